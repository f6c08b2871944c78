// The side models on the Vulkan backend (lavapipe in CI): the DSpark draft (docs/spec/dspark.md)
// and the MoonViT vision tower (docs/spec/vision.md) run through the same Backend ops as on the
// CPU; their outputs on a Vulkan backend of their own against the CPU backend's (f32 both; rel RMS
// 1e-4 as the other Vulkan-vs-CPU model tests, argmax equal) and the float64 references the CPU
// side is checked against (tests/ref), through DsparkDraft / DsparkDrafter and VisionRunner.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <atomic>
#include <cmath>
#include <random>

#include "backend/cpu/cpu_backend.h"
#include "backend/placement.h"
#include "engine_fixture.h"
#include "image/image.h"
#include "image_fixture.h"
#include "model/dspark.h"
#include "model/vision.h"
#include "ref/dspark_ref.h"
#include "ref/ref_vision.h"
#include "runtime/context.h"
#include "runtime/dspark_drafter.h"
#include "runtime/sampling.h"
#include "runtime/speculative.h"
#include "runtime/vision_input.h"
#include "test_util.h"
#include "unit/vulkan_fixture.h"
#include "util/error.h"
#include "util/thread_pool.h"

using namespace kimi;

namespace {

bool have_vulkan() {
  if (test::first_vulkan_device() >= 0) return true;
  if (test::vulkan_required()) ADD_FAILURE() << "no usable Vulkan device, but KIMI_REQUIRE_VULKAN=1 / CI=true";
  return false;
}

struct DraftFiles {
  test::TempDir dir;
  std::string target_hf, target_gguf, draft_hf, draft_gguf;
};

DraftFiles& draft_files() {
  static DraftFiles f = [] {
    DraftFiles f;
    f.target_hf = test::tiny_hf(1);
    f.target_gguf = test::tiny_gguf(1);
    f.draft_hf = f.dir.file("draft-hf");
    f.draft_gguf = f.dir.file("draft.gguf");
    auto r = test::run_kimi(fmt::format("synth --preset dspark-tiny --seed 1 -q -o {}", f.draft_hf));
    EXPECT_EQ(r.exit_code, 0) << r.out;
    r = test::run_kimi(fmt::format("convert {} -o {} --quiet", f.draft_hf, f.draft_gguf));
    EXPECT_EQ(r.exit_code, 0) << r.out;
    return f;
  }();
  return f;
}

// context rows: taps [n][tap_width] as the draft takes them, and the same values in double
std::vector<std::vector<double>> random_taps(int64_t n, int64_t width, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<double> N(0.0, 1.0);
  std::vector<std::vector<double>> t(static_cast<size_t>(n), std::vector<double>(static_cast<size_t>(width)));
  for (auto& row : t)
    for (auto& x : row) x = static_cast<float>(N(rng));
  return t;
}

void add_context(DsparkDraft& d, const std::vector<std::vector<double>>& taps) {
  for (size_t p0 = 0; p0 < taps.size(); p0 += 64) {
    const size_t n = std::min<size_t>(64, taps.size() - p0);
    std::vector<BatchEntry> e(n);
    std::vector<float> buf;
    for (size_t t = 0; t < n; ++t) {
      e[t] = {0, 0, static_cast<int32_t>(p0 + t), false};
      for (double v : taps[p0 + t]) buf.push_back(static_cast<float>(v));
    }
    d.add_context(e.data(), static_cast<int64_t>(n), buf.data());
  }
}

// max |a - ref| / max |ref|
double max_rel(const float* a, const std::vector<double>& ref) {
  double md = 0, mr = 0;
  for (size_t i = 0; i < ref.size(); ++i) {
    md = std::max(md, std::abs(double(a[i]) - ref[i]));
    mr = std::max(mr, std::abs(ref[i]));
  }
  return md / mr;
}

size_t argmax(const float* v, size_t n) { return static_cast<size_t>(std::max_element(v, v + n) - v); }

using kimi::test::random_image;

}  // namespace

