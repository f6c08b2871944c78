// AVX2 + FMA + F16C matmul kernels; reached only via dispatch (avx2_kernel). The micro-kernels
// only: register tiles of R rows x T tokens (8-lane vectors) driven by matmul_driver.h, as in the
// AVX-512 file, and the table of this level's kernels at the end.
//   F32/F16/BF16 x f32 activations and BF16 x bf16 activations: widen to f32, FMA.
//   Q4_0 / MXFP4: vpmaddubsw of the (offset, non-negative) 4-bit weights with the s8 activation,
//     minus the precomputed offset * sum(q) (quantize_act.h nibble layout), times the scales.
//   Q8_0: vpmaddubsw(|w|, sign(x, w)) (no saturation: 128 * 127 * 2 < 32768), times the scales.
//   Q4_K / Q5_K / Q6_K: vpmaddubsw with Q8_K activations, vpmaddwd with the sub-block scales.
// Precision::F32 for quantized weights uses the scalar kernels.
#include "backend/cpu/dispatch.h"
#include "backend/cpu/matmul_lowbit.h"

#if defined(__x86_64__)
#include "backend/cpu/matmul_driver.h"
#include "backend/cpu/quantize_act.h"

namespace kimi::kern {

namespace {

inline float hsum8(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}
inline float bf16f(uint16_t h) {
  const uint32_t u = static_cast<uint32_t>(h) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

// ------------------------------------------------------------------------------------------------
// widen-to-f32 kernels. W: weight kind; X: activation kind (f32 or bf16)
enum class K { F32, F16, BF16 };

template <K W, K X>
struct Widen {
  static constexpr int WS = W == K::F32 ? 4 : 2, XS = X == K::F32 ? 4 : 2;
  template <K Kind>
  static inline __m256 load8(const uint8_t* p) {
    if constexpr (Kind == K::F32) return _mm256_loadu_ps(reinterpret_cast<const float*>(p));
    else if constexpr (Kind == K::F16) return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
    else
      return _mm256_castsi256_ps(
          _mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))), 16));
  }
  template <K Kind>
  static inline float load1(const uint8_t* p) {
    if constexpr (Kind == K::F32) {
      return rd_f32(p);
    } else if constexpr (Kind == K::F16) {
      return _cvtsh_ss(rd16(p));
    } else {
      return bf16f(rd16(p));
    }
  }
  template <int R, int T>
  static void tile(const uint8_t* const* w, const uint8_t* const* x, int64_t cols, float* y, int64_t ldy) {
    __m256 acc[R][T];
    KIMI_UNROLL for (int r = 0; r < R; ++r)
      KIMI_UNROLL for (int t = 0; t < T; ++t) acc[r][t] = _mm256_setzero_ps();
    int64_t k = 0;
    for (; k + 8 <= cols; k += 8) {
      __m256 wv[R];
      KIMI_UNROLL for (int r = 0; r < R; ++r) wv[r] = load8<W>(w[r] + k * WS);
      KIMI_UNROLL for (int t = 0; t < T; ++t) {
        const __m256 xv = load8<X>(x[t] + k * XS);
        KIMI_UNROLL for (int r = 0; r < R; ++r) acc[r][t] = _mm256_fmadd_ps(wv[r], xv, acc[r][t]);
      }
    }
    KIMI_UNROLL for (int r = 0; r < R; ++r)
      KIMI_UNROLL for (int t = 0; t < T; ++t) {
        float s = hsum8(acc[r][t]);
        for (int64_t c = k; c < cols; ++c) s += load1<W>(w[r] + c * WS) * load1<X>(x[t] + c * XS);
        y[t * ldy + r] = s;
      }
  }
};

template <K W, K X>
constexpr auto run_widen = run_tiles<Widen<W, X>, 2, 4, 1>;

// ------------------------------------------------------------------------------------------------
// 8-bit dot products
struct Dec {
  __m256i lo[2], hi[2];
  __m256 dw[2];
};

