// AVX-512 (VNNI) kernels over the x16 packed K-quants (repack.h); reached only via dispatch
// (avx512_packed_kernel). A tile is one group of 16 rows (one zmm lane per row) x T tokens:
//   for each 4 consecutive elements of a sub-block: the 16 rows' u8 values (decoded from one
//   64-byte vector) times the token's 4 activation bytes broadcast (vpdpbusd), summed over the
//   sub-block in int32, times the sub-block scale (vpmulld), summed over the super-block;
//   then y += d * d_a * sum - (Q4_K/Q5_K) dmin * d_a * sum_j m_j s_j, where s_j is the activation
//   sum of sub-block j (vpdpwssd over pairs of (m_j, s_j) int16), or - (Q6_K) d * d_a * 32 *
//   sum_k sc_k bsum_k (the -32 offset of its 6-bit values).
// Integer sums are exact (|sum| < 2^31 for every block, see repack.h's value ranges), so the result
// is the reference's sum of d * q * a up to the order of the float additions.
#include "backend/cpu/dispatch.h"

#if defined(__x86_64__)
// GCC 12 warns about _mm512_undefined_* inside its own intrinsic headers
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include "backend/cpu/matmul_driver.h"
#include "backend/cpu/quantize_act.h"
#include "backend/cpu/repack.h"

#include <array>

namespace kimi::kern {

namespace {

enum class KT { Q4, Q5, Q6 };

constexpr int kAB = kQ8KxBlockBytes;  // activation bytes per super-block (quantize_act.h "q8 Kx")
constexpr int kPf = 3072;             // GEMV software prefetch distance (bytes ahead of the read)

inline __m512i bcast_i32(const uint8_t* p) { return _mm512_set1_epi32(rd_i32(p)); }
// acc + the u8 x s8 dot products of v's dwords with the 4 bytes at p broadcast (vpdpbusd with an
// embedded broadcast operand: one instruction; GCC does not fold the broadcast itself)
inline __m512i dp_bcast(__m512i acc, __m512i v, const uint8_t* p) {
  asm("vpdpbusd %2%{1to16%}, %1, %0" : "+v"(acc) : "v"(v), "m"(*reinterpret_cast<const int32_t*>(p)));
  return acc;
}
inline void prefetch(const uint8_t* p) { _mm_prefetch(reinterpret_cast<const char*>(p), _MM_HINT_T0); }

// (a & 0x0f) | b, b having no bits in 0..3
inline __m512i nib_or(__m512i a, __m512i b) {
  return _mm512_ternarylogic_epi32(a, _mm512_set1_epi8(0x0f), b, 0xEA);
}

template <KT K>
struct PK {
  static constexpr int kBB = K == KT::Q4 ? 2304 : K == KT::Q5 ? 2816 : 3328;
  static constexpr int kQs = K == KT::Q4 ? 256 : 768;  // Q4_K / Q5_K: offset of the qs vectors

  // Q6_K: the 4 value vectors (k = 0..3: elements 128h + 32k + 4s ..) of one (h, s) of the
  // block, from the ql vectors of k = 0, 1 and the qh vector (k's 2 bits at 2k of each byte).
  static inline void q6_values(const uint8_t* blk, int h, int s, __m512i v[4]) {
    const __m512i l0 = _mm512_loadu_si512(blk + 256 + 64 * (16 * h + s));
    const __m512i l1 = _mm512_loadu_si512(blk + 256 + 64 * (16 * h + 8 + s));
    const __m512i hb = _mm512_loadu_si512(blk + 2304 + 64 * (8 * h + s));
    const __m512i m30 = _mm512_set1_epi8(0x30);
    v[0] = nib_or(l0, _mm512_and_si512(_mm512_slli_epi16(hb, 4), m30));
    v[1] = nib_or(l1, _mm512_and_si512(_mm512_slli_epi16(hb, 2), m30));
    v[2] = nib_or(_mm512_srli_epi16(l0, 4), _mm512_and_si512(hb, m30));
    v[3] = nib_or(_mm512_srli_epi16(l1, 4), _mm512_and_si512(_mm512_srli_epi16(hb, 2), m30));
  }
  // Q6_K scale of sub-block 2p + odd as int32 lanes, from the int16 pairs scp
  static inline __m512i q6_scale(__m512i scp, int odd) {
    return odd ? _mm512_srai_epi32(scp, 16) : _mm512_srai_epi32(_mm512_slli_epi32(scp, 16), 16);
  }
  // Q4_K / Q5_K: the value vectors of sub-blocks 2c (lo) and 2c+1 (hi), elements 4s .. 4s+3
  static inline void q45_values(const uint8_t* blk, int c, int s, __m512i* lo, __m512i* hi) {
    const __m512i q = _mm512_loadu_si512(blk + kQs + 64 * (8 * c + s));
    if constexpr (K == KT::Q5) {
      const __m512i hb = _mm512_loadu_si512(blk + 256 + 64 * s);  // bit j: 5th bit in sub-block j
      const __m512i m10 = _mm512_set1_epi8(0x10);
      const int j = 2 * c;  // bit j -> bit 4, bit j+1 -> bit 4
      const __m512i h0 = j < 4 ? _mm512_slli_epi16(hb, 4 - j) : _mm512_srli_epi16(hb, j - 4);
      const __m512i h1 = j + 1 < 4 ? _mm512_slli_epi16(hb, 3 - j) : _mm512_srli_epi16(hb, j - 3);
      *lo = nib_or(q, _mm512_and_si512(h0, m10));
      *hi = nib_or(_mm512_srli_epi16(q, 4), _mm512_and_si512(h1, m10));
    } else {
      const __m512i m4 = _mm512_set1_epi8(0x0f);
      *lo = _mm512_and_si512(q, m4);
      *hi = _mm512_and_si512(_mm512_srli_epi16(q, 4), m4);
    }
  }

