// GBNF parsing, the code-point automaton and the JSON schema converter (grammar.h).
#include "server/grammar.h"

#include <fmt/format.h>

#include <algorithm>
#include <cctype>
#include <functional>
#include <limits>
#include <map>
#include <queue>
#include <stdexcept>

namespace kimi::server::grammar {

std::chrono::steady_clock::time_point Budget::deadline() const {
  const double s = std::clamp(max_seconds, 0.0, 86400.0);
  return std::chrono::steady_clock::now() + std::chrono::microseconds(static_cast<int64_t>(s * 1e6));
}

bool Sym::matches(uint32_t c) const {
  bool in = false;
  for (const Range& r : ranges) in = in || (c >= r.lo && c <= r.hi);
  return in != negated;
}

// ---------------------------------------------------------------------------------------------
// Characters of a class: the fewest bytes, the cost of a generated character (Matcher::min_cost)

namespace {
constexpr uint64_t kNoChar = std::numeric_limits<uint64_t>::max();
bool structural(uint32_t c) { return c >= 0xE000 && c <= 0xE002; }  // U+E000..U+E002: one special token each
uint64_t utf8_len(uint32_t c) { return c < 0x80 ? 1 : c < 0x800 ? 2 : c < 0x10000 ? 3 : 4; }
// The character of the class that is cheapest to generate: a structural code point (one token) if
// the class has one, else its smallest code point; 0x110000: the class matches nothing.
uint32_t cheapest_char(const Sym& s) {
  if (!s.negated) {
    uint32_t lo = 0x110000;
    for (const Range& r : s.ranges) {
      if (r.lo > r.hi || r.lo > 0x10FFFF) continue;
      if (r.lo <= 0xE002 && r.hi >= 0xE000) return std::max<uint32_t>(r.lo, 0xE000);
      lo = std::min(lo, r.lo);
    }
    return lo;
  }
  uint32_t c = 0;  // the smallest code point outside every range
  for (bool moved = true; moved && c <= 0x10FFFF;) {
    moved = false;
    for (const Range& r : s.ranges)
      if (r.lo <= c && c <= r.hi) { c = r.hi + 1; moved = true; }
  }
  return c > 0x10FFFF ? 0x110000 : c;
}
uint64_t sym_bytes(const Sym& s) {  // fewest UTF-8 bytes of a character the class matches
  if (!s.negated) {
    uint32_t lo = 0x110000;
    for (const Range& r : s.ranges)
      if (r.lo <= r.hi && r.lo <= 0x10FFFF) lo = std::min(lo, r.lo);
    return lo == 0x110000 ? kNoChar : utf8_len(lo);
  }
  const uint32_t c = cheapest_char(s);
  return c == 0x110000 ? kNoChar : utf8_len(c);
}
uint64_t sym_cost(const Sym& s) {
  const uint32_t c = cheapest_char(s);
  return c == 0x110000 ? kNoChar : structural(c) ? 1 : sym_bytes(s);
}
}  // namespace

// ---------------------------------------------------------------------------------------------
// GBNF parser

class Parser {
 public:
  Parser(std::string_view t, const Budget& b) : t_(t), b_(b), deadline_(b.deadline()) {}

  std::shared_ptr<const Grammar> run(const std::string& root_name) {
    auto g = std::make_shared<Grammar>();
    g_ = g.get();
    skip(true);
    while (i_ < t_.size()) {
      poll();
      const std::string name = ident();
      if (name.empty()) fail("expected a rule name");
      skip(false);
      if (t_.substr(i_, 3) != "::=") fail(fmt::format("expected '::=' after rule name '{}'", name));
      i_ += 3;
      const int r = rule_index(name);
      if (defined_[static_cast<size_t>(r)]) fail(fmt::format("rule '{}' is defined twice", name));
      defined_[static_cast<size_t>(r)] = true;
      g_->rules_[static_cast<size_t>(r)].alts = alternatives(0, name);
      skip(true);
    }
    for (size_t r = 0; r < g_->rules_.size(); ++r)
      if (!defined_[r]) throw GrammarError(fmt::format("grammar: rule '{}' is used but not defined", g_->rules_[r].name));
    auto it = index_.find(root_name);
    if (it == index_.end()) throw GrammarError(fmt::format("grammar: no '{}' rule", root_name));
    g_->root_ = it->second;
    check_left_recursion();
    prune_and_measure();
    g_->expanded_size_ = expanded_size();
    return g;
  }

