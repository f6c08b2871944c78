#if defined(__x86_64__)  // x86 only; ops_simd_tables.cpp takes these into kAvx512
// AVX-512 DSA indexer scan (compiled with AVX-512 flags; entered only after a CPU check).
// indexer_scores_prepared (H <= 64): heads in lanes against a query prepared once (lane_keys below).
// indexer_scores (any H <= 256): keys outer, each key row converted once per 16-head group and dotted
// with the 16 query heads (L1-resident) into 16 accumulators, which a transpose-add reduces to one
// vector of 16 head dots; ReLU, times the (identically permuted) head weights, summed into the score.
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <immintrin.h>

#include <cstdint>
#include <cstring>

#include "backend/cpu/ops_simd.h"

namespace kimi::kern::avx512 {

namespace {

// a[0..15] -> v with v[lane] = sum of the 16 lanes of a[head_of_lane(lane)], where
// head_of_lane(4*blk + p) = kBlkBase[blk] + kPosOff[p].
constexpr int kBlkBase[4] = {0, 8, 4, 12};
constexpr int kPosOff[4] = {0, 2, 1, 3};

inline __m512 transpose_add16(const __m512* a) {
  __m512 b[8], c[4], d[2];
#pragma GCC unroll 8
  for (int i = 0; i < 8; ++i)
    b[i] = _mm512_add_ps(_mm512_shuffle_f32x4(a[i], a[i + 8], 0x44), _mm512_shuffle_f32x4(a[i], a[i + 8], 0xEE));
#pragma GCC unroll 4
  for (int i = 0; i < 4; ++i)
    c[i] = _mm512_add_ps(_mm512_shuffle_f32x4(b[i], b[i + 4], 0x88), _mm512_shuffle_f32x4(b[i], b[i + 4], 0xDD));
#pragma GCC unroll 2
  for (int i = 0; i < 2; ++i)
    d[i] = _mm512_add_ps(_mm512_shuffle_ps(c[i], c[i + 2], 0x44), _mm512_shuffle_ps(c[i], c[i + 2], 0xEE));
  return _mm512_add_ps(_mm512_shuffle_ps(d[0], d[1], 0x88), _mm512_shuffle_ps(d[0], d[1], 0xDD));
}

template <bool F16>
inline __m512 load_key(const void* keys, int64_t off) {
  if constexpr (F16)
    return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(static_cast<const uint16_t*>(keys) + off)));
  else
    return _mm512_loadu_ps(static_cast<const float*>(keys) + off);
}

template <bool F16>
void scan(const float* const* qg, const __m512* wv, int64_t G, const void* keys, int64_t D, int64_t n,
          float* scores) {
  const int64_t nc = D / 16;
  for (int64_t s = 0; s < n; ++s) {
    __m512 total = _mm512_setzero_ps();
    for (int64_t g = 0; g < G; ++g) {
      const float* q = qg[g];
      __m512 acc[16];
#pragma GCC unroll 16
      for (int h = 0; h < 16; ++h) acc[h] = _mm512_setzero_ps();
      for (int64_t c = 0; c < nc; ++c) {
        const __m512 k = load_key<F16>(keys, s * D + c * 16);
#pragma GCC unroll 16
        for (int h = 0; h < 16; ++h) acc[h] = _mm512_fmadd_ps(_mm512_loadu_ps(q + h * D + c * 16), k, acc[h]);
      }
      const __m512 e = _mm512_max_ps(transpose_add16(acc), _mm512_setzero_ps());
      total = _mm512_fmadd_ps(e, wv[g], total);
    }
    scores[s] = _mm512_reduce_add_ps(total);
  }
}

