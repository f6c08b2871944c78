// Non-x86 builds: the AVX-512 engine kernels (ops/attention/kda *_avx512.cpp) are not compiled,
// and the dispatch never puts a family above scalar there, so these definitions are never called; they
// only satisfy the linker.
#if !defined(__x86_64__)
#include <cstdlib>

#include "backend/cpu/ops_simd.h"

namespace kimi::kern::avx512 {
float dot_f32(const float* a, const float* b, int64_t n) { std::abort(); }
double sum_sq(const float* x, int64_t n) { std::abort(); }
float dot_f16(const float* a, const uint16_t* b, int64_t n) { std::abort(); }
void axpy_f32(float a, const float* x, float* y, int64_t n) { std::abort(); }
void axpy_f16(float a, const uint16_t* x, float* y, int64_t n) { std::abort(); }
void f16_to_f32_row(const uint16_t* x, float* y, int64_t n) { std::abort(); }
void f32_to_f16_row(const float* x, uint16_t* y, int64_t n) { std::abort(); }
void sigmoid_inplace(float* x, int64_t n) { std::abort(); }
void silu(const float* x, float* y, int64_t n) { std::abort(); }
void situ(const float* g, const float* u, float* out, int64_t n, float beta, float lambda) { std::abort(); }
void mul_sigmoid(float* x, const float* gate, int64_t n) { std::abort(); }
void exp_row(const float* x, float* y, int64_t n) { std::abort(); }
void indexer_scores(const float* q, const float* w, int64_t H, const void* keys, bool f16, int64_t D, int64_t n, float* scores) { std::abort(); }
void block_scores(const float* q, const float* const* rows, int64_t nb, int64_t W, float* out) { std::abort(); }
void attn_accumulate(float* z, int64_t nh, int64_t r, const float* const* rows, int64_t nb, const float* p, int64_t p_stride) { std::abort(); }
void kda_step(float* S, const float* q, const float* k, const float* v, const float* g, bool g_is_decay, float beta, float scale, float* o, int64_t D, float* p) { std::abort(); }
}  // namespace kimi::kern::avx512
#endif
