// SIMD row helpers for 16-bit float rows (dispatched: AVX-512 when available and not disabled by
// KIMI_ISA, portable scalar otherwise). f16 rows and f32 dot/axpy are in ops.h (kern::dot_f16,
// kern::f16_to_f32_row, ...); these complete them for bf16 (embeddings, BF16 caches/weights).
#pragma once
#include <cstdint>

namespace kimi::kern::vec {

void bf16_to_f32_row(const uint16_t* x, float* y, int64_t n);  // exact
void f32_to_bf16_row(const float* x, uint16_t* y, int64_t n);  // round to nearest even
float dot_bf16_f32(const uint16_t* a, const float* b, int64_t n);  // sum a[i]*b[i], f32 accumulation

// internal: AVX-512 versions (vec_avx512.cpp)
void bf16_to_f32_row_avx512(const uint16_t* x, float* y, int64_t n);
void f32_to_bf16_row_avx512(const float* x, uint16_t* y, int64_t n);
float dot_bf16_f32_avx512(const uint16_t* a, const float* b, int64_t n);

}  // namespace kimi::kern::vec
