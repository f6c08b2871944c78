// Multiple KDA snapshots per sequence: truncating back to any snapshot, and copying the first n
// positions of a sequence, then continuing must equal a fresh run fed the same chunks (bit-exact
// with F32 precision: the restored states and copied rows are the very values a fresh run computes).
#include <gtest/gtest.h>

#include <cstring>
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

std::vector<int32_t> random_tokens(int n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<int32_t> t(static_cast<size_t>(n));
  for (auto& x : t) x = static_cast<int32_t>(rng() % 1000u);
  return t;
}

using Rows = std::vector<std::vector<float>>;

Rows run(Context& ctx, const std::vector<int32_t>& toks, size_t from, size_t to, int seq) {
  Batch b;
  const int32_t base = ctx.seq_len(seq);
  for (size_t i = from; i < to; ++i) b.add(toks[i], seq, base + static_cast<int32_t>(i - from), true);
  ctx.decode(b);
  Rows out;
  for (size_t i = 0; i < b.size(); ++i) out.emplace_back(ctx.logits(i), ctx.logits(i) + ctx.n_vocab());
  return out;
}

bool bit_equal(const Rows& a, const Rows& b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i)
    if (a[i].size() != b[i].size() || std::memcmp(a[i].data(), b[i].data(), a[i].size() * 4) != 0) return false;
  return true;
}

struct Snapshots : ::testing::Test {
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
  static ContextOptions opts(int n_snap = 4) {
    ContextOptions o;
    o.n_threads = 1;
    o.n_seq_max = 2;
    o.n_ctx_max = 96;
    o.n_batch_max = 32;
    o.precision = Precision::F32;
    o.n_snapshots_max = n_snap;
    return o;
  }
  static constexpr size_t kChunk = 10;
  // a fresh context fed prefix[0, p) in chunks of kChunk, then `cont`: the logits of `cont`
  static Rows fresh(const Model& m, const std::vector<int32_t>& prefix, size_t p, const std::vector<int32_t>& cont) {
    Context c(m, opts());
    for (size_t i = 0; i < p; i += kChunk) run(c, prefix, i, std::min(p, i + kChunk), 0);
    return run(c, cont, 0, cont.size(), 0);
  }
};

}  // namespace

TEST_F(Snapshots, TruncateToEachSnapshotThenContinueEqualsFreshRun) {
  auto m = Model::load(path);
  const auto prefix = random_tokens(40, 7), cont = random_tokens(6, 8);
  Context c(*m, opts());
  for (size_t i = 0; i < prefix.size(); i += kChunk) {
    if (i > 0) c.seq_snapshot(0);  // at 10, 20, 30
    run(c, prefix, i, i + kChunk, 0);
  }
  EXPECT_EQ(c.seq_snapshot_positions(0), (std::vector<int32_t>{10, 20, 30}));
  EXPECT_EQ(c.seq_snapshot_pos(0), 30);
  // not a snapshot: refused, naming the snapshots; the state is unchanged
  try {
    c.seq_truncate(0, 25);
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("10, 20, 30"), std::string::npos) << e.what();
  }
  EXPECT_EQ(c.seq_len(0), 40);
  EXPECT_TRUE(bit_equal(run(c, cont, 0, cont.size(), 0), fresh(*m, prefix, 40, cont)));
  for (int32_t p : {30, 20, 10}) {
    c.seq_truncate(0, p);
    EXPECT_EQ(c.seq_len(0), p);
    std::vector<int32_t> expect;
    for (int32_t q = 10; q <= p; q += 10) expect.push_back(q);
    EXPECT_EQ(c.seq_snapshot_positions(0), expect) << "after truncating to " << p;
    EXPECT_TRUE(bit_equal(run(c, cont, 0, cont.size(), 0), fresh(*m, prefix, static_cast<size_t>(p), cont)))
        << "continuation after truncating to " << p;
  }
  // the snapshot at 10 is still there (the continuation ran after it)
  c.seq_truncate(0, 10);
  EXPECT_TRUE(bit_equal(run(c, cont, 0, cont.size(), 0), fresh(*m, prefix, 10, cont)));
}

TEST_F(Snapshots, CopyFirstNEqualsFreshRun) {
  auto m = Model::load(path);
  const auto prefix = random_tokens(40, 11), cont = random_tokens(5, 12);
  Context c(*m, opts());
  for (size_t i = 0; i < prefix.size(); i += kChunk) {
    run(c, prefix, i, i + kChunk, 0);
    if (i + kChunk < prefix.size()) c.seq_snapshot(0);  // at 10, 20, 30
  }
  for (int32_t n : {10, 20, 30, 40}) {
    c.seq_copy(0, 1, n);
    EXPECT_EQ(c.seq_len(1), n);
    std::vector<int32_t> expect;
    for (int32_t q = 10; q <= n && q < 40; q += 10) expect.push_back(q);
    EXPECT_EQ(c.seq_snapshot_positions(1), expect) << "copy of " << n;
    EXPECT_TRUE(bit_equal(run(c, cont, 0, cont.size(), 1), fresh(*m, prefix, static_cast<size_t>(n), cont)))
        << "continuation of the first " << n << " positions";
  }
  // the source is untouched by the copies
  EXPECT_EQ(c.seq_len(0), 40);
  EXPECT_EQ(c.seq_snapshot_positions(0), (std::vector<int32_t>{10, 20, 30}));
  EXPECT_TRUE(bit_equal(run(c, cont, 0, cont.size(), 0), fresh(*m, prefix, 40, cont)));
  c.seq_copy(0, 1, 0);
  EXPECT_EQ(c.seq_len(1), 0);
  EXPECT_TRUE(c.seq_snapshot_positions(1).empty());
  try {
    c.seq_copy(0, 1, 15);
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("snapshot"), std::string::npos) << e.what();
  }
  EXPECT_THROW(c.seq_copy(0, 1, 99), Error);
}

