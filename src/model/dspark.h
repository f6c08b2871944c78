// The K3 DSpark draft model (docs/spec/dspark.md): hyper-parameters and weight views from a
// `kimi-k3-dspark` GGUF (§2), and its forward pass on one backend (§3): context rows from the
// target's tapped hidden states, the block forward over the target's embedding and output
// matrix, and the Markov head that samples the block left to right.
//
//   auto dm = kimi::DsparkModel::load("draft.gguf");
//   dm->check_target(target.hparams());                  // widths, vocabulary, tap layers
//   kimi::DsparkDraft draft(*dm, target, cpu_backend, {.n_seq = 1, .n_ctx = 4096, .n_batch = 512});
//   draft.add_context(entries, n, taps);                 // every token the target processed
//   int n = draft.draft_greedy(seq, anchor, pos, 7, out); // up to block_size drafted tokens
//
// The draft runs on a backend of its own (it calls reserve() with its own limits): the CPU backend,
// or a Vulkan one (its own instance, not the target context's); the ops it uses beyond the K3 set
// are Backend::silu_mul_rows and Backend::rope_rows.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "model/model.h"

namespace kimi {

struct DsparkHParams {
  uint32_t n_layer = 0, n_embd = 0, n_ff = 0, n_vocab = 0, n_head = 0;
  uint32_t q_lora = 0, kv_lora = 0, n_nope = 0, n_rope = 0, n_v = 0;
  uint32_t n_ctx_train = 0;
  float rms_eps = 1e-5f;
  // RoPE / YaRN (dspark.md §3.3); yarn_factor <= 1: plain RoPE
  float rope_base = 10000.0f, yarn_factor = 1.0f, yarn_beta_fast = 32.0f, yarn_beta_slow = 1.0f;
  float yarn_mscale = 1.0f, yarn_mscale_all = 0.0f;
  uint32_t yarn_orig_ctx = 0;
  // drafting
  std::vector<uint32_t> taps;  // target layers (0-based), ascending
  uint32_t target_n_layer = 0, target_n_embd = 0;
  uint32_t block = 7, mask_token = 0, markov_rank = 0;

  uint32_t n_kq() const { return n_nope + n_rope; }
  uint32_t row() const { return kv_lora + n_rope; }   // latent cache row
  uint32_t tap_width() const { return static_cast<uint32_t>(taps.size()) * target_n_embd; }
  double attn_scale() const;                          // mscale^2 / sqrt(nope + rope) (§3.2 step 4)
  // cos/sin of every position < n_ctx and pair i < n_rope/2, magnitude factor folded in (§3.3),
  // [n_ctx][n_rope/2][2]
  std::vector<float> rope_table(int64_t n_ctx) const;
};

struct DsparkLayer {
  WeightView attn_norm, q_a, q_a_norm, q_b, kv_a, kv_a_norm, k_b, v_b, attn_out, ffn_norm, ffn_gate, ffn_up, ffn_down;
};

class DsparkModel {
 public:
  // Opens the GGUF, reads and checks the keys, binds every tensor (shape and type). Throws
  // kimi::Error naming the file and key/tensor.
  static std::unique_ptr<DsparkModel> load(const std::string& path);
  // Throws unless the draft fits this target: embedding width and vocabulary, tap layers inside it,
  // target width (the draft's target.embedding_length).
  void check_target(const HParams& target) const;

  const DsparkHParams& hparams() const { return hp_; }
  const gguf::Reader& reader() const { return *reader_; }
  const std::string& path() const { return path_; }
  const WeightView& context_proj() const { return context_proj_; }
  const WeightView& context_norm() const { return context_norm_; }
  const WeightView& output_norm() const { return output_norm_; }
  const WeightView& markov_w1() const { return markov_w1_; }
  const WeightView& markov_w2() const { return markov_w2_; }
  const DsparkLayer& layer(uint32_t il) const { return layers_[il]; }
  uint64_t n_params() const;

 private:
  DsparkModel() = default;
  std::string path_;
  std::unique_ptr<gguf::Reader> reader_;
  DsparkHParams hp_;
  WeightView context_proj_, context_norm_, output_norm_, markov_w1_, markov_w2_;
  std::vector<DsparkLayer> layers_;
  friend struct DsparkLoader;
};

struct DsparkOptions {
  int n_seq = 1;    // sequence ids 0..n_seq-1
  int n_ctx = 1;    // positions per sequence (the block reaches pos + block_size - 1)
  int n_batch = 1;  // most context rows per add_context call
};

class DsparkDraft {
 public:
  // `target` gives the token embedding and output matrix (dspark.md §3.2). `be` is the draft's own
  // (reserve() is called with the draft's limits); host inputs and outputs are copied to and from it.
  DsparkDraft(const DsparkModel& dm, const Model& target, Backend& be, const DsparkOptions& o);
  ~DsparkDraft();

  // Context rows (dspark.md §3.1) of n <= n_batch tokens: token t is (e[t].seq_id, e[t].pos) and
  // its tap k (k-th tap layer, ascending) is taps[(t * n_taps + k) * target_n_embd ..] (host; one
  // row per token, the layers in order inside it: Forward::set_taps writes tap-major, transpose).
  void add_context(const BatchEntry* e, int64_t n, const float* taps);
  // The block of (seq, anchor token at pos): the base logits z_j of its block_size rows (§3.2) into
  // base (host, block_size x n_vocab). Context rows 0..pos-1 of seq must be present.
  void block_logits(int32_t seq, int32_t anchor, int32_t pos, float* base);
  // The Markov bias of the previous token (§3.4) into bias (host, n_vocab).
  void markov_bias(int32_t prev, float* bias);
  // Greedy block drafting (§3.4): block_logits, then token j+1 = argmax(z_j + bias(t_j)), t_0 = the
  // anchor; up to min(n_max, block_size) tokens into out (host); returns how many.
  int draft_greedy(int32_t seq, int32_t anchor, int32_t pos, int n_max, int32_t* out);

  const DsparkHParams& hparams() const { return hp_; }

 private:
  struct Impl;
  std::unique_ptr<Impl> p_;
  const DsparkHParams& hp_;
};

}  // namespace kimi
