// The constraint engine of `kimi serve` (server/grammar.h): GBNF parsing, the code-point
// automaton (prefixes, complete sentences, UTF-8 split across pieces), and JSON schema -> GBNF
// checked by brute force against nlohmann's JSON parser: every accepted text is valid JSON of the
// schema's shape, and valid documents are accepted.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <random>

#include "server/grammar.h"

using namespace kimi::server::grammar;
using ojson = nlohmann::ordered_json;

namespace {

bool full(const std::string& gbnf, const std::string& text) {
  Matcher m(Grammar::parse(gbnf));
  return m.advance_bytes(text) && m.can_end();
}
bool prefix(const std::string& gbnf, const std::string& text) {
  Matcher m(Grammar::parse(gbnf));
  return m.advance_bytes(text);
}

}  // namespace

TEST(Grammar, LiteralsClassesAlternatives) {
  const std::string g = R"(root ::= "yes" | "no" | [0-9]+ "%"   # a comment
)";
  EXPECT_TRUE(full(g, "yes"));
  EXPECT_TRUE(full(g, "no"));
  EXPECT_TRUE(full(g, "42%"));
  EXPECT_FALSE(full(g, "ye"));
  EXPECT_TRUE(prefix(g, "ye"));
  EXPECT_FALSE(prefix(g, "yess"));
  EXPECT_FALSE(prefix(g, "%"));
  EXPECT_FALSE(full(g, "42"));
}

TEST(Grammar, RepetitionCountsAndGroups) {
  const std::string g = R"(root ::= ("ab"){2,3} x?
x ::= [^a-c]
)";
  EXPECT_FALSE(full(g, "ab"));
  EXPECT_TRUE(full(g, "abab"));
  EXPECT_TRUE(full(g, "ababab"));
  EXPECT_FALSE(full(g, "abababab"));
  EXPECT_TRUE(full(g, "ababz"));
  EXPECT_FALSE(full(g, "ababc"));
  EXPECT_TRUE(full(R"(root ::= "a"{3})", "aaa"));
  EXPECT_FALSE(full(R"(root ::= "a"{3})", "aaaa"));
  EXPECT_TRUE(full(R"(root ::= "a"{2,} "b")", "aaaaab"));
  EXPECT_FALSE(full(R"(root ::= "a"{2,} "b")", "ab"));
}

TEST(Grammar, Utf8AcrossPiecesAndEscapes) {
  const std::string g = "root ::= [\\u00e0-\\u00ff] \"\\n\" \"\\u20ac\"";
  Matcher m(Grammar::parse(g));
  EXPECT_TRUE(m.advance_bytes("\xc3"));   // first byte of U+00E9: could still be in range
  EXPECT_FALSE(m.can_end());
  EXPECT_TRUE(m.advance_bytes("\xa9\n\xe2\x82"));
  EXPECT_FALSE(m.accepts_bytes("\xac!"));
  EXPECT_TRUE(m.advance_bytes("\xac"));
  EXPECT_TRUE(m.can_end());
  Matcher m2(Grammar::parse(g));
  EXPECT_FALSE(m2.advance_bytes("\xc2"));  // U+0080..U+00BF: none in range
  EXPECT_FALSE(m2.advance_bytes("\xff"));  // never UTF-8
  // overlong forms, surrogates and code points beyond U+10FFFF are not characters, whatever they decode to
  const std::string any = "root ::= .+";
  EXPECT_FALSE(prefix(any, "\xc1\xb9"));          // overlong 'y'
  EXPECT_FALSE(prefix(any, "\xe0\x81\xb9"));      // overlong 'y'
  EXPECT_FALSE(prefix(any, "\xed\xa0\x80"));      // U+D800
  EXPECT_FALSE(prefix(any, "\xf4\x90\x80\x80"));  // U+110000
  EXPECT_TRUE(full(any, "y\xc3\xa9\xe2\x82\xac\xf0\x9f\x98\x80"));
  EXPECT_FALSE(full(R"(root ::= "y")", "\xc1\xb9"));
  // a lead byte alone is accepted only when a valid character it starts can follow
  EXPECT_FALSE(prefix(R"(root ::= [a-z])", "\xe0"));  // E0 starts U+0800..U+0FFF only
  EXPECT_FALSE(prefix(R"(root ::= [\u0000-\u07ff])", "\xe0"));
  EXPECT_TRUE(prefix(R"(root ::= [\u0900-\u0901])", "\xe0"));
  EXPECT_FALSE(prefix(R"(root ::= [\ud800-\udfff] | [\ue000-\ue001])", "\xed"));
}

