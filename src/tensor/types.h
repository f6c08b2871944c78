// ggml element/block types as stored in GGUF (ids from formats-quant.md §4.1) and scalar
// conversions for the 16-bit float formats. Block layouts live in tensor/blocks.h.
#pragma once
#include <cstdint>
#include <cstring>
#include <optional>
#include <string>
#include <string_view>

namespace kimi {

enum class GgmlType : uint32_t {
  F32 = 0, F16 = 1, Q4_0 = 2, Q4_1 = 3, Q5_0 = 6, Q5_1 = 7, Q8_0 = 8, Q8_1 = 9,
  Q2_K = 10, Q3_K = 11, Q4_K = 12, Q5_K = 13, Q6_K = 14, Q8_K = 15,
  IQ2_XXS = 16, IQ2_XS = 17, IQ3_XXS = 18, IQ1_S = 19, IQ4_NL = 20, IQ3_S = 21, IQ2_S = 22, IQ4_XS = 23,
  I8 = 24, I16 = 25, I32 = 26, I64 = 27, F64 = 28, IQ1_M = 29, BF16 = 30,
  TQ1_0 = 34, TQ2_0 = 35, MXFP4 = 39,
};

struct TypeTraits {
  const char* name;   // "F32", "Q8_0", "MXFP4", ... (ggml spelling)
  uint32_t block;     // elements per block (1 for plain types)
  uint32_t bytes;     // bytes per block
};

// Traits for a known type id; nullopt for ids that are unknown or removed (4, 5, 31-33, 36-38, ...).
std::optional<TypeTraits> type_traits(uint32_t id);
const TypeTraits& traits(GgmlType t);  // throws for an unknown type
inline const char* type_name(GgmlType t) { return traits(t).name; }
std::optional<GgmlType> type_from_name(std::string_view name);  // case-insensitive
// Bytes of a row of n elements (n must be a multiple of the block size; throws otherwise).
uint64_t row_bytes(GgmlType t, uint64_t n);

// llama_ftype values for general.file_type (formats-quant.md §4.7)
enum class FileType : uint32_t {
  ALL_F32 = 0, MOSTLY_F16 = 1, MOSTLY_Q4_0 = 2, MOSTLY_Q4_1 = 3, MOSTLY_Q8_0 = 7, MOSTLY_Q5_0 = 8,
  MOSTLY_Q5_1 = 9, MOSTLY_Q2_K = 10, MOSTLY_Q3_K_S = 11, MOSTLY_Q3_K_M = 12, MOSTLY_Q3_K_L = 13,
  MOSTLY_Q4_K_S = 14, MOSTLY_Q4_K_M = 15, MOSTLY_Q5_K_S = 16, MOSTLY_Q5_K_M = 17, MOSTLY_Q6_K = 18,
  MOSTLY_IQ2_XXS = 19, MOSTLY_IQ2_XS = 20, MOSTLY_Q2_K_S = 21, MOSTLY_IQ3_XS = 22, MOSTLY_IQ3_XXS = 23,
  MOSTLY_IQ1_S = 24, MOSTLY_IQ4_NL = 25, MOSTLY_IQ3_S = 26, MOSTLY_IQ3_M = 27, MOSTLY_IQ2_S = 28,
  MOSTLY_IQ2_M = 29, MOSTLY_IQ4_XS = 30, MOSTLY_IQ1_M = 31, MOSTLY_BF16 = 32, MOSTLY_TQ1_0 = 36,
  MOSTLY_TQ2_0 = 37, MOSTLY_MXFP4_MOE = 38, MOSTLY_Q1_0 = 40, MOSTLY_Q2_0 = 41,
};

// ---- 16-bit floats (exact, scalar; SIMD versions live in kernels/) ----
inline uint32_t f32_bits(float f) { uint32_t u; std::memcpy(&u, &f, 4); return u; }
inline float bits_f32(uint32_t u) { float f; std::memcpy(&f, &u, 4); return f; }

inline float bf16_to_f32(uint16_t h) { return bits_f32(static_cast<uint32_t>(h) << 16); }
// round to nearest even; NaN stays NaN (quiet)
inline uint16_t f32_to_bf16(float f) {
  uint32_t u = f32_bits(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x40);
  u += 0x7fffu + ((u >> 16) & 1u);
  return static_cast<uint16_t>(u >> 16);
}

float f16_to_f32(uint16_t h);   // exact (subnormals, inf, nan)
uint16_t f32_to_f16(float f);   // round to nearest even, overflow -> inf

// E8M0 scale byte -> float: 2^(e-127) (e = 255 -> NaN)
float e8m0_to_f32(uint8_t e);
// ggml's "half" E8M0 used with doubled MXFP4 kvalues: 2^(e-128)
float e8m0_to_f32_half(uint8_t e);

}  // namespace kimi
