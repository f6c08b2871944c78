// The backend seam with a second backend: "dev1" is the CPU backend wrapped as a device with its
// own memory (one arena, tagged allocations), weights uploaded as copies, and
// - every dev1 op checks that each pointer it gets lies in dev1 memory (so a missing copy fails
//   with the op's name), and
// - outside dev1's own ops its memory is PROT_NONE, so any op of device 0 (the context's CPU
//   backend) that reads or writes dev1 memory faults (reported by a SIGSEGV handler).
// The whole model then runs with layers, routed experts, input and output split between the two by
// placement rules (-ngl, --cpu-moe, --n-cpu-moe, -ot), and its logits must equal the
// single-backend logits bit for bit (same kernels, same order): prefill, decode, a second
// sequence interleaved, snapshot + truncate, with and without the DSA indexer, both precisions.
#include <gtest/gtest.h>

#include <signal.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <new>
#include <string>
#include <vector>

#include "backend/cpu/cpu_backend.h"
#include "backend_workload.h"
#include "engine_fixture.h"
#include "io/imatrix.h"
#include "model/expert_cache.h"
#include "model/model.h"
#include "runtime/context.h"
#include "test_util.h"
#include "util/error.h"

#include "count_allocs.h"

using namespace kimi;
using kimi::test::drive;
using kimi::test::Run;
using kimi::test::TinyModel;