TEST_F(Snapshots, EvictionKeepsTheNewestAndSpreadsTheRest) {
  auto m = Model::load(path);
  const auto toks = random_tokens(60, 21);
  Context c(*m, opts(3));
  for (size_t i = 0; i < toks.size(); i += kChunk) {
    run(c, toks, i, i + kChunk, 0);
    c.seq_snapshot(0);
  }
  // 10,20,30 | +40: gaps around 10/20/30 are 20/20/20 -> the earliest (10) goes: 20,30,40
  // +50: gaps 30/20/20 -> 30 goes: 20,40,50 | +60: gaps 40/30/20 -> 50 goes: 20,40,60
  EXPECT_EQ(c.seq_snapshot_positions(0), (std::vector<int32_t>{20, 40, 60}));
  c.seq_snapshot(0);  // same length: replaced, nothing evicted
  EXPECT_EQ(c.seq_snapshot_positions(0), (std::vector<int32_t>{20, 40, 60}));
  // with one snapshot allowed the behaviour is the historical one: only the latest is kept
  Context one(*m, opts(1));
  run(one, toks, 0, 10, 0);
  one.seq_snapshot(0);
  run(one, toks, 10, 20, 0);
  one.seq_snapshot(0);
  EXPECT_EQ(one.seq_snapshot_positions(0), (std::vector<int32_t>{20}));
  EXPECT_THROW(one.seq_truncate(0, 10), Error);
  ContextOptions bad = opts(0);
  EXPECT_THROW(Context(*m, bad), Error);
}

// The prompt cache's host copies: rows [0, q) saved in two ranges and the KDA states at a snapshot
// q, loaded into another sequence of ANOTHER context, then continued, give bit for bit the logits
// of a cold context that prefills everything in one batch (Fast and F32).
TEST_F(Snapshots, SaveLoadToHostThenContinueEqualsColdPrefill) {
  auto m = Model::load(path);
  const auto toks = random_tokens(50, 31);
  for (Precision prec : {Precision::F32, Precision::Fast}) {
    SCOPED_TRACE(prec == Precision::F32 ? "f32" : "fast");
    ContextOptions o = opts();
    o.precision = prec;
    Context a(*m, o);
    run(a, toks, 0, 10, 0);
    run(a, toks, 10, 23, 0);
    a.seq_snapshot(0);  // at 23
    run(a, toks, 23, 40, 0);
    const size_t q = 23;
    ASSERT_GT(a.seq_state_bytes(), 0u);
    const uint64_t rb = a.seq_row_bytes();
    uint64_t parts = 0;
    for (uint64_t p : a.seq_row_parts()) parts += p;
    EXPECT_EQ(parts, rb);
    std::vector<uint8_t> r1(rb * 9), r2(rb * (q - 9)), st(a.seq_state_bytes()), st_now(a.seq_state_bytes());
    a.seq_save_rows(0, 0, 9, r1.data());
    a.seq_save_rows(0, 9, static_cast<int32_t>(q), r2.data());
    a.seq_save_state(0, static_cast<int32_t>(q), st.data());
    a.seq_save_state(0, 40, st_now.data());
    EXPECT_NE(st, st_now);  // the states moved on after the snapshot
    EXPECT_THROW(a.seq_save_state(0, 30, st.data()), Error);          // no states there
    EXPECT_THROW(a.seq_save_rows(0, 0, 41, r1.data()), Error);        // beyond the length
    // cold: all 50 tokens in one batch
    Context cold(*m, o);
    const Rows want = run(cold, toks, 0, toks.size(), 0);
    Context b(*m, o);
    run(b, toks, 0, 5, 1);  // seq 1 holds something else first
    b.seq_load_rows(1, 0, 9, r1.data());
    b.seq_load_rows(1, 9, static_cast<int32_t>(q), r2.data());
    b.seq_load_state(1, static_cast<int32_t>(q), st.data());
    EXPECT_EQ(b.seq_len(1), static_cast<int32_t>(q));
    EXPECT_TRUE(b.seq_snapshot_positions(1).empty());
    const Rows got = run(b, toks, q, toks.size(), 1);
    EXPECT_TRUE(bit_equal(got, Rows(want.begin() + static_cast<std::ptrdiff_t>(q), want.end())));
    EXPECT_EQ(a.state_identity(), b.state_identity());
    ContextOptions other = o;
    other.cache_type = CacheType::F32;
    if (prec == Precision::Fast) {
      EXPECT_NE(Context(*m, other).state_identity(), a.state_identity());
    }
  }
}
