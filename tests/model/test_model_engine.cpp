// Engine consistency tests on a tiny kimi-k3 GGUF (written by engine_fixture.h): batching,
// sequences, sparse vs dense attention, the indexer switch, K3 vs K3.1 files, loader errors.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <random>

#include "engine_fixture.h"
#include "model/model.h"
#include "runtime/context.h"
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

using Rows = std::vector<std::vector<float>>;

// logits of every position of `toks` in one batch (sequence `seq`, from position 0)
Rows run_batch(Context& ctx, const std::vector<int32_t>& toks, int seq = 0) {
  Batch b;
  b.add_sequence(toks, seq, ctx.seq_len(seq), true, true);
  ctx.decode(b);
  Rows out;
  for (size_t i = 0; i < toks.size(); ++i) out.emplace_back(ctx.logits(i), ctx.logits(i) + ctx.n_vocab());
  return out;
}

Rows run_one_by_one(Context& ctx, const std::vector<int32_t>& toks, int seq = 0) {
  Rows out;
  for (int32_t t : toks) {
    Batch b;
    b.add(t, seq, ctx.seq_len(seq), true);
    ctx.decode(b);
    out.emplace_back(ctx.logits(0), ctx.logits(0) + ctx.n_vocab());
  }
  return out;
}

// max |a-b| / max |b|
double rel_diff(const Rows& a, const Rows& b) {
  EXPECT_EQ(a.size(), b.size());
  double md = 0, mb = 0;
  for (size_t i = 0; i < a.size() && i < b.size(); ++i)
    for (size_t j = 0; j < a[i].size(); ++j) {
      md = std::max(md, std::fabs(double(a[i][j]) - b[i][j]));
      mb = std::max(mb, std::fabs(double(b[i][j])));
    }
  return md / std::max(mb, 1e-30);
}

bool bit_equal(const Rows& a, const Rows& b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i)
    if (std::memcmp(a[i].data(), b[i].data(), a[i].size() * 4) != 0) return false;
  return true;
}

struct Fixture : ::testing::Test {
  static inline TempDir* dir = nullptr;
  static inline std::string k31, k3;
  static void SetUpTestSuite() {
    dir = new TempDir();
    k31 = dir->file("tiny-k31.gguf");
    k3 = dir->file("tiny-k3.gguf");
    TinySpec sp;
    test::write_tiny_gguf(k31, sp);
    sp.top_k = 0;
    test::write_tiny_gguf(k3, sp);
  }
  static void TearDownTestSuite() {
    delete dir;
    dir = nullptr;
  }
  // one thread by default (fast on a loaded 2-core machine); the batching tests use 2
  static inline int n_threads = 1;
  static ContextOptions opts(int top_k = -1, AttnPath p = AttnPath::Sparse, int n_seq = 1) {
    ContextOptions o;
    o.n_threads = n_threads;
    o.n_seq_max = n_seq;
    o.n_ctx_max = 128;
    o.n_batch_max = 32;
    o.attn = p;
    o.attn_top_k = top_k;
    return o;
  }
};

}  // namespace

TEST_F(Fixture, LoadReadsHparamsFromKeys) {
  auto m = Model::load(k31);
  const HParams& hp = m->hparams();
  EXPECT_EQ(hp.n_layer, 8u);
  EXPECT_EQ(hp.n_embd, 64u);
  EXPECT_EQ(hp.n_vocab, 1024u);
  EXPECT_EQ(hp.n_mla_layers(), 2u);
  EXPECT_TRUE(hp.is_mla[3] && hp.is_mla[7] && !hp.is_mla[0] && !hp.is_mla[4]);
  EXPECT_EQ(hp.n_nope, 16u);
  EXPECT_EQ(hp.mla_row(), 40u);
  EXPECT_TRUE(hp.has_indexer);
  EXPECT_EQ(hp.idx_top_k, 16u);
  EXPECT_FLOAT_EQ(hp.expert_weights_scale, 2.5f);
  // per sequence: 6 KDA layers x (conv 3*64*3 + rec 4*16*16) f32
  EXPECT_EQ(hp.state_bytes_per_seq(), 6u * (3 * 64 * 3 + 4 * 16 * 16) * 4);
  // per token: 2 MLA layers x (40 latent + 16 indexer) x 2 B
  EXPECT_EQ(hp.cache_bytes_per_token(CacheType::F16), 2u * (40 + 16) * 2);
  const std::string s = m->summary();
  EXPECT_NE(s.find("DSA indexer: 4 heads x 16, top_k 16"), std::string::npos) << s;
  EXPECT_NE(s.find("MXFP4"), std::string::npos) << s;
  auto m3 = Model::load(k3);
  EXPECT_FALSE(m3->hparams().has_indexer);
}

