// JSON schema -> GBNF (grammar.h: schema_to_gbnf, json_object_gbnf).
#include <fmt/format.h>

#include <algorithm>
#include <cctype>
#include <chrono>
#include <cmath>
#include <optional>
#include <map>
#include <set>

#include "server/grammar.h"

namespace kimi::server::grammar {

namespace {

using ojson = nlohmann::ordered_json;

// Shared rules of every JSON grammar. Whitespace is limited (no endless runs of spaces); numbers
// have at most 16 integer and 16 fraction digits.
const char* const kJsonBase = R"(
ws ::= ( " " | "\n" [ \t]{0,8} )?
json-value ::= json-object | json-array | json-string | json-number | json-boolean | json-null
json-object ::= "{" ws ( json-string ws ":" ws json-value ( ws "," ws json-string ws ":" ws json-value )* )? ws "}"
json-array ::= "[" ws ( json-value ( ws "," ws json-value )* )? ws "]"
json-char ::= [^"\\\x00-\x1f] | "\\" ( ["\\/bfnrt] | "u" [0-9a-fA-F]{4} )
json-string ::= "\"" json-char* "\""
json-int ::= "-"? ( "0" | [1-9] [0-9]{0,15} )
json-number ::= json-int ( "." [0-9]{1,16} )? ( [eE] [-+]? [0-9]{1,2} )?
json-integer ::= json-int
json-char1 ::= json-char
json-object-empty ::= "{" ws "}"
json-boolean ::= "true" | "false"
json-null ::= "null"
)";

std::string lit(const std::string& s) { return gbnf_literal(s); }

const std::set<std::string>& annotations() {
  static const std::set<std::string> a = {"title", "description", "default", "examples", "$schema", "$id",
                                          "$comment", "deprecated", "readOnly", "writeOnly", "$defs", "definitions"};
  return a;
}

// The largest magnitude a JSON grammar writes (16 digits, as json-int).
constexpr int64_t kMaxInt = 9999999999999999;

// GBNF of the decimal numbers (no sign, no leading zeros) in [a, b], 0 <= a <= b <= kMaxInt.
std::string same_len_range(const std::string& lo, const std::string& hi) {
  // lo, hi: digit strings of one length, lo <= hi
  if (lo.empty()) return "\"\"";
  if (lo == hi) return lit(lo);
  const size_t n = lo.size();
  const bool lo_zeros = lo.find_first_not_of('0', 1) == std::string::npos;
  const bool hi_nines = hi.find_first_not_of('9', 1) == std::string::npos;
  const std::string rest_any = n > 1 ? fmt::format(" [0-9]{{{}}}", n - 1) : "";
  if (lo[0] == hi[0]) return "\"" + std::string(1, lo[0]) + "\" " + same_len_range(lo.substr(1), hi.substr(1));
  if (lo_zeros && hi_nines) return fmt::format("[{}-{}]{}", lo[0], hi[0], rest_any);
  std::vector<std::string> alts;
  char from = lo[0], to = hi[0];
  if (!lo_zeros) {
    alts.push_back("\"" + std::string(1, lo[0]) + "\" ( " + same_len_range(lo.substr(1), std::string(n - 1, '9')) + " )");
    ++from;
  }
  std::string hi_alt;
  if (!hi_nines) {
    hi_alt = "\"" + std::string(1, hi[0]) + "\" ( " + same_len_range(std::string(n - 1, '0'), hi.substr(1)) + " )";
    --to;
  }
  if (from <= to) alts.push_back(fmt::format("[{}-{}]{}", from, to, rest_any));
  if (!hi_alt.empty()) alts.push_back(hi_alt);
  std::string o;
  for (const auto& a : alts) o += (o.empty() ? "" : " | ") + a;
  return "( " + o + " )";
}
std::string nonneg_range(int64_t a, int64_t b) {
  std::string o;
  const int da = static_cast<int>(std::to_string(a).size()), db = static_cast<int>(std::to_string(b).size());
  int64_t p = 1;
  for (int d = 1; d < da; ++d) p *= 10;
  for (int d = da; d <= db; ++d, p *= 10) {
    const int64_t lo = std::max(a, d == 1 ? int64_t{0} : p), hi = std::min(b, p * 10 - 1);
    if (lo > hi) continue;
    o += (o.empty() ? "" : " | ") + same_len_range(std::to_string(lo), std::to_string(hi));
  }
  return "( " + o + " )";
}
// Integers in [lo, hi] (|lo|, |hi| <= kMaxInt), as JSON writes them.
std::string int_range(int64_t lo, int64_t hi) {
  std::string o;
  if (lo < 0) o = "\"-\" " + nonneg_range(std::max<int64_t>(1, -hi), -lo);
  if (hi >= 0) o += (o.empty() ? "" : " | ") + nonneg_range(std::max<int64_t>(0, lo), hi);
  return "( " + o + " )";
}

