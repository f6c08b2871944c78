// matmul / matmul_rows / dequantize_row for every weight type, both precisions and every ISA level
// this CPU supports, against a float64 reference that decodes the weights straight from the block
// layouts of formats-quant.md (no call into the code under test) and emulates the activation
// rounding of Precision::Fast.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "backend/cpu/dispatch.h"
#include "backend/cpu/matmul.h"
#include "backend/cpu/matmul_amx.h"
#include "backend/cpu/quantize_act.h"
#include "backend/cpu/repack.h"
#include "backend/cpu/vec.h"
#include "tensor/quants.h"
#include "tensor/types.h"
#include "util/error.h"

using namespace kimi;
using namespace kimi::kern;

namespace {

// ------------------------------ reference decode (float64) ------------------------------
uint16_t rd16(const uint8_t* p) { return static_cast<uint16_t>(p[0] | (p[1] << 8)); }
double h16(const uint8_t* p) { return f16_to_f32(rd16(p)); }

const int kMx[16] = {0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12};

void kscale(int j, const uint8_t* s, int* sc, int* m) {  // 6-bit scale/min pairs of Q4_K/Q5_K
  if (j < 4) {
    *sc = s[j] & 63;
    *m = s[j + 4] & 63;
  } else {
    *sc = (s[j + 4] & 15) | ((s[j - 4] >> 6) << 4);
    *m = (s[j + 4] >> 4) | ((s[j] >> 6) << 4);
  }
}

// decode element c of one row
double ref_elem(GgmlType t, const uint8_t* row, int64_t c) {
  switch (t) {
    case GgmlType::F32: { float f; std::memcpy(&f, row + 4 * c, 4); return f; }
    case GgmlType::F16: return h16(row + 2 * c);
    case GgmlType::BF16: { uint32_t u = static_cast<uint32_t>(rd16(row + 2 * c)) << 16; float f; std::memcpy(&f, &u, 4); return f; }
    case GgmlType::Q8_0: {
      const uint8_t* b = row + (c / 32) * 34;
      return h16(b) * static_cast<int8_t>(b[2 + c % 32]);
    }
    case GgmlType::Q4_0: {
      const uint8_t* b = row + (c / 32) * 18;
      const int j = c % 32;
      const int q = j < 16 ? (b[2 + j] & 15) : (b[2 + j - 16] >> 4);
      return h16(b) * (q - 8);
    }
    case GgmlType::Q5_0: case GgmlType::Q5_1: {  // formats-quant.md §4: qh (LE u32) bit j = 5th bit of element j
      const bool one = t == GgmlType::Q5_1;
      const uint8_t* b = row + (c / 32) * (one ? 24 : 22);
      const uint8_t* qh = b + (one ? 4 : 2);
      const uint8_t* qs = qh + 4;
      const int j = c % 32;
      const int lo = j < 16 ? (qs[j] & 15) : (qs[j - 16] >> 4);
      const int bit = (qh[j / 8] >> (j % 8)) & 1;
      const int q = lo + 16 * bit;
      return one ? h16(b) * q + h16(b + 2) : h16(b) * (q - 16);
    }
    case GgmlType::MXFP4: {
      const uint8_t* b = row + (c / 32) * 17;
      const int j = c % 32;
      const int q = j < 16 ? (b[1 + j] & 15) : (b[1 + j - 16] >> 4);
      // OCP: E2M1 value x 2^(e-127) == doubled kvalue x 2^(e-128)
      return kMx[q] * std::ldexp(1.0, static_cast<int>(b[0]) - 128);
    }
    case GgmlType::Q4_K: {
      const uint8_t* b = row + (c / 256) * 144;
      const int e = c % 256;
      const int cc = e / 64, l = e % 32;
      const uint8_t qb = b[16 + 32 * cc + l];
      const int q = (e % 64) < 32 ? (qb & 15) : (qb >> 4);
      int sc, m;
      kscale(e / 32, b + 4, &sc, &m);
      return h16(b) * sc * q - h16(b + 2) * m;
    }
    case GgmlType::Q5_K: {
      const uint8_t* b = row + (c / 256) * 176;
      const int e = c % 256;
      const int cc = e / 64, l = e % 32, hi = (e % 64) >= 32;
      const uint8_t qb = b[48 + 32 * cc + l];
      const int low = hi ? (qb >> 4) : (qb & 15);
      const int bit = (b[16 + l] >> (2 * cc + hi)) & 1;
      int sc, m;
      kscale(e / 32, b + 4, &sc, &m);
      return h16(b) * sc * (low | (bit << 4)) - h16(b + 2) * m;
    }
    case GgmlType::Q6_K: {
      const uint8_t* b = row + (c / 256) * 210;
      const int e = c % 256;
      const int h = e / 128, k = (e % 128) / 32, l = e % 32;
      const uint8_t* ql = b + 64 * h;
      const uint8_t* qh = b + 128 + 32 * h;
      int low;
      switch (k) {
        case 0: low = ql[l] & 15; break;
        case 1: low = ql[32 + l] & 15; break;
        case 2: low = ql[l] >> 4; break;
        default: low = ql[32 + l] >> 4; break;
      }
      const int hi2 = (qh[l] >> (2 * k)) & 3;
      const int8_t sc = static_cast<int8_t>(b[192 + e / 16]);
      return h16(b + 208) * sc * ((low | (hi2 << 4)) - 32);
    }
    case GgmlType::Q2_K: {  // formats-quant.md §4.4
      const uint8_t* b = row + (c / 256) * 84;
      const int e = c % 256;
      const int q = (b[16 + 32 * (e / 128) + e % 32] >> (2 * ((e % 128) / 32))) & 3;
      return h16(b + 80) * (b[e / 16] & 15) * q - h16(b + 82) * (b[e / 16] >> 4);
    }
    case GgmlType::Q3_K: {
      const uint8_t* b = row + (c / 256) * 110;
      const int e = c % 256, t = e / 16;
      const int low = (b[32 + 32 * (e / 128) + e % 32] >> (2 * ((e % 128) / 32))) & 3;
      const int hb = (b[e % 32] >> (e / 32)) & 1;
      const uint8_t* sc = b + 96;
      const int s = (t < 8 ? (sc[t] & 15) : (sc[t - 8] >> 4)) | (((sc[8 + t % 4] >> (2 * (t / 4))) & 3) << 4);
      return h16(b + 108) * (s - 32) * (low - (hb ? 0 : 4));
    }
    case GgmlType::IQ4_XS: {  // formats-quant.md §4.6
      static const int kT[16] = {-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113};
      const uint8_t* b = row + (c / 256) * 136;
      const int e = c % 256, ib = e / 32, j = e % 32;
      const int sh = b[2] | (b[3] << 8);
      const int ls = ((b[4 + ib / 2] >> (4 * (ib % 2))) & 15) | (((sh >> (2 * ib)) & 3) << 4);
      const uint8_t q = b[8 + 16 * ib + j % 16];
      return h16(b) * (ls - 32) * kT[j < 16 ? (q & 15) : (q >> 4)];
    }
    case GgmlType::IQ2_XS: {
      const uint8_t* b = row + (c / 256) * 74;
      const int e = c % 256, g = e / 8, i = e % 8;
      const int q = b[2 + 2 * g] | (b[3 + 2 * g] << 8);
      const int s7 = q >> 9;
      const int neg = i < 7 ? (s7 >> i) & 1 : __builtin_popcount(s7) & 1;
      const int lvl = (kIq2xsGrid[q & 511] >> (2 * i)) & 3;
      const int s4 = (b[66 + e / 32] >> (4 * ((e % 32) / 16))) & 15;
      return h16(b) * (2 * s4 + 1) / 8.0 * (lvl == 0 ? 8 : lvl == 1 ? 25 : 43) * (neg ? -1 : 1);
    }
    default: ADD_FAILURE() << "no reference for type"; return 0;
  }
}

// ------------------------------ activation emulation ------------------------------
// Q8_0 as ggml: d = amax/127, q = roundf(x * (1/d)), value q * f16(d)
void emulate_q8_0(const float* x, int64_t n, double* out) {
  for (int64_t b = 0; b < n / 32; ++b) {
    float amax = 0;
    for (int j = 0; j < 32; ++j) amax = std::max(amax, std::fabs(x[32 * b + j]));
    const float d = amax / 127.0f;
    const float id = d != 0 ? 1.0f / d : 0.0f;
    const double dh = f16_to_f32(f32_to_f16(d));
    for (int j = 0; j < 32; ++j) out[32 * b + j] = std::roundf(x[32 * b + j] * id) * dh;
  }
}
// Q8_K: signed max M, iscale = -127/M, q = min(127, rne(iscale x)), d = 1/iscale (float)
void emulate_q8_K(const float* x, int64_t n, double* out) {
  for (int64_t b = 0; b < n / 256; ++b) {
    float amax = 0, vmax = 0;
    for (int j = 0; j < 256; ++j)
      if (std::fabs(x[256 * b + j]) > amax) { amax = std::fabs(x[256 * b + j]); vmax = x[256 * b + j]; }
    if (amax == 0) { for (int j = 0; j < 256; ++j) out[256 * b + j] = 0; continue; }
    const float iscale = -127.0f / vmax;
    const float d = 1.0f / iscale;
    for (int j = 0; j < 256; ++j) {
      const int q = std::min(127, static_cast<int>(std::nearbyint(iscale * x[256 * b + j])));
      out[256 * b + j] = static_cast<double>(q) * d;
    }
  }
}

void emulate_act(GgmlType t, Precision p, const float* x, int64_t n, double* out) {
  if (p == Precision::F32 || t == GgmlType::F32) {
    for (int64_t i = 0; i < n; ++i) out[i] = x[i];
    return;
  }
  switch (t) {
    case GgmlType::BF16: for (int64_t i = 0; i < n; ++i) out[i] = bf16_to_f32(f32_to_bf16(x[i])); return;
    case GgmlType::F16: for (int64_t i = 0; i < n; ++i) out[i] = f16_to_f32(f32_to_f16(x[i])); return;
    case GgmlType::Q8_0: case GgmlType::Q4_0: case GgmlType::MXFP4: case GgmlType::Q5_0: case GgmlType::Q5_1:
      emulate_q8_0(x, n, out);  // Q5_1 pairs with Q8_1, whose d and q are the Q8_0 ones
      return;
    default: emulate_q8_K(x, n, out); return;
  }
}

// ------------------------------ random weights ------------------------------
uint16_t f16_bits(float v) { return f32_to_f16(v); }
void put16(uint8_t* p, uint16_t v) { p[0] = v & 0xff; p[1] = v >> 8; }

std::vector<uint8_t> random_weights(GgmlType t, int64_t rows, int64_t cols, std::mt19937& rng) {
  const uint64_t rb = row_bytes(t, cols);
  std::vector<uint8_t> w(rb * rows);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  std::uniform_int_distribution<int> byte(0, 255);
  for (auto& b : w) b = static_cast<uint8_t>(byte(rng));
  for (int64_t r = 0; r < rows; ++r) {
    uint8_t* row = w.data() + r * rb;
    switch (t) {
      case GgmlType::F32: for (int64_t c = 0; c < cols; ++c) { float f = u(rng); std::memcpy(row + 4 * c, &f, 4); } break;
      case GgmlType::F16: for (int64_t c = 0; c < cols; ++c) put16(row + 2 * c, f16_bits(u(rng))); break;
      case GgmlType::BF16: for (int64_t c = 0; c < cols; ++c) put16(row + 2 * c, f32_to_bf16(u(rng))); break;
      case GgmlType::Q8_0: for (int64_t b = 0; b < cols / 32; ++b) put16(row + 34 * b, f16_bits(0.002f + 0.01f * std::fabs(u(rng)))); break;
      case GgmlType::Q4_0: for (int64_t b = 0; b < cols / 32; ++b) put16(row + 18 * b, f16_bits(0.05f * u(rng))); break;
      case GgmlType::Q5_0: for (int64_t b = 0; b < cols / 32; ++b) put16(row + 22 * b, f16_bits(0.03f * u(rng))); break;
      case GgmlType::Q5_1:
        for (int64_t b = 0; b < cols / 32; ++b) {
          put16(row + 24 * b, f16_bits(0.002f + 0.03f * std::fabs(u(rng))));
          put16(row + 24 * b + 2, f16_bits(-0.5f * std::fabs(u(rng))));
        }
        break;
      case GgmlType::MXFP4: for (int64_t b = 0; b < cols / 32; ++b) row[17 * b] = static_cast<uint8_t>(120 + byte(rng) % 12); break;
      case GgmlType::Q4_K: case GgmlType::Q5_K:
        for (int64_t b = 0; b < cols / 256; ++b) {
          uint8_t* blk = row + (t == GgmlType::Q4_K ? 144 : 176) * b;
          put16(blk, f16_bits(0.01f * std::fabs(u(rng)) + 0.001f));
          put16(blk + 2, f16_bits(0.01f * std::fabs(u(rng))));
        }
        break;
      case GgmlType::Q6_K: for (int64_t b = 0; b < cols / 256; ++b) put16(row + 210 * b + 208, f16_bits(0.001f * u(rng))); break;
      case GgmlType::Q2_K:
        for (int64_t b = 0; b < cols / 256; ++b) {
          put16(row + 84 * b + 80, f16_bits(0.01f * std::fabs(u(rng)) + 0.001f));
          put16(row + 84 * b + 82, f16_bits(0.01f * std::fabs(u(rng))));
        }
        break;
      case GgmlType::Q3_K: for (int64_t b = 0; b < cols / 256; ++b) put16(row + 110 * b + 108, f16_bits(0.003f * u(rng))); break;
      case GgmlType::IQ4_XS: for (int64_t b = 0; b < cols / 256; ++b) put16(row + 136 * b, f16_bits(0.0003f * u(rng))); break;
      case GgmlType::IQ2_XS: for (int64_t b = 0; b < cols / 256; ++b) put16(row + 74 * b, f16_bits(0.002f * u(rng))); break;
      default: break;
    }
  }
  return w;
}

struct Case {
  GgmlType type;
  std::vector<int64_t> cols;
};

// every level this CPU has (x86-64: scalar, avx2, avx512; aarch64: scalar, neon, neon_dot, neon_i8mm)
std::vector<Isa> isa_levels() { return supported_isas(); }

struct IsaRestore {
  Isa saved = current_isa();
  ~IsaRestore() { set_isa(saved); }
};

class MatmulTypes : public ::testing::TestWithParam<Case> {};

TEST_P(MatmulTypes, MatchesFloat64Reference) {
  const Case cs = GetParam();
  IsaRestore restore;
  ThreadPool pool(2);
  std::mt19937 rng(1234 + static_cast<int>(cs.type));
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  const int64_t rows_list[] = {1, 3, 17, 130};
  // 70 tokens: more than one token tile (64 max) and several register tiles with a ragged edge
  const int64_t tok_list[] = {1, 2, 7, 33, 70};
  // Under an emulator (scripts/cross-test.sh sets KIMI_TEST_EMULATED) the widest rows, 130 rows and
  // 70 tokens are left out (each costs minutes there); the other sizes still reach every tile edge.
  const bool emulated = std::getenv("KIMI_TEST_EMULATED") != nullptr;
  for (int64_t cols : cs.cols) {
    if (emulated && cols > 1024) continue;
    for (int64_t rows : rows_list) {
      if (emulated && rows > 17) continue;
      const auto w = random_weights(cs.type, rows, cols, rng);
      const MatView W{cs.type, w.data(), rows, cols, row_bytes(cs.type, cols)};
      // decoded weights (float64, from the layout) and per-row check of dequantize_row
      std::vector<double> wd(rows * cols);
      std::vector<float> drow(cols);
      for (int64_t r = 0; r < rows; ++r) {
        for (int64_t c = 0; c < cols; ++c) wd[r * cols + c] = ref_elem(cs.type, w.data() + r * W.row_bytes, c);
        dequantize_row(W, r, drow.data());
        for (int64_t c = 0; c < cols; ++c) {
          // exact except K-quants with a min (d*sc*q - dmin*m is evaluated in float)
          double tol = 0;
          if (cs.type == GgmlType::Q4_K || cs.type == GgmlType::Q5_K) {
            const uint8_t* blk = w.data() + r * W.row_bytes + (c / 256) * (cs.type == GgmlType::Q4_K ? 144 : 176);
            tol = 3e-7 * (std::fabs(h16(blk)) * 63 * 31 + std::fabs(h16(blk + 2)) * 63);
          } else if (cs.type == GgmlType::Q5_1 || cs.type == GgmlType::Q2_K) {  // one f32 rounding of the sum
            tol = 6e-8 * std::fabs(wd[r * cols + c]);
          }
          ASSERT_NEAR(static_cast<double>(drow[c]), wd[r * cols + c], tol) << type_name(cs.type) << " r=" << r << " c=" << c;
        }
      }
      for (int64_t nt : tok_list) {
        if (emulated && nt > 33) continue;
        std::vector<float> x(nt * cols);
        for (auto& v : x) v = u(rng);
        if (nt > 2) x[cols] = 0, x[cols + 1] = 3.5f;  // an outlier and a zero
        for (Precision prec : {Precision::F32, Precision::Fast}) {
          std::vector<double> xe(nt * cols), ref(nt * rows), mag(nt * rows);
          for (int64_t t = 0; t < nt; ++t) emulate_act(cs.type, prec, &x[t * cols], cols, &xe[t * cols]);
          for (int64_t t = 0; t < nt; ++t)
            for (int64_t r = 0; r < rows; ++r) {
              double s = 0, m = 0;
              for (int64_t c = 0; c < cols; ++c) {
                const double p = wd[r * cols + c] * xe[t * cols + c];
                s += p;
                m += std::fabs(p);
              }
              ref[t * rows + r] = s;
              mag[t * rows + r] = m;
            }
          for (Isa isa : isa_levels()) {
            set_isa(isa);
            std::vector<float> y(nt * rows, NAN), y2(nt * rows, NAN);
            matmul(W, x.data(), nt, y.data(), pool, prec);
            // matmul_rows over two pieces
            const int64_t mid = rows / 2;
            matmul_rows(W, x.data(), nt, y2.data(), 0, mid, prec);
            matmul_rows(W, x.data(), nt, y2.data(), mid, rows, prec);
            for (int64_t i = 0; i < nt * rows; ++i) {
              const double tol = 1e-5 * mag[i] + 1e-30;
              ASSERT_NEAR(y[i], ref[i], tol) << type_name(cs.type) << " isa=" << isa_name(isa)
                  << " prec=" << (prec == Precision::F32 ? "f32" : "fast") << " rows=" << rows << " cols=" << cols
                  << " nt=" << nt << " i=" << i;
              ASSERT_NEAR(y2[i], ref[i], tol) << "matmul_rows " << type_name(cs.type) << " isa=" << isa_name(isa)
                  << " rows=" << rows << " cols=" << cols << " nt=" << nt << " i=" << i;
            }
          }
        }
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(
    AllTypes, MatmulTypes,
    ::testing::Values(Case{GgmlType::F32, {1, 7, 33, 4160}}, Case{GgmlType::F16, {1, 7, 33, 4160}},
                      Case{GgmlType::BF16, {1, 7, 33, 64, 4160}}, Case{GgmlType::Q8_0, {32, 96, 4160}},
                      Case{GgmlType::Q4_0, {32, 96, 4160}}, Case{GgmlType::Q5_0, {32, 96, 4160}},
                      Case{GgmlType::Q5_1, {32, 96, 4160}}, Case{GgmlType::MXFP4, {32, 96, 160, 4160}},
                      Case{GgmlType::Q4_K, {256, 768}}, Case{GgmlType::Q5_K, {256, 768}},
                      Case{GgmlType::Q6_K, {256, 768}}, Case{GgmlType::Q2_K, {256, 768}},
                      Case{GgmlType::Q3_K, {256, 768}}, Case{GgmlType::IQ4_XS, {256, 768}},
                      Case{GgmlType::IQ2_XS, {256, 768}}),
    [](const ::testing::TestParamInfo<Case>& i) { return std::string(type_name(i.param.type)); });

// Packed (x16 row-interleaved) copies of K-quant weights (repack.h): the packed kernels, with the
// rows outside whole groups of 16 through the plain kernels, against the float64 reference at every
// level (a level without packed kernels reads the original), through matmul and through
// matmul_rows over ragged row ranges. 130 rows = 8 groups + 2 tail rows; 70 tokens = several
// 8-token tiles with a ragged one.
TEST(Matmul, PackedKQuantsMatchReference) {
  IsaRestore restore;
  ThreadPool pool(2);
  std::mt19937 rng(4321);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  bool packed_any = false;
  for (GgmlType type : {GgmlType::Q4_K, GgmlType::Q5_K, GgmlType::Q6_K}) {
    for (int64_t cols : {256, 768}) {
      for (int64_t rows : {16, 37, 130}) {
        const auto w = random_weights(type, rows, cols, rng);
        MatView W{type, w.data(), rows, cols, row_bytes(type, cols)};
        set_isa(best_isa());
        const auto P = pack_weight(W, &pool);
        if (P) {
          packed_any = true;
          ASSERT_EQ(P->groups, rows / 16);
        }
        W.packed = P.get();
        std::vector<double> wd(rows * cols);
        for (int64_t r = 0; r < rows; ++r)
          for (int64_t c = 0; c < cols; ++c) wd[r * cols + c] = ref_elem(type, w.data() + r * W.row_bytes, c);
        for (int64_t nt : {1, 2, 8, 9, 70}) {
          std::vector<float> x(nt * cols);
          for (auto& v : x) v = u(rng);
          std::vector<double> xe(nt * cols), ref(nt * rows), mag(nt * rows);
          for (int64_t t = 0; t < nt; ++t) emulate_act(type, Precision::Fast, &x[t * cols], cols, &xe[t * cols]);
          for (int64_t t = 0; t < nt; ++t)
            for (int64_t r = 0; r < rows; ++r) {
              double s = 0, m = 0;
              for (int64_t c = 0; c < cols; ++c) {
                s += wd[r * cols + c] * xe[t * cols + c];
                m += std::fabs(wd[r * cols + c] * xe[t * cols + c]);
              }
              ref[t * rows + r] = s;
              mag[t * rows + r] = m;
            }
          if (rows > 16) {  // views narrowed after packing: a prefix of the rows, and rows 16.. (moved data)
            set_isa(best_isa());
            for (int64_t skip : {int64_t{0}, int64_t{16}}) {
              MatView V = W;
              V.data += static_cast<uint64_t>(skip) * W.row_bytes;
              V.rows = rows - skip - 3;
              std::vector<float> yv(nt * V.rows, NAN);
              matmul(V, x.data(), nt, yv.data(), pool, Precision::Fast);
              for (int64_t t = 0; t < nt; ++t)
                for (int64_t r = 0; r < V.rows; ++r)
                  ASSERT_NEAR(yv[t * V.rows + r], ref[t * rows + skip + r], 1e-5 * mag[t * rows + skip + r] + 1e-30)
                      << type_name(type) << " narrowed view skip=" << skip << " rows=" << rows << " nt=" << nt;
            }
          }
          for (Isa isa : isa_levels()) {
            set_isa(isa);
            std::vector<float> y(nt * rows, NAN), y2(nt * rows, NAN);
            matmul(W, x.data(), nt, y.data(), pool, Precision::Fast);
            const int64_t cuts[] = {0, 5, rows / 2 + 3, rows};  // ragged, mostly not on group boundaries
            for (int i = 0; i < 3; ++i)
              matmul_rows(W, x.data(), nt, y2.data(), std::min(cuts[i], rows), std::min(cuts[i + 1], rows));
            for (int64_t i = 0; i < nt * rows; ++i) {
              const double tol = 1e-5 * mag[i] + 1e-30;
              ASSERT_NEAR(y[i], ref[i], tol) << type_name(type) << " packed isa=" << isa_name(isa) << " rows=" << rows
                                             << " cols=" << cols << " nt=" << nt << " i=" << i;
              ASSERT_NEAR(y2[i], ref[i], tol) << "matmul_rows " << type_name(type) << " packed isa=" << isa_name(isa)
                                              << " rows=" << rows << " cols=" << cols << " nt=" << nt << " i=" << i;
            }
          }
        }
      }
    }
  }
  if (!packed_any) GTEST_SKIP() << "no packed K-quant kernels at this CPU's best ISA level (" << isa_name(best_isa()) << ")";
}

// matmul_set (several weights on one input, one pool job for one token) gives every weight exactly
// what its own matmul gives, bit for bit: packed K-quants with tail rows, plain K-quants, MXFP4,
// BF16, Q5_0, F32 and a 16-row weight in one set, at every ISA level, for 1 and 3 tokens.
TEST(Matmul, MatmulSetEqualsOneMatmulPerWeight) {
  IsaRestore restore;
  ThreadPool pool(2), many(7);  // 7: more chunks than items of some weights, workers reading the caller's list
  std::mt19937 rng(99);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  const int64_t cols = 512;
  struct Wt {
    GgmlType type;
    int64_t rows;
  };
  const Wt specs[] = {{GgmlType::Q4_K, 37}, {GgmlType::Q6_K, 130}, {GgmlType::MXFP4, 96}, {GgmlType::BF16, 40},
                      {GgmlType::Q5_0, 64}, {GgmlType::F32, 16}, {GgmlType::Q4_K, 16}};
  constexpr int kN = 7;
  std::vector<std::vector<uint8_t>> data;
  std::vector<std::unique_ptr<PackedWeight>> packs;
  MatView W[kN];
  set_isa(best_isa());
  for (int i = 0; i < kN; ++i) {
    data.push_back(random_weights(specs[i].type, specs[i].rows, cols, rng));
    W[i] = MatView{specs[i].type, data.back().data(), specs[i].rows, cols, row_bytes(specs[i].type, cols)};
    packs.push_back(pack_weight(W[i], &pool));
    W[i].packed = packs.back().get();
  }
  const MatView* wp[kN];
  for (int i = 0; i < kN; ++i) wp[i] = &W[i];
  for (int64_t nt : {1, 3}) {
    std::vector<float> x(nt * cols);
    for (auto& v : x) v = u(rng);
    for (Isa isa : isa_levels()) {
      set_isa(isa);
      std::vector<std::vector<float>> a(kN), b(kN);
      float* yp[kN];
      for (int i = 0; i < kN; ++i) {
        a[i].assign(nt * specs[i].rows, NAN);
        b[i].assign(nt * specs[i].rows, NAN);
        matmul(W[i], x.data(), nt, a[i].data(), pool, Precision::Fast);
        yp[i] = b[i].data();
      }
      for (ThreadPool* p : {&pool, &many}) {
        for (auto& v : b) std::fill(v.begin(), v.end(), NAN);
        matmul_set(wp, yp, kN, x.data(), nt, *p, Precision::Fast);
        for (int i = 0; i < kN; ++i)
          ASSERT_EQ(std::memcmp(a[i].data(), b[i].data(), a[i].size() * 4), 0)
              << "weight " << i << " " << type_name(specs[i].type) << " isa=" << isa_name(isa) << " nt=" << nt
              << " threads=" << p->size();
      }
    }
  }
}

// The AMX BF16 GEMM (matmul_amx.h), called directly so that the test cannot pass without it: against
// the float64 reference of the bf16-rounded activations (the products are exact, only the f32 sums
// differ) and against the AVX2 kernel. Shapes: 5, 16, 48 and 83 rows (fewer than a tile, 32-row blocks,
// a 16-row block, a zero-padded last tile), 32 and 2080 columns, 1 / 3 / 16 / 31 / 300 tokens (one token
// block read in place, padded token blocks, a group of 16 blocks and a ragged one); 1 and 3 threads. Then
// the invariance that the rest of the engine relies on: matmul on 1 or 3 threads, matmul_rows over ranges
// that cut 16-row groups and one token alone give the same bits.
// matmul on one and on three threads, and matmul_rows over the ranges [cut[i], cut[i + 1]), give exactly
// the bits of ref (rows x nt tokens): the AMX paths' results do not depend on the split.
void expect_same_bits_through_matmul(const MatView& W, const std::vector<float>& x, int64_t nt,
                                     const std::vector<float>& ref, const std::vector<int64_t>& cut, ThreadPool& one,
                                     ThreadPool& three, const std::string& what) {
  std::vector<float> y1(nt * W.rows, NAN), y3(nt * W.rows, NAN), yc(nt * W.rows, NAN);
  matmul(W, x.data(), nt, y1.data(), one, Precision::Fast);
  matmul(W, x.data(), nt, y3.data(), three, Precision::Fast);
  for (size_t i = 0; i + 1 < cut.size(); ++i)
    matmul_rows(W, x.data(), nt, yc.data(), std::min(cut[i], W.rows), std::min(cut[i + 1], W.rows), Precision::Fast);
  ASSERT_EQ(std::memcmp(y1.data(), ref.data(), ref.size() * 4), 0) << what << " (1 thread)";
  ASSERT_EQ(std::memcmp(y3.data(), ref.data(), ref.size() * 4), 0) << what << " (3 threads)";
  ASSERT_EQ(std::memcmp(yc.data(), ref.data(), ref.size() * 4), 0) << what << " (matmul_rows over cuts)";
}

TEST(Matmul, AmxBf16TilesMatchReference) {
  if (!amx_bf16_usable()) GTEST_SKIP() << "no AMX-BF16 on this CPU (or the OS did not grant the tile state)";
  IsaRestore restore;
  set_isa(Isa::Avx512);
  ThreadPool one(1), three(3);
  std::mt19937 rng(4242);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  for (int64_t cols : {32, 2080}) {
    for (int64_t rows : {5, 16, 48, 83, 300}) {
      const auto w = random_weights(GgmlType::BF16, rows, cols, rng);
      const MatView W{GgmlType::BF16, w.data(), rows, cols, row_bytes(GgmlType::BF16, cols)};
      for (int64_t nt : {1, 3, 16, 31, 300, 530}) {
        // the prefill items: rows 300 = a 256-row block + 44 (the last 12 a 16-row tile); 2080 columns = 8
        // K blocks of 256 + 32; 530 tokens = two token groups, the last with an odd block. The float64
        // reference of the big shapes is slow: only 300 x 2080 x 530 of them (every 13th token checked).
        const bool big = cols > 32 && nt > 31 && rows > 16;
        if ((rows == 300) != (nt == 530) || (big && rows != 300)) continue;
        const int64_t tstep = big ? 13 : 1;
        std::vector<float> x(nt * cols);
        for (auto& v : x) v = u(rng);
        x[nt > 1 ? cols + 5 : 5] = 0.0f;
        x[nt > 1 ? cols + 6 : 6] = 40.0f;
        std::vector<float> yk(nt * rows, NAN);
        set_isa(Isa::Avx512);
        ASSERT_TRUE(amx_bf16_takes(W, nt));
        for (ThreadPool* pool : {&one, &three}) {
          std::vector<float> y(nt * rows, NAN);
          ASSERT_EQ(matmul_amx_bf16(W, x.data(), nt, y.data(), pool, 0, rows), rows);
          // the AVX-512 kernel on the same rows (KIMI_ISA-like switch: AMX is used at the avx512 level only)
          set_isa(Isa::Avx2);
          ASSERT_FALSE(amx_bf16_takes(W, nt));
          matmul_rows(W, x.data(), nt, yk.data(), 0, rows, Precision::Fast);
          set_isa(Isa::Avx512);
          for (int64_t t = 0; t < nt; t += tstep)
            for (int64_t r = 0; r < rows; ++r) {
              const int64_t i = t * rows + r;
              double sum = 0, m = 0;
              for (int64_t c = 0; c < cols; ++c) {
                const double p = ref_elem(GgmlType::BF16, w.data() + r * W.row_bytes, c) *
                                 static_cast<double>(bf16_to_f32(f32_to_bf16(x[t * cols + c])));
                sum += p;
                m += std::fabs(p);
              }
              ASSERT_NEAR(y[i], sum, 2e-6 * m + 1e-30) << "rows=" << rows << " cols=" << cols << " nt=" << nt
                                                       << " t=" << t << " r=" << r << " threads=" << pool->size();
              ASSERT_NEAR(y[i], yk[i], 4e-6 * m + 1e-30) << "vs avx2 kernel, t=" << t << " r=" << r;
            }
        }
        // the same bits through matmul (1 and 3 threads) and matmul_rows over ranges that cut 16-row groups
        std::vector<float> ya(nt * rows, NAN);
        matmul(W, x.data(), nt, ya.data(), one, Precision::Fast);
        ASSERT_NO_FATAL_FAILURE(expect_same_bits_through_matmul(
            W, x, nt, ya, {0, 7, 40, 270, rows}, one, three,
            std::to_string(rows) + "x" + std::to_string(cols) + " nt=" + std::to_string(nt)));
        // the copy in the AMX tile order (repack.h: 32-row groups, the last zero-padded) gives the same bits,
        // prefill and decode, with ranges that cut its groups
        const auto P = pack_weight(W, &three);
        ASSERT_NE(P, nullptr);
        ASSERT_EQ(P->groups, (rows + 31) / 32);
        MatView Wp = W;
        Wp.packed = P.get();
        ASSERT_NO_FATAL_FAILURE(expect_same_bits_through_matmul(
            Wp, x, nt, ya, {0, 7, 40, 270, rows}, one, three,
            "packed " + std::to_string(rows) + "x" + std::to_string(cols) + " nt=" + std::to_string(nt)));
        if (nt > 1) {  // token 1 and the last token alone (decode) equal their rows of the batch (prefill)
          std::vector<float> y1(rows), y1p(rows);
          for (int64_t t : {int64_t{1}, nt - 1}) {
            matmul(W, x.data() + t * cols, 1, y1.data(), three, Precision::Fast);
            ASSERT_EQ(std::memcmp(y1.data(), ya.data() + t * rows, rows * 4), 0)
                << rows << "x" << cols << " nt=" << nt << " t=" << t;
            matmul(Wp, x.data() + t * cols, 1, y1p.data(), three, Precision::Fast);
            ASSERT_EQ(std::memcmp(y1p.data(), y1.data(), rows * 4), 0)
                << "packed " << rows << "x" << cols << " nt=" << nt << " t=" << t;
          }
        }
      }
    }
  }
  // what it does not take: columns not a multiple of 32, other precisions (matmul_rows' caller check)
  std::vector<float> x(16 * 48, 0.5f), y(16 * 16);
  const auto w = random_weights(GgmlType::BF16, 16, 48, rng);
  const MatView odd{GgmlType::BF16, w.data(), 16, 48, row_bytes(GgmlType::BF16, 48)};
  EXPECT_FALSE(amx_bf16_takes(odd, 16));
  EXPECT_EQ(matmul_amx_bf16(odd, x.data(), 16, y.data(), &one, 2, 16), 2);
  EXPECT_TRUE(amx_bf16_takes(MatView{GgmlType::BF16, w.data(), 16, 32, row_bytes(GgmlType::BF16, 32)}, 1));
  EXPECT_EQ(pack_weight(odd), nullptr);  // no tile order for columns not a multiple of 32
  // a packed copy made from other data (a view that moved: a slice, a rank's rows) is not used
  const auto w2 = random_weights(GgmlType::BF16, 16, 32, rng);
  MatView a{GgmlType::BF16, w.data(), 16, 32, row_bytes(GgmlType::BF16, 32)}, b = a;
  b.data = w2.data();
  const auto Pa = pack_weight(a);
  ASSERT_NE(Pa, nullptr);
  b.packed = Pa.get();
  std::vector<float> yb(16), yr(16);
  matmul(b, x.data(), 1, yb.data(), one, Precision::Fast);
  b.packed = nullptr;
  matmul(b, x.data(), 1, yr.data(), one, Precision::Fast);
  EXPECT_EQ(std::memcmp(yb.data(), yr.data(), 16 * 4), 0);
}

// BF16 in the bf16 x16 order (repack.h; AVX-512 BF16 without AMX): the packed kernel (4 groups x 6 tokens
// per register tile, one pass over the columns; the last group zero-padded) against the
// float64 reference, and every token's row of a batch the same bits as the token alone (prefill == decode,
// a sequence in a batch == alone) at every token count around the tile (6) and token-tile (96) edges,
// through matmul on 1 and 3 threads and matmul_rows over ranges that cut the 16-row groups. Rows: 16 = one
// group, 37 = 2 groups + a padded one of 5 rows, 83 = 5 groups (a 4-group panel and one more) + 3, 130 = 8 + 2;
// columns: one 32-column step, 2080, 4160.
TEST(Matmul, PackedBf16MatchesReferenceAndBatchEqualsAlone) {
  IsaRestore restore;
  set_isa(best_isa());
  if (amx_bf16_usable() || !packed_kernel_available(GgmlType::BF16))
    GTEST_SKIP() << "the bf16 x16 order is for AVX-512 BF16 without AMX (best level here: " << isa_name(best_isa()) << ")";
  ThreadPool one(1), three(3);
  std::mt19937 rng(5151);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  for (int64_t cols : {32, 2080, 4160}) {
    for (int64_t rows : {16, 37, 83, 130}) {
      const auto w = random_weights(GgmlType::BF16, rows, cols, rng);
      MatView W{GgmlType::BF16, w.data(), rows, cols, row_bytes(GgmlType::BF16, cols)};
      const auto P = pack_weight(W, &three);
      ASSERT_NE(P, nullptr) << rows << "x" << cols;
      ASSERT_EQ(P->groups, (rows + 15) / 16);  // the last group zero-padded
      ASSERT_EQ(P->group_rows, 16);
      W.packed = P.get();
      std::vector<double> wd(rows * cols);
      for (int64_t r = 0; r < rows; ++r)
        for (int64_t c = 0; c < cols; ++c) wd[r * cols + c] = ref_elem(GgmlType::BF16, w.data() + r * W.row_bytes, c);
      for (int64_t nt : {1, 2, 5, 6, 7, 13, 16, 95, 97, 200}) {
        if (cols > 2080 && rows > 37 && nt > 16 && nt != 97) continue;  // keep the float64 reference quick
        std::vector<float> x(nt * cols);
        for (auto& v : x) v = u(rng);
        x[nt > 1 ? cols + 5 : 5] = 0.0f;
        x[nt > 1 ? cols + 6 : 6] = 40.0f;
        std::vector<float> y(nt * rows, NAN);
        matmul(W, x.data(), nt, y.data(), one, Precision::Fast);
        const std::string what = std::to_string(rows) + "x" + std::to_string(cols) + " nt=" + std::to_string(nt);
        // matmul_rows over ranges that cut the groups (those rows through the plain kernel)
        std::vector<float> yc(nt * rows, NAN);
        for (int64_t c : {int64_t{0}, int64_t{7}, int64_t{40}})
          matmul_rows(W, x.data(), nt, yc.data(), std::min(c, rows), std::min(c == 0 ? 7 : c == 7 ? 40 : rows, rows),
                      Precision::Fast);
        for (int64_t t = 0; t < nt; ++t)
          for (int64_t r = 0; r < rows; ++r) {
            double s = 0, m = 0;
            for (int64_t c = 0; c < cols; ++c) {
              const double p = wd[r * cols + c] * static_cast<double>(bf16_to_f32(f32_to_bf16(x[t * cols + c])));
              s += p;
              m += std::fabs(p);
            }
            ASSERT_NEAR(y[t * rows + r], s, 1e-5 * m + 1e-30) << what << " t=" << t << " r=" << r;
            ASSERT_NEAR(yc[t * rows + r], s, 1e-5 * m + 1e-30) << "matmul_rows over cut groups " << what << " t=" << t
                                                                << " r=" << r;
          }
        // the same bits on 1 and 3 threads and over ranges on group boundaries (a range that cuts a group runs
        // those rows through the plain kernel, whose sums are in another order: checked above)
        ASSERT_NO_FATAL_FAILURE(
            expect_same_bits_through_matmul(W, x, nt, y, {0, 16, 48, 64, rows}, one, three, "packed " + what));
        std::vector<float> y1(rows, NAN);
        for (int64_t t = 0; t < nt; ++t) {  // each token alone (the one-token product of the same copy)
          matmul(W, x.data() + t * cols, 1, y1.data(), three, Precision::Fast);
          ASSERT_EQ(std::memcmp(y1.data(), y.data() + t * rows, rows * 4), 0) << what << " t=" << t;
        }
      }
    }
  }
  // a packed copy made from other data (a view that moved) is not used; columns not a multiple of 32 are not packed
  const auto w = random_weights(GgmlType::BF16, 32, 64, rng), w2 = random_weights(GgmlType::BF16, 32, 64, rng);
  MatView a{GgmlType::BF16, w.data(), 32, 64, row_bytes(GgmlType::BF16, 64)}, b = a;
  b.data = w2.data();
  const auto Pa = pack_weight(a);
  ASSERT_NE(Pa, nullptr);
  b.packed = Pa.get();
  std::vector<float> x(3 * 64, 0.25f), yb(3 * 32), yr(3 * 32);
  matmul(b, x.data(), 3, yb.data(), one, Precision::Fast);
  b.packed = nullptr;
  matmul(b, x.data(), 3, yr.data(), one, Precision::Fast);
  EXPECT_EQ(std::memcmp(yb.data(), yr.data(), yb.size() * 4), 0);
  EXPECT_EQ(pack_weight(MatView{GgmlType::BF16, w.data(), 16, 48, row_bytes(GgmlType::BF16, 48)}), nullptr);
  // a slice of rows packed on its own (a rank's rows in a tensor split, model/forward_dist.cpp) gives the
  // whole matrix's bits for those rows, whatever the slice's length and start (the zero-padded last group:
  // every row sums in its own lane; Dist.LogitsMatchOneProcess relies on it)
  const int64_t R = 83, C = 2080;
  const auto wf = random_weights(GgmlType::BF16, R, C, rng);
  MatView F{GgmlType::BF16, wf.data(), R, C, row_bytes(GgmlType::BF16, C)};
  const auto PF = pack_weight(F);
  ASSERT_NE(PF, nullptr);
  F.packed = PF.get();
  for (int64_t nt : {1, 7}) {
    std::vector<float> xs(nt * C);
    for (auto& v : xs) v = u(rng);
    std::vector<float> yf(nt * R, NAN);
    matmul(F, xs.data(), nt, yf.data(), three, Precision::Fast);
    for (auto [lo, hi] : {std::pair<int64_t, int64_t>{0, 28}, {28, 55}, {55, 83}, {3, 4}, {17, 33}}) {
      MatView S{GgmlType::BF16, wf.data() + static_cast<size_t>(lo) * F.row_bytes, hi - lo, C, F.row_bytes};
      const auto PS = pack_weight(S);
      ASSERT_NE(PS, nullptr) << lo << ".." << hi;
      S.packed = PS.get();
      std::vector<float> ys(nt * (hi - lo), NAN);
      matmul(S, xs.data(), nt, ys.data(), one, Precision::Fast);
      for (int64_t t = 0; t < nt; ++t)
        ASSERT_EQ(std::memcmp(ys.data() + t * (hi - lo), yf.data() + t * R + lo, (hi - lo) * 4), 0)
            << "rows " << lo << ".." << hi << " nt=" << nt << " t=" << t;
    }
  }
}

// AMX-INT8 for MXFP4 / Q4_0 / Q8_0 with >= 16 tokens (matmul_amx.h): bit-identical to the AVX-512 kernel's
// 16-token-lane path (run_lanes, which the AVX-512 kernel uses for every token tile of >= 16 tokens and
// matmul_rows for >= 16 tokens), through matmul on 1 and 3 threads and matmul_rows over ranges that cut
// 16-row groups. (Against the float64 reference: MatmulTypes, which on an AMX machine runs this path for
// its 33- and 70-token cases.) Shapes: 32 / 96 columns = tail blocks only, 288 = 2 groups of 4 blocks + 1,
// 4160 = 32 groups + 2; 83 / 130 rows: several 64-row items with a ragged last one; 150 tokens: two token
// groups, the last vector with 6 tokens. MXFP4 rows with the scale's special exponents: row 2 all e = 0
// (2^-127: tiny but not zero, so a decode that gave 0 fails), one block of row 4 e = 255 (NaN).
TEST(Matmul, AmxInt8NibbleTilesEqualTheLaneKernel) {
  if (!amx_int8_usable()) GTEST_SKIP() << "no AMX-INT8 on this CPU (or the OS did not grant the tile state)";
  IsaRestore restore;
  set_isa(Isa::Avx512);
  ThreadPool one(1), three(3);
  std::mt19937 rng(777);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  for (GgmlType type : {GgmlType::MXFP4, GgmlType::Q4_0, GgmlType::Q8_0}) {
    MatKernel k;
    ASSERT_TRUE(avx512_kernel(type, Precision::Fast, &k));
    for (int64_t cols : {32, 96, 288, 4160}) {
      for (int64_t rows : {5, 16, 83, 130}) {
        auto w = random_weights(type, rows, cols, rng);
        if (type == GgmlType::MXFP4 && cols >= 96) {  // the scale's special exponents: 2^-127 and NaN
          for (int64_t b = 0; b < cols / 32; ++b) w[2 * row_bytes(type, cols) + b * 17] = 0;  // all of row 2: tiny
          w[4 * row_bytes(type, cols) + 2 * 17] = 255;
        }
        const MatView W{type, w.data(), rows, cols, row_bytes(type, cols)};
        for (int64_t nt : {16, 37, 150}) {
          if (cols == 4160 && rows > 16 && nt > 37) continue;
          std::vector<float> x(nt * cols);
          for (auto& v : x) v = u(rng);
          x[cols + 3] = 0.0f;
          x[cols + 4] = 30.0f;
          ASSERT_TRUE(amx_nib_takes(W, nt));
          // the lane kernel: the AVX-512 runner on all nt tokens at once (>= 16: run_lanes)
          const size_t stride = (k.act_bytes(cols) + 63) / 64 * 64;
          std::vector<uint8_t> act(stride * nt);
          for (int64_t t = 0; t < nt; ++t) k.prep(&x[t * cols], cols, act.data() + t * stride);
          std::vector<float> yl(nt * rows, NAN);
          k.run(W, act.data(), stride, nt, 0, rows, yl.data(), rows);
          ASSERT_NO_FATAL_FAILURE(expect_same_bits_through_matmul(
              W, x, nt, yl, {0, 7, 40, 70, rows}, one, three,
              std::string(type_name(type)) + " " + std::to_string(rows) + "x" + std::to_string(cols) +
                  " nt=" + std::to_string(nt)));
        }
      }
    }
  }
  // fewer than 16 tokens and other types are not its work
  const auto w = random_weights(GgmlType::MXFP4, 16, 64, rng);
  EXPECT_FALSE(amx_nib_takes(MatView{GgmlType::MXFP4, w.data(), 16, 64, row_bytes(GgmlType::MXFP4, 64)}, 15));
  EXPECT_FALSE(amx_nib_takes(MatView{GgmlType::Q5_0, w.data(), 16, 32, row_bytes(GgmlType::Q5_0, 32)}, 16));
}

// AMX-INT8 for the packed Q4_K / Q5_K weights with >= 16 tokens (matmul_amx.h): bit-identical to the
// packed AVX-512 kernel, through matmul (1 and 3 threads; token tiles of 64 with a ragged one) and
// matmul_rows over ranges of whole groups (rows outside whole groups go through the plain kernel, AMX or not);
// for Q4_K (whose one-token product is the packed kernel too) a token alone equals its row of the batch.
// (Against the float64 reference: PackedKQuantsMatchReference, whose 70-token case runs this path.)
TEST(Matmul, AmxInt8PackedKQuantsEqualTheAvx512Kernel) {
  if (!amx_int8_usable()) GTEST_SKIP() << "no AMX-INT8 on this CPU (or the OS did not grant the tile state)";
  IsaRestore restore;
  set_isa(Isa::Avx512);
  ThreadPool one(1), three(3);
  std::mt19937 rng(991);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  for (GgmlType type : {GgmlType::Q4_K, GgmlType::Q5_K}) {
    PackedKernel pk;
    ASSERT_TRUE(avx512_packed_kernel(type, &pk));
    AmxPackedRun run = nullptr;
    ASSERT_TRUE(amx_packed_run(type, &run));
    for (int64_t cols : {256, 2048}) {
      for (int64_t rows : {16, 48}) {
        const auto w = random_weights(type, rows, cols, rng);
        MatView W{type, w.data(), rows, cols, row_bytes(type, cols)};
        const auto P = pack_weight(W, &three);
        ASSERT_TRUE(P);
        W.packed = P.get();
        for (int64_t nt : {16, 23, 70, 150}) {
          std::vector<float> x(nt * cols);
          for (auto& v : x) v = u(rng);
          x[cols + 2] = 25.0f;
          // the packed AVX-512 kernel on all tokens at once
          const size_t stride = (pk.act_bytes(cols) + 63) / 64 * 64;
          std::vector<uint8_t> act(stride * (nt + 15));
          for (int64_t t = 0; t < nt; ++t) pk.prep(&x[t * cols], cols, act.data() + t * stride);
          std::vector<float> yk(nt * rows, NAN), ya(nt * rows, NAN);
          pk.run(*P, act.data(), stride, nt, 0, P->groups, yk.data(), rows);
          run(*P, act.data(), stride, nt, 0, P->groups, ya.data(), rows);  // direct, every token in one call
          const std::string what = std::string(type_name(type)) + " " + std::to_string(rows) + "x" +
                                   std::to_string(cols) + " nt=" + std::to_string(nt);
          ASSERT_EQ(std::memcmp(ya.data(), yk.data(), yk.size() * 4), 0) << what;
          ASSERT_NO_FATAL_FAILURE(expect_same_bits_through_matmul(W, x, nt, yk, {0, 16, 32, rows}, one, three, what));
          if (type == GgmlType::Q4_K) {
            std::vector<float> yt(rows);
            matmul(W, x.data() + (nt - 1) * cols, 1, yt.data(), three, Precision::Fast);
            ASSERT_EQ(std::memcmp(yt.data(), yk.data() + (nt - 1) * rows, rows * 4), 0) << what << " last token alone";
          }
        }
      }
    }
  }
  AmxPackedRun run = nullptr;
  EXPECT_FALSE(amx_packed_run(GgmlType::Q6_K, &run));
}

// MXFP4 blocks with exponent byte 0 (scale 2^-127, subnormal) are exact in every path, also
// next to normal blocks (e = 255 is NaN in E8M0 and never written by a quantizer: not tested).
// Activations are integers with |max| = 127 per block, so the Q8_0 activation scale is exactly 1
// and every product and partial sum is exactly representable: results must be bit-exact.
TEST(Matmul, Mxfp4ZeroExponentIsExact) {
  IsaRestore restore;
  int64_t nonzero = 0;  // results that are not an exact cancellation (the test is not vacuous)
  ThreadPool pool(2);
  std::mt19937 rng(77);
  std::uniform_int_distribution<int> byte(0, 255), xi(-127, 127);
  for (int64_t cols : {32, 96, 160, 1024}) {
    for (int mix = 0; mix < 2; ++mix) {
      const int64_t rows = 13;
      const uint64_t rb = row_bytes(GgmlType::MXFP4, cols);
      std::vector<uint8_t> w(rb * rows);
      for (auto& b : w) b = static_cast<uint8_t>(byte(rng));
      for (int64_t r = 0; r < rows; ++r)
        for (int64_t b = 0; b < cols / 32; ++b)  // mix 0: all e = 0; mix 1: e = 0 or 1 (both subnormal scales)
          w[r * rb + 17 * b] = static_cast<uint8_t>(mix ? (b + r) % 2 : 0);
      for (int64_t nt : {1, 5, 20}) {
        std::vector<float> x(nt * cols);
        for (int64_t i = 0; i < nt * cols; ++i) x[i] = static_cast<float>(xi(rng));
        for (int64_t i = 0; i < nt * cols; i += 32) x[i] = (i / 32) % 2 ? 127.0f : -127.0f;
        const MatView W{GgmlType::MXFP4, w.data(), rows, cols, rb};
        for (Isa isa : isa_levels()) {
          set_isa(isa);
          for (Precision prec : {Precision::Fast, Precision::F32}) {
            std::vector<float> y(nt * rows, NAN);
            matmul(W, x.data(), nt, y.data(), pool, prec);
            for (int64_t t = 0; t < nt; ++t)
              for (int64_t r = 0; r < rows; ++r) {
                double ref = 0;
                for (int64_t c = 0; c < cols; ++c) ref += ref_elem(GgmlType::MXFP4, w.data() + r * rb, c) * x[t * cols + c];
                nonzero += ref != 0.0;
                ASSERT_EQ(static_cast<double>(y[t * rows + r]), ref)
                    << isa_name(isa) << " cols=" << cols << " mix=" << mix << " nt=" << nt << " r=" << r;
              }
          }
        }
      }
    }
  }
  EXPECT_GT(nonzero, 1000);
}

// The MXFP4 GEMV for CPUs with AVX512-VBMI (one vpermt2b gathers a group's nibbles, vpermb looks
// them up, vfixupimmps handles the scale's special exponents, 4 rows at a time) computes the same
// block sums and f32 steps in the same order as the plain AVX-512 GEMV: results bit-identical, also
// for exponent 0 (scale 2^-127) and 255 (NaN: that row's result is NaN, the others are not), all-zero
// activation blocks, tail blocks, an odd last group and row counts that are not a multiple of 4.
TEST(Matmul, Mxfp4VbmiGemvEqualsTheAvx512Kernel) {
  if (!isa_at_most(Isa::Avx512, best_isa()) || !cpu_features().avx512vbmi)
    GTEST_SKIP() << "no AVX-512 with VBMI on this CPU";
  IsaRestore restore;
  set_isa(Isa::Avx512);
  struct VbmiRestore {
    ~VbmiRestore() { set_vbmi_kernels(true); }
  } vbmi_restore;
  ThreadPool one(1), three(3);
  std::mt19937 rng(4242);
  std::uniform_int_distribution<int> byte(0, 255), ex(112, 132);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  int64_t nans = 0;
  for (int64_t cols : {32, 96, 160, 1184, 7168}) {  // 1184: 9 groups (odd) + 1 tail block
    for (int64_t rows : {1, 3, 4, 13, 130}) {
      const uint64_t rb = row_bytes(GgmlType::MXFP4, cols);
      std::vector<uint8_t> w(rb * rows);
      for (auto& b : w) b = static_cast<uint8_t>(byte(rng));
      const int64_t nb = cols / 32;
      for (int64_t r = 0; r < rows; ++r)
        for (int64_t b = 0; b < nb; ++b) w[r * rb + 17 * b] = static_cast<uint8_t>(ex(rng));
      w[0] = 0;                                               // row 0, block 0: scale 2^-127
      if (rows > 2) w[2 * rb + 17 * (nb - 1)] = 255;          // row 2, its last block: NaN
      if (rows > 5) w[5 * rb + 17 * (nb / 2)] = 0;            // row 5, a middle block
      std::vector<float> x(cols);
      for (auto& v : x) v = nd(rng);
      if (nb > 2) std::fill(x.begin() + 32, x.begin() + 64, 0.0f);  // block 1 all zero (dx = 0)
      const MatView W{GgmlType::MXFP4, w.data(), rows, cols, rb};
      std::vector<float> want(rows, 1.0f);
      set_vbmi_kernels(false);
      matmul(W, x.data(), 1, want.data(), three, Precision::Fast);
      set_vbmi_kernels(true);
      const std::string what = "MXFP4 VBMI GEMV cols=" + std::to_string(cols) + " rows=" + std::to_string(rows);
      // matmul_rows from a row that is not a multiple of 4
      ASSERT_NO_FATAL_FAILURE(expect_same_bits_through_matmul(W, x, 1, want, {0, rows / 3 + 1, rows}, one, three, what));
      for (int64_t r = 0; r < rows; ++r) {
        ASSERT_EQ(std::isnan(want[r]), rows > 2 && r == 2) << what << " r=" << r;
        nans += std::isnan(want[r]);
      }
    }
  }
  EXPECT_EQ(nans, 5 * 4);  // 5 widths x the 4 row counts with a row 2
}

// The activation quantizers of the Q8_0 paths are bit-identical to the ggml reference rule
// d = amax / 127, q = roundf(x * (1/d)) (ties away from zero; x * (1/d), not x / d), written out
// independently here, including exact .5 ties and inputs where x * (1/d) and x / d round apart.
TEST(QuantizeAct, Q8_0BlockMatchesGgmlRule) {
  std::mt19937 rng(5);
  std::uniform_real_distribution<float> u(-2.0f, 2.0f);
  auto ref_block = [](const float* x, int8_t* q, float* d) {
    float amax = 0;
    for (int j = 0; j < 32; ++j) amax = std::max(amax, std::fabs(x[j]));
    const float dd = amax / 127.0f;
    const float id = dd != 0.0f ? 1.0f / dd : 0.0f;
    for (int j = 0; j < 32; ++j) {
      const float v = x[j] * id;
      // half away from zero; in double, where |v| + 0.5 is exact for every float v <= 127.5
      const double a = std::floor(std::fabs(static_cast<double>(v)) + 0.5);
      q[j] = static_cast<int8_t>(v < 0 ? -a : a);
    }
    *d = f16_to_f32(f32_to_f16(dd));
  };
  int apart = 0;
  for (int it = 0; it < 4000; ++it) {
    float x[32];
    for (auto& v : x) v = u(rng);
    if (it % 4 == 0) {  // amax 127 -> d = 1: exact .5 ties
      for (int j = 0; j < 32; ++j) x[j] = static_cast<float>(static_cast<int>(u(rng) * 60)) + 0.5f;
      x[7] = -127.0f;
    }
    if (it % 4 == 1) {  // values next to a .5 boundary where x * (1/d) and x / d round apart
      const float amax = 1.0f + std::fabs(u(rng));
      const float d0 = amax / 127.0f, id0 = 1.0f / d0;
      int n = 0;
      for (int k = 0; k < 127 && n < 31; ++k) {
        float v = (static_cast<float>(k) + 0.5f) * d0;
        for (int step = 0; step < 8; ++step, v = std::nextafter(v, 1e9f))
          if (std::round(v * id0) != std::round(v / d0) && n < 31) x[n++] = (k % 2 ? -v : v);
        v = (static_cast<float>(k) + 0.5f) * d0;
        for (int step = 0; step < 8; ++step, v = std::nextafter(v, -1e9f))
          if (std::round(v * id0) != std::round(v / d0) && n < 31) x[n++] = (k % 2 ? -v : v);
      }
      x[31] = amax;
    }
    const float dd = [&] { float m = 0; for (float v : x) m = std::max(m, std::fabs(v)); return m / 127.0f; }();
    for (int j = 0; j < 32; ++j)
      if (std::round(x[j] * (1.0f / dd)) != std::round(x[j] / dd)) ++apart;
    int8_t qr[32], q1[32], q2[32];
    float dr, d1, d2;
    int s1, s2;
    ref_block(x, qr, &dr);
    quant_block_q8_0(x, q1, &d1, &s1);
    block_q8_0 b;
    quantize_row_q8_0(x, &b, 32);
    int sr = 0;
    for (int j = 0; j < 32; ++j) {
      sr += qr[j];
      ASSERT_EQ(q1[j], qr[j]) << "it=" << it << " j=" << j << " x=" << x[j];
      ASSERT_EQ(b.qs[j], qr[j]) << "it=" << it << " j=" << j << " x=" << x[j];
    }
    ASSERT_EQ(d1, dr);
    ASSERT_EQ(f16_to_f32(b.d), dr);
    ASSERT_EQ(s1, sr);
    if (isa_at_most(Isa::Avx512, best_isa())) {
      quant_block_q8_0_avx512(x, q2, &d2, &s2);
      for (int j = 0; j < 32; ++j) ASSERT_EQ(q2[j], qr[j]) << "avx512 it=" << it << " j=" << j;
      ASSERT_EQ(d2, dr);
      ASSERT_EQ(s2, sr);
    }
  }
  EXPECT_GT(apart, 0) << "no input where x*(1/d) and x/d round apart: the test lost its teeth";
  float ties[32];
  for (int j = 0; j < 32; ++j) ties[j] = (j % 2 ? 1.0f : -1.0f) * (static_cast<float>(j) + 0.5f);
  ties[31] = 127.0f;
  block_q8_0 b;
  quantize_row_q8_0(ties, &b, 32);
  EXPECT_EQ(b.qs[0], -1);  // -0.5 -> -1
  EXPECT_EQ(b.qs[1], 2);   // 1.5 -> 2
  EXPECT_EQ(b.qs[2], -3);  // -2.5 -> -3 (round-half-even would give -2)
}

// The AVX-512 Q8_K activation quantizer (K-quant and low-bit kernels) writes the bytes of
// quantize_row_q8_K: the scale from the FIRST value of largest magnitude (sign included), round half
// to even, the bsums; checked on random blocks of several scales, exact ties, a tied +/- maximum,
// a single nonzero value and zeros, and through both activation layouts (q8_K rows, "q8 Kx").
TEST(Matmul, Q8KActivationsAvx512AreTheScalarBytes) {
  if (!isa_at_most(Isa::Avx512, best_isa())) GTEST_SKIP() << "no AVX-512 on this CPU";
  std::mt19937 rng(99);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::vector<std::vector<float>> blocks;
  for (float sc : {1e-6f, 0.03f, 1.0f, 40.0f, 3e4f})
    for (int k = 0; k < 20; ++k) {
      std::vector<float> x(QK_K);
      for (auto& v : x) v = nd(rng) * sc * (rng() % 13 == 0 ? 8.0f : 1.0f);
      blocks.push_back(x);
    }
  std::vector<float> ties(QK_K);  // vmax = -127 -> iscale = 1: every k + 0.5 is an exact tie
  for (int j = 0; j < QK_K; ++j) ties[j] = (j % 2 ? -1.0f : 1.0f) * (static_cast<float>(j % 127) + 0.5f);
  ties[5] = -127.0f;
  blocks.push_back(ties);
  std::vector<float> pm(QK_K, 0.25f);  // +max and -max tied: the first one (negative here) sets the sign
  pm[17] = -9.0f;
  pm[200] = 9.0f;
  blocks.push_back(pm);
  std::vector<float> one(QK_K, 0.0f);
  one[255] = -3.5f;
  blocks.push_back(one);
  blocks.push_back(std::vector<float>(QK_K, 0.0f));
  int tied = 0;
  for (size_t i = 0; i < blocks.size(); ++i) {
    block_q8_K ref, got;
    std::memset(&ref, 0x5a, sizeof ref);
    std::memset(&got, 0xa5, sizeof got);
    quantize_row_q8_K(blocks[i].data(), &ref, QK_K);
    quant_block_q8_K_avx512(blocks[i].data(), &got);
    ASSERT_EQ(std::memcmp(&ref, &got, sizeof ref), 0) << "block " << i << " d " << ref.d << " vs " << got.d;
    if (i + 4 == blocks.size()) tied = ref.qs[0] == 0 && ref.qs[1] == -2 && ref.qs[2] == 2;  // 0.5->0, -1.5->-2, 2.5->2
  }
  EXPECT_TRUE(tied) << "the tie block did not round half to even";
  // whole rows through both layouts, 3 blocks each
  std::vector<float> row;
  for (size_t i = 0; i < 3; ++i) row.insert(row.end(), blocks[i * 7].begin(), blocks[i * 7].end());
  const int64_t cols = static_cast<int64_t>(row.size());
  std::vector<uint8_t> a(q8_K_act_bytes(cols)), b(a.size()), c(q8_Kx_act_bytes(cols)), e(c.size());
  prep_q8_K(row.data(), cols, a.data());
  prep_q8_K_avx512(row.data(), cols, b.data());
  EXPECT_EQ(a, b);
  prep_q8_Kx(row.data(), cols, c.data());
  prep_q8_Kx_avx512(row.data(), cols, e.data());
  EXPECT_EQ(c, e);
}

TEST(Matmul, RejectsBadViews) {
  ThreadPool pool(1);
  std::vector<uint8_t> w(34 * 4, 0);
  std::vector<float> x(64, 1.0f), y(4);
  MatView W{GgmlType::Q8_0, w.data(), 2, 64, 68};
  EXPECT_NO_THROW(matmul(W, x.data(), 1, y.data(), pool));
  MatView bad_rb = W;
  bad_rb.row_bytes = 64;
  EXPECT_THROW(matmul(bad_rb, x.data(), 1, y.data(), pool), kimi::Error);
  MatView bad_cols{GgmlType::Q8_0, w.data(), 2, 40, 34};
  EXPECT_THROW(matmul(bad_cols, x.data(), 1, y.data(), pool), kimi::Error);
  MatView bad_type{GgmlType::IQ2_XXS, w.data(), 1, 256, 66};
  EXPECT_THROW(matmul(bad_type, x.data(), 1, y.data(), pool), kimi::Error);
  EXPECT_THROW(matmul_rows(W, x.data(), 1, y.data(), 1, 3), kimi::Error);
  EXPECT_THROW(dequantize_row(W, 2, y.data()), kimi::Error);
}

TEST(Vec, Bf16RowsAndDot) {
  IsaRestore restore;
  std::mt19937 rng(99);
  std::uniform_real_distribution<float> u(-3.0f, 3.0f);
  for (int64_t n : {1, 15, 16, 17, 33, 100, 1000}) {
    std::vector<float> x(n), b(n), back(n);
    for (auto& v : x) v = u(rng);
    for (auto& v : b) v = u(rng);
    std::vector<uint16_t> h(n);
    for (Isa isa : isa_levels()) {
      set_isa(isa);
      vec::f32_to_bf16_row(x.data(), h.data(), n);
      for (int64_t i = 0; i < n; ++i) ASSERT_EQ(h[i], f32_to_bf16(x[i])) << isa_name(isa) << " n=" << n;
      vec::bf16_to_f32_row(h.data(), back.data(), n);
      double ref = 0, mag = 0;
      for (int64_t i = 0; i < n; ++i) {
        const uint32_t bits = static_cast<uint32_t>(h[i]) << 16;
        float f;
        std::memcpy(&f, &bits, 4);
        ASSERT_EQ(back[i], f);
        ref += static_cast<double>(f) * b[i];
        mag += std::fabs(static_cast<double>(f) * b[i]);
      }
      EXPECT_NEAR(vec::dot_bf16_f32(h.data(), b.data(), n), ref, 1e-6 * mag) << isa_name(isa) << " n=" << n;
      std::vector<float> d(n);
      dequantize(GgmlType::BF16, h.data(), d.data(), n);
      EXPECT_EQ(d, back);
    }
  }
}

TEST(Matmul, IsaOverrideOnlyGoesDown) {
  IsaRestore restore;
  EXPECT_EQ(set_isa(Isa::Scalar), Isa::Scalar);
  EXPECT_STREQ(active_isa(), "scalar");
  EXPECT_EQ(set_isa(Isa::Avx512), best_isa());
}

}  // namespace

// A token's row is the same bits whether it is multiplied alone (the GEMV) or in a batch of up to 15
// tokens (the register tiles and decoded panels): the invariance that makes prefill == decode and a
// speculative verify pass == plain decoding exact in Fast precision (docs/speculative.md). Every
// level the CPU has, the types of the K3 files' dense and expert weights, column counts with several
// 32-column steps / groups of 4 blocks and a tail (the old AVX-512 GEMVs summed alternate steps into
// separate accumulators, which only showed from 128 columns on), 1 and 3 threads. Batches of 16 and
// more tokens may take the token-lane and AMX kernels, whose sums run in another order (not checked).
// Every weight type matmul multiplies, plain and (K-quants, BF16) in the packed layout load-time repacking
// makes, at every ISA level: a token's row of a batch of 2..15 tokens is the same bits as that token alone
// (speculative verification relies on it, docs/speculative.md "Exact"). 37 rows = 2 packed groups + 5 tail
// rows. All differing (level, type, layout) cases are listed in one failure.
TEST(Matmul, BatchRowEqualsAlone) {
  IsaRestore restore;
  ThreadPool one(1), three(3);
  std::mt19937 rng(1207);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  const GgmlType types[] = {GgmlType::F32,  GgmlType::F16,  GgmlType::BF16, GgmlType::Q8_0,  GgmlType::Q4_0,
                            GgmlType::Q5_0, GgmlType::Q5_1, GgmlType::MXFP4, GgmlType::Q4_K, GgmlType::Q5_K,
                            GgmlType::Q6_K, GgmlType::Q2_K, GgmlType::Q3_K, GgmlType::IQ4_XS, GgmlType::IQ2_XS};
  std::string differing;
  for (Isa isa : isa_levels()) {
    for (GgmlType type : types) {
      const bool k256 = traits(type).block == 256;
      for (bool packed : {false, true}) {
        bool bad = false;
        for (int64_t cols : k256 ? std::vector<int64_t>{2048, 2304, 1280} : std::vector<int64_t>{2048, 2080, 1184}) {
          if (bad) break;
          const int64_t rows = 37;
          const auto w = random_weights(type, rows, cols, rng);
          MatView W{type, w.data(), rows, cols, row_bytes(type, cols)};
          set_isa(best_isa());
          const auto P = packed ? pack_weight(W, &one) : nullptr;
          if (packed && !P) break;  // no packed layout for this type / CPU
          W.packed = P.get();
          set_isa(isa);
          for (int64_t nt = 2; nt <= 15 && !bad; ++nt) {
            std::vector<float> x(nt * cols);
            for (auto& v : x) v = nd(rng);
            for (ThreadPool* pool : {&one, &three}) {
              std::vector<float> yb(nt * rows, NAN), y1(rows, NAN);
              matmul(W, x.data(), nt, yb.data(), *pool, Precision::Fast);
              for (int64_t t = 0; t < nt && !bad; ++t) {
                matmul(W, x.data() + t * cols, 1, y1.data(), *pool, Precision::Fast);
                if (std::memcmp(y1.data(), yb.data() + t * rows, rows * 4) != 0) {
                  bad = true;
                  differing += std::string(" ") + isa_name(isa) + "/" + type_name(type) + (packed ? "/packed" : "") +
                               "(cols=" + std::to_string(cols) + " nt=" + std::to_string(nt) + ")";
                }
              }
            }
          }
        }
      }
    }
  }
  EXPECT_TRUE(differing.empty()) << "a row of the batch differs from the token alone:" << differing;
}

// The packed K-quants whose one-token product is packed too (Q4_K, Q5_K; PackedKernel::gemv) run one token
// and any batch through the same packed kernel (its tiles sum each token's blocks in one order whatever
// the tile's token count; AMX tiles, where usable, are the same bits): a token's row is the bits of the
// token alone at 16 tokens and beyond too, with tail rows (37 rows: 2 groups + 5 plain rows) and on 1 and
// 3 threads. Before 2026-12-06 Q5_K read the original rows for one token and differed from any packed
// batch of 16+ (avx512 Q5_K cols=2048 nt=16). Q6_K reads the original rows below 16 tokens
// (Matmul.BatchRowEqualsAlone covers it).
TEST(Matmul, PackedKQuantRowEqualsAloneAtAnyBatch) {
  IsaRestore restore;
  set_isa(best_isa());
  ThreadPool one(1), three(3);
  std::mt19937 rng(2207);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::string differing;
  bool packed_any = false;
  for (GgmlType type : {GgmlType::Q4_K, GgmlType::Q5_K, GgmlType::Q6_K}) {
    const int64_t rows = 37, cols = 2048;
    const auto w = random_weights(type, rows, cols, rng);
    MatView W{type, w.data(), rows, cols, row_bytes(type, cols)};
    const auto P = pack_weight(W, &one);
    PackedKernel pk;
    if (!P || !pick_packed_kernel(type, &pk) || !pk.gemv) continue;  // Q6_K: one token reads the original rows
    packed_any = true;
    W.packed = P.get();
    for (int64_t nt : {16, 17, 24, 33}) {
      std::vector<float> x(nt * cols);
      for (auto& v : x) v = nd(rng);
      for (ThreadPool* pool : {&one, &three}) {
        std::vector<float> yb(nt * rows, NAN), y1(rows, NAN);
        matmul(W, x.data(), nt, yb.data(), *pool, Precision::Fast);
        for (int64_t t = 0; t < nt; ++t) {
          matmul(W, x.data() + t * cols, 1, y1.data(), *pool, Precision::Fast);
          if (std::memcmp(y1.data(), yb.data() + t * rows, rows * 4) != 0) {
            differing += std::string(" ") + type_name(type) + "(nt=" + std::to_string(nt) + " t=" + std::to_string(t) +
                         " threads=" + std::to_string(pool->size()) + ")";
            break;
          }
        }
      }
    }
  }
  if (!packed_any) GTEST_SKIP() << "no packed K-quant kernels at this CPU's best ISA level (" << isa_name(best_isa()) << ")";
  EXPECT_TRUE(differing.empty()) << "a row of the batch differs from the token alone:" << differing;
}
