// Prefill offload in hybrid mode (model/expert_offload.h, docs/gpu.md "Prefill offload") on the Vulkan
// backend (lavapipe in CI): the tiny model with every layer on the GPU and the routed experts on the CPU,
// the host's picks of micro-batches of >= 2 tokens run on the GPU from experts uploaded chunk by chunk
// (3 experts per pool half: up to 3 chunks per step, both halves used) against the CPU backend in f32 —
// logits within rel RMS 1e-4 and top-1 equal, offload forced on and off, alone and with --gpu-experts;
// every prefill pick counted offloaded, no decode step offloaded; greedy generation identical; the decode
// loop allocates nothing with the offload on. Then the `kimi` program: -v prints the choice, bench reports
// the uploaded bytes and offloaded picks, a threshold of 1 is refused.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <new>
#include <string>
#include <vector>

#include "backend/vulkan/vulkan_backend.h"
#include "backend_workload.h"
#include "unit/vulkan_fixture.h"

#include "count_allocs.h"

using namespace kimi;
using kimi::test::TinyModel;

namespace {

constexpr int64_t kBatch = 8;

class ModelVulkanOffload : public ::testing::Test {
 protected:
  void SetUp() override {
    const int dev = test::first_vulkan_device();
    if (dev < 0) {
      if (test::vulkan_required()) FAIL() << "no usable Vulkan device, but KIMI_REQUIRE_VULKAN=1 / CI=true";
      GTEST_SKIP() << "no Vulkan device on this machine: Vulkan model tests skipped";
    }
    gpu_ = make_vulkan_backend(dev, Precision::F32);
  }
  static ContextOptions cpu() {
    ContextOptions o;
    o.n_threads = 2;
    o.n_ctx_max = 64;
    o.n_seq_max = 2;
    o.n_batch_max = kBatch;
    o.precision = Precision::F32;
    return o;
  }
  // every layer, the head and the embeddings on the GPU, the routed experts on the CPU
  ContextOptions hybrid(ExpertOffloadOptions::Mode mode, int64_t pool_bytes) const {
    ContextOptions o = cpu();
    o.placement.n_gpu_layers = -1;
    o.placement.overrides = parse_tensor_overrides("token_embd=vulkan");
    o.placement.cpu_moe = true;
    o.extra_backends = {gpu_.get()};
    o.stream.offload.mode = mode;
    o.stream.offload.min_tokens = 2;
    o.stream.offload.pool_bytes = pool_bytes;
    return o;
  }
  std::unique_ptr<Backend> gpu_;
};

// a pool of two halves of c experts of layer L (the layout of ExpertOffload: three stacks, 256-aligned)
int64_t pool_for(const Model& m, int64_t c) {
  uint64_t half = 0;
  for (uint32_t il = 0; il < m.hparams().n_layer; ++il) {
    if (!m.hparams().is_moe(il)) continue;
    const LayerWeights& L = m.layer(il);
    half = 0;
    for (uint64_t s : {L.ffn_gate_exps.slice_bytes, L.ffn_up_exps.slice_bytes, L.ffn_down_exps.slice_bytes})
      half += (uint64_t(c) * s + 255) / 256 * 256;
  }
  return int64_t(2 * half);
}

uint64_t expert_bytes(const Model& m) {
  for (uint32_t il = 0; il < m.hparams().n_layer; ++il)
    if (m.hparams().is_moe(il))
      return m.layer(il).ffn_gate_exps.slice_bytes + m.layer(il).ffn_up_exps.slice_bytes +
             m.layer(il).ffn_down_exps.slice_bytes;
  return 0;
}

int64_t moe_layers(const Model& m) {
  int64_t n = 0;
  for (uint32_t il = 0; il < m.hparams().n_layer; ++il) n += m.hparams().is_moe(il);
  return n;
}

struct Result {
  std::vector<std::vector<float>> logits;
  ExpertStreamStats prefill, decode;  // counters of the micro-batches of >= 2 tokens / of 1 token
  int64_t prefill_tokens = 0;         // tokens in micro-batches of >= 2 tokens
};

// prefill 21 tokens (micro-batches of 8, 8, 5), 4 single-token decodes, a batch of seq 1's 5-token
// prefill with one seq 0 token, a truncate + decode: every logits row, the counters split by batch size
Result drive(const Model& m, const ContextOptions& o) {
  Context c(m, o);
  Result r;
  const int V = c.n_vocab();
  Batch b;
  auto step = [&]() {
    const ExpertStreamStats before = c.expert_stream_stats();
    c.decode(b);
    const ExpertStreamStats d = c.expert_stream_stats().minus(before);
    if (b.size() >= 2) {
      r.prefill.add(d);
      r.prefill_tokens += int64_t(b.size());
    } else {
      r.decode.add(d);
    }
    for (size_t i = 0; i < b.size(); ++i)
      if (b.entries[i].want_logits) r.logits.emplace_back(c.logits(i), c.logits(i) + V);
  };
  std::vector<int32_t> p0;
  for (int i = 0; i < 21; ++i) p0.push_back((i * 37 + 5) % V);
  // one micro-batch per decode() call here: the prompt in chunks of 8 (the context cuts bigger ones)
  for (size_t at = 0; at < p0.size(); at += kBatch) {
    b.clear();
    for (size_t i = at; i < std::min(p0.size(), at + kBatch); ++i) b.add(p0[i], 0, int32_t(i), true);
    step();
  }
  c.seq_snapshot(0);
  for (int i = 0; i < 4; ++i) {
    b.clear();
    b.add((i * 11 + 3) % V, 0, c.seq_len(0), true);
    step();
  }
  b.clear();
  for (int i = 0; i < 5; ++i) b.add((i * 53 + 7) % V, 1, i, i == 4);
  b.add(17, 0, c.seq_len(0), true);
  step();
  c.seq_truncate(0, 21);
  b.clear();
  b.add(99, 0, 21, true);
  step();
  return r;
}

void expect_close(const Result& want, const Result& got, const std::string& what) {
  ASSERT_EQ(want.logits.size(), got.logits.size()) << what;
  double worst = 0;
  for (size_t i = 0; i < want.logits.size(); ++i) {
    const double e = test::rel_rms(got.logits[i], want.logits[i]);
    worst = std::max(worst, e);
    EXPECT_LT(e, 1e-4) << what << ": logits row " << i;
    const auto& a = want.logits[i];
    const auto& g = got.logits[i];
    EXPECT_EQ(std::max_element(a.begin(), a.end()) - a.begin(), std::max_element(g.begin(), g.end()) - g.begin())
        << what << ": top-1 of row " << i;
  }
  std::printf("[ %s ] %zu logits rows, worst rel RMS vs CPU f32 %.3g\n", what.c_str(), want.logits.size(), worst);
}

}  // namespace

