// The MXFP4 / Q8_0 lane path with register broadcasts (matmul_mx_lanes.h: >= 16 tokens at the AVX-512 level)
// against a float64 reference that decodes the MXFP4 bytes itself (formats-quant.md: E2M1 value x
// 2^(e - 127)) and emulates the Q8_0 activation rounding, and bit for bit against the lane kernel it
// replaces (the same path switched off: matmul_rows then runs run_lanes over all tokens). Exponent
// patterns: all equal, spreads of 1..3, gaps of 4..30, e = 0 (2^-127) beside small and large exponents,
// random; Q8_0 rows with random scales. Shapes: rows around the 3-row register tile and the 48-row item; token counts around 16 (the
// switch from the Q8_0 kernels), the 4-vector register tile (64 tokens) and the 128-token pass; 1 and 3
// threads, matmul_rows over cut ranges.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "backend/cpu/dispatch.h"
#include "backend/cpu/matmul.h"
#include "backend/cpu/matmul_amx.h"
#include "backend/cpu/matmul_mx_lanes.h"
#include "tensor/quants.h"

using namespace kimi;
using namespace kimi::kern;

namespace {

constexpr int kE2M1[16] = {0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12};  // doubled

double ref_weight_q8(const uint8_t* row, int64_t c) {  // Q8_0: f16 d, then 32 int8
  const uint8_t* b = row + (c / 32) * 34;
  return static_cast<double>(f16_to_f32(static_cast<uint16_t>(b[0] | (b[1] << 8)))) * static_cast<int8_t>(b[2 + c % 32]);
}

double ref_weight(const uint8_t* row, int64_t c) {
  const uint8_t* b = row + (c / 32) * 17;
  const int j = static_cast<int>(c % 32);
  const int nib = j < 16 ? (b[1 + j] & 15) : (b[1 + j - 16] >> 4);
  return 0.5 * kE2M1[nib] * std::ldexp(1.0, b[0] == 0 ? -127 : static_cast<int>(b[0]) - 127);
}

// ggml Q8_0 per 32 values: d = f16(amax / 127), q = roundf(x * (1 / (amax / 127)))
void emulate_q8_0(const float* x, int64_t n, double* out) {
  for (int64_t g = 0; g < n; g += 32) {
    float amax = 0;
    for (int j = 0; j < 32; ++j) amax = std::max(amax, std::fabs(x[g + j]));
    const float d = amax / 127.0f;
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    const double dh = f16_to_f32(f32_to_f16(d));
    for (int j = 0; j < 32; ++j) out[g + j] = std::roundf(x[g + j] * id) * dh;
  }
}

enum class Ex { Same, Spread3, Gaps, ZeroMix, Random };
// Q8_0 rows: random q, d = f16 of a random scale (random bytes could be NaN / inf)
std::vector<uint8_t> make_q8_weights(int64_t rows, int64_t cols, std::mt19937& rng) {
  const uint64_t rb = row_bytes(GgmlType::Q8_0, cols);
  std::vector<uint8_t> w(rb * rows);
  std::uniform_int_distribution<int> byte(0, 255);
  std::uniform_real_distribution<float> sc(1e-4f, 1e-2f);
  for (auto& b : w) b = static_cast<uint8_t>(byte(rng));
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t b = 0; b < cols / 32; ++b) {
      const uint16_t h = f32_to_f16(sc(rng));
      w[r * rb + 34 * b] = static_cast<uint8_t>(h & 0xff);
      w[r * rb + 34 * b + 1] = static_cast<uint8_t>(h >> 8);
    }
  return w;
}

std::vector<uint8_t> make_weights(int64_t rows, int64_t cols, Ex ex, std::mt19937& rng) {
  const uint64_t rb = row_bytes(GgmlType::MXFP4, cols);
  std::vector<uint8_t> w(rb * rows);
  std::uniform_int_distribution<int> byte(0, 255), spread(0, 3), gap(4, 30), coin(0, 3);
  for (auto& b : w) b = static_cast<uint8_t>(byte(rng));
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t b = 0; b < cols / 32; ++b) {
      uint8_t& e = w[r * rb + 17 * b];
      switch (ex) {
        case Ex::Same: e = 120; break;
        case Ex::Spread3: e = static_cast<uint8_t>(118 + spread(rng)); break;
        case Ex::Gaps: e = static_cast<uint8_t>(coin(rng) == 0 ? 100 + gap(rng) : 110 + spread(rng)); break;
        case Ex::ZeroMix: e = static_cast<uint8_t>(coin(rng) == 0 ? 0 : coin(rng) == 0 ? 2 : coin(rng) == 0 ? 120 : 1); break;
        case Ex::Random: e = static_cast<uint8_t>(100 + byte(rng) % 40); break;
      }
    }
  return w;
}