namespace {

constexpr uint64_t kArenaBytes = uint64_t{1} << 30;  // address space only (MAP_NORESERVE)
uint8_t* g_arena = nullptr;
uint64_t g_used = 0;
int g_open = 0;  // nesting depth of dev1 calls (an op may call another op of its own backend)

void on_segv(int, siginfo_t* si, void*) {
  const auto* a = static_cast<const uint8_t*>(si->si_addr);
  if (g_arena && a >= g_arena && a < g_arena + kArenaBytes) {
    const char msg[] = "FAIL: device-0 code touched dev1 memory (a missing copy between backends)\n";
    (void)!::write(2, msg, sizeof msg - 1);
  }
  _exit(3);
}

class DevBuffer final : public Buffer {
 public:
  DevBuffer(Backend* o, void* p, uint64_t b) : Buffer(o, p, b) {}
};

// The CPU backend as "device 1": its own memory, explicit copies, every pointer checked.
class FakeDevice final : public CpuBackend {
 public:
  FakeDevice(ThreadPool& pool, Precision prec) : CpuBackend(pool, prec) {
    if (!g_arena) {
      void* p = ::mmap(nullptr, kArenaBytes, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
      EXPECT_NE(p, MAP_FAILED);
      g_arena = static_cast<uint8_t*>(p);
      struct sigaction sa {};
      sa.sa_sigaction = on_segv;
      sa.sa_flags = SA_SIGINFO;
      sigaction(SIGSEGV, &sa, nullptr);
    }
    base_ = g_used;  // each fake device takes the arena from where the last one stopped
  }
  ~FakeDevice() override {  // its buffers are gone (the contexts died first): give the arena back
    if (g_used > base_) ::madvise(g_arena + base_, g_used - base_, MADV_DONTNEED);
    g_used = base_;
  }
  const char* name() const override { return "dev1"; }
  bool host_visible() const override { return false; }
  int64_t n_ops = 0, n_uploads = 0, n_downloads = 0;
  // flush() (Backend::flush: start the recorded work, do not wait): how often, and how many dev1 ops were
  // recorded between the last download and each flush (work the device could run while the host works)
  int64_t n_flushes = 0, ops_at_download = 0, flushed_ops_after_download = 0;
  void flush() override {
    ++n_flushes;
    flushed_ops_after_download += n_ops - ops_at_download;
  }

  // ---- memory ----
  std::unique_ptr<Buffer> alloc(uint64_t bytes, const char* what) override {
    Open o(this);
    void* p = take(bytes);
    std::memset(p, 0, bytes);
    tags_.push_back(what);
    return std::make_unique<DevBuffer>(this, p, bytes);
  }
  const uint8_t* place_weight(const std::string& name, const uint8_t* host, uint64_t bytes) override {
    Open o(this);
    auto* p = static_cast<uint8_t*>(take(bytes));
    std::memcpy(p, host, bytes);
    tags_.push_back(name);
    return p;
  }
  // the CPU backend's load-time copies (repack.h) read the placed weight: a dev1 op like any other
  const PackedWeight* prepare_weight(const MatView& w) override {
    Open o(this);
    own(w.data, "prepare_weight");
    return CpuBackend::prepare_weight(w);
  }
  void upload(void* dst, const void* src, uint64_t bytes) override {
    Open o(this);
    own(dst, "upload");
    ++n_uploads;
    std::memcpy(dst, src, bytes);
  }
  void download(void* dst, const void* src, uint64_t bytes) override {
    Open o(this);
    own(src, "download");
    ++n_downloads;
    ops_at_download = n_ops;
    std::memcpy(dst, src, bytes);
  }
  void copy(void* d, const void* s, uint64_t b) override { Op o(this, "copy", {d, s}); CpuBackend::copy(d, s, b); }
  void fill_zero(void* d, uint64_t b) override { Op o(this, "fill_zero", {d}); CpuBackend::fill_zero(d, b); }

  // ---- ops: check, then the CPU implementation ----
  void matmul(const MatView& W, const float* x, int64_t n, float* y) override {
    Op o(this, "matmul", {W.data, x, y});
    CpuBackend::matmul(W, x, n, y);
  }
  void matmul_set(const MatView* const* W, float* const* y, int count, const float* x, int64_t n) override {
    Op o(this, "matmul_set", {x});
    for (int i = 0; i < count; ++i) {
      own(W[i]->data, "matmul_set");
      own(y[i], "matmul_set");
    }
    CpuBackend::matmul_set(W, y, count, x, n);
  }
  void embed_rows(const MatView& t, const BatchEntry* e, int64_t n, float* out) override {
    Op o(this, "embed_rows", {t.data, out});
    CpuBackend::embed_rows(t, e, n, out);
  }
  void rms_norm_rows(const float* x, int64_t ldx, const float* w, float* y, int64_t ldy, int64_t n, int64_t width,
                     float eps) override {
    Op o(this, "rms_norm_rows", {x, w, y});
    CpuBackend::rms_norm_rows(x, ldx, w, y, ldy, n, width, eps);
  }
  void layer_norm_rows(float* x, const float* w, const float* b, int64_t n, int64_t width, float eps) override {
    Op o(this, "layer_norm_rows", {x, w, b});
    CpuBackend::layer_norm_rows(x, w, b, n, width, eps);
  }
  void l2_norm_rows(float* x, int64_t n, int64_t width, float eps) override {
    Op o(this, "l2_norm_rows", {x});
    CpuBackend::l2_norm_rows(x, n, width, eps);
  }
  void add(float* y, const float* x, int64_t count) override {
    Op o(this, "add", {y, x});
    CpuBackend::add(y, x, count);
  }
  void scale_rows(float* x, int64_t n, int64_t width, float a) override {
    Op o(this, "scale_rows", {x});
    CpuBackend::scale_rows(x, n, width, a);
  }
  void sigmoid(float* x, int64_t count) override {
    Op o(this, "sigmoid", {x});
    CpuBackend::sigmoid(x, count);
  }
  void mul_sigmoid_rows(float* x, const float* g, int64_t n, int64_t w) override {
    Op o(this, "mul_sigmoid_rows", {x, g});
    CpuBackend::mul_sigmoid_rows(x, g, n, w);
  }
  void situ_rows(float* g, const float* u, int64_t n, int64_t w, float b, float l) override {
    Op o(this, "situ_rows", {g, u});
    CpuBackend::situ_rows(g, u, n, w, b, l);
  }
  void gather_rows(const float* src, int64_t width, const int32_t* rows, int64_t n, float* dst) override {
    Op o(this, "gather_rows", {src, dst});
    CpuBackend::gather_rows(src, width, rows, n, dst);
  }
  void set_i32(int32_t* dst, int64_t count, int32_t v) override {
    Op o(this, "set_i32", {dst});
    CpuBackend::set_i32(dst, count, v);
  }
  void res_mix(const float* cur, const float* w, const float* bank, const float* inv, uint32_t nb, int64_t bt,
               int64_t n, int64_t d, float eps, float* dst) override {
    Op o(this, "res_mix", {cur, w, bank, inv, dst});
    CpuBackend::res_mix(cur, w, bank, inv, nb, bt, n, d, eps, dst);
  }
  void bank_append(const float* src, int64_t n, int64_t d, float eps, float* be, float* ie) override {
    Op o(this, "bank_append", {src, be, ie});
    CpuBackend::bank_append(src, n, d, eps, be, ie);
  }
  void store_cache_rows(const float* src, int64_t ld, const BatchEntry* e, int64_t n, const CacheRows& r) override {
    Op o(this, "store_cache_rows", {src, r.data});
    CpuBackend::store_cache_rows(src, ld, e, n, r);
  }
  void mla_absorb_queries(const MatView& kb, uint64_t sb, const float* q, int64_t n, int64_t H, int64_t nope,
                          int64_t pe, float* qc) override {
    Op o(this, "mla_absorb_queries", {kb.data, q, qc});
    CpuBackend::mla_absorb_queries(kb, sb, q, n, H, nope, pe, qc);
  }
  void mla_attention(const CacheRows& lat, int64_t kvl, const BatchEntry* e, int64_t n, int64_t H, const float* qc,
                     const int32_t* si, const int32_t* sn, int64_t cap, float scale, AttnPath path,
                     float* z) override {
    Op o(this, "mla_attention", {lat.data, qc, cap ? si : nullptr, sn, z});
    CpuBackend::mla_attention(lat, kvl, e, n, H, qc, si, sn, cap, scale, path, z);
  }
  void mla_value_heads(const MatView& vb, uint64_t sb, const float* z, int64_t n, int64_t H, float* out) override {
    Op o(this, "mla_value_heads", {vb.data, z, out});
    CpuBackend::mla_value_heads(vb, sb, z, n, H, out);
  }
  void indexer_scores(const CacheRows& k, int32_t seq, const float* q, const float* w, int64_t h, int64_t nv,
                      float* s) override {
    Op o(this, "indexer_scores", {k.data, q, w, s});
    CpuBackend::indexer_scores(k, seq, q, w, h, nv, s);
  }
  void indexer_topk(const float* s, int64_t n, int64_t k, int32_t* sel, int32_t* sn, float* tmp) override {
    Op o(this, "indexer_topk", {s, sel, sn, tmp});
    CpuBackend::indexer_topk(s, n, k, sel, sn, tmp);
  }
  void indexer_select(const CacheRows& k, const BatchEntry* e, int64_t n, const float* q, const float* w, int64_t h,
                      int64_t top_k, int32_t* sel, int64_t cap, int32_t* sn, float* s, float* tmp) override {
    Op o(this, "indexer_select", {k.data, q, w, sel, sn, s, tmp});
    CpuBackend::indexer_select(k, e, n, q, w, h, top_k, sel, cap, sn, s, tmp);
  }
  void kda_conv_silu(const float* const w[3], int64_t K, int64_t C, const SeqStates& conv, const BatchEntry* e,
                     int64_t n, float* const x[3]) override {
    Op o(this, "kda_conv_silu", {w[0], w[1], w[2], conv.data, x[0], x[1], x[2]});
    CpuBackend::kda_conv_silu(w, K, C, conv, e, n, x);
  }
  void kda_gate(float* g, const float* dtb, const float* a, int64_t n, int64_t H, int64_t D,
                const KdaGateParams& p) override {
    Op o(this, "kda_gate", {g, dtb, a});
    CpuBackend::kda_gate(g, dtb, a, n, H, D, p);
  }
  void kda_scan(const SeqStates& rec, const BatchEntry* e, int64_t n, int64_t H, int64_t D, const float* q,
                const float* k, const float* v, const float* g, const float* beta, float scale, float* out) override {
    Op o(this, "kda_scan", {rec.data, q, k, v, g, beta, out});
    CpuBackend::kda_scan(rec, e, n, H, D, q, k, v, g, beta, scale, out);
  }
  void moe_route(float* lg, const float* bias, int64_t n, const RouterParams& p, float* pr, int32_t* sel,
                 float* w) override {
    Op o(this, "moe_route", {lg, bias, pr, sel, w});
    CpuBackend::moe_route(lg, bias, n, p, pr, sel, w);
  }
  void moe_experts(const ExpertMats& m, const float* x, int64_t n, int64_t width, const int32_t* sel, const float* w,
                   int64_t k, int64_t E, float b, float l, float* acc) override {
    Op o(this, "moe_experts", {m.gate.data, m.up.data, m.down.data, x, sel, w, acc});
    CpuBackend::moe_experts(m, x, n, width, sel, w, k, E, b, l, acc);
  }

 private:
  // dev1 memory is accessible only while one of its own calls runs
  struct Open {
    explicit Open(FakeDevice*) {
      if (g_open++ == 0) protect(PROT_READ | PROT_WRITE);
    }
    ~Open() {
      if (--g_open == 0) protect(PROT_NONE);
    }
  };
  struct Op : Open {
    Op(FakeDevice* f, const char* what, std::initializer_list<const void*> ptrs) : Open(f) {
      ++f->n_ops;
      for (const void* p : ptrs)
        if (p) f->own(p, what);
    }
  };
  static void protect(int prot) {
    if (g_used) ::mprotect(g_arena, (g_used + 4095) / 4096 * 4096, prot);
  }
  void* take(uint64_t bytes) {
    const uint64_t at = (g_used + 63) / 64 * 64;
    if (at + bytes > kArenaBytes) {
      ADD_FAILURE() << "dev1 arena full";
      std::abort();
    }
    g_used = at + bytes + 64;  // a gap between allocations
    if (g_open > 0) protect(PROT_READ | PROT_WRITE);  // the new range too
    return g_arena + at;
  }
  void own(const void* p, const char* op) const {
    const auto* a = static_cast<const uint8_t*>(p);
    if (!(a >= g_arena + base_ && a < g_arena + g_used)) {
      std::fprintf(stderr, "FAIL: dev1 op '%s' got a pointer that is not dev1 memory (a missing copy)\n", op);
      std::abort();
    }
  }
  uint64_t base_ = 0;
  std::vector<std::string> tags_;  // what each allocation holds, in order
};

void expect_same(const Run& a, const Run& b, const std::string& what) {
  ASSERT_EQ(a.logits.size(), b.logits.size()) << what;
  for (size_t i = 0; i < a.logits.size(); ++i)
    ASSERT_EQ(0, std::memcmp(a.logits[i].data(), b.logits[i].data(), a.logits[i].size() * 4))
        << what << ": logits row " << i << " differ";
}

struct Split {
  const char* what;
  PlacementRules rules;
  int want_uploads_min;  // copies expected (at least one residual move per ubatch when split)
};

std::vector<Split> splits() {
  std::vector<Split> v;
  PlacementRules r;
  r.n_gpu_layers = 4;  // layers 4..7 on dev1, head on device 0
  v.push_back({"ngl 4", r, 1});
  r = {};
  r.n_gpu_layers = -1;  // all on dev1 incl. the head, routed experts stay on device 0
  r.cpu_moe = true;
  v.push_back({"ngl all + cpu-moe", r, 1});
  r = {};
  r.n_gpu_layers = 6;  // layers 2..7 on dev1, experts of layers 0..4 on device 0
  r.n_cpu_moe = 5;
  v.push_back({"ngl 6 + n-cpu-moe 5", r, 1});
  r = {};
  // MLA layer 3 on dev1; experts of 5 and 6 on dev1 while their layers stay; FFN part of layer 2
  // on dev1 (attention on device 0); embeddings and head on dev1
  r.overrides = parse_tensor_overrides(
      "blk\\.3\\.=dev1,blk\\.[56]\\.ffn_.*_exps=1,blk\\.2\\.(ffn|exp_probs)=1,token_embd=1,^output=1");
  v.push_back({"-ot mix", r, 1});
  return v;
}

void check_splits(const Model& m, Precision prec, AttnPath path) {
  ContextOptions o;
  o.n_threads = 2;
  o.n_ctx_max = 64;
  o.n_seq_max = 2;
  o.n_batch_max = 8;
  o.precision = prec;
  o.attn = path;
  const Run ref = drive(m, o);
  ASSERT_GT(ref.logits.size(), 25u);
  for (const Split& s : splits()) {
    ThreadPool pool(2);
    FakeDevice dev1(pool, prec);
    ContextOptions os = o;
    os.placement = s.rules;
    os.extra_backends = {&dev1};
    {
      Context probe(m, os);
      EXPECT_FALSE(probe.placement().single_device()) << s.what;
      EXPECT_NE(probe.memory_summary().find("device 1 (dev1)"), std::string::npos) << s.what;
    }
    const Run got = drive(m, os);
    expect_same(ref, got, s.what);
    EXPECT_GT(dev1.n_ops, 100) << s.what << ": dev1 ran nothing";
    EXPECT_GE(dev1.n_uploads, s.want_uploads_min) << s.what;
    EXPECT_GE(dev1.n_downloads, 1) << s.what;
  }
}

}  // namespace

TEST(ModelBackendSplit, PlacementSplitsGiveIdenticalLogitsF32) {
  TinyModel t(16);
  check_splits(*t.m, Precision::F32, AttnPath::Sparse);
}

TEST(ModelBackendSplit, PlacementSplitsGiveIdenticalLogitsFast) {
  TinyModel t(16);
  check_splits(*t.m, Precision::Fast, AttnPath::Sparse);
}

TEST(ModelBackendSplit, WithoutIndexerAndDenseAttention) {
  TinyModel t(0);
  check_splits(*t.m, Precision::F32, AttnPath::Sparse);
  TinyModel t2(16);
  check_splits(*t2.m, Precision::F32, AttnPath::Dense);
}

// The checks themselves work: a dev1 op handed device-0 memory stops the process.
TEST(ModelBackendSplit, FakeDeviceRefusesForeignMemory) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  ThreadPool pool(1);
  FakeDevice dev1(pool, Precision::F32);
  auto own = dev1.alloc(64 * 4, "x");
  std::vector<float> host(64, 1.0f);
  EXPECT_DEATH(dev1.add(own->as<float>(), host.data(), 64), "not dev1 memory");
  EXPECT_DEATH(host[0] = *own->as<float>(), "");  // PROT_NONE outside dev1's own calls
  dev1.add(own->as<float>(), own->as<float>(), 64);  // its own buffers: fine
}

