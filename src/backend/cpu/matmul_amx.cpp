// AMX BF16 GEMM (see matmul_amx.h); entered only after amx_bf16_usable() (matmul.cpp).
//
// Roles: the weights are the A operand (a tile = 16 weight rows x 32 columns), the activations the B
// operand, which AMX wants in "pair" order: B row p holds, for each of 16 tokens, the bf16 pair
// (x[t][2p], x[t][2p + 1]). That layout is made once per matmul for all tokens (each 16-token block:
// cvtne2ps_pbh of its rows, then a 16 x 16 dword transpose per 32 columns). A C tile holds 16 weight rows
// x 16 tokens (f32); at the end it is stored, transposed and written as 16 token rows of y. Two A + two B
// tiles feed four C tiles (the 8 tile registers).
// - One token block (decode, <= 16 tokens; run_item): 32-row items, the tiles loaded from the packed copy
//   (repack.h: the weight read front to back) or from the rows in place (each weight line is used once),
//   C accumulating over all columns.
// - Prefill (run_block): items of up to 256 rows x 512 tokens, K-blocked by 256 columns: the block's
//   slice of the rows comes from the packed copy or, without one, is copied to a panel (rows 4 KiB apart
//   loaded straight into a tile would share one L1 set), each 32-row sub-block's slice (16 KiB) stays in L1
//   while every token pair's slice streams
//   from L2, and the C tiles are parked in a buffer between K blocks (stored and reloaded exactly, so every
//   C element gets the same tile products in the same order as in one pass: results do not depend on the
//   blocking or the batch). The next K block's rows are prefetched while the tiles work. Measured on a
//   2-core Xeon VM (12288 x 7168 x 512 tokens, 1 thread, weights in L3): 169 ms unblocked with 256-token
//   groups -> 114 ms; larger K blocks were slower.
// The weight's last rows % 16 are zero-padded to a tile (and not stored), so every row of a weight goes
// through the tiles.
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

