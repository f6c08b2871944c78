// Intel AMX (Advanced Matrix Extensions: Sapphire Rapids, Emerald Rapids, Granite Rapids Xeons): the
// BF16 weights' products on tile registers, prefill and decode alike. A tile multiply (TDPBF16PS) does
// 16 x 16 x 32 bf16 multiply-adds with f32 accumulation, several times the AVX-512 vdpbf16ps rate of the
// same core (prefill); decode reads the weight rows with tile loads (memory-bound either way).
// The products are those of the AVX-512 BF16 kernel (bf16 activations rounded to nearest even, exact
// bf16 x bf16 products, f32 sums); only the order of the f32 additions differs.
//
// Used by matmul(), matmul_rows() and matmul_set() for Precision::Fast BF16 weights, when the CPU has
// AMX-TILE + AMX-BF16, Linux granted the process the tile state (arch_prctl ARCH_REQ_XCOMP_PERM, kernel
// >= 5.16), the matmul level is AVX-512 (so KIMI_ISA=avx2 turns it off too) and KIMI_AMX is not 0.
// Elsewhere (other OSes, other CPUs) the AVX-512 / AVX2 kernels run as before.
#pragma once

#include <cstdint>

#include "backend/mat_view.h"
#include "util/thread_pool.h"

namespace kimi::kern {

// AMX-TILE + AMX-BF16 present, the tile state granted by the OS, the matmul level AVX-512 and KIMI_AMX
// not 0 (checked once; the OS request is made on the first call).
bool amx_bf16_usable();

// Whether AMX computes W's product: Fast precision BF16 weights with cols % 32 == 0, every row and every
// token count (a weight's last rows % 16 zero-padded to a tile). So a row's sum is computed in one order
// whatever the batch (decode and prefill alike), the split of the rows between threads, matmul_rows
// calls or MPI ranks: results do not depend on any of them, as with the AVX-512 kernels.
bool amx_bf16_takes(const MatView& W, int64_t n_tokens);

// Rows [r0, r1) of the Fast-precision product of a BF16 weight with n_tokens f32 rows (y[t * W.rows + r]),
// threaded on pool when given (matmul.cpp: threading and buffers). Returns r1, or r0 having done nothing
// when !amx_bf16_takes(W, n_tokens).
int64_t matmul_amx_bf16(const MatView& W, const float* x, int64_t n_tokens, float* y, ThreadPool* pool, int64_t r0,
                        int64_t r1);

// iters x 4 independent 16 x 16 x 32 tile products (32768 bf16 multiply-adds per iteration): the
// compute peak `kimi bench` states for bf16 when AMX is used (ceiling.cpp).
constexpr int64_t kAmxPeakProductsPerIter = 4 * 16 * 16 * 32;
double amx_bf16_peak_loop(int64_t iters);

// The kernels (matmul_amx.cpp). Token block b (tokens 16b .. 16b + 15 of x, ld = cols, zeros past n) in the
// B operand's pair order: cols / 2 rows of 16 dwords at out.
void amx_bf16_prep(const float* x, int64_t n, int64_t cols, int64_t b, uint32_t* out);
// Weight rows [r0, r0 + nr) (nr = 16 or 32; rows past W.rows count as zero) x token blocks [b0, b1) of the
// prepared activations bt (block b at bt + b * cols / 2 * 16): y[t * ldy + r] for the valid tokens t < n and
// the rows r in [lo, hi). panel: 64-byte aligned scratch of nr * cols * 2 bytes (the rows are copied there
// first), unused (may be null) for one token block of rows that all exist.
void amx_bf16_rows(const MatView& W, const uint32_t* bt, int64_t n, int64_t r0, int nr, int64_t b0, int64_t b1,
                   float* y, int64_t ldy, uint8_t* panel, int64_t lo, int64_t hi);

}  // namespace kimi::kern
