// `kimi serve` with output constraints: a GBNF `grammar`, response_format json_object /
// json_schema and llama.cpp's `json_schema` hold the sampled answer of the (random-weight) tiny
// model to the grammar: every finished answer is checked with nlohmann's parser against the
// schema's shape, over several seeds, non-streaming and streaming; bad constraints are 400s.
#include <gtest/gtest.h>

#include "server_fixture.h"

using namespace kimi;
using namespace kimi::test;

namespace {

const ojson kMsgs = ojson::array({{{"role", "user"}, {"content", "Give me a record as JSON."}}});

// {"name": string of at most 8 characters, "count": integer, "ok": boolean (optional)}: every
// sentence is short, so an answer always finishes within the token budget.
const ojson kSchema = ojson::parse(R"({
  "type": "object",
  "properties": {"name": {"type": "string", "maxLength": 8}, "count": {"type": "integer"},
                 "ok": {"type": "boolean"}},
  "required": ["name", "count"],
  "additionalProperties": false
})");

void expect_record(const std::string& text) {
  const ojson j = ojson::parse(text, nullptr, false);
  ASSERT_FALSE(j.is_discarded()) << "not JSON: " << text;
  ASSERT_TRUE(j.is_object()) << text;
  ASSERT_TRUE(j.contains("name") && j["name"].is_string()) << text;
  ASSERT_TRUE(j.contains("count") && j["count"].is_number_integer()) << text;
  for (auto it = j.begin(); it != j.end(); ++it)
    EXPECT_TRUE(it.key() == "name" || it.key() == "count" || it.key() == "ok") << text;
  if (j.contains("ok")) {
    EXPECT_TRUE(j["ok"].is_boolean()) << text;
  }
}

}  // namespace

TEST(ServerGrammar, GbnfGrammarOnCompletions) {
  RunningServer r(server_opts());
  for (int seed = 1; seed <= 6; ++seed) {
    const ojson req = {{"prompt", "Answer:"}, {"max_tokens", 20}, {"seed", seed},
                       {"grammar", "root ::= (\"yes\" | \"no\") (\", \" [a-z]{1,3})?"}};
    int st = 0;
    const ojson j = r.post("/v1/completions", req, &st);
    ASSERT_EQ(st, 200) << j.dump();
    const std::string t = j["choices"][0]["text"].get<std::string>();
    EXPECT_EQ(j["choices"][0]["finish_reason"], "stop") << t;
    const bool ok = t == "yes" || t == "no" ||
                    ((t.rfind("yes, ", 0) == 0 || t.rfind("no, ", 0) == 0) && t.size() - t.find(' ') - 1 <= 3);
    EXPECT_TRUE(ok) << "'" << t << "'";
  }
}

TEST(ServerGrammar, ChatJsonSchemaIsHeldToTheSchema) {
  RunningServer r(server_opts());
  for (int seed = 1; seed <= 6; ++seed) {
    SCOPED_TRACE(seed);
    const ojson req = {{"messages", kMsgs}, {"max_tokens", 200}, {"seed", seed}, {"thinking", false},
                       {"response_format", {{"type", "json_schema"},
                                            {"json_schema", {{"name", "record"}, {"schema", kSchema}, {"strict", true}}}}}};
    int st = 0;
    const ojson j = r.post("/v1/chat/completions", req, &st);
    ASSERT_EQ(st, 200) << j.dump();
    EXPECT_EQ(j["choices"][0]["finish_reason"], "stop");
    expect_record(j["choices"][0]["message"]["content"].get<std::string>());
  }
  // streamed: the deltas join to a valid record as well
  const ojson sreq = {{"messages", kMsgs}, {"max_tokens", 200}, {"seed", 11}, {"thinking", false}, {"stream", true},
                      {"json_schema", kSchema}};
  bool done = false;
  std::string content;
  for (const ojson& e : sse_events(r.post_stream("/v1/chat/completions", sreq), &done)) {
    const ojson& d = e["choices"][0]["delta"];
    if (d.contains("content")) content += d["content"].get<std::string>();
  }
  EXPECT_TRUE(done);
  expect_record(content);
}

