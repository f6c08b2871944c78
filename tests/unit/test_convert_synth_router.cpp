// `kimi synth --router zipf[:S]` (convert/synth.h, Config::router_zipf): the selection bias it writes makes
// a sigmoid router with N(0, 1) logits pick the experts with the designed Zipf shares, from token to token.
// Checked here by drawing router logits independently (std::normal_distribution, not the synth's hash),
// selecting the top k of sigmoid(l) + bias as the engine does, and comparing the counted shares with the
// design (router_pick_share) and with Zipf's law itself.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <cmath>
#include <numeric>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "convert/synth.h"
#include "util/error.h"

namespace {

const std::string kBias = "language_model.model.layers.{}.block_sparse_moe.gate.e_score_correction_bias";

std::string bias_name(int layer) {
  std::string s = kBias;
  s.replace(s.find("{}"), 2, std::to_string(layer));
  return s;
}

kimi::synth::Config config(int64_t experts, int64_t used, const std::string& router) {
  auto c = kimi::synth::preset("tiny");
  kimi::synth::set_experts(c, experts);
  kimi::synth::set_experts_used(c, used);
  kimi::synth::set_router(c, router);
  return c;
}

// picks per expert over `tokens` tokens with independent N(0, 1) logits; also the number of distinct top-k sets
std::vector<double> simulate(const std::vector<float>& bias, int64_t k, int tokens, size_t* distinct) {
  const size_t E = bias.size();
  std::mt19937_64 rng(12345);
  std::normal_distribution<double> nd(0.0, 1.0);
  std::vector<double> count(E, 0.0);
  std::set<std::vector<int>> sets;
  std::vector<std::pair<double, int>> s(E);
  for (int t = 0; t < tokens; ++t) {
    for (size_t e = 0; e < E; ++e) s[e] = {1.0 / (1.0 + std::exp(-nd(rng))) + double(bias[e]), int(e)};
    std::partial_sort(s.begin(), s.begin() + k, s.end(), [](auto& a, auto& b) { return a.first > b.first; });
    std::vector<int> top;
    for (int64_t i = 0; i < k; ++i) count[size_t(s[size_t(i)].second)] += 1, top.push_back(s[size_t(i)].second);
    std::sort(top.begin(), top.end());
    if (sets.size() < 100000) sets.insert(top);
  }
  *distinct = sets.size();
  return count;
}

}  // namespace

TEST(SynthRouter, ParsesTheOption) {
  auto c = kimi::synth::preset("tiny");
  EXPECT_LT(c.router_zipf, 0);  // spread is the default
  kimi::synth::set_router(c, "zipf");
  EXPECT_EQ(c.router_zipf, 1.0);
  kimi::synth::set_router(c, "zipf:0.5");
  EXPECT_EQ(c.router_zipf, 0.5);
  kimi::synth::set_router(c, "spread");
  EXPECT_LT(c.router_zipf, 0);
  for (const char* bad : {"zipf:", "zipf:-1", "zipf:x", "zipf:1x", "zipf:4.5", "zip", "zipf1", "", "uniform"}) {
    try {
      kimi::synth::set_router(c, bad);
      ADD_FAILURE() << "accepted --router '" << bad << "'";
    } catch (const kimi::Error& e) {
      EXPECT_NE(std::string(e.what()).find("--router"), std::string::npos) << e.what();
    }
  }
  EXPECT_THROW(kimi::synth::set_experts_used(c, 0), kimi::Error);
  EXPECT_THROW(kimi::synth::set_experts_used(c, c.experts + 1), kimi::Error);
}

TEST(SynthRouter, DesignedSharesFollowZipf) {
  const auto c = config(256, 8, "zipf:1");
  EXPECT_TRUE(kimi::synth::router_pick_share(c, 0).empty());  // layer 0 is dense
  const auto p = kimi::synth::router_pick_share(c, 2);
  ASSERT_EQ(p.size(), 256u);
  EXPECT_NEAR(std::accumulate(p.begin(), p.end(), 0.0), 8.0, 1e-9);
  std::vector<double> s = p;
  std::sort(s.rbegin(), s.rend());
  // uncapped ranks: p_r proportional to 1 / r
  for (size_t r = 1; r < s.size(); ++r)
    if (s[r - 1] < 1.0) EXPECT_NEAR(s[r] / s[r - 1], double(r) / double(r + 1), 1e-9) << r;
  // a different order in another layer
  EXPECT_NE(p, kimi::synth::router_pick_share(c, 3));
  // S = 0: every expert equally often
  for (double x : kimi::synth::router_pick_share(config(64, 8, "zipf:0"), 1)) EXPECT_NEAR(x, 8.0 / 64.0, 1e-12);
}

TEST(SynthRouter, SigmoidRouterPicksTheDesignedShares) {
  for (auto [E, k, router] : {std::tuple<int64_t, int64_t, const char*>{64, 16, "zipf"}, {256, 8, "zipf:1"},
                              {128, 4, "zipf:0.6"}}) {
    const auto c = config(E, k, router);
    const auto bias = kimi::synth::tensor_values(c, bias_name(3));
    ASSERT_EQ(bias.size(), size_t(E));
    const auto want = kimi::synth::router_pick_share(c, 3);
    const int T = 20000;
    size_t distinct = 0;
    const auto got = simulate(bias, k, T, &distinct);
    // total variation between the counted and the designed shares of the picks
    double tv = 0;
    for (int64_t e = 0; e < E; ++e) tv += std::fabs(got[size_t(e)] / (double(T) * k) - want[size_t(e)] / double(k));
    tv *= 0.5;
    std::printf("%s, %lld experts top %lld: total variation %.4f, %zu distinct sets of %d tokens\n", router,
                static_cast<long long>(E), static_cast<long long>(k), tv, distinct, T);
    EXPECT_LT(tv, 0.03) << router << " E " << E;
    // the choices vary from token to token
    EXPECT_GT(distinct, size_t(T / 2)) << router << " E " << E;
    // the most popular expert by design is picked most often, and the top 10 % take far more than 10 %
    const auto top = size_t(std::max_element(want.begin(), want.end()) - want.begin());
    EXPECT_EQ(top, size_t(std::max_element(got.begin(), got.end()) - got.begin())) << router;
    std::vector<double> g = got;
    std::sort(g.rbegin(), g.rend());
    const double top10 = std::accumulate(g.begin(), g.begin() + E / 10, 0.0) / (double(T) * k);
    EXPECT_GT(top10, 0.25) << router << " E " << E;
  }
  // the spread router (the default) is what the zipf one replaces: one set of experts for nearly every token
  auto c = kimi::synth::preset("tiny");
  kimi::synth::set_experts(c, 64);
  kimi::synth::set_experts_used(c, 8);
  size_t distinct = 0;
  simulate(kimi::synth::tensor_values(c, bias_name(3)), 8, 2000, &distinct);
  EXPECT_LT(distinct, 2000u / 20);  // zipf: over half of the tokens pick a set of their own
}