inline __m256i load2x16(const uint8_t* p, int stride) {
  return _mm256_inserti128_si256(_mm256_castsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))),
                                 _mm_loadu_si128(reinterpret_cast<const __m128i*>(p + stride)), 1);
}

template <bool MX>
struct NibP {
  static constexpr int kG = 4, kBB = MX ? 17 : 18, kAG = kNibGroupBytes, kQs = MX ? 1 : 2;
  static inline float wscale(const uint8_t* blk) {
    if constexpr (MX) return e8m0_scale(blk[0]);
    else return _cvtsh_ss(rd16(blk));
  }
  static inline Dec decode(const uint8_t* p) {
    Dec d;
    const __m256i m4 = _mm256_set1_epi8(0x0f);
    const __m256i tab = _mm256_broadcastsi128_si256(mxfp4_plus12_table());
    for (int h = 0; h < 2; ++h) {
      const uint8_t* b = p + 2 * h * kBB;
      const __m256i qs = load2x16(b + kQs, kBB);
      d.lo[h] = _mm256_and_si256(qs, m4);
      d.hi[h] = _mm256_and_si256(_mm256_srli_epi16(qs, 4), m4);
      if constexpr (MX) {
        d.lo[h] = _mm256_shuffle_epi8(tab, d.lo[h]);
        d.hi[h] = _mm256_shuffle_epi8(tab, d.hi[h]);
      }
      d.dw[h] = _mm256_setr_m128(_mm_set1_ps(wscale(b)), _mm_set1_ps(wscale(b + kBB)));
    }
    return d;
  }
  static inline __m256 dot(const Dec& d, const uint8_t* a, __m256 acc) {
    const __m256i ones = _mm256_set1_epi16(1);
    for (int h = 0; h < 2; ++h) {
      const __m256i p = _mm256_add_epi16(
          _mm256_maddubs_epi16(d.lo[h], _mm256_loadu_si256(reinterpret_cast<const __m256i*>(a + 32 * h))),
          _mm256_maddubs_epi16(d.hi[h], _mm256_loadu_si256(reinterpret_cast<const __m256i*>(a + 64 + 32 * h))));
      __m256i s = _mm256_madd_epi16(p, ones);
      s = _mm256_sub_epi32(s, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(a + 192 + 32 * h)));
      acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(s),
                            _mm256_mul_ps(d.dw[h], _mm256_loadu_ps(reinterpret_cast<const float*>(a + 128 + 32 * h))),
                            acc);
    }
    return acc;
  }
  static inline float tail(const uint8_t* blk, const uint8_t* a) {
    const __m128i qs = _mm_loadu_si128(reinterpret_cast<const __m128i*>(blk + kQs));
    const __m128i m4 = _mm_set1_epi8(0x0f);
    __m128i lo = _mm_and_si128(qs, m4), hi = _mm_and_si128(_mm_srli_epi16(qs, 4), m4);
    if constexpr (MX) {
      const __m128i tab = mxfp4_plus12_table();
      lo = _mm_shuffle_epi8(tab, lo);
      hi = _mm_shuffle_epi8(tab, hi);
    }
    const __m128i p = _mm_add_epi16(_mm_maddubs_epi16(lo, _mm_loadu_si128(reinterpret_cast<const __m128i*>(a))),
                                    _mm_maddubs_epi16(hi, _mm_loadu_si128(reinterpret_cast<const __m128i*>(a + 16))));
    const __m128i s = _mm_madd_epi16(p, _mm_set1_epi16(1));
    return static_cast<float>(hsum_epi32_128(s) - rd_i32(a + 36)) * (wscale(blk) * rd_f32(a + 32));
  }
};

