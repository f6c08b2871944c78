// Matrix products for every weight type (F32, F16, BF16, Q8_0, Q4_0, Q5_0, Q5_1, MXFP4, Q4_K, Q5_K,
// Q6_K), with run-time ISA dispatch (scalar / AVX2 / AVX-512).
// W is a GGUF 2-D weight (or one 2-D slice of a 3-D stacked tensor): `rows` = ne[1] output
// features, `cols` = ne[0] input features, rows stored one after another (row_bytes apart).
#pragma once
#include <cstdint>

#include "tensor/types.h"
#include "util/thread_pool.h"

namespace kimi::kern {

struct MatView {
  GgmlType type = GgmlType::F32;
  const uint8_t* data = nullptr;
  int64_t rows = 0;       // output features
  int64_t cols = 0;       // input features (multiple of the type's block size)
  uint64_t row_bytes = 0; // bytes per row (row_bytes(type, cols))
};

// Precision::Fast: activations are rounded to the weight's dot type (bf16 for BF16, f16 for F16,
//   Q8_0 blocks for Q8_0/MXFP4/Q4_0, Q8_K for K-quants), int32/f32 accumulation.
// Precision::F32: weights are decoded to f32 on the fly and dotted with f32 activations.
enum class Precision { Fast, F32 };

// y[t*rows + r] = sum_c W[r][c] * x[t*cols + c]  for t < n_tokens (x, y row-major f32).
// n_tokens == 1 takes the GEMV path; larger n_tokens the blocked GEMM path. Threads over rows
// (and token tiles). No allocation after the first call with a given size (thread-local scratch).
void matmul(const MatView& W, const float* x, int64_t n_tokens, float* y, ThreadPool& pool,
            Precision prec = Precision::Fast);

// Same without threading (the caller is already parallel), over rows [r0, r1).
void matmul_rows(const MatView& W, const float* x, int64_t n_tokens, float* y, int64_t r0, int64_t r1,
                 Precision prec = Precision::Fast);

// Decode row r of W into f32 (cols values). For tests, embedding lookups and reference paths.
void dequantize_row(const MatView& W, int64_t r, float* out);
void dequantize(GgmlType type, const void* src, float* dst, int64_t n);  // n multiple of block size

// Which ISA the dispatcher picked ("avx512", "avx2", "scalar"); KIMI_ISA=scalar|avx2|avx512 env
// overrides it (down only) so tests can run every path on one machine.
const char* active_isa();

}  // namespace kimi::kern