 private:
  // the time budget and the client: checked every so often while working
  void poll() const {
    if ((++polls_ & 255) != 0) return;
    if (b_.cancelled && b_.cancelled()) throw LimitError("cancelled", "grammar: compilation cancelled (the client has gone)");
    if (std::chrono::steady_clock::now() > deadline_)
      throw LimitError("max_seconds", fmt::format("grammar: compiling took longer than the limit of {} s", b_.max_seconds));
  }
  // symbols made so far (the expanded size before rule references are inlined)
  void add_syms(uint64_t n) {
    syms_ += n;
    if (syms_ > b_.max_size) too_large(syms_);
  }
  [[noreturn]] void too_large(uint64_t n, uint64_t limit = 0) const {
    if (!limit) limit = b_.max_size;
    throw LimitError("max_size", fmt::format("grammar: the expanded grammar has more than {} symbols (at least {}; "
                                             "repeats count with their repetition counts), the limit is {}",
                                             limit, n, limit));
  }
  std::pair<size_t, size_t> line_col() const {
    size_t line = 1, col = 1;
    for (size_t k = 0; k < i_ && k < t_.size(); ++k) {
      if (t_[k] == '\n') { ++line; col = 1; } else { ++col; }
    }
    return {line, col};
  }
  [[noreturn]] void fail(const std::string& m) const {
    const auto [line, col] = line_col();
    throw GrammarError(fmt::format("grammar: {} (line {}, column {})", m, line, col));
  }
  // whitespace and comments; newlines only when `nl`
  void skip(bool nl) {
    while (i_ < t_.size()) {
      const char c = t_[i_];
      if (c == ' ' || c == '\t' || (nl && (c == '\n' || c == '\r'))) {
        ++i_;
      } else if (c == '#') {
        while (i_ < t_.size() && t_[i_] != '\n') ++i_;
      } else {
        break;
      }
    }
  }
  static bool name_char(char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '-' || c == '_';
  }
  std::string ident() {
    const size_t b = i_;
    while (i_ < t_.size() && name_char(t_[i_])) ++i_;
    return std::string(t_.substr(b, i_ - b));
  }
  int rule_index(const std::string& name) {
    auto it = index_.find(name);
    if (it != index_.end()) return it->second;
    const int r = static_cast<int>(g_->rules_.size());
    g_->rules_.push_back({name, {}});
    defined_.push_back(false);
    index_[name] = r;
    return r;
  }
  int new_rule(const std::string& base) {
    std::string n;
    do n = fmt::format("{}-{}", base, ++counter_);
    while (index_.count(n));
    const int r = rule_index(n);
    defined_[static_cast<size_t>(r)] = true;
    return r;
  }
  // Does a rule start at i_ ("name ::=")? Then the current rule has ended.
  bool at_rule_start() const {
    size_t k = i_;
    while (k < t_.size() && name_char(t_[k])) ++k;
    if (k == i_) return false;
    while (k < t_.size() && (t_[k] == ' ' || t_[k] == '\t')) ++k;
    return t_.substr(k, 3) == "::=";
  }
  uint32_t utf8_char() {
    const unsigned char c = static_cast<unsigned char>(t_[i_]);
    int n = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 0;
    if (n == 0 || i_ + static_cast<size_t>(n) > t_.size()) fail("invalid UTF-8");
    uint32_t cp = n == 1 ? c : c & (0xFF >> (n + 1));
    for (int k = 1; k < n; ++k) {
      const unsigned char d = static_cast<unsigned char>(t_[i_ + static_cast<size_t>(k)]);
      if ((d >> 6) != 2) fail("invalid UTF-8");
      cp = (cp << 6) | (d & 0x3F);
    }
    i_ += static_cast<size_t>(n);
    return cp;
  }
  uint32_t hex(int n) {
    uint32_t v = 0;
    for (int k = 0; k < n; ++k, ++i_) {
      if (i_ >= t_.size() || !std::isxdigit(static_cast<unsigned char>(t_[i_]))) fail("bad hex escape");
      const char c = static_cast<char>(std::tolower(static_cast<unsigned char>(t_[i_])));
      v = v * 16 + static_cast<uint32_t>(c <= '9' ? c - '0' : c - 'a' + 10);
    }
    return v;
  }
  // One character of a literal or class (handles escapes).
  uint32_t char_or_escape() {
    if (i_ >= t_.size()) fail("unexpected end of the grammar");
    if (t_[i_] != '\\') return utf8_char();
    ++i_;
    if (i_ >= t_.size()) fail("unexpected end after '\\'");
    const char e = t_[i_++];
    switch (e) {
      case 'n': return '\n';
      case 'r': return '\r';
      case 't': return '\t';
      case '\\': case '"': case '[': case ']': case '-': case '^': case '\'': return static_cast<uint32_t>(e);
      case 'x': return hex(2);
      case 'u': return hex(4);
      case 'U': return hex(8);
      default: fail(fmt::format("unknown escape '\\{}'", e));
    }
  }
  std::vector<std::vector<Sym>> alternatives(int depth, const std::string& rule) {
    std::vector<std::vector<Sym>> alts;
    alts.push_back(sequence(depth, rule));
    while (i_ < t_.size() && t_[i_] == '|') {
      ++i_;
      alts.push_back(sequence(depth, rule));
    }
    return alts;
  }
  std::vector<Sym> sequence(int depth, const std::string& rule) {
    std::vector<Sym> seq;
    for (;;) {
      poll();
      skip(true);
      if (i_ >= t_.size() || t_[i_] == '|' || (t_[i_] == ')' && depth > 0)) break;
      if (depth == 0 && at_rule_start()) break;
      const size_t start = seq.size();
      const char c = t_[i_];
      if (c == '"') {
        ++i_;
        while (i_ < t_.size() && t_[i_] != '"') {
          const uint32_t cp = char_or_escape();
          Sym s;
          s.ranges.push_back({cp, cp});
          seq.push_back(std::move(s));
          add_syms(1);
        }
        if (i_ >= t_.size()) fail("unterminated string literal");
        ++i_;
      } else if (c == '[') {
        ++i_;
        Sym s;
        if (i_ < t_.size() && t_[i_] == '^') { s.negated = true; ++i_; }
        while (i_ < t_.size() && t_[i_] != ']') {
          const uint32_t lo = char_or_escape();
          uint32_t hi = lo;
          if (i_ + 1 < t_.size() && t_[i_] == '-' && t_[i_ + 1] != ']') {
            ++i_;
            hi = char_or_escape();
            if (hi < lo) fail("character range out of order");
          }
          s.ranges.push_back({lo, hi});
        }
        if (i_ >= t_.size()) fail("unterminated character class");
        ++i_;
        seq.push_back(std::move(s));
        add_syms(1);
      } else if (c == '.') {
        ++i_;
        Sym s;
        s.negated = true;  // [^] : any character
        seq.push_back(std::move(s));
        add_syms(1);
      } else if (c == '(') {
        if (depth + 1 > b_.max_depth)
          throw LimitError("max_depth", fmt::format("grammar: groups nested deeper than the limit of {} (line {}, column {})",
                                                    b_.max_depth, line_col().first, line_col().second));
        ++i_;
        const int r = new_rule(rule);
        auto alts = alternatives(depth + 1, rule);
        skip(true);
        if (i_ >= t_.size() || t_[i_] != ')') fail("expected ')'");
        ++i_;
        g_->rules_[static_cast<size_t>(r)].alts = std::move(alts);
        Sym s;
        s.is_rule = true;
        s.rule = r;
        seq.push_back(std::move(s));
        add_syms(1);
      } else if (name_char(c)) {
        Sym s;
        s.is_rule = true;
        s.rule = rule_index(ident());
        seq.push_back(std::move(s));
        add_syms(1);
      } else {
        fail(fmt::format("unexpected '{}'", c));
      }
      postfix(seq, start, rule);
    }
    return seq;
  }
  // Applies * + ? {m,n} to the last item (seq[start..]).
  void postfix(std::vector<Sym>& seq, size_t start, const std::string& rule) {
    if (i_ >= t_.size()) return;
    const char c = t_[i_];
    if (c != '*' && c != '+' && c != '?' && c != '{') return;
    std::vector<Sym> item(seq.begin() + static_cast<std::ptrdiff_t>(start), seq.end());
    seq.resize(start);
    int lo = 0, hi = -1;  // hi -1: unbounded
    ++i_;
    if (c == '*') {
      lo = 0;
    } else if (c == '+') {
      lo = 1;
    } else if (c == '?') {
      lo = 0;
      hi = 1;
    } else {
      skip(false);
      lo = number();
      skip(false);
      hi = lo;
      if (i_ < t_.size() && t_[i_] == ',') {
        ++i_;
        skip(false);
        hi = i_ < t_.size() && std::isdigit(static_cast<unsigned char>(t_[i_])) ? number() : -1;
        skip(false);
      }
      if (i_ >= t_.size() || t_[i_] != '}') fail("expected '}'");
      ++i_;
      if (hi >= 0 && hi < lo) fail("repetition {m,n} with n < m");
      if (lo > 1000 || hi > 1000) fail("repetition count above 1000");
    }
    // what the expansion below will make, counted before it is made
    const uint64_t copies = static_cast<uint64_t>(std::max(lo, hi));
    add_syms(copies * (item.size() + 1) - std::min<uint64_t>(item.size(), copies * (item.size() + 1)));
    for (int k = 0; k < lo; ++k) seq.insert(seq.end(), item.begin(), item.end());
    if (hi < 0) {  // star ::= item star | ε
      const int r = new_rule(rule);
      Sym ref;
      ref.is_rule = true;
      ref.rule = r;
      std::vector<Sym> a = item;
      a.push_back(ref);
      g_->rules_[static_cast<size_t>(r)].alts = {a, {}};
      seq.push_back(ref);
    } else if (hi > lo) {  // opt_k ::= item opt_{k-1} | ε, nested (hi - lo) deep
      int inner = -1;
      for (int k = 0; k < hi - lo; ++k) {
        const int r = new_rule(rule);
        std::vector<Sym> a = item;
        if (inner >= 0) {
          Sym ref;
          ref.is_rule = true;
          ref.rule = inner;
          a.push_back(ref);
        }
        g_->rules_[static_cast<size_t>(r)].alts = {a, {}};
        inner = r;
      }
      Sym ref;
      ref.is_rule = true;
      ref.rule = inner;
      seq.push_back(ref);
    }
  }
  int number() {
    const size_t b = i_;
    while (i_ < t_.size() && std::isdigit(static_cast<unsigned char>(t_[i_]))) ++i_;
    if (b == i_ || i_ - b > 6) fail("expected a repetition count");
    return std::stoi(std::string(t_.substr(b, i_ - b)));
  }
  std::vector<char> nullable_rules() const {
    const std::vector<uint64_t> b = shortest(kNullable);
    std::vector<char> nullable(b.size());
    for (size_t r = 0; r < b.size(); ++r) nullable[r] = b[r] == 0;
    return nullable;
  }
  // A rule that can reach itself before consuming a character would loop the automaton. Depth-first
  // over the left edges (r -> s when s can be the first thing r derives), with an explicit stack.
  void check_left_recursion() const {
    const auto& rules = g_->rules_;
    const std::vector<char> nullable = nullable_rules();
    std::vector<char> state(rules.size(), 0);  // 0 new, 1 on path, 2 done
    struct Frame {
      int rule;
      size_t alt = 0, idx = 0;
    };
    std::vector<Frame> path;
    for (size_t r0 = 0; r0 < rules.size(); ++r0) {
      if (state[r0] != 0) continue;
      state[r0] = 1;
      path.push_back({static_cast<int>(r0)});
      while (!path.empty()) {
        Frame& f = path.back();
        const auto& alts = rules[static_cast<size_t>(f.rule)].alts;
        if (f.alt >= alts.size()) {
          state[static_cast<size_t>(f.rule)] = 2;
          path.pop_back();
          continue;
        }
        const auto& a = alts[f.alt];
        // the next left edge of this alternative: symbols up to and including the first non-nullable
        if (f.idx >= a.size() || !a[f.idx].is_rule ||
            (f.idx > 0 && !nullable[static_cast<size_t>(a[f.idx - 1].rule)])) {
          ++f.alt;
          f.idx = 0;
          continue;
        }
        const int s = a[f.idx].rule;
        ++f.idx;
        if (state[static_cast<size_t>(s)] == 1)
          throw GrammarError(fmt::format("grammar: rule '{}' is left-recursive", rules[static_cast<size_t>(s)].name));
        if (state[static_cast<size_t>(s)] == 0) {
          poll();
          state[static_cast<size_t>(s)] = 1;
          path.push_back({s});
        }
      }
    }
  }
  // The fewest bytes each rule can derive (Knuth's generalization of Dijkstra to grammars): a rule
  // that derives no finite sentence never ends; alternatives using such a rule (or a character class
  // that matches nothing) are dropped, so the matcher never walks into a dead end. A root that
  // derives nothing is an error: the answer could not be a sentence of the grammar.
  static constexpr uint64_t kInf = std::numeric_limits<uint64_t>::max();
  static uint64_t sym_bytes(const Sym& s) { return grammar::sym_bytes(s); }
  // The fewest bytes each rule can derive (kInf: no finite sentence), by Knuth's generalization of
  // Dijkstra to grammars; kNullable: every character counts kInf (0: the rule derives ""); kCost:
  // a character costs Grammar::char_cost (the structural code points one token each).
  enum Measure { kBytes, kNullable, kCost };
  std::vector<uint64_t> shortest(Measure m) const {
    const auto& rules = g_->rules_;
    auto sat_add = [](uint64_t a, uint64_t b) { return a > kInf - b ? kInf : a + b; };
    struct AltState {
      uint64_t sum = 0;
      size_t unresolved = 0;
    };
    std::vector<std::vector<AltState>> st(rules.size());
    std::vector<std::vector<std::pair<int, int>>> uses(rules.size());  // rule -> (rule, alt), once per use
    using Item = std::pair<uint64_t, int>;
    std::priority_queue<Item, std::vector<Item>, std::greater<Item>> pq;
    for (size_t r = 0; r < rules.size(); ++r) {
      poll();
      st[r].resize(rules[r].alts.size());
      for (size_t a = 0; a < rules[r].alts.size(); ++a) {
        AltState& as = st[r][a];
        for (const Sym& sy : rules[r].alts[a]) {
          if (sy.is_rule) {
            ++as.unresolved;
            uses[static_cast<size_t>(sy.rule)].push_back({static_cast<int>(r), static_cast<int>(a)});
          } else {
            as.sum = sat_add(as.sum, m == kNullable ? kInf : m == kCost ? grammar::sym_cost(sy) : sym_bytes(sy));
          }
        }
        if (as.unresolved == 0 && as.sum != kInf) pq.push({as.sum, static_cast<int>(r)});
      }
    }
    std::vector<uint64_t> best(rules.size(), kInf);
    std::vector<char> final(rules.size(), 0);
    while (!pq.empty()) {
      const auto [v, r] = pq.top();
      pq.pop();
      if (final[static_cast<size_t>(r)]) continue;
      final[static_cast<size_t>(r)] = 1;
      best[static_cast<size_t>(r)] = v;
      poll();
      for (const auto& [ur, ua] : uses[static_cast<size_t>(r)]) {
        AltState& as = st[static_cast<size_t>(ur)][static_cast<size_t>(ua)];
        as.sum = sat_add(as.sum, v);
        if (--as.unresolved == 0 && as.sum != kInf && !final[static_cast<size_t>(ur)]) pq.push({as.sum, ur});
      }
    }
    return best;
  }
  // Alternatives that use a rule deriving no finite sentence (or a class that matches nothing) are
  // dropped, so the matcher never walks into a dead end. A root that derives nothing is an error: no
  // answer could be a sentence of the grammar.
  void prune_and_measure() {
    auto& rules = g_->rules_;
    const std::vector<uint64_t> best = shortest(kBytes);
    const size_t root = static_cast<size_t>(g_->root_);
    if (best[root] == kInf)
      throw GrammarError(fmt::format("grammar: the language of rule '{}' is empty: no text can complete it", rules[root].name));
    g_->min_bytes_ = best[root];
    for (size_t r = 0; r < rules.size(); ++r) {
      auto& alts = rules[r].alts;
      alts.erase(std::remove_if(alts.begin(), alts.end(),
                                [&](const std::vector<Sym>& a) {
                                  for (const Sym& sy : a)
                                    if (sy.is_rule ? best[static_cast<size_t>(sy.rule)] == kInf : sym_bytes(sy) == kInf)
                                      return true;
                                  return false;
                                }),
                 alts.end());
    }
    g_->min_cost_ = shortest(kCost);  // of what is left (every rule still derives a sentence)
  }
  // The size of the root with every rule reference inlined (a reference back into a rule that is
  // being expanded counts 1): what nested repeats multiply to, e.g. (("a"{0,100}){0,100}){0,100}
  // is a million "a"s. Saturates just above the budget.
  uint64_t expanded_size() const {
    const auto& rules = g_->rules_;
    const uint64_t limit = b_.max_expanded ? b_.max_expanded : b_.max_size;
    const uint64_t cap = limit + 1;
    std::vector<uint64_t> size(rules.size(), 0);
    std::vector<char> state(rules.size(), 0);  // 0 new, 1 on path, 2 done
    struct Frame {
      int rule;
      size_t alt = 0, idx = 0;
      uint64_t acc = 0;
    };
    std::vector<Frame> path;
    auto add = [&](uint64_t a, uint64_t b) { return std::min(cap, a + b); };
    const int root = g_->root_;
    state[static_cast<size_t>(root)] = 1;
    path.push_back({root});
    uint64_t result = 0;
    while (!path.empty()) {
      Frame& f = path.back();
      const auto& alts = rules[static_cast<size_t>(f.rule)].alts;
      if (f.alt >= alts.size()) {
        size[static_cast<size_t>(f.rule)] = std::max<uint64_t>(f.acc, 1);
        state[static_cast<size_t>(f.rule)] = 2;
        const uint64_t v = size[static_cast<size_t>(f.rule)];
        path.pop_back();
        if (path.empty()) result = v;
        else path.back().acc = add(path.back().acc, v);
        continue;
      }
      const auto& a = alts[f.alt];
      if (f.idx >= a.size()) {
        f.acc = add(f.acc, 1);  // the alternative itself
        ++f.alt;
        f.idx = 0;
        continue;
      }
      const Sym& sy = a[f.idx++];
      if (!sy.is_rule || state[static_cast<size_t>(sy.rule)] == 1) {
        f.acc = add(f.acc, 1);
      } else if (state[static_cast<size_t>(sy.rule)] == 2) {
        f.acc = add(f.acc, size[static_cast<size_t>(sy.rule)]);
      } else {
        poll();
        state[static_cast<size_t>(sy.rule)] = 1;
        path.push_back({sy.rule});
      }
    }
    if (result > limit) too_large(result, limit);
    return result;
  }

