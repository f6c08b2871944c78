// One place that bounds every hyper-parameter the loader and the forward pass compute with.
//
// The loader multiplies, adds and divides GGUF values (head_count * key_length, kv_lora_rank +
// rope.dimension_count, ceil(block_count / attn_res.block_size), context * bytes per token, ...) in
// 32- or 64-bit unsigned arithmetic. A hostile or corrupt file can make such an expression wrap (e.g.
// attn_res.block_size near 2^32 turns the bank size into 0), a later size check then passes and the
// forward pass writes past a buffer. validate_hparams checks each value against the range a real
// Kimi-K3 model can have (generously: several times the largest released model) and every derived
// quantity with 64-bit overflow-checked arithmetic, before any tensor is bound or buffer is sized.
#pragma once
#include <cstdint>
#include <string>

namespace kimi {

struct HParams;
namespace gguf {
class Reader;
}

// Limits (inclusive). Kimi-K3: 7168 wide, 64 heads, 61 layers, 384 experts, vocab 163840, 1M context.
struct HParamLimits {
  static constexpr uint64_t max_layers = 4096;
  static constexpr uint64_t max_embd = 1u << 17;      // n_embd, expert_latent_length
  static constexpr uint64_t max_heads = 4096;         // attention / indexer heads
  static constexpr uint64_t max_head_dim = 1u << 16;  // key/value/rope/kda/indexer dims, lora ranks
  static constexpr uint64_t max_width = 1u << 24;     // heads x dim products, FFN widths
  static constexpr uint64_t max_experts = 1u << 16;
  static constexpr uint64_t max_conv_kernel = 64;
  static constexpr uint64_t max_vocab = 1u << 24;
  static constexpr uint64_t max_ctx = 1u << 27;       // context_length and indexer top_k
};

// Throws kimi::Error "FILE: key 'kimi-k3.K' = V: ..." naming the first bad value. `r` supplies the
// keys that HParams does not hold yet (vocab_size, token_embd rows).
void validate_hparams(const HParams& hp, const gguf::Reader& r, const std::string& file);

}  // namespace kimi
