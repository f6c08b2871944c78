#if defined(__aarch64__)  // aarch64 only; ops_simd_tables.cpp takes these into kNeonOps
// ARM NEON (ARMv8-A AdvSIMD, every aarch64 CPU) versions of the vector primitives of ops_simd.h:
// dots, axpy, f16 rows, the fast activations (the AVX-512 file's polynomials on 4 lanes), the
// attention block scores / accumulation, the DSA indexer scan and the fused KDA step.
#include <arm_neon.h>

#include <cmath>
#include <cstdint>

#include "backend/cpu/ops_simd.h"
#include "tensor/types.h"

namespace kimi::kern::neon {

namespace {

inline float32x4_t load4(const float* p) { return vld1q_f32(p); }
inline float32x4_t load4(const uint16_t* p) { return vcvt_f32_f16(vreinterpret_f16_u16(vld1_u16(p))); }
inline float one(const float* p) { return *p; }
inline float one(const uint16_t* p) { return kimi::f16_to_f32(*p); }

template <class B>
inline float dot(const float* a, const B* b, int64_t n) {
  float32x4_t s0 = vdupq_n_f32(0), s1 = vdupq_n_f32(0), s2 = vdupq_n_f32(0), s3 = vdupq_n_f32(0);
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    s0 = vfmaq_f32(s0, vld1q_f32(a + i), load4(b + i));
    s1 = vfmaq_f32(s1, vld1q_f32(a + i + 4), load4(b + i + 4));
    s2 = vfmaq_f32(s2, vld1q_f32(a + i + 8), load4(b + i + 8));
    s3 = vfmaq_f32(s3, vld1q_f32(a + i + 12), load4(b + i + 12));
  }
  for (; i + 4 <= n; i += 4) s0 = vfmaq_f32(s0, vld1q_f32(a + i), load4(b + i));
  float r = vaddvq_f32(vaddq_f32(vaddq_f32(s0, s1), vaddq_f32(s2, s3)));
  for (; i < n; ++i) r += a[i] * one(b + i);
  return r;
}

template <class X>
inline void axpy(float a, const X* x, float* y, int64_t n) {
  const float32x4_t va = vdupq_n_f32(a);
  int64_t i = 0;
  for (; i + 4 <= n; i += 4) vst1q_f32(y + i, vfmaq_f32(vld1q_f32(y + i), va, load4(x + i)));
  for (; i < n; ++i) y[i] += a * one(x + i);
}

// exp(x) = 2^n e^r as in ops_avx512.cpp (n = round(x log2 e), two-step r, degree-7 Taylor
// polynomial); 2^n applied as two factors 2^(n/2) 2^(n - n/2) so that overflow gives inf and
// underflow 0 / subnormals like a scaling instruction. NaN propagates.
inline float32x4_t exp4(float32x4_t x) {
  x = vmaxq_f32(vdupq_n_f32(-104.0f), vminq_f32(vdupq_n_f32(89.0f), x));
  const float32x4_t n = vrndnq_f32(vmulq_f32(x, vdupq_n_f32(1.44269504088896341f)));
  float32x4_t r = vfmsq_f32(x, n, vdupq_n_f32(0.693145751953125f));
  r = vfmsq_f32(r, n, vdupq_n_f32(1.42860682030941723212e-6f));
  float32x4_t p = vdupq_n_f32(1.0f / 5040.0f);
  p = vfmaq_f32(vdupq_n_f32(1.0f / 720.0f), p, r);
  p = vfmaq_f32(vdupq_n_f32(1.0f / 120.0f), p, r);
  p = vfmaq_f32(vdupq_n_f32(1.0f / 24.0f), p, r);
  p = vfmaq_f32(vdupq_n_f32(1.0f / 6.0f), p, r);
  p = vfmaq_f32(vdupq_n_f32(0.5f), p, r);
  p = vfmaq_f32(vdupq_n_f32(1.0f), p, r);
  p = vfmaq_f32(vdupq_n_f32(1.0f), p, r);
  const int32x4_t ni = vcvtq_s32_f32(n);
  const int32x4_t n1 = vshrq_n_s32(ni, 1), n2 = vsubq_s32(ni, n1);
  const float32x4_t f1 = vreinterpretq_f32_s32(vshlq_n_s32(vaddq_s32(n1, vdupq_n_s32(127)), 23));
  const float32x4_t f2 = vreinterpretq_f32_s32(vshlq_n_s32(vaddq_s32(n2, vdupq_n_s32(127)), 23));
  return vmulq_f32(vmulq_f32(p, f1), f2);
}
inline float32x4_t sigmoid4(float32x4_t x) {
  const float32x4_t o = vdupq_n_f32(1.0f);
  return vdivq_f32(o, vaddq_f32(o, exp4(vnegq_f32(x))));
}
// tanh as in ops_avx512.cpp: odd Taylor polynomial for |x| < 0.4, else sign(x) (1 - 2 / (e^{2|x|} + 1))
inline float32x4_t tanh4(float32x4_t x) {
  const float32x4_t ax = vabsq_f32(x), x2 = vmulq_f32(x, x);
  float32x4_t p = vdupq_n_f32(21844.0f / 6081075.0f);
  p = vfmaq_f32(vdupq_n_f32(-1382.0f / 155925.0f), p, x2);
  p = vfmaq_f32(vdupq_n_f32(62.0f / 2835.0f), p, x2);
  p = vfmaq_f32(vdupq_n_f32(-17.0f / 315.0f), p, x2);
  p = vfmaq_f32(vdupq_n_f32(2.0f / 15.0f), p, x2);
  p = vfmaq_f32(vdupq_n_f32(-1.0f / 3.0f), p, x2);
  const float32x4_t small = vfmaq_f32(x, vmulq_f32(p, x2), x);
  const float32x4_t e = exp4(vaddq_f32(ax, ax));
  const float32x4_t big_abs = vsubq_f32(vdupq_n_f32(1.0f), vdivq_f32(vdupq_n_f32(2.0f), vaddq_f32(e, vdupq_n_f32(1.0f))));
  const uint32x4_t sign = vandq_u32(vreinterpretq_u32_f32(x), vdupq_n_u32(0x80000000u));
  const float32x4_t big = vreinterpretq_f32_u32(vorrq_u32(vreinterpretq_u32_f32(big_abs), sign));
  return vbslq_f32(vcltq_f32(ax, vdupq_n_f32(0.4f)), small, big);
}

// f on every 4 lanes; the last n % 4 elements through a zero-padded temporary
template <class F>
inline void map1(const float* x, float* y, int64_t n, F f) {
  int64_t i = 0;
  for (; i + 4 <= n; i += 4) vst1q_f32(y + i, f(vld1q_f32(x + i)));
  if (i < n) {
    float t[4] = {0, 0, 0, 0};
    for (int64_t j = i; j < n; ++j) t[j - i] = x[j];
    vst1q_f32(t, f(vld1q_f32(t)));
    for (int64_t j = i; j < n; ++j) y[j] = t[j - i];
  }
}
template <class F>
inline void map2(const float* a, const float* b, float* y, int64_t n, F f) {
  int64_t i = 0;
  for (; i + 4 <= n; i += 4) vst1q_f32(y + i, f(vld1q_f32(a + i), vld1q_f32(b + i)));
  if (i < n) {
    float ta[4] = {0, 0, 0, 0}, tb[4] = {0, 0, 0, 0};
    for (int64_t j = i; j < n; ++j) {
      ta[j - i] = a[j];
      tb[j - i] = b[j];
    }
    vst1q_f32(ta, f(vld1q_f32(ta), vld1q_f32(tb)));
    for (int64_t j = i; j < n; ++j) y[j] = ta[j - i];
  }
}

}  // namespace