// Heads in lanes (attention.h, prep_idx_query_f32): KB keys against the G head groups of the prepared
// query qt (dimension d of group g = the vector qt + (g * D + d) * 16, the 16 heads' q[d]); key element d
// broadcast over the lanes, one FMA per key, group and dimension (no horizontal sums); each head's dot is
// summed in order within runs of 32 dimensions, the runs added in order. Then ReLU, times the head
// weights (wv, natural lane order), summed over the lanes: the score.
template <int G, int KB, bool F16>
inline void lane_keys(const float* qt, const __m512* wv, const void* keys, int64_t s0, int64_t D, float* out) {
  alignas(64) float kf[KB][256];
  const float* kp[KB];
#pragma GCC unroll 8
  for (int j = 0; j < KB; ++j) {
    if constexpr (F16) {
      for (int64_t c = 0; c < D; c += 16) _mm512_store_ps(kf[j] + c, load_key<true>(keys, (s0 + j) * D + c));
      kp[j] = kf[j];
    } else {
      kp[j] = static_cast<const float*>(keys) + (s0 + j) * D;
    }
  }
  __m512 tot[KB][G];
#pragma GCC unroll 8
  for (int j = 0; j < KB; ++j)
#pragma GCC unroll 4
    for (int g = 0; g < G; ++g) tot[j][g] = _mm512_setzero_ps();
  for (int64_t d0 = 0; d0 < D; d0 += 32) {
    __m512 acc[KB][G];
#pragma GCC unroll 8
    for (int j = 0; j < KB; ++j)
#pragma GCC unroll 4
      for (int g = 0; g < G; ++g) acc[j][g] = _mm512_setzero_ps();
    const int64_t d1 = d0 + 32 < D ? d0 + 32 : D;
    for (int64_t d = d0; d < d1; ++d) {
      __m512 qv[G];
#pragma GCC unroll 4
      for (int g = 0; g < G; ++g) qv[g] = _mm512_loadu_ps(qt + (g * D + d) * 16);
#pragma GCC unroll 8
      for (int j = 0; j < KB; ++j) {
        const __m512 k = _mm512_set1_ps(kp[j][d]);
#pragma GCC unroll 4
        for (int g = 0; g < G; ++g) acc[j][g] = _mm512_fmadd_ps(qv[g], k, acc[j][g]);
      }
    }
#pragma GCC unroll 8
    for (int j = 0; j < KB; ++j)
#pragma GCC unroll 4
      for (int g = 0; g < G; ++g) tot[j][g] = _mm512_add_ps(tot[j][g], acc[j][g]);
  }
#pragma GCC unroll 8
  for (int j = 0; j < KB; ++j) {
    __m512 t = _mm512_setzero_ps();
#pragma GCC unroll 4
    for (int g = 0; g < G; ++g) t = _mm512_fmadd_ps(_mm512_max_ps(tot[j][g], _mm512_setzero_ps()), wv[g], t);
    out[j] = _mm512_reduce_add_ps(t);
  }
}

template <int G, bool F16>
void lane_scan(const float* qp, const void* keys, int64_t D, int64_t n, float* scores) {
  constexpr int KB = G == 1 ? 8 : G == 2 ? 4 : G == 3 ? 3 : 2;  // ~8 accumulators (+ their run totals)
  __m512 wv[G];
  for (int g = 0; g < G; ++g) wv[g] = _mm512_loadu_ps(qp + G * D * 16 + g * 16);
  int64_t s = 0;
  for (; s + KB <= n; s += KB) lane_keys<G, KB, F16>(qp, wv, keys, s, D, scores + s);
  for (; s < n; ++s) lane_keys<G, 1, F16>(qp, wv, keys, s, D, scores + s);
}

}  // namespace

void indexer_scores_prepared(const float* qp, int64_t H, const void* keys, bool f16, int64_t D, int64_t n,
                             float* scores) {
  switch ((H + 15) / 16) {
    case 1: return f16 ? lane_scan<1, true>(qp, keys, D, n, scores) : lane_scan<1, false>(qp, keys, D, n, scores);
    case 2: return f16 ? lane_scan<2, true>(qp, keys, D, n, scores) : lane_scan<2, false>(qp, keys, D, n, scores);
    case 3: return f16 ? lane_scan<3, true>(qp, keys, D, n, scores) : lane_scan<3, false>(qp, keys, D, n, scores);
    default: return f16 ? lane_scan<4, true>(qp, keys, D, n, scores) : lane_scan<4, false>(qp, keys, D, n, scores);
  }
}

void indexer_scores(const float* q, const float* w, int64_t H, const void* keys, bool f16, int64_t D, int64_t n,
                    float* scores) {
  const int64_t G = (H + 15) / 16;
  alignas(64) float wperm[256];
  alignas(64) float qpad[16 * 256];  // the last, partial group of heads, zero-padded
  const float* qg[16];
  __m512 wv[16];
  for (int64_t g = 0; g < G; ++g) {
    const int64_t h0 = g * 16, nh = H - h0 < 16 ? H - h0 : 16;
    for (int lane = 0; lane < 16; ++lane) {
      const int h = kBlkBase[lane / 4] + kPosOff[lane % 4];
      wperm[g * 16 + lane] = h < nh ? w[h0 + h] : 0.0f;
    }
    wv[g] = _mm512_load_ps(wperm + g * 16);
    if (nh == 16) {
      qg[g] = q + h0 * D;
    } else {
      std::memset(qpad, 0, sizeof(float) * static_cast<size_t>(16 * D));
      std::memcpy(qpad, q + h0 * D, sizeof(float) * static_cast<size_t>(nh * D));
      qg[g] = qpad;
    }
  }
  if (f16)
    scan<true>(qg, wv, G, keys, D, n, scores);
  else
    scan<false>(qg, wv, G, keys, D, n, scores);
}

