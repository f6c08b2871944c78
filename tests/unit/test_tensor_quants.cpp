// Block quantizers / dequantizers of tensor/quants.h: the MXFP4 worked example of
// formats-quant.md §3.7, hand-packed K-quant blocks decoded against values chosen in the test,
// and quantize -> dequantize round trips within each format's error bound.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "tensor/quants.h"
#include "util/error.h"

using namespace kimi;

namespace {

std::vector<float> gaussian(int64_t n, unsigned seed, float sigma = 1.0f) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd(0.0f, sigma);
  std::vector<float> v(static_cast<size_t>(n));
  for (auto& x : v) x = nd(rng);
  return v;
}

TEST(Quants, BlockSizesMatchTypeTraits) {
  EXPECT_EQ(sizeof(block_q8_0), traits(GgmlType::Q8_0).bytes);
  EXPECT_EQ(sizeof(block_q4_0), traits(GgmlType::Q4_0).bytes);
  EXPECT_EQ(sizeof(block_q5_0), traits(GgmlType::Q5_0).bytes);
  EXPECT_EQ(sizeof(block_q5_1), traits(GgmlType::Q5_1).bytes);
  EXPECT_EQ(sizeof(block_mxfp4), traits(GgmlType::MXFP4).bytes);
  EXPECT_EQ(sizeof(block_q4_K), traits(GgmlType::Q4_K).bytes);
  EXPECT_EQ(sizeof(block_q5_K), traits(GgmlType::Q5_K).bytes);
  EXPECT_EQ(sizeof(block_q6_K), traits(GgmlType::Q6_K).bytes);
  EXPECT_EQ(sizeof(block_q8_K), traits(GgmlType::Q8_K).bytes);
}

// formats-quant.md §3.7
TEST(Quants, Mxfp4WorkedExample) {
  const uint8_t bytes[17] = {0x7E, 0xF0, 0xE1, 0xD2, 0xC3, 0xB4, 0xA5, 0x96, 0x87,
                             0x78, 0x69, 0x5A, 0x4B, 0x3C, 0x2D, 0x1E, 0x0F};
  block_mxfp4 b;
  std::memcpy(&b, bytes, 17);
  float y[32];
  dequantize_row_mxfp4(&b, y, 32);
  const float expect[32] = {0, .25f, .5f, .75f, 1, 1.5f, 2, 3, 0, -.25f, -.5f, -.75f, -1, -1.5f, -2, -3,
                            -3, -2, -1.5f, -1, -.75f, -.5f, -.25f, 0, 3, 2, 1.5f, 1, .75f, .5f, .25f, 0};
  for (int i = 0; i < 32; ++i) EXPECT_EQ(y[i], expect[i]) << i;
  EXPECT_FALSE(std::signbit(y[8]));  // code 8 (-0) dequantizes to +0

  // ggml's quantizer: amax 2.7 -> e = 126; amax 3.9 -> e = 126 and 3.9 clips to 3.0
  float x[32] = {};
  x[5] = 2.7f;
  x[20] = -0.25f;
  block_mxfp4 q;
  quantize_row_mxfp4(x, &q, 32);
  EXPECT_EQ(q.e, 126);
  dequantize_row_mxfp4(&q, y, 32);
  EXPECT_EQ(y[5], 3.0f);  // nearest of {2, 3}: 3
  EXPECT_EQ(y[20], -0.25f);
  x[5] = 3.9f;
  quantize_row_mxfp4(x, &q, 32);
  EXPECT_EQ(q.e, 126);
  dequantize_row_mxfp4(&q, y, 32);
  EXPECT_EQ(y[5], 3.0f);
  // the worked example's values quantize back to the same bytes (amax 3 -> e 126, exact codes)
  quantize_row_mxfp4(expect, &q, 32);
  EXPECT_EQ(q.e, 0x7E);
  for (int j = 0; j < 16; ++j) {
    // -0 (code 8) re-encodes as +0 (code 0): ggml's quantizer takes the first minimum
    uint8_t lo = bytes[1 + j] & 0x0F, hi = bytes[1 + j] >> 4;
    if (lo == 8) lo = 0;
    if (hi == 8) hi = 0;
    EXPECT_EQ(q.qs[j], lo | (hi << 4)) << j;
  }
}