struct ByteP {
  static constexpr int kG = 2, kBB = 34, kAG = kByteGroupBytes;
  static inline __m256i dot32(const uint8_t* w, const uint8_t* x) {
    const __m256i wv = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(w));
    const __m256i xv = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x));
    const __m256i p = _mm256_maddubs_epi16(_mm256_sign_epi8(wv, wv), _mm256_sign_epi8(xv, wv));
    return _mm256_madd_epi16(p, _mm256_set1_epi16(1));
  }
  static inline Dec decode(const uint8_t* p) {
    Dec d;  // keep the raw block pointers' scales; the bytes are re-read in dot (L1 resident)
    d.dw[0] = _mm256_set1_ps(_cvtsh_ss(rd16(p)));
    d.dw[1] = _mm256_set1_ps(_cvtsh_ss(rd16(p + 34)));
    d.lo[0] = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + 2));
    d.lo[1] = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + 36));
    d.hi[0] = _mm256_sign_epi8(d.lo[0], d.lo[0]);
    d.hi[1] = _mm256_sign_epi8(d.lo[1], d.lo[1]);
    return d;
  }
  static inline __m256 dot(const Dec& d, const uint8_t* a, __m256 acc) {
    for (int k = 0; k < 2; ++k) {
      const __m256i xv = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(a + 32 * k));
      const __m256i p = _mm256_maddubs_epi16(d.hi[k], _mm256_sign_epi8(xv, d.lo[k]));
      const __m256i s = _mm256_madd_epi16(p, _mm256_set1_epi16(1));
      acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(s), _mm256_mul_ps(d.dw[k], _mm256_set1_ps(rd_f32(a + 64 + 32 * k))), acc);
    }
    return acc;
  }
  static inline float tail(const uint8_t* blk, const uint8_t* a) {
    const __m256i s = dot32(blk + 2, a);
    const __m128i s4 = _mm_add_epi32(_mm256_castsi256_si128(s), _mm256_extracti128_si256(s, 1));
    return static_cast<float>(hsum_epi32_128(s4)) * (_cvtsh_ss(rd16(blk)) * rd_f32(a + 32));
  }
};

template <class P>
struct Q8Tiles {
  template <int R, int T>
  static void tile(const uint8_t* const* w, const uint8_t* const* x, int64_t nb, float* y, int64_t ldy) {
    __m256 acc[R][T];
    KIMI_UNROLL for (int r = 0; r < R; ++r)
      KIMI_UNROLL for (int t = 0; t < T; ++t) acc[r][t] = _mm256_setzero_ps();
    const int64_t ng = nb / P::kG;
    for (int64_t g = 0; g < ng; ++g) {
      Dec d[R];
      KIMI_UNROLL for (int r = 0; r < R; ++r) d[r] = P::decode(w[r] + g * (P::kG * P::kBB));
      KIMI_UNROLL for (int t = 0; t < T; ++t) {
        const uint8_t* a = x[t] + g * P::kAG;
        KIMI_UNROLL for (int r = 0; r < R; ++r) acc[r][t] = P::dot(d[r], a, acc[r][t]);
      }
    }
    KIMI_UNROLL for (int r = 0; r < R; ++r)
      KIMI_UNROLL for (int t = 0; t < T; ++t) {
        float s = hsum8(acc[r][t]);
        for (int64_t b = ng * P::kG; b < nb; ++b)
          s += P::tail(w[r] + b * P::kBB, x[t] + ng * P::kAG + (b - ng * P::kG) * kTailBlockBytes);
        y[t * ldy + r] = s;
      }
  }
};

template <class P>
constexpr auto run_q8 = run_tiles<Q8Tiles<P>, 1, 4, 32>;

// ------------------------------------------------------------------------------------------------
// K-quants x Q8_K activations (block_q8_K), same scheme as the AVX-512 file with 32-element
// chunks: vpmaddubsw(w_u8, a_s8) -> s16, vpmaddwd with the chunk's s16 scales -> s32, summed per
// block, then y += d_w * d_a * sum - dmin_w * d_a * sum_g min_g * bsum_g (Q6_K: min_g = 32 sc_g).
enum class KT { Q4, Q5, Q6 };

