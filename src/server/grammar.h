// Constrained decoding for `kimi serve`: a GBNF grammar (llama.cpp's notation) or a JSON schema
// becomes a pushdown automaton over Unicode code points, and the automaton decides which tokens
// may come next (their bytes must continue a string the grammar can still derive).
//
//   auto g = grammar::Grammar::parse(R"(root ::= "yes" | "no")");        // GrammarError on bad input
//   auto j = grammar::Grammar::parse(grammar::schema_to_gbnf(schema));   // SchemaError: unsupported feature
//   grammar::Matcher m(g);
//   m.accepts_bytes("ye");   // true: a prefix of a sentence
//   m.advance_bytes("yes");  // consumes; m.can_end() is now true
//   grammar::TokenTrie trie(pieces);        // once per vocabulary
//   m.allowed_tokens(trie, ok);             // ok[t] = m.accepts_bytes(pieces[t]), for all t at once
//
// GBNF: `name ::= alternatives` rules (the start rule is `root`); "literal" strings, [a-z] / [^"\\]
// character classes, `.` (any character), ( groups ), and the postfixes * + ? {m} {m,} {m,n};
// escapes \n \r \t \\ \" \] \[ \- \xHH \uHHHH \UHHHHHHHH; # comments. Left recursion is refused.
#pragma once
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <stdexcept>
#include <string>
#include <string_view>
#include <unordered_map>
#include <unordered_set>
#include <vector>

namespace kimi::server::grammar {

// A grammar that does not parse: the message names the rule / position.
struct GrammarError : std::runtime_error {
  using std::runtime_error::runtime_error;
};
// A JSON schema the converter does not support: `feature` is the keyword, `where` its JSON path.
struct SchemaError : std::runtime_error {
  SchemaError(const std::string& feature, const std::string& where, const std::string& msg)
      : std::runtime_error(msg), feature(feature), where(where) {}
  std::string feature, where;
};

// The one budget of every compiler of user-supplied structure (GBNF text, JSON schema and its
// $ref chains, the matcher's first state): what a request may make the server build before a
// token is generated. Exceeding it is a LimitError naming the limit.
struct Budget {
  int max_depth = 64;                // nesting: GBNF groups, schema levels, $ref chains
  uint64_t max_size = 1u << 20;      // expanded size in symbols: repeats multiplied before expansion
  uint64_t max_expanded = 0;         // the limit of the size with rule references inlined (0: max_size)
  double max_seconds = 2.0;          // wall time of one compilation
  std::function<bool()> cancelled;   // polled while compiling: true when the client has gone
  std::chrono::steady_clock::time_point deadline() const;  // now + max_seconds
};
// A limit of the Budget was exceeded (or the compile was cancelled): `limit` names it
// ("max_depth", "max_size", "max_seconds", "max_states", "cancelled").
struct LimitError : GrammarError {
  LimitError(std::string limit, const std::string& msg) : GrammarError(msg), limit(std::move(limit)) {}
  std::string limit;
};

struct Range {
  uint32_t lo, hi;  // inclusive code points
};

struct Sym {
  bool is_rule = false;
  int rule = -1;              // is_rule: index into Grammar::rules
  bool negated = false;       // [^...]
  std::vector<Range> ranges;  // a character class (a literal character is one range)
  bool matches(uint32_t c) const;
};

struct Rule {
  std::string name;
  std::vector<std::vector<Sym>> alts;  // each alternative is a sequence (may be empty)
};

class Grammar {
 public:
  // Throws GrammarError (LimitError beyond the budget). Besides the syntax it checks: every used
  // rule defined, no left recursion, a non-empty language (alternatives that can never finish are
  // dropped; a root that can never finish is an error), the budget's nesting depth, expanded size
  // (repeats multiplied by their counts before they are expanded, rule references inlined) and time.
  static std::shared_ptr<const Grammar> parse(std::string_view text, const std::string& root = "root");
  static std::shared_ptr<const Grammar> parse(std::string_view text, const Budget& budget, const std::string& root = "root");
  const std::vector<Rule>& rules() const { return rules_; }
  int root() const { return root_; }
  // The fewest UTF-8 bytes of a sentence (an answer shorter than that cannot be complete).
  uint64_t min_sentence_bytes() const { return min_bytes_; }
  // The expanded size the budget was checked against (symbols, with repeats and rules inlined).
  uint64_t expanded_size() const { return expanded_size_; }
  // Per rule: the least cost of a sentence it derives, a character costing its UTF-8 bytes and the
  // structural code points U+E000..U+E002 (one special token each in a tool grammar) 1 -- an upper
  // bound on the tokens that can write it with a byte-level vocabulary (Matcher::min_cost).
  const std::vector<uint64_t>& min_cost() const { return min_cost_; }

