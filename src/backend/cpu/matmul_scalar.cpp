// Portable scalar matmul kernels: the reference the SIMD levels are tested against, and the
// fallback on CPUs without AVX2 (and on ARM).
#include <cmath>
#include <cstring>
#include <vector>

#include "backend/cpu/dispatch.h"
#include "backend/cpu/matmul_lowbit.h"
#include "backend/cpu/quantize_act.h"
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

// F16 weights, Fast: the activation rounded to f16 (prep_f16r, stored as f32 values), then run_f32.

// ---- BF16 weights, Fast: activation rounded to bf16 (prep_bf16); exact bf16 x bf16 products summed in f32 ----
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

// ---- K-quants x Q8_K activations (quantize_act.h: prep_q8_K) ----

// Q4_K / Q5_K (Q5_K: a fifth bit per element from qh, bit j for sub-block j)
template <typename Block, bool kQ5>
float dot_q45_K(const Block& w, const block_q8_K& a) {
  int sumi = 0, summ = 0;
  for (int j = 0; j < 8; ++j) {
    uint8_t sc, m;
    get_scale_min_k4(j, w.scales, &sc, &m);
    const uint8_t* q = w.qs + 32 * (j / 2);
    const int8_t* x = a.qs + 32 * j;
    int s = 0;
    for (int l = 0; l < 32; ++l) {
      const int lo = (j & 1) ? (q[l] >> 4) : (q[l] & 0xF);
      int hi = 0;
      if constexpr (kQ5) hi = (w.qh[l] >> j) & 1;
      s += (lo | (hi << 4)) * x[l];
    }
    sumi += sc * s;
    summ += m * (a.bsums[2 * j] + a.bsums[2 * j + 1]);
  }
  return a.d * (f16_to_f32(w.d) * static_cast<float>(sumi) - f16_to_f32(w.dmin) * static_cast<float>(summ));
}
float dot_q4_K(const block_q4_K& w, const block_q8_K& a) { return dot_q45_K<block_q4_K, false>(w, a); }
float dot_q5_K(const block_q5_K& w, const block_q8_K& a) { return dot_q45_K<block_q5_K, true>(w, a); }

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

// Every type at Precision::F32 (and F32 weights at both): rows decoded to f32, then dotted.
const KernelRow kScalarKernels[] = {
    {GgmlType::F32, true, {nullptr, nullptr, run_f32, 0}},
    {GgmlType::F16, true, {nullptr, nullptr, run_f32, 1}},
    {GgmlType::BF16, true, {nullptr, nullptr, run_f32, 1}},
    {GgmlType::Q8_0, true, {nullptr, nullptr, run_f32, 1}},
    {GgmlType::Q4_0, true, {nullptr, nullptr, run_f32, 1}},
    {GgmlType::Q5_0, true, {nullptr, nullptr, run_f32, 1}},
    {GgmlType::Q5_1, true, {nullptr, nullptr, run_f32, 1}},
    {GgmlType::MXFP4, true, {nullptr, nullptr, run_f32, 1}},
    {GgmlType::Q4_K, true, {nullptr, nullptr, run_f32, 1}},
    {GgmlType::Q5_K, true, {nullptr, nullptr, run_f32, 1}},
    {GgmlType::Q6_K, true, {nullptr, nullptr, run_f32, 1}},
    {GgmlType::F16, false, {f16r_act_bytes, prep_f16r, run_f32, 1}},
    {GgmlType::BF16, false, {bf16_act_bytes, prep_bf16, run_bf16}},
    {GgmlType::Q8_0, false, {q8_0_act_bytes, q8_0_prep, run_q8_0}},
    {GgmlType::Q4_0, false, {q8_0_act_bytes, q8_0_prep, run_q4_0}},
    {GgmlType::Q5_0, false, {q8_0_act_bytes, q8_0_prep, run_q5_0}},
    {GgmlType::Q5_1, false, {q8_0_act_bytes, q8_0_prep, run_q5_1}},
    {GgmlType::MXFP4, false, {q8_0_act_bytes, q8_0_prep, run_mxfp4}},
    {GgmlType::Q4_K, false, {q8_K_act_bytes, prep_q8_K, run_k<block_q4_K, dot_q4_K>}},
    {GgmlType::Q5_K, false, {q8_K_act_bytes, prep_q8_K, run_k<block_q5_K, dot_q5_K>}},
    {GgmlType::Q6_K, false, {q8_K_act_bytes, prep_q8_K, run_k<block_q6_K, dot_q6_K>}},
};

}  // namespace

bool scalar_kernel(GgmlType type, Precision prec, MatKernel* k) {
  return select_kernel(kScalarKernels, sizeof(kScalarKernels) / sizeof(kScalarKernels[0]), type, prec, k) ||
         scalar_lowbit_kernel(type, prec, k);  // Q2_K, Q3_K, IQ4_XS, IQ2_XS (matmul_lowbit.h)
}

}  // namespace kimi::kern