float dot_f32(const float* a, const float* b, int64_t n) { return dot(a, b, n); }
float dot_f16(const float* a, const uint16_t* b, int64_t n) { return dot(a, b, n); }
void axpy_f32(float a, const float* x, float* y, int64_t n) { axpy(a, x, y, n); }
void axpy_f16(float a, const uint16_t* x, float* y, int64_t n) { axpy(a, x, y, n); }

double sum_sq(const float* x, int64_t n) {
  float64x2_t a0 = vdupq_n_f64(0), a1 = vdupq_n_f64(0);
  int64_t i = 0;
  for (; i + 4 <= n; i += 4) {
    const float32x4_t v = vld1q_f32(x + i);
    const float64x2_t lo = vcvt_f64_f32(vget_low_f32(v)), hi = vcvt_high_f64_f32(v);
    a0 = vfmaq_f64(a0, lo, lo);
    a1 = vfmaq_f64(a1, hi, hi);
  }
  double ss = vaddvq_f64(vaddq_f64(a0, a1));
  for (; i < n; ++i) ss += static_cast<double>(x[i]) * x[i];
  return ss;
}

void f16_to_f32_row(const uint16_t* x, float* y, int64_t n) {
  int64_t i = 0;
  for (; i + 4 <= n; i += 4) vst1q_f32(y + i, load4(x + i));
  for (; i < n; ++i) y[i] = kimi::f16_to_f32(x[i]);
}

