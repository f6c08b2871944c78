// variants: F32 F16 BF16 Q8_0 Q4_0 Q5_0 Q5_1 MXFP4 Q4_K Q5_K Q6_K Q2_K Q3_K IQ4_XS F32+SG F16+SG BF16+SG Q8_0+SG Q4_0+SG Q5_0+SG Q5_1+SG MXFP4+SG Q4_K+SG Q5_K+SG Q6_K+SG Q2_K+SG Q3_K+SG IQ4_XS+SG
// y[t][r] = sum_c W[r][c] x[t][c] for a weight type (dequant.glsl), f32 activations and sums.
// A tile of up to 8 tokens per workgroup; the z dimension batches independent products: per-head
// slices (z = head: slice z of a stacked weight) or routed experts (sel != 0: slot z uses slice
// sel[z] and input row z / x_div).
// VARIANT_SG (the _sg pipelines, used where the device has subgroup arithmetic): each subgroup
// takes its own weight row (64 / subgroup size rows per workgroup: 2 at 32 lanes, 8 on lavapipe),
// its lanes split the row into 8-value chunks and subgroupAdd reduces them; no shared memory, no
// barrier. Rows are walked with a grid stride, so any workgroup count covers them.
// Portable: 64 threads on one weight row, a shared-memory tree reduction.
#version 460
#include "common.glsl"
#include "dequant.glsl"
#if defined(VARIANT_SG)
#extension GL_KHR_shader_subgroup_arithmetic : require
#extension GL_KHR_shader_subgroup_basic : require
#endif

layout(local_size_x = 64) in;
layout(push_constant) uniform PC {
  uint64_t w, x, y, sel;
  uint64_t slice_bytes;  // bytes between the slices of a stacked weight
  uint rows, cols, n, row_bytes;
  uint ldx, ldy;          // floats between consecutive tokens in x / y
  uint x_batch, y_batch;  // floats between consecutive z items in x / y
  uint x_div;             // expert mode: input row = z / x_div
} pc;

const uint TT = 8u;
#if !defined(VARIANT_SG)
shared float red[TT][64];
#endif

void main() {
  const uint tid = gl_LocalInvocationID.x;
  const uint z = gl_WorkGroupID.z;
  const uint t0 = gl_WorkGroupID.y * TT;
  const uint nt = min(TT, pc.n - t0);
  uint64_t wbase = pc.w;
  uint64_t xoff, yoff;
  bool skip = false;  // a routed slot with expert < 0 (held by another rank): its rows are 0
  if (pc.sel != 0ul) {
    const int e = I32(pc.sel).v[z];
    skip = e < 0;
    wbase += uint64_t(max(e, 0)) * pc.slice_bytes;
    xoff = uint64_t(z / pc.x_div) * pc.x_batch;
  } else {
    wbase += uint64_t(z) * pc.slice_bytes;
    xoff = uint64_t(z) * pc.x_batch;
  }
  yoff = uint64_t(z) * pc.y_batch;
  const uint nchunk = pc.cols / 8u;
#if defined(VARIANT_SG)
  const uint lane = gl_SubgroupInvocationID, lanes = gl_SubgroupSize;
  for (uint r = gl_WorkGroupID.x * gl_NumSubgroups + gl_SubgroupID; r < pc.rows; r += gl_NumWorkGroups.x * gl_NumSubgroups) {
    const uint64_t row = wbase + uint64_t(r) * pc.row_bytes;
    float acc[TT];
    for (uint t = 0u; t < TT; ++t) acc[t] = 0.0;
    for (uint c = lane; !skip && c < nchunk; c += lanes) {
      float v[8];
      dq8(row, c, v);
      for (uint t = 0u; t < nt; ++t) {
        F32 xv = F32(pc.x + 4ul * (xoff + uint64_t(t0 + t) * pc.ldx + uint64_t(c) * 8ul));
        float s = 0.0;
        for (uint i = 0u; i < 8u; ++i) s += v[i] * xv.v[i];
        acc[t] += s;
      }
    }
#if defined(PLAIN_TYPE)
    for (uint j = nchunk * 8u + lane; !skip && j < pc.cols; j += lanes) {
      const float wv = dq1(row, j);
      for (uint t = 0u; t < nt; ++t) acc[t] += wv * F32(pc.x + 4ul * (xoff + uint64_t(t0 + t) * pc.ldx + j)).v[0];
    }
#endif
    for (uint t = 0u; t < TT; ++t) {
      const float sum = subgroupAdd(acc[t]);
      if (t < nt && subgroupElect()) F32(pc.y + 4ul * (yoff + uint64_t(t0 + t) * pc.ldy + r)).v[0] = sum;
    }
  }
#else
  for (uint r = gl_WorkGroupID.x; r < pc.rows; r += gl_NumWorkGroups.x) {
    const uint64_t row = wbase + uint64_t(r) * pc.row_bytes;
    float acc[TT];
    for (uint t = 0u; t < TT; ++t) acc[t] = 0.0;
    for (uint c = tid; !skip && c < nchunk; c += 64u) {
      float v[8];
      dq8(row, c, v);
      for (uint t = 0u; t < nt; ++t) {
        const uint64_t xa = pc.x + 4ul * (xoff + uint64_t(t0 + t) * pc.ldx + uint64_t(c) * 8ul);
        F32 xv = F32(xa);
        float s = 0.0;
        for (uint i = 0u; i < 8u; ++i) s += v[i] * xv.v[i];
        acc[t] += s;
      }
    }
#if defined(PLAIN_TYPE)
    for (uint j = nchunk * 8u + tid; !skip && j < pc.cols; j += 64u) {  // tail of a row whose length is not a multiple of 8
      const float wv = dq1(row, j);
      for (uint t = 0u; t < nt; ++t) acc[t] += wv * F32(pc.x + 4ul * (xoff + uint64_t(t0 + t) * pc.ldx + j)).v[0];
    }
#endif
    for (uint t = 0u; t < TT; ++t) red[t][tid] = acc[t];
    barrier();
    for (uint s = 32u; s > 0u; s >>= 1) {
      if (tid < s)
        for (uint t = 0u; t < TT; ++t) red[t][tid] += red[t][tid + s];
      barrier();
    }
    if (tid < nt) F32(pc.y + 4ul * (yoff + uint64_t(t0 + tid) * pc.ldy + r)).v[0] = red[tid][0];
    barrier();
  }
#endif
}