const char* ex_name(Ex e) {
  switch (e) {
    case Ex::Same: return "same";
    case Ex::Spread3: return "spread<=3";
    case Ex::Gaps: return "gaps";
    case Ex::ZeroMix: return "e=0 mix";
    case Ex::Random: return "random";
  }
  return "?";
}

bool path_here() { return family_isa(KernelFamily::Matmul) == Isa::Avx512 && !amx_int8_usable(); }

struct Restore {
  Isa isa = family_isa(KernelFamily::Matmul);
  ~Restore() {
    set_isa(isa);
    set_mx_lanes(true);
  }
};

TEST(MatmulMxLanes, MatchesFloat64ReferenceAndTheLaneKernelBitForBit) {
  if (!path_here()) GTEST_SKIP() << "the path runs at the AVX-512 level without AMX-INT8 (this CPU: " << active_isa() << ")";
  Restore restore;
  set_isa(Isa::Avx512);
  ThreadPool one(1), three(3);
  std::mt19937 rng(4141);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  struct Shape {
    int64_t rows, cols;
    std::vector<int64_t> toks;
  };
  const Shape shapes[] = {
      {1, 32, {15, 16, 17, 19}},   {4, 96, {16, 20, 33, 49}},      {17, 512, {16, 17, 47, 64, 65}},
      {47, 544, {16, 35, 130}},    {49, 1184, {17, 80}},           {97, 160, {16, 127, 128, 129, 200}},
      {130, 3584, {16, 70}},       {48, 576, {19, 111}}};
  int checked = 0;
  for (const Shape& sh : shapes) {
    for (int pat = 0; pat < 6; ++pat) {  // 5 MXFP4 exponent patterns, then Q8_0
      const bool q8 = pat == 5;
      const Ex ex = q8 ? Ex::Random : static_cast<Ex>(pat);
      const GgmlType type = q8 ? GgmlType::Q8_0 : GgmlType::MXFP4;
      const auto w = q8 ? make_q8_weights(sh.rows, sh.cols, rng) : make_weights(sh.rows, sh.cols, ex, rng);
      const MatView W{type, w.data(), sh.rows, sh.cols, row_bytes(type, sh.cols)};
      std::vector<double> wd(sh.rows * sh.cols);
      for (int64_t r = 0; r < sh.rows; ++r)
        for (int64_t c = 0; c < sh.cols; ++c)
          wd[r * sh.cols + c] = q8 ? ref_weight_q8(w.data() + r * W.row_bytes, c) : ref_weight(w.data() + r * W.row_bytes, c);
      for (int64_t nt : sh.toks) {
        std::vector<float> x(nt * sh.cols);
        for (auto& v : x) v = nd(rng);
        x[sh.cols + 5] = 40.0f;  // an outlier and a zero in token 1, an all-zero block in token 0
        x[sh.cols + 6] = 0.0f;
        for (int64_t c = 0; c < 32; ++c) x[c] = 0.0f;
        const bool on = nt >= kMxLanesMinTokens;
        ASSERT_EQ(mx_lanes_takes(W, nt, Precision::Fast), on) << nt;
        std::vector<double> xe(nt * sh.cols), ref(nt * sh.rows), mag(nt * sh.rows);
        for (int64_t t = 0; t < nt; ++t) emulate_q8_0(&x[t * sh.cols], sh.cols, &xe[t * sh.cols]);
        for (int64_t t = 0; t < nt; ++t)
          for (int64_t r = 0; r < sh.rows; ++r) {
            double s = 0, m = 0;
            for (int64_t c = 0; c < sh.cols; ++c) {
              const double p = wd[r * sh.cols + c] * xe[t * sh.cols + c];
              s += p;
              m += std::fabs(p);
            }
            ref[t * sh.rows + r] = s;
            mag[t * sh.rows + r] = m;
          }
        const std::string what = std::string(q8 ? "Q8_0" : ex_name(ex)) + " rows=" + std::to_string(sh.rows) +
                                 " cols=" + std::to_string(sh.cols) + " nt=" + std::to_string(nt);
        // the lane kernel: the path off, matmul_rows (one call: run_lanes over all tokens)
        std::vector<float> lanes(nt * sh.rows, NAN);
        set_mx_lanes(false);
        matmul_rows(W, x.data(), nt, lanes.data(), 0, sh.rows, Precision::Fast);
        set_mx_lanes(true);
        for (ThreadPool* pool : {&one, &three}) {
          std::vector<float> y(nt * sh.rows, NAN), y2(nt * sh.rows, NAN);
          matmul(W, x.data(), nt, y.data(), *pool, Precision::Fast);
          // matmul_rows over cut ranges (inside a row vector, inside an item)
          const int64_t cuts[] = {0, std::min<int64_t>(3, sh.rows), std::min<int64_t>(53, sh.rows), sh.rows};
          for (int i = 0; i < 3; ++i)
            if (cuts[i] < cuts[i + 1]) matmul_rows(W, x.data(), nt, y2.data(), cuts[i], cuts[i + 1], Precision::Fast);
          for (int64_t i = 0; i < nt * sh.rows; ++i) {
            const double tol = 1e-5 * mag[i] + 1e-30;
            ASSERT_NEAR(y[i], ref[i], tol) << what << " i=" << i << " threads=" << pool->size();
            ASSERT_NEAR(y2[i], ref[i], tol) << "matmul_rows " << what << " i=" << i;
            ASSERT_EQ(std::memcmp(&y[i], &y2[i], 4), 0) << "split " << what << " i=" << i;
            if (on) ASSERT_EQ(std::memcmp(&y[i], &lanes[i], 4), 0) << "vs lane kernel " << what << " i=" << i;
          }
          ++checked;
        }
      }
    }
  }
  EXPECT_GT(checked, 180);
}

