// Pre-tokenizer: splits text into pieces with a tiktoken-style regex, run by PCRE2 (UTF + UCP + JIT).
//
// Patterns are written in the syntax of Rust's `regex` crate (what tiktoken runs). PCRE2 differs
// in two ways that matter for the Kimi / OpenAI patterns, and translate_pattern() rewrites them:
//  * character-class intersection `[X&&Y]` does not exist in PCRE2: it becomes `(?:(?=Y)X)`
//    (one code point that satisfies Y, then the same code point consumed by X);
//  * `\p{Han}` (a bare script name) means Script=Han in Rust but Script_Extensions=Han in
//    PCRE2 >= 10.40 (which would pull in e.g. U+3001 `、`): bare script names become `\p{sc:Name}`.
// Everything else (general categories, \s, (?i:...), lookahead) is passed through unchanged.
#pragma once
#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace kimi::tok {

// The Kimi (K2/K3) pre-tokenizer regex, exactly as written in the Kimi tokenizer.
extern const char* const kKimiPattern;
// OpenAI patterns (for tests and `kimi tokenize --tiktoken`).
extern const char* const kCl100kPattern;
extern const char* const kO200kPattern;

// Rust-regex syntax -> PCRE2 syntax (see above). Throws kimi::Error on unbalanced classes.
std::string translate_pattern(std::string_view rust_pattern);

class Pretokenizer {
 public:
  explicit Pretokenizer(std::string pattern);  // Rust-regex syntax; throws kimi::Error on a bad pattern
  ~Pretokenizer();
  Pretokenizer(Pretokenizer&&) noexcept;
  Pretokenizer& operator=(Pretokenizer&&) noexcept;

  // Appends the pieces of `text` (which must be valid UTF-8) to `out`, in order: the successive
  // leftmost-first matches, as tiktoken's find_iter yields them (text between matches, if a
  // pattern leaves any, is skipped just as tiktoken skips it).
  void split(std::string_view text, std::vector<std::string_view>& out) const;
  // The same from byte `start` of `text` (matching still sees the text before it), stopping after
  // `max_pieces` pieces; returns the byte where the next call continues (text.size() at the end).
  size_t split_from(std::string_view text, size_t start, size_t max_pieces, std::vector<std::string_view>& out) const;

  const std::string& pattern() const { return pattern_; }
  const std::string& pcre2_pattern() const { return translated_; }
  bool jit() const;

 private:
  std::string pattern_, translated_;
  struct Code;
  std::unique_ptr<Code> code_;
};

}  // namespace kimi::tok
