// The Vulkan backend's MLA attention and DSA indexer ops against the CPU backend in f32 (the
// reference), on random caches of real-ish shapes: odd head counts, kv_lora 96 and 512, rope 0 and
// 64, two sequences interleaved in one cache, prefill batches at scattered positions and decode,
// f16 and f32 rows. The selection lists and counts live in device memory, as the indexer writes them.
#include <algorithm>
#include <limits>
#include <numeric>

#include "tensor/types.h"
#include "unit/vulkan_fixture.h"

using namespace kimi;
using kimi::test::random_floats;
using kimi::test::rel_rms;

namespace {

// a cache of `seqs` sequences x nctx rows of `width` random values, as f16 or f32 bytes
std::vector<uint8_t> random_cache(int64_t nctx, int64_t width, bool f16, uint32_t seed, int64_t seqs = 2) {
  const auto f = random_floats(static_cast<size_t>(seqs * nctx * width), seed);
  std::vector<uint8_t> out(f.size() * (f16 ? 2 : 4));
  if (f16) {
    auto* h = reinterpret_cast<uint16_t*>(out.data());
    for (size_t i = 0; i < f.size(); ++i) h[i] = f32_to_f16(f[i]);
  } else {
    std::memcpy(out.data(), f.data(), out.size());
  }
  return out;
}

BatchEntry entry(int32_t seq, int32_t pos) {
  BatchEntry e;
  e.seq_id = seq;
  e.pos = pos;
  return e;
}

// The k best of s (higher first, ties: lower index; NaN as -inf), ascending: a plain sort.
std::vector<int32_t> topk_by_sort(const std::vector<float>& s, int64_t k) {
  std::vector<int32_t> idx(s.size());
  std::iota(idx.begin(), idx.end(), 0);
  auto key = [&](int32_t i) { return std::isnan(s[i]) ? -INFINITY : s[i]; };
  std::stable_sort(idx.begin(), idx.end(), [&](int32_t a, int32_t b) { return key(a) > key(b); });
  idx.resize(static_cast<size_t>(std::min<int64_t>(k, static_cast<int64_t>(s.size()))));
  std::sort(idx.begin(), idx.end());
  return idx;
}

}  // namespace

using VulkanAttention = kimi::test::VulkanOps;

// scores[s] = sum_h w_h ReLU(q_h . key_s): f16 and f32 keys; 64 heads x 128 (the real indexer),
// 5 x 128, 70 x 40 (a second, partial head block; a partial key step), 3 x 72; both sequences.
TEST_F(VulkanAttention, IndexerScores) {
  const int64_t nctx = 300;
  for (bool f16 : {true, false}) {
    for (auto [HI, DI] : {std::pair<int64_t, int64_t>{5, 128}, {64, 128}, {70, 40}, {3, 72}}) {
      SCOPED_TRACE(std::string(f16 ? "f16" : "f32") + " heads " + std::to_string(HI) + " dim " + std::to_string(DI));
      auto keys = both(random_cache(nctx, DI, f16, 7));
      auto q = both(random_floats(static_cast<size_t>(HI * DI), 8));
      auto w = both(random_floats(static_cast<size_t>(HI), 9));
      for (int32_t seq : {0, 1}) {
        for (int64_t nvis : {int64_t{1}, int64_t{37}, nctx}) {
          auto sc = zeros(static_cast<size_t>(nctx));
          CacheRows kc{keys.cp<uint8_t>(), f16, DI, nctx}, kg{keys.gp<uint8_t>(), f16, DI, nctx};
          cpu_->indexer_scores(kc, seq, q.cp<float>(), w.cp<float>(), HI, nvis, sc.cp<float>());
          gpu_->indexer_scores(kg, seq, q.gp<float>(), w.gp<float>(), HI, nvis, sc.gp<float>());
          auto [c, g] = read(sc, static_cast<size_t>(nvis));
          EXPECT_LT(rel_rms(g, c), 1e-5) << "seq " << seq << " visible " << nvis;
          // positions past n_visible are left alone
          auto [c2, g2] = read(sc);
          for (int64_t s = nvis; s < nctx; ++s) ASSERT_EQ(g2[static_cast<size_t>(s)], 0.0f) << s;
        }
      }
    }
  }
}

