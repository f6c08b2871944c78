// The whole model on the Vulkan backend (lavapipe in CI) against the CPU backend in f32: tiny
// model logits for every placement (everything on the GPU, hybrid with the routed experts on the
// CPU, a layer split) within rel RMS 1e-4 with the same top-1 token; on the GPU, DSA with
// top-k >= context equals no indexer and the sparse kernel equals the dense masked path; greedy
// generation equals the CPU's token for token; command-buffer replay equals fresh recording bit for
// bit, and steady decode steps are replayed.
#include <gtest/gtest.h>

#include <atomic>
#include <cmath>
#include <cstdlib>
#include <new>
#include <string>
#include <vector>

#include "backend/vulkan/vulkan_backend.h"
#include "backend_workload.h"
#include "unit/vulkan_fixture.h"

#include "count_allocs.h"

using namespace kimi;
using kimi::test::drive;

using kimi::test::TinyModel;

namespace {

class ModelVulkan : public ::testing::Test {
 protected:
  void SetUp() override {
    const int dev = test::first_vulkan_device();
    if (dev < 0) {
      if (test::vulkan_required()) FAIL() << "no usable Vulkan device, but KIMI_REQUIRE_VULKAN=1 / CI=true";
      GTEST_SKIP() << "no Vulkan device on this machine: Vulkan model tests skipped";
    }
    gpu_ = make_vulkan_backend(dev, Precision::F32);
  }
  ContextOptions base(Precision prec = Precision::F32) const {
    ContextOptions o;
    o.n_threads = 2;
    o.n_ctx_max = 64;
    o.n_seq_max = 2;
    o.n_batch_max = 8;
    o.precision = prec;
    return o;
  }
  ContextOptions on_gpu(ContextOptions o, const PlacementRules& r) const {
    o.placement = r;
    o.extra_backends = {gpu_.get()};
    return o;
  }
  std::unique_ptr<Backend> gpu_;
};

double row_rel_rms(const std::vector<float>& got, const std::vector<float>& want) {
  return test::rel_rms(got, want);
}
int argmax(const std::vector<float>& v) { return static_cast<int>(std::max_element(v.begin(), v.end()) - v.begin()); }

void expect_close(const test::Run& want, const test::Run& got, const std::string& what, double tol = 1e-4, bool top1 = true) {
  ASSERT_EQ(want.logits.size(), got.logits.size()) << what;
  double worst = 0;
  for (size_t i = 0; i < want.logits.size(); ++i) {
    const double e = row_rel_rms(got.logits[i], want.logits[i]);
    worst = std::max(worst, e);
    EXPECT_LT(e, tol) << what << ": logits row " << i;
    if (top1) {
      EXPECT_EQ(argmax(got.logits[i]), argmax(want.logits[i])) << what << ": top-1 of row " << i;
    }
  }
  std::printf("[ %s ] %zu logits rows, worst rel RMS vs CPU f32 %.3g\n", what.c_str(), want.logits.size(), worst);
}

PlacementRules full_gpu() {  // every layer, the head and the embeddings on device 1
  PlacementRules r;
  r.n_gpu_layers = -1;
  r.overrides = parse_tensor_overrides("token_embd=vulkan");
  return r;
}

}  // namespace

TEST_F(ModelVulkan, LogitsMatchCpuForEveryPlacement) {
  for (int top_k : {16, 0}) {
    TinyModel t(top_k);
    const test::Run ref = drive(*t.m, base());
    ASSERT_GT(ref.logits.size(), 25u);
    PlacementRules hybrid = full_gpu();
    hybrid.cpu_moe = true;
    PlacementRules layers;
    layers.n_gpu_layers = 4;
    PlacementRules part;  // experts of layers 5-6 only on the GPU, layer 3 (MLA) whole on the GPU
    part.overrides = parse_tensor_overrides("blk\\.3\\.=vulkan,blk\\.[56]\\.ffn_.*_exps=vulkan");
    const std::string k = top_k ? " (indexer on)" : " (no indexer)";
    expect_close(ref, drive(*t.m, on_gpu(base(), full_gpu())), "full GPU" + k);
    expect_close(ref, drive(*t.m, on_gpu(base(), hybrid)), "GPU + routed experts on the CPU" + k);
    expect_close(ref, drive(*t.m, on_gpu(base(), layers)), "last 4 layers on the GPU" + k);
    expect_close(ref, drive(*t.m, on_gpu(base(), part)), "-ot mix" + k);
  }
}

