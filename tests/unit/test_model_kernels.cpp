// The engine's small kernels (ops, top-k, conv, KDA step, MLA attention) and the sampler against
// straightforward double-precision loops written here from the spec.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <vector>

#include "backend/cpu/attention.h"
#include "backend/cpu/conv.h"
#include "backend/cpu/dispatch.h"
#include "backend/cpu/kda.h"
#include "backend/cpu/ops.h"
#include "backend/cpu/topk.h"
#include "ref/reference.h"
#include "runtime/sampling.h"
#include "tensor/types.h"

using namespace kimi;

namespace {
std::vector<float> rnd(size_t n, uint32_t seed, float scale = 1.0f) {
  std::mt19937 r(seed);
  std::uniform_real_distribution<float> U(-scale, scale);
  std::vector<float> v(n);
  for (auto& x : v) x = U(r);
  return v;
}

// Runs body once per ISA level this CPU supports (the one dispatch moves every kernel family), then
// restores the level in use.
template <class F>
void at_every_isa(F body) {
  const kern::Isa saved = kern::current_isa();
  for (kern::Isa isa : kern::supported_isas()) {
    kern::set_isa(isa);
    SCOPED_TRACE(kern::isa_name(isa));
    body();
  }
  kern::set_isa(saved);
}
}  // namespace

TEST(ModelKernels, NormsAndActivations) {
  at_every_isa([&] {
  const int n = 37;
  auto x = rnd(n, 1, 3.0f), w = rnd(n, 2), b = rnd(n, 3);
  std::vector<float> y(n);
  double ss = 0, mean = 0;
  for (float v : x) ss += double(v) * v, mean += v;
  mean /= n;
  kern::rms_norm(x.data(), w.data(), y.data(), n, 1e-5f);
  for (int i = 0; i < n; ++i) EXPECT_NEAR(y[i], x[i] / std::sqrt(ss / n + 1e-5) * w[i], 1e-5);
  kern::l2_norm(x.data(), y.data(), n, 1e-5f);
  for (int i = 0; i < n; ++i) EXPECT_NEAR(y[i], x[i] / std::sqrt(ss + 1e-5), 1e-6);
  double var = 0;
  for (float v : x) var += (v - mean) * (v - mean);
  var /= n;
  kern::layer_norm(x.data(), w.data(), b.data(), y.data(), n, 1e-6f);
  for (int i = 0; i < n; ++i) EXPECT_NEAR(y[i], (x[i] - mean) / std::sqrt(var + 1e-6) * w[i] + b[i], 1e-5);
  auto g = rnd(n, 4, 30.0f), u = rnd(n, 5, 60.0f);
  kern::situ(g.data(), u.data(), y.data(), n, 4.0f, 25.0f);
  for (int i = 0; i < n; ++i) {
    const double gs = 4.0 * std::tanh(g[i] / 4.0) / (1 + std::exp(-double(g[i])));
    EXPECT_NEAR(y[i], gs * 25.0 * std::tanh(u[i] / 25.0), 1e-4 * (1 + std::fabs(y[i])));
  }
  kern::situ(g.data(), u.data(), y.data(), n, 4.0f, 0.0f);  // lambda <= 0: identity up branch
  for (int i = 0; i < n; ++i)
    EXPECT_NEAR(y[i], 4.0 * std::tanh(g[i] / 4.0) / (1 + std::exp(-double(g[i]))) * u[i], 1e-4 * (1 + std::fabs(y[i])));
  });
}

