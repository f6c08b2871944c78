#if defined(__x86_64__)  // x86 only; ops_simd_tables.cpp takes these into kAvx512
// AVX-512 fused KDA step; D multiple of 16. Pass 1 only reads the state (p = sum_i k_i e_i S_i,
// i.e. k against the decayed state), pass 2 writes it once: S_i = e_i S_i + k_i d, o += q_i S_i.
// For D = 64 and 128 the p / d / o vectors live in registers across the D state rows.
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <immintrin.h>

#include <cmath>
#include <cstdint>

#include "backend/cpu/kda.h"

namespace kimi::kern::avx512 {

namespace {

template <int NC>  // D = 16 * NC
void step_fixed(float* S, const float* q, const float* k, const float* v, const float* g, bool g_is_decay, float beta,
                float scale, float* o) {
  constexpr int64_t D = 16 * NC;
  __m512 p[NC], ov[NC];
#pragma GCC unroll 8
  for (int c = 0; c < NC; ++c) p[c] = _mm512_setzero_ps();
  for (int64_t i = 0; i < D; ++i) {
    const float* Si = S + i * D;
    const float ei = g_is_decay ? g[i] : std::exp(g[i]);
    const __m512 ke = _mm512_set1_ps(k[i] * ei);
#pragma GCC unroll 8
    for (int c = 0; c < NC; ++c) p[c] = _mm512_fmadd_ps(ke, _mm512_loadu_ps(Si + 16 * c), p[c]);
  }
  const __m512 b = _mm512_set1_ps(beta);
#pragma GCC unroll 8
  for (int c = 0; c < NC; ++c) {
    p[c] = _mm512_mul_ps(b, _mm512_sub_ps(_mm512_loadu_ps(v + 16 * c), p[c]));  // d
    ov[c] = _mm512_setzero_ps();
  }
  for (int64_t i = 0; i < D; ++i) {
    float* Si = S + i * D;
    const __m512 e = _mm512_set1_ps(g_is_decay ? g[i] : std::exp(g[i]));
    const __m512 ki = _mm512_set1_ps(k[i]);
    const __m512 qi = _mm512_set1_ps(q[i]);
#pragma GCC unroll 8
    for (int c = 0; c < NC; ++c) {
      const __m512 s = _mm512_fmadd_ps(e, _mm512_loadu_ps(Si + 16 * c), _mm512_mul_ps(ki, p[c]));
      _mm512_storeu_ps(Si + 16 * c, s);
      ov[c] = _mm512_fmadd_ps(qi, s, ov[c]);
    }
  }
  const __m512 sc = _mm512_set1_ps(scale);
#pragma GCC unroll 8
  for (int c = 0; c < NC; ++c) _mm512_storeu_ps(o + 16 * c, _mm512_mul_ps(sc, ov[c]));
}

}  // namespace

void kda_step(float* S, const float* q, const float* k, const float* v, const float* g, bool g_is_decay, float beta,
              float scale, float* o, int64_t D, float* p) {
  if (D == 128) return step_fixed<8>(S, q, k, v, g, g_is_decay, beta, scale, o);
  if (D == 64) return step_fixed<4>(S, q, k, v, g, g_is_decay, beta, scale, o);
  for (int64_t j = 0; j < D; j += 16) _mm512_storeu_ps(p + j, _mm512_setzero_ps());
  for (int64_t i = 0; i < D; ++i) {
    const float* Si = S + i * D;
    const float ei = g_is_decay ? g[i] : std::exp(g[i]);
    const __m512 ke = _mm512_set1_ps(k[i] * ei);
    for (int64_t j = 0; j < D; j += 16)
      _mm512_storeu_ps(p + j, _mm512_fmadd_ps(ke, _mm512_loadu_ps(Si + j), _mm512_loadu_ps(p + j)));
  }
  const __m512 b = _mm512_set1_ps(beta);
  for (int64_t j = 0; j < D; j += 16) {
    _mm512_storeu_ps(p + j, _mm512_mul_ps(b, _mm512_sub_ps(_mm512_loadu_ps(v + j), _mm512_loadu_ps(p + j))));
    _mm512_storeu_ps(o + j, _mm512_setzero_ps());
  }
  for (int64_t i = 0; i < D; ++i) {
    float* Si = S + i * D;
    const __m512 e = _mm512_set1_ps(g_is_decay ? g[i] : std::exp(g[i]));
    const __m512 ki = _mm512_set1_ps(k[i]);
    const __m512 qi = _mm512_set1_ps(q[i]);
    for (int64_t j = 0; j < D; j += 16) {
      const __m512 s = _mm512_fmadd_ps(e, _mm512_loadu_ps(Si + j), _mm512_mul_ps(ki, _mm512_loadu_ps(p + j)));
      _mm512_storeu_ps(Si + j, s);
      _mm512_storeu_ps(o + j, _mm512_fmadd_ps(qi, s, _mm512_loadu_ps(o + j)));
    }
  }
  const __m512 sc = _mm512_set1_ps(scale);
  for (int64_t j = 0; j < D; j += 16) _mm512_storeu_ps(o + j, _mm512_mul_ps(sc, _mm512_loadu_ps(o + j)));
}

// The chunked form (kda.h kda_chunk), padded to 16 tokens (the padding rows have k = q = 0 and
// beta = 0, so their deltas are 0 and change nothing). The 16 rows of a 16-column block live in
// 16 registers (one per token): S0^T (b_r q_r) and S0^T (b_r k_r) are each one pass over the
// block's column of the state, the deltas are solved in registers, and the state update is a
// third pass that reads and writes the column once.
bool kda_chunk(float* S, const float* q, const float* k, const float* v, const float* g, bool g_is_decay,
               const float* beta, int64_t ld, int64_t ldb, int64_t L, float scale, float* o, int64_t D, float* work) {
  constexpr int64_t R = 16;
  float* Kb = work;         // R x D: b_r k_r
  float* Qb = Kb + R * D;   // R x D: b_r q_r
  float* KiT = Qb + R * D;  // D x R: k_s / b_s, transposed; then (b_{L-1} / b_s) k_s
  float* Wt = KiT + R * D;  // R x D: S0^T (b_r q_r), one column block at a time
  float* bl = Wt + R * D;   // D: b_{L-1}
  float* A = bl + D;        // R x R
  float* B = A + R * R;     // R x R
  const __m512i tidx = _mm512_mullo_epi32(_mm512_set1_epi32(static_cast<int>(R)),
                                          _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15));
  // 1. cumulative decay, scaled rows, the decay test (before anything is written)
  for (int64_t c = 0; c < D; c += 16) {
    __m512 b = _mm512_set1_ps(1.0f);
    for (int64_t r = 0; r < R; ++r) {
      __m512 kb = _mm512_setzero_ps(), qb = kb, ki = kb;
      if (r < L) {
        __m512 a;
        if (g_is_decay) {
          a = _mm512_loadu_ps(g + r * ld + c);
        } else {
          alignas(64) float t[16];
          for (int j = 0; j < 16; ++j) t[j] = std::exp(g[r * ld + c + j]);
          a = _mm512_load_ps(t);
        }
        b = _mm512_mul_ps(b, a);
        const __m512 kk = _mm512_loadu_ps(k + r * ld + c);
        kb = _mm512_mul_ps(kk, b);
        qb = _mm512_mul_ps(_mm512_loadu_ps(q + r * ld + c), b);
        ki = _mm512_div_ps(kk, b);
      }
      _mm512_storeu_ps(Kb + r * D + c, kb);
      _mm512_storeu_ps(Qb + r * D + c, qb);
      _mm512_i32scatter_ps(KiT + c * R + r, tidx, ki, 4);
    }
    // b >= min decay in every lane (false for NaN)
    if (_mm512_cmp_ps_mask(b, _mm512_set1_ps(kKdaMinDecay), _CMP_GE_OQ) != 0xFFFF) return false;
    _mm512_storeu_ps(bl + c, b);
  }
  // 2. A = Kb KiT (strictly lower), B = Qb KiT (lower with the diagonal): row r is one vector over s
  for (int which = 0; which < 2; ++which) {
    const float* X = which == 0 ? Kb : Qb;
    __m512 acc[R];
#pragma GCC unroll 16
    for (int r = 0; r < R; ++r) acc[r] = _mm512_setzero_ps();
    for (int64_t i = 0; i < D; ++i) {
      const __m512 kt = _mm512_loadu_ps(KiT + i * R);
#pragma GCC unroll 16
      for (int r = 0; r < R; ++r) acc[r] = _mm512_fmadd_ps(_mm512_set1_ps(X[r * D + i]), kt, acc[r]);
    }
    float* M = which == 0 ? A : B;
#pragma GCC unroll 16
    for (int r = 0; r < R; ++r) {
      const __mmask16 keep = static_cast<__mmask16>(which == 0 ? (1u << r) - 1u : (2u << r) - 1u);
      _mm512_storeu_ps(M + r * R, _mm512_maskz_mov_ps(keep, acc[r]));
    }
  }
  // KiT -> (b_{L-1} / b_s) k_s
  for (int64_t i = 0; i < D; ++i)
    _mm512_storeu_ps(KiT + i * R, _mm512_mul_ps(_mm512_set1_ps(bl[i]), _mm512_loadu_ps(KiT + i * R)));
  float bt[R];
  for (int64_t r = 0; r < R; ++r) bt[r] = r < L ? beta[r * ldb] : 0.0f;
  const __m512 sc = _mm512_set1_ps(scale);
  // 3. per 16-column block of the state
  for (int64_t c = 0; c < D; c += 16) {
    __m512 d[R];
    // S0^T (b_r q_r) for this block, kept in Wt
#pragma GCC unroll 16
    for (int r = 0; r < R; ++r) d[r] = _mm512_setzero_ps();
    for (int64_t i = 0; i < D; ++i) {
      const __m512 s0 = _mm512_loadu_ps(S + i * D + c);
#pragma GCC unroll 16
      for (int r = 0; r < R; ++r) d[r] = _mm512_fmadd_ps(_mm512_set1_ps(Qb[r * D + i]), s0, d[r]);
    }
#pragma GCC unroll 16
    for (int r = 0; r < R; ++r) _mm512_storeu_ps(Wt + r * D + c, d[r]);
    // S0^T (b_r k_r), then the deltas by forward substitution
#pragma GCC unroll 16
    for (int r = 0; r < R; ++r) d[r] = _mm512_setzero_ps();
    for (int64_t i = 0; i < D; ++i) {
      const __m512 s0 = _mm512_loadu_ps(S + i * D + c);
#pragma GCC unroll 16
      for (int r = 0; r < R; ++r) d[r] = _mm512_fmadd_ps(_mm512_set1_ps(Kb[r * D + i]), s0, d[r]);
    }
#pragma GCC unroll 16
    for (int r = 0; r < R; ++r) {
      __m512 x = _mm512_sub_ps(r < L ? _mm512_loadu_ps(v + r * ld + c) : _mm512_setzero_ps(), d[r]);
#pragma GCC unroll 16
      for (int s2 = 0; s2 < r; ++s2) x = _mm512_fnmadd_ps(_mm512_set1_ps(A[r * R + s2]), d[s2], x);
      d[r] = _mm512_mul_ps(_mm512_set1_ps(bt[r]), x);
    }
    // outputs
#pragma GCC unroll 16
    for (int r = 0; r < R; ++r) {
      if (r >= L) break;
      __m512 x = _mm512_loadu_ps(Wt + r * D + c);
#pragma GCC unroll 16
      for (int s2 = 0; s2 <= r; ++s2) x = _mm512_fmadd_ps(_mm512_set1_ps(B[r * R + s2]), d[s2], x);
      _mm512_storeu_ps(o + r * ld + c, _mm512_mul_ps(sc, x));
    }
    // state update of the block: S[i] = b_{L-1}[i] S0[i] + sum_s KiT[i][s] d_s
    for (int64_t i = 0; i < D; ++i) {
      float* Si = S + i * D + c;
      __m512 x = _mm512_mul_ps(_mm512_set1_ps(bl[i]), _mm512_loadu_ps(Si));
#pragma GCC unroll 16
      for (int s2 = 0; s2 < R; ++s2) x = _mm512_fmadd_ps(_mm512_set1_ps(KiT[i * R + s2]), d[s2], x);
      _mm512_storeu_ps(Si, x);
    }
  }
  return true;
}

}  // namespace kimi::kern::avx512
#endif  // __x86_64__
