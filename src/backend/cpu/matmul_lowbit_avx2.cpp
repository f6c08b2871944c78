// AVX2 kernels of Q2_K, Q3_K, IQ4_XS, IQ2_XS x Q8_K activations (matmul_lowbit.h): as the
// AVX-512 file with 32-element chunks: u8 magnitudes and a sign vector (vpsignb moves the
// weight's sign onto the activation), vpmaddubsw, vpmaddwd with the two group scales of the chunk.
#include "backend/cpu/matmul_lowbit.h"

#if defined(__x86_64__)
#include "backend/cpu/matmul_driver.h"
#include "backend/cpu/matmul_lowbit_impl.h"
#include "backend/cpu/quantize_act.h"
#include "tensor/quants.h"

namespace kimi::kern {

namespace {

constexpr int kAB = 292;

inline float hsum8(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

struct Vals {
  __m256i mag;  // u8 magnitudes
  __m256i sgn;  // s8: < 0 where the weight is negative, > 0 elsewhere (Q2_K: unused)
};

template <GgmlType T>
struct LB2 {
  static constexpr int kBB = lb_block_bytes<T>();

  // elements 32j .. 32j+31
  static inline Vals values(const uint8_t* b, int j, const uint64_t* grid) {
    Vals v;
    if constexpr (T == GgmlType::Q2_K || T == GgmlType::Q3_K) {
      const uint8_t* qs = b + (T == GgmlType::Q2_K ? 16 : 32) + 32 * (j >> 2);
      const __m256i q = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(qs));
      const __m256i low = _mm256_and_si256(_mm256_srl_epi16(q, _mm_cvtsi32_si128(2 * (j & 3))), _mm256_set1_epi8(3));
      if constexpr (T == GgmlType::Q2_K) {
        v.mag = low;
        v.sgn = _mm256_set1_epi8(1);
      } else {
        const __m256i hm = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b));
        const __m256i hb = _mm256_and_si256(_mm256_srl_epi16(hm, _mm_cvtsi32_si128(j)), _mm256_set1_epi8(1));
        const __m256i q3 = _mm256_sub_epi8(_mm256_or_si256(low, _mm256_slli_epi16(hb, 2)), _mm256_set1_epi8(4));
        v.mag = _mm256_abs_epi8(q3);
        v.sgn = q3;
      }
    } else if constexpr (T == GgmlType::IQ4_XS) {
      const __m128i q = _mm_loadu_si128(reinterpret_cast<const __m128i*>(b + 8 + 16 * j));
      const __m128i m4 = _mm_set1_epi8(0x0f);
      const __m256i idx = _mm256_setr_m128i(_mm_and_si128(q, m4), _mm_and_si128(_mm_srli_epi16(q, 4), m4));
      const __m256i tab = _mm256_broadcastsi128_si256(
          _mm_setr_epi8(-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113));
      v.sgn = _mm256_shuffle_epi8(tab, idx);
      v.mag = _mm256_abs_epi8(v.sgn);
    } else {  // IQ2_XS: groups 4j .. 4j+3
      uint16_t e[4];
      std::memcpy(e, b + 2 + 8 * j, 8);
      v.mag = _mm256_setr_epi64x(static_cast<long long>(grid[e[0] & 511]), static_cast<long long>(grid[e[1] & 511]),
                                 static_cast<long long>(grid[e[2] & 511]), static_cast<long long>(grid[e[3] & 511]));
      const uint32_t m = static_cast<uint32_t>(iq2xs_sign_mask(b, 4 * j, 4));
      // byte k of the result = bit k of m as 0xff / 0x00
      const __m256i rep = _mm256_shuffle_epi8(_mm256_set1_epi32(static_cast<int>(m)),
                                              _mm256_setr_epi8(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 2,
                                                               2, 2, 2, 2, 2, 3, 3, 3, 3, 3, 3, 3, 3));
      const __m256i bits = _mm256_set1_epi64x(static_cast<long long>(0x8040201008040201ull));
      const __m256i neg = _mm256_cmpeq_epi8(_mm256_and_si256(rep, bits), bits);
      v.sgn = _mm256_or_si256(neg, _mm256_set1_epi8(1));  // -1 or 1
    }
    return v;
  }

