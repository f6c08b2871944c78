// MXFP4 and Q8_0 x 16 or more tokens at the AVX-512 level: the 16-token-lane kernel with each weight dword
// broadcast ONCE into a register for up to 4 token vectors (prefill of the routed experts;
// docs/performance.md, section 6.6).
//
// The lane kernel it replaces (matmul_avx512.cpp, run_lanes) holds 16 tokens in the lanes of a vector and
// multiplies them by one weight dword given as an embedded-broadcast operand of vpdpbusd. On AMD Zen 4 a
// broadcast, embedded or explicit, takes a vector-pipe slot of its own (measured: a vpdpbusd with a
// {1to16} operand runs at half the rate of one with register operands), so that kernel could reach half
// the VNNI peak at most. Here a register tile is 3 rows x 4 token vectors (64 tokens): the weight dword is
// broadcast into a register once and used by 4 vpdpbusd.
//
// The arithmetic is the lane kernel's, operation for operation: activations quantized per 32 values as
// Q8_0 (quant_block_q8_0; dx = 0.5 x f16(d), the E2M1 doubling), per block and row the int32 sum starts at
// -128 x sum(w) and adds (q + 128) x w, then y += cvt(sum) x (dx x 2^(e-127)), blocks in order. So every
// result is bit for bit what run_lanes gives for the same tokens (the tests check it), and a token's row is
// the same in any batch of >= 16 tokens. Fewer tokens keep the Q8_0 kernels (a row of a batch of up to 15
// tokens equals the row alone, bit for bit); AMX machines keep their int8 tiles.
//
// Layouts (caller scratch):
//   activation tiles, per 16 tokens ("vector") and block, kMxTileBlk bytes: 8 x 64 (vector g: lane j =
//     token j's q[4g..4g+3] + 128 as u8), then dx[16] f32;
//   weight records, per row and block, kMxRecBlk bytes: w[32] s8 (natural order: the doubled E2M1 values,
//     or Q8_0's q), dw f32 (2^(e-127), or Q8_0's f16 d), nc i32 = -128 x sum(w).
// Q8_0 the same way (dx = f16(d), as its lane kernel), from the same rules.
#pragma once
#include <cstddef>
#include <cstdint>

#include "backend/mat_view.h"
#include "util/thread_pool.h"

namespace kimi::kern {

constexpr int64_t kMxLanesMinTokens = 16;
constexpr int kMxTileBlk = 9 * 64;
constexpr int kMxRecBlk = 40;
constexpr int kMxItemRows = 48;       // rows per work item
constexpr int kMxChunkBlk = 8;        // blocks per K chunk (4 vectors' tiles of a chunk: 18 KiB, in L1)
constexpr int64_t kMxTokChunk = 128;  // tokens per pass (their tiles: 8 x 18 x cols bytes, in L2)

// Whether matmul / matmul_rows run W x n tokens on this path (set_mx_lanes(false), or KIMI_MX_LANES=0 at
// start-up, turns it off for A/B measurements).
bool mx_lanes_takes(const MatView& W, int64_t n, Precision prec);
void set_mx_lanes(bool on);
bool mx_lanes_enabled();

// Rows [r0, r1) of y = W x for n tokens (threaded on pool when given); returns r1.
int64_t matmul_mx_lanes(const MatView& W, const float* x, int64_t n, float* y, ThreadPool* pool, int64_t r0,
                        int64_t r1);

// The AVX-512 kernels (matmul_mxfp4_vnni_avx512.cpp; call only at the AVX-512 level):
// the tiles of token vector v (tokens 16v..16v+15 of x, cols apart; zero past n): cols / 32 blocks of
// kMxTileBlk bytes, dx = dscale x d (MXFP4 0.5, Q8_0 1);
void mx_lanes_tiles(const float* x, int64_t n, int64_t cols, int64_t v, float dscale, uint8_t* out);
// nr (<= kMxItemRows) rows (MXFP4, or Q8_0 when q8) from src (row_bytes apart) x the nt tokens of the tiles (tile_stride bytes per
// vector): y[t * ldy + i] for i < nr; rec: mx_lanes_item_scratch(cols) bytes, 64-byte aligned.
inline size_t mx_lanes_item_scratch(int64_t cols) {
  return (static_cast<size_t>(kMxItemRows) * static_cast<size_t>(cols / 32) * kMxRecBlk + 63) / 64 * 64 +
         static_cast<size_t>(kMxItemRows) * 4 * 64;
}
void mx_lanes_item(bool q8, const uint8_t* src, uint64_t row_bytes, int nr, int64_t cols, const uint8_t* tiles,
                   size_t tile_stride, int64_t nt, float* y, int64_t ldy, uint8_t* rec);

}  // namespace kimi::kern