TEST(ServerGrammar, JsonObjectAndLlamaCppJsonSchema) {
  RunningServer r(server_opts());
  for (int seed = 1; seed <= 4; ++seed) {
    const ojson req = {{"messages", kMsgs}, {"max_tokens", 300}, {"seed", seed}, {"thinking", false},
                       {"temperature", 0.7}, {"response_format", {{"type", "json_object"}}}};
    const ojson j = r.post("/v1/chat/completions", req);
    const std::string c = j["choices"][0]["message"]["content"].get<std::string>();
    ASSERT_FALSE(c.empty());
    EXPECT_EQ(c[0], '{') << c;
    if (j["choices"][0]["finish_reason"] == "stop") {
      const ojson v = ojson::parse(c, nullptr, false);
      EXPECT_TRUE(!v.is_discarded() && v.is_object()) << c;
    }
  }
  // llama.cpp's top-level json_schema on /v1/completions
  const ojson enum_schema = {{"enum", {"red", "green", "blue"}}};
  for (int seed = 1; seed <= 4; ++seed) {
    const ojson j = r.post("/v1/completions", ojson{{"prompt", "Colour:"}, {"max_tokens", 10}, {"seed", seed},
                                                    {"json_schema", enum_schema}});
    const std::string t = j["choices"][0]["text"].get<std::string>();
    EXPECT_TRUE(t == "\"red\"" || t == "\"green\"" || t == "\"blue\"") << t;
  }
}

// Thinking on: the reasoning is not constrained (it is free text), the answer is.
TEST(ServerGrammar, ReasoningIsFreeAnswerIsConstrained) {
  RunningServer r(server_opts());
  const ojson req = {{"messages", kMsgs}, {"max_tokens", 40}, {"seed", 5}, {"thinking", true}, {"temperature", 1.0},
                     {"json_schema", kSchema}};
  int st = 0;
  const ojson j = r.post("/v1/chat/completions", req, &st);
  ASSERT_EQ(st, 200) << j.dump();
  const ojson& m = j["choices"][0]["message"];
  ASSERT_TRUE(m.contains("reasoning_content")) << j.dump();
  EXPECT_FALSE(m["reasoning_content"].get<std::string>().empty());
  // the random model rarely opens the response channel in 40 tokens; if it did, it is a record
  if (!m["content"].get<std::string>().empty() && j["choices"][0]["finish_reason"] == "stop")
    expect_record(m["content"].get<std::string>());
}

