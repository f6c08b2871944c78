// The engine's fast paths against double-precision loops written here: the polynomial
// exp/sigmoid/SiLU/SiTU used in Precision::Fast, the DSA indexer scan (AVX-512 heads-in-lanes kernel
// for H <= 64, the transpose-add kernel above, and the portable loop), the KDA step with precomputed decay factors and the threshold
// top-k selection (tie rule).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "backend/cpu/attention.h"
#include "backend/cpu/kda.h"
#include "backend/cpu/ops.h"
#include "backend/cpu/topk.h"
#include "backend/cpu/cpu_backend.h"
#include "ref/reference.h"
#include "util/thread_pool.h"
#include "tensor/types.h"

using namespace kimi;

namespace {
std::vector<float> rnd(size_t n, uint32_t seed, float lo, float hi) {
  std::mt19937 r(seed);
  std::uniform_real_distribution<float> U(lo, hi);
  std::vector<float> v(n);
  for (auto& x : v) x = U(r);
  return v;
}
double sig(double x) { return 1.0 / (1.0 + std::exp(-x)); }
// |a - b| <= rel * |b| + abs
void expect_close(double a, double b, double rel, double abs, const char* what, double x) {
  EXPECT_LE(std::fabs(a - b), rel * std::fabs(b) + abs) << what << "(" << x << ") = " << a << ", expected " << b;
}
}  // namespace

TEST(ModelFastPaths, ExpSigmoidSiluAgreeWithDoubleToAFewUlp) {
  // every length 1..40 (masked tails) over a wide range, plus the special values
  for (int n = 1; n <= 40; ++n) {
    auto x = rnd(static_cast<size_t>(n), 100 + n, -90.0f, 90.0f);
    std::vector<float> y(x.size());
    kern::exp_fast(x.data(), y.data(), n);
    for (int i = 0; i < n; ++i) {
      const double e = std::exp(double(x[i]));
      if (e > std::numeric_limits<float>::max())
        EXPECT_TRUE(std::isinf(y[i]) && y[i] > 0) << x[i];
      else
        expect_close(y[i], e, 4e-7, 1e-44, "exp", x[i]);  // denormal results: absolute
    }
    auto s = x;
    kern::sigmoid_inplace_fast(s.data(), n);
    // below FLT_MIN (x < -87.3) results may flush to 0, as 1 / (1 + expf(-x)) does with libm
    for (int i = 0; i < n; ++i) expect_close(s[i], sig(x[i]), 5e-7, 1.2e-38, "sigmoid", x[i]);
    kern::silu_fast(x.data(), y.data(), n);
    for (int i = 0; i < n; ++i) expect_close(y[i], x[i] * sig(x[i]), 5e-7, 1.1e-36, "silu", x[i]);
    auto g = rnd(static_cast<size_t>(n), 200 + n, -12.0f, 12.0f), v = rnd(static_cast<size_t>(n), 300 + n, -3.0f, 3.0f);
    auto m = v;
    kern::mul_sigmoid_fast(m.data(), g.data(), n);
    for (int i = 0; i < n; ++i) expect_close(m[i], v[i] * sig(g[i]), 5e-7, 1e-30, "mul_sigmoid", g[i]);
  }
  // dense sweep of the small range where the polynomial pieces meet
  std::vector<float> x, y;
  for (float v = -3.0f; v <= 3.0f; v += 1.0f / 1024) x.push_back(v);
  y.resize(x.size());
  kern::exp_fast(x.data(), y.data(), static_cast<int64_t>(x.size()));
  for (size_t i = 0; i < x.size(); ++i) expect_close(y[i], std::exp(double(x[i])), 3e-7, 0, "exp", x[i]);
  const float inf = std::numeric_limits<float>::infinity();
  float sp[5] = {inf, -inf, 0.0f, 1000.0f, -1000.0f}, e[5];
  kern::exp_fast(sp, e, 5);
  EXPECT_EQ(e[0], inf);
  EXPECT_EQ(e[1], 0.0f);
  EXPECT_EQ(e[2], 1.0f);
  EXPECT_EQ(e[3], inf);
  EXPECT_EQ(e[4], 0.0f);
  float sg[5] = {inf, -inf, 0.0f, 1000.0f, -1000.0f};
  kern::sigmoid_inplace_fast(sg, 5);
  EXPECT_EQ(sg[0], 1.0f);
  EXPECT_EQ(sg[1], 0.0f);
  EXPECT_EQ(sg[2], 0.5f);
  EXPECT_EQ(sg[3], 1.0f);
  EXPECT_EQ(sg[4], 0.0f);
  float nan[1] = {std::numeric_limits<float>::quiet_NaN()};
  kern::exp_fast(nan, nan, 1);
  EXPECT_TRUE(std::isnan(nan[0]));
}

