// The JSON Schema keywords the converter holds exactly (server/grammar.h schema_to_gbnf): integer
// and number ranges checked against the numbers themselves, `pattern` against std::regex (an
// independent regex engine), JSON-pointer $refs, additionalProperties, type lists; and the tool
// grammar (server/tool_grammar.h) built from such schemas: type lists keep their keywords, nested
// optional objects stay within the budget, counted strings count '<' once. The matcher's cheapest
// completion (what a required tool call is finished with at max_tokens).
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <cstdio>
#include <random>
#include <regex>

#include "server/grammar.h"
#include "server/tool_grammar.h"

using namespace kimi::server;
using namespace kimi::server::grammar;
using ojson = nlohmann::ordered_json;

namespace {

bool full(const std::string& gbnf, const std::string& text) {
  Matcher m(Grammar::parse(gbnf));
  return m.advance_bytes(text) && m.can_end();
}
std::string schema(const char* json) { return schema_to_gbnf(ojson::parse(json)); }
std::string fmt_num(double v, int digits) {
  char b[64];
  std::snprintf(b, sizeof b, "%.*f", digits, v);
  return b;
}

}  // namespace

TEST(SchemaExact, IntegerRangesHoldEveryInteger) {
  std::mt19937 rng(38);
  for (int c = 0; c < 60; ++c) {
    const int a = static_cast<int>(rng() % 4000) - 2000, w = static_cast<int>(rng() % 1500);
    const bool lo_x = rng() % 3 == 0, hi_x = rng() % 3 == 0;
    ojson s = {{"type", "integer"}, {lo_x ? "exclusiveMinimum" : "minimum", a}, {hi_x ? "exclusiveMaximum" : "maximum", a + w}};
    const int lo = lo_x ? a + 1 : a, hi = hi_x ? a + w - 1 : a + w;
    if (lo > hi) {
      EXPECT_THROW(schema_to_gbnf(s), SchemaError) << s.dump();
      continue;
    }
    Matcher start(Grammar::parse(schema_to_gbnf(s)));
    for (int n = a - 40; n <= a + w + 40; ++n) {
      Matcher m = start;
      const bool in = n >= lo && n <= hi;
      EXPECT_EQ(m.advance_bytes(std::to_string(n)) && m.can_end(), in) << s.dump() << " n=" << n;
    }
    Matcher m = start;
    EXPECT_FALSE(m.advance_bytes("-0") && m.can_end());  // no leading zeros, no -0
    m = start;
    EXPECT_FALSE(m.advance_bytes("0" + std::to_string(std::abs(lo) + 1)) && m.can_end());
  }
  // one bound: the other side open up to 16 digits
  const std::string g = schema(R"({"type": "integer", "minimum": 7})");
  EXPECT_TRUE(full(g, "7"));
  EXPECT_TRUE(full(g, "9999999999999999"));
  EXPECT_FALSE(full(g, "6"));
  EXPECT_FALSE(full(g, "-7"));
  const std::string h = schema(R"({"type": "integer", "maximum": -3})");
  EXPECT_TRUE(full(h, "-3"));
  EXPECT_TRUE(full(h, "-1234567"));
  EXPECT_FALSE(full(h, "-2"));
  EXPECT_FALSE(full(h, "0"));
}

TEST(SchemaExact, NumberRangesWriteOnlyNumbersInside) {
  struct Case {
    const char* s;
    double lo, hi;
    bool lo_x, hi_x;
  };
  for (const Case& c : {Case{R"({"type": "number", "minimum": 0, "maximum": 1})", 0, 1, false, false},
                        Case{R"({"type": "number", "minimum": -2.5, "maximum": 3.5})", -2.5, 3.5, false, false},
                        Case{R"({"type": "number", "exclusiveMinimum": -3, "exclusiveMaximum": 2})", -3, 2, true, true},
                        Case{R"({"type": "number", "minimum": 10})", 10, 1e300, false, false},
                        Case{R"({"type": "number", "maximum": -1})", -1e300, -1, false, false}}) {
    Matcher start(Grammar::parse(schema(c.s)));
    int accepted = 0;
    for (int k = -600; k <= 600; ++k) {  // -6.00 .. 6.00 and -60 .. 60 in several spellings
      for (const std::string& t : {fmt_num(k / 100.0, 2), fmt_num(k / 10.0, 1), std::to_string(k / 10), fmt_num(k / 100.0, 3)}) {
        Matcher m = start;
        if (!(m.advance_bytes(t) && m.can_end())) continue;
        ++accepted;
        const double v = std::stod(t);
        EXPECT_TRUE(c.lo_x ? v > c.lo : v >= c.lo) << c.s << " " << t;
        EXPECT_TRUE(c.hi_x ? v < c.hi : v <= c.hi) << c.s << " " << t;
      }
    }
    EXPECT_GT(accepted, 0) << c.s;
  }
  EXPECT_TRUE(full(schema(R"({"type": "number", "minimum": 0, "maximum": 1})"), "0.25"));
  EXPECT_TRUE(full(schema(R"({"type": "number", "minimum": 0, "maximum": 1})"), "1"));
  // a range with no integer inside is refused, naming the keyword
  try {
    schema(R"({"type": "number", "minimum": 0.1, "maximum": 0.9})");
    ADD_FAILURE() << "accepted";
  } catch (const SchemaError& e) {
    EXPECT_EQ(e.feature, "minimum");
  }
}

