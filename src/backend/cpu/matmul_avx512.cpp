// AVX-512 (F/BW/VL/DQ/VNNI/BF16) matmul kernels; reached only via dispatch (avx512_kernel).
// Every kernel is a register tile of R weight rows x T tokens: each weight vector is loaded (and,
// for quantized types, decoded) once per tile and used for T tokens; GEMV is the T = 1 case.
//   F32/F16/BF16 with f32 activations: FMA over 16 lanes (F16 Fast: activation rounded to f16).
//   BF16 Fast: vdpbf16ps on bf16 activations (exact products, f32 accumulation).
//   Q8_0 / Q4_0 / MXFP4 Fast: vpdpbusd of (weight + offset) as u8 with the Q8_0 activation as s8,
//     minus the precomputed offset * sum(q) (see quantize_act.h), times the block scales.
//   Q4_K / Q5_K / Q6_K Fast: vpmaddubsw of the decoded u8 weights with Q8_K activations, vpmaddwd
//     with the s16 sub-block scales, mins / Q6_K offset through the activation bsums.
//   GEMV (one token) for BF16 and the Q8_0-activation types: one sequential stream over the rows
//     with software prefetch (see gemv_bf16).
//   Precision::F32 for quantized types: rows decoded to f32 (scalar reference decoder), then FMA.
// The tile driver is matmul_driver.h; this level's kernel table is at the end.
// Only intrinsics and functions local to this file (or to its copy of matmul_driver.h) are used here
// (no inline library code that could be emitted with AVX-512 instructions and picked by the linker
// for other callers).
#include "backend/cpu/dispatch.h"
#include "backend/cpu/matmul_amx.h"
#include "backend/cpu/matmul_lowbit.h"

#if defined(__x86_64__)
// GCC 12 warns about _mm512_undefined_* inside its own intrinsic headers
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include "backend/cpu/matmul_driver.h"
#include "backend/cpu/quantize_act.h"
#include "tensor/quants.h"

namespace kimi::kern {

namespace {

inline __mmask16 mask16(int64_t n) { return n >= 16 ? static_cast<__mmask16>(0xffff) : static_cast<__mmask16>((1u << n) - 1); }
inline __mmask32 mask32(int64_t n) { return n >= 32 ? 0xffffffffu : static_cast<__mmask32>((1u << n) - 1); }

constexpr int kPfBytes = 2048;
inline void prefetch_line(const uint8_t* p) { _mm_prefetch(reinterpret_cast<const char*>(p), _MM_HINT_T0); }

// ------------------------------------------------------------------------------------------------
// f32 activations; weights F32 / F16 / BF16 widened to f32
enum class WK { F32, F16, BF16 };

// Register tiles over plain element rows. L loads kStep elements of a weight row (wload; wload_m
// for the last, partial step of n < kStep elements) and of an activation row (xload / xload_m)
// and accumulates their products into 16 f32 lanes (madd).
template <class L>
struct PlainTiles {
  template <int R, int T>
  static void tile(const uint8_t* const* w, const uint8_t* const* x, int64_t cols, float* y, int64_t ldy) {
    __m512 acc[R][T];
    KIMI_UNROLL for (int r = 0; r < R; ++r)
      KIMI_UNROLL for (int t = 0; t < T; ++t) acc[r][t] = _mm512_setzero_ps();
    int64_t k = 0;
    for (; k + L::kStep <= cols; k += L::kStep) {
      typename L::V wv[R];
      KIMI_UNROLL for (int r = 0; r < R; ++r) wv[r] = L::wload(w[r], k);
      KIMI_UNROLL for (int t = 0; t < T; ++t) {
        const typename L::V xv = L::xload(x[t], k);
        KIMI_UNROLL for (int r = 0; r < R; ++r) acc[r][t] = L::madd(acc[r][t], wv[r], xv);
      }
    }
    if (k < cols) {
      typename L::V wv[R];
      KIMI_UNROLL for (int r = 0; r < R; ++r) wv[r] = L::wload_m(w[r], k, cols - k);
      KIMI_UNROLL for (int t = 0; t < T; ++t) {
        const typename L::V xv = L::xload_m(x[t], k, cols - k);
        KIMI_UNROLL for (int r = 0; r < R; ++r) acc[r][t] = L::madd(acc[r][t], wv[r], xv);
      }
    }
    KIMI_UNROLL for (int r = 0; r < R; ++r)
      KIMI_UNROLL for (int t = 0; t < T; ++t) y[t * ldy + r] = _mm512_reduce_add_ps(acc[r][t]);
  }
};

// f32 activations; weights F32 / F16 / BF16 widened to f32, FMA
template <WK K>
struct F32ActL {
  using V = __m512;
  static constexpr int kStep = 16, ES = K == WK::F32 ? 4 : 2;
  static inline __m512 wload(const uint8_t* w, int64_t k) {
    const uint8_t* p = w + k * ES;
    if constexpr (K == WK::F32) return _mm512_loadu_ps(p);
    else if constexpr (K == WK::F16) return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
    else
      return _mm512_castsi512_ps(
          _mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p))), 16));
  }
  static inline __m512 wload_m(const uint8_t* w, int64_t k, int64_t n) {
    const uint8_t* p = w + k * ES;
    const __mmask16 m = mask16(n);
    if constexpr (K == WK::F32) return _mm512_maskz_loadu_ps(m, p);
    else if constexpr (K == WK::F16) return _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(m, p));
    else return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(m, p)), 16));
  }
  static inline __m512 xload(const uint8_t* x, int64_t k) { return _mm512_loadu_ps(reinterpret_cast<const float*>(x) + k); }
  static inline __m512 xload_m(const uint8_t* x, int64_t k, int64_t n) {
    return _mm512_maskz_loadu_ps(mask16(n), reinterpret_cast<const float*>(x) + k);
  }
  static inline __m512 madd(__m512 acc, __m512 w, __m512 x) { return _mm512_fmadd_ps(w, x, acc); }
};
template <WK K>
using F32Act = PlainTiles<F32ActL<K>>;

template <WK K>
constexpr auto run_f32act = run_tiles<F32Act<K>, 4, 4, 1>;

// Precision::F32 for quantized weights: decode 4 rows at a time, then the f32 tiles.
void run_deq(const MatView& W, const uint8_t* act, size_t stride, int64_t nt, int64_t r0, int64_t r1, float* y,
             int64_t ldy) {
  float* buf = f32_scratch(4 * W.cols, 1);
  const uint64_t rb = static_cast<uint64_t>(W.cols) * 4;
  for (int64_t r = r0; r < r1; r += 4) {
    const int64_t rr = r1 - r < 4 ? r1 - r : 4;
    for (int64_t i = 0; i < rr; ++i)
      kimi::dequantize_row(W.type, W.data + static_cast<uint64_t>(r + i) * W.row_bytes, buf + i * W.cols, W.cols);
    // rows of buf are rows r..r+rr of W: shift y so that buf row i writes y[.. + r + i]
    drive<F32Act<WK::F32>, 4, 4>(reinterpret_cast<const uint8_t*>(buf), rb, act, stride, nt, 0, rr, y + r, ldy, W.cols);
  }
}

// ------------------------------------------------------------------------------------------------
// BF16 weights x bf16 activations (vdpbf16ps; the activation rows are zero padded to a multiple of 32)
struct Bf16DpL {
  using V = __m512i;
  static constexpr int kStep = 32;
  static inline __m512i wload(const uint8_t* w, int64_t k) { return _mm512_loadu_si512(w + 2 * k); }
  static inline __m512i wload_m(const uint8_t* w, int64_t k, int64_t n) {
    return _mm512_maskz_loadu_epi16(mask32(n), w + 2 * k);
  }
  static inline __m512i xload(const uint8_t* x, int64_t k) { return _mm512_loadu_si512(x + 2 * k); }
  static inline __m512i xload_m(const uint8_t* x, int64_t k, int64_t) { return _mm512_loadu_si512(x + 2 * k); }
  static inline __m512 madd(__m512 acc, __m512i w, __m512i x) { return _mm512_dpbf16_ps(acc, (__m512bh)w, (__m512bh)x); }
};
using Bf16Dp = PlainTiles<Bf16DpL>;

// GEMV (one token). Each row sums in exactly the order of the register tile (Bf16Dp::tile<R, T>): ONE
// accumulator over the 32-column steps from the first column to the last, the masked tail step into
// the same accumulator, then _mm512_reduce_add_ps. So a token's row is the same bits decoded alone
// (this GEMV) and in a batch of fewer than 16 tokens (the tiles): prefill == decode and a speculative
// verify pass == plain decoding hold in Fast precision too (tests/unit/test_kernels_matmul.cpp
// Matmul.BatchRowEqualsAlone). The latency of the single chain per row is hidden by 4 rows at a time
// (4 independent chains, the activation loads shared); the software prefetch reads the same columns of
// the next row block (whole blocks, at least kPfBytes ahead): 2 KiB ahead inside one row would land in
// the next row, which this block reads itself. Measured (bench_matmul, 1 thread, AMD EPYC, loaded):
// from DRAM as fast as the 4-accumulator form it replaces; from cache ~25 % slower (compute-bound).
template <int RR>
inline void bf16_rows(const uint8_t* w, uint64_t rb, const uint8_t* act, int64_t cols, int64_t pf, float* y) {
  __m512 acc[RR];
  KIMI_UNROLL for (int i = 0; i < RR; ++i) acc[i] = _mm512_setzero_ps();
  int64_t k = 0;
  for (; k + 32 <= cols; k += 32) {
    const __m512i x = _mm512_loadu_si512(act + 2 * k);
    KIMI_UNROLL for (int i = 0; i < RR; ++i) {
      const uint8_t* p = w + i * rb + 2 * k;
      prefetch_line(p + pf);
      acc[i] = _mm512_dpbf16_ps(acc[i], (__m512bh)_mm512_loadu_si512(p), (__m512bh)x);
    }
  }
  if (k < cols) {  // activation row zero padded to a multiple of 32
    const __m512i x = _mm512_loadu_si512(act + 2 * k);
    KIMI_UNROLL for (int i = 0; i < RR; ++i)
      acc[i] = _mm512_dpbf16_ps(acc[i], (__m512bh)_mm512_maskz_loadu_epi16(mask32(cols - k), w + i * rb + 2 * k),
                                (__m512bh)x);
  }
  KIMI_UNROLL for (int i = 0; i < RR; ++i) y[i] = _mm512_reduce_add_ps(acc[i]);
}

