// Q2_K, Q3_K, IQ4_XS, IQ2_XS (tensor/quants.h): decode of golden super-blocks packed by an
// independent Python script from the format definition (tests/data/quants/make_lowbit_golden.py),
// bit-exact decode of random blocks against a float64 decoder written here from
// formats-quant.md §4.4 / §4.6, the IQ2_XS codebook against ggml's packed entries, and quantizer
// round trips (error bounds; the importance-weighted error drops with an importance vector).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "tensor/quants.h"
#include "util/error.h"

using namespace kimi;

namespace {

double h16(const uint8_t* p) { return f16_to_f32(static_cast<uint16_t>(p[0] | (p[1] << 8))); }

// ---- float64 reference decoders, straight from the byte layouts ----
double ref_q2_K(const uint8_t* b, int e) {
  const int q = (b[16 + 32 * (e / 128) + e % 32] >> (2 * ((e % 128) / 32))) & 3;
  const int sc = b[e / 16];
  return h16(b + 80) * (sc & 15) * q - h16(b + 82) * (sc >> 4);
}
double ref_q3_K(const uint8_t* b, int e) {
  const int low = (b[32 + 32 * (e / 128) + e % 32] >> (2 * ((e % 128) / 32))) & 3;
  const int hb = (b[e % 32] >> (e / 32)) & 1;
  const int t = e / 16;
  const uint8_t* sc = b + 96;
  const int s = (t < 8 ? (sc[t] & 15) : (sc[t - 8] >> 4)) | (((sc[8 + t % 4] >> (2 * (t / 4))) & 3) << 4);
  return h16(b + 108) * (s - 32) * (low - (hb ? 0 : 4));
}
const int kT[16] = {-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113};
double ref_iq4_xs(const uint8_t* b, int e) {
  const int ib = e / 32, j = e % 32;
  const int sh = b[2] | (b[3] << 8);
  const int ls = ((b[4 + ib / 2] >> (4 * (ib % 2))) & 15) | (((sh >> (2 * ib)) & 3) << 4);
  const uint8_t q = b[8 + 16 * ib + j % 16];
  return h16(b) * (ls - 32) * kT[j < 16 ? (q & 15) : (q >> 4)];
}
double ref_iq2_xs(const uint8_t* b, int e) {
  const int g = e / 8, i = e % 8;
  const int q = b[2 + 2 * g] | (b[3 + 2 * g] << 8);
  const int s7 = q >> 9;
  const int neg = i < 7 ? (s7 >> i) & 1 : __builtin_popcount(s7) & 1;  // even count of negatives
  const int lvl = (kIq2xsGrid[q & 511] >> (2 * i)) & 3;
  const int mag = lvl == 0 ? 8 : lvl == 1 ? 25 : 43;
  const int s4 = (b[66 + e / 32] >> (4 * ((e % 32) / 16))) & 15;
  return h16(b) * (2 * s4 + 1) / 8.0 * mag * (neg ? -1 : 1);
}

struct TypeCase {
  GgmlType t;
  double (*ref)(const uint8_t*, int);
  std::vector<int> f16_offsets;  // the block's f16 scale fields
  double max_rel_rmse;           // quantizer bound on N(0, 1) data (measured + margin)
};
const TypeCase kCases[] = {
    {GgmlType::Q2_K, ref_q2_K, {80, 82}, 0.29},
    {GgmlType::Q3_K, ref_q3_K, {108}, 0.16},
    {GgmlType::IQ4_XS, ref_iq4_xs, {0}, 0.085},
    {GgmlType::IQ2_XS, ref_iq2_xs, {0}, 0.31},
};

std::vector<float> gaussian(int64_t n, unsigned seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::vector<float> v(static_cast<size_t>(n));
  for (auto& x : v) x = nd(rng);
  return v;
}

TEST(LowBit, BlockSizesMatchTypeTraits) {
  EXPECT_EQ(sizeof(block_q2_K), traits(GgmlType::Q2_K).bytes);
  EXPECT_EQ(sizeof(block_q3_K), traits(GgmlType::Q3_K).bytes);
  EXPECT_EQ(sizeof(block_iq4_xs), traits(GgmlType::IQ4_XS).bytes);
  EXPECT_EQ(sizeof(block_iq2_xs), traits(GgmlType::IQ2_XS).bytes);
  EXPECT_EQ(static_cast<uint32_t>(GgmlType::Q2_K), 10u);
  EXPECT_EQ(static_cast<uint32_t>(GgmlType::Q3_K), 11u);
  EXPECT_EQ(static_cast<uint32_t>(GgmlType::IQ2_XS), 17u);
  EXPECT_EQ(static_cast<uint32_t>(GgmlType::IQ4_XS), 23u);
}

// ggml-common.h iq2xs_grid[0..13] and ksigns_iq2xs[0..7]
TEST(LowBit, Iq2xsCodebookMatchesGgmlEntries) {
  const uint64_t want[14] = {0x0808080808080808ull, 0x080808080808082bull, 0x0808080808081919ull, 0x0808080808082b08ull,
                             0x0808080808082b2bull, 0x0808080808190819ull, 0x0808080808191908ull, 0x080808080819192bull,
                             0x0808080808192b19ull, 0x08080808082b0808ull, 0x08080808082b082bull, 0x08080808082b1919ull,
                             0x08080808082b2b08ull, 0x0808080819080819ull};
  for (int k = 0; k < 14; ++k) EXPECT_EQ(iq2xs_grid_u64(k), want[k]) << k;
  const uint8_t ks[8] = {0, 129, 130, 3, 132, 5, 6, 135};
  for (int i = 0; i < 8; ++i) EXPECT_EQ(iq2_ksigns(i), ks[i]) << i;
  // the 512 entries are distinct and use levels 0..2 only
  for (int k = 0; k < 512; ++k) {
    for (int i = 0; i < 8; ++i) ASSERT_LT((kIq2xsGrid[k] >> (2 * i)) & 3, 3);
    if (k) {
      ASSERT_LT(kIq2xsGrid[k - 1], kIq2xsGrid[k]);
    }
  }
}

TEST(LowBit, GoldenBlocksDecode) {
  std::ifstream f(std::string(KIMI_TEST_DATA) + "/quants/lowbit_golden.txt");
  ASSERT_TRUE(f.good());
  std::string line;
  int seen = 0;
  while (std::getline(f, line)) {
    std::istringstream hs(line);
    std::string name, hex;
    hs >> name >> hex;
    std::string vline;
    ASSERT_TRUE(std::getline(f, vline));
    auto t = type_from_name(name);
    ASSERT_TRUE(t.has_value()) << name;
    std::vector<uint8_t> bytes(hex.size() / 2);
    for (size_t i = 0; i < bytes.size(); ++i) bytes[i] = static_cast<uint8_t>(std::stoi(hex.substr(2 * i, 2), nullptr, 16));
    ASSERT_EQ(bytes.size(), traits(*t).bytes) << name;
    std::istringstream vs(vline);
    std::string n2;
    vs >> n2;
    std::vector<float> y(256);
    dequantize_row(*t, bytes.data(), y.data(), 256);
    for (int e = 0; e < 256; ++e) {
      double v;
      vs >> v;
      ASSERT_EQ(y[static_cast<size_t>(e)], static_cast<float>(v)) << name << " element " << e;
    }
    ++seen;
  }
  EXPECT_EQ(seen, 4);
}

TEST(LowBit, RandomBlocksDecodeExactly) {
  std::mt19937 rng(7);
  for (const auto& c : kCases) {
    const uint32_t bb = traits(c.t).bytes;
    const int nblk = 500;
    std::vector<uint8_t> buf(bb * nblk);
    for (auto& v : buf) v = static_cast<uint8_t>(rng());
    for (int b = 0; b < nblk; ++b)
      for (int off : c.f16_offsets) {  // finite f16 scales, both signs, normal and subnormal
        uint16_t h = static_cast<uint16_t>(rng());
        if ((h & 0x7c00u) == 0x7c00u) h &= 0xbfff;
        std::memcpy(&buf[b * bb + off], &h, 2);
      }
    std::vector<float> y(256 * nblk);
    dequantize_row(c.t, buf.data(), y.data(), 256 * nblk);
    for (int b = 0; b < nblk; ++b)
      for (int e = 0; e < 256; ++e) {
        const double r = c.ref(&buf[b * bb], e);
        ASSERT_EQ(y[b * 256 + e], static_cast<float>(r)) << type_name(c.t) << " block " << b << " element " << e;
      }
  }
}

TEST(LowBit, QuantizeRoundTripAndImatrix) {
  const int64_t n = 256 * 32;
  const auto x = gaussian(n, 11);
  std::vector<float> qw(n);
  std::mt19937 rng(3);
  for (auto& w : qw) w = (rng() % 8 == 0) ? 40.0f : 1.0f;  // a few columns matter much more
  for (const auto& c : kCases) {
    std::vector<uint8_t> q(row_bytes(c.t, n));
    std::vector<float> y(n);
    double wer[2];
    for (int k = 0; k < 2; ++k) {
      quantize_row_imat(c.t, x.data(), q.data(), n, k ? qw.data() : nullptr);
      dequantize_row(c.t, q.data(), y.data(), n);
      double e = 0, s = 0, ew = 0;
      for (int64_t i = 0; i < n; ++i) {
        const double d = y[i] - x[i];
        e += d * d;
        s += static_cast<double>(x[i]) * x[i];
        ew += qw[i] * d * d;
      }
      if (k == 0) {
        EXPECT_LT(std::sqrt(e / s), c.max_rel_rmse) << type_name(c.t);
      }
      wer[k] = ew;
    }
    EXPECT_TRUE(uses_imatrix(c.t));
    // the importance-weighted error drops by at least a quarter with the importances
    EXPECT_LT(wer[1], 0.75 * wer[0]) << type_name(c.t);
  }
}

// The importance weights are the importances themselves (the expected squared activation of each
// column, so a row's weighted squared error is the expected squared error of its matmul output),
// with a floor of 1e-4 of the mean; none for a null or all-zero row.
TEST(LowBit, ImatrixElementWeights) {
  float qw[4] = {4.0f, 0.0f, -1.0f, 8.0f}, w[4];
  ASSERT_TRUE(imatrix_element_weights(qw, 4, w));
  const float fl = 1e-4f * 12.0f / 4.0f;
  EXPECT_FLOAT_EQ(w[0], 4.0f + fl);
  EXPECT_FLOAT_EQ(w[1], fl);
  EXPECT_FLOAT_EQ(w[2], fl) << "negative importances count as zero";
  EXPECT_FLOAT_EQ(w[3], 8.0f + fl);
  const float zero[4] = {0, 0, 0, 0};
  EXPECT_FALSE(imatrix_element_weights(zero, 4, w));
  EXPECT_FALSE(imatrix_element_weights(nullptr, 4, w));
}

// Weakly structured importances (every column within about +-25 % of the mean, the spread of the
// synthetic models' attention inputs): the error the importances measure still drops for every
// type, high-bit K-quants included. The measure is evaluated with the same importances the
// quantizer saw; its expected value over the data is what a matmul's output error is.
TEST(LowBit, WeakImportanceStillLowersWeightedError) {
  const int64_t n = 256 * 64;
  const auto x = gaussian(n, 21);
  std::vector<float> qw(n);
  std::mt19937 rng(5);
  std::normal_distribution<float> nd(0.0f, 0.25f);
  for (auto& w : qw) w = std::max(0.2f, 1.0f + nd(rng));
  for (GgmlType t : {GgmlType::Q2_K, GgmlType::Q3_K, GgmlType::IQ4_XS, GgmlType::IQ2_XS, GgmlType::Q4_K,
                     GgmlType::Q5_K, GgmlType::Q6_K}) {
    std::vector<uint8_t> q(row_bytes(t, n));
    std::vector<float> y(n);
    double wer[2];
    for (int k = 0; k < 2; ++k) {
      quantize_row_imat(t, x.data(), q.data(), n, k ? qw.data() : nullptr);
      dequantize_row(t, q.data(), y.data(), n);
      double ew = 0;
      for (int64_t i = 0; i < n; ++i) ew += qw[i] * (y[i] - x[i]) * (y[i] - x[i]);
      wer[k] = ew;
    }
    std::printf("%-6s weighted error with / without the importances: %.4f\n", type_name(t), wer[1] / wer[0]);
    EXPECT_LT(wer[1], 0.99 * wer[0]) << type_name(t);  // measured 0.94 (Q6_K) .. 0.983 (Q5_K)
  }
}

TEST(LowBit, ZeroAndTinyBlocks) {
  std::vector<float> x(256, 0.0f), y(256, 1.0f);
  for (const auto& c : kCases) {
    std::vector<uint8_t> q(traits(c.t).bytes);
    quantize_row(c.t, x.data(), q.data(), 256);
    dequantize_row(c.t, q.data(), y.data(), 256);
    for (float v : y) ASSERT_EQ(v, 0.0f) << type_name(c.t);
    // one non-zero element survives with its sign
    x[37] = -3.0f;
    quantize_row(c.t, x.data(), q.data(), 256);
    dequantize_row(c.t, q.data(), y.data(), 256);
    EXPECT_LT(y[37], -1.0f) << type_name(c.t);
    x[37] = 0.0f;
  }
}

TEST(LowBit, BadInputs) {
  std::vector<float> x(100);
  std::vector<uint8_t> q(1000);
  EXPECT_THROW(quantize_row(GgmlType::Q2_K, x.data(), q.data(), 100), Error);
  EXPECT_THROW(dequantize_row(GgmlType::IQ2_XS, q.data(), x.data(), 100), Error);
  // validation: an inf / NaN scale is reported with the block index
  std::vector<uint8_t> blk(2 * 136, 0);
  std::string why;
  EXPECT_TRUE(validate_row(GgmlType::IQ4_XS, blk.data(), 512, &why));
  blk[136] = 0x00;
  blk[137] = 0x7e;  // block 1: d = NaN
  EXPECT_FALSE(validate_row(GgmlType::IQ4_XS, blk.data(), 512, &why));
  EXPECT_NE(why.find("block 1"), std::string::npos) << why;
}

}  // namespace
