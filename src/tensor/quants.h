// ggml block layouts (formats-quant.md §3.3, §4.3, §4.4) and the scalar reference quantizers and
// dequantizers. Every struct is byte-exact with ggml (static_asserts below); f16 fields are raw
// IEEE binary16 bits. These are the reference paths: SIMD kernels live in backend/cpu/.
#pragma once
#include <cstdint>

#include "tensor/types.h"

namespace kimi {

constexpr int QK8_0 = 32;
constexpr int QK4_0 = 32;
constexpr int QK_MXFP4 = 32;
constexpr int QK_K = 256;
constexpr int K_SCALE_SIZE = 12;

#pragma pack(push, 1)
struct block_q8_0 {
  uint16_t d;        // f16 scale
  int8_t qs[QK8_0];  // x = q * d
};
struct block_q4_0 {
  uint16_t d;             // f16 scale (may be negative)
  uint8_t qs[QK4_0 / 2];  // low nibble = element j, high nibble = element j+16; x = (q - 8) * d
};
struct block_q5_0 {
  uint16_t d;             // f16 scale (may be negative)
  uint8_t qh[4];          // u32 LE: bit k = 5th bit of element k
  uint8_t qs[QK4_0 / 2];  // low nibble = element j, high nibble = element j+16; x = (q - 16) * d
};
struct block_q5_1 {
  uint16_t d;             // f16 scale
  uint16_t m;             // f16 min
  uint8_t qh[4];          // u32 LE: bit k = 5th bit of element k
  uint8_t qs[QK4_0 / 2];  // as Q5_0; x = q * d + m
};
struct block_mxfp4 {
  uint8_t e;                 // E8M0 exponent byte
  uint8_t qs[QK_MXFP4 / 2];  // low nibble = element j, high nibble = element j+16 (E2M1 codes)
};
struct block_q4_K {
  uint16_t d;                      // f16 super-block scale for the scales
  uint16_t dmin;                   // f16 super-block scale for the mins
  uint8_t scales[K_SCALE_SIZE];    // 8 x (6-bit scale, 6-bit min)
  uint8_t qs[QK_K / 2];
};
struct block_q5_K {
  uint16_t d;
  uint16_t dmin;
  uint8_t scales[K_SCALE_SIZE];
  uint8_t qh[QK_K / 8];
  uint8_t qs[QK_K / 2];
};
struct block_q6_K {
  uint8_t ql[QK_K / 2];
  uint8_t qh[QK_K / 4];
  int8_t scales[QK_K / 16];
  uint16_t d;
};
struct block_q8_K {
  float d;
  int8_t qs[QK_K];
  int16_t bsums[QK_K / 16];  // sum of each group of 16 qs
};
#pragma pack(pop)

static_assert(sizeof(block_q8_0) == 34);
static_assert(sizeof(block_q4_0) == 18);
static_assert(sizeof(block_q5_0) == 22);
static_assert(sizeof(block_q5_1) == 24);
static_assert(sizeof(block_mxfp4) == 17);
static_assert(sizeof(block_q4_K) == 144);
static_assert(sizeof(block_q5_K) == 176);
static_assert(sizeof(block_q6_K) == 210);
static_assert(sizeof(block_q8_K) == 292);

// ggml kvalues_mxfp4: doubled E2M1 values, paired with the half scale e8m0_to_f32_half(e).
extern const int8_t kvalues_mxfp4[16];

// ---- reference quantizers (ggml *_ref semantics, bit-exact); n = multiple of the block size ----
void quantize_row_q8_0(const float* x, block_q8_0* y, int64_t n);  // d = amax/127, q = roundf(x/d)
void quantize_row_q4_0(const float* x, block_q4_0* y, int64_t n);
void quantize_row_q5_0(const float* x, block_q5_0* y, int64_t n);  // d = M/-16, q = min(31, trunc(x/d + 16.5))
void quantize_row_q5_1(const float* x, block_q5_1* y, int64_t n);  // d = (max-min)/31, m = min
void quantize_row_mxfp4(const float* x, block_mxfp4* y, int64_t n);  // e = floor(log2 amax) - 2 + 127
void quantize_row_q4_K(const float* x, block_q4_K* y, int64_t n);
void quantize_row_q5_K(const float* x, block_q5_K* y, int64_t n);
void quantize_row_q6_K(const float* x, block_q6_K* y, int64_t n);
void quantize_row_q8_K(const float* x, block_q8_K* y, int64_t n);

// ---- reference dequantizers ----
void dequantize_row_q8_0(const block_q8_0* x, float* y, int64_t n);
void dequantize_row_q4_0(const block_q4_0* x, float* y, int64_t n);
void dequantize_row_q5_0(const block_q5_0* x, float* y, int64_t n);
void dequantize_row_q5_1(const block_q5_1* x, float* y, int64_t n);
void dequantize_row_mxfp4(const block_mxfp4* x, float* y, int64_t n);
void dequantize_row_q4_K(const block_q4_K* x, float* y, int64_t n);
void dequantize_row_q5_K(const block_q5_K* x, float* y, int64_t n);
void dequantize_row_q6_K(const block_q6_K* x, float* y, int64_t n);
void dequantize_row_q8_K(const block_q8_K* x, float* y, int64_t n);

// Type-generic entry points over the types above plus F32/F16/BF16. `n` elements, multiple of the
// block size. Throw kimi::Error for types without a (de)quantizer.
bool can_quantize(GgmlType t);
void quantize_row(GgmlType t, const float* x, void* y, int64_t n);
void dequantize_row(GgmlType t, const void* x, float* y, int64_t n);

// Helpers for K-quant scale/min unpacking (j = 0..7).
inline void get_scale_min_k4(int j, const uint8_t* q, uint8_t* d, uint8_t* m) {
  if (j < 4) {
    *d = q[j] & 63;
    *m = q[j + 4] & 63;
  } else {
    *d = static_cast<uint8_t>((q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4));
    *m = static_cast<uint8_t>((q[j + 4] >> 4) | ((q[j] >> 6) << 4));
  }
}

}  // namespace kimi
