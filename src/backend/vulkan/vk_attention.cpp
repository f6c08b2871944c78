// The Vulkan backend's MLA attention and DSA indexer ops (vk_backend_impl.h).
//
// mla_attention (shaders/mla_attn*.comp): a token's visited rows form a list (the selection, or
// every visible position); the list is cut into chunks of 64 rows and `splits` workgroups per
// (token, head) take every splits-th chunk with an online softmax, so the work follows the rows
// actually visited (top-k), never the context. With splits > 1 the partials (m, l, acc) go to
// the attention scratch and mla_attn_combine merges them. On a cpu device (lavapipe, whose
// invocations stop looping after 65535 iterations) the chunks are issued in windows of a few
// dispatches, the running state kept in that scratch between them. The dense path walks every visible
// position and scores unselected ones -inf, reading a per-token selection bitmask built first.
// indexer_scores (shaders/indexer_scores.comp): a tiled positions x heads product (8 x 8 per
// thread) with the ReLU-weighted head sum fused. indexer_topk (shaders/topk.comp): one workgroup, radix select of the k-th key on the
// float bits, then an ordered compaction — the same set as the CPU's threshold select.
#include <algorithm>
#include <cstdlib>
#include <limits>

#include "backend/vulkan/vk_backend_impl.h"
#include "util/error.h"