// The thread's tile configuration (it stays with the thread; reloaded only on a change of kind):
// kBf16: every tile 16 rows x 64 bytes. kInt8 (K = 32 per product): C tiles 0, 1 16 x 64 bytes, A tiles
// 2, 4 16 rows x 32 bytes, B tiles 3, 5 8 rows x 64 bytes.
enum TileKind { kNone, kBf16, kInt8 };
void configure_tiles(TileKind kind = kBf16) {
  thread_local TileKind current = kNone;
  if (current == kind) return;
  TileConfig c;
  for (int i = 0; i < 8; ++i) {
    c.colsb[i] = 64;
    c.rows[i] = 16;
  }
  if (kind == kInt8) {
    c.colsb[2] = c.colsb[4] = 32;
    c.rows[3] = c.rows[5] = 8;
  }
  // GCC 12 does not treat the ldtilecfg builtin as reading the struct and dropped the stores above (a
  // configuration of empty tiles: the first tile instruction then faults); the barrier keeps them
  asm volatile("" : : "m"(c) : "memory");
  _tile_loadconfig(&c);
  current = kind;
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

// Where column step s (columns 32s .. 32s + 31: 16 pair rows of 16 dwords, 1 KiB) of token block b lies in
// the prepared activations of nb token blocks: K-block major ([K block][token block][step]), so the slice
// that one K block of run_block reads for every token block is one contiguous run (with token blocks
// cols / 2 dwords apart, the 8 KiB slices of a K block sat 224 KiB apart for 7168 columns: in a loop of
// just the tile loads and products that layout ran at 1.3-1.5 TFLOP/s per thread, a contiguous one at 1.9;
// in the whole kernel the difference is within the noise). With nb = 1 this is step s at s * 256.
inline int64_t bt_step(int64_t nb, int64_t ks, int64_t b, int64_t s) {
  const int64_t s0 = s / kAmxKSteps * kAmxKSteps, ns = ks - s0 < kAmxKSteps ? ks - s0 : kAmxKSteps;
  return (s0 * nb + b * ns + (s - s0)) * 256;
}

// Token block b (tokens 16b .. 16b + 15, zero past n) of x (ld = cols) in pair order, at its steps of bt
// (nb token blocks).
void prep_block(const float* x, int64_t n, int64_t cols, int64_t b, int64_t nb, uint32_t* bt) {
  const int64_t t0 = 16 * b, nv = n - t0 < 16 ? n - t0 : 16;
  for (int64_t k = 0; k < cols; k += 32) {
    uint32_t* out = bt + bt_step(nb, cols / 32, b, k / 32);
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
    for (int j = 0; j < 16; ++j) _mm512_storeu_si512(out + j * 16, r[j]);
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

// rows g .. g + 15 that lie in [lo, hi) (a range that cuts a 16-row group stores only its rows)
inline __mmask16 keep_rows(int64_t g, int64_t lo, int64_t hi) {
  uint32_t m = 0;
  for (int j = 0; j < 16; ++j) m |= static_cast<uint32_t>(g + j >= lo && g + j < hi) << j;
  return static_cast<__mmask16>(m);
}

// Weight rows [r0, r0 + 16 * NR) x one token block (the first n <= 16 tokens of bt): decode and short
// prompts. Each weight line is used once, so the tiles load it where it is: from the packed copy pk
// (r0 / 32's group) or, without one, from the rows in place; a block that runs past the weight's last
// row then goes through panel ([column step][16 * NR rows][64 bytes]), zero-padded.
template <int NR>
void run_item(const MatView& W, const uint32_t* bt, int64_t n, int64_t r0, float* y, int64_t ldy, uint8_t* panel,
              int64_t lo, int64_t hi, const uint8_t* pk) {
  const int64_t ks = W.cols / 32;
  const size_t rb = W.row_bytes;
  const int64_t avail = W.rows - r0;
  const bool direct = avail >= 16 * NR;
  const uint8_t* a0 = pk ? pk + static_cast<uint64_t>(r0 / 32) * static_cast<uint64_t>(W.cols) * 64
                         : direct ? W.data + static_cast<uint64_t>(r0) * rb : panel;
  const uint8_t* a1 = pk ? a0 + 1024 : direct ? a0 + 16 * rb : panel + 1024;
  const int64_t kStep = pk ? 2048 : direct ? 64 : 1024 * NR;  // bytes from one column step to the next
  const size_t ld = pk || !direct ? 64 : rb;                   // tile row stride
  if (!pk && !direct)
    for (int i = 0; i < 16 * NR; ++i) {
      const uint8_t* src = W.data + static_cast<uint64_t>(r0 + i) * rb;
      for (int64_t s = 0; s < ks; ++s)
        _mm512_store_si512(panel + (s * 16 * NR + i) * 64, i < avail ? _mm512_loadu_si512(src + s * 64)
                                                                     : _mm512_setzero_si512());
    }
  _tile_zero(0);
  if constexpr (NR == 2) _tile_zero(2);
  for (int64_t s = 0; s < ks; ++s) {
    // packed: before the step's first tile load, a prefetch of its second tile's 16 lines (NR == 2) or of
    // the next step's tile (NR == 1), so both loads' misses are in flight at once (a tile load waits for
    // its lines in turn); the hardware prefetchers read ahead of that. On a Xeon VM, 2 threads: k3-layers
    // BF16 tg16 1.11-1.16x against 32 lines 8 KiB ahead; the next step's first lines (2 / 4 KiB ahead)
    // or none at all slower (docs/performance.md "Decode: the AMX tile loads' misses overlapped").
    if (pk) {
      const uint8_t* next = NR == 2 ? a1 + s * kStep : s + 1 < ks ? a0 + (s + 1) * kStep : nullptr;
      if (next)
        for (int l = 0; l < 16; ++l) _mm_prefetch(reinterpret_cast<const char*>(next + 64 * l), _MM_HINT_T0);
    }
    _tile_loadd(4, a0 + s * kStep, ld);
    _tile_loadd(6, bt + s * 256, 64);
    _tile_dpbf16ps(0, 4, 6);
    if constexpr (NR == 2) {
      _tile_loadd(5, a1 + s * kStep, ld);
      _tile_dpbf16ps(2, 5, 6);
    }
  }
  // (the tile register numbers are immediates: one store per literal)
  alignas(64) float buf[256];
  const int64_t nv = n < 16 ? n : 16;
  _tile_stored(0, buf, 64);
  store_c(buf, y, ldy, 0, nv, r0, keep_rows(r0, lo, hi));
  if constexpr (NR == 2) {
    _tile_stored(2, buf, 64);
    store_c(buf, y, ldy, 0, nv, r0 + 16, keep_rows(r0 + 16, lo, hi));
  }
}

// One K block (column steps [s0, s0 + ns)) of one sub-block of 16 * NR weight rows, whose slice a holds as
// [step, astep bytes apart][16 * NR rows][64 bytes], for every token pair of [b0, b1) (bt: nbt token blocks
// in bt_step's order): the C tiles of each pair are zeroed
// (first K block) or loaded from c, accumulate over the block, and go back to c (4 KiB per pair). A C
// element so gets exactly the sequence of tile products of run_item's one pass over all columns.
// pf(i) runs before token pair i (the next K block's weight lines are prefetched that way).
template <int NR, class Pf>
void kblock(const uint8_t* a, int64_t astep, const uint32_t* bt, int64_t nbt, int64_t b0, int64_t b1, int64_t s0, int ns,
            float* c, bool first, Pf&& pf) {
  for (int64_t b = b0; b < b1; b += 2, c += 1024) {
    pf((b - b0) / 2);
    const bool two = b + 1 < b1;
    const uint32_t* p0 = bt + (s0 * nbt + b * ns) * 256;  // bt_step(nbt, ks, b, s0): this K block has ns steps
    const uint32_t* p1 = p0 + ns * 256;
    if (first) {
      _tile_zero(0);
      _tile_zero(1);
      _tile_zero(2);
      _tile_zero(3);
    } else {
      _tile_loadd(0, c, 64);
      _tile_loadd(1, c + 256, 64);
      if constexpr (NR == 2) {
        _tile_loadd(2, c + 512, 64);
        _tile_loadd(3, c + 768, 64);
      }
    }
    if (two) {
      for (int s = 0; s < ns; ++s) {
        _tile_loadd(4, a + s * astep, 64);
        _tile_loadd(6, p0 + s * 256, 64);
        _tile_loadd(7, p1 + s * 256, 64);
        _tile_dpbf16ps(0, 4, 6);
        _tile_dpbf16ps(1, 4, 7);
        if constexpr (NR == 2) {
          _tile_loadd(5, a + s * astep + 1024, 64);
          _tile_dpbf16ps(2, 5, 6);
          _tile_dpbf16ps(3, 5, 7);
        }
      }
    } else {
      for (int s = 0; s < ns; ++s) {
        _tile_loadd(4, a + s * astep, 64);
        _tile_loadd(6, p0 + s * 256, 64);
        _tile_dpbf16ps(0, 4, 6);
        if constexpr (NR == 2) {
          _tile_loadd(5, a + s * astep + 1024, 64);
          _tile_dpbf16ps(2, 5, 6);
        }
      }
    }
    _tile_stored(0, c, 64);
    _tile_stored(1, c + 256, 64);
    if constexpr (NR == 2) {
      _tile_stored(2, c + 512, 64);
      _tile_stored(3, c + 768, 64);
    }
  }
}

// Weight rows [r0, r0 + nrows) (nrows <= kAmxRowBlock) x token blocks [b0, b1) (at least 2, at most
// kAmxTokenGroup), K-blocked so that the operands of the tile products come from L1/L2: per K block of
// kAmxKSteps column steps, each sub-block of 32 rows (the last one 16 rows where <= 16 remain; rows past
// W.rows zero) runs every token pair over its slice of the block (the slice stays in L1, the token blocks'
// slice in L2), the C tiles parked in cbuf between K blocks. The slices are read from the packed copy pk
// (repack.h: already in tile order, one contiguous 16 KiB run per sub-block and K block; the next one is
// prefetched while the tiles work) or, without one, copied from the rows to the panel first. At the end the
// C tiles are transposed into y token by token (rows in [lo, hi) only).
void run_block(const MatView& W, const uint32_t* bt, int64_t n, int64_t r0, int64_t nrows, int64_t b0, int64_t b1,
               float* y, int64_t ldy, uint8_t* scratch, int64_t lo, int64_t hi, const uint8_t* pk) {
  const int64_t ks = W.cols / 32, nbt = (n + 15) / 16;
  const size_t rb = W.row_bytes;
  const int nsub = static_cast<int>((nrows + 31) / 32);
  const int64_t npair = (b1 - b0 + 1) / 2;
  uint8_t* panel = scratch;
  float* cbuf = reinterpret_cast<float*>(scratch + static_cast<size_t>(kAmxRowBlock) * kAmxKSteps * 64);
  auto sub_nr = [&](int j) { return nrows - 32 * j > 16 ? 2 : 1; };
  const uint64_t gb = static_cast<uint64_t>(W.cols) * 64;  // packed bytes per 32-row group
  auto packed_slice = [&](int j, int64_t s0) { return pk + (static_cast<uint64_t>(r0 / 32 + j)) * gb + s0 * 2048; };
  for (int64_t s0 = 0; s0 < ks; s0 += kAmxKSteps) {
    const int ns = static_cast<int>(ks - s0 < kAmxKSteps ? ks - s0 : kAmxKSteps);
    for (int j = 0; j < nsub && !pk; ++j) {  // copy the K block's slice of sub-block j
      const int rows_j = 16 * sub_nr(j);
      uint8_t* aj = panel + static_cast<size_t>(j) * ns * 2048;
      for (int i = 0; i < rows_j; ++i) {
        const int64_t row = r0 + 32 * j + i;
        const uint8_t* src = W.data + static_cast<uint64_t>(row) * rb + s0 * 64;
        const bool have = row < W.rows;
        for (int s = 0; s < ns; ++s)
          _mm512_store_si512(aj + (static_cast<size_t>(s) * rows_j + i) * 64,
                             have ? _mm512_loadu_si512(src + s * 64) : _mm512_setzero_si512());
      }
    }
    // unpacked: the next K block's weight lines (row-major), a share before each token pair: from memory
    // the rows come in runs of 512 bytes, too short for the hardware prefetchers (measured on k3-layers
    // pp512: the copy's loads 53 % -> 19 % of this function; with the weights in L3 it is a wash)
    const int64_t s1 = s0 + ns, ns1 = ks - s1 < kAmxKSteps ? ks - s1 : kAmxKSteps;
    const int64_t prow = std::min<int64_t>(32 * nsub, W.rows - r0), nline = prow * ns1;
    const int64_t per = (nline + nsub * npair - 1) / (nsub * npair);
    for (int j = 0; j < nsub; ++j) {
      const uint8_t* aj = pk ? packed_slice(j, s0) : panel + static_cast<size_t>(j) * ns * 2048;
      float* cj = cbuf + static_cast<size_t>(j) * npair * 1024;
      // packed: the slice that comes next (sub-block j + 1 of this K block, or sub-block 0 of the next),
      // a share of its lines before each token pair, into L2
      const bool last = j + 1 == nsub;
      const uint8_t* next = !pk || (last && ns1 <= 0) ? nullptr : last ? packed_slice(0, s1) : packed_slice(j + 1, s0);
      const int64_t nl_next = (last ? ns1 : ns) * 32, per_next = (nl_next + npair - 1) / npair;
      auto pf = [&](int64_t p) {
        if (pk) {
          if (next)
            for (int64_t l = p * per_next, l1 = std::min(nl_next, l + per_next); l < l1; ++l)
              _mm_prefetch(reinterpret_cast<const char*>(next + l * 64), _MM_HINT_T1);
          return;
        }
        const int64_t l1 = std::min(nline, (j * npair + p + 1) * per);
        for (int64_t l = (j * npair + p) * per; l < l1; ++l)
          _mm_prefetch(reinterpret_cast<const char*>(W.data + static_cast<uint64_t>(r0 + l / ns1) * rb + (s1 + l % ns1) * 64),
                       _MM_HINT_T2);
      };
      const int64_t astep = pk ? 2048 : 1024 * sub_nr(j);
      if (sub_nr(j) == 2) kblock<2>(aj, astep, bt, nbt, b0, b1, s0, ns, cj, s0 == 0, pf);
      else kblock<1>(aj, astep, bt, nbt, b0, b1, s0, ns, cj, s0 == 0, pf);
    }
  }
  // the C tiles out: per token block, every tile of the item transposed into tb (16 tokens x the item's
  // rows, 16 KiB), then each token's row of y written front to back (was: tile by tile, 16 pieces of 64
  // bytes 4 * ldy apart each). Measured on a Xeon VM: the GEMM +1-11 % (one thread) / -1..+7 % (two) in
  // bench_matmul, k3-layers pp512 within the noise (-1..+4 %)
  alignas(64) float tb[16 * kAmxRowBlock];
  const int ng16 = static_cast<int>((nrows + 15) / 16);
  __mmask16 keep[kAmxRowBlock / 16];
  for (int q = 0; q < ng16; ++q) keep[q] = keep_rows(r0 + 16 * q, lo, hi);
  for (int64_t p = 0; p < npair; ++p)
    for (int h = 0; h < 2; ++h) {  // token block b0 + 2p + h
      const int64_t t0 = 16 * (b0 + 2 * p + h);
      if (t0 >= 16 * b1) break;
      const int64_t nv = n - t0 < 16 ? n - t0 : 16;
      for (int j = 0; j < nsub; ++j) {
        const float* c = cbuf + (static_cast<size_t>(j) * npair + p) * 1024;
        for (int g = 0; g < sub_nr(j); ++g) {
          __m512i r[16];
          for (int i = 0; i < 16; ++i) r[i] = _mm512_load_si512(c + 256 * (2 * g + h) + 16 * i);
          transpose16(r);
          for (int m = 0; m < 16; ++m) _mm512_store_si512(tb + m * kAmxRowBlock + 32 * j + 16 * g, r[m]);
        }
      }
      for (int64_t m = 0; m < nv; ++m)
        for (int q = 0; q < ng16; ++q)
          _mm512_mask_storeu_epi32(y + (t0 + m) * ldy + r0 + 16 * q, keep[q], _mm512_load_si512(tb + m * kAmxRowBlock + 16 * q));
    }
}

// acc[m] += float(c[m]) * (dx * dw[m]) for the 16 rows m of one block's C tile (stored at c): run_lanes'
// update, in its order.
[[gnu::always_inline]] inline void nib_update(__m512 (&acc)[16], const int32_t* c, const float* dxp, const float* dw) {
  const __m512 dx = _mm512_loadu_ps(dxp);
#pragma GCC unroll 16
  for (int m = 0; m < 16; ++m)
    acc[m] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_load_si512(c + 16 * m)), _mm512_mul_ps(dx, _mm512_set1_ps(dw[m])),
                             acc[m]);
}

// 16 rows (A tiles at w, row stride 32; scales dw, nr apart per block) x one token vector (tiles at t): the
// block products alternate between C tiles 0 and 1 so the next block's product runs while this one's
// f32 update does.
// The 16 x 16 f32 results go to out (row m = 16 tokens of weight row m).
void nib_rows16(const int8_t* w, const float* dw, int nr, int64_t nb, const uint8_t* t, float* out) {
  alignas(64) int32_t c0[256], c1[256];
  const size_t wa = static_cast<size_t>(nr) * 32;
  __m512 acc[16];
#pragma GCC unroll 16
  for (int m = 0; m < 16; ++m) acc[m] = _mm512_setzero_ps();
  _tile_zero(0);
  _tile_loadd(2, w, 32);
  _tile_loadd(3, t, 64);
  _tile_dpbssd(0, 2, 3);
  for (int64_t b = 0; b < nb; b += 2) {
    const bool odd = b + 1 < nb;
    if (odd) {
      _tile_zero(1);
      _tile_loadd(4, w + (b + 1) * wa, 32);
      _tile_loadd(5, t + (b + 1) * kAmxNibTileBlock, 64);
      _tile_dpbssd(1, 4, 5);
    }
    _tile_stored(0, c0, 64);
    nib_update(acc, c0, reinterpret_cast<const float*>(t + b * kAmxNibTileBlock + 512), dw + b * nr);
    if (b + 2 < nb) {
      _tile_zero(0);
      _tile_loadd(2, w + (b + 2) * wa, 32);
      _tile_loadd(3, t + (b + 2) * kAmxNibTileBlock, 64);
      _tile_dpbssd(0, 2, 3);
    }
    if (odd) {
      _tile_stored(1, c1, 64);
      nib_update(acc, c1, reinterpret_cast<const float*>(t + (b + 1) * kAmxNibTileBlock + 512), dw + (b + 1) * nr);
    }
  }
#pragma GCC unroll 16
  for (int m = 0; m < 16; ++m) _mm512_store_ps(out + 16 * m, acc[m]);
}

}  // namespace