void gemv_bf16(const MatView& W, const uint8_t* act, int64_t r0, int64_t r1, float* y) {
  const uint64_t rb = W.row_bytes;
  const int64_t blk = 4 * static_cast<int64_t>(rb), pf = blk * ((kPfBytes + blk - 1) / blk);
  int64_t r = r0;
  for (; r + 4 <= r1; r += 4) bf16_rows<4>(W.data + static_cast<uint64_t>(r) * rb, rb, act, W.cols, pf, y + r);
  for (; r < r1; ++r) bf16_rows<1>(W.data + static_cast<uint64_t>(r) * rb, rb, act, W.cols, static_cast<int64_t>(rb), y + r);
}

void run_bf16(const MatView& W, const uint8_t* act, size_t stride, int64_t nt, int64_t r0, int64_t r1, float* y,
              int64_t ldy) {
  if (nt == 1) return gemv_bf16(W, act, r0, r1, y);
  drive<Bf16Dp, 6, 4>(W.data, W.row_bytes, act, stride, nt, r0, r1, y, ldy, W.cols);
}

// ------------------------------------------------------------------------------------------------
// 8-bit integer dot products against the prepared Q8_0 activations (quantize_act.h layouts)
struct Dec {
  __m512i lo, hi;
  __m512 dw;
};

inline __m512i load4x16(const uint8_t* p, int stride) {
  __m512i v = _mm512_castsi128_si512(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  v = _mm512_inserti32x4(v, _mm_loadu_si128(reinterpret_cast<const __m128i*>(p + stride)), 1);
  v = _mm512_inserti32x4(v, _mm_loadu_si128(reinterpret_cast<const __m128i*>(p + 2 * stride)), 2);
  v = _mm512_inserti32x4(v, _mm_loadu_si128(reinterpret_cast<const __m128i*>(p + 3 * stride)), 3);
  return v;
}

// One tail block of a nibble type: lo/hi = the u8 operands of elements 0..15 / 16..31, dw = the
// weight scale; a = the block's activation (32 s8, then dx f32, then the offset correction i32).
inline float nib_tail_dot(__m128i lo, __m128i hi, float dw, const uint8_t* a) {
  __m128i s = _mm_dpbusd_epi32(_mm_setzero_si128(), lo, _mm_loadu_si128(reinterpret_cast<const __m128i*>(a)));
  s = _mm_dpbusd_epi32(s, hi, _mm_loadu_si128(reinterpret_cast<const __m128i*>(a + 16)));
  return static_cast<float>(hsum_epi32_128(s) - rd_i32(a + 36)) * (dw * rd_f32(a + 32));
}

// nibble layout: 4 blocks per group
template <bool MX>
struct NibP {
  static constexpr int kG = 4, kBB = MX ? 17 : 18, kAG = kNibGroupBytes, kQs = MX ? 1 : 2;
  static constexpr int kOff = MX ? 12 : 8;  // the offset added to the weight in the u8 operand
  static inline __m512i table() {
    // MXFP4: kvalues + 12 (so the u8 operand is non-negative); unused for Q4_0
    return _mm512_broadcast_i32x4(mxfp4_plus12_table());
  }
  // MXFP4: the vpshufb index that moves e_k (byte 17k of a group = byte k of 128-bit lane k of its
  // first 64 bytes) into the low byte of lane k's 4 dwords, the other bytes zero
  static inline __m512i exp_index() {
    return _mm512_setr_epi32(0xffffff00, 0xffffff00, 0xffffff00, 0xffffff00, 0xffffff01, 0xffffff01, 0xffffff01,
                             0xffffff01, 0xffffff02, 0xffffff02, 0xffffff02, 0xffffff02, 0xffffff03, 0xffffff03,
                             0xffffff03, 0xffffff03);
  }
  static inline Dec decode(const uint8_t* p) {
    Dec d;
    const __m512i qs = load4x16(p + kQs, kBB);
    const __m512i m4 = _mm512_set1_epi8(0x0f);
    d.lo = _mm512_and_si512(qs, m4);
    d.hi = _mm512_and_si512(_mm512_srli_epi16(qs, 4), m4);
    if constexpr (MX) {
      const __m512i tab = table();
      d.lo = _mm512_shuffle_epi8(tab, d.lo);
      d.hi = _mm512_shuffle_epi8(tab, d.hi);
      const __m512i e = _mm512_shuffle_epi8(_mm512_loadu_si512(p), exp_index());
      // 2^(e-127), the 1/2 folded into dx; e = 0 is the subnormal 2^-127 (exact, as the reference)
      d.dw = _mm512_castsi512_ps(
          _mm512_mask_mov_epi32(_mm512_mask_mov_epi32(_mm512_slli_epi32(e, 23), _mm512_testn_epi32_mask(e, e),
                                                      _mm512_set1_epi32(0x00400000)),
                                _mm512_cmpeq_epi32_mask(e, _mm512_set1_epi32(255)), _mm512_set1_epi32(0x7fc00000)));
      // (e = 255 is NaN in E8M0, as the reference decoder)
    } else {
      const __m128i h = _mm_setr_epi16(static_cast<short>(rd16(p)), static_cast<short>(rd16(p + 18)),
                                       static_cast<short>(rd16(p + 36)), static_cast<short>(rd16(p + 54)), 0, 0, 0, 0);
      const __m512i idx = _mm512_setr_epi32(0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3);
      d.dw = _mm512_permutexvar_ps(idx, _mm512_castps128_ps512(_mm_cvtph_ps(h)));
    }
    return d;
  }
  static inline __m512 dot(const Dec& d, const uint8_t* a, __m512 acc) {
    __m512i s = _mm512_dpbusd_epi32(_mm512_setzero_si512(), d.lo, _mm512_loadu_si512(a));
    s = _mm512_dpbusd_epi32(s, d.hi, _mm512_loadu_si512(a + 64));
    s = _mm512_sub_epi32(s, _mm512_loadu_si512(a + 192));
    return _mm512_fmadd_ps(_mm512_cvtepi32_ps(s), _mm512_mul_ps(d.dw, _mm512_loadu_ps(a + 128)), acc);
  }
  static inline float tail(const uint8_t* blk, const uint8_t* a) {
    const __m128i qs = _mm_loadu_si128(reinterpret_cast<const __m128i*>(blk + kQs));
    const __m128i m4 = _mm_set1_epi8(0x0f);
    __m128i lo = _mm_and_si128(qs, m4), hi = _mm_and_si128(_mm_srli_epi16(qs, 4), m4);
    float dw;
    if constexpr (MX) {
      const __m128i tab = mxfp4_plus12_table();
      lo = _mm_shuffle_epi8(tab, lo);
      hi = _mm_shuffle_epi8(tab, hi);
      dw = e8m0_scale(blk[0]);
    } else {
      dw = _cvtsh_ss(rd16(blk));
    }
    return nib_tail_dot(lo, hi, dw, a);
  }
};

// 5-bit block types (Q5_0, Q5_1): 4 blocks of kbb bytes at p, qh (u32) at byte qh_off and qs[16]
// at qh_off + 4 of each block; lane k of lo/hi = elements 0..15 / 16..31 of block k, as u8 0..31.
inline void unpack_q5x4(const uint8_t* p, int kbb, int qh_off, __m512i* lo, __m512i* hi) {
  const __m512i qs = load4x16(p + qh_off + 4, kbb);
  const __m512i m4 = _mm512_set1_epi8(0x0f);
  uint64_t ml = 0, mh = 0;
  for (int k = 0; k < 4; ++k) {
    uint32_t qh;
    std::memcpy(&qh, p + k * kbb + qh_off, 4);
    ml |= static_cast<uint64_t>(qh & 0xffffu) << (16 * k);
    mh |= static_cast<uint64_t>(qh >> 16) << (16 * k);
  }
  const __m512i b16 = _mm512_set1_epi8(16);
  *lo = _mm512_and_si512(qs, m4);
  *hi = _mm512_and_si512(_mm512_srli_epi16(qs, 4), m4);
  *lo = _mm512_mask_add_epi8(*lo, ml, *lo, b16);
  *hi = _mm512_mask_add_epi8(*hi, mh, *hi, b16);
}
// The same for one block (a tail block).
inline void unpack_q5x1(const uint8_t* blk, int qh_off, __m128i* lo, __m128i* hi) {
  const __m128i qs = _mm_loadu_si128(reinterpret_cast<const __m128i*>(blk + qh_off + 4));
  const __m128i m4 = _mm_set1_epi8(0x0f);
  uint32_t qh;
  std::memcpy(&qh, blk + qh_off, 4);
  const __m128i b16 = _mm_set1_epi8(16);
  *lo = _mm_and_si128(qs, m4);
  *hi = _mm_and_si128(_mm_srli_epi16(qs, 4), m4);
  *lo = _mm_mask_add_epi8(*lo, static_cast<__mmask16>(qh & 0xffffu), *lo, b16);
  *hi = _mm_mask_add_epi8(*hi, static_cast<__mmask16>(qh >> 16), *hi, b16);
}
// The f16 at p + k*kbb (k = 0..3), each broadcast over the 4 dword lanes of 128-bit lane k.
inline __m512 bcast_f16x4(const uint8_t* p, int kbb) {
  const __m128i h = _mm_setr_epi16(static_cast<short>(rd16(p)), static_cast<short>(rd16(p + kbb)),
                                   static_cast<short>(rd16(p + 2 * kbb)), static_cast<short>(rd16(p + 3 * kbb)), 0, 0, 0,
                                   0);
  const __m512i idx = _mm512_setr_epi32(0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3);
  return _mm512_permutexvar_ps(idx, _mm512_castps128_ps512(_mm_cvtph_ps(h)));
}

// Q5_0 (22-byte blocks: f16 d, u32 qh, qs[16]): the Q4_0 nibble layout plus a fifth bit per element
// from qh (bit j -> element j, bit j+16 -> element j+16), so the u8 operand is q in 0..31 and the
// activation prep subtracts 16 * sum(a) (offset 16), exactly like Q4_0 with offset 8.
struct Q5P {
  static constexpr int kG = 4, kBB = 22, kAG = kNibGroupBytes;
  static inline Dec decode(const uint8_t* p) {
    Dec d;
    unpack_q5x4(p, kBB, 2, &d.lo, &d.hi);
    d.dw = bcast_f16x4(p, kBB);
    return d;
  }
  static inline __m512 dot(const Dec& d, const uint8_t* a, __m512 acc) { return NibP<false>::dot(d, a, acc); }
  static inline float tail(const uint8_t* blk, const uint8_t* a) {
    __m128i lo, hi;
    unpack_q5x1(blk, 2, &lo, &hi);
    return nib_tail_dot(lo, hi, _cvtsh_ss(rd16(blk)), a);
  }
};

// Q5_1 (24-byte blocks: f16 d, f16 m, u32 qh, qs[16]): x = d q + m with q in 0..31, so
// sum(x a) dx = d dx sum(q a) + m dx sum(a). The activation prep with offset 1 stores sum(a) per
// dword lane as the "correction", which here is scaled by m instead of subtracted.
struct Dec51 {
  __m512i lo, hi;
  __m512 dw, mw;
};
struct Q51P {
  static constexpr int kG = 4, kBB = 24, kAG = kNibGroupBytes;
  static inline Dec51 decode(const uint8_t* p) {
    Dec51 d;
    unpack_q5x4(p, kBB, 4, &d.lo, &d.hi);
    d.dw = bcast_f16x4(p, kBB);
    d.mw = bcast_f16x4(p + 2, kBB);
    return d;
  }
  static inline __m512 dot(const Dec51& d, const uint8_t* a, __m512 acc) {
    __m512i s = _mm512_dpbusd_epi32(_mm512_setzero_si512(), d.lo, _mm512_loadu_si512(a));
    s = _mm512_dpbusd_epi32(s, d.hi, _mm512_loadu_si512(a + 64));
    const __m512 dx = _mm512_loadu_ps(a + 128);
    acc = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_loadu_si512(a + 192)), _mm512_mul_ps(d.mw, dx), acc);
    return _mm512_fmadd_ps(_mm512_cvtepi32_ps(s), _mm512_mul_ps(d.dw, dx), acc);
  }
  static inline float tail(const uint8_t* blk, const uint8_t* a) {
    __m128i lo, hi;
    unpack_q5x1(blk, 4, &lo, &hi);
    __m128i s = _mm_dpbusd_epi32(_mm_setzero_si128(), lo, _mm_loadu_si128(reinterpret_cast<const __m128i*>(a)));
    s = _mm_dpbusd_epi32(s, hi, _mm_loadu_si128(reinterpret_cast<const __m128i*>(a + 16)));
    const float dx = rd_f32(a + 32);
    return static_cast<float>(hsum_epi32_128(s)) * (_cvtsh_ss(rd16(blk)) * dx) +
           static_cast<float>(rd_i32(a + 36)) * (_cvtsh_ss(rd16(blk + 2)) * dx);
  }
};

