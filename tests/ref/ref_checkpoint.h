// Test checkpoints for the reference: a small random Kimi-K3.1 HF checkpoint written directly
// (config.json + model.safetensors, no tokenizer files) so the reference self-checks do not depend
// on `kimi synth`, and a patcher that copies an HF directory while rewriting chosen tensors
// (used to build special cases such as exact indexer ties from a synth checkpoint).
#pragma once
#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <vector>

namespace kimi::ref {

struct RandomSpec {
  uint64_t seed = 1;
  int64_t d = 32, n_layer = 4, n_head = 2, kda_dim = 8, conv_k = 4;
  std::vector<int64_t> full_attn_1based = {2, 4};
  int64_t q_lora = 16, kv_lora = 16, nope = 8, rope = 4, vdim = 8;
  int64_t dense_width = 64, n_expert = 4, n_used = 2, n_shared = 1, moe_width = 32, latent = 32;
  int64_t block_size = 2, vocab = 64;
  int64_t idx_heads = 2, idx_dim = 8, idx_topk = 4;
  int64_t a_log_len = 0;  // 0: max(n_head, kda_dim)
  double routed_scale = 2.5;
  bool mxfp4 = true;      // routed experts as compressed-tensors mxfp4-pack-quantized
};

// Writes DIR/config.json and DIR/model.safetensors (DIR must exist). Weights are BF16 except the
// KDA conv / A_log / dt_bias / o_norm (F32), the router bias (F32) and MXFP4 experts (U8).
void write_random_checkpoint(const std::string& dir, const RandomSpec& spec);

// Copies every file of the HF directory SRC into DST (created), rewriting each tensor named in
// EDITS (full safetensors name): it is decoded to double, passed to the function, and written back
// in its original dtype (BF16/F16/F32, round to nearest even).
using TensorEdit = std::function<void(std::vector<double>& values, const std::vector<int64_t>& shape)>;
void patch_checkpoint(const std::string& src, const std::string& dst, const std::map<std::string, TensorEdit>& edits);

}  // namespace kimi::ref