void amx_tiles_int8() { configure_tiles(kInt8); }

void amx_nib_rows(const int8_t* w, const float* dw, int nr, int64_t nb, const uint8_t* tiles, size_t tile_stride,
                  int64_t v0, int64_t v1, int64_t n, float* y, int64_t ldy, int64_t row0, int64_t lo, int64_t hi) {
  configure_tiles(kInt8);
  for (int g = 0; g < nr / 16; ++g) {
    const __mmask16 keep = keep_rows(row0 + 16 * g, lo, hi);
    if (keep == 0) continue;
    for (int64_t v = v0; v < v1; ++v) {
      alignas(64) float buf[256];
      nib_rows16(w + 16 * g * 32, dw + 16 * g, nr, nb, tiles + v * tile_stride, buf);
      const int64_t t0 = 16 * v;
      store_c(buf, y, ldy, t0, n - t0 < 16 ? n - t0 : 16, row0 + 16 * g, keep);
    }
  }
}

// iters x 4 independent tile products into C tiles 0-3 from zero operands (the rate does not depend on the
// values): TDPBSSD (Int8) or TDPBF16PS, every tile 16 rows x 64 bytes. Returns a C element (0).
template <bool Int8>
double amx_peak_loop(int64_t iters) {
  configure_tiles();
  alignas(64) static const uint8_t kZeros[1024] = {};
  _tile_zero(0);
  _tile_zero(1);
  _tile_zero(2);
  _tile_zero(3);
  _tile_loadd(4, kZeros, 64);
  _tile_loadd(5, kZeros, 64);
  _tile_loadd(6, kZeros, 64);
  _tile_loadd(7, kZeros, 64);
  for (int64_t i = 0; i < iters; ++i) {
    if constexpr (Int8) {
      _tile_dpbssd(0, 4, 6);
      _tile_dpbssd(1, 4, 7);
      _tile_dpbssd(2, 5, 6);
      _tile_dpbssd(3, 5, 7);
    } else {
      _tile_dpbf16ps(0, 4, 6);
      _tile_dpbf16ps(1, 4, 7);
      _tile_dpbf16ps(2, 5, 6);
      _tile_dpbf16ps(3, 5, 7);
    }
  }
  alignas(64) int32_t buf[256];  // f32 or int32 sums: zero either way
  _tile_stored(0, buf, 64);
  return buf[0];
}