TEST(ModelKernels, VectorPrimitivesAllLengths) {
  at_every_isa([&] {
  for (int n : {1, 7, 16, 31, 32, 33, 100, 576}) {
    auto a = rnd(n, 10 + n), b = rnd(n, 20 + n);
    std::vector<uint16_t> h(n);
    std::vector<float> bh(n);
    for (int i = 0; i < n; ++i) bh[i] = f16_to_f32(h[i] = f32_to_f16(b[i]));
    double d = 0, dh = 0;
    for (int i = 0; i < n; ++i) d += double(a[i]) * b[i], dh += double(a[i]) * bh[i];
    EXPECT_NEAR(kern::dot_f32(a.data(), b.data(), n), d, 1e-5 * n);
    EXPECT_NEAR(kern::dot_f16(a.data(), h.data(), n), dh, 1e-5 * n);
    std::vector<float> y(a), y2(a);
    kern::axpy_f32(0.5f, b.data(), y.data(), n);
    kern::axpy_f16(0.5f, h.data(), y2.data(), n);
    for (int i = 0; i < n; ++i) {
      EXPECT_FLOAT_EQ(y[i], a[i] + 0.5f * b[i]);
      EXPECT_FLOAT_EQ(y2[i], a[i] + 0.5f * bh[i]);
    }
    std::vector<uint16_t> h2(n);
    std::vector<float> back(n);
    kern::f32_to_f16_row(b.data(), h2.data(), n);
    kern::f16_to_f32_row(h2.data(), back.data(), n);
    for (int i = 0; i < n; ++i) {
      EXPECT_EQ(h2[i], h[i]);
      EXPECT_EQ(back[i], bh[i]);
    }
  }
  });
}

TEST(ModelKernels, TopKTiesGoToTheEarlierPosition) {
  std::vector<float> s = {1, 5, 3, 5, 0, 5, 2, NAN, 5};
  std::vector<kern::ScoreIdx> scr(s.size());
  std::vector<int32_t> out(s.size());
  ASSERT_EQ(kern::topk_indices(s.data(), 9, 2, out.data(), scr.data()), 2);
  EXPECT_EQ(out[0], 1);
  EXPECT_EQ(out[1], 3);
  ASSERT_EQ(kern::topk_indices(s.data(), 9, 5, out.data(), scr.data()), 5);
  EXPECT_EQ(std::vector<int32_t>(out.begin(), out.begin() + 5), (std::vector<int32_t>{1, 2, 3, 5, 8}));
  ASSERT_EQ(kern::topk_ranked(s.data(), 9, 3, out.data(), scr.data()), 3);
  EXPECT_EQ(std::vector<int32_t>(out.begin(), out.begin() + 3), (std::vector<int32_t>{1, 3, 5}));
  EXPECT_EQ(kern::topk_indices(s.data(), 9, 20, out.data(), scr.data()), 9);  // k > n: everything
  // random scores with many exact ties against a sort-based selection
  std::mt19937 r(5);
  for (int trial = 0; trial < 20; ++trial) {
    const int n = 1 + int(r() % 300), k = 1 + int(r() % 40);
    std::vector<float> v(n);
    for (auto& x : v) x = float(int(r() % 7));
    std::vector<int32_t> idx(n);
    for (int i = 0; i < n; ++i) idx[i] = i;
    std::stable_sort(idx.begin(), idx.end(), [&](int a, int b) { return v[a] > v[b]; });
    idx.resize(std::min(n, k));
    std::sort(idx.begin(), idx.end());
    std::vector<kern::ScoreIdx> sc(n);
    std::vector<int32_t> got(n);
    const int64_t m = kern::topk_indices(v.data(), n, k, got.data(), sc.data());
    EXPECT_EQ(std::vector<int32_t>(got.begin(), got.begin() + m), idx);
  }
}

TEST(ModelKernels, ConvStepIsCausalWithLastTapOnCurrentToken) {
  const int C = 5, K = 4, T = 9;
  auto w = rnd(C * K, 30), u = rnd(C * T, 31);
  std::vector<float> st(C * (K - 1), 0.0f), out(C);
  for (int t = 0; t < T; ++t) {
    kern::conv_step(w.data(), K, st.data(), u.data() + t * C, out.data(), C);
    for (int c = 0; c < C; ++c) {
      double ref = 0;
      for (int j = 0; j < K; ++j) {
        const int s = t - (K - 1) + j;  // tap K-1 multiplies the current token
        if (s >= 0) ref += double(w[c * K + j]) * u[s * C + c];
      }
      EXPECT_NEAR(out[c], ref, 1e-5) << "t " << t << " c " << c;
    }
  }
}

