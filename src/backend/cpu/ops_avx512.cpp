#if defined(__x86_64__)  // x86 only; ops_simd_tables.cpp takes these into kAvx512
// AVX-512 vector primitives (compiled with -mavx512f etc.; entered only after a CPU check).
// gcc 12 reports false "uninitialized" warnings inside its own AVX-512 reduce/convert intrinsics
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <immintrin.h>

#include "backend/cpu/ops_simd.h"
#include "tensor/types.h"

namespace kimi::kern::avx512 {

double sum_sq(const float* x, int64_t n) {
  __m512d a0 = _mm512_setzero_pd(), a1 = _mm512_setzero_pd();
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    const __m512d lo = _mm512_cvtps_pd(_mm256_loadu_ps(x + i)), hi = _mm512_cvtps_pd(_mm256_loadu_ps(x + i + 8));
    a0 = _mm512_fmadd_pd(lo, lo, a0);
    a1 = _mm512_fmadd_pd(hi, hi, a1);
  }
  double ss = _mm512_reduce_add_pd(_mm512_add_pd(a0, a1));
  for (; i < n; ++i) ss += static_cast<double>(x[i]) * x[i];
  return ss;
}

static inline __m512 load_h(const uint16_t* p) {
  return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
}

// 16 lanes of an f32 or f16 row as f32 (load), the first n < 16 of them with the rest 0 (load_m)
static inline __m512 load(const float* p) { return _mm512_loadu_ps(p); }
static inline __m512 load(const uint16_t* p) { return load_h(p); }
static inline __m512 load_m(const float* p, __mmask16 m) { return _mm512_maskz_loadu_ps(m, p); }
static inline __m512 load_m(const uint16_t* p, __mmask16 m) { return _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(m, p)); }
static inline __mmask16 first(int64_t n) { return static_cast<__mmask16>((1u << n) - 1); }

// sum a[i] * b[i]: two accumulators over 32-element steps, then a 16-element step, then the masked tail
template <class B>
static inline float dot(const float* a, const B* b, int64_t n) {
  __m512 s0 = _mm512_setzero_ps(), s1 = _mm512_setzero_ps();
  int64_t i = 0;
  for (; i + 32 <= n; i += 32) {
    s0 = _mm512_fmadd_ps(_mm512_loadu_ps(a + i), load(b + i), s0);
    s1 = _mm512_fmadd_ps(_mm512_loadu_ps(a + i + 16), load(b + i + 16), s1);
  }
  for (; i + 16 <= n; i += 16) s0 = _mm512_fmadd_ps(_mm512_loadu_ps(a + i), load(b + i), s0);
  if (i < n) {
    const __mmask16 m = first(n - i);
    s1 = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(m, a + i), load_m(b + i, m), s1);
  }
  return _mm512_reduce_add_ps(_mm512_add_ps(s0, s1));
}

// y += a * x
template <class X>
static inline void axpy(float a, const X* x, float* y, int64_t n) {
  const __m512 va = _mm512_set1_ps(a);
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) _mm512_storeu_ps(y + i, _mm512_fmadd_ps(va, load(x + i), _mm512_loadu_ps(y + i)));
  if (i < n) {
    const __mmask16 m = first(n - i);
    _mm512_mask_storeu_ps(y + i, m, _mm512_fmadd_ps(va, load_m(x + i, m), _mm512_maskz_loadu_ps(m, y + i)));
  }
}

float dot_f32(const float* a, const float* b, int64_t n) { return dot(a, b, n); }
float dot_f16(const float* a, const uint16_t* b, int64_t n) { return dot(a, b, n); }
void axpy_f32(float a, const float* x, float* y, int64_t n) { axpy(a, x, y, n); }
void axpy_f16(float a, const uint16_t* x, float* y, int64_t n) { axpy(a, x, y, n); }

void f16_to_f32_row(const uint16_t* x, float* y, int64_t n) {
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) _mm512_storeu_ps(y + i, load_h(x + i));
  for (; i < n; ++i) y[i] = f16_to_f32(x[i]);
}

void f32_to_f16_row(const float* x, uint16_t* y, int64_t n) {
  int64_t i = 0;
  for (; i + 16 <= n; i += 16)
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(y + i),
                        _mm512_cvtps_ph(_mm512_loadu_ps(x + i), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
  for (; i < n; ++i) y[i] = f32_to_f16(x[i]);
}

// ---- fast transcendental functions ----
// exp(x) = 2^n e^r, n = round(x log2 e), r = x - n ln2 (two-step), e^r by its degree-7 Taylor
// polynomial (truncation < 1e-8 relative on |r| <= ln2/2), 2^n applied by vscalefps (exact
// overflow to inf / underflow to 0). NaN propagates.
static inline __m512 exp16(__m512 x) {
  x = _mm512_max_ps(_mm512_set1_ps(-104.0f), _mm512_min_ps(_mm512_set1_ps(89.0f), x));
  const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
                                        _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693145751953125f), x);
  r = _mm512_fnmadd_ps(n, _mm512_set1_ps(1.42860682030941723212e-6f), r);
  __m512 p = _mm512_set1_ps(1.0f / 5040.0f);
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 720.0f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 120.0f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 24.0f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 6.0f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(0.5f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
  return _mm512_scalef_ps(p, n);
}