// A JSON Schema `pattern` (the regex subset agents use) as GBNF over the characters of a JSON
// string's text (escaped where JSON needs it). Python's re.search semantics: unanchored ends match
// anywhere. Refused (SchemaError "pattern"): backreferences, lookaround, word boundaries, flags,
// Unicode properties, anchors other than a leading ^ / trailing $.
class RegexToGbnf {
 public:
  RegexToGbnf(const std::string& re, bool tool_text, const std::string& where)
      : re_(re), tool_(tool_text), where_(where) {}
  std::string run() {
    std::string body = re_;
    bool start = false, end = false;
    if (!body.empty() && body[0] == '^') start = true, body.erase(0, 1);
    if (!body.empty() && body.back() == '$') {
      size_t bs = 0;  // an escaped $ is a literal
      for (size_t k = body.size() - 1; k-- > 0 && body[k] == '\\';) ++bs;
      if (bs % 2 == 0) end = true, body.pop_back();
    }
    re_ = body;
    i_ = 0;
    top_alts_ = 0;
    std::string e = alt(0);
    if (i_ != re_.size()) fail("unbalanced ')'");
    if ((start || end) && top_alts_ > 0 && !(start && end)) fail("an anchor on one alternative only");
    if (top_alts_ > 0 && start != end) fail("an anchor on one alternative only");
    const std::string any = "json-char*";
    return "\"\\\"\" " + std::string(start ? "" : any + " ") + "( " + e + " ) " + (end ? "" : any + " ") + "\"\\\"\"";
  }

