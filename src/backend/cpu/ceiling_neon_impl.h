// The loops the three NEON ceiling files share (included by ceiling_neon*.cpp, each compiled for
// its level): 128-bit stream reads and the fmla.4s chain.
#pragma once
#if defined(__aarch64__)
#include <arm_neon.h>

#include "backend/cpu/ceiling.h"

namespace kimi::kern::detail {
namespace {

template <int S>
uint64_t neon_read_s(const uint8_t* p, size_t bytes) {
  uint64x2_t acc[S];
  for (int s = 0; s < S; ++s) acc[s] = vdupq_n_u64(0);
  const size_t part = bytes / S;
  for (size_t off = 0; off < part; off += 256) {
    _Pragma("GCC unroll 8") for (int s = 0; s < S; ++s) {
      const uint64_t* q = reinterpret_cast<const uint64_t*>(p + s * part + off);
      uint64x2_t a = vdupq_n_u64(0), b = vdupq_n_u64(0);
      _Pragma("GCC unroll 8") for (int k = 0; k < 32; k += 4) {
        a = vaddq_u64(a, vld1q_u64(q + k));
        b = vaddq_u64(b, vld1q_u64(q + k + 2));
      }
      acc[s] = vaddq_u64(acc[s], vaddq_u64(a, b));
    }
  }
  uint64x2_t t = acc[0];
  for (int s = 1; s < S; ++s) t = vaddq_u64(t, acc[s]);
  return vgetq_lane_u64(t, 0) + vgetq_lane_u64(t, 1);
}

inline uint64_t neon_read(const uint8_t* p, size_t bytes, int streams, bool) {
  switch (streams) {
    case 1: return neon_read_s<1>(p, bytes);
    case 2: return neon_read_s<2>(p, bytes);
    case 4: return neon_read_s<4>(p, bytes);
    case 8: return neon_read_s<8>(p, bytes);
    default: {
      uint64_t t = 0;
      const size_t part = bytes / static_cast<size_t>(streams);
      for (int s = 0; s < streams; ++s) t += neon_read_s<1>(p + static_cast<size_t>(s) * part, part);
      return t;
    }
  }
}

constexpr int kNeonAcc = 16;  // 32 registers: 16 chains

inline double neon_sum(const float32x4_t* acc, int n) {
  double t = 0;
  for (int a = 0; a < n; ++a)
    for (int l = 0; l < 4; ++l) t += static_cast<double>(acc[a][l]);
  return t;
}
inline double neon_sum(const int32x4_t* acc, int n) {
  double t = 0;
  for (int a = 0; a < n; ++a)
    for (int l = 0; l < 4; ++l) t += static_cast<double>(acc[a][l]);
  return t;
}

inline double neon_peak_f32(int64_t iters, int one) {
  float32x4_t acc[kNeonAcc];
  for (auto& a : acc) a = vdupq_n_f32(0.0f);
  const float32x4_t x = vdupq_n_f32(static_cast<float>(one));
  for (int64_t i = 0; i < iters; ++i) {
    _Pragma("GCC unroll 16") for (int a = 0; a < kNeonAcc; ++a) acc[a] = vfmaq_f32(acc[a], x, x);
  }
  return neon_sum(acc, kNeonAcc);
}

}  // namespace
}  // namespace kimi::kern::detail
#endif