void f32_to_f16_row(const float* x, uint16_t* y, int64_t n) {
  int64_t i = 0;  // FCVTN rounds to nearest even, as f32_to_f16
  for (; i + 4 <= n; i += 4) vst1_u16(y + i, vreinterpret_u16_f16(vcvt_f16_f32(vld1q_f32(x + i))));
  for (; i < n; ++i) y[i] = kimi::f32_to_f16(x[i]);
}

void exp_row(const float* x, float* y, int64_t n) {
  map1(x, y, n, [](float32x4_t v) { return exp4(v); });
}
void sigmoid_inplace(float* x, int64_t n) {
  map1(x, x, n, [](float32x4_t v) { return sigmoid4(v); });
}
void silu(const float* x, float* y, int64_t n) {
  map1(x, y, n, [](float32x4_t v) { return vdivq_f32(v, vaddq_f32(vdupq_n_f32(1.0f), exp4(vnegq_f32(v)))); });
}
void mul_sigmoid(float* x, const float* gate, int64_t n) {
  map2(x, gate, x, n, [](float32x4_t v, float32x4_t g) {
    return vdivq_f32(v, vaddq_f32(vdupq_n_f32(1.0f), exp4(vnegq_f32(g))));
  });
}
void situ(const float* g, const float* u, float* out, int64_t n, float beta, float lambda) {
  const float32x4_t vb = vdupq_n_f32(beta), vib = vdupq_n_f32(1.0f / beta);
  if (lambda > 0) {
    const float32x4_t vl = vdupq_n_f32(lambda), vil = vdupq_n_f32(1.0f / lambda);
    map2(g, u, out, n, [=](float32x4_t gv, float32x4_t uv) {
      const float32x4_t a = vmulq_f32(vmulq_f32(vb, tanh4(vmulq_f32(gv, vib))), sigmoid4(gv));
      return vmulq_f32(a, vmulq_f32(vl, tanh4(vmulq_f32(uv, vil))));
    });
  } else {
    map2(g, u, out, n, [=](float32x4_t gv, float32x4_t uv) {
      return vmulq_f32(vmulq_f32(vmulq_f32(vb, tanh4(vmulq_f32(gv, vib))), sigmoid4(gv)), uv);
    });
  }
}

// ---- attention (D, W, r multiples of 16 as for AVX-512) ----
void indexer_scores(const float* q, const float* w, int64_t H, const void* keys, bool f16, int64_t D, int64_t n,
                    float* scores) {
  float kf[256];  // one key row as f32 (D <= 256)
  for (int64_t s = 0; s < n; ++s) {
    const float* k;
    if (f16) {
      f16_to_f32_row(static_cast<const uint16_t*>(keys) + s * D, kf, D);
      k = kf;
    } else {
      k = static_cast<const float*>(keys) + s * D;
    }
    float acc = 0.0f;
    for (int64_t h = 0; h < H; ++h) {
      const float dq = dot(q + h * D, k, D);
      if (dq > 0.0f) acc += w[h] * dq;
    }
    scores[s] = acc;
  }
}

