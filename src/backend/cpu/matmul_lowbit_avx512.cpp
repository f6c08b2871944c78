// AVX-512 kernels of Q2_K, Q3_K, IQ4_XS, IQ2_XS x Q8_K activations (matmul_lowbit.h). Per
// super-block and row: the group scales widened to s16 once (scalar header decode), then 4 chunks
// of 64 elements decoded to u8 magnitudes + a 64-bit negative mask:
//   Q2_K   2-bit levels (no sign), mins through the activation bsums
//   Q3_K   2 low bits + hmask bit -> -4..3
//   IQ4_XS nibbles -> |level| by vpshufb from the IQ4_NL table, sign = level index < 8
//   IQ2_XS 8 codebook entries gathered (vpgatherqq), signs from the 7-bit indices + parity
// and used for every token of the register tile: the activation is negated where the weight is
// negative (masked subtract), vpmaddubsw, vpmaddwd with the scales, summed per block.
#include "backend/cpu/matmul_lowbit.h"

#if defined(__x86_64__)
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include "backend/cpu/matmul_driver.h"
#include "backend/cpu/matmul_lowbit_impl.h"
#include "backend/cpu/quantize_act.h"
#include "tensor/quants.h"

namespace kimi::kern {

namespace {

constexpr int kAB = 292;  // sizeof(block_q8_K): float d, int8 qs[256], int16 bsums[16]
constexpr int kPf = 2048;

struct Vals {
  __m512i mag;
  __mmask64 neg;
};

template <GgmlType T>
struct LB {
  static constexpr int kBB = lb_block_bytes<T>();

  static inline Vals values(const uint8_t* b, int i, const long long* grid) {
    Vals v;
    v.neg = 0;
    if constexpr (T == GgmlType::Q2_K || T == GgmlType::Q3_K) {
      const uint8_t* qs = b + (T == GgmlType::Q2_K ? 16 : 32) + 32 * (i >> 1);
      const __m512i q = _mm512_broadcast_i64x4(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(qs)));
      const int s0 = 4 * (i & 1);
      const __m512i cnt = _mm512_inserti64x4(_mm512_set1_epi16(static_cast<short>(s0)),
                                             _mm256_set1_epi16(static_cast<short>(s0 + 2)), 1);
      __m512i low = _mm512_and_si512(_mm512_srlv_epi16(q, cnt), _mm512_set1_epi8(3));
      if constexpr (T == GgmlType::Q2_K) {
        v.mag = low;
      } else {
        const __m512i hm = _mm512_broadcast_i64x4(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(b)));
        const __m512i sel = _mm512_inserti64x4(_mm512_set1_epi8(static_cast<char>(1 << (2 * i))),
                                               _mm256_set1_epi8(static_cast<char>(1 << (2 * i + 1))), 1);
        const __mmask64 hb = _mm512_test_epi8_mask(hm, sel);
        const __m512i q3 = _mm512_mask_sub_epi8(low, ~hb, low, _mm512_set1_epi8(4));  // -4..3
        v.mag = _mm512_abs_epi8(q3);
        v.neg = _mm512_movepi8_mask(q3);
      }
    } else if constexpr (T == GgmlType::IQ4_XS) {
      const __m512i q = _mm512_castsi256_si512(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(b + 8 + 32 * i)));
      // 128-bit lanes: sub-block 2i low nibbles, its high nibbles, sub-block 2i+1 low, high
      const __m512i l4 = _mm512_shuffle_i64x2(q, q, 0x50);
      const __m512i cnt = _mm512_setr_epi32(0, 0, 0, 0, 0x00040004, 0x00040004, 0x00040004, 0x00040004, 0, 0, 0, 0,
                                            0x00040004, 0x00040004, 0x00040004, 0x00040004);
      const __m512i idx = _mm512_and_si512(_mm512_srlv_epi16(l4, cnt), _mm512_set1_epi8(0x0f));
      const __m512i tab = _mm512_broadcast_i32x4(_mm_setr_epi8(127, 104, 83, 65, 49, 35, 22, 10, 1, 13, 25, 38, 53, 69, 89, 113));
      v.mag = _mm512_shuffle_epi8(tab, idx);
      v.neg = _mm512_testn_epi8_mask(idx, _mm512_set1_epi8(8));
    } else {  // IQ2_XS
      const __m512i e = _mm512_and_si512(
          _mm512_cvtepu16_epi64(_mm_loadu_si128(reinterpret_cast<const __m128i*>(b + 2 + 16 * i))), _mm512_set1_epi64(511));
      v.mag = _mm512_i64gather_epi64(e, grid, 8);
      v.neg = iq2xs_sign_mask(b, 8 * i, 8);
    }
    return v;
  }

  // s16 scale per vpmaddubsw lane of chunk i (lanes 8g .. 8g+7 -> group 4i + g)
  static inline __m512i scales(__m512i sc, int i) {
    const __m512i base = _mm512_setr_epi32(0, 0, 0, 0, 0x00010001, 0x00010001, 0x00010001, 0x00010001, 0x00020002,
                                           0x00020002, 0x00020002, 0x00020002, 0x00030003, 0x00030003, 0x00030003,
                                           0x00030003);
    return _mm512_permutexvar_epi16(_mm512_add_epi16(base, _mm512_set1_epi16(static_cast<short>(4 * i))), sc);
  }

  template <int R, int TT>
  static void tile(const uint8_t* const* w, const uint8_t* const* x, int64_t nb, float* y, int64_t ldy) {
    __m512 acc[R][TT];
    KIMI_UNROLL for (int r = 0; r < R; ++r)
      KIMI_UNROLL for (int t = 0; t < TT; ++t) acc[r][t] = _mm512_setzero_ps();
    const long long* grid = reinterpret_cast<const long long*>(iq2xs_grid_u64_table());
    for (int64_t b = 0; b < nb; ++b) {
      LbHdr h[R];
      __m512i sc[R];
      KIMI_UNROLL for (int r = 0; r < R; ++r) {
        if constexpr (TT == 1) prefetch(w[r] + b * kBB + kPf);
        lb_header<T>(w[r] + b * kBB, h[r]);
        sc[r] = _mm512_castsi256_si512(_mm256_load_si256(reinterpret_cast<const __m256i*>(h[r].sc)));
      }
      __m512i isum[R][TT];
      KIMI_UNROLL for (int r = 0; r < R; ++r)
        KIMI_UNROLL for (int t = 0; t < TT; ++t) isum[r][t] = _mm512_setzero_si512();
      KIMI_UNROLL for (int i = 0; i < 4; ++i) {
        Vals v[R];
        __m512i s[R];
        KIMI_UNROLL for (int r = 0; r < R; ++r) {
          v[r] = values(w[r] + b * kBB, i, grid);
          s[r] = scales(sc[r], i);
        }
        KIMI_UNROLL for (int t = 0; t < TT; ++t) {
          const __m512i a = _mm512_loadu_si512(x[t] + b * kAB + 4 + 64 * i);
          KIMI_UNROLL for (int r = 0; r < R; ++r) {
            __m512i as = a;
            if constexpr (T != GgmlType::Q2_K) as = _mm512_mask_sub_epi8(a, v[r].neg, _mm512_setzero_si512(), a);
            isum[r][t] = _mm512_add_epi32(isum[r][t], _mm512_madd_epi16(_mm512_maddubs_epi16(v[r].mag, as), s[r]));
          }
        }
      }
      KIMI_UNROLL for (int t = 0; t < TT; ++t) {
        const uint8_t* ab = x[t] + b * kAB;
        const float da = rd_f32(ab);
        KIMI_UNROLL for (int r = 0; r < R; ++r) {
          acc[r][t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(isum[r][t]), _mm512_set1_ps(h[r].d * da), acc[r][t]);
          if constexpr (T == GgmlType::Q2_K) {
            const __m256i bs = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(ab + 260));
            const __m256i mn16 = _mm256_load_si256(reinterpret_cast<const __m256i*>(h[r].mn));
            const __m512 mn = _mm512_cvtepi32_ps(_mm512_zextsi256_si512(_mm256_madd_epi16(bs, mn16)));
            acc[r][t] = _mm512_fnmadd_ps(mn, _mm512_set1_ps(h[r].dmin * da), acc[r][t]);
          }
        }
      }
    }
    KIMI_UNROLL for (int r = 0; r < R; ++r)
      KIMI_UNROLL for (int t = 0; t < TT; ++t) y[t * ldy + r] = _mm512_reduce_add_ps(acc[r][t]);
  }

  static inline void prefetch(const uint8_t* p) { _mm_prefetch(reinterpret_cast<const char*>(p), _MM_HINT_T0); }
};

