// Synthetic Kimi-K3.1 Hugging Face checkpoints (`kimi synth`): the real directory layout
// (config.json, sharded safetensors + index, tiktoken.model, tokenizer_config.json) with
// deterministic random weights and a BPE vocabulary learned from generated text.
//
// Every tensor's values depend only on (seed, tensor name): the same seed gives identical bytes,
// --no-indexer leaves the other tensors unchanged, --layers N reproduces the first N layers of a
// deeper model. The vocabulary depends only on vocab_size.
#pragma once
#include <cstdint>
#include <functional>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "io/safetensors.h"

namespace kimi::synth {

struct Config {
  std::string preset;
  int64_t hidden = 0;
  int64_t layers = 0;
  std::vector<int64_t> full_attn_layers;  // 1-INDEXED (as in config.json)
  int64_t heads = 0;                      // MLA and KDA heads
  int64_t kda_head_dim = 0;
  int64_t q_lora = 0, kv_lora = 0, nope = 0, rope = 0, v_dim = 0;
  int64_t dense_width = 0;  // intermediate_size (layer 0)
  int64_t experts = 0, top_k = 0, shared_experts = 2, moe_inter = 0, latent = 0;
  int64_t res_block = 0;  // attn_res_block_size
  int64_t index_heads = 0, index_dim = 0, index_topk = 0;
  int64_t vocab = 0;
  int64_t max_pos = 1048576;
  double routed_scaling = 1.0;
  bool indexer = true;        // DSA indexer tensors + index_* keys
  bool mxfp4_experts = true;  // false: BF16 experts.E.wK.weight, no quantization_config
  uint64_t seed = 0;
  // The MoonViT3D vision tower and projector (docs/spec/vision.md §1.3): widths scaled per preset,
  // patch size 14, merge kernel 2, eps as in K3. vision = false (--no-vision) writes no vision tensors
  // and no vision_config.
  bool vision = true;
  int64_t vt_width = 0, vt_qkv = 0, vt_heads = 0, vt_ff = 0, vt_blocks = 0, vt_grid = 0;
  // Experimental (--outlier-channels N[:SCALE], off by default): N channels of every RMSNorm weight of
  // the residual stream, the routed-expert latent and the MLA q/kv latents get SCALE times their value,
  // the same channel indices for every norm of the same width (chosen from the seed), so the normed
  // activations have a few outlier input channels as trained LLMs do. 0 = off (the default output).
  int64_t outlier_channels = 0;
  float outlier_scale = 1.0f;
  // The router's selection bias (e_score_correction_bias), --router: < 0 = "spread" (the default: evenly
  // spaced values 0.1 apart in a random order, which dominate the sigmoid scores, so nearly every token picks
  // the same experts); >= 0 = "zipf:S": expert popularity of Zipf exponent S per MoE layer (the expert of
  // popularity rank r, 1-based, in a per-layer random order, is picked by a share of the tokens
  // p_r = min(1, c / r^S), c such that the p_r sum to top_k), realised as a bias under which a router logit
  // of N(0, 1) per token and expert (what the synthetic router gives for RMS-normed inputs) picks expert e
  // with probability p_e; the choices then vary from token to token. Only the bias tensors change.
  double router_zipf = -1;

  bool is_mla(int64_t layer0) const;  // 0-based layer index
  int64_t conv_kernel() const { return 4; }
  int64_t a_log_len() const { return heads > kda_head_dim ? heads : kda_head_dim; }
};

// "tiny", "small", "k3-layers" (docs/spec/README.md, synthetic checkpoints); throws kimi::Error for other names.
Config preset(const std::string& name);
const std::vector<std::string>& preset_names();
// --layers N: keep the first N layers (full_attn_layers entries > N are dropped).
void set_layers(Config& c, int64_t n);
// --experts N: N routed experts (top_k clamped to N).
void set_experts(Config& c, int64_t n);
// --outlier-channels N[:SCALE]: parses "N" or "N:SCALE" (N >= 1, SCALE > 0, default 20) into the config;
// throws kimi::Error for anything else.
void set_outlier_channels(Config& c, const std::string& spec);
// The outlier channel indices (ascending) for a norm of width n, as chosen for this config (empty when off).
std::vector<int64_t> outlier_channel_indices(const Config& c, int64_t n);
// --router spread|zipf|zipf:S (S a number in [0, 4], default 1); throws kimi::Error for anything else.
void set_router(Config& c, const std::string& spec);
// --experts-used N: N experts per token (1 <= N <= experts).
void set_experts_used(Config& c, int64_t n);
// With --router zipf: the share of tokens that picks each expert of MoE layer `layer0` (0-based), by expert
// id (sums to top_k), as the bias is designed for; empty with the spread router or for a dense layer.
std::vector<double> router_pick_share(const Config& c, int64_t layer0);

struct TensorInfo {
  std::string name;
  st::Dtype dtype;
  std::vector<int64_t> shape;
};
// Every tensor of the checkpoint in file order (names with the language_model./vision_tower./
// mm_projector. prefixes, shapes in PyTorch [out, in] order).
std::vector<TensorInfo> tensor_list(const Config& c);

// The float values behind a floating-point tensor (before rounding to its dtype), or, for a routed
// expert, the logical weight "language_model.model.layers.L.block_sparse_moe.experts.E.wK.weight"
// [out, in] that the MXFP4 pair (weight_packed, weight_scale) quantizes. Throws for unknown names.
std::vector<float> tensor_values(const Config& c, const std::string& name);

// MXFP4 quantization of one row of n (multiple of 32) floats, compressed-tensors layout:
// packed[n/2] (byte i = code(2i) | code(2i+1) << 4), scales[n/32] (E8M0). The scale is the
// smallest power of two with 6 * scale >= block amax (no clipping); codes are round-to-nearest.
void mxfp4_quantize_row(const float* x, int64_t n, uint8_t* packed, uint8_t* scales);

// Special token names at ids V-256 .. V-1 (docs/spec/README.md, synthetic checkpoints).
std::string special_token(int64_t vocab, int64_t id);
nlohmann::ordered_json config_json(const Config& c);
nlohmann::ordered_json tokenizer_config_json(const Config& c);
// The learned base vocabulary (V-256 tokens, rank order) and the size of its training text.
std::vector<std::string> learn_vocab(int64_t vocab, size_t* text_bytes = nullptr);

// Move a finished temporary directory `tmp` into place at `final_path` (with `replace`: the existing
// directory is moved aside first and removed after), discarding tmp when the rename fails. Both the
// K3 synth and the DSpark draft's synth end with it.
void install_dir(const std::string& tmp, const std::string& final_path, bool replace);

struct WriteOptions {
  bool force = false;  // replace an existing non-empty output directory
  bool quiet = false;  // no progress output
  uint64_t shard_max_bytes = 4ull << 30;  // also: a new shard every 4 layers
};
struct Summary {
  size_t tensors = 0;
  size_t shards = 0;
  uint64_t tensor_bytes = 0;  // sum of tensor data bytes (index.json total_size)
  uint64_t parameters = 0;    // logical weights (an MXFP4 pair counts its unpacked elements)
  size_t vocab_text_bytes = 0;
};
// Writes the whole directory into DIR.tmp, then renames it to DIR.
Summary write_checkpoint(const Config& c, const std::string& dir, const WriteOptions& opt = {});

}  // namespace kimi::synth
