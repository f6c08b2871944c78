#include "backend/cpu/topk.h"

#include <algorithm>
#include <cmath>

namespace kimi::kern {

namespace {
// strict weak order: higher score first, then lower index; NaN treated as -inf
inline float key(float s) { return std::isnan(s) ? -INFINITY : s; }
struct Better {
  bool operator()(const ScoreIdx& a, const ScoreIdx& b) const {
    const float x = key(a.score), y = key(b.score);
    if (x != y) return x > y;
    return a.idx < b.idx;
  }
};

int64_t select(const float* scores, int64_t n, int64_t k, ScoreIdx* scratch) {
  if (k <= 0 || n <= 0) return 0;
  if (k > n) k = n;
  for (int64_t i = 0; i < n; ++i) scratch[i] = {scores[i], static_cast<int32_t>(i)};
  if (k < n) std::nth_element(scratch, scratch + (k - 1), scratch + n, Better{});
  return k;
}
}  // namespace

int64_t topk_indices(const float* scores, int64_t n, int64_t k, int32_t* out, ScoreIdx* scratch) {
  k = select(scores, n, k, scratch);
  for (int64_t i = 0; i < k; ++i) out[i] = scratch[i].idx;
  std::sort(out, out + k);
  return k;
}

int64_t topk_indices_threshold(const float* scores, int64_t n, int64_t k, int32_t* out, float* tmp) {
  if (k <= 0 || n <= 0) return 0;
  if (k >= n) {
    for (int64_t i = 0; i < n; ++i) out[i] = static_cast<int32_t>(i);
    return n;
  }
  for (int64_t i = 0; i < n; ++i) tmp[i] = key(scores[i]);
  std::nth_element(tmp, tmp + (k - 1), tmp + n, [](float a, float b) { return a > b; });
  const float thr = tmp[k - 1];
  int64_t above = 0;
  for (int64_t i = 0; i < n; ++i) above += key(scores[i]) > thr;
  int64_t equal_left = k - above, m = 0;
  for (int64_t i = 0; i < n; ++i) {
    const float v = key(scores[i]);
    if (v > thr || (v == thr && equal_left-- > 0)) out[m++] = static_cast<int32_t>(i);
  }
  return m;
}

int64_t topk_ranked(const float* scores, int64_t n, int64_t k, int32_t* out, ScoreIdx* scratch) {
  k = select(scores, n, k, scratch);
  std::sort(scratch, scratch + k, Better{});
  for (int64_t i = 0; i < k; ++i) out[i] = scratch[i].idx;
  return k;
}

}  // namespace kimi::kern
