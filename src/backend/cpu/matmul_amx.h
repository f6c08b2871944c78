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
// The int8 tiles (TDPBSSD) serve MXFP4 / Q4_0 / Q8_0 and the packed Q4_K / Q5_K products with >= 16 tokens,
// bit-identical to the AVX-512 kernels they replace (the sections at the end of this header).
#pragma once

#include <cstddef>
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
// The same for the int8 tiles: iters x 4 independent 16 x 16 x 64 TDPBSSD products (65536 int8
// multiply-adds per iteration): the INT8 TILES peak (ceiling.h).
constexpr int64_t kAmxInt8PeakProductsPerIter = 4 * 16 * 16 * 64;
double amx_int8_peak_loop(int64_t iters);

// The kernels (matmul_amx.cpp). Token block b (tokens 16b .. 16b + 15 of x, ld = cols, zeros past n) in the
// B operand's pair order (per column step of 32, 16 rows of 16 dwords) into bt, which holds the (n + 15) / 16
// token blocks K-block major: [K block of kAmxKSteps steps][token block][step] (n * cols * 2 bytes, rounded up
// to token blocks; with one token block, step s at bt + 256 s).
void amx_bf16_prep(const float* x, int64_t n, int64_t cols, int64_t b, uint32_t* bt);
// Weight rows [r0, r0 + nr) (nr = 16 or 32; rows past W.rows count as zero) x the first token block of
// the prepared activations bt (n <= 16 tokens: decode, short prompts): y[t * ldy + r] for t < n and the rows
// r in [lo, hi). pk: W's packed copy in the tile order (repack.h, PackedWeight::data; r0 a multiple of 32)
// or nullptr: then the rows are tile-loaded in place, and a block past the weight's last row goes through
// panel (64-byte aligned scratch of nr * cols * 2 bytes). The same results either way.
void amx_bf16_rows(const MatView& W, const uint32_t* bt, int64_t n, int64_t r0, int nr, float* y, int64_t ldy,
                   uint8_t* panel, int64_t lo, int64_t hi, const uint8_t* pk);

// Prefill (>= 2 token blocks): items of up to kAmxRowBlock weight rows x up to kAmxTokenGroup token blocks,
// K-blocked by kAmxKSteps column steps of 32 (matmul_amx.cpp: run_block). Rows [r0, r0 + nrows) (rows past
// W.rows count as zero) x token blocks [b0, b1) into y as amx_bf16_rows does; scratch: 64-byte aligned,
// kAmxBlockScratch bytes; pk as in amx_bf16_rows (r0 a multiple of 32). A C element gets the same tile
// products in the same order as
// in amx_bf16_rows: a token's result does not depend on the batch it came in.
constexpr int kAmxRowBlock = 256, kAmxKSteps = 8, kAmxTokenGroup = 32;
constexpr size_t kAmxBlockScratch =
    static_cast<size_t>(kAmxRowBlock) * kAmxKSteps * 64 + static_cast<size_t>(kAmxRowBlock) * kAmxTokenGroup * 16 * 4;
void amx_bf16_block(const MatView& W, const uint32_t* bt, int64_t n, int64_t r0, int64_t nrows, int64_t b0, int64_t b1,
                    float* y, int64_t ldy, uint8_t* scratch, int64_t lo, int64_t hi, const uint8_t* pk);

