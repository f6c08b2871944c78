// The selection bitmask the DENSE variant of mla_attn.comp reads: bit r of token t's words is set
// when position r is among sel_idx[t][0..sel_n[t]) (the words are zeroed before this runs).
// One workgroup per token; tokens with sel_n < 0 (everything visible) are skipped.
#version 460
#include "common.glsl"

layout(local_size_x = 64) in;
layout(push_constant) uniform PC {
  uint64_t sel_idx, sel_n, mask;
  uint n, sel_cap, mask_words;
} pc;

void main() {
  for (uint t = gl_WorkGroupID.x; t < pc.n; t += gl_NumWorkGroups.x) {
    const int ns = I32(pc.sel_n).v[t];
    I32 sel = I32(pc.sel_idx + 4ul * uint64_t(t) * pc.sel_cap);
    I32 bits = I32(pc.mask + 4ul * uint64_t(t) * pc.mask_words);
    for (int i = int(gl_LocalInvocationID.x); i < ns; i += 64) {
      const int r = sel.v[i];
      if (r >= 0 && uint(r) < pc.mask_words * 32u) atomicOr(bits.v[uint(r) >> 5u], int(1u << (uint(r) & 31u)));
    }
  }
}
