// Speculative decoding (runtime/speculative.h): greedy output with a drafter equals the output
// without it, token for token, with the logits each token was chosen from (rejections forced at
// every block position, KDA states rolled back), the n-gram drafter, and the rejection-sampling
// rule keeping the target's distribution (chi-square over many seeds).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <map>
#include <random>
#include <sstream>

#include "engine_fixture.h"
#include "model/model.h"
#include "runtime/context.h"
#include "runtime/sampling.h"
#include "runtime/speculative.h"
#include "test_util.h"
#include "util/error.h"

using namespace kimi;
using kimi::test::TempDir;
using kimi::test::TinySpec;

namespace {

std::vector<int32_t> random_tokens(int n, uint32_t seed, int vocab = 1000) {
  std::mt19937 rng(seed);
  std::vector<int32_t> t(static_cast<size_t>(n));
  for (auto& x : t) x = static_cast<int32_t>(rng() % static_cast<uint32_t>(vocab));
  return t;
}

// Proposes the continuation it is given (the reference output), with a wrong token at chosen
// positions of each block: what a drafter that is right except there looks like.
struct ScriptDrafter final : Drafter {
  std::vector<int32_t> truth;  // the whole expected sequence (prompt + reference output)
  std::vector<int> wrong_at;   // block positions to corrupt (each proposal)
  int block = 4;
  int proposals = 0, accepted_total = 0;
  std::string name() const override { return "script"; }
  int propose(std::span<const int32_t> t, int n_max, std::vector<int32_t>& draft) override {
    draft.clear();
    // the sequence so far must be a prefix of the truth (else the engine emitted a wrong token)
    if (t.size() > truth.size() || !std::equal(t.begin(), t.end(), truth.begin())) return 0;
    const int n = std::min(n_max, block);
    for (int j = 0; j < n && t.size() + static_cast<size_t>(j) < truth.size(); ++j) {
      int32_t x = truth[t.size() + static_cast<size_t>(j)];
      if (std::find(wrong_at.begin(), wrong_at.end(), j) != wrong_at.end()) x = (x + 1) % 1000;
      draft.push_back(x);
    }
    ++proposals;
    return static_cast<int>(draft.size());
  }
  void accepted(int n) override { accepted_total += n; }
};

struct Spec : ::testing::Test {
  static inline TempDir* dir = nullptr;
  static inline std::string path;
  static void SetUpTestSuite() {
    dir = new TempDir();
    path = dir->file("tiny-k31.gguf");
    test::write_tiny_gguf(path, TinySpec{});
  }
  static void TearDownTestSuite() {
    delete dir;
    dir = nullptr;
  }
  static ContextOptions opts(Precision prec = Precision::F32) {
    ContextOptions o;
    o.n_threads = 1;
    o.n_seq_max = 2;
    o.n_ctx_max = 256;
    o.n_batch_max = 64;
    o.precision = prec;
    o.n_snapshots_max = 5;
    return o;
  }
  struct Gen {
    std::vector<int32_t> tokens;            // generated
    std::vector<std::vector<float>> logits; // the row each token was chosen from
  };
  // plain greedy decoding, one token per step
  static Gen plain(const Model& m, const std::vector<int32_t>& prompt, int n, Precision prec = Precision::F32) {
    Context c(m, opts(prec));
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
  // the same through the Speculator with `d`
  static Gen speculative(const Model& m, const std::vector<int32_t>& prompt, int n, Drafter* d, SpecParams p,
                         SpecStats* stats = nullptr, Precision prec = Precision::F32) {
    Context c(m, opts(prec));
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
      EXPECT_LE(out.size(), static_cast<size_t>(p.n_max + 1));
      for (size_t i = 0; i < out.size(); ++i) {
        g.tokens.push_back(out[i]);
        g.logits.emplace_back(sp.logits(i), sp.logits(i) + c.n_vocab());
      }
      // the context holds every emitted token but the pending ones
      EXPECT_EQ(static_cast<size_t>(c.seq_len(0)) + static_cast<size_t>(sp.pending()),
                prompt.size() + g.tokens.size());
    }
    if (stats) *stats = sp.stats();
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
  // tokens equal; each token's logits row equal to tolerance tol (0: bit for bit)
  static void expect_same(const Gen& ref, const Gen& got, double tol, const std::string& what) {
    ASSERT_EQ(ref.tokens, got.tokens) << what;
    ASSERT_EQ(ref.logits.size(), got.logits.size()) << what;
    for (size_t i = 0; i < ref.logits.size(); ++i) {
      if (tol == 0)
        EXPECT_EQ(std::memcmp(ref.logits[i].data(), got.logits[i].data(), ref.logits[i].size() * 4), 0)
            << what << ": logits of token " << i << " differ (max rel " << max_rel(ref.logits[i], got.logits[i]) << ")";
      else
        EXPECT_LT(max_rel(ref.logits[i], got.logits[i]), tol) << what << ": token " << i;
    }
  }
};

// The verify pass computes the rows of a multi-token batch, a decode step one row; every kernel on
// these batch sizes computes a row the same way whatever the other rows are, so the logits each
// token was chosen from are compared bit for bit.
constexpr double kTolF32 = 0;

}  // namespace

TEST_F(Spec, NgramDrafterProposesWhatFollowedTheLastTokens) {
  NgramDrafter d({.n_min_match = 2, .n_max_match = 3});
  std::vector<int32_t> draft;
  draft.reserve(8);
  // "5 6 7 8 9 | 1 5 6" : the last two tokens (5 6) occurred at 0, followed by 7 8 9 1 5 6
  const std::vector<int32_t> t{5, 6, 7, 8, 9, 1, 5, 6};
  ASSERT_EQ(d.propose(t, 4, draft), 4);
  EXPECT_EQ(draft, (std::vector<int32_t>{7, 8, 9, 1}));
  // past the end of the text the continuation repeats with its period: 7 8 9 1 5 6 | 7 8
  ASSERT_EQ(d.propose(t, 8, draft), 8);
  EXPECT_EQ(draft, (std::vector<int32_t>{7, 8, 9, 1, 5, 6, 7, 8}));
  // the longest match wins over a later shorter one: "1 2 3 x | 9 2 3 y | 1 2 3" -> x (3-gram), not y
  const std::vector<int32_t> u{1, 2, 3, 40, 9, 2, 3, 50, 1, 2, 3};
  ASSERT_EQ(d.propose(u, 1, draft), 1);
  EXPECT_EQ(draft[0], 40);
  // the latest occurrence among equal lengths
  const std::vector<int32_t> v{1, 2, 7, 1, 2, 8, 1, 2};
  ASSERT_EQ(d.propose(v, 1, draft), 1);
  EXPECT_EQ(draft[0], 8);
  // nothing to match
  const std::vector<int32_t> w{1, 2, 3, 4};
  EXPECT_EQ(d.propose(w, 4, draft), 0);
  EXPECT_TRUE(draft.empty());
  EXPECT_EQ(d.propose(t, 0, draft), 0);
  EXPECT_THROW(NgramDrafter({.n_min_match = 3, .n_max_match = 2}), Error);
}

TEST_F(Spec, GreedyWithNgramEqualsPlainDecoding) {
  auto m = Model::load(path);
  // a prompt that repeats (the n-gram drafter finds matches) and a random one
  std::vector<int32_t> rep = random_tokens(12, 3);
  std::vector<int32_t> prompt = rep;
  prompt.insert(prompt.end(), rep.begin(), rep.end());
  prompt.insert(prompt.end(), rep.begin(), rep.begin() + 5);
  for (const auto& pr : {prompt, random_tokens(20, 4)}) {
    const Gen ref = plain(*m, pr, 40);
    NgramDrafter d;
    SpecStats st;
    const Gen got = speculative(*m, pr, 40, &d, {.n_max = 6}, &st);
    expect_same(ref, got, kTolF32, "ngram");
    EXPECT_GT(st.steps, 0u);
    EXPECT_EQ(st.emitted + 1, got.tokens.size());  // + the first token, sampled before the loop
  }
}

// --spec auto (SpecParams::adaptive, spec_decide): a drafter that is right (always, or 3 times in 4)
// keeps drafting, with the plain output; one that is always wrong is turned off after its first
// verify step and only probed again after 8, 16, 32, ... plain steps.
TEST_F(Spec, AutoDraftsWhileItPaysAndStopsWhenDraftsAreWrong) {
  auto m = Model::load(path);
  const std::vector<int32_t> prompt = random_tokens(16, 31);
  const Gen ref = plain(*m, prompt, 80);
  {  // the tiny model's cost model: a verify step of 4 drafts costs less than 5 decode steps
    Context c(*m, opts());
    const VerifyCostModel cm = VerifyCostModel::of(*m, c.placement());
    EXPECT_GT(cm.rel(4), 1.0);
    EXPECT_LT(cm.rel(4), 2.5);
    EXPECT_GT(spec_decide(cm, 1.0, 0.0, 1, 4, false).k, 0);
    EXPECT_EQ(spec_decide(cm, 0.0, 0.0, 1, 4, true).k, 0);
  }
  for (const std::vector<int>& wrong : {std::vector<int>{}, std::vector<int>{3}, std::vector<int>{0}}) {
    ScriptDrafter d;
    d.truth = prompt;
    d.truth.insert(d.truth.end(), ref.tokens.begin(), ref.tokens.end());
    d.wrong_at = wrong;
    SpecStats st;
    const Gen got = speculative(*m, prompt, 80, &d, {.n_max = 4, .adaptive = true}, &st);
    expect_same(ref, got, kTolF32, "auto");
    if (wrong.empty()) {  // right: drafting all along (after the first, plain step)
      EXPECT_EQ(st.paused, 0u);
      EXPECT_LE(st.steps, st.verify_steps + 2);
      EXPECT_GT(st.tokens_per_step(), 4.0);
    } else if (wrong[0] == 3) {  // right 3 times in 4: never paused (the plain steps commit the kept
      // tokens of two rollbacks in a row, docs/speculative.md "Rollback")
      EXPECT_EQ(st.paused, 0u);
      EXPECT_GT(st.accept_len(), 2.5);
      EXPECT_GT(st.tokens_per_step(), 2.5);
    } else {  // wrong at 0: off after one verify step; probes after 8, then 16, 32 plain steps
      EXPECT_LE(st.verify_steps, 4u);
      EXPECT_GE(st.paused, 8u + 16u + 32u - 3u);
      EXPECT_EQ(st.accepted, 0u);
    }
  }
}

// The built-in verify-cost model reads the model's own tensors: everything but the embedding table,
// the routed experts split per expert, on the host with a single-device placement.
TEST_F(Spec, CostModelCountsTheWeightsOfThePlacement) {
  auto m = Model::load(path);
  Context c(*m, opts());
  const VerifyCostModel cm = VerifyCostModel::of(*m, c.placement());
  double fixed = 0, experts = 0;
  for (const auto& t : m->reader().tensors()) {
    if (t.name == "token_embd.weight") continue;
    (t.name.find("_exps.weight") != std::string::npos ? experts : fixed) += double(t.nbytes);
  }
  EXPECT_DOUBLE_EQ(cm.host_fixed, fixed);
  EXPECT_NEAR(cm.host_expert * m->hparams().file_experts(), experts, 1e-6 * experts);
  EXPECT_EQ(cm.dev_fixed, 0.0);
  EXPECT_EQ(cm.dev_expert, 0.0);
  EXPECT_EQ(cm.n_expert, static_cast<int>(m->hparams().n_expert));
  EXPECT_EQ(cm.top_k, static_cast<int>(m->hparams().n_expert_used));
}

// Speculation in Fast precision (the default): the verify pass's rows against single-row decode
// steps differ by the batched kernels' rounding; the tokens must still match and the logits stay close.
TEST_F(Spec, GreedyWithNgramEqualsPlainDecodingFastPrecision) {
  auto m = Model::load(path);
  std::vector<int32_t> rep = random_tokens(10, 13);
  std::vector<int32_t> prompt = rep;
  prompt.insert(prompt.end(), rep.begin(), rep.end());
  const Gen ref = plain(*m, prompt, 30, Precision::Fast);
  NgramDrafter d;
  const Gen got = speculative(*m, prompt, 30, &d, {.n_max = 5}, nullptr, Precision::Fast);
  expect_same(ref, got, 0, "ngram fast");
}

// A Q4_K_M file (`kimi quantize`; d = 256 so the 256-column matrices become Q4_K / Q6_K and, >= 16 rows,
// get their packed load-time copies): `kimi eval` writes the same logits bits with micro-batches of 1 and
// of 8 tokens, and greedy speculative decoding (fast precision; the drafter always right, and right
// except at position 1) equals plain decoding bit for bit.
TEST_F(Spec, KQuantFileBatchRowsEqualAloneAndSpeculationIsExact) {
  TinySpec sp;
  sp.d = 256;
  sp.n_ff = 512;
  sp.n_layer = 4;
  sp.mla_layers = {3};
  const std::string f32 = dir->file("tiny-d256.gguf"), q4 = dir->file("tiny-d256-q4km.gguf");
  test::write_tiny_gguf(f32, sp);
  auto qr = test::run_kimi("quantize " + f32 + " " + q4 + " Q4_K_M");
  ASSERT_EQ(qr.exit_code, 0) << qr.out;
  const std::string types = qr.out.substr(qr.out.find("output types"));
  ASSERT_NE(types.find("Q4_K"), std::string::npos) << qr.out;
  ASSERT_NE(types.find("Q6_K"), std::string::npos) << qr.out;

  const std::vector<int32_t> toks = random_tokens(16, 77);
  std::string list;
  for (size_t i = 0; i < toks.size(); ++i) list += (i ? "," : "") + std::to_string(toks[i]);
  std::string logits[2];
  for (int i = 0; i < 2; ++i) {
    const std::string out = dir->file("q4km-b" + std::to_string(i) + ".bin");
    auto r = test::run_kimi("eval -m " + q4 + " -t 1 --all-logits --tokens " + list + " -b " + (i ? "8" : "1") +
                            " --logits-out " + out);
    ASSERT_EQ(r.exit_code, 0) << r.out;
    logits[i] = test::read_file(out);
  }
  ASSERT_EQ(logits[0].size(), toks.size() * 1024 * 4);
  EXPECT_TRUE(logits[0] == logits[1]) << "kimi eval -b 1 and -b 8 logits differ on the Q4_K_M file";

  auto m = Model::load(q4);
  std::vector<int32_t> prompt = random_tokens(12, 78);
  const Gen ref = plain(*m, prompt, 24, Precision::Fast);
  for (std::vector<int> wrong : {std::vector<int>{}, std::vector<int>{1}}) {
    ScriptDrafter d;
    d.truth = prompt;
    d.truth.insert(d.truth.end(), ref.tokens.begin(), ref.tokens.end());
    d.wrong_at = wrong;
    d.block = 5;
    const Gen got = speculative(*m, prompt, 24, &d, {.n_max = 5}, nullptr, Precision::Fast);
    expect_same(ref, got, 0, wrong.empty() ? "q4_k_m always right" : "q4_k_m wrong at 1");
    EXPECT_GT(d.accepted_total, 0);
  }
}

// A drafter that is right except at block position j, for every j, and one that is always right:
// every rejection position (and the all-accepted bonus path) gives the plain output.
TEST_F(Spec, RejectionAtEveryBlockPositionEqualsPlainDecoding) {
  auto m = Model::load(path);
  const std::vector<int32_t> prompt = random_tokens(16, 5);
  const int n = 36, block = 5;
  const Gen ref = plain(*m, prompt, n);
  std::vector<int32_t> truth = prompt;
  truth.insert(truth.end(), ref.tokens.begin(), ref.tokens.end());
  for (int j = -1; j < block; ++j) {
    ScriptDrafter d;
    d.truth = truth;
    d.block = block;
    if (j >= 0) d.wrong_at = {j};
    SpecStats st;
    const Gen got = speculative(*m, prompt, n, &d, {.n_max = block}, &st);
    expect_same(ref, got, kTolF32, "wrong at " + std::to_string(j));
    EXPECT_GT(st.verify_steps, 0u) << j;
    if (j < 0) {
      EXPECT_EQ(st.accepted, st.drafted);  // all right: every step emits its block + the bonus token
    } else {
      // each proposal is kept up to position j, then rejected (the last step may be cut short)
      EXPECT_LE(st.accepted, st.verify_steps * static_cast<uint64_t>(j));
      EXPECT_GE(st.accepted + static_cast<uint64_t>(j), st.verify_steps * static_cast<uint64_t>(j)) << j;
      if (j > 0) {
        EXPECT_GT(st.accepted, 0u);
      }
      EXPECT_GT(st.recomputed, 0u);  // the tiny model has KDA layers: rolled back, then decoded again
    }
  }
}

// The KDA states must go back when drafted tokens are rejected: after a verify step whose drafts
// are all wrong, the next logits equal the plain run's. The same step without the rollback (the
// rejected tokens left in the recurrent state) gives logits far outside that tolerance, so the
// comparison can tell.
TEST_F(Spec, KdaStatesAreRolledBackAfterRejection) {
  auto m = Model::load(path);
  ASSERT_GT(m->hparams().n_kda_layers(), 0u);
  const std::vector<int32_t> prompt = random_tokens(12, 6);
  const Gen ref = plain(*m, prompt, 12);
  std::vector<int32_t> truth = prompt;
  truth.insert(truth.end(), ref.tokens.begin(), ref.tokens.end());
  ScriptDrafter d;
  d.truth = truth;
  d.block = 4;
  d.wrong_at = {0, 1, 2, 3};
  const Gen got = speculative(*m, prompt, 12, &d, {.n_max = 4});
  expect_same(ref, got, kTolF32, "all drafts wrong");

  // the negative control: on a model of KDA layers only (no cache rows; positions only order
  // tokens), continuing after the wrong tokens without restoring the states - what a rollback that
  // forgot the KDA states would do - changes the next logits far beyond the comparison above
  TempDir d2;
  TinySpec ks;
  ks.mla_layers = {};
  const std::string kp = d2.file("kda.gguf");
  test::write_tiny_gguf(kp, ks);
  auto km = Model::load(kp);
  ASSERT_EQ(km->hparams().n_mla_layers(), 0u);
  const Gen kref = plain(*km, prompt, 3);
  truth = prompt;
  truth.insert(truth.end(), kref.tokens.begin(), kref.tokens.end());
  ScriptDrafter kd;
  kd.truth = truth;
  kd.block = 2;
  kd.wrong_at = {0, 1};
  expect_same(kref, speculative(*km, prompt, 3, &kd, {.n_max = 2}), kTolF32, "kda only, all drafts wrong");
  Context c(*km, opts());
  Batch b;
  b.add_sequence(prompt, 0, 0, false);
  c.decode(b);
  b.clear();
  const int32_t L = c.seq_len(0);
  b.add(ref.tokens[0], 0, L, true);
  for (int j = 0; j < 2; ++j) b.add((truth[prompt.size() + 1 + j] + 1) % 1000, 0, L + 1 + j, true);
  c.decode(b);
  // a model without KDA could truncate to L + 1 here; with KDA the context refuses (no snapshot)
  EXPECT_THROW(c.seq_truncate(0, L + 1), Error);
  // what a forgetful rollback would continue from: the stream after the wrong tokens
  b.clear();
  b.add(ref.tokens[1], 0, c.seq_len(0), true);
  c.decode(b);
  const std::vector<float> wrong(c.logits(0), c.logits(0) + c.n_vocab());
  EXPECT_GT(max_rel(wrong, kref.logits[2]), 1e-3);
}

TEST_F(Spec, DraftCapsAndPlainSteps) {
  auto m = Model::load(path);
  const std::vector<int32_t> prompt = random_tokens(10, 7);
  const Gen ref = plain(*m, prompt, 20);
  std::vector<int32_t> truth = prompt;
  truth.insert(truth.end(), ref.tokens.begin(), ref.tokens.end());
  {  // --draft-min above what the drafter proposes: every step is a plain one
    ScriptDrafter d;
    d.truth = truth;
    d.block = 2;
    SpecStats st;
    const Gen got = speculative(*m, prompt, 20, &d, {.n_max = 6, .n_min = 3}, &st);
    expect_same(ref, got, kTolF32, "n_min");
    EXPECT_EQ(st.verify_steps, 0u);
    EXPECT_EQ(st.steps, 19u);
  }
  {  // the last step never goes past the tokens asked for
    ScriptDrafter d;
    d.truth = truth;
    d.block = 8;
    SpecStats st;
    const Gen got = speculative(*m, prompt, 20, &d, {.n_max = 8}, &st);
    expect_same(ref, got, kTolF32, "cap");
    EXPECT_EQ(got.tokens.size(), 20u);
  }
  {  // no drafter: plain decoding through the same loop
    const Gen got = speculative(*m, prompt, 20, nullptr, {.n_max = 4});
    expect_same(ref, got, 0, "no drafter");
  }
  Context c(*m, opts());
  Sampler s({}, c.n_vocab());
  EXPECT_THROW(Speculator(c, 0, s, nullptr, {.n_max = 2, .n_min = 3}), Error);
  EXPECT_THROW(Speculator(c, 0, s, nullptr, {.n_max = -1}), Error);
}

// A model without KDA layers (all MLA) rolls back by truncating the rows alone.
TEST_F(Spec, AllMlaModelRollsBackByTruncation) {
  TempDir d2;
  TinySpec sp;
  sp.n_layer = 4;
  sp.mla_layers = {0, 1, 2, 3};
  const std::string p2 = d2.file("mla.gguf");
  test::write_tiny_gguf(p2, sp);
  auto m = Model::load(p2);
  ASSERT_EQ(m->hparams().n_kda_layers(), 0u);
  const std::vector<int32_t> prompt = random_tokens(14, 8);
  const Gen ref = plain(*m, prompt, 24);
  std::vector<int32_t> truth = prompt;
  truth.insert(truth.end(), ref.tokens.begin(), ref.tokens.end());
  for (int j : {0, 2}) {
    ScriptDrafter d;
    d.truth = truth;
    d.block = 4;
    d.wrong_at = {j};
    SpecStats st;
    const Gen got = speculative(*m, prompt, 24, &d, {.n_max = 4}, &st);
    expect_same(ref, got, kTolF32, "mla wrong at " + std::to_string(j));
    EXPECT_EQ(st.recomputed, 0u);
  }
}

// ---- sampling: the rejection rule keeps the target's distribution ----

namespace {

// the critical value of chi-square with df degrees of freedom at p = 1e-3 (Wilson-Hilferty)
double chi2_crit(int df) {
  const double z = 3.0902, a = 2.0 / (9.0 * df);
  return df * std::pow(1.0 - a + z * std::sqrt(a), 3.0);
}

// chi-square of observed counts against probabilities (cells with expected < 5 pooled)
double chi2(const std::map<std::pair<int, int>, int>& obs, const std::map<std::pair<int, int>, double>& prob, int n,
            int* df) {
  double x = 0, pool_e = 0, pool_o = 0;
  int cells = 0;
  for (const auto& [key, p] : prob) {
    const double e = p * n;
    const auto it = obs.find(key);
    const double o = it == obs.end() ? 0.0 : it->second;
    if (e < 5) {
      pool_e += e, pool_o += o;
      continue;
    }
    x += (o - e) * (o - e) / e;
    ++cells;
  }
  double o_out = 0;  // outcomes the target cannot produce
  for (const auto& [key, c] : obs)
    if (!prob.count(key)) o_out += c;
  pool_o += o_out;
  if (pool_e >= 1e-9) {
    x += (pool_o - pool_e) * (pool_o - pool_e) / pool_e;
    ++cells;
  } else if (pool_o > 0) {
    x += 1e9;  // impossible outcomes observed
  }
  *df = cells - 1;
  return x;
}

// Draws draft tokens from a fixed distribution q over a few ids (its own seed): a drafter with a
// distribution, as a draft model is.
struct RandomDrafter final : Drafter {
  std::vector<float> q;  // n_vocab
  std::vector<int32_t> ids;
  std::mt19937_64 rng;
  int block = 2;
  bool expose_q = true;
  std::string name() const override { return "random"; }
  int propose(std::span<const int32_t>, int n_max, std::vector<int32_t>& draft) override {
    draft.clear();
    std::uniform_real_distribution<double> U(0, 1);
    for (int j = 0; j < std::min(n_max, block); ++j) {
      double r = U(rng), acc = 0;
      int32_t pick = ids.back();
      for (int32_t id : ids) {
        acc += q[static_cast<size_t>(id)];
        if (r < acc) {
          pick = id;
          break;
        }
      }
      draft.push_back(pick);
    }
    return static_cast<int>(draft.size());
  }
  const float* draft_probs(int) const override { return expose_q ? q.data() : nullptr; }
};

}  // namespace

// Over many seeds, the first two tokens generated with drafts (temperature 1, top-k 4) follow the
// target's own joint distribution p(x1) p(x2 | x1): chi-square below its 1e-3 critical value. The
// same counts against a distribution with two cells' probabilities swapped are far above it (the
// test can tell a wrong rule).
TEST_F(Spec, RejectionSamplingKeepsTheTargetDistribution) {
  auto m = Model::load(path);
  Context c(*m, opts());
  const std::vector<int32_t> prompt = random_tokens(9, 9);
  const std::vector<int32_t> head(prompt.begin(), prompt.end() - 1);
  Batch b;
  b.add_sequence(head, 0, 0, false);
  c.decode(b);
  c.seq_snapshot(0);
  const int V = c.n_vocab();
  const SamplerParams sp{.temp = 1.0f, .top_k = 4};
  // the target's distribution of x1 and of x2 given x1: top-4 softmax (computed here, not by the Sampler)
  auto top4 = [&](const float* lg) {
    std::vector<int32_t> id(static_cast<size_t>(V));
    for (int i = 0; i < V; ++i) id[static_cast<size_t>(i)] = i;
    std::partial_sort(id.begin(), id.begin() + 4, id.end(), [&](int32_t a, int32_t bb) {
      return lg[a] > lg[bb] || (lg[a] == lg[bb] && a < bb);
    });
    std::vector<std::pair<int32_t, double>> r;
    double z = 0;
    for (int i = 0; i < 4; ++i) z += std::exp(double(lg[id[static_cast<size_t>(i)]]) - lg[id[0]]);
    for (int i = 0; i < 4; ++i)
      r.push_back({id[static_cast<size_t>(i)], std::exp(double(lg[id[static_cast<size_t>(i)]]) - lg[id[0]]) / z});
    return r;
  };
  std::map<std::pair<int, int>, double> joint;
  b.clear();
  b.add(prompt.back(), 0, c.seq_len(0), true);
  c.decode(b);
  const auto p1 = top4(c.logits(0));
  c.seq_truncate(0, static_cast<int32_t>(head.size()));
  for (const auto& [x1, q1] : p1) {
    b.clear();
    b.add(prompt.back(), 0, c.seq_len(0), false);
    b.add(x1, 0, c.seq_len(0) + 1, true);
    c.decode(b);
    for (const auto& [x2, q2] : top4(c.logits(1))) joint[{x1, x2}] = q1 * q2;
    c.seq_truncate(0, static_cast<int32_t>(head.size()));
  }
  // drafts: from a q over the target's likely tokens, one it never picks, and the x1 candidates
  std::vector<int32_t> ids;
  for (const auto& [x1, q1] : p1) ids.push_back(x1);
  ids.push_back((p1[0].first + 7) % V);  // outside the top-4 support
  for (bool with_q : {true, false}) {
    RandomDrafter d;
    d.q.assign(static_cast<size_t>(V), 0.0f);
    const float qs[5] = {0.1f, 0.4f, 0.2f, 0.2f, 0.1f};
    for (size_t i = 0; i < ids.size(); ++i) d.q[static_cast<size_t>(ids[i])] = qs[i];
    d.ids = ids;
    d.rng.seed(with_q ? 11 : 12);
    d.expose_q = with_q;
    if (!with_q) {  // proposals without a distribution are treated as certain (q = 1 at the token):
      d.q.assign(static_cast<size_t>(V), 0.0f);  // a deterministic drafter: always the second candidate
      d.q[static_cast<size_t>(ids[1])] = 1.0f;
      d.ids = {ids[1]};
    }
    const int N = 3000;
    std::map<std::pair<int, int>, int> obs;
    SpecStats total;
    for (int trial = 0; trial < N; ++trial) {
      SamplerParams p = sp;
      p.seed = 1000 + static_cast<uint64_t>(trial);
      Sampler s(p, V);
      Speculator spec(c, 0, s, &d, {.n_max = 2});
      spec.start(head, prompt.back());
      std::vector<int32_t> out;
      while (out.size() < 2)
        for (int32_t t : spec.step(3)) out.push_back(t);
      obs[{out[0], out[1]}]++;
      total.add(spec.stats());
      c.seq_truncate(0, static_cast<int32_t>(head.size()));
    }
    int df = 0;
    const double x = chi2(obs, joint, N, &df);
    ASSERT_GE(df, 3);
    EXPECT_LT(x, chi2_crit(df)) << (with_q ? "q drafter" : "point drafter") << ": chi2 " << x << " df " << df;
    EXPECT_GT(total.accepted, 0u);
    EXPECT_LT(total.accepted, total.drafted);  // both outcomes of the rule happened
    // power: the two likeliest cells swapped with the two least likely above the pooling limit
    auto bad = joint;
    std::vector<std::pair<double, std::pair<int, int>>> by_p;
    for (const auto& [k, p] : joint)
      if (p * N >= 5) by_p.push_back({p, k});
    std::sort(by_p.begin(), by_p.end());
    std::swap(bad[by_p.front().second], bad[by_p.back().second]);
    int df2 = 0;
    const double x_bad = chi2(obs, bad, N, &df2);
    std::printf("%s: chi2 %.1f (df %d, 1e-3 critical %.1f); against a wrong distribution %.1f; %llu of %llu drafts kept\n",
                with_q ? "q drafter" : "point drafter", x, df, chi2_crit(df), x_bad,
                static_cast<unsigned long long>(total.accepted), static_cast<unsigned long long>(total.drafted));
    EXPECT_GT(x_bad, 2 * chi2_crit(df2));
  }
}

// The sampler's verify() alone, against its own sample() distribution, for a handful of logits.
TEST_F(Spec, SamplerVerifyMatchesSampleDistribution) {
  const int V = 6;
  const float logits[V] = {1.0f, 0.5f, 0.2f, -0.3f, 2.0f, -1.0f};
  SamplerParams p{.temp = 0.8f, .top_p = 0.95f};
  // the distribution sample() draws from, estimated from many draws
  std::vector<double> ps(V, 0.0), pv(V, 0.0);
  const int N = 40000;
  Sampler a(p, V);
  for (int i = 0; i < N; ++i) ps[static_cast<size_t>(a.sample(logits))] += 1.0 / N;
  // verify() with a point draft at token 1 (rejections draw from p without it)
  p.seed = 99;
  Sampler b(p, V);
  int acc_n = 0;
  for (int i = 0; i < N; ++i) {
    bool acc = false;
    pv[static_cast<size_t>(b.verify(logits, 1, nullptr, acc))] += 1.0 / N;
    acc_n += acc;
  }
  for (int t = 0; t < V; ++t) EXPECT_NEAR(ps[static_cast<size_t>(t)], pv[static_cast<size_t>(t)], 0.012) << t;
  EXPECT_NEAR(double(acc_n) / N, ps[1], 0.012);
  // greedy: the argmax, accepted iff it is the draft
  Sampler g({}, V);
  bool acc = true;
  EXPECT_EQ(g.verify(logits, 1, nullptr, acc), 4);
  EXPECT_FALSE(acc);
  EXPECT_EQ(g.verify(logits, 4, nullptr, acc), 4);
  EXPECT_TRUE(acc);
}

// `kimi run --spec ngram` prints the ids `kimi run` prints, on a prompt the model repeats (P, its
// own continuation G, P again: the n-gram drafter proposes G); -n and --draft-max are respected.
TEST(SpecCli, RunWithNgramPrintsThePlainIds) {
  const std::string m = test::tiny_gguf();
  auto first_line = [](const std::string& s) { return s.substr(0, s.find('\n')); };
  auto join = [](const std::vector<int32_t>& v) {
    std::string r;
    for (size_t i = 0; i < v.size(); ++i) r += (i ? "," : "") + std::to_string(v[i]);
    return r;
  };
  const std::vector<int32_t> P = random_tokens(20, 21, 900);
  auto g = test::run_kimi("run -m " + m + " --tokens " + join(P) + " -n 30 --ids --ignore-eos");
  ASSERT_EQ(g.exit_code, 0) << g.out;
  std::vector<int32_t> prompt = P;
  {
    std::istringstream in(first_line(g.out));
    for (int32_t x; in >> x;) prompt.push_back(x);
  }
  ASSERT_EQ(prompt.size(), 50u) << g.out;
  prompt.insert(prompt.end(), P.begin(), P.end());
  const std::string args = "run -m " + m + " --tokens " + join(prompt) + " -n 30 --ids --ignore-eos";
  auto plain = test::run_kimi(args);
  ASSERT_EQ(plain.exit_code, 0) << plain.out;
  for (const char* spec : {"--spec ngram --draft-max 4", "--spec auto", "--spec ngram --draft-min 3"}) {
    auto a = test::run_kimi(args + " " + spec);
    ASSERT_EQ(a.exit_code, 0) << a.out;
    EXPECT_EQ(first_line(a.out), first_line(plain.out)) << spec;
    EXPECT_NE(a.out.find("speculative ("), std::string::npos) << a.out;
  }
  auto bad = test::run_kimi(args + " --spec medusa");
  EXPECT_NE(bad.exit_code, 0);
  bad = test::run_kimi(args + " --spec dspark");
  EXPECT_NE(bad.exit_code, 0);
  EXPECT_NE(bad.out.find("-md/--model-draft"), std::string::npos) << bad.out;
  bad = test::run_kimi(args + " --spec ngram --draft-max 2 --draft-min 3");
  EXPECT_NE(bad.exit_code, 0);
  EXPECT_NE(bad.out.find("--draft-min"), std::string::npos) << bad.out;
  bad = test::run_kimi(args + " -md x.gguf");
  EXPECT_NE(bad.exit_code, 0);
}

// `kimi chat --spec ngram`: the same replies (greedy) over two turns as without, the context kept
// consistent between turns (the second turn reuses the first's cache).
TEST(SpecCli, ChatWithNgramGivesThePlainReplies) {
  const std::string m = test::tiny_gguf();
  TempDir d;
  test::write_file(d.file("in.txt"), "say something\nand again the same\n");
  const std::string args = "chat -m " + m + " -n 24 -t 1 --temp 0 < " + d.file("in.txt");
  auto plain = test::run_kimi(args);
  ASSERT_EQ(plain.exit_code, 0) << plain.out;
  auto spec = test::run_kimi("chat -m " + m + " -n 24 -t 1 --temp 0 --spec ngram --draft-max 5 < " + d.file("in.txt"));
  ASSERT_EQ(spec.exit_code, 0) << spec.out;
  auto body = [](const std::string& s) {  // the replies and the token counts, without the speeds
    std::string r;
    std::istringstream in(s);
    for (std::string l; std::getline(in, l);) {
      if (l.rfind("speculative", 0) == 0) continue;
      if (l.rfind("[prompt", 0) == 0) l = l.substr(0, l.find("reused"));  // "[prompt N tokens: X new, Y "
      r += l + "\n";
    }
    return r;
  };
  EXPECT_NE(body(plain.out).find("[prompt"), std::string::npos);
  EXPECT_EQ(body(spec.out), body(plain.out));
}