// Very wide heads x dims (2000 x 1040): on a cpu device the head blocks go out in several
// dispatches that continue the sums in memory (a single dispatch gives rel RMS 0.19 there: its
// loops are cut short); the scores still match.
TEST_F(VulkanAttention, IndexerScoresWide) {
  const int64_t nctx = 20, HI = 2000, DI = 1040;
  auto keys = both(random_cache(nctx, DI, true, 91, 1));
  auto q = both(random_floats(static_cast<size_t>(HI * DI), 92));
  auto w = both(random_floats(static_cast<size_t>(HI), 93));
  auto sc = zeros(static_cast<size_t>(nctx));
  CacheRows kc{keys.cp<uint8_t>(), true, DI, nctx}, kg{keys.gp<uint8_t>(), true, DI, nctx};
  cpu_->indexer_scores(kc, 0, q.cp<float>(), w.cp<float>(), HI, nctx, sc.cp<float>());
  gpu_->indexer_scores(kg, 0, q.gp<float>(), w.gp<float>(), HI, nctx, sc.gp<float>());
  auto [c, g] = read(sc);
  EXPECT_LT(rel_rms(g, c), 1e-5);
}

// top-k: exactly the CPU's set (and a plain sort's), ascending, for random scores, scores with
// many ties (a few distinct values, -0 next to +0, -inf, NaN), k = 1, inside, n - 1, n, > n, 0.
TEST_F(VulkanAttention, TopkExactWithTies) {
  for (int64_t n : {int64_t{1}, int64_t{300}, int64_t{5001}, int64_t{70001}}) {
    for (int kind = 0; kind < 3; ++kind) {
      if (n > 10000 && kind != 1) continue;  // the long case once, with ties
      std::vector<float> s = random_floats(static_cast<size_t>(n), 11 + static_cast<uint32_t>(kind + n));
      if (kind >= 1)  // few distinct values: long runs of ties
        for (auto& x : s) x = std::round(x * 3.0f) / 3.0f;
      if (kind == 2) {  // signed zeros and the specials
        for (size_t i = 0; i < s.size(); i += 5) s[i] = (i / 5) % 2 ? -0.0f : 0.0f;
        if (n > 10) {
          s[3] = std::numeric_limits<float>::quiet_NaN();
          s[7] = -INFINITY;
          s[static_cast<size_t>(n - 1)] = std::numeric_limits<float>::quiet_NaN();
        }
      }
      auto sc = both(s);
      auto tmp = zeros(static_cast<size_t>(n));
      for (int64_t k : {int64_t{1}, int64_t{17}, n / 2, n - 1, n, n + 5, int64_t{0}}) {
        SCOPED_TRACE("n " + std::to_string(n) + " kind " + std::to_string(kind) + " k " + std::to_string(k));
        auto sel = both(std::vector<int32_t>(static_cast<size_t>(n + 5), -7));
        auto cnt = both(std::vector<int32_t>{-3});
        cpu_->indexer_topk(sc.cp<float>(), n, k, sel.cp<int32_t>(), cnt.cp<int32_t>(), tmp.cp<float>());
        gpu_->indexer_topk(sc.gp<float>(), n, k, sel.gp<int32_t>(), cnt.gp<int32_t>(), tmp.gp<float>());
        auto [cn, gn] = read<int32_t>(cnt);
        ASSERT_EQ(gn[0], cn[0]);
        ASSERT_EQ(gn[0], std::max<int64_t>(0, std::min(k, n)));
        auto [cs, gs] = read<int32_t>(sel);
        for (size_t i = static_cast<size_t>(gn[0]); i < gs.size(); ++i) ASSERT_EQ(gs[i], -7) << "written past sel_n: " << i;
        gs.resize(static_cast<size_t>(gn[0]));
        cs.resize(static_cast<size_t>(cn[0]));
        EXPECT_EQ(gs, cs);
        EXPECT_EQ(gs, topk_by_sort(s, std::max<int64_t>(k, 0)));
      }
    }
  }
}

