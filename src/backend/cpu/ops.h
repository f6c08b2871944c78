// Elementwise ops, norms, activations and small vector primitives used by the forward pass.
// All f32 in / f32 out. Vector primitives (dot, axpy, f16 rows) and the fast activations have
// AVX-512 versions, used when the one kernel dispatch (dispatch.h: KernelFamily::Ops) is at avx512;
// KIMI_ISA=avx2|scalar or set_isa() below avx512 selects the portable path.
#pragma once
#include <cstdint>

namespace kimi::kern {

// y = x / sqrt(mean(x^2) + eps) * w   (w may be nullptr = no weight; y may alias x)
void rms_norm(const float* x, const float* w, float* y, int64_t n, float eps);
// y = x / sqrt(sum(x^2) + eps)        (the KDA q/k "l2 norm"; y may alias x)
void l2_norm(const float* x, float* y, int64_t n, float eps);
// y = (x - mean) / sqrt(var + eps) * w + b   (population variance; y may alias x)
void layer_norm(const float* x, const float* w, const float* b, float* y, int64_t n, float eps);

inline float sigmoid(float x) { return 1.0f / (1.0f + __builtin_expf(-x)); }
void sigmoid_inplace(float* x, int64_t n);
void silu_inplace(float* x, int64_t n);
// out = [beta*tanh(g/beta)*sigmoid(g)] * [lambda*tanh(u/lambda)]  (lambda <= 0: * u). out may alias g.
void situ(const float* g, const float* u, float* out, int64_t n, float beta, float lambda);
// x *= sigmoid(gate) elementwise
void mul_sigmoid(float* x, const float* gate, int64_t n);

// Fast variants (used in Precision::Fast): AVX-512 polynomial exp (about 1-2 ulp), sigmoid and
// tanh built on it (tanh: odd polynomial for |x| < 0.4, else 1 - 2/(e^2|x| + 1)); max relative
// error ~1e-6. Without AVX-512 they are the exact libm versions above.
void sigmoid_inplace_fast(float* x, int64_t n);
void silu_fast(const float* x, float* y, int64_t n);  // y may alias x
void situ_fast(const float* g, const float* u, float* out, int64_t n, float beta, float lambda);
void mul_sigmoid_fast(float* x, const float* gate, int64_t n);
void exp_fast(const float* x, float* y, int64_t n);   // y may alias x

// vector primitives
double sum_sq(const float* x, int64_t n);  // sum of x^2 accumulated in double (the norms' convention)
float dot_f32(const float* a, const float* b, int64_t n);
float dot_f16(const float* a, const uint16_t* b, int64_t n);  // b: IEEE half
void axpy_f32(float a, const float* x, float* y, int64_t n);   // y += a*x
void axpy_f16(float a, const uint16_t* x, float* y, int64_t n);
void scale_f32(float a, float* y, int64_t n);                  // y *= a
void f16_to_f32_row(const uint16_t* x, float* y, int64_t n);
void f32_to_f16_row(const float* x, uint16_t* y, int64_t n);

// true when the AVX-512 versions are in use (family_isa(KernelFamily::Ops) == Isa::Avx512)
bool ops_use_avx512();

}  // namespace kimi::kern