// byte layout (Q8_0 weights): 2 blocks per group
struct ByteP {
  static constexpr int kG = 2, kBB = 34, kAG = kByteGroupBytes;
  static inline Dec decode(const uint8_t* p) {
    Dec d;
    const __m512i w = _mm512_inserti64x4(
        _mm512_castsi256_si512(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + 2))),
        _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + 36)), 1);
    d.lo = _mm512_xor_si512(w, _mm512_set1_epi8(static_cast<char>(0x80)));
    d.hi = d.lo;
    const __m256i h = _mm256_inserti128_si256(_mm256_castsi128_si256(_mm_set1_epi16(static_cast<short>(rd16(p)))),
                                              _mm_set1_epi16(static_cast<short>(rd16(p + 34))), 1);
    d.dw = _mm512_cvtph_ps(h);
    return d;
  }
  static inline __m512 dot(const Dec& d, const uint8_t* a, __m512 acc) {
    __m512i s = _mm512_dpbusd_epi32(_mm512_setzero_si512(), d.lo, _mm512_loadu_si512(a));
    s = _mm512_sub_epi32(s, _mm512_loadu_si512(a + 128));
    return _mm512_fmadd_ps(_mm512_cvtepi32_ps(s), _mm512_mul_ps(d.dw, _mm512_loadu_ps(a + 64)), acc);
  }
  static inline float tail(const uint8_t* blk, const uint8_t* a) {
    const __m256i w = _mm256_xor_si256(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk + 2)),
                                       _mm256_set1_epi8(static_cast<char>(0x80)));
    const __m256i s = _mm256_dpbusd_epi32(_mm256_setzero_si256(), w,
                                          _mm256_loadu_si256(reinterpret_cast<const __m256i*>(a)));
    const __m128i s4 = _mm_add_epi32(_mm256_castsi256_si128(s), _mm256_extracti128_si256(s, 1));
    return static_cast<float>(hsum_epi32_128(s4) - rd_i32(a + 36)) * (_cvtsh_ss(rd16(blk)) * rd_f32(a + 32));
  }
};

// The weight bytes of one group of P's blocks in a tile's rows: the raw blocks, or (DecodedP) the
// decoded group; the nb % kG tail blocks follow the groups raw either way.
template <class P>
constexpr int group_bytes() {
  if constexpr (requires { P::kGroupBytes; }) return P::kGroupBytes;
  else return P::kG * P::kBB;
}

template <class P>
struct Q8Tiles {
  template <int R, int T>
  static void tile(const uint8_t* const* w, const uint8_t* const* x, int64_t nb, float* y, int64_t ldy) {
    constexpr int kGB = group_bytes<P>();
    __m512 acc[R][T];
    KIMI_UNROLL for (int r = 0; r < R; ++r)
      KIMI_UNROLL for (int t = 0; t < T; ++t) acc[r][t] = _mm512_setzero_ps();
    const int64_t ng = nb / P::kG;
    for (int64_t g = 0; g < ng; ++g) {
      decltype(P::decode(nullptr)) d[R];
      KIMI_UNROLL for (int r = 0; r < R; ++r) d[r] = P::decode(w[r] + g * kGB);
      KIMI_UNROLL for (int t = 0; t < T; ++t) {
        const uint8_t* a = x[t] + g * P::kAG;
        KIMI_UNROLL for (int r = 0; r < R; ++r) acc[r][t] = P::dot(d[r], a, acc[r][t]);
      }
    }
    float tl[R][T];
    KIMI_UNROLL for (int r = 0; r < R; ++r)
      KIMI_UNROLL for (int t = 0; t < T; ++t) tl[r][t] = 0.0f;
    for (int64_t b = ng * P::kG; b < nb; ++b)
      KIMI_UNROLL for (int r = 0; r < R; ++r)
        KIMI_UNROLL for (int t = 0; t < T; ++t)
          tl[r][t] += P::tail(w[r] + ng * kGB + (b - ng * P::kG) * P::kBB,
                              x[t] + ng * P::kAG + (b - ng * P::kG) * kTailBlockBytes);
    KIMI_UNROLL for (int r = 0; r < R; ++r)
      KIMI_UNROLL for (int t = 0; t < T; ++t) y[t * ldy + r] = _mm512_reduce_add_ps(acc[r][t]) + tl[r][t];
  }
};

// GEMV (one token): one row at a time (a sequential stream over the contiguous rows), software
// prefetch ahead of the read position. The groups sum into ONE accumulator in column order and the
// tail blocks into a float after it, exactly as Q8Tiles::tile<R, T> sums a row: a token's row is the
// same bits alone and in a batch of fewer than 16 tokens (Matmul.BatchRowEqualsAlone). Only the FMA
// into the accumulator is a chain; the decode and integer dot products of the next groups overlap it.
template <class P>
void gemv_q8(const MatView& W, const uint8_t* act, int64_t r0, int64_t r1, float* y) {
  const int64_t nb = W.cols / 32, ng = nb / P::kG;
  constexpr int kGB = P::kG * P::kBB;  // weight bytes per group
  for (int64_t r = r0; r < r1; ++r) {
    const uint8_t* w = W.data + static_cast<uint64_t>(r) * W.row_bytes;
    __m512 a0 = _mm512_setzero_ps();
    int64_t g = 0;
    for (; g + 2 <= ng; g += 2) {
      const uint8_t* p = w + g * kGB;
      prefetch_line(p + kPfBytes);
      prefetch_line(p + kPfBytes + kGB);
      if constexpr (2 * kGB > 128) prefetch_line(p + kPfBytes + 128);
      a0 = P::dot(P::decode(p), act + g * P::kAG, a0);
      a0 = P::dot(P::decode(p + kGB), act + (g + 1) * P::kAG, a0);
    }
    if (g < ng) a0 = P::dot(P::decode(w + g * kGB), act + g * P::kAG, a0);
    float tl = 0.0f;
    for (int64_t b = ng * P::kG; b < nb; ++b)
      tl += P::tail(w + b * P::kBB, act + ng * P::kAG + (b - ng * P::kG) * kTailBlockBytes);
    y[r] = _mm512_reduce_add_ps(a0) + tl;
  }
}