 private:
  [[noreturn]] void fail(const std::string& why) const {
    throw SchemaError("pattern", where_, fmt::format("JSON schema: 'pattern' at {} ({}) is not supported: {}", where_,
                                                     ojson(re_).dump(), why));
  }
  bool at(char c) const { return i_ < re_.size() && re_[i_] == c; }
  std::string alt(int depth) {
    if (depth > 32) fail("groups nested too deeply");
    std::string o = seq(depth);
    while (at('|')) {
      ++i_;
      if (depth == 0) ++top_alts_;
      o += " | " + seq(depth);
    }
    return o;
  }
  std::string seq(int depth) {
    std::string o;
    while (i_ < re_.size() && !at('|') && !at(')')) {
      std::string a = atom(depth);
      a = quant(a);
      o += (o.empty() ? "" : " ") + a;
    }
    return o.empty() ? "\"\"" : o;
  }
  int number() {
    size_t b = i_;
    while (i_ < re_.size() && std::isdigit(static_cast<unsigned char>(re_[i_]))) ++i_;
    if (b == i_ || i_ - b > 4) fail("a repetition count");
    return std::stoi(re_.substr(b, i_ - b));
  }
  std::string quant(const std::string& a) {
    if (i_ >= re_.size()) return a;
    const char c = re_[i_];
    std::string q;
    if (c == '*' || c == '+' || c == '?') {
      ++i_;
      q = std::string(1, c);
    } else if (c == '{') {
      const size_t save = i_;
      ++i_;
      if (!(i_ < re_.size() && std::isdigit(static_cast<unsigned char>(re_[i_])))) {
        i_ = save;  // a literal '{' (Python's reading)
        return a;
      }
      const int m = number();
      int n = m;
      bool open = false;
      if (at(',')) {
        ++i_;
        if (at('}')) open = true;
        else n = number();
      }
      if (!at('}')) fail("a malformed {m,n}");
      ++i_;
      if (m > 1000 || n > 1000 || (!open && n < m)) fail("a repetition count above 1000 or {m,n} with n < m");
      q = open ? fmt::format("{{{},}}", m) : fmt::format("{{{},{}}}", m, n);
    } else {
      return a;
    }
    if (at('?') || at('+')) ++i_;  // lazy / possessive: the same set of strings
    if (at('*') || at('+') || at('?') || at('{')) fail("a repeated quantifier");
    return "( " + a + " )" + q;
  }
  // one character of the string: its JSON form
  std::string char_lit(uint32_t c) const {
    if (c == '"') return "\"\\\\\\\"\"";
    if (c == '\\') return "\"\\\\\\\\\"";
    if (c == '\n') return "\"\\\\n\"";
    if (c == '\t') return "\"\\\\t\"";
    if (c == '\r') return "\"\\\\r\"";
    if (c < 0x20) return fmt::format("\"\\\\u{:04x}\"", c);
    if (tool_ && c == '<') return "\"\\\\u003c\"";  // never a raw '<' in a tool call's text (tags)
    if (c >= 0xE000 && c <= 0xE002) return fmt::format("\"\\\\u{:04X}\"", c);
    std::string u8;
    if (c < 0x80) u8 += static_cast<char>(c);
    else if (c < 0x800) u8 += {static_cast<char>(0xC0 | (c >> 6)), static_cast<char>(0x80 | (c & 0x3F))};
    else if (c < 0x10000)
      u8 += {static_cast<char>(0xE0 | (c >> 12)), static_cast<char>(0x80 | ((c >> 6) & 0x3F)), static_cast<char>(0x80 | (c & 0x3F))};
    else
      u8 += {static_cast<char>(0xF0 | (c >> 18)), static_cast<char>(0x80 | ((c >> 12) & 0x3F)),
             static_cast<char>(0x80 | ((c >> 6) & 0x3F)), static_cast<char>(0x80 | (c & 0x3F))};
    return gbnf_literal(u8);
  }
  // the characters a negated set may write: printable, no quote / backslash (and no '<' in a tool call)
  std::string excluded() const {
    return std::string("\"\\\\\\x00-\\x1f") + (tool_ ? "<\\uE000-\\uE002" : "");
  }
  static std::string cls_char(uint32_t c) {
    if (c == ']' || c == '\\' || c == '^' || c == '-' || c == '[') return std::string("\\") + static_cast<char>(c);
    if (c < 0x20 || c == 0x7f || c > 0x7e) return fmt::format("\\U{:08x}", c);
    return std::string(1, static_cast<char>(c));
  }
  // a positive set of ranges as GBNF: the plain characters in one class, quote / backslash /
  // controls as their escapes
  std::string ranges_gbnf(std::vector<std::pair<uint32_t, uint32_t>> rs) const {
    std::string cls, extra;
    for (auto [lo, hi] : rs) {
      for (uint32_t c : {uint32_t('"'), uint32_t('\\'), uint32_t('<')})
        if (lo <= c && c <= hi && !(c == '<' && !tool_)) extra += (extra.empty() ? "" : " | ") + char_lit(c);
      for (uint32_t c = lo; c <= hi && c < 0x20; ++c) extra += (extra.empty() ? "" : " | ") + char_lit(c);
      // the plain parts: [lo, hi] minus controls, '"', '\\' (and '<' for tools)
      std::vector<std::pair<uint32_t, uint32_t>> parts = {{std::max<uint32_t>(lo, 0x20), hi}};
      for (uint32_t cut : {uint32_t('"'), uint32_t('\\'), uint32_t('<')}) {
        if (cut == '<' && !tool_) continue;
        std::vector<std::pair<uint32_t, uint32_t>> next;
        for (auto [a, b] : parts) {
          if (a > b) continue;
          if (cut < a || cut > b) { next.push_back({a, b}); continue; }
          if (a < cut) next.push_back({a, cut - 1});
          if (cut < b) next.push_back({cut + 1, b});
        }
        parts = next;
      }
      for (auto [a, b] : parts) {
        if (a > b) continue;
        if (tool_ && a <= 0xE002 && b >= 0xE000) {  // the structural code points: never text
          if (a < 0xE000) cls += cls_char(a) + (a < 0xDFFF ? "-" + cls_char(0xDFFF) : "");
          if (b > 0xE002) cls += cls_char(0xE003) + (b > 0xE003 ? "-" + cls_char(b) : "");
          continue;
        }
        cls += cls_char(a) + (b > a ? "-" + cls_char(b) : "");
      }
    }
    std::string o = cls.empty() ? "" : "[" + cls + "]";
    if (!extra.empty()) o += (o.empty() ? "" : " | ") + extra;
    if (o.empty()) fail("a character set that matches nothing");
    return "( " + o + " )";
  }
  std::string negated_gbnf(const std::vector<std::pair<uint32_t, uint32_t>>& rs) const {
    std::string cls;
    for (auto [lo, hi] : rs) cls += cls_char(lo) + (hi > lo ? "-" + cls_char(hi) : "");
    return "[^" + cls + excluded() + "]";
  }
  uint32_t hexn(int n) {
    uint32_t v = 0;
    for (int k = 0; k < n; ++k, ++i_) {
      if (i_ >= re_.size() || !std::isxdigit(static_cast<unsigned char>(re_[i_]))) fail("a bad hex escape");
      const char c = static_cast<char>(std::tolower(static_cast<unsigned char>(re_[i_])));
      v = v * 16 + static_cast<uint32_t>(c <= '9' ? c - '0' : c - 'a' + 10);
    }
    return v;
  }
  uint32_t utf8() {
    const unsigned char c = static_cast<unsigned char>(re_[i_]);
    const int n = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 0;
    if (n == 0 || i_ + static_cast<size_t>(n) > re_.size()) fail("invalid UTF-8");
    uint32_t cp = n == 1 ? c : c & (0xFF >> (n + 1));
    for (int k = 1; k < n; ++k) cp = (cp << 6) | (static_cast<unsigned char>(re_[i_ + static_cast<size_t>(k)]) & 0x3F);
    i_ += static_cast<size_t>(n);
    return cp;
  }
  // an escape after '\\': a class (d w s and negations: -1..-6 in *cls) or a character
  uint32_t escape(int* cls) {
    if (i_ >= re_.size()) fail("a trailing backslash");
    const char e = re_[i_++];
    *cls = 0;
    switch (e) {
      case 'd': *cls = 1; return 0;
      case 'D': *cls = -1; return 0;
      case 'w': *cls = 2; return 0;
      case 'W': *cls = -2; return 0;
      case 's': *cls = 3; return 0;
      case 'S': *cls = -3; return 0;
      case 'n': return '\n';
      case 't': return '\t';
      case 'r': return '\r';
      case 'f': return '\f';
      case 'v': return '\v';
      case 'x': return hexn(2);
      case 'u': return hexn(4);
      default: break;
    }
    if (std::isalnum(static_cast<unsigned char>(e))) fail(fmt::format("the escape \\{}", e));
    --i_;
    return utf8();
  }
  static std::vector<std::pair<uint32_t, uint32_t>> cls_ranges(int cls) {
    switch (cls < 0 ? -cls : cls) {
      case 1: return {{'0', '9'}};
      case 2: return {{'0', '9'}, {'A', 'Z'}, {'_', '_'}, {'a', 'z'}};
      default: return {{' ', ' '}};  // \s: a space (the other white space needs escapes)
    }
  }
  std::string atom(int depth) {
    const char c = re_[i_];
    if (c == '(') {
      ++i_;
      if (at('?')) {
        ++i_;
        if (at(':')) ++i_;
        else if (at('P') && i_ + 1 < re_.size() && re_[i_ + 1] == '<') {
          i_ = re_.find('>', i_);
          if (i_ == std::string::npos) fail("a malformed named group");
          ++i_;
        } else if (at('<') && i_ + 1 < re_.size() && re_[i_ + 1] != '=' && re_[i_ + 1] != '!') {
          i_ = re_.find('>', i_);
          if (i_ == std::string::npos) fail("a malformed named group");
          ++i_;
        } else {
          fail("lookaround, flags or conditionals");
        }
      }
      std::string e = alt(depth + 1);
      if (!at(')')) fail("an unclosed group");
      ++i_;
      return "( " + e + " )";
    }
    if (c == ')' || c == '|') fail("an unexpected ')'");
    if (c == '*' || c == '+' || c == '?') fail("a quantifier with nothing to repeat");
    if (c == '^' || c == '$') fail("an anchor inside the pattern");
    if (c == '.') {
      ++i_;
      return "[^" + excluded() + "]";
    }
    if (c == '[') return set();
    if (c == '\\') {
      ++i_;
      int cls = 0;
      const uint32_t ch = escape(&cls);
      if (cls > 0) return ranges_gbnf(cls_ranges(cls));
      if (cls < 0) return negated_gbnf(cls_ranges(cls));
      return char_lit(ch);
    }
    return char_lit(utf8());
  }
  std::string set() {
    ++i_;  // '['
    bool neg = false;
    if (at('^')) neg = true, ++i_;
    std::vector<std::pair<uint32_t, uint32_t>> rs;
    bool first = true;
    while (i_ < re_.size() && (first || !at(']'))) {
      first = false;
      uint32_t lo;
      int cls = 0;
      if (at('\\')) {
        ++i_;
        lo = escape(&cls);
        if (cls < 0) fail("a negated class escape inside [...]");
        if (cls > 0) {
          for (auto r : cls_ranges(cls)) rs.push_back(r);
          continue;
        }
      } else if (at('[') && i_ + 1 < re_.size() && re_[i_ + 1] == ':') {
        fail("POSIX classes");
      } else {
        lo = utf8();
      }
      uint32_t hi = lo;
      if (at('-') && i_ + 1 < re_.size() && re_[i_ + 1] != ']') {
        ++i_;
        if (at('\\')) {
          ++i_;
          hi = escape(&cls);
          if (cls != 0) fail("a class escape as a range end");
        } else {
          hi = utf8();
        }
        if (hi < lo) fail("a range out of order");
      }
      rs.push_back({lo, hi});
    }
    if (!at(']')) fail("an unclosed [...]");
    ++i_;
    return neg ? negated_gbnf(rs) : ranges_gbnf(rs);
  }

