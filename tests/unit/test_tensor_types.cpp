// Scalar type conversions and type traits (tensor/types.h) against independent references built
// from the IEEE definitions with ldexp/frexp/rint in double precision.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "tensor/types.h"
#include "util/error.h"

using namespace kimi;

namespace {

uint32_t bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}
float from_bits(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

// binary16 value of bit pattern h, from the definition: (-1)^s * 2^(e-15) * 1.m, subnormals
// 2^-14 * 0.m, e = 31 -> inf / nan.
double ref_f16_value(uint16_t h) {
  const int s = h >> 15, e = (h >> 10) & 31, m = h & 1023;
  double v;
  if (e == 0)
    v = std::ldexp(static_cast<double>(m), -24);
  else if (e == 31)
    v = m ? std::numeric_limits<double>::quiet_NaN() : std::numeric_limits<double>::infinity();
  else
    v = std::ldexp(static_cast<double>(1024 + m), e - 25);
  return s ? -v : v;
}

// f32 -> f16 bits, round to nearest even, overflow to inf, computed with double arithmetic.
uint16_t ref_f32_to_f16(float x) {
  const uint16_t sign = std::signbit(x) ? 0x8000 : 0;
  const double a = std::fabs(static_cast<double>(x));
  if (std::isnan(x)) return sign | 0x7e00;
  if (a >= 65520.0) return sign | 0x7c00;  // 65504 + half an ulp (32/2) rounds up to 2^16 -> inf
  if (a < std::ldexp(1.0, -14)) {
    const double q = std::rint(a * std::ldexp(1.0, 24));  // multiples of 2^-24; exact, then RNE
    return sign | static_cast<uint16_t>(q);               // q == 1024 is the smallest normal: same bits
  }
  int e;
  std::frexp(a, &e);  // a = f * 2^e, f in [0.5, 1)
  const int E = e - 1;  // a in [2^E, 2^(E+1))
  double m = std::rint(std::ldexp(a, 10 - E));  // 1024..2048
  int EE = E;
  if (m == 2048) {
    m = 1024;
    ++EE;
  }
  if (EE > 15) return sign | 0x7c00;
  return sign | static_cast<uint16_t>(((EE + 15) << 10) | (static_cast<int>(m) - 1024));
}

// f32 -> bf16 value (as double) with RNE, computed with double arithmetic.
double ref_bf16_value(float x) {
  const double a = std::fabs(static_cast<double>(x));
  double q;  // quantum at a
  if (a < std::ldexp(1.0, -126)) {
    q = std::ldexp(1.0, -133);  // float subnormal spacing 2^-149 times 2^16
  } else {
    int e;
    std::frexp(a, &e);
    q = std::ldexp(1.0, e - 1 - 7);
  }
  double r = std::rint(a / q) * q;
  if (r >= std::ldexp(1.0, 128)) r = std::numeric_limits<double>::infinity();
  return std::signbit(x) ? -r : r;
}

std::vector<float> test_floats() {
  std::vector<float> v;
  // a strided sweep over all 2^32 bit patterns
  for (uint64_t u = 0; u < (uint64_t{1} << 32); u += 4099) v.push_back(from_bits(static_cast<uint32_t>(u)));
  // every half value, the midpoints between neighbours and one float ulp either side
  for (uint32_t h = 0; h < 0x7c00; ++h) {
    const float lo = static_cast<float>(ref_f16_value(static_cast<uint16_t>(h)));
    const float hi = static_cast<float>(h + 1 == 0x7c00 ? 65536.0 : ref_f16_value(static_cast<uint16_t>(h + 1)));
    const float mid = static_cast<float>((static_cast<double>(lo) + hi) / 2);  // exact in float
    for (float f : {lo, mid, std::nextafter(mid, 0.0f), std::nextafter(mid, 1e30f)}) {
      v.push_back(f);
      v.push_back(-f);
    }
  }
  // special values and edges
  for (float f : {0.0f, -0.0f, 65504.0f, 65519.99f, 65520.0f, 1e30f, std::numeric_limits<float>::infinity(),
                  std::numeric_limits<float>::denorm_min(), std::numeric_limits<float>::min(),
                  std::numeric_limits<float>::max(), 5.9604644775390625e-8f, 2.98023223876953125e-8f,
                  2.9802326e-8f, 6.1035156e-5f, 6.1032e-5f})
    v.push_back(f), v.push_back(-f);
  return v;
}

}  // namespace

