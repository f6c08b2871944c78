// Portable scalar matmul kernels: the reference the SIMD levels are tested against, and the
// fallback on CPUs without AVX2 (and on ARM).
#include <cmath>
#include <cstring>
#include <vector>

#include "backend/cpu/dispatch.h"
#include "tensor/quants.h"

namespace kimi::kern {

namespace {


// f32 dot with 8 partial sums (less rounding error, vectorizable)
float dot_f32(const float* a, const float* b, int64_t n) {
  float s[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  int64_t i = 0;
  for (; i + 8 <= n; i += 8)
    for (int j = 0; j < 8; ++j) s[j] += a[i + j] * b[i + j];
  for (; i < n; ++i) s[i & 7] += a[i] * b[i];
  return ((s[0] + s[1]) + (s[2] + s[3])) + ((s[4] + s[5]) + (s[6] + s[7]));
}

// ---- Precision::F32 (and F32 weights): decode each row to f32, dot with the f32 activations ----
void run_f32(const MatView& W, const uint8_t* act, size_t stride, int64_t nt, int64_t r0, int64_t r1, float* y,
             int64_t ldy) {
  float* w = W.type == GgmlType::F32 ? nullptr : f32_scratch(W.cols, 1);
  for (int64_t r = r0; r < r1; ++r) {
    const uint8_t* src = W.data + static_cast<uint64_t>(r) * W.row_bytes;
    const float* wr;
    if (W.type == GgmlType::F32) {
      wr = reinterpret_cast<const float*>(src);
    } else {
      kimi::dequantize_row(W.type, src, w, W.cols);
      wr = w;
    }
    for (int64_t t = 0; t < nt; ++t)
      y[t * ldy + r] = dot_f32(wr, reinterpret_cast<const float*>(act + t * stride), W.cols);
  }
}

// ---- F16 weights, Fast: activation rounded to f16 (stored as f32 values) ----
size_t f16_act_bytes(int64_t cols) { return static_cast<size_t>(cols) * sizeof(float); }
void f16_prep(const float* x, int64_t cols, uint8_t* out) {
  float* o = reinterpret_cast<float*>(out);
  for (int64_t i = 0; i < cols; ++i) o[i] = f16_to_f32(f32_to_f16(x[i]));
}

// ---- BF16 weights, Fast: activation rounded to bf16; exact bf16 x bf16 products summed in f32 ----
size_t bf16_act_bytes(int64_t cols) { return static_cast<size_t>(cols) * sizeof(uint16_t); }
void bf16_prep(const float* x, int64_t cols, uint8_t* out) {
  uint16_t* o = reinterpret_cast<uint16_t*>(out);
  for (int64_t i = 0; i < cols; ++i) o[i] = f32_to_bf16(x[i]);
}
void run_bf16(const MatView& W, const uint8_t* act, size_t stride, int64_t nt, int64_t r0, int64_t r1, float* y,
              int64_t ldy) {
  for (int64_t r = r0; r < r1; ++r) {
    const uint16_t* w = reinterpret_cast<const uint16_t*>(W.data + static_cast<uint64_t>(r) * W.row_bytes);
    for (int64_t t = 0; t < nt; ++t) {
      const uint16_t* a = reinterpret_cast<const uint16_t*>(act + t * stride);
      float s[8] = {0, 0, 0, 0, 0, 0, 0, 0};
      for (int64_t i = 0; i < W.cols; ++i) s[i & 7] += bf16_to_f32(w[i]) * bf16_to_f32(a[i]);
      y[t * ldy + r] = ((s[0] + s[1]) + (s[2] + s[3])) + ((s[4] + s[5]) + (s[6] + s[7]));
    }
  }
}

// ---- Q8_0 activations (for Q8_0, Q4_0, MXFP4 weights) ----
size_t q8_0_act_bytes(int64_t cols) { return static_cast<size_t>(cols / QK8_0) * sizeof(block_q8_0); }
void q8_0_prep(const float* x, int64_t cols, uint8_t* out) {
  quantize_row_q8_0(x, reinterpret_cast<block_q8_0*>(out), cols);
}

template <typename Block, typename DotFn>
void run_q8_0_act(const MatView& W, const uint8_t* act, size_t stride, int64_t nt, int64_t r0, int64_t r1, float* y,
                  int64_t ldy, DotFn block_dot) {
  const int64_t nb = W.cols / 32;
  for (int64_t r = r0; r < r1; ++r) {
    const Block* w = reinterpret_cast<const Block*>(W.data + static_cast<uint64_t>(r) * W.row_bytes);
    for (int64_t t = 0; t < nt; ++t) {
      const block_q8_0* a = reinterpret_cast<const block_q8_0*>(act + t * stride);
      float sum = 0.0f;
      for (int64_t b = 0; b < nb; ++b) sum += block_dot(w[b], a[b]);
      y[t * ldy + r] = sum;
    }
  }
}

void run_q8_0(const MatView& W, const uint8_t* act, size_t stride, int64_t nt, int64_t r0, int64_t r1, float* y,
              int64_t ldy) {
  run_q8_0_act<block_q8_0>(W, act, stride, nt, r0, r1, y, ldy, [](const block_q8_0& w, const block_q8_0& a) {
    int s = 0;
    for (int j = 0; j < 32; ++j) s += w.qs[j] * a.qs[j];
    return static_cast<float>(s) * (f16_to_f32(w.d) * f16_to_f32(a.d));
  });
}

void run_q4_0(const MatView& W, const uint8_t* act, size_t stride, int64_t nt, int64_t r0, int64_t r1, float* y,
              int64_t ldy) {
  run_q8_0_act<block_q4_0>(W, act, stride, nt, r0, r1, y, ldy, [](const block_q4_0& w, const block_q8_0& a) {
    int s = 0;
    for (int j = 0; j < 16; ++j)
      s += ((w.qs[j] & 0xF) - 8) * a.qs[j] + ((w.qs[j] >> 4) - 8) * a.qs[j + 16];
    return static_cast<float>(s) * (f16_to_f32(w.d) * f16_to_f32(a.d));
  });
}

inline uint32_t load_qh(const uint8_t* p) {
  return static_cast<uint32_t>(p[0]) | (static_cast<uint32_t>(p[1]) << 8) | (static_cast<uint32_t>(p[2]) << 16) |
         (static_cast<uint32_t>(p[3]) << 24);
}

// Integer dot of a Q5 block's raw levels (0..31) with the activation q; *sum_a gets sum(a.qs).
inline int dot_q5_levels(const uint8_t* qs, const uint8_t* qh_bytes, const int8_t* a, int* sum_a) {
  const uint32_t qh = load_qh(qh_bytes);
  int s = 0, sa = 0;
  for (int j = 0; j < 16; ++j) {
    const int q0 = (qs[j] & 0xF) | static_cast<int>(((qh >> j) & 1) << 4);
    const int q1 = (qs[j] >> 4) | static_cast<int>(((qh >> (j + 16)) & 1) << 4);
    s += q0 * a[j] + q1 * a[j + 16];
    sa += a[j] + a[j + 16];
  }
  *sum_a = sa;
  return s;
}

// Q5_0: sum((q - 16) a) = sum(q a) - 16 sum(a), exact in int
void run_q5_0(const MatView& W, const uint8_t* act, size_t stride, int64_t nt, int64_t r0, int64_t r1, float* y,
              int64_t ldy) {
  run_q8_0_act<block_q5_0>(W, act, stride, nt, r0, r1, y, ldy, [](const block_q5_0& w, const block_q8_0& a) {
    int sa = 0;
    const int s = dot_q5_levels(w.qs, w.qh, a.qs, &sa) - 16 * sa;
    return static_cast<float>(s) * (f16_to_f32(w.d) * f16_to_f32(a.d));
  });
}

// Q5_1 with Q8_1-style activations: sum((q d + m) a da) = d da sum(q a) + m s with s = da sum(a). The
// activation blocks are the Q8_0 blocks; s is formed here exactly in f32 (f16 da x |sum| < 2^13).
void run_q5_1(const MatView& W, const uint8_t* act, size_t stride, int64_t nt, int64_t r0, int64_t r1, float* y,
              int64_t ldy) {
  run_q8_0_act<block_q5_1>(W, act, stride, nt, r0, r1, y, ldy, [](const block_q5_1& w, const block_q8_0& a) {
    int sa = 0;
    const int s = dot_q5_levels(w.qs, w.qh, a.qs, &sa);
    const float da = f16_to_f32(a.d);
    return static_cast<float>(s) * (f16_to_f32(w.d) * da) + f16_to_f32(w.m) * (da * static_cast<float>(sa));
  });
}

void run_mxfp4(const MatView& W, const uint8_t* act, size_t stride, int64_t nt, int64_t r0, int64_t r1, float* y,
               int64_t ldy) {
  run_q8_0_act<block_mxfp4>(W, act, stride, nt, r0, r1, y, ldy, [](const block_mxfp4& w, const block_q8_0& a) {
    int s = 0;
    for (int j = 0; j < 16; ++j)
      s += kvalues_mxfp4[w.qs[j] & 0xF] * a.qs[j] + kvalues_mxfp4[w.qs[j] >> 4] * a.qs[j + 16];
    return static_cast<float>(s) * (e8m0_to_f32_half(w.e) * f16_to_f32(a.d));
  });
}

// ---- Q8_K activations (K-quants) ----
size_t q8_K_act_bytes(int64_t cols) { return static_cast<size_t>(cols / QK_K) * sizeof(block_q8_K); }
void q8_K_prep(const float* x, int64_t cols, uint8_t* out) {
  quantize_row_q8_K(x, reinterpret_cast<block_q8_K*>(out), cols);
}

float dot_q4_K(const block_q4_K& w, const block_q8_K& a) {
  int sumi = 0, summ = 0;
  for (int j = 0; j < 8; ++j) {
    uint8_t sc, m;
    get_scale_min_k4(j, w.scales, &sc, &m);
    const uint8_t* q = w.qs + 32 * (j / 2);
    const int8_t* x = a.qs + 32 * j;
    int s = 0;
    for (int l = 0; l < 32; ++l) s += ((j & 1) ? (q[l] >> 4) : (q[l] & 0xF)) * x[l];
    sumi += sc * s;
    summ += m * (a.bsums[2 * j] + a.bsums[2 * j + 1]);
  }
  return a.d * (f16_to_f32(w.d) * static_cast<float>(sumi) - f16_to_f32(w.dmin) * static_cast<float>(summ));
}

float dot_q5_K(const block_q5_K& w, const block_q8_K& a) {
  int sumi = 0, summ = 0;
  for (int j = 0; j < 8; ++j) {
    uint8_t sc, m;
    get_scale_min_k4(j, w.scales, &sc, &m);
    const uint8_t* q = w.qs + 32 * (j / 2);
    const int8_t* x = a.qs + 32 * j;
    int s = 0;
    for (int l = 0; l < 32; ++l) {
      const int lo = (j & 1) ? (q[l] >> 4) : (q[l] & 0xF);
      const int hi = (w.qh[l] >> j) & 1;
      s += (lo | (hi << 4)) * x[l];
    }
    sumi += sc * s;
    summ += m * (a.bsums[2 * j] + a.bsums[2 * j + 1]);
  }
  return a.d * (f16_to_f32(w.d) * static_cast<float>(sumi) - f16_to_f32(w.dmin) * static_cast<float>(summ));
}

float dot_q6_K(const block_q6_K& w, const block_q8_K& a) {
  int sumi = 0;
  for (int g = 0; g < 16; ++g) {  // 16 groups of 16 elements
    int s = 0;
    for (int i = 0; i < 16; ++i) {
      const int e = 16 * g + i;
      const int h = e / 128, k = (e % 128) / 32, l = e % 32;
      const uint8_t* ql = w.ql + 64 * h;
      const uint8_t* qh = w.qh + 32 * h;
      const int low = (k & 1) ? ((k & 2) ? ql[32 + l] >> 4 : ql[32 + l] & 0xF) : ((k & 2) ? ql[l] >> 4 : ql[l] & 0xF);
      const int hi2 = (qh[l] >> (2 * k)) & 3;
      s += ((low | (hi2 << 4)) - 32) * a.qs[e];
    }
    sumi += w.scales[g] * s;
  }
  return a.d * f16_to_f32(w.d) * static_cast<float>(sumi);
}

template <typename Block, float (*Dot)(const Block&, const block_q8_K&)>
void run_k(const MatView& W, const uint8_t* act, size_t stride, int64_t nt, int64_t r0, int64_t r1, float* y,
           int64_t ldy) {
  const int64_t nb = W.cols / QK_K;
  for (int64_t r = r0; r < r1; ++r) {
    const Block* w = reinterpret_cast<const Block*>(W.data + static_cast<uint64_t>(r) * W.row_bytes);
    for (int64_t t = 0; t < nt; ++t) {
      const block_q8_K* a = reinterpret_cast<const block_q8_K*>(act + t * stride);
      float sum = 0.0f;
      for (int64_t b = 0; b < nb; ++b) sum += Dot(w[b], a[b]);
      y[t * ldy + r] = sum;
    }
  }
}

}  // namespace

bool scalar_kernel(GgmlType type, Precision prec, MatKernel* k) {
  *k = MatKernel{};
  if (prec == Precision::F32 || type == GgmlType::F32) {
    switch (type) {
      case GgmlType::F32: case GgmlType::F16: case GgmlType::BF16: case GgmlType::Q8_0: case GgmlType::Q4_0:
      case GgmlType::Q5_0: case GgmlType::Q5_1: case GgmlType::MXFP4: case GgmlType::Q4_K: case GgmlType::Q5_K:
      case GgmlType::Q6_K:
        k->run = run_f32;
        k->scratch_rows = type == GgmlType::F32 ? 0 : 1;
        return true;
      default:
        return false;
    }
  }
  switch (type) {
    case GgmlType::F16: *k = {f16_act_bytes, f16_prep, run_f32, 1}; return true;
    case GgmlType::BF16: *k = {bf16_act_bytes, bf16_prep, run_bf16}; return true;
    case GgmlType::Q8_0: *k = {q8_0_act_bytes, q8_0_prep, run_q8_0}; return true;
    case GgmlType::Q4_0: *k = {q8_0_act_bytes, q8_0_prep, run_q4_0}; return true;
    case GgmlType::Q5_0: *k = {q8_0_act_bytes, q8_0_prep, run_q5_0}; return true;
    case GgmlType::Q5_1: *k = {q8_0_act_bytes, q8_0_prep, run_q5_1}; return true;
    case GgmlType::MXFP4: *k = {q8_0_act_bytes, q8_0_prep, run_mxfp4}; return true;
    case GgmlType::Q4_K: *k = {q8_K_act_bytes, q8_K_prep, run_k<block_q4_K, dot_q4_K>}; return true;
    case GgmlType::Q5_K: *k = {q8_K_act_bytes, q8_K_prep, run_k<block_q5_K, dot_q5_K>}; return true;
    case GgmlType::Q6_K: *k = {q8_K_act_bytes, q8_K_prep, run_k<block_q6_K, dot_q6_K>}; return true;
    default: return false;
  }
}

}  // namespace kimi::kern