// The indexer chain on the device: scores -> top-k -> the selection, which then drives attention
// (below). Here: the top-k of the device scores equals the plain sort of the same scores.
TEST_F(VulkanAttention, IndexerChainSelectsFromDeviceScores) {
  const int64_t nctx = 300, HI = 3, DI = 64, k = 40;
  auto keys = both(random_cache(nctx, DI, true, 21));
  auto q = both(random_floats(static_cast<size_t>(HI * DI), 22));
  auto w = both(random_floats(static_cast<size_t>(HI), 23));
  auto sc = zeros(static_cast<size_t>(nctx));
  auto sel = zeros<int32_t>(static_cast<size_t>(k));
  auto cnt = zeros<int32_t>(1);
  CacheRows kg{keys.gp<uint8_t>(), true, DI, nctx};
  gpu_->indexer_scores(kg, 1, q.gp<float>(), w.gp<float>(), HI, 250, sc.gp<float>());
  gpu_->indexer_topk(sc.gp<float>(), 250, k, sel.gp<int32_t>(), cnt.gp<int32_t>(), nullptr);
  auto [c_unused, scores] = read(sc, 250);
  (void)c_unused;
  int zeros_seen = 0;
  for (float x : scores) zeros_seen += x == 0.0f;
  EXPECT_GT(zeros_seen, 0) << "ReLU leaves some scores at exactly 0 (ties)";
  auto [c2, g] = read<int32_t>(sel);
  (void)c2;
  auto [c3, n] = read<int32_t>(cnt);
  (void)c3;
  EXPECT_EQ(n[0], k);
  EXPECT_EQ(g, topk_by_sort(scores, k));
}

namespace {

struct AttnCase {
  int64_t H, kvl, pe;
  bool f16;
};

}  // namespace