double amx_bf16_peak_loop(int64_t iters) { return amx_peak_loop<false>(iters); }
double amx_int8_peak_loop(int64_t iters) { return amx_peak_loop<true>(iters); }

void amx_bf16_prep(const float* x, int64_t n, int64_t cols, int64_t b, uint32_t* bt) {
  prep_block(x, n, cols, b, (n + 15) / 16, bt);
}

void amx_bf16_rows(const MatView& W, const uint32_t* bt, int64_t n, int64_t r0, int nr, float* y, int64_t ldy,
                   uint8_t* panel, int64_t lo, int64_t hi, const uint8_t* pk) {
  configure_tiles();
  if (nr == 32) run_item<2>(W, bt, n, r0, y, ldy, panel, lo, hi, pk);
  else run_item<1>(W, bt, n, r0, y, ldy, panel, lo, hi, pk);
}

void amx_bf16_block(const MatView& W, const uint32_t* bt, int64_t n, int64_t r0, int64_t nrows, int64_t b0, int64_t b1,
                    float* y, int64_t ldy, uint8_t* scratch, int64_t lo, int64_t hi, const uint8_t* pk) {
  configure_tiles();
  run_block(W, bt, n, r0, nrows, b0, b1, y, ldy, scratch, lo, hi, pk);
}

}  // namespace kimi::kern

#else

namespace kimi::kern {
double amx_bf16_peak_loop(int64_t) { return 0; }
double amx_int8_peak_loop(int64_t) { return 0; }
void amx_bf16_prep(const float*, int64_t, int64_t, int64_t, uint32_t*) {}
void amx_bf16_rows(const MatView&, const uint32_t*, int64_t, int64_t, int, float*, int64_t, uint8_t*, int64_t, int64_t,
                   const uint8_t*) {}
void amx_bf16_block(const MatView&, const uint32_t*, int64_t, int64_t, int64_t, int64_t, int64_t, float*, int64_t, uint8_t*,
                    int64_t, int64_t, const uint8_t*) {}
void amx_nib_rows(const int8_t*, const float*, int, int64_t, const uint8_t*, size_t, int64_t, int64_t, int64_t, float*, int64_t,
                  int64_t, int64_t, int64_t) {}
void amx_tiles_int8() {}
}  // namespace kimi::kern

#endif
