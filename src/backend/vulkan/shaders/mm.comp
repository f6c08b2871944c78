// variants: F32 F16 BF16 Q8_0 Q4_0 Q5_0 Q5_1 MXFP4 Q4_K Q5_K Q6_K Q2_K Q3_K IQ4_XS F32+SG F16+SG BF16+SG Q8_0+SG Q4_0+SG Q5_0+SG Q5_1+SG MXFP4+SG Q4_K+SG Q5_K+SG Q6_K+SG Q2_K+SG Q3_K+SG IQ4_XS+SG
// y[t][r] = sum_c W[r][c] x[t][c] for a weight type (dequant.glsl), f32 activations and sums.
// A tile of up to 8 tokens per workgroup; the z dimension batches independent products: per-head
// slices (z = head: slice z of a stacked weight) or routed experts (sel != 0: slot z uses slice
// sel[z] and input row z / x_div).
// VARIANT_SG (the _sg pipelines, used where the device has subgroup arithmetic): each subgroup
// takes NR = 4 weight rows at a time (2 NR rows per workgroup at 32 lanes, 8 NR on lavapipe), its
// lanes split the rows into units and subgroupAdd reduces them: no shared memory, no barrier. Rows
// are walked with a grid stride, so any workgroup count covers them.
// Portable: 64 threads on one weight row, a shared-memory tree reduction.
// Units: block types (HAVE_DOT32) go by 32 values (a block, or an eighth of a K-quant super-block):
// each lane reads its unit's bytes with 4- or 16-byte loads (dot32, dequant.glsl) and the 32
// activations of a token as 8 vec4 (where the token rows sit on 16 bytes), used for all NR rows;
// one pass per token of the tile (decode: one). Plain types go by 8 values (dq8, 16-byte loads
// where aligned), each decoded once for the tile's tokens.
#version 460
#include "common.glsl"
#include "dequant.glsl"
#if defined(VARIANT_SG)
#extension GL_KHR_shader_subgroup_arithmetic : require
#extension GL_KHR_shader_subgroup_basic : require
#endif
#extension GL_EXT_control_flow_attributes : require

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
#if defined(VARIANT_SG)
const uint NR = 4u;  // rows per subgroup (vulkan_backend.cpp sizes the dispatch by it)
#else
const uint NR = 1u;
shared float red[TT][64];
#endif
layout(buffer_reference, std430, buffer_reference_align = 16) buffer XF4 { vec4 v[]; };

#if defined(HAVE_DOT32)
// the 32 activations at float address a (16-byte loads where al: the token rows sit on 16 bytes)
void ldx32(uint64_t a, bool al, out vec4 xv[8]) {
  if (al) {
    XF4 p = XF4(a);
    [[unroll]] for (uint i = 0u; i < 8u; ++i) xv[i] = p.v[i];
  } else {
    F32 p = F32(a);
    [[unroll]] for (uint i = 0u; i < 8u; ++i) xv[i] = vec4(p.v[4u * i], p.v[4u * i + 1u], p.v[4u * i + 2u], p.v[4u * i + 3u]);
  }
}
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
  const uint64_t x0 = pc.x + 4ul * (xoff + uint64_t(t0) * pc.ldx);  // the tile's first token row
#if defined(VARIANT_SG)
  const uint lane = gl_SubgroupInvocationID, lanes = gl_SubgroupSize;
  const uint first = (gl_WorkGroupID.x * gl_NumSubgroups + gl_SubgroupID) * NR, step = gl_NumWorkGroups.x * gl_NumSubgroups * NR;
#else
  const uint lane = tid, lanes = 64u;
  const uint first = gl_WorkGroupID.x, step = gl_NumWorkGroups.x;
