// Weight decoding for the matmul and row-gather shaders: dq8(row, c, v) writes the 8 consecutive
// values 8c .. 8c+7 of a weight row (row = device address of the row's first block). One of the
// VARIANT_* macros selects the type; layouts are ggml's (docs/spec/formats-quant.md).
uint b8(uint64_t a, uint o) { return uint(U8(a).v[o]); }
uint u16at(uint64_t a, uint o) { return b8(a, o) | (b8(a, o + 1u) << 8); }
float hf(uint64_t a, uint o) { return half_bits(u16at(a, o)); }
int s8(uint64_t a, uint o) { int v = int(b8(a, o)); return v >= 128 ? v - 256 : v; }

// Wide loads of block bytes (both kernels): aligned 4-byte words (16-byte where the blocks sit on 16
// bytes) with funnel shifts for any byte alignment; a word is read only if one of the wanted bytes
// lies in it, so no load reaches past the tensor's last word.
layout(buffer_reference, std430, buffer_reference_align = 4) buffer WU32 { uint v[]; };
layout(buffer_reference, std430, buffer_reference_align = 16) buffer WU4 { uvec4 v[]; };

// bits s .. s+31 of the 64-bit value hi:lo (0 <= s < 64)
uint fsh(uint lo, uint hi, uint s) { return uint(packUint2x32(uvec2(lo, hi)) >> s); }
// the 16 bytes at any byte address a: four aligned 4-byte loads, five where a is not 4-aligned
uvec4 ld16w(uint64_t a) {
  WU32 p = WU32(a & ~3ul);
  const uint s = uint(a & 3ul) * 8u;
  const uint w0 = p.v[0], w1 = p.v[1], w2 = p.v[2], w3 = p.v[3];
  uint w4 = 0u;
  if (s != 0u) w4 = p.v[4];
  return uvec4(fsh(w0, w1, s), fsh(w1, w2, s), fsh(w2, w3, s), fsh(w3, w4, s));
}
// the 4 bytes at any byte address a: one aligned 4-byte load, two where a is not 4-aligned
uint ld4w(uint64_t a) {
  WU32 p = WU32(a & ~3ul);
  const uint s = uint(a & 3ul) * 8u;
  uint w1 = 0u;
  if (s != 0u) w1 = p.v[1];
  return fsh(p.v[0], w1, s);
}
// the same with one 16-byte load where a is 16-aligned (types whose blocks all share an alignment,
// so the branch is uniform)
uvec4 ld16(uint64_t a) {
  if ((a & 15ul) == 0ul) return WU4(a).v[0];
  return ld16w(a);
}
// the 2 bytes at an even address as one 16-bit load (block types' f16 fields; bytes if odd)
uint ld2(uint64_t a) {
  if ((a & 1ul) == 0ul) return uint(U16(a).v[0]);
  return u16at(a, 0u);
}
// 4 low nibbles / signed bytes / 4 bits of the 4 bytes of a word, as a vec4
vec4 nib4(uint w) { return vec4((uvec4(w, w >> 8, w >> 16, w >> 24)) & 15u); }
vec4 sb4(uint w) { return vec4(ivec4(int(w << 24) >> 24, int(w << 16) >> 24, int(w << 8) >> 24, int(w) >> 24)); }
vec4 bits4(uint w, uint o) { return vec4((uvec4(w) >> (uvec4(0u, 1u, 2u, 3u) + o)) & 1u); }  // bits o .. o+3
vec4 bit4(uint w, uint j) { return vec4((uvec4(w, w >> 8, w >> 16, w >> 24) >> j) & 1u); }
float hsum(vec4 v) { return dot(v, vec4(1.0)); }
// byte i (0..7) of two words
uint byte8(uvec2 w, uint i) { return (w[i >> 2] >> (8u * (i & 3u))) & 255u; }
uvec2 ld8w(uint64_t a) { return uvec2(ld4w(a), ld4w(a + 4ul)); }

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
  float d = half_bits(ld2(blk));
  const uvec2 w = ld8w(blk + uint64_t(2u + (c % 4u) * 8u));
  for (uint i = 0u; i < 8u; ++i) v[i] = d * float(int(byte8(w, i) << 24) >> 24);
}
#elif defined(VARIANT_Q4_0)  // {f16 d; u8 qs[16]} = 18 bytes: j < 16 low nibbles, j >= 16 high
void dq8(uint64_t row, uint c, out float v[8]) {
  uint64_t blk = row + uint64_t(c / 4u) * 18ul;
  float d = half_bits(ld2(blk));
  uint j0 = (c % 4u) * 8u;
  const uvec2 w = ld8w(blk + uint64_t(2u + j0 % 16u));
  const uint sh = j0 < 16u ? 0u : 4u;
  for (uint i = 0u; i < 8u; ++i) v[i] = d * float(int((byte8(w, i) >> sh) & 15u) - 8);
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
  float d = half_bits(ld2(blk));
#if defined(VARIANT_Q5_1)
  float m = half_bits(ld2(blk + 2ul));
#endif
  uint qh = ld4w(blk + uint64_t(QH));
  uint j0 = (c % 4u) * 8u;
  const uvec2 w = ld8w(blk + uint64_t(QH + 4u + j0 % 16u));
  const uint sh = j0 < 16u ? 0u : 4u;
  for (uint i = 0u; i < 8u; ++i) {
    uint j = j0 + i;
    uint q = ((byte8(w, i) >> sh) & 15u) | (((qh >> j) & 1u) << 4);
#if defined(VARIANT_Q5_0)
    v[i] = d * float(int(q) - 16);
#else
    v[i] = d * float(q) + m;
#endif
  }
}
#elif defined(VARIANT_MXFP4)  // {u8 e (E8M0); u8 qs[16]} = 17 bytes, ggml's doubled values x half scale
// doubled E2M1 magnitudes 0 1 2 3 4 6 8 12 as nibbles of one constant; bit 3 is the sign
// (no table in private memory: a dynamically indexed constant array can land in local memory)
float e2m1x2(uint c) {
  const int m = int((0xC8643210u >> ((c & 7u) * 4u)) & 15u);
  return float((c & 8u) != 0u ? -m : m);  // code 8 is +0, as ggml's table has it
}
void dq8(uint64_t row, uint c, out float v[8]) {
  uint64_t blk = row + uint64_t(c / 4u) * 17ul;
  uint e = b8(blk, 0u);
  float h = uintBitsToFloat(e < 2u ? (0x00200000u << e) : ((e - 1u) << 23));
  uint j0 = (c % 4u) * 8u;
  const uvec2 w = ld8w(blk + uint64_t(1u + j0 % 16u));
  const uint sh = j0 < 16u ? 0u : 4u;
  for (uint i = 0u; i < 8u; ++i) v[i] = e2m1x2((byte8(w, i) >> sh) & 15u) * h;
}
#elif defined(VARIANT_Q4_K) || defined(VARIANT_Q5_K)
// Q4_K {f16 d; f16 dmin; u8 scales[12]; u8 qs[128]} = 144 bytes
// Q5_K {f16 d; f16 dmin; u8 scales[12]; u8 qh[32]; u8 qs[128]} = 176 bytes
// 256 values in 4 chunks of 64: 32 low nibbles (sub-block 2k) then 32 high nibbles (2k+1)
void dq8(uint64_t row, uint c, out float v[8]) {
#if defined(VARIANT_Q4_K)
  const uint BS = 144u, QS = 16u;
#else
  const uint BS = 176u, QS = 48u;
#endif
  uint64_t blk = row + uint64_t(c / 32u) * uint64_t(BS);
  uint e0 = (c % 32u) * 8u;          // element in the block
  uint chunk = e0 / 64u, within = e0 % 64u, hi = within / 32u, l0 = within % 32u;
  // the header (d, dmin, scales) as one 16-byte load where the blocks sit on 16 bytes
  const uvec4 hd = ld16(blk);
  const uint j = 2u * chunk + hi;
  const uint sj = (hd[1u + j / 4u] >> (8u * (j % 4u))) & 255u, sj4 = (hd[1u + (j + 4u) / 4u] >> (8u * (j % 4u))) & 255u;
  uint sc, mn;
  if (j < 4u) {
    sc = sj & 63u;
    mn = sj4 & 63u;
  } else {
    const uint sjm4 = (hd[(j - 4u) / 4u + 1u] >> (8u * (j % 4u))) & 255u;
    sc = (sj4 & 15u) | ((sjm4 >> 6) << 4);
    mn = (sj4 >> 4) | ((sj >> 6) << 4);
  }
  const vec2 dm = unpackHalf2x16(hd.x);
  float d = dm.x * float(sc), m = dm.y * float(mn);
  const uvec2 w = ld8w(blk + uint64_t(QS + chunk * 32u + l0));
#if defined(VARIANT_Q5_K)
  const uvec2 wh = ld8w(blk + uint64_t(16u + l0));
#endif
  for (uint i = 0u; i < 8u; ++i) {
    uint q = (byte8(w, i) >> (4u * hi)) & 15u;
#if defined(VARIANT_Q5_K)
    q += ((byte8(wh, i) >> j) & 1u) << 4;
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
  float d = half_bits(ld2(blk + 208ul));
  uint ql = half_ * 64u + (run & 1u) * 32u, qh = 128u + half_ * 32u, scb = 192u + half_ * 8u;
  const uvec2 wl = ld8w(blk + uint64_t(ql + l0)), wh = ld8w(blk + uint64_t(qh + l0));
  int s = s8(blk, scb + l0 / 16u + 2u * run);  // l0 .. l0+7 share one 16-value scale
  for (uint i = 0u; i < 8u; ++i) {
    uint lo = (byte8(wl, i) >> (run < 2u ? 0u : 4u)) & 15u;
    uint h = (byte8(wh, i) >> (2u * run)) & 3u;
    int q = int(lo | (h << 4)) - 32;
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
  const uvec2 wq = ld8w(blk + uint64_t(QS + 32u * (e0 / 128u) + e0 % 32u));
#if defined(VARIANT_Q3_K)
  const uvec2 wm = ld8w(blk + uint64_t(e0 % 32u));
#endif
  for (uint i = 0u; i < 8u; ++i) {
    int q = int((byte8(wq, i) >> shift) & 3u);
#if defined(VARIANT_Q3_K)
    if ((byte8(wm, i) & (1u << (e0 / 32u))) == 0u) q -= 4;
#endif
    v[i] = d * float(q) - m;
  }
}
#elif defined(VARIANT_IQ4_XS)
// {f16 d; u16 scales_h; u8 scales_l[4]; u8 qs[128]} = 136 bytes; 8 sub-blocks of 32 with 6-bit
// scales (+32), values from the IQ4_NL table; sub-block bytes: low nibble j, high nibble j+16
// the IQ4_NL table as 16 signed bytes of a constant vector (a dynamically indexed constant array can
// land in local memory): -127 -104 -83 -65 -49 -35 -22 -10 1 13 25 38 53 69 89 113
const uvec4 KV_IQ4NL_B = uvec4(0xBFAD9881u, 0xF6EADDCFu, 0x26190D01u, 0x71594535u);
float kv_iq4nl(uint c) { return float(int(KV_IQ4NL_B[c >> 2] << (24u - 8u * (c & 3u))) >> 24); }
void dq8(uint64_t row, uint c, out float v[8]) {
  uint64_t blk = row + uint64_t(c / 32u) * 136ul;
  uint e0 = (c % 32u) * 8u, ib = e0 / 32u;
  uint ls = ((b8(blk, 4u + ib / 2u) >> (4u * (ib % 2u))) & 15u) | (((u16at(blk, 2u) >> (2u * ib)) & 3u) << 4);
  float d = hf(blk, 0u) * float(int(ls) - 32);
  const uint j0 = e0 % 32u;
  const uvec2 w = ld8w(blk + uint64_t(8u + ib * 16u + j0 % 16u));
  for (uint i = 0u; i < 8u; ++i) v[i] = d * kv_iq4nl((byte8(w, i) >> (j0 < 16u ? 0u : 4u)) & 15u);
}
#else
#error "dequant.glsl: no VARIANT_* type given"
#endif

// ---- Wide-load unit dots for the decode GEMV (mm.comp) ----
// dot32(row, u, x) = sum over the 32 values 32u .. 32u+31 of a weight row times x[0..31] (x as 8
// vec4). Block types only (their rows hold whole blocks of 32 or 256 values). Each invocation reads
// its unit's bytes as 4-byte words (one 16-byte load where the type's blocks sit on 16 bytes: Q4_K,
// Q5_K), never byte by byte, and applies each block or sub-block scale once to its sum. A word is
// read only if one of the unit's bytes lies in it, so no load reaches past the tensor's last word.
#if !defined(PLAIN_TYPE)
#define HAVE_DOT32 1
#endif

#if defined(VARIANT_MXFP4)
vec4 mx4(uint w) { return vec4(e2m1x2(w & 15u), e2m1x2((w >> 8) & 15u), e2m1x2((w >> 16) & 15u), e2m1x2((w >> 24) & 15u)); }
float dot32(uint64_t row, uint u, vec4 x[8]) {
  // 17 bytes from any byte alignment: always the five words that hold them
  const uint64_t a = row + uint64_t(u) * 17ul;
  WU32 p = WU32(a & ~3ul);
  const uint s = uint(a & 3ul) * 8u;
  const uint w0 = p.v[0], w1 = p.v[1], w2 = p.v[2], w3 = p.v[3], w4 = p.v[4];
  const uint e = (w0 >> s) & 255u;
  const uint q[4] = uint[4](fsh(w0, w1, s + 8u), fsh(w1, w2, s + 8u), fsh(w2, w3, s + 8u), fsh(w3, w4, s + 8u));
  float sum = 0.0;
  for (uint i = 0u; i < 4u; ++i) sum += dot(mx4(q[i]), x[i]) + dot(mx4(q[i] >> 4), x[i + 4u]);
  return sum * uintBitsToFloat(e < 2u ? (0x00200000u << e) : ((e - 1u) << 23));
}
#elif defined(VARIANT_Q8_0)
float dot32(uint64_t row, uint u, vec4 x[8]) {
  const uint64_t a = row + uint64_t(u) * 34ul;
  const uvec4 q0 = ld16w(a + 2ul), q1 = ld16w(a + 18ul);
  const uint q[8] = uint[8](q0.x, q0.y, q0.z, q0.w, q1.x, q1.y, q1.z, q1.w);
  float sum = 0.0;
  for (uint i = 0u; i < 8u; ++i) sum += dot(sb4(q[i]), x[i]);
  return half_bits(ld2(a)) * sum;
}
#elif defined(VARIANT_Q4_0)
float dot32(uint64_t row, uint u, vec4 x[8]) {
  const uint64_t a = row + uint64_t(u) * 18ul;
  const uvec4 qv = ld16w(a + 2ul);
  const uint q[4] = uint[4](qv.x, qv.y, qv.z, qv.w);
  float sum = 0.0;
  for (uint i = 0u; i < 4u; ++i) sum += dot(nib4(q[i]) - 8.0, x[i]) + dot(nib4(q[i] >> 4) - 8.0, x[i + 4u]);
  return half_bits(ld2(a)) * sum;
}
#elif defined(VARIANT_Q5_0) || defined(VARIANT_Q5_1)
float dot32(uint64_t row, uint u, vec4 x[8]) {
#if defined(VARIANT_Q5_0)
  const uint64_t a = row + uint64_t(u) * 22ul;
  const uint QH = 2u;
#else
  const uint64_t a = row + uint64_t(u) * 24ul;
  const uint QH = 4u;
#endif
  // qh (4 bytes) and qs (16) in 20 bytes from QH: one 16-byte load and the last word
  const uvec4 hv = ld16w(a + uint64_t(QH));
  const uint qh = hv.x;
  const uint q[4] = uint[4](hv.y, hv.z, hv.w, ld4w(a + uint64_t(QH) + 16ul));
  float sum = 0.0;
  for (uint i = 0u; i < 4u; ++i)
    sum += dot(nib4(q[i]) + 16.0 * bits4(qh, 4u * i), x[i]) + dot(nib4(q[i] >> 4) + 16.0 * bits4(qh, 16u + 4u * i), x[i + 4u]);
  const float d = half_bits(ld2(a));
#if defined(VARIANT_Q5_0)
  float xs = 0.0;
  for (uint i = 0u; i < 8u; ++i) xs += hsum(x[i]);
  return d * (sum - 16.0 * xs);
#else
  float xs = 0.0;
  for (uint i = 0u; i < 8u; ++i) xs += hsum(x[i]);
  return d * sum + half_bits(ld2(a + 2ul)) * xs;
#endif
}
#elif defined(VARIANT_Q4_K) || defined(VARIANT_Q5_K)
// unit j of a super-block = sub-block j: chunk j/2, low (j even) or high (odd) nibbles of its 32 bytes
float dot32(uint64_t row, uint u, vec4 x[8]) {
#if defined(VARIANT_Q4_K)
  const uint64_t blk = row + uint64_t(u / 8u) * 144ul;
  const uint QS = 16u;
#else
  const uint64_t blk = row + uint64_t(u / 8u) * 176ul;
  const uint QS = 48u;
#endif
  const uint j = u % 8u, c = j / 2u, sh = 4u * (j % 2u);
  const uvec4 h = ld16(blk);  // d, dmin, scales[12]
  // ggml's 6-bit scale and min j: byte k of scales is byte k % 4 of word 1 + k / 4 of the header
  const uint sj = (h[1u + j / 4u] >> (8u * (j % 4u))) & 255u;
  const uint sj4 = (h[1u + (j + 4u) / 4u] >> (8u * (j % 4u))) & 255u;
  uint sc, mn;
  if (j < 4u) {
    sc = sj & 63u;
    mn = sj4 & 63u;
  } else {
    const uint sjm4 = (h[1u + (j - 4u) / 4u] >> (8u * (j % 4u))) & 255u;
    sc = (sj4 & 15u) | ((sjm4 >> 6) << 4);
    mn = (sj4 >> 4) | ((sj >> 6) << 4);
  }
  const uvec4 q0 = ld16(blk + uint64_t(QS + 32u * c)), q1 = ld16(blk + uint64_t(QS + 32u * c + 16u));
  const uint q[8] = uint[8](q0.x, q0.y, q0.z, q0.w, q1.x, q1.y, q1.z, q1.w);
#if defined(VARIANT_Q5_K)
  const uvec4 h0 = ld16(blk + 16ul), h1 = ld16(blk + 32ul);
  const uint qh[8] = uint[8](h0.x, h0.y, h0.z, h0.w, h1.x, h1.y, h1.z, h1.w);
#endif
  float sum = 0.0, xs = 0.0;
  for (uint i = 0u; i < 8u; ++i) {
#if defined(VARIANT_Q5_K)
    sum += dot(nib4(q[i] >> sh) + 16.0 * bit4(qh[i], j), x[i]);
#else
    sum += dot(nib4(q[i] >> sh), x[i]);
#endif
    xs += hsum(x[i]);
  }
  const vec2 dm = unpackHalf2x16(h.x);
  return dm.x * float(sc) * sum - dm.y * float(mn) * xs;
}
#elif defined(VARIANT_Q6_K)
// unit: half h = j / 4, run = j % 4 of the super-block: 32 bytes of ql (nibble run / 2), 32 of qh
// (bits 2 run), two signed scales (elements 0-15, 16-31)
float dot32(uint64_t row, uint u, vec4 x[8]) {
  const uint64_t blk = row + uint64_t(u / 8u) * 210ul;
  const uint j = u % 8u, hf_ = j / 4u, run = j % 4u;
  const uint64_t ql = blk + uint64_t(hf_ * 64u + (run & 1u) * 32u), qh = blk + uint64_t(128u + hf_ * 32u);
  const uvec4 l0 = ld16w(ql), l1 = ld16w(ql + 16ul), h0 = ld16w(qh), h1 = ld16w(qh + 16ul);
  const uint lo[8] = uint[8](l0.x, l0.y, l0.z, l0.w, l1.x, l1.y, l1.z, l1.w);
  const uint hi[8] = uint[8](h0.x, h0.y, h0.z, h0.w, h1.x, h1.y, h1.z, h1.w);
  const uint lsh = 4u * (run >> 1), hsh = 2u * run;
  float s0 = 0.0, s1 = 0.0;
  for (uint i = 0u; i < 8u; ++i) {
    const vec4 q = nib4(lo[i] >> lsh) + 16.0 * vec4((uvec4(hi[i], hi[i] >> 8, hi[i] >> 16, hi[i] >> 24) >> hsh) & 3u) - 32.0;
    if (i < 4u) s0 += dot(q, x[i]); else s1 += dot(q, x[i]);
  }
  const uint sc = ld2(blk + uint64_t(192u + hf_ * 8u + 2u * run));
  return half_bits(ld2(blk + 208ul)) * (float(int(sc << 24) >> 24) * s0 + float(int(sc << 16) >> 24) * s1);
}
#elif defined(VARIANT_Q2_K) || defined(VARIANT_Q3_K)
// unit j: elements 32j .. 32j+31: 2-bit levels from 32 bytes of qs (half j / 4, shift 2 (j % 4)),
// sub-blocks 2j and 2j+1; Q3_K: bit j of the 32 hmask bytes clear = level - 4
float dot32(uint64_t row, uint u, vec4 x[8]) {
#if defined(VARIANT_Q2_K)
  const uint64_t blk = row + uint64_t(u / 8u) * 84ul;
  const uint QS = 16u;
#else
  const uint64_t blk = row + uint64_t(u / 8u) * 110ul;
  const uint QS = 32u;
#endif
  const uint j = u % 8u, sh = 2u * (j % 4u);
  const uint64_t qa = blk + uint64_t(QS + 32u * (j / 4u));
  const uvec4 q0 = ld16w(qa), q1 = ld16w(qa + 16ul);
  const uint q[8] = uint[8](q0.x, q0.y, q0.z, q0.w, q1.x, q1.y, q1.z, q1.w);
#if defined(VARIANT_Q3_K)
  const uvec4 m0 = ld16w(blk), m1 = ld16w(blk + 16ul);
  const uint hm[8] = uint[8](m0.x, m0.y, m0.z, m0.w, m1.x, m1.y, m1.z, m1.w);
#endif
  float s0 = 0.0, s1 = 0.0, x0 = 0.0, x1 = 0.0;
  for (uint i = 0u; i < 8u; ++i) {
    vec4 l = vec4((uvec4(q[i], q[i] >> 8, q[i] >> 16, q[i] >> 24) >> sh) & 3u);
#if defined(VARIANT_Q3_K)
    l -= 4.0 * (1.0 - bit4(hm[i], j));
#endif
    if (i < 4u) {
      s0 += dot(l, x[i]);
      x0 += hsum(x[i]);
    } else {
      s1 += dot(l, x[i]);
      x1 += hsum(x[i]);
    }
  }
#if defined(VARIANT_Q2_K)
  const uint sc = ld2(blk + uint64_t(2u * j));  // scales[2j], scales[2j+1]
  const uint dd = ld2(blk + 80ul) | (ld2(blk + 82ul) << 16);
  const vec2 dm = unpackHalf2x16(dd);
  return dm.x * (float(sc & 15u) * s0 + float((sc >> 8) & 15u) * s1) -
         dm.y * (float((sc >> 4) & 15u) * x0 + float((sc >> 12) & 15u) * x1);
#else
  // scales[12] and d are the 14 bytes at 96: read as the 16 bytes at 94 (inside the block)
  const uvec4 t = ld16w(blk + 94ul);
  float r = 0.0;
  for (uint k = 0u; k < 2u; ++k) {
    const uint sb = 2u * j + k;
    const uint b_lo = 2u + (sb < 8u ? sb : sb - 8u), b_hi = 2u + 8u + sb % 4u;
    const uint lo = ((t[b_lo / 4u] >> (8u * (b_lo % 4u))) >> (sb < 8u ? 0u : 4u)) & 15u;
    const uint hi = ((t[b_hi / 4u] >> (8u * (b_hi % 4u))) >> (2u * (sb / 4u))) & 3u;
    r += float(int(lo | (hi << 4)) - 32) * (k == 0u ? s0 : s1);
  }
  return half_bits(t.w >> 16) * r;
#endif
}
#elif defined(VARIANT_IQ4_XS)
float dot32(uint64_t row, uint u, vec4 x[8]) {
  const uint64_t blk = row + uint64_t(u / 8u) * 136ul;
  const uint ib = u % 8u;
  const uvec4 h = ld16w(blk);  // d, scales_h, scales_l[4], the first 8 bytes of qs
  const uint ls = ((h.y >> (4u * ib)) & 15u) | (((h.x >> (16u + 2u * ib)) & 3u) << 4);
  const uvec4 qv = ld16w(blk + uint64_t(8u + 16u * ib));
  const uint q[4] = uint[4](qv.x, qv.y, qv.z, qv.w);
  float sum = 0.0;
  for (uint i = 0u; i < 4u; ++i) {
    const uvec4 lo = uvec4(q[i], q[i] >> 8, q[i] >> 16, q[i] >> 24) & 15u;
    const uvec4 hi = uvec4(q[i] >> 4, q[i] >> 12, q[i] >> 20, q[i] >> 28) & 15u;
    sum += dot(vec4(kv_iq4nl(lo.x), kv_iq4nl(lo.y), kv_iq4nl(lo.z), kv_iq4nl(lo.w)), x[i]) +
           dot(vec4(kv_iq4nl(hi.x), kv_iq4nl(hi.y), kv_iq4nl(hi.z), kv_iq4nl(hi.w)), x[i + 4u]);
  }
  return unpackHalf2x16(h.x).x * float(int(ls) - 32) * sum;
}
#endif
