#include "tensor/types.h"

#include <cctype>
#include <cmath>

#include "util/error.h"

namespace kimi {

namespace {
struct Entry {
  uint32_t id;
  TypeTraits t;
};
constexpr Entry kTypes[] = {
    {0, {"F32", 1, 4}},       {1, {"F16", 1, 2}},        {2, {"Q4_0", 32, 18}},    {3, {"Q4_1", 32, 20}},
    {6, {"Q5_0", 32, 22}},    {7, {"Q5_1", 32, 24}},     {8, {"Q8_0", 32, 34}},    {9, {"Q8_1", 32, 36}},
    {10, {"Q2_K", 256, 84}},  {11, {"Q3_K", 256, 110}},  {12, {"Q4_K", 256, 144}}, {13, {"Q5_K", 256, 176}},
    {14, {"Q6_K", 256, 210}}, {15, {"Q8_K", 256, 292}},  {16, {"IQ2_XXS", 256, 66}}, {17, {"IQ2_XS", 256, 74}},
    {18, {"IQ3_XXS", 256, 98}}, {19, {"IQ1_S", 256, 50}}, {20, {"IQ4_NL", 32, 18}}, {21, {"IQ3_S", 256, 110}},
    {22, {"IQ2_S", 256, 82}}, {23, {"IQ4_XS", 256, 136}}, {24, {"I8", 1, 1}},       {25, {"I16", 1, 2}},
    {26, {"I32", 1, 4}},      {27, {"I64", 1, 8}},       {28, {"F64", 1, 8}},      {29, {"IQ1_M", 256, 56}},
    {30, {"BF16", 1, 2}},     {34, {"TQ1_0", 256, 54}},  {35, {"TQ2_0", 256, 66}}, {39, {"MXFP4", 32, 17}},
};
}  // namespace

std::optional<TypeTraits> type_traits(uint32_t id) {
  for (auto& e : kTypes)
    if (e.id == id) return e.t;
  return std::nullopt;
}

const TypeTraits& traits(GgmlType t) {
  for (auto& e : kTypes)
    if (e.id == static_cast<uint32_t>(t)) return e.t;
  fail("unknown ggml type id {}", static_cast<uint32_t>(t));
}

std::optional<GgmlType> type_from_name(std::string_view name) {
  for (auto& e : kTypes) {
    std::string_view n = e.t.name;
    if (n.size() != name.size()) continue;
    bool eq = true;
    for (size_t i = 0; i < n.size() && eq; ++i)
      eq = std::toupper(static_cast<unsigned char>(n[i])) == std::toupper(static_cast<unsigned char>(name[i]));
    if (eq) return static_cast<GgmlType>(e.id);
  }
  return std::nullopt;
}

uint64_t row_bytes(GgmlType t, uint64_t n) {
  const auto& tr = traits(t);
  check(n % tr.block == 0, "row of {} elements is not a multiple of the {} block size {}", n, tr.name, tr.block);
  return n / tr.block * tr.bytes;
}

float f16_to_f32(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t exp = (h >> 10) & 0x1fu;
  uint32_t mant = h & 0x3ffu;
  if (exp == 0x1f) return bits_f32(sign | 0x7f800000u | (mant << 13));  // inf / nan
  if (exp == 0) {
    if (mant == 0) return bits_f32(sign);
    // subnormal: value = mant * 2^-24
    float v = static_cast<float>(mant) * 5.9604644775390625e-8f;
    return sign ? -v : v;
  }
  return bits_f32(sign | ((exp + 112u) << 23) | (mant << 13));
}

uint16_t f32_to_f16(float f) {
  uint32_t u = f32_bits(f);
  const uint16_t sign = static_cast<uint16_t>((u >> 16) & 0x8000u);
  u &= 0x7fffffffu;
  if (u > 0x7f800000u) return sign | 0x7e00u;            // nan
  if (u >= 0x477ff000u) return sign | 0x7c00u;           // rounds to >= 65520 -> inf
  if (u < 0x38800000u) {                                  // below 2^-14: subnormal or zero
    // value * 2^24 rounded to nearest even integer = subnormal mantissa
    float a = bits_f32(u);
    float scaled = a * 16777216.0f;                        // exact (power of two)
    float r = std::nearbyint(scaled);                      // default rounding mode: nearest even
    return sign | static_cast<uint16_t>(r);
  }
  // normal: round mantissa from 23 to 10 bits, nearest even
  uint32_t rounded = u + 0xfffu + ((u >> 13) & 1u);
  return sign | static_cast<uint16_t>((rounded - 0x38000000u) >> 13);
}

float e8m0_to_f32(uint8_t e) {
  if (e == 0xff) return std::nanf("");
  if (e == 0) return bits_f32(0x00400000u);  // 2^-127
  return bits_f32(static_cast<uint32_t>(e) << 23);
}

float e8m0_to_f32_half(uint8_t e) {
  if (e == 0xff) return std::nanf("");
  if (e == 0) return bits_f32(0x00200000u);  // 2^-128
  if (e == 1) return bits_f32(0x00400000u);  // 2^-127
  return bits_f32(static_cast<uint32_t>(e - 1) << 23);
}

}  // namespace kimi
