// The Vulkan backend's KDA ops (short conv + SiLU, decay gate, gated delta rule) and the MoE router
// against the CPU backend in f32 (the reference), on random data of real and odd shapes: two
// sequences interleaved in one batch, prefill then decode continuing the per-sequence states, the
// states compared after every step.
#include <algorithm>
#include <cstdlib>
#include <cstring>

#include "unit/vulkan_fixture.h"
#include "util/error.h"

using namespace kimi;
using kimi::test::random_floats;
using kimi::test::rel_rms;

namespace {

// A schedule of micro-batches over sequences 2 and 0 of a 3-slot state (slot 1 stays unused and
// must stay zero): an interleaved prefill of both, a decode step of both, a prefill of one, a
// decode step of both, and a long prefill of both (every 7th token of sequence 2), long enough to
// span several of the backend's token windows (vk_kda.cpp).
std::vector<std::vector<BatchEntry>> schedule(int64_t long_prefill) {
  std::vector<std::vector<BatchEntry>> steps;
  int32_t pos[3] = {0, 0, 0};
  auto add = [&](std::vector<BatchEntry>& b, int32_t seq) {
    BatchEntry e;
    e.token = static_cast<int32_t>(b.size());
    e.seq_id = seq;
    e.pos = pos[seq]++;
    b.push_back(e);
  };
  std::vector<BatchEntry> b;
  for (int32_t s : {2, 0, 0, 2, 2, 2, 0, 2, 0, 0, 2, 0, 0}) add(b, s);  // 6 of seq 2, 7 of seq 0
  steps.push_back(b);
  b.clear();
  add(b, 0);
  add(b, 2);
  steps.push_back(b);
  b.clear();
  for (int i = 0; i < 9; ++i) add(b, 2);
  steps.push_back(b);
  b.clear();
  add(b, 2);
  add(b, 0);
  steps.push_back(b);
  b.clear();
  for (int64_t i = 0; i < long_prefill; ++i) add(b, i % 7 == 3 ? 2 : 0);  // mostly seq 0, some of seq 2
  steps.push_back(b);
  return steps;
}

// per-head L2-normalized rows (n x H*D), as the KDA layer feeds q and k to the scan
std::vector<float> l2_heads(std::vector<float> x, int64_t n, int64_t H, int64_t D) {
  for (int64_t r = 0; r < n * H; ++r) {
    double s = 0;
    for (int64_t i = 0; i < D; ++i) s += static_cast<double>(x[static_cast<size_t>(r * D + i)]) * x[static_cast<size_t>(r * D + i)];
    const float inv = static_cast<float>(1.0 / std::sqrt(s + 1e-6));
    for (int64_t i = 0; i < D; ++i) x[static_cast<size_t>(r * D + i)] *= inv;
  }
  return x;
}

WorkLimits limits(int64_t n_tokens, int64_t H, int64_t D) {
  WorkLimits lim;
  lim.n_tokens = n_tokens;
  lim.n_heads = H;
  lim.row = std::max<int64_t>(D, 64);
  return lim;
}

}  // namespace

using VulkanKda = kimi::test::VulkanOps;

class VulkanKdaScan : public kimi::test::VulkanOps {
 protected:
  // the schedule() steps through kda_scan on both backends, compared after every step
  void scan_schedule(int64_t D, float g_lo, uint32_t seed);
};

