// Independent float64 reference of the K3 DSpark draft (docs/spec/dspark.md §3), written from the
// spec text. It reads the Hugging Face checkpoints directly — the draft's (config.json +
// model.safetensors, unsplit kv_b_proj, un-absorbed attention) and the target's embedding and
// lm_head — never a GGUF, so a comparison checks the draft converter and the engine together.
// Shares no code with the engine: own decoding (ref_math), own loops, double everywhere.
//
//   auto ref = kimi::ref::DsparkRef::load(draft_hf, target_hf);
//   auto z = ref.block_logits(taps, anchor);  // taps: one row per context position 0..L-1
//   auto b = ref.markov_bias(prev);
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace kimi::ref {

class DsparkRef {
 public:
  static DsparkRef load(const std::string& draft_hf, const std::string& target_hf);
  DsparkRef(DsparkRef&&) noexcept;
  ~DsparkRef();

  int64_t block() const;
  int64_t vocab() const;
  int64_t tap_width() const;  // n_taps * target hidden
  // The base logits z_j (dspark.md §3.2) of the block of `anchor` at position L = taps.size(), whose
  // context rows come from taps[p] (row p: the taps of position p concatenated in ascending tap
  // order): block() rows of vocab() values.
  std::vector<std::vector<double>> block_logits(const std::vector<std::vector<double>>& taps, int32_t anchor) const;
  // The Markov bias W2 W1[prev] (dspark.md §3.4).
  std::vector<double> markov_bias(int32_t prev) const;

 private:
  struct Impl;
  explicit DsparkRef(std::unique_ptr<Impl> p);
  std::unique_ptr<Impl> p_;
};

}  // namespace kimi::ref