TEST(Quants, Q8_0ByHand) {
  float x[32];
  for (int i = 0; i < 32; ++i) x[i] = (i - 16) * 0.25f;  // amax 4.0 at i = 0
  block_q8_0 b;
  quantize_row_q8_0(x, &b, 32);
  EXPECT_EQ(b.d, f32_to_f16(4.0f / 127.0f));
  EXPECT_EQ(b.qs[0], -127);
  EXPECT_EQ(b.qs[16], 0);
  EXPECT_EQ(b.qs[17], 8);    // 0.25 * 127/4 = 7.94 -> 8
  EXPECT_EQ(b.qs[31], 119);  // 3.75 * 31.75 = 119.06
  float y[32];
  dequantize_row_q8_0(&b, y, 32);
  EXPECT_EQ(y[17], 8 * f16_to_f32(b.d));
}

TEST(Quants, Q4_0ByHand) {
  float x[32] = {};
  x[3] = -2.0f;  // signed max magnitude -> d = -2 / -8 = 0.25
  x[20] = 1.0f;  // 1 / 0.25 + 8.5 = 12.5 -> 12
  block_q4_0 b;
  quantize_row_q4_0(x, &b, 32);
  EXPECT_EQ(f16_to_f32(b.d), 0.25f);
  EXPECT_EQ(b.qs[3] & 0xF, 0);
  EXPECT_EQ(b.qs[4] >> 4, 12);
  float y[32];
  dequantize_row_q4_0(&b, y, 32);
  EXPECT_EQ(y[3], -2.0f);
  EXPECT_EQ(y[20], 1.0f);
  EXPECT_EQ(y[0], 0.0f);
}

// formats-quant.md §4: Q5_0 = d@0, qh u32@2, qs[16]@6; Q5_1 = d@0, m@2, qh@4, qs@8. Literal bytes,
// levels worked out by hand: qh bits 0, 15, 30, 31 set; qs[0] = 0x3A (e0 low 0xA, e16 high 3),
// qs[14] = 0x21 (e14 = 1, e30 = 2), qs[15] = 0xF0 (e15 = 0, e31 = 0xF), all other nibbles 0.
// Levels: e0 = 26, e14 = 1, e15 = 16, e16 = 3, e30 = 18, e31 = 31, the rest 0.
TEST(Quants, Q5HandDecoded) {
  const uint8_t q5_0[22] = {0x00, 0x38, 0x01, 0x80, 0x00, 0xC0, 0x3A, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0x21, 0xF0};
  const uint8_t q5_1[24] = {0x00, 0x38, 0x00, 0xBC, 0x01, 0x80, 0x00, 0xC0, 0x3A, 0, 0, 0,
                            0,    0,    0,    0,    0,    0,    0,    0,    0,    0,    0x21, 0xF0};
  block_q5_0 a;
  block_q5_1 b;
  std::memcpy(&a, q5_0, sizeof(a));
  std::memcpy(&b, q5_1, sizeof(b));
  float y0[32], y1[32];
  dequantize_row_q5_0(&a, y0, 32);  // d = 0.5: (level - 16) * 0.5
  dequantize_row_q5_1(&b, y1, 32);  // d = 0.5, m = -1: level * 0.5 - 1
  for (int i = 0; i < 32; ++i) {
    float e0 = -8.0f, e1 = -1.0f;
    switch (i) {
      case 0: e0 = 5.0f; e1 = 12.0f; break;
      case 14: e0 = -7.5f; e1 = -0.5f; break;
      case 15: e0 = 0.0f; e1 = 7.0f; break;
      case 16: e0 = -6.5f; e1 = 0.5f; break;
      case 30: e0 = 1.0f; e1 = 8.0f; break;
      case 31: e0 = 7.5f; e1 = 14.5f; break;
      default: break;
    }
    EXPECT_EQ(y0[i], e0) << "q5_0 element " << i;
    EXPECT_EQ(y1[i], e1) << "q5_1 element " << i;
  }
  // generic entry point decodes the same bytes
  float g[32];
  dequantize_row(GgmlType::Q5_0, q5_0, g, 32);
  for (int i = 0; i < 32; ++i) EXPECT_EQ(g[i], y0[i]) << i;
  dequantize_row(GgmlType::Q5_1, q5_1, g, 32);
  for (int i = 0; i < 32; ++i) EXPECT_EQ(g[i], y1[i]) << i;
}

