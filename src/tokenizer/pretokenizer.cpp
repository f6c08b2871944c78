#include "tokenizer/pretokenizer.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include <algorithm>
#include <array>
#include <cstdint>

#include "util/error.h"
#include "util/per_thread.h"

namespace kimi::tok {

const char* const kKimiPattern =
    R"([\p{Han}]+|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]*[\p{Ll}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]+[\p{Ll}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
const char* const kCl100kPattern =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
const char* const kO200kPattern =
    R"([^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+)";

// ---------------------------------------------------------------------------------------------
// Pattern translation

namespace {

bool is_general_category(std::string_view n) {
  static const char* const kNames[] = {
      "C", "Cc", "Cf", "Cn", "Co", "Cs", "L", "L&", "LC", "Ll", "Lm", "Lo", "Lt", "Lu", "M", "Mc", "Me", "Mn",
      "N", "Nd", "Nl", "No", "P", "Pc", "Pd", "Pe", "Pf", "Pi", "Po", "Ps", "S", "Sc", "Sk", "Sm", "So",
      "Z", "Zl", "Zp", "Zs", "Any", "Letter", "Mark", "Number", "Punctuation", "Symbol", "Separator", "Other",
      "Uppercase_Letter", "Lowercase_Letter", "Titlecase_Letter", "Modifier_Letter", "Other_Letter",
      "Decimal_Number", "Letter_Number", "Other_Number", "Nonspacing_Mark", "Spacing_Mark", "Enclosing_Mark",
      "Xan", "Xps", "Xsp", "Xwd", "Xuc"};
  for (const char* k : kNames)
    if (n == k) return true;
  return false;
}

// Translates the name inside \p{...}.
std::string translate_property(std::string_view name, std::string_view whole) {
  std::string n(name);
  n.erase(std::remove(n.begin(), n.end(), ' '), n.end());
  const size_t eq = n.find_first_of("=:");
  if (eq != std::string::npos) {
    const std::string key = n.substr(0, eq), val = n.substr(eq + 1);
    if (key == "Script" || key == "sc" || key == "script") return "sc:" + val;
    if (key == "Script_Extensions" || key == "scx") return "scx:" + val;
    if (key == "General_Category" || key == "gc") return val;
    fail("pre-tokenizer pattern: unsupported property '{}'", whole);
  }
  if (is_general_category(n)) return n;
  return "sc:" + n;  // Rust: a bare name that is not a category or binary property is a Script
}

struct ClassParser {
  std::string_view p;
  size_t i = 0;

  [[noreturn]] void bad(const char* what) const {
    fail("pre-tokenizer pattern: {} at offset {} in '{}'", what, i, p);
  }

  // Copies one escape sequence starting at p[i] == '\\' (translating \p{..} names).
  std::string escape() {
    if (i + 1 >= p.size()) bad("trailing backslash");
    const char c = p[i + 1];
    if ((c == 'p' || c == 'P') && i + 2 < p.size()) {
      if (p[i + 2] == '{') {
        const size_t close = p.find('}', i + 3);
        if (close == std::string_view::npos) bad("unterminated \\p{");
        std::string_view name = p.substr(i + 3, close - (i + 3));
        std::string out = std::string("\\") + c + "{" + translate_property(name, p.substr(i, close + 1 - i)) + "}";
        i = close + 1;
        return out;
      }
      std::string out = std::string("\\") + c + p[i + 2];  // one-letter form \pL
      i += 3;
      return out;
    }
    if (c == 'x' && i + 2 < p.size() && p[i + 2] == '{') {
      const size_t close = p.find('}', i + 3);
      if (close == std::string_view::npos) bad("unterminated \\x{");
      std::string out(p.substr(i, close + 1 - i));
      i = close + 1;
      return out;
    }
    std::string out(p.substr(i, 2));
    i += 2;
    return out;
  }