TEST(TensorTypes, F16ToF32Exhaustive) {
  for (uint32_t h = 0; h < 65536; ++h) {
    const float got = f16_to_f32(static_cast<uint16_t>(h));
    const double want = ref_f16_value(static_cast<uint16_t>(h));
    if (std::isnan(want)) {
      ASSERT_TRUE(std::isnan(got)) << std::hex << h;
      ASSERT_EQ(std::signbit(got), (h & 0x8000) != 0) << std::hex << h;
    } else {
      ASSERT_EQ(static_cast<double>(got), want) << std::hex << h;
      ASSERT_EQ(std::signbit(got), (h & 0x8000) != 0) << std::hex << h;  // -0 stays -0
    }
  }
}

TEST(TensorTypes, F32ToF16RoundsToNearestEven) {
  // spot checks of the rules themselves
  EXPECT_EQ(f32_to_f16(1.0f), 0x3c00);
  EXPECT_EQ(f32_to_f16(1.0f + 1.0f / 2048), 0x3c00);          // tie -> even (down)
  EXPECT_EQ(f32_to_f16(1.0f + 3.0f / 2048), 0x3c02);          // tie -> even (up)
  EXPECT_EQ(f32_to_f16(65504.0f), 0x7bff);
  EXPECT_EQ(f32_to_f16(65519.99f), 0x7bff);
  EXPECT_EQ(f32_to_f16(65520.0f), 0x7c00);                    // overflow -> inf
  EXPECT_EQ(f32_to_f16(-1e10f), 0xfc00);
  EXPECT_EQ(f32_to_f16(5.9604644775390625e-8f), 0x0001);      // smallest subnormal
  EXPECT_EQ(f32_to_f16(2.98023223876953125e-8f), 0x0000);     // half of it: tie -> even (0)
  EXPECT_EQ(f32_to_f16(2.9802326e-8f), 0x0001);               // just above the tie
  EXPECT_EQ(f32_to_f16(-0.0f), 0x8000);
  EXPECT_EQ(f32_to_f16(std::numeric_limits<float>::infinity()), 0x7c00);
  const uint16_t nan = f32_to_f16(std::numeric_limits<float>::quiet_NaN());
  EXPECT_EQ(nan & 0x7c00, 0x7c00);
  EXPECT_NE(nan & 0x03ff, 0);

  size_t n = 0;
  for (float f : test_floats()) {
    if (std::isnan(f)) {
      const uint16_t h = f32_to_f16(f);
      ASSERT_TRUE((h & 0x7c00) == 0x7c00 && (h & 0x3ff) != 0) << std::hex << bits(f);
      continue;
    }
    ASSERT_EQ(f32_to_f16(f), ref_f32_to_f16(f)) << "x = " << f << " bits 0x" << std::hex << bits(f);
    ++n;
  }
  EXPECT_GT(n, 1000000u);
  // every half survives a round trip
  for (uint32_t h = 0; h < 65536; ++h) {
    if ((h & 0x7c00) == 0x7c00 && (h & 0x3ff)) continue;  // nan payloads are not preserved
    ASSERT_EQ(f32_to_f16(f16_to_f32(static_cast<uint16_t>(h))), h) << std::hex << h;
  }
}

TEST(TensorTypes, Bf16Rounding) {
  EXPECT_EQ(f32_to_bf16(1.0f), 0x3f80);
  EXPECT_EQ(f32_to_bf16(from_bits(0x3f808000)), 0x3f80);  // tie -> even (down)
  EXPECT_EQ(f32_to_bf16(from_bits(0x3f818000)), 0x3f82);  // tie -> even (up)
  EXPECT_EQ(f32_to_bf16(from_bits(0x3f808001)), 0x3f81);
  EXPECT_EQ(f32_to_bf16(std::numeric_limits<float>::max()), 0x7f80);  // rounds to inf
  EXPECT_EQ(f32_to_bf16(-std::numeric_limits<float>::infinity()), 0xff80);
  const uint16_t nan = f32_to_bf16(from_bits(0x7f800001));  // signalling nan stays nan
  EXPECT_TRUE((nan & 0x7f80) == 0x7f80 && (nan & 0x7f) != 0);
  for (uint32_t h = 0; h < 65536; ++h) {
    const float f = bf16_to_f32(static_cast<uint16_t>(h));
    ASSERT_EQ(bits(f), h << 16);
    if (!std::isnan(f)) {
      ASSERT_EQ(f32_to_bf16(f), h);
    }
  }
  for (float f : test_floats()) {
    const uint16_t b = f32_to_bf16(f);
    if (std::isnan(f)) {
      ASSERT_TRUE(std::isnan(bf16_to_f32(b)));
      continue;
    }
    const double got = bf16_to_f32(b);
    const double want = ref_bf16_value(f);
    ASSERT_EQ(got, want) << "x = " << f << " bits 0x" << std::hex << bits(f);
    ASSERT_EQ(std::signbit(got), std::signbit(f));
  }
}