// Placement errors surface when the context is made, naming the rule (nothing half-built).
TEST(ModelBackendSplit, BadPlacementFailsWhenTheContextIsMade) {
  TinyModel t(16);
  ContextOptions o;
  o.n_threads = 1;
  o.n_ctx_max = 32;
  o.placement.overrides = parse_tensor_overrides("exps=gpu9");
  try {
    Context c(*t.m, o);
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("unknown device 'gpu9'"), std::string::npos) << e.what();
  }
  // without an accelerator -ngl is ignored: everything stays on the CPU
  ContextOptions ok;
  ok.n_threads = 1;
  ok.n_ctx_max = 32;
  ok.placement.n_gpu_layers = -1;
  Context c(*t.m, ok);
  EXPECT_TRUE(c.placement().single_device());
}

// --gpu-experts (model/expert_cache.h HotExperts): hybrid mode (every layer on dev1, the routed experts on
// the CPU) with the N most-picked experts of each layer also on dev1. Each MoE step splits the picks: dev1
// runs its resident experts' picks, the CPU the others, and the two sums are added. The logits agree with
// the CPU-only run (F32: the two partial sums only change the order of a few additions), every pick is run
// exactly once (counted on one side or the other), and N = all experts leaves nothing to the CPU.
TEST(ModelBackendSplit, HotExpertsSplitThePicks) {
  TinyModel t(16);
  const Model& m = *t.m;
  const HParams& hp = m.hparams();
  const int64_t E = hp.n_expert, k = hp.n_expert_used;
  ASSERT_GE(E, 4);
  ContextOptions o;
  o.n_threads = 2;
  o.n_ctx_max = 64;
  o.n_seq_max = 2;
  o.n_batch_max = 8;
  o.precision = Precision::F32;
  const kimi::test::Run ref = drive(m, o);
  // counts that rank the experts differently in every layer
  HotExpertOptions hot;
  hot.counts.resize(hp.n_layer);
  int64_t moe_layers = 0;
  for (uint32_t il = 0; il < hp.n_layer; ++il) {
    if (!hp.is_moe(il)) continue;
    ++moe_layers;
    for (int64_t e = 0; e < E; ++e) hot.counts[il].push_back(double((e * 5 + il * 3) % E));
  }
  for (int64_t per : {int64_t(1), E / 2, E, int64_t(-1)}) {
    const std::string what = "--gpu-experts " + (per < 0 ? std::string("auto") : std::to_string(per));
    ThreadPool pool(2);
    FakeDevice dev1(pool, Precision::F32);
    ContextOptions os = o;
    os.placement.n_gpu_layers = -1;
    os.placement.cpu_moe = true;
    os.extra_backends = {&dev1};
    os.stream.hot = hot;
    os.stream.hot.per_layer = per;
    const kimi::test::Run got = drive(m, os);
    ASSERT_EQ(got.logits.size(), ref.logits.size()) << what;
    for (size_t r = 0; r < ref.logits.size(); ++r) {
      double num = 0, den = 0;
      size_t a = 0, b = 0;
      for (size_t i = 0; i < ref.logits[r].size(); ++i) {
        const double x = ref.logits[r][i], y = got.logits[r][i];
        num += (x - y) * (x - y), den += x * x;
        if (ref.logits[r][i] > ref.logits[r][a]) a = i;
        if (got.logits[r][i] > got.logits[r][b]) b = i;
      }
      EXPECT_LT(std::sqrt(num / den), 1e-5) << what << ": logits row " << r;
      EXPECT_EQ(a, b) << what << ": top-1 of row " << r;
    }
    // the split's counters over one prefill of 11 tokens and 3 decoded tokens
    Context c(m, os);
    kimi::test::prefill_seq0(c, 11);
    kimi::test::decode_seq0(c, 3);
    const ExpertStreamStats s = c.expert_stream_stats();
    EXPECT_EQ(s.hot_per_layer, per < 0 ? E : per) << what;  // auto: dev1 states no memory limit
    EXPECT_EQ(s.hot_picks + s.host_picks, uint64_t(14 * k * moe_layers)) << what;
    EXPECT_GT(s.hot_picks, 0u) << what;
    if (per == 1) {
      EXPECT_GT(s.host_picks, s.hot_picks) << what;
    }
    if (per == E || per < 0) {
      EXPECT_EQ(s.host_picks, 0u) << what;
    }
    if (per == E / 2) {
      EXPECT_GT(s.host_picks, 0u) << what;
    }
  }
  // without counts the experts 0..N-1 start resident (ranked while running); with counts for the wrong expert
  // count the context refuses
  {
    ThreadPool pool(2);
    FakeDevice dev1(pool, Precision::F32);
    ContextOptions os = o;
    os.placement.n_gpu_layers = -1;
    os.placement.cpu_moe = true;
    os.extra_backends = {&dev1};
    os.stream.hot.per_layer = 2;
    EXPECT_EQ(Context(m, os).expert_stream_stats().hot_per_layer, 2);
    os.stream.hot.counts.assign(hp.n_layer, std::vector<double>(size_t(E + 1), 1.0));
    try {
      Context c(m, os);
      ADD_FAILURE() << "no error";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("expert counts of layer"), std::string::npos) << e.what();
    }
  }
}

