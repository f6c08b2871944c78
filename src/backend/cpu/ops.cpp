#include "backend/cpu/ops.h"

#include <cmath>

#include "backend/cpu/dispatch.h"
#include "backend/cpu/ops_simd.h"
#include "tensor/types.h"

namespace kimi::kern {

// The SIMD versions (AVX-512, NEON) run when the one dispatch (dispatch.h) puts this family at a
// level that has them.
static inline const SimdOps* simd() { return simd_ops(KernelFamily::Ops); }
bool ops_use_avx512() { return family_isa(KernelFamily::Ops) == Isa::Avx512; }

double sum_sq(const float* x, int64_t n) {
  if (const SimdOps* s = simd()) return s->sum_sq(x, n);
  double ss = 0;
  for (int64_t i = 0; i < n; ++i) ss += static_cast<double>(x[i]) * x[i];
  return ss;
}

void rms_norm(const float* x, const float* w, float* y, int64_t n, float eps) {
  const double ss = sum_sq(x, n);
  const float scale = 1.0f / std::sqrt(static_cast<float>(ss / static_cast<double>(n)) + eps);
  if (w) {
    for (int64_t i = 0; i < n; ++i) y[i] = x[i] * scale * w[i];
  } else {
    for (int64_t i = 0; i < n; ++i) y[i] = x[i] * scale;
  }
}

void l2_norm(const float* x, float* y, int64_t n, float eps) {
  const double ss = sum_sq(x, n);
  const float scale = 1.0f / std::sqrt(static_cast<float>(ss) + eps);
  for (int64_t i = 0; i < n; ++i) y[i] = x[i] * scale;
}

void layer_norm(const float* x, const float* w, const float* b, float* y, int64_t n, float eps) {
  double mean = 0;
  for (int64_t i = 0; i < n; ++i) mean += x[i];
  mean /= static_cast<double>(n);
  double var = 0;
  for (int64_t i = 0; i < n; ++i) {
    const double d = x[i] - mean;
    var += d * d;
  }
  var /= static_cast<double>(n);
  const float scale = 1.0f / std::sqrt(static_cast<float>(var) + eps);
  const float m = static_cast<float>(mean);
  for (int64_t i = 0; i < n; ++i) {
    float v = (x[i] - m) * scale;
    if (w) v *= w[i];
    if (b) v += b[i];
    y[i] = v;
  }
}

void sigmoid_inplace(float* x, int64_t n) {
  for (int64_t i = 0; i < n; ++i) x[i] = 1.0f / (1.0f + std::exp(-x[i]));
}

void silu_inplace(float* x, int64_t n) {
  for (int64_t i = 0; i < n; ++i) x[i] = x[i] / (1.0f + std::exp(-x[i]));
}

void situ(const float* g, const float* u, float* out, int64_t n, float beta, float lambda) {
  const float ib = 1.0f / beta;
  if (lambda > 0) {
    const float il = 1.0f / lambda;
    for (int64_t i = 0; i < n; ++i) {
      const float gv = g[i];
      const float a = beta * std::tanh(gv * ib) / (1.0f + std::exp(-gv));
      out[i] = a * (lambda * std::tanh(u[i] * il));
    }
  } else {
    for (int64_t i = 0; i < n; ++i) {
      const float gv = g[i];
      out[i] = beta * std::tanh(gv * ib) / (1.0f + std::exp(-gv)) * u[i];
    }
  }
}

void mul_sigmoid(float* x, const float* gate, int64_t n) {
  for (int64_t i = 0; i < n; ++i) x[i] *= 1.0f / (1.0f + std::exp(-gate[i]));
}

void sigmoid_inplace_fast(float* x, int64_t n) {
  if (const SimdOps* s = simd()) return s->sigmoid_inplace(x, n);
  sigmoid_inplace(x, n);
}

void silu_fast(const float* x, float* y, int64_t n) {
  if (const SimdOps* s = simd()) return s->silu(x, y, n);
  for (int64_t i = 0; i < n; ++i) y[i] = x[i] / (1.0f + std::exp(-x[i]));
}

void situ_fast(const float* g, const float* u, float* out, int64_t n, float beta, float lambda) {
  if (const SimdOps* s = simd()) return s->situ(g, u, out, n, beta, lambda);
  situ(g, u, out, n, beta, lambda);
}

void mul_sigmoid_fast(float* x, const float* gate, int64_t n) {
  if (const SimdOps* s = simd()) return s->mul_sigmoid(x, gate, n);
  mul_sigmoid(x, gate, n);
}

void exp_fast(const float* x, float* y, int64_t n) {
  if (const SimdOps* s = simd()) return s->exp_row(x, y, n);
  for (int64_t i = 0; i < n; ++i) y[i] = std::exp(x[i]);
}

float dot_f32(const float* a, const float* b, int64_t n) {
  if (const SimdOps* s = simd()) return s->dot_f32(a, b, n);
  float s[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  int64_t i = 0;
  for (; i + 8 <= n; i += 8)
    for (int k = 0; k < 8; ++k) s[k] += a[i + k] * b[i + k];
  float r = 0;
  for (; i < n; ++i) r += a[i] * b[i];
  return r + ((s[0] + s[1]) + (s[2] + s[3])) + ((s[4] + s[5]) + (s[6] + s[7]));
}

float dot_f16(const float* a, const uint16_t* b, int64_t n) {
  if (const SimdOps* s = simd()) return s->dot_f16(a, b, n);
  float s[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  int64_t i = 0;
  for (; i + 8 <= n; i += 8)
    for (int k = 0; k < 8; ++k) s[k] += a[i + k] * f16_to_f32(b[i + k]);
  float r = 0;
  for (; i < n; ++i) r += a[i] * f16_to_f32(b[i]);
  return r + ((s[0] + s[1]) + (s[2] + s[3])) + ((s[4] + s[5]) + (s[6] + s[7]));
}

void axpy_f32(float a, const float* x, float* y, int64_t n) {
  if (const SimdOps* s = simd()) return s->axpy_f32(a, x, y, n);
  for (int64_t i = 0; i < n; ++i) y[i] += a * x[i];
}

void axpy_f16(float a, const uint16_t* x, float* y, int64_t n) {
  if (const SimdOps* s = simd()) return s->axpy_f16(a, x, y, n);
  for (int64_t i = 0; i < n; ++i) y[i] += a * f16_to_f32(x[i]);
}

void scale_f32(float a, float* y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] *= a;
}

void f16_to_f32_row(const uint16_t* x, float* y, int64_t n) {
  if (const SimdOps* s = simd()) return s->f16_to_f32_row(x, y, n);
  for (int64_t i = 0; i < n; ++i) y[i] = f16_to_f32(x[i]);
}

void f32_to_f16_row(const float* x, uint16_t* y, int64_t n) {
  if (const SimdOps* s = simd()) return s->f32_to_f16_row(x, y, n);
  for (int64_t i = 0; i < n; ++i) y[i] = f32_to_f16(x[i]);
}

}  // namespace kimi::kern
