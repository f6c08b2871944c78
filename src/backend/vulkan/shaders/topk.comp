// The k best of scores[0..n) into sel in ascending index order, exactly the CPU backend's set
// (higher score first, ties: lower index; NaN ranks as -inf; -0 equals +0). One workgroup:
//  1. every score becomes an order-preserving uint key (larger float -> larger key);
//  2. radix select, 8 bits per pass from the top: a 256-bin histogram of the keys that share the
//     prefix found so far picks the next digit of T, the k-th largest key; after 4 passes T is
//     exact and `rem` is how many keys equal to T are taken (the k - #(key > T) lowest-index ones);
//  3. ordered compaction: each thread owns a contiguous segment, counts its keys > T and == T,
//     an exclusive scan over the threads gives each segment its output offset, and the segment
//     is walked again writing the indices in order.
// *sel_n = k (the host clamps k to n and handles k <= 0).
#version 460
#include "common.glsl"

#define NT 256u

layout(local_size_x = 256) in;
layout(push_constant) uniform PC {
  uint64_t scores, sel, sel_n;
  uint64_t dyn;  // staged n, k (data, not push constants: decode steps replay one command buffer)
} pc;

shared uint hist[256];
shared uint cnt_gt[NT];
shared uint cnt_eq[NT];
shared uint s_prefix, s_rem;

uint key_of(float x) {
  uint b = floatBitsToUint(x);  // bit tests: immune to fast-math folding of isnan / x == 0
  if ((b & 0x7F800000u) == 0x7F800000u && (b & 0x007FFFFFu) != 0u) b = 0xFF800000u;  // NaN -> -inf
  if ((b & 0x7FFFFFFFu) == 0u) b = 0u;                                            // -0 -> +0
  return (b & 0x80000000u) != 0u ? ~b : (b | 0x80000000u);
}

void main() {
  const uint tid = gl_LocalInvocationID.x;
  const uint N = uint(I32(pc.dyn).v[0]), K = uint(I32(pc.dyn).v[1]);
  F32 sc = F32(pc.scores);
  if (tid == 0u) {
    s_prefix = 0u;
    s_rem = K;
  }
  for (int shift = 24; shift >= 0; shift -= 8) {
    hist[tid] = 0u;  // NT == 256 bins
    barrier();
    const uint prefix = s_prefix;
    const uint hi_mask = shift == 24 ? 0u : ~((1u << uint(shift + 8)) - 1u);
    for (uint i = tid; i < N; i += NT) {
      const uint u = key_of(sc.v[i]);
      if ((u & hi_mask) == prefix) atomicAdd(hist[(u >> uint(shift)) & 255u], 1u);
    }
    barrier();
    if (tid == 0u) {
      uint rem = s_rem, cum = 0u;
      for (int d = 255; d >= 0; --d) {
        const uint c = hist[uint(d)];
        if (cum + c >= rem) {
          s_prefix = prefix | (uint(d) << uint(shift));
          s_rem = rem - cum;
          break;
        }
        cum += c;
      }
    }
    barrier();
  }
  const uint T = s_prefix, rem = s_rem;
  const uint seg = (N + NT - 1u) / NT;
  const uint b0 = min(N, tid * seg), b1 = min(N, b0 + seg);
  uint gt = 0u, eq = 0u;
  for (uint i = b0; i < b1; ++i) {
    const uint u = key_of(sc.v[i]);
    gt += u > T ? 1u : 0u;
    eq += u == T ? 1u : 0u;
  }
  cnt_gt[tid] = gt;
  cnt_eq[tid] = eq;
  barrier();
  if (tid == 0u) {  // exclusive scans (NT adds)
    uint a = 0u, b = 0u;
    for (uint i = 0u; i < NT; ++i) {
      const uint x = cnt_gt[i], y = cnt_eq[i];
      cnt_gt[i] = a;
      cnt_eq[i] = b;
      a += x;
      b += y;
    }
  }
  barrier();
  uint eq_before = cnt_eq[tid];
  uint o = cnt_gt[tid] + min(eq_before, rem);
  I32 out_sel = I32(pc.sel);
  for (uint i = b0; i < b1; ++i) {
    const uint u = key_of(sc.v[i]);
    bool take = u > T;
    if (u == T) {
      take = eq_before < rem;
      ++eq_before;
    }
    if (take) out_sel.v[o++] = int(i);
  }
  if (tid == 0u) I32(pc.sel_n).v[0] = int(K);
}