// Overlap in hybrid mode (moe.cpp, ExpertStreamOptions::hybrid_overlap): the routed input crosses to the
// CPU first, then dev1 records the shared experts (and the hot experts' picks) and is flushed, and the CPU runs
// its routed experts meanwhile. The same products run in both orders, so the logits are the same bits with
// overlap on and off, with and without hot experts, and equal to the CPU-only run without them.
TEST(ModelBackendSplit, HybridOverlapGivesTheSameBits) {
  TinyModel t(16);
  const Model& m = *t.m;
  const HParams& hp = m.hparams();
  const int64_t E = hp.n_expert;
  int64_t moe_layers = 0;
  HotExpertOptions hot;
  hot.counts.resize(hp.n_layer);
  for (uint32_t il = 0; il < hp.n_layer; ++il) {
    if (!hp.is_moe(il)) continue;
    ++moe_layers;
    for (int64_t e = 0; e < E; ++e) hot.counts[il].push_back(double((e * 3 + il) % E));
  }
  ASSERT_GT(moe_layers, 0);
  ASSERT_GT(hp.n_expert_shared, 0u);  // the shared experts are what overlaps
  for (Precision prec : {Precision::F32, Precision::Fast}) {
    ContextOptions o;
    o.n_threads = 2;
    o.n_ctx_max = 64;
    o.n_seq_max = 2;
    o.n_batch_max = 8;
    o.precision = prec;
    const kimi::test::Run ref = drive(m, o);
    for (int64_t per : {int64_t(0), E / 2}) {
      kimi::test::Run runs[2];
      for (int on = 0; on < 2; ++on) {
        const std::string what = std::string(prec == Precision::F32 ? "f32" : "fast") + " --gpu-experts " +
                                 std::to_string(per) + " overlap " + (on ? "on" : "off");
        ThreadPool pool(2);
        FakeDevice dev1(pool, prec);
        ContextOptions os = o;
        os.placement.n_gpu_layers = -1;
        os.placement.cpu_moe = true;
        os.extra_backends = {&dev1};
        os.stream.hybrid_overlap = on != 0;
        if (per) os.stream.hot = hot, os.stream.hot.per_layer = per;
        runs[on] = drive(m, os);
        if (on) {
          // one flush per MoE layer call, each after the crossing with dev1 work recorded since it: the shared
          // experts' two products and SiTU (3 ops), and the hot experts
          EXPECT_GE(dev1.n_flushes, moe_layers) << what;
          EXPECT_GE(dev1.flushed_ops_after_download, 3 * dev1.n_flushes) << what;
          // one download per MoE step (the routed input, selection and weights side by side), besides the
          // logits of each run (fewer than the steps): three per step would be 3 x flushes
          EXPECT_LT(dev1.n_downloads, 2 * dev1.n_flushes) << what;
        } else {
          EXPECT_EQ(dev1.n_flushes, 0) << what;
        }
        if (per == 0) expect_same(ref, runs[on], what + " vs the CPU");
      }
      expect_same(runs[0], runs[1], "overlap on vs off, --gpu-experts " + std::to_string(per));
    }
  }
}