// The draft's block logits and Markov bias on Vulkan vs the CPU backend and vs the float64
// reference, for contexts of 0..200 rows (past the synthetic YaRN original length 64).
TEST(VulkanSide, DsparkBlockLogitsMatchCpuAndReference) {
  if (!have_vulkan()) GTEST_SKIP() << "no Vulkan device on this machine";
  auto& f = draft_files();
  const auto ref = ref::DsparkRef::load(f.draft_hf, f.target_hf);
  auto target = Model::load(f.target_gguf);
  auto dm = DsparkModel::load(f.draft_gguf);
  ThreadPool pool(2);
  CpuBackend cpu(pool, Precision::F32);
  auto gpu = make_vulkan_backend(test::first_vulkan_device(), Precision::F32);
  const DsparkOptions o{.n_seq = 1, .n_ctx = 256, .n_batch = 64};
  DsparkDraft dc(*dm, *target, cpu, o), dg(*dm, *target, *gpu, o);
  const int64_t B = ref.block(), V = ref.vocab();
  struct Case {
    int ctx;
    uint32_t seed;
    int32_t anchor;
  };
  for (const Case c : {Case{0, 1, 5}, Case{9, 3, 42}, Case{200, 5, 1000}}) {
    SCOPED_TRACE(fmt::format("context {} anchor {}", c.ctx, c.anchor));
    const auto taps = random_taps(c.ctx, ref.tap_width(), c.seed);
    add_context(dc, taps);
    add_context(dg, taps);
    std::vector<float> zc(static_cast<size_t>(B * V)), zg(zc.size());
    dc.block_logits(0, c.anchor, c.ctx, zc.data());
    dg.block_logits(0, c.anchor, c.ctx, zg.data());
    EXPECT_LT(test::rel_rms(zg, zc), 1e-4);
    const auto want = ref.block_logits(taps, c.anchor);
    for (int64_t j = 0; j < B; ++j) {
      EXPECT_LE(max_rel(zg.data() + j * V, want[size_t(j)]), 2e-5) << "block row " << j;  // the CPU's bound
      EXPECT_EQ(argmax(zg.data() + j * V, size_t(V)), argmax(zc.data() + j * V, size_t(V))) << "block row " << j;
    }
    int32_t tc[7], tg[7];
    ASSERT_EQ(dc.draft_greedy(0, c.anchor, c.ctx, 7, tc), 7);
    ASSERT_EQ(dg.draft_greedy(0, c.anchor, c.ctx, 7, tg), 7);
    EXPECT_EQ(std::vector<int32_t>(tg, tg + 7), std::vector<int32_t>(tc, tc + 7)) << "greedy block";
  }
  std::vector<float> bc(static_cast<size_t>(V)), bg(bc.size());
  dc.markov_bias(321, bc.data());
  dg.markov_bias(321, bg.data());
  EXPECT_LT(test::rel_rms(bg, bc), 1e-5);
}

// DsparkDrafter with a Vulkan backend of its own (what `kimi run --device vulkan --spec dspark`
// makes) proposes the CPU drafter's tokens.
TEST(VulkanSide, DsparkDrafterOnVulkanProposesTheCpuDraft) {
  if (!have_vulkan()) GTEST_SKIP() << "no Vulkan device on this machine";
  auto& f = draft_files();
  auto target = Model::load(f.target_gguf);
  std::shared_ptr<const DsparkModel> dm = DsparkModel::load(f.draft_gguf);
  std::shared_ptr<Backend> gpu = make_vulkan_backend(test::first_vulkan_device(), Precision::F32);
  DsparkDrafter dc(dm, *target, {.n_ctx = 64, .n_batch = 4, .n_threads = 1, .precision = Precision::F32});
  DsparkDrafter dg(dm, *target, {.n_ctx = 64, .n_batch = 4, .n_threads = 1, .precision = Precision::F32, .backend = gpu});
  const auto taps = random_taps(9, 5 * 64, 78);
  std::vector<float> rows;
  for (auto& r : taps) rows.insert(rows.end(), r.begin(), r.end());
  TargetTaps t;
  t.layers = dc.tap_layers();
  t.n_embd = 64;
  t.n_rows = 9;
  t.data = rows.data();
  dc.observe(t);
  dg.observe(t);
  std::vector<int32_t> toks{5, 6, 7, 8, 9, 10, 11, 12, 13, 14}, a, b;
  a.reserve(8), b.reserve(8);
  ASSERT_EQ(dc.propose(toks, 7, a), 7);
  ASSERT_EQ(dg.propose(toks, 7, b), 7);
  EXPECT_EQ(a, b);
}