  // A parsed class: a list of operands joined by '&&'; each operand is a union of simple items
  // (kept as PCRE2 class text) and nested classes (already translated to one-code-point atoms).
  // Returns a PCRE2 expression matching exactly one code point. p[i] == '['.
  std::string parse_class() {
    ++i;  // '['
    bool negated = false;
    if (i < p.size() && p[i] == '^') {
      negated = true;
      ++i;
    }
    std::vector<std::string> operands;  // each one a one-code-point atom
    std::string simple;                 // simple items of the current operand
    std::vector<std::string> nested;    // nested atoms of the current operand
    bool first = true;
    auto finish_operand = [&]() {
      std::string atom;
      if (nested.empty()) {
        if (simple.empty()) bad("empty character class operand");
        atom = "[" + simple + "]";
      } else {
        std::vector<std::string> alts = nested;
        if (!simple.empty()) alts.insert(alts.begin(), "[" + simple + "]");
        if (alts.size() == 1) {
          atom = alts[0];
        } else {
          atom = "(?:";
          for (size_t k = 0; k < alts.size(); ++k) atom += (k ? "|" : "") + alts[k];
          atom += ")";
        }
      }
      operands.push_back(atom);
      simple.clear();
      nested.clear();
    };
    for (;;) {
      if (i >= p.size()) bad("unterminated character class");
      const char c = p[i];
      if (c == ']' && !first) {
        ++i;
        break;
      }
      first = false;
      if (c == '\\') {
        simple += escape();
      } else if (c == '[') {
        if (i + 1 < p.size() && p[i + 1] == ':') {  // POSIX class [:alpha:]
          const size_t close = p.find(":]", i + 2);
          if (close == std::string_view::npos) bad("unterminated POSIX class");
          simple += p.substr(i, close + 2 - i);
          i = close + 2;
        } else {
          nested.push_back(parse_class());
        }
      } else if (c == '&' && i + 1 < p.size() && p[i + 1] == '&') {
        i += 2;
        finish_operand();
        first = true;  // Rust allows ']' right after '&&'? no, but treat as an operand start
        first = false;
      } else {
        // a literal (or a range dash): escape PCRE2 class metacharacters that Rust treats literally
        if (c == '[' || c == ']') simple += '\\';
        simple += c;
        ++i;
      }
    }
    finish_operand();
    std::string expr;
    if (operands.size() == 1) {
      expr = operands[0];
    } else {
      expr = "(?:";
      for (size_t k = 0; k + 1 < operands.size(); ++k) expr += "(?=" + operands[k] + ")";
      expr += operands.back() + ")";
    }
    if (negated) {
      // For a simple single-bracket class just flip it; otherwise "not X, then any code point".
      if (operands.size() == 1 && expr.size() >= 2 && expr[0] == '[' && expr[1] != '^' &&
          expr.find('[', 1) == std::string::npos) {
        // simple class text may contain '[' only inside a POSIX class, which we excluded above
        expr = "[^" + expr.substr(1);
      } else {
        expr = "(?:(?!" + expr + ")(?s:.))";
      }
    }
    return expr;
  }
};

}  // namespace

std::string translate_pattern(std::string_view pattern) {
  ClassParser cp{pattern};
  std::string out;
  out.reserve(pattern.size() * 2);
  while (cp.i < pattern.size()) {
    const char c = pattern[cp.i];
    if (c == '\\') {
      out += cp.escape();
    } else if (c == '[') {
      out += cp.parse_class();
    } else {
      out += c;
      ++cp.i;
    }
  }
  return out;
}

// ---------------------------------------------------------------------------------------------
// PCRE2 wrapper

struct Pretokenizer::Code {
  pcre2_code* re = nullptr;
  bool jit = false;
  ~Code() {
    if (re) pcre2_code_free(re);
  }
};

namespace {
// Per-thread match state (match data + JIT stack), reused across calls: no allocation per split.
struct ThreadMatchState {
  pcre2_match_data* md = nullptr;
  pcre2_match_context* mctx = nullptr;
  pcre2_jit_stack* stack = nullptr;
  ThreadMatchState() {
    md = pcre2_match_data_create(4, nullptr);
    mctx = pcre2_match_context_create(nullptr);
    stack = pcre2_jit_stack_create(64 * 1024, 64 * 1024 * 1024, nullptr);
    if (!md || !mctx || !stack) fail("pre-tokenizer: out of memory creating PCRE2 match state");
    pcre2_jit_stack_assign(mctx, nullptr, stack);
  }
  ~ThreadMatchState() {
    pcre2_match_data_free(md);
    pcre2_match_context_free(mctx);
    pcre2_jit_stack_free(stack);
  }
  // The JIT stack's pages stay resident once touched: a match over a huge piece (a 4 MB "abab..."
  // is one piece) touches ~32 MB of it, and every server handler thread has its own. After such a
  // match the stack is replaced by a fresh one (untouched pages cost nothing).
  void reset_stack() {
    pcre2_jit_stack* fresh = pcre2_jit_stack_create(64 * 1024, 64 * 1024 * 1024, nullptr);
    if (!fresh) return;  // keep the old one
    pcre2_jit_stack_free(stack);
    stack = fresh;
    pcre2_jit_stack_assign(mctx, nullptr, stack);
  }
};
ThreadMatchState& match_state() { return per_thread<ThreadMatchState, ThreadMatchState>(); }
std::string pcre2_message(int code) {
  PCRE2_UCHAR buf[256];
  pcre2_get_error_message(code, buf, sizeof buf);
  return reinterpret_cast<const char*>(buf);
}
}  // namespace

Pretokenizer::Pretokenizer(std::string pattern) : pattern_(std::move(pattern)) {
  translated_ = translate_pattern(pattern_);
  code_ = std::make_unique<Code>();
  int err = 0;
  PCRE2_SIZE off = 0;
  code_->re = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(translated_.data()), translated_.size(),
                            PCRE2_UTF | PCRE2_UCP, &err, &off, nullptr);
  if (!code_->re)
    fail("pre-tokenizer pattern: PCRE2 rejects '{}' (translated from '{}') at offset {}: {}", translated_, pattern_,
         off, pcre2_message(err));
  code_->jit = pcre2_jit_compile(code_->re, PCRE2_JIT_COMPLETE) == 0;
}