TEST_F(Fixture, PrefillEqualsTokenByTokenDecode) {
  auto m = Model::load(k31);
  n_threads = 2;
  auto toks = random_tokens(45, 7);  // longer than top_k (16): the indexer selects
  Context a(*m, opts()), b(*m, opts());
  Rows pa = run_batch(a, toks);  // two micro-batches of 32 + 13
  Rows pb = run_one_by_one(b, toks);
  EXPECT_LT(rel_diff(pa, pb), 2e-3);
  EXPECT_EQ(a.seq_len(0), 45);
  n_threads = 1;
}

// --indexer-int8: prefill (batched selection) and token-by-token decode score the int8 keys with
// the same integer arithmetic, so they select the same rows; the logits stay near the f16-key run
// (only near-tied positions can be selected differently); a sequence copy carries the int8 keys.
TEST_F(Fixture, IndexerInt8PrefillEqualsDecodeAndStaysNearF16Keys) {
  auto m = Model::load(k31);
  n_threads = 2;
  auto toks = random_tokens(45, 7);  // longer than top_k (16): the indexer selects
  ContextOptions o = opts(-1, AttnPath::Sparse, 2);
  o.indexer_int8 = true;
  Context a(*m, o), b(*m, o), f(*m, opts()), all(*m, opts(0));
  Rows pa = run_batch(a, toks);
  Rows pb = run_one_by_one(b, toks);
  Rows pf = run_batch(f, toks);
  Rows pall = run_batch(all, toks);  // indexer off: every position visible
  EXPECT_LT(rel_diff(pa, pb), 2e-3);
  // the int8 selection moves the logits far less than the selection itself does
  const double vs_f16 = rel_diff(pa, pf), sel_effect = rel_diff(pf, pall);
  std::printf("int8 keys vs f16 keys: max rel logit diff %.2e (top-k vs all positions: %.2e)\n", vs_f16, sel_effect);
  EXPECT_LT(vs_f16, 0.5 * sel_effect);
  // seq 1 = a copy of seq 0 (its int8 keys included); both continue alike
  a.seq_copy(0, 1);
  const auto more = random_tokens(6, 9);
  Rows c0 = run_batch(a, more, 0), c1 = run_batch(a, more, 1);
  n_threads = 1;
  EXPECT_TRUE(bit_equal(c0, c1));
}

TEST_F(Fixture, PrefillEqualsDecodeF32Precision) {
  auto m = Model::load(k31);
  auto toks = random_tokens(40, 8);
  ContextOptions o = opts();
  o.precision = Precision::F32;
  Context a(*m, o), b(*m, o);
  Rows pa = run_batch(a, toks);
  Rows pb = run_one_by_one(b, toks);
  EXPECT_LT(rel_diff(pa, pb), 1e-5);
  EXPECT_EQ(a.cache_type(), CacheType::F32);
}

TEST_F(Fixture, SeveralSequencesInOneBatchEqualEachAlone) {
  auto m = Model::load(k31);
  auto t0 = random_tokens(40, 1), t1 = random_tokens(23, 2), t2 = random_tokens(30, 3);
  Rows alone[3];
  {
    Context c(*m, opts());
    alone[0] = run_batch(c, t0);
    c.seq_clear(0);
    alone[1] = run_batch(c, t1);
    c.seq_clear(0);
    alone[2] = run_batch(c, t2);
  }
  n_threads = 2;
  Context c(*m, opts(-1, AttnPath::Sparse, 3));
  n_threads = 1;
  // interleave: seq 0 prefill chunk, seq 1 tokens, seq 2 ... in rounds of uneven chunk sizes
  const std::vector<int32_t>* ts[3] = {&t0, &t1, &t2};
  Rows got[3];
  size_t done[3] = {0, 0, 0};
  const size_t chunk[3] = {7, 1, 5};
  while (done[0] < t0.size() || done[1] < t1.size() || done[2] < t2.size()) {
    Batch b;
    std::vector<int> who;
    for (int s = 0; s < 3; ++s)
      for (size_t i = 0; i < chunk[s] && done[s] < ts[s]->size(); ++i, ++done[s]) {
        b.add((*ts[s])[done[s]], s, c.seq_len(s) + static_cast<int32_t>(i), true);
        who.push_back(s);
      }
    c.decode(b);
    for (size_t i = 0; i < who.size(); ++i) got[who[i]].emplace_back(c.logits(i), c.logits(i) + c.n_vocab());
  }
  for (int s = 0; s < 3; ++s) EXPECT_LT(rel_diff(got[s], alone[s]), 2e-3) << "sequence " << s;
}