TEST(Quants, Q5_0ByHand) {
  float x[64] = {};
  x[3] = -2.0f;   // block 0: signed max magnitude -> d = -2 / -16 = 0.125
  x[20] = 1.0f;   // 1 / 0.125 + 16.5 = 24.5 -> 24 (0b11000: 5th bit set, nibble 8)
  x[32] = 2.0f;   // block 1: positive max -> d = -0.125, level 0
  x[33] = -2.0f;  // -2 / -0.125 + 16.5 = 32.5 -> 32 -> clamped to 31 -> -1.875
  block_q5_0 b[2];
  quantize_row_q5_0(x, b, 64);
  EXPECT_EQ(f16_to_f32(b[0].d), 0.125f);
  EXPECT_EQ(f16_to_f32(b[1].d), -0.125f);
  // block 0 levels: e3 = 0, e20 = 24, all others 16 -> qh = every bit but bit 3
  EXPECT_EQ(b[0].qh[0], 0xF7);
  EXPECT_EQ(b[0].qh[1], 0xFF);
  EXPECT_EQ(b[0].qh[2], 0xFF);
  EXPECT_EQ(b[0].qh[3], 0xFF);
  EXPECT_EQ(b[0].qs[3], 0x00);  // e3 = 0 (low), e19 = 16 -> nibble 0 (high)
  EXPECT_EQ(b[0].qs[4], 0x80);  // e4 = 16 -> 0, e20 = 24 -> 8
  // block 1 levels: e0 = 0, e1 = 31, others 16
  EXPECT_EQ(b[1].qh[0], 0xFE);
  EXPECT_EQ(b[1].qs[1], 0x0F);
  float y[64];
  dequantize_row_q5_0(b, y, 64);
  EXPECT_EQ(y[3], -2.0f);
  EXPECT_EQ(y[20], 1.0f);
  EXPECT_EQ(y[0], 0.0f);
  EXPECT_EQ(y[32], 2.0f);
  EXPECT_EQ(y[33], -1.875f);
  EXPECT_EQ(y[40], 0.0f);
}

TEST(Quants, Q5_1ByHand) {
  float x[32];
  for (int j = 0; j < 32; ++j) x[j] = -1.0f + 0.25f * j;  // min -1, max 6.75 -> d = 7.75 / 31 = 0.25
  x[5] += 0.13f;                                         // (x - min) * 4 = 5.52 -> +0.5 -> 6
  block_q5_1 b;
  quantize_row_q5_1(x, &b, 32);
  EXPECT_EQ(f16_to_f32(b.d), 0.25f);
  EXPECT_EQ(f16_to_f32(b.m), -1.0f);
  // levels = j (6 at j = 5): element j and j+16 share nibble j & 15; bit 4 set exactly for j >= 16
  EXPECT_EQ(b.qh[0], 0x00);
  EXPECT_EQ(b.qh[1], 0x00);
  EXPECT_EQ(b.qh[2], 0xFF);
  EXPECT_EQ(b.qh[3], 0xFF);
  for (int j = 0; j < 16; ++j) EXPECT_EQ(b.qs[j], j == 5 ? 0x56 : j * 0x11) << j;
  float y[32];
  dequantize_row_q5_1(&b, y, 32);
  for (int j = 0; j < 32; ++j) EXPECT_EQ(y[j], j == 5 ? 0.5f : -1.0f + 0.25f * j) << j;
}

// Hand-packed Q4_K / Q5_K: scale/min values chosen here (both < 16 and >= 16 to exercise the
// 6-bit split), packed per §4.4, expected values computed from the chosen numbers.
void pack_k_scales(const int sc[8], const int m[8], uint8_t* s) {
  std::memset(s, 0, 12);
  for (int j = 0; j < 4; ++j) {
    s[j] = static_cast<uint8_t>((sc[j] & 63) | ((sc[j + 4] >> 4) << 6));
    s[j + 4] = static_cast<uint8_t>((m[j] & 63) | ((m[j + 4] >> 4) << 6));
    s[j + 8] = static_cast<uint8_t>((sc[j + 4] & 15) | ((m[j + 4] & 15) << 4));
  }
}