// The vision tower through VisionRunner on a Vulkan backend vs the CPU's and vs the float64
// reference (the CPU's bound, 1e-4 rel RMS): odd sizes, one image and several per call.
TEST(VulkanSide, VisionTowerMatchesCpuAndReference) {
  if (!have_vulkan()) GTEST_SKIP() << "no Vulkan device on this machine";
  const std::string mmproj = test::tiny_vision_dir(1) + "/model.mmproj.gguf";
  VisionRunner vc(mmproj, 64, 2, Precision::F32);
  VisionRunner vg(mmproj, 64, 2, Precision::F32, make_vulkan_backend(test::first_vulkan_device(), Precision::F32));
  auto ref = ref::RefVision::load(test::tiny_hf(1));
  const std::pair<int64_t, int64_t> sizes[] = {{50, 30}, {31, 77}, {14, 14}};
  std::vector<image::Patches> ps;
  std::vector<ref::RefImage> rs;
  for (size_t i = 0; i < std::size(sizes); ++i) {
    const image::Rgb im = random_image(sizes[i].first, sizes[i].second, static_cast<uint32_t>(i + 11));
    ps.push_back(vg.preprocess(im));
    rs.push_back(ref::ref_preprocess(im.px, im.width, im.height));
  }
  auto flat = [](const std::vector<std::vector<double>>& r) {
    std::vector<float> v;
    for (auto& row : r)
      for (double x : row) v.push_back(static_cast<float>(x));
    return v;
  };
  for (size_t i = 0; i < ps.size(); ++i) {
    SCOPED_TRACE(fmt::format("{}x{}", sizes[i].first, sizes[i].second));
    const auto g = vg.encode({&ps[i]});
    const auto c = vc.encode({&ps[i]});
    ASSERT_EQ(g.size(), c.size());
    EXPECT_LT(test::rel_rms(g, c), 1e-4);
    const auto r = flat(ref.forward({&rs[i]}));
    ASSERT_EQ(g.size(), r.size());
    EXPECT_LT(test::rel_rms(g, r), 1e-4);
  }
  const auto all = vg.encode({&ps[0], &ps[1], &ps[2]});
  const auto call = vc.encode({&ps[0], &ps[1], &ps[2]});
  ASSERT_EQ(all.size(), call.size());
  EXPECT_LT(test::rel_rms(all, call), 1e-4);
  EXPECT_LT(test::rel_rms(all, flat(ref.forward({&rs[0], &rs[1], &rs[2]}))), 1e-4);
  // a cancelled call (the server's tower worker) waits for what it recorded and stops; the device
  // then gives the same rows again
  std::atomic<bool> stop{true};
  EXPECT_THROW(vg.encode({&ps[0], &ps[1], &ps[2]}, &stop), Error);
  EXPECT_EQ(vg.encode({&ps[0], &ps[1], &ps[2]}), all);
}

// ---- speculative decoding with the target on Vulkan (docs/speculative.md) ----

