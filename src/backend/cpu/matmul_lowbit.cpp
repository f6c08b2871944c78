// Scalar matmul kernels of Q2_K, Q3_K, IQ4_XS, IQ2_XS x Q8_K activations (matmul_lowbit.h): the
// reference the SIMD levels are tested against and the fallback without AVX2; plus the
// Precision::F32 kernels (rows decoded to f32 by the tensor/quants.h reference decoders).
#include <cmath>
#include <cstring>

#include "backend/cpu/matmul_lowbit.h"
#include "backend/cpu/quantize_act.h"
#include "tensor/quants.h"

namespace kimi::kern {

namespace {

float dot_f32(const float* a, const float* b, int64_t n) {
  float s[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  int64_t i = 0;
  for (; i + 8 <= n; i += 8)
    for (int j = 0; j < 8; ++j) s[j] += a[i + j] * b[i + j];
  for (; i < n; ++i) s[i & 7] += a[i] * b[i];
  return ((s[0] + s[1]) + (s[2] + s[3])) + ((s[4] + s[5]) + (s[6] + s[7]));
}

void run_deq_f32(const MatView& W, const uint8_t* act, size_t stride, int64_t nt, int64_t r0, int64_t r1, float* y,
                 int64_t ldy) {
  float* w = f32_scratch(W.cols, 1);
  for (int64_t r = r0; r < r1; ++r) {
    kimi::dequantize_row(W.type, W.data + static_cast<uint64_t>(r) * W.row_bytes, w, W.cols);
    for (int64_t t = 0; t < nt; ++t) y[t * ldy + r] = dot_f32(w, reinterpret_cast<const float*>(act + t * stride), W.cols);
  }
}

// Integer levels of one super-block in element order, s16 scale per 16-group, the f32 factor of
// sum(scale * level * a) and (Q2_K) of sum(min * bsum).
struct Decoded {
  int8_t q[QK_K];
  int sc[16], mn[16];
  float d, dmin;
};

void decode_q2_K(const block_q2_K& b, Decoded& o) {
  for (int e = 0; e < QK_K; ++e) o.q[e] = static_cast<int8_t>((b.qs[32 * (e / 128) + e % 32] >> (2 * ((e % 128) / 32))) & 3);
  for (int g = 0; g < 16; ++g) {
    o.sc[g] = b.scales[g] & 15;
    o.mn[g] = b.scales[g] >> 4;
  }
  o.d = f16_to_f32(b.d);
  o.dmin = f16_to_f32(b.dmin);
}
void decode_q3_K(const block_q3_K& b, Decoded& o) {
  for (int e = 0; e < QK_K; ++e) {
    const int low = (b.qs[32 * (e / 128) + e % 32] >> (2 * ((e % 128) / 32))) & 3;
    o.q[e] = static_cast<int8_t>(low - (((b.hmask[e % 32] >> (e / 32)) & 1) ? 0 : 4));
  }
  int8_t s[16];
  q3_K_scales(b.scales, s);
  for (int g = 0; g < 16; ++g) {
    o.sc[g] = s[g];
    o.mn[g] = 0;
  }
  o.d = f16_to_f32(b.d);
  o.dmin = 0;
}
void decode_iq4_xs(const block_iq4_xs& b, Decoded& o) {
  for (int ib = 0; ib < 8; ++ib) {
    const int ls = ((b.scales_l[ib / 2] >> (4 * (ib % 2))) & 15) | (((b.scales_h >> (2 * ib)) & 3) << 4);
    o.sc[2 * ib] = o.sc[2 * ib + 1] = ls - 32;
    o.mn[2 * ib] = o.mn[2 * ib + 1] = 0;
    for (int j = 0; j < 16; ++j) {
      o.q[32 * ib + j] = kvalues_iq4nl[b.qs[16 * ib + j] & 15];
      o.q[32 * ib + j + 16] = kvalues_iq4nl[b.qs[16 * ib + j] >> 4];
    }
  }
  o.d = f16_to_f32(b.d);
  o.dmin = 0;
}
void decode_iq2_xs(const block_iq2_xs& b, Decoded& o) {
  static constexpr int kMag[3] = {8, 25, 43};
  for (int g = 0; g < 32; ++g) {
    const int signs = iq2_ksigns(b.qs[g] >> 9);
    const uint16_t lv = kIq2xsGrid[b.qs[g] & 511];
    for (int i = 0; i < 8; ++i) {
      const int m = kMag[(lv >> (2 * i)) & 3];
      o.q[8 * g + i] = static_cast<int8_t>((signs >> i & 1) ? -m : m);
    }
  }
  for (int h = 0; h < 16; ++h) {
    o.sc[h] = 2 * ((b.scales[h / 2] >> (4 * (h % 2))) & 15) + 1;
    o.mn[h] = 0;
  }
  o.d = f16_to_f32(b.d) * 0.125f;
  o.dmin = 0;
}

template <typename Block, void (*Decode)(const Block&, Decoded&)>
void run_lowbit(const MatView& W, const uint8_t* act, size_t stride, int64_t nt, int64_t r0, int64_t r1, float* y,
                int64_t ldy) {
  const int64_t nb = W.cols / QK_K;
  Decoded dec;
  for (int64_t r = r0; r < r1; ++r) {
    const Block* w = reinterpret_cast<const Block*>(W.data + static_cast<uint64_t>(r) * W.row_bytes);
    for (int64_t t = 0; t < nt; ++t) y[t * ldy + r] = 0.0f;
    for (int64_t b = 0; b < nb; ++b) {
      Decode(w[b], dec);
      for (int64_t t = 0; t < nt; ++t) {
        const block_q8_K& a = reinterpret_cast<const block_q8_K*>(act + t * stride)[b];
        int sumi = 0, summ = 0;
        for (int g = 0; g < 16; ++g) {
          int s = 0;
          for (int i = 0; i < 16; ++i) s += dec.q[16 * g + i] * a.qs[16 * g + i];
          sumi += dec.sc[g] * s;
          summ += dec.mn[g] * a.bsums[g];
        }
        y[t * ldy + r] += a.d * (dec.d * static_cast<float>(sumi) - dec.dmin * static_cast<float>(summ));
      }
    }
  }
}

const KernelRow kScalarLowbit[] = {
    {GgmlType::Q2_K, true, {nullptr, nullptr, run_deq_f32, 1}},
    {GgmlType::Q3_K, true, {nullptr, nullptr, run_deq_f32, 1}},
    {GgmlType::IQ4_XS, true, {nullptr, nullptr, run_deq_f32, 1}},
    {GgmlType::IQ2_XS, true, {nullptr, nullptr, run_deq_f32, 1}},
    {GgmlType::Q2_K, false, {q8_K_act_bytes, prep_q8_K, run_lowbit<block_q2_K, decode_q2_K>}},
    {GgmlType::Q3_K, false, {q8_K_act_bytes, prep_q8_K, run_lowbit<block_q3_K, decode_q3_K>}},
    {GgmlType::IQ4_XS, false, {q8_K_act_bytes, prep_q8_K, run_lowbit<block_iq4_xs, decode_iq4_xs>}},
    {GgmlType::IQ2_XS, false, {q8_K_act_bytes, prep_q8_K, run_lowbit<block_iq2_xs, decode_iq2_xs>}},
};

}  // namespace

bool scalar_lowbit_kernel(GgmlType type, Precision prec, MatKernel* k) {
  return select_kernel(kScalarLowbit, sizeof(kScalarLowbit) / sizeof(kScalarLowbit[0]), type, prec, k);
}

}  // namespace kimi::kern