TEST_F(Fixture, SparseEqualsDense) {
  // Fast precision rounds activations to bf16 / Q8_0 and routes experts by top-k, so a rounding
  // difference between the two attention paths can flip a routing or indexer choice and change
  // a few rows by a few percent (the same happens between ISAs): most rows must agree to 1e-2 and
  // none may be far off. The exact equivalence is checked in F32 precision (next test).
  auto m = Model::load(k31);
  auto toks = random_tokens(48, 11);
  for (int top_k : {-1, 5, 0}) {
    Context s(*m, opts(top_k, AttnPath::Sparse)), d(*m, opts(top_k, AttnPath::Dense));
    Rows a = run_batch(s, toks), b = run_batch(d, toks);
    int close = 0;
    for (size_t i = 0; i < a.size(); ++i) {
      const double r = rel_diff(Rows{a[i]}, Rows{b[i]});
      EXPECT_LT(r, 0.1) << "top_k " << top_k << " row " << i;
      close += r < 1e-2;
    }
    EXPECT_GE(close, static_cast<int>(a.size()) * 3 / 4) << "top_k " << top_k;
  }
}

TEST_F(Fixture, SparseEqualsDenseF32Precision) {
  auto m = Model::load(k31);
  auto toks = random_tokens(48, 12);
  for (int top_k : {-1, 5, 0}) {
    ContextOptions os = opts(top_k, AttnPath::Sparse), od = opts(top_k, AttnPath::Dense);
    os.precision = od.precision = Precision::F32;
    Context s(*m, os), d(*m, od);
    EXPECT_LT(rel_diff(run_batch(s, toks), run_batch(d, toks)), 2e-5) << "top_k " << top_k;
  }
}

TEST_F(Fixture, TopKAtLeastContextIsExactlyIndexerOff) {
  auto m = Model::load(k31);
  for (AttnPath p : {AttnPath::Sparse, AttnPath::Dense}) {
    // the file's top_k (16) covers a 16-token context
    auto toks = random_tokens(16, 21);
    Context on(*m, opts(-1, p)), off(*m, opts(0, p));
    EXPECT_TRUE(bit_equal(run_batch(on, toks), run_batch(off, toks)));
    // an override >= context on a longer prompt
    auto longer = random_tokens(50, 22);
    Context big(*m, opts(64, p)), off2(*m, opts(0, p));
    EXPECT_TRUE(bit_equal(run_batch(big, longer), run_batch(off2, longer)));
  }
}

TEST_F(Fixture, TopKBelowContextChangesLogits) {
  auto m = Model::load(k31);
  auto toks = random_tokens(48, 31);
  Context on(*m, opts()), off(*m, opts(0));
  Rows a = run_batch(on, toks), b = run_batch(off, toks);
  // identical while the context fits in top_k (first 16 positions), different afterwards
  Rows a16(a.begin(), a.begin() + 16), b16(b.begin(), b.begin() + 16);
  EXPECT_TRUE(bit_equal(a16, b16));
  Rows at(a.begin() + 40, a.end()), bt(b.begin() + 40, b.end());
  EXPECT_GT(rel_diff(at, bt), 1e-4);
}

TEST_F(Fixture, PlainK3FileEqualsK31WithTopKAtLeastContext) {
  auto m31 = Model::load(k31);
  auto m3 = Model::load(k3);
  auto toks = random_tokens(40, 41);
  Context a(*m3, opts()), b(*m31, opts(1000));
  EXPECT_EQ(a.effective_top_k(), 0);
  EXPECT_TRUE(bit_equal(run_batch(a, toks), run_batch(b, toks)));
}

