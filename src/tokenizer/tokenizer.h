// Kimi tokenizer: tiktoken-style byte-level BPE with the Kimi pre-tokenizer regex.
//
// Sources:
//  * a GGUF vocabulary (tokenizer.ggml.*, as `kimi convert` / llama.cpp write it): tokens are the
//    GPT-2 byte->unicode strings of each base token, merges give the merge priority (line index);
//    CONTROL (3) and USER_DEFINED (4) tokens are special tokens with literal text;
//  * a tiktoken rank file (`base64 rank` lines, or the JSON of the `tiktoken` npm package) plus a
//    regex and a special-token map: BPE by rank, exactly as OpenAI's tiktoken.
//
// encode(): special tokens are matched first (leftmost, longest; only when allow_special), the
// text between them is pre-tokenized with the regex and each piece is BPE-encoded. Input that is
// not valid UTF-8 is first decoded as the WHATWG decoder does (each maximal invalid subsequence
// becomes U+FFFD), which is what tiktoken sees when handed the same bytes as a string.
// No BOS is added (the K3 convention); add_bos() reports the GGUF flag for callers that want it.
#pragma once
#include <cstdint>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace kimi::gguf {
class Reader;
}

namespace kimi::tok {

enum class TokenType : int32_t {
  Undefined = 0, Normal = 1, Unknown = 2, Control = 3, UserDefined = 4, Unused = 5, Byte = 6,
};

// The tokenizer.ggml.* content of a GGUF file (what from_gguf reads).
struct GgufVocab {
  std::string model = "gpt2";          // tokenizer.ggml.model
  std::string pre = "kimi-k2";         // tokenizer.ggml.pre
  std::vector<std::string> tokens;     // tokenizer.ggml.tokens (GPT-2-mapped for normal tokens)
  std::vector<int32_t> types;          // tokenizer.ggml.token_type (empty: all normal)
  std::vector<std::string> merges;     // tokenizer.ggml.merges ("A B"); empty: BPE by rank (id)
  int32_t bos = -1, eos = -1, eot = -1, pad = -1, unk = -1;
  bool add_bos = false;
  std::string source = "<memory>";     // for error messages (the GGUF path)
};

// Maps tokenizer.ggml.pre to a pattern: "kimi-k2" -> kKimiPattern (others are rejected).
std::string pattern_for_pre(const std::string& pre);

class Tokenizer {
 public:
  static Tokenizer from_gguf(const gguf::Reader& reader);
  static Tokenizer from_vocab(const GgufVocab& vocab);
  // rank_file: `base64 rank` lines (tiktoken format) or the npm tiktoken encoder JSON
  // ({"bpe_ranks": "...", "special_tokens": {...}, "pat_str": "..."}). An empty pattern or an
  // empty specials map takes the JSON's pat_str / special_tokens where present.
  static Tokenizer from_tiktoken(const std::string& rank_file, const std::string& pattern,
                                 const std::map<std::string, int32_t>& specials);
  // The same from memory: ranks[i] = {token bytes, rank}.
  static Tokenizer from_ranks(const std::vector<std::pair<std::string, int32_t>>& ranks, const std::string& pattern,
                              const std::map<std::string, int32_t>& specials);

  Tokenizer(Tokenizer&&) noexcept;
  Tokenizer& operator=(Tokenizer&&) noexcept;
  ~Tokenizer();

  std::vector<int32_t> encode(std::string_view text, bool allow_special = true) const;
  void encode(std::string_view text, std::vector<int32_t>& out, bool allow_special = true) const;  // appends
  // As encode(), but stops as soon as more than `max_tokens` tokens are produced: the result is the
  // whole encoding when it has at most `max_tokens` tokens, otherwise a prefix of it that is longer
  // (for callers that refuse long inputs without tokenizing all of them).
  std::vector<int32_t> encode_limited(std::string_view text, size_t max_tokens, bool allow_special = true) const;
  // Length in bytes of the longest token (special tokens as their text): a text of B bytes has at
  // least ceil(B / max_token_bytes()) tokens.
  size_t max_token_bytes() const;
  // Pre-tokenizer pieces (raw bytes; a matched special token is one piece of its own).
  std::vector<std::string> split(std::string_view text, bool allow_special = true) const;

  // Raw bytes of the ids (special tokens as their text). Throws kimi::Error on an id out of range.
  std::string decode(std::span<const int32_t> ids) const;
  const std::string& token_to_piece(int32_t id) const;  // raw bytes (special: its text)
  int32_t token_id(std::string_view piece) const;       // exact piece (specials by text); -1 if none

  int32_t n_vocab() const;
  int32_t bos_id() const;
  int32_t eos_id() const;
  int32_t eot_id() const;  // [EOT] (or tokenizer.ggml.eot_token_id); -1 if none
  int32_t pad_id() const;
  bool add_bos() const;
  bool is_eog(int32_t id) const;      // eos, [EOT], [EOS] (and the GGUF eot id)
  bool is_special(int32_t id) const;  // control / user-defined / tiktoken special
  TokenType token_type(int32_t id) const;
  bool rank_mode() const;             // true: BPE by rank (tiktoken); false: by merges (GGUF)
  const std::string& pattern() const;

 private:
  struct Impl;
  explicit Tokenizer(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
  friend class Detokenizer;
};

// Incremental detokenizer for streaming: push() returns only complete, valid UTF-8 text; bytes of
// a code point split across tokens are held back until it is complete. Bytes that can never form
// valid UTF-8 come out as U+FFFD, so the concatenated output equals utf8_sanitize(decode(all ids)).
class Detokenizer {
 public:
  explicit Detokenizer(const Tokenizer& tok, bool skip_special = false) : tok_(&tok), skip_special_(skip_special) {}
  std::string push(int32_t id);
  std::string flush();  // end of stream: a held incomplete sequence becomes U+FFFD
  void reset() { pending_.clear(); }
  size_t pending_bytes() const { return pending_.size(); }

 private:
  const Tokenizer* tok_;
  bool skip_special_;
  std::string pending_;
};

}  // namespace kimi::tok
