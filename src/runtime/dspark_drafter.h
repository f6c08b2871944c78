// The K3 DSpark draft model as a Drafter (runtime/speculative.h, docs/spec/dspark.md §3.5): it
// reads the target's hidden states at its tap layers through observe(), keeps the draft's latent
// context rows, and proposes up to block_size tokens per step by greedy block drafting with the
// Markov head.
//
//   auto dm = std::shared_ptr<const kimi::DsparkModel>(kimi::DsparkModel::load("draft.gguf"));
//   kimi::DsparkDrafter d(dm, target, {.n_ctx = 4096, .n_threads = 4});
//   ctx.set_tap_layers(d.tap_layers_vec());   // before the prompt is decoded
#pragma once
#include <memory>
#include <span>
#include <vector>

#include "model/dspark.h"
#include "runtime/speculative.h"

namespace kimi {

class CpuBackend;
class ThreadPool;

struct DsparkDrafterOptions {
  int n_ctx = 4096;    // positions of the sequence (the context's n_ctx_max)
  int n_batch = 512;   // context rows projected per call (larger observe()s are split)
  int n_threads = 0;   // the draft's own CPU threads (0: all hardware threads)
  // the draft's matmuls (Fast: bf16/q8 activations as the target's Fast mode); greedy verification
  // keeps the output exact either way, only which tokens are drafted can change
  Precision precision = Precision::Fast;
  // the backend the draft runs on, its own (not the target context's: the draft reserves its own
  // scratch); nullptr: a CPU backend of n_threads threads. app/engine_args.cpp gives a Vulkan one
  // when the target's layers are on a Vulkan device.
  std::shared_ptr<Backend> backend;
};

class DsparkDrafter final : public Drafter {
 public:
  DsparkDrafter(std::shared_ptr<const DsparkModel> dm, const Model& target, const DsparkDrafterOptions& o);
  ~DsparkDrafter() override;
  std::string name() const override { return "dspark"; }
  // Greedy block drafting from the last token (the anchor at position tokens.size() - 1). Proposes
  // nothing until the context rows of every earlier position have been observed.
  int propose(std::span<const int32_t> tokens, int n_max, std::vector<int32_t>& draft) override;
  void reset() override { covered_ = 0; }
  std::span<const int> tap_layers() const override { return taps_; }
  void observe(const TargetTaps& taps) override;
  const std::vector<int>& tap_layers_vec() const { return taps_; }
  // positions 0 .. covered() - 1 have context rows
  int32_t covered() const { return covered_; }

 private:
  std::shared_ptr<const DsparkModel> dm_;
  std::unique_ptr<ThreadPool> pool_;
  std::unique_ptr<CpuBackend> cpu_;
  std::shared_ptr<Backend> be_;  // cpu_ or DsparkDrafterOptions::backend
  std::unique_ptr<DsparkDraft> draft_;
  std::vector<int> taps_;
  std::vector<BatchEntry> entries_;
  std::vector<int32_t> out_;
  int n_batch_ = 1, n_ctx_ = 1;
  int32_t covered_ = 0;
};

}  // namespace kimi