// The token trie (Matcher::allowed_tokens) only finds the allowed set faster: a server that checks
// every token one by one (KIMI_GRAMMAR_FULL_SCAN=1, the way it was done before the trie) produces
// the same answers for the same requests and seeds: greedy, temperature with top-k / top-p / min-p,
// repetition penalty, streaming, schema / json_object / GBNF with multi-byte characters. The random
// model's first sampled token is refused by every one of these (an answer must start with '{',
// '"', a Greek letter...), so the masked path is taken.
TEST(ServerGrammar, TrieWalkSamplesWhatTheFullScanSamples) {
  const ojson schema_rf = {{"type", "json_schema"}, {"json_schema", {{"name", "record"}, {"schema", kSchema}}}};
  std::vector<std::pair<std::string, ojson>> reqs;
  for (int seed = 1; seed <= 3; ++seed) {
    reqs.push_back({"/v1/chat/completions", {{"messages", kMsgs}, {"max_tokens", 60}, {"seed", seed}, {"thinking", false},
                                             {"temperature", 1.0}, {"response_format", schema_rf}}});
    reqs.push_back({"/v1/chat/completions", {{"messages", kMsgs}, {"max_tokens", 60}, {"seed", seed}, {"thinking", false},
                                             {"temperature", 0.8}, {"top_k", 40}, {"top_p", 0.9}, {"min_p", 0.02},
                                             {"repeat_penalty", 1.2}, {"response_format", {{"type", "json_object"}}}}});
    reqs.push_back({"/v1/completions", {{"prompt", "Words:"}, {"max_tokens", 24}, {"seed", seed}, {"temperature", 1.2},
                                        {"grammar", "root ::= [\u03b1-\u03c9 ]+ (\"!\" | \"\u20ac\")"}}});
  }
  reqs.push_back({"/v1/chat/completions", {{"messages", kMsgs}, {"max_tokens", 60}, {"temperature", 0}, {"thinking", false},
                                           {"json_schema", kSchema}}});
  auto answers = [&](bool full_scan) {
    if (full_scan) ::setenv("KIMI_GRAMMAR_FULL_SCAN", "1", 1);
    else ::unsetenv("KIMI_GRAMMAR_FULL_SCAN");
    RunningServer r(server_opts());
    ::unsetenv("KIMI_GRAMMAR_FULL_SCAN");
    std::vector<std::string> out;
    for (const auto& [path, body] : reqs) {
      int st = 0;
      const ojson j = r.post(path, body, &st);
      EXPECT_EQ(st, 200) << j.dump();
      const ojson& c = j["choices"][0];
      out.push_back((c.contains("text") ? c["text"] : c["message"]["content"]).get<std::string>() + " | " +
                    c["finish_reason"].get<std::string>());
    }
    // streamed too (one request)
    ojson sreq = reqs[0].second;
    sreq["stream"] = true;
    std::string content;
    bool done = false;
    for (const ojson& e : sse_events(r.post_stream("/v1/chat/completions", sreq), &done)) {
      const ojson& d = e["choices"][0]["delta"];
      if (d.contains("content")) content += d["content"].get<std::string>();
    }
    out.push_back(content);
    return out;
  };
  const std::vector<std::string> trie = answers(false), full = answers(true);
  ASSERT_EQ(trie.size(), full.size());
  for (size_t i = 0; i < trie.size(); ++i) {
    EXPECT_EQ(trie[i], full[i]) << "request " << i << ": " << (i < reqs.size() ? reqs[i].second.dump() : "streamed");
    EXPECT_GT(trie[i].size(), 3u) << i;  // something was generated
  }
}

TEST(ServerGrammar, BadConstraintsAre400NamingTheProblem) {
  RunningServer r(server_opts());
  struct Case { ojson extra; std::string param, in_message; };
  const std::vector<Case> cases = {
      {{{"json_schema", {{"type", "string"}, {"pattern", "(?=a)a+"}}}}, "json_schema", "'pattern'"},  // lookaround
      {{{"response_format", {{"type", "json_schema"},
                             {"json_schema", {{"name", "x"}, {"schema", {{"type", "number"}, {"minimum", 0.2}, {"maximum", 0.8}}}}}}}},
       "response_format.json_schema.schema", "'minimum'"},  // no integer inside the range
      {{{"response_format", {{"type", "json_schema"}, {"json_schema", {{"name", "x"}, {"schema", {{"type", "number"}, {"multipleOf", 2}}}}}}}},
       "response_format.json_schema.schema", "'multipleOf'"},
      {{{"response_format", {{"type", "json_schema"}, {"json_schema", {{"name", "x"}}}}}},
       "response_format.json_schema.schema", "required"},
      {{{"grammar", "root ::= undefined-rule"}}, "grammar", "'undefined-rule' is used but not defined"},
      {{{"grammar", "root ::= \"a"}}, "grammar", "unterminated string"},
      {{{"grammar", "root ::= \"a\""}, {"json_schema", {{"type", "string"}}}}, "grammar", "only one of"},
  };
  for (const Case& c : cases) {
    ojson req = {{"messages", kMsgs}, {"max_tokens", 4}};
    for (auto it = c.extra.begin(); it != c.extra.end(); ++it) req[it.key()] = it.value();
    int st = 0;
    const ojson j = r.post("/v1/chat/completions", req, &st);
    SCOPED_TRACE(req.dump());
    EXPECT_EQ(st, 400) << j.dump();
    EXPECT_EQ(j["error"]["param"], c.param) << j.dump();
    EXPECT_NE(j["error"]["message"].get<std::string>().find(c.in_message), std::string::npos) << j.dump();
  }
}

