// AVX-512 bf16 row helpers (only called after the dispatch check in vec.cpp).
#include "backend/cpu/vec.h"

#if defined(__x86_64__)
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <immintrin.h>

namespace kimi::kern::vec {

namespace {
inline __mmask16 mask16(int64_t n) { return n >= 16 ? static_cast<__mmask16>(0xffff) : static_cast<__mmask16>((1u << n) - 1); }
inline __m512 widen(__m256i h) { return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16)); }
}  // namespace

void bf16_to_f32_row_avx512(const uint16_t* x, float* y, int64_t n) {
  for (int64_t i = 0; i < n; i += 16) {
    const __mmask16 m = mask16(n - i);
    _mm512_mask_storeu_ps(y + i, m, widen(_mm256_maskz_loadu_epi16(m, x + i)));
  }
}

void f32_to_bf16_row_avx512(const float* x, uint16_t* y, int64_t n) {
  for (int64_t i = 0; i < n; i += 16) {
    const __mmask16 m = mask16(n - i);
    const __m256bh b = _mm512_cvtneps_pbh(_mm512_maskz_loadu_ps(m, x + i));
    _mm256_mask_storeu_epi16(y + i, m, reinterpret_cast<const __m256i&>(b));
  }
}

float dot_bf16_f32_avx512(const uint16_t* a, const float* b, int64_t n) {
  __m512 acc0 = _mm512_setzero_ps(), acc1 = _mm512_setzero_ps();
  int64_t i = 0;
  for (; i + 32 <= n; i += 32) {
    acc0 = _mm512_fmadd_ps(widen(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(a + i))), _mm512_loadu_ps(b + i), acc0);
    acc1 = _mm512_fmadd_ps(widen(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(a + i + 16))),
                           _mm512_loadu_ps(b + i + 16), acc1);
  }
  for (; i < n; i += 16) {
    const __mmask16 m = mask16(n - i);
    acc0 = _mm512_fmadd_ps(widen(_mm256_maskz_loadu_epi16(m, a + i)), _mm512_maskz_loadu_ps(m, b + i), acc0);
  }
  return _mm512_reduce_add_ps(_mm512_add_ps(acc0, acc1));
}

}  // namespace kimi::kern::vec
#endif
