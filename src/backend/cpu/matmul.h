// Matrix products for every weight type (F32, F16, BF16, Q8_0, Q4_0, Q5_0, Q5_1, MXFP4, Q4_K, Q5_K,
// Q6_K), with run-time ISA dispatch (scalar / AVX2 / AVX-512).
// W is a GGUF 2-D weight (or one 2-D slice of a 3-D stacked tensor): `rows` = ne[1] output
// features, `cols` = ne[0] input features, rows stored one after another (row_bytes apart).
#pragma once
#include <cstdint>

#include "backend/mat_view.h"
#include "tensor/types.h"
#include "util/thread_pool.h"

namespace kimi::kern {

// The weight view and the precision are the backend-neutral ones (backend/mat_view.h).
using kimi::MatView;
using kimi::Precision;

// y[t*rows + r] = sum_c W[r][c] * x[t*cols + c]  for t < n_tokens (x, y row-major f32).
// n_tokens == 1 takes the GEMV path; larger n_tokens the blocked GEMM path. Threads over rows
// (and token tiles). No allocation after the first call with a given size (thread-local scratch).
// Batch invariance: for every weight type and layout (plain or packed, repack.h), token t's row of a
// product with fewer than kBatchInvariantTokens tokens is the same bits as matmul of token t alone
// (Matmul.BatchRowEqualsAlone); larger batches may take other kernels (AMX tiles, packed Q5_K / Q6_K).
constexpr int64_t kBatchInvariantTokens = 16;
void matmul(const MatView& W, const float* x, int64_t n_tokens, float* y, ThreadPool& pool,
            Precision prec = Precision::Fast);

// y[i] = W[i] x for `count` weights that read the same input (one token or several): for one token
// the activations are prepared once per activation kind and every weight's row chunks go to the
// pool as ONE job (one wake-up and one barrier instead of `count`); each y[i] is bit-identical to
// matmul(*W[i], x, n_tokens, y[i]). Several tokens: one matmul each.
void matmul_set(const MatView* const* W, float* const* y, int count, const float* x, int64_t n_tokens,
                ThreadPool& pool, Precision prec = Precision::Fast);

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
