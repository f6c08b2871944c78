// DSA indexer scores of one query against the keys of one sequence, one thread per position:
//   scores[s] = sum_h w[h] * max(0, q_h . key(s)),  s < n_visible
// (heads in order, the dot product over d in order). The query heads are staged through shared
// memory in groups of up to QMAX floats; keys are f16 or f32 rows of DI elements.
#version 460
#include "common.glsl"

#define QMAX 4096u

layout(local_size_x = 64) in;
layout(push_constant) uniform PC {
  uint64_t keys, q, w, scores;
  uint DI, HI, nvis, f16;
} pc;

shared float qs[QMAX];

void main() {
  const uint tid = gl_LocalInvocationID.x;
  const uint G = QMAX / pc.DI;  // heads per staged group
  const uint64_t row_bytes = uint64_t(pc.DI) * (pc.f16 != 0u ? 2ul : 4ul);
  F32 q = F32(pc.q);
  F32 w = F32(pc.w);
  for (uint s0 = gl_WorkGroupID.x * 64u; s0 < pc.nvis; s0 += gl_NumWorkGroups.x * 64u) {
    const uint s = s0 + tid;
    const uint64_t row = pc.keys + uint64_t(min(s, pc.nvis - 1u)) * row_bytes;
    float acc = 0.0;
    for (uint h0 = 0u; h0 < pc.HI; h0 += G) {
      const uint nh = min(G, pc.HI - h0);
      barrier();  // the previous group's readers are done
      for (uint i = tid; i < nh * pc.DI; i += 64u) qs[i] = q.v[h0 * pc.DI + i];
      barrier();
      for (uint hh = 0u; hh < nh; ++hh) {
        float d = 0.0;
        const uint qo = hh * pc.DI;
        if (pc.f16 != 0u) {
          U16 k = U16(row);
          for (uint i = 0u; i < pc.DI; ++i) d += qs[qo + i] * half_bits(uint(k.v[i]));
        } else {
          F32 k = F32(row);
          for (uint i = 0u; i < pc.DI; ++i) d += qs[qo + i] * k.v[i];
        }
        if (d > 0.0) acc += w.v[h0 + hh] * d;
      }
    }
    if (s < pc.nvis) F32(pc.scores).v[s] = acc;
  }
}