TEST_F(ModelVulkanOffload, ForcedOnAndOffMatchCpu) {
  TinyModel t(16);
  const Model& m = *t.m;
  const int64_t k = m.hparams().n_expert_used, layers = moe_layers(m);
  const uint64_t eb = expert_bytes(m);
  const Result ref = drive(m, cpu());
  ASSERT_EQ(ref.logits.size(), 21u + 4 + 2 + 1);

  // forced on, 3 experts per pool half: every host pick of the 27 prefill tokens ran on the GPU (k per
  // token and MoE layer), none of the single-token steps; whole experts uploaded, several chunks a step
  const Result on = drive(m, hybrid(ExpertOffloadOptions::Mode::On, pool_for(m, 3)));
  expect_close(ref, on, "offload on, 3 experts per chunk");
  EXPECT_EQ(on.prefill_tokens, 27);
  EXPECT_EQ(on.prefill.offload_picks, uint64_t(on.prefill_tokens * k * layers));
  EXPECT_EQ(on.prefill.offload_steps, uint64_t(4 * layers));
  EXPECT_GT(on.prefill.offload_chunks, on.prefill.offload_steps);
  EXPECT_EQ(on.prefill.offload_bytes % eb, 0u);
  EXPECT_GT(on.prefill.offload_bytes, 0u);
  EXPECT_LE(on.prefill.offload_bytes, on.prefill.offload_steps * uint64_t(m.hparams().n_expert) * eb);
  EXPECT_EQ(on.decode.offload_steps + on.decode.offload_picks + on.decode.offload_bytes, 0u);
  EXPECT_NE(on.prefill.offload_plan.find("on for micro-batches >= 2 tokens"), std::string::npos)
      << on.prefill.offload_plan;

  // a pool for every expert (one chunk a step) and the default pool give the same logits
  expect_close(ref, drive(m, hybrid(ExpertOffloadOptions::Mode::On, -1)), "offload on, auto pool");

  // split steps: the 3 most-picked experts of each step on the GPU, the CPU runs the others at the same time
  ContextOptions split = hybrid(ExpertOffloadOptions::Mode::On, pool_for(m, 2));
  split.stream.offload.max_experts = 3;
  const Result sp = drive(m, split);
  expect_close(ref, sp, "offload on, at most 3 experts a step, the rest on the CPU");
  EXPECT_GT(sp.prefill.offload_split_steps, 0u);
  EXPECT_GT(sp.prefill.offload_picks, 0u);
  EXPECT_LT(sp.prefill.offload_picks, on.prefill.offload_picks);
  EXPECT_LE(sp.prefill.offload_bytes, sp.prefill.offload_steps * 3 * eb);

  // forced off: nothing offloaded
  const Result off = drive(m, hybrid(ExpertOffloadOptions::Mode::Off, -1));
  expect_close(ref, off, "offload off");
  EXPECT_EQ(off.prefill.offload_picks + off.prefill.offload_steps + off.prefill.offload_bytes, 0u);

  // with hot experts (3 per layer resident): their picks stay theirs, the others are offloaded
  ContextOptions hot = hybrid(ExpertOffloadOptions::Mode::On, pool_for(m, 2));
  hot.stream.hot.per_layer = 3;
  hot.stream.hot.counts.resize(m.hparams().n_layer);
  for (uint32_t il = 0; il < m.hparams().n_layer; ++il)
    for (int64_t e = 0; e < m.hparams().n_expert; ++e)
      hot.stream.hot.counts[il].push_back(double((e * 5 + il) % m.hparams().n_expert));
  const Result both = drive(m, hot);
  expect_close(ref, both, "offload on + 3 hot experts per layer");
  EXPECT_GT(both.prefill.hot_picks, 0u);
  EXPECT_GT(both.prefill.offload_picks, 0u);
  EXPECT_EQ(both.prefill.hot_picks + both.prefill.offload_picks, uint64_t(both.prefill_tokens * k * layers));
  EXPECT_EQ(both.decode.offload_picks, 0u);
  EXPECT_GT(both.decode.host_picks, 0u);
}

