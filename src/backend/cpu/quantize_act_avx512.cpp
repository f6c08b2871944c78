// AVX-512 activation preparation (bit-identical to the scalar versions in quantize_act.cpp).
#include "backend/cpu/quantize_act.h"

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
