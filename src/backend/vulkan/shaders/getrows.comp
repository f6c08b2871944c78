// variants: F32 F16 BF16 Q8_0 Q4_0 Q5_0 Q5_1 MXFP4 Q4_K Q5_K Q6_K Q2_K Q3_K IQ4_XS
// out[t] = row ids[t] of a weight table, decoded to f32 (embedding lookup). ids: i32 token ids
// at a stride of `id_stride` ints (the micro-batch entries). One workgroup per token.
#version 460
#include "common.glsl"
#include "dequant.glsl"

layout(local_size_x = 64) in;
layout(push_constant) uniform PC {
  uint64_t table, ids, out_;
  uint cols, row_bytes, id_stride, n;
} pc;

void main() {
  const uint t = gl_WorkGroupID.x;
  const uint id = uint(I32(pc.ids).v[t * pc.id_stride]);
  const uint64_t row = pc.table + uint64_t(id) * pc.row_bytes;
  for (uint c = gl_LocalInvocationID.x; c < pc.cols / 8u; c += 64u) {
    float v[8];
    dq8(row, c, v);
    F32 o = F32(pc.out_ + 4ul * (uint64_t(t) * pc.cols + uint64_t(c) * 8ul));
    for (uint i = 0u; i < 8u; ++i) o.v[i] = v[i];
  }
#if defined(PLAIN_TYPE)
  for (uint j = (pc.cols / 8u) * 8u + gl_LocalInvocationID.x; j < pc.cols; j += 64u)
    F32(pc.out_ + 4ul * uint64_t(t) * pc.cols).v[j] = dq1(row, j);
#endif
}