Pretokenizer::~Pretokenizer() = default;
Pretokenizer::Pretokenizer(Pretokenizer&&) noexcept = default;
Pretokenizer& Pretokenizer::operator=(Pretokenizer&&) noexcept = default;

bool Pretokenizer::jit() const { return code_->jit; }

void Pretokenizer::split(std::string_view text, std::vector<std::string_view>& out) const {
  split_from(text, 0, SIZE_MAX, out);
}

size_t Pretokenizer::split_from(std::string_view text, size_t start, size_t max_pieces,
                                std::vector<std::string_view>& out) const {
  ThreadMatchState& st = match_state();
  const auto* subject = reinterpret_cast<PCRE2_SPTR>(text.data());
  const size_t n = text.size();
  size_t pos = start, got = 0, longest = 0;
  struct Reset {  // also when a match fails (throws)
    ThreadMatchState& st;
    const size_t& longest;
    ~Reset() {
      if (longest > (size_t{64} << 10)) st.reset_stack();
    }
  } reset{st, longest};
  while (pos < n && got < max_pieces) {
    const int rc = code_->jit ? pcre2_jit_match(code_->re, subject, n, pos, 0, st.md, st.mctx)
                              : pcre2_match(code_->re, subject, n, pos, PCRE2_NO_UTF_CHECK, st.md, st.mctx);
    if (rc == PCRE2_ERROR_NOMATCH) return n;
    if (rc < 0) fail("pre-tokenizer: PCRE2 match failed at byte {} of a {}-byte text: {}", pos, n, pcre2_message(rc));
    const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(st.md);
    const size_t s = ov[0], e = ov[1];
    if (e <= s) {  // empty match: step over one code point (as find_iter does)
      size_t step = 1;
      while (s + step < n && (static_cast<uint8_t>(text[s + step]) & 0xC0) == 0x80) ++step;
      pos = s + step;
      continue;
    }
    out.push_back(text.substr(s, e - s));
    longest = std::max(longest, e - s);
    ++got;
    pos = e;
  }
  return pos < n ? pos : n;
}

}  // namespace kimi::tok
