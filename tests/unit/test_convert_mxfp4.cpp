// MXFP4 repack compressed-tensors -> ggml block_mxfp4 (formats-quant.md §3.5): byte-for-byte on the
// worked example of §3.7, and value-for-value on random rows against a scalar E2M1 x E8M0 decode.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

#include "convert/transforms.h"

using kimi::convert::repack_mxfp4_row;

namespace {
// OCP E2M1 values of the 16 codes (formats-quant.md §3.1)
const double kE2M1[16] = {0, 0.5, 1, 1.5, 2, 3, 4, 6, -0.0, -0.5, -1, -1.5, -2, -3, -4, -6};

// source side: element k of a compressed-tensors row = E2M1(code) * 2^(scale - 127)
double decode_ct(const uint8_t* packed, const uint8_t* scales, int64_t k) {
  uint8_t b = packed[k / 2];
  int code = (k % 2 == 0) ? (b & 15) : (b >> 4);
  return kE2M1[code] * std::ldexp(1.0, scales[k / 32] - 127);
}

// ggml side: kvalues (doubled E2M1) * 2^(e - 128); low nibble of qs[j] = element j, high = j+16
double decode_ggml(const uint8_t* blocks, int64_t k) {
  static const int kv[16] = {0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12};
  const uint8_t* blk = blocks + (k / 32) * 17;
  int j = static_cast<int>(k % 32);
  int code = j < 16 ? (blk[1 + j] & 15) : (blk[1 + j - 16] >> 4);
  return kv[code] * std::ldexp(1.0, blk[0] - 128);
}
}  // namespace

TEST(ConvertMxfp4, WorkedExampleBytes) {
  const uint8_t packed[16] = {0x10, 0x32, 0x54, 0x76, 0x98, 0xBA, 0xDC, 0xFE,
                              0xEF, 0xCD, 0xAB, 0x89, 0x67, 0x45, 0x23, 0x01};
  const uint8_t scale[1] = {0x7E};
  const uint8_t want[17] = {0x7E, 0xF0, 0xE1, 0xD2, 0xC3, 0xB4, 0xA5, 0x96, 0x87,
                            0x78, 0x69, 0x5A, 0x4B, 0x3C, 0x2D, 0x1E, 0x0F};
  uint8_t out[17] = {};
  repack_mxfp4_row(packed, scale, 1, out);
  for (int i = 0; i < 17; ++i) EXPECT_EQ(out[i], want[i]) << "byte " << i;
  // the dequantized values listed in §3.7
  const double first[16] = {0, .25, .5, .75, 1, 1.5, 2, 3, 0, -.25, -.5, -.75, -1, -1.5, -2, -3};
  const double second[16] = {-3, -2, -1.5, -1, -.75, -.5, -.25, 0, 3, 2, 1.5, 1, .75, .5, .25, 0};
  for (int k = 0; k < 16; ++k) {
    EXPECT_EQ(decode_ggml(out, k), first[k]) << k;
    EXPECT_EQ(decode_ggml(out, k + 16), second[k]) << k + 16;
  }
}

TEST(ConvertMxfp4, RandomRowsDecodeIdentically) {
  std::mt19937 rng(1234);
  for (int trial = 0; trial < 200; ++trial) {
    const int64_t ng = 1 + trial % 7;
    std::vector<uint8_t> packed(ng * 16), scales(ng), out(ng * 17, 0xAA);
    for (auto& b : packed) b = static_cast<uint8_t>(rng());
    for (auto& s : scales) s = static_cast<uint8_t>(rng() % 255);  // 0..254 (255 = NaN)
    scales[0] = static_cast<uint8_t>(trial % 3);                    // include e = 0, 1, 2 edge cases
    repack_mxfp4_row(packed.data(), scales.data(), ng, out.data());
    for (int64_t k = 0; k < ng * 32; ++k) {
      double a = decode_ct(packed.data(), scales.data(), k), b = decode_ggml(out.data(), k);
      ASSERT_EQ(a, b) << "trial " << trial << " element " << k;
    }
    // codes are moved, never changed: the multiset of nibbles per block is preserved
    for (int64_t g = 0; g < ng; ++g) {
      int hist_src[16] = {}, hist_dst[16] = {};
      for (int i = 0; i < 16; ++i) {
        ++hist_src[packed[g * 16 + i] & 15], ++hist_src[packed[g * 16 + i] >> 4];
        ++hist_dst[out[g * 17 + 1 + i] & 15], ++hist_dst[out[g * 17 + 1 + i] >> 4];
      }
      for (int c = 0; c < 16; ++c) ASSERT_EQ(hist_src[c], hist_dst[c]);
      ASSERT_EQ(out[g * 17], scales[g]);
    }
  }
}