TEST(Grammar, BadGrammarsNameTheProblem) {
  auto msg = [](const std::string& g) {
    try {
      Grammar::parse(g);
    } catch (const GrammarError& e) {
      return std::string(e.what());
    }
    return std::string("(accepted)");
  };
  EXPECT_NE(msg("root ::= foo").find("rule 'foo' is used but not defined"), std::string::npos);
  EXPECT_NE(msg("start ::= \"a\"").find("no 'root' rule"), std::string::npos);
  EXPECT_NE(msg("root ::= \"a").find("unterminated string"), std::string::npos);
  EXPECT_NE(msg("root ::= root \"a\" | \"b\"").find("left-recursive"), std::string::npos);
  EXPECT_NE(msg("root ::= x\nx ::= \"\" root").find("left-recursive"), std::string::npos);
  EXPECT_NE(msg("root ::= \"a\"{3,1}").find("n < m"), std::string::npos);
  EXPECT_NE(msg("root ::= \"a\"\nroot ::= \"b\"").find("defined twice"), std::string::npos);
  EXPECT_NE(msg("root ::= [a-").find("line 1"), std::string::npos);
}

namespace {

// Random walks: from the start, repeatedly append a random byte the matcher accepts (ASCII and a
// few multi-byte characters); whenever the matcher can end, the text must parse as JSON and pass
// `check`. Also the acceptance of given valid / invalid documents.
void walk(const std::string& gbnf, const std::function<void(const ojson&)>& check, int walks = 300) {
  auto g = Grammar::parse(gbnf);
  std::mt19937 rng(7);
  const std::vector<std::string> alphabet = [] {
    std::vector<std::string> a;
    for (int c = 0x20; c < 0x7f; ++c) a.push_back(std::string(1, static_cast<char>(c)));
    a.push_back("\n");
    a.push_back("\xc3\xa9");
    a.push_back("\xe2\x82\xac");
    return a;
  }();
  int ended = 0;
  for (int w = 0; w < walks; ++w) {
    Matcher m(g);
    std::string text;
    for (int step = 0; step < 80; ++step) {
      if (m.can_end() && (rng() % 6 == 0 || !m.can_continue())) break;
      std::vector<const std::string*> ok;
      for (const auto& s : alphabet)
        if (m.accepts_bytes(s)) ok.push_back(&s);
      if (ok.empty()) break;
      // prefer closing characters a little, so walks finish
      const std::string& pick = *ok[rng() % ok.size()];
      ASSERT_TRUE(m.advance_bytes(pick));
      text += pick;
    }
    if (!m.can_end()) continue;
    ++ended;
    const ojson j = ojson::parse(text, nullptr, false);
    ASSERT_FALSE(j.is_discarded()) << "grammar accepted invalid JSON: " << text;
    check(j);
  }
  EXPECT_GT(ended, 10) << "too few complete walks to say anything";
}

}  // namespace

TEST(JsonSchema, JsonObjectGrammarAcceptsOnlyObjects) {
  const std::string g = json_object_gbnf();
  walk(g, [](const ojson& j) { EXPECT_TRUE(j.is_object()) << j.dump(); });
  EXPECT_TRUE(full(g, R"({"a": [1, 2.5e3, -0, true, null, "x\"y\u00e9"], "b": {}})"));
  EXPECT_FALSE(full(g, "[1]"));
  EXPECT_FALSE(full(g, R"({"a": 01})"));
  EXPECT_FALSE(full(g, R"({"a": 1,})"));
  EXPECT_FALSE(full(g, "{\"a\": \"\x01\"}"));
}

