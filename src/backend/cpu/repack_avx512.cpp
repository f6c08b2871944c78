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
#include "backend/cpu/repack_avx512_impl.h"

#include <algorithm>
#include <array>
#include <cstring>

namespace kimi::kern {

namespace {

// One group (16 rows) x T tokens over all nb super-blocks; y[t * ldy + i] for row i.
template <KT K, int T>
void tile(const uint8_t* grp, int64_t nb, const uint8_t* const* x, float* y, int64_t ldy) {
  const int pf = T == 1 ? packed_gemv_prefetch_bytes() : 0;
  __m512 acc[T];
  KIMI_UNROLL for (int t = 0; t < T; ++t) acc[t] = _mm512_setzero_ps();
  const uint8_t* a[T];
  for (int64_t b = 0; b < nb; ++b) {
    KIMI_UNROLL for (int t = 0; t < T; ++t) a[t] = x[t] + b * kAB;
    PK<K>::template block<T>(grp + b * PK<K>::kBB, K == KT::Q6 ? grp + nb * PK<K>::kBB + b * 32 : nullptr, a, acc, pf);
  }
  KIMI_UNROLL for (int t = 0; t < T; ++t) _mm512_storeu_ps(y + t * ldy, acc[t]);
}

constexpr int kT = 8;  // tokens per GEMM tile

template <KT K, size_t... i>
constexpr auto tile_fns(std::index_sequence<i...>) {
  using Fn = void (*)(const uint8_t*, int64_t, const uint8_t* const*, float*, int64_t);
  return std::array<Fn, sizeof...(i)>{&tile<K, static_cast<int>(i) + 1>...};
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

// ---- BF16 in the bf16 x16 order (repack.h): a register tile of NV groups (16 NV rows) x T tokens over all
// column pairs, acc[v][t] lane i = row 16v + i of token t, each pair step 4 weight vectors (one stream per
// group, front to back) and T broadcast activation pairs into 24 vdpbf16ps. Every row sums its pairs in
// order from the first to the last in one lane, whatever the tile and the tokens: a token's row is the same
// bits alone (T = 1) and in any batch (Matmul.PackedBf16MatchesReferenceAndBatchEqualsAlone). Measured
// (bench_dnnl, AMD EPYC Zen 4, 1 thread): blocking the columns (K blocks of 64-512 with the partial sums
// parked in y) was 7-45 % slower than one pass; 3 x 8 and 4 x 6 tiles alike, 2 x 12 slower.
constexpr int kBf16NV = 4, kBf16T = 6;

template <int NV, int T>
void bf16_tile(const uint8_t* grp, uint64_t gb, const uint8_t* const* x, int64_t np, float* y, int64_t ldy) {
  __m512 acc[NV][T];
  KIMI_UNROLL for (int v = 0; v < NV; ++v)
    KIMI_UNROLL for (int t = 0; t < T; ++t) acc[v][t] = _mm512_setzero_ps();
  const uint8_t* w = grp;
  for (int64_t p = 0; p < np; ++p, w += 64) {
    __m512i wv[NV];
    KIMI_UNROLL for (int v = 0; v < NV; ++v) wv[v] = _mm512_load_si512(w + static_cast<uint64_t>(v) * gb);
    KIMI_UNROLL for (int t = 0; t < T; ++t) {
      const __m512i xb = bcast_i32(x[t] + 4 * p);
      KIMI_UNROLL for (int v = 0; v < NV; ++v) acc[v][t] = _mm512_dpbf16_ps(acc[v][t], (__m512bh)wv[v], (__m512bh)xb);
    }
  }
  KIMI_UNROLL for (int v = 0; v < NV; ++v)
    KIMI_UNROLL for (int t = 0; t < T; ++t) _mm512_storeu_ps(y + t * ldy + 16 * v, acc[v][t]);
}

template <size_t... i>
constexpr auto bf16_tiles(std::index_sequence<i...>) {
  using Fn = void (*)(const uint8_t*, uint64_t, const uint8_t* const*, int64_t, float*, int64_t);
  return std::array<Fn, sizeof...(i)>{&bf16_tile<static_cast<int>(i / kBf16T) + 1, static_cast<int>(i % kBf16T) + 1>...};
}

void run_packed_bf16(const PackedWeight& P, const uint8_t* act, size_t stride, int64_t nt, int64_t g0, int64_t g1,
                     float* y, int64_t ldy) {
  static constexpr auto tab = bf16_tiles(std::make_index_sequence<kBf16NV * kBf16T>{});
  const int64_t np = P.cols / 2;
  const uint8_t* xp[kBf16T];
  const int64_t gf = g1 < P.rows / kPackRows ? g1 : std::max(g0, P.rows / kPackRows);  // groups [g0, gf) are full
  for (int64_t g = g0; g < gf; g += kBf16NV) {
    const int nv = static_cast<int>(gf - g < kBf16NV ? gf - g : kBf16NV);
    for (int64_t t0 = 0; t0 < nt; t0 += kBf16T) {
      const int tt = static_cast<int>(nt - t0 < kBf16T ? nt - t0 : kBf16T);
      for (int j = 0; j < tt; ++j) xp[j] = act + static_cast<size_t>(t0 + j) * stride;
      tab[(nv - 1) * kBf16T + tt - 1](P.group(g), P.group_bytes, xp, np, y + t0 * ldy + g * kPackRows, ldy);
    }
  }
  if (gf == g1) return;
  // the zero-padded last group (rows 16 gf .. P.rows - 1): the same tile into a block on the stack, its
  // rows below P.rows copied out (each row sums in its own lane: the padding does not touch them)
  const int valid = static_cast<int>(P.rows - gf * kPackRows);
  alignas(64) float blk[kBf16T * kPackRows];
  for (int64_t t0 = 0; t0 < nt; t0 += kBf16T) {
    const int tt = static_cast<int>(nt - t0 < kBf16T ? nt - t0 : kBf16T);
    for (int j = 0; j < tt; ++j) xp[j] = act + static_cast<size_t>(t0 + j) * stride;
    tab[tt - 1](P.group(gf), P.group_bytes, xp, np, blk, kPackRows);
    for (int j = 0; j < tt; ++j)
      std::memcpy(y + (t0 + j) * ldy + gf * kPackRows, blk + j * kPackRows, static_cast<size_t>(valid) * sizeof(float));
  }
}

}  // namespace

bool avx512_packed_kernel(GgmlType type, PackedKernel* k) {
  switch (type) {
    // Q4_K / Q5_K: every token count, one token too (gemv): a token's row of any batch is then the bits of
    // the token alone, since a tile sums each token's blocks in the same order whatever T is
    // (Matmul.PackedKQuantRowEqualsAloneAtAnyBatch). Q5_K's GEMV read the original rows until 2026-12-06
    // (its products of 2-15 tokens had to as well, 2-4x slower). Q6_K: the GEMV reads the original rows,
    // so 2-15 tokens do too (matmul.cpp packed_usable): its packed one-token tile measured 1.6x the plain
    // GEMV's time from DRAM (bench_matmul gemv_packed/q6_K_2048x8192, 1 thread, AMD Zen 4: 1.40 vs 0.86 ms;
    // spreading its prefetches or prefetching the group's scales did not help)
    case GgmlType::Q4_K: *k = {q8_Kx_act_bytes, prep_q8_Kx_avx512, run_packed<KT::Q4>, true}; return true;
    case GgmlType::Q5_K: *k = {q8_Kx_act_bytes, prep_q8_Kx_avx512, run_packed<KT::Q5>, true}; return true;
    case GgmlType::Q6_K: *k = {q8_Kx_act_bytes, prep_q8_Kx_avx512, run_packed<KT::Q6>, false}; return true;
    case GgmlType::BF16: *k = {bf16_act_bytes, prep_bf16_avx512, run_packed_bf16, true}; return true;
    default: return false;
  }
}

}  // namespace kimi::kern

#else  // not x86-64

namespace kimi::kern {
bool avx512_packed_kernel(GgmlType, PackedKernel*) { return false; }
}  // namespace kimi::kern

#endif