TEST(Quants, Q4_KHandDecoded) {
  const int sc[8] = {1, 7, 15, 16, 33, 47, 60, 63};
  const int m[8] = {63, 2, 17, 31, 0, 48, 5, 40};
  block_q4_K b;
  b.d = f32_to_f16(0.5f);
  b.dmin = f32_to_f16(0.125f);
  pack_k_scales(sc, m, b.scales);
  int q[256];
  for (int e = 0; e < 256; ++e) q[e] = (e * 7 + 3) % 16;
  // element e: chunk c = e/64 bytes qs[32c .. 32c+31]; low nibble for e%64 < 32
  std::memset(b.qs, 0, sizeof(b.qs));
  for (int e = 0; e < 256; ++e) {
    const int c = e / 64, l = e % 32;
    b.qs[32 * c + l] |= static_cast<uint8_t>((e % 64) < 32 ? q[e] : q[e] << 4);
  }
  float y[256];
  dequantize_row_q4_K(&b, y, 256);
  for (int e = 0; e < 256; ++e) EXPECT_EQ(y[e], 0.5f * sc[e / 32] * q[e] - 0.125f * m[e / 32]) << e;
}

TEST(Quants, Q5_KHandDecoded) {
  const int sc[8] = {63, 16, 1, 31, 17, 2, 58, 40};
  const int m[8] = {0, 1, 62, 15, 16, 33, 9, 63};
  block_q5_K b;
  b.d = f32_to_f16(0.25f);
  b.dmin = f32_to_f16(0.5f);
  pack_k_scales(sc, m, b.scales);
  int q[256];
  for (int e = 0; e < 256; ++e) q[e] = (e * 13 + 5) % 32;
  std::memset(b.qs, 0, sizeof(b.qs));
  std::memset(b.qh, 0, sizeof(b.qh));
  for (int e = 0; e < 256; ++e) {
    const int c = e / 64, l = e % 32, hi = (e % 64) >= 32;
    b.qs[32 * c + l] |= static_cast<uint8_t>(hi ? (q[e] & 15) << 4 : (q[e] & 15));
    if (q[e] & 16) b.qh[l] |= static_cast<uint8_t>(1 << (2 * c + hi));
  }
  float y[256];
  dequantize_row_q5_K(&b, y, 256);
  for (int e = 0; e < 256; ++e) EXPECT_EQ(y[e], 0.25f * sc[e / 32] * q[e] - 0.5f * m[e / 32]) << e;
}

TEST(Quants, Q6_KHandDecoded) {
  block_q6_K b;
  b.d = f32_to_f16(0.0625f);
  int8_t sc[16];
  for (int g = 0; g < 16; ++g) sc[g] = static_cast<int8_t>(g * 17 - 128);  // -128 .. 127
  std::memcpy(b.scales, sc, 16);
  int q[256];  // q in [-32, 31]
  for (int e = 0; e < 256; ++e) q[e] = (e * 11 + 7) % 64 - 32;
  std::memset(b.ql, 0, sizeof(b.ql));
  std::memset(b.qh, 0, sizeof(b.qh));
  for (int e = 0; e < 256; ++e) {
    const int u = q[e] + 32;
    const int h = e / 128, k = (e % 128) / 32, l = e % 32;
    uint8_t* ql = b.ql + 64 * h;
    uint8_t* qh = b.qh + 32 * h;
    const int byte = (k & 1) ? 32 + l : l;
    ql[byte] |= static_cast<uint8_t>((k & 2) ? (u & 15) << 4 : (u & 15));
    qh[l] |= static_cast<uint8_t>((u >> 4) << (2 * k));
  }
  float y[256];
  dequantize_row_q6_K(&b, y, 256);
  for (int e = 0; e < 256; ++e) EXPECT_EQ(y[e], 0.0625f * sc[e / 16] * q[e]) << e;
}

double rel_rmse(const std::vector<float>& a, const std::vector<float>& b) {
  double num = 0, den = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    num += (a[i] - b[i]) * static_cast<double>(a[i] - b[i]);
    den += a[i] * static_cast<double>(a[i]);
  }
  return std::sqrt(num / den);
}