TEST(JsonSchema, ObjectWithRequiredAndOptionalProperties) {
  const ojson schema = ojson::parse(R"({
    "type": "object",
    "properties": {
      "name": {"type": "string", "maxLength": 5},
      "age": {"type": "integer"},
      "tags": {"type": "array", "items": {"enum": ["a", "b"]}, "maxItems": 2},
      "ok": {"type": ["boolean", "null"]}
    },
    "required": ["name", "ok"],
    "additionalProperties": false
  })");
  const std::string g = schema_to_gbnf(schema);
  walk(g, [](const ojson& j) {
    ASSERT_TRUE(j.is_object());
    ASSERT_TRUE(j.contains("name") && j["name"].is_string()) << j.dump();
    EXPECT_LE(j["name"].get<std::string>().size(), 5u * 3);  // up to 5 characters (UTF-8 bytes)
    ASSERT_TRUE(j.contains("ok") && (j["ok"].is_boolean() || j["ok"].is_null())) << j.dump();
    if (j.contains("age")) {
      EXPECT_TRUE(j["age"].is_number_integer()) << j.dump();
    }
    if (j.contains("tags")) {
      ASSERT_TRUE(j["tags"].is_array());
      EXPECT_LE(j["tags"].size(), 2u);
      for (const auto& t : j["tags"]) EXPECT_TRUE(t == "a" || t == "b") << j.dump();
    }
    for (auto it = j.begin(); it != j.end(); ++it)
      EXPECT_TRUE(it.key() == "name" || it.key() == "age" || it.key() == "tags" || it.key() == "ok") << it.key();
  });
  EXPECT_TRUE(full(g, R"({"name": "bob", "ok": true})"));
  EXPECT_TRUE(full(g, R"({"name": "bob", "age": 7, "tags": ["b"], "ok": null})"));
  EXPECT_FALSE(full(g, R"({"ok": true})"));                  // name missing
  EXPECT_FALSE(full(g, R"({"name": "bobbyy", "ok": true})"));  // too long
  EXPECT_FALSE(full(g, R"({"name": "b", "ok": true, "x": 1})"));
  EXPECT_FALSE(full(g, R"({"name": "b", "age": 1.5, "ok": true})"));
}

TEST(JsonSchema, RefsAnyOfConstAndArrays) {
  const ojson schema = ojson::parse(R"({
    "$defs": {"node": {"type": "object", "properties": {"v": {"type": "number"},
                                                       "next": {"anyOf": [{"$ref": "#/$defs/node"}, {"type": "null"}]}},
                       "required": ["v", "next"]}},
    "type": "object",
    "properties": {"kind": {"const": "list"}, "head": {"$ref": "#/$defs/node"},
                   "xs": {"type": "array", "items": {"type": "integer"}, "minItems": 1, "maxItems": 3}},
    "required": ["kind", "head", "xs"]
  })");
  const std::string g = schema_to_gbnf(schema);
  EXPECT_TRUE(full(g, R"({"kind": "list", "head": {"v": 1, "next": {"v": 2.5, "next": null}}, "xs": [1]})"));
  EXPECT_FALSE(full(g, R"({"kind": "tree", "head": {"v": 1, "next": null}, "xs": [1]})"));
  EXPECT_FALSE(full(g, R"({"kind": "list", "head": {"v": 1, "next": null}, "xs": []})"));
  EXPECT_FALSE(full(g, R"({"kind": "list", "head": {"v": 1, "next": null}, "xs": [1, 2, 3, 4]})"));
  walk(g, [](const ojson& j) {
    EXPECT_EQ(j["kind"], "list");
    EXPECT_TRUE(j["xs"].size() >= 1 && j["xs"].size() <= 3) << j.dump();
  }, 400);
}