#endif
#if defined(HAVE_DOT32)
  // block types: one pass over the rows per token (the rows' bytes come from the cache after the
  // first), the token's 32 activations of a unit loaded once for the NR rows
  const bool al = (x0 & 15ul) == 0ul && (pc.ldx & 3u) == 0u;
  const uint nunit = pc.cols / 32u;
  for (uint r0 = first; r0 < pc.rows; r0 += step) {
    const uint nr = min(NR, pc.rows - r0);
    for (uint t = 0u; t < nt; ++t) {
      const uint64_t xt = x0 + 4ul * uint64_t(t) * pc.ldx;
      float acc[NR];
      [[unroll]] for (uint k = 0u; k < NR; ++k) acc[k] = 0.0;
      for (uint u = lane; !skip && u < nunit; u += lanes) {
        vec4 xv[8];
        ldx32(xt + 128ul * uint64_t(u), al, xv);
        [[unroll]] for (uint k = 0u; k < NR; ++k)
          if (k < nr) acc[k] += dot32(wbase + uint64_t(r0 + k) * pc.row_bytes, u, xv);
      }
#if defined(VARIANT_SG)
      [[unroll]] for (uint k = 0u; k < NR; ++k) {
        const float sum = subgroupAdd(acc[k]);
        if (k < nr && subgroupElect()) F32(pc.y + 4ul * (yoff + uint64_t(t0 + t) * pc.ldy + r0 + k)).v[0] = sum;
      }
#else
      red[t][tid] = acc[0];
#endif
    }
#if !defined(VARIANT_SG)
    barrier();
    for (uint s = 32u; s > 0u; s >>= 1) {
      if (tid < s)
        for (uint t = 0u; t < TT; ++t) red[t][tid] += red[t][tid + s];
      barrier();
    }
    if (tid < nt) F32(pc.y + 4ul * (yoff + uint64_t(t0 + tid) * pc.ldy + r0)).v[0] = red[tid][0];
    barrier();
#endif
  }
#else
  // plain types: each 8-value chunk decoded once for the tile's tokens
  for (uint r0 = first; r0 < pc.rows; r0 += step) {
    const uint nr = min(NR, pc.rows - r0);
    float acc[TT][NR];
    [[unroll]] for (uint t = 0u; t < TT; ++t)
      [[unroll]] for (uint k = 0u; k < NR; ++k) acc[t][k] = 0.0;
    const uint nchunk = pc.cols / 8u;
    [[unroll]] for (uint k = 0u; k < NR; ++k) {
      if (k >= nr) break;
      const uint64_t row = wbase + uint64_t(r0 + k) * pc.row_bytes;
      for (uint c = lane; !skip && c < nchunk; c += lanes) {
        float v[8];
        dq8(row, c, v);
        [[unroll]] for (uint t = 0u; t < TT; ++t) {
          if (t >= nt) break;
          F32 xv = F32(x0 + 4ul * (uint64_t(t) * pc.ldx + uint64_t(c) * 8ul));
          float s = 0.0;
          for (uint i = 0u; i < 8u; ++i) s += v[i] * xv.v[i];
          acc[t][k] += s;
        }
      }
      for (uint j = nchunk * 8u + lane; !skip && j < pc.cols; j += lanes) {  // tail of a row whose length is not a multiple of 8
        const float wv = dq1(row, j);
        [[unroll]] for (uint t = 0u; t < TT; ++t) {
          if (t >= nt) break;
          acc[t][k] += wv * F32(x0 + 4ul * (uint64_t(t) * pc.ldx + j)).v[0];
        }
      }
    }
#if defined(VARIANT_SG)
    [[unroll]] for (uint t = 0u; t < TT; ++t) {
      if (t >= nt) break;
      [[unroll]] for (uint k = 0u; k < NR; ++k) {
        const float sum = subgroupAdd(acc[t][k]);
        if (k < nr && subgroupElect()) F32(pc.y + 4ul * (yoff + uint64_t(t0 + t) * pc.ldy + r0 + k)).v[0] = sum;
      }
    }
#else
    [[unroll]] for (uint t = 0u; t < TT; ++t) red[t][tid] = acc[t][0];
    barrier();
    for (uint s = 32u; s > 0u; s >>= 1) {
      if (tid < s)
        for (uint t = 0u; t < TT; ++t) red[t][tid] += red[t][tid + s];
      barrier();
    }
    if (tid < nt) F32(pc.y + 4ul * (yoff + uint64_t(t0 + tid) * pc.ldy + r0)).v[0] = red[tid][0];
    barrier();
#endif
  }
#endif
}