template <GgmlType T>
void run_lb(const MatView& W, const uint8_t* act, size_t stride, int64_t nt, int64_t r0, int64_t r1, float* y,
            int64_t ldy) {
  if (nt == 1) return drive<LB<T>, 1, 1>(W.data, W.row_bytes, act, stride, nt, r0, r1, y, ldy, W.cols / 256);
  drive<LB<T>, 2, 4>(W.data, W.row_bytes, act, stride, nt, r0, r1, y, ldy, W.cols / 256);
}

const KernelRow kAvx512Lowbit[] = {
    {GgmlType::Q2_K, false, {q8_K_act_bytes, prep_q8_K_avx512, run_lb<GgmlType::Q2_K>}},
    {GgmlType::Q3_K, false, {q8_K_act_bytes, prep_q8_K_avx512, run_lb<GgmlType::Q3_K>}},
    {GgmlType::IQ4_XS, false, {q8_K_act_bytes, prep_q8_K_avx512, run_lb<GgmlType::IQ4_XS>}},
    {GgmlType::IQ2_XS, false, {q8_K_act_bytes, prep_q8_K_avx512, run_lb<GgmlType::IQ2_XS>}},
};

}  // namespace

bool avx512_lowbit_kernel(GgmlType type, Precision prec, MatKernel* k) {
  return select_kernel(kAvx512Lowbit, sizeof(kAvx512Lowbit) / sizeof(kAvx512Lowbit[0]), type, prec, k);
}

}  // namespace kimi::kern

#else  // not x86-64

namespace kimi::kern {
bool avx512_lowbit_kernel(GgmlType, Precision, MatKernel*) { return false; }
}  // namespace kimi::kern

#endif