  std::string_view t_;
  const Budget& b_;
  std::chrono::steady_clock::time_point deadline_;
  mutable uint64_t polls_ = 0;
  uint64_t syms_ = 0;
  size_t i_ = 0;
  Grammar* g_ = nullptr;
  std::map<std::string, int> index_;
  std::vector<bool> defined_;
  int counter_ = 0;
};

std::shared_ptr<const Grammar> Grammar::parse(std::string_view text, const std::string& root) {
  return parse(text, Budget{}, root);
}

std::shared_ptr<const Grammar> Grammar::parse(std::string_view text, const Budget& budget, const std::string& root) {
  return Parser(text, budget).run(root);
}

// ---------------------------------------------------------------------------------------------
// Matcher

Matcher::Matcher(std::shared_ptr<const Grammar> g) : g_(std::move(g)) {
  const Rule& root = g_->rules()[static_cast<size_t>(g_->root())];
  Expansion x;
  for (int a = 0; a < static_cast<int>(root.alts.size()); ++a)
    if (!expand({{g_->root(), a, 0}}, stacks_, x))
      throw LimitError("max_states", fmt::format("grammar: its first state has more than {} parse stacks or takes more than "
                                                 "{} steps to build (an ambiguous or deeply chained grammar)",
                                                 kMaxStacks, kMaxExpandWork));
  std::sort(stacks_.begin(), stacks_.end());
  stacks_.erase(std::unique(stacks_.begin(), stacks_.end()), stacks_.end());
  if (stacks_.size() > kMaxStacks)
    throw LimitError("max_states", fmt::format("grammar: its first state has more than {} parse stacks (an ambiguous grammar)",
                                               kMaxStacks));
}

// Moves a stack forward until its top is a character class (or it is empty: accepted), for every
// alternative on the way; an explicit work list, so a long chain of rules costs no native stack.
// There is no left recursion, so every path reaches a character class or the end; `work` counts the
// stack positions built and bounds what an ambiguous grammar can cost.
size_t Matcher::StackHash::operator()(const Stack& st) const {
  size_t h = st.size();
  for (const Pos& p : st)
    h = (h * 1000003u) ^ (static_cast<size_t>(static_cast<uint32_t>(p.rule)) * 0x9E3779B1u) ^
        (static_cast<size_t>(static_cast<uint32_t>(p.alt)) << 20) ^ static_cast<size_t>(static_cast<uint32_t>(p.idx));
  return h;
}

bool Matcher::expand(Stack st, std::vector<Stack>& out, Expansion& x) const {
  constexpr size_t kDedupAfter = 4096;  // positions: below, duplicates cost less than hashing them
  std::vector<Stack>& todo = x.todo;  // empty between calls; its capacity is reused
  if (x.work >= kDedupAfter && !x.seen.insert(st).second) return true;
  todo.push_back(std::move(st));
  while (!todo.empty()) {
    Stack cur = std::move(todo.back());
    todo.pop_back();
    bool branched = false;
    while (!cur.empty()) {
      const Pos p = cur.back();
      const auto& seq = g_->rules()[static_cast<size_t>(p.rule)].alts[static_cast<size_t>(p.alt)];
      if (p.idx == static_cast<int32_t>(seq.size())) {
        cur.pop_back();
        continue;
      }
      const Sym& s = seq[static_cast<size_t>(p.idx)];
      if (!s.is_rule) break;
      cur.back().idx++;
      if (cur.back().idx == static_cast<int32_t>(seq.size())) cur.pop_back();  // tail call: nothing left here
      const auto& alts = g_->rules()[static_cast<size_t>(s.rule)].alts;
      x.work += alts.size() * (cur.size() + 1);
      if (x.work > kMaxExpandWork) {
        todo.clear();
        return false;
      }
      for (int a = static_cast<int>(alts.size()); a-- > 0;) {
        Stack n = cur;
        n.push_back({s.rule, a, 0});
        const auto& alt = alts[static_cast<size_t>(a)];
        if (!alt.empty() && !alt[0].is_rule) {
          out.push_back(std::move(n));  // a character class on top: done (duplicates go in step())
        } else if (x.work < kDedupAfter || x.seen.insert(n).second) {
          // may go on without a character: once this character's expansion is not small any more,
          // a stack reached again (another ε-path to it) is not expanded again
          todo.push_back(std::move(n));
        }
      }
      branched = true;
      break;
    }
    if (branched) continue;
    out.push_back(std::move(cur));
  }
  return true;
}

bool Matcher::step(std::vector<Stack>& stacks, uint32_t c) const {
  if (work_ > kMaxCallWork) {  // this call has cost enough: refused as an overflow
    overflow_ = true;
    return false;
  }
  std::vector<Stack> next;
  Expansion x;
  for (const Stack& st : stacks) {
    if (st.empty()) continue;
    const Pos p = st.back();
    const Sym& s = g_->rules()[static_cast<size_t>(p.rule)].alts[static_cast<size_t>(p.alt)][static_cast<size_t>(p.idx)];
    if (!s.matches(c)) continue;
    Stack n = st;
    n.back().idx++;
    const bool ok = expand(std::move(n), next, x);
    if (!ok) {
      work_ += x.work;
      overflow_ = true;
      return false;
    }
  }
  work_ += x.work;
  if (next.empty()) return false;
  std::sort(next.begin(), next.end());
  next.erase(std::unique(next.begin(), next.end()), next.end());
  if (next.size() > kMaxStacks) {
    overflow_ = true;
    return false;
  }
  stacks.swap(next);
  return true;
}

// An incomplete UTF-8 character: some character of its possible range must be acceptable.
bool Matcher::partial_ok(const std::vector<Stack>& stacks, const std::string& pending) const {
  const unsigned char c0 = static_cast<unsigned char>(pending[0]);
  const int n = (c0 >> 5) == 6 ? 2 : (c0 >> 4) == 14 ? 3 : 4;
  uint32_t lo = c0 & (0xFF >> (n + 1));
  for (size_t k = 1; k < pending.size(); ++k) lo = (lo << 6) | (static_cast<unsigned char>(pending[k]) & 0x3F);
  const int rest = n - static_cast<int>(pending.size());
  uint32_t hi = lo;
  for (int k = 0; k < rest; ++k) {
    lo <<= 6;
    hi = (hi << 6) | 0x3F;
  }
  // only what a valid sequence can still become: no overlong forms, surrogates or beyond U+10FFFF
  lo = std::max(lo, n == 2 ? 0x80u : n == 3 ? 0x800u : 0x10000u);
  hi = std::min(hi, 0x10FFFFu);
  if (lo >= 0xD800 && hi <= 0xDFFF) return false;
  if (lo <= 0xD7FF && hi >= 0xD800 && hi <= 0xDFFF) hi = 0xD7FF;  // ED: up to U+D7FF
  if (lo > hi) return false;
  for (const Stack& st : stacks) {
    if (st.empty()) continue;
    const Pos p = st.back();
    const Sym& s = g_->rules()[static_cast<size_t>(p.rule)].alts[static_cast<size_t>(p.alt)][static_cast<size_t>(p.idx)];
    if (s.negated) {  // accepts everything outside its ranges: fails only when [lo, hi] is covered
      bool covered = false;
      for (const Range& r : s.ranges) covered = covered || (r.lo <= lo && r.hi >= hi);
      if (!covered) return true;
    } else {
      for (const Range& r : s.ranges)
        if (r.lo <= hi && r.hi >= lo) return true;
    }
  }
  return false;
}

bool Matcher::feed(std::vector<Stack>& stacks, std::string& pending, std::string_view bytes) const {
  for (char ch : bytes) {
    const unsigned char b = static_cast<unsigned char>(ch);
    if (pending.empty()) {
      if (b < 0x80) {
        if (!step(stacks, b)) return false;
        continue;
      }
      if (b < 0xC2 || b > 0xF4) return false;  // not a lead byte (C0, C1: overlong; F5..: beyond U+10FFFF)
      pending.push_back(static_cast<char>(b));
    } else {
      // strict UTF-8 (as the detokenizer): no overlong forms, no surrogates, nothing beyond U+10FFFF
      const unsigned char c0 = static_cast<unsigned char>(pending[0]);
      unsigned char lo = 0x80, hi = 0xBF;
      if (pending.size() == 1) {
        if (c0 == 0xE0) lo = 0xA0;
        else if (c0 == 0xED) hi = 0x9F;
        else if (c0 == 0xF0) lo = 0x90;
        else if (c0 == 0xF4) hi = 0x8F;
      }
      if (b < lo || b > hi) return false;
      pending.push_back(static_cast<char>(b));
    }
    const unsigned char c0 = static_cast<unsigned char>(pending[0]);
    const size_t n = (c0 >> 5) == 6 ? 2 : (c0 >> 4) == 14 ? 3 : 4;
    if (pending.size() < n) {
      if (!partial_ok(stacks, pending)) return false;
      continue;
    }
    uint32_t cp = c0 & (0xFF >> (n + 1));
    for (size_t k = 1; k < n; ++k) cp = (cp << 6) | (static_cast<unsigned char>(pending[k]) & 0x3F);
    pending.clear();
    if (!step(stacks, cp)) return false;
  }
  return true;
}

bool Matcher::accepts_bytes(std::string_view bytes) const {
  work_ = 0;
  std::vector<Stack> st = stacks_;
  std::string pend = pending_;
  return feed(st, pend, bytes);
}

bool Matcher::advance_bytes(std::string_view bytes) {
  work_ = 0;
  std::vector<Stack> st = stacks_;
  std::string pend = pending_;
  if (!feed(st, pend, bytes)) return false;
  stacks_.swap(st);
  pending_.swap(pend);
  return true;
}

// ---------------------------------------------------------------------------------------------
// Token trie and the walk over it

TokenTrie::TokenTrie(const std::vector<std::string>& pieces) : n_tokens_(pieces.size()) {
  std::vector<int32_t> order;
  order.reserve(pieces.size());
  for (size_t t = 0; t < pieces.size(); ++t)
    if (!pieces[t].empty()) order.push_back(static_cast<int32_t>(t));
  std::stable_sort(order.begin(), order.end(), [&](int32_t a, int32_t b) {
    return pieces[static_cast<size_t>(a)] < pieces[static_cast<size_t>(b)];
  });
  // sorted strings: each adds the nodes past its common prefix with the previous one, in pre-order
  std::vector<uint32_t> path;  // path[d]: the node at depth d + 1 on the current string
  const std::string* prev = nullptr;
  toks_.reserve(order.size());
  for (int32_t t : order) {
    const std::string& p = pieces[static_cast<size_t>(t)];
    size_t common = 0;
    if (prev) {
      while (common < p.size() && common < prev->size() && p[common] == (*prev)[common]) ++common;
    }
    if (p.size() > 0xFFFF) throw std::length_error("grammar: a token piece is longer than 65535 bytes");
    path.resize(common);
    for (size_t d = common; d < p.size(); ++d) {
      path.push_back(static_cast<uint32_t>(nodes_.size()));
      nodes_.push_back({0, 0, 0, static_cast<uint16_t>(d + 1), static_cast<uint8_t>(p[d])});
    }
    Node& leaf = nodes_[path.back()];
    if (leaf.tok_begin == leaf.tok_end) leaf.tok_begin = leaf.tok_end = static_cast<uint32_t>(toks_.size());
    toks_.push_back(t);  // equal pieces are adjacent in the sorted order
    leaf.tok_end = static_cast<uint32_t>(toks_.size());
    prev = &p;
  }
  // subtree ends: a node's subtree ends at the next node that is not deeper
  std::vector<uint32_t> open;
  for (uint32_t i = 0; i < nodes_.size(); ++i) {
    while (!open.empty() && nodes_[open.back()].depth >= nodes_[i].depth) {
      nodes_[open.back()].end = i;
      open.pop_back();
    }
    open.push_back(i);
  }
  for (uint32_t i : open) nodes_[i].end = static_cast<uint32_t>(nodes_.size());
}

size_t Matcher::StateHash::operator()(const State& s) const {
  size_t h = std::hash<std::string>()(s.pending);
  for (const Stack& st : s.stacks) {
    h = h * 1000003u ^ st.size();
    for (const Pos& p : st)
      h = (h * 1000003u) ^ (static_cast<size_t>(static_cast<uint32_t>(p.rule)) * 0x9E3779B1u) ^
          (static_cast<size_t>(static_cast<uint32_t>(p.alt)) << 20) ^ static_cast<size_t>(static_cast<uint32_t>(p.idx));
  }
  return h;
}

int32_t Matcher::intern(State&& s) {
  auto it = dfa_index_.find(s);
  if (it != dfa_index_.end()) return it->second;
  const int32_t id = static_cast<int32_t>(dfa_states_.size());
  dfa_states_.push_back(s);
  dfa_index_.emplace(std::move(s), id);
  dfa_next_.insert(dfa_next_.end(), 256, -2);
  return id;
}

// The state after one more byte (feed() one byte at a time is feed() of the whole string).
int32_t Matcher::next_state(int32_t from, uint8_t byte) {
  int32_t& slot = dfa_next_[static_cast<size_t>(from) * 256 + byte];
  if (slot != -2) return slot;
  if (work_ > kMaxCallWork) {  // this walk has cost enough: what it has not reached is refused (not cached)
    overflow_ = true;
    return -1;
  }
  State s = dfa_states_[static_cast<size_t>(from)];
  const char c = static_cast<char>(byte);
  const int32_t to = feed(s.stacks, s.pending, std::string_view(&c, 1)) ? intern(std::move(s)) : -1;
  dfa_next_[static_cast<size_t>(from) * 256 + byte] = to;  // intern() may have moved the table
  return to;
}

void Matcher::allowed_tokens(const TokenTrie& trie, std::vector<uint8_t>& ok) {
  ok.assign(trie.n_tokens_, 0);
  if (dfa_states_.size() > 8192) {  // a long generation through many states: start afresh
    dfa_states_.clear();
    dfa_next_.clear();
    dfa_index_.clear();
  }
  work_ = 0;
  std::vector<int32_t> at;  // at[d]: the state after the first d bytes of the current path
  at.push_back(intern(State{stacks_, pending_}));
  const auto& nodes = trie.nodes_;
  for (size_t i = 0; i < nodes.size();) {
    const TokenTrie::Node& n = nodes[i];
    at.resize(n.depth);
    const int32_t s = next_state(at.back(), n.byte);
    if (s < 0) {
      i = n.end;  // refused: no token below this prefix can follow
      continue;
    }
    at.push_back(s);
    for (uint32_t k = n.tok_begin; k < n.tok_end; ++k) ok[static_cast<size_t>(trie.toks_[k])] = 1;
    ++i;
  }
}

// A stack's remaining cost: the rest of every frame's alternative (the top from the class it
// waits at; a frame below from the symbol after the rule it entered).
uint64_t Matcher::stack_cost(const Stack& st) const {
  uint64_t sum = 0;
  for (const Pos& p : st) {
    const auto& seq = g_->rules()[static_cast<size_t>(p.rule)].alts[static_cast<size_t>(p.alt)];
    for (size_t i = static_cast<size_t>(p.idx); i < seq.size(); ++i) {
      const uint64_t c = seq[i].is_rule ? g_->min_cost()[static_cast<size_t>(seq[i].rule)] : sym_cost(seq[i]);
      if (c == kNoChar || sum + c < sum) return kNoChar;
      sum += c;
    }
  }
  return sum;
}

uint64_t Matcher::min_cost() const {
  if (!pending_.empty()) return kNoChar;
  uint64_t best = kNoChar;
  for (const Stack& st : stacks_) {
    best = std::min(best, stack_cost(st));
  }
  return best;
}

std::string Matcher::cheapest_completion() const {
  std::string out;
  if (!pending_.empty()) return out;
  std::vector<Stack> stacks = stacks_;
  work_ = 0;
  for (size_t guard = 0; guard < (1u << 20); ++guard) {
    const Stack* best = nullptr;
    uint64_t bc = kNoChar;
    for (const Stack& st : stacks) {
      const uint64_t c = stack_cost(st);
      if (c < bc) bc = c, best = &st;
    }
    if (!best || bc == 0) break;
    const Pos p = best->back();
    const Sym& s = g_->rules()[static_cast<size_t>(p.rule)].alts[static_cast<size_t>(p.alt)][static_cast<size_t>(p.idx)];
    const uint32_t c = cheapest_char(s);
    if (c > 0x10FFFF || !step(stacks, c)) return {};
    // UTF-8 of c
    if (c < 0x80) out += static_cast<char>(c);
    else if (c < 0x800) out += {static_cast<char>(0xC0 | (c >> 6)), static_cast<char>(0x80 | (c & 0x3F))};
    else if (c < 0x10000)
      out += {static_cast<char>(0xE0 | (c >> 12)), static_cast<char>(0x80 | ((c >> 6) & 0x3F)), static_cast<char>(0x80 | (c & 0x3F))};
    else
      out += {static_cast<char>(0xF0 | (c >> 18)), static_cast<char>(0x80 | ((c >> 12) & 0x3F)),
              static_cast<char>(0x80 | ((c >> 6) & 0x3F)), static_cast<char>(0x80 | (c & 0x3F))};
  }
  return out;
}

bool Matcher::can_end() const {
  if (!pending_.empty()) return false;
  for (const Stack& s : stacks_)
    if (s.empty()) return true;
  return false;
}

bool Matcher::can_continue() const {
  for (const Stack& s : stacks_)
    if (!s.empty()) return true;
  return false;
}

}  // namespace kimi::server::grammar