// Expert counts gathered while running (HotExperts::split counts every pick the host sees; begin_pass re-ranks
// between forward passes): picks that favor two experts per layer make exactly those two resident after the
// re-ranking, the device stacks then hold their bytes, only the changed slots are re-uploaded, and a re-ranking
// on the same counts changes nothing.
TEST(ModelBackendSplit, HotExpertsRerankByCountedPicks) {
  TinyModel t(16);
  const Model& m = *t.m;
  const HParams& hp = m.hparams();
  const int64_t E = hp.n_expert, k = hp.n_expert_used;
  ASSERT_GE(E, 6);
  ASSERT_GE(k, 2);
  ThreadPool pool(1);
  FakeDevice dev1(pool, Precision::F32);
  std::vector<uint8_t> on_host(hp.n_layer, 0);
  for (uint32_t il = 0; il < hp.n_layer; ++il) on_host[il] = hp.is_moe(il) ? 1 : 0;
  HotExpertOptions o;
  o.per_layer = 2;
  o.rerank_tokens = 8;  // no counts: experts 0 and 1 start resident; the first re-ranking after 8 tokens
  o.decay_tokens = 0;   // every pick counts 1 (the fading has its own test)
  const int64_t n_tok = 4;
  HotExperts hot(m, dev1, on_host, o, n_tok);
  // layer il favors experts E-1-il%2 and E-3 (every token picks both), the other picks rotate over the rest
  auto favored = [&](uint32_t il, int64_t e) { return e == E - 1 - int64_t(il % 2) || e == E - 3; };
  std::vector<int32_t> sel(size_t(n_tok * k));
  std::vector<float> w(size_t(n_tok * k), 0.5f);
  std::vector<std::vector<double>> want(hp.n_layer, std::vector<double>(size_t(E), 0.0));
  int64_t passes = 0, moe_layers = 0;
  for (int pass = 0; pass < 3; ++pass, ++passes) {
    hot.begin_pass(n_tok);
    EXPECT_EQ(hot.layer(1) != nullptr, hp.is_moe(1));
    for (uint32_t il = 0; il < hp.n_layer; ++il) {
      if (!hot.layer(il)) continue;
      if (pass == 0) ++moe_layers;
      for (int64_t tk = 0; tk < n_tok; ++tk) {
        int64_t j = 0;
        for (int64_t e = 0; e < E; ++e)
          if (favored(il, e)) sel[size_t(tk * k + j++)] = int32_t(e);
        for (int64_t x = pass * n_tok + tk; j < k; ++x) {  // distinct others, rotating
          const int64_t e = x % E;
          bool dup = favored(il, e);
          for (int64_t q = 0; q < j; ++q) dup = dup || sel[size_t(tk * k + q)] == e;
          if (!dup) sel[size_t(tk * k + j++)] = int32_t(e);
        }
        for (int64_t q = 0; q < k; ++q) want[il][size_t(sel[size_t(tk * k + q)])] += 1.0;
      }
      const HotExperts::Layer& h = *hot.layer(il);
      const std::vector<int32_t> before = h.expert;
      hot.split(il, sel.data(), w.data(), n_tok * k);
      for (int64_t i = 0; i < n_tok * k; ++i) {  // a resident expert's pick left the host
        if (sel[size_t(i)] >= 0) {
          EXPECT_LT(h.slot[size_t(sel[size_t(i)])], 0);
        }
      }
      EXPECT_EQ(h.expert, before);  // split never moves experts
    }
  }
  ASSERT_GT(moe_layers, 0);
  ExpertStreamStats st;
  hot.add_stats(st);
  EXPECT_EQ(st.hot_reranks, 1u);  // before the third pass (8 tokens ran)
  EXPECT_EQ(st.hot_picks + st.host_picks, uint64_t(passes * n_tok * k * moe_layers));
  for (uint32_t il = 0; il < hp.n_layer; ++il) {
    const HotExperts::Layer* h = hot.layer(il);
    if (!h) continue;
    EXPECT_EQ(hot.counts(il), want[il]) << "layer " << il;
    // resident: exactly the two most-picked experts, and the stacks hold their bytes
    for (int64_t e = 0; e < E; ++e) EXPECT_EQ(h->slot[size_t(e)] >= 0, favored(il, e)) << "layer " << il << " expert " << e;
    const LayerWeights& L = m.layer(il);
    const WeightView* wv[3] = {&L.ffn_gate_exps, &L.ffn_up_exps, &L.ffn_down_exps};
    const MatView* st3[3] = {&h->mats.gate, &h->mats.up, &h->mats.down};
    for (int64_t s = 0; s < h->n; ++s)
      for (int j = 0; j < 3; ++j) {
        const uint64_t sb = wv[j]->slice_bytes;
        std::vector<uint8_t> got(sb);
        dev1.download(got.data(), st3[j]->data + sb * uint64_t(s), sb);
        EXPECT_EQ(0, std::memcmp(got.data(), wv[j]->slice(h->expert[size_t(s)]).data, sb))
            << "layer " << il << " slot " << s << " matrix " << j;
      }
  }
  EXPECT_EQ(st.hot_reloads, uint64_t(2 * moe_layers));  // both slots of every layer changed, once
  hot.rerank();  // the same counts: nothing moves
  ExpertStreamStats st2;
  hot.add_stats(st2);
  EXPECT_EQ(st2.hot_reloads, st.hot_reloads);
  EXPECT_NE(st2.hot_summary().find("re-ranked 2 times (" + std::to_string(2 * moe_layers) + " experts re-uploaded)"),
            std::string::npos)
      << st2.hot_summary();
}

