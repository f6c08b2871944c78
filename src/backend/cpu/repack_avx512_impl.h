// The x16 packed K-quant kernels' building blocks (repack.h layout), shared by the AVX-512 kernels
// (repack_avx512.cpp) and the AMX ones (repack_amx.cpp): decoding of the packed super-blocks and the
// per-super-block integer / f32 steps. Included ONLY by those ISA files; everything here is in an
// unnamed namespace, so each file gets its own copy compiled with its flags.
#pragma once
#if !defined(__x86_64__)
#error "repack_avx512_impl.h is for the x86 ISA files"
#endif
#include "backend/cpu/matmul_driver.h"
#include "backend/cpu/quantize_act.h"
#include "backend/cpu/repack.h"

namespace kimi::kern {

namespace {

enum class KT { Q4, Q5, Q6 };

constexpr int kAB = kQ8KxBlockBytes;  // activation bytes per super-block (quantize_act.h "q8 Kx")

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
  // Q4_K / Q5_K super-block header of the 16 rows (lanes): bytes 0..3 of sc4[0] / sc4[1] = the 6-bit
  // scales of sub-blocks 0..3 / 4..7; mp[p] = int16 pairs of mins matching the activation's s32 order;
  // d, dmin as f32
  struct Hdr45 {
    __m512i sc4[2], mp[4];
    __m512 d, dmin;
  };
  static inline Hdr45 hdr45(const uint8_t* blk) {
    Hdr45 h;
    const __m512i u0 = _mm512_loadu_si512(blk + 64), u1 = _mm512_loadu_si512(blk + 128),
                  u2 = _mm512_loadu_si512(blk + 192);
    const __m512i m3f = _mm512_set1_epi32(0x3f3f3f3f), m0f = _mm512_set1_epi32(0x0f0f0f0f),
                  m03 = _mm512_set1_epi32(0x03030303);
    h.sc4[0] = _mm512_and_si512(u0, m3f);
    h.sc4[1] = _mm512_or_si512(_mm512_and_si512(u2, m0f),
                               _mm512_slli_epi32(_mm512_and_si512(_mm512_srli_epi32(u0, 6), m03), 4));
    const __m512i mlo = _mm512_and_si512(u1, m3f);
    const __m512i mhi = _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi32(u2, 4), m0f),
                                        _mm512_slli_epi32(_mm512_and_si512(_mm512_srli_epi32(u1, 6), m03), 4));
    const __m512i m00ff = _mm512_set1_epi32(0x00ff00ff);
    h.mp[0] = _mm512_and_si512(mlo, m00ff);
    h.mp[1] = _mm512_and_si512(_mm512_srli_epi32(mlo, 8), m00ff);
    h.mp[2] = _mm512_and_si512(mhi, m00ff);
    h.mp[3] = _mm512_and_si512(_mm512_srli_epi32(mhi, 8), m00ff);
    h.d = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk)));
    h.dmin = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk + 32)));
    return h;
  }
  // the scale of sub-block j of the 16 rows, int32 lanes
  static inline __m512i scale45(const Hdr45& h, int j) {
    const __m512i sv = h.sc4[j >> 2];
    return (j & 3) == 3 ? _mm512_srli_epi32(sv, 24)
                        : _mm512_and_si512(_mm512_srli_epi32(sv, 8 * (j & 3)), _mm512_set1_epi32(0xff));
  }
  // acc + d * d_a * isb - dmin * d_a * sum_j m_j s_j for one token's activation block a (isb: the
  // scaled integer dot products of the 16 rows)
  static inline __m512 finish45(const Hdr45& h, __m512i isb, const uint8_t* a, __m512 acc) {
    __m512i ms = _mm512_setzero_si512();
    KIMI_UNROLL for (int p = 0; p < 4; ++p) ms = _mm512_dpwssd_epi32(ms, h.mp[p], bcast_i32(a + 260 + 4 * p));
    const __m512 da = _mm512_set1_ps(rd_f32(a + 256));
    acc = _mm512_fmadd_ps(_mm512_cvtepi32_ps(isb), _mm512_mul_ps(h.d, da), acc);
    return _mm512_fnmadd_ps(_mm512_cvtepi32_ps(ms), _mm512_mul_ps(h.dmin, da), acc);
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

  // GEMV prefetch of step j of N of a block: its share of the block's lines, pf bytes on
  template <int N>
  static inline void pf_step(const uint8_t* blk, int pf, int j) {
    constexpr int kL = (kBB + 63) / 64;
    for (int l = j * kL / N; l < (j + 1) * kL / N; ++l) prefetch(blk + pf + 64 * l);
  }

  // One super-block of the group (blk; Q6_K: d16 = its 16 f16 scales) for T tokens (a[t] = the
  // token's activation block): acc[t] += the 16 rows' block dot products. T <= 4: all value
  // vectors of a load decoded together (independent chains: one per sub-block in flight);
  // T > 4: one sub-block at a time (T chains), the loads repeated per sub-block (registers).
  // GEMV (T == 1): the block's lines pf bytes on are prefetched first (packed_gemv_prefetch_bytes()).
  template <int T>
  static inline void block(const uint8_t* blk, const uint8_t* d16, const uint8_t* const* a, __m512* acc, int pf) {
    // Q4_K / Q6_K: all lines at the block's start; Q5_K (2816 bytes): spread over the block's 32 steps
    // (pf_step), a few lines per step as the plain GEMV does (44 at once: 0.81 ms vs the plain GEMV's 0.67
    // from DRAM, spread 0.65; bench_matmul gemv_packed/q5_K_2048x8192, 1 thread, AMD Zen 4)
    if constexpr (T == 1 && K != KT::Q5) {
      for (int l = 0; l < kBB; l += 64) prefetch(blk + pf + l);
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
      const Hdr45 hd = hdr45(blk);
      auto scale = [&](int j) { return scale45(hd, j); };
      KIMI_UNROLL for (int c = 0; c < 4; ++c) {
        if constexpr (kNarrow) {
          constexpr int kNA = T == 1 ? 2 : 1;  // chains per sub-block and token
          __m512i il[kNA][T], ih[kNA][T];
          KIMI_UNROLL for (int u = 0; u < kNA; ++u)
            KIMI_UNROLL for (int t = 0; t < T; ++t) il[u][t] = ih[u][t] = _mm512_setzero_si512();
          KIMI_UNROLL for (int s = 0; s < 8; ++s) {
            if constexpr (T == 1 && K == KT::Q5) pf_step<32>(blk, pf, 8 * c + s);
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
      KIMI_UNROLL for (int t = 0; t < T; ++t) acc[t] = finish45(hd, isb[t], a[t], acc[t]);
    }
  }

};

}  // namespace
}  // namespace kimi::kern
