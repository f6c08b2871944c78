// Prefill offload in hybrid mode (docs/gpu.md, "Prefill offload"): for a micro-batch of many tokens,
// the routed experts it picks are copied from host memory to the accelerator and run there instead of
// on the CPU, when the rates measured at load say that the copy plus the device's work take less time
// than the CPU's expert work.
//
// Hybrid mode keeps a layer's routed experts in host memory (--cpu-moe / --n-cpu-moe) while the rest of
// the layer runs on an accelerator. Decode reads 16 of K3.1's 896 experts per layer per token, so the CPU,
// next to the experts, is the right place for them. A prompt of thousands of tokens picks nearly every
// expert of a layer many times over; the CPU's matrix work then grows with the tokens while the bytes
// to copy stay at most one layer's experts. Above a batch size the copy over PCIe is cheaper than the
// CPU's work (ik_llama.cpp's rule of thumb: experts / active x 32 tokens, ~1800 for K3.1).
//
// ExpertOffload holds a fixed device pool of two halves, each a gate, an up and a down stack of C experts,
// allocated once when the context is made. A step lists the distinct experts of the host's picks in id
// order and walks them C at a time: chunk c is uploaded into half c % 2 and run there (moe_experts on
// the half with the picks remapped to its slots, the others skipped), its sum added to the layer's in
// chunk order; the device's work is started (Backend::flush) before the next chunk is staged, so the
// next copy can overlap it where the backend runs recorded work while the host stages more. A step may also
// be split: its most-picked experts go to the device while the host runs the others at the same time (auto
// chooses how many from the measured rates), the host's sum then comes back and the device's is added to it.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "model/model.h"

namespace kimi {

struct ExpertStreamStats;  // model/expert_cache.h

struct ExpertOffloadOptions {
  enum class Mode { Off, Auto, On };
  Mode mode = Mode::Auto;     // auto: when the measured rates say the device is faster; on: always
  int64_t min_tokens = 0;     // smallest micro-batch offloaded (>= 2); 0 = 32 x experts / experts used
  // at most this many experts of a step go to the device, the most-picked ones; the host runs the others at
  // the same time (0: no limit). auto picks the split itself, from the measured rates.
  int64_t max_experts = 0;
  int64_t pool_bytes = -1;    // the device pool (both halves); -1 = auto: 1/8 of the device's free memory
                              // (4 GiB when it does not say), at most two halves of every expert of a layer
};

// The rates the choice is made with, measured by a probe when the context is made (auto mode).
struct OffloadRates {
  double cpu_read_Bps = 0;      // expert bytes/s the CPU's moe_experts reads (one token: read-bound)
  double cpu_s_per_pick = 0;    // CPU seconds per (token, expert) pick in a batch (work-bound)
  double upload_Bps = 0;        // host -> device bytes/s of expert slices (Backend::upload + sync)
  double dev_s_per_pick = 0;    // device seconds per pick in a batch (moe_experts + sync)
  double probe_s = 0;           // time the probe took
  bool measured() const { return cpu_s_per_pick > 0 && upload_Bps > 0; }
  // Estimated seconds of one step that picks `picks` times among `distinct` experts of `expert_bytes`
  double cpu_seconds(int64_t distinct, int64_t picks, uint64_t expert_bytes) const;
  double device_seconds(int64_t distinct, int64_t picks, uint64_t expert_bytes) const;
};

// The default threshold: 32 x n_expert / n_used tokens (ik_llama.cpp), at least 2.
int64_t default_offload_min_tokens(int64_t n_expert, int64_t n_used);

class ExpertOffload {
 public:
  // Layers with on_host[il] run their routed experts on `host` (a host-visible backend) while their FFN
  // runs on `dev`. Allocates the pool and the step buffers on dev; auto mode runs the probe. n_tokens:
  // the micro-batch capacity. Throws kimi::Error when a forced pool cannot hold one expert.
  ExpertOffload(const Model& m, Backend& dev, Backend& host, const std::vector<uint8_t>& on_host,
                const ExpertOffloadOptions& o, int64_t n_tokens);
  ExpertOffload(const ExpertOffload&) = delete;
  ExpertOffload& operator=(const ExpertOffload&) = delete;
  ~ExpertOffload();

  // false when nothing can ever be offloaded (mode off, micro-batches below the threshold, no room)
  bool active() const { return active_; }

  // What run() did: None (the host runs every pick), All (acc holds the sum of every host pick), Part (the
  // device ran the picks of some experts: their host_sel entries are now -1, their sum is in part_sum(); the
  // host runs the rest and the caller adds part_sum() to the host's sum)
  enum class Result { None, All, Part };
  // One MoE step of layer il whose host picks are host_sel / host_weights (host memory, n x k; -1 =
  // not the host's pick, e.g. a hot expert's): when the step qualifies, the experts of (some of) those picks
  // are uploaded chunk by chunk and run on the device. x: the experts' input on the device; acc: the layer's
  // routed sum on the device (written when All). host_mats: the layer's experts as the host reads them.
  // The device's work is started (flush) before it returns, so the host's share runs at the same time.
  Result run(uint32_t il, const ExpertMats& host_mats, const float* x, int64_t n, int64_t width, int32_t* host_sel,
             const float* host_weights, int64_t k, float situ_beta, float situ_lambda, float* acc);
  float* part_sum() const { return part_->as<float>(); }

  // "prefill offload (vulkan:0): auto for micro-batches >= 128 tokens: ..." (the choice and its rates)
  const std::string& plan() const { return plan_; }
  const OffloadRates& rates() const { return rates_; }
  int64_t min_tokens() const { return min_tokens_; }
  int64_t chunk_experts() const { return chunk_; }
  void add_stats(ExpertStreamStats& s) const;  // offload_* fields

 private:
  void probe(const Model& m, uint32_t il, int64_t n_tokens);
  void upload_expert(const ExpertMats& host_mats, int32_t e, int half, int64_t slot);
  ExpertMats half_mats(const ExpertMats& host_mats, int half) const;

  Backend& dev_;
  Backend& host_;
  ExpertOffloadOptions::Mode mode_;
  int64_t max_experts_ = 0;
  bool active_ = false;
  int64_t E_ = 0, k_ = 0, n_tokens_ = 0, width_ = 0, min_tokens_ = 0, chunk_ = 0;
  uint64_t expert_bytes_ = 0, gate_slice_ = 0, up_slice_ = 0, down_slice_ = 0;
  std::vector<uint8_t> on_host_;
  std::vector<MatView> gate_, up_, down_;  // per layer: the layer's matrix views (shape and type)
  std::unique_ptr<Buffer> pool_[2][3];     // [half][gate, up, down]: the stacks of C experts
  std::unique_ptr<Buffer> sel_[2], w_[2], acc_[2], part_;
  // per step (sized once): distinct experts, expert -> position among the offloaded ones, picks per
  // expert, the remapped picks
  std::vector<int32_t> used_, pos_, cnt_, csel_;
  std::vector<float> cw_;
  OffloadRates rates_;
  std::string plan_, device_;
  uint64_t steps_ = 0, declined_ = 0, picks_ = 0, bytes_ = 0, chunks_ = 0, split_steps_ = 0;
};

}  // namespace kimi