TEST(JsonSchema, UnsupportedFeaturesAreNamed) {
  struct Case { const char* schema; const char* feature; };
  for (const Case& c : {Case{R"({"type": "string", "pattern": "(?=a)b"})", "pattern"},
                        Case{R"({"type": "string", "format": "date-time"})", "format"},
                        Case{R"({"type": "number", "minimum": 0.25, "maximum": 0.75})", "minimum"},
                        Case{R"({"allOf": [{"type": "string"}]})", "allOf"},
                        Case{R"({"type": "object", "properties": {"a": {"type": "number", "multipleOf": 2}}})", "multipleOf"},
                        Case{R"({"type": "array", "items": {"type": "string"}, "uniqueItems": true})", "uniqueItems"},
                        Case{R"({"$ref": "#/$defs/missing"})", "$ref"},
                        Case{R"({"type": "tuple"})", "type"}}) {
    try {
      schema_to_gbnf(ojson::parse(c.schema));
      ADD_FAILURE() << "accepted " << c.schema;
    } catch (const SchemaError& e) {
      EXPECT_EQ(e.feature, c.feature) << c.schema;
      EXPECT_NE(std::string(e.what()).find(c.feature), std::string::npos) << e.what();
    }
  }
  // annotations are fine
  EXPECT_NO_THROW(schema_to_gbnf(ojson::parse(R"({"title": "t", "description": "d", "type": "string", "default": "x"})")));
}

namespace {

// A vocabulary like a byte-level BPE one: every single byte, words and JSON punctuation glued
// together, UTF-8 characters whole and cut anywhere (pieces that end or start mid-character),
// duplicate pieces and empty ones (special tokens).
std::vector<std::string> test_vocab(size_t n, uint32_t seed) {
  std::vector<std::string> v;
  for (int b = 0; b < 256; ++b) v.push_back(std::string(1, static_cast<char>(b)));
  const std::vector<std::string> parts = {"\"", "{", "}", "[", "]", ":", ",", " ", "\n", "\\", "\\\"", "\\n", "\\u00",
                                          "true", "false", "null", "name", "count", "ok", "yes", "no", "a", "e", "x",
                                          "0", "1", "42", "-", ".", "e+", "\xc3\xa9", "\xe2\x82\xac", "\xf0\x9f\x98\x80",
                                          "\xce\xb1", "\xcf\x89", "\xc3", "\xa9", "\x82\xac", "\xe2", "\xf0\x9f", "\x98\x80"};
  std::mt19937 rng(seed);
  while (v.size() < n) {
    std::string s;
    const int k = 1 + static_cast<int>(rng() % 4);
    for (int i = 0; i < k; ++i) s += parts[rng() % parts.size()];
    v.push_back(s);
  }
  v.push_back("");
  v.push_back(v[300]);  // a duplicate
  return v;
}

}  // namespace

// The trie walk is a shortcut for asking accepts_bytes token by token: on random paths through
// several grammars (JSON schema, json_object, UTF-8 classes, negated classes) both give the same
// set of allowed tokens at every step, so constrained sampling draws from the same distribution.
TEST(TokenTrie, AllowedTokensEqualPerTokenChecks) {
  const std::vector<std::string> vocab = test_vocab(6000, 11);
  const TokenTrie trie(vocab);
  EXPECT_EQ(trie.n_tokens(), vocab.size());
  const std::vector<std::string> grammars = {
      schema_to_gbnf(ojson::parse(R"({"type": "object", "properties": {"name": {"type": "string", "maxLength": 8},
          "count": {"type": "integer"}, "ok": {"type": "boolean"}}, "required": ["name", "count"],
          "additionalProperties": false})")),
      json_object_gbnf(),
      "root ::= \"yes\" | \"no\" | [\\u03b1-\\u03c9]+ (\" \" [^a-z\\n]{1,3})?",
      "root ::= ([a-z ] | \"\\u20ac\" | \"\\U0001F600\")* \"!\"",
  };
  std::mt19937 rng(5);
  for (const std::string& gbnf : grammars) {
    SCOPED_TRACE(gbnf.substr(0, 80));
    auto g = Grammar::parse(gbnf);
    for (int walk = 0; walk < 6; ++walk) {
      Matcher m(g);
      std::vector<uint8_t> ok;
      for (int step = 0; step < 40; ++step) {
        m.allowed_tokens(trie, ok);
        ASSERT_EQ(ok.size(), vocab.size());
        std::vector<size_t> allowed;
        for (size_t t = 0; t < vocab.size(); ++t) {
          const bool ref = !vocab[t].empty() && m.accepts_bytes(vocab[t]);
          ASSERT_EQ(ok[t] != 0, ref) << "token " << t << " '" << vocab[t] << "' at step " << step;
          if (ref) allowed.push_back(t);
        }
        if (allowed.empty()) break;
        ASSERT_TRUE(m.advance_bytes(vocab[allowed[rng() % allowed.size()]]));
      }
    }
  }
}

// ---------------------------------------------------------------------------------------------
// The compile budget (issue 31): hostile structure is refused with a LimitError naming the limit,
// never a crash (deep recursion), a runaway expansion or a silently empty language.

namespace {

std::string limit_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const LimitError& e) {
    return e.limit + ": " + e.what();
  } catch (const std::exception& e) {
    return std::string("other: ") + e.what();
  }
  return "(accepted)";
}

}  // namespace

