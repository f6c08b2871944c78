// The Vulkan backend's ops of the DSpark draft (silu_mul_rows, rope_rows: docs/spec/dspark.md §3)
// and of the MoonViT vision tower (gelu, rope_2d, segment_attention: docs/spec/vision.md §3).
#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <limits>

#include "backend/vulkan/vk_backend_impl.h"
#include "util/error.h"

namespace kimi {

void VulkanBackend::silu_mul_rows(float* g, const float* u, int64_t n, int64_t width) {
  eltwise(7, g, u, static_cast<uint64_t>(n * width));
}

namespace {
struct RopePc {
  uint64_t x, ents, cs;
  uint32_t ld, n, heads, head_stride, half_pairs;
};
// invocations of rope.comp (256 a workgroup) for `items` pairs
uint32_t rope_groups(int64_t items) { return groups((items + 255) / 256); }
}  // namespace

void VulkanBackend::rope_rows(float* x, int64_t ld, const BatchEntry* e, int64_t n, int64_t n_heads,
                              int64_t head_stride, int64_t n_rot, const float* cs) {
  const int64_t half = n_rot / 2;
  if (n <= 0 || n_heads <= 0 || half <= 0) return;
  check(n * n_heads * half < (int64_t{1} << 32), "vulkan: rope_rows over {} pairs (at most 2^32 - 1)",
        n * n_heads * half);
  RopePc pc{dev_addr(x), stage_entries(e, n), dev_addr(cs), u32(ld, "ld"), u32(n, "rows"), u32(n_heads, "heads"),
            u32(head_stride, "head stride"), u32(half, "rotated pairs")};
  rt_.dispatch(pipe("rope_rows"), &pc, sizeof(pc), rope_groups(n * n_heads * half));
}

void VulkanBackend::gelu(float* x, int64_t count, bool tanh_approx) {
  eltwise(tanh_approx ? 8 : 9, x, nullptr, static_cast<uint64_t>(count));
}

void VulkanBackend::rope_2d(float* x, int64_t ld, int64_t n, int64_t heads, int64_t D, const int32_t* row,
                            const int32_t* col, float theta) {
  check(D % 4 == 0 && D <= 1024, "rope_2d: head_dim {} (a multiple of 4, at most 1024)", D);
  if (n <= 0 || heads <= 0 || D <= 0) return;
  // (row, col) pairs and the cos/sin table of every position up to the largest, made as the CPU
  // backend makes its angles (double product rounded to float, then libm's float cos / sin)
  int32_t top = 0;
  host_i32_.resize(static_cast<size_t>(2 * n));
  for (int64_t t = 0; t < n; ++t) {
    check(row[t] >= 0 && col[t] >= 0, "rope_2d: row {} has a negative position ({}, {})", t, row[t], col[t]);
    top = std::max({top, row[t], col[t]});
    host_i32_[static_cast<size_t>(2 * t)] = row[t];
    host_i32_[static_cast<size_t>(2 * t + 1)] = col[t];
  }
  const int64_t quarter = D / 4;
  host_f32_.resize(static_cast<size_t>((int64_t(top) + 1) * quarter * 2));
  for (int64_t j = 0; j < quarter; ++j) {
    const double w = std::pow(static_cast<double>(theta), -4.0 * static_cast<double>(j) / static_cast<double>(D));
    for (int64_t p = 0; p <= top; ++p) {
      const float a = static_cast<float>(static_cast<double>(p) * w);
      host_f32_[static_cast<size_t>((p * quarter + j) * 2)] = std::cos(a);
      host_f32_[static_cast<size_t>((p * quarter + j) * 2 + 1)] = std::sin(a);
    }
  }
  const uint64_t pos = rt_.stage(host_i32_.data(), host_i32_.size() * 4);
  const uint64_t tab = rt_.stage(host_f32_.data(), host_f32_.size() * 4);
  check(n * heads * (D / 2) < (int64_t{1} << 32), "vulkan: rope_2d over {} pairs (at most 2^32 - 1)", n * heads * (D / 2));
  RopePc pc{dev_addr(x), pos, tab, u32(ld, "ld"), u32(n, "rows"), u32(heads, "heads"), u32(D, "head_dim"),
            u32(D / 2, "pairs")};
  rt_.dispatch(pipe("rope_twod"), &pc, sizeof(pc), rope_groups(n * heads * (D / 2)));
}

void VulkanBackend::segment_attention(const float* qkv, int64_t ld, int64_t n, int64_t H, int64_t D,
                                      const int64_t* seg, int64_t n_seg, float scale, float* out) {
  check(D <= 512, "segment_attention: head_dim {} (at most 512)", D);
  check(n_seg >= 1 && seg[0] == 0 && seg[n_seg] == n, "segment_attention: segments do not cover the {} rows", n);
  if (n <= 0 || H <= 0) return;
  host_i32_.resize(static_cast<size_t>(n_seg + 1));
  for (int64_t i = 0; i <= n_seg; ++i) {
    check(i == 0 || seg[i] >= seg[i - 1], "segment_attention: segment bound {} ({}) before the previous one", i, seg[i]);
    host_i32_[static_cast<size_t>(i)] = static_cast<int32_t>(u32(seg[i], "segment bound"));
  }
  const uint64_t bounds = rt_.stage(host_i32_.data(), host_i32_.size() * 4);
  int64_t longest = 0;
  for (int64_t i = 0; i < n_seg; ++i) longest = std::max(longest, seg[i + 1] - seg[i]);
  const int64_t items = n * H;
  check(items < (int64_t{1} << 32), "vulkan: segment_attention over {} rows x heads", items);
  // keys per dispatch: all on a GPU; on a cpu device (lavapipe ends an invocation's loops after
  // 65535 iterations) windows of chunks within a loop budget: per 64-key chunk the dot product (D),
  // the chunk's max and sum (2 x 64) and the value sums (64 per 64 output values)
  int64_t window = std::numeric_limits<int64_t>::max() / 2;
  if (const char* w = std::getenv("KIMI_VULKAN_SEG_WINDOW")) {
    const long v = std::strtol(w, nullptr, 10);
    check(v > 0, "KIMI_VULKAN_SEG_WINDOW={} is not a positive number of 64-key chunks", w);
    window = v * 64;
  } else if (rt_.info().type == "cpu") {
    window = std::max<int64_t>(1, 32768 / (D + 160 + (D + 63) / 64 * 66)) * 64;
  }
  const bool one_window = longest <= window;
  void* state = one_window ? nullptr : op_scratch(0, static_cast<uint64_t>(items) * 8);
  struct {
    uint64_t qkv, seg, out, state;
    uint32_t ld, n, heads, dim, n_seg;
    float scale;
    uint32_t item0, win0, win1, flags;
  } pc{dev_addr(qkv), bounds, dev_addr(out), dev_addr(state), u32(ld, "ld"), u32(n, "rows"), u32(H, "heads"),
       u32(D, "head_dim"), u32(n_seg, "segments"), scale, 0, 0, 0, 0};
  for (int64_t w0 = 0; w0 < std::max<int64_t>(longest, 1); w0 += window) {
    const int64_t w1 = std::min(longest, w0 + window);
    pc.win0 = u32(w0, "key window");
    pc.win1 = u32(one_window ? longest : w1, "key window");
    pc.flags = (w0 == 0 ? 1u : 0u) | (w1 >= longest ? 2u : 0u);
    for (int64_t i0 = 0; i0 < items; i0 += 65535) {
      pc.item0 = static_cast<uint32_t>(i0);
      rt_.dispatch(pipe("seg_attn"), &pc, sizeof(pc), groups(std::min<int64_t>(65535, items - i0)));
    }
  }
}

}  // namespace kimi
