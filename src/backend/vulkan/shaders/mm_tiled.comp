// variants: F32 F16 BF16 Q8_0 Q4_0 Q5_0 Q5_1 MXFP4 Q4_K Q5_K Q6_K Q2_K Q3_K IQ4_XS
// The prefill GEMM: y[t][r] = sum_c W[r][c] x[t][c] for a weight type (dequant.glsl), f32
// activations and sums. A workgroup of 128 threads computes a block of BM = 64 weight rows x
// BN = 32 tokens; per step of BK = 32 columns the weight block is decoded once into shared memory
// (each of its 64 x 4 runs of 8 values by one thread) and the token block copied beside it, then
// every thread accumulates a 4 x 4 register block (rows tm + 16i, tokens tn + 8j) from them. Each
// output is one f32 sum over the columns in order, so a row's result does not depend on which
// tile or which other tokens it was computed with.
// Two modes:
// - plain (groups == 0): the z dimension batches slices: slice z of a stacked weight (slice_bytes
//   apart) against x + z x_batch, y + z y_batch, tokens ldx / ldy floats apart;
// - grouped experts (groups != 0, written by moe_sort.comp): workgroup y is one tile of one expert's
//   tokens: {expert, begin, count} with the slots sorted[begin .. begin + count); slot s reads input
//   row s / x_div (x_batch floats apart) and writes output row s (y_batch apart) with expert's
//   slice; a tile of expert 0xFFFFFFFF (slots routed to no expert here) writes zeros.
#version 460
#include "common.glsl"
#include "dequant.glsl"
#extension GL_EXT_control_flow_attributes : require

layout(local_size_x = 128) in;
layout(push_constant) uniform PC {
  uint64_t w, x, y, slice_bytes;
  uint64_t groups;  // 0, or the address of moe_sort.comp's output
  uint rows, cols, n, row_bytes;
  uint ldx, ldy, x_batch, y_batch;
  uint x_div;
} pc;

layout(buffer_reference, std430, buffer_reference_align = 4) buffer U32 { uint v[]; };

const uint BM = 64u, BN = 32u, BK = 32u;
shared float Ws[BK][BM + 1u];
shared float Xs[BK][BN + 1u];
shared uint64_t xrow[BN];  // float index of each token's input row (~0 for none)
shared uint64_t yrow[BN];

void main() {
  const uint tid = gl_LocalInvocationID.x;
  const uint tm = tid % 16u, tn = tid / 16u;
  uint64_t wbase = pc.w;
  uint ntok;
  bool zero = false;  // grouped: slots routed to no expert on this device get zero rows
  if (pc.groups != 0ul) {
    U32 g = U32(pc.groups);
    const uint tile = gl_WorkGroupID.y;
    if (tile >= g.v[0]) return;  // fewer tiles than the dispatch's upper bound: uniform exit
    const uint e = g.v[4u + 4u * tile], begin = g.v[5u + 4u * tile];
    ntok = g.v[6u + 4u * tile];
    zero = e == 0xFFFFFFFFu;
    wbase += uint64_t(zero ? 0u : e) * pc.slice_bytes;
    if (tid < BN) {
      const uint s = tid < ntok ? g.v[g.v[1] + begin + tid] : 0u;
      xrow[tid] = uint64_t(s / pc.x_div) * pc.x_batch;
      yrow[tid] = uint64_t(s) * pc.y_batch;
    }
  } else {
    const uint z = gl_WorkGroupID.z, t0 = gl_WorkGroupID.y * BN;
    ntok = min(BN, pc.n - t0);
    wbase += uint64_t(z) * pc.slice_bytes;
    if (tid < BN) {
      xrow[tid] = uint64_t(z) * pc.x_batch + uint64_t(t0 + tid) * pc.ldx;
      yrow[tid] = uint64_t(z) * pc.y_batch + uint64_t(t0 + tid) * pc.ldy;
    }
  }
  barrier();
  const uint nrt = (pc.rows + BM - 1u) / BM;
  for (uint rt = gl_WorkGroupID.x; rt < nrt; rt += gl_NumWorkGroups.x) {
    const uint r0 = rt * BM;
    float acc[4][4];
    [[unroll]] for (uint i = 0u; i < 4u; ++i)
      [[unroll]] for (uint j = 0u; j < 4u; ++j) acc[i][j] = 0.0;
    for (uint k0 = 0u; !zero && k0 < pc.cols; k0 += BK) {
      // the weight block: BM rows x BK columns, one run of 8 per thread and pass
      [[unroll]] for (uint q = 0u; q < 2u; ++q) {
        const uint idx = tid + 128u * q, m = idx / 4u, c = idx % 4u;
        const uint r = r0 + m;
        float v[8];
        [[unroll]] for (uint i = 0u; i < 8u; ++i) v[i] = 0.0;
        if (r < pc.rows) {
          const uint64_t row = wbase + uint64_t(r) * pc.row_bytes;
#if defined(PLAIN_TYPE)
          if (k0 + 8u * c + 8u <= pc.cols) {
            dq8(row, k0 / 8u + c, v);  // wide loads where the row is aligned
          } else {
            [[unroll]] for (uint i = 0u; i < 8u; ++i) {
              const uint col = k0 + 8u * c + i;
              if (col < pc.cols) v[i] = dq1(row, col);
            }
          }
#else
          // block types: cols is a multiple of the block (>= 32), so a BK step is whole
          dq8(row, k0 / 8u + c, v);
#endif
        }
        [[unroll]] for (uint i = 0u; i < 8u; ++i) Ws[8u * c + i][m] = v[i];
      }
      // the token block: BN tokens x BK columns, consecutive threads on consecutive columns
      [[unroll]] for (uint q = 0u; q < 8u; ++q) {
        const uint idx = tid + 128u * q, t = idx / BK, k = idx % BK;
        float v = 0.0;
        if (t < ntok && k0 + k < pc.cols) v = F32(pc.x + 4ul * (xrow[t] + uint64_t(k0 + k))).v[0];
        Xs[k][t] = v;
      }
      barrier();
      [[unroll]] for (uint k = 0u; k < BK; ++k) {
        float a[4], b[4];
        [[unroll]] for (uint i = 0u; i < 4u; ++i) a[i] = Ws[k][tm + 16u * i];
        [[unroll]] for (uint j = 0u; j < 4u; ++j) b[j] = Xs[k][tn + 8u * j];
        [[unroll]] for (uint i = 0u; i < 4u; ++i)
          [[unroll]] for (uint j = 0u; j < 4u; ++j) acc[i][j] += a[i] * b[j];
      }
      barrier();
    }
    [[unroll]] for (uint i = 0u; i < 4u; ++i) {
      const uint r = r0 + tm + 16u * i;
      [[unroll]] for (uint j = 0u; j < 4u; ++j) {
        const uint t = tn + 8u * j;
        if (r < pc.rows && t < ntok) F32(pc.y + 4ul * (yrow[t] + uint64_t(r))).v[0] = acc[i][j];
      }
    }
  }
}