// ------------------------------------------------------------------------------------------------
// Issue 38: schemas the enforced tool grammar got wrong (each valid; each call checked here by hand
// against the schema, the schema suite tests/schema checks hundreds with python3-jsonschema).

namespace {

size_t code_points(const std::string& s) {
  size_t n = 0;
  for (unsigned char c : s) n += (c & 0xC0) != 0x80;
  return n;
}

RunningServer& tool_srv() {
  static RunningServer s([] {
    server::ServerOptions o = server_opts();
    o.ctx = 4096;  // the nested schema's declaration alone is ~1 500 tokens
    return o;
  }());
  return s;
}

// The arguments of forced calls of tool "t" with these parameters (seeds 1..n), whole answers.
std::vector<ojson> forced_args(const ojson& params, int n, int* status = nullptr, ojson* error = nullptr) {
  std::vector<ojson> out;
  for (int seed = 1; seed <= n; ++seed) {
    const ojson body = {{"messages", kMsgs}, {"thinking", false}, {"max_tokens", 150}, {"seed", seed},
                        {"tools", ojson::array({{{"type", "function"}, {"function", {{"name", "t"}, {"parameters", params}}}}})},
                        {"tool_choice", {{"type", "function"}, {"function", {{"name", "t"}}}}}};
    int st = 0;
    const ojson r = tool_srv().post("/v1/chat/completions", body, &st);
    if (status) *status = st;
    if (st != 200) {
      if (error) *error = r;
      return out;
    }
    const ojson& c = r["choices"][0];
    EXPECT_EQ(c["finish_reason"], "tool_calls") << r.dump();
    if (!c["message"].contains("tool_calls")) continue;
    out.push_back(ojson::parse(c["message"]["tool_calls"][0]["function"]["arguments"].get<std::string>()));
  }
  return out;
}

}  // namespace

TEST(ServerGrammar, ToolTypeListsKeepTheirKeywords) {
  // "type": ["object"] / ["array"] / ["string"] made the grammar ignore properties, items, maxLength
  const ojson p = ojson::parse(R"({"type": "object", "properties": {"value": {"type": ["object"],
      "properties": {"id": {"type": "string", "maxLength": 4}}, "required": ["id"], "additionalProperties": false},
      "list": {"type": ["array"], "items": {"type": "boolean"}, "maxItems": 2},
      "s": {"type": ["string"], "maxLength": 3}}, "required": ["value", "list", "s"], "additionalProperties": false})");
  const auto all = forced_args(p, 6);
  EXPECT_EQ(all.size(), 6u);
  for (const ojson& a : all) {
    SCOPED_TRACE(a.dump());
    ASSERT_TRUE(a["value"].is_object());
    ASSERT_EQ(a["value"].size(), 1u);
    ASSERT_TRUE(a["value"]["id"].is_string());
    EXPECT_LE(code_points(a["value"]["id"].get<std::string>()), 4u);
    ASSERT_TRUE(a["list"].is_array());
    EXPECT_LE(a["list"].size(), 2u);
    for (const auto& b : a["list"]) EXPECT_TRUE(b.is_boolean());
    ASSERT_TRUE(a["s"].is_string());
    EXPECT_LE(code_points(a["s"].get<std::string>()), 3u);
  }
}