// auto: the probe measured every rate it decides with; each eligible step ran either offloaded or on the CPU
TEST_F(ModelVulkanOffload, AutoMeasuresAndDecides) {
  TinyModel t(16);
  const Model& m = *t.m;
  const Result ref = drive(m, cpu());
  const Result a = drive(m, hybrid(ExpertOffloadOptions::Mode::Auto, -1));
  expect_close(ref, a, "offload auto");
  EXPECT_EQ(a.prefill.offload_steps + a.prefill.offload_declined, uint64_t(4 * moe_layers(m)));
  EXPECT_EQ(a.decode.offload_steps + a.decode.offload_declined, 0u);
  for (const char* s : {"auto for micro-batches >= 2 tokens", "GB/s of experts read", "per pick; upload", " -> "})
    EXPECT_NE(a.prefill.offload_plan.find(s), std::string::npos) << s << " in " << a.prefill.offload_plan;
  std::printf("%s\n", a.prefill.offload_plan.c_str());
}

TEST_F(ModelVulkanOffload, GreedyGenerationIdentical) {
  TinyModel t(16);
  auto generate = [&](const ContextOptions& o) { return test::greedy(*t.m, o); };
  const auto want = generate(cpu());
  EXPECT_EQ(generate(hybrid(ExpertOffloadOptions::Mode::On, pool_for(*t.m, 3))), want);
  EXPECT_EQ(generate(hybrid(ExpertOffloadOptions::Mode::Off, -1)), want);
}

