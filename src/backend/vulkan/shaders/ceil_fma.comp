// The device's f32 multiply-add rate (kimi bench --device vulkan, vk_ceiling.cpp): 8 independent
// chains of fma per invocation, `iters` rounds (16 flops per round); the result is stored only when it
// equals an impossible value, so the arithmetic stays and nothing is written.
#version 460
#include "common.glsl"

layout(local_size_x = 256) in;
layout(push_constant) uniform PC {
  uint64_t dst;
  uint iters;
  float a, b;
} pc;

void main() {
  float x0 = float(gl_GlobalInvocationID.x) * 1e-9, x1 = x0 + 0.1, x2 = x0 + 0.2, x3 = x0 + 0.3;
  float x4 = x0 + 0.4, x5 = x0 + 0.5, x6 = x0 + 0.6, x7 = x0 + 0.7;
  for (uint i = 0u; i < pc.iters; ++i) {
    x0 = fma(x0, pc.a, pc.b); x1 = fma(x1, pc.a, pc.b); x2 = fma(x2, pc.a, pc.b); x3 = fma(x3, pc.a, pc.b);
    x4 = fma(x4, pc.a, pc.b); x5 = fma(x5, pc.a, pc.b); x6 = fma(x6, pc.a, pc.b); x7 = fma(x7, pc.a, pc.b);
  }
  const float t = x0 + x1 + x2 + x3 + x4 + x5 + x6 + x7;
  if (t == -1.25e-37) F32AT(pc.dst)[0] = t;
}
