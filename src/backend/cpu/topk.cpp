#include "backend/cpu/topk.h"

#include <algorithm>
#include <cmath>
#include <cstring>

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

namespace {
// An order-preserving map of floats (NaN -> -inf, -0 -> +0 first) to unsigned integers.
inline uint32_t ordered_bits(float s) {
  const float v = key(s) + 0.0f;  // -0 + 0 = +0
  uint32_t u;
  std::memcpy(&u, &v, 4);
  return u & 0x80000000u ? ~u : u | 0x80000000u;
}
}  // namespace

int64_t topk_indices_threshold(const float* scores, int64_t n, int64_t k, int32_t* out, float* tmp) {
  if (k <= 0 || n <= 0) return 0;
  if (k >= n) {
    for (int64_t i = 0; i < n; ++i) out[i] = static_cast<int32_t>(i);
    return n;
  }
  // The k-th largest value, by a radix step: a histogram of the top 12 bits of the ordered
  // keys finds the bucket that holds it, and nth_element runs only on that bucket's values
  // (every value, in the worst case of one bucket). One read of the scores, then one pass that
  // copies the bucket: O(n) with a small constant instead of nth_element over all n.
  constexpr int kBits = 12;
  uint32_t hist[1u << kBits] = {};
  for (int64_t i = 0; i < n; ++i) ++hist[ordered_bits(scores[i]) >> (32 - kBits)];
  uint32_t bucket = (1u << kBits) - 1;
  int64_t higher = 0;  // values in buckets above `bucket`
  while (higher + hist[bucket] < k) higher += hist[bucket--];
  int64_t nb = 0;
  for (int64_t i = 0; i < n; ++i)
    if (ordered_bits(scores[i]) >> (32 - kBits) == bucket) tmp[nb++] = key(scores[i]);
  const int64_t r = k - 1 - higher;  // rank of the k-th largest within the bucket
  std::nth_element(tmp, tmp + r, tmp + nb, [](float a, float b) { return a > b; });
  const float thr = tmp[r];
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