// A token's row is the same bits in any batch of >= 16 tokens (each lane's sums run alike).
TEST(MatmulMxLanes, TokenRowIndependentOfBatch) {
  if (!path_here()) GTEST_SKIP() << "the path runs at the AVX-512 level without AMX-INT8";
  Restore restore;
  set_isa(Isa::Avx512);
  ThreadPool three(3);
  std::mt19937 rng(99);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  const int64_t rows = 45, cols = 544, nt = 150;
  const auto w = make_weights(rows, cols, Ex::Gaps, rng);
  const MatView W{GgmlType::MXFP4, w.data(), rows, cols, row_bytes(GgmlType::MXFP4, cols)};
  std::vector<float> x(nt * cols);
  for (auto& v : x) v = nd(rng);
  std::vector<float> yb(nt * rows), ys(17 * rows);
  matmul(W, x.data(), nt, yb.data(), three, Precision::Fast);
  for (int64_t t0 : {0, 21, 126, 133}) {
    matmul(W, x.data() + t0 * cols, 17, ys.data(), three, Precision::Fast);
    ASSERT_EQ(std::memcmp(ys.data(), yb.data() + t0 * rows, 17 * rows * 4), 0) << "tokens from " << t0;
  }
}

TEST(MatmulMxLanes, TakesOnlyItsWork) {
  if (!path_here()) GTEST_SKIP() << "the path runs at the AVX-512 level without AMX-INT8";
  Restore restore;
  set_isa(Isa::Avx512);
  std::mt19937 rng(5);
  const auto w = make_weights(24, 512, Ex::Random, rng);
  const MatView W{GgmlType::MXFP4, w.data(), 24, 512, row_bytes(GgmlType::MXFP4, 512)};
  EXPECT_TRUE(mx_lanes_takes(W, 16, Precision::Fast));
  EXPECT_FALSE(mx_lanes_takes(W, 15, Precision::Fast));
  EXPECT_FALSE(mx_lanes_takes(W, 64, Precision::F32));
  set_mx_lanes(false);
  EXPECT_FALSE(mx_lanes_takes(W, 64, Precision::Fast));
  set_mx_lanes(true);
  set_isa(Isa::Avx2);
  EXPECT_FALSE(mx_lanes_takes(W, 64, Precision::Fast));
  const auto q = std::vector<uint8_t>(row_bytes(GgmlType::Q8_0, 512) * 24);
  set_isa(Isa::Avx512);
  EXPECT_TRUE(mx_lanes_takes(MatView{GgmlType::Q8_0, q.data(), 24, 512, row_bytes(GgmlType::Q8_0, 512)}, 64, Precision::Fast));
  const auto q4 = std::vector<uint8_t>(row_bytes(GgmlType::Q4_0, 512) * 24);
  EXPECT_FALSE(mx_lanes_takes(MatView{GgmlType::Q4_0, q4.data(), 24, 512, row_bytes(GgmlType::Q4_0, 512)}, 64, Precision::Fast));
}

}  // namespace