 private:
  friend class Parser;
  std::vector<Rule> rules_;
  int root_ = -1;
  uint64_t min_bytes_ = 0, expanded_size_ = 0;
  std::vector<uint64_t> min_cost_;
};

// The byte strings of a vocabulary as a trie, stored in depth-first order: a matcher walks it once
// and skips every subtree whose prefix the grammar refuses (Matcher::allowed_tokens).
class TokenTrie {
 public:
  // pieces[t]: the bytes of token t; an empty piece is never allowed (special tokens: pass "").
  explicit TokenTrie(const std::vector<std::string>& pieces);
  size_t n_tokens() const { return n_tokens_; }
  size_t n_nodes() const { return nodes_.size(); }

 private:
  friend class Matcher;
  struct Node {
    uint32_t end;        // one past the last node of this subtree
    uint32_t tok_begin;  // tokens whose piece ends here: toks_[tok_begin, tok_end)
    uint32_t tok_end;
    uint16_t depth;      // bytes from the root (>= 1)
    uint8_t byte;        // the edge into this node
  };
  std::vector<Node> nodes_;  // depth-first (pre-order); the root itself is not stored
  std::vector<int32_t> toks_;
  size_t n_tokens_ = 0;
};

// Where the automaton is: the set of parse stacks (positions in rule alternatives, innermost
// last) that are still alive after the input so far, plus an incomplete UTF-8 sequence.
class Matcher {
 public:
  explicit Matcher(std::shared_ptr<const Grammar> g);
  bool accepts_bytes(std::string_view bytes) const;  // would advance_bytes succeed?
  bool advance_bytes(std::string_view bytes);        // false (state unchanged) when not accepted
  bool can_end() const;       // the input so far is a whole sentence of the grammar
  bool can_continue() const;  // some character may still follow
  bool dead() const { return stacks_.empty(); }
  // A character was refused because the parse stacks grew past the matcher's limits (an
  // ambiguous grammar), not because the grammar forbids it.
  bool overflowed() const { return overflow_; }
  static constexpr size_t kMaxStacks = 1u << 15;     // parse stacks alive after one character (an enum: one per value)
  static constexpr size_t kMaxExpandWork = 1u << 17;  // stack positions built for one character
  static constexpr size_t kMaxCallWork = 1u << 18;    // ... for one accepts_bytes / advance_bytes /
                                                      // allowed_tokens call (beyond: refused, overflow)
  // ok[t] = 1 when accepts_bytes(piece of t) (ok is resized to trie.n_tokens()): one walk of the
  // trie with a lazily built byte-level DFA of this matcher's states, kept across calls.
  void allowed_tokens(const TokenTrie& trie, std::vector<uint8_t>& ok);
  // The least cost (Grammar::min_cost) of a text that completes the sentence from here: 0 when it
  // can end now; UINT64_MAX when it is dead or inside an unfinished UTF-8 character.
  uint64_t min_cost() const;
  // A text of that least cost that completes the sentence (the cheapest character of the cheapest
  // parse stack, one after another); "" when it can end now or min_cost() is UINT64_MAX.
  std::string cheapest_completion() const;