namespace kimi {

namespace {


constexpr int64_t kChunk = 64;        // rows per chunk (mla_attn.comp CH)
constexpr int64_t kMaxSplits = 8;     // workgroups per (token, head) at most
constexpr int64_t kTargetGroups = 1024;  // enough workgroups to fill a device
constexpr int64_t kMaxRow = 2048;     // mla_attn.comp QMAX
constexpr int64_t kMaxLatent = 1024;  // mla_attn.comp 64 * ZMAX
// lavapipe (Mesa's llvmpipe, a "cpu" device) silently ends an invocation's loops after 65535
// iterations counted over all its loops: there, a dispatch stays within this many
constexpr int64_t kLoopBudget = 32768;

// chunks of each split one mla_attn dispatch may take: all of them on a GPU, a loop-budget
// window on a cpu device; KIMI_VULKAN_ATTN_WINDOW=<chunks> forces a window (tests)
int64_t attn_window(const vk::DeviceInfo& dev, int64_t W) {
  if (const char* w = std::getenv("KIMI_VULKAN_ATTN_WINDOW")) {
    const long v = std::strtol(w, nullptr, 10);
    check(v > 0, "KIMI_VULKAN_ATTN_WINDOW={} is not a positive number of chunks", w);
    return v;
  }
  if (dev.type != "cpu") return std::numeric_limits<int64_t>::max();
  // per chunk: the score loop (~W per invocation) and the rows' accumulation, with margin
  return std::max<int64_t>(1, kLoopBudget / (W + 1400));
}

}  // namespace

void VulkanBackend::mla_attention(const CacheRows& latent, int64_t kvl, const BatchEntry* e, int64_t n, int64_t H,
                                  const float* qcat, const int32_t* sel_idx, const int32_t* sel_n, int64_t sel_cap,
                                  float scale, AttnPath path, float* z) {
  if (n <= 0 || H <= 0) return;
  const int64_t W = latent.width;
  check(W <= kMaxRow, "vulkan: mla_attention row width {} (at most {})", W, kMaxRow);
  check(kvl > 0 && kvl <= W && kvl <= kMaxLatent, "vulkan: mla_attention kv_lora {} (row width {}, at most {})", kvl,
        W, kMaxLatent);
  check(H <= 65535, "vulkan: mla_attention with {} heads (at most 65535)", H);
  int64_t max_vis = 0;  // rows any token can visit: its visible positions
  for (int64_t t = 0; t < n; ++t) {
    check(e[t].pos >= 0 && e[t].pos < latent.n_ctx && e[t].seq_id >= 0,
          "vulkan: mla_attention token {}: position {} outside the cache's {} rows (sequence {})", t, e[t].pos,
          latent.n_ctx, e[t].seq_id);
    max_vis = std::max<int64_t>(max_vis, static_cast<int64_t>(e[t].pos) + 1);
  }
  const bool dense = path == AttnPath::Dense;
  const int64_t chunks = (max_vis + kChunk - 1) / kChunk;
  // below the GEMM switch (decode, a speculative verify step) the split count depends on the heads
  // only, not on the batch or how far its rows see: each row's sums then go in the order of the same
  // token decoded alone (splits that get no chunk are empty in the combine; docs/gpu.md, "Batch
  // invariance"); larger batches (prefill) split only while the grid is small
  const int64_t splits = n < gemm_min_ ? std::clamp<int64_t>(kTargetGroups / H, 1, kMaxSplits)
                                       : std::clamp<int64_t>(std::min(chunks, kTargetGroups / (n * H)), 1, kMaxSplits);
  const int64_t mask_words = dense ? (max_vis + 31) / 32 : 0;
  const int64_t per_split = (chunks + splits - 1) / splits;  // chunks one split may walk
  const int64_t window = std::min(per_split, attn_window(rt_.info(), W));
  const int64_t windows = std::max<int64_t>(1, (per_split + window - 1) / window);
  const uint64_t mask_bytes = static_cast<uint64_t>(n * mask_words) * 4;
  const uint64_t part_bytes =
      splits > 1 || windows > 1 ? static_cast<uint64_t>(n * H * splits * (kvl + 2)) * 4 : 0;
  uint8_t* scratch = mask_bytes + part_bytes > 0 ? static_cast<uint8_t*>(op_scratch(0, mask_bytes + part_bytes)) : nullptr;
  const uint64_t mask = dev_addr(scratch), part = dev_addr(scratch) + mask_bytes;
  const uint64_t ents = stage_entries(e, n);  // after op_scratch: a growing scratch submits

  if (dense) {
    rt_.fill_zero(mask, mask_bytes);
    struct {
      uint64_t sel_idx, sel_n, mask;
      uint32_t n, sel_cap, mask_words;
    } mp{dev_addr(sel_idx), dev_addr(sel_n), mask, u32(n, "tokens"), u32(sel_cap, "selection capacity"),
         u32(mask_words, "mask words")};
    rt_.dispatch(pipe("mla_attn_mask"), &mp, sizeof(mp), groups(n));
  }
  struct {
    uint64_t latent, qcat, sel_idx, sel_n, ents, part, mask, z;
    uint32_t W, kvl, H, n, sel_cap, n_ctx, f16, splits, mask_words;
    float scale;
    uint32_t w_first, w_count, load_state, final_z, vec;
  } pc{dev_addr(latent.data), dev_addr(qcat), dev_addr(sel_idx), dev_addr(sel_n), ents, part, mask, dev_addr(z),
       u32(W, "row width"), u32(kvl, "kv_lora"), u32(H, "heads"), u32(n, "tokens"), u32(sel_cap, "selection capacity"),
       u32(latent.n_ctx, "n_ctx"), latent.f16 ? 1u : 0u, static_cast<uint32_t>(splits), u32(mask_words, "mask words"),
       scale, 0, static_cast<uint32_t>(window), 0, 0,
       // 4-element row reads: whole vectors per row and per latent part, rows 16-byte aligned
       W % 4 == 0 && kvl % 4 == 0 && dev_addr(latent.data) % 16 == 0 ? 1u : 0u};
  static_assert(sizeof(pc) <= 128, "push constants");
  vk::Pipeline& attn = pipe(dense ? "mla_attn_dense" : "mla_attn_sparse");
  for (int64_t w = 0; w < windows; ++w) {
    pc.w_first = static_cast<uint32_t>(w * window);
    pc.load_state = w > 0 ? 1u : 0u;
    pc.final_z = w == windows - 1 && splits == 1 ? 1u : 0u;
    rt_.dispatch(attn, &pc, sizeof(pc), static_cast<uint32_t>(splits), static_cast<uint32_t>(H), groups(n));
  }
  if (splits > 1) {
    struct {
      uint64_t part, z;
      uint32_t kvl, H, n, splits;
    } cp{part, dev_addr(z), static_cast<uint32_t>(kvl), static_cast<uint32_t>(H), static_cast<uint32_t>(n),
         static_cast<uint32_t>(splits)};
    rt_.dispatch(pipe("mla_attn_combine"), &cp, sizeof(cp), static_cast<uint32_t>(H), groups(n));
  }
}

void VulkanBackend::indexer_scores(const CacheRows& keys, int32_t seq, const float* q, const float* w,
                                   int64_t n_heads, int64_t n_visible, float* scores) {
  if (n_visible <= 0) return;
  check(keys.width > 0, "vulkan: indexer key width {}", keys.width);
  if (n_heads <= 0) {  // no head contributes
    fill_zero(scores, static_cast<uint64_t>(n_visible) * 4);
    return;
  }
  check(seq >= 0 && n_visible <= keys.n_ctx, "vulkan: indexer_scores sequence {} with {} visible rows ({} in the cache)",
        seq, n_visible, keys.n_ctx);
  // the visible rows change every decode step: staged with the group counts (an indirect dispatch),
  // so that the command buffer stays the same (vk_runtime.h, replay)
  const uint32_t dyn_host[4] = {groups((n_visible + 63) / 64), 1, 1, u32(n_visible, "visible rows")};
  const uint64_t dyn = rt_.stage(dyn_host, sizeof(dyn_host));
  struct {
    uint64_t keys, q, w, scores, dyn;
    uint32_t DI, HI, f16, h_first, h_end, accumulate;
  } pc{dev_addr(keys.row(seq, 0)), dev_addr(q), dev_addr(w), dev_addr(scores), dyn, u32(keys.width, "key width"),
       u32(n_heads, "indexer heads"), keys.f16 ? 1u : 0u, 0, 0, 0};
  // head blocks (64 heads) per dispatch: all on a GPU; within the loop budget on a cpu device
  const int64_t blocks = (n_heads + 63) / 64;
  int64_t per = blocks;
  if (rt_.info().type == "cpu") {
    const int64_t per_block = (keys.width + 31) / 32 * 72 + 96;  // loop iterations of one head block
    check(per_block <= kLoopBudget, "vulkan: indexer key width {} is too wide for this cpu device's loop limit",
          keys.width);
    per = std::max<int64_t>(1, kLoopBudget / per_block);
  }
  for (int64_t b = 0; b < blocks; b += per) {
    pc.h_first = static_cast<uint32_t>(b * 64);
    pc.h_end = static_cast<uint32_t>(std::min(n_heads, (b + per) * 64));
    pc.accumulate = b > 0 ? 1u : 0u;
    rt_.dispatch_indirect(pipe("indexer_scores"), &pc, sizeof(pc), dyn);
  }
}

void VulkanBackend::indexer_topk(const float* scores, int64_t n, int64_t k, int32_t* sel, int32_t* sel_n, float* tmp) {
  (void)tmp;  // the select works on the scores in place
  if (n <= 0 || k <= 0) {
    set_i32(sel_n, 1, 0);
    return;
  }
  check(n < (int64_t{1} << 31), "vulkan: indexer_topk over {} scores (at most 2^31 - 1)", n);
  // topk.comp loops ~6 n / 256 + 1300 times per invocation: within a cpu device's loop limit
  check(rt_.info().type != "cpu" || n <= (int64_t{1} << 21),
        "vulkan: indexer_topk over {} scores exceeds this cpu device's loop limit (at most 2^21)", n);
  const uint32_t dyn[2] = {static_cast<uint32_t>(n), static_cast<uint32_t>(std::min(k, n))};  // staged: see indexer_scores
  struct {
    uint64_t scores, sel, sel_n, dyn;
  } pc{dev_addr(scores), dev_addr(sel), dev_addr(sel_n), rt_.stage(dyn, sizeof(dyn))};
  rt_.dispatch(pipe("topk"), &pc, sizeof(pc), 1);
}

}  // namespace kimi