TEST(SchemaExact, PatternsAgreeWithAnIndependentRegexEngine) {
  const std::vector<std::string> patterns = {
      "^[a-z]+$", "^[A-Z][a-z]{1,3}$", "^\\d{3}-\\d{2}$", "^[a-z0-9_-]{1,6}$", "^(get|set|del)$", "^#[0-9a-fA-F]{2}$",
      "^v\\d+\\.\\d+$", "ab+c", "^\\S+$", "^(yes|no)?$", "x[0-9]?y", "^[^abc]{2}$", "^\\w+@\\w+\\.(com|org)$",
      "^a.c$", "(ab|cd)+", "^(?:x|y){2,3}$", "^[-+]?\\d+$", "^q\\\"t$"};
  const std::string alphabet = "abcdxyzqtAZ09-_#.@+ ";
  std::mt19937 rng(7);
  for (const auto& p : patterns) {
    SCOPED_TRACE(p);
    ojson s = {{"type", "string"}, {"pattern", p}};
    Matcher start(Grammar::parse(schema_to_gbnf(s)));
    const std::regex re(p, std::regex::ECMAScript);
    int matched = 0;
    for (int k = 0; k < 3000; ++k) {
      std::string t;
      const size_t n = rng() % 8;
      for (size_t i = 0; i < n; ++i) t += alphabet[rng() % alphabet.size()];
      if (k < 40) t = std::vector<std::string>{"abc", "abbc", "get", "Abc", "123-45", "v1.2", "a_b", "#0f", "xy", "x5y",
                                               "yes", "", "a@b.com", "axc", "abcd", "xyx", "-12", "q\"t"}[k % 18];
      Matcher m = start;
      const bool g = m.advance_bytes(ojson(t).dump()) && m.can_end();
      const bool r = std::regex_search(t, re);
      matched += r;
      // every string the grammar writes matches; a match is written (the test alphabet avoids what
      // the grammar leaves out: escapes other than \", non-space white space)
      if (t.find('"') == std::string::npos) {
        EXPECT_EQ(g, r) << "'" << t << "'";
      } else if (g) {
        EXPECT_TRUE(r) << "'" << t << "'";  // sets leave the quote out (a subset)
      }
    }
    EXPECT_GT(matched, 0);
  }
  for (const char* bad : {"(?=a)b", "\\bword", "(a)\\1", "(?i)abc", "^a|b", "\\p{L}"}) {
    try {
      schema_to_gbnf(ojson{{"type", "string"}, {"pattern", bad}});
      ADD_FAILURE() << "accepted " << bad;
    } catch (const SchemaError& e) {
      EXPECT_EQ(e.feature, "pattern") << bad;
      EXPECT_NE(std::string(e.what()).find("pattern"), std::string::npos);
    }
  }
}

TEST(SchemaExact, RefsFollowJsonPointers) {
  const std::string g = schema(R"({
    "$defs": {"p": {"type": "object", "properties": {"id": {"type": "integer", "minimum": 1, "maximum": 9}},
                    "required": ["id"], "additionalProperties": false},
              "a/b": {"enum": ["x"]}},
    "type": "object",
    "properties": {"one": {"$ref": "#/$defs/p/properties/id"}, "two": {"$ref": "#/$defs/a~1b"}},
    "required": ["one", "two"], "additionalProperties": false})");
  EXPECT_TRUE(full(g, R"({"one": 5, "two": "x"})"));
  EXPECT_FALSE(full(g, R"({"one": 10, "two": "x"})"));
  EXPECT_FALSE(full(g, R"({"one": {"id": 5}, "two": "x"})"));
  EXPECT_EQ(resolve_ref(ojson::parse(R"({"a": [1, {"b": 2}]})"), "#/a/1/b")->get<int>(), 2);
  EXPECT_EQ(resolve_ref(ojson::parse(R"({"a": 1})"), "#/b"), nullptr);
  EXPECT_EQ(resolve_ref(ojson::parse(R"({"a": 1})"), "other.json#/a"), nullptr);
}