 private:
  struct Pos {
    int32_t rule, alt, idx;
    bool operator==(const Pos& o) const { return rule == o.rule && alt == o.alt && idx == o.idx; }
    bool operator<(const Pos& o) const {
      return rule != o.rule ? rule < o.rule : alt != o.alt ? alt < o.alt : idx < o.idx;
    }
  };
  using Stack = std::vector<Pos>;
  struct StackHash {
    size_t operator()(const Stack& st) const;
  };
  // one character's expansion: the stacks already reached (many ε-paths lead to the same stack)
  struct Expansion {
    std::unordered_set<Stack, StackHash> seen;
    std::vector<Stack> todo;  // expand()'s work list
    size_t work = 0;
  };
  bool expand(Stack st, std::vector<Stack>& out, Expansion& x) const;  // false: over the limits
  bool step(std::vector<Stack>& stacks, uint32_t c) const;              // one code point
  uint64_t stack_cost(const Stack& st) const;                           // min_cost() of one stack
  bool partial_ok(const std::vector<Stack>& stacks, const std::string& pending) const;
  bool feed(std::vector<Stack>& stacks, std::string& pending, std::string_view bytes) const;
  struct State {
    std::vector<Stack> stacks;
    std::string pending;
    bool operator==(const State& o) const { return stacks == o.stacks && pending == o.pending; }
  };
  struct StateHash {
    size_t operator()(const State& s) const;
  };
  int32_t intern(State&& s);
  int32_t next_state(int32_t from, uint8_t byte);
  std::shared_ptr<const Grammar> g_;
  std::vector<Stack> stacks_;
  std::string pending_;  // bytes of an incomplete UTF-8 character
  mutable bool overflow_ = false;
  mutable size_t work_ = 0;  // stack positions built since the current public call began
  // allowed_tokens' DFA: interned states and their byte transitions (-2 unknown, -1 refused)
  std::vector<State> dfa_states_;
  std::vector<int32_t> dfa_next_;  // 256 per state
  std::unordered_map<State, int32_t, StateHash> dfa_index_;
};

// JSON schema -> GBNF whose `root` derives only JSON texts valid under the schema (with limited
// whitespace). Held exactly: type (one or a list; without one, the type its keywords imply),
// properties / required / additionalProperties (false, true or a schema: extra members after the
// declared ones, with keys that do not start like a declared one), items, minItems / maxItems,
// enum, const, anyOf / oneOf, $ref to `#` or a JSON pointer into the schema (#/$defs/p,
// #/$defs/p/properties/id, ...), string minLength / maxLength (above 1000: at most 1000 are
// written) and pattern (the regex subset of RegexToGbnf: classes, groups, alternation,
// quantifiers, ^ and $ at the ends; not together with lengths), integer minimum / maximum /
// exclusiveMinimum / exclusiveMaximum (a digit grammar of the range), number bounds (the
// numbers written are the range's integers and m.fraction where [m, m + 1) lies inside);
// annotations (title, description, default, examples, $schema, $id, $comment) are ignored.
// Anything else (format, multipleOf, allOf, uniqueItems unless maxItems <= 1, prefixItems, a
// regex outside the subset, ...) throws SchemaError naming the keyword: the answer could not be
// held to it. `tool_text`: the strings of a tool call (no raw '<', which could start a tag: it is
// written as \u003c where a length or pattern counts characters).
// Throws SchemaError, or LimitError beyond the budget (nesting and $ref chains deeper than
// max_depth, output larger than the budget allows, time, cancellation).
std::string schema_to_gbnf(const nlohmann::ordered_json& schema);
std::string schema_to_gbnf(const nlohmann::ordered_json& schema, const Budget& budget, bool tool_text = false);

// `#` or a JSON pointer fragment (`#/$defs/a~1b/properties/0`) into root; nullptr when it names nothing.
const nlohmann::ordered_json* resolve_ref(const nlohmann::ordered_json& root, const std::string& ref);

// The grammar of any JSON object (response_format json_object).
std::string json_object_gbnf();

// A GBNF string literal (quoted, escaped) that matches exactly the bytes of `s`.
std::string gbnf_literal(const std::string& s);

}  // namespace kimi::server::grammar
