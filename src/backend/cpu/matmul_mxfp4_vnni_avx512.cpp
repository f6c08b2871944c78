// The AVX-512 VNNI kernels of the MXFP4 / Q8_0 lane path with register broadcasts (matmul_mx_lanes.h: layouts and
// rules). Only intrinsics and functions local to this file (and the AVX-512 quantizer of quantize_act.h)
// are used (no inline library code that could be emitted with AVX-512 instructions and picked by the linker
// for other callers).
#include "backend/cpu/matmul_mx_lanes.h"

#if defined(__x86_64__)
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <immintrin.h>

#include <cstring>

#include "backend/cpu/quantize_act.h"

#define KIMI_MX_UNROLL _Pragma("GCC unroll 16")

namespace kimi::kern {
namespace {

constexpr int kBlk = 17;  // bytes of one MXFP4 block: e, qs[16]
constexpr int kRR = 3;    // rows per register tile
constexpr int kNV = 4;    // token vectors per register tile

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

// One row's nb blocks -> records.
void row_records(const uint8_t* src, int64_t nb, uint8_t* rec) {
  const __m128i tab = _mm_setr_epi8(0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12);
  const __m128i m4 = _mm_set1_epi8(15), ones = _mm_set1_epi8(1);
  for (int64_t b = 0; b < nb; ++b) {
    const uint8_t* blk = src + b * kBlk;
    uint8_t* out = rec + b * kMxRecBlk;
    const __m128i q = _mm_loadu_si128(reinterpret_cast<const __m128i*>(blk + 1));
    const __m128i lo = _mm_shuffle_epi8(tab, _mm_and_si128(q, m4));                     // values 0..15
    const __m128i hi = _mm_shuffle_epi8(tab, _mm_and_si128(_mm_srli_epi16(q, 4), m4));  // values 16..31
    _mm_storeu_si128(reinterpret_cast<__m128i*>(out), lo);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(out + 16), hi);
    __m128i s = _mm_dpbusd_epi32(_mm_dpbusd_epi32(_mm_setzero_si128(), ones, lo), ones, hi);
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0x4e));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0xb1));
    const int32_t nc = -128 * _mm_cvtsi128_si32(s);
    // 2^(e-127); e = 0 the subnormal 2^-127, e = 255 NaN (as the lane kernel's decoder)
    const uint32_t e = blk[0];
    const uint32_t bits = e == 0 ? 0x00400000u : e == 255 ? 0x7fc00000u : e << 23;
    std::memcpy(out + 32, &bits, 4);
    std::memcpy(out + 36, &nc, 4);
  }
}

// One row's nb Q8_0 blocks (f16 d, q[32]) -> records.
void row_records_q8(const uint8_t* src, int64_t nb, uint8_t* rec) {
  const __m256i ones = _mm256_set1_epi8(1);
  for (int64_t b = 0; b < nb; ++b) {
    const uint8_t* blk = src + b * 34;
    uint8_t* out = rec + b * kMxRecBlk;
    const __m256i q = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk + 2));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(out), q);
    __m256i s = _mm256_dpbusd_epi32(_mm256_setzero_si256(), ones, q);
    __m128i s4 = _mm_add_epi32(_mm256_castsi256_si128(s), _mm256_extracti128_si256(s, 1));
    s4 = _mm_add_epi32(s4, _mm_shuffle_epi32(s4, 0x4e));
    s4 = _mm_add_epi32(s4, _mm_shuffle_epi32(s4, 0xb1));
    const int32_t nc = -128 * _mm_cvtsi128_si32(s4);
    uint16_t h;
    std::memcpy(&h, blk, 2);
    const float dw = _cvtsh_ss(h);
    std::memcpy(out + 32, &dw, 4);
    std::memcpy(out + 36, &nc, 4);
  }
}

// RR rows (records rec + r * rec_row) x NV token vectors (tiles tl + v * tile_stride) over nb blocks of a K
// chunk; the accumulators of row r and vector v live at accb + 16 (r kNV + v) between chunks (first: from 0).
template <int RR, int NV>
void tile(const uint8_t* rec, size_t rec_row, const uint8_t* tl, size_t tile_stride, int64_t nb, float* accb,
          bool first) {
  __m512 acc[RR][NV];
  KIMI_MX_UNROLL for (int r = 0; r < RR; ++r) KIMI_MX_UNROLL for (int v = 0; v < NV; ++v)
    acc[r][v] = first ? _mm512_setzero_ps() : _mm512_load_ps(accb + 16 * (r * kNV + v));
  for (int64_t b = 0; b < nb; ++b) {
    const uint8_t* tb = tl + b * kMxTileBlk;
    const uint8_t* wb = rec + b * kMxRecBlk;
    __m512i is[RR][NV];  // from 0 (a zeroing idiom, no vector op); -128 x sum(w) is added before the conversion
    KIMI_MX_UNROLL for (int r = 0; r < RR; ++r) KIMI_MX_UNROLL for (int v = 0; v < NV; ++v) is[r][v] = _mm512_setzero_si512();
    KIMI_MX_UNROLL for (int g = 0; g < 8; ++g) {
      __m512i a[NV];
      KIMI_MX_UNROLL for (int v = 0; v < NV; ++v) a[v] = _mm512_load_si512(tb + v * tile_stride + 64 * g);
      KIMI_MX_UNROLL for (int r = 0; r < RR; ++r) {
        __m512i w;  // one broadcast for NV vpdpbusd (an embedded {1to16} operand would cost one per vpdpbusd)
        asm("vpbroadcastd %1, %0" : "=v"(w) : "m"(*reinterpret_cast<const int32_t*>(wb + r * rec_row + 4 * g)));
        KIMI_MX_UNROLL for (int v = 0; v < NV; ++v) is[r][v] = _mm512_dpbusd_epi32(is[r][v], a[v], w);
      }
    }
    KIMI_MX_UNROLL for (int r = 0; r < RR; ++r) {
      const __m512 dw = _mm512_set1_ps(rd_f32(wb + r * rec_row + 32));
      const __m512i nc = _mm512_set1_epi32(rd_i32(wb + r * rec_row + 36));
      KIMI_MX_UNROLL for (int v = 0; v < NV; ++v) {
        const __m512 dx = _mm512_load_ps(tb + v * tile_stride + 512);
        const __m512i sum = _mm512_add_epi32(is[r][v], nc);  // the same int32 as starting from nc (exact)
        acc[r][v] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(sum), _mm512_mul_ps(dx, dw), acc[r][v]);
      }
    }
  }
  KIMI_MX_UNROLL for (int r = 0; r < RR; ++r) KIMI_MX_UNROLL for (int v = 0; v < NV; ++v)
    _mm512_store_ps(accb + 16 * (r * kNV + v), acc[r][v]);
}