// ---- AMX-INT8: MXFP4, Q4_0 and Q8_0 weights, prefill (>= 16 tokens) ----
// The AVX-512 path for >= 16 tokens (matmul_avx512.cpp, run_lanes) sums each 32-value block exactly in
// int32 (vpdpbusd) and then adds y += float(block sum) * (dx * dw) block by block. Here a tile product
// (TDPBSSD, signed weights x signed Q8_0 activations, K = 32 = one block) gives the same 16 rows x 16 tokens
// of exact block sums, and the same f32 update follows in the same order: the results are bit-identical to
// those of run_lanes, i.e. to the AVX-512 kernels wherever they use it (token tiles of >= 16 tokens).
// Used by matmul() and matmul_rows() for Precision::Fast MXFP4 / Q4_0 / Q8_0 weights with >= 16 tokens when the CPU
// has AMX-INT8 and the tile state (as amx_bf16_usable), at the AVX-512 matmul level.
bool amx_int8_usable();
// The weight types amx_nib_takes serves (MXFP4, Q4_0, Q8_0), whatever the CPU.
bool amx_nib_type(GgmlType type);
bool amx_nib_takes(const MatView& W, int64_t n_tokens);
// Rows [r0, r1) of the product, threaded on pool when given; returns r1, or r0 having done nothing when
// !amx_nib_takes(W, n_tokens).
int64_t matmul_amx_nib(const MatView& W, const float* x, int64_t n_tokens, float* y, ThreadPool* pool, int64_t r0,
                       int64_t r1);

// Helpers (matmul_avx512.cpp: the layouts of run_lanes). The activation tiles of token vector v (tokens
// 16v .. 16v + 15 of the n rows at act, stride bytes apart, prepared by type's AVX-512 kernel: q8-nibble, or
// q8-byte for Q8_0; lanes past n repeat the last token): per 32-column block kAmxNibTileBlock bytes = 8 x 64
// bytes (row s: token j's q[4s .. 4s + 3] as s8 in dword j: the B operand of a K = 32 tile product) + dx[16] f32.
constexpr int kAmxNibTileBlock = 8 * 64 + 64;
void amx_nib_act_tiles(GgmlType type, const uint8_t* act, size_t stride, int64_t n, int64_t cols, int64_t v,
                       uint8_t* out);
// Rows [0, nr) of a MXFP4 / Q4_0 / Q8_0 weight starting at src (rows >= nvalid: zero) as the A operand:
// w[(b * nr + i) * 32 + k] = the signed value of element k of block b of row i (MXFP4: 2 x E2M1),
// dw[b * nr + i] = its scale (MXFP4: 2^(e - 127), the 1/2 is in dx; Q4_0, Q8_0: d).
void amx_nib_weights(GgmlType type, const uint8_t* src, uint64_t row_bytes, int64_t nvalid, int nr, int64_t cols,
                     int8_t* w, float* dw);
// The tile kernel (matmul_amx.cpp): rows [0, nr) of a panel (nr = 16 or 32) x token vectors [v0, v1) of the
// tiles (tile_stride bytes per vector; tokens < n valid): y[t * ldy + row0 + i] for the rows row0 + i in [lo, hi).
void amx_nib_rows(const int8_t* w, const float* dw, int nr, int64_t nb, const uint8_t* tiles, size_t tile_stride,
                  int64_t v0, int64_t v1, int64_t n, float* y, int64_t ldy, int64_t row0, int64_t lo, int64_t hi);

// ---- AMX-INT8: packed Q4_K / Q5_K weights (repack.h), prefill (>= 16 tokens) ----
// repack_amx.cpp: per 256-value super-block, one tile product per 32-value sub-block (16 tokens x 16 rows
// of exact int32 sums), scaled and summed in int32, then the packed AVX-512 kernel's f32 steps: the results
// are bit-identical to that kernel's (whose results do not depend on the token count), so decode still
// equals prefill. A PackedKernel::run replacement (same arguments); the activation rows are read 16 at a
// time, so the buffer must hold whole groups of 16 rows from the first token (rows past nt are ignored).
// matmul_packed uses it for >= 16 tokens when amx_int8_usable().
using AmxPackedRun = void (*)(const PackedWeight& P, const uint8_t* act, size_t act_stride, int64_t nt, int64_t g0,
                              int64_t g1, float* y, int64_t ldy);
bool amx_packed_run(GgmlType type, AmxPackedRun* run);
// The int8 tile configuration on this thread (the one the int8 kernels use; cheap when already loaded).
void amx_tiles_int8();

}  // namespace kimi::kern
