// Tokenizer vocabulary for GGUF (k3-architecture.md §4.1): tiktoken ranks (or a HF tokenizer.json)
// -> tokenizer.ggml.tokens / token_type / merges, plus the special ids and the chat template.
#pragma once
#include <array>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace kimi {
struct HfConfig;
}

namespace kimi::convert {

// GPT-2 byte -> unicode table (UTF-8 string of one code point per byte value).
const std::array<std::string, 256>& gpt2_byte_to_unicode();
// Maps raw token bytes to the GPT-2 byte-level string used in tokenizer.ggml.tokens / merges.
std::string gpt2_encode_bytes(std::string_view bytes);
// Inverse mapping; returns false when `s` contains a code point that is not in the table.
bool gpt2_decode(std::string_view s, std::string* bytes);

// Standard base64 (RFC 4648, '=' padding optional). Returns false on an invalid character.
bool base64_decode(std::string_view in, std::string* out);

// tiktoken rank file: one "BASE64 RANK" per line. Returns the token bytes indexed by rank; ranks
// must be unique and cover 0..n-1, token bytes unique. Throws kimi::Error naming the file and line.
std::vector<std::string> parse_tiktoken(const std::string& text, const std::string& label);
std::vector<std::string> load_tiktoken(const std::string& path);

// Merges reconstructed from ranks (§4.1): for every token of rank R and length >= 2, byte-level BPE
// of its bytes using only merges whose result has rank < R (lowest rank first, leftmost on ties);
// when that ends in exactly two pieces A, B, emit "A B" (GPT-2 strings). Emitted in rank order.
std::vector<std::string> reconstruct_merges(const std::vector<std::string>& token_bytes_by_rank);

enum TokenType : int32_t { TOKEN_NORMAL = 1, TOKEN_UNKNOWN = 2, TOKEN_CONTROL = 3, TOKEN_USER_DEFINED = 4,
                           TOKEN_UNUSED = 5, TOKEN_BYTE = 6 };

struct Vocab {
  std::string source;                  // path of tiktoken.model or tokenizer.json
  size_t n_base = 0;                   // number of base (BPE) tokens
  std::vector<std::string> tokens;     // exactly vocab_size entries
  std::vector<int32_t> types;          // TokenType per token
  std::vector<std::string> merges;
  std::optional<uint32_t> bos, eos, pad;
  std::optional<bool> add_bos;         // only when tokenizer_config.json sets add_bos_token
  std::optional<std::string> chat_template;
};

// Builds the GGUF vocabulary of an HF model directory: tiktoken.model (+ tokenizer_config.json
// added_tokens_decoder for the specials), else tokenizer.json. vocab_size, bos/eos/pad ids come from
// the config (eos = config eos_token_id). Ids with no token become "[PAD{id}]" (UNUSED).
Vocab load_vocab(const std::string& hf_dir, const HfConfig& cfg);

}  // namespace kimi::convert
