// int8 DSA indexer keys (the opt-in --indexer-int8 cache): a key row of n values is stored as
//   int8 q[n] | f32 scale | int32 sum(q),   q[i] = round-half-even(x[i] / scale), scale = max|x| / 127
// (scale 0 and q = 0 for an all-zero row), so a score q_h . k is scale * (q_h . q_k) with an exact
// integer dot product. The same quantization (max|x| / 127 per head) is used for the queries.
#pragma once
#include <cmath>
#include <cstdint>
#include <cstring>

namespace kimi {

inline float quantize_i8_row(const float* x, int64_t n, int8_t* q, int32_t* sum) {
  float amax = 0.0f;
  for (int64_t i = 0; i < n; ++i) amax = std::fmax(amax, std::fabs(x[i]));
  const float scale = amax / 127.0f;
  int32_t s = 0;
  for (int64_t i = 0; i < n; ++i) {
    const int v = scale > 0.0f ? static_cast<int>(std::nearbyint(x[i] / scale)) : 0;
    q[i] = static_cast<int8_t>(v < -127 ? -127 : v > 127 ? 127 : v);
    s += q[i];
  }
  *sum = s;
  return scale;
}

// One cache row (n + 8 bytes at out) from n f32 values.
inline void quantize_key_i8(const float* x, int64_t n, uint8_t* out) {
  int32_t sum = 0;
  const float scale = quantize_i8_row(x, n, reinterpret_cast<int8_t*>(out), &sum);
  std::memcpy(out + n, &scale, 4);
  std::memcpy(out + n + 4, &sum, 4);
}

}  // namespace kimi