// On the GPU: the sparse kernel equals the dense masked path, and top-k >= context equals the
// model without the indexer (everything selected).
TEST_F(ModelVulkan, SparseEqualsDenseAndFullTopKEqualsNoIndexer) {
  TinyModel t(16);
  ContextOptions sparse = on_gpu(base(), full_gpu());
  ContextOptions dense = sparse;
  dense.attn = AttnPath::Dense;
  const test::Run a = drive(*t.m, sparse), b = drive(*t.m, dense);
  expect_close(a, b, "GPU sparse vs dense", 1e-6);
  ContextOptions all = sparse, off = sparse;
  all.attn_top_k = 64;  // = n_ctx: every visible row selected
  off.attn_top_k = 0;
  expect_close(drive(*t.m, off), drive(*t.m, all), "GPU top-k >= context vs no indexer", 1e-6);
}

// The prefill kernels in the whole model: with the GEMM switch at 2 tokens (KIMI_VULKAN_GEMM_MIN=2)
// every micro-batch of the workload runs the tiled GEMM and the routed experts grouped per expert
// (decode steps of one token keep the row kernel); logits within rel RMS 1e-4 of the CPU, same top-1.
TEST_F(ModelVulkan, TiledGemmAndGroupedExpertsMatchCpu) {
  TinyModel t(16);
  ::setenv("KIMI_VULKAN_GEMM_MIN", "2", 1);
  gpu_ = make_vulkan_backend(test::first_vulkan_device(), Precision::F32);
  ::unsetenv("KIMI_VULKAN_GEMM_MIN");
  expect_close(drive(*t.m, base()), drive(*t.m, on_gpu(base(), full_gpu())), "full GPU, GEMM from 2 tokens");
}

// Fast precision on the GPU: f32 math with F16 caches, so within the caches' rounding of the CPU's
// f32 logits. (The CPU's fast path also rounds activations to bf16 / Q8_0: on this tiny random
// model it moves logits by up to ~1 rel RMS, so it is no reference for the GPU.)
TEST_F(ModelVulkan, FastPrecisionCloseToCpu) {
  TinyModel t(16);
  gpu_ = make_vulkan_backend(test::first_vulkan_device(), Precision::Fast);
  const test::Run got = drive(*t.m, on_gpu(base(Precision::Fast), full_gpu()));
  expect_close(drive(*t.m, base(Precision::F32)), got, "fast GPU vs f32 CPU", 1e-2, false);
}

// Greedy generation: the same tokens as the CPU, decode step by step.
TEST_F(ModelVulkan, GreedyGenerationIdentical) {
  TinyModel t(16);
  auto generate = [&](const ContextOptions& o) { return test::greedy(*t.m, o); };
  const auto want = generate(base());
  EXPECT_EQ(generate(on_gpu(base(), full_gpu())), want);
  PlacementRules hybrid = full_gpu();
  hybrid.cpu_moe = true;
  EXPECT_EQ(generate(on_gpu(base(), hybrid)), want);
}

// The default placement fits the device: a budget smaller than the model moves the routed
// experts to the CPU first.
TEST_F(ModelVulkan, AutoFitPlacesWhatFits) {
  TinyModel t(16);
  ContextOptions o = base();
  o.placement.n_gpu_layers = -1;
  o.placement.auto_fit = true;
  o.extra_backends = {gpu_.get()};
  Context c(*t.m, o);
  // lavapipe's "device memory" is system RAM: the tiny model fits whole
  EXPECT_NE(c.memory_summary().find("everything the rules place there fits"), std::string::npos) << c.memory_summary();
  EXPECT_EQ(c.placement().experts[1], 1);
  // with a budget below the model the experts go first (fit_to_memory directly)
  std::vector<TensorBytes> tb;
  uint64_t total = 0, experts = 0;  // bytes -ngl -1 places on the device, of which routed experts
  for (const auto& ti : t.m->reader().tensors()) {
    tb.push_back({ti.name, ti.nbytes});
    if (ti.name.rfind("token_embd", 0) != 0) total += ti.nbytes;  // -ngl -1 places all but the input
    if (ti.name.find("_exps") != std::string::npos) experts += ti.nbytes;
  }
  std::string why;
  PlacementRules r;
  r.n_gpu_layers = -1;
  const std::vector<std::string> devs{"cpu", "vulkan:0"};
  PlacementRules fit = fit_to_memory(r, devs, tb, t.m->hparams().n_layer, total - experts / 2, 0, &why);
  EXPECT_TRUE(fit.cpu_moe) << why;
  EXPECT_EQ(fit.n_gpu_layers, -1) << why;
  fit = fit_to_memory(r, devs, tb, t.m->hparams().n_layer, (total - experts) / 2, 0, &why);
  EXPECT_TRUE(fit.cpu_moe);
  EXPECT_GT(fit.n_gpu_layers, 0) << why;
  EXPECT_LT(fit.n_gpu_layers, static_cast<int>(t.m->hparams().n_layer)) << why;
}

