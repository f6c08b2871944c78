#include "backend/cpu/kda.h"

#include <cmath>

#include "backend/cpu/dispatch.h"
#include "backend/cpu/ops.h"
#include "backend/cpu/ops_simd.h"

namespace kimi::kern {

static inline const SimdOps* simd() { return simd_ops(KernelFamily::Kda); }

// The portable step; kDecayed: g holds exp(g) already.
template <bool kDecayed>
static void step_portable(float* S, const float* q, const float* k, const float* v, const float* g, float beta,
                          float scale, float* o, int64_t D, float* tmp) {
  float* p = tmp;
  for (int64_t j = 0; j < D; ++j) p[j] = 0.0f;
  // decay, then predict with the decayed state
  for (int64_t i = 0; i < D; ++i) {
    float* Si = S + i * D;
    scale_f32(kDecayed ? g[i] : std::exp(g[i]), Si, D);
    axpy_f32(k[i], Si, p, D);
  }
  for (int64_t j = 0; j < D; ++j) p[j] = beta * (v[j] - p[j]);  // delta
  for (int64_t j = 0; j < D; ++j) o[j] = 0.0f;
  // update, then read out with the updated state
  for (int64_t i = 0; i < D; ++i) {
    float* Si = S + i * D;
    axpy_f32(k[i], p, Si, D);
    axpy_f32(q[i], Si, o, D);
  }
  for (int64_t j = 0; j < D; ++j) o[j] *= scale;
}

void kda_step(float* S, const float* q, const float* k, const float* v, const float* g, float beta,
              float scale, float* o, int64_t D, float* tmp) {
  if (const SimdOps* s = simd(); s && D % 16 == 0) return s->kda_step(S, q, k, v, g, false, beta, scale, o, D, tmp);
  step_portable<false>(S, q, k, v, g, beta, scale, o, D, tmp);
}

void kda_step_decay(float* S, const float* q, const float* k, const float* v, const float* a, float beta,
                    float scale, float* o, int64_t D, float* tmp) {
  if (const SimdOps* s = simd(); s && D % 16 == 0) return s->kda_step(S, q, k, v, a, true, beta, scale, o, D, tmp);
  step_portable<true>(S, q, k, v, a, beta, scale, o, D, tmp);
}

int64_t kda_chunk_work_floats(int64_t D) { return 5 * kKdaChunk * D + D + 2 * kKdaChunk * kKdaChunk; }

// The portable chunk: the formulas of kda.h written out, matrices row-major.
static bool chunk_portable(float* S, const float* q, const float* k, const float* v, const float* g, bool g_is_decay,
                           const float* beta, int64_t ld, int64_t ldb, int64_t L, float scale, float* o, int64_t D,
                           float* work) {
  float* b = work;        // L x D cumulative decay
  float* bi = b + L * D;  // L x D its inverse
  float* U = bi + L * D;  // L x D: S0^T (b_r k_r), then the deltas
  float* W = U + L * D;   // L x D: S0^T (b_r q_r)
  float* A = W + L * D;   // L x L
  float* B = A + L * L;   // L x L
  for (int64_t r = 0; r < L; ++r)
    for (int64_t i = 0; i < D; ++i) {
      const float a = g_is_decay ? g[r * ld + i] : std::exp(g[r * ld + i]);
      b[r * D + i] = (r > 0 ? b[(r - 1) * D + i] : 1.0f) * a;
    }
  const float* bl = b + (L - 1) * D;
  for (int64_t i = 0; i < D; ++i)
    if (!(bl[i] >= kKdaMinDecay)) return false;  // NaN fails too
  for (int64_t j = 0; j < L * D; ++j) bi[j] = 1.0f / b[j];
  for (int64_t r = 0; r < L; ++r)
    for (int64_t s = 0; s <= r; ++s) {
      float ak = 0.0f, aq = 0.0f;
      for (int64_t i = 0; i < D; ++i) {
        const float ks = k[s * ld + i] * bi[s * D + i];
        ak += k[r * ld + i] * b[r * D + i] * ks;
        aq += q[r * ld + i] * b[r * D + i] * ks;
      }
      A[r * L + s] = s < r ? ak : 0.0f;
      B[r * L + s] = aq;
    }
  for (int64_t r = 0; r < L; ++r) {
    float* u = U + r * D;
    float* w = W + r * D;
    for (int64_t j = 0; j < D; ++j) u[j] = w[j] = 0.0f;
    for (int64_t i = 0; i < D; ++i) {
      axpy_f32(k[r * ld + i] * b[r * D + i], S + i * D, u, D);
      axpy_f32(q[r * ld + i] * b[r * D + i], S + i * D, w, D);
    }
  }
  for (int64_t r = 0; r < L; ++r) {  // forward substitution: U row r becomes d_r
    float* d = U + r * D;
    for (int64_t j = 0; j < D; ++j) d[j] = v[r * ld + j] - d[j];
    for (int64_t s = 0; s < r; ++s) axpy_f32(-A[r * L + s], U + s * D, d, D);
    for (int64_t j = 0; j < D; ++j) d[j] *= beta[r * ldb];
  }
  for (int64_t r = 0; r < L; ++r) {
    float* w = W + r * D;
    for (int64_t s = 0; s <= r; ++s) axpy_f32(B[r * L + s], U + s * D, w, D);
    for (int64_t j = 0; j < D; ++j) o[r * ld + j] = scale * w[j];
  }
  for (int64_t i = 0; i < D; ++i) {
    float* Si = S + i * D;
    scale_f32(bl[i], Si, D);
    for (int64_t s = 0; s < L; ++s) axpy_f32(k[s * ld + i] * bi[s * D + i] * bl[i], U + s * D, Si, D);
  }
  return true;
}

bool kda_chunk(float* S, const float* q, const float* k, const float* v, const float* g, bool g_is_decay,
               const float* beta, int64_t ld, int64_t ldb, int64_t L, float scale, float* o, int64_t D, float* work) {
  if (L <= 0) return true;
  if (L > kKdaChunk) return false;
  if (const SimdOps* s = simd(); s && s->kda_chunk && D % 16 == 0)
    return s->kda_chunk(S, q, k, v, g, g_is_decay, beta, ld, ldb, L, scale, o, D, work);
  return chunk_portable(S, q, k, v, g, g_is_decay, beta, ld, ldb, L, scale, o, D, work);
}

}  // namespace kimi::kern