// MXFP4 GEMV with AVX512-VBMI (every AVX-512 BF16 CPU but Cooper Lake; checked at run time): the
// same integer block sums and the same f32 steps per block and lane as gemv_q8<NibP<true>>, in fewer
// vector ops per group of 4 blocks (68 bytes) — what bounds it in cache (14.5 -> 20.8 GB/s, one thread):
//  - the 4 x 16 nibble bytes gathered from two loads of the group by one vpermt2b (was 4 loads and
//    3 lane inserts);
//  - the E2M1 lookup by vpermb, which indexes with 6 bits, so a 64-entry table that repeats the 16
//    values makes the nibble masks unnecessary (hi = the 16-bit shift by 4, its bits 4-5 ignored);
//  - the scale 2^(e-127) as the float with exponent field e, its two special cases (e = 0: 2^-127,
//    a subnormal; e = 255: NaN) fixed by one vfixupimmps on the classes "zero" and "+inf";
//  - the offset correction negated once per call (ncorr) and loaded as the first vpdpbusd's
//    accumulator, instead of a zeroed register and a subtraction per row;
//  - 4 rows at a time (the activation loads shared, 4 independent chains), prefetching the same
//    columns of the next 4 rows.
// Rows and blocks sum in the same order as gemv_q8 and Q8Tiles (one accumulator per row, groups in
// column order): the same bits alone and in a batch.
struct MxVbmi {
  __m512i gather, tab, eidx, fix;
  __m512 sub;
};

template <int RR>
__attribute__((target("avx512vbmi"))) inline void mxfp4_rows_vbmi(const uint8_t* w, uint64_t rb, int64_t ng,
                                                                  const uint8_t* act, const uint8_t* ncorr,
                                                                  const MxVbmi& c, __m512* acc0) {
  constexpr int kGB = 4 * NibP<true>::kBB;  // 68
  // prefetch the same columns of the next row block (whole row blocks, at least kPfBytes ahead), not
  // 2 KiB ahead in each row, which for 4 adjacent rows lands in lines the next row's own stream has
  // read (measured with the weights in L3: 17 -> 32 GB/s for 3072 x 7168, 2 threads; from DRAM both
  // run at ~20, docs/performance.md "Decode from DRAM")
  const int64_t blk = RR * static_cast<int64_t>(rb);
  const int64_t pf = blk * ((kPfBytes + blk - 1) / blk);
  auto group = [&](const uint8_t* p, const uint8_t* a, const uint8_t* nc, __m512 acc)
                   __attribute__((target("avx512vbmi"))) {
    const __m512i v0 = _mm512_loadu_si512(p), v4 = _mm512_loadu_si512(p + 4);
    const __m512i qs = _mm512_permutex2var_epi8(v0, c.gather, v4);
    const __m512i lo = _mm512_permutexvar_epi8(qs, c.tab);
    const __m512i hi = _mm512_permutexvar_epi8(_mm512_srli_epi16(qs, 4), c.tab);
    const __m512i e = _mm512_shuffle_epi8(v0, c.eidx);
    const __m512 dw = _mm512_fixupimm_ps(c.sub, _mm512_castsi512_ps(_mm512_slli_epi32(e, 23)), c.fix, 0);
    __m512i s = _mm512_dpbusd_epi32(_mm512_loadu_si512(nc), lo, _mm512_loadu_si512(a));
    s = _mm512_dpbusd_epi32(s, hi, _mm512_loadu_si512(a + 64));
    return _mm512_fmadd_ps(_mm512_cvtepi32_ps(s), _mm512_mul_ps(dw, _mm512_loadu_ps(a + 128)), acc);
  };
  for (int i = 0; i < RR; ++i) acc0[i] = _mm512_setzero_ps();
  int64_t g = 0;
  for (; g + 2 <= ng; g += 2) {
    const uint8_t* a = act + g * kNibGroupBytes;
    const uint8_t* nc = ncorr + g * 64;
    KIMI_UNROLL for (int i = 0; i < RR; ++i) {
      const uint8_t* p = w + i * rb + g * kGB;
      prefetch_line(p + pf);
      prefetch_line(p + pf + 64);
      prefetch_line(p + pf + 128);
      acc0[i] = group(p, a, nc, acc0[i]);
      acc0[i] = group(p + kGB, a + kNibGroupBytes, nc + 64, acc0[i]);
    }
  }
  if (g < ng)
    for (int i = 0; i < RR; ++i) acc0[i] = group(w + i * rb + g * kGB, act + g * kNibGroupBytes, ncorr + g * 64, acc0[i]);
}

__attribute__((target("avx512vbmi"))) void gemv_mxfp4_vbmi(const MatView& W, const uint8_t* act, int64_t r0,
                                                           int64_t r1, float* y) {
  using P = NibP<true>;
  const int64_t nb = W.cols / 32, ng = nb / 4;
  alignas(64) static constexpr uint8_t kGather[64] = {
      1,  2,  3,  4,  5,  6,  7,  8,  9,  10, 11, 12, 13, 14, 15, 16,  //
      18, 19, 20, 21, 22, 23, 24, 25, 26, 27, 28, 29, 30, 31, 32, 33,  //
      35, 36, 37, 38, 39, 40, 41, 42, 43, 44, 45, 46, 47, 48, 49, 50,  //
      // bytes 52..67 of the group = bytes 48..63 of the second load (at +4): index 64 + 48..63
      112, 113, 114, 115, 116, 117, 118, 119, 120, 121, 122, 123, 124, 125, 126, 127};
  MxVbmi c;
  c.gather = _mm512_load_si512(kGather);
  c.tab = P::table();
  c.eidx = P::exp_index();
  c.sub = _mm512_castsi512_ps(_mm512_set1_epi32(0x00400000));  // 2^-127
  // response per input class, 4 bits each (0 QNaN, 1 SNaN, 2 zero, 3 +1, 4 -inf, 5 +inf, 6 negative,
  // 7 positive): zero -> keep the destination (2^-127), +inf -> QNaN(+inf) = 0x7fc00000 (the reference's
  // NaN), every other class -> the input
  c.fix = _mm512_set1_epi32(0x11211011);
  // -corr of every group (f32 scratch slot 1: matmul lends it, MatKernel::scratch_rows covers it)
  uint8_t* ncorr = reinterpret_cast<uint8_t*>(f32_scratch(ng * 16 + 16, 1));
  for (int64_t g = 0; g < ng; ++g)
    _mm512_storeu_si512(ncorr + g * 64,
                        _mm512_sub_epi32(_mm512_setzero_si512(), _mm512_loadu_si512(act + g * kNibGroupBytes + 192)));
  const uint64_t rb = W.row_bytes;
  auto finish = [&](int64_t r, __m512 a0) {
    const uint8_t* w = W.data + static_cast<uint64_t>(r) * rb;
    float tl = 0.0f;
    for (int64_t b = ng * 4; b < nb; ++b) tl += P::tail(w + b * P::kBB, act + ng * P::kAG + (b - ng * 4) * kTailBlockBytes);
    y[r] = _mm512_reduce_add_ps(a0) + tl;
  };
  __m512 a0[4];
  int64_t r = r0;
  for (; r + 4 <= r1; r += 4) {
    mxfp4_rows_vbmi<4>(W.data + static_cast<uint64_t>(r) * rb, rb, ng, act, ncorr, c, a0);
    for (int i = 0; i < 4; ++i) finish(r + i, a0[i]);
  }
  for (; r < r1; ++r) {
    mxfp4_rows_vbmi<1>(W.data + static_cast<uint64_t>(r) * rb, rb, ng, act, ncorr, c, a0);
    finish(r, a0[0]);
  }
}

// GEMM over many tokens for the nibble types: each panel of kPanel rows is decoded ONCE into
// scratch (per group of 4 blocks: lo[64] u8, hi[64] u8, dw[16] f32 = 192 bytes; the nb % 4 tail
// blocks copied raw after the groups) and the register tiles then read the decoded panel for every
// token of the tile, so the nibble unpacking / table lookup is not repeated per 4 tokens.
constexpr int kDecGroup = 192;
constexpr int kPanel = 4;
inline size_t dec_row_bytes(int64_t nb, int kbb) { return static_cast<size_t>(nb / 4 * kDecGroup + nb % 4 * kbb); }

template <class P>
struct DecodedP {  // P's blocks, already decoded (see above); the Q8Tiles of DecodedP<P> read the panel
  static constexpr int kG = 4, kBB = P::kBB, kAG = P::kAG, kGroupBytes = kDecGroup;
  static inline Dec decode(const uint8_t* p) {
    Dec d;
    d.lo = _mm512_loadu_si512(p);
    d.hi = _mm512_loadu_si512(p + 64);
    d.dw = _mm512_loadu_ps(p + 128);
    return d;
  }
  static inline __m512 dot(const Dec& d, const uint8_t* a, __m512 acc) { return P::dot(d, a, acc); }
  static inline float tail(const uint8_t* blk, const uint8_t* a) { return P::tail(blk, a); }
};