  // One super-block of the group (blk; Q6_K: d16 = its 16 f16 scales) for T tokens (a[t] = the
  // token's activation block): acc[t] += the 16 rows' block dot products. T <= 4: all value
  // vectors of a load decoded together (independent chains: one per sub-block in flight);
  // T > 4: one sub-block at a time (T chains), the loads repeated per sub-block (registers).
  template <int T>
  static inline void block(const uint8_t* blk, const uint8_t* d16, const uint8_t* const* a, __m512* acc) {
    if constexpr (T == 1) {
      for (int l = 0; l < kBB; l += 64) prefetch(blk + kPf + l);
    }
    constexpr bool kNarrow = T <= 4;
    __m512i isb[T];
    KIMI_UNROLL for (int t = 0; t < T; ++t) isb[t] = _mm512_setzero_si512();
    if constexpr (K == KT::Q6) {
      __m512i scp[8];  // int16 pairs (sc[2p], sc[2p+1]) per row
      KIMI_UNROLL for (int p = 0; p < 8; ++p)
        scp[p] = _mm512_cvtepi8_epi16(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk + 32 * p)));
      KIMI_UNROLL for (int h = 0; h < 2; ++h) {
        KIMI_UNROLL for (int sb = 0; sb < 2; ++sb) {  // sub-block 8h + 2k + sb for k = 0..3
          if constexpr (kNarrow) {
            __m512i is[4][T];
            KIMI_UNROLL for (int k = 0; k < 4; ++k)
              KIMI_UNROLL for (int t = 0; t < T; ++t) is[k][t] = _mm512_setzero_si512();
            KIMI_UNROLL for (int s = 4 * sb; s < 4 * sb + 4; ++s) {
              __m512i v[4];
              q6_values(blk, h, s, v);
              KIMI_UNROLL for (int k = 0; k < 4; ++k)
                KIMI_UNROLL for (int t = 0; t < T; ++t)
                  is[k][t] = dp_bcast(is[k][t], v[k], a[t] + 128 * h + 32 * k + 4 * s);
            }
            KIMI_UNROLL for (int k = 0; k < 4; ++k) {
              const __m512i sc = q6_scale(scp[4 * h + k], sb);
              KIMI_UNROLL for (int t = 0; t < T; ++t) isb[t] = _mm512_add_epi32(isb[t], _mm512_mullo_epi32(is[k][t], sc));
            }
          } else {
            KIMI_UNROLL for (int k = 0; k < 4; ++k) {
              __m512i is[T];
              KIMI_UNROLL for (int t = 0; t < T; ++t) is[t] = _mm512_setzero_si512();
              KIMI_UNROLL for (int s = 4 * sb; s < 4 * sb + 4; ++s) {
                __m512i v[4];
                q6_values(blk, h, s, v);  // the compiler keeps only v[k]
                KIMI_UNROLL for (int t = 0; t < T; ++t) is[t] = dp_bcast(is[t], v[k], a[t] + 128 * h + 32 * k + 4 * s);
              }
              const __m512i sc = q6_scale(scp[4 * h + k], sb);
              KIMI_UNROLL for (int t = 0; t < T; ++t) isb[t] = _mm512_add_epi32(isb[t], _mm512_mullo_epi32(is[t], sc));
            }
          }
        }
      }
      const __m512 d = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(d16)));
      KIMI_UNROLL for (int t = 0; t < T; ++t) {
        __m512i ms = _mm512_setzero_si512();
        KIMI_UNROLL for (int p = 0; p < 8; ++p) ms = _mm512_dpwssd_epi32(ms, scp[p], bcast_i32(a[t] + 276 + 4 * p));
        const __m512i tot = _mm512_sub_epi32(isb[t], _mm512_slli_epi32(ms, 5));
        const __m512 da = _mm512_set1_ps(rd_f32(a[t] + 256));
        acc[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(tot), _mm512_mul_ps(d, da), acc[t]);
      }
    } else {
      const __m512i u0 = _mm512_loadu_si512(blk + 64), u1 = _mm512_loadu_si512(blk + 128),
                    u2 = _mm512_loadu_si512(blk + 192);
      const __m512i m3f = _mm512_set1_epi32(0x3f3f3f3f), m0f = _mm512_set1_epi32(0x0f0f0f0f),
                    m03 = _mm512_set1_epi32(0x03030303);
      // bytes 0..3 of sc4[0] / sc4[1] = the 6-bit scales of sub-blocks 0..3 / 4..7 (same for mins)
      const __m512i sc4[2] = {_mm512_and_si512(u0, m3f),
                              _mm512_or_si512(_mm512_and_si512(u2, m0f),
                                              _mm512_slli_epi32(_mm512_and_si512(_mm512_srli_epi32(u0, 6), m03), 4))};
      auto scale = [&](int j) {
        const __m512i sv = sc4[j >> 2];
        return (j & 3) == 3 ? _mm512_srli_epi32(sv, 24)
                            : _mm512_and_si512(_mm512_srli_epi32(sv, 8 * (j & 3)), _mm512_set1_epi32(0xff));
      };
      KIMI_UNROLL for (int c = 0; c < 4; ++c) {
        if constexpr (kNarrow) {
          constexpr int kNA = T == 1 ? 2 : 1;  // chains per sub-block and token
          __m512i il[kNA][T], ih[kNA][T];
          KIMI_UNROLL for (int u = 0; u < kNA; ++u)
            KIMI_UNROLL for (int t = 0; t < T; ++t) il[u][t] = ih[u][t] = _mm512_setzero_si512();
          KIMI_UNROLL for (int s = 0; s < 8; ++s) {
            __m512i lo, hi;
            q45_values(blk, c, s, &lo, &hi);
            KIMI_UNROLL for (int t = 0; t < T; ++t) {
              il[s % kNA][t] = dp_bcast(il[s % kNA][t], lo, a[t] + 64 * c + 4 * s);
              ih[s % kNA][t] = dp_bcast(ih[s % kNA][t], hi, a[t] + 64 * c + 32 + 4 * s);
            }
          }
          const __m512i sl = scale(2 * c), sh = scale(2 * c + 1);
          KIMI_UNROLL for (int t = 0; t < T; ++t) {
            __m512i l = il[0][t], h = ih[0][t];
            KIMI_UNROLL for (int u = 1; u < kNA; ++u) l = _mm512_add_epi32(l, il[u][t]), h = _mm512_add_epi32(h, ih[u][t]);
            isb[t] = _mm512_add_epi32(isb[t], _mm512_add_epi32(_mm512_mullo_epi32(l, sl), _mm512_mullo_epi32(h, sh)));
          }
        } else {
          KIMI_UNROLL for (int half = 0; half < 2; ++half) {
            const int j = 2 * c + half;
            __m512i is[T];
            KIMI_UNROLL for (int t = 0; t < T; ++t) is[t] = _mm512_setzero_si512();
            KIMI_UNROLL for (int s = 0; s < 8; ++s) {
              __m512i lo, hi;
              q45_values(blk, c, s, &lo, &hi);  // the compiler keeps only the half in use
              KIMI_UNROLL for (int t = 0; t < T; ++t) is[t] = dp_bcast(is[t], half ? hi : lo, a[t] + 32 * j + 4 * s);
            }
            const __m512i sc = scale(j);
            KIMI_UNROLL for (int t = 0; t < T; ++t) isb[t] = _mm512_add_epi32(isb[t], _mm512_mullo_epi32(is[t], sc));
          }
        }
      }
      const __m512i mlo = _mm512_and_si512(u1, m3f);
      const __m512i mhi = _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi32(u2, 4), m0f),
                                          _mm512_slli_epi32(_mm512_and_si512(_mm512_srli_epi32(u1, 6), m03), 4));
      const __m512i m00ff = _mm512_set1_epi32(0x00ff00ff);
      const __m512i mp[4] = {_mm512_and_si512(mlo, m00ff), _mm512_and_si512(_mm512_srli_epi32(mlo, 8), m00ff),
                             _mm512_and_si512(mhi, m00ff), _mm512_and_si512(_mm512_srli_epi32(mhi, 8), m00ff)};
      const __m512 d = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk)));
      const __m512 dmin = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk + 32)));
      KIMI_UNROLL for (int t = 0; t < T; ++t) {
        __m512i ms = _mm512_setzero_si512();
        KIMI_UNROLL for (int p = 0; p < 4; ++p) ms = _mm512_dpwssd_epi32(ms, mp[p], bcast_i32(a[t] + 260 + 4 * p));
        const __m512 da = _mm512_set1_ps(rd_f32(a[t] + 256));
        acc[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(isb[t]), _mm512_mul_ps(d, da), acc[t]);
        acc[t] = _mm512_fnmadd_ps(_mm512_cvtepi32_ps(ms), _mm512_mul_ps(dmin, da), acc[t]);
      }
    }
  }

  // One group (16 rows) x T tokens over all nb super-blocks; y[t * ldy + i] for row i.
  template <int T>
  static void tile(const uint8_t* grp, int64_t nb, const uint8_t* const* x, float* y, int64_t ldy) {
    __m512 acc[T];
    KIMI_UNROLL for (int t = 0; t < T; ++t) acc[t] = _mm512_setzero_ps();
    const uint8_t* a[T];
    for (int64_t b = 0; b < nb; ++b) {
      KIMI_UNROLL for (int t = 0; t < T; ++t) a[t] = x[t] + b * kAB;
      block<T>(grp + b * kBB, K == KT::Q6 ? grp + nb * kBB + b * 32 : nullptr, a, acc);
    }
    KIMI_UNROLL for (int t = 0; t < T; ++t) _mm512_storeu_ps(y + t * ldy, acc[t]);
  }
};

