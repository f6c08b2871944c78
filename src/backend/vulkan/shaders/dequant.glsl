// Weight decoding for the matmul and row-gather shaders: dq8(row, c, v) writes the 8 consecutive
// values 8c .. 8c+7 of a weight row (row = device address of the row's first block). One of the
// VARIANT_* macros selects the type; layouts are ggml's (docs/spec/formats-quant.md).
uint b8(uint64_t a, uint o) { return uint(U8(a).v[o]); }
uint u16at(uint64_t a, uint o) { return b8(a, o) | (b8(a, o + 1u) << 8); }
float hf(uint64_t a, uint o) { return half_bits(u16at(a, o)); }
int s8(uint64_t a, uint o) { int v = int(b8(a, o)); return v >= 128 ? v - 256 : v; }

// Plain types (PLAIN_TYPE) may have any row length: dq1(row, j) decodes one value for the tail.
#if defined(VARIANT_F32)
#define PLAIN_TYPE 1
float dq1(uint64_t row, uint j) { return F32(row).v[j]; }
#elif defined(VARIANT_F16)
#define PLAIN_TYPE 1
float dq1(uint64_t row, uint j) { return half_bits(uint(U16(row).v[j])); }
#elif defined(VARIANT_BF16)
#define PLAIN_TYPE 1
float dq1(uint64_t row, uint j) { return uintBitsToFloat(uint(U16(row).v[j]) << 16); }
#endif
#if defined(PLAIN_TYPE)
// wide loads: the 8 values as one 16-byte load (two for F32) where the row is 16-byte aligned (rows of
// a whole number of 16 bytes, i.e. most weights); else one load per value
layout(buffer_reference, std430, buffer_reference_align = 16) buffer V4 { uvec4 v[]; };
void dq8(uint64_t row, uint c, out float v[8]) {
  if ((row & 15ul) != 0ul) {
    for (uint i = 0u; i < 8u; ++i) v[i] = dq1(row, c * 8u + i);
    return;
  }
#if defined(VARIANT_F32)
  const uvec4 a = V4(row + 32ul * uint64_t(c)).v[0], b = V4(row + 32ul * uint64_t(c) + 16ul).v[0];
  v[0] = uintBitsToFloat(a.x); v[1] = uintBitsToFloat(a.y); v[2] = uintBitsToFloat(a.z); v[3] = uintBitsToFloat(a.w);
  v[4] = uintBitsToFloat(b.x); v[5] = uintBitsToFloat(b.y); v[6] = uintBitsToFloat(b.z); v[7] = uintBitsToFloat(b.w);
#else
  const uvec4 a = V4(row + 16ul * uint64_t(c)).v[0];
  const uint w[4] = uint[4](a.x, a.y, a.z, a.w);
  for (uint i = 0u; i < 4u; ++i) {
#if defined(VARIANT_F16)
    const vec2 h = unpackHalf2x16(w[i]);
    v[2u * i] = h.x;
    v[2u * i + 1u] = h.y;
#else  // BF16: the high 16 bits of an f32
    v[2u * i] = uintBitsToFloat(w[i] << 16);
    v[2u * i + 1u] = uintBitsToFloat(w[i] & 0xFFFF0000u);
#endif
  }
#endif
}
#elif defined(VARIANT_Q8_0)  // {f16 d; int8 q[32]} = 34 bytes
void dq8(uint64_t row, uint c, out float v[8]) {
  uint64_t blk = row + uint64_t(c / 4u) * 34ul;
  float d = hf(blk, 0u);
  uint o = 2u + (c % 4u) * 8u;
  for (uint i = 0u; i < 8u; ++i) v[i] = d * float(s8(blk, o + i));
}
#elif defined(VARIANT_Q4_0)  // {f16 d; u8 qs[16]} = 18 bytes: j < 16 low nibbles, j >= 16 high
void dq8(uint64_t row, uint c, out float v[8]) {
  uint64_t blk = row + uint64_t(c / 4u) * 18ul;
  float d = hf(blk, 0u);
  uint j0 = (c % 4u) * 8u;
  for (uint i = 0u; i < 8u; ++i) {
    uint j = j0 + i;
    uint q = j < 16u ? (b8(blk, 2u + j) & 15u) : (b8(blk, 2u + j - 16u) >> 4);
    v[i] = d * float(int(q) - 8);
  }
}
#elif defined(VARIANT_Q5_0) || defined(VARIANT_Q5_1)
// Q5_0 {f16 d; u8 qh[4]; u8 qs[16]} = 22 bytes, value (q - 16) d
// Q5_1 {f16 d; f16 m; u8 qh[4]; u8 qs[16]} = 24 bytes, value q d + m; bit j of qh is element j's 5th bit
void dq8(uint64_t row, uint c, out float v[8]) {
#if defined(VARIANT_Q5_0)
  const uint BS = 22u, QH = 2u;
#else
  const uint BS = 24u, QH = 4u;
#endif
  uint64_t blk = row + uint64_t(c / 4u) * uint64_t(BS);
  float d = hf(blk, 0u);
  uint qh = b8(blk, QH) | (b8(blk, QH + 1u) << 8) | (b8(blk, QH + 2u) << 16) | (b8(blk, QH + 3u) << 24);
  uint j0 = (c % 4u) * 8u;
  for (uint i = 0u; i < 8u; ++i) {
    uint j = j0 + i;
    uint lo = j < 16u ? (b8(blk, QH + 4u + j) & 15u) : (b8(blk, QH + 4u + j - 16u) >> 4);
    uint q = lo | (((qh >> j) & 1u) << 4);
#if defined(VARIANT_Q5_0)
    v[i] = d * float(int(q) - 16);
#else
    v[i] = d * float(q) + hf(blk, 2u);
#endif
  }
}
#elif defined(VARIANT_MXFP4)  // {u8 e (E8M0); u8 qs[16]} = 17 bytes, ggml's doubled values x half scale
const float KV_MXFP4[16] = float[16](0., 1., 2., 3., 4., 6., 8., 12., 0., -1., -2., -3., -4., -6., -8., -12.);
void dq8(uint64_t row, uint c, out float v[8]) {
  uint64_t blk = row + uint64_t(c / 4u) * 17ul;
  uint e = b8(blk, 0u);
  float h = uintBitsToFloat(e < 2u ? (0x00200000u << e) : ((e - 1u) << 23));
  uint j0 = (c % 4u) * 8u;
  for (uint i = 0u; i < 8u; ++i) {
    uint j = j0 + i;
    uint q = j < 16u ? (b8(blk, 1u + j) & 15u) : (b8(blk, 1u + j - 16u) >> 4);
    v[i] = KV_MXFP4[q] * h;
  }
}
#elif defined(VARIANT_Q4_K) || defined(VARIANT_Q5_K)
// Q4_K {f16 d; f16 dmin; u8 scales[12]; u8 qs[128]} = 144 bytes
// Q5_K {f16 d; f16 dmin; u8 scales[12]; u8 qh[32]; u8 qs[128]} = 176 bytes
// 256 values in 4 chunks of 64: 32 low nibbles (sub-block 2k) then 32 high nibbles (2k+1)
void scale_min_k4(uint64_t blk, uint j, out uint d, out uint m) {
  if (j < 4u) {
    d = b8(blk, 4u + j) & 63u;
    m = b8(blk, 4u + j + 4u) & 63u;
  } else {
    d = (b8(blk, 4u + j + 4u) & 15u) | ((b8(blk, 4u + j - 4u) >> 6) << 4);
    m = (b8(blk, 4u + j + 4u) >> 4) | ((b8(blk, 4u + j) >> 6) << 4);
  }
}
void dq8(uint64_t row, uint c, out float v[8]) {
#if defined(VARIANT_Q4_K)
  const uint BS = 144u, QS = 16u;
#else
  const uint BS = 176u, QS = 48u;
#endif
  uint64_t blk = row + uint64_t(c / 32u) * uint64_t(BS);
  uint e0 = (c % 32u) * 8u;          // element in the block
  uint chunk = e0 / 64u, within = e0 % 64u, hi = within / 32u, l0 = within % 32u;
  uint sc, mn;
  scale_min_k4(blk, 2u * chunk + hi, sc, mn);
  float d = hf(blk, 0u) * float(sc), m = hf(blk, 2u) * float(mn);
  for (uint i = 0u; i < 8u; ++i) {
    uint l = l0 + i;
    uint qb = b8(blk, QS + chunk * 32u + l);
    uint q = hi == 0u ? (qb & 15u) : (qb >> 4);
#if defined(VARIANT_Q5_K)
    uint u = 1u << (2u * chunk + hi);
    if ((b8(blk, 16u + l) & u) != 0u) q += 16u;
#endif
    v[i] = d * float(q) - m;
  }
}
#elif defined(VARIANT_Q6_K)
// {u8 ql[128]; u8 qh[64]; i8 scales[16]; f16 d} = 210 bytes; two halves of 128 values, each four
// runs of 32: (ql low, qh bits 0-1), (ql+32 low, bits 2-3), (ql high, bits 4-5), (ql+32 high, bits 6-7)
void dq8(uint64_t row, uint c, out float v[8]) {
  uint64_t blk = row + uint64_t(c / 32u) * 210ul;
  uint e0 = (c % 32u) * 8u;
  uint half_ = e0 / 128u, r = e0 % 128u, run = r / 32u, l0 = r % 32u;
  float d = hf(blk, 208u);
  uint ql = half_ * 64u, qh = 128u + half_ * 32u, scb = 192u + half_ * 8u;
  for (uint i = 0u; i < 8u; ++i) {
    uint l = l0 + i;
    uint lo = (run & 1u) == 0u ? b8(blk, ql + l) : b8(blk, ql + l + 32u);
    lo = run < 2u ? (lo & 15u) : (lo >> 4);
    uint h = (b8(blk, qh + l) >> (2u * run)) & 3u;
    int q = int(lo | (h << 4)) - 32;
    int s = s8(blk, scb + l / 16u + 2u * run);
    v[i] = d * float(s) * float(q);
  }
}
#elif defined(VARIANT_Q2_K) || defined(VARIANT_Q3_K)
// Q2_K {u8 scales[16] (low nibble scale, high nibble min); u8 qs[64]; f16 d; f16 dmin} = 84 bytes
// Q3_K {u8 hmask[32]; u8 qs[64]; u8 scales[12] (16 x 6 bits, +32); f16 d} = 110 bytes
// element e: 2-bit level (qs[32(e/128) + e%32] >> 2((e%128)/32)) & 3, sub-block scale e/16;
// Q3_K: bit e/32 of hmask[e%32] clear = level - 4
void dq8(uint64_t row, uint c, out float v[8]) {
#if defined(VARIANT_Q2_K)
  const uint BS = 84u, QS = 16u;
#else
  const uint BS = 110u, QS = 32u;
#endif
  uint64_t blk = row + uint64_t(c / 32u) * uint64_t(BS);
  uint e0 = (c % 32u) * 8u, sb = e0 / 16u;
#if defined(VARIANT_Q2_K)
  uint sc = b8(blk, sb);
  float d = hf(blk, 80u) * float(sc & 15u), m = hf(blk, 82u) * float(sc >> 4);
#else
  uint lo = sb < 8u ? (b8(blk, 96u + sb) & 15u) : (b8(blk, 96u + sb - 8u) >> 4);
  uint hi = (b8(blk, 104u + sb % 4u) >> (2u * (sb / 4u))) & 3u;
  float d = hf(blk, 108u) * float(int(lo | (hi << 4)) - 32), m = 0.0;
#endif
  uint shift = 2u * ((e0 % 128u) / 32u);
  for (uint i = 0u; i < 8u; ++i) {
    uint e = e0 + i;
    int q = int((b8(blk, QS + 32u * (e / 128u) + e % 32u) >> shift) & 3u);
#if defined(VARIANT_Q3_K)
    if ((b8(blk, e % 32u) & (1u << (e / 32u))) == 0u) q -= 4;
#endif
    v[i] = d * float(q) - m;
  }
}
#elif defined(VARIANT_IQ4_XS)
// {f16 d; u16 scales_h; u8 scales_l[4]; u8 qs[128]} = 136 bytes; 8 sub-blocks of 32 with 6-bit
// scales (+32), values from the IQ4_NL table; sub-block bytes: low nibble j, high nibble j+16
const float KV_IQ4NL[16] = float[16](-127., -104., -83., -65., -49., -35., -22., -10., 1., 13., 25., 38., 53., 69., 89., 113.);
void dq8(uint64_t row, uint c, out float v[8]) {
  uint64_t blk = row + uint64_t(c / 32u) * 136ul;
  uint e0 = (c % 32u) * 8u, ib = e0 / 32u;
  uint ls = ((b8(blk, 4u + ib / 2u) >> (4u * (ib % 2u))) & 15u) | (((u16at(blk, 2u) >> (2u * ib)) & 3u) << 4);
  float d = hf(blk, 0u) * float(int(ls) - 32);
  for (uint i = 0u; i < 8u; ++i) {
    uint j = (e0 + i) % 32u;
    uint qb = b8(blk, 8u + ib * 16u + (j % 16u));
    v[i] = d * KV_IQ4NL[j < 16u ? (qb & 15u) : (qb >> 4)];
  }
}
#else
#error "dequant.glsl: no VARIANT_* type given"
#endif