// ------------------------------------------------------------------------------------------------
// GEMM with tokens in lanes (MXFP4 / Q4_0 / Q8_0, >= 16 tokens): 16 tokens' activations per zmm, one dword
// (4 elements) per token, as u8 q + 128; each weight dword (4 signed values of one row) is an
// embedded-broadcast vpdpbusd operand, so one instruction does 4 multiply-adds for 16 tokens and
// nothing is decoded per token. Per row and block: the int32 sum starts at -128 * sum(w) (the
// +128 of the activations), then y_row += cvt(sum) * (dw * dx_tokens).
//   activation tile (per 16 tokens, per block): 8 x 64 bytes (vector s: token j's q[4s..4s+3] + 128
//     in lane j), then dx[16] f32;
//   weight record (per row, per block, 40 bytes): w[32] s8 (natural order), dw f32, -128*sum(w) i32.
constexpr int kTokLanes = 16;
constexpr int kActTileBlock = 8 * 64 + 64;
constexpr int kWRec = 40;
constexpr int kLaneRows = 8;  // rows per register tile (8 accumulators + 8 activation vectors)
// f32 scratch per column for run_lanes with up to 64 tokens (matmul's token tiles): 4 tiles of
// 576 bytes per block + kLaneRows records of 40 bytes per block = 82 bytes per column, and the
// decoded panel of run_q8_nib (2 rows)
constexpr int kLaneScratchRows = 21;

// The q (32 s8: lo = q[0..15], hi = q[16..31]) and dx of block b in a prepared activation row: the
// q8-nibble layout (Byte false: Q4_0 / MXFP4 weights, ng = nb / 4 groups of 4 blocks) or the q8-byte
// layout (Byte true: Q8_0 weights, ng = nb / 2 groups of 2 blocks; quantize_act.h).
template <bool Byte>
inline void act_block(const uint8_t* row, int64_t b, int64_t ng, const uint8_t** lo, const uint8_t** hi,
                      const uint8_t** dx) {
  constexpr int kG = Byte ? 2 : 4;
  if (b < kG * ng) {
    const int k = static_cast<int>(b % kG);
    if constexpr (Byte) {
      const uint8_t* g = row + (b / 2) * kByteGroupBytes;
      *lo = g + 32 * k, *hi = g + 32 * k + 16, *dx = g + 64 + 32 * k;
    } else {
      const uint8_t* g = row + (b / 4) * kNibGroupBytes;
      *lo = g + 16 * k, *hi = g + 64 + 16 * k, *dx = g + 128 + 16 * k;
    }
  } else {
    const uint8_t* t = row + ng * (Byte ? kByteGroupBytes : kNibGroupBytes) + (b - kG * ng) * kTailBlockBytes;
    *lo = t, *hi = t + 16, *dx = t + 32;
  }
}

// 16 activation rows (tokens; x[j], laid out as act_block<Byte> reads them) -> the tile of block b (out):
// a 16 x 8 dword transpose in three rounds of two-source permutes, q + 128 as u8 (flip; the AMX path: q
// as s8).
template <bool Byte = false>
inline void act_tile_block(const uint8_t* const* x, int64_t b, int64_t ng, uint8_t* out, bool flip = true) {
  __m512i z[8];
  alignas(64) float dx[16];
  for (int p = 0; p < 8; ++p) {
    const uint8_t *lo0, *hi0, *d0, *lo1, *hi1, *d1;
    act_block<Byte>(x[2 * p], b, ng, &lo0, &hi0, &d0);
    act_block<Byte>(x[2 * p + 1], b, ng, &lo1, &hi1, &d1);
    const __m256i a0 = _mm256_inserti128_si256(_mm256_castsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(lo0))),
                                               _mm_loadu_si128(reinterpret_cast<const __m128i*>(hi0)), 1);
    const __m256i a1 = _mm256_inserti128_si256(_mm256_castsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(lo1))),
                                               _mm_loadu_si128(reinterpret_cast<const __m128i*>(hi1)), 1);
    z[p] = _mm512_inserti64x4(_mm512_castsi256_si512(a0), a1, 1);  // dword 8*(token & 1) + s
    dx[2 * p] = rd_f32(d0);
    dx[2 * p + 1] = rd_f32(d1);
  }
  // round 1: tokens 4q..4q+3, y[2q + h]: lane 4s' + t (s = 4h + s')
  __m512i yv[8];
  for (int q = 0; q < 4; ++q)
    for (int h = 0; h < 2; ++h) {
      alignas(64) int32_t id[16];
      for (int sp = 0; sp < 4; ++sp)
        for (int t = 0; t < 4; ++t) id[4 * sp + t] = (t >= 2 ? 16 : 0) + 8 * (t & 1) + 4 * h + sp;
      yv[2 * q + h] = _mm512_permutex2var_epi32(z[2 * q], _mm512_load_si512(id), z[2 * q + 1]);
    }
  // round 2: tokens 8r..8r+7, w[4r + 2h + e]: lane 8s'' + t (s = 4h + 2e + s'')
  __m512i wv[8];
  for (int r = 0; r < 2; ++r)
    for (int h = 0; h < 2; ++h)
      for (int e = 0; e < 2; ++e) {
        alignas(64) int32_t id[16];
        for (int ss = 0; ss < 2; ++ss)
          for (int t = 0; t < 8; ++t) id[8 * ss + t] = (t >= 4 ? 16 : 0) + 4 * (2 * e + ss) + (t & 3);
        wv[4 * r + 2 * h + e] = _mm512_permutex2var_epi32(yv[4 * r + h], _mm512_load_si512(id), yv[4 * r + 2 + h]);
      }
  // round 3: all 16 tokens of s: lane t
  const __m512i fl = _mm512_set1_epi8(static_cast<char>(flip ? 0x80 : 0));
  for (int h = 0; h < 2; ++h)
    for (int e = 0; e < 2; ++e)
      for (int ss = 0; ss < 2; ++ss) {
        alignas(64) int32_t id[16];
        for (int t = 0; t < 16; ++t) id[t] = (t >= 8 ? 16 : 0) + 8 * ss + (t & 7);
        const int sidx = 4 * h + 2 * e + ss;
        const __m512i v = _mm512_permutex2var_epi32(wv[2 * h + e], _mm512_load_si512(id), wv[4 + 2 * h + e]);
        _mm512_storeu_si512(out + 64 * sidx, _mm512_xor_si512(v, fl));
      }
  std::memcpy(out + 512, dx, 64);
}

// The signed value of nibble v of a weight of type P (MXFP4: E2M1 doubled; Q4_0: v - 8).
template <class P>
inline int8_t nib_value(int v) {
  static constexpr int8_t kMx[16] = {0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12};
  return P::kOff == 12 ? kMx[v] : static_cast<int8_t>(v - 8);
}
template <class P>
inline float nib_scale(const uint8_t* blk) {
  return P::kOff == 12 ? e8m0_scale(blk[0]) : _cvtsh_ss(rd16(blk));
}

// Row r of a Q8_0 weight, all nb blocks, as weight records: the blocks' q as they are, d as f32.
void q8_weight_records(const uint8_t* src, int64_t nb, uint8_t* out) {
  const __m256i flip = _mm256_set1_epi8(static_cast<char>(0x80));
  for (int64_t b = 0; b < nb; ++b) {
    const uint8_t* blk = src + b * ByteP::kBB;
    uint8_t* rec = out + b * kWRec;
    const __m256i q = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk + 2));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(rec), q);
    // sum(q) = sum(q + 128) - 32 * 128, the u8 sums by vpsadbw
    const __m256i sad = _mm256_sad_epu8(_mm256_xor_si256(q, flip), _mm256_setzero_si256());
    const __m128i s2 = _mm_add_epi64(_mm256_castsi256_si128(sad), _mm256_extracti128_si256(sad, 1));
    const int32_t sum = static_cast<int32_t>(_mm_cvtsi128_si64(_mm_add_epi64(s2, _mm_unpackhi_epi64(s2, s2)))) - 32 * 128;
    const float dw = _cvtsh_ss(rd16(blk));
    const int32_t nc = -128 * sum;
    std::memcpy(rec + 32, &dw, 4);
    std::memcpy(rec + 36, &nc, 4);
  }
}