TEST(ModelFastPaths, SituFastAgreesWithDouble) {
  for (float lambda : {25.0f, 0.0f}) {
    for (int n : {1, 15, 16, 17, 100}) {
      // g spans the tanh polynomial (|g/4| < 0.4) and exp-formula pieces; u likewise for lambda
      auto g = rnd(static_cast<size_t>(n), 7 + n, -40.0f, 40.0f), u = rnd(static_cast<size_t>(n), 8 + n, -60.0f, 60.0f);
      for (int i = 0; i < n; i += 3) g[static_cast<size_t>(i)] *= 0.02f;  // some small arguments
      std::vector<float> y(g.size());
      kern::situ_fast(g.data(), u.data(), y.data(), n, 4.0f, lambda);
      for (int i = 0; i < n; ++i) {
        const double a = 4.0 * std::tanh(g[i] / 4.0) * sig(g[i]);
        const double b = lambda > 0 ? lambda * std::tanh(u[i] / double(lambda)) : u[i];
        expect_close(y[i], a * b, 2e-6, 1e-30, "situ", g[i]);
      }
    }
  }
}

TEST(ModelFastPaths, IndexerScoresMatchTheDefinition) {
  // H: full 16-head groups, a partial group, a single head, 3 and 4 groups (the heads-in-lanes scan's
  // widest), 5 groups (the transpose-add kernel); D: AVX-512 sizes and a portable one; 37 keys: blocks of
  // keys with a ragged rest
  for (int64_t H : {1, 16, 20, 32, 48, 64, 80}) {
    for (int64_t D : {16, 24, 128}) {
      for (bool f16 : {true, false}) {
        const int64_t n = 37;
        auto q = rnd(static_cast<size_t>(H * D), 11 + H + D, -1.0f, 1.0f);
        auto w = rnd(static_cast<size_t>(H), 12 + H, -0.5f, 1.0f);  // negative weights too
        auto kf = rnd(static_cast<size_t>(n * D), 13 + D, -2.0f, 2.0f);
        std::vector<uint16_t> kh(kf.size());
        for (size_t i = 0; i < kf.size(); ++i) {
          kh[i] = f32_to_f16(kf[i]);
          if (f16) kf[i] = f16_to_f32(kh[i]);  // the reference sees exactly the stored keys
        }
        std::vector<float> sc(static_cast<size_t>(n));
        const void* keys = f16 ? static_cast<const void*>(kh.data()) : kf.data();
        kern::indexer_scores(q.data(), w.data(), H, keys, f16, D, n, sc.data());
        // the prepared query (decode, batched prefill) gives the same bits where it exists
        std::vector<float> qp(kern::idx_query_f32_floats(H, D)), sp(static_cast<size_t>(n));
        if (kern::prep_idx_query_f32(q.data(), w.data(), H, D, qp.data())) {
          EXPECT_TRUE(H <= 64 && D % 16 == 0) << H << " " << D;
          kern::indexer_scores_prepared(qp.data(), H, keys, f16, D, n, sp.data());
          EXPECT_EQ(std::memcmp(sp.data(), sc.data(), sp.size() * 4), 0) << "H " << H << " D " << D;
        }
        for (int64_t s = 0; s < n; ++s) {
          double ref = 0, mag = 0;
          for (int64_t h = 0; h < H; ++h) {
            double d = 0, dm = 0;
            for (int64_t j = 0; j < D; ++j) {
              d += double(q[h * D + j]) * kf[s * D + j];
              dm += std::fabs(double(q[h * D + j]) * kf[s * D + j]);
            }
            ref += w[h] * std::max(d, 0.0);
            mag += std::fabs(w[h]) * dm;
          }
          EXPECT_NEAR(sc[s], ref, 1e-6 * mag + 1e-7) << "H " << H << " D " << D << " f16 " << f16 << " s " << s;
        }
      }
    }
  }
}

