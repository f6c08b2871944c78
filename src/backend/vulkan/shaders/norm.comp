// variants: RMS LAYER L2
// Row norms, one workgroup per row (f32 sums reduced in shared memory):
//   RMS:   y = x / sqrt(mean(x^2) + eps) * w           (w optional; rows at strides ldx / ldy)
//   LAYER: y = (x - mean) / sqrt(var + eps) * w + b    (w, b optional)
//   L2:    y = x / sqrt(sum(x^2) + eps)
#version 460
#include "common.glsl"

layout(local_size_x = 64) in;
layout(push_constant) uniform PC {
  uint64_t x, w, b, y;
  uint ldx, ldy, n, width;
  float eps;
} pc;

shared float red[64];

float reduce_sum(float v) {
  const uint tid = gl_LocalInvocationID.x;
  red[tid] = v;
  barrier();
  for (uint s = 32u; s > 0u; s >>= 1) {
    if (tid < s) red[tid] += red[tid + s];
    barrier();
  }
  float r = red[0];
  barrier();
  return r;
}

void main() {
  const uint tid = gl_LocalInvocationID.x;
  for (uint row = gl_WorkGroupID.x; row < pc.n; row += gl_NumWorkGroups.x) {
    F32 x = F32(pc.x + 4ul * uint64_t(row) * pc.ldx);
    F32 y = F32(pc.y + 4ul * uint64_t(row) * pc.ldy);
    float mean = 0.0;
#if defined(VARIANT_LAYER)
    float s1 = 0.0;
    for (uint i = tid; i < pc.width; i += 64u) s1 += x.v[i];
    mean = reduce_sum(s1) / float(pc.width);
#endif
    float s2 = 0.0;
    for (uint i = tid; i < pc.width; i += 64u) {
      float d = x.v[i] - mean;
      s2 += d * d;
    }
    float ss = reduce_sum(s2);
#if defined(VARIANT_L2)
    float scale = 1.0 / sqrt(ss + pc.eps);
#else
    float scale = 1.0 / sqrt(ss / float(pc.width) + pc.eps);
#endif
    for (uint i = tid; i < pc.width; i += 64u) {
      float v = (x.v[i] - mean) * scale;
      if (pc.w != 0ul) v *= F32(pc.w).v[i];
      if (pc.b != 0ul) v += F32(pc.b).v[i];
      y.v[i] = v;
    }
    barrier();
  }
}