// Row r of W (a nibble type P), all nb blocks, as weight records.
template <class P>
void weight_records(const uint8_t* src, int64_t nb, uint8_t* out) {
  const int64_t ng = nb / 4;
  const __m512i off = _mm512_set1_epi8(static_cast<char>(P::kOff));
  for (int64_t g = 0; g < ng; ++g) {
    const Dec d = P::decode(src + g * (4 * P::kBB));
    const __m512i lo = _mm512_sub_epi8(d.lo, off), hi = _mm512_sub_epi8(d.hi, off);
    // -128 * sum(w) of block k in every dword of 128-bit lane k
    __m512i sm = _mm512_dpbusd_epi32(_mm512_setzero_si512(), _mm512_set1_epi8(-128), lo);
    sm = _mm512_dpbusd_epi32(sm, _mm512_set1_epi8(-128), hi);  // u8 128 x s8 w; negated below
    sm = _mm512_add_epi32(sm, _mm512_shuffle_epi32(sm, _MM_PERM_BADC));
    sm = _mm512_add_epi32(sm, _mm512_shuffle_epi32(sm, _MM_PERM_CDAB));
    sm = _mm512_sub_epi32(_mm512_setzero_si512(), sm);
    alignas(64) uint8_t l[64], h[64];
    alignas(64) float dw[16];
    alignas(64) int32_t nc[16];
    _mm512_store_si512(l, lo);
    _mm512_store_si512(h, hi);
    _mm512_store_ps(dw, d.dw);
    _mm512_store_si512(nc, sm);
    for (int k = 0; k < 4; ++k) {
      uint8_t* rec = out + (4 * g + k) * kWRec;
      std::memcpy(rec, l + 16 * k, 16);
      std::memcpy(rec + 16, h + 16 * k, 16);
      std::memcpy(rec + 32, &dw[4 * k], 4);
      std::memcpy(rec + 36, &nc[4 * k], 4);
    }
  }
  for (int64_t b = 4 * ng; b < nb; ++b) {  // tail blocks, one at a time
    const uint8_t* blk = src + b * P::kBB;
    uint8_t* rec = out + b * kWRec;
    int32_t sum = 0;
    for (int j = 0; j < 16; ++j) {
      const int8_t wl = nib_value<P>(blk[P::kQs + j] & 15), wh = nib_value<P>(blk[P::kQs + j] >> 4);
      rec[j] = static_cast<uint8_t>(wl);
      rec[16 + j] = static_cast<uint8_t>(wh);
      sum += wl + wh;
    }
    const float dw = nib_scale<P>(blk);
    const int32_t nc = -128 * sum;
    std::memcpy(rec + 32, &dw, 4);
    std::memcpy(rec + 36, &nc, 4);
  }
}

inline __m512i dp_bcast(__m512i acc, __m512i a, const uint8_t* p) {  // vpdpbusd, p's dword broadcast
  asm("vpdpbusd %2%{1to16%}, %1, %0" : "+v"(acc) : "v"(a), "m"(*reinterpret_cast<const int32_t*>(p)));
  return acc;
}

// rr (<= kLaneRows) rows of records x one 16-token tile over nb blocks; lanes j < tt stored.
template <int RR>
void lane_tile(const uint8_t* rec, size_t rec_row, const uint8_t* tile, int64_t nb, int tt, float* y, int64_t ldy) {
  __m512 acc[RR];
  KIMI_UNROLL for (int r = 0; r < RR; ++r) acc[r] = _mm512_setzero_ps();
  for (int64_t b = 0; b < nb; ++b) {
    const uint8_t* tb = tile + b * kActTileBlock;
    __m512i a[8];
    KIMI_UNROLL for (int s = 0; s < 8; ++s) a[s] = _mm512_loadu_si512(tb + 64 * s);
    const __m512 dx = _mm512_loadu_ps(tb + 512);
    KIMI_UNROLL for (int r = 0; r < RR; ++r) {
      const uint8_t* w = rec + r * rec_row + b * kWRec;
      __m512i is = _mm512_set1_epi32(rd_i32(w + 36));
      KIMI_UNROLL for (int s = 0; s < 8; ++s) is = dp_bcast(is, a[s], w + 4 * s);
      acc[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(is), _mm512_mul_ps(dx, _mm512_set1_ps(rd_f32(w + 32))), acc[r]);
    }
  }
  KIMI_UNROLL for (int r = 0; r < RR; ++r) {
    alignas(64) float o[16];
    _mm512_store_ps(o, acc[r]);
    for (int j = 0; j < tt; ++j) y[j * ldy + r] = o[j];
  }
}

template <class P>
void run_lanes(const MatView& W, const uint8_t* act, size_t stride, int64_t nt, int64_t r0, int64_t r1, float* y,
               int64_t ldy) {
  constexpr int64_t kChunk = 4 * kTokLanes;  // tokens per pass (the tiles stay in L2)
  if (nt > kChunk) {
    for (int64_t t0 = 0; t0 < nt; t0 += kChunk)
      run_lanes<P>(W, act + static_cast<size_t>(t0) * stride, stride, std::min(kChunk, nt - t0), r0, r1, y + t0 * ldy, ldy);
    return;
  }
  constexpr bool kByte = std::is_same_v<P, ByteP>;  // Q8_0: q8-byte activations
  const int64_t nb = W.cols / 32, ng = nb / (kByte ? 2 : 4);
  const int64_t ntv = (nt + kTokLanes - 1) / kTokLanes;
  // scratch (f32_scratch slot 1, MatKernel::scratch_rows covers it): the activation tiles, then
  // kLaneRows rows of weight records
  const size_t tile_bytes = static_cast<size_t>(nb) * kActTileBlock;
  const size_t rec_row = static_cast<size_t>(nb) * kWRec;
  uint8_t* buf = reinterpret_cast<uint8_t*>(
      f32_scratch(static_cast<int64_t>((tile_bytes * ntv + rec_row * kLaneRows) / 4 + 16), 1));
  uint8_t* recs = buf + tile_bytes * ntv;
  const uint8_t* xp[kTokLanes];
  for (int64_t v = 0; v < ntv; ++v) {
    for (int j = 0; j < kTokLanes; ++j) {  // lanes past the last token repeat it (not stored)
      const int64_t t = std::min<int64_t>(v * kTokLanes + j, nt - 1);
      xp[j] = act + static_cast<size_t>(t) * stride;
    }
    for (int64_t b = 0; b < nb; ++b) act_tile_block<kByte>(xp, b, ng, buf + v * tile_bytes + b * kActTileBlock);
  }
  for (int64_t r = r0; r < r1; r += kLaneRows) {
    const int rr = static_cast<int>(std::min<int64_t>(kLaneRows, r1 - r));
    for (int i = 0; i < rr; ++i) {
      const uint8_t* src = W.data + static_cast<uint64_t>(r + i) * W.row_bytes;
      if constexpr (kByte) q8_weight_records(src, nb, recs + i * rec_row);
      else weight_records<P>(src, nb, recs + i * rec_row);
    }
    for (int64_t v = 0; v < ntv; ++v) {
      const int tt = static_cast<int>(std::min<int64_t>(kTokLanes, nt - v * kTokLanes));
      float* yo = y + v * kTokLanes * ldy + r;
      const uint8_t* tl = buf + v * tile_bytes;
      switch (rr) {
        case 8: lane_tile<8>(recs, rec_row, tl, nb, tt, yo, ldy); break;
        case 7: lane_tile<7>(recs, rec_row, tl, nb, tt, yo, ldy); break;
        case 6: lane_tile<6>(recs, rec_row, tl, nb, tt, yo, ldy); break;
        case 5: lane_tile<5>(recs, rec_row, tl, nb, tt, yo, ldy); break;
        case 4: lane_tile<4>(recs, rec_row, tl, nb, tt, yo, ldy); break;
        case 3: lane_tile<3>(recs, rec_row, tl, nb, tt, yo, ldy); break;
        case 2: lane_tile<2>(recs, rec_row, tl, nb, tt, yo, ldy); break;
        default: lane_tile<1>(recs, rec_row, tl, nb, tt, yo, ldy); break;
      }
    }
  }
}

template <class P>
void run_q8_nib(const MatView& W, const uint8_t* act, size_t stride, int64_t nt, int64_t r0, int64_t r1, float* y,
                int64_t ldy) {
  if (nt == 1) {
    if constexpr (std::is_same_v<P, NibP<true>>) {
      if (vbmi_kernels()) return gemv_mxfp4_vbmi(W, act, r0, r1, y);
    }
    return gemv_q8<P>(W, act, r0, r1, y);
  }
  if (nt < 8) return drive<Q8Tiles<P>, 4, 4>(W.data, W.row_bytes, act, stride, nt, r0, r1, y, ldy, W.cols / 32);
  if constexpr (requires { P::kOff; }) {
    if (nt >= kTokLanes) return run_lanes<P>(W, act, stride, nt, r0, r1, y, ldy);
  }
  const int64_t nb = W.cols / 32, ng = nb / 4;
  const size_t drb = dec_row_bytes(nb, P::kBB);
  // kPanel decoded rows; MatKernel::scratch_rows = 2 covers it (1.5 * cols bytes per row)
  uint8_t* buf = reinterpret_cast<uint8_t*>(f32_scratch(2 * W.cols, 1));
  for (int64_t r = r0; r < r1; r += kPanel) {
    const int64_t rr = r1 - r < kPanel ? r1 - r : kPanel;
    for (int64_t i = 0; i < rr; ++i) {
      const uint8_t* src = W.data + static_cast<uint64_t>(r + i) * W.row_bytes;
      uint8_t* dst = buf + i * drb;
      for (int64_t g = 0; g < ng; ++g) {
        const Dec d = P::decode(src + g * (4 * P::kBB));
        _mm512_storeu_si512(dst + g * kDecGroup, d.lo);
        _mm512_storeu_si512(dst + g * kDecGroup + 64, d.hi);
        _mm512_storeu_ps(dst + g * kDecGroup + 128, d.dw);
      }
      for (int64_t b = ng * 4; b < nb; ++b)
        std::memcpy(dst + ng * kDecGroup + (b - ng * 4) * P::kBB, src + b * P::kBB, P::kBB);
    }
    drive<Q8Tiles<DecodedP<P>>, 4, 4>(buf, drb, act, stride, nt, 0, rr, y + r, ldy, nb);
  }
}

template <class P>
void run_q8(const MatView& W, const uint8_t* act, size_t stride, int64_t nt, int64_t r0, int64_t r1, float* y,
            int64_t ldy) {
  if (nt == 1) return gemv_q8<P>(W, act, r0, r1, y);
  if constexpr (std::is_same_v<P, ByteP>) {  // Q8_0 with >= 16 tokens: tokens in lanes, as MXFP4 / Q4_0
    if (nt >= kTokLanes) return run_lanes<P>(W, act, stride, nt, r0, r1, y, ldy);
  }
  drive<Q8Tiles<P>, 4, 4>(W.data, W.row_bytes, act, stride, nt, r0, r1, y, ldy, W.cols / 32);
}

