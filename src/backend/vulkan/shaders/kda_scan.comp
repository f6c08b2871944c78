// KDA gated delta rule (vk_kda.cpp kda_scan), the exact sequential form. Workgroup (x, h): x runs
// over the tokens; the workgroup of a sequence's FIRST token in the batch takes all of that
// sequence's tokens in batch order (the others exit), so sequences run in parallel and each one's
// tokens in order. Head h of the sequence's state: S[i][j] at state + seq * per_seq + h*D*D + i*D + j
// (i key, j value). Per token, with invocation j owning column j (no reductions needed):
//   S[i][j] *= exp(g[i]);  p = sum_i k[i] S[i][j];  d = beta * (v[j] - p)
//   S[i][j] += k[i] d;     o[j] = scale * sum_i q[i] S[i][j]
// q, k, v, g, o: n x H*D rows; beta: n x H. k, q and the decay factors of a token go through
// shared memory (D <= MAXD, checked by the host).
#version 460
#include "common.glsl"

#define WG 128u
#define MAXD 256u
layout(local_size_x = 128) in;
layout(push_constant) uniform PC {
  uint64_t q, k, v, g, beta, o, state, ents;
  uint64_t per_seq;
  uint n, H, D;
  float scale;
} pc;

shared float sk[MAXD], sq[MAXD], sdec[MAXD];

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
    for (uint t = t0; t < pc.n; ++t) {
      if (ents.v[t * 4u + 1u] != seq) continue;
      const uint off = t * C + h * D;
      barrier();  // the previous token's reads of shared memory are done
      for (uint i = tid; i < D; i += WG) {
        sk[i] = k.v[off + i];
        sq[i] = q.v[off + i];
        sdec[i] = exp(g.v[off + i]);
      }
      barrier();
      const float b = beta.v[t * pc.H + h];
      for (uint j = tid; j < D; j += WG) {
        float p = 0.0;
        for (uint i = 0u; i < D; ++i) {
          const float s = S.v[i * D + j] * sdec[i];
          S.v[i * D + j] = s;
          p += sk[i] * s;
        }
        const float d = b * (v.v[off + j] - p);
        float acc = 0.0;
        for (uint i = 0u; i < D; ++i) {
          const float s = S.v[i * D + j] + sk[i] * d;
          S.v[i * D + j] = s;
          acc += sq[i] * s;
        }
        o.v[off + j] = acc * pc.scale;
      }
    }
  }
}
