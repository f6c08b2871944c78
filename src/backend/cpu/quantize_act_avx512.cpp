// AVX-512 activation preparation (bit-identical to the scalar versions in quantize_act.cpp).
#include "backend/cpu/quantize_act.h"

#include <cstring>

#include "tensor/quants.h"

#if defined(__x86_64__)
// GCC 12 warns about _mm512_undefined_* inside its own intrinsic headers
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <immintrin.h>

namespace kimi::kern {

namespace {
// roundf (half away from zero) of 16 floats, as int32
inline __m512i round_half_away(__m512 v) {
  const __m512 a = _mm512_abs_ps(v);
  __m512 t = _mm512_roundscale_ps(a, _MM_FROUND_TO_ZERO | _MM_FROUND_NO_EXC);
  const __mmask16 up = _mm512_cmp_ps_mask(_mm512_sub_ps(a, t), _mm512_set1_ps(0.5f), _CMP_GE_OQ);
  t = _mm512_mask_add_ps(t, up, t, _mm512_set1_ps(1.0f));
  __m512i i = _mm512_cvttps_epi32(t);
  const __mmask16 neg = _mm512_cmp_ps_mask(v, _mm512_setzero_ps(), _CMP_LT_OQ);
  return _mm512_mask_sub_epi32(i, neg, _mm512_setzero_si512(), i);
}
}  // namespace

void quant_block_q8_0_avx512(const float* x, int8_t* q, float* d, int* sum) {
  const __m512 v0 = _mm512_loadu_ps(x), v1 = _mm512_loadu_ps(x + 16);
  const float amax = _mm512_reduce_max_ps(_mm512_max_ps(_mm512_abs_ps(v0), _mm512_abs_ps(v1)));
  const float dd = amax / 127.0f;
  const float id = dd != 0.0f ? 1.0f / dd : 0.0f;
  const __m512 vid = _mm512_set1_ps(id);
  const __m512i i0 = round_half_away(_mm512_mul_ps(v0, vid));
  const __m512i i1 = round_half_away(_mm512_mul_ps(v1, vid));
  _mm_storeu_si128(reinterpret_cast<__m128i*>(q), _mm512_cvtepi32_epi8(i0));
  _mm_storeu_si128(reinterpret_cast<__m128i*>(q + 16), _mm512_cvtepi32_epi8(i1));
  *sum = _mm512_reduce_add_epi32(_mm512_add_epi32(i0, i1));
  const unsigned short h = _cvtss_sh(dd, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  *d = _cvtsh_ss(h);
}

void prep_q8_nib_avx512(const float* x, int64_t cols, uint8_t* out, int offset, float dscale) {
  prep_q8_nib_with(quant_block_q8_0_avx512, x, cols, out, offset, dscale);
}
void prep_q8_byte_avx512(const float* x, int64_t cols, uint8_t* out, int offset, float dscale) {
  prep_q8_byte_with(quant_block_q8_0_avx512, x, cols, out, offset, dscale);
}

void prep_act_q8_0_avx512(const float* x, int64_t cols, uint8_t* out) { prep_q8_byte_avx512(x, cols, out, 128, 1.0f); }
void prep_act_q4_0_avx512(const float* x, int64_t cols, uint8_t* out) { prep_q8_nib_avx512(x, cols, out, 8, 1.0f); }
void prep_act_q5_0_avx512(const float* x, int64_t cols, uint8_t* out) { prep_q8_nib_avx512(x, cols, out, 16, 1.0f); }
void prep_act_q5_1_avx512(const float* x, int64_t cols, uint8_t* out) { prep_q8_nib_avx512(x, cols, out, 1, 1.0f); }
void prep_act_mxfp4_avx512(const float* x, int64_t cols, uint8_t* out) { prep_q8_nib_avx512(x, cols, out, 12, 0.5f); }

// quantize_row_q8_K of one block, the same bytes: the FIRST value of largest magnitude sets the
// scale and its sign (iscale = -127 / vmax; NaNs never win, as the scalar's strict compare), q =
// round-half-even(iscale * x) capped at 127 and truncated to 8 bits, bsums over the truncated bytes.
void quant_block_q8_K_avx512(const float* x, block_q8_K* y) {
  __m512 v[QK_K / 16];
  __m512 am = _mm512_setzero_ps();
  for (int i = 0; i < QK_K / 16; ++i) {
    v[i] = _mm512_loadu_ps(x + 16 * i);
    am = _mm512_max_ps(_mm512_abs_ps(v[i]), am);  // a NaN lane of the first operand keeps am
  }
  const float amax = _mm512_reduce_max_ps(am);
  if (amax == 0.0f) {
    std::memset(y, 0, sizeof(block_q8_K));
    return;
  }
  float vmax = amax;
  for (int i = 0; i < QK_K / 16; ++i) {
    const __mmask16 m = _mm512_cmp_ps_mask(_mm512_abs_ps(v[i]), _mm512_set1_ps(amax), _CMP_EQ_OQ);
    if (m) {
      vmax = x[16 * i + __builtin_ctz(m)];
      break;
    }
  }
  const float iscale = -127.0f / vmax;
  const __m512 vs = _mm512_set1_ps(iscale);
  for (int i = 0; i < QK_K / 16; ++i) {
    const __m512 r = _mm512_roundscale_ps(_mm512_mul_ps(v[i], vs), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    const __m128i q8 = _mm512_cvtepi32_epi8(_mm512_min_epi32(_mm512_cvtps_epi32(r), _mm512_set1_epi32(127)));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(y->qs + 16 * i), q8);
    y->bsums[i] = static_cast<int16_t>(_mm512_reduce_add_epi32(_mm512_cvtepi8_epi32(q8)));
  }
  y->d = 1.0f / iscale;
}

void prep_q8_K_avx512(const float* x, int64_t cols, uint8_t* out) {
  for (int64_t b = 0; b < cols / QK_K; ++b) quant_block_q8_K_avx512(x + b * QK_K, reinterpret_cast<block_q8_K*>(out) + b);
}
void prep_q8_Kx_avx512(const float* x, int64_t cols, uint8_t* out) { prep_q8_Kx_with(quant_block_q8_K_avx512, x, cols, out); }

void prep_bf16_avx512(const float* x, int64_t cols, uint8_t* out) {
  int64_t i = 0;
  for (; i + 32 <= cols; i += 32) {
    const __m512bh b = _mm512_cvtne2ps_pbh(_mm512_loadu_ps(x + i + 16), _mm512_loadu_ps(x + i));
    _mm512_storeu_si512(out + 2 * i, reinterpret_cast<const __m512i&>(b));
  }
  if (i < cols) {  // tail, zero padded to 32
    const int64_t n = cols - i;
    const __mmask16 m0 = static_cast<__mmask16>(n >= 16 ? 0xffff : ((1u << n) - 1));
    const __mmask16 m1 = static_cast<__mmask16>(n <= 16 ? 0 : ((1u << (n - 16)) - 1));
    const __m512bh b = _mm512_cvtne2ps_pbh(_mm512_maskz_loadu_ps(m1, x + i + 16), _mm512_maskz_loadu_ps(m0, x + i));
    _mm512_storeu_si512(out + 2 * i, reinterpret_cast<const __m512i&>(b));
  }
}

void prep_f16r_avx512(const float* x, int64_t cols, uint8_t* out) {
  float* o = reinterpret_cast<float*>(out);
  int64_t i = 0;
  for (; i < cols; i += 16) {
    const int64_t n = cols - i;
    const __mmask16 m = static_cast<__mmask16>(n >= 16 ? 0xffff : ((1u << n) - 1));
    const __m512 v = _mm512_maskz_loadu_ps(m, x + i);
    const __m256i h = _mm512_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    _mm512_mask_storeu_ps(o + i, m, _mm512_cvtph_ps(h));
  }
}

}  // namespace kimi::kern
#endif