TEST(ModelFastPaths, KdaStepDecayEqualsKdaStepWithExp) {
  for (int D : {8, 32, 48, 64, 128}) {
    std::vector<float> S1(static_cast<size_t>(D * D), 0.0f), S2 = S1, tmp(D), o1(D), o2(D);
    for (int t = 0; t < 5; ++t) {
      auto q = rnd(D, 40 + t, -0.3f, 0.3f), k = rnd(D, 50 + t, -0.3f, 0.3f), v = rnd(D, 60 + t, -1.0f, 1.0f);
      auto g = rnd(D, 70 + t, -1.1f, -0.1f);
      std::vector<float> a(D);
      for (int i = 0; i < D; ++i) a[i] = std::exp(g[i]);
      kern::kda_step(S1.data(), q.data(), k.data(), v.data(), g.data(), 0.4f, 0.125f, o1.data(), D, tmp.data());
      kern::kda_step_decay(S2.data(), q.data(), k.data(), v.data(), a.data(), 0.4f, 0.125f, o2.data(), D, tmp.data());
      for (int j = 0; j < D; ++j) EXPECT_NEAR(o1[j], o2[j], 1e-6 * (1 + std::fabs(o1[j]))) << "D " << D << " j " << j;
    }
    for (size_t i = 0; i < S1.size(); ++i) ASSERT_NEAR(S1[i], S2[i], 1e-6 * (1 + std::fabs(S1[i])));
  }
}

TEST(ModelFastPaths, ThresholdTopKFollowsTheTieRule) {
  // against a direct definition: sort (score desc with NaN lowest, index asc), take k, sort by index
  std::mt19937 r(3);
  for (int trial = 0; trial < 200; ++trial) {
    const int64_t n = 1 + static_cast<int64_t>(r() % 300);
    const int64_t k = static_cast<int64_t>(r() % (n + 3));
    std::vector<float> sc(static_cast<size_t>(n));
    for (auto& v : sc) {
      const uint32_t u = r() % 20;  // few distinct values: many ties
      v = u == 0 ? std::numeric_limits<float>::quiet_NaN()
                 : u == 1 ? -std::numeric_limits<float>::infinity() : static_cast<float>(u % 7) - 3.0f;
    }
    std::vector<int64_t> order(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) order[static_cast<size_t>(i)] = i;
    auto keyf = [&](int64_t i) { return std::isnan(sc[i]) ? -std::numeric_limits<float>::infinity() : sc[i]; };
    std::sort(order.begin(), order.end(), [&](int64_t a, int64_t b) {
      return keyf(a) != keyf(b) ? keyf(a) > keyf(b) : a < b;
    });
    const int64_t kk = std::min(k, n);
    std::vector<int32_t> want(order.begin(), order.begin() + kk);
    std::sort(want.begin(), want.end());
    std::vector<int32_t> got(static_cast<size_t>(n) + 1, -1);
    std::vector<float> tmp(static_cast<size_t>(n));
    const int64_t m = kern::topk_indices_threshold(sc.data(), n, k, got.data(), tmp.data());
    ASSERT_EQ(m, kk) << "n " << n << " k " << k;
    for (int64_t i = 0; i < m; ++i) ASSERT_EQ(got[static_cast<size_t>(i)], want[static_cast<size_t>(i)]) << "n " << n << " k " << k << " i " << i;
  }
}

// The radix step of topk_indices_threshold on the indexer's sizes (k = 2048 of up to 40000):
// widely spread scores (many histogram buckets), scores packed into one bucket, signed zeros
// (-0 == +0 is a tie, the earlier position wins) and NaN; against a full sort.
TEST(ModelFastPaths, ThresholdTopKAtIndexerSizes) {
  std::mt19937 r(11);
  for (int trial = 0; trial < 12; ++trial) {
    const int64_t n = 2049 + static_cast<int64_t>(r() % 38000), k = 2048;
    std::vector<float> sc(static_cast<size_t>(n));
    std::normal_distribution<float> N(0.0f, trial % 3 == 0 ? 1e-3f : 30.0f);
    for (auto& v : sc) {
      const uint32_t u = r() % 50;
      v = u == 0 ? -0.0f : u == 1 ? 0.0f : u == 2 ? std::numeric_limits<float>::quiet_NaN()
                                                  : (trial % 3 == 1 ? 1.0f + N(r) * 1e-6f : N(r));
    }
    std::vector<int64_t> order(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) order[static_cast<size_t>(i)] = i;
    auto keyf = [&](int64_t i) { return std::isnan(sc[i]) ? -std::numeric_limits<float>::infinity() : sc[i]; };
    std::stable_sort(order.begin(), order.end(), [&](int64_t a, int64_t b) { return keyf(a) > keyf(b); });
    std::vector<int32_t> want(order.begin(), order.begin() + k);
    std::sort(want.begin(), want.end());
    std::vector<int32_t> got(static_cast<size_t>(k), -1);
    std::vector<float> tmp(static_cast<size_t>(n));
    ASSERT_EQ(kern::topk_indices_threshold(sc.data(), n, k, got.data(), tmp.data()), k) << "trial " << trial;
    EXPECT_EQ(got, want) << "trial " << trial << " n " << n;
  }
}