// ------------------------------------------------------------------------------------------------
// K-quants (Q4_K, Q5_K, Q6_K) x Q8_K activations (block_q8_K as written by quantize_row_q8_K).
// Per 256-element block and row: the 6-bit (Q4_K/Q5_K) or int8 (Q6_K) scales are widened to s16
// once; the block is decoded 64 elements at a time, in natural order, to u8 (Q4_K 0..15, Q5_K
// 0..31, Q6_K 0..63) and used for every token of the tile:
//   vpmaddubsw(w_u8, a_s8) -> s16 pairs (no saturation: 63 * 127 * 2 < 32767), vpmaddwd with the
//   sub-block scales -> s32, summed over the block; then y += d_w * d_a * sum.
// The mins (Q4_K/Q5_K: dmin * m_j) and the Q6_K offset (-32, i.e. 32 * sc_g with scale d) are
// subtracted through the activation's 16-element sums bsums: y -= dmin_w * d_a * sum_g min_g bsum_g.
enum class KT { Q4, Q5, Q6 };

template <KT K>
struct KQ {
  static constexpr int kBB = K == KT::Q4 ? 144 : K == KT::Q5 ? 176 : 210;
  static constexpr int kAB = 292;  // sizeof(block_q8_K): float d, int8 qs[256], int16 bsums[16]

  struct Hdr {
    __m512i sc;      // s16 lanes: Q4/Q5 0..7 scales, 8..15 mins; Q6 0..15 scales
    __m256i mins16;  // s16 per 16-element group: Q4/Q5 m_{g/2}, Q6 32 * sc_g
    float d, dmin;
  };

  static inline Hdr header(const uint8_t* b) {
    Hdr h;
    if constexpr (K == KT::Q6) {
      h.sc = _mm512_cvtepi8_epi16(_mm256_zextsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(b + 192))));
      h.mins16 = _mm256_slli_epi16(_mm512_castsi512_si256(h.sc), 5);
      h.d = _cvtsh_ss(rd16(b + 208));
      h.dmin = h.d;
    } else {
      // 12 bytes of packed 6-bit (scale, min) pairs -> 8 scale bytes then 8 min bytes
      uint32_t u[3];
      std::memcpy(u, b + 4, 12);
      const uint32_t sc_lo = u[0] & 0x3f3f3f3fu;
      const uint32_t sc_hi = (u[2] & 0x0f0f0f0fu) | (((u[0] >> 6) & 0x03030303u) << 4);
      const uint32_t m_lo = u[1] & 0x3f3f3f3fu;
      const uint32_t m_hi = ((u[2] >> 4) & 0x0f0f0f0fu) | (((u[1] >> 6) & 0x03030303u) << 4);
      const __m128i v = _mm_setr_epi32(static_cast<int>(sc_lo), static_cast<int>(sc_hi), static_cast<int>(m_lo),
                                       static_cast<int>(m_hi));
      h.sc = _mm512_cvtepu8_epi16(_mm256_zextsi128_si256(v));
      const __m256i idx = _mm256_setr_epi16(8, 8, 9, 9, 10, 10, 11, 11, 12, 12, 13, 13, 14, 14, 15, 15);
      h.mins16 = _mm256_permutexvar_epi16(idx, _mm512_castsi512_si256(h.sc));
      h.d = _cvtsh_ss(rd16(b));
      h.dmin = _cvtsh_ss(rd16(b + 2));
    }
    return h;
  }

  // s16 scale per vpmaddubsw output lane (lane l = elements 2l, 2l+1 of the 64) for chunk i
  static inline __m512i scales(const Hdr& h, int i) {
    // Q6: lanes 0-7 -> group 4i, 8-15 -> 4i+1, ...; Q4/Q5: lanes 0-15 -> sub-block 2i, 16-31 -> 2i+1
    const __m512i base = K == KT::Q6 ? _mm512_setr_epi32(0, 0, 0, 0, 0x00010001, 0x00010001, 0x00010001, 0x00010001,
                                                         0x00020002, 0x00020002, 0x00020002, 0x00020002, 0x00030003,
                                                         0x00030003, 0x00030003, 0x00030003)
                                     : _mm512_setr_epi32(0, 0, 0, 0, 0, 0, 0, 0, 0x00010001, 0x00010001, 0x00010001,
                                                         0x00010001, 0x00010001, 0x00010001, 0x00010001, 0x00010001);
    const __m512i idx = _mm512_add_epi16(base, _mm512_set1_epi16(static_cast<short>(K == KT::Q6 ? 4 * i : 2 * i)));
    return _mm512_permutexvar_epi16(idx, h.sc);
  }

  // elements 64i .. 64i+63 of the block as u8
  static inline __m512i values(const uint8_t* b, int i) {
    const __m512i m4 = _mm512_set1_epi8(0x0f);
    if constexpr (K == KT::Q6) {
      const int hf = i >> 1, s = (i & 1) * 4;
      const __m512i ql = _mm512_loadu_si512(b + 64 * hf);
      const __m512i lo = _mm512_and_si512(s ? _mm512_srli_epi16(ql, 4) : ql, m4);
      const __m512i qh = _mm512_broadcast_i64x4(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(b + 128 + 32 * hf)));
      const __m512i cnt = _mm512_inserti64x4(_mm512_set1_epi16(static_cast<short>(s)),
                                             _mm256_set1_epi16(static_cast<short>(s + 2)), 1);
      const __m512i hb = _mm512_and_si512(_mm512_srlv_epi16(qh, cnt), _mm512_set1_epi8(0x03));
      return _mm512_or_si512(lo, _mm512_slli_epi16(hb, 4));
    } else {
      const uint8_t* qs = b + (K == KT::Q4 ? 16 : 48) + 32 * i;
      const __m512i q = _mm512_broadcast_i64x4(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(qs)));
      const __m512i cnt = _mm512_inserti64x4(_mm512_setzero_si512(), _mm256_set1_epi16(4), 1);
      __m512i v = _mm512_and_si512(_mm512_srlv_epi16(q, cnt), m4);
      if constexpr (K == KT::Q5) {  // bit j of qh[l] is bit 4 of element l of sub-block j = 2i, 2i+1
        const __m512i qh = _mm512_broadcast_i64x4(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(b + 16)));
        const __m512i sel = _mm512_inserti64x4(_mm512_set1_epi8(static_cast<char>(1 << (2 * i))),
                                               _mm256_set1_epi8(static_cast<char>(1 << (2 * i + 1))), 1);
        v = _mm512_or_si512(v, _mm512_maskz_mov_epi8(_mm512_test_epi8_mask(qh, sel), _mm512_set1_epi8(16)));
      }
      return v;
    }
  }

  template <int R, int T>
  static void tile(const uint8_t* const* w, const uint8_t* const* x, int64_t nb, float* y, int64_t ldy) {
    __m512 acc[R][T];
    KIMI_UNROLL for (int r = 0; r < R; ++r)
      KIMI_UNROLL for (int t = 0; t < T; ++t) acc[r][t] = _mm512_setzero_ps();
    for (int64_t b = 0; b < nb; ++b) {
      Hdr h[R];
      KIMI_UNROLL for (int r = 0; r < R; ++r) {
        if constexpr (T == 1)  // every line of the block kPfBytes ahead (a block is 2.3-3.3 lines)
          for (int l = 0; l < kBB; l += 64) prefetch_line(w[r] + b * kBB + kPfBytes + l);
        h[r] = header(w[r] + b * kBB);
      }
      __m512i isum[R][T];
      KIMI_UNROLL for (int r = 0; r < R; ++r)
        KIMI_UNROLL for (int t = 0; t < T; ++t) isum[r][t] = _mm512_setzero_si512();
      KIMI_UNROLL for (int i = 0; i < 4; ++i) {
        __m512i v[R], sc[R];
        KIMI_UNROLL for (int r = 0; r < R; ++r) {
          v[r] = values(w[r] + b * kBB, i);
          sc[r] = scales(h[r], i);
        }
        KIMI_UNROLL for (int t = 0; t < T; ++t) {
          const __m512i a = _mm512_loadu_si512(x[t] + b * kAB + 4 + 64 * i);
          KIMI_UNROLL for (int r = 0; r < R; ++r)
            isum[r][t] = _mm512_add_epi32(isum[r][t], _mm512_madd_epi16(_mm512_maddubs_epi16(v[r], a), sc[r]));
        }
      }
      KIMI_UNROLL for (int t = 0; t < T; ++t) {
        const uint8_t* ab = x[t] + b * kAB;
        const float da = rd_f32(ab);
        const __m256i bs = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(ab + 260));
        KIMI_UNROLL for (int r = 0; r < R; ++r) {
          const __m512 mn = _mm512_cvtepi32_ps(_mm512_zextsi256_si512(_mm256_madd_epi16(bs, h[r].mins16)));
          acc[r][t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(isum[r][t]), _mm512_set1_ps(h[r].d * da), acc[r][t]);
          acc[r][t] = _mm512_fnmadd_ps(mn, _mm512_set1_ps(h[r].dmin * da), acc[r][t]);
        }
      }
    }
    KIMI_UNROLL for (int r = 0; r < R; ++r)
      KIMI_UNROLL for (int t = 0; t < T; ++t) y[t * ldy + r] = _mm512_reduce_add_ps(acc[r][t]);
  }
};