constexpr int kT = 8;  // tokens per GEMM tile

template <KT K, size_t... i>
constexpr auto tile_fns(std::index_sequence<i...>) {
  using Fn = void (*)(const uint8_t*, int64_t, const uint8_t* const*, float*, int64_t);
  return std::array<Fn, sizeof...(i)>{&PK<K>::template tile<static_cast<int>(i) + 1>...};
}

template <KT K>
void run_packed(const PackedWeight& P, const uint8_t* act, size_t stride, int64_t nt, int64_t g0, int64_t g1, float* y,
                int64_t ldy) {
  static constexpr auto tab = tile_fns<K>(std::make_index_sequence<kT>{});
  const int64_t nb = P.cols / 256;
  const uint8_t* xp[kT];
  for (int64_t g = g0; g < g1; ++g) {
    for (int64_t t0 = 0; t0 < nt; t0 += kT) {
      const int tt = static_cast<int>(nt - t0 < kT ? nt - t0 : kT);
      for (int j = 0; j < tt; ++j) xp[j] = act + static_cast<size_t>(t0 + j) * stride;
      tab[tt - 1](P.group(g), nb, xp, y + t0 * ldy + g * kPackRows, ldy);
    }
  }
}

}  // namespace

bool avx512_packed_kernel(GgmlType type, PackedKernel* k) {
  switch (type) {
    // GEMV: Q4_K packed; Q5_K / Q6_K through the original rows, measured 10-25 % faster end to end
    // (small preset tg64, 2 threads; their packed one-token tiles decode 2-3 value vectors per
    // vpdpbusd pair and stall on the block's three read regions)
    case GgmlType::Q4_K: *k = {q8_Kx_act_bytes, prep_q8_Kx_avx512, run_packed<KT::Q4>, true}; return true;
    case GgmlType::Q5_K: *k = {q8_Kx_act_bytes, prep_q8_Kx_avx512, run_packed<KT::Q5>, false}; return true;
    case GgmlType::Q6_K: *k = {q8_Kx_act_bytes, prep_q8_Kx_avx512, run_packed<KT::Q6>, false}; return true;
    default: return false;
  }
}

}  // namespace kimi::kern

#else  // not x86-64

namespace kimi::kern {
bool avx512_packed_kernel(GgmlType, PackedKernel*) { return false; }
}  // namespace kimi::kern

#endif
