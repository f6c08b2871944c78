// Kimi-K3 / K3.1 model: hyper-parameters read from GGUF keys (k3-architecture.md §2.2, spec/README.md
// decision 2) and weight views into the mmapped file (never copied, never expanded).
//
//   auto m = kimi::Model::load("model.gguf");          // throws kimi::Error on any bad key/tensor
//   fmt::print("{}", m->summary(kimi::CacheType::F16)); // parameters, bytes by type, cache sizes
//
// The forward pass over these weights is model/forward.h; sequences and batching are
// runtime/context.h.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "io/gguf.h"
#include "backend/backend.h"  // MatView

namespace kimi {

enum class CacheType { F16, F32 };

// Everything the forward pass needs, read from `kimi-k3.*` keys (nothing hard-coded).
struct HParams {
  std::string arch;            // "kimi-k3"
  uint32_t n_layer = 0;        // block_count
  uint32_t n_embd = 0;         // embedding_length (d)
  uint32_t n_vocab = 0;        // vocab_size (or token_embd rows)
  uint32_t n_ctx_train = 0;    // context_length
  uint32_t n_ff = 0;           // feed_forward_length (dense leading layers)
  uint32_t n_head = 0;         // attention.head_count (MLA heads and KDA heads)
  std::vector<uint8_t> is_mla; // per layer: head_count_kv[il] != 0 (else KDA)
  float rms_eps = 1e-5f;       // attention.layer_norm_rms_epsilon (every RMS norm + KDA l2 norm)

  // MLA
  uint32_t q_lora = 0;         // attention.q_lora_rank
  uint32_t kv_lora = 0;        // attention.kv_lora_rank (latent r)
  uint32_t n_rope = 0;         // rope.dimension_count (pe part, no rotation)
  uint32_t n_nope = 0;         // key_length_mla - n_rope
  uint32_t n_kq = 0;           // key_length_mla (softmax scale 1/sqrt(n_kq))
  uint32_t n_v = 0;            // value_length_mla (per-head v)

  // KDA
  uint32_t kda_head_dim = 0;   // kda.head_dim (D)
  uint32_t conv_kernel = 0;    // ssm.conv_kernel
  bool has_gate_lb = false;    // kda.gate_lower_bound present
  float gate_lb = 0.0f;

  // FFN / MoE
  uint32_t n_dense_lead = 0;   // leading_dense_block_count
  uint32_t n_expert = 0;
  uint32_t n_expert_used = 0;
  uint32_t n_expert_shared = 0;
  uint32_t n_ff_exp = 0;       // expert_feed_forward_length
  uint32_t n_latent = 0;       // expert_latent_length (0 = experts at full width)
  float expert_weights_scale = 1.0f;
  bool expert_weights_norm = true;
  uint32_t gating_func = 2;    // 1 softmax, 2 sigmoid
  // per-rank file (model/shard.h): kimi.shard.*; shard_ranks == 0 for a full model. The file's
  // expert tensors hold experts [shard_expert_first, + shard_expert_count) of n_expert.
  uint32_t shard_ranks = 0, shard_rank = 0, shard_expert_first = 0, shard_expert_count = 0;
  uint32_t file_experts() const { return shard_ranks ? shard_expert_count : n_expert; }

  // residual attention (ResMix) and activation
  uint32_t attn_res_block = 0; // attn_res.block_size (0 = plain residual)
  float situ_beta = 4.0f;
  float situ_lambda = 25.0f;   // <= 0: up branch is the identity

  // DSA indexer (K3.1); has_indexer iff attention.indexer.top_k present and > 0
  bool has_indexer = false;
  uint32_t idx_heads = 0;      // H_I
  uint32_t idx_dim = 0;        // D_I
  uint32_t idx_top_k = 0;

  int32_t bos_id = -1, eos_id = -1;  // tokenizer.ggml.{bos,eos}_token_id when present

  uint32_t kda_channels() const { return n_head * kda_head_dim; }  // C
  uint32_t mla_row() const { return kv_lora + n_rope; }             // cached latent row width
  uint32_t n_mla_layers() const;
  uint32_t n_kda_layers() const { return n_layer - n_mla_layers(); }
  bool is_moe(uint32_t il) const { return il >= n_dense_lead; }