  std::string re_;
  bool tool_;
  std::string where_;
  size_t i_ = 0;
  int top_alts_ = 0;
};

class Converter {
 public:
  Converter(const ojson& root, const Budget& b, bool tool_text) : root_(root), b_(b), deadline_(b.deadline()), tool_(tool_text) {}

  std::string run() {
    const std::string top = expr(root_, "$");
    std::string out = "root ::= " + top + "\n";
    for (const auto& r : rules_) out += r + "\n";
    return out + kJsonBase;
  }

 private:
  // Nesting (schema levels and $ref chains together) is bounded, so the recursion over the schema
  // is; the text made so far is bounded by the size budget (a GBNF symbol is at least a byte of
  // it... and a rule reference at most a few dozen), and time and the client are polled.
  struct Level {
    Converter& c;
    Level(Converter& c, const std::string& where) : c(c) {
      if (++c.depth_ > c.b_.max_depth)
        throw LimitError("max_depth", fmt::format("JSON schema: nested deeper than the limit of {} (schema levels and "
                                                  "$ref chains together) at {}",
                                                  c.b_.max_depth, where));
      if ((++c.polls_ & 63) == 0) {
        if (c.b_.cancelled && c.b_.cancelled()) throw LimitError("cancelled", "JSON schema: compilation cancelled (the client has gone)");
        if (std::chrono::steady_clock::now() > c.deadline_)
          throw LimitError("max_seconds", fmt::format("JSON schema: converting took longer than the limit of {} s", c.b_.max_seconds));
      }
    }
    ~Level() { --c.depth_; }
  };
  void grew(size_t n) {
    out_bytes_ += n;
    if (out_bytes_ > kBytesPerSymbol * b_.max_size)
      throw LimitError("max_size", fmt::format("JSON schema: the grammar it makes is larger than the limit ({} symbols)",
                                               b_.max_size));
  }
  static constexpr uint64_t kBytesPerSymbol = 8;
  [[noreturn]] void unsupported(const std::string& kw, const std::string& where, const std::string& why = "") const {
    throw SchemaError(kw, where,
                      fmt::format("JSON schema: '{}' at {} is not supported{}", kw, where, why.empty() ? "" : " (" + why + ")"));
  }
  std::string add_rule(const std::string& body) {
    const std::string name = fmt::format("s{}", rules_.size() + refs_.size() + 1);
    rules_.push_back(name + " ::= " + body);
    grew(rules_.back().size());
    return name;
  }
  static const std::set<std::string>& supported() {
    static const std::set<std::string> k = {"type", "properties", "required", "additionalProperties", "items", "minItems",
                                            "maxItems", "uniqueItems", "enum", "const", "anyOf", "oneOf", "$ref",
                                            "minLength", "maxLength", "pattern", "minimum", "maximum", "exclusiveMinimum",
                                            "exclusiveMaximum"};
    return k;
  }
  void check_keys(const ojson& s, const std::string& where) const {
    for (auto it = s.begin(); it != s.end(); ++it)
      if (!annotations().count(it.key()) && !supported().count(it.key())) unsupported(it.key(), where);
  }
  bool has_other(const ojson& s, std::initializer_list<const char*> allowed) const {
    for (auto it = s.begin(); it != s.end(); ++it) {
      if (annotations().count(it.key())) continue;
      bool ok = false;
      for (const char* a : allowed) ok = ok || it.key() == a;
      if (!ok) return true;
    }
    return false;
  }

