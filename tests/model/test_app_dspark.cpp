// The K3 DSpark draft (docs/spec/dspark.md): `kimi synth --preset dspark-tiny` + `kimi convert`,
// the draft's forward pass on the CPU backend against the independent float64 reference
// (tests/ref/dspark_ref.h, which reads the HF checkpoints), greedy block drafting with the Markov
// head, the target's hidden-state taps, and clear errors for bad drafts.
//
// Tolerance: Precision::F32 (weights decoded exactly, f32 activations and latent cache): only f32
// rounding differs. Bound: max |engine - ref| / max |ref| <= 2e-5 over each block row's logits, for
// context lengths 0..200 (past the synthetic YaRN original length 64); measured <= 6e-7. Mistakes
// seen at 0.5 .. 1.2 (checked by hand on the engine): causal attention inside the block, no YaRN
// attention scale (mscale^2), plain RoPE frequencies instead of YaRN's.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <cmath>
#include <random>

#include "backend/cpu/cpu_backend.h"
#include "backend/placement.h"
#include "engine_fixture.h"
#include "model/dspark.h"
#include "model/forward.h"
#include "ref/dspark_ref.h"
#include "runtime/context.h"
#include "runtime/dspark_drafter.h"
#include "test_util.h"
#include "util/error.h"
#include "util/thread_pool.h"