template <KT Kt>
struct KQ {
  static constexpr int kBB = Kt == KT::Q4 ? 144 : Kt == KT::Q5 ? 176 : 210;
  static constexpr int kAB = 292;  // sizeof(block_q8_K)

  struct Hdr {
    alignas(16) uint8_t sm[16];  // Q4/Q5: 8 scales then 8 mins (6-bit)
    __m256i mins16;              // s16 per 16-element group
    float d, dmin;
  };

  static inline void header(const uint8_t* b, Hdr& h) {
    if constexpr (Kt == KT::Q6) {
      const __m256i sc = _mm256_cvtepi8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(b + 192)));
      h.mins16 = _mm256_slli_epi16(sc, 5);
      h.d = _cvtsh_ss(rd16(b + 208));
      h.dmin = h.d;
    } else {
      uint32_t u[3];
      std::memcpy(u, b + 4, 12);
      const uint32_t w4[4] = {u[0] & 0x3f3f3f3fu, (u[2] & 0x0f0f0f0fu) | (((u[0] >> 6) & 0x03030303u) << 4),
                              u[1] & 0x3f3f3f3fu, ((u[2] >> 4) & 0x0f0f0f0fu) | (((u[1] >> 6) & 0x03030303u) << 4)};
      std::memcpy(h.sm, w4, 16);
      const __m128i v = _mm_load_si128(reinterpret_cast<const __m128i*>(h.sm));
      h.mins16 = _mm256_cvtepu8_epi16(
          _mm_shuffle_epi8(v, _mm_setr_epi8(8, 8, 9, 9, 10, 10, 11, 11, 12, 12, 13, 13, 14, 14, 15, 15)));
      h.d = _cvtsh_ss(rd16(b));
      h.dmin = _cvtsh_ss(rd16(b + 2));
    }
  }

  // s16 scale of the 16 vpmaddubsw lanes of chunk j (elements 32j .. 32j+31)
  static inline __m256i scales(const uint8_t* b, const Hdr& h, int j) {
    if constexpr (Kt == KT::Q6) {
      const int8_t* sc = reinterpret_cast<const int8_t*>(b + 192);
      return _mm256_setr_m128i(_mm_set1_epi16(sc[2 * j]), _mm_set1_epi16(sc[2 * j + 1]));
    } else {
      return _mm256_set1_epi16(h.sm[j]);
    }
  }

  static inline __m256i values(const uint8_t* b, int j) {
    const __m256i m4 = _mm256_set1_epi8(0x0f);
    if constexpr (Kt == KT::Q6) {
      const int hf = j >> 2, k = j & 3;
      const __m256i ql = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b + 64 * hf + 32 * (k & 1)));
      const __m256i lo = _mm256_and_si256(k & 2 ? _mm256_srli_epi16(ql, 4) : ql, m4);
      const __m256i qh = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b + 128 + 32 * hf));
      const __m256i hb = _mm256_and_si256(_mm256_srl_epi16(qh, _mm_cvtsi32_si128(2 * k)), _mm256_set1_epi8(0x03));
      return _mm256_or_si256(lo, _mm256_slli_epi16(hb, 4));
    } else {
      const uint8_t* qs = b + (Kt == KT::Q4 ? 16 : 48) + 32 * (j >> 1);
      const __m256i q = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(qs));
      __m256i v = _mm256_and_si256(j & 1 ? _mm256_srli_epi16(q, 4) : q, m4);
      if constexpr (Kt == KT::Q5) {  // bit j of qh[l] -> bit 4 of element l
        const __m256i qh = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b + 16));
        const __m256i bit = _mm256_and_si256(_mm256_srl_epi16(qh, _mm_cvtsi32_si128(j)), _mm256_set1_epi8(0x01));
        v = _mm256_or_si256(v, _mm256_slli_epi16(bit, 4));
      }
      return v;
    }
  }

  template <int R, int T>
  static void tile(const uint8_t* const* w, const uint8_t* const* x, int64_t nb, float* y, int64_t ldy) {
    static_assert(R == 1, "one row per tile (16 ymm registers)");
    __m256 acc[T];
    KIMI_UNROLL for (int t = 0; t < T; ++t) acc[t] = _mm256_setzero_ps();
    for (int64_t b = 0; b < nb; ++b) {
      const uint8_t* blk = w[0] + b * kBB;
      Hdr h;
      header(blk, h);
      __m256i isum[T];
      KIMI_UNROLL for (int t = 0; t < T; ++t) isum[t] = _mm256_setzero_si256();
      KIMI_UNROLL for (int j = 0; j < 8; ++j) {
        const __m256i v = values(blk, j), sc = scales(blk, h, j);
        KIMI_UNROLL for (int t = 0; t < T; ++t) {
          const __m256i a = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x[t] + b * kAB + 4 + 32 * j));
          isum[t] = _mm256_add_epi32(isum[t], _mm256_madd_epi16(_mm256_maddubs_epi16(v, a), sc));
        }
      }
      KIMI_UNROLL for (int t = 0; t < T; ++t) {
        const uint8_t* ab = x[t] + b * kAB;
        const float da = rd_f32(ab);
        const __m256i bs = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(ab + 260));
        const __m256 mn = _mm256_cvtepi32_ps(_mm256_madd_epi16(bs, h.mins16));
        acc[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum[t]), _mm256_set1_ps(h.d * da), acc[t]);
        acc[t] = _mm256_fnmadd_ps(mn, _mm256_set1_ps(h.dmin * da), acc[t]);
      }
    }
    KIMI_UNROLL for (int t = 0; t < T; ++t) y[t * ldy] = hsum8(acc[t]);
  }
};