  std::string expr(const ojson& s, const std::string& where) {
    const Level level(*this, where);
    std::string e = expr1(s, where);
    grew(e.size());
    return e;
  }
  std::string expr1(const ojson& s, const std::string& where) {
    if (s.is_boolean()) {
      if (s.get<bool>()) return "json-value";
      unsupported("false", where, "a schema that accepts nothing");
    }
    if (!s.is_object()) throw SchemaError("schema", where, fmt::format("JSON schema: the schema at {} is not an object", where));
    check_keys(s, where);
    if (s.contains("$ref")) {
      if (has_other(s, {"$ref"})) unsupported("$ref", where, "beside other keywords");
      return ref(s["$ref"], where);
    }
    if (s.contains("const") || s.contains("enum")) {
      const char* k = s.contains("const") ? "const" : "enum";
      if (has_other(s, {"const", "enum", "type"})) unsupported(k, where, "beside keywords other than type");
      const ojson vals = s.contains("const") ? ojson::array({s["const"]}) : s["enum"];
      if (!vals.is_array() || vals.empty()) unsupported("enum", where, "must be a non-empty array");
      std::string alts;
      for (const auto& v : vals) {
        if (s.contains("const") && s.contains("enum")) {
          bool in = false;
          for (const auto& e : s["enum"]) in = in || e == v;
          if (!in) continue;
        }
        if (s.contains("type") && !type_admits(s["type"], v)) continue;
        alts += (alts.empty() ? "" : " | ") + json_lit(v);
      }
      if (alts.empty()) unsupported(k, where, "no value is of the schema's type");
      return "( " + alts + " )";
    }
    for (const char* k : {"anyOf", "oneOf"}) {
      if (!s.contains(k)) continue;
      if (has_other(s, {k})) unsupported(k, where, "beside other keywords");
      const ojson& v = s[k];
      if (!v.is_array() || v.empty()) unsupported(k, where, "must be a non-empty array");
      std::string alts;
      for (size_t i = 0; i < v.size(); ++i)
        alts += (alts.empty() ? "" : " | ") + expr(v[i], fmt::format("{}.{}[{}]", where, k, i));
      return "( " + alts + " )";
    }
    std::vector<std::string> types;
    if (s.contains("type")) {
      const ojson& t = s["type"];
      if (t.is_string()) types.push_back(t.get<std::string>());
      else if (t.is_array()) {
        for (const auto& one : t) {
          if (!one.is_string()) unsupported("type", where, "must be a string or a list of strings");
          if (std::find(types.begin(), types.end(), one.get<std::string>()) == types.end()) types.push_back(one.get<std::string>());
        }
        if (types.empty()) unsupported("type", where, "an empty type list");
      } else {
        unsupported("type", where, "must be a string or a list of strings");
      }
    } else {  // the type its keywords imply (a schema without one also accepts other types: a subset)
      if (s.contains("properties") || s.contains("additionalProperties") || s.contains("required")) types.push_back("object");
      else if (s.contains("items") || s.contains("minItems") || s.contains("maxItems")) types.push_back("array");
      else if (s.contains("minLength") || s.contains("maxLength") || s.contains("pattern")) types.push_back("string");
      else if (s.contains("minimum") || s.contains("maximum") || s.contains("exclusiveMinimum") || s.contains("exclusiveMaximum"))
        types.push_back("number");
      else return "json-value";  // {}: any JSON value
    }
    // number beside integer: the integers are numbers already
    if (std::find(types.begin(), types.end(), "number") != types.end())
      types.erase(std::remove(types.begin(), types.end(), "integer"), types.end());
    std::string alts;
    for (const auto& t : types) alts += (alts.empty() ? "" : " | ") + typed(s, t, where);
    return types.size() == 1 ? alts : "( " + alts + " )";
  }