// kda_conv_silu: the three streams' outputs and the rolling conv states after every step (K = 4,
// and K = 2, the shortest state); channels H*D for D = 32 (with a 5500-token step: two windows)
// and 128 with H = 3.
TEST_F(VulkanKda, ConvSiluInterleavedPrefillDecode) {
  uint32_t seed = 10;
  for (int64_t D : {32, 128}) {
    for (int64_t K : {4, 2}) {
      const int64_t H = 3, C = H * D, S = K - 1, per_seq = 3 * C * S;
      SCOPED_TRACE("D " + std::to_string(D) + " K " + std::to_string(K));
      cpu_->reserve(limits(12000, H, D));
      gpu_->reserve(limits(12000, H, D));
      auto w0 = both(random_floats(static_cast<size_t>(C * K), seed++, 0.7f));
      auto w1 = both(random_floats(static_cast<size_t>(C * K), seed++, 0.7f));
      auto w2 = both(random_floats(static_cast<size_t>(C * K), seed++, 0.7f));
      const float* wc[3] = {w0.cp<float>(), w1.cp<float>(), w2.cp<float>()};
      const float* wg[3] = {w0.gp<float>(), w1.gp<float>(), w2.gp<float>()};
      auto st = zeros(static_cast<size_t>(3 * per_seq));
      const SeqStates sc{st.cp<float>(), per_seq}, sg{st.gp<float>(), per_seq};
      int step = 0;
      for (const auto& b : schedule(D == 32 && K == 4 ? 12000 : 37)) {
        const int64_t n = static_cast<int64_t>(b.size());
        auto x0 = both(random_floats(static_cast<size_t>(n * C), seed++, 2.0f));
        auto x1 = both(random_floats(static_cast<size_t>(n * C), seed++, 2.0f));
        auto x2 = both(random_floats(static_cast<size_t>(n * C), seed++, 2.0f));
        float* const xc[3] = {x0.cp<float>(), x1.cp<float>(), x2.cp<float>()};
        float* const xg[3] = {x0.gp<float>(), x1.gp<float>(), x2.gp<float>()};
        cpu_->kda_conv_silu(wc, K, C, sc, b.data(), n, xc);
        gpu_->kda_conv_silu(wg, K, C, sg, b.data(), n, xg);
        int i = 0;
        for (const Pair* x : {&x0, &x1, &x2}) {
          auto [c, g] = read(*x);
          EXPECT_LT(rel_rms(g, c), 1e-5) << "step " << step << " stream " << i++;
        }
        auto [c, g] = read(st);
        EXPECT_LT(rel_rms(g, c), 1e-5) << "state after step " << step;
        // the state is the raw inputs: exact, and slot 1 is never touched
        EXPECT_EQ(g, c) << "state after step " << step;
        for (int64_t j = per_seq; j < 2 * per_seq; ++j) ASSERT_EQ(g[static_cast<size_t>(j)], 0.0f);
        ++step;
      }
    }
  }
}

// kda_gate: both forms (lower-bound sigmoid, softplus with both of its branches) on inputs wide
// enough to reach a > 20 and the small-exp(a) end of log1p.
TEST_F(VulkanKda, GateBothForms) {
  uint32_t seed = 40;
  for (int64_t D : {32, 128, 33}) {
    const int64_t H = 3, C = H * D, n = 7;
    SCOPED_TRACE("D " + std::to_string(D));
    auto dtb = both(random_floats(static_cast<size_t>(C), seed++, 2.0f));
    std::vector<float> ah = random_floats(static_cast<size_t>(H), seed++, 1.0f);
    for (auto& x : ah) x = -std::exp(x);  // ssm_a = -exp(A_log) < 0
    auto a = both(ah);
    const auto gin = random_floats(static_cast<size_t>(n * C), seed++, 30.0f);
    for (bool lb : {true, false}) {
      KdaGateParams p;
      p.has_lower_bound = lb;
      p.lower_bound = -5.0f;
      auto g = both(gin);
      cpu_->kda_gate(g.cp<float>(), dtb.cp<float>(), a.cp<float>(), n, H, D, p);
      gpu_->kda_gate(g.gp<float>(), dtb.gp<float>(), a.gp<float>(), n, H, D, p);
      auto [c, r] = read(g);
      EXPECT_LT(rel_rms(r, c), 1e-5) << (lb ? "lower bound" : "softplus");
      // element-wise too: the tiny softplus values must keep their relative precision
      size_t bad = 0;
      for (size_t i = 0; i < c.size(); ++i)
        if (std::fabs(r[i] - c[i]) > 1e-5 * std::fabs(c[i]) + 1e-30) ++bad;
      EXPECT_EQ(bad, 0u) << (lb ? "lower bound" : "softplus") << ": elements off by more than 1e-5 relative";
    }
  }
}

// kda_scan: outputs and the recurrent states after every step; q, k L2-normalized per head, the
// decay from the lower-bound gate (mild: g in (-0.5, 0); K3's range: (-5, 0)), beta in (0, 1),
// scale 1/sqrt(D). Each kernel on the same data: the per-token one, the chunked one (chunks of
// 16 tokens, short chunks padded) and the automatic choice; the 260-token step spans several
// token windows at D = 128.
TEST_F(VulkanKdaScan, InterleavedPrefillDecode) {
  for (const char* mode : {"seq", "chunk", "auto"})
    for (float g_lo : {0.5f, 5.0f})
      for (int64_t D : {32, 128}) {
        SCOPED_TRACE(std::string("kernel ") + mode + " g > -" + std::to_string(g_lo) + " D " + std::to_string(D));
        if (std::strcmp(mode, "auto") == 0)
          unsetenv("KIMI_VULKAN_KDA_SCAN");
        else
          setenv("KIMI_VULKAN_KDA_SCAN", mode, 1);
        scan_schedule(D, g_lo, 70);
      }
  unsetenv("KIMI_VULKAN_KDA_SCAN");
}