template <KT Kt>
constexpr auto run_kq = run_tiles<KQ<Kt>, 1, 4, 256>;

// The AVX2 kernels (Precision::F32 for quantized weights: none, the scalar level decodes them).
const KernelRow kAvx2Kernels[] = {
    {GgmlType::F32, true, {nullptr, nullptr, run_widen<K::F32, K::F32>}},
    {GgmlType::F16, true, {nullptr, nullptr, run_widen<K::F16, K::F32>}},
    {GgmlType::BF16, true, {nullptr, nullptr, run_widen<K::BF16, K::F32>}},
    {GgmlType::F16, false, {f16r_act_bytes, prep_f16r, run_widen<K::F16, K::F32>}},
    {GgmlType::BF16, false, {bf16_act_bytes, prep_bf16, run_widen<K::BF16, K::BF16>}},
    {GgmlType::Q8_0, false, {q8_byte_act_bytes, prep_act_q8_0, run_q8<ByteP>}},
    {GgmlType::Q4_0, false, {q8_nib_act_bytes, prep_act_q4_0, run_q8<NibP<false>>}},
    {GgmlType::MXFP4, false, {q8_nib_act_bytes, prep_act_mxfp4, run_q8<NibP<true>>}},
    {GgmlType::Q4_K, false, {q8_K_act_bytes, prep_q8_K, run_kq<KT::Q4>}},
    {GgmlType::Q5_K, false, {q8_K_act_bytes, prep_q8_K, run_kq<KT::Q5>}},
    {GgmlType::Q6_K, false, {q8_K_act_bytes, prep_q8_K, run_kq<KT::Q6>}},
};

}  // namespace

bool avx2_kernel(GgmlType type, Precision prec, MatKernel* k) {
  return select_kernel(kAvx2Kernels, sizeof(kAvx2Kernels) / sizeof(kAvx2Kernels[0]), type, prec, k) ||
         avx2_lowbit_kernel(type, prec, k);  // Q2_K, Q3_K, IQ4_XS, IQ2_XS (matmul_lowbit.h)
}

}  // namespace kimi::kern

#else  // not x86-64

namespace kimi::kern {
bool avx2_kernel(GgmlType, Precision, MatKernel*) { return false; }
}  // namespace kimi::kern

#endif