namespace {

std::vector<int32_t> random_tokens(int n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<int32_t> t(static_cast<size_t>(n));
  for (auto& x : t) x = static_cast<int32_t>(rng() % 1000u);
  return t;
}

// Proposes the reference continuation with a wrong token at the chosen block positions.
struct ScriptDrafter final : Drafter {
  std::vector<int32_t> truth;
  std::vector<int> wrong_at;
  int block = 4;
  std::string name() const override { return "script"; }
  int propose(std::span<const int32_t> t, int n_max, std::vector<int32_t>& draft) override {
    draft.clear();
    if (t.size() > truth.size() || !std::equal(t.begin(), t.end(), truth.begin())) return 0;
    for (int j = 0; j < std::min(n_max, block) && t.size() + size_t(j) < truth.size(); ++j) {
      int32_t x = truth[t.size() + size_t(j)];
      if (std::find(wrong_at.begin(), wrong_at.end(), j) != wrong_at.end()) x = (x + 1) % 1000;
      draft.push_back(x);
    }
    return static_cast<int>(draft.size());
  }
};

class VulkanSpec : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!have_vulkan()) GTEST_SKIP() << "no Vulkan device on this machine";
    gpu_ = make_vulkan_backend(test::first_vulkan_device(), Precision::F32);
    path_ = dir_.file("tiny.gguf");
    test::write_tiny_gguf(path_, test::TinySpec{});
    m_ = Model::load(path_);
  }
  // every layer, the head and the embeddings on the device; hybrid: the routed experts on the CPU
  ContextOptions opts(bool hybrid) const {
    ContextOptions o;
    o.n_threads = 2;
    o.n_seq_max = 2;
    o.n_ctx_max = 256;
    o.n_batch_max = 32;
    o.precision = Precision::F32;
    o.n_snapshots_max = 3;
    o.placement.n_gpu_layers = -1;
    o.placement.cpu_moe = hybrid;
    o.placement.overrides = parse_tensor_overrides("token_embd=vulkan");
    o.extra_backends = {gpu_.get()};
    return o;
  }
  struct Gen {
    std::vector<int32_t> tokens;
    std::vector<std::vector<float>> logits;
  };
  Gen plain(const std::vector<int32_t>& prompt, int n, bool hybrid) {
    Context c(*m_, opts(hybrid));
    Batch b;
    b.add_sequence(prompt, 0, 0, true);
    c.decode(b);
    Sampler s({}, c.n_vocab());
    Gen g;
    const float* lg = c.logits(b.size() - 1);
    for (int i = 0; i < n; ++i) {
      const int32_t t = s.sample(lg);
      g.tokens.push_back(t);
      g.logits.emplace_back(lg, lg + c.n_vocab());
      if (i + 1 == n) break;
      b.clear();
      b.add(t, 0, c.seq_len(0), true);
      c.decode(b);
      lg = c.logits(0);
    }
    return g;
  }
  Gen speculative(const std::vector<int32_t>& prompt, int n, bool hybrid, Drafter* d, SpecParams p, SpecStats* st) {
    Context c(*m_, opts(hybrid));
    Batch b;
    b.add_sequence(prompt, 0, 0, true);
    c.decode(b);
    Sampler s({}, c.n_vocab());
    Gen g;
    const float* lg = c.logits(b.size() - 1);
    const int32_t first = s.sample(lg);
    s.accept(first);
    g.tokens.push_back(first);
    g.logits.emplace_back(lg, lg + c.n_vocab());
    Speculator sp(c, 0, s, d, p);
    sp.start(prompt, first);
    while (static_cast<int>(g.tokens.size()) < n) {
      const auto& out = sp.step(n - static_cast<int>(g.tokens.size()));
      for (size_t i = 0; i < out.size(); ++i) {
        g.tokens.push_back(out[i]);
        g.logits.emplace_back(sp.logits(i), sp.logits(i) + c.n_vocab());
      }
    }
    *st = sp.stats();
    return g;
  }
  static double max_rel(const std::vector<float>& a, const std::vector<float>& b) {
    double mx = 0, scale = 0;
    for (size_t i = 0; i < a.size(); ++i) {
      mx = std::max(mx, double(std::fabs(a[i] - b[i])));
      scale = std::max(scale, double(std::fabs(a[i])));
    }
    return mx / std::max(scale, 1e-30);
  }
  // tokens equal; each token's logits within tol (0: bit for bit); returns the worst difference
  static double expect_same(const Gen& ref, const Gen& got, double tol, const std::string& what) {
    EXPECT_EQ(ref.tokens, got.tokens) << what;
    if (ref.logits.size() != got.logits.size()) return 1;
    double worst = 0;
    for (size_t i = 0; i < ref.logits.size(); ++i) {
      const double e = max_rel(ref.logits[i], got.logits[i]);
      worst = std::max(worst, e);
      if (tol == 0)
        EXPECT_EQ(std::memcmp(ref.logits[i].data(), got.logits[i].data(), ref.logits[i].size() * 4), 0)
            << what << ": logits of token " << i << " differ (max rel " << e << ")";
      else
        EXPECT_LE(e, tol) << what << ": token " << i;
    }
    return worst;
  }
  test::TempDir dir_;
  std::string path_;
  std::unique_ptr<Backend> gpu_;
  std::unique_ptr<Model> m_;
};

}  // namespace