  static bool type_admits(const ojson& type, const ojson& v) {
    auto one = [&](const std::string& t) {
      if (t == "string") return v.is_string();
      if (t == "integer") return v.is_number_integer() || (v.is_number_float() && std::floor(v.get<double>()) == v.get<double>());
      if (t == "number") return v.is_number();
      if (t == "boolean") return v.is_boolean();
      if (t == "null") return v.is_null();
      if (t == "object") return v.is_object();
      if (t == "array") return v.is_array();
      return false;
    };
    if (type.is_string()) return one(type.get<std::string>());
    if (type.is_array())
      for (const auto& t : type)
        if (t.is_string() && one(t.get<std::string>())) return true;
    return !type.is_string() && !type.is_array();
  }
  // a JSON value as it may be written (a string with the tool calls' escapes)
  std::string json_lit(const ojson& v) const {
    std::string d = v.dump();
    if (tool_) {  // no raw '<' (a tag could start) nor structural code point in a tool call's JSON
      std::string o;
      for (size_t i = 0; i < d.size(); ++i) {
        if (d[i] == '<') o += "\\u003c";
        else if (d.compare(i, 2, "\xEE\x80") == 0 && i + 2 < d.size() && static_cast<unsigned char>(d[i + 2]) <= 0x82) {
          o += fmt::format("\\u{:04X}", 0xE000 + (static_cast<unsigned char>(d[i + 2]) - 0x80));
          i += 2;
        } else {
          o += d[i];
        }
      }
      d = o;
    }
    return lit(d);
  }

  std::string typed(const ojson& s, const std::string& type, const std::string& where) {
    if (type == "object") return object(s, where);
    if (type == "array") return array(s, where);
    if (type == "string") return string(s, where);
    if (type == "integer" || type == "number") return number(s, type == "integer", where);
    if (type == "boolean" || type == "null") return "json-" + type;
    unsupported("type", where, fmt::format("unknown type '{}'", type));
  }

  int count(const ojson& s, const char* k, const std::string& where, int dflt, int most = 1000) const {
    if (!s.contains(k)) return dflt;
    if (!s[k].is_number_integer() || s[k].get<int64_t>() < 0) unsupported(k, where, "must be a non-negative integer");
    const uint64_t v = s[k].get<uint64_t>();
    if (v > static_cast<uint64_t>(most)) unsupported(k, where, fmt::format("above {}", most));
    return static_cast<int>(v);
  }

  std::string string(const ojson& s, const std::string& where) {
    if (s.contains("pattern")) {
      if (!s["pattern"].is_string()) unsupported("pattern", where, "must be a string");
      if (s.contains("minLength") || s.contains("maxLength"))
        unsupported("pattern", where, "together with minLength / maxLength");
      return add_rule(RegexToGbnf(s["pattern"].get<std::string>(), tool_, where).run());
    }
    const int lo = count(s, "minLength", where, 0);
    int hi = -1;
    if (s.contains("maxLength")) {  // above 1000: at most 1000 are written (valid: a shorter string)
      if (!s["maxLength"].is_number_integer() || s["maxLength"].get<int64_t>() < 0)
        unsupported("maxLength", where, "must be a non-negative integer");
      hi = static_cast<int>(std::min<uint64_t>(s["maxLength"].get<uint64_t>(), 1000));
      if (s["maxLength"].get<uint64_t>() < static_cast<uint64_t>(lo)) unsupported("maxLength", where, "smaller than minLength");
    }
    if (lo == 0 && hi < 0) return "json-string";
    // one character each: json-char1 (in a tool call no raw '<', which json-char allows as "<"+ text)
    return add_rule(fmt::format("\"\\\"\" json-char1{{{},{}}} \"\\\"\"", lo, hi < 0 ? "" : std::to_string(hi)));
  }

  std::string number(const ojson& s, bool integer, const std::string& where) {
    // bounds: the integers inside them (a non-integer bound rounded inwards)
    std::optional<double> lo, hi;
    bool lo_x = false, hi_x = false;
    for (const char* k : {"minimum", "exclusiveMinimum", "maximum", "exclusiveMaximum"}) {
      if (!s.contains(k)) continue;
      const ojson& v = s[k];
      if (v.is_boolean()) unsupported(k, where, "the draft-4 boolean form");
      if (!v.is_number()) unsupported(k, where, "must be a number");
      const double d = v.get<double>();
      const bool is_min = k[0] == 'm' ? std::string(k) == "minimum" : std::string(k) == "exclusiveMinimum";
      const bool excl = std::string(k).rfind("exclusive", 0) == 0;
      if (is_min) {
        if (!lo || d > *lo || (d == *lo && excl)) lo = d, lo_x = excl;
      } else {
        if (!hi || d < *hi || (d == *hi && excl)) hi = d, hi_x = excl;
      }
    }
    if (!lo && !hi) return integer ? "json-integer" : "json-number";
    const double big = static_cast<double>(kMaxInt);
    // the integers n with lo <= n <= hi (exclusive: <)
    const double ilo_d = lo ? (lo_x ? std::floor(*lo) + 1 : std::ceil(*lo)) : -big;
    const double ihi_d = hi ? (hi_x ? std::ceil(*hi) - 1 : std::floor(*hi)) : big;
    const char* kw = lo ? (lo_x ? "exclusiveMinimum" : "minimum") : (hi_x ? "exclusiveMaximum" : "maximum");
    if (ilo_d > big || ihi_d < -big) unsupported(kw, where, "beyond 16 digits");
    const int64_t ilo = static_cast<int64_t>(std::max(ilo_d, -big)), ihi = static_cast<int64_t>(std::min(ihi_d, big));
    if (ilo > ihi) unsupported(kw, where, "no integer lies within the bounds (the grammar writes ranges through their integers)");
    std::string e = int_range(ilo, ihi);
    if (!integer) {
      // m.f (m >= 0) lies in [m, m + 1): inside when m is (m >= lo, or > lo) and m + 1 <= hi;
      // -m.f lies in (-(m + 1), -m]: inside when -(m + 1) >= lo and -m <= hi (or < hi)
      const std::string frac = " \".\" [0-9]{1,16}";
      const double plo = std::max(0.0, ilo_d), phi = hi ? std::min(std::floor(*hi) - 1, big) : big;
      if (plo <= phi) e += " | " + nonneg_range(static_cast<int64_t>(plo), static_cast<int64_t>(phi)) + frac;
      const double nlo = std::max(0.0, hi ? (hi_x ? std::floor(-*hi) + 1 : std::ceil(-*hi)) : 0.0);
      const double nhi = lo ? std::min(std::floor(-*lo) - 1, big) : big;
      if (nlo <= nhi) e += " | \"-\" " + nonneg_range(static_cast<int64_t>(nlo), static_cast<int64_t>(nhi)) + frac;
    }
    return add_rule(e);
  }

