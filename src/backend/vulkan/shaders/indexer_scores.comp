// DSA indexer scores of one query against the keys of one sequence:
//   scores[s] = sum_h w[h] * max(0, q_h . key(s)),  s < n_visible
// A small GEMM (positions x heads over the key dimension) with the ReLU-weighted head sum fused.
// Workgroup = a tile of 64 positions; its 64 threads each own 8 positions x 8 heads of a
// 64-head block (thread (tp, th): positions tp + 8i, heads th + 8j). The keys and query heads
// are staged through shared memory KB dimensions at a time (coalesced loads, zero past the
// edges). Per position, the head sum runs over each thread's 8 heads, then over the 8 head
// groups in order, then over the head blocks in order (a later dispatch of more head blocks
// continues the sums in memory: the host splits very wide heads x dims products on a cpu device,
// whose invocations may loop only 65535 times). Keys are f16 or f32 rows of DI elements. The
// visible-row count and the group counts (an indirect dispatch) are staged data, not push constants,
// so that decode steps replay one command buffer (vk_runtime.h).
#version 460
#include "common.glsl"

#define TP 64u  // positions per tile
#define TH 64u  // heads per block
#define KB 32u  // key dimensions per staging step

layout(local_size_x = 64) in;
layout(push_constant) uniform PC {
  uint64_t keys, q, w, scores;
  uint64_t dyn;  // staged: the dispatch's group counts (3 uints), then the visible rows
  uint DI, HI, f16;
  uint h_first, h_end;  // this dispatch's heads (a multiple of TH, and the end)
  uint accumulate;      // 1: add to the scores an earlier dispatch wrote (later heads)
} pc;

shared float ks[TP][KB + 1u];  // +1: rows fall in different banks
shared float qh[TH][KB + 1u];
shared float red[8][TP];

void main() {
  const uint tid = gl_LocalInvocationID.x, tp = tid >> 3u, th = tid & 7u;
  F32 q = F32(pc.q);
  F32 w = F32(pc.w);
  const uint nvis = uint(I32(pc.dyn).v[3]);  // from memory: a step's count never changes the command buffer
  for (uint s0 = gl_WorkGroupID.x * TP; s0 < nvis; s0 += gl_NumWorkGroups.x * TP) {
    float total = 0.0;  // position s0 + tid
    if (pc.accumulate != 0u && s0 + tid < nvis) total = F32(pc.scores).v[s0 + tid];
    for (uint h0 = pc.h_first; h0 < pc.h_end; h0 += TH) {
      float d[8][8];
      for (uint i = 0u; i < 8u; ++i)
        for (uint j = 0u; j < 8u; ++j) d[i][j] = 0.0;
      for (uint k0 = 0u; k0 < pc.DI; k0 += KB) {
        barrier();  // the previous step's readers are done
        for (uint e = tid; e < TP * KB; e += 64u) {
          const uint r = e / KB, kk = e % KB, s = s0 + r, k = k0 + kk;
          float kv = 0.0;
          if (s < nvis && k < pc.DI) {
            const uint64_t at = uint64_t(s) * pc.DI + k;
            kv = pc.f16 != 0u ? f16_at(pc.keys + 2ul * at) : F32(pc.keys + 4ul * at).v[0];
          }
          ks[r][kk] = kv;
          const uint h = h0 + r;
          qh[r][kk] = h < pc.h_end && k < pc.DI ? q.v[h * pc.DI + k] : 0.0;
        }
        barrier();
        for (uint kk = 0u; kk < KB; ++kk) {
          float kv[8];
          for (uint i = 0u; i < 8u; ++i) kv[i] = ks[tp + 8u * i][kk];
          for (uint j = 0u; j < 8u; ++j) {
            const float qv = qh[th + 8u * j][kk];
            for (uint i = 0u; i < 8u; ++i) d[i][j] += kv[i] * qv;
          }
        }
      }
      // ReLU-weighted sum over this thread's heads, per position
      for (uint i = 0u; i < 8u; ++i) {
        float part = 0.0;
        for (uint j = 0u; j < 8u; ++j) {
          const uint h = h0 + th + 8u * j;
          if (h < pc.h_end && d[i][j] > 0.0) part += w.v[h] * d[i][j];
        }
        red[th][tp + 8u * i] = part;
      }
      barrier();
      for (uint g = 0u; g < 8u; ++g) total += red[g][tid];
    }
    if (s0 + tid < nvis) F32(pc.scores).v[s0 + tid] = total;
  }
}