TEST(SchemaExact, AdditionalPropertiesWithAndWithoutProperties) {
  const std::string closed = schema(R"({"type": "object", "additionalProperties": false})");
  EXPECT_TRUE(full(closed, "{}"));
  EXPECT_FALSE(full(closed, R"({"a": 1})"));
  const std::string any = schema(R"({"type": "object"})");
  EXPECT_TRUE(full(any, R"({"a": [1, "x"]})"));
  const std::string ints = schema(R"({"type": "object", "additionalProperties": {"type": "integer", "maximum": 5}})");
  EXPECT_TRUE(full(ints, R"({"a": 1, "b": 5})"));
  EXPECT_FALSE(full(ints, R"({"a": 6})"));
  EXPECT_FALSE(full(ints, R"({"a": "x"})"));
  const std::string mixed = schema(
      R"({"type": "object", "properties": {"id": {"type": "integer"}}, "additionalProperties": {"type": "boolean"}})");
  EXPECT_TRUE(full(mixed, R"({"id": 3, "x": true})"));
  EXPECT_TRUE(full(mixed, R"({"x": true})"));
  EXPECT_FALSE(full(mixed, R"({"id": 3, "x": 1})"));
  EXPECT_FALSE(full(mixed, R"({"ix": true})"));  // never a key that starts like "id" (that property's schema would apply)
}

TEST(SchemaExact, TypeListsAndLongStrings) {
  const std::string g = schema(R"({"type": ["string", "null"], "maxLength": 3})");
  EXPECT_TRUE(full(g, "\"abc\""));
  EXPECT_TRUE(full(g, "null"));
  EXPECT_FALSE(full(g, "\"abcd\""));
  const std::string l = schema(R"({"type": "string", "minLength": 70, "maxLength": 100})");
  EXPECT_TRUE(full(l, "\"" + std::string(100, 'a') + "\""));
  EXPECT_FALSE(full(l, "\"" + std::string(101, 'a') + "\""));
  EXPECT_FALSE(full(l, "\"" + std::string(69, 'a') + "\""));
  for (const auto& [s, kw] : std::vector<std::pair<const char*, const char*>>{
           {R"({"type": "array", "uniqueItems": true})", "uniqueItems"},
           {R"({"type": "string", "format": "uri"})", "format"},
           {R"({"type": "number", "multipleOf": 2})", "multipleOf"},
           {R"({"type": "array", "prefixItems": [{"type": "string"}]})", "prefixItems"}}) {
    try {
      schema(s);
      ADD_FAILURE() << "accepted " << s;
    } catch (const SchemaError& e) {
      EXPECT_EQ(e.feature, kw);
    }
  }
  EXPECT_NO_THROW(schema(R"({"type": "array", "uniqueItems": true, "maxItems": 1})"));
}

namespace {

// The whole forced answer of a tool call with JSON arguments (tool_choice named, thinking off).
std::string call_text(const std::string& json_args) {
  return std::string(kToolClose) + "response" + kToolSep + kToolOpen + "tools" + kToolSep + kToolOpen +
         "call tool=\"t\" index=\"1\"" + kToolSep + kToolOpen + "json type=\"object\"" + kToolSep + json_args + kToolClose +
         "json" + kToolSep + kToolClose + "call" + kToolSep + kToolClose + "tools" + kToolSep;
}
bool call_ok(const ojson& params, const std::string& args) {
  Matcher m(Grammar::parse(tool_gbnf({ToolSpec{"t", params}}, ToolMode::Required, "t", false), tool_budget()));
  return m.advance_bytes(call_text(args)) && m.can_end();
}

}  // namespace

