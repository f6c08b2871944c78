// AMX BF16 GEMM (see matmul_amx.h); entered only after amx_bf16_usable() (matmul.cpp).
//
// Roles: the weights are the A operand, read in place (a tile = 16 weight rows x 32 columns, loaded
// with the row stride, no copy of the weight), the activations the B operand, which AMX wants in
// "pair" order: B row p holds, for each of 16 tokens, the bf16 pair (x[t][2p], x[t][2p + 1]). That
// layout is made once per matmul for all tokens (each 16-token block: cvtne2ps_pbh of its rows, then a
// 16 x 16 dword transpose per 32 columns). A C tile then holds 16 weight rows x 16 tokens (f32), so
// it is stored, transposed and written as 16 token rows of y.
// Work items: blocks of 32 weight rows (2 A tiles) x groups of up to 16 token blocks; each item runs
// its token blocks in pairs (2 B tiles) with 4 C tiles accumulating over all columns (2 A + 2 B + 4 C
// = the 8 tile registers). The weight's last rows % 16 are zero-padded to a tile (and not stored), so
// every row of a weight goes through the tiles.
#include "backend/cpu/matmul_amx.h"

// GCC 12 warns about _mm512_undefined_* inside its own intrinsic headers
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
// Only intrinsics and functions local to this file are used here (no inline library code that could be
// emitted with AVX-512 / AMX instructions and picked by the linker for other callers); the threading and
// the buffers are matmul.cpp's.

#if defined(__x86_64__) && defined(__linux__)
#include <immintrin.h>