// MLA attention, sparse and dense, against the CPU; sparse vs dense on the device. Tokens: a
// prefill batch over two interleaved sequences at scattered positions, each with its own
// selection (all visible rows, a random subset of up to sel_cap rows spanning several chunks, the
// empty set, a single row), then decode at the last position, then a batch whose positions all
// fit one chunk (a single split, no combine pass).
TEST_F(VulkanAttention, MlaSparseAndDense) {
  const int64_t nctx = 300, sel_cap = 150;
  // widths that are multiples of 4 take the 4-element row reads, the odd ones (96 + 7, 75 + 5) the scalar path
  const AttnCase cases[] = {{3, 96, 0, true},    {3, 96, 64, false}, {3, 96, 64, true}, {5, 512, 64, true},
                            {2, 512, 64, false}, {3, 96, 7, true},   {3, 75, 5, false}};
  std::mt19937 rng(5);
  for (const AttnCase& ac : cases) {
    const int64_t W = ac.kvl + ac.pe, H = ac.H, kvl = ac.kvl;
    SCOPED_TRACE("H " + std::to_string(H) + " kv_lora " + std::to_string(kvl) + " rope " + std::to_string(ac.pe) +
                 (ac.f16 ? " f16" : " f32"));
    WorkLimits lim;
    lim.n_tokens = 8;
    lim.n_ctx = nctx;
    lim.n_heads = H;
    lim.head_io = kvl;
    lim.row = W;
    lim.dense_attn = true;
    cpu_->reserve(lim);
    gpu_->reserve(lim);
    auto cache = both(random_cache(nctx, W, ac.f16, 31));
    CacheRows cc{cache.cp<uint8_t>(), ac.f16, W, nctx}, cg{cache.gp<uint8_t>(), ac.f16, W, nctx};
    const std::vector<std::vector<BatchEntry>> batches = {
        {entry(1, 0), entry(0, 5), entry(1, 150), entry(0, 299), entry(1, 64), entry(0, 200), entry(1, 299)},
        {entry(1, 299)},
        {entry(0, 3), entry(1, 63), entry(0, 40)}};
    for (size_t b = 0; b < batches.size(); ++b) {
      const auto& e = batches[b];
      const int64_t n = static_cast<int64_t>(e.size());
      SCOPED_TRACE("batch " + std::to_string(b));
      // selections: token t picks mode t % 4 (b shifts it): all, random subset, empty, one row
      std::vector<int32_t> sel(static_cast<size_t>(n * sel_cap), 0), cnt(static_cast<size_t>(n));
      for (int64_t t = 0; t < n; ++t) {
        const int32_t nvis = e[static_cast<size_t>(t)].pos + 1;
        const int mode = static_cast<int>((t + static_cast<int64_t>(b)) % 4);
        int32_t* s = sel.data() + t * sel_cap;
        if (mode == 0) {
          cnt[static_cast<size_t>(t)] = -1;
        } else if (mode == 1) {
          std::vector<int32_t> all(static_cast<size_t>(nvis));
          std::iota(all.begin(), all.end(), 0);
          std::shuffle(all.begin(), all.end(), rng);
          const int32_t k = std::min<int32_t>(nvis, static_cast<int32_t>(sel_cap) - static_cast<int32_t>(t));
          std::sort(all.begin(), all.begin() + k);
          std::copy(all.begin(), all.begin() + k, s);
          cnt[static_cast<size_t>(t)] = k;
        } else if (mode == 2) {
          cnt[static_cast<size_t>(t)] = 0;
        } else {
          s[0] = nvis - 1;
          cnt[static_cast<size_t>(t)] = 1;
        }
      }
      auto sl = both(sel);
      auto sn = both(cnt);
      auto q = both(random_floats(static_cast<size_t>(n * H * W), 40 + static_cast<uint32_t>(b), 0.3f));
      const float scale = 1.0f / std::sqrt(static_cast<float>(W));
      std::vector<float> gpu_out[2];
      for (AttnPath path : {AttnPath::Sparse, AttnPath::Dense}) {
        const bool dense = path == AttnPath::Dense;
        auto z = both(std::vector<float>(static_cast<size_t>(n * H * kvl), 123.0f));  // overwritten
        cpu_->mla_attention(cc, kvl, e.data(), n, H, q.cp<float>(), sl.cp<int32_t>(), sn.cp<int32_t>(), sel_cap,
                            scale, path, z.cp<float>());
        gpu_->mla_attention(cg, kvl, e.data(), n, H, q.gp<float>(), sl.gp<int32_t>(), sn.gp<int32_t>(), sel_cap,
                            scale, path, z.gp<float>());
        auto [c, g] = read(z);
        EXPECT_LT(rel_rms(g, c), 1e-5) << (dense ? "dense" : "sparse");
        for (int64_t t = 0; t < n; ++t) {  // per token as well (the empty selection gives zeros)
          const auto a = static_cast<size_t>(t * H * kvl), len = static_cast<size_t>(H * kvl);
          std::vector<float> ct(c.begin() + a, c.begin() + a + len), gt(g.begin() + a, g.begin() + a + len);
          EXPECT_LT(rel_rms(gt, ct), 1e-5) << (dense ? "dense" : "sparse") << " token " << t;
          if (cnt[static_cast<size_t>(t)] == 0) {
            EXPECT_EQ(gt, std::vector<float>(len, 0.0f)) << "token " << t;
          }
        }
        gpu_out[dense ? 1 : 0] = g;
      }
      EXPECT_LT(rel_rms(gpu_out[0], gpu_out[1]), 1e-6) << "sparse vs dense on the device";
      for (int64_t t = 0; t < n; ++t) {  // all rows visible: both paths walk the same list, bit for bit
        if (cnt[static_cast<size_t>(t)] >= 0) continue;
        const auto a = static_cast<ptrdiff_t>(t * H * kvl), len = static_cast<ptrdiff_t>(H * kvl);
        EXPECT_TRUE(std::equal(gpu_out[0].begin() + a, gpu_out[0].begin() + a + len, gpu_out[1].begin() + a))
            << "token " << t << ": sparse and dense differ with every row selected";
      }
    }
  }
}