// The Vulkan kernels the verify pass runs, on the batch sizes it uses (k + 1 drafted rows, plus the
// rows decoded again after a KDA rollback): below the GEMM switch (16 rows) a row of a batch of m
// rows has the logits of the same token decoded alone, bit for bit (m = 2, 5, 9, 15; after a short
// prompt and after one of 140 tokens, where the rows see several 64-row attention chunks and the
// batch crosses a chunk boundary). From 16 rows the tiled GEMM, grouped experts and the chunked KDA
// scan sum in other orders: close, not the same bits (docs/gpu.md, "Batch invariance").
TEST_F(VulkanSpec, BatchRowEqualsAlone) {
  struct Case {
    bool hybrid;
    int plen;
    std::vector<int> rows;
  };
  for (const Case& k : {Case{false, 140, {3, 15, 18}}, Case{true, 9, {9}}}) {
    SCOPED_TRACE(fmt::format("{}, prompt {}", k.hybrid ? "hybrid" : "full GPU", k.plen));
    Context c(*m_, opts(k.hybrid));
    const std::vector<int32_t> prompt = random_tokens(k.plen, 21), next = random_tokens(18, 22);
    Batch b;
    b.add_sequence(prompt, 0, 0, false);
    c.decode(b);
    b.clear();
    b.add_sequence(prompt, 1, 0, false);
    c.decode(b);
    const int32_t P = static_cast<int32_t>(prompt.size());
    c.seq_snapshot(0);
    c.seq_snapshot(1);
    for (int m : k.rows) {
      SCOPED_TRACE("rows " + std::to_string(m));
      c.seq_truncate(0, P);  // back to the snapshot after the prompt
      b.clear();
      for (int i = 0; i < m; ++i) b.add(next[size_t(i)], 0, P + i, true);
      c.decode(b);
      std::vector<std::vector<float>> batch;
      for (int i = 0; i < m; ++i) batch.emplace_back(c.logits(i), c.logits(i) + c.n_vocab());
      c.seq_truncate(1, P);
      for (int i = 0; i < m; ++i) {
        b.clear();
        b.add(next[size_t(i)], 1, P + i, true);
        c.decode(b);
        const std::vector<float> alone(c.logits(0), c.logits(0) + c.n_vocab());
        if (m < 16)
          EXPECT_EQ(std::memcmp(alone.data(), batch[size_t(i)].data(), alone.size() * 4), 0)
              << "row " << i << " (max rel " << max_rel(alone, batch[size_t(i)]) << ")";
        else
          EXPECT_LT(max_rel(alone, batch[size_t(i)]), 1e-4) << "row " << i;
      }
    }
  }
}

// Greedy speculation with the target on Vulkan (all layers; hybrid): drafts wrong at each block
// position (each a rejection and a KDA rollback), drafts all right, and the n-gram drafter: the
// tokens and the logits each was chosen from are those of plain decoding.
TEST_F(VulkanSpec, GreedyWithDraftsEqualsPlainDecoding) {
  const std::vector<int32_t> prompt = random_tokens(14, 23);
  const int n = 24, block = 4;
  for (bool hybrid : {false, true}) {
    SCOPED_TRACE(hybrid ? "hybrid" : "full GPU");
    const Gen ref = plain(prompt, n, hybrid);
    std::vector<int32_t> truth = prompt;
    truth.insert(truth.end(), ref.tokens.begin(), ref.tokens.end());
    for (int j : hybrid ? std::vector<int>{1} : std::vector<int>{-1, 0, 1, 2, 3}) {
      ScriptDrafter d;
      d.truth = truth;
      d.block = block;
      if (j >= 0) d.wrong_at = {j};
      SpecStats st;
      const Gen got = speculative(prompt, n, hybrid, &d, {.n_max = block}, &st);
      expect_same(ref, got, 0, "wrong at " + std::to_string(j));
      EXPECT_GT(st.verify_steps, 0u);
      if (j >= 0) EXPECT_GT(st.recomputed, 0u) << "a rejection rolls the KDA states back";
      else EXPECT_EQ(st.accepted, st.drafted);
    }
  }
  NgramDrafter nd;
  SpecStats st;
  expect_same(plain(prompt, n, false), speculative(prompt, n, false, &nd, {.n_max = 6}, &st), 0, "ngram");
}
