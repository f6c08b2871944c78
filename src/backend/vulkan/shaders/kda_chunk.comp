// KDA gated delta rule in chunks of L tokens (vk_kda.cpp kda_scan, prefill): the same result as
// kda_scan.comp up to rounding, reading and writing each head's D x D state once per chunk instead
// of once per token. Workgroups as in kda_scan.comp: (first token of a sequence, head h).
//
// Within a chunk (tokens r = 0..L-1 of one sequence, state S0 before it), with the inclusive
// cumulative log decay G_r = g_0 + ... + g_r (per key channel i) and the delta d_s of token s:
//   S_r = diag(e^G_r) S0 + sum_{s<=r} diag(e^(G_r - G_s)) k_s d_s^T
// so the prediction, the deltas and the read-out are
//   p_r = S0^T (e^G_r * k_r) + sum_{s<r} A[r][s] d_s,   A[r][s] = sum_i k_r[i] k_s[i] e^(G_r[i] - G_s[i])
//   d_r = beta_r (v_r - p_r)                            (a forward substitution over r, per column j)
//   o_r = scale (S0^T (e^G_r * q_r) + sum_{s<=r} B[r][s] d_s),   B[r][s] = sum_i q_r[i] k_s[i] e^(G_r[i] - G_s[i])
//   S_L = diag(e^G_{L-1}) S0 + sum_s (e^(G_{L-1} - G_s) * k_s) d_s^T
// Every exponent is <= 0 for a decaying gate (g <= 0), and e^(G_r - G_s) is taken from the
// difference directly (never e^G_r / e^G_s), so nothing overflows. A short last chunk is padded
// with k = q = 0, g = 0, beta = 0 tokens, which change nothing. Invocation j owns state column j;
// its L deltas and partial sums live in registers. D <= MAXD (checked by the host).
#version 460
#include "common.glsl"

#define WG 128u
#define MAXD 128u
#define L 16u
layout(local_size_x = 128) in;
layout(push_constant) uniform PC {
  uint64_t q, k, v, g, beta, o, state, ents;
  uint64_t per_seq;
  uint n, H, D;
  float scale;
} pc;

shared float sK[L * MAXD];  // k, then k * e^G_r
shared float sQ[L * MAXD];  // q, then q * e^G_r
shared float sG[L * MAXD];  // cumulative log decay, then k * e^(G_{L-1} - G_r)
shared float sA[L * L], sB[L * L];
shared float sLast[MAXD];   // e^G_{L-1}
shared float sBeta[L];
shared uint sTok[L];
shared uint sCount, sNext;