// Without the indexer (top_k = 0): no selection array at all (sel_cap 0, sel_idx null), every
// count -1; both paths attend to every visible row, identically.
TEST_F(VulkanAttention, MlaWithoutIndexer) {
  const int64_t nctx = 300, H = 3, kvl = 96, W = 160;
  WorkLimits lim;
  lim.n_tokens = 4;
  lim.n_ctx = nctx;
  lim.n_heads = H;
  lim.head_io = kvl;
  lim.row = W;
  lim.dense_attn = true;
  cpu_->reserve(lim);
  gpu_->reserve(lim);
  auto cache = both(random_cache(nctx, W, true, 61));
  CacheRows cc{cache.cp<uint8_t>(), true, W, nctx}, cg{cache.gp<uint8_t>(), true, W, nctx};
  const std::vector<BatchEntry> e = {entry(0, 299), entry(1, 17), entry(1, 200), entry(0, 0)};
  const int64_t n = 4;
  auto sn = both(std::vector<int32_t>(4, -1));
  auto q = both(random_floats(static_cast<size_t>(n * H * W), 62, 0.3f));
  std::vector<float> out[2];
  for (AttnPath path : {AttnPath::Sparse, AttnPath::Dense}) {
    auto z = zeros(static_cast<size_t>(n * H * kvl));
    cpu_->mla_attention(cc, kvl, e.data(), n, H, q.cp<float>(), nullptr, sn.cp<int32_t>(), 0, 0.08f, path, z.cp<float>());
    gpu_->mla_attention(cg, kvl, e.data(), n, H, q.gp<float>(), nullptr, sn.gp<int32_t>(), 0, 0.08f, path, z.gp<float>());
    auto [c, g] = read(z);
    EXPECT_LT(rel_rms(g, c), 1e-5) << (path == AttnPath::Dense ? "dense" : "sparse");
    out[path == AttnPath::Dense ? 1 : 0] = g;
  }
  EXPECT_EQ(out[0], out[1]) << "sparse and dense walk the same rows in the same order";
}

namespace {

// KIMI_VULKAN_ATTN_WINDOW for one scope
struct WindowEnv {
  explicit WindowEnv(const char* v) { setenv("KIMI_VULKAN_ATTN_WINDOW", v, 1); }
  ~WindowEnv() { unsetenv("KIMI_VULKAN_ATTN_WINDOW"); }
};

}  // namespace

