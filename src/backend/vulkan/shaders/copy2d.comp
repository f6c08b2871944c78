// dst[i][0..width) = src[i][0..width) for n rows at row strides ld_dst / ld_src (floats); one
// workgroup per row (grid-stride over rows).
#version 460
#include "common.glsl"

layout(local_size_x = 64) in;
layout(push_constant) uniform PC {
  uint64_t src, dst;
  uint ld_src, ld_dst, n, width;
} pc;

void main() {
  for (uint r = gl_WorkGroupID.x; r < pc.n; r += gl_NumWorkGroups.x) {
    F32 s = F32(pc.src + 4ul * uint64_t(r) * pc.ld_src);
    F32 d = F32(pc.dst + 4ul * uint64_t(r) * pc.ld_dst);
    for (uint i = gl_LocalInvocationID.x; i < pc.width; i += 64u) d.v[i] = s.v[i];
  }
}