// The decode loop allocates nothing on the host with the GPU either (full and hybrid): after a
// warm-up, single-token decodes make no operator new call (the staging ring, command buffer,
// pipelines and scratch are reused; the driver's own C allocations are not counted).
TEST_F(ModelVulkan, DecodeLoopDoesNotAllocate) {
  TinyModel t(16);
  PlacementRules hybrid = full_gpu();
  hybrid.cpu_moe = true;
  for (const PlacementRules& r : {full_gpu(), hybrid}) {
    ContextOptions o = on_gpu(base(), r);
    o.n_seq_max = 1;
    Context c(*t.m, o);
    Batch b;
    b.add_sequence({1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20}, 0, 0, true);
    c.decode(b);
    b.clear();
    b.add(21, 0, c.seq_len(0), true);
    c.decode(b);  // warm-up at batch size 1
    const long before = g_allocs.load();
    const uint64_t replayed_before = gpu_->stats().cmd_replayed;
    for (int i = 0; i < 24; ++i) {  // crosses top_k = 16: the indexer selects
      b.entries[0].token = 100 + i;
      b.entries[0].pos = c.seq_len(0);
      c.decode(b);
      ASSERT_NE(c.logits(0), nullptr);
    }
    EXPECT_EQ(g_allocs.load() - before, 0) << (r.cpu_moe ? "hybrid" : "full GPU");
    // and the steady decode steps were replayed: every submission of the 24 steps but the first few
    const BackendStats st = gpu_->stats();
    EXPECT_GE(st.cmd_replayed - replayed_before, 24u) << (r.cpu_moe ? "hybrid" : "full GPU");
  }
}

// Replayed command buffers equal freshly recorded ones: the whole workload (prefill over several
// micro-batches, interleaved sequences, snapshot + truncate, sequence copy) and 24 greedy decode
// steps, full GPU and hybrid, give bit-identical logits with replay on and off
// (KIMI_VULKAN_REPLAY=0 records every submission), and the steady decode steps are replays.
TEST_F(ModelVulkan, ReplayEqualsFreshRecording) {
  TinyModel t(16);
  ::setenv("KIMI_VULKAN_REPLAY", "0", 1);
  auto fresh = make_vulkan_backend(test::first_vulkan_device(), Precision::F32);
  ::unsetenv("KIMI_VULKAN_REPLAY");
  auto with_be = [](ContextOptions o, Backend* be) {
    o.extra_backends = {be};
    return o;
  };
  {
    const test::Run a = drive(*t.m, with_be(on_gpu(base(), full_gpu()), gpu_.get()));
    const test::Run b = drive(*t.m, with_be(on_gpu(base(), full_gpu()), fresh.get()));
    ASSERT_EQ(a.logits.size(), b.logits.size());
    for (size_t i = 0; i < a.logits.size(); ++i) EXPECT_EQ(a.logits[i], b.logits[i]) << "workload logits row " << i;
  }
  // greedy decode: every step's whole logits row
  auto generate = [&](ContextOptions o, Backend& be, std::vector<std::vector<float>>* rows) {
    o.extra_backends = {&be};
    return test::greedy(*t.m, o, 24, rows);
  };
  PlacementRules hybrid = full_gpu();
  hybrid.cpu_moe = true;
  for (const PlacementRules& r : {full_gpu(), hybrid}) {
    const char* what = r.cpu_moe ? "hybrid" : "full GPU";
    const BackendStats s0 = gpu_->stats(), f0 = fresh->stats();
    std::vector<std::vector<float>> ra, rb;
    const auto ta = generate(on_gpu(base(), r), *gpu_, &ra);
    const auto tb = generate(on_gpu(base(), r), *fresh, &rb);
    EXPECT_EQ(ta, tb) << what;
    ASSERT_EQ(ra.size(), rb.size());
    for (size_t i = 0; i < ra.size(); ++i) EXPECT_EQ(ra[i], rb[i]) << what << ": decode step " << i;
    const BackendStats s1 = gpu_->stats(), f1 = fresh->stats();
    // 23 decode steps after the prompt: all but the first step (and the step that crosses the
    // indexer's top-k, where the command stream changes) replay every submission
    EXPECT_GE(s1.cmd_replayed - s0.cmd_replayed, 20u) << what;
    EXPECT_LT(s1.cmd_recorded - s0.cmd_recorded, f1.cmd_recorded - f0.cmd_recorded) << what;
    EXPECT_EQ(f1.cmd_replayed, 0u) << what << ": KIMI_VULKAN_REPLAY=0 records every submission";
    std::printf("[ %s ] 24 greedy steps: replay on %llu recorded + %llu replayed (%.2f ms recording), off %llu "
                "recorded (%.2f ms)\n",
                what, static_cast<unsigned long long>(s1.cmd_recorded - s0.cmd_recorded),
                static_cast<unsigned long long>(s1.cmd_replayed - s0.cmd_replayed),
                1e3 * (s1.record_seconds - s0.record_seconds),
                static_cast<unsigned long long>(f1.cmd_recorded - f0.cmd_recorded),
                1e3 * (f1.record_seconds - f0.record_seconds));
  }
}
