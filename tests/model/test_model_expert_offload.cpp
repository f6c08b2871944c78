// Prefill offload (model/expert_offload.h) without a GPU: the CPU backend stands in as "device 1" (its
// own buffers, reached through upload/download only), so every build (no Vulkan, the cross builds) runs
// the offload's logic: the distinct experts of the host's picks uploaded chunk by chunk into the pool's
// two halves, the picks remapped per chunk, the chunk sums added in order. Against the CPU backend alone
// in f32 on the tiny model: logits within rel RMS 1e-5 and top-1 equal (forced on with 1, 3 and every
// expert per chunk, one chunk bit-identical; with hot experts; steps split with the CPU (at most 3 experts
// to the device); auto; off); every pick of the micro-batches
// of >= 2 tokens counted offloaded and none of a single-token step; the bytes uploaded are whole experts.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "backend/cpu/cpu_backend.h"
#include "backend_workload.h"
#include "model/expert_cache.h"
#include "model/model.h"
#include "runtime/context.h"
#include "test_util.h"
#include "util/error.h"
#include "util/thread_pool.h"

using namespace kimi;

namespace {

// the CPU backend as device 1: not host-visible, so the forward pass moves data with upload/download
class Dev1 final : public CpuBackend {
 public:
  Dev1(ThreadPool& pool, Precision prec) : CpuBackend(pool, prec) {}
  const char* name() const override { return "dev1"; }
  bool host_visible() const override { return false; }
};

ContextOptions cpu_options() {
  ContextOptions o;
  o.n_threads = 2;
  o.n_ctx_max = 64;
  o.n_seq_max = 2;
  o.n_batch_max = 8;
  o.precision = Precision::F32;
  return o;
}

// bytes of c experts' stacks in one pool half (256-aligned stacks, as ExpertOffload counts them), times 2
int64_t pool_for(const Model& m, int64_t c) {
  for (uint32_t il = 0; il < m.hparams().n_layer; ++il) {
    if (!m.hparams().is_moe(il)) continue;
    const LayerWeights& L = m.layer(il);
    uint64_t half = 0;
    for (uint64_t s : {L.ffn_gate_exps.slice_bytes, L.ffn_up_exps.slice_bytes, L.ffn_down_exps.slice_bytes})
      half += (uint64_t(c) * s + 255) / 256 * 256;
    return int64_t(2 * half);
  }
  return 0;
}

// rel RMS of got against want (float64 sums)
double rel_rms(const std::vector<float>& got, const std::vector<float>& want) {
  double num = 0, den = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    const double d = double(got[i]) - double(want[i]);
    num += d * d, den += double(want[i]) * double(want[i]);
  }
  return std::sqrt(num / std::max(den, 1e-300));
}

// worst rel RMS of the rows
double expect_close(const test::Run& want, const test::Run& got, const std::string& what) {
  EXPECT_EQ(want.logits.size(), got.logits.size()) << what;
  if (want.logits.size() != got.logits.size()) return 1.0;
  double worst = 0;
  for (size_t r = 0; r < want.logits.size(); ++r) {
    const double e = rel_rms(got.logits[r], want.logits[r]);
    worst = std::max(worst, e);
    EXPECT_LT(e, 1e-5) << what << ": logits row " << r;
    const auto& a = want.logits[r];
    const auto& b = got.logits[r];
    EXPECT_EQ(std::max_element(a.begin(), a.end()) - a.begin(), std::max_element(b.begin(), b.end()) - b.begin())
        << what << ": top-1 of row " << r;
  }
  std::printf("[ %s ] %zu rows, worst rel RMS vs CPU %.3g\n", what.c_str(), want.logits.size(), worst);
  return worst;
}

}  // namespace

