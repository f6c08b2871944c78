// Block-header decoding shared by the low-bit ISA kernel files (matmul_lowbit_avx2.cpp,
// matmul_lowbit_avx512.cpp). Plain scalar code in an unnamed namespace, so each ISA file gets its
// own copy compiled with its flags (as matmul_driver.h).
#pragma once
#include <cstdint>
#include <cstring>

#include "tensor/types.h"

namespace kimi::kern {
namespace {

// Per super-block: s16 scale per 16-element group, s16 min per group (Q2_K; 0 otherwise), the
// f32 factors of sum(scale * q * a) and sum(min * bsum).
struct LbHdr {
  alignas(32) int16_t sc[16];
  alignas(32) int16_t mn[16];
  float d, dmin;
  bool has_min;
};

inline float lb_f16(const uint8_t* p) {
  uint16_t h;
  std::memcpy(&h, p, 2);
  return _cvtsh_ss(h);
}

template <GgmlType T>
inline void lb_header(const uint8_t* b, LbHdr& h) {
  if constexpr (T == GgmlType::Q2_K) {
    for (int g = 0; g < 16; ++g) {
      h.sc[g] = static_cast<int16_t>(b[g] & 15);
      h.mn[g] = static_cast<int16_t>(b[g] >> 4);
    }
    h.d = lb_f16(b + 80);
    h.dmin = lb_f16(b + 82);
    h.has_min = true;
  } else if constexpr (T == GgmlType::Q3_K) {
    const uint8_t* p = b + 96;
    for (int t = 0; t < 16; ++t) {
      const int low = t < 8 ? (p[t] & 15) : (p[t - 8] >> 4);
      const int high = (p[8 + t % 4] >> (2 * (t / 4))) & 3;
      h.sc[t] = static_cast<int16_t>((low | (high << 4)) - 32);
    }
    h.d = lb_f16(b + 108);
    h.dmin = 0;
    h.has_min = false;
  } else if constexpr (T == GgmlType::IQ4_XS) {
    uint16_t sh;
    std::memcpy(&sh, b + 2, 2);
    for (int ib = 0; ib < 8; ++ib) {
      const int ls = ((b[4 + ib / 2] >> (4 * (ib % 2))) & 15) | (((sh >> (2 * ib)) & 3) << 4);
      h.sc[2 * ib] = h.sc[2 * ib + 1] = static_cast<int16_t>(ls - 32);
    }
    h.d = lb_f16(b);
    h.dmin = 0;
    h.has_min = false;
  } else {  // IQ2_XS: (2s + 1) per 16 elements, d / 8
    for (int g = 0; g < 16; ++g) h.sc[g] = static_cast<int16_t>(2 * ((b[66 + g / 2] >> (4 * (g % 2))) & 15) + 1);
    h.d = lb_f16(b) * 0.125f;
    h.dmin = 0;
    h.has_min = false;
  }
}

template <GgmlType T>
constexpr int lb_block_bytes() {
  return T == GgmlType::Q2_K ? 84 : T == GgmlType::Q3_K ? 110 : T == GgmlType::IQ4_XS ? 136 : 74;
}

// 64-bit negative mask of IQ2_XS groups g0 .. g0+7 (8 bits each: ksigns with the parity bit)
inline uint64_t iq2xs_sign_mask(const uint8_t* b, int g0, int ng) {
  uint64_t m = 0;
  for (int k = 0; k < ng; ++k) {
    uint16_t q;
    std::memcpy(&q, b + 2 + 2 * (g0 + k), 2);
    const unsigned s7 = q >> 9;
    unsigned par = s7 ^ (s7 >> 4);
    par ^= par >> 2;
    par ^= par >> 1;
    const unsigned s8 = s7 | ((par & 1u) << 7);
    m |= static_cast<uint64_t>(s8) << (8 * k);
  }
  return m;
}

}  // namespace
}  // namespace kimi::kern
