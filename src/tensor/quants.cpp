#include "tensor/quants.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "util/error.h"

namespace kimi {

const int8_t kvalues_mxfp4[16] = {0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12};

namespace {

// ggml nearest_int: round to nearest, ties to even (valid for |x| < 2^22).
inline int rne(float x) { return static_cast<int>(std::nearbyint(x)); }

void check_blocks(int64_t n, int64_t qk, const char* what) {
  check(n >= 0 && n % qk == 0, "{}: row of {} elements is not a multiple of the block size {}", what, n, qk);
}

}  // namespace

// ------------------------------------------------------------------------------------------------
// Q8_0
void quantize_row_q8_0(const float* x, block_q8_0* y, int64_t n) {
  check_blocks(n, QK8_0, "quantize_row_q8_0");
  for (int64_t b = 0; b < n / QK8_0; ++b, x += QK8_0) {
    float amax = 0.0f;
    for (int j = 0; j < QK8_0; ++j) amax = std::max(amax, std::fabs(x[j]));
    const float d = amax / 127.0f;
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    y[b].d = f32_to_f16(d);
    for (int j = 0; j < QK8_0; ++j) y[b].qs[j] = static_cast<int8_t>(std::roundf(x[j] * id));
  }
}

void dequantize_row_q8_0(const block_q8_0* x, float* y, int64_t n) {
  check_blocks(n, QK8_0, "dequantize_row_q8_0");
  for (int64_t b = 0; b < n / QK8_0; ++b) {
    const float d = f16_to_f32(x[b].d);
    for (int j = 0; j < QK8_0; ++j) y[b * QK8_0 + j] = x[b].qs[j] * d;
  }
}

// ------------------------------------------------------------------------------------------------
// Q4_0
void quantize_row_q4_0(const float* x, block_q4_0* y, int64_t n) {
  check_blocks(n, QK4_0, "quantize_row_q4_0");
  for (int64_t b = 0; b < n / QK4_0; ++b, x += QK4_0) {
    float amax = 0.0f, vmax = 0.0f;  // vmax: the signed element of largest magnitude
    for (int j = 0; j < QK4_0; ++j) {
      if (amax < std::fabs(x[j])) {
        amax = std::fabs(x[j]);
        vmax = x[j];
      }
    }
    const float d = vmax / -8.0f;
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    y[b].d = f32_to_f16(d);
    for (int j = 0; j < QK4_0 / 2; ++j) {
      const int q0 = std::min(15, static_cast<int>(static_cast<int8_t>(x[j] * id + 8.5f)));
      const int q1 = std::min(15, static_cast<int>(static_cast<int8_t>(x[j + 16] * id + 8.5f)));
      y[b].qs[j] = static_cast<uint8_t>(q0 | (q1 << 4));
    }
  }
}

void dequantize_row_q4_0(const block_q4_0* x, float* y, int64_t n) {
  check_blocks(n, QK4_0, "dequantize_row_q4_0");
  for (int64_t b = 0; b < n / QK4_0; ++b) {
    const float d = f16_to_f32(x[b].d);
    for (int j = 0; j < QK4_0 / 2; ++j) {
      y[b * QK4_0 + j] = ((x[b].qs[j] & 0xF) - 8) * d;
      y[b * QK4_0 + j + 16] = ((x[b].qs[j] >> 4) - 8) * d;
    }
  }
}

// ------------------------------------------------------------------------------------------------
// Q5_0 / Q5_1 (formats-quant.md §4: nibble order as Q4_0, qh bit k = 5th bit of element k)
namespace {

void pack_q5(const int* q, uint8_t* qs, uint8_t* qh_bytes) {  // q[32] in 0..31
  uint32_t qh = 0;
  for (int j = 0; j < 16; ++j) {
    qs[j] = static_cast<uint8_t>((q[j] & 0xF) | ((q[j + 16] & 0xF) << 4));
    qh |= static_cast<uint32_t>((q[j] >> 4) & 1) << j;
    qh |= static_cast<uint32_t>((q[j + 16] >> 4) & 1) << (j + 16);
  }
  for (int i = 0; i < 4; ++i) qh_bytes[i] = static_cast<uint8_t>(qh >> (8 * i));
}

// the 32 levels (0..31) of a Q5 block
inline void q5_levels(const uint8_t* qs, const uint8_t* qh_bytes, int* q) {
  const uint32_t qh = static_cast<uint32_t>(qh_bytes[0]) | (static_cast<uint32_t>(qh_bytes[1]) << 8) |
                      (static_cast<uint32_t>(qh_bytes[2]) << 16) | (static_cast<uint32_t>(qh_bytes[3]) << 24);
  for (int j = 0; j < 16; ++j) {
    q[j] = (qs[j] & 0xF) | static_cast<int>(((qh >> j) & 1) << 4);
    q[j + 16] = (qs[j] >> 4) | static_cast<int>(((qh >> (j + 16)) & 1) << 4);
  }
}

}  // namespace

void quantize_row_q5_0(const float* x, block_q5_0* y, int64_t n) {
  check_blocks(n, QK4_0, "quantize_row_q5_0");
  int q[32];
  for (int64_t b = 0; b < n / QK4_0; ++b, x += QK4_0) {
    float amax = 0.0f, vmax = 0.0f;  // vmax: the signed element of largest magnitude
    for (int j = 0; j < QK4_0; ++j) {
      if (amax < std::fabs(x[j])) {
        amax = std::fabs(x[j]);
        vmax = x[j];
      }
    }
    const float d = vmax / -16.0f;
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    y[b].d = f32_to_f16(d);
    for (int j = 0; j < QK4_0; ++j) q[j] = std::min(31, static_cast<int>(static_cast<int8_t>(x[j] * id + 16.5f)));
    pack_q5(q, y[b].qs, y[b].qh);
  }
}

void dequantize_row_q5_0(const block_q5_0* x, float* y, int64_t n) {
  check_blocks(n, QK4_0, "dequantize_row_q5_0");
  for (int64_t b = 0; b < n / QK4_0; ++b) {
    const float d = f16_to_f32(x[b].d);
    int q[32];
    q5_levels(x[b].qs, x[b].qh, q);
    for (int j = 0; j < QK4_0; ++j) y[b * QK4_0 + j] = static_cast<float>(q[j] - 16) * d;
  }
}

void quantize_row_q5_1(const float* x, block_q5_1* y, int64_t n) {
  check_blocks(n, QK4_0, "quantize_row_q5_1");
  int q[32];
  for (int64_t b = 0; b < n / QK4_0; ++b, x += QK4_0) {
    float mn = x[0], mx = x[0];
    for (int j = 1; j < QK4_0; ++j) {
      mn = std::min(mn, x[j]);
      mx = std::max(mx, x[j]);
    }
    const float d = (mx - mn) / 31.0f;
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    y[b].d = f32_to_f16(d);
    y[b].m = f32_to_f16(mn);
    for (int j = 0; j < QK4_0; ++j) q[j] = static_cast<int>(static_cast<int8_t>((x[j] - mn) * id + 0.5f));
    pack_q5(q, y[b].qs, y[b].qh);
  }
}

void dequantize_row_q5_1(const block_q5_1* x, float* y, int64_t n) {
  check_blocks(n, QK4_0, "dequantize_row_q5_1");
  for (int64_t b = 0; b < n / QK4_0; ++b) {
    const float d = f16_to_f32(x[b].d), m = f16_to_f32(x[b].m);
    int q[32];
    q5_levels(x[b].qs, x[b].qh, q);
    for (int j = 0; j < QK4_0; ++j) y[b * QK4_0 + j] = static_cast<float>(q[j]) * d + m;
  }
}

// ------------------------------------------------------------------------------------------------
// MXFP4 (ggml convention: doubled kvalues, half scale)
void quantize_row_mxfp4(const float* x, block_mxfp4* y, int64_t n) {
  check_blocks(n, QK_MXFP4, "quantize_row_mxfp4");
  for (int64_t b = 0; b < n / QK_MXFP4; ++b, x += QK_MXFP4) {
    float amax = 0.0f;
    for (int j = 0; j < QK_MXFP4; ++j) amax = std::max(amax, std::fabs(x[j]));
    int e = 0;
    if (amax > 0.0f) e = std::clamp(static_cast<int>(std::floor(std::log2(amax))) - 2 + 127, 0, 254);
    y[b].e = static_cast<uint8_t>(e);
    const float h = e8m0_to_f32_half(static_cast<uint8_t>(e));
    auto best = [&](float v) {
      int bi = 0;
      float be = std::fabs(kvalues_mxfp4[0] * h - v);
      for (int i = 1; i < 16; ++i) {
        const float err = std::fabs(kvalues_mxfp4[i] * h - v);
        if (err < be) {
          be = err;
          bi = i;
        }
      }
      return bi;
    };
    for (int j = 0; j < QK_MXFP4 / 2; ++j) y[b].qs[j] = static_cast<uint8_t>(best(x[j]) | (best(x[j + 16]) << 4));
  }
}

void dequantize_row_mxfp4(const block_mxfp4* x, float* y, int64_t n) {
  check_blocks(n, QK_MXFP4, "dequantize_row_mxfp4");
  for (int64_t b = 0; b < n / QK_MXFP4; ++b) {
    const float h = e8m0_to_f32_half(x[b].e);
    for (int j = 0; j < QK_MXFP4 / 2; ++j) {
      y[b * QK_MXFP4 + j] = kvalues_mxfp4[x[b].qs[j] & 0xF] * h;
      y[b * QK_MXFP4 + j + 16] = kvalues_mxfp4[x[b].qs[j] >> 4] * h;
    }
  }
}

// ------------------------------------------------------------------------------------------------
// Q8_K (activation type)
void quantize_row_q8_K(const float* x, block_q8_K* y, int64_t n) {
  check_blocks(n, QK_K, "quantize_row_q8_K");
  for (int64_t b = 0; b < n / QK_K; ++b, x += QK_K) {
    float amax = 0.0f, vmax = 0.0f;
    for (int j = 0; j < QK_K; ++j) {
      if (amax < std::fabs(x[j])) {
        amax = std::fabs(x[j]);
        vmax = x[j];
      }
    }
    if (amax == 0.0f) {
      std::memset(&y[b], 0, sizeof(block_q8_K));
      continue;
    }
    const float iscale = -127.0f / vmax;
    for (int j = 0; j < QK_K; ++j) y[b].qs[j] = static_cast<int8_t>(std::min(127, rne(iscale * x[j])));
    for (int g = 0; g < QK_K / 16; ++g) {
      int s = 0;
      for (int j = 0; j < 16; ++j) s += y[b].qs[16 * g + j];
      y[b].bsums[g] = static_cast<int16_t>(s);
    }
    y[b].d = 1.0f / iscale;
  }
}

void dequantize_row_q8_K(const block_q8_K* x, float* y, int64_t n) {
  check_blocks(n, QK_K, "dequantize_row_q8_K");
  for (int64_t b = 0; b < n / QK_K; ++b)
    for (int j = 0; j < QK_K; ++j) y[b * QK_K + j] = x[b].d * x[b].qs[j];
}

// ------------------------------------------------------------------------------------------------
// K-quant dequantizers
void dequantize_row_q4_K(const block_q4_K* x, float* y, int64_t n) {
  check_blocks(n, QK_K, "dequantize_row_q4_K");
  for (int64_t b = 0; b < n / QK_K; ++b) {
    const float d = f16_to_f32(x[b].d), dmin = f16_to_f32(x[b].dmin);
    const uint8_t* q = x[b].qs;
    for (int c = 0; c < 4; ++c, q += 32) {  // 64 elements per chunk: low nibbles then high nibbles
      uint8_t sc, m;
      get_scale_min_k4(2 * c, x[b].scales, &sc, &m);
      const float d1 = d * sc, m1 = dmin * m;
      get_scale_min_k4(2 * c + 1, x[b].scales, &sc, &m);
      const float d2 = d * sc, m2 = dmin * m;
      for (int l = 0; l < 32; ++l) *y++ = d1 * (q[l] & 0xF) - m1;
      for (int l = 0; l < 32; ++l) *y++ = d2 * (q[l] >> 4) - m2;
    }
  }
}

void dequantize_row_q5_K(const block_q5_K* x, float* y, int64_t n) {
  check_blocks(n, QK_K, "dequantize_row_q5_K");
  for (int64_t b = 0; b < n / QK_K; ++b) {
    const float d = f16_to_f32(x[b].d), dmin = f16_to_f32(x[b].dmin);
    const uint8_t* q = x[b].qs;
    const uint8_t* qh = x[b].qh;
    for (int c = 0; c < 4; ++c, q += 32) {
      uint8_t sc, m;
      get_scale_min_k4(2 * c, x[b].scales, &sc, &m);
      const float d1 = d * sc, m1 = dmin * m;
      get_scale_min_k4(2 * c + 1, x[b].scales, &sc, &m);
      const float d2 = d * sc, m2 = dmin * m;
      const uint8_t u1 = static_cast<uint8_t>(1u << (2 * c)), u2 = static_cast<uint8_t>(2u << (2 * c));
      for (int l = 0; l < 32; ++l) *y++ = d1 * ((q[l] & 0xF) + ((qh[l] & u1) ? 16 : 0)) - m1;
      for (int l = 0; l < 32; ++l) *y++ = d2 * ((q[l] >> 4) + ((qh[l] & u2) ? 16 : 0)) - m2;
    }
  }
}

void dequantize_row_q6_K(const block_q6_K* x, float* y, int64_t n) {
  check_blocks(n, QK_K, "dequantize_row_q6_K");
  for (int64_t b = 0; b < n / QK_K; ++b) {
    const float d = f16_to_f32(x[b].d);
    const uint8_t* ql = x[b].ql;
    const uint8_t* qh = x[b].qh;
    const int8_t* sc = x[b].scales;
    for (int h = 0; h < 2; ++h, ql += 64, qh += 32, sc += 8, y += 128) {
      for (int l = 0; l < 32; ++l) {
        const int is = l / 16;
        const int q1 = ((ql[l] & 0xF) | (((qh[l] >> 0) & 3) << 4)) - 32;
        const int q2 = ((ql[l + 32] & 0xF) | (((qh[l] >> 2) & 3) << 4)) - 32;
        const int q3 = ((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) - 32;
        const int q4 = ((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) - 32;
        y[l] = d * sc[is] * q1;
        y[l + 32] = d * sc[is + 2] * q2;
        y[l + 64] = d * sc[is + 4] * q3;
        y[l + 96] = d * sc[is + 6] * q4;
      }
    }
  }
}

// ------------------------------------------------------------------------------------------------
// K-quant reference quantizers (the ggml *_ref algorithms, formats-quant.md §4.4)
namespace {

constexpr float kGroupMaxEps = 1e-15f;

// Fit x ~ scale * L + min (min <= 0, L in [0, nmax]) for one group, weighted least squares with a
// grid search over candidate inverse scales. Returns scale; *the_min = -min.
float make_qkx2_quants(int n, int nmax, const float* x, const float* w, uint8_t* L, float* the_min, uint8_t* Laux,
                       float rmin, float rdelta, int nstep) {
  float mn = x[0], mx = x[0], sum_w = w[0], sum_x = w[0] * x[0];
  for (int i = 1; i < n; ++i) {
    mn = std::min(mn, x[i]);
    mx = std::max(mx, x[i]);
    sum_w += w[i];
    sum_x += w[i] * x[i];
  }
  if (mn > 0) mn = 0;
  if (mx == mn) {
    for (int i = 0; i < n; ++i) L[i] = 0;
    *the_min = -mn;
    return 0.0f;
  }
  float iscale = nmax / (mx - mn);
  float scale = 1.0f / iscale;
  float best_err = 0;
  for (int i = 0; i < n; ++i) {
    const int l = std::clamp(rne(iscale * (x[i] - mn)), 0, nmax);
    L[i] = static_cast<uint8_t>(l);
    const float diff = scale * l + mn - x[i];
    best_err += w[i] * diff * diff;
  }
  for (int is = 0; is <= nstep; ++is) {
    iscale = (rmin + rdelta * is + nmax) / (mx - mn);
    float sum_l = 0, sum_l2 = 0, sum_xl = 0;
    for (int i = 0; i < n; ++i) {
      const int l = std::clamp(rne(iscale * (x[i] - mn)), 0, nmax);
      Laux[i] = static_cast<uint8_t>(l);
      sum_l += w[i] * l;
      sum_l2 += w[i] * l * l;
      sum_xl += w[i] * l * x[i];
    }
    const float D = sum_w * sum_l2 - sum_l * sum_l;
    if (D > 0) {
      float this_scale = (sum_w * sum_xl - sum_x * sum_l) / D;
      float this_min = (sum_l2 * sum_x - sum_l * sum_xl) / D;
      if (this_min > 0) {
        this_min = 0;
        this_scale = sum_xl / sum_l2;
      }
      float err = 0;
      for (int i = 0; i < n; ++i) {
        const float diff = this_scale * Laux[i] + this_min - x[i];
        err += w[i] * diff * diff;
      }
      if (err < best_err) {
        for (int i = 0; i < n; ++i) L[i] = Laux[i];
        best_err = err;
        scale = this_scale;
        mn = this_min;
      }
    }
  }
  *the_min = -mn;
  return scale;
}

// Signed fit x ~ scale * (L - nmax), L in [0, 2 nmax), 19 candidate scales; weights x^2, or the imatrix
// importances (imatrix_element_weights) when qw is given.
float make_qx_quants(int n, int nmax, const float* x, int8_t* L, const float* qw = nullptr) {
  float wbuf[32];  // importance weights (n <= 32), else x^2
  if (n > 32 || !imatrix_element_weights(qw, n, wbuf)) qw = nullptr;
  float mx = 0, amax = 0;
  for (int i = 0; i < n; ++i) {
    const float ax = std::fabs(x[i]);
    if (ax > amax) {
      amax = ax;
      mx = x[i];
    }
  }
  if (amax < kGroupMaxEps) {
    for (int i = 0; i < n; ++i) L[i] = 0;
    return 0.0f;
  }
  float iscale = -nmax / mx;
  float sumlx = 0, suml2 = 0;
  for (int i = 0; i < n; ++i) {
    const int l = std::clamp(rne(iscale * x[i]), -nmax, nmax - 1);
    L[i] = static_cast<int8_t>(l + nmax);
    const float w = qw ? wbuf[i] : x[i] * x[i];
    sumlx += w * x[i] * l;
    suml2 += w * l * l;
  }
  float scale = suml2 != 0 ? sumlx / suml2 : 0.0f;
  float best = scale * sumlx;
  for (int is = -9; is <= 9; ++is) {
    if (is == 0) continue;
    iscale = -(nmax + 0.1f * is) / mx;
    sumlx = suml2 = 0;
    for (int i = 0; i < n; ++i) {
      const int l = std::clamp(rne(iscale * x[i]), -nmax, nmax - 1);
      const float w = qw ? wbuf[i] : x[i] * x[i];
      sumlx += w * x[i] * l;
      suml2 += w * l * l;
    }
    if (suml2 > 0 && sumlx * sumlx > best * suml2) {
      for (int i = 0; i < n; ++i) L[i] = static_cast<int8_t>(nmax + std::clamp(rne(iscale * x[i]), -nmax, nmax - 1));
      scale = sumlx / suml2;
      best = scale * sumlx;
    }
  }
  return scale;
}

// Shared part of Q4_K / Q5_K: 8 sub-block (scale, min) fits packed as 6-bit pairs; returns the
// final integer levels in L[256] (0..nmax).
void quantize_k_scales(const float* x, int nmax, float rmin, float rdelta, int nstep, uint16_t* d_out,
                       uint16_t* dmin_out, uint8_t* packed, uint8_t* L, const float* qw) {
  float scales[8], mins[8], w[32];
  uint8_t Laux[32];
  float max_scale = 0, max_min = 0;
  for (int j = 0; j < 8; ++j) {
    float sum_x2 = 0;
    for (int l = 0; l < 32; ++l) sum_x2 += x[32 * j + l] * x[32 * j + l];
    const float av_x = std::sqrt(sum_x2 / 32);
    if (!imatrix_element_weights(qw ? qw + 32 * j : nullptr, 32, w))  // else ggml's magnitude weight
      for (int l = 0; l < 32; ++l) w[l] = av_x + std::fabs(x[32 * j + l]);
    scales[j] = make_qkx2_quants(32, nmax, x + 32 * j, w, L + 32 * j, &mins[j], Laux, rmin, rdelta, nstep);
    max_scale = std::max(max_scale, scales[j]);
    max_min = std::max(max_min, mins[j]);
  }
  const float inv_scale = max_scale > 0 ? 63.0f / max_scale : 0.0f;
  const float inv_min = max_min > 0 ? 63.0f / max_min : 0.0f;
  std::memset(packed, 0, K_SCALE_SIZE);
  for (int j = 0; j < 8; ++j) {
    const int ls = std::min(63, rne(inv_scale * scales[j]));
    const int lm = std::min(63, rne(inv_min * mins[j]));
    if (j < 4) {
      packed[j] = static_cast<uint8_t>(ls);
      packed[j + 4] = static_cast<uint8_t>(lm);
    } else {
      packed[j + 4] = static_cast<uint8_t>((ls & 0xF) | ((lm & 0xF) << 4));
      packed[j - 4] |= static_cast<uint8_t>((ls >> 4) << 6);
      packed[j] |= static_cast<uint8_t>((lm >> 4) << 6);
    }
  }
  *d_out = f32_to_f16(max_scale / 63.0f);
  *dmin_out = f32_to_f16(max_min / 63.0f);
  const float d = f16_to_f32(*d_out), dmin = f16_to_f32(*dmin_out);
  for (int j = 0; j < 8; ++j) {
    uint8_t sc, m;
    get_scale_min_k4(j, packed, &sc, &m);
    const float dd = d * sc;
    if (dd == 0.0f) continue;
    const float dm = dmin * m;
    for (int ii = 0; ii < 32; ++ii)
      L[32 * j + ii] = static_cast<uint8_t>(std::clamp(rne((x[32 * j + ii] + dm) / dd), 0, nmax));
  }
}

}  // namespace

void quantize_row_q4_K(const float* x, block_q4_K* y, int64_t n, const float* qw) {
  check_blocks(n, QK_K, "quantize_row_q4_K");
  uint8_t L[QK_K];
  for (int64_t b = 0; b < n / QK_K; ++b, x += QK_K, qw = qw ? qw + QK_K : nullptr) {
    quantize_k_scales(x, 15, -1.0f, 0.1f, 20, &y[b].d, &y[b].dmin, y[b].scales, L, qw);
    uint8_t* q = y[b].qs;
    for (int j = 0; j < QK_K; j += 64, q += 32)
      for (int l = 0; l < 32; ++l) q[l] = static_cast<uint8_t>(L[j + l] | (L[j + l + 32] << 4));
  }
}

void quantize_row_q5_K(const float* x, block_q5_K* y, int64_t n, const float* qw) {
  check_blocks(n, QK_K, "quantize_row_q5_K");
  uint8_t L[QK_K];
  for (int64_t b = 0; b < n / QK_K; ++b, x += QK_K, qw = qw ? qw + QK_K : nullptr) {
    quantize_k_scales(x, 31, -0.5f, 0.1f, 15, &y[b].d, &y[b].dmin, y[b].scales, L, qw);
    std::memset(y[b].qh, 0, sizeof(y[b].qh));
    uint8_t* ql = y[b].qs;
    uint8_t m1 = 1, m2 = 2;
    for (int nn = 0; nn < QK_K; nn += 64, ql += 32) {
      for (int j = 0; j < 32; ++j) {
        int l1 = L[nn + j], l2 = L[nn + j + 32];
        if (l1 > 15) {
          l1 -= 16;
          y[b].qh[j] |= m1;
        }
        if (l2 > 15) {
          l2 -= 16;
          y[b].qh[j] |= m2;
        }
        ql[j] = static_cast<uint8_t>(l1 | (l2 << 4));
      }
      m1 = static_cast<uint8_t>(m1 << 2);
      m2 = static_cast<uint8_t>(m2 << 2);
    }
  }
}

void quantize_row_q6_K(const float* x, block_q6_K* y, int64_t n, const float* qw) {
  check_blocks(n, QK_K, "quantize_row_q6_K");
  int8_t L[QK_K];
  float scales[QK_K / 16];
  for (int64_t b = 0; b < n / QK_K; ++b, x += QK_K, qw = qw ? qw + QK_K : nullptr) {
    float max_scale = 0, max_abs_scale = 0;
    for (int ib = 0; ib < QK_K / 16; ++ib) {
      const float scale = make_qx_quants(16, 32, x + 16 * ib, L + 16 * ib, qw ? qw + 16 * ib : nullptr);
      scales[ib] = scale;
      if (std::fabs(scale) > max_abs_scale) {
        max_abs_scale = std::fabs(scale);
        max_scale = scale;
      }
    }
    if (max_abs_scale < kGroupMaxEps) {
      std::memset(&y[b], 0, sizeof(block_q6_K));
      y[b].d = f32_to_f16(0.0f);
      continue;
    }
    const float iscale = -128.0f / max_scale;
    y[b].d = f32_to_f16(1.0f / iscale);
    for (int ib = 0; ib < QK_K / 16; ++ib) y[b].scales[ib] = static_cast<int8_t>(std::min(127, rne(iscale * scales[ib])));
    const float d0 = f16_to_f32(y[b].d);
    for (int j = 0; j < QK_K / 16; ++j) {
      const float d = d0 * y[b].scales[j];
      if (d == 0.0f) continue;
      for (int ii = 0; ii < 16; ++ii)
        L[16 * j + ii] = static_cast<int8_t>(std::clamp(rne(x[16 * j + ii] / d), -32, 31) + 32);
    }
    uint8_t* ql = y[b].ql;
    uint8_t* qh = y[b].qh;
    for (int j = 0; j < QK_K; j += 128, ql += 64, qh += 32) {
      for (int l = 0; l < 32; ++l) {
        const int q1 = L[j + l] & 0xF, q2 = L[j + l + 32] & 0xF, q3 = L[j + l + 64] & 0xF, q4 = L[j + l + 96] & 0xF;
        ql[l] = static_cast<uint8_t>(q1 | (q3 << 4));
        ql[l + 32] = static_cast<uint8_t>(q2 | (q4 << 4));
        qh[l] = static_cast<uint8_t>((L[j + l] >> 4) | ((L[j + l + 32] >> 4) << 2) | ((L[j + l + 64] >> 4) << 4) |
                                     ((L[j + l + 96] >> 4) << 6));
      }
    }
  }
}

// ------------------------------------------------------------------------------------------------
bool can_quantize(GgmlType t) {
  switch (t) {
    case GgmlType::F32: case GgmlType::F16: case GgmlType::BF16: case GgmlType::Q8_0: case GgmlType::Q4_0:
    case GgmlType::Q5_0: case GgmlType::Q5_1: case GgmlType::MXFP4: case GgmlType::Q4_K: case GgmlType::Q5_K: case GgmlType::Q6_K: case GgmlType::Q8_K:
    case GgmlType::Q2_K: case GgmlType::Q3_K: case GgmlType::IQ4_XS: case GgmlType::IQ2_XS:
      return true;
    default:
      return false;
  }
}

bool uses_imatrix(GgmlType t) {
  switch (t) {
    case GgmlType::Q2_K: case GgmlType::Q3_K: case GgmlType::Q4_K: case GgmlType::Q5_K: case GgmlType::Q6_K:
    case GgmlType::IQ4_XS: case GgmlType::IQ2_XS:
      return true;
    default:
      return false;
  }
}

void quantize_row(GgmlType t, const float* x, void* y, int64_t n) { quantize_row_imat(t, x, y, n, nullptr); }

void quantize_row_imat(GgmlType t, const float* x, void* y, int64_t n, const float* qw) {
  switch (t) {
    case GgmlType::F32: std::memcpy(y, x, static_cast<size_t>(n) * 4); return;
    case GgmlType::F16: {
      auto* o = static_cast<uint16_t*>(y);
      for (int64_t i = 0; i < n; ++i) o[i] = f32_to_f16(x[i]);
      return;
    }
    case GgmlType::BF16: {
      auto* o = static_cast<uint16_t*>(y);
      for (int64_t i = 0; i < n; ++i) o[i] = f32_to_bf16(x[i]);
      return;
    }
    case GgmlType::Q8_0: quantize_row_q8_0(x, static_cast<block_q8_0*>(y), n); return;
    case GgmlType::Q4_0: quantize_row_q4_0(x, static_cast<block_q4_0*>(y), n); return;
    case GgmlType::Q5_0: quantize_row_q5_0(x, static_cast<block_q5_0*>(y), n); return;
    case GgmlType::Q5_1: quantize_row_q5_1(x, static_cast<block_q5_1*>(y), n); return;
    case GgmlType::MXFP4: quantize_row_mxfp4(x, static_cast<block_mxfp4*>(y), n); return;
    case GgmlType::Q4_K: quantize_row_q4_K(x, static_cast<block_q4_K*>(y), n, qw); return;
    case GgmlType::Q5_K: quantize_row_q5_K(x, static_cast<block_q5_K*>(y), n, qw); return;
    case GgmlType::Q6_K: quantize_row_q6_K(x, static_cast<block_q6_K*>(y), n, qw); return;
    case GgmlType::Q8_K: quantize_row_q8_K(x, static_cast<block_q8_K*>(y), n); return;
    case GgmlType::Q2_K: quantize_row_q2_K(x, static_cast<block_q2_K*>(y), n, qw); return;
    case GgmlType::Q3_K: quantize_row_q3_K(x, static_cast<block_q3_K*>(y), n, qw); return;
    case GgmlType::IQ4_XS: quantize_row_iq4_xs(x, static_cast<block_iq4_xs*>(y), n, qw); return;
    case GgmlType::IQ2_XS: quantize_row_iq2_xs(x, static_cast<block_iq2_xs*>(y), n, qw); return;
    default: fail("quantize_row: no quantizer for type {}", type_name(t));
  }
}

void dequantize_row(GgmlType t, const void* x, float* y, int64_t n) {
  switch (t) {
    case GgmlType::F32: std::memcpy(y, x, static_cast<size_t>(n) * 4); return;
    case GgmlType::F16: {
      auto* s = static_cast<const uint16_t*>(x);
      for (int64_t i = 0; i < n; ++i) y[i] = f16_to_f32(s[i]);
      return;
    }
    case GgmlType::BF16: {
      auto* s = static_cast<const uint16_t*>(x);
      for (int64_t i = 0; i < n; ++i) y[i] = bf16_to_f32(s[i]);
      return;
    }
    case GgmlType::Q8_0: dequantize_row_q8_0(static_cast<const block_q8_0*>(x), y, n); return;
    case GgmlType::Q4_0: dequantize_row_q4_0(static_cast<const block_q4_0*>(x), y, n); return;
    case GgmlType::Q5_0: dequantize_row_q5_0(static_cast<const block_q5_0*>(x), y, n); return;
    case GgmlType::Q5_1: dequantize_row_q5_1(static_cast<const block_q5_1*>(x), y, n); return;
    case GgmlType::MXFP4: dequantize_row_mxfp4(static_cast<const block_mxfp4*>(x), y, n); return;
    case GgmlType::Q4_K: dequantize_row_q4_K(static_cast<const block_q4_K*>(x), y, n); return;
    case GgmlType::Q5_K: dequantize_row_q5_K(static_cast<const block_q5_K*>(x), y, n); return;
    case GgmlType::Q6_K: dequantize_row_q6_K(static_cast<const block_q6_K*>(x), y, n); return;
    case GgmlType::Q8_K: dequantize_row_q8_K(static_cast<const block_q8_K*>(x), y, n); return;
    case GgmlType::Q2_K: dequantize_row_q2_K(static_cast<const block_q2_K*>(x), y, n); return;
    case GgmlType::Q3_K: dequantize_row_q3_K(static_cast<const block_q3_K*>(x), y, n); return;
    case GgmlType::IQ4_XS: dequantize_row_iq4_xs(static_cast<const block_iq4_xs*>(x), y, n); return;
    case GgmlType::IQ2_XS: dequantize_row_iq2_xs(static_cast<const block_iq2_xs*>(x), y, n); return;
    default: fail("dequantize_row: no dequantizer for type {}", type_name(t));
  }
}

bool validate_row(GgmlType t, const void* row, int64_t n, std::string* why) {
  // the f16 scales of each block (offsets per type) must be finite
  int off[2] = {-1, -1};
  switch (t) {
    case GgmlType::Q2_K: off[0] = 80; off[1] = 82; break;
    case GgmlType::Q3_K: off[0] = 108; break;
    case GgmlType::IQ4_XS: case GgmlType::IQ2_XS: case GgmlType::Q4_K: case GgmlType::Q5_K: off[0] = 0; break;
    case GgmlType::Q6_K: off[0] = 208; break;
    default: return true;
  }
  if (t == GgmlType::Q4_K || t == GgmlType::Q5_K) off[1] = 2;
  const auto& tr = traits(t);
  const auto* p = static_cast<const uint8_t*>(row);
  for (int64_t b = 0; b < n / tr.block; ++b)
    for (int k : off) {
      if (k < 0) continue;
      uint16_t h;
      std::memcpy(&h, p + b * tr.bytes + k, 2);
      if ((h & 0x7c00u) == 0x7c00u) {
        if (why) *why = std::string(tr.name) + " block " + std::to_string(b) + ": scale is inf or NaN";
        return false;
      }
    }
  return true;
}

}  // namespace kimi