// With the offload on, the decode loop allocates nothing (a prefill offloaded first, then single tokens).
TEST_F(ModelVulkanOffload, DecodeLoopDoesNotAllocate) {
  TinyModel t(16);
  for (auto mode : {ExpertOffloadOptions::Mode::On, ExpertOffloadOptions::Mode::Off}) {
    ContextOptions o = hybrid(mode, pool_for(*t.m, 3));
    o.n_seq_max = 1;
    Context c(*t.m, o);
    Batch b;
    b.add_sequence({1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20}, 0, 0, true);
    c.decode(b);
    EXPECT_EQ(c.expert_stream_stats().offload_picks > 0, mode == ExpertOffloadOptions::Mode::On);
    b.clear();
    b.add(21, 0, c.seq_len(0), true);
    c.decode(b);  // warm-up at batch size 1
    const long before = g_allocs.load();
    for (int i = 0; i < 24; ++i) {
      b.entries[0].token = 100 + i;
      b.entries[0].pos = c.seq_len(0);
      c.decode(b);
      ASSERT_NE(c.logits(0), nullptr);
    }
    EXPECT_EQ(g_allocs.load() - before, 0) << (mode == ExpertOffloadOptions::Mode::On ? "offload on" : "offload off");
  }
}

// The program: -v prints the choice, bench reports what was offloaded and uploaded, eval's logits as the
// CPU's; a threshold of 1 token is refused with the option's name.
TEST_F(ModelVulkanOffload, ProgramReportsTheOffload) {
  test::TempDir d;
  const std::string g = test::tiny_gguf();
  std::string toks;
  for (int i = 0; i < 24; ++i) toks += (i ? "," : "") + std::to_string((i * 97 + 13) % 1000);
  auto eval = [&](const std::string& flags, const std::string& out) {
    const auto r = test::run_kimi("eval -m " + g + " --tokens " + toks + " --all-logits --precision f32 --logits-out " +
                                  d.file(out) + " " + flags);
    EXPECT_EQ(r.exit_code, 0) << r.out;
    const std::string b = test::read_file(d.file(out));
    std::vector<float> v(b.size() / 4);
    std::memcpy(v.data(), b.data(), v.size() * 4);
    return std::make_pair(v, r.out);
  };
  const auto cpu_l = eval("", "cpu.f32").first;
  const auto [gpu_l, log] = eval("--device vulkan -ngl 99 --cpu-moe --moe-offload on --moe-offload-min 2 -v", "g.f32");
  EXPECT_NE(log.find("prefill offload (vulkan:0): on for micro-batches >= 2 tokens"), std::string::npos) << log;
  ASSERT_EQ(cpu_l.size(), gpu_l.size());
  const size_t V = cpu_l.size() / 24;
  for (size_t t = 0; t < 24; ++t) {
    std::vector<float> a(cpu_l.begin() + t * V, cpu_l.begin() + (t + 1) * V), b(gpu_l.begin() + t * V, gpu_l.begin() + (t + 1) * V);
    EXPECT_LT(test::rel_rms(b, a), 1e-4) << "position " << t;
  }
  const auto r = test::run_kimi("bench -m " + g + " --device vulkan -ngl 99 --cpu-moe --moe-offload on --moe-offload-min 2 "
                                "--moe-offload-pool 8K -p 8 -n 4 -r 1 --no-ceiling -o json");
  ASSERT_EQ(r.exit_code, 0) << r.out;
  const auto j = nlohmann::json::parse(r.out.substr(r.out.find('{')), nullptr, false);
  ASSERT_FALSE(j.is_discarded()) << r.out;
  ASSERT_TRUE(j.contains("moe_offload")) << r.out;
  EXPECT_GT(j["moe_offload"]["pp"]["picks"].get<uint64_t>(), 0u);
  EXPECT_GT(j["moe_offload"]["pp"]["bytes_uploaded"].get<uint64_t>(), 0u);
  EXPECT_EQ(j["moe_offload"]["tg"]["picks"].get<uint64_t>(), 0u);
  // kimi run -v: the prompt's offload counters after the run
  const auto run = test::run_kimi("run -m " + g + " -p 'The sea is blue and the sky is' -n 2 --temp 0 --device vulkan "
                                  "-ngl 99 --cpu-moe --moe-offload on --moe-offload-min 2 -v");
  ASSERT_EQ(run.exit_code, 0) << run.out;
  EXPECT_NE(run.out.find("prompt: routed experts offloaded to vulkan:0: "), std::string::npos) << run.out;
  const auto bad = test::run_kimi("eval -m " + g + " --tokens 1 --device vulkan --cpu-moe --moe-offload-min 1 --logits-out " +
                                  d.file("z.f32"));
  EXPECT_NE(bad.exit_code, 0);
  EXPECT_NE(bad.out.find("--moe-offload-min"), std::string::npos) << bad.out;
}
