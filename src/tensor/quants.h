// ggml block layouts (formats-quant.md §3.3, §4.3, §4.4) and the scalar reference quantizers and
// dequantizers. Every struct is byte-exact with ggml (static_asserts below); f16 fields are raw
// IEEE binary16 bits. These are the reference paths: SIMD kernels live in backend/cpu/.
#pragma once
#include <cstdint>
#include <string>

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
// Low-bit types (formats-quant.md §4.4, §4.6); implemented in quants_lowbit.cpp / quants_iq2.cpp.
struct block_q2_K {
  uint8_t scales[QK_K / 16];  // low nibble: 4-bit scale, high nibble: 4-bit min (per 16 elements)
  uint8_t qs[QK_K / 4];       // 2-bit levels: element e at (qs[32(e/128) + e%32] >> 2((e%128)/32)) & 3
  uint16_t d;                 // f16 scale of the scales
  uint16_t dmin;              // f16 scale of the mins; x = d*sc*q - dmin*m
};
struct block_q3_K {
  uint8_t hmask[QK_K / 8];  // bit e/32 of hmask[e%32] set: level q = low; clear: q = low - 4
  uint8_t qs[QK_K / 4];     // low 2 bits, packed as Q2_K
  uint8_t scales[12];       // 16 x 6-bit scales (stored +32)
  uint16_t d;               // f16; x = d * (s - 32) * q, q in [-4, 3]
};
struct block_iq4_xs {
  uint16_t d;               // f16
  uint16_t scales_h;        // high 2 bits of the 8 6-bit sub-block scales (bits 2ib, 2ib+1)
  uint8_t scales_l[QK_K / 64];  // low 4 bits (nibble ib%2 of byte ib/2)
  uint8_t qs[QK_K / 2];     // per 32-element sub-block 16 bytes: low nibble j, high nibble j+16
};
struct block_iq2_xs {
  uint16_t d;                // f16
  uint16_t qs[QK_K / 8];     // per 8 elements: 9-bit grid index | 7-bit sign index << 9
  uint8_t scales[QK_K / 32];  // per 32 elements: 4-bit scale of elements 0..15 (low), 16..31 (high)
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
static_assert(sizeof(block_q2_K) == 84);
static_assert(sizeof(block_q3_K) == 110);
static_assert(sizeof(block_iq4_xs) == 136);
static_assert(sizeof(block_iq2_xs) == 74);

// IQ4_NL / IQ4_XS non-linear levels (formats-quant.md §4.3)
extern const int8_t kvalues_iq4nl[16];
// IQ2_XS codebook: entry k = 8 levels, level i = (kIq2xsGrid[k] >> 2i) & 3 in {0, 1, 2}, meaning
// the magnitudes 8, 25, 43 (iq2xs_grid byte i). iq2xs_grid_u64(k) gives ggml's packed 8-byte form.
extern const uint16_t kIq2xsGrid[512];
uint64_t iq2xs_grid_u64(int k);
const uint64_t* iq2xs_grid_u64_table();  // the 512 packed entries (for SIMD gathers)
// ksigns: 7 sign bits (bit i = element i negative) plus bit 7 = their parity (even negatives)
inline uint8_t iq2_ksigns(int idx7) { return static_cast<uint8_t>(idx7 | ((__builtin_popcount(idx7) & 1) << 7)); }

// ggml kvalues_mxfp4: doubled E2M1 values, paired with the half scale e8m0_to_f32_half(e).
extern const int8_t kvalues_mxfp4[16];

// ---- reference quantizers (ggml *_ref semantics, bit-exact); n = multiple of the block size ----
void quantize_row_q8_0(const float* x, block_q8_0* y, int64_t n);  // d = amax/127, q = roundf(x/d)
void quantize_row_q4_0(const float* x, block_q4_0* y, int64_t n);
void quantize_row_q5_0(const float* x, block_q5_0* y, int64_t n);  // d = M/-16, q = min(31, trunc(x/d + 16.5))
void quantize_row_q5_1(const float* x, block_q5_1* y, int64_t n);  // d = (max-min)/31, m = min
void quantize_row_mxfp4(const float* x, block_mxfp4* y, int64_t n);  // e = floor(log2 amax) - 2 + 127
// K-quants: qw = optional per-column importances (imatrix), nullptr = the ggml *_ref search.
void quantize_row_q4_K(const float* x, block_q4_K* y, int64_t n, const float* qw = nullptr);
void quantize_row_q5_K(const float* x, block_q5_K* y, int64_t n, const float* qw = nullptr);
void quantize_row_q6_K(const float* x, block_q6_K* y, int64_t n, const float* qw = nullptr);
void quantize_row_q8_K(const float* x, block_q8_K* y, int64_t n);
// Low-bit quantizers: importance-weighted searches (own algorithms, ggml-compatible bytes). qw: n
// per-column importances (an imatrix row; nullptr = none, i.e. all equal).
void quantize_row_q2_K(const float* x, block_q2_K* y, int64_t n, const float* qw = nullptr);
void quantize_row_q3_K(const float* x, block_q3_K* y, int64_t n, const float* qw = nullptr);
void quantize_row_iq4_xs(const float* x, block_iq4_xs* y, int64_t n, const float* qw = nullptr);
void quantize_row_iq2_xs(const float* x, block_iq2_xs* y, int64_t n, const float* qw = nullptr);

// Element weights of the importance-weighted searches for n elements with column importances qw
// (an imatrix row: the mean squared input activation of each column). The weight is the importance
// itself, so the weighted squared error of a row is the expected squared error its rounding adds
// to the matmul's output (columns taken as uncorrelated); a floor of 1e-4 of the mean keeps columns
// that never saw an activation from being coded arbitrarily. False (w untouched) when qw is null or
// all zero: the caller then uses its magnitude heuristic, as without an imatrix.
bool imatrix_element_weights(const float* qw, int n, float* w);

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
void dequantize_row_q2_K(const block_q2_K* x, float* y, int64_t n);
void dequantize_row_q3_K(const block_q3_K* x, float* y, int64_t n);
void dequantize_row_iq4_xs(const block_iq4_xs* x, float* y, int64_t n);
void dequantize_row_iq2_xs(const block_iq2_xs* x, float* y, int64_t n);
// The 16 signed 6-bit Q3_K scales (s - 32) of a block.
void q3_K_scales(const uint8_t* packed12, int8_t* out16);

// Type-generic entry points over the types above plus F32/F16/BF16. `n` elements, multiple of the
// block size. Throw kimi::Error for types without a (de)quantizer.
bool can_quantize(GgmlType t);
void quantize_row(GgmlType t, const float* x, void* y, int64_t n);
// With per-column importances qw (n values; nullptr = none). Types whose quantizer has no
// weighted search ignore qw (Q8_0, MXFP4, plain floats).
void quantize_row_imat(GgmlType t, const float* x, void* y, int64_t n, const float* qw);
// Whether quantize_row_imat uses qw for this type.
bool uses_imatrix(GgmlType t);
// Check that a block row holds finite scales (GGUF validation of untrusted data): false with a
// message in *why when not. Types without scales to check return true.
bool validate_row(GgmlType t, const void* row, int64_t n, std::string* why);
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
