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

}  // namespace kimi::kern
