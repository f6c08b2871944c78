// The vision tower's attention (docs/spec/vision.md §3.3 step 3): no mask inside each segment
// [seg[i], seg[i+1]) of the n rows, nothing across them. One workgroup per (query row t, head h),
// item = t * heads + h, items item0 .. item0 + groups - 1 of this dispatch:
// out[t][h*D..] = softmax_s(scale q[t]_h . k[s]_h) v[s]_h over t's segment, with q, k, v of row t at
// qkv + t * ld + {0, H*D, 2*H*D} + h*D.
// The keys go in chunks of 64: each invocation scores one key of the chunk (a full dot product with
// the query held in shared memory), then the chunk's maximum updates the running one (online
// softmax) and each invocation adds the chunk's weighted values to its output dimensions
// (d = tid, tid + 64, ... < D <= 512).
// A dispatch may take only the keys [win0, win1) of each segment (offsets from its start; lavapipe
// ends an invocation's loops after 65535 iterations, so there the keys go in windows): the running
// maximum and sum are carried in `state` (2 floats per item) and the unnormalised output in `out`
// between windows; FIRST (flags bit 0) starts them, LAST (bit 1) divides by the sum.
#version 460
#include "common.glsl"

layout(local_size_x = 64) in;
layout(push_constant) uniform PC {
  uint64_t qkv, seg, out_, state;
  uint ld, n, heads, dim, n_seg;
  float scale;
  uint item0, win0, win1, flags;
} pc;

shared float q_sh[512];
shared float p_sh[64];

void main() {
  const uint tid = gl_LocalInvocationID.x;
  const uint Q = pc.heads * pc.dim;
  const uint item = pc.item0 + gl_WorkGroupID.x;
  if (item >= pc.n * pc.heads) return;
  I32 seg = I32(pc.seg);
  const uint t = item / pc.heads, h = item % pc.heads;
  // the segment of row t: the last bound <= t (binary search over n_seg + 1 bounds)
  uint lo = 0u, hi = pc.n_seg;  // seg[lo] <= t < seg[hi]
  while (hi - lo > 1u) {
    const uint mid = (lo + hi) / 2u;
    if (uint(seg.v[mid]) <= t) lo = mid; else hi = mid;
  }
  const uint seg0 = uint(seg.v[lo]), seg1 = uint(seg.v[lo + 1u]);
  const uint s0 = min(seg0 + pc.win0, seg1), s1 = min(seg0 + pc.win1, seg1);
  F32 q = F32(pc.qkv + 4ul * (uint64_t(t) * pc.ld + uint64_t(h) * pc.dim));
  for (uint d = tid; d < pc.dim; d += 64u) q_sh[d] = q.v[d];
  barrier();
  F32 o = F32(pc.out_ + 4ul * (uint64_t(t) * Q + uint64_t(h) * pc.dim));
  F32 st = F32(pc.state + 8ul * uint64_t(item));
  float acc[8];
  float mx = -1.0 / 0.0, sum = 0.0;
  for (uint j = 0u; j < 8u; ++j) {
    const uint d = tid + 64u * j;
    acc[j] = (pc.flags & 1u) == 0u && d < pc.dim ? o.v[d] : 0.0;
  }
  if ((pc.flags & 1u) == 0u) {
    mx = st.v[0];
    sum = st.v[1];
  }
  for (uint c0 = s0; c0 < s1; c0 += 64u) {
    const uint cn = min(64u, s1 - c0);
    float sc = -1.0 / 0.0;
    if (tid < cn) {
      F32 k = F32(pc.qkv + 4ul * (uint64_t(c0 + tid) * pc.ld + Q + uint64_t(h) * pc.dim));
      float dot = 0.0;
      for (uint d = 0u; d < pc.dim; ++d) dot += q_sh[d] * k.v[d];
      sc = pc.scale * dot;
    }
    p_sh[tid] = sc;
    barrier();
    float cm = p_sh[0];
    for (uint i = 1u; i < cn; ++i) cm = max(cm, p_sh[i]);
    const float m_new = max(mx, cm);
    const float r = exp(mx - m_new);  // 0 on the first chunk (mx = -inf)
    barrier();
    if (tid < cn) p_sh[tid] = exp(sc - m_new);
    barrier();
    float ps = 0.0;
    for (uint i = 0u; i < cn; ++i) ps += p_sh[i];
    sum = sum * r + ps;
    mx = m_new;
    for (uint j = 0u; j < 8u; ++j) {
      const uint d = tid + 64u * j;
      if (d >= pc.dim) break;
      float a = acc[j] * r;
      for (uint i = 0u; i < cn; ++i)
        a += p_sh[i] * F32AT(pc.qkv + 4ul * (uint64_t(c0 + i) * pc.ld + 2u * Q + uint64_t(h) * pc.dim))[d];
      acc[j] = a;
    }
    barrier();
  }
  const bool last = (pc.flags & 2u) != 0u;
  const float inv = last ? 1.0 / sum : 1.0;
  for (uint j = 0u; j < 8u; ++j) {
    const uint d = tid + 64u * j;
    if (d >= pc.dim) break;
    o.v[d] = acc[j] * inv;
  }
  if (!last && tid == 0u) {
    st.v[0] = mx;
    st.v[1] = sum;
  }
}