TEST(ModelExpertOffload, SecondDeviceMatchesCpu) {
  test::TinyModel t(16);
  const Model& m = *t.m;
  const HParams& hp = m.hparams();
  const int64_t E = hp.n_expert, k = hp.n_expert_used;
  int64_t layers = 0;
  uint64_t eb = 0;
  for (uint32_t il = 0; il < hp.n_layer; ++il)
    if (hp.is_moe(il)) {
      ++layers;
      const LayerWeights& L = m.layer(il);
      eb = L.ffn_gate_exps.slice_bytes + L.ffn_up_exps.slice_bytes + L.ffn_down_exps.slice_bytes;
    }
  const test::Run ref = test::drive(m, cpu_options());
  HotExpertOptions hot;
  hot.counts.resize(hp.n_layer);
  for (uint32_t il = 0; il < hp.n_layer; ++il)
    if (hp.is_moe(il))
      for (int64_t e = 0; e < E; ++e) hot.counts[il].push_back(double((e * 3 + il) % E));
  struct Case {
    const char* what;
    ExpertOffloadOptions::Mode mode;
    int64_t chunk;  // experts per pool half (0: the auto pool)
    int64_t hot = 0;
    int64_t max_experts = 0;  // split steps: at most this many experts to the device
  };
  for (const Case& c : {Case{"on, 1 expert per chunk", ExpertOffloadOptions::Mode::On, 1},
                        Case{"on, 3 experts per chunk", ExpertOffloadOptions::Mode::On, 3},
                        Case{"on, auto pool", ExpertOffloadOptions::Mode::On, 0},
                        Case{"on, at most 3 experts a step (split with the CPU)", ExpertOffloadOptions::Mode::On, 2, 0, 3},
                        Case{"on, at most 3 experts a step + 2 hot", ExpertOffloadOptions::Mode::On, 2, 2, 3},
                        Case{"on, 2 per chunk + 2 hot experts", ExpertOffloadOptions::Mode::On, 2, 2},
                        Case{"auto", ExpertOffloadOptions::Mode::Auto, 0},
                        Case{"off", ExpertOffloadOptions::Mode::Off, 0}}) {
    ThreadPool pool(2);
    Dev1 dev1(pool, Precision::F32);
    ContextOptions o = cpu_options();
    o.placement.n_gpu_layers = -1;
    o.placement.cpu_moe = true;
    o.extra_backends = {&dev1};
    o.stream.offload.mode = c.mode;
    o.stream.offload.min_tokens = 2;
    o.stream.offload.pool_bytes = c.chunk > 0 ? pool_for(m, c.chunk) : -1;
    o.stream.offload.max_experts = c.max_experts;
    if (c.hot) {
      o.stream.hot = hot;
      o.stream.hot.per_layer = c.hot;
    }
    const double worst = expect_close(ref, test::drive(m, o), c.what);
    // one chunk of every used expert, in id order, on the same kernels: the CPU's sum bit for bit
    if (c.mode == ExpertOffloadOptions::Mode::On && c.chunk == 0) {
      EXPECT_EQ(worst, 0.0) << c.what;
    }
    // the counters over a prefill of 11 tokens (micro-batches of 8 and 3) and 3 decoded tokens
    Context ctx(m, o);
    kimi::test::prefill_seq0(ctx, 11);
    const ExpertStreamStats pre = ctx.expert_stream_stats();
    kimi::test::decode_seq0(ctx, 3);
    const ExpertStreamStats dec = ctx.expert_stream_stats().minus(pre);
    EXPECT_EQ(dec.offload_steps + dec.offload_declined + dec.offload_picks, 0u) << c.what;
    if (c.mode == ExpertOffloadOptions::Mode::On && c.max_experts > 0) {
      // split steps: the 3 most-picked experts of each step on the device, the host ran the rest
      EXPECT_EQ(pre.offload_steps, uint64_t(2 * layers)) << c.what;
      EXPECT_GT(pre.offload_split_steps, 0u) << c.what;
      EXPECT_GT(pre.offload_picks, 0u) << c.what;
      EXPECT_LT(pre.offload_picks + pre.hot_picks, uint64_t(11 * k * layers)) << c.what;
      EXPECT_LE(pre.offload_bytes, pre.offload_steps * 3 * eb) << c.what;
    } else if (c.mode == ExpertOffloadOptions::Mode::On) {
      EXPECT_EQ(pre.offload_steps, uint64_t(2 * layers)) << c.what;
      EXPECT_EQ(pre.offload_split_steps, 0u) << c.what;
      EXPECT_EQ(pre.offload_picks + pre.hot_picks, uint64_t(11 * k * layers)) << c.what;
      EXPECT_GT(pre.offload_bytes, 0u) << c.what;
      EXPECT_EQ(pre.offload_bytes % eb, 0u) << c.what;
      EXPECT_LE(pre.offload_bytes, pre.offload_steps * uint64_t(E) * eb) << c.what;
      if (c.chunk == 1) {
        EXPECT_EQ(pre.offload_chunks * eb, pre.offload_bytes) << c.what;  // one expert per chunk
      }
      if (c.hot) {
        EXPECT_GT(pre.hot_picks, 0u) << c.what;
      }
      EXPECT_NE(pre.offload_plan.find("prefill offload (dev1): on for micro-batches >= 2 tokens"), std::string::npos)
          << pre.offload_plan;
    } else if (c.mode == ExpertOffloadOptions::Mode::Auto) {
      EXPECT_EQ(pre.offload_steps + pre.offload_declined, uint64_t(2 * layers)) << c.what;
      EXPECT_NE(pre.offload_plan.find("auto for micro-batches >= 2 tokens"), std::string::npos) << pre.offload_plan;
    } else {
      EXPECT_EQ(pre.offload_steps + pre.offload_declined + pre.offload_picks, 0u) << c.what;
      EXPECT_NE(pre.offload_plan.find("off (--moe-offload off)"), std::string::npos) << pre.offload_plan;
    }
  }
}

// A forced pool too small for one expert is refused, naming the option; a batch capacity below the threshold
// leaves the offload off and says so.
TEST(ModelExpertOffload, PoolAndThresholdLimits) {
  test::TinyModel t(16);
  const Model& m = *t.m;
  ThreadPool pool(2);
  Dev1 dev1(pool, Precision::F32);
  ContextOptions o = cpu_options();
  o.placement.n_gpu_layers = -1;
  o.placement.cpu_moe = true;
  o.extra_backends = {&dev1};
  o.stream.offload.mode = ExpertOffloadOptions::Mode::On;
  o.stream.offload.min_tokens = 2;
  o.stream.offload.pool_bytes = pool_for(m, 1) - 1;
  try {
    Context c(m, o);
    ADD_FAILURE() << "a pool without room for one expert was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("--moe-offload-pool"), std::string::npos) << e.what();
  }
  o.stream.offload.pool_bytes = -1;
  o.stream.offload.min_tokens = 9;  // above n_batch_max = 8
  Context c(m, o);
  EXPECT_NE(c.expert_stream_stats().offload_plan.find("below the threshold of 9 tokens"), std::string::npos)
      << c.expert_stream_stats().offload_plan;
}