  template <int R, int TT>
  static void tile(const uint8_t* const* w, const uint8_t* const* x, int64_t nb, float* y, int64_t ldy) {
    static_assert(R == 1, "one row per tile (16 ymm registers)");
    __m256 acc[TT];
    KIMI_UNROLL for (int t = 0; t < TT; ++t) acc[t] = _mm256_setzero_ps();
    const uint64_t* grid = iq2xs_grid_u64_table();
    for (int64_t b = 0; b < nb; ++b) {
      const uint8_t* blk = w[0] + b * kBB;
      LbHdr h;
      lb_header<T>(blk, h);
      __m256i isum[TT];
      KIMI_UNROLL for (int t = 0; t < TT; ++t) isum[t] = _mm256_setzero_si256();
      KIMI_UNROLL for (int j = 0; j < 8; ++j) {
        const Vals v = values(blk, j, grid);
        const __m256i sc = _mm256_setr_m128i(_mm_set1_epi16(h.sc[2 * j]), _mm_set1_epi16(h.sc[2 * j + 1]));
        KIMI_UNROLL for (int t = 0; t < TT; ++t) {
          __m256i a = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x[t] + b * kAB + 4 + 32 * j));
          if constexpr (T != GgmlType::Q2_K) a = _mm256_sign_epi8(a, v.sgn);
          isum[t] = _mm256_add_epi32(isum[t], _mm256_madd_epi16(_mm256_maddubs_epi16(v.mag, a), sc));
        }
      }
      KIMI_UNROLL for (int t = 0; t < TT; ++t) {
        const uint8_t* ab = x[t] + b * kAB;
        const float da = rd_f32(ab);
        acc[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum[t]), _mm256_set1_ps(h.d * da), acc[t]);
        if constexpr (T == GgmlType::Q2_K) {
          const __m256i bs = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(ab + 260));
          const __m256i mn16 = _mm256_load_si256(reinterpret_cast<const __m256i*>(h.mn));
          acc[t] = _mm256_fnmadd_ps(_mm256_cvtepi32_ps(_mm256_madd_epi16(bs, mn16)), _mm256_set1_ps(h.dmin * da), acc[t]);
        }
      }
    }
    KIMI_UNROLL for (int t = 0; t < TT; ++t) y[t * ldy] = hsum8(acc[t]);
  }
};

template <GgmlType T>
constexpr auto run_lb2 = run_tiles<LB2<T>, 1, 4, 256>;

const KernelRow kAvx2Lowbit[] = {
    {GgmlType::Q2_K, false, {q8_K_act_bytes, prep_q8_K, run_lb2<GgmlType::Q2_K>}},
    {GgmlType::Q3_K, false, {q8_K_act_bytes, prep_q8_K, run_lb2<GgmlType::Q3_K>}},
    {GgmlType::IQ4_XS, false, {q8_K_act_bytes, prep_q8_K, run_lb2<GgmlType::IQ4_XS>}},
    {GgmlType::IQ2_XS, false, {q8_K_act_bytes, prep_q8_K, run_lb2<GgmlType::IQ2_XS>}},
};

}  // namespace

bool avx2_lowbit_kernel(GgmlType type, Precision prec, MatKernel* k) {
  return select_kernel(kAvx2Lowbit, sizeof(kAvx2Lowbit) / sizeof(kAvx2Lowbit[0]), type, prec, k);
}

}  // namespace kimi::kern

#else  // not x86-64

namespace kimi::kern {
bool avx2_lowbit_kernel(GgmlType, Precision, MatKernel*) { return false; }
}  // namespace kimi::kern

#endif