// The whole model in hybrid mode with the hot experts counted while running (no starting counts, a re-ranking
// every few tokens): the logits stay within rel RMS 1e-5 of the CPU's (F32) with top-1 equal, every pick is
// counted, and the counts written at the end (--expert-counts-out) are the picks seen, in the imatrix format
// --expert-counts reads.
TEST(ModelBackendSplit, HotExpertsCountedWhileRunningMatchCpu) {
  TinyModel t(16);
  const Model& m = *t.m;
  const HParams& hp = m.hparams();
  const int64_t k = hp.n_expert_used;
  ContextOptions o;
  o.n_threads = 2;
  o.n_ctx_max = 64;
  o.n_seq_max = 2;
  o.n_batch_max = 8;
  o.precision = Precision::F32;
  const kimi::test::Run ref = drive(m, o);
  kimi::test::TempDir d;
  ThreadPool pool(2);
  FakeDevice dev1(pool, Precision::F32);
  ContextOptions os = o;
  os.placement.n_gpu_layers = -1;
  os.placement.cpu_moe = true;
  os.extra_backends = {&dev1};
  os.stream.hot.per_layer = 2;
  os.stream.hot.rerank_tokens = 4;
  os.stream.hot.decay_tokens = 0;  // every pick counts 1: the saved sums are whole picks
  const kimi::test::Run got = drive(m, os);
  ASSERT_EQ(got.logits.size(), ref.logits.size());
  for (size_t r = 0; r < ref.logits.size(); ++r) {
    double num = 0, den = 0;
    for (size_t i = 0; i < ref.logits[r].size(); ++i) {
      const double x = ref.logits[r][i], y = got.logits[r][i];
      num += (x - y) * (x - y), den += x * x;
    }
    EXPECT_LT(std::sqrt(num / den), 1e-5) << "logits row " << r;
    EXPECT_EQ(std::max_element(got.logits[r].begin(), got.logits[r].end()) - got.logits[r].begin(),
              std::max_element(ref.logits[r].begin(), ref.logits[r].end()) - ref.logits[r].begin())
        << "top-1 of row " << r;
  }
  // counters and the saved counts over 11 prompt tokens and 5 decoded ones
  const std::string out = d.file("counts.imatrix");
  os.stream.hot.counts_out = out;
  ExpertStreamStats s;
  {
    Context c(m, os);
    kimi::test::prefill_seq0(c, 11);
    kimi::test::decode_seq0(c, 5);
    s = c.expert_stream_stats();
  }
  EXPECT_GT(s.hot_reranks, 0u);
  const imatrix::Data saved = imatrix::Data::load(out);
  int64_t moe_layers = 0;
  for (uint32_t il = 0; il < hp.n_layer; ++il) {
    if (!hp.is_moe(il)) continue;
    ++moe_layers;
    const auto it = saved.entries.find("blk." + std::to_string(il) + ".ffn_gate_exps.weight");
    ASSERT_NE(it, saved.entries.end()) << "layer " << il;
    double sum = 0;
    for (double c : it->second.count) sum += c;
    EXPECT_EQ(sum, double(16 * k)) << "layer " << il;
    EXPECT_EQ(int64_t(it->second.count.size()), hp.n_expert);
  }
  EXPECT_EQ(s.hot_picks + s.host_picks, uint64_t(16 * k * moe_layers));
  // the saved counts start the next context: its first ranking keeps their two most picked experts
  os.stream.hot.counts_out.clear();
  os.stream.hot.counts.assign(hp.n_layer, {});
  for (const auto& [name, e] : saved.entries) os.stream.hot.counts[std::stoul(name.substr(4))] = e.count;
  Context c2(m, os);
  EXPECT_EQ(c2.expert_stream_stats().hot_per_layer, 2);
}