void block_scores(const float* q, const float* const* rows, int64_t nb, int64_t W, float* out) {
  for (int64_t j = 0; j < nb; ++j) out[j] = dot(q, rows[j], W);
}

void attn_accumulate(float* z, int64_t nh, int64_t r, const float* const* rows, int64_t nb, const float* p,
                     int64_t p_stride) {
  for (int64_t h = 0; h < nh; ++h) {
    float* zh = z + h * r;
    for (int64_t c = 0; c < r; c += 16) {  // 16 outputs in registers across the block's rows
      float32x4_t a0 = vld1q_f32(zh + c), a1 = vld1q_f32(zh + c + 4), a2 = vld1q_f32(zh + c + 8),
                  a3 = vld1q_f32(zh + c + 12);
      for (int64_t j = 0; j < nb; ++j) {
        const float32x4_t pj = vdupq_n_f32(p[h * p_stride + j]);
        const float* rj = rows[j] + c;
        a0 = vfmaq_f32(a0, pj, vld1q_f32(rj));
        a1 = vfmaq_f32(a1, pj, vld1q_f32(rj + 4));
        a2 = vfmaq_f32(a2, pj, vld1q_f32(rj + 8));
        a3 = vfmaq_f32(a3, pj, vld1q_f32(rj + 12));
      }
      vst1q_f32(zh + c, a0);
      vst1q_f32(zh + c + 4, a1);
      vst1q_f32(zh + c + 8, a2);
      vst1q_f32(zh + c + 12, a3);
    }
  }
}

// ---- KDA: the fused step of kda_avx512.cpp (pass 1 reads the state: p = sum_i k_i e_i S_i; pass 2
// writes it once: S_i = e_i S_i + k_i d, o += q_i S_i); D multiple of 16 ----
void kda_step(float* S, const float* q, const float* k, const float* v, const float* g, bool g_is_decay, float beta,
              float scale, float* o, int64_t D, float* p) {
  for (int64_t j = 0; j < D; ++j) p[j] = 0.0f;
  for (int64_t i = 0; i < D; ++i) {
    const float* Si = S + i * D;
    const float ei = g_is_decay ? g[i] : std::exp(g[i]);
    const float32x4_t ke = vdupq_n_f32(k[i] * ei);
    for (int64_t j = 0; j < D; j += 4) vst1q_f32(p + j, vfmaq_f32(vld1q_f32(p + j), ke, vld1q_f32(Si + j)));
  }
  const float32x4_t b = vdupq_n_f32(beta);
  for (int64_t j = 0; j < D; j += 4) {
    vst1q_f32(p + j, vmulq_f32(b, vsubq_f32(vld1q_f32(v + j), vld1q_f32(p + j))));
    vst1q_f32(o + j, vdupq_n_f32(0.0f));
  }
  for (int64_t i = 0; i < D; ++i) {
    float* Si = S + i * D;
    const float32x4_t e = vdupq_n_f32(g_is_decay ? g[i] : std::exp(g[i]));
    const float32x4_t ki = vdupq_n_f32(k[i]), qi = vdupq_n_f32(q[i]);
    for (int64_t j = 0; j < D; j += 4) {
      const float32x4_t s = vfmaq_f32(vmulq_f32(ki, vld1q_f32(p + j)), e, vld1q_f32(Si + j));
      vst1q_f32(Si + j, s);
      vst1q_f32(o + j, vfmaq_f32(vld1q_f32(o + j), qi, s));
    }
  }
  const float32x4_t sc = vdupq_n_f32(scale);
  for (int64_t j = 0; j < D; j += 4) vst1q_f32(o + j, vmulq_f32(sc, vld1q_f32(o + j)));
}

}  // namespace kimi::kern::neon
#endif  // __aarch64__
