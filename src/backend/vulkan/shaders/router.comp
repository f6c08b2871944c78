// MoE router (vk_kda.cpp moe_route), one workgroup per token:
//   probs = sigmoid(logits) or softmax(logits);  choice = probs + bias (written over logits)
//   sel = the n_used best choices, ranked (higher first; ties: lower index; NaN counts as -inf)
//   weights = probs[sel], renormalized (sum floored at 6.1035e-5) when renorm != 0, times scale
// Selection runs n_used rounds of a workgroup arg-best; round r takes the best element strictly
// after round r-1's winner in that total order, so nothing is marked or moved.
#version 460
#include "common.glsl"

#define WG 128u
layout(local_size_x = 128) in;
layout(push_constant) uniform PC {
  uint64_t logits, bias, probs, sel, weights;
  uint n, E, k, softmax, renorm;
  float scale;
} pc;

shared float rs[WG];
shared int ri[WG];
shared float rp[WG];

#define NEG_INF uintBitsToFloat(0xff800000u)

// (a, ia) ranks before (b, ib)
bool before(float a, int ia, float b, int ib) { return a != b ? a > b : ia < ib; }
float key(float s) { return isnan(s) ? NEG_INF : s; }

float reduce_max(float x) {
  const uint tid = gl_LocalInvocationID.x;
  rs[tid] = x;
  barrier();
  for (uint s = WG / 2u; s > 0u; s >>= 1) {
    if (tid < s) rs[tid] = max(rs[tid], rs[tid + s]);
    barrier();
  }
  const float r = rs[0];
  barrier();
  return r;
}

float reduce_sum(float x) {
  const uint tid = gl_LocalInvocationID.x;
  rs[tid] = x;
  barrier();
  for (uint s = WG / 2u; s > 0u; s >>= 1) {
    if (tid < s) rs[tid] += rs[tid + s];
    barrier();
  }
  const float r = rs[0];
  barrier();
  return r;
}

void main() {
  const uint tid = gl_LocalInvocationID.x;
  const uint E = pc.E;
  for (uint t = gl_WorkGroupID.x; t < pc.n; t += gl_NumWorkGroups.x) {
    F32 lg = F32(pc.logits + 4ul * uint64_t(t) * E);
    F32 pr = F32(pc.probs + 4ul * uint64_t(t) * E);
    if (pc.softmax == 0u) {
      for (uint i = tid; i < E; i += WG) pr.v[i] = 1.0 / (1.0 + exp(-lg.v[i]));
    } else {
      float m = NEG_INF;
      for (uint i = tid; i < E; i += WG) m = max(m, lg.v[i]);
      m = reduce_max(m);
      float s = 0.0;
      for (uint i = tid; i < E; i += WG) {
        const float e = exp(lg.v[i] - m);
        pr.v[i] = e;
        s += e;
      }
      s = reduce_sum(s);
      for (uint i = tid; i < E; i += WG) pr.v[i] = pr.v[i] / s;
    }
    // selection scores, each invocation on its own elements (no barrier needed)
    for (uint i = tid; i < E; i += WG) lg.v[i] = pr.v[i] + (pc.bias != 0ul ? F32(pc.bias).v[i] : 0.0);
    I32 sel = I32(pc.sel + 4ul * uint64_t(t) * pc.k);
    F32 w = F32(pc.weights + 4ul * uint64_t(t) * pc.k);
    float prev_s = 0.0;
    int prev_i = -1;  // none yet
    float sum = 0.0;
    for (uint r = 0u; r < pc.k; ++r) {
      float bs = NEG_INF, bp = 0.0;
      int bi = 0x7fffffff;
      for (uint i = tid; i < E; i += WG) {
        const float c = key(lg.v[i]);
        if ((prev_i < 0 || before(prev_s, prev_i, c, int(i))) && before(c, int(i), bs, bi)) {
          bs = c;
          bi = int(i);
          bp = pr.v[i];
        }
      }
      rs[tid] = bs;
      ri[tid] = bi;
      rp[tid] = bp;
      barrier();
      for (uint s = WG / 2u; s > 0u; s >>= 1) {
        if (tid < s && before(rs[tid + s], ri[tid + s], rs[tid], ri[tid])) {
          rs[tid] = rs[tid + s];
          ri[tid] = ri[tid + s];
          rp[tid] = rp[tid + s];
        }
        barrier();
      }
      prev_s = rs[0];
      prev_i = ri[0];
      if (tid == 0u) {
        sel.v[r] = prev_i;
        w.v[r] = rp[0];
        sum += rp[0];
      }
      barrier();
    }
    if (tid == 0u) {
      const float inv = pc.renorm != 0u ? 1.0 / max(sum, 6.1035e-5) : 1.0;
      for (uint r = 0u; r < pc.k; ++r) {
        float x = w.v[r];
        if (pc.renorm != 0u) x *= inv;
        if (pc.scale != 1.0) x *= pc.scale;
        w.v[r] = x;
      }
    }
  }
}