TEST(GrammarBudget, DeepGroupsAndRefChainsAreRefusedNotCrashed) {
  // 40 000 nested groups: the parser recursed once per level (a stack overflow on main)
  const std::string deep = "root ::= " + std::string(40000, '(') + "\"a\"" + std::string(40000, ')');
  const std::string r = limit_of([&] { Grammar::parse(deep); });
  EXPECT_EQ(r.rfind("max_depth: ", 0), 0u) << r;
  EXPECT_NE(r.find(std::to_string(Budget{}.max_depth)), std::string::npos) << r;
  // within the limit it works
  const int ok_depth = Budget{}.max_depth;
  EXPECT_TRUE(full("root ::= " + std::string(ok_depth, '(') + "\"a\"" + std::string(ok_depth, ')'), "a"));
  // a $ref chain 30 000 long: the converter recursed once per link
  ojson defs = ojson::object();
  for (int i = 0; i < 30000; ++i) defs["d" + std::to_string(i)] = {{"$ref", "#/$defs/d" + std::to_string(i + 1)}};
  defs["d30000"] = {{"type", "string"}};
  const ojson schema = {{"$defs", defs}, {"$ref", "#/$defs/d0"}};
  const std::string s = limit_of([&] { schema_to_gbnf(schema); });
  EXPECT_EQ(s.rfind("max_depth: ", 0), 0u) << s;
  // a schema nested past the limit (within the JSON parser's 128 levels)
  ojson nested = {{"type", "string"}};
  for (int i = 0; i < Budget{}.max_depth + 1; ++i) nested = {{"type", "array"}, {"items", nested}};
  EXPECT_EQ(limit_of([&] { schema_to_gbnf(nested); }).rfind("max_depth: ", 0), 0u);
}

TEST(GrammarBudget, LongRuleChainsKeepTheirLanguage) {
  // 300 rules each referring to the next: the matcher dropped paths deeper than 256 rule entries,
  // so "a" was refused (an empty language, answered as an empty "stop" by the server)
  std::string g = "root ::= r0\n";
  for (int i = 0; i < 300; ++i) g += "r" + std::to_string(i) + " ::= r" + std::to_string(i + 1) + "\n";
  g += "r300 ::= \"a\"\n";
  EXPECT_TRUE(full(g, "a"));
  EXPECT_FALSE(full(g, "b"));
  // nullable rules in a row: 300 of them, each entered and left without a character
  std::string n = "root ::= ";
  for (int i = 0; i < 300; ++i) n += "e ";
  n += "\"z\"\ne ::= \"\" | \"y\"\n";
  EXPECT_TRUE(full(n, "z"));
  EXPECT_TRUE(full(n, "yyz"));
}

TEST(GrammarBudget, RepeatsAreCountedBeforeTheyAreExpanded) {
  // a million "a"s after expansion (the server grew past 20 GB on it)
  const std::string r = limit_of([] { Grammar::parse(R"(root ::= (("a"{0,100}){0,100}){0,100})"); });
  EXPECT_EQ(r.rfind("max_size: ", 0), 0u) << r;
  EXPECT_NE(r.find(std::to_string(Budget{}.max_size)), std::string::npos) << r;
  // the same through named rules
  const std::string named = limit_of([] {
    Grammar::parse("root ::= b{0,100}\nb ::= c{0,100}\nc ::= \"a\"{0,100}\n");
  });
  EXPECT_EQ(named.rfind("max_size: ", 0), 0u) << named;
  // a long literal repeated: refused before the copies are made
  const std::string lit = "root ::= \"" + std::string(100000, 'x') + "\"{1000}";
  EXPECT_EQ(limit_of([&] { Grammar::parse(lit); }).rfind("max_size: ", 0), 0u);
  // a smaller budget refuses earlier; ordinary repeats stay fine
  Budget small;
  small.max_size = 500;
  EXPECT_EQ(limit_of([] {
              Budget b;
              b.max_size = 500;
              Grammar::parse(R"(root ::= [0-9]{1,1000})", b);
            }).rfind("max_size: ", 0),
            0u);
  EXPECT_TRUE(full(R"(root ::= ("ab"){1,1000} [0-9]{0,1000})", "ababab123"));
  auto g = Grammar::parse(R"(root ::= ("ab"){1,1000})");
  EXPECT_GE(g->expanded_size(), 2000u);
  EXPECT_LE(g->expanded_size(), Budget{}.max_size);
}