namespace {

// acc + the u8 x s8 dot products of v's dwords with the 4 bytes at p broadcast (vpdpbusd with an
// embedded-broadcast memory operand: one instruction; GCC does not fold _mm512_set1_epi32 into it)
inline __m512i dpbusd_bcast(__m512i acc, __m512i v, const uint8_t* p) {
  asm("vpdpbusd %2%{1to16%}, %1, %0" : "+v"(acc) : "v"(v), "m"(*reinterpret_cast<const int32_t*>(p)));
  return acc;
}

// KB keys (rows rb bytes apart from k0) against the G head vectors of the prepared query: heads in
// lanes, one vpdpbusd per key dword and head group (the query dword vector in a register, the key
// dword broadcast from the row), KB x G independent accumulators.
template <int G, int KB>
inline void i8_keys(const uint8_t* qt, const __m512* wq, const uint8_t* k0, int64_t D, float* out) {
  const int64_t rb = D + 8, D4 = D / 4;
  __m512i acc[KB][G];
#pragma GCC unroll 16
  for (int j = 0; j < KB; ++j)
#pragma GCC unroll 4
    for (int g = 0; g < G; ++g) acc[j][g] = _mm512_setzero_si512();
  for (int64_t d4 = 0; d4 < D4; ++d4) {
    __m512i qv[G];
#pragma GCC unroll 4
    for (int g = 0; g < G; ++g) qv[g] = _mm512_loadu_si512(qt + (d4 * G + g) * 64);
#pragma GCC unroll 16
    for (int j = 0; j < KB; ++j)
#pragma GCC unroll 4
      for (int g = 0; g < G; ++g) acc[j][g] = dpbusd_bcast(acc[j][g], qv[g], k0 + j * rb + 4 * d4);
  }
#pragma GCC unroll 16
  for (int j = 0; j < KB; ++j) {
    const uint8_t* k = k0 + j * rb;
    float ks;
    int32_t ksum;
    std::memcpy(&ks, k + D, 4);
    std::memcpy(&ksum, k + D + 4, 4);
    const __m512i corr = _mm512_set1_epi32(128 * ksum);  // the + 128 of the u8 query
    __m512 t = _mm512_setzero_ps();
    for (int g = 0; g < G; ++g)
      t = _mm512_fmadd_ps(_mm512_max_ps(_mm512_cvtepi32_ps(_mm512_sub_epi32(acc[j][g], corr)), _mm512_setzero_ps()),
                          wq[g], t);
    out[j] = _mm512_reduce_add_ps(t) * ks;
  }
}

template <int G>
void i8_scan(const uint8_t* qp, const uint8_t* keys, int64_t D, int64_t n, float* scores) {
  constexpr int KB = G <= 2 ? 8 : 4;  // <= 16 accumulators + G query vectors in registers
  const uint8_t* qt = qp;
  __m512 wq[G];
  for (int g = 0; g < G; ++g) wq[g] = _mm512_loadu_ps(reinterpret_cast<const float*>(qp + D / 4 * G * 64) + 16 * g);
  const int64_t rb = D + 8;
  int64_t s = 0;
  for (; s + KB <= n; s += KB) i8_keys<G, KB>(qt, wq, keys + s * rb, D, scores + s);
  for (; s < n; ++s) i8_keys<G, 1>(qt, wq, keys + s * rb, D, scores + s);
}

}  // namespace

void indexer_scores_i8(const uint8_t* qp, int64_t H, const uint8_t* keys, int64_t D, int64_t n, float* scores) {
  switch ((H + 15) / 16) {
    case 1: return i8_scan<1>(qp, keys, D, n, scores);
    case 2: return i8_scan<2>(qp, keys, D, n, scores);
    case 3: return i8_scan<3>(qp, keys, D, n, scores);
    default: return i8_scan<4>(qp, keys, D, n, scores);  // H <= 64 (attention.cpp checks)
  }
}