TEST_F(Fixture, SeqCopyTruncateClearThenContinueEqualsFreshRun) {
  auto m = Model::load(k31);
  auto prefix = random_tokens(30, 51), cont_a = random_tokens(12, 52), cont_b = random_tokens(9, 53);
  std::vector<int32_t> full_a = prefix, full_b = prefix;
  full_a.insert(full_a.end(), cont_a.begin(), cont_a.end());
  full_b.insert(full_b.end(), cont_b.begin(), cont_b.end());
  Rows fresh_a, fresh_b;
  {
    Context c(*m, opts());
    Rows r = run_batch(c, full_a);
    fresh_a.assign(r.begin() + 30, r.end());
    c.seq_clear(0);
    EXPECT_EQ(c.seq_len(0), 0);
    r = run_batch(c, full_b);  // clear then run == fresh (checked against a new context below)
    fresh_b.assign(r.begin() + 30, r.end());
    Context c2(*m, opts());
    Rows r2 = run_batch(c2, full_b);
    EXPECT_TRUE(bit_equal(Rows(r2.begin() + 30, r2.end()), fresh_b));
  }
  Context c(*m, opts(-1, AttnPath::Sparse, 2));
  run_batch(c, prefix, 0);
  c.seq_snapshot(0);
  c.seq_copy(0, 1);
  EXPECT_EQ(c.seq_len(1), 30);
  EXPECT_LT(rel_diff(run_batch(c, cont_a, 1), fresh_a), 1e-6);
  EXPECT_LT(rel_diff(run_batch(c, cont_b, 0), fresh_b), 1e-6);
  // back to the snapshot, then the other continuation
  c.seq_truncate(0, 30);
  EXPECT_EQ(c.seq_len(0), 30);
  EXPECT_LT(rel_diff(run_batch(c, cont_a, 0), fresh_a), 1e-6);
  // truncation to a position without a snapshot is refused with a clear message
  try {
    c.seq_truncate(0, 35);
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("snapshot"), std::string::npos) << e.what();
  }
  c.seq_truncate(0, 0);
  EXPECT_EQ(c.seq_len(0), 0);
}

TEST_F(Fixture, DecodeRejectsBadBatches) {
  auto m = Model::load(k31);
  Context c(*m, opts(-1, AttnPath::Sparse, 2));
  auto expect_err = [&](const Batch& b, const char* what) {
    try {
      c.decode(b);
      FAIL() << "expected an error mentioning " << what;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(what), std::string::npos) << e.what();
    }
  };
  Batch b;
  b.add(5000, 0, 0, true);
  expect_err(b, "out of range");
  b.clear();
  b.add(1, 2, 0, true);
  expect_err(b, "seq_id 2");
  b.clear();
  b.add(1, 0, 1, true);
  expect_err(b, "expects position 0");
  EXPECT_EQ(c.seq_len(0), 0);  // nothing was evaluated
  b.clear();
  b.add(1, 0, 0, false);
  c.decode(b);
  expect_err(b, "expects position 1");
  EXPECT_THROW(c.logits(0), Error);  // last successful batch did not request logits
}

// ---- loader errors on edited files ----