TEST(ModelKernels, KdaStepMatchesTheDeltaRule) {
  at_every_isa([&] {
  for (int D : {8, 32, 64, 128}) {  // 32: generic AVX-512 path; 64, 128: register-resident variants
  const int T = 6;
  std::vector<float> S(D * D, 0.0f), tmp(D), o(D);
  std::vector<double> Sr(D * D, 0.0);
  for (int t = 0; t < T; ++t) {
    auto q = rnd(D, 40 + t), k = rnd(D, 50 + t), v = rnd(D, 60 + t), g = rnd(D, 70 + t, 0.5f);
    for (auto& x : g) x -= 0.6f;  // log decay < 0
    const float beta = 0.3f + 0.1f * t;
    kern::kda_step(S.data(), q.data(), k.data(), v.data(), g.data(), beta, 0.25f, o.data(), D, tmp.data());
    // reference: decay, predict with decayed state, update, read with updated state
    for (int i = 0; i < D; ++i)
      for (int j = 0; j < D; ++j) Sr[i * D + j] *= std::exp(double(g[i]));
    for (int j = 0; j < D; ++j) {
      double p = 0;
      for (int i = 0; i < D; ++i) p += Sr[i * D + j] * k[i];
      const double delta = beta * (v[j] - p);
      for (int i = 0; i < D; ++i) Sr[i * D + j] += k[i] * delta;
    }
    for (int j = 0; j < D; ++j) {
      double r = 0;
      for (int i = 0; i < D; ++i) r += Sr[i * D + j] * q[i];
      EXPECT_NEAR(o[j], 0.25 * r, 1e-5 * (1 + std::fabs(r))) << "D " << D << " t " << t << " j " << j;
    }
  }
  }
  });
}

// The chunked (WY) form against the float64 recurrence of tests/ref and against the token steps
// (outputs and the state after every chunk), with the K3 gate range: log decays in (-5, 0), some
// channels at the -5 bound for all 16 tokens of a chunk (cumulative decay e^-80, the hardest case
// the chunk form still takes), both gate forms (log decay / decay factor), full and short chunks.
TEST(ModelKernels, KdaChunkMatchesTheRecurrence) {
  at_every_isa([&] {
  for (int D : {8, 32, 128}) {
  for (bool decayed : {false, true}) {
    const int T = 45;  // chunks of 16, 16, 13
    std::mt19937 rng(7u + static_cast<uint32_t>(D));
    std::uniform_real_distribution<float> U(-1.0f, 1.0f), G(-5.0f, 0.0f), Bt(0.05f, 0.95f);
    std::vector<float> q(T * D), k(T * D), v(T * D), g(T * D), gin(T * D), beta(T);
    auto unit = [&](float* x) {
      double n = 0;
      for (int i = 0; i < D; ++i) n += double(x[i]) * x[i];
      for (int i = 0; i < D; ++i) x[i] = static_cast<float>(x[i] / std::sqrt(n));
    };
    for (int t = 0; t < T; ++t) {
      for (int i = 0; i < D; ++i) {
        q[t * D + i] = U(rng), k[t * D + i] = U(rng), v[t * D + i] = U(rng);
        g[t * D + i] = i % 7 == 3 ? -5.0f : G(rng);
      }
      unit(&q[t * D]), unit(&k[t * D]);
      beta[t] = Bt(rng);
    }
    for (int j = 0; j < T * D; ++j) gin[j] = decayed ? std::exp(g[j]) : g[j];
    const float scale = 1.0f / std::sqrt(float(D));
    std::vector<float> S(D * D, 0.0f), St(D * D, 0.0f), o(T * D), ot(T * D), tmp(D);
    std::vector<float> work(static_cast<size_t>(kern::kda_chunk_work_floats(D)));
    for (int t0 = 0; t0 < T; t0 += 16) {
      const int L = std::min(16, T - t0);
      const int64_t off = int64_t(t0) * D;
      ASSERT_TRUE(kern::kda_chunk(S.data(), &q[off], &k[off], &v[off], &gin[off], decayed, &beta[t0], D, 1, L, scale,
                                  &o[off], D, work.data()));
      for (int t = t0; t < t0 + L; ++t) {
        const int64_t ot0 = int64_t(t) * D;
        if (decayed)
          kern::kda_step_decay(St.data(), &q[ot0], &k[ot0], &v[ot0], &gin[ot0], beta[t], scale, &ot[ot0], D, tmp.data());
        else
          kern::kda_step(St.data(), &q[ot0], &k[ot0], &v[ot0], &gin[ot0], beta[t], scale, &ot[ot0], D, tmp.data());
      }
      double worst = 0;
      for (int j = 0; j < D * D; ++j) worst = std::max(worst, std::fabs(double(S[j]) - St[j]) / (1e-3 + std::fabs(St[j])));
      EXPECT_LT(worst, 2e-5) << "state after the chunk at " << t0 << ", D " << D;
    }
    // float64 reference
    std::vector<std::vector<double>> rq(T), rk(T), rv(T), rg(T);
    std::vector<double> rb(beta.begin(), beta.end());
    for (int t = 0; t < T; ++t) {
      rq[t].assign(&q[t * D], &q[t * D] + D), rk[t].assign(&k[t * D], &k[t * D] + D);
      rv[t].assign(&v[t * D], &v[t * D] + D), rg[t].assign(&g[t * D], &g[t * D] + D);
    }
    const auto ref = ref::kda_recurrence(rq, rk, rv, rg, rb);
    double worst_chunk = 0, worst_step = 0;
    for (int t = 0; t < T; ++t)
      for (int j = 0; j < D; ++j) {
        worst_chunk = std::max(worst_chunk, std::fabs(o[t * D + j] - ref[t][j]));
        worst_step = std::max(worst_step, std::fabs(ot[t * D + j] - ref[t][j]));
      }
    // same order of error as the token steps (f32 rounding), far below the outputs (~0.1)
    EXPECT_LT(worst_chunk, 2e-6) << "D " << D << " decayed " << decayed << " (token steps: " << worst_step << ")";
  }
  }
  });
}

