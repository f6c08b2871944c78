// The routed experts' (token, slot) pairs grouped by expert for the grouped GEMM (mm_tiled.comp):
// one workgroup counts the slots of each expert (sel[s] in [0, n_expert), or < 0 for an expert
// held elsewhere: bucket n_expert), lays the buckets out one after another, cuts each into tiles of
// at most BN slots and scatters the slot indices into their bucket. Output (uints at `out`):
// [0] tile count, [1] offset of the sorted slot list, then tiles {expert or 0xFFFFFFFF, begin,
// count, 0} from [4], then the sorted slots. The order of the slots within a bucket is not fixed
// (atomics), which does not change any result: every slot's output row is its own sum.
#version 460
#include "common.glsl"

layout(local_size_x = 256) in;
layout(push_constant) uniform PC {
  uint64_t sel, out_;
  uint slots, n_expert, bn, max_tiles;
} pc;

layout(buffer_reference, std430, buffer_reference_align = 4) buffer U32 { uint v[]; };

const uint MAXE = 4096u;  // experts + 1 (the host checks)
shared uint cnt[MAXE];

void main() {
  const uint tid = gl_LocalInvocationID.x;
  const uint nb = pc.n_expert + 1u;
  U32 o = U32(pc.out_);
  I32 sel = I32(pc.sel);
  const uint sorted = 4u + 4u * pc.max_tiles;
  for (uint e = tid; e < nb; e += 256u) cnt[e] = 0u;
  barrier();
  for (uint s = tid; s < pc.slots; s += 256u) {
    const int e = sel.v[s];
    atomicAdd(cnt[e < 0 || uint(e) >= pc.n_expert ? pc.n_expert : uint(e)], 1u);
  }
  barrier();
  if (tid == 0u) {
    uint off = 0u, nt = 0u;
    for (uint e = 0u; e < nb; ++e) {
      const uint c = cnt[e];
      for (uint b = 0u; b < c; b += pc.bn) {
        o.v[4u + 4u * nt] = e == pc.n_expert ? 0xFFFFFFFFu : e;
        o.v[5u + 4u * nt] = off + b;
        o.v[6u + 4u * nt] = min(pc.bn, c - b);
        o.v[7u + 4u * nt] = 0u;
        ++nt;
      }
      cnt[e] = off;  // from here on: the bucket's next free place
      off += c;
    }
    o.v[0] = nt;
    o.v[1] = sorted;
  }
  barrier();
  for (uint s = tid; s < pc.slots; s += 256u) {
    const int e = sel.v[s];
    const uint pos = atomicAdd(cnt[e < 0 || uint(e) >= pc.n_expert ? pc.n_expert : uint(e)], 1u);
    o.v[sorted + pos] = s;
  }
}
