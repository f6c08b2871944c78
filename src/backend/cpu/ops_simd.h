// Internal: the SIMD versions of the vector primitives in ops.h, one set per ISA level that has
// them: AVX-512 (ops_avx512.cpp, attention_avx512.cpp, kda_avx512.cpp) and NEON (ops_neon.cpp).
// The entry points in ops.cpp, attention.cpp and kda.cpp call them through simd_ops(family): the
// table of the level the dispatch puts that family at, or null where it runs the portable code.
#pragma once
#include <cstdint>

#include "backend/cpu/dispatch.h"

namespace kimi::kern::avx512 {
float dot_f32(const float* a, const float* b, int64_t n);
double sum_sq(const float* x, int64_t n);
float dot_f16(const float* a, const uint16_t* b, int64_t n);
void axpy_f32(float a, const float* x, float* y, int64_t n);
void axpy_f16(float a, const uint16_t* x, float* y, int64_t n);
void f16_to_f32_row(const uint16_t* x, float* y, int64_t n);
void f32_to_f16_row(const float* x, uint16_t* y, int64_t n);
void sigmoid_inplace(float* x, int64_t n);
void silu(const float* x, float* y, int64_t n);
void situ(const float* g, const float* u, float* out, int64_t n, float beta, float lambda);
void mul_sigmoid(float* x, const float* gate, int64_t n);
void exp_row(const float* x, float* y, int64_t n);
// attention_avx512.cpp (D % 16 == 0, D <= 256, H <= 256)
void indexer_scores(const float* q, const float* w, int64_t H, const void* keys, bool f16, int64_t D, int64_t n,
                    float* scores);
// attention_avx512.cpp: attention.h's indexer_scores_i8 (H <= 64, D % 4 == 0)
void indexer_scores_i8(const uint8_t* qp, int64_t H, const uint8_t* keys, int64_t D, int64_t n, float* scores);
// attention_avx512.cpp: attention.h's indexer_scores_prepared (H <= 64, D % 16 == 0, D <= 256)
void indexer_scores_prepared(const float* qp, int64_t H, const void* keys, bool f16, int64_t D, int64_t n,
                             float* scores);
// out[j] = q . rows[j][:W] for j < nb <= 16 (W % 16 == 0)
void block_scores(const float* q, const float* const* rows, int64_t nb, int64_t W, float* out);
// z[h][:r] += sum_j p[h * p_stride + j] * rows[j][:r]  (r % 16 == 0)
void attn_accumulate(float* z, int64_t nh, int64_t r, const float* const* rows, int64_t nb, const float* p,
                     int64_t p_stride);
// kda_avx512.cpp (D % 16 == 0)
// g_is_decay: g holds exp(g) already
void kda_step(float* S, const float* q, const float* k, const float* v, const float* g, bool g_is_decay, float beta,
              float scale, float* o, int64_t D, float* p);
// the chunked form (kda.h kda_chunk; D % 16 == 0, L <= 16)
bool kda_chunk(float* S, const float* q, const float* k, const float* v, const float* g, bool g_is_decay,
               const float* beta, int64_t ld, int64_t ldb, int64_t L, float scale, float* o, int64_t D, float* work);
}  // namespace kimi::kern::avx512

namespace kimi::kern::neon {  // ops_neon.cpp (same contracts)
float dot_f32(const float* a, const float* b, int64_t n);
double sum_sq(const float* x, int64_t n);
float dot_f16(const float* a, const uint16_t* b, int64_t n);
void axpy_f32(float a, const float* x, float* y, int64_t n);
void axpy_f16(float a, const uint16_t* x, float* y, int64_t n);
void f16_to_f32_row(const uint16_t* x, float* y, int64_t n);
void f32_to_f16_row(const float* x, uint16_t* y, int64_t n);
void sigmoid_inplace(float* x, int64_t n);
void silu(const float* x, float* y, int64_t n);
void situ(const float* g, const float* u, float* out, int64_t n, float beta, float lambda);
void mul_sigmoid(float* x, const float* gate, int64_t n);
void exp_row(const float* x, float* y, int64_t n);
// attention_avx512.cpp (D % 16 == 0, D <= 256, H <= 256)
void indexer_scores(const float* q, const float* w, int64_t H, const void* keys, bool f16, int64_t D, int64_t n,
                    float* scores);
// out[j] = q . rows[j][:W] for j < nb <= 16 (W % 16 == 0)
void block_scores(const float* q, const float* const* rows, int64_t nb, int64_t W, float* out);
// z[h][:r] += sum_j p[h * p_stride + j] * rows[j][:r]  (r % 16 == 0)
void attn_accumulate(float* z, int64_t nh, int64_t r, const float* const* rows, int64_t nb, const float* p,
                     int64_t p_stride);
// kda_avx512.cpp (D % 16 == 0)
// g_is_decay: g holds exp(g) already
void kda_step(float* S, const float* q, const float* k, const float* v, const float* g, bool g_is_decay, float beta,
              float scale, float* o, int64_t D, float* p);
}  // namespace kimi::kern::neon

namespace kimi::kern {
struct SimdOps {
  float (*dot_f32)(const float* a, const float* b, int64_t n);
  double (*sum_sq)(const float* x, int64_t n);
  float (*dot_f16)(const float* a, const uint16_t* b, int64_t n);
  void (*axpy_f32)(float a, const float* x, float* y, int64_t n);
  void (*axpy_f16)(float a, const uint16_t* x, float* y, int64_t n);
  void (*f16_to_f32_row)(const uint16_t* x, float* y, int64_t n);
  void (*f32_to_f16_row)(const float* x, uint16_t* y, int64_t n);
  void (*sigmoid_inplace)(float* x, int64_t n);
  void (*silu)(const float* x, float* y, int64_t n);
  void (*situ)(const float* g, const float* u, float* out, int64_t n, float beta, float lambda);
  void (*mul_sigmoid)(float* x, const float* gate, int64_t n);
  void (*exp_row)(const float* x, float* y, int64_t n);
  void (*indexer_scores)(const float* q, const float* w, int64_t H, const void* keys, bool f16, int64_t D, int64_t n,
                         float* scores);
  void (*block_scores)(const float* q, const float* const* rows, int64_t nb, int64_t W, float* out);
  void (*attn_accumulate)(float* z, int64_t nh, int64_t r, const float* const* rows, int64_t nb, const float* p,
                          int64_t p_stride);
  void (*kda_step)(float* S, const float* q, const float* k, const float* v, const float* g, bool g_is_decay,
                   float beta, float scale, float* o, int64_t D, float* p);
  // null where the level has none (the portable code runs)
  void (*indexer_scores_i8)(const uint8_t* qp, int64_t H, const uint8_t* keys, int64_t D, int64_t n, float* scores);
  bool (*kda_chunk)(float* S, const float* q, const float* k, const float* v, const float* g, bool g_is_decay,
                    const float* beta, int64_t ld, int64_t ldb, int64_t L, float scale, float* o, int64_t D,
                    float* work);
  void (*indexer_scores_prepared)(const float* qp, int64_t H, const void* keys, bool f16, int64_t D, int64_t n,
                                  float* scores);
};
// The table of the level family f runs at now (family_isa), null for the portable code
// (ops_simd_tables.cpp).
const SimdOps* simd_ops(KernelFamily f);
}  // namespace kimi::kern