void VulkanKdaScan::scan_schedule(int64_t D, float g_lo, uint32_t seed) {
  {
    const int64_t H = 3, C = H * D, per_seq = H * D * D;
    const float scale = 1.0f / std::sqrt(static_cast<float>(D));
    cpu_->reserve(limits(360, H, D));
    gpu_->reserve(limits(360, H, D));
    auto st = zeros(static_cast<size_t>(3 * per_seq));
    const SeqStates sc{st.cp<float>(), per_seq}, sg{st.gp<float>(), per_seq};
    int step = 0;
    for (const auto& b : schedule(360)) {
      const int64_t n = static_cast<int64_t>(b.size());
      auto q = both(l2_heads(random_floats(static_cast<size_t>(n * C), seed++), n, H, D));
      auto k = both(l2_heads(random_floats(static_cast<size_t>(n * C), seed++), n, H, D));
      auto v = both(random_floats(static_cast<size_t>(n * C), seed++, 2.0f));
      std::vector<float> gh = random_floats(static_cast<size_t>(n * C), seed++, 3.0f);
      for (auto& x : gh) x = -g_lo / (1.0f + std::exp(-x));  // log decay in (-g_lo, 0)
      auto g = both(gh);
      std::vector<float> bh = random_floats(static_cast<size_t>(n * H), seed++, 3.0f);
      for (auto& x : bh) x = 1.0f / (1.0f + std::exp(-x));
      auto beta = both(bh);
      auto o = zeros(static_cast<size_t>(n * C));
      cpu_->kda_scan(sc, b.data(), n, H, D, q.cp<float>(), k.cp<float>(), v.cp<float>(), g.cp<float>(),
                     beta.cp<float>(), scale, o.cp<float>());
      gpu_->kda_scan(sg, b.data(), n, H, D, q.gp<float>(), k.gp<float>(), v.gp<float>(), g.gp<float>(),
                     beta.gp<float>(), scale, o.gp<float>());
      {
        auto [c, r] = read(o);
        EXPECT_LT(rel_rms(r, c), 1e-5) << "output of step " << step << " (" << n << " tokens)";
      }
      auto [c, r] = read(st);
      EXPECT_LT(rel_rms(r, c), 1e-5) << "state after step " << step;
      for (int64_t j = per_seq; j < 2 * per_seq; ++j) ASSERT_EQ(r[static_cast<size_t>(j)], 0.0f);
      double norm = 0;
      for (float x : c) norm += static_cast<double>(x) * x;
      EXPECT_GT(norm, 1.0) << "the state is not trivially small";
      ++step;
    }
  }
}

namespace {

struct RouteCase {
  int64_t E, k, n;
  bool softmax, bias, renorm, ties;
  float scale;
};

}  // namespace