template <KT K>
void run_kq(const MatView& W, const uint8_t* act, size_t stride, int64_t nt, int64_t r0, int64_t r1, float* y,
            int64_t ldy) {
  if (nt == 1) return drive<KQ<K>, 1, 1>(W.data, W.row_bytes, act, stride, nt, r0, r1, y, ldy, W.cols / 256);
  drive<KQ<K>, 2, 4>(W.data, W.row_bytes, act, stride, nt, r0, r1, y, ldy, W.cols / 256);
}

// The AVX-512 kernels (Q5_0 / Q5_1 at Precision::F32: none, the scalar level decodes them).
const KernelRow kAvx512Kernels[] = {
    {GgmlType::F32, true, {nullptr, nullptr, run_f32act<WK::F32>}},
    {GgmlType::F16, true, {nullptr, nullptr, run_f32act<WK::F16>}},
    {GgmlType::BF16, true, {nullptr, nullptr, run_f32act<WK::BF16>}},
    {GgmlType::Q8_0, true, {nullptr, nullptr, run_deq, 4}},
    {GgmlType::Q4_0, true, {nullptr, nullptr, run_deq, 4}},
    {GgmlType::MXFP4, true, {nullptr, nullptr, run_deq, 4}},
    {GgmlType::Q4_K, true, {nullptr, nullptr, run_deq, 4}},
    {GgmlType::Q5_K, true, {nullptr, nullptr, run_deq, 4}},
    {GgmlType::Q6_K, true, {nullptr, nullptr, run_deq, 4}},
    {GgmlType::F16, false, {f16r_act_bytes, prep_f16r_avx512, run_f32act<WK::F16>}},
    {GgmlType::BF16, false, {bf16_act_bytes, prep_bf16_avx512, run_bf16}},
    {GgmlType::Q8_0, false, {q8_byte_act_bytes, prep_act_q8_0_avx512, run_q8<ByteP>, kLaneScratchRows}},
    {GgmlType::Q4_0, false, {q8_nib_act_bytes, prep_act_q4_0_avx512, run_q8_nib<NibP<false>>, kLaneScratchRows}},
    {GgmlType::Q5_0, false, {q8_nib_act_bytes, prep_act_q5_0_avx512, run_q8_nib<Q5P>, 2}},
    {GgmlType::Q5_1, false, {q8_nib_act_bytes, prep_act_q5_1_avx512, run_q8<Q51P>}},
    {GgmlType::MXFP4, false, {q8_nib_act_bytes, prep_act_mxfp4_avx512, run_q8_nib<NibP<true>>, kLaneScratchRows}},
    {GgmlType::Q4_K, false, {q8_K_act_bytes, prep_q8_K_avx512, run_kq<KT::Q4>}},
    {GgmlType::Q5_K, false, {q8_K_act_bytes, prep_q8_K_avx512, run_kq<KT::Q5>}},
    {GgmlType::Q6_K, false, {q8_K_act_bytes, prep_q8_K_avx512, run_kq<KT::Q6>}},
};

// Rows [0, nr) of a nibble weight (rows >= nvalid: zero) as the AMX A operand (matmul_amx.h). Groups of 4
// blocks outside, rows inside: consecutive rows write consecutive 32-byte pieces of the panel.
template <class P>
void amx_nib_panel(const uint8_t* src, uint64_t row_bytes, int64_t nvalid, int nr, int64_t nb, int8_t* w, float* dw) {
  const int64_t ng = nb / 4, nv = nvalid < nr ? nvalid : nr;
  const __m512i off = _mm512_set1_epi8(static_cast<char>(P::kOff));
  // qwords of (lo, hi): block k's 32 values = lo lane k then hi lane k
  const __m512i i01 = _mm512_setr_epi64(0, 1, 8, 9, 2, 3, 10, 11), i23 = _mm512_setr_epi64(4, 5, 12, 13, 6, 7, 14, 15);
  const __m512i isc = _mm512_setr_epi32(0, 4, 8, 12, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0);
  const int64_t bs = static_cast<int64_t>(nr) * 32;  // bytes from one block to the next
  for (int64_t g = 0; g < ng; ++g) {
    int8_t* o = w + 4 * g * bs;
    float* so = dw + 4 * g * nr;
    for (int64_t i = 0; i < nv; ++i, o += 32, ++so) {
      const Dec d = P::decode(src + static_cast<uint64_t>(i) * row_bytes + g * (4 * P::kBB));
      const __m512i lo = _mm512_sub_epi8(d.lo, off), hi = _mm512_sub_epi8(d.hi, off);
      const __m512i b01 = _mm512_permutex2var_epi64(lo, i01, hi), b23 = _mm512_permutex2var_epi64(lo, i23, hi);
      _mm256_store_si256(reinterpret_cast<__m256i*>(o), _mm512_castsi512_si256(b01));
      _mm256_store_si256(reinterpret_cast<__m256i*>(o + bs), _mm512_extracti64x4_epi64(b01, 1));
      _mm256_store_si256(reinterpret_cast<__m256i*>(o + 2 * bs), _mm512_castsi512_si256(b23));
      _mm256_store_si256(reinterpret_cast<__m256i*>(o + 3 * bs), _mm512_extracti64x4_epi64(b23, 1));
      const __m128 sc = _mm512_castps512_ps128(_mm512_permutexvar_ps(isc, d.dw));  // dword lanes 0, 4, 8, 12
      so[0] = _mm_cvtss_f32(sc);
      so[nr] = _mm_cvtss_f32(_mm_shuffle_ps(sc, sc, 1));
      so[2 * nr] = _mm_cvtss_f32(_mm_shuffle_ps(sc, sc, 2));
      so[3 * nr] = _mm_cvtss_f32(_mm_shuffle_ps(sc, sc, 3));
    }
  }
  for (int64_t b = 4 * ng; b < nb; ++b)  // tail blocks
    for (int64_t i = 0; i < nv; ++i) {
      const uint8_t* blk = src + static_cast<uint64_t>(i) * row_bytes + b * P::kBB;
      int8_t* o = w + b * bs + i * 32;
      for (int j = 0; j < 16; ++j) {
        o[j] = nib_value<P>(blk[P::kQs + j] & 15);
        o[16 + j] = nib_value<P>(blk[P::kQs + j] >> 4);
      }
      dw[b * nr + i] = nib_scale<P>(blk);
    }
  for (int64_t b = 0; b < nb; ++b)  // rows past the weight: zero
    for (int64_t i = nv; i < nr; ++i) {
      std::memset(w + b * bs + i * 32, 0, 32);
      dw[b * nr + i] = 0.0f;
    }
}

}  // namespace

static_assert(kActTileBlock == kAmxNibTileBlock, "the AMX int8 path reads run_lanes' activation tiles");

void amx_nib_act_tiles(GgmlType type, const uint8_t* act, size_t stride, int64_t n, int64_t cols, int64_t v,
                       uint8_t* out) {
  const bool byte = type == GgmlType::Q8_0;
  const int64_t nb = cols / 32, ng = nb / (byte ? 2 : 4);
  const uint8_t* xp[kTokLanes];
  for (int j = 0; j < kTokLanes; ++j)  // lanes past the last token repeat it (not stored)
    xp[j] = act + static_cast<size_t>(std::min<int64_t>(v * kTokLanes + j, n - 1)) * stride;
  for (int64_t b = 0; b < nb; ++b) {
    if (byte) act_tile_block<true>(xp, b, ng, out + b * kActTileBlock, false);
    else act_tile_block<false>(xp, b, ng, out + b * kActTileBlock, false);
  }
}

void amx_nib_weights(GgmlType type, const uint8_t* src, uint64_t row_bytes, int64_t nvalid, int nr, int64_t cols,
                     int8_t* w, float* dw) {
  const int64_t nb = cols / 32;
  if (type == GgmlType::MXFP4) return amx_nib_panel<NibP<true>>(src, row_bytes, nvalid, nr, nb, w, dw);
  if (type == GgmlType::Q4_0) return amx_nib_panel<NibP<false>>(src, row_bytes, nvalid, nr, nb, w, dw);
  // Q8_0: each block's 32 q as they are, d as f32 (the weight records' values); rows past the weight zero
  const int64_t nv = nvalid < nr ? nvalid : nr, bs = static_cast<int64_t>(nr) * 32;
  for (int64_t b = 0; b < nb; ++b) {
    for (int64_t i = 0; i < nv; ++i) {
      const uint8_t* blk = src + static_cast<uint64_t>(i) * row_bytes + b * ByteP::kBB;
      _mm256_store_si256(reinterpret_cast<__m256i*>(w + b * bs + i * 32),
                         _mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk + 2)));
      dw[b * nr + i] = _cvtsh_ss(rd16(blk));
    }
    for (int64_t i = nv; i < nr; ++i) {
      std::memset(w + b * bs + i * 32, 0, 32);
      dw[b * nr + i] = 0.0f;
    }
  }
}

bool avx512_kernel(GgmlType type, Precision prec, MatKernel* k) {
  return select_kernel(kAvx512Kernels, sizeof(kAvx512Kernels) / sizeof(kAvx512Kernels[0]), type, prec, k) ||
         avx512_lowbit_kernel(type, prec, k);  // Q2_K, Q3_K, IQ4_XS, IQ2_XS (matmul_lowbit.h)
}

}  // namespace kimi::kern

#else  // not x86-64

namespace kimi::kern {
bool avx512_kernel(GgmlType, Precision, MatKernel*) { return false; }
void amx_nib_act_tiles(GgmlType, const uint8_t*, size_t, int64_t, int64_t, int64_t, uint8_t*) {}
void amx_nib_weights(GgmlType, const uint8_t*, uint64_t, int64_t, int, int64_t, int8_t*, float*) {}
}  // namespace kimi::kern

#endif
