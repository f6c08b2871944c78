// The Vulkan backend's KDA ops and the MoE router (vk_backend_impl.h). Shaders: kda_conv.comp,
// kda_gate.comp, kda_scan.comp (per token), kda_chunk.comp (chunks of 16 tokens), router.comp.
// The gate's output is the log-space decay (the CPU backend's f32 form) at every precision;
// kda_scan reads that form.
//
// Token windows: the conv and the scan walk the tokens in order inside each invocation, and
// lavapipe (Mesa's llvmpipe) stops an invocation's loops after 65535 iterations counted over all
// of its loops together (LP_MAX_TGSI_LOOP_ITERATIONS), silently. A batch is therefore issued as
// consecutive windows of tokens, one dispatch each, sized to stay far below that count; the
// semantics are unchanged because the tokens are processed in batch order either way.
#include <algorithm>
#include <cstdlib>
#include <cstring>

#include "backend/vulkan/vk_backend_impl.h"
#include "util/error.h"

namespace kimi {

namespace {


constexpr int64_t kLoopBudget = 32768;  // loop iterations one invocation may spend per dispatch
constexpr int64_t kScanMaxD = 256;   // kda_scan.comp MAXD
constexpr int64_t kChunkMaxD = 128;  // kda_chunk.comp MAXD
constexpr uint32_t kChunkShared = (3 * 16 * 128 + 2 * 16 * 16 + 128 + 2 * 16 + 2) * 4;  // its shared memory

// The chunked scan pays off when the sequences of a batch have many tokens each (prefill); a
// decode batch (one token per sequence) takes the per-token kernel, and so does a batch of fewer
// than min_tokens (the matmuls' GEMM switch, gemm_min_) tokens per sequence: a speculative verify
// step's rows then get the bits each would get decoded alone (docs/gpu.md, "Batch invariance").
// KIMI_VULKAN_KDA_SCAN=seq or =chunk forces one kernel (the tests run both on the same data).
bool use_chunked(const BatchEntry* e, int64_t n, int64_t min_tokens) {
  if (const char* f = std::getenv("KIMI_VULKAN_KDA_SCAN")) {
    if (std::strcmp(f, "seq") == 0) return false;
    if (std::strcmp(f, "chunk") == 0) return true;
  }
  if (n < min_tokens) return false;
  uint64_t seen[64] = {};  // distinct sequences below 4096 (others count once each)
  int64_t distinct = 0;
  for (int64_t t = 0; t < n; ++t) {
    const uint32_t s = static_cast<uint32_t>(e[t].seq_id);
    if (s >= 4096) {
      ++distinct;
    } else if (!(seen[s / 64] >> (s % 64) & 1)) {
      seen[s / 64] |= uint64_t{1} << (s % 64);
      ++distinct;
    }
  }
  return n >= min_tokens * distinct;
}

}  // namespace

void VulkanBackend::kda_conv_silu(const float* const w[3], int64_t K, int64_t C, const SeqStates& conv,
                                  const BatchEntry* e, int64_t n, float* const x[3]) {
  if (n <= 0 || C <= 0) return;
  check(K >= 1, "vulkan: kda_conv_silu kernel size {} (at least 1)", K);
  check(conv.per_seq >= 3 * C * (K - 1), "vulkan: kda_conv_silu state of {} floats per sequence < 3 x {} x {}",
        conv.per_seq, C, K - 1);
  u32(n * C, "kda_conv_silu tokens x channels");
  const uint64_t ents = stage_entries(e, n);
  const int64_t window = std::max<int64_t>(1, kLoopBudget / (2 * K + 2));  // ~2K iterations per token
  for (int64_t t0 = 0; t0 < n; t0 += window) {
    const int64_t m = std::min(window, n - t0);
    const uint64_t xo = static_cast<uint64_t>(t0 * C) * 4;
    struct {
      uint64_t w0, w1, w2, x0, x1, x2, state, ents, per_seq;
      uint32_t K, C, n;
    } pc{dev_addr(w[0]), dev_addr(w[1]), dev_addr(w[2]), dev_addr(x[0]) + xo, dev_addr(x[1]) + xo,
         dev_addr(x[2]) + xo, dev_addr(conv.data), ents + static_cast<uint64_t>(t0) * sizeof(BatchEntry),
         static_cast<uint64_t>(conv.per_seq), u32(K, "conv kernel"), u32(C, "conv channels"), u32(m, "tokens")};
    rt_.dispatch(pipe("kda_conv"), &pc, sizeof(pc), groups((3 * C + 63) / 64));
  }
}

void VulkanBackend::kda_gate(float* g, const float* dt_bias, const float* a, int64_t n, int64_t H, int64_t D,
                             const KdaGateParams& p) {
  if (n <= 0 || H <= 0 || D <= 0) return;
  struct {
    uint64_t g, dtb, a;
    uint32_t count, C, D, has_lb;
    float lb;
  } pc{dev_addr(g), dev_addr(dt_bias), dev_addr(a), u32(n * H * D, "kda_gate elements"), u32(H * D, "kda channels"),
       u32(D, "kda head dim"), p.has_lower_bound ? 1u : 0u, p.lower_bound};
  rt_.dispatch(pipe("kda_gate"), &pc, sizeof(pc), groups((n * H * D + 255) / 256));
}

void VulkanBackend::kda_scan(const SeqStates& rec, const BatchEntry* e, int64_t n, int64_t H, int64_t D,
                             const float* q, const float* k, const float* v, const float* g, const float* beta,
                             float scale, float* o) {
  if (n <= 0 || H <= 0 || D <= 0) return;
  check(D <= kScanMaxD, "vulkan: kda_scan head dim {} (at most {})", D, kScanMaxD);
  check(H <= 65535, "vulkan: kda_scan over {} heads (at most 65535)", H);
  check(rec.per_seq >= H * D * D, "vulkan: kda_scan state of {} floats per sequence < {} heads x {}^2", rec.per_seq,
        H, D);
  u32(n * H * D, "kda_scan tokens x channels");
  const uint64_t ents = stage_entries(e, n);
  const bool chunked = D <= kChunkMaxD && rt_.info().shared_memory >= kChunkShared && use_chunked(e, n, gemm_min_);
  // loop iterations per token of one invocation: per-token kernel ~2D per owned column (+ the
  // window's first-token scan); chunked kernel ~(2D + 48) per token plus the pair sums
  const int64_t cols = (D + 127) / 128;
  const int64_t per_token = chunked ? 2 * D + 64 + (16 * 17 / 2 * (D + 16) + 127) / 128 : 2 * D * cols + 8;
  const int64_t window = std::max<int64_t>(16, kLoopBudget / per_token / 16 * 16);
  const int64_t C = H * D;
  for (int64_t t0 = 0; t0 < n; t0 += window) {
    const int64_t m = std::min(window, n - t0);
    const uint64_t ro = static_cast<uint64_t>(t0 * C) * 4;
    struct {
      uint64_t q, k, v, g, beta, o, state, ents, per_seq;
      uint32_t n, H, D;
      float scale;
    } pc{dev_addr(q) + ro, dev_addr(k) + ro, dev_addr(v) + ro, dev_addr(g) + ro,
         dev_addr(beta) + static_cast<uint64_t>(t0 * H) * 4, dev_addr(o) + ro, dev_addr(rec.data),
         ents + static_cast<uint64_t>(t0) * sizeof(BatchEntry), static_cast<uint64_t>(rec.per_seq), u32(m, "tokens"),
         u32(H, "heads"), u32(D, "head dim"), scale};
    rt_.dispatch(pipe(chunked ? "kda_chunk" : "kda_scan"), &pc, sizeof(pc), groups(m), static_cast<uint32_t>(H));
  }
}

void VulkanBackend::moe_route(float* logits, const float* bias, int64_t n, const RouterParams& p, float* probs,
                              int32_t* sel, float* weights) {
  if (n <= 0) return;
  check(p.n_expert > 0 && p.n_used > 0 && p.n_used <= p.n_expert,
        "vulkan: moe_route chooses {} of {} experts (need 0 < n_used <= n_expert)", p.n_used, p.n_expert);
  u32(n * p.n_expert, "router tokens x experts");
  struct {
    uint64_t logits, bias, probs, sel, weights;
    uint32_t n, E, k, softmax, renorm;
    float scale;
  } pc{dev_addr(logits), dev_addr(bias), dev_addr(probs), dev_addr(sel), dev_addr(weights), u32(n, "tokens"),
       u32(p.n_expert, "experts"), u32(p.n_used, "experts used"), p.softmax ? 1u : 0u, p.renormalize ? 1u : 0u,
       p.scale};
  rt_.dispatch(pipe("router"), &pc, sizeof(pc), groups(n));
}

}  // namespace kimi