// The counts fade with a half-life of decay_tokens: starting counts that favor expert 0 (100 picks) give way to a
// workload that picks expert E-1 in every token once they have faded below its recent picks; each count equals
// the sum of its picks weighted 2^-(age / half-life); without fading expert 0 stays (the control).
TEST(ModelBackendSplit, HotExpertCountsFade) {
  TinyModel t(16);
  const Model& m = *t.m;
  const HParams& hp = m.hparams();
  const int64_t E = hp.n_expert, k = hp.n_expert_used;
  ThreadPool pool(1);
  std::vector<uint8_t> on_host(hp.n_layer, 0);
  for (uint32_t il = 0; il < hp.n_layer; ++il) on_host[il] = hp.is_moe(il) ? 1 : 0;
  const int64_t n_tok = 4, passes = 16, half = 8;
  for (const int64_t decay : {half, int64_t(0)}) {
    SCOPED_TRACE("decay_tokens " + std::to_string(decay));
    FakeDevice dev1(pool, Precision::F32);
    HotExpertOptions o;
    o.per_layer = 1;
    o.rerank_tokens = 0;  // re-ranked by hand below
    o.decay_tokens = decay;
    o.counts.assign(hp.n_layer, std::vector<double>(size_t(E), 0.0));
    for (auto& c : o.counts) c[0] = 100.0;
    HotExperts hot(m, dev1, on_host, o, n_tok);
    std::vector<int32_t> sel(size_t(n_tok * k));
    std::vector<float> w(size_t(n_tok * k), 0.5f);
    for (int64_t p = 0; p < passes; ++p) {
      hot.begin_pass(n_tok);
      for (uint32_t il = 0; il < hp.n_layer; ++il) {
        if (!hot.layer(il)) continue;
        for (int64_t tk = 0; tk < n_tok; ++tk)
          for (int64_t q = 0; q < k; ++q) sel[size_t(tk * k + q)] = int32_t(q == 0 ? E - 1 : 1 + (tk + q) % (E - 2));
        hot.split(il, sel.data(), w.data(), n_tok * k);
      }
    }
    hot.rerank();
    // the picks of pass p were made after 4 (p + 1) of the 64 tokens: their age is 64 - 4 (p + 1)
    const double now = double(passes * n_tok);
    double want_last = 0;
    for (int64_t p = 0; p < passes; ++p)
      want_last += double(n_tok) * (decay ? std::exp2(-(now - double(n_tok * (p + 1))) / double(decay)) : 1.0);
    const double want_first = 100.0 * (decay ? std::exp2(-now / double(decay)) : 1.0);
    int64_t layers = 0;
    for (uint32_t il = 0; il < hp.n_layer; ++il) {
      const HotExperts::Layer* h = hot.layer(il);
      if (!h) continue;
      ++layers;
      const std::vector<double> c = hot.counts(il);
      EXPECT_NEAR(c[0], want_first, 1e-9 * want_first) << "layer " << il;
      EXPECT_NEAR(c[size_t(E - 1)], want_last, 1e-9 * want_last) << "layer " << il;
      EXPECT_EQ(h->expert[0], decay ? E - 1 : 0) << "layer " << il;
    }
    EXPECT_GT(layers, 0);
  }
}

