// acc[t] = sum_j weights[t][j] * rows[t * n_used + j] (the routed experts' outputs of token t,
// slots in routing order); one workgroup per token.
#version 460
#include "common.glsl"

layout(local_size_x = 64) in;
layout(push_constant) uniform PC {
  uint64_t rows, weights, acc;
  uint n, n_used, width;
} pc;

void main() {
  const uint t = gl_WorkGroupID.x;
  F32 w = F32(pc.weights);
  F32 o = F32(pc.acc + 4ul * uint64_t(t) * pc.width);
  for (uint i = gl_LocalInvocationID.x; i < pc.width; i += 64u) {
    float s = 0.0;
    for (uint j = 0u; j < pc.n_used; ++j)
      s += w.v[t * pc.n_used + j] * F32(pc.rows + 4ul * (uint64_t(t) * pc.n_used + j) * pc.width).v[i];
    o.v[i] = s;
  }
}