namespace {

using kimi::test::run_kimi;

constexpr double kTol = 2e-5;

struct Files {
  kimi::test::TempDir dir;
  std::string target_hf, target_gguf, draft_hf, draft_gguf;
};

Files& files() {
  static Files f = [] {
    Files f;
    f.target_hf = kimi::test::tiny_hf(1);
    f.target_gguf = kimi::test::tiny_gguf(1);
    f.draft_hf = f.dir.file("draft-hf");
    f.draft_gguf = f.dir.file("draft.gguf");
    auto r = run_kimi(fmt::format("synth --preset dspark-tiny --seed 1 -q -o {}", f.draft_hf));
    EXPECT_EQ(r.exit_code, 0) << r.out;
    r = run_kimi(fmt::format("convert {} -o {} --quiet", f.draft_hf, f.draft_gguf));
    EXPECT_EQ(r.exit_code, 0) << r.out;
    return f;
  }();
  return f;
}

std::vector<std::vector<double>> random_taps(int64_t n, int64_t width, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<double> N(0.0, 1.0);
  std::vector<std::vector<double>> t(static_cast<size_t>(n), std::vector<double>(static_cast<size_t>(width)));
  for (auto& row : t)
    for (auto& x : row) x = static_cast<float>(N(rng));  // representable in f32: both sides see the same input
  return t;
}

double rel_err(const std::vector<float>& eng, const std::vector<double>& ref) {
  double md = 0, mr = 0;
  for (size_t i = 0; i < ref.size(); ++i) {
    md = std::max(md, std::abs(double(eng[i]) - ref[i]));
    mr = std::max(mr, std::abs(ref[i]));
  }
  return md / mr;
}

struct Engine {
  std::unique_ptr<kimi::Model> target;
  std::unique_ptr<kimi::DsparkModel> dm;
  kimi::ThreadPool pool{2};
  std::unique_ptr<kimi::CpuBackend> be;
  std::unique_ptr<kimi::DsparkDraft> draft;
  explicit Engine(int n_ctx, int n_seq = 1) {
    target = kimi::Model::load(files().target_gguf);
    dm = kimi::DsparkModel::load(files().draft_gguf);
    be = std::make_unique<kimi::CpuBackend>(pool, kimi::Precision::F32);
    draft = std::make_unique<kimi::DsparkDraft>(*dm, *target, *be,
                                                kimi::DsparkOptions{.n_seq = n_seq, .n_ctx = n_ctx, .n_batch = 64});
  }
  // context rows 0..taps.size()-1 of seq, in chunks of up to 64
  void context(int32_t seq, const std::vector<std::vector<double>>& taps) {
    const auto& hp = dm->hparams();
    const int64_t nk = static_cast<int64_t>(hp.taps.size()), dt = hp.target_n_embd;
    for (size_t p0 = 0; p0 < taps.size(); p0 += 64) {
      const int64_t n = std::min<int64_t>(64, static_cast<int64_t>(taps.size() - p0));
      std::vector<kimi::BatchEntry> e(static_cast<size_t>(n));
      std::vector<float> buf(static_cast<size_t>(n * nk * dt));
      for (int64_t t = 0; t < n; ++t) {
        e[size_t(t)] = {0, seq, static_cast<int32_t>(p0 + t), false};
        for (int64_t k = 0; k < nk; ++k)
          for (int64_t i = 0; i < dt; ++i)
            buf[size_t((t * nk + k) * dt + i)] = static_cast<float>(taps[p0 + size_t(t)][size_t(k * dt + i)]);
      }
      draft->add_context(e.data(), n, buf.data());
    }
  }
};

TEST(Dspark, SynthAndConvertWriteTheDocumentedLayout) {
  auto dm = kimi::DsparkModel::load(files().draft_gguf);
  const auto& hp = dm->hparams();
  EXPECT_EQ(hp.n_layer, 5u);
  EXPECT_EQ(hp.n_embd, 64u);
  EXPECT_EQ(hp.block, 7u);
  EXPECT_EQ(hp.markov_rank, 16u);
  EXPECT_EQ(hp.mask_token, 1024u - 3);
  EXPECT_EQ(hp.taps, (std::vector<uint32_t>{0, 2, 4, 5, 7}));  // K3's taps scaled to 8 layers (dspark.md §4)
  EXPECT_EQ(hp.target_n_layer, 8u);
  EXPECT_FLOAT_EQ(hp.yarn_factor, 32.0f);
  EXPECT_EQ(hp.yarn_orig_ctx, 64u);
  // 5 model-level + 13 per layer (kv_b split into k_b and v_b), embed_tokens and confidence head dropped
  EXPECT_EQ(dm->reader().tensors().size(), 5u + 13u * 5u);
  auto target = kimi::Model::load(files().target_gguf);
  EXPECT_NO_THROW(dm->check_target(target->hparams()));
  // kimi verify re-derives every tensor and key from the HF source; kimi inspect shows the file
  auto r = run_kimi(fmt::format("verify {} {} -q", files().draft_hf, files().draft_gguf));
  EXPECT_EQ(r.exit_code, 0) << r.out;
  EXPECT_NE(r.out.find("verified 70 tensors: 70 exact, 0 mismatched"), std::string::npos) << r.out;
  r = run_kimi(fmt::format("inspect {}", files().draft_gguf));
  EXPECT_EQ(r.exit_code, 0) << r.out;
  EXPECT_NE(r.out.find("kimi-k3-dspark.markov_rank"), std::string::npos) << r.out;
  // verify finds one changed element of a split tensor
  kimi::test::TempDir d;
  std::string bytes = kimi::test::read_file(files().draft_gguf);
  const auto* ti = dm->reader().find_tensor("blk.3.attn_k_b.weight");
  ASSERT_NE(ti, nullptr);
  const size_t at = static_cast<size_t>(ti->data - dm->reader().mapped_file(0)->data()) + 2 * 77;
  bytes[at] = static_cast<char>(bytes[at] ^ 0x10);
  kimi::test::write_file(d.file("bad.gguf"), bytes);
  r = run_kimi(fmt::format("verify {} {} -q", files().draft_hf, d.file("bad.gguf")));
  EXPECT_NE(r.exit_code, 0) << r.out;
  EXPECT_NE(r.out.find("blk.3.attn_k_b.weight"), std::string::npos) << r.out;
}

// The block's base logits vs the float64 reference for several tap inputs and block positions.
TEST(Dspark, BlockLogitsMatchTheFloat64Reference) {
  const auto ref = kimi::ref::DsparkRef::load(files().draft_hf, files().target_hf);
  Engine eng(256);
  const int64_t B = ref.block(), V = ref.vocab();
  ASSERT_EQ(B, 7);
  struct Case {
    int ctx;
    uint32_t seed;
    int32_t anchor;
  };
  for (const Case c : {Case{0, 1, 5}, Case{1, 2, 700}, Case{9, 3, 42}, Case{63, 4, 1}, Case{200, 5, 1000}}) {
    SCOPED_TRACE(fmt::format("context {} seed {} anchor {}", c.ctx, c.seed, c.anchor));
    const auto taps = random_taps(c.ctx, ref.tap_width(), c.seed);
    eng.context(0, taps);
    std::vector<float> z(static_cast<size_t>(B * V));
    eng.draft->block_logits(0, c.anchor, c.ctx, z.data());
    const auto want = ref.block_logits(taps, c.anchor);
    for (int64_t j = 0; j < B; ++j) {
      std::vector<float> row(z.begin() + j * V, z.begin() + (j + 1) * V);
      EXPECT_LE(rel_err(row, want[size_t(j)]), kTol) << "block row " << j;
    }
  }
}

// A block drafted later in the same sequence sees the context rows written in between, and the
// block rows of an earlier draft are overwritten by the context (no rollback needed, dspark.md §3.2).
TEST(Dspark, LaterBlocksSeeTheNewContextAndNotOldBlockRows) {
  const auto ref = kimi::ref::DsparkRef::load(files().draft_hf, files().target_hf);
  Engine eng(128);
  const int64_t B = ref.block(), V = ref.vocab();
  auto taps = random_taps(30, ref.tap_width(), 11);
  std::vector<std::vector<double>> first(taps.begin(), taps.begin() + 20);
  eng.context(0, first);
  std::vector<float> z(static_cast<size_t>(B * V));
  eng.draft->block_logits(0, 17, 20, z.data());  // writes block rows at 20..26
  // the target accepted 10 more tokens: their context rows replace the block rows
  std::vector<std::vector<double>> more(taps.begin() + 20, taps.end());
  std::vector<kimi::BatchEntry> e;
  {
    const auto& hp = eng.dm->hparams();
    const int64_t nk = static_cast<int64_t>(hp.taps.size()), dt = hp.target_n_embd, n = 10;
    std::vector<float> buf(static_cast<size_t>(n * nk * dt));
    for (int64_t t = 0; t < n; ++t) {
      e.push_back({0, 0, static_cast<int32_t>(20 + t), false});
      for (int64_t k = 0; k < nk; ++k)
        for (int64_t i = 0; i < dt; ++i)
          buf[size_t((t * nk + k) * dt + i)] = static_cast<float>(more[size_t(t)][size_t(k * dt + i)]);
    }
    eng.draft->add_context(e.data(), n, buf.data());
  }
  eng.draft->block_logits(0, 99, 30, z.data());
  const auto want = ref.block_logits(taps, 99);
  for (int64_t j = 0; j < B; ++j) {
    std::vector<float> row(z.begin() + j * V, z.begin() + (j + 1) * V);
    EXPECT_LE(rel_err(row, want[size_t(j)]), kTol) << "block row " << j;
  }
}

// Two sequences keep their own context rows.
TEST(Dspark, SequencesAreIndependent) {
  const auto ref = kimi::ref::DsparkRef::load(files().draft_hf, files().target_hf);
  Engine eng(64, 2);
  const int64_t B = ref.block(), V = ref.vocab();
  const auto a = random_taps(12, ref.tap_width(), 21), b = random_taps(12, ref.tap_width(), 22);
  eng.context(0, a);
  eng.context(1, b);
  std::vector<float> z(static_cast<size_t>(B * V));
  eng.draft->block_logits(0, 3, 12, z.data());
  const auto want = ref.block_logits(a, 3);
  for (int64_t j = 0; j < B; ++j) {
    std::vector<float> row(z.begin() + j * V, z.begin() + (j + 1) * V);
    EXPECT_LE(rel_err(row, want[size_t(j)]), kTol) << "block row " << j;
  }
}

// The Markov bias and greedy left-to-right sampling (dspark.md §3.4).
TEST(Dspark, GreedyDraftFollowsTheMarkovChainOfTheReference) {
  const auto ref = kimi::ref::DsparkRef::load(files().draft_hf, files().target_hf);
  Engine eng(128);
  const int64_t V = ref.vocab();
  for (int32_t prev : {0, 1, 500, 1023}) {
    std::vector<float> b(static_cast<size_t>(V));
    eng.draft->markov_bias(prev, b.data());
    EXPECT_LE(rel_err(b, ref.markov_bias(prev)), 1e-6) << "prev " << prev;
  }
  int compared = 0;
  for (uint32_t seed = 1; seed <= 4; ++seed) {
    const int ctx = static_cast<int>(10 * seed);
    const auto taps = random_taps(ctx, ref.tap_width(), 100 + seed);
    eng.context(0, taps);
    const int32_t anchor = static_cast<int32_t>(37 * seed);
    int32_t out[7];
    ASSERT_EQ(eng.draft->draft_greedy(0, anchor, ctx, 7, out), 7);
    const auto z = ref.block_logits(taps, anchor);
    int32_t prev = anchor;
    for (int j = 0; j < 7; ++j) {
      const auto bias = ref.markov_bias(prev);
      int32_t best = 0, second = -1;
      for (int64_t v = 1; v < V; ++v) {
        if (z[size_t(j)][size_t(v)] + bias[size_t(v)] > z[size_t(j)][size_t(best)] + bias[size_t(best)]) {
          second = best;
          best = static_cast<int32_t>(v);
        } else if (second < 0 ||
                   z[size_t(j)][size_t(v)] + bias[size_t(v)] > z[size_t(j)][size_t(second)] + bias[size_t(second)]) {
          second = static_cast<int32_t>(v);
        }
      }
      const double margin = (z[size_t(j)][size_t(best)] + bias[size_t(best)]) -
                            (z[size_t(j)][size_t(second)] + bias[size_t(second)]);
      if (margin < 1e-3) break;  // a near tie: f32 may pick either, and the chain forks from here
      EXPECT_EQ(out[j], best) << "seed " << seed << " position " << j;
      ++compared;
      prev = best;
      if (out[j] != best) break;
    }
  }
  EXPECT_GE(compared, 20);  // the chains were compared, not skipped
  int32_t few[7];
  EXPECT_EQ(eng.draft->draft_greedy(0, 5, 40, 3, few), 3);  // n_max below the block
}

// The target's hidden-state taps (Forward::set_taps, dspark.md §3.1): every row of a run lands at
// its row index, tap-major; a 5-token prefill gives the same taps per row as 5 one-token runs.
TEST(Dspark, ForwardTapsCopyTheStreamAfterEachTapLayer) {
  auto target = kimi::Model::load(files().target_gguf);
  const auto& hp = target->hparams();
  kimi::ThreadPool pool(2);
  kimi::CpuBackend be(pool, kimi::Precision::F32);
  std::vector<std::string> names;
  for (const auto& t : target->reader().tensors()) names.push_back(t.name);
  const auto place = kimi::resolve_placement({}, {"cpu"}, names, hp.n_layer);
  kimi::ForwardOptions fo;
  fo.n_ctx = 32, fo.n_batch = 8;
  kimi::Forward fwd(*target, {&be}, place, fo);
  const int64_t n = 5, d = hp.n_embd;
  const std::vector<uint32_t> layers{2, hp.n_layer - 1};
  std::vector<float> taps(static_cast<size_t>(8 * 2 * d), -7.0f);
  fwd.set_taps(layers, taps.data());
  std::vector<kimi::BatchEntry> e;
  for (int t = 0; t < n; ++t) e.push_back({10 + 3 * t, 0, t, true});
  std::vector<float> logits(static_cast<size_t>(n * hp.n_vocab));
  fwd.run(e.data(), n, logits.data());
  const std::vector<float> prefill(taps.begin(), taps.begin() + 2 * n * d);
  double diff = 0;
  for (int64_t i = 0; i < n * d; ++i) {
    ASSERT_NE(prefill[size_t(i)], -7.0f);
    ASSERT_NE(prefill[size_t(n * d + i)], -7.0f);
    diff = std::max(diff, double(std::abs(prefill[size_t(i)] - prefill[size_t(n * d + i)])));
  }
  EXPECT_GT(diff, 1e-3);  // two different layers' streams
  fwd.seq_clear(0);
  for (int64_t t = 0; t < n; ++t) {
    fwd.run(&e[size_t(t)], 1, logits.data());
    for (int64_t k = 0; k < 2; ++k) {
      double md = 0, mr = 0;
      for (int64_t i = 0; i < d; ++i) {
        md = std::max(md, double(std::abs(taps[size_t(k * d + i)] - prefill[size_t((k * n + t) * d + i)])));
        mr = std::max(mr, double(std::abs(prefill[size_t((k * n + t) * d + i)])));
      }
      EXPECT_LE(md / mr, 1e-5) << "row " << t << " tap " << k;
    }
  }
  EXPECT_THROW(fwd.set_taps({3, 2}, taps.data()), kimi::Error);
  EXPECT_THROW(fwd.set_taps({hp.n_layer}, taps.data()), kimi::Error);
}

// Context::set_tap_layers: the taps of a batch are per entry, whatever the micro-batches were.
TEST(Dspark, ContextTapsAreTheBatchRowsWhateverTheMicroBatches) {
  auto target = kimi::Model::load(files().target_gguf);
  const auto& hp = target->hparams();
  const std::vector<int> layers{0, 2, 4, 5, 7};
  std::vector<int32_t> toks;
  for (int i = 0; i < 11; ++i) toks.push_back(17 + 31 * i);
  std::vector<std::vector<float>> got[2];
  for (int run = 0; run < 2; ++run) {
    kimi::ContextOptions co;
    co.n_threads = 2, co.n_ctx_max = 32, co.n_batch_max = run == 0 ? 16 : 3;
    co.precision = kimi::Precision::F32;
    kimi::Context ctx(*target, co);
    ctx.set_tap_layers(layers);
    kimi::Batch b;
    b.add_sequence(toks, 0, 0, true);
    ctx.decode(b);
    ASSERT_EQ(ctx.tap_count(), 11);
    for (size_t i = 0; i < 11; ++i) {
      EXPECT_EQ(ctx.tap_entry(i).pos, static_cast<int32_t>(i));
      got[run].emplace_back(ctx.tap_row(i), ctx.tap_row(i) + layers.size() * hp.n_embd);
    }
  }
  for (size_t i = 0; i < 11; ++i) {
    double md = 0, mr = 0;
    for (size_t j = 0; j < got[0][i].size(); ++j) {
      md = std::max(md, double(std::abs(got[0][i][j] - got[1][i][j])));
      mr = std::max(mr, double(std::abs(got[0][i][j])));
    }
    EXPECT_LE(md / mr, 1e-5) << "entry " << i;
  }
}

// The drafter proposes nothing until it has the context rows of every earlier position, then the
// greedy block of the draft.
TEST(Dspark, DrafterProposesOnceTheContextIsObserved) {
  auto target = kimi::Model::load(files().target_gguf);
  std::shared_ptr<const kimi::DsparkModel> dm = kimi::DsparkModel::load(files().draft_gguf);
  kimi::DsparkDrafter d(dm, *target, {.n_ctx = 64, .n_batch = 4, .n_threads = 1, .precision = kimi::Precision::F32});
  EXPECT_EQ(d.name(), "dspark");
  ASSERT_EQ(std::vector<int>(d.tap_layers().begin(), d.tap_layers().end()), (std::vector<int>{0, 2, 4, 5, 7}));
  const std::vector<int32_t> toks{5, 6, 7, 8, 9, 10};
  std::vector<int32_t> draft;
  draft.reserve(8);
  EXPECT_EQ(d.propose(toks, 7, draft), 0);  // no context rows yet
  const auto taps = random_taps(5, 5 * 64, 77);
  std::vector<float> rows;
  for (auto& r : taps) rows.insert(rows.end(), r.begin(), r.end());
  kimi::TargetTaps t;
  t.layers = d.tap_layers();
  t.n_embd = 64;
  t.pos0 = 1;  // a gap at position 0: still nothing
  t.n_rows = 4;
  t.data = rows.data() + 5 * 64;
  d.observe(t);
  EXPECT_EQ(d.propose(toks, 7, draft), 0);
  t.pos0 = 0, t.n_rows = 5, t.data = rows.data();  // 5 rows in chunks of 4 (n_batch)
  d.observe(t);
  EXPECT_EQ(d.covered(), 5);
  ASSERT_EQ(d.propose(toks, 7, draft), 7);
  Engine eng(64);
  eng.context(0, taps);
  int32_t want[7];
  ASSERT_EQ(eng.draft->draft_greedy(0, 10, 5, 7, want), 7);
  EXPECT_EQ(draft, std::vector<int32_t>(want, want + 7));
  EXPECT_EQ(d.propose(toks, 3, draft), 3);
  d.reset();
  EXPECT_EQ(d.propose(toks, 7, draft), 0);
}

// `kimi run --spec dspark -md draft.gguf` (greedy) gives the tokens of `--spec off`, and drafts.
TEST(Dspark, SpeculativeGreedyRunEqualsPlainRun) {
  for (const char* p : {"1,2,3,4,5,6,7,8", "300,301,302,303,304,305,306,307,308,309,310,311,312,313,314"}) {
    const std::string base = fmt::format("run -m {} --tokens {} -n 40 --temp 0 --ids", files().target_gguf, p);
    auto off = run_kimi(base + " --spec off");
    ASSERT_EQ(off.exit_code, 0) << off.out;
    auto ds = run_kimi(base + " --spec dspark -md " + files().draft_gguf + " --draft-max 7");
    ASSERT_EQ(ds.exit_code, 0) << ds.out;
    auto ids = [](const std::string& out) {  // the first line: the generated ids
      return out.substr(0, out.find('\n'));
    };
    EXPECT_EQ(ids(ds.out), ids(off.out));
    EXPECT_GT(ids(off.out).size(), 40u);
    const auto at = ds.out.find("speculative (dspark): ");
    ASSERT_NE(at, std::string::npos) << ds.out;
    const auto dr = ds.out.find(" drafted", at);
    ASSERT_NE(dr, std::string::npos) << ds.out;
    const auto colon = ds.out.rfind(' ', dr - 1);
    EXPECT_GT(std::stoi(ds.out.substr(colon + 1, dr - colon - 1)), 40) << ds.out;  // it drafted
  }
}

// `kimi run --spec auto -md draft.gguf`: the random-weight synthetic draft is never right, so auto
// stops drafting after its first verify step (and only probes now and then); same ids as --spec off.
TEST(Dspark, AutoStopsDraftingWithARandomDraft) {
  const std::string base = fmt::format("run -m {} --tokens 300,301,302,303,304,305,306,307 -n 80 --temp 0 --ids --ignore-eos",
                                       files().target_gguf);
  auto off = run_kimi(base + " --spec off");
  ASSERT_EQ(off.exit_code, 0) << off.out;
  auto au = run_kimi(base + " --spec auto -md " + files().draft_gguf);
  ASSERT_EQ(au.exit_code, 0) << au.out;
  EXPECT_EQ(au.out.substr(0, au.out.find('\n')), off.out.substr(0, off.out.find('\n')));
  ASSERT_NE(au.out.find("speculative (auto, dspark): "), std::string::npos) << au.out;
  const auto at = au.out.find(" steps without drafting (did not pay)");
  ASSERT_NE(at, std::string::npos) << au.out;
  const auto sp = au.out.rfind(' ', at - 1);
  EXPECT_GE(std::stoi(au.out.substr(sp + 1, at - sp - 1)), 50) << au.out;
}

TEST(Dspark, BadDraftsGetClearErrors) {
  // the target GGUF is not a draft
  try {
    kimi::DsparkModel::load(files().target_gguf);
    FAIL() << "loaded a kimi-k3 file as a draft";
  } catch (const kimi::Error& e) {
    EXPECT_NE(std::string(e.what()).find("kimi-k3-dspark"), std::string::npos) << e.what();
  }
  // a config whose mask token lies outside the vocabulary
  kimi::test::TempDir d;
  const std::string hf = d.file("bad-hf");
  ASSERT_EQ(run_kimi(fmt::format("synth --preset dspark-tiny -q -o {}", hf)).exit_code, 0);
  std::string cfg = kimi::test::read_file(hf + "/config.json");
  const auto at = cfg.find("\"mask_token_id\": 1021");
  ASSERT_NE(at, std::string::npos) << cfg;
  cfg.replace(at, 21, "\"mask_token_id\": 5000");
  kimi::test::write_file(hf + "/config.json", cfg);
  auto r = run_kimi(fmt::format("convert {} -o {}", hf, d.file("bad.gguf")));
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.out.find("mask_token_id"), std::string::npos) << r.out;
  // a dspark preset does not take target options
  r = run_kimi(fmt::format("synth --preset dspark-tiny --layers 3 -q -o {}", d.file("x")));
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.out.find("--seed"), std::string::npos) << r.out;
  // a draft on a target of another vocabulary
  kimi::test::TinySpec sp;
  sp.vocab = 2048;
  kimi::test::write_tiny_gguf(d.file("t2048.gguf"), sp);
  auto other = kimi::Model::load(d.file("t2048.gguf"));
  auto dm = kimi::DsparkModel::load(files().draft_gguf);
  try {
    dm->check_target(other->hparams());
    FAIL() << "a draft of vocabulary 1024 accepted a target of 2048";
  } catch (const kimi::Error& e) {
    EXPECT_NE(std::string(e.what()).find("vocab_size"), std::string::npos) << e.what();
  }
}

}  // namespace