// A channel that decays below the chunk form's range (e^-6 per token: e^-96 over 16 tokens)
// returns false and leaves the state and the outputs untouched; so does a NaN decay.
TEST(ModelKernels, KdaChunkDeclinesDecayOutOfRange) {
  at_every_isa([&] {
  const int D = 32, L = 16;
  for (float gbad : {-6.0f, NAN}) {
    std::vector<float> q(L * D, 0.1f), k(L * D, 0.1f), v(L * D, 0.5f), g(L * D, -0.1f), beta(L, 0.5f);
    for (int t = 0; t < L; ++t) g[t * D + 5] = gbad;
    std::vector<float> S(D * D, 0.25f), o(L * D, 7.0f), work(static_cast<size_t>(kern::kda_chunk_work_floats(D)));
    EXPECT_FALSE(kern::kda_chunk(S.data(), q.data(), k.data(), v.data(), g.data(), false, beta.data(), D, 1, L, 0.5f,
                                 o.data(), D, work.data()));
    EXPECT_TRUE(std::all_of(S.begin(), S.end(), [](float x) { return x == 0.25f; }));
    EXPECT_TRUE(std::all_of(o.begin(), o.end(), [](float x) { return x == 7.0f; }));
  }
  });
}

TEST(ModelKernels, MlaSparseAndDenseMatchSoftmaxOverTheSelection) {
  at_every_isa([&] {
  struct Cfg {
    int W, r, n, nh;
  };
  // W 40: portable scores; W 96 (% 16 == 0): AVX-512 block scores, 4-head accumulate tiles plus a
  // tail head, several 16-row blocks with a partial one; nh 17: two head passes
  for (const Cfg cfg : {Cfg{40, 32, 23, 3}, Cfg{96, 64, 53, 9}, Cfg{96, 48, 37, 17}}) {
  const int W = cfg.W, r = cfg.r, n = cfg.n, nh = cfg.nh;
  auto rows = rnd(n * W, 80 + W), q = rnd(nh * W, 81 + nh, 2.0f);
  std::vector<uint16_t> rows_h(n * W);
  std::vector<float> rows_hf(n * W);
  for (int i = 0; i < n * W; ++i) rows_hf[i] = f16_to_f32(rows_h[i] = f32_to_f16(rows[i]));
  std::vector<int32_t> sel = {0, 3, 4, 10, 22};
  for (int s = 23; s < n; s += 2) sel.push_back(s);  // more than one block when n is large
  std::vector<uint8_t> mask(n, 0);
  for (int s : sel) mask[s] = 1;
  const float scale = 0.2f;
  for (bool f16 : {false, true}) {
    const std::vector<float>& R = f16 ? rows_hf : rows;
    kern::LatentRows lr{f16 ? static_cast<const void*>(rows_h.data()) : rows.data(), f16, W, r};
    for (bool all : {false, true}) {
      // reference
      std::vector<double> ref(nh * r, 0.0);
      for (int h = 0; h < nh; ++h) {
        std::vector<double> e;
        std::vector<int> ids;
        for (int s = 0; s < n; ++s)
          if (all || mask[s]) {
            double d = 0;
            for (int j = 0; j < W; ++j) d += double(q[h * W + j]) * R[s * W + j];
            e.push_back(d * scale);
            ids.push_back(s);
          }
        const double mx = *std::max_element(e.begin(), e.end());
        double sum = 0;
        for (auto& x : e) sum += (x = std::exp(x - mx));
        for (size_t i = 0; i < ids.size(); ++i)
          for (int j = 0; j < r; ++j) ref[h * r + j] += e[i] / sum * R[ids[i] * W + j];
      }
      std::vector<float> zs(nh * r), zd(nh * r), rb(W), sc(nh * n);
      kern::mla_attend_sparse(q.data(), nh, lr, all ? nullptr : sel.data(), all ? n : int64_t(sel.size()), scale,
                              zs.data(), rb.data());
      kern::mla_attend_dense(q.data(), nh, lr, n, all ? nullptr : mask.data(), scale, zd.data(), sc.data(), rb.data());
      for (int i = 0; i < nh * r; ++i) {
        EXPECT_NEAR(zs[i], ref[i], 1e-5) << "W " << W << " nh " << nh << " i " << i;
        EXPECT_NEAR(zd[i], ref[i], 1e-5) << "W " << W << " nh " << nh << " i " << i;
      }
    }
  }
  }
  });
}

