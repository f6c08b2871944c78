#include "backend/cpu/quantize_act.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "tensor/quants.h"
#include "tensor/types.h"

namespace kimi::kern {

void quant_block_q8_0(const float* x, int8_t* q, float* d, int* sum) {
  float amax = 0.0f;
  for (int j = 0; j < 32; ++j) amax = std::max(amax, std::fabs(x[j]));
  const float dd = amax / 127.0f;
  const float id = dd != 0.0f ? 1.0f / dd : 0.0f;
  int s = 0;
  for (int j = 0; j < 32; ++j) {
    q[j] = static_cast<int8_t>(std::roundf(x[j] * id));
    s += q[j];
  }
  *d = f16_to_f32(f32_to_f16(dd));
  *sum = s;
}

size_t q8_nib_act_bytes(int64_t cols) {
  const int64_t nb = cols / 32;
  return static_cast<size_t>(nb / 4 * kNibGroupBytes + nb % 4 * kTailBlockBytes);
}
size_t q8_byte_act_bytes(int64_t cols) {
  const int64_t nb = cols / 32;
  return static_cast<size_t>(nb / 2 * kByteGroupBytes + nb % 2 * kTailBlockBytes);
}

namespace {
void write_tail(uint8_t* t, const int8_t* q, float dx, int corr) {
  std::memcpy(t, q, 32);
  std::memcpy(t + 32, &dx, 4);
  std::memcpy(t + 36, &corr, 4);
  std::memset(t + 40, 0, 8);
}
}  // namespace

void prep_q8_nib_with(QuantBlockFn qb, const float* x, int64_t cols, uint8_t* out, int offset, float dscale) {
  const int64_t nb = cols / 32, ng = nb / 4;
  int8_t q[32];
  float d;
  int sum;
  for (int64_t g = 0; g < ng; ++g) {
    uint8_t* grp = out + g * kNibGroupBytes;
    float dx[16];
    int32_t corr[16] = {};
    for (int k = 0; k < 4; ++k) {
      qb(x + (4 * g + k) * 32, q, &d, &sum);
      std::memcpy(grp + 16 * k, q, 16);
      std::memcpy(grp + 64 + 16 * k, q + 16, 16);
      for (int l = 0; l < 4; ++l) dx[4 * k + l] = d * dscale;
      corr[4 * k] = offset * sum;
    }
    std::memcpy(grp + 128, dx, 64);
    std::memcpy(grp + 192, corr, 64);
  }
  for (int64_t b = ng * 4; b < nb; ++b) {
    qb(x + b * 32, q, &d, &sum);
    write_tail(out + ng * kNibGroupBytes + (b - ng * 4) * kTailBlockBytes, q, d * dscale, offset * sum);
  }
}

void prep_q8_byte_with(QuantBlockFn qb, const float* x, int64_t cols, uint8_t* out, int offset, float dscale) {
  const int64_t nb = cols / 32, ng = nb / 2;
  int8_t q[32];
  float d;
  int sum;
  for (int64_t g = 0; g < ng; ++g) {
    uint8_t* grp = out + g * kByteGroupBytes;
    float dx[16];
    int32_t corr[16] = {};
    for (int k = 0; k < 2; ++k) {
      qb(x + (2 * g + k) * 32, q, &d, &sum);
      std::memcpy(grp + 32 * k, q, 32);
      for (int l = 0; l < 8; ++l) dx[8 * k + l] = d * dscale;
      corr[8 * k] = offset * sum;
    }
    std::memcpy(grp + 64, dx, 64);
    std::memcpy(grp + 128, corr, 64);
  }
  if (nb % 2) {
    qb(x + (nb - 1) * 32, q, &d, &sum);
    write_tail(out + ng * kByteGroupBytes, q, d * dscale, offset * sum);
  }
}

void prep_q8_nib(const float* x, int64_t cols, uint8_t* out, int offset, float dscale) {
  prep_q8_nib_with(quant_block_q8_0, x, cols, out, offset, dscale);
}
void prep_q8_byte(const float* x, int64_t cols, uint8_t* out, int offset, float dscale) {
  prep_q8_byte_with(quant_block_q8_0, x, cols, out, offset, dscale);
}

size_t bf16_act_bytes(int64_t cols) { return static_cast<size_t>((cols + 31) / 32 * 32) * 2; }
void prep_bf16(const float* x, int64_t cols, uint8_t* out) {
  uint16_t* o = reinterpret_cast<uint16_t*>(out);
  const int64_t padded = (cols + 31) / 32 * 32;
  for (int64_t i = 0; i < cols; ++i) o[i] = f32_to_bf16(x[i]);
  for (int64_t i = cols; i < padded; ++i) o[i] = 0;
}

size_t f16r_act_bytes(int64_t cols) { return static_cast<size_t>(cols) * 4; }
void prep_f16r(const float* x, int64_t cols, uint8_t* out) {
  float* o = reinterpret_cast<float*>(out);
  for (int64_t i = 0; i < cols; ++i) o[i] = f16_to_f32(f32_to_f16(x[i]));
}

size_t q8_K_act_bytes(int64_t cols) { return static_cast<size_t>(cols / QK_K) * sizeof(block_q8_K); }
void prep_q8_K(const float* x, int64_t cols, uint8_t* out) {
  quantize_row_q8_K(x, reinterpret_cast<block_q8_K*>(out), cols);
}

size_t q8_Kx_act_bytes(int64_t cols) { return static_cast<size_t>(cols / QK_K) * kQ8KxBlockBytes; }
void prep_q8_Kx_with(QuantKBlockFn qb, const float* x, int64_t cols, uint8_t* out) {
  static constexpr int kOrder[8] = {0, 2, 1, 3, 4, 6, 5, 7};
  for (int64_t b = 0; b < cols / QK_K; ++b) {
    block_q8_K q;
    qb(x + b * QK_K, &q);
    uint8_t* o = out + b * kQ8KxBlockBytes;
    std::memcpy(o, q.qs, QK_K);
    std::memcpy(o + 256, &q.d, 4);
    int16_t s32[8];
    for (int j = 0; j < 8; ++j)
      s32[j] = static_cast<int16_t>(q.bsums[2 * kOrder[j]] + q.bsums[2 * kOrder[j] + 1]);
    std::memcpy(o + 260, s32, 16);
    std::memcpy(o + 276, q.bsums, 32);
    std::memset(o + 308, 0, kQ8KxBlockBytes - 308);
  }
}
void prep_q8_Kx(const float* x, int64_t cols, uint8_t* out) {
  prep_q8_Kx_with([](const float* v, block_q8_K* y) { quantize_row_q8_K(v, y, QK_K); }, x, cols, out);
}

void prep_act_q8_0(const float* x, int64_t cols, uint8_t* out) { prep_q8_byte(x, cols, out, 128, 1.0f); }
void prep_act_q4_0(const float* x, int64_t cols, uint8_t* out) { prep_q8_nib(x, cols, out, 8, 1.0f); }
void prep_act_q5_0(const float* x, int64_t cols, uint8_t* out) { prep_q8_nib(x, cols, out, 16, 1.0f); }
void prep_act_q5_1(const float* x, int64_t cols, uint8_t* out) { prep_q8_nib(x, cols, out, 1, 1.0f); }
void prep_act_mxfp4(const float* x, int64_t cols, uint8_t* out) { prep_q8_nib(x, cols, out, 12, 0.5f); }

#if !defined(__x86_64__)
void quant_block_q8_0_avx512(const float* x, int8_t* q, float* d, int* sum) { quant_block_q8_0(x, q, d, sum); }
void prep_q8_nib_avx512(const float* x, int64_t cols, uint8_t* out, int offset, float dscale) {
  prep_q8_nib(x, cols, out, offset, dscale);
}
void prep_q8_byte_avx512(const float* x, int64_t cols, uint8_t* out, int offset, float dscale) {
  prep_q8_byte(x, cols, out, offset, dscale);
}
void prep_bf16_avx512(const float* x, int64_t cols, uint8_t* out) { prep_bf16(x, cols, out); }
void prep_f16r_avx512(const float* x, int64_t cols, uint8_t* out) { prep_f16r(x, cols, out); }
void prep_act_q8_0_avx512(const float* x, int64_t cols, uint8_t* out) { prep_act_q8_0(x, cols, out); }
void prep_act_q4_0_avx512(const float* x, int64_t cols, uint8_t* out) { prep_act_q4_0(x, cols, out); }
void prep_act_q5_0_avx512(const float* x, int64_t cols, uint8_t* out) { prep_act_q5_0(x, cols, out); }
void prep_act_q5_1_avx512(const float* x, int64_t cols, uint8_t* out) { prep_act_q5_1(x, cols, out); }
void prep_act_mxfp4_avx512(const float* x, int64_t cols, uint8_t* out) { prep_act_mxfp4(x, cols, out); }
void quant_block_q8_K_avx512(const float* x, block_q8_K* y) { quantize_row_q8_K(x, y, QK_K); }
void prep_q8_K_avx512(const float* x, int64_t cols, uint8_t* out) { prep_q8_K(x, cols, out); }
void prep_q8_Kx_avx512(const float* x, int64_t cols, uint8_t* out) { prep_q8_Kx(x, cols, out); }
#endif

}  // namespace kimi::kern