void block_scores(const float* q, const float* const* rows, int64_t nb, int64_t W, float* out) {
  // acc[j] = lane-wise partial products of q and row j (rows past nb repeat row 0 and are
  // dropped); one transpose-add gives the 16 dot products
  const float* rp[16];
  for (int j = 0; j < 16; ++j) rp[j] = rows[j < nb ? j : 0];
  __m512 acc[16];
#pragma GCC unroll 16
  for (int j = 0; j < 16; ++j) acc[j] = _mm512_setzero_ps();
  for (int64_t c = 0; c < W; c += 16) {
    const __m512 qc = _mm512_loadu_ps(q + c);
#pragma GCC unroll 16
    for (int j = 0; j < 16; ++j) acc[j] = _mm512_fmadd_ps(qc, _mm512_loadu_ps(rp[j] + c), acc[j]);
  }
  alignas(64) float v[16];
  _mm512_store_ps(v, transpose_add16(acc));
  for (int lane = 0; lane < 16; ++lane) {
    const int j = kBlkBase[lane / 4] + kPosOff[lane % 4];
    if (j < nb) out[j] = v[lane];
  }
}

void attn_accumulate(float* z, int64_t nh, int64_t r, const float* const* rows, int64_t nb, const float* p,
                     int64_t p_stride) {
  // 4 heads x 2 slices of 16 per register tile; rows streamed in order (same per-element
  // accumulation order as one axpy per row)
  for (int64_t c = 0; c < r; c += 32) {
    const bool two = c + 16 < r;
    int64_t h = 0;
    for (; h + 4 <= nh; h += 4) {
      float* z0 = z + h * r + c;
      __m512 a0 = _mm512_loadu_ps(z0), a1 = _mm512_loadu_ps(z0 + r), a2 = _mm512_loadu_ps(z0 + 2 * r),
             a3 = _mm512_loadu_ps(z0 + 3 * r);
      __m512 b0 = _mm512_setzero_ps(), b1 = b0, b2 = b0, b3 = b0;
      if (two) {
        b0 = _mm512_loadu_ps(z0 + 16);
        b1 = _mm512_loadu_ps(z0 + r + 16);
        b2 = _mm512_loadu_ps(z0 + 2 * r + 16);
        b3 = _mm512_loadu_ps(z0 + 3 * r + 16);
      }
      const float* ph = p + h * p_stride;
      for (int64_t j = 0; j < nb; ++j) {
        const __m512 x = _mm512_loadu_ps(rows[j] + c);
        const __m512 p0 = _mm512_set1_ps(ph[j]), p1 = _mm512_set1_ps(ph[p_stride + j]),
                     p2 = _mm512_set1_ps(ph[2 * p_stride + j]), p3 = _mm512_set1_ps(ph[3 * p_stride + j]);
        a0 = _mm512_fmadd_ps(p0, x, a0);
        a1 = _mm512_fmadd_ps(p1, x, a1);
        a2 = _mm512_fmadd_ps(p2, x, a2);
        a3 = _mm512_fmadd_ps(p3, x, a3);
        if (two) {
          const __m512 y = _mm512_loadu_ps(rows[j] + c + 16);
          b0 = _mm512_fmadd_ps(p0, y, b0);
          b1 = _mm512_fmadd_ps(p1, y, b1);
          b2 = _mm512_fmadd_ps(p2, y, b2);
          b3 = _mm512_fmadd_ps(p3, y, b3);
        }
      }
      _mm512_storeu_ps(z0, a0);
      _mm512_storeu_ps(z0 + r, a1);
      _mm512_storeu_ps(z0 + 2 * r, a2);
      _mm512_storeu_ps(z0 + 3 * r, a3);
      if (two) {
        _mm512_storeu_ps(z0 + 16, b0);
        _mm512_storeu_ps(z0 + r + 16, b1);
        _mm512_storeu_ps(z0 + 2 * r + 16, b2);
        _mm512_storeu_ps(z0 + 3 * r + 16, b3);
      }
    }
    for (; h < nh; ++h) {
      float* z0 = z + h * r + c;
      __m512 a0 = _mm512_loadu_ps(z0), b0 = two ? _mm512_loadu_ps(z0 + 16) : _mm512_setzero_ps();
      const float* ph = p + h * p_stride;
      for (int64_t j = 0; j < nb; ++j) {
        const __m512 pj = _mm512_set1_ps(ph[j]);
        a0 = _mm512_fmadd_ps(pj, _mm512_loadu_ps(rows[j] + c), a0);
        if (two) b0 = _mm512_fmadd_ps(pj, _mm512_loadu_ps(rows[j] + c + 16), b0);
      }
      _mm512_storeu_ps(z0, a0);
      if (two) _mm512_storeu_ps(z0 + 16, b0);
    }
  }
}

}  // namespace kimi::kern::avx512
#endif  // __x86_64__