// The CPU backend's batched DSA selection (a prefill chunk's queries scored together, key block
// by key block, top-k in parallel) against the query-by-query default of the Backend interface:
// the same selections bit for bit, for f16 and f32 keys, two sequences interleaved in one batch,
// queries below and above top_k visible positions; and against the float64 scores of tests/ref.
TEST(ModelFastPaths, BatchedIndexerSelectionEqualsQueryByQuery) {
  const int64_t H = 20, D = 32, nctx = 700, k = 64;  // 20 heads: a partial 16-head group
  ThreadPool pool(2);
  for (bool f16 : {true, false}) {
    CpuBackend be(pool, kern::Precision::Fast);
    WorkLimits lim;
    lim.n_tokens = 64, lim.n_ctx = nctx, lim.n_heads = H, lim.row = D;
    be.reserve(lim);
    std::mt19937 r(f16 ? 5 : 6);
    std::normal_distribution<float> N(0.0f, 1.0f);
    // cache: 2 sequences x nctx keys
    std::vector<float> kf(static_cast<size_t>(2 * nctx * D));
    for (auto& x : kf) x = N(r);
    std::vector<uint8_t> cache(kf.size() * (f16 ? 2 : 4));
    if (f16)
      kern::f32_to_f16_row(kf.data(), reinterpret_cast<uint16_t*>(cache.data()), static_cast<int64_t>(kf.size()));
    else
      std::memcpy(cache.data(), kf.data(), cache.size());
    const CacheRows keys{cache.data(), f16, D, nctx};
    // batch: seq 0 at 600..629 (groups of 16 + 14), seq 1 at 40..69 (up to 63: everything selected),
    // seq 0 again at 630..639
    std::vector<BatchEntry> e;
    for (int i = 0; i < 30; ++i) e.push_back({0, 0, 600 + i, true});
    for (int i = 0; i < 30; ++i) e.push_back({0, 1, 40 + i, true});
    for (int i = 0; i < 10; ++i) e.push_back({0, 0, 630 + i, true});
    const int64_t n = static_cast<int64_t>(e.size());
    std::vector<float> q(static_cast<size_t>(n * H * D)), w(static_cast<size_t>(n * H));
    for (auto& x : q) x = N(r);
    for (auto& x : w) x = N(r);  // negative head weights too
    std::vector<int32_t> sel_a(static_cast<size_t>(n * k), -7), sel_b = sel_a, sn_a(static_cast<size_t>(n), -9), sn_b = sn_a;
    std::vector<float> scores(nctx), tmp(nctx);
    be.indexer_select(keys, e.data(), n, q.data(), w.data(), H, k, sel_a.data(), k, sn_a.data(), scores.data(),
                      tmp.data());
    be.Backend::indexer_select(keys, e.data(), n, q.data(), w.data(), H, k, sel_b.data(), k, sn_b.data(),
                               scores.data(), tmp.data());
    EXPECT_EQ(sn_a, sn_b);
    EXPECT_EQ(sel_a, sel_b);
    // the float64 definition (random scores: no ties) for a few queries
    for (int64_t t : {int64_t{0}, int64_t{17}, int64_t{35}, int64_t{59}, n - 1}) {
      const int64_t nv = e[t].pos + 1;
      if (nv <= k) {
        EXPECT_EQ(sn_a[t], -1);
        continue;
      }
      std::vector<double> qd(q.begin() + t * H * D, q.begin() + (t + 1) * H * D), wd(w.begin() + t * H, w.begin() + (t + 1) * H);
      std::vector<double> sc(static_cast<size_t>(nv));
      for (int64_t s = 0; s < nv; ++s) {
        std::vector<double> kd(static_cast<size_t>(D));
        for (int64_t i = 0; i < D; ++i) {
          const size_t at = static_cast<size_t>((e[t].seq_id * nctx + s) * D + i);
          kd[i] = f16 ? f16_to_f32(reinterpret_cast<const uint16_t*>(cache.data())[at]) : kf[at];
        }
        sc[s] = ref::indexer_score(qd, wd, kd, H, D);
      }
      const auto want = ref::select_top_k(sc, k);
      ASSERT_EQ(sn_a[t], k) << "query " << t;
      for (int64_t i = 0; i < k; ++i) EXPECT_EQ(sel_a[t * k + i], want[i]) << "query " << t << " rank " << i;
    }
  }
}
