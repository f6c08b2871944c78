// Routed experts streamed from disk (model/expert_cache.h, docs/performance.md, section 4): with a cache
// far smaller than the experts (so experts are evicted and read again all the time) the logits
// are bit-identical to the normal path reading the file mapping, in both ways of holding the
// experts (pread copies, madvise'd mapping), both precisions, with and without the indexer. The
// cache itself is checked against the file: every slice pointer it hands out holds the bytes of
// that expert's slice, and its counters add up.
#include <gtest/gtest.h>

#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "backend_workload.h"
#include "engine_fixture.h"
#include "model/expert_cache.h"
#include "model/model.h"
#include "runtime/context.h"
#include "test_util.h"
#include "util/error.h"
#include "util/file_read.h"

using namespace kimi;
using kimi::test::drive;
using kimi::test::Run;
using kimi::test::TinyModel;

namespace {

ContextOptions options(Precision prec, int64_t budget, StreamMode mode) {
  ContextOptions o;
  o.n_threads = 2;
  o.n_ctx_max = 64;
  o.n_seq_max = 2;
  o.n_batch_max = 8;
  o.precision = prec;
  o.stream.budget_bytes = budget;
  o.stream.mode = mode;
  o.stream.io_threads = 3;
  return o;
}

void expect_same(const Run& a, const Run& b, const std::string& what) {
  ASSERT_EQ(a.logits.size(), b.logits.size()) << what;
  for (size_t i = 0; i < a.logits.size(); ++i)
    ASSERT_EQ(0, std::memcmp(a.logits[i].data(), b.logits[i].data(), a.logits[i].size() * 4))
        << what << ": logits row " << i << " differs";
}

void check_identical(const Model& m, Precision prec) {
  if (!ReadOnlyFile::supported()) GTEST_SKIP() << "expert streaming is not supported on this system";
  const Run ref = drive(m, options(prec, 0, StreamMode::Pread));
  ASSERT_GT(ref.logits.size(), 25u);
  const uint64_t slot = ExpertCache::slot_bytes(m);
  ASSERT_GT(slot, 0u);
  const int64_t k = m.hparams().n_expert_used;
  // k slots: every decode step evicts; 3k: some hits; every expert of every layer: no eviction
  for (int64_t slots : {k, 3 * k, int64_t(m.hparams().n_expert) * m.hparams().n_layer})
    for (StreamMode mode : {StreamMode::Pread, StreamMode::Madvise}) {
      const std::string what = (mode == StreamMode::Pread ? "pread, " : "madvise, ") + std::to_string(slots) + " slots";
      expect_same(ref, drive(m, options(prec, int64_t(slot) * slots, mode)), what);
    }
}

}  // namespace

TEST(ModelExpertStream, LogitsIdenticalUnderEvictionF32) {
  TinyModel t(16);
  check_identical(*t.m, Precision::F32);
}

TEST(ModelExpertStream, LogitsIdenticalUnderEvictionFast) {
  TinyModel t(16);
  check_identical(*t.m, Precision::Fast);
}

TEST(ModelExpertStream, LogitsIdenticalWithoutIndexer) {
  TinyModel t(0);
  check_identical(*t.m, Precision::Fast);
}

// The counters of a run: lookups split into hits and misses, bytes read = misses x expert bytes,
// evictions when the cache is full, a prefill micro-batch with more experts than slots goes
// through the mapping.
TEST(ModelExpertStream, CountersAddUp) {
  if (!ReadOnlyFile::supported()) GTEST_SKIP() << "expert streaming is not supported on this system";
  TinyModel t(16);
  const Model& m = *t.m;
  const uint64_t slot = ExpertCache::slot_bytes(m);
  const int64_t k = m.hparams().n_expert_used;
  Context c(m, options(Precision::Fast, int64_t(slot) * 2 * k, StreamMode::Pread));
  ExpertStreamStats s0 = c.expert_stream_stats();
  ASSERT_TRUE(s0.enabled);
  EXPECT_EQ(s0.slots, 2 * k);
  EXPECT_EQ(s0.lookups, 0u);
  Batch b;
  for (int i = 0; i < 8; ++i) b.add((i * 37 + 5) % c.n_vocab(), 0, i, i == 7);
  c.decode(b);  // 8 tokens x k experts: more distinct experts than 2k slots in most layers
  const ExpertStreamStats s1 = c.expert_stream_stats();
  EXPECT_GT(s1.bypass_calls, 0u);
  for (int i = 0; i < 6; ++i) {
    b.clear();
    b.add((i * 11 + 3) % c.n_vocab(), 0, c.seq_len(0), true);
    c.decode(b);
  }
  const ExpertStreamStats d = c.expert_stream_stats().minus(s1);
  const HParams& hp = m.hparams();
  const uint64_t n_moe = hp.n_layer - hp.n_dense_lead;
  EXPECT_EQ(d.bypass_calls, 0u);  // one token: k experts per layer always fit
  EXPECT_EQ(d.lookups, 6 * n_moe * uint64_t(k));
  EXPECT_EQ(d.hits + d.misses, d.lookups);
  EXPECT_GT(d.misses, 0u);
  EXPECT_GT(d.evictions, 0u);  // 2k slots for 7 layers x k experts per token
  const LayerWeights& L = m.layer(hp.n_dense_lead);
  const uint64_t expert_bytes = L.ffn_gate_exps.slice_bytes + L.ffn_up_exps.slice_bytes + L.ffn_down_exps.slice_bytes;
  EXPECT_EQ(d.bytes_read, d.misses * expert_bytes);
  EXPECT_NE(c.expert_stream_stats().summary(1.0).find("hit rate"), std::string::npos);
}