// moe_route: exact selection (ranked; ties to the lower index), weights and probabilities, at the
// real size (E 896, 8 used, sigmoid + bias) and small odd ones with many exact ties.
TEST_F(VulkanKda, RouterSelectionAndWeights) {
  const RouteCase cases[] = {
      {896, 8, 9, false, true, true, false, 1.0f},   // K3-like: sigmoid, bias chooses only
      {896, 16, 3, true, false, true, false, 2.5f},  // softmax, scaled
      {37, 5, 11, false, false, false, true, 1.0f},  // odd E, ties, no renormalization
      {37, 5, 11, true, true, true, true, 1.0f},     // odd E, ties in both logits and bias
      {7, 7, 4, false, true, true, true, 1.0f},      // every expert chosen
  };
  uint32_t seed = 100;
  for (const RouteCase& rc : cases) {
    const int64_t E = rc.E, k = rc.k, n = rc.n;
    SCOPED_TRACE("E " + std::to_string(E) + " k " + std::to_string(k) + (rc.softmax ? " softmax" : " sigmoid"));
    WorkLimits lim;
    lim.n_tokens = n;
    lim.n_expert = E;
    lim.n_expert_used = k;
    cpu_->reserve(lim);
    gpu_->reserve(lim);
    std::vector<float> lh = random_floats(static_cast<size_t>(n * E), seed++, 3.0f);
    std::vector<float> bh = random_floats(static_cast<size_t>(E), seed++, 0.05f);
    if (rc.ties) {  // few distinct values: exact ties everywhere (equal logits give equal probs on both)
      for (auto& x : lh) x = std::round(x * 1.5f) / 1.5f;
      for (size_t i = 0; i < bh.size(); ++i) bh[i] = (i % 3) * 0.125f;
      if (rc.bias)
        for (int64_t t = 0; t < n; ++t)
          for (int64_t i = 0; i < E; ++i)  // equal logits only within one bias class
            lh[static_cast<size_t>(t * E + i)] = lh[static_cast<size_t>(t * E + i % 3 + (i / 9) * 3 % (E - 3))];
    }
    auto lg = both(lh);
    auto bias = both(bh);
    auto probs = zeros(static_cast<size_t>(n * E));
    auto sel = zeros<int32_t>(static_cast<size_t>(n * k));
    auto w = zeros(static_cast<size_t>(n * k));
    RouterParams p;
    p.n_expert = E;
    p.n_used = k;
    p.softmax = rc.softmax;
    p.renormalize = rc.renorm;
    p.scale = rc.scale;
    cpu_->moe_route(lg.cp<float>(), rc.bias ? bias.cp<float>() : nullptr, n, p, probs.cp<float>(), sel.cp<int32_t>(),
                    w.cp<float>());
    gpu_->moe_route(lg.gp<float>(), rc.bias ? bias.gp<float>() : nullptr, n, p, probs.gp<float>(), sel.gp<int32_t>(),
                    w.gp<float>());
    auto [sc, sg] = read<int32_t>(sel);
    EXPECT_EQ(sg, sc) << "selected experts (ranked)";
    if (rc.ties) {  // the case really has ties among the chosen
      int tied = 0;
      for (int64_t t = 0; t < n; ++t)
        for (int64_t j = 1; j < k; ++j)
          tied += lh[static_cast<size_t>(t * E + sc[static_cast<size_t>(t * k + j)])] ==
                  lh[static_cast<size_t>(t * E + sc[static_cast<size_t>(t * k + j - 1)])];
      EXPECT_GT(tied, 0);
    }
    auto [wc, wg] = read(w);
    EXPECT_LT(rel_rms(wg, wc), 1e-6) << "weights";
    auto [pc, pg] = read(probs);
    EXPECT_LT(rel_rms(pg, pc), 1e-6) << "probabilities";
    if (rc.renorm) {
      double s = 0;
      for (int64_t j = 0; j < k; ++j) s += wg[static_cast<size_t>(j)];
      EXPECT_NEAR(s, rc.scale, 1e-5) << "renormalized weights sum to the scale";
    }
  }
}

// shapes the kernels cannot take fail with a message naming the op, before anything is recorded
TEST_F(VulkanKda, BadShapesFailClearly) {
  auto expect_error = [](auto&& fn, const char* what) {
    try {
      fn();
      ADD_FAILURE() << "no error for " << what;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(what), std::string::npos) << e.what();
    }
  };
  auto buf = gpu_->alloc(1 << 20, "test");
  float* p = buf->as<float>();
  std::vector<BatchEntry> b(2);
  expect_error([&] { gpu_->kda_scan({p, 512 * 512}, b.data(), 2, 1, 512, p, p, p, p, p, 1.0f, p); }, "kda_scan head dim");
  expect_error([&] { gpu_->kda_scan({p, 100}, b.data(), 2, 1, 32, p, p, p, p, p, 1.0f, p); }, "kda_scan state");
  const float* w[3] = {p, p, p};
  float* x[3] = {p, p, p};
  expect_error([&] { gpu_->kda_conv_silu(w, 4, 32, {p, 3 * 32 * 2}, b.data(), 2, x); }, "kda_conv_silu state");
  RouterParams rp;
  rp.n_expert = 4;
  rp.n_used = 5;
  expect_error([&] { gpu_->moe_route(p, nullptr, 2, rp, p, reinterpret_cast<int32_t*>(p), p); }, "moe_route");
}
