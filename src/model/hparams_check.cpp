#include "model/hparams_check.h"

#include <cmath>
#include <tuple>

#include "io/gguf.h"
#include "model/model.h"
#include "util/error.h"

namespace kimi {

namespace {

struct Checker {
  const HParams& hp;
  const std::string& file;
  const std::string a;  // "kimi-k3."

  [[noreturn]] void bad(const std::string& key, uint64_t v, const std::string& why) const {
    fail("{}: key '{}{}' = {}: {}", file, a, key, v, why);
  }
  void range(const std::string& key, uint64_t v, uint64_t lo, uint64_t hi) const {
    if (v < lo || v > hi) bad(key, v, fmt::format("must be in {}..{}", lo, hi));
  }
  // a * b with the product bounded by `hi` (64-bit, no wrap)
  uint64_t product(const std::string& what, uint64_t x, uint64_t y, uint64_t hi) const {
    uint64_t p = 0;
    if (__builtin_mul_overflow(x, y, &p) || p > hi)
      fail("{}: {} = {} x {} exceeds the limit of {}", file, what, x, y, hi);
    return p;
  }
  void finite(const std::string& key, float v, bool positive) const {
    if (!std::isfinite(v) || (positive && !(v > 0.0f)))
      fail("{}: key '{}{}' = {}: must be a finite{} number", file, a, key, v, positive ? " positive" : "");
  }
};

}  // namespace

void validate_hparams(const HParams& hp, const gguf::Reader& r, const std::string& file) {
  using L = HParamLimits;
  const Checker c{hp, file, hp.arch + "."};

  c.range("block_count", hp.n_layer, 1, L::max_layers);
  check(hp.is_mla.size() == hp.n_layer, "{}: layer schedule has {} entries for {} layers", file, hp.is_mla.size(),
        hp.n_layer);
  c.range("embedding_length", hp.n_embd, 1, L::max_embd);
  c.range("attention.head_count", hp.n_head, 1, L::max_heads);
  c.range("context_length", hp.n_ctx_train, 0, L::max_ctx);
  c.finite("attention.layer_norm_rms_epsilon", hp.rms_eps, true);
  // leading_dense_block_count is clamped to block_count by the loader
  if (hp.n_dense_lead > 0) c.range("feed_forward_length", hp.n_ff, 1, L::max_width);

  const uint32_t n_mla = hp.n_mla_layers();
  if (n_mla > 0) {
    c.range("attention.q_lora_rank", hp.q_lora, 1, L::max_head_dim);
    c.range("attention.kv_lora_rank", hp.kv_lora, 1, L::max_head_dim);
    c.range("rope.dimension_count", hp.n_rope, 0, L::max_head_dim);
    c.range("attention.key_length_mla", hp.n_kq, 1, L::max_head_dim);
    c.range("attention.value_length_mla", hp.n_v, 1, L::max_head_dim);
    c.product("attention.head_count x key_length_mla", hp.n_head, hp.n_kq, L::max_width);
    c.product("attention.head_count x value_length_mla", hp.n_head, hp.n_v, L::max_width);
    c.product("attention.head_count x kv_lora_rank", hp.n_head, hp.kv_lora, L::max_width);
    // mla_row() = kv_lora + n_rope in uint32: both <= 2^16, so no wrap
  }
  if (hp.n_kda_layers() > 0) {
    c.range("kda.head_dim", hp.kda_head_dim, 1, L::max_head_dim);
    c.range("ssm.conv_kernel", hp.conv_kernel, 1, L::max_conv_kernel);
    // kda_channels() = n_head * head_dim in uint32; the recurrent state is H x D x D floats per layer
    c.product("attention.head_count x kda.head_dim", hp.n_head, hp.kda_head_dim, L::max_width);
    c.product("attention.head_count x kda.head_dim^2",
              static_cast<uint64_t>(hp.n_head) * hp.kda_head_dim, hp.kda_head_dim, uint64_t(1) << 40);
  }
  if (hp.has_gate_lb) c.finite("kda.gate_lower_bound", hp.gate_lb, false);

  if (hp.n_dense_lead < hp.n_layer) {  // MoE layers
    c.range("expert_count", hp.n_expert, 1, L::max_experts);
    c.range("expert_used_count", hp.n_expert_used, 1, hp.n_expert);
    c.range("expert_shared_count", hp.n_expert_shared, 0, 1024);
    c.range("expert_feed_forward_length", hp.n_ff_exp, 1, L::max_width);
    c.range("expert_latent_length", hp.n_latent, 0, L::max_embd);
    const uint64_t lw = hp.n_latent ? hp.n_latent : hp.n_embd;
    c.product("expert_feed_forward_length x expert_shared_count", hp.n_ff_exp, hp.n_expert_shared, L::max_width);
    // one stacked expert tensor: width x ff x experts elements (bounded again by the file size)
    c.product("experts x expert_feed_forward_length x width", c.product("expert_count x expert_feed_forward_length",
              hp.n_expert, hp.n_ff_exp, uint64_t(1) << 40), lw, uint64_t(1) << 56);
    c.finite("expert_weights_scale", hp.expert_weights_scale, false);
  }

  // ResMix: one bank entry per block of layers, ceil(n_layer / block) computed in 32 bits by the forward
  // pass; a block near 2^32 made that wrap to 0. A block longer than this file's layers is valid: a
  // slice of the real model (k3-layers --layers 4) keeps its block of 12, all its layers in one block.
  if (hp.attn_res_block != 0) c.range("attn_res.block_size", hp.attn_res_block, 1, L::max_layers);
  c.finite("activation.situ_beta", hp.situ_beta, false);
  c.finite("activation.situ_linear_beta", hp.situ_lambda, false);
  // SiTU divides by both (beta·tanh(g/beta); lambda·tanh(u/lambda) when lambda > 0): 0 or a subnormal
  // made the reciprocal infinite and every activation NaN (found by fuzz_model)
  for (const auto& [key, v, used] : {std::tuple{"activation.situ_beta", hp.situ_beta, true},
                                     std::tuple{"activation.situ_linear_beta", hp.situ_lambda, hp.situ_lambda > 0}})
    if (used && !std::isfinite(1.0f / v))
      fail("{}: key '{}{}' = {}: must not be 0 or so small that its reciprocal overflows", file, c.a, key, v);

  if (hp.has_indexer) {
    c.range("attention.indexer.head_count", hp.idx_heads, 1, L::max_heads);
    c.range("attention.indexer.key_length", hp.idx_dim, 1, L::max_head_dim);
    c.range("attention.indexer.top_k", hp.idx_top_k, 1, L::max_ctx);
    c.product("attention.indexer.head_count x key_length", hp.idx_heads, hp.idx_dim, L::max_width);
  }

  // vocabulary: vocab_size, else the rows of token_embd.weight (as the loader reads it); ids are int32
  uint64_t vocab = r.get_u32_or(c.a + "vocab_size", 0);
  if (vocab == 0) {
    const gguf::TensorInfo* te = r.find_tensor("token_embd.weight");
    if (te) vocab = static_cast<uint64_t>(te->ne[1]);
  }
  if (vocab != 0) {
    c.range("vocab_size", vocab, 1, L::max_vocab);
    for (auto [key, id] : {std::pair{"tokenizer.ggml.bos_token_id", hp.bos_id},
                           std::pair{"tokenizer.ggml.eos_token_id", hp.eos_id}}) {
      if (r.has(key) && (id < 0 || static_cast<uint64_t>(id) >= vocab))
        fail("{}: key '{}' = {}: not a token id of the {}-token vocabulary", file, key,
             r.get_u32(key), vocab);
    }
  }

  // per-token cache and per-sequence state sizes, at the largest context, fit in 64 bits
  const uint64_t row = static_cast<uint64_t>(hp.kv_lora) + hp.n_rope + (hp.has_indexer ? hp.idx_dim : 0);
  const uint64_t per_token = c.product("MLA layers x cache row", n_mla, row * 4, uint64_t(1) << 40);
  c.product("context x cache bytes per token", L::max_ctx, per_token, uint64_t(1) << 62);
  const uint64_t C = static_cast<uint64_t>(hp.n_head) * hp.kda_head_dim;
  const uint64_t per_layer_state =
      3 * C * (hp.conv_kernel > 0 ? hp.conv_kernel - 1 : 0) * 4 + C * hp.kda_head_dim * 4;
  c.product("KDA layers x state bytes", hp.n_kda_layers(), per_layer_state, uint64_t(1) << 56);
}

}  // namespace kimi