// 1 / (1 + e^-x)
static inline __m512 sigmoid16(__m512 x) {
  const __m512 one = _mm512_set1_ps(1.0f);
  return _mm512_div_ps(one, _mm512_add_ps(one, exp16(_mm512_sub_ps(_mm512_setzero_ps(), x))));
}

// tanh: odd Taylor polynomial to x^13 for |x| < 0.4 (truncation < 1e-9 relative), else
// sign(x) (1 - 2 / (e^{2|x|} + 1))
static inline __m512 tanh16(__m512 x) {
  const __m512 ax = _mm512_abs_ps(x);
  const __m512 x2 = _mm512_mul_ps(x, x);
  __m512 p = _mm512_set1_ps(21844.0f / 6081075.0f);
  p = _mm512_fmadd_ps(p, x2, _mm512_set1_ps(-1382.0f / 155925.0f));
  p = _mm512_fmadd_ps(p, x2, _mm512_set1_ps(62.0f / 2835.0f));
  p = _mm512_fmadd_ps(p, x2, _mm512_set1_ps(-17.0f / 315.0f));
  p = _mm512_fmadd_ps(p, x2, _mm512_set1_ps(2.0f / 15.0f));
  p = _mm512_fmadd_ps(p, x2, _mm512_set1_ps(-1.0f / 3.0f));
  const __m512 small = _mm512_fmadd_ps(_mm512_mul_ps(p, x2), x, x);
  const __m512 e = exp16(_mm512_add_ps(ax, ax));
  const __m512 big_abs = _mm512_sub_ps(_mm512_set1_ps(1.0f),
                                       _mm512_div_ps(_mm512_set1_ps(2.0f), _mm512_add_ps(e, _mm512_set1_ps(1.0f))));
  // copy the sign of x onto big_abs
  const __m512 sign = _mm512_and_ps(x, _mm512_castsi512_ps(_mm512_set1_epi32(static_cast<int>(0x80000000u))));
  const __m512 big = _mm512_or_ps(big_abs, sign);
  const __mmask16 is_small = _mm512_cmp_ps_mask(ax, _mm512_set1_ps(0.4f), _CMP_LT_OQ);
  return _mm512_mask_blend_ps(is_small, big, small);
}

template <class F>
static inline void map1(const float* x, float* y, int64_t n, F f) {
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) _mm512_storeu_ps(y + i, f(_mm512_loadu_ps(x + i)));
  if (i < n) {
    const __mmask16 m = static_cast<__mmask16>((1u << (n - i)) - 1);
    _mm512_mask_storeu_ps(y + i, m, f(_mm512_maskz_loadu_ps(m, x + i)));
  }
}

template <class F>
static inline void map2(const float* a, const float* b, float* y, int64_t n, F f) {
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) _mm512_storeu_ps(y + i, f(_mm512_loadu_ps(a + i), _mm512_loadu_ps(b + i)));
  if (i < n) {
    const __mmask16 m = static_cast<__mmask16>((1u << (n - i)) - 1);
    _mm512_mask_storeu_ps(y + i, m, f(_mm512_maskz_loadu_ps(m, a + i), _mm512_maskz_loadu_ps(m, b + i)));
  }
}

void exp_row(const float* x, float* y, int64_t n) {
  map1(x, y, n, [](__m512 v) { return exp16(v); });
}

void sigmoid_inplace(float* x, int64_t n) {
  map1(x, x, n, [](__m512 v) { return sigmoid16(v); });
}

void silu(const float* x, float* y, int64_t n) {
  const __m512 one = _mm512_set1_ps(1.0f);
  map1(x, y, n, [one](__m512 v) {
    return _mm512_div_ps(v, _mm512_add_ps(one, exp16(_mm512_sub_ps(_mm512_setzero_ps(), v))));
  });
}

void mul_sigmoid(float* x, const float* gate, int64_t n) {
  const __m512 one = _mm512_set1_ps(1.0f);
  map2(x, gate, x, n, [one](__m512 v, __m512 g) {
    return _mm512_div_ps(v, _mm512_add_ps(one, exp16(_mm512_sub_ps(_mm512_setzero_ps(), g))));
  });
}

void situ(const float* g, const float* u, float* out, int64_t n, float beta, float lambda) {
  const __m512 vb = _mm512_set1_ps(beta), vib = _mm512_set1_ps(1.0f / beta);
  if (lambda > 0) {
    const __m512 vl = _mm512_set1_ps(lambda), vil = _mm512_set1_ps(1.0f / lambda);
    map2(g, u, out, n, [=](__m512 gv, __m512 uv) {
      const __m512 a = _mm512_mul_ps(_mm512_mul_ps(vb, tanh16(_mm512_mul_ps(gv, vib))), sigmoid16(gv));
      return _mm512_mul_ps(a, _mm512_mul_ps(vl, tanh16(_mm512_mul_ps(uv, vil))));
    });
  } else {
    map2(g, u, out, n, [=](__m512 gv, __m512 uv) {
      const __m512 a = _mm512_mul_ps(_mm512_mul_ps(vb, tanh16(_mm512_mul_ps(gv, vib))), sigmoid16(gv));
      return _mm512_mul_ps(a, uv);
    });
  }
}

}  // namespace kimi::kern::avx512
#endif  // __x86_64__