// Hybrid decode with hot experts counted and re-ranked every 4 tokens, overlap on: after a warm-up, 24
// single-token decode steps (6 re-rankings among them) make no heap allocation.
TEST(ModelBackendSplit, HotExpertsRerankingDecodeLoopDoesNotAllocate) {
  TinyModel t(16);
  ThreadPool pool(2);
  FakeDevice dev1(pool, Precision::F32);
  ContextOptions o;
  o.n_threads = 2;
  o.n_ctx_max = 64;
  o.n_seq_max = 1;
  o.n_batch_max = 8;
  o.precision = Precision::F32;
  o.placement.n_gpu_layers = -1;
  o.placement.cpu_moe = true;
  o.extra_backends = {&dev1};
  o.stream.hot.per_layer = 2;
  o.stream.hot.rerank_tokens = 4;
  Context c(*t.m, o);
  Batch b;
  // past the indexer's top-k (16): its first selecting step grows a buffer once
  b.add_sequence({1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20}, 0, 0, true);
  c.decode(b);
  b.clear();
  b.add(21, 0, c.seq_len(0), true);
  c.decode(b);  // warm-up at batch size 1
  const ExpertStreamStats s0 = c.expert_stream_stats();
  const long before = g_allocs.load();
  for (int i = 0; i < 24; ++i) {
    b.entries[0].token = 100 + i;
    b.entries[0].pos = c.seq_len(0);
    c.decode(b);
    ASSERT_NE(c.logits(0), nullptr);
  }
  const long allocs = g_allocs.load() - before;
  const ExpertStreamStats s1 = c.expert_stream_stats();
  EXPECT_EQ(allocs, 0);
  EXPECT_EQ(s1.hot_reranks - s0.hot_reranks, 6u);
  std::printf("[ hot experts, re-rank every 4 tokens ] 24 decode steps: %llu re-rankings, %llu experts re-uploaded, %ld "
              "allocations\n",
              (unsigned long long)(s1.hot_reranks - s0.hot_reranks), (unsigned long long)(s1.hot_reloads - s0.hot_reloads),
              allocs);
}
