// The K3 DSpark draft model as a Drafter (runtime/speculative.h, docs/spec/dspark.md §3.5): it
// reads the target's hidden states at its tap layers through observe(), keeps the draft's latent
// context rows, and proposes up to block_size tokens per step by greedy block drafting with the
// Markov head.
//
//   auto dm = std::shared_ptr<const kimi::DsparkModel>(kimi::DsparkModel::load("draft.gguf"));
//   kimi::DsparkDrafter d(dm, target, {.n_ctx = 4096, .n_threads = 4});
//   ctx.set_tap_layers(d.tap_layers_vec());   // before the prompt is decoded
//
// Several sequences (kimi serve): one DsparkRunner (the draft's threads, backend and context rows
// of n_seq sequences) and a DsparkDrafter per sequence on it, each with its own rows and coverage.
#pragma once
#include <algorithm>
#include <memory>
#include <span>
#include <vector>

#include "model/dspark.h"
#include "runtime/speculative.h"

namespace kimi {

class CpuBackend;
class ThreadPool;

struct DsparkDrafterOptions {
  int n_seq = 1;       // sequences (DsparkRunner: one drafter per sequence id 0..n_seq-1)
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

// The draft's forward for the drafters of n_seq sequences: its own threads, CPU backend and the
// context rows of every sequence. Its drafters are used from one thread at a time.
struct DsparkRunner {
  DsparkRunner(std::shared_ptr<const DsparkModel> dm, const Model& target, const DsparkDrafterOptions& o);
  ~DsparkRunner();
  std::shared_ptr<const DsparkModel> dm;
  std::unique_ptr<ThreadPool> pool;
  std::unique_ptr<CpuBackend> cpu;
  std::shared_ptr<Backend> be;  // cpu, or DsparkDrafterOptions::backend
  std::unique_ptr<DsparkDraft> draft;
  std::vector<int> taps;             // the target layers it reads
  std::vector<BatchEntry> entries;   // scratch of observe() (n_batch)
  std::vector<int32_t> out;          // scratch of propose() (block)
  int n_batch = 1, n_ctx = 1, n_seq = 1;
};

class DsparkDrafter final : public Drafter {
 public:
  // a drafter with a runner of its own (one sequence)
  DsparkDrafter(std::shared_ptr<const DsparkModel> dm, const Model& target, const DsparkDrafterOptions& o);
  // the drafter of sequence `seq` (0..n_seq-1) of a shared runner
  DsparkDrafter(std::shared_ptr<DsparkRunner> runner, int32_t seq);
  ~DsparkDrafter() override;
  std::string name() const override { return "dspark"; }
  // Greedy block drafting from the last token (the anchor at position tokens.size() - 1). Proposes
  // nothing until the context rows of every earlier position have been observed.
  int propose(std::span<const int32_t> tokens, int n_max, std::vector<int32_t>& draft) override;
  void reset() override { covered_ = 0; }
  void keep(int32_t n_keep) override { covered_ = std::min(covered_, std::max<int32_t>(n_keep, 0)); }
  std::span<const int> tap_layers() const override { return r_->taps; }
  void observe(const TargetTaps& taps) override;
  const std::vector<int>& tap_layers_vec() const { return r_->taps; }
  // positions 0 .. covered() - 1 have context rows
  int32_t covered() const { return covered_; }

 private:
  std::shared_ptr<DsparkRunner> r_;
  int32_t seq_ = 0;
  int32_t covered_ = 0;
};

}  // namespace kimi
