// Activation preparation for the matmul kernels: each f32 activation row is converted ONCE per
// matmul call to the weight's dot type, in a layout the SIMD kernels read directly.
//
// "q8 nibble" layout (Q4_0 / MXFP4 weights; a 4-bit block holds element j in the low nibble and
// j+16 in the high nibble of byte j). The row's nb = cols/32 Q8_0 blocks (ggml rule: d = amax/127
// rounded to f16, q = roundf(x * 1/d)) are stored as
//   ng = nb/4 groups of 4 blocks (k = 0..3), 256 bytes each:
//     lo[64]  int8   lo[16k + j] = q_k[j]        (j < 16)
//     hi[64]  int8   hi[16k + j] = q_k[16 + j]
//     dx[16]  float  lanes 4k..4k+3 = dscale * f16(d_k)
//     corr[16] int32 lane 4k = offset * sum(q_k), other lanes 0
//   then nb%4 tail blocks, 48 bytes each: q[32] int8, dx float, corr int32, 8 pad bytes.
// "q8 byte" layout (Q8_0 weights): ng = nb/2 groups of 2 blocks, 192 bytes each:
//     q[64] int8 (natural order), dx[16] float (lanes 0-7 block 0, 8-15 block 1),
//     corr[16] int32 (lane 0 / lane 8 = offset * sum(q))
//   then nb%2 tail block of 48 bytes as above.
// The offset makes the weight operand of an unsigned x signed int8 dot product (VNNI vpdpbusd,
// AVX2 vpmaddubsw) non-negative: the kernel computes sum((w + offset) * q) and subtracts corr.
#pragma once
#include <cstddef>
#include <cstdint>

namespace kimi {
struct block_q8_K;  // tensor/quants.h
}

namespace kimi::kern {

constexpr int kNibGroupBytes = 256;
constexpr int kByteGroupBytes = 192;
constexpr int kTailBlockBytes = 48;

size_t q8_nib_act_bytes(int64_t cols);
size_t q8_byte_act_bytes(int64_t cols);
// offset / dscale per weight type: MXFP4 12 / 0.5 (kernels use 2^(e-127), table kvalues+12),
// Q4_0 8 / 1, Q8_0 128 / 1.
void prep_q8_nib(const float* x, int64_t cols, uint8_t* out, int offset, float dscale);
void prep_q8_byte(const float* x, int64_t cols, uint8_t* out, int offset, float dscale);

// One ggml Q8_0 block quantization of 32 values: q, f16-rounded scale as float, sum of q.
void quant_block_q8_0(const float* x, int8_t* q, float* d, int* sum);

// bf16 activation row, zero-padded to a multiple of 32 elements
size_t bf16_act_bytes(int64_t cols);
void prep_bf16(const float* x, int64_t cols, uint8_t* out);
// f32 row rounded through f16 (F16 weights, Precision::Fast)
size_t f16r_act_bytes(int64_t cols);
void prep_f16r(const float* x, int64_t cols, uint8_t* out);

// Layout writers with a given block quantizer (identical results to quant_block_q8_0 required).
using QuantBlockFn = void (*)(const float* x, int8_t* q, float* d, int* sum);
void prep_q8_nib_with(QuantBlockFn qb, const float* x, int64_t cols, uint8_t* out, int offset, float dscale);
void prep_q8_byte_with(QuantBlockFn qb, const float* x, int64_t cols, uint8_t* out, int offset, float dscale);

// Q8_K activation rows (K-quant weights): block_q8_K (tensor/quants.h) per 256 values.
size_t q8_K_act_bytes(int64_t cols);
void prep_q8_K(const float* x, int64_t cols, uint8_t* out);

// "q8 Kx" layout (packed K-quant weights, repack.h): the Q8_K quantization (same d and q) of each
// 256 values, 320 bytes per block:
//   qs[256] int8 | d f32 | s32[8] int16 in the order s0 s2 s1 s3 s4 s6 s5 s7, s_j = sum of
//   qs[32j .. 32j+31] | bsums[16] int16 (sums of 16, as block_q8_K) | 28 zero bytes
constexpr int kQ8KxBlockBytes = 320;
size_t q8_Kx_act_bytes(int64_t cols);
void prep_q8_Kx(const float* x, int64_t cols, uint8_t* out);
// The same with a given quantizer of one 256-value block (identical results to quantize_row_q8_K
// required).
using QuantKBlockFn = void (*)(const float* x, block_q8_K* y);
void prep_q8_Kx_with(QuantKBlockFn qb, const float* x, int64_t cols, uint8_t* out);

// The preparation of each weight type's activations (the offset / dscale rules above):
// q8 byte layout for Q8_0 (128 / 1), q8 nibble layout for Q4_0 (8 / 1), Q5_0 (16 / 1),
// Q5_1 (1 / 1: corr = sum(q), scaled by the block min instead of subtracted), MXFP4 (12 / 0.5).
void prep_act_q8_0(const float* x, int64_t cols, uint8_t* out);
void prep_act_q4_0(const float* x, int64_t cols, uint8_t* out);
void prep_act_q5_0(const float* x, int64_t cols, uint8_t* out);
void prep_act_q5_1(const float* x, int64_t cols, uint8_t* out);
void prep_act_mxfp4(const float* x, int64_t cols, uint8_t* out);

// AVX-512 versions (same bytes out); only call when dispatch allows AVX-512.
void quant_block_q8_0_avx512(const float* x, int8_t* q, float* d, int* sum);
void prep_q8_nib_avx512(const float* x, int64_t cols, uint8_t* out, int offset, float dscale);
void prep_q8_byte_avx512(const float* x, int64_t cols, uint8_t* out, int offset, float dscale);
void prep_bf16_avx512(const float* x, int64_t cols, uint8_t* out);
void prep_f16r_avx512(const float* x, int64_t cols, uint8_t* out);
void prep_act_q8_0_avx512(const float* x, int64_t cols, uint8_t* out);
void prep_act_q4_0_avx512(const float* x, int64_t cols, uint8_t* out);
void prep_act_q5_0_avx512(const float* x, int64_t cols, uint8_t* out);
void prep_act_q5_1_avx512(const float* x, int64_t cols, uint8_t* out);
void prep_act_mxfp4_avx512(const float* x, int64_t cols, uint8_t* out);
void quant_block_q8_K_avx512(const float* x, block_q8_K* y);
void prep_q8_K_avx512(const float* x, int64_t cols, uint8_t* out);
void prep_q8_Kx_avx512(const float* x, int64_t cols, uint8_t* out);

}  // namespace kimi::kern
