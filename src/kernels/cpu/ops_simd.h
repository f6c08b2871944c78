// Internal: AVX-512 versions of the vector primitives in ops.h (defined in ops_avx512.cpp,
// only called after a run-time CPU check).
#pragma once
#include <cstdint>

namespace kimi::kern::avx512 {
float dot_f32(const float* a, const float* b, int64_t n);
float dot_f16(const float* a, const uint16_t* b, int64_t n);
void axpy_f32(float a, const float* x, float* y, int64_t n);
void axpy_f16(float a, const uint16_t* x, float* y, int64_t n);
void f16_to_f32_row(const uint16_t* x, float* y, int64_t n);
void f32_to_f16_row(const float* x, uint16_t* y, int64_t n);
// kda_avx512.cpp (D % 16 == 0)
void kda_step(float* S, const float* q, const float* k, const float* v, const float* g, float beta, float scale,
              float* o, int64_t D, float* p);
}  // namespace kimi::kern::avx512