// The chunk windows (how a cpu device such as lavapipe stays within its loop limit; forced
// small here with KIMI_VULKAN_ATTN_WINDOW) carry the online-softmax state exactly: windows of 1
// and 2 chunks equal one dispatch bit for bit, with several splits (few tokens, long lists) and
// with one split (many tokens x heads, z written by the last window); all vs the CPU.
TEST_F(VulkanAttention, MlaWindowsAreExact) {
  struct Shape {
    int64_t n, H, nctx, kvl, W;
  };
  std::mt19937 rng(9);
  for (const Shape& sh : {Shape{3, 3, 1100, 96, 160}, Shape{19, 27, 130, 32, 40}}) {
    const int64_t n = sh.n, H = sh.H, nctx = sh.nctx, kvl = sh.kvl, W = sh.W, sel_cap = 150;
    SCOPED_TRACE("tokens " + std::to_string(n) + " heads " + std::to_string(H) + " n_ctx " + std::to_string(nctx));
    WorkLimits lim;
    lim.n_tokens = n;
    lim.n_ctx = nctx;
    lim.n_heads = H;
    lim.head_io = kvl;
    lim.row = W;
    lim.dense_attn = true;
    cpu_->reserve(lim);
    gpu_->reserve(lim);
    auto cache = both(random_cache(nctx, W, true, 71));
    CacheRows cc{cache.cp<uint8_t>(), true, W, nctx}, cg{cache.gp<uint8_t>(), true, W, nctx};
    std::vector<BatchEntry> e;
    std::vector<int32_t> sel(static_cast<size_t>(n * sel_cap), 0), cnt(static_cast<size_t>(n));
    for (int64_t t = 0; t < n; ++t) {
      const int32_t pos = t == 0 ? static_cast<int32_t>(nctx - 1) : static_cast<int32_t>((t * 37 + 5) % nctx);
      e.push_back(entry(static_cast<int32_t>(t % 2), pos));
      if (t % 2 == 0) {
        cnt[static_cast<size_t>(t)] = -1;
      } else {
        std::vector<int32_t> all(static_cast<size_t>(pos + 1));
        std::iota(all.begin(), all.end(), 0);
        std::shuffle(all.begin(), all.end(), rng);
        const int32_t k = std::min<int32_t>(pos + 1, static_cast<int32_t>(sel_cap));
        std::sort(all.begin(), all.begin() + k);
        std::copy(all.begin(), all.begin() + k, sel.begin() + t * sel_cap);
        cnt[static_cast<size_t>(t)] = k;
      }
    }
    auto sl = both(sel);
    auto sn = both(cnt);
    auto q = both(random_floats(static_cast<size_t>(n * H * W), 72, 0.3f));
    for (AttnPath path : {AttnPath::Sparse, AttnPath::Dense}) {
      const char* what = path == AttnPath::Dense ? "dense" : "sparse";
      auto z = zeros(static_cast<size_t>(n * H * kvl));
      auto run_gpu = [&] {
        gpu_->mla_attention(cg, kvl, e.data(), n, H, q.gp<float>(), sl.gp<int32_t>(), sn.gp<int32_t>(), sel_cap, 0.08f,
                            path, z.gp<float>());
        return read(z).second;
      };
      const std::vector<float> one = run_gpu();
      for (const char* w : {"1", "2"}) {
        WindowEnv env(w);
        EXPECT_EQ(run_gpu(), one) << what << ": windows of " << w << " chunks";
      }
      cpu_->mla_attention(cc, kvl, e.data(), n, H, q.cp<float>(), sl.cp<int32_t>(), sn.cp<int32_t>(), sel_cap, 0.08f,
                          path, z.cp<float>());
      EXPECT_LT(rel_rms(one, read(z).first), 1e-5) << what;
    }
  }
}

// A long context with every row visible: 1024 chunks of 64 rows over at most 8 splits, far past
// what one lavapipe invocation may loop (without the windows this gave rel RMS 0.41 there).
TEST_F(VulkanAttention, MlaLongContext) {
  const int64_t nctx = 65536, H = 1, kvl = 512, W = 576;
  WorkLimits lim;
  lim.n_tokens = 1;
  lim.n_ctx = nctx;
  lim.n_heads = H;
  lim.head_io = kvl;
  lim.row = W;
  lim.dense_attn = true;
  cpu_->reserve(lim);
  gpu_->reserve(lim);
  auto cache = both(random_cache(nctx, W, true, 81, 1));
  CacheRows cc{cache.cp<uint8_t>(), true, W, nctx}, cg{cache.gp<uint8_t>(), true, W, nctx};
  const std::vector<BatchEntry> e{entry(0, static_cast<int32_t>(nctx - 1))};
  auto sn = both(std::vector<int32_t>{-1});
  auto q = both(random_floats(static_cast<size_t>(H * W), 82, 0.3f));
  auto z = zeros(static_cast<size_t>(H * kvl));
  cpu_->mla_attention(cc, kvl, e.data(), 1, H, q.cp<float>(), nullptr, sn.cp<int32_t>(), 0, 0.05f, AttnPath::Sparse,
                      z.cp<float>());
  gpu_->mla_attention(cg, kvl, e.data(), 1, H, q.gp<float>(), nullptr, sn.gp<int32_t>(), 0, 0.05f, AttnPath::Sparse,
                      z.gp<float>());
  auto [c, g] = read(z);
  EXPECT_LT(rel_rms(g, c), 1e-5);
}