using TileFn = void (*)(const uint8_t*, size_t, const uint8_t*, size_t, int64_t, float*, bool);
constexpr TileFn kTiles[kRR][kNV] = {
    {&tile<1, 1>, &tile<1, 2>, &tile<1, 3>, &tile<1, 4>},
    {&tile<2, 1>, &tile<2, 2>, &tile<2, 3>, &tile<2, 4>},
    {&tile<3, 1>, &tile<3, 2>, &tile<3, 3>, &tile<3, 4>}};

}  // namespace

void mx_lanes_tiles(const float* x, int64_t n, int64_t cols, int64_t v, float dscale, uint8_t* out) {
  const int64_t nb = cols / 32;
  for (int j = 0; j < 16; ++j) {
    const int64_t t = 16 * v + j;
    for (int64_t b = 0; b < nb; ++b) {
      uint8_t* tb = out + b * kMxTileBlk;
      alignas(16) int8_t q[32];
      float d = 0.0f;
      int sum = 0;
      if (t < n) {
        quant_block_q8_0_avx512(x + t * cols + 32 * b, q, &d, &sum);  // the Q8_0 rounding of every activation path
      } else {
        std::memset(q, 0, sizeof q);
      }
      for (int g = 0; g < 8; ++g) {
        uint32_t dw;
        std::memcpy(&dw, q + 4 * g, 4);
        dw ^= 0x80808080u;  // q + 128 as u8
        std::memcpy(tb + 64 * g + 4 * j, &dw, 4);
      }
      const float dx = dscale * d;
      std::memcpy(tb + 512 + 4 * j, &dx, 4);
    }
  }
}

void mx_lanes_item(bool q8, const uint8_t* src, uint64_t row_bytes, int nr, int64_t cols, const uint8_t* tiles,
                   size_t tile_stride, int64_t nt, float* y, int64_t ldy, uint8_t* rec) {
  const int64_t nb = cols / 32, ntv = (nt + 15) / 16;
  const size_t rec_row = static_cast<size_t>(nb) * kMxRecBlk;
  for (int i = 0; i < nr; ++i) {
    const uint8_t* row = src + static_cast<uint64_t>(i) * row_bytes;
    if (q8) row_records_q8(row, nb, rec + i * rec_row);
    else row_records(row, nb, rec + i * rec_row);
  }
  // the accumulators of the item's rows x kNV vectors, after the records (64-byte aligned)
  float* accb = reinterpret_cast<float*>(rec + (static_cast<size_t>(kMxItemRows) * rec_row + 63) / 64 * 64);
  for (int64_t v = 0; v < ntv; v += kNV) {
    const int nv = static_cast<int>(ntv - v < kNV ? ntv - v : kNV);
    // K chunks whose activation tiles (nv x kMxChunkBlk blocks) stay in L1 while every row tile of the item
    // runs over them
    for (int64_t c0 = 0; c0 < nb; c0 += kMxChunkBlk) {
      const int64_t nbk = nb - c0 < kMxChunkBlk ? nb - c0 : kMxChunkBlk;
      for (int r = 0; r < nr; r += kRR) {
        const int rr = nr - r < kRR ? nr - r : kRR;
        kTiles[rr - 1][nv - 1](rec + r * rec_row + c0 * kMxRecBlk, rec_row,
                               tiles + v * tile_stride + c0 * kMxTileBlk, tile_stride, nbk,
                               accb + static_cast<size_t>(r) * kNV * 16, c0 == 0);
      }
    }
    for (int r = 0; r < nr; ++r)
      for (int i = 0; i < nv; ++i) {
        const float* o = accb + 16 * (r * kNV + i);
        const int64_t tt = nt - 16 * (v + i) < 16 ? nt - 16 * (v + i) : 16;
        for (int64_t j = 0; j < tt; ++j) y[(16 * (v + i) + j) * ldy + r] = o[j];
      }
  }
}

}  // namespace kimi::kern

#else
namespace kimi::kern {
void mx_lanes_tiles(const float*, int64_t, int64_t, int64_t, float, uint8_t*) {}
void mx_lanes_item(bool, const uint8_t*, uint64_t, int, int64_t, const uint8_t*, size_t, int64_t, float*, int64_t, uint8_t*) {}
}  // namespace kimi::kern
#endif
