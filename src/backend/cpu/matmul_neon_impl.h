// The ARM NEON matmul kernels, written once and compiled at three levels: matmul_neon.cpp (plain
// ARMv8-A AdvSIMD), matmul_neon_dot.cpp (+ dotprod: SDOT) and matmul_neon_i8mm.cpp (+ dotprod, i8mm:
// SMMLA, and bf16: BFDOT). Each of those files includes this header inside its own namespace, with
// its own -march flags (cmake/KimiIsa.cmake); the instructions a level may use are chosen here by
// the compiler's feature macros (__ARM_FEATURE_DOTPROD, __ARM_FEATURE_MATMUL_INT8,
// __ARM_FEATURE_BF16_VECTOR_ARITHMETIC).
//
// The activations use the scalar level's layouts (quantize_act.h / tensor/quants.h): block_q8_0 rows
// for the 32-element types, block_q8_K rows for the K-quants, bf16 rows for BF16, f16-rounded f32 rows
// for F16 (Precision::Fast). The integer block sums are exact, and each (row, token) accumulates
// its blocks in the scalar order, so the quantized kernels give the scalar level's result up to the
// order of float additions inside a block's scale product.
//
// Everything is in an unnamed namespace: each level's file gets its own copy.
#pragma once
#if !defined(__aarch64__)
#error "matmul_neon_impl.h is for the aarch64 kernel files"
#endif
#include <arm_neon.h>

#include <cstdint>
#include <cstring>

#include "backend/cpu/dispatch.h"
#include "backend/cpu/quantize_act.h"
#include "tensor/quants.h"
#include "tensor/types.h"

