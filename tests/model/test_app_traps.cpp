// Trap tests (k3-architecture.md §5): each trap switch makes the float64 reference commit ONE
// plausible mistake. For every observable trap we show
//   (1) power: reference(trap) differs from reference(correct) by a clear margin (>= 1e-3 relative,
//       30x the engine's f32 tolerance; measured >= 2e-2) on the tiny model, and
//   (2) the engine (f32) matches reference(correct) within tolerance and is therefore at least that
//       far from reference(trap): the engine does not make the mistake.
// Converter-side mistakes (kv_b split, g_proj naming, conv reshape, MXFP4 nibble order) are emulated
// in the reference; the engine reads the GGUF from the real converter, so (2) covers the converter.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <random>

#include "model/model.h"
#include "ref/ref_checkpoint.h"
#include "ref/reference.h"
#include "runtime/context.h"
#include "test_util.h"
#include "io/safetensors.h"
#include "util/error.h"

namespace {

using Logits = std::vector<std::vector<double>>;
using kimi::ref::RefModel;
using kimi::ref::Trap;

constexpr double kTolF32 = 3e-5;    // engine f32 vs reference (see test_app_reference.cpp)
constexpr double kMargin = 1e-3;    // a trap must move the logits at least this much
constexpr double kInvisible = 1e-4; // the unobservable traps move them less than this

std::vector<int32_t> prompt(int seed, int n) {
  std::mt19937 rng(static_cast<uint32_t>(seed * 104729 + n));
  std::uniform_int_distribution<int32_t> d(0, 767);
  std::vector<int32_t> t(static_cast<size_t>(n));
  for (auto& x : t) x = d(rng);
  return t;
}

Logits run_engine_f32(const std::string& gguf, const std::vector<int32_t>& toks) {
  auto m = kimi::Model::load(gguf);
  kimi::ContextOptions o;
  o.n_threads = 2;
  o.n_ctx_max = 64;
  o.precision = kimi::Precision::F32;
  kimi::Context ctx(*m, o);
  kimi::Batch b;
  b.add_sequence(toks, 0, 0, false, true);
  ctx.decode(b);
  Logits out;
  for (size_t i = 0; i < toks.size(); ++i) out.emplace_back(ctx.logits(i), ctx.logits(i) + ctx.n_vocab());
  return out;
}

// The tiny model (seed 1), a 40-token prompt (> top_k 16), the correct reference and the engine.
struct Fixture {
  RefModel ref;
  std::vector<int32_t> toks;
  Logits correct, engine;
};

Fixture& fixture() {
  static std::unique_ptr<Fixture> f;
  if (!f) {
    auto toks = prompt(1, 40);
    f.reset(new Fixture{RefModel::load(kimi::test::tiny_hf(1)), toks, {}, {}});
    f->correct = f->ref.forward(toks);
    f->engine = run_engine_f32(kimi::test::tiny_gguf(1), toks);
  }
  return *f;
}

std::vector<Trap> traps_where(bool observable) {
  std::vector<Trap> v;
  for (Trap t : kimi::ref::all_traps())
    if (t != Trap::ZeroIndexedFullAttn && kimi::ref::trap_observable(t) == observable) v.push_back(t);
  return v;
}

std::string trap_param_name(const ::testing::TestParamInfo<Trap>& i) { return kimi::ref::trap_name(i.param); }

class ObservableTrap : public ::testing::TestWithParam<Trap> {};
class UnobservableTrap : public ::testing::TestWithParam<Trap> {};

}  // namespace

TEST(Traps, EngineMatchesTheCorrectReference) {
  Fixture& f = fixture();
  EXPECT_LE(kimi::ref::max_rel_diff(f.engine, f.correct), kTolF32);
}

TEST_P(ObservableTrap, ReferenceHasPowerAndEngineAvoidsIt) {
  Fixture& f = fixture();
  Logits trapped = f.ref.forward(f.toks, {.trap = GetParam()});
  const double power = kimi::ref::max_rel_diff(trapped, f.correct);
  EXPECT_GE(power, kMargin) << "the trap does not change the tiny model's logits enough to be detected";
  EXPECT_GE(kimi::ref::max_rel_diff(f.engine, trapped), kMargin - kTolF32) << "the engine behaves like the trap";
}