  // per sequence: KDA conv + recurrent state (f32), bytes
  uint64_t state_bytes_per_seq() const;
  // per token: MLA latent row + indexer key over all MLA layers, bytes (cache element = 2 or 4 B)
  uint64_t cache_bytes_per_token(CacheType ct) const;
};

// A view of one stored weight. For 2-D weights `mat` is the GGUF matrix (rows = ne[1], cols =
// ne[0]); 3-D stacked experts/heads use slice(i). `f32` points at F32 data for vectors.
struct WeightView {
  const gguf::TensorInfo* info = nullptr;  // nullptr = tensor absent (optional tensors)
  MatView mat;                       // 2-D (or slice 0 of 3-D)
  uint64_t slice_bytes = 0;                // bytes between 3-D slices
  const float* f32 = nullptr;              // F32 vectors only
  explicit operator bool() const { return info != nullptr; }
  MatView slice(int64_t i) const {
    MatView m = mat;
    m.data += slice_bytes * static_cast<uint64_t>(i);
    return m;
  }
};

// The view of a stored tensor whose shape was already checked: a vector (`vec`, F32 only) or a matrix
// of any known type whose block size divides its row length. Returns "" and fills `out`, or the
// reason it cannot be used (naming the tensor).
std::string weight_view_of(const gguf::TensorInfo& ti, bool vec, WeightView& out);

struct LayerWeights {
  WeightView attn_norm, ffn_norm, attn_res_score, ffn_res_score;
  // KDA
  WeightView attn_q, attn_k, attn_v, conv_q, conv_k, conv_v, ssm_f_a, ssm_f_b, ssm_beta, ssm_a, ssm_dt_b,
      ssm_g, ssm_norm;
  // MLA
  WeightView attn_q_a, attn_q_a_norm, attn_q_b, attn_kv_a_mqa, attn_kv_a_norm, attn_k_b, attn_v_b, attn_gate;
  // shared by KDA and MLA
  WeightView attn_output;
  // DSA indexer (MLA layers of K3.1 files)
  WeightView idx_q_b, idx_k, idx_k_norm_w, idx_k_norm_b, idx_proj;
  // dense FFN
  WeightView ffn_gate, ffn_up, ffn_down;
  // MoE
  WeightView ffn_gate_inp, exp_probs_b, ffn_gate_exps, ffn_up_exps, ffn_down_exps, ffn_routed_down,
      ffn_routed_up, ffn_routed_norm, ffn_gate_shexp, ffn_up_shexp, ffn_down_shexp;
};

struct ModelOptions {
  bool verbose = false;  // print the load summary to stderr
};

class Model {
 public:
  // Opens the GGUF (mmap), reads hparams from keys, binds and validates every tensor (presence,
  // type, shape). Throws kimi::Error naming the file and the tensor/key on any problem.
  static std::unique_ptr<Model> load(const std::string& path, const ModelOptions& opts = {});

  const HParams& hparams() const { return hp_; }
  const gguf::Reader& reader() const { return *reader_; }
  const std::string& path() const { return path_; }

  // global weights
  const WeightView& token_embd() const { return token_embd_; }
  const WeightView& output() const { return output_; }
  const WeightView& output_norm() const { return output_norm_; }
  const WeightView& output_res_score() const { return output_res_score_; }
  const LayerWeights& layer(uint32_t il) const { return layers_[il]; }

  uint64_t n_params() const;  // total elements of all tensors
  // Weight bytes one decoded token reads: every tensor once, except the token embedding (one row)
  // and the routed experts (*_exps: n_expert_used of n_expert slices). Caches not included.
  uint64_t decode_weight_bytes_per_token() const;
  // Multi-line load summary: arch, layer schedule, parameters, bytes by type, state/cache sizes.
  std::string summary(CacheType ct = CacheType::F16) const;

 private:
  Model() = default;
  std::string path_;
  std::unique_ptr<gguf::Reader> reader_;
  HParams hp_;
  WeightView token_embd_, output_, output_norm_, output_res_score_;
  std::vector<LayerWeights> layers_;
  friend struct ModelLoader;
};

}  // namespace kimi
