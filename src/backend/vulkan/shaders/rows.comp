// variants: GATHER STORE_CACHE
// Row moves with host-given row lists (staged in device memory):
//   GATHER:      dst[i] = src[rows[i]]                       (width floats per row)
//   STORE_CACHE: cache row (e[t].seq_id, e[t].pos) = src[t] (f32 -> f16 when f16 != 0); e = the
//                micro-batch entries as 4 ints each (token, seq_id, pos, flags)
// One workgroup per row.
#version 460
#include "common.glsl"

layout(local_size_x = 64) in;
layout(push_constant) uniform PC {
  uint64_t src, dst, rows;
  uint width, ld_src, n, f16, n_ctx;
} pc;

void main() {
  const uint t = gl_WorkGroupID.x;
#if defined(VARIANT_GATHER)
  const uint r = uint(I32(pc.rows).v[t]);
  F32 s = F32(pc.src + 4ul * uint64_t(r) * pc.width);
  F32 d = F32(pc.dst + 4ul * uint64_t(t) * pc.width);
  for (uint i = gl_LocalInvocationID.x; i < pc.width; i += 64u) d.v[i] = s.v[i];
#else
  const uint seq = uint(I32(pc.rows).v[t * 4u + 1u]), pos = uint(I32(pc.rows).v[t * 4u + 2u]);
  const uint64_t row = (uint64_t(seq) * pc.n_ctx + pos) * pc.width;
  F32 s = F32(pc.src + 4ul * uint64_t(t) * pc.ld_src);
  if (pc.f16 != 0u) {
    U16 d = U16(pc.dst + 2ul * row);
    for (uint i = gl_LocalInvocationID.x; i < pc.width; i += 64u) d.v[i] = uint16_t(packHalf2x16(vec2(s.v[i], 0.0)) & 0xFFFFu);
  } else {
    F32 d = F32(pc.dst + 4ul * row);
    for (uint i = gl_LocalInvocationID.x; i < pc.width; i += 64u) d.v[i] = s.v[i];
  }
#endif
}