void main() {
  const uint tid = gl_LocalInvocationID.x;
  const uint h = gl_WorkGroupID.y;
  const uint D = pc.D, C = pc.H * pc.D;
  I32 ents = I32(pc.ents);
  F32 q = F32(pc.q);
  F32 k = F32(pc.k);
  F32 v = F32(pc.v);
  F32 g = F32(pc.g);
  F32 o = F32(pc.o);
  F32 beta = F32(pc.beta);
  for (uint t0 = gl_WorkGroupID.x; t0 < pc.n; t0 += gl_NumWorkGroups.x) {
    const int seq = ents.v[t0 * 4u + 1u];
    bool first = true;
    for (uint t = 0u; t < t0; ++t)
      if (ents.v[t * 4u + 1u] == seq) {
        first = false;
        break;
      }
    if (!first) continue;
    F32 S = F32(pc.state + 4ul * (uint64_t(seq) * pc.per_seq + uint64_t(h) * D * D));
    uint cursor = t0;
    for (;;) {
      barrier();  // the previous chunk is done with shared memory
      if (tid == 0u) {  // the next (up to) L tokens of this sequence, in batch order
        uint cnt = 0u, cur = cursor;
        for (; cur < pc.n && cnt < L; ++cur)
          if (ents.v[cur * 4u + 1u] == seq) sTok[cnt++] = cur;
        sCount = cnt;
        sNext = cur;
      }
      barrier();
      const uint cnt = sCount;
      cursor = sNext;
      if (cnt == 0u) break;
      // load the chunk (padding rows zero)
      for (uint idx = tid; idx < L * D; idx += WG) {
        const uint r = idx / D, i = idx - r * D;
        float kv = 0.0, qv = 0.0, gv = 0.0;
        if (r < cnt) {
          const uint off = sTok[r] * C + h * D + i;
          kv = k.v[off];
          qv = q.v[off];
          gv = g.v[off];
        }
        sK[r * MAXD + i] = kv;
        sQ[r * MAXD + i] = qv;
        sG[r * MAXD + i] = gv;
      }
      if (tid < L) sBeta[tid] = tid < cnt ? beta.v[sTok[tid] * pc.H + h] : 0.0;
      barrier();
      for (uint i = tid; i < D; i += WG) {  // inclusive cumulative sums over the chunk
        float acc = 0.0;
        for (uint r = 0u; r < L; ++r) {
          acc += sG[r * MAXD + i];
          sG[r * MAXD + i] = acc;
        }
      }
      barrier();
      // A (s < r) and B (s <= r): one invocation per pair
      for (uint p = tid; p < L * (L + 1u) / 2u; p += WG) {
        uint r = 0u, s = p;
        while (s > r) {
          s -= r + 1u;
          ++r;
        }
        float a = 0.0, b = 0.0;
        for (uint i = 0u; i < D; ++i) {
          const float e = exp(sG[r * MAXD + i] - sG[s * MAXD + i]);
          const float ks = sK[s * MAXD + i] * e;
          a += sK[r * MAXD + i] * ks;
          b += sQ[r * MAXD + i] * ks;
        }
        sA[r * L + s] = s < r ? a : 0.0;
        sB[r * L + s] = b;
      }
      for (uint i = tid; i < D; i += WG) sLast[i] = sG[(L - 1u) * MAXD + i];
      barrier();
      // k, q scaled by e^G_r; the update rows k_s e^(G_{L-1} - G_s) over the cumulative decay
      for (uint idx = tid; idx < L * D; idx += WG) {
        const uint r = idx / D, i = idx - r * D;
        const float gr = sG[r * MAXD + i], kv = sK[r * MAXD + i];
        sK[r * MAXD + i] = kv * exp(gr);
        sQ[r * MAXD + i] = sQ[r * MAXD + i] * exp(gr);
        sG[r * MAXD + i] = kv * exp(sLast[i] - gr);
      }
      barrier();
      for (uint i = tid; i < D; i += WG) sLast[i] = exp(sLast[i]);
      barrier();
      for (uint j = tid; j < D; j += WG) {
        float u[L], oq[L], d[L];
        for (uint r = 0u; r < L; ++r) {
          u[r] = r < cnt ? v.v[sTok[r] * C + h * D + j] : 0.0;
          oq[r] = 0.0;
        }
        for (uint i = 0u; i < D; ++i) {  // the chunk's start state, read once
          const float s0 = S.v[i * D + j];
          for (uint r = 0u; r < L; ++r) {
            u[r] -= sK[r * MAXD + i] * s0;
            oq[r] += sQ[r * MAXD + i] * s0;
          }
        }
        for (uint r = 0u; r < L; ++r) {  // forward substitution
          float x = u[r];
          for (uint s = 0u; s < L; ++s)
            if (s < r) x -= sA[r * L + s] * d[s];
          d[r] = sBeta[r] * x;
        }
        for (uint r = 0u; r < L; ++r) {
          if (r >= cnt) break;
          float acc = oq[r];
          for (uint s = 0u; s < L; ++s)
            if (s <= r) acc += sB[r * L + s] * d[s];
          o.v[sTok[r] * C + h * D + j] = acc * pc.scale;
        }
        for (uint i = 0u; i < D; ++i) {  // the state after the chunk
          float s1 = sLast[i] * S.v[i * D + j];
          for (uint r = 0u; r < L; ++r) s1 += sG[r * MAXD + i] * d[r];
          S.v[i * D + j] = s1;
        }
      }
    }
  }
}