TEST(ServerGrammar, ToolRefsNestedOptionalsAndAdditionalProperties) {
  // a $ref into a $defs entry by JSON pointer was a 400
  const ojson ref = ojson::parse(R"({"type": "object", "$defs": {"p": {"type": "object", "properties":
      {"id": {"type": "integer", "minimum": 3, "maximum": 7}}}}, "properties": {"id": {"$ref": "#/$defs/p/properties/id"}},
      "required": ["id"], "additionalProperties": false})");
  for (const ojson& a : forced_args(ref, 4)) {
    ASSERT_TRUE(a["id"].is_number_integer()) << a.dump();
    EXPECT_GE(a["id"].get<int>(), 3);
    EXPECT_LE(a["id"].get<int>(), 7);
  }
  // 6 optional objects of 6 optional strings: a 400 "more than 1048576 symbols"
  ojson inner = {{"type", "object"}, {"properties", ojson::object()}, {"additionalProperties", false}};
  for (int i = 0; i < 6; ++i) inner["properties"]["f" + std::to_string(i)] = {{"type", "string"}, {"maxLength", 5}};
  ojson nested = {{"type", "object"}, {"properties", ojson::object()}, {"additionalProperties", false}};
  for (int i = 0; i < 6; ++i) nested["properties"]["o" + std::to_string(i)] = inner;
  int st = 0;
  ojson err;
  const auto all = forced_args(nested, 4, &st, &err);
  ASSERT_EQ(st, 200) << err.dump();
  for (const ojson& a : all) {
    for (auto it = a.begin(); it != a.end(); ++it) {
      ASSERT_EQ(it.key().size(), 2u) << a.dump();
      ASSERT_TRUE(it.value().is_object()) << a.dump();
      for (auto f = it.value().begin(); f != it.value().end(); ++f) EXPECT_TRUE(f.value().is_string()) << a.dump();
    }
  }
  // an object without properties honours additionalProperties (false: {}; a schema: its values)
  const ojson closed = ojson::parse(R"({"type": "object", "properties": {"m": {"type": "object", "additionalProperties": false}},
      "required": ["m"], "additionalProperties": false})");
  for (const ojson& a : forced_args(closed, 4)) EXPECT_EQ(a, ojson::parse(R"({"m": {}})"));
  const ojson ints = ojson::parse(R"({"type": "object", "properties": {"m": {"type": "object",
      "additionalProperties": {"type": "integer", "minimum": 0, "maximum": 9}}}, "required": ["m"], "additionalProperties": false})");
  for (const ojson& a : forced_args(ints, 4))
    for (auto it = a["m"].begin(); it != a["m"].end(); ++it) {
      ASSERT_TRUE(it.value().is_number_integer()) << a.dump();
      EXPECT_TRUE(it.value().get<int>() >= 0 && it.value().get<int>() <= 9) << a.dump();
    }
  // a pattern outside the regex subset: a 400 naming the keyword
  const ojson bad = ojson::parse(R"({"type": "object", "properties": {"s": {"type": "string", "pattern": "(?<=a)b"}}})");
  forced_args(bad, 1, &st, &err);
  EXPECT_EQ(st, 400);
  EXPECT_NE(err["error"]["message"].get<std::string>().find("pattern"), std::string::npos) << err.dump();
}

// maxLength in enforced arguments: a string holding '<' got one character too many (21 code points
// for maxLength 20): now a '<' is written as \u003c and counts once.
TEST(ServerGrammar, ToolMaxLengthCountsEveryCharacter) {
  const ojson p = ojson::parse(R"({"type": "object", "properties": {"s": {"type": "string", "maxLength": 4}},
      "required": ["s"], "additionalProperties": false})");
  const auto all = forced_args(p, 10);
  EXPECT_EQ(all.size(), 10u);
  for (const ojson& a : all) {
    EXPECT_LE(code_points(a["s"].get<std::string>()), 4u) << a.dump();
  }
}