namespace kimi::kern {

namespace {

struct alignas(64) TileConfig {
  uint8_t palette = 1, start_row = 0;
  uint8_t reserved[14] = {};
  uint16_t colsb[16] = {};
  uint8_t rows[16] = {};
};

// Every tile 16 rows x 64 bytes; loaded once per thread (the configuration stays with the thread).
void configure_tiles() {
  thread_local bool done = false;
  if (done) return;
  TileConfig c;
  for (int i = 0; i < 8; ++i) {
    c.colsb[i] = 64;
    c.rows[i] = 16;
  }
  _tile_loadconfig(&c);
  done = true;
}

// r[i] = row i of a 16 x 16 matrix of dwords -> r[j] = column j.
inline void transpose16(__m512i r[16]) {
  __m512i t[16];
  for (int i = 0; i < 8; ++i) {
    t[2 * i] = _mm512_unpacklo_epi32(r[2 * i], r[2 * i + 1]);
    t[2 * i + 1] = _mm512_unpackhi_epi32(r[2 * i], r[2 * i + 1]);
  }
  for (int i = 0; i < 4; ++i) {
    r[4 * i] = _mm512_unpacklo_epi64(t[4 * i], t[4 * i + 2]);
    r[4 * i + 1] = _mm512_unpackhi_epi64(t[4 * i], t[4 * i + 2]);
    r[4 * i + 2] = _mm512_unpacklo_epi64(t[4 * i + 1], t[4 * i + 3]);
    r[4 * i + 3] = _mm512_unpackhi_epi64(t[4 * i + 1], t[4 * i + 3]);
  }
  // r[4i + j], 128-bit lane L = rows 4i..4i+3 of column 4L + j
  __m512i o[16];
  for (int j = 0; j < 4; ++j) {
    const __m512i u0 = _mm512_shuffle_i32x4(r[j], r[4 + j], 0x88), u1 = _mm512_shuffle_i32x4(r[j], r[4 + j], 0xdd);
    const __m512i u2 = _mm512_shuffle_i32x4(r[8 + j], r[12 + j], 0x88);
    const __m512i u3 = _mm512_shuffle_i32x4(r[8 + j], r[12 + j], 0xdd);
    o[j] = _mm512_shuffle_i32x4(u0, u2, 0x88);
    o[8 + j] = _mm512_shuffle_i32x4(u0, u2, 0xdd);
    o[4 + j] = _mm512_shuffle_i32x4(u1, u3, 0x88);
    o[12 + j] = _mm512_shuffle_i32x4(u1, u3, 0xdd);
  }
  for (int i = 0; i < 16; ++i) r[i] = o[i];
}

// Token block b (tokens 16b .. 16b + 15, zero past n) of x (ld = cols) in pair order: cols / 2 rows
// of 16 dwords at out.
void prep_block(const float* x, int64_t n, int64_t cols, int64_t b, uint32_t* out) {
  const int64_t t0 = 16 * b, nv = n - t0 < 16 ? n - t0 : 16;
  for (int64_t k = 0; k < cols; k += 32) {
    __m512i r[16];
    for (int t = 0; t < 16; ++t) {
      if (t < nv) {
        const float* xr = x + (t0 + t) * cols + k;
        const __m512bh h = _mm512_cvtne2ps_pbh(_mm512_loadu_ps(xr + 16), _mm512_loadu_ps(xr));
        r[t] = reinterpret_cast<const __m512i&>(h);
      } else {
        r[t] = _mm512_setzero_si512();
      }
    }
    transpose16(r);
    for (int j = 0; j < 16; ++j) _mm512_storeu_si512(out + (k / 2 + j) * 16, r[j]);
  }
}

// A C tile stored to buf (16 weight rows x 16 tokens, f32) -> y rows t0 .. t0 + nv - 1, columns r0 .. r0 + 15.
// Only the rows whose bit is set in keep are written (a range that cuts a 16-row group).
inline void store_c(const float* buf, float* y, int64_t ldy, int64_t t0, int64_t nv, int64_t r0, __mmask16 keep) {
  __m512i r[16];
  for (int i = 0; i < 16; ++i) r[i] = _mm512_load_si512(buf + 16 * i);
  transpose16(r);
  for (int64_t m = 0; m < nv; ++m) _mm512_mask_storeu_epi32(y + (t0 + m) * ldy + r0, keep, r[m]);
}

// Weight rows [r0, r0 + 16 * NR) x token blocks [b0, b1) (tokens < n valid).
// The weight rows are first copied into panel as [column step][16 * NR rows][64 bytes]: a tile
// loaded straight from rows 4 KiB apart (2048 columns) would put all its 16 lines into one L1 set.
template <int NR>
void run_item(const MatView& W, const uint32_t* bt, int64_t n, int64_t r0, int64_t b0, int64_t b1, float* y,
              int64_t ldy, uint8_t* panel, int64_t lo, int64_t hi) {
  auto keep = [&](int64_t g) {  // rows g .. g + 15 that lie in [lo, hi)
    uint32_t m = 0;
    for (int j = 0; j < 16; ++j) m |= static_cast<uint32_t>(g + j >= lo && g + j < hi) << j;
    return static_cast<__mmask16>(m);
  };
  const __mmask16 k0 = keep(r0), k1 = keep(r0 + 16);
  const int64_t ks = W.cols / 32, half = W.cols / 2;
  const size_t rb = W.row_bytes;
  // one token block (decode, short prompts): each weight line is used once, the tiles load the rows in place;
  // a block past the last row (the weight's last rows % 32) goes through the panel, zero-padded
  const int64_t avail = W.rows - r0;
  const bool direct = b1 - b0 == 1 && avail >= 16 * NR;
  const uint8_t* a0 = direct ? W.data + static_cast<uint64_t>(r0) * rb : panel;
  const uint8_t* a1 = direct ? a0 + 16 * rb : panel + 1024;
  const int64_t kStep = direct ? 64 : 1024 * NR;  // bytes from one column step to the next
  const size_t ld = direct ? rb : 64;            // tile row stride
  if (!direct)
    for (int i = 0; i < 16 * NR; ++i) {
      const uint8_t* src = W.data + static_cast<uint64_t>(r0 + i) * rb;
      for (int64_t s = 0; s < ks; ++s)
        _mm512_store_si512(panel + (s * 16 * NR + i) * 64, i < avail ? _mm512_loadu_si512(src + s * 64)
                                                                     : _mm512_setzero_si512());
    }
  for (int64_t b = b0; b < b1; b += 2) {
    const bool two = b + 1 < b1;
    const uint32_t* p0 = bt + b * half * 16;
    const uint32_t* p1 = p0 + half * 16;
    _tile_zero(0);
    _tile_zero(1);
    if constexpr (NR == 2) {
      _tile_zero(2);
      _tile_zero(3);
    }
    if (two) {
      for (int64_t s = 0; s < ks; ++s) {
        _tile_loadd(4, a0 + s * kStep, ld);
        _tile_loadd(6, p0 + s * 256, 64);
        _tile_loadd(7, p1 + s * 256, 64);
        _tile_dpbf16ps(0, 4, 6);
        _tile_dpbf16ps(1, 4, 7);
        if constexpr (NR == 2) {
          _tile_loadd(5, a1 + s * kStep, ld);
          _tile_dpbf16ps(2, 5, 6);
          _tile_dpbf16ps(3, 5, 7);
        }
      }
    } else {
      for (int64_t s = 0; s < ks; ++s) {
        _tile_loadd(4, a0 + s * kStep, ld);
        _tile_loadd(6, p0 + s * 256, 64);
        _tile_dpbf16ps(0, 4, 6);
        if constexpr (NR == 2) {
          _tile_loadd(5, a1 + s * kStep, ld);
          _tile_dpbf16ps(2, 5, 6);
        }
      }
    }
    // (the tile register numbers are immediates: one store per literal)
    alignas(64) float buf[256];
    const int64_t t0 = 16 * b, nv0 = n - t0 < 16 ? n - t0 : 16;
    _tile_stored(0, buf, 64);
    store_c(buf, y, ldy, t0, nv0, r0, k0);
    if constexpr (NR == 2) {
      _tile_stored(2, buf, 64);
      store_c(buf, y, ldy, t0, nv0, r0 + 16, k1);
    }
    if (two) {
      const int64_t nv1 = n - t0 - 16 < 16 ? n - t0 - 16 : 16;
      _tile_stored(1, buf, 64);
      store_c(buf, y, ldy, t0 + 16, nv1, r0, k0);
      if constexpr (NR == 2) {
        _tile_stored(3, buf, 64);
        store_c(buf, y, ldy, t0 + 16, nv1, r0 + 16, k1);
      }
    }
  }
}

}  // namespace

double amx_bf16_peak_loop(int64_t iters) {
  configure_tiles();
  alignas(64) static const uint16_t kZeros[512] = {};  // zero operands: the rate does not depend on the values
  _tile_zero(0);
  _tile_zero(1);
  _tile_zero(2);
  _tile_zero(3);
  _tile_loadd(4, kZeros, 64);
  _tile_loadd(5, kZeros, 64);
  _tile_loadd(6, kZeros, 64);
  _tile_loadd(7, kZeros, 64);
  for (int64_t i = 0; i < iters; ++i) {
    _tile_dpbf16ps(0, 4, 6);
    _tile_dpbf16ps(1, 4, 7);
    _tile_dpbf16ps(2, 5, 6);
    _tile_dpbf16ps(3, 5, 7);
  }
  alignas(64) float buf[256];
  _tile_stored(0, buf, 64);
  return buf[0];
}

void amx_bf16_prep(const float* x, int64_t n, int64_t cols, int64_t b, uint32_t* out) { prep_block(x, n, cols, b, out); }

void amx_bf16_rows(const MatView& W, const uint32_t* bt, int64_t n, int64_t r0, int nr, int64_t b0, int64_t b1,
                   float* y, int64_t ldy, uint8_t* panel, int64_t lo, int64_t hi) {
  configure_tiles();
  if (nr == 32) run_item<2>(W, bt, n, r0, b0, b1, y, ldy, panel, lo, hi);
  else run_item<1>(W, bt, n, r0, b0, b1, y, ldy, panel, lo, hi);
}

}  // namespace kimi::kern

#else

namespace kimi::kern {
double amx_bf16_peak_loop(int64_t) { return 0; }
void amx_bf16_prep(const float*, int64_t, int64_t, int64_t, uint32_t*) {}
void amx_bf16_rows(const MatView&, const uint32_t*, int64_t, int64_t, int, int64_t, int64_t, float*, int64_t, uint8_t*, int64_t,
                   int64_t) {}
}  // namespace kimi::kern

#endif
