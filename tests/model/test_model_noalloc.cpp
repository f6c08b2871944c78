// The decode loop allocates nothing: after a warm-up token, further single-token decodes (and
// their logits) make no heap allocation; nor does the speculative loop (verify steps, rollbacks). Counts operator new calls in this binary.
#include <gtest/gtest.h>

#include <atomic>
#include <cstdlib>
#include <new>

#include "engine_fixture.h"
#include "model/model.h"
#include "runtime/context.h"
#include "runtime/sampling.h"
#include "runtime/speculative.h"
#include "test_util.h"

#include "count_allocs.h"

using namespace kimi;

TEST(ModelNoAlloc, DecodeLoopDoesNotAllocate) {
  test::TempDir d;
  const std::string path = d.file("tiny.gguf");
  test::write_tiny_gguf(path, test::TinySpec{});
  auto m = Model::load(path);
  // 1 thread and 2 threads: ThreadPool::parallel_for takes callables by reference (no
  // std::function), so neither the engine's nor kern::matmul's pool calls allocate.
  for (int threads : {1, 2}) {
    for (AttnPath p : {AttnPath::Sparse, AttnPath::Dense}) {
      ContextOptions o;
      o.n_threads = threads;
      o.n_ctx_max = 64;
      o.attn = p;
      Context c(*m, o);
      Batch b;
      b.add_sequence({1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20}, 0, 0, true);
      c.decode(b);
      b.clear();
      b.add(21, 0, c.seq_len(0), true);
      c.decode(b);  // warm-up at batch size 1
      const long before = g_allocs.load();
      for (int i = 0; i < 24; ++i) {  // crosses top_k = 16: the indexer selects
        b.entries[0].token = 100 + i;
        b.entries[0].pos = c.seq_len(0);
        c.decode(b);
        ASSERT_NE(c.logits(0), nullptr);
      }
      EXPECT_EQ(g_allocs.load() - before, 0) << "threads " << threads << " path " << int(p);
    }
  }
}

namespace {

// Drafts the known answer, wrong at a block position that cycles 0, 1, 2, 3, none: verify steps with
// rejections (KDA rollbacks, kept tokens decoded again) and without. Allocates nothing itself.
struct CyclingDrafter final : Drafter {
  std::vector<int32_t> truth;
  int step = 0;
  std::string name() const override { return "cycling"; }
  int propose(std::span<const int32_t> t, int n_max, std::vector<int32_t>& draft) override {
    draft.clear();
    const int wrong = step++ % 5;
    for (int j = 0; j < std::min(n_max, 4) && t.size() + static_cast<size_t>(j) < truth.size(); ++j) {
      const int32_t x = truth[t.size() + static_cast<size_t>(j)];
      draft.push_back(j == wrong ? (x + 1) % 1000 : x);
    }
    return static_cast<int>(draft.size());
  }
};

}  // namespace

// The speculative loop (runtime/speculative.h) allocates nothing once warm: verify steps, rejections
// at every block position, the KDA snapshot and rollback, the recomputed tokens, --spec auto's
// bookkeeping. The output is the plain greedy output (checked, so the drafts really were verified).
TEST(ModelNoAlloc, SpeculativeLoopWithRejectionsDoesNotAllocate) {
  test::TempDir d;
  const std::string path = d.file("tiny.gguf");
  test::write_tiny_gguf(path, test::TinySpec{});
  auto m = Model::load(path);
  ASSERT_GT(m->hparams().n_kda_layers(), 0u);
  const std::vector<int32_t> prompt{1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12};
  const int n = 90;
  // One thread: the CPU kernels' per-thread scratch grows to the largest shape a thread has worked
  // on (a high-water mark, kept); with several threads which thread takes which part of a step of
  // 1..15 rows varies from run to run, so a thread may meet a larger part for the first time late
  // (measured: 0-2 growths in 1 of 3 runs with 2 threads). With one thread the warm-up reaches it.
  ContextOptions o;
  o.n_threads = 1;
  o.n_ctx_max = 160;
  o.n_batch_max = 32;
  o.n_snapshots_max = 2;
  o.n_seq_max = 2;
  std::vector<int32_t> ref;  // plain greedy
  {
    Context c(*m, o);
    Sampler s({}, c.n_vocab());
    Batch b;
    b.add_sequence(prompt, 0, 0, true);
    c.decode(b);
    const float* lg = c.logits(b.size() - 1);
    for (int i = 0; i < n; ++i) {
      ref.push_back(s.sample(lg));
      b.clear();
      b.add(ref.back(), 0, c.seq_len(0), true);
      c.decode(b);
      lg = c.logits(0);
    }
  }
  for (bool adaptive : {false, true}) {
    Context c(*m, o);
    // auto: a cost model that always pays, so that it keeps drafting with a third of the drafts wrong
    auto cost = std::make_shared<VerifyCostModel>();
    cost->measured = {1.0, 1.0, 1.0, 1.0, 1.0};
    // the same generation in sequence `seq`; counts the allocations once got has 30 tokens (every
    // block position rejected by then); returns them (-1: not counted)
    auto generate = [&](int32_t seq, SpecStats* st) {
      Sampler s({}, c.n_vocab());
      Batch b;
      b.add_sequence(prompt, seq, 0, true);
      c.decode(b);
      CyclingDrafter dr;
      dr.truth = prompt;
      dr.truth.insert(dr.truth.end(), ref.begin(), ref.end());
      std::vector<int32_t> got;
      got.reserve(static_cast<size_t>(n) + 8);
      got.push_back(s.sample(c.logits(b.size() - 1)));
      s.accept(got.back());
      Speculator sp(c, seq, s, &dr, {.n_max = 4, .adaptive = adaptive, .cost = cost});
      sp.start(prompt, got.back());
      long before = -1;
      while (static_cast<int>(got.size()) < n) {
        if (got.size() >= 30 && before < 0) before = g_allocs.load();
        for (int32_t t : sp.step(n - static_cast<int>(got.size()))) got.push_back(t);
      }
      const long allocs = before < 0 ? -1 : g_allocs.load() - before;
      EXPECT_EQ(got, std::vector<int32_t>(ref.begin(), ref.begin() + n)) << "adaptive " << adaptive;
      *st = sp.stats();
      return allocs;
    };
    // warm-up: the CPU kernels' per-thread scratch grows to the most rows one routed expert gets in
    // a step (a high-water mark, kept); the same generation in sequence 1 reaches it
    SpecStats st;
    generate(1, &st);
    EXPECT_EQ(generate(0, &st), 0) << "adaptive " << adaptive;
    EXPECT_GT(st.recomputed, 10u);
    EXPECT_GT(st.accepted, 20u);
  }
}