namespace {
std::string load_error(const std::string& path) {
  try {
    Model::load(path);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}
}  // namespace

TEST_F(Fixture, LoaderRejectsMissingTensor) {
  std::string p = dir->file("missing.gguf");
  test::GgufEdit ed;
  ed.edit_tensor = [](const std::string& n, GgmlType&, std::vector<int64_t>&) { return n != "blk.5.ssm_beta.weight"; };
  test::copy_gguf(k31, p, ed);
  const std::string e = load_error(p);
  EXPECT_NE(e.find("blk.5.ssm_beta.weight"), std::string::npos) << e;
  EXPECT_NE(e.find("missing"), std::string::npos) << e;
}

TEST_F(Fixture, LoaderRejectsWrongShape) {
  std::string p = dir->file("shape.gguf");
  test::GgufEdit ed;
  ed.edit_tensor = [](const std::string& n, GgmlType&, std::vector<int64_t>& ne) {
    if (n == "blk.3.attn_k_b.weight") ne = {16, 32, 3};
    return true;
  };
  test::copy_gguf(k31, p, ed);
  const std::string e = load_error(p);
  EXPECT_NE(e.find("blk.3.attn_k_b.weight"), std::string::npos) << e;
  EXPECT_NE(e.find("{16, 32, 4}"), std::string::npos) << e;
  EXPECT_NE(e.find("{16, 32, 3}"), std::string::npos) << e;
}

TEST_F(Fixture, LoaderRejectsWrongVectorType) {
  std::string p = dir->file("type.gguf");
  test::GgufEdit ed;
  ed.edit_tensor = [](const std::string& n, GgmlType& t, std::vector<int64_t>&) {
    if (n == "blk.2.attn_norm.weight") t = GgmlType::BF16;
    return true;
  };
  test::copy_gguf(k31, p, ed);
  const std::string e = load_error(p);
  EXPECT_NE(e.find("blk.2.attn_norm.weight"), std::string::npos) << e;
  EXPECT_NE(e.find("expected type F32, found BF16"), std::string::npos) << e;
}

TEST_F(Fixture, LoaderRejectsIndexerTensorInKdaLayer) {
  std::string p = dir->file("idx-kda.gguf");
  test::GgufEdit ed;
  ed.add_tensor.push_back({"blk.2.indexer.attn_k.weight", GgmlType::BF16, {64, 16}});
  test::copy_gguf(k31, p, ed);
  const std::string e = load_error(p);
  EXPECT_NE(e.find("blk.2.indexer.attn_k.weight"), std::string::npos) << e;
  EXPECT_NE(e.find("KDA layer"), std::string::npos) << e;
}

TEST_F(Fixture, LoaderRejectsMissingIndexerTensorAndKeys) {
  std::string p = dir->file("idx-missing.gguf");
  test::GgufEdit ed;
  ed.edit_tensor = [](const std::string& n, GgmlType&, std::vector<int64_t>&) {
    return n != "blk.7.indexer.proj.weight";
  };
  test::copy_gguf(k31, p, ed);
  std::string e = load_error(p);
  EXPECT_NE(e.find("blk.7.indexer.proj.weight"), std::string::npos) << e;

  std::string p2 = dir->file("idx-nokeys.gguf");
  test::GgufEdit ed2;
  ed2.drop_kv = {"kimi-k3.attention.indexer.head_count"};
  test::copy_gguf(k31, p2, ed2);
  e = load_error(p2);
  EXPECT_NE(e.find("kimi-k3.attention.indexer.head_count"), std::string::npos) << e;

  // indexer tensors without the top_k key: refused (the file is inconsistent)
  std::string p3 = dir->file("idx-notopk.gguf");
  test::GgufEdit ed3;
  ed3.drop_kv = {"kimi-k3.attention.indexer.top_k"};
  test::copy_gguf(k31, p3, ed3);
  e = load_error(p3);
  EXPECT_NE(e.find("indexer"), std::string::npos) << e;
}

TEST_F(Fixture, LoaderRejectsWrongArchitecture) {
  std::string p = dir->file("arch.gguf");
  test::GgufEdit ed;
  ed.set_kv.push_back({"general.architecture", gguf::Value::str("llama")});
  test::copy_gguf(k31, p, ed);
  const std::string e = load_error(p);
  EXPECT_NE(e.find("'llama'"), std::string::npos) << e;
  EXPECT_NE(e.find("kimi-k3"), std::string::npos) << e;
}

TEST_F(Fixture, GroupedExpertsEqualPerExpertLoop) {
  // n_batch_max 1: a decode token's k routed slots do not fit the gather buffers -> one threaded
  // matmul per expert; n_batch_max 32: all active experts in one parallel job (matmul_rows).
  // Both compute every output row with the same kernel and sum in expert order: bit-identical.
  auto m = Model::load(k31);
  auto toks = random_tokens(20, 41);
  for (Precision p : {Precision::Fast, Precision::F32}) {
    ContextOptions a = opts(), b = opts();
    a.precision = b.precision = p;
    a.n_threads = b.n_threads = 2;
    a.n_batch_max = 1;
    Context loop(*m, a), grouped(*m, b);
    EXPECT_TRUE(bit_equal(run_one_by_one(loop, toks), run_one_by_one(grouped, toks)));
  }
}

TEST_F(Fixture, SyntheticFillSetsTheLengthAndDecodingContinues) {
  auto m = Model::load(k31);
  for (AttnPath p : {AttnPath::Sparse, AttnPath::Dense}) {
    Context ctx(*m, opts(-1, p));
    ctx.seq_fill_synthetic(0, 100, 7);
    EXPECT_EQ(ctx.seq_len(0), 100);
    EXPECT_EQ(ctx.seq_snapshot_pos(0), -1);
    Batch b;
    b.add(5, 0, 100, true);
    ctx.decode(b);  // attends over the synthetic rows (top_k 16 < 101 visible: indexer + selection)
    const float* lg = ctx.logits(0);
    for (int i = 0; i < ctx.n_vocab(); ++i) ASSERT_TRUE(std::isfinite(lg[i]));
    EXPECT_EQ(ctx.seq_len(0), 101);
    EXPECT_THROW(ctx.seq_fill_synthetic(0, 129), Error);  // n_ctx_max 128
    EXPECT_THROW(ctx.seq_fill_synthetic(1, 10), Error);   // one sequence
    ctx.seq_fill_synthetic(0, 0);
    EXPECT_EQ(ctx.seq_len(0), 0);
  }
}
