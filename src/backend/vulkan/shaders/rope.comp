// variants: ROWS TWOD
// Rotary embeddings in place, one invocation per rotated pair (grid-stride):
//   ROWS: pair i < half of head h of row t (at x + t * ld + h * head_stride) rotated by the angle of
//         position pos(t) (the staged micro-batch entries, 4 ints each): cos = cs[(pos * half + i) * 2],
//         sin = the next value (the table the caller made, magnitude factor folded in)
//   TWOD: the vision tower's 2-D rotation (docs/spec/vision.md §3.4) of rows of `heads` vectors of
//         head_dim = 4 * quarter values: pair m of a head turns by the angle of column col[t] (m even)
//         or row row[t] (m odd) and frequency j = m / 2; the host stages row / col as int pairs and the
//         table cs[(p * quarter + j) * 2] = cos, sin of p * theta^(-4j / head_dim) for p up to the
//         largest row / column (made on the host as the CPU backend makes it: the same bits)
#version 460
#include "common.glsl"

layout(local_size_x = 256) in;
layout(push_constant) uniform PC {
  uint64_t x, ents, cs;
  uint ld, n, heads, head_stride, half_pairs;  // TWOD: head_stride = head_dim, half_pairs = head_dim / 2
} pc;

void main() {
  const uint stride = gl_NumWorkGroups.x * 256u;
  const uint per_row = pc.heads * pc.half_pairs;
  const uint total = pc.n * per_row;
  F32 cs = F32(pc.cs);
  for (uint k = gl_GlobalInvocationID.x; k < total; k += stride) {
    const uint t = k / per_row, r = k % per_row, h = r / pc.half_pairs, i = r % pc.half_pairs;
#if defined(VARIANT_ROWS)
    const uint pos = uint(I32(pc.ents).v[t * 4u + 2u]);
    const uint c = (pos * pc.half_pairs + i) * 2u;
#else
    const uint p = uint(I32(pc.ents).v[t * 2u + ((i & 1u) == 0u ? 1u : 0u)]);  // (row, col) per t
    const uint c = (p * (pc.half_pairs / 2u) + i / 2u) * 2u;
#endif
    F32 v = F32(pc.x + 4ul * (uint64_t(t) * pc.ld + uint64_t(h) * pc.head_stride + 2ul * i));
    const float x0 = v.v[0], x1 = v.v[1], co = cs.v[c], si = cs.v[c + 1u];
    v.v[0] = x0 * co - x1 * si;
    v.v[1] = x0 * si + x1 * co;
  }
}
