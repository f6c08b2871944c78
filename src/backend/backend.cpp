// Copies between backends and the default DSA selection (backend.h).
#include "backend/backend.h"

#include <vector>

#include "util/error.h"
#include "util/per_thread.h"

namespace kimi {

void copy_between(Backend& to, void* dst, Backend& from, const void* src, uint64_t bytes) {
  if (bytes == 0) return;
  if (&to == &from) return to.copy(dst, src, bytes);
  from.sync();
  if (from.host_visible()) return to.upload(dst, src, bytes);
  if (to.host_visible()) return from.download(dst, src, bytes);
  // device to device: through a host staging buffer (grows once to the largest copy)
  auto& staging = per_thread<std::vector<uint8_t>, struct CopyStaging>();
  if (staging.size() < bytes) staging.resize(bytes);
  from.download(staging.data(), src, bytes);
  to.upload(dst, staging.data(), bytes);
}

void Backend::indexer_select(const CacheRows& keys, const BatchEntry* e, int64_t n, const float* q, const float* w,
                             int64_t n_heads, int64_t k, int32_t* sel, int64_t sel_cap, int32_t* sel_n, float* scores,
                             float* tmp) {
  const int64_t qw = n_heads * keys.width;
  for (int64_t t = 0; t < n; ++t) {
    const int64_t n_visible = static_cast<int64_t>(e[t].pos) + 1;
    if (k >= n_visible) {  // everything visible is selected: plain attention, no scoring
      set_i32(sel_n + t, 1, -1);
      continue;
    }
    indexer_scores(keys, e[t].seq_id, q + t * qw, w + t * n_heads, n_heads, n_visible, scores);
    indexer_topk(scores, n_visible, k, sel + t * sel_cap, sel_n + t, tmp);
  }
}

void Backend::silu_mul_rows(float*, const float*, int64_t, int64_t) {
  fail("backend {}: silu_mul_rows is not supported (the DSpark draft runs on the CPU or Vulkan backend)", name());
}

void Backend::rope_rows(float*, int64_t, const BatchEntry*, int64_t, int64_t, int64_t, int64_t, const float*) {
  fail("backend {}: rope_rows is not supported (the DSpark draft runs on the CPU or Vulkan backend)", name());
}

void Backend::gelu(float*, int64_t, bool) {
  fail("backend {}: gelu is not supported (the vision tower runs on the CPU or Vulkan backend)", name());
}
void Backend::rope_2d(float*, int64_t, int64_t, int64_t, int64_t, const int32_t*, const int32_t*, float) {
  fail("backend {}: rope_2d is not supported (the vision tower runs on the CPU or Vulkan backend)", name());
}
void Backend::segment_attention(const float*, int64_t, int64_t, int64_t, int64_t, const int64_t*, int64_t, float,
                                float*) {
  fail("backend {}: segment_attention is not supported (the vision tower runs on the CPU or Vulkan backend)", name());
}

void Backend::axpy(float*, float, const float*, int64_t) {
  fail("backend {}: axpy is not supported (the distributed forward pass needs the CPU backend)", name());
}

}  // namespace kimi