  // `#` and JSON pointers into the schema: #/$defs/NAME, #/definitions/NAME/properties/id, ...
  std::string ref(const ojson& r, const std::string& where) {
    if (!r.is_string()) unsupported("$ref", where, "must be a string");
    const std::string p = r.get<std::string>();
    auto it = refs_.find(p);
    if (it != refs_.end()) return it->second;
    const ojson* target = resolve_ref(root_, p);
    if (!target) unsupported("$ref", where, fmt::format("'{}' is not a JSON pointer into this schema (#/$defs/..., #/definitions/...)", p));
    // a rule per definition, named before it is converted: recursive schemas refer to it
    const std::string name = fmt::format("ref{}", refs_.size() + 1);
    refs_[p] = name;
    const std::string body = expr(*target, p);
    rules_.push_back(name + " ::= " + body);
    grew(rules_.back().size());
    return name;
  }

  std::string object(const ojson& s, const std::string& where) {
    // additionalProperties: false / absent / true / {} write no other keys; a schema writes more
    // members after the declared ones, whose keys never start like a declared one (they would be
    // validated by that property's schema)
    std::string extra;
    if (s.contains("additionalProperties")) {
      const ojson& ap = s["additionalProperties"];
      const bool none = ap.is_boolean() || (ap.is_object() && ap.empty());
      if (!none) {
        if (!ap.is_object()) unsupported("additionalProperties", where, "must be a boolean or a schema");
        std::string first = "\"\\\\\\x00-\\x1f";
        if (tool_) first += "<\\uE000-\\uE002";
        if (s.contains("properties") && s["properties"].is_object())
          for (auto it = s["properties"].begin(); it != s["properties"].end(); ++it) {
            if (it.key().empty()) continue;
            const unsigned char c = static_cast<unsigned char>(it.key()[0]);
            if (c >= 0x80) unsupported("additionalProperties", where, "beside a property whose name starts with a non-ASCII character");
            if (c == ']' || c == '\\' || c == '^' || c == '-' || c == '[') first += '\\';
            first += static_cast<char>(c);
          }
        const std::string key = "\"\\\"\" [^" + first + "] json-char1* \"\\\"\"";
        extra = add_rule(key + " ws \":\" ws " + expr(ap, where + ".additionalProperties"));
      }
    }
    std::set<std::string> required;
    const ojson empty = ojson::object();
    const ojson& props = s.contains("properties") ? s["properties"] : empty;
    if (!props.is_object()) unsupported("properties", where, "must be an object");
    if (s.contains("required")) {
      if (!s["required"].is_array()) unsupported("required", where, "must be an array of names");
      for (const auto& r : s["required"]) {
        if (!r.is_string() || !props.contains(r.get<std::string>()))
          unsupported("required", where, fmt::format("{} is not one of the properties", r.dump()));
        required.insert(r.get<std::string>());
      }
    }
    if (props.empty() && extra.empty()) {  // no members to write: {"type": "object"} alone takes any object
      const bool closed = s.contains("properties") || (s.contains("additionalProperties") && s["additionalProperties"].is_boolean() &&
                                                       !s["additionalProperties"].get<bool>());
      return closed ? "json-object-empty" : "json-object";
    }
    // properties in the schema's order; an optional one may be left out. head(i): properties i..
    // with none written yet; tail(i): after at least one (each then starts with a comma). The
    // extra members (additionalProperties) come last.
    std::vector<std::pair<std::string, bool>> kv;  // (key: value expression, required)
    for (auto it = props.begin(); it != props.end(); ++it)
      kv.push_back({json_lit(ojson(it.key())) + " ws \":\" ws " + expr(it.value(), where + ".properties." + it.key()),
                    required.count(it.key()) > 0});
    const size_t n = kv.size();
    std::vector<std::string> tail(n + 1), head(n + 1);
    tail[n] = extra.empty() ? "" : add_rule("( ws \",\" ws " + extra + " )*");
    head[n] = extra.empty() ? "" : add_rule("( " + extra + " " + tail[n] + " )?");
    for (size_t i = n; i-- > 0;) {
      const std::string t_next = tail[i + 1], h_next = head[i + 1];
      if (kv[i].second) {
        tail[i] = add_rule("ws \",\" ws " + kv[i].first + " " + t_next);
        head[i] = add_rule(kv[i].first + " " + t_next);
      } else {
        tail[i] = add_rule("( ws \",\" ws " + kv[i].first + " )? " + t_next);
        head[i] = add_rule(kv[i].first + " " + t_next + " | " + (h_next.empty() ? "\"\"" : h_next));
      }
    }
    return "( \"{\" ws " + head[0] + " ws \"}\" )";
  }

