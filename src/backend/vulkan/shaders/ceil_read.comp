// The device's read bandwidth (kimi bench --device vulkan, vk_ceiling.cpp): every invocation sums
// 16-byte loads of a buffer in a grid-stride loop (consecutive invocations read consecutive vectors) and
// stores its sum only when it equals an impossible value, so the loads stay and nothing is written.
#version 460
#include "common.glsl"

layout(buffer_reference, std430, buffer_reference_align = 16) buffer V4 { vec4 v[]; };
layout(local_size_x = 256) in;
layout(push_constant) uniform PC {
  uint64_t src, dst;
  uint n_vec4;  // vectors to read
} pc;

void main() {
  V4 s = V4(pc.src);
  vec4 acc = vec4(0);
  const uint stride = gl_NumWorkGroups.x * 256u;
  for (uint i = gl_GlobalInvocationID.x; i < pc.n_vec4; i += stride) acc += s.v[i];
  const float t = acc.x + acc.y + acc.z + acc.w;
  if (t == -1.25e-37) F32AT(pc.dst)[0] = t;
}
