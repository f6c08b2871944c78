#include "backend/cpu/vec.h"

#include "backend/cpu/dispatch.h"
#include "tensor/types.h"

namespace kimi::kern::vec {

static inline bool simd() { return family_isa(KernelFamily::Vec) == Isa::Avx512; }

void bf16_to_f32_row(const uint16_t* x, float* y, int64_t n) {
  if (simd()) return bf16_to_f32_row_avx512(x, y, n);
  for (int64_t i = 0; i < n; ++i) y[i] = bf16_to_f32(x[i]);
}

void f32_to_bf16_row(const float* x, uint16_t* y, int64_t n) {
  if (simd()) return f32_to_bf16_row_avx512(x, y, n);
  for (int64_t i = 0; i < n; ++i) y[i] = f32_to_bf16(x[i]);
}

float dot_bf16_f32(const uint16_t* a, const float* b, int64_t n) {
  if (simd()) return dot_bf16_f32_avx512(a, b, n);
  float s[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  for (int64_t i = 0; i < n; ++i) s[i & 7] += bf16_to_f32(a[i]) * b[i];
  return ((s[0] + s[1]) + (s[2] + s[3])) + ((s[4] + s[5]) + (s[6] + s[7]));
}

#if !defined(__x86_64__)
void bf16_to_f32_row_avx512(const uint16_t* x, float* y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] = bf16_to_f32(x[i]);
}
void f32_to_bf16_row_avx512(const float* x, uint16_t* y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] = f32_to_bf16(x[i]);
}
float dot_bf16_f32_avx512(const uint16_t* a, const float* b, int64_t n) {
  float s = 0;
  for (int64_t i = 0; i < n; ++i) s += bf16_to_f32(a[i]) * b[i];
  return s;
}
#endif

}  // namespace kimi::kern::vec