TEST(GrammarBudget, CancelledAndTimedOutCompilesStop) {
  std::string g = "root ::=";
  for (int i = 0; i < 5000; ++i) g += " \"a\"";
  Budget b;
  b.cancelled = [] { return true; };
  EXPECT_EQ(limit_of([&] { Grammar::parse(g, b); }).rfind("cancelled: ", 0), 0u);
  Budget t;
  t.max_seconds = 0;
  EXPECT_EQ(limit_of([&] { Grammar::parse(g, t); }).rfind("max_seconds: ", 0), 0u);
  ojson props = ojson::object();
  for (int i = 0; i < 2000; ++i) props["p" + std::to_string(i)] = {{"type", "string"}};
  EXPECT_EQ(limit_of([&] { schema_to_gbnf(ojson{{"type", "object"}, {"properties", props}}, b); }).rfind("cancelled: ", 0), 0u);
}

TEST(GrammarBudget, EmptyLanguagesAreErrorsAndDeadAlternativesAreDropped) {
  auto msg = [](const std::string& g) {
    try {
      Grammar::parse(g);
    } catch (const GrammarError& e) {
      return std::string(e.what());
    }
    return std::string("(accepted)");
  };
  // no base case: no text completes root
  EXPECT_NE(msg("root ::= \"a\" root").find("empty"), std::string::npos) << msg("root ::= \"a\" root");
  EXPECT_NE(msg("root ::= [^\\x00-\\U0010FFFF]").find("empty"), std::string::npos);
  EXPECT_NE(msg("root ::= x \"b\"\nx ::= \"c\" x").find("empty"), std::string::npos);
  // an alternative that can never finish is dropped: the matcher does not walk into it
  const std::string g = "root ::= \"a\" x | \"b\"\nx ::= \"c\" x\n";
  EXPECT_FALSE(prefix(g, "a"));
  EXPECT_TRUE(full(g, "b"));
  // the shortest sentence in bytes
  EXPECT_EQ(Grammar::parse(R"(root ::= "abcd" | "de" [\u00e9] | "xyz" "!"?)")->min_sentence_bytes(), 3u);
  EXPECT_EQ(Grammar::parse(R"(root ::= [\u00e9] [\u20ac]{2})")->min_sentence_bytes(), 8u);
  EXPECT_EQ(Grammar::parse(R"(root ::= "a"*)")->min_sentence_bytes(), 0u);
}

TEST(GrammarBudget, AmbiguousGrammarsStayBoundedPerCharacter) {
  // within the size budget but ambiguous: nested optional repeats give every character
  // exponentially many ε-paths (main explored each of them: the first state alone never finished);
  // stacks reached twice are expanded once, and each character stays within the matcher's caps (a
  // refusal reported as an overflow, which the server reports as a dead end)
  Matcher m(Grammar::parse("root ::= b{0,60}\nb ::= c{0,60}\nc ::= \"a\"{0,60}\n"));
  int advanced = 0;
  for (int i = 0; i < 400; ++i) {
    if (!m.advance_bytes("a")) break;
    ++advanced;
  }
  EXPECT_GT(advanced, 0);
  if (advanced < 400) {
    EXPECT_TRUE(m.overflowed()) << advanced;
  }
}

TEST(JsonSchema, BigEnumsAndTypeListsStayWithinTheBudget) {
  ojson values = ojson::array();
  for (int i = 0; i < 10000; ++i) values.push_back("value-" + std::to_string(i));
  auto g = Grammar::parse(schema_to_gbnf(ojson{{"enum", values}}));
  EXPECT_TRUE(full(schema_to_gbnf(ojson{{"enum", values}}), "\"value-9999\""));
  // a type list at every level multiplies the work: refused by size or time, not computed for ever
  ojson s = {{"type", "string"}};
  for (int i = 0; i < 12; ++i)  // each type of the list converts its keywords: 3^12 expansions (a repeated type counts once)
    s = {{"type", ojson::array({"object", "array", "object"})}, {"properties", {{"a", s}, {"b", s}}}, {"items", s}};
  const std::string r = limit_of([&] { schema_to_gbnf(s); });
  EXPECT_TRUE(r.rfind("max_size: ", 0) == 0 || r.rfind("max_seconds: ", 0) == 0) << r.substr(0, 200);
}
