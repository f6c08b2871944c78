#include "kernels/cpu/attention.h"

#include <cmath>

#include "kernels/cpu/ops.h"

namespace kimi::kern {

static inline const float* row_f32(const LatentRows& rows, int64_t s, float* buf) {
  if (rows.f16) {
    f16_to_f32_row(static_cast<const uint16_t*>(rows.data) + s * rows.W, buf, rows.W);
    return buf;
  }
  return static_cast<const float*>(rows.data) + s * rows.W;
}

void mla_attend_sparse(const float* q, int64_t nh, const LatentRows& rows, const int32_t* idx, int64_t n_sel,
                       float scale, float* z, float* row_buf) {
  const int64_t W = rows.W, r = rows.r;
  // per head running max m and denominator l live in z's scratch? keep them on the stack in chunks
  constexpr int64_t kMaxHeads = 256;
  float m[kMaxHeads], l[kMaxHeads];
  for (int64_t h0 = 0; h0 < nh; h0 += kMaxHeads) {
    const int64_t nhc = nh - h0 < kMaxHeads ? nh - h0 : kMaxHeads;
    for (int64_t h = 0; h < nhc; ++h) {
      m[h] = -INFINITY;
      l[h] = 0.0f;
      float* zh = z + (h0 + h) * r;
      for (int64_t j = 0; j < r; ++j) zh[j] = 0.0f;
    }
    for (int64_t t = 0; t < n_sel; ++t) {
      const int64_t s = idx ? idx[t] : t;
      const float* row = row_f32(rows, s, row_buf);
      for (int64_t h = 0; h < nhc; ++h) {
        const float e = dot_f32(q + (h0 + h) * W, row, W) * scale;
        float* zh = z + (h0 + h) * r;
        if (e > m[h]) {
          const float c = std::exp(m[h] - e);  // exp(-inf) = 0 on the first row
          if (l[h] != 0.0f) scale_f32(c, zh, r);
          l[h] *= c;
          m[h] = e;
        }
        const float p = std::exp(e - m[h]);
        l[h] += p;
        axpy_f32(p, row, zh, r);
      }
    }
    for (int64_t h = 0; h < nhc; ++h) {
      const float inv = l[h] > 0.0f ? 1.0f / l[h] : 0.0f;
      scale_f32(inv, z + (h0 + h) * r, r);
    }
  }
}

void mla_attend_dense(const float* q, int64_t nh, const LatentRows& rows, int64_t n, const uint8_t* sel,
                      float scale, float* z, float* scores, float* row_buf) {
  const int64_t W = rows.W, r = rows.r;
  // pass 1: scores for every row (-inf where not selected)
  for (int64_t s = 0; s < n; ++s) {
    if (sel && !sel[s]) {
      for (int64_t h = 0; h < nh; ++h) scores[h * n + s] = -INFINITY;
      continue;
    }
    const float* row = row_f32(rows, s, row_buf);
    for (int64_t h = 0; h < nh; ++h) scores[h * n + s] = dot_f32(q + h * W, row, W) * scale;
  }
  // softmax per head
  for (int64_t h = 0; h < nh; ++h) {
    float* sc = scores + h * n;
    float mx = -INFINITY;
    for (int64_t s = 0; s < n; ++s) mx = sc[s] > mx ? sc[s] : mx;
    float sum = 0.0f;
    for (int64_t s = 0; s < n; ++s) {
      const float p = sc[s] == -INFINITY ? 0.0f : std::exp(sc[s] - mx);
      sc[s] = p;
      sum += p;
    }
    const float inv = sum > 0.0f ? 1.0f / sum : 0.0f;
    for (int64_t s = 0; s < n; ++s) sc[s] *= inv;
    float* zh = z + h * r;
    for (int64_t j = 0; j < r; ++j) zh[j] = 0.0f;
  }
  // pass 2: weighted sum of the latent part over all rows (zero weights contribute nothing)
  for (int64_t s = 0; s < n; ++s) {
    if (sel && !sel[s]) continue;
    const float* row = row_f32(rows, s, row_buf);
    for (int64_t h = 0; h < nh; ++h) {
      const float p = scores[h * n + s];
      if (p != 0.0f) axpy_f32(p, row, z + h * r, r);
    }
  }
}

}  // namespace kimi::kern