  std::string array(const ojson& s, const std::string& where) {
    if (s.contains("prefixItems")) unsupported("prefixItems", where);
    if (s.contains("items") && s["items"].is_array()) unsupported("items", where, "the tuple (array) form");
    const std::string item = s.contains("items") ? expr(s["items"], where + ".items") : "json-value";
    const int lo = count(s, "minItems", where, 0), hi = count(s, "maxItems", where, -1);
    if (hi >= 0 && hi < lo) unsupported("maxItems", where, "smaller than minItems");
    if (s.contains("uniqueItems") && !(s["uniqueItems"].is_boolean() && !s["uniqueItems"].get<bool>()) && !(hi >= 0 && hi <= 1))
      unsupported("uniqueItems", where, "a context-free grammar cannot keep array items distinct");
    if (hi == 0) return "( \"[\" ws \"]\" )";
    const std::string more = fmt::format("( ws \",\" ws {} ){{{},{}}}", item, std::max(lo - 1, 0),
                                         hi < 0 ? std::string() : std::to_string(hi - 1));
    const std::string body = item + " " + more;
    return "( \"[\" ws " + (lo == 0 ? "( " + body + " )?" : body) + " ws \"]\" )";
  }

  const ojson& root_;
  const Budget& b_;
  std::chrono::steady_clock::time_point deadline_;
  bool tool_ = false;
  int depth_ = 0;
  uint64_t polls_ = 0, out_bytes_ = 0;
  std::vector<std::string> rules_;
  std::map<std::string, std::string> refs_;
};

}  // namespace

std::string schema_to_gbnf(const nlohmann::ordered_json& schema) { return schema_to_gbnf(schema, Budget{}); }

std::string schema_to_gbnf(const nlohmann::ordered_json& schema, const Budget& budget, bool tool_text) {
  return Converter(schema, budget, tool_text).run();
}

const nlohmann::ordered_json* resolve_ref(const nlohmann::ordered_json& root, const std::string& ref) {
  if (ref.empty() || ref[0] != '#') return nullptr;
  const ojson* at = &root;
  size_t i = 1;
  if (i < ref.size() && ref[i] != '/') return nullptr;
  while (i < ref.size()) {
    size_t e = ref.find('/', i + 1);
    if (e == std::string::npos) e = ref.size();
    std::string tokn;
    for (size_t k = i + 1; k < e; ++k) {  // ~1 -> '/', ~0 -> '~', %XX (URI fragment)
      if (ref[k] == '~' && k + 1 < e && (ref[k + 1] == '0' || ref[k + 1] == '1')) {
        tokn += ref[k + 1] == '0' ? '~' : '/';
        ++k;
      } else if (ref[k] == '%' && k + 2 < e && std::isxdigit(static_cast<unsigned char>(ref[k + 1])) &&
                 std::isxdigit(static_cast<unsigned char>(ref[k + 2]))) {
        tokn += static_cast<char>(std::stoi(ref.substr(k + 1, 2), nullptr, 16));
        k += 2;
      } else {
        tokn += ref[k];
      }
    }
    if (at->is_object()) {
      auto it = at->find(tokn);
      if (it == at->end()) return nullptr;
      at = &*it;
    } else if (at->is_array()) {
      if (tokn.empty() || tokn.size() > 9 || tokn.find_first_not_of("0123456789") != std::string::npos) return nullptr;
      const size_t idx = std::stoul(tokn);
      if (idx >= at->size()) return nullptr;
      at = &(*at)[idx];
    } else {
      return nullptr;
    }
    i = e;
  }
  return at;
}

// A GBNF string literal holding `s` exactly.
std::string gbnf_literal(const std::string& s) {
  std::string o = "\"";
  for (unsigned char c : s) {
    if (c == '"') o += "\\\"";
    else if (c == '\\') o += "\\\\";
    else if (c == '\n') o += "\\n";
    else if (c == '\r') o += "\\r";
    else if (c == '\t') o += "\\t";
    else if (c < 0x20) o += fmt::format("\\x{:02x}", c);
    else o += static_cast<char>(c);
  }
  return o + "\"";
}

std::string json_object_gbnf() { return std::string("root ::= json-object\n") + kJsonBase; }

}  // namespace kimi::server::grammar