// The cache against the file: random requests; every pointer of a requested expert holds that
// expert's slice bytes (as the mapping has them), hits are the experts still cached.
TEST(ModelExpertStream, SlicesHoldTheFileBytes) {
  if (!ReadOnlyFile::supported()) GTEST_SKIP() << "expert streaming is not supported on this system";
  TinyModel t(16);
  const Model& m = *t.m;
  const HParams& hp = m.hparams();
  const int64_t E = hp.n_expert, k = hp.n_expert_used;
  std::vector<uint8_t> on_host(hp.n_layer, 1);
  for (StreamMode mode : {StreamMode::Pread, StreamMode::Madvise}) {
    ExpertStreamOptions o;
    o.mode = mode;
    o.io_threads = 2;
    const int64_t slots = 5;
    ExpertCache cache(m, on_host, ExpertCache::slot_bytes(m) * slots, o);
    std::mt19937 rng(7);
    std::vector<std::pair<uint32_t, int32_t>> lru;  // most recent last: what a 5-slot LRU holds
    uint64_t hits = 0;
    for (int step = 0; step < 200; ++step) {
      const uint32_t il = hp.n_dense_lead + rng() % (hp.n_layer - hp.n_dense_lead);
      std::vector<int32_t> sel(static_cast<size_t>(k));
      for (auto& e : sel) e = static_cast<int32_t>(rng() % E);
      if (step % 7 == 0) sel[0] = -1;  // another rank's slot: skipped
      ASSERT_TRUE(cache.request(il, sel.data(), k));
      const uint8_t* const* p = cache.wait();
      std::vector<int32_t> distinct;
      for (int32_t e : sel)
        if (e >= 0 && std::find(distinct.begin(), distinct.end(), e) == distinct.end()) distinct.push_back(e);
      for (int32_t e : distinct) {
        auto it = std::find(lru.begin(), lru.end(), std::make_pair(il, e));
        if (it != lru.end()) {
          ++hits;
          lru.erase(it);
        }
      }
      for (int32_t e : distinct) lru.emplace_back(il, e);
      while (lru.size() > size_t(slots)) lru.erase(lru.begin());
      const LayerWeights& L = m.layer(il);
      for (int32_t e : distinct) {
        const WeightView* w[3] = {&L.ffn_gate_exps, &L.ffn_up_exps, &L.ffn_down_exps};
        for (int j = 0; j < 3; ++j)
          ASSERT_EQ(0, std::memcmp(p[3 * e + j], w[j]->info->data + w[j]->slice_bytes * uint64_t(e), w[j]->slice_bytes))
              << "layer " << il << " expert " << e << " part " << j;
      }
    }
    EXPECT_EQ(cache.stats().hits, hits);
    EXPECT_GT(cache.stats().evictions, 0u);
    // more distinct experts than slots: refused (the caller reads through the mapping)
    std::vector<int32_t> all;
    for (int32_t e = 0; e < E; ++e) all.push_back(e);
    EXPECT_FALSE(cache.request(hp.n_dense_lead, all.data(), E));
    EXPECT_EQ(cache.stats().bypass_calls, 1u);
  }
}

TEST(ModelExpertStream, BudgetBelowOneTokenIsAnError) {
  if (!ReadOnlyFile::supported()) GTEST_SKIP() << "expert streaming is not supported on this system";
  TinyModel t(16);
  const uint64_t slot = ExpertCache::slot_bytes(*t.m);
  try {
    Context c(*t.m, options(Precision::Fast, int64_t(slot), StreamMode::Pread));  // 1 slot < k = 2
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("--mem-budget"), std::string::npos) << e.what();
  }
}

// auto: a tiny model fits in memory, so nothing is streamed
TEST(ModelExpertStream, AutoDoesNotStreamWhatFits) {
  TinyModel t(16);
  EXPECT_EQ(resolve_stream_budget(*t.m, ExpertStreamOptions{}), 0u);
  Context c(*t.m, options(Precision::Fast, -1, StreamMode::Pread));
  EXPECT_FALSE(c.expert_stream_stats().enabled);
}
