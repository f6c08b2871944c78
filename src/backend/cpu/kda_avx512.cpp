#if defined(__x86_64__)  // x86 only; ops_simd_tables.cpp takes these into kAvx512
// AVX-512 fused KDA step; D multiple of 16. Pass 1 only reads the state (p = sum_i k_i e_i S_i,
// i.e. k against the decayed state), pass 2 writes it once: S_i = e_i S_i + k_i d, o += q_i S_i.
// For D = 64 and 128 the p / d / o vectors live in registers across the D state rows.
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <immintrin.h>

#include <cmath>
#include <cstdint>

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

}  // namespace kimi::kern::avx512
#endif  // __x86_64__