TEST(ToolSchema, TypeListsKeepTheirKeywords) {
  const ojson p = ojson::parse(R"({"type": "object", "properties": {
      "o": {"type": ["object"], "properties": {"id": {"type": "string", "maxLength": 3}}, "required": ["id"],
            "additionalProperties": false},
      "a": {"type": ["array"], "items": {"type": "integer"}, "maxItems": 2},
      "s": {"type": ["string"], "maxLength": 2}}, "required": ["o", "a", "s"], "additionalProperties": false})");
  EXPECT_TRUE(call_ok(p, R"({"o": {"id": "abc"}, "a": [1, 2], "s": "xy"})"));
  EXPECT_FALSE(call_ok(p, R"({"o": {}, "a": [1, 2], "s": "xy"})"));
  EXPECT_FALSE(call_ok(p, R"({"o": {"id": "abcd"}, "a": [1], "s": "xy"})"));
  EXPECT_FALSE(call_ok(p, R"({"o": {"id": "a"}, "a": [1, 2, 3], "s": "xy"})"));
  EXPECT_FALSE(call_ok(p, R"({"o": {"id": "a"}, "a": ["x"], "s": "xy"})"));
  EXPECT_FALSE(call_ok(p, R"({"o": {"id": "a"}, "a": [], "s": "xyz"})"));
  const ojson r = relax_schema(p);
  EXPECT_TRUE(r["properties"]["o"].contains("properties")) << r.dump();
  EXPECT_TRUE(r["properties"]["a"].contains("items")) << r.dump();
  EXPECT_TRUE(r["properties"]["s"].contains("maxLength")) << r.dump();
}

TEST(ToolSchema, NestedOptionalObjectsStayExact) {
  // 6 optional objects of 6 optional strings: a 400 "more than 1048576 symbols" before
  ojson inner = {{"type", "object"}, {"properties", ojson::object()}};
  for (int i = 0; i < 6; ++i) inner["properties"]["f" + std::to_string(i)] = {{"type", "string"}, {"maxLength", 12}};
  ojson p = {{"type", "object"}, {"properties", ojson::object()}};
  for (int i = 0; i < 6; ++i) p["properties"]["o" + std::to_string(i)] = inner;
  EXPECT_TRUE(call_ok(p, R"({"o1": {"f2": "abc"}, "o5": {}})"));
  EXPECT_FALSE(call_ok(p, R"({"o1": {"f2": "abcdefghijklm"}})"));  // 13 characters: the schema, not any object
  EXPECT_FALSE(call_ok(p, R"({"o1": {"g": "a"}})"));  // ... and not any object either
}

TEST(ToolSchema, CountedStringsCountALessThanOnce) {
  const ojson p = ojson::parse(R"({"type": "object", "properties": {"s": {"type": "string", "maxLength": 3}},
                                  "required": ["s"], "additionalProperties": false})");
  EXPECT_TRUE(call_ok(p, R"({"s": "a\u003cb"})"));
  EXPECT_FALSE(call_ok(p, R"({"s": "ab\u003cc"})"));
  EXPECT_FALSE(call_ok(p, R"({"s": "a<b"})"));  // a raw '<' could start a tag: written as \u003c
  EXPECT_FALSE(call_ok(p, R"({"s": "<<<"})"));
}

TEST(ToolSchema, UnsupportedPatternsAreRefusedByName) {
  const ojson p = ojson::parse(R"({"type": "object", "properties": {"s": {"type": "string", "pattern": "(?=x)y"}}})");
  try {
    tool_gbnf({ToolSpec{"t", p}}, ToolMode::Required, "t", false);
    ADD_FAILURE() << "accepted";
  } catch (const SchemaError& e) {
    EXPECT_EQ(e.feature, "pattern");
  }
}

TEST(MatcherCost, CheapestCompletionFinishesTheSentence) {
  auto g = Grammar::parse("root ::= \"ab\" [0-9]+ ( \"xy\" | \"\\uE001\" ) tail\ntail ::= \"\" | \"zz\"");
  Matcher m(g);
  EXPECT_EQ(m.min_cost(), 4u);  // "ab", a digit, U+E001 (a structural code point: one token)
  EXPECT_EQ(m.cheapest_completion(), "ab0\xEE\x80\x81");
  ASSERT_TRUE(m.advance_bytes("ab12"));
  EXPECT_EQ(m.min_cost(), 1u);
  const std::string rest = m.cheapest_completion();
  ASSERT_TRUE(m.advance_bytes(rest));
  EXPECT_TRUE(m.can_end());
  EXPECT_EQ(m.min_cost(), 0u);
  EXPECT_EQ(m.cheapest_completion(), "");
  // a JSON schema's cheapest valid document
  Matcher j(Grammar::parse(schema(R"({"type": "object", "properties": {"a": {"type": "integer", "minimum": 10}},
                                      "required": ["a"]})")));
  const std::string doc = j.cheapest_completion();
  ASSERT_TRUE(j.advance_bytes(doc));
  EXPECT_TRUE(j.can_end());
  EXPECT_EQ(ojson::parse(doc)["a"].get<int>(), 10) << doc;
}