namespace {

using namespace kimi;
using kimi::kern::f32_scratch;

// ---- integer dot products of 16 int8 pairs into 4 int32 lanes (only the lane total is used) ----
inline int32x4_t dot16(int32x4_t acc, int8x16_t a, int8x16_t b) {
#if defined(__ARM_FEATURE_DOTPROD)
  return vdotq_s32(acc, a, b);
#else
  const int16x8_t lo = vmull_s8(vget_low_s8(a), vget_low_s8(b));
  const int16x8_t hi = vmull_high_s8(a, b);
  return vpadalq_s16(vpadalq_s16(acc, lo), hi);
#endif
}

inline float f16f(uint16_t h) { return kimi::f16_to_f32(h); }

// K-quant 6-bit scale and min j (0..7) of a 12-byte scales field (a local copy: an inline function
// of tensor/quants.h emitted here with this level's -march could be the copy every caller gets)
inline void scale_min_k4(int j, const uint8_t* q, uint8_t* d, uint8_t* m) {
  if (j < 4) {
    *d = q[j] & 63;
    *m = q[j + 4] & 63;
  } else {
    *d = static_cast<uint8_t>((q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4));
    *m = static_cast<uint8_t>((q[j + 4] >> 4) | ((q[j] >> 6) << 4));
  }
}

// ---- the 32-element block types: unpack one block to 32 signed int8 (lo = elements 0..15,
// hi = 16..31) and its scale; Q5_1 also has a min (x = q * d + m). ----
struct Q8_0 {
  using Block = block_q8_0;
  static constexpr bool kMin = false;
  static inline void unpack(const Block& w, int8x16_t& lo, int8x16_t& hi) {
    lo = vld1q_s8(w.qs);
    hi = vld1q_s8(w.qs + 16);
  }
  static inline float scale(const Block& w) { return f16f(w.d); }
  static inline float min(const Block&) { return 0.0f; }
};
struct Q4_0 {
  using Block = block_q4_0;
  static constexpr bool kMin = false;
  static inline void unpack(const Block& w, int8x16_t& lo, int8x16_t& hi) {
    const uint8x16_t b = vld1q_u8(w.qs);
    const int8x16_t eight = vdupq_n_s8(8);
    lo = vsubq_s8(vreinterpretq_s8_u8(vandq_u8(b, vdupq_n_u8(0x0F))), eight);
    hi = vsubq_s8(vreinterpretq_s8_u8(vshrq_n_u8(b, 4)), eight);
  }
  static inline float scale(const Block& w) { return f16f(w.d); }
  static inline float min(const Block&) { return 0.0f; }
};
// bit j of the 16-bit value (b0 | b1 << 8) as 0x10 in byte j
inline uint8x16_t fifth_bits(uint8_t b0, uint8_t b1) {
  static const uint8_t kBit[16] = {1, 2, 4, 8, 16, 32, 64, 128, 1, 2, 4, 8, 16, 32, 64, 128};
  const uint8x16_t v = vcombine_u8(vdup_n_u8(b0), vdup_n_u8(b1));
  return vandq_u8(vtstq_u8(v, vld1q_u8(kBit)), vdupq_n_u8(0x10));
}
template <class B, int kOffset>
inline void unpack_q5(const B& w, int8x16_t& lo, int8x16_t& hi) {
  const uint8x16_t b = vld1q_u8(w.qs);
  const uint8x16_t l = vorrq_u8(vandq_u8(b, vdupq_n_u8(0x0F)), fifth_bits(w.qh[0], w.qh[1]));
  const uint8x16_t h = vorrq_u8(vshrq_n_u8(b, 4), fifth_bits(w.qh[2], w.qh[3]));
  lo = vsubq_s8(vreinterpretq_s8_u8(l), vdupq_n_s8(kOffset));
  hi = vsubq_s8(vreinterpretq_s8_u8(h), vdupq_n_s8(kOffset));
}
struct Q5_0 {
  using Block = block_q5_0;
  static constexpr bool kMin = false;
  static inline void unpack(const Block& w, int8x16_t& lo, int8x16_t& hi) { unpack_q5<Block, 16>(w, lo, hi); }
  static inline float scale(const Block& w) { return f16f(w.d); }
  static inline float min(const Block&) { return 0.0f; }
};
struct Q5_1 {
  using Block = block_q5_1;
  static constexpr bool kMin = true;
  static inline void unpack(const Block& w, int8x16_t& lo, int8x16_t& hi) { unpack_q5<Block, 0>(w, lo, hi); }
  static inline float scale(const Block& w) { return f16f(w.d); }
  static inline float min(const Block& w) { return f16f(w.m); }
};
struct MXFP4 {
  using Block = block_mxfp4;
  static constexpr bool kMin = false;
  static inline void unpack(const Block& w, int8x16_t& lo, int8x16_t& hi) {
    const int8x16_t tab = vld1q_s8(kimi::kvalues_mxfp4);
    const uint8x16_t b = vld1q_u8(w.qs);
    lo = vqtbl1q_s8(tab, vandq_u8(b, vdupq_n_u8(0x0F)));
    hi = vqtbl1q_s8(tab, vshrq_n_u8(b, 4));
  }
  static inline float scale(const Block& w) { return kimi::e8m0_to_f32_half(w.e); }
  static inline float min(const Block&) { return 0.0f; }
};

size_t q8_0_act_bytes(int64_t cols) { return static_cast<size_t>(cols / QK8_0) * sizeof(block_q8_0); }
void q8_0_prep(const float* x, int64_t cols, uint8_t* out) {
  kimi::quantize_row_q8_0(x, reinterpret_cast<block_q8_0*>(out), cols);
}

constexpr int kTok = 4;  // tokens per tile: a weight block is unpacked once for up to 4 tokens

// Rows [r0, r1) x tokens [0, nt) of a 32-element block type with block_q8_0 activations.
template <class P>
void run_q8(const kern::MatView& W, const uint8_t* act, size_t stride, int64_t nt, int64_t r0, int64_t r1, float* y,
            int64_t ldy) {
  using Block = typename P::Block;
  const int64_t nb = W.cols / 32;
  int64_t r = r0;
#if defined(__ARM_FEATURE_MATMUL_INT8)
  // SMMLA: 2 rows x 2 tokens per instruction (8-element chunks: a = rows, b = tokens)
  for (; r + 2 <= r1; r += 2) {
    const Block* w0 = reinterpret_cast<const Block*>(W.data + static_cast<uint64_t>(r) * W.row_bytes);
    const Block* w1 = reinterpret_cast<const Block*>(W.data + static_cast<uint64_t>(r + 1) * W.row_bytes);
    int64_t t = 0;
    for (; t + 2 <= nt; t += 2) {
      const block_q8_0* a0 = reinterpret_cast<const block_q8_0*>(act + t * stride);
      const block_q8_0* a1 = reinterpret_cast<const block_q8_0*>(act + (t + 1) * stride);
      float s00 = 0, s01 = 0, s10 = 0, s11 = 0;
      for (int64_t b = 0; b < nb; ++b) {
        int8x16_t l0, h0, l1, h1;
        P::unpack(w0[b], l0, h0);
        P::unpack(w1[b], l1, h1);
        const int8x16_t x0l = vld1q_s8(a0[b].qs), x0h = vld1q_s8(a0[b].qs + 16);
        const int8x16_t x1l = vld1q_s8(a1[b].qs), x1h = vld1q_s8(a1[b].qs + 16);
        int32x4_t acc = vdupq_n_s32(0);  // [r0t0, r0t1, r1t0, r1t1]
        acc = vmmlaq_s32(acc, vcombine_s8(vget_low_s8(l0), vget_low_s8(l1)), vcombine_s8(vget_low_s8(x0l), vget_low_s8(x1l)));
        acc = vmmlaq_s32(acc, vcombine_s8(vget_high_s8(l0), vget_high_s8(l1)), vcombine_s8(vget_high_s8(x0l), vget_high_s8(x1l)));
        acc = vmmlaq_s32(acc, vcombine_s8(vget_low_s8(h0), vget_low_s8(h1)), vcombine_s8(vget_low_s8(x0h), vget_low_s8(x1h)));
        acc = vmmlaq_s32(acc, vcombine_s8(vget_high_s8(h0), vget_high_s8(h1)), vcombine_s8(vget_high_s8(x0h), vget_high_s8(x1h)));
        const float d0 = P::scale(w0[b]), d1 = P::scale(w1[b]);
        const float e0 = f16f(a0[b].d), e1 = f16f(a1[b].d);
        s00 += static_cast<float>(vgetq_lane_s32(acc, 0)) * (d0 * e0);
        s01 += static_cast<float>(vgetq_lane_s32(acc, 1)) * (d0 * e1);
        s10 += static_cast<float>(vgetq_lane_s32(acc, 2)) * (d1 * e0);
        s11 += static_cast<float>(vgetq_lane_s32(acc, 3)) * (d1 * e1);
        if constexpr (P::kMin) {
          const int sa0 = vaddlvq_s8(x0l) + vaddlvq_s8(x0h), sa1 = vaddlvq_s8(x1l) + vaddlvq_s8(x1h);
          s00 += P::min(w0[b]) * (e0 * static_cast<float>(sa0));
          s01 += P::min(w0[b]) * (e1 * static_cast<float>(sa1));
          s10 += P::min(w1[b]) * (e0 * static_cast<float>(sa0));
          s11 += P::min(w1[b]) * (e1 * static_cast<float>(sa1));
        }
      }
      y[t * ldy + r] = s00;
      y[(t + 1) * ldy + r] = s01;
      y[t * ldy + r + 1] = s10;
      y[(t + 1) * ldy + r + 1] = s11;
    }
    if (t < nt) {  // the odd last token: the 1 x T path below for these two rows
      const block_q8_0* a = reinterpret_cast<const block_q8_0*>(act + t * stride);
      for (int i = 0; i < 2; ++i) {
        const Block* w = i == 0 ? w0 : w1;
        float s = 0;
        for (int64_t b = 0; b < nb; ++b) {
          int8x16_t lo, hi;
          P::unpack(w[b], lo, hi);
          const int8x16_t xl = vld1q_s8(a[b].qs), xh = vld1q_s8(a[b].qs + 16);
          const int isum = vaddvq_s32(dot16(dot16(vdupq_n_s32(0), lo, xl), hi, xh));
          const float e = f16f(a[b].d);
          s += static_cast<float>(isum) * (P::scale(w[b]) * e);
          if constexpr (P::kMin) s += P::min(w[b]) * (e * static_cast<float>(vaddlvq_s8(xl) + vaddlvq_s8(xh)));
        }
        y[t * ldy + r + i] = s;
      }
    }
  }
#endif
  for (; r < r1; ++r) {
    const Block* w = reinterpret_cast<const Block*>(W.data + static_cast<uint64_t>(r) * W.row_bytes);
    for (int64_t t0 = 0; t0 < nt; t0 += kTok) {
      const int tt = static_cast<int>(nt - t0 < kTok ? nt - t0 : kTok);
      const block_q8_0* a[kTok];
      float s[kTok] = {0, 0, 0, 0};
      for (int j = 0; j < tt; ++j) a[j] = reinterpret_cast<const block_q8_0*>(act + (t0 + j) * stride);
      for (int64_t b = 0; b < nb; ++b) {
        int8x16_t lo, hi;
        P::unpack(w[b], lo, hi);
        const float d = P::scale(w[b]);
        for (int j = 0; j < tt; ++j) {
          const int8x16_t xl = vld1q_s8(a[j][b].qs), xh = vld1q_s8(a[j][b].qs + 16);
          const int isum = vaddvq_s32(dot16(dot16(vdupq_n_s32(0), lo, xl), hi, xh));
          const float e = f16f(a[j][b].d);
          s[j] += static_cast<float>(isum) * (d * e);
          if constexpr (P::kMin) s[j] += P::min(w[b]) * (e * static_cast<float>(vaddlvq_s8(xl) + vaddlvq_s8(xh)));
        }
      }
      for (int j = 0; j < tt; ++j) y[(t0 + j) * ldy + r] = s[j];
    }
  }
}

// ---- K-quants with block_q8_K activations ----
// sum over 32 elements of (4-bit or 5-bit unsigned level) x activation
inline int dot32_u(uint8x16_t q0, uint8x16_t q1, const int8_t* x) {
  int32x4_t acc = dot16(vdupq_n_s32(0), vreinterpretq_s8_u8(q0), vld1q_s8(x));
  acc = dot16(acc, vreinterpretq_s8_u8(q1), vld1q_s8(x + 16));
  return vaddvq_s32(acc);
}

template <bool kQ5>
float dot_q45_K(const uint8_t* qs, const uint8_t* qh, const uint8_t* scales, uint16_t d, uint16_t dmin,
                const block_q8_K& a) {
  int sumi = 0, summ = 0;
  const uint8x16_t m4 = vdupq_n_u8(0x0F);
  uint8x16_t h0 = vdupq_n_u8(0), h1 = vdupq_n_u8(0);
  if constexpr (kQ5) {
    h0 = vld1q_u8(qh);
    h1 = vld1q_u8(qh + 16);
  }
  for (int p = 0; p < 4; ++p) {  // 4 x 32 bytes: sub-blocks 2p (low nibbles) and 2p+1 (high)
    const uint8x16_t b0 = vld1q_u8(qs + 32 * p), b1 = vld1q_u8(qs + 32 * p + 16);
    uint8x16_t l0 = vandq_u8(b0, m4), l1 = vandq_u8(b1, m4);
    uint8x16_t u0 = vshrq_n_u8(b0, 4), u1 = vshrq_n_u8(b1, 4);
    if constexpr (kQ5) {
      const uint8x16_t bl = vdupq_n_u8(static_cast<uint8_t>(1u << (2 * p)));
      const uint8x16_t bu = vdupq_n_u8(static_cast<uint8_t>(1u << (2 * p + 1)));
      const uint8x16_t x10 = vdupq_n_u8(0x10);
      l0 = vorrq_u8(l0, vandq_u8(vtstq_u8(h0, bl), x10));
      l1 = vorrq_u8(l1, vandq_u8(vtstq_u8(h1, bl), x10));
      u0 = vorrq_u8(u0, vandq_u8(vtstq_u8(h0, bu), x10));
      u1 = vorrq_u8(u1, vandq_u8(vtstq_u8(h1, bu), x10));
    }
    for (int half = 0; half < 2; ++half) {
      const int j = 2 * p + half;
      uint8_t sc, m;
      scale_min_k4(j, scales, &sc, &m);
      const int s = half == 0 ? dot32_u(l0, l1, a.qs + 32 * j) : dot32_u(u0, u1, a.qs + 32 * j);
      sumi += sc * s;
      summ += m * (a.bsums[2 * j] + a.bsums[2 * j + 1]);
    }
  }
  return a.d * (f16f(d) * static_cast<float>(sumi) - f16f(dmin) * static_cast<float>(summ));
}
float dot_q4_K(const block_q4_K& w, const block_q8_K& a) {
  return dot_q45_K<false>(w.qs, nullptr, w.scales, w.d, w.dmin, a);
}
float dot_q5_K(const block_q5_K& w, const block_q8_K& a) {
  return dot_q45_K<true>(w.qs, w.qh, w.scales, w.d, w.dmin, a);
}

float dot_q6_K(const block_q6_K& w, const block_q8_K& a) {
  int sumi = 0;
  const uint8x16_t m4 = vdupq_n_u8(0x0F), m3 = vdupq_n_u8(3);
  const int8x16_t k32 = vdupq_n_s8(32);
  for (int h = 0; h < 2; ++h) {
    const uint8_t* ql = w.ql + 64 * h;
    const uint8_t* qh = w.qh + 32 * h;
    for (int half = 0; half < 2; ++half) {  // l = 16 * half .. + 16
      const uint8x16_t hb = vld1q_u8(qh + 16 * half);
      const uint8x16_t la = vld1q_u8(ql + 16 * half), lb = vld1q_u8(ql + 32 + 16 * half);
      const uint8x16_t low[4] = {vandq_u8(la, m4), vandq_u8(lb, m4), vshrq_n_u8(la, 4), vshrq_n_u8(lb, 4)};
      const uint8x16_t hi[4] = {vandq_u8(hb, m3), vandq_u8(vshrq_n_u8(hb, 2), m3), vandq_u8(vshrq_n_u8(hb, 4), m3),
                                vshrq_n_u8(hb, 6)};
      for (int k = 0; k < 4; ++k) {
        const int8x16_t q = vsubq_s8(vreinterpretq_s8_u8(vorrq_u8(low[k], vshlq_n_u8(hi[k], 4))), k32);
        const int e0 = 128 * h + 32 * k + 16 * half;
        const int s = vaddvq_s32(dot16(vdupq_n_s32(0), q, vld1q_s8(a.qs + e0)));
        sumi += w.scales[e0 / 16] * s;
      }
    }
  }
  return a.d * f16f(w.d) * static_cast<float>(sumi);
}

template <typename Block, float (*Dot)(const Block&, const block_q8_K&)>
void run_k(const kern::MatView& W, const uint8_t* act, size_t stride, int64_t nt, int64_t r0, int64_t r1, float* y,
           int64_t ldy) {
  const int64_t nb = W.cols / QK_K;
  for (int64_t r = r0; r < r1; ++r) {
    const Block* w = reinterpret_cast<const Block*>(W.data + static_cast<uint64_t>(r) * W.row_bytes);
    for (int64_t t = 0; t < nt; ++t) {
      const block_q8_K* a = reinterpret_cast<const block_q8_K*>(act + t * stride);
      float sum = 0.0f;
      for (int64_t b = 0; b < nb; ++b) sum += Dot(w[b], a[b]);
      y[t * ldy + r] = sum;
    }
  }
}

// ---- float kernels ----
inline float bf16f(uint16_t h) {
  const uint32_t u = static_cast<uint32_t>(h) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
inline float hsum8(float32x4_t a, float32x4_t b) { return vaddvq_f32(vaddq_f32(a, b)); }

float dot_f32(const float* a, const float* b, int64_t n) {
  float32x4_t s0 = vdupq_n_f32(0), s1 = vdupq_n_f32(0), s2 = vdupq_n_f32(0), s3 = vdupq_n_f32(0);
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    s0 = vfmaq_f32(s0, vld1q_f32(a + i), vld1q_f32(b + i));
    s1 = vfmaq_f32(s1, vld1q_f32(a + i + 4), vld1q_f32(b + i + 4));
    s2 = vfmaq_f32(s2, vld1q_f32(a + i + 8), vld1q_f32(b + i + 8));
    s3 = vfmaq_f32(s3, vld1q_f32(a + i + 12), vld1q_f32(b + i + 12));
  }
  for (; i + 4 <= n; i += 4) s0 = vfmaq_f32(s0, vld1q_f32(a + i), vld1q_f32(b + i));
  float r = hsum8(vaddq_f32(s0, s1), vaddq_f32(s2, s3));
  for (; i < n; ++i) r += a[i] * b[i];
  return r;
}

// F32 weights, and every type at Precision::F32: the row decoded to f32 (scalar decoders), then
// f32 dots with up to 4 tokens at a time.
void run_f32(const kern::MatView& W, const uint8_t* act, size_t stride, int64_t nt, int64_t r0, int64_t r1, float* y,
             int64_t ldy) {
  float* buf = W.type == GgmlType::F32 ? nullptr : f32_scratch(W.cols, 1);
  for (int64_t r = r0; r < r1; ++r) {
    const uint8_t* src = W.data + static_cast<uint64_t>(r) * W.row_bytes;
    const float* wr;
    if (W.type == GgmlType::F32) {
      wr = reinterpret_cast<const float*>(src);
    } else {
      kimi::dequantize_row(W.type, src, buf, W.cols);
      wr = buf;
    }
    for (int64_t t = 0; t < nt; ++t) y[t * ldy + r] = dot_f32(wr, reinterpret_cast<const float*>(act + t * stride), W.cols);
  }
}

// F16 weights with f16-rounded activations (Precision::Fast): widened on the fly.
void run_f16(const kern::MatView& W, const uint8_t* act, size_t stride, int64_t nt, int64_t r0, int64_t r1, float* y,
             int64_t ldy) {
  const int64_t n = W.cols;
  for (int64_t r = r0; r < r1; ++r) {
    const uint16_t* w = reinterpret_cast<const uint16_t*>(W.data + static_cast<uint64_t>(r) * W.row_bytes);
    for (int64_t t = 0; t < nt; ++t) {
      const float* x = reinterpret_cast<const float*>(act + t * stride);
      float32x4_t s0 = vdupq_n_f32(0), s1 = vdupq_n_f32(0);
      int64_t i = 0;
      for (; i + 8 <= n; i += 8) {
        const float16x8_t h = vreinterpretq_f16_u16(vld1q_u16(w + i));
        s0 = vfmaq_f32(s0, vcvt_f32_f16(vget_low_f16(h)), vld1q_f32(x + i));
        s1 = vfmaq_f32(s1, vcvt_high_f32_f16(h), vld1q_f32(x + i + 4));
      }
      float s = hsum8(s0, s1);
      for (; i < n; ++i) s += f16f(w[i]) * x[i];
      y[t * ldy + r] = s;
    }
  }
}

// BF16 weights with bf16 activations (Precision::Fast; rows padded to 32 elements by prep_bf16).
void run_bf16(const kern::MatView& W, const uint8_t* act, size_t stride, int64_t nt, int64_t r0, int64_t r1, float* y,
              int64_t ldy) {
  const int64_t n = W.cols;
  for (int64_t r = r0; r < r1; ++r) {
    const uint16_t* w = reinterpret_cast<const uint16_t*>(W.data + static_cast<uint64_t>(r) * W.row_bytes);
    for (int64_t t = 0; t < nt; ++t) {
      const uint16_t* x = reinterpret_cast<const uint16_t*>(act + t * stride);
      int64_t i = 0;
      float s;
#if defined(__ARM_FEATURE_BF16_VECTOR_ARITHMETIC)
      float32x4_t acc = vdupq_n_f32(0);
      for (; i + 8 <= n; i += 8)
        acc = vbfdotq_f32(acc, vreinterpretq_bf16_u16(vld1q_u16(w + i)), vreinterpretq_bf16_u16(vld1q_u16(x + i)));
      s = vaddvq_f32(acc);
#else
      float32x4_t s0 = vdupq_n_f32(0), s1 = vdupq_n_f32(0);
      for (; i + 8 <= n; i += 8) {
        const uint16x8_t wv = vld1q_u16(w + i), xv = vld1q_u16(x + i);
        s0 = vfmaq_f32(s0, vreinterpretq_f32_u32(vshll_n_u16(vget_low_u16(wv), 16)),
                       vreinterpretq_f32_u32(vshll_n_u16(vget_low_u16(xv), 16)));
        s1 = vfmaq_f32(s1, vreinterpretq_f32_u32(vshll_high_n_u16(wv, 16)),
                       vreinterpretq_f32_u32(vshll_high_n_u16(xv, 16)));
      }
      s = hsum8(s0, s1);
#endif
      for (; i < n; ++i) s += bf16f(w[i]) * bf16f(x[i]);
      y[t * ldy + r] = s;
    }
  }
}

using kern::KernelRow;
const KernelRow kNeonKernels[] = {
    {GgmlType::F32, true, {nullptr, nullptr, run_f32, 0}},
    {GgmlType::F16, true, {nullptr, nullptr, run_f32, 1}},
    {GgmlType::BF16, true, {nullptr, nullptr, run_f32, 1}},
    {GgmlType::Q8_0, true, {nullptr, nullptr, run_f32, 1}},
    {GgmlType::Q4_0, true, {nullptr, nullptr, run_f32, 1}},
    {GgmlType::Q5_0, true, {nullptr, nullptr, run_f32, 1}},
    {GgmlType::Q5_1, true, {nullptr, nullptr, run_f32, 1}},
    {GgmlType::MXFP4, true, {nullptr, nullptr, run_f32, 1}},
    {GgmlType::Q4_K, true, {nullptr, nullptr, run_f32, 1}},
    {GgmlType::Q5_K, true, {nullptr, nullptr, run_f32, 1}},
    {GgmlType::Q6_K, true, {nullptr, nullptr, run_f32, 1}},
    {GgmlType::F16, false, {kern::f16r_act_bytes, kern::prep_f16r, run_f16}},
    {GgmlType::BF16, false, {kern::bf16_act_bytes, kern::prep_bf16, run_bf16}},
    {GgmlType::Q8_0, false, {q8_0_act_bytes, q8_0_prep, run_q8<Q8_0>}},
    {GgmlType::Q4_0, false, {q8_0_act_bytes, q8_0_prep, run_q8<Q4_0>}},
    {GgmlType::Q5_0, false, {q8_0_act_bytes, q8_0_prep, run_q8<Q5_0>}},
    {GgmlType::Q5_1, false, {q8_0_act_bytes, q8_0_prep, run_q8<Q5_1>}},
    {GgmlType::MXFP4, false, {q8_0_act_bytes, q8_0_prep, run_q8<MXFP4>}},
    {GgmlType::Q4_K, false, {kern::q8_K_act_bytes, kern::prep_q8_K, run_k<block_q4_K, dot_q4_K>}},
    {GgmlType::Q5_K, false, {kern::q8_K_act_bytes, kern::prep_q8_K, run_k<block_q5_K, dot_q5_K>}},
    {GgmlType::Q6_K, false, {kern::q8_K_act_bytes, kern::prep_q8_K, run_k<block_q6_K, dot_q6_K>}},
};

}  // namespace