INSTANTIATE_TEST_SUITE_P(K3Traps, ObservableTrap, ::testing::ValuesIn(traps_where(true)), trap_param_name);

// These mistakes cannot be seen through the logits (docs/testing.md): the test pins that fact, so
// the list in the docs stays true.
TEST_P(UnobservableTrap, ChangesOnlyAtRoundingLevel) {
  Fixture& f = fixture();
  Logits trapped = f.ref.forward(f.toks, {.trap = GetParam()});
  EXPECT_LE(kimi::ref::max_rel_diff(trapped, f.correct), kInvisible);
}

INSTANTIATE_TEST_SUITE_P(K3Traps, UnobservableTrap, ::testing::ValuesIn(traps_where(false)), trap_param_name);

// Trap 1: with full_attn_layers read 0-based, the layer types no longer match the tensors in the
// checkpoint (the reference cannot even find them), while the engine's schedule from the GGUF is
// the 1-indexed one: layer il is MLA iff il + 1 is listed.
TEST(Traps, FullAttnLayersAreOneIndexed) {
  Fixture& f = fixture();
  try {
    f.ref.forward(f.toks, {.trap = Trap::ZeroIndexedFullAttn});
    FAIL() << "the 0-indexed schedule should not find its tensors";
  } catch (const kimi::Error& e) {
    EXPECT_NE(std::string(e.what()).find("layers.3.self_attn.q_proj.weight' not found"), std::string::npos)
        << e.what();
  }
  auto m = kimi::Model::load(kimi::test::tiny_gguf(1));
  const auto& listed = f.ref.config().full_attn_1based;
  ASSERT_EQ(m->hparams().n_layer, f.ref.config().n_layer);
  for (uint32_t il = 0; il < m->hparams().n_layer; ++il) {
    const bool want = std::find(listed.begin(), listed.end(), static_cast<int64_t>(il) + 1) != listed.end();
    EXPECT_EQ(m->hparams().is_mla[il] != 0, want) << "layer " << il;
  }
}

// Exact indexer ties: with every indexer wk = 0, each key is LayerNorm(0) = k_norm.bias, so all
// positions score the same and the tie rule alone decides the selection (earliest positions win).
TEST(Traps, IndexerTiesPickTheEarliestPositions) {
  kimi::test::TempDir dir;
  const std::string src = kimi::test::tiny_hf(1), hf = dir.file("tied"), gguf = dir.file("tied.gguf");
  RefModel base = RefModel::load(src);
  std::map<std::string, kimi::ref::TensorEdit> edits;
  for (int64_t l : base.config().full_attn_1based)
    edits[fmt::format("language_model.model.layers.{}.self_attn.indexer.wk.weight", l - 1)] =
        [](std::vector<double>& v, const std::vector<int64_t>&) { std::fill(v.begin(), v.end(), 0.0); };
  kimi::ref::patch_checkpoint(src, hf, edits);
  auto r = kimi::test::run_kimi("convert " + hf + " -o " + gguf + " --quiet");
  ASSERT_EQ(r.exit_code, 0) << r.out;

  RefModel ref = RefModel::load(hf);
  auto toks = prompt(5, 40);
  Logits correct = ref.forward(toks);
  Logits later = ref.forward(toks, {.trap = Trap::IndexerTieLater});
  EXPECT_GE(kimi::ref::max_rel_diff(later, correct), kMargin);
  Logits eng = run_engine_f32(gguf, toks);
  EXPECT_LE(kimi::ref::max_rel_diff(eng, correct), kTolF32);
}

// The A_log padding trap needs stored length > heads; tiny has 16 stored values for 4 heads. Check
// the fixture really exercises it (otherwise ALogReshape would be vacuous).
TEST(Traps, TinyExercisesALogPadding) {
  const auto ck = kimi::st::Checkpoint::open(kimi::test::tiny_hf(1));
  const auto& t = ck->get("language_model.model.layers.0.self_attn.A_log");
  EXPECT_GT(t.numel(), fixture().ref.config().n_head);
}
