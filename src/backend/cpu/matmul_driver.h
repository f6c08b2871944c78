// The part of the SIMD matmul kernels that is the same at every ISA level: the register-tile
// driver (rows x tokens of R x T tiles, edge tiles from a table of tile<rr, tt> instances), the
// runner that feeds it a weight view, and small helpers of the block layouts. (The choice of a
// kernel by weight type and precision is select_kernel over each level's KernelRow table,
// dispatch.h.) matmul.cpp does the activation
// preparation and the split over threads (rows x token tiles); each ISA file (matmul_avx2.cpp,
// matmul_avx512.cpp) provides only its micro-kernels (P::tile<R, T>, decoders, GEMV loops) and
// its kernel table.
//
// Included ONLY by the ISA files, and everything here is in an unnamed namespace: each ISA file
// gets its own copy, compiled with its flags. (An inline function with external linkage emitted
// with AVX-512 instructions could be the copy the linker keeps for every caller.)
#pragma once
#if !defined(__x86_64__)
#error "matmul_driver.h is for the x86 ISA files (include it inside their #if defined(__x86_64__))"
#endif
#include <immintrin.h>

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <utility>

#include "backend/cpu/dispatch.h"
#include "backend/cpu/quantize_act.h"

// GCC does not fully unroll the R x T tile loops on its own at -O2 (the accumulators then live on
// the stack): force it so every accumulator stays in a register.
#define KIMI_UNROLL _Pragma("GCC unroll 16")

namespace kimi::kern {
namespace {

// One register tile: rr weight rows (w[0..rr)) x tt tokens (x[0..tt)) over n inner steps (columns
// or blocks, as the kernel defines them); writes y[t * ldy + r].
using TileFn = void (*)(const uint8_t* const* w, const uint8_t* const* x, int64_t n, float* y, int64_t ldy);

// f[(rr - 1) * T + tt - 1] = P::tile<rr, tt> for every edge tile of an R x T blocking
template <int N>
struct TileTab {
  TileFn f[N];
};
template <class P, int T, size_t... i>
constexpr TileTab<sizeof...(i)> tile_table(std::index_sequence<i...>) {
  return {{&P::template tile<static_cast<int>(i / T) + 1, static_cast<int>(i % T) + 1>...}};
}

// Drive P's R x T register tiles over rows [r0, r1) x tokens [0, nt): for each panel of R rows
// (which stays in L1) the token tiles stream by (matmul keeps nt small enough for L2).
template <class P, int R, int T>
void drive(const uint8_t* base, uint64_t row_bytes, const uint8_t* act, size_t stride, int64_t nt, int64_t r0,
           int64_t r1, float* y, int64_t ldy, int64_t n) {
  static constexpr TileTab<R * T> tab = tile_table<P, T>(std::make_index_sequence<R * T>{});
  const uint8_t* wp[R];
  const uint8_t* xp[T];
  for (int64_t r = r0; r < r1; r += R) {
    const int rr = static_cast<int>(r1 - r < R ? r1 - r : R);
    for (int i = 0; i < rr; ++i) wp[i] = base + static_cast<uint64_t>(r + i) * row_bytes;
    for (int64_t t = 0; t < nt; t += T) {
      const int tt = static_cast<int>(nt - t < T ? nt - t : T);
      for (int j = 0; j < tt; ++j) xp[j] = act + static_cast<size_t>(t + j) * stride;
      tab.f[(rr - 1) * T + tt - 1](wp, xp, n, y + t * ldy + r, ldy);
    }
  }
}

// A MatKernel::run that drives P's R x T tiles over W; the tile's inner count is W.cols / kInner
// (1: columns, 32: Q8_0-style blocks, 256: K-quant super-blocks).
template <class P, int R, int T, int kInner>
void run_tiles(const MatView& W, const uint8_t* act, size_t stride, int64_t nt, int64_t r0, int64_t r1, float* y,
               int64_t ldy) {
  drive<P, R, T>(W.data, W.row_bytes, act, stride, nt, r0, r1, y, ldy, W.cols / kInner);
}

// ---- block layout helpers ----
inline uint16_t rd16(const uint8_t* p) {
  uint16_t v;
  std::memcpy(&v, p, 2);
  return v;
}
inline float rd_f32(const uint8_t* p) {
  float v;
  std::memcpy(&v, p, 4);
  return v;
}
inline int32_t rd_i32(const uint8_t* p) {
  int32_t v;
  std::memcpy(&v, p, 4);
  return v;
}
// MXFP4 block scale 2^(e-127) (the format's 1/2 is folded into the activation's dx); e = 0 is the
// subnormal 2^-127 (exact, as the reference decoder), e = 255 is NaN in E8M0.
inline float e8m0_scale(uint8_t e) {
  const uint32_t bits = e == 0 ? 0x00400000u : e == 255 ? 0x7fc00000u : static_cast<uint32_t>(e) << 23;
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}
// The MXFP4 values + 12 (so the u8 operand is non-negative), indexed by nibble (byte shuffle table).
inline __m128i mxfp4_plus12_table() {
  return _mm_setr_epi8(12, 13, 14, 15, 16, 18, 20, 24, 12, 11, 10, 9, 8, 6, 4, 0);
}
// Horizontal sum of 4 int32 lanes.
inline int hsum_epi32_128(__m128i v) {
  v = _mm_add_epi32(v, _mm_shuffle_epi32(v, 0x4e));
  v = _mm_add_epi32(v, _mm_shuffle_epi32(v, 0xb1));
  return _mm_cvtsi128_si32(v);
}

}  // namespace
}  // namespace kimi::kern