TEST(Quants, RoundTripBlock32Types) {
  const int64_t n = 32 * 64;
  auto x = gaussian(n, 11, 0.7f);
  x[5] = 0.0f;
  for (int j = 32; j < 64; ++j) x[j] = 0.0f;  // an all-zero block
  std::vector<float> y(n);
  {  // Q8_0: |err| <= d/2 + 127 * |d - f16(d)|  (~0.56 d), d = amax / 127
    std::vector<block_q8_0> q(n / 32);
    quantize_row_q8_0(x.data(), q.data(), n);
    dequantize_row_q8_0(q.data(), y.data(), n);
    for (int64_t b = 0; b < n / 32; ++b) {
      float amax = 0;
      for (int j = 0; j < 32; ++j) amax = std::max(amax, std::fabs(x[32 * b + j]));
      for (int j = 0; j < 32; ++j) EXPECT_LE(std::fabs(x[32 * b + j] - y[32 * b + j]), 0.57f * amax / 127 + 1e-30f);
    }
  }
  {  // Q4_0: levels d * (q - 8), d = amax / 8; worst case at the far end 1 step
    std::vector<block_q4_0> q(n / 32);
    quantize_row_q4_0(x.data(), q.data(), n);
    dequantize_row_q4_0(q.data(), y.data(), n);
    for (int64_t b = 0; b < n / 32; ++b) {
      float amax = 0;
      for (int j = 0; j < 32; ++j) amax = std::max(amax, std::fabs(x[32 * b + j]));
      for (int j = 0; j < 32; ++j) EXPECT_LE(std::fabs(x[32 * b + j] - y[32 * b + j]), 1.01f * amax / 8 + 1e-30f);
    }
    EXPECT_LT(rel_rmse(x, y), 0.12);
  }
  {  // Q5_0: levels d * (q - 16), |d| = amax / 16; worst case at the clamped end 1 step
    std::vector<block_q5_0> q(n / 32);
    quantize_row_q5_0(x.data(), q.data(), n);
    dequantize_row_q5_0(q.data(), y.data(), n);
    for (int64_t b = 0; b < n / 32; ++b) {
      float amax = 0;
      for (int j = 0; j < 32; ++j) amax = std::max(amax, std::fabs(x[32 * b + j]));
      for (int j = 0; j < 32; ++j) EXPECT_LE(std::fabs(x[32 * b + j] - y[32 * b + j]), 1.01f * amax / 16 + 1e-30f);
    }
    for (int j = 32; j < 64; ++j) EXPECT_EQ(y[j], 0.0f);
    EXPECT_LT(rel_rmse(x, y), 0.06);
  }
  {  // Q5_1: d = (max - min) / 31, m = min; |err| <= d/2 + f16 rounding of d (x31) and of m
    std::vector<block_q5_1> q(n / 32);
    quantize_row_q5_1(x.data(), q.data(), n);
    dequantize_row_q5_1(q.data(), y.data(), n);
    for (int64_t b = 0; b < n / 32; ++b) {
      float mn = x[32 * b], mx = x[32 * b];
      for (int j = 0; j < 32; ++j) mn = std::min(mn, x[32 * b + j]), mx = std::max(mx, x[32 * b + j]);
      const float d = (mx - mn) / 31;
      for (int j = 0; j < 32; ++j)
        EXPECT_LE(std::fabs(x[32 * b + j] - y[32 * b + j]), 0.52f * d + 0.0005f * std::fabs(mn) + 1e-30f) << b << " " << j;
    }
    for (int j = 32; j < 64; ++j) EXPECT_EQ(y[j], 0.0f);
    EXPECT_LT(rel_rmse(x, y), 0.04);
  }
  {  // MXFP4: scale 2^(floor(log2 amax) - 2); worst error half the top spacing or the clip
    std::vector<block_mxfp4> q(n / 32);
    quantize_row_mxfp4(x.data(), q.data(), n);
    dequantize_row_mxfp4(q.data(), y.data(), n);
    for (int64_t b = 0; b < n / 32; ++b) {
      float amax = 0;
      for (int j = 0; j < 32; ++j) amax = std::max(amax, std::fabs(x[32 * b + j]));
      const float p2 = amax > 0 ? std::exp2(std::floor(std::log2(amax))) : 0.0f;
      for (int j = 0; j < 32; ++j) EXPECT_LE(std::fabs(x[32 * b + j] - y[32 * b + j]), 0.5f * p2) << b << " " << j;
    }
    EXPECT_LT(rel_rmse(x, y), 0.2);
  }
}

