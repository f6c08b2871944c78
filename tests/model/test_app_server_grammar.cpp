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
      {{{"json_schema", {{"type", "string"}, {"pattern", "^a+$"}}}}, "json_schema", "'pattern'"},
      {{{"response_format", {{"type", "json_schema"}, {"json_schema", {{"schema", {{"type", "integer"}, {"minimum", 1}}}}}}}},
       "response_format.json_schema.schema", "'minimum'"},
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