TEST(ModelSampler, GreedyTopKTopPMinPAndPenalty) {
  const std::vector<float> lg = {1.0f, 3.0f, 2.5f, 3.0f, -1.0f};
  Sampler g({}, 5);
  EXPECT_EQ(g.sample(lg.data()), 1);  // tie between 1 and 3: lower id
  SamplerParams pp;
  pp.repeat_penalty = 2.0f;
  Sampler pen(pp, 5);
  pen.accept(1);
  pen.accept(1);
  EXPECT_EQ(pen.sample(lg.data()), 3);  // 3.0/2 = 1.5 < 3.0
  // top-k 1 with temperature is greedy
  SamplerParams tk;
  tk.temp = 1.0f;
  tk.top_k = 1;
  tk.seed = 9;
  Sampler s1(tk, 5);
  for (int i = 0; i < 10; ++i) EXPECT_EQ(s1.sample(lg.data()), 1);
  // top-p keeps the smallest prefix with mass >= p; min-p drops tokens below min_p * p_max
  SamplerParams tp;
  tp.temp = 1.0f;
  tp.top_p = 0.5f;
  tp.seed = 1;
  Sampler s2(tp, 5);
  for (int i = 0; i < 50; ++i) {
    int t = s2.sample(lg.data());
    EXPECT_TRUE(t == 1 || t == 3) << t;  // p(1) = p(3) ~ 0.36 each: the first two reach 0.5
  }
  SamplerParams mp;
  mp.temp = 1.0f;
  mp.min_p = 0.5f;
  mp.seed = 2;
  Sampler s3(mp, 5);
  std::vector<int> seen(5, 0);
  for (int i = 0; i < 200; ++i) seen[s3.sample(lg.data())]++;
  EXPECT_EQ(seen[0], 0);
  EXPECT_EQ(seen[4], 0);
  EXPECT_GT(seen[1], 0);
  EXPECT_GT(seen[2], 0);  // exp(-0.5) = 0.61 >= 0.5
  EXPECT_GT(seen[3], 0);
  // same seed, same draws
  SamplerParams t;
  t.temp = 0.9f;
  t.seed = 77;
  Sampler a(t, 5), b(t, 5);
  for (int i = 0; i < 20; ++i) EXPECT_EQ(a.sample(lg.data()), b.sample(lg.data()));
}