TEST(Quants, RoundTripKQuants) {
  const int64_t n = 256 * 16;
  auto x = gaussian(n, 21, 0.05f);
  for (int j = 256; j < 512; ++j) x[j] = 0.0f;       // all-zero super-block
  for (int j = 512; j < 768; ++j) x[j] = 0.5f + x[j];  // all-positive super-block (min 0 path)
  std::vector<float> y(n);
  auto check_zero_block = [&](const char* what) {
    for (int j = 256; j < 512; ++j) ASSERT_EQ(y[j], 0.0f) << what << " " << j;
  };
  {
    std::vector<block_q4_K> q(n / 256);
    quantize_row_q4_K(x.data(), q.data(), n);
    dequantize_row_q4_K(q.data(), y.data(), n);
    check_zero_block("q4_K");
    EXPECT_LT(rel_rmse(x, y), 0.10);
  }
  {
    std::vector<block_q5_K> q(n / 256);
    quantize_row_q5_K(x.data(), q.data(), n);
    dequantize_row_q5_K(q.data(), y.data(), n);
    check_zero_block("q5_K");
    EXPECT_LT(rel_rmse(x, y), 0.05);
  }
  {
    std::vector<block_q6_K> q(n / 256);
    quantize_row_q6_K(x.data(), q.data(), n);
    dequantize_row_q6_K(q.data(), y.data(), n);
    check_zero_block("q6_K");
    EXPECT_LT(rel_rmse(x, y), 0.03);
  }
  {  // Q8_K: d = M / -127, |err| <= d/2 per element
    std::vector<block_q8_K> q(n / 256);
    quantize_row_q8_K(x.data(), q.data(), n);
    dequantize_row_q8_K(q.data(), y.data(), n);
    check_zero_block("q8_K");
    for (int64_t b = 0; b < n / 256; ++b) {
      float amax = 0;
      for (int j = 0; j < 256; ++j) amax = std::max(amax, std::fabs(x[256 * b + j]));
      for (int j = 0; j < 256; ++j) EXPECT_LE(std::fabs(x[256 * b + j] - y[256 * b + j]), 0.501f * amax / 127 + 1e-30f);
      for (int g = 0; g < 16; ++g) {
        int s = 0;
        for (int j = 0; j < 16; ++j) s += q[b].qs[16 * g + j];
        EXPECT_EQ(q[b].bsums[g], s);
      }
    }
  }
}

TEST(Quants, GenericEntryPointsAndErrors) {
  auto x = gaussian(256, 5);
  std::vector<uint8_t> buf(row_bytes(GgmlType::Q6_K, 256));
  std::vector<float> a(256), b(256);
  for (GgmlType t : {GgmlType::F32, GgmlType::F16, GgmlType::BF16, GgmlType::Q8_0, GgmlType::Q4_0, GgmlType::Q5_0,
                     GgmlType::Q5_1, GgmlType::MXFP4, GgmlType::Q4_K, GgmlType::Q5_K, GgmlType::Q6_K}) {
    ASSERT_TRUE(can_quantize(t));
    buf.assign(row_bytes(t, 256), 0);
    quantize_row(t, x.data(), buf.data(), 256);
    dequantize_row(t, buf.data(), a.data(), 256);
    EXPECT_LT(rel_rmse(x, a), 0.2) << type_name(t);
  }
  EXPECT_FALSE(can_quantize(GgmlType::IQ2_XXS));
  EXPECT_THROW(quantize_row(GgmlType::IQ2_XXS, x.data(), buf.data(), 256), kimi::Error);
  EXPECT_THROW(quantize_row_q8_0(x.data(), reinterpret_cast<block_q8_0*>(buf.data()), 33), kimi::Error);
  EXPECT_THROW(quantize_row(GgmlType::Q5_0, x.data(), buf.data(), 48), kimi::Error);
  EXPECT_THROW(dequantize_row(GgmlType::Q5_1, buf.data(), b.data(), 40), kimi::Error);
  EXPECT_THROW(dequantize_row(GgmlType::Q4_K, buf.data(), b.data(), 100), kimi::Error);
}

}  // namespace