TEST(TensorTypes, E8M0Values) {
  for (int e = 0; e < 255; ++e) {
    ASSERT_EQ(static_cast<double>(e8m0_to_f32(static_cast<uint8_t>(e))), std::ldexp(1.0, e - 127)) << e;
    ASSERT_EQ(static_cast<double>(e8m0_to_f32_half(static_cast<uint8_t>(e))), std::ldexp(1.0, e - 128)) << e;
  }
  EXPECT_TRUE(std::isnan(e8m0_to_f32(255)));
  EXPECT_TRUE(std::isnan(e8m0_to_f32_half(255)));
  EXPECT_EQ(e8m0_to_f32(127), 1.0f);
  EXPECT_EQ(e8m0_to_f32(0), std::ldexp(1.0f, -127));
}

TEST(TensorTypes, TraitsAndRowBytes) {
  // formats-quant.md §4.1
  struct Row {
    GgmlType t;
    const char* name;
    uint32_t block, bytes;
  };
  const Row rows[] = {{GgmlType::F32, "F32", 1, 4},     {GgmlType::F16, "F16", 1, 2},
                      {GgmlType::Q4_0, "Q4_0", 32, 18}, {GgmlType::Q8_0, "Q8_0", 32, 34},
                      {GgmlType::Q4_K, "Q4_K", 256, 144}, {GgmlType::Q6_K, "Q6_K", 256, 210},
                      {GgmlType::IQ4_XS, "IQ4_XS", 256, 136}, {GgmlType::BF16, "BF16", 1, 2},
                      {GgmlType::TQ2_0, "TQ2_0", 256, 66}, {GgmlType::MXFP4, "MXFP4", 32, 17}};
  for (const auto& r : rows) {
    const auto& tr = traits(r.t);
    EXPECT_STREQ(tr.name, r.name);
    EXPECT_EQ(tr.block, r.block);
    EXPECT_EQ(tr.bytes, r.bytes);
    EXPECT_EQ(row_bytes(r.t, 4096), 4096 / r.block * r.bytes);
    EXPECT_EQ(type_from_name(r.name), r.t);
  }
  EXPECT_EQ(type_from_name("mxfp4"), GgmlType::MXFP4);
  EXPECT_EQ(type_from_name("q8_0"), GgmlType::Q8_0);
  EXPECT_FALSE(type_from_name("Q4_2").has_value());
  for (uint32_t id : {4u, 5u, 31u, 32u, 33u, 36u, 37u, 38u, 43u, 1000u}) EXPECT_FALSE(type_traits(id).has_value()) << id;
  EXPECT_THROW(traits(static_cast<GgmlType>(4)), kimi::Error);
  EXPECT_THROW(row_bytes(GgmlType::Q8_0, 33), kimi::Error);
  EXPECT_THROW(row_bytes(GgmlType::Q4_K, 128), kimi::Error);
  EXPECT_THROW(row_bytes(GgmlType::MXFP4, 16), kimi::Error);
  EXPECT_THROW(row_bytes(static_cast<GgmlType>(5), 32), kimi::Error);
  EXPECT_EQ(row_bytes(GgmlType::Q8_0, 0), 0u);
  try {
    row_bytes(GgmlType::Q8_0, 33);
  } catch (const kimi::Error& e) {
    EXPECT_NE(std::string(e.what()).find("Q8_0"), std::string::npos) << e.what();
  }
}
