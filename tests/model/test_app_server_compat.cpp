// `kimi serve` as llama.cpp / OpenAI users call it: the README's curl example as written, bodies
// without a JSON content type, and the llama-server style endpoints.
#include <gtest/gtest.h>

#include <fstream>
#include <sstream>

#include "server_fixture.h"

using namespace kimi;
using namespace kimi::test;

namespace {

// The JSON body of the README's `curl ... /v1/chat/completions -d '...'` line.
std::string readme_curl_body() {
  std::ifstream f(std::string(KIMI_SOURCE_DIR) + "/README.md");
  std::string line;
  while (std::getline(f, line)) {
    if (line.rfind("curl -s localhost:8080/v1/chat/completions -d '", 0) != 0) continue;
    const size_t a = line.find('\''), b = line.rfind('\'');
    if (a != std::string::npos && b > a) return line.substr(a + 1, b - a - 1);
  }
  return {};
}

}  // namespace

// The README's example, sent the way curl -d sends it (application/x-www-form-urlencoded), shows an
// answer in `content` (not only reasoning).
TEST(ServerCompat, ReadmeCurlExampleShowsAnAnswer) {
  const std::string body = readme_curl_body();
  ASSERT_FALSE(body.empty()) << "no curl example in README.md";
  auto o = server_opts();
  o.fixed_seed = true;  // the example has no seed; a fixed server seed makes the output reproducible
  o.sampling.seed = 7;
  RunningServer r(o);
  int st = 0;
  const ojson j = r.post("/v1/chat/completions", body, &st, "application/x-www-form-urlencoded");
  ASSERT_EQ(st, 200) << j.dump();
  const ojson& m = j["choices"][0]["message"];
  EXPECT_FALSE(m.contains("reasoning_content")) << m.dump();
  ASSERT_TRUE(m["content"].is_string());
  EXPECT_FALSE(m["content"].get<std::string>().empty()) << j.dump();
  EXPECT_GT(j["usage"]["completion_tokens"].get<int>(), 0);
}

// curl -d / --data-binary send `application/x-www-form-urlencoded` (or nothing); a JSON body over
// 8 KiB is read as JSON all the same.
TEST(ServerCompat, LargeJsonBodyWithoutJsonContentType) {
  auto o = server_opts();
  o.ctx = 4096;
  RunningServer r(o);
  ojson prompt = ojson::array();
  for (int i = 0; i < 2500; ++i) prompt.push_back(100 + i % 500);
  const std::string body = ojson{{"prompt", prompt}, {"max_tokens", 2}, {"temperature", 0}}.dump();
  ASSERT_GT(body.size(), 8192u);
  for (const char* ct : {"application/x-www-form-urlencoded", "text/plain", ""}) {
    int st = 0;
    const ojson j = r.post("/v1/completions", body, &st, ct);
    EXPECT_EQ(st, 200) << ct << ": " << j.dump().substr(0, 300);
    EXPECT_EQ(j["usage"]["prompt_tokens"], 2500) << ct;
  }
}

// thinking_effort follows the K3 template: what it refuses is a 400 with the template's message.
TEST(ServerCompat, ThinkingEffortAsTheTemplateSays) {
  RunningServer r(server_opts());
  const ojson msgs = ojson::array({{{"role", "user"}, {"content", "hi"}}});
  int st = 0;
  for (const char* k : {"thinking_effort", "reasoning_effort"}) {
    const ojson j = r.post("/v1/chat/completions", ojson{{"messages", msgs}, {k, "extreme"}, {"max_tokens", 2}}, &st);
    EXPECT_EQ(st, 400) << j.dump();
    EXPECT_EQ(j["error"]["param"], k);
    // thinking_effort: the template's own message; reasoning_effort: OpenAI's values (mapped onto K3's)
    EXPECT_NE(j["error"]["message"].get<std::string>().find(
                  std::string(k) == "thinking_effort"
                      ? "Unsupported thinking_effort=extreme; supported values are low, medium, high, and max."
                      : "expected one of none, minimal, low, medium, high, xhigh"),
              std::string::npos)
        << j.dump();
  }
  r.post("/v1/chat/completions", ojson{{"messages", msgs}, {"thinking_effort", "low"}, {"max_tokens", 2}}, &st);
  EXPECT_EQ(st, 200);
  // thinking off: the template does not look at the effort
  r.post("/v1/chat/completions",
         ojson{{"messages", msgs}, {"thinking", false}, {"thinking_effort", "extreme"}, {"max_tokens", 2}}, &st);
  EXPECT_EQ(st, 200);
}

// ------------------------------------------------------------------------------------------------
// Kimi's own API contract (issue 38): what Moonshot's API and vLLM / SGLang take for K3.

namespace {

RunningServer& kimi_srv() {
  static RunningServer s(server_opts());
  return s;
}
const ojson kHi = ojson::array({{{"role", "user"}, {"content", "hi"}}});
int prompt_tokens(const ojson& extra) {
  ojson body = {{"messages", kHi}, {"max_tokens", 1}, {"temperature", 0}};
  for (auto it = extra.begin(); it != extra.end(); ++it) body[it.key()] = it.value();
  int st = 0;
  const ojson r = kimi_srv().post("/v1/chat/completions", body, &st);
  EXPECT_EQ(st, 200) << body.dump() << " -> " << r.dump();
  return r["usage"].value("prompt_tokens", -1);
}
void expect_400(const ojson& body, const std::string& param, const std::string& says = "") {
  int st = 0;
  const ojson r = kimi_srv().post("/v1/chat/completions", body, &st);
  EXPECT_EQ(st, 400) << body.dump() << " -> " << r.dump();
  EXPECT_EQ(r["error"]["param"], param) << r.dump();
  if (!says.empty()) {
    EXPECT_NE(r["error"]["message"].get<std::string>().find(says), std::string::npos) << r.dump();
  }
}

}  // namespace

TEST(ServerCompat, KimiThinkingObjectAndTemplateKwargs) {
  const int on = prompt_tokens({{"thinking", true}}), off = prompt_tokens({{"thinking", false}});
  ASSERT_NE(on, off);
  // thinking: {"type": "disabled"} turned thinking on (any non-empty object counted as true)
  EXPECT_EQ(prompt_tokens({{"thinking", {{"type", "disabled"}}}}), off);
  EXPECT_EQ(prompt_tokens({{"thinking", {{"type", "enabled"}}}}), on);
  // thinking.effort is read: the effort instruction of the template
  const int low = prompt_tokens({{"thinking_effort", "low"}});
  EXPECT_EQ(prompt_tokens({{"thinking", {{"type", "enabled"}, {"effort", "low"}}}}), low);
  // chat_template_kwargs (vLLM / SGLang): thinking, thinking_effort, preserve_thinking
  EXPECT_EQ(prompt_tokens({{"chat_template_kwargs", {{"thinking", false}}}}), off);
  EXPECT_EQ(prompt_tokens({{"chat_template_kwargs", {{"thinking_effort", "low"}}}}), low);
  expect_400({{"messages", kHi}, {"chat_template_kwargs", {{"thinking_effort", "medium"}}}}, "chat_template_kwargs.thinking_effort",
             "Unsupported thinking_effort=medium; supported values are low, medium, high, and max.");
  const ojson history = ojson::array({{{"role", "user"}, {"content", "hi"}},
                                      {{"role", "assistant"}, {"content", "Hello."}, {"reasoning_content", "A long thought about it."}},
                                      {{"role", "user"}, {"content", "again"}}});
  const int kept = prompt_tokens({{"messages", history}});
  EXPECT_EQ(prompt_tokens({{"messages", history}, {"chat_template_kwargs", {{"preserve_thinking", true}}}}), kept);
  EXPECT_LT(prompt_tokens({{"messages", history}, {"chat_template_kwargs", {{"preserve_thinking", false}}}}), kept);
  // shapes
  expect_400({{"messages", kHi}, {"thinking", {{"type", "sometimes"}}}}, "thinking.type");
  expect_400({{"messages", kHi}, {"thinking", "yes"}}, "thinking");
  expect_400({{"messages", kHi}, {"chat_template_kwargs", "x"}}, "chat_template_kwargs");
  expect_400({{"messages", kHi}, {"chat_template_kwargs", {{"thinking", "no"}}}}, "chat_template_kwargs.thinking");
}

TEST(ServerCompat, UncheckedFieldsAre400sNamingThem) {
  const ojson schema = {{"type", "object"}};
  expect_400({{"messages", kHi}, {"response_format", {{"type", "json_schema"}, {"json_schema", {{"schema", schema}}}}}},
             "response_format.json_schema.name");
  expect_400({{"messages", kHi},
              {"response_format", {{"type", "json_schema"}, {"json_schema", {{"name", "x"}, {"schema", schema}, {"strict", "yes"}}}}}},
             "response_format.json_schema.strict");
  expect_400({{"messages", kHi}, {"presence_penalty", "abc"}}, "presence_penalty");
  expect_400({{"messages", kHi}, {"frequency_penalty", {{"a", 1}}}}, "frequency_penalty");
  expect_400({{"messages", kHi}, {"frequency_penalty", 3}}, "frequency_penalty");
  EXPECT_GT(prompt_tokens({{"presence_penalty", 0.5}, {"frequency_penalty", -0.5}}), 0);
}

// Dynamic tools: a system message may declare tools (K3). They are callable (the tool grammar holds
// them), tool_choice "required" works with them alone, and they are checked as request tools.
TEST(ServerCompat, DynamicToolsAreCallableAndChecked) {
  const ojson dyn = ojson::array({{{"type", "function"},
                                   {"function", {{"name", "lookup"},
                                                 {"parameters", {{"type", "object"},
                                                                 {"properties", {{"key", {{"enum", {"a", "b"}}}}}},
                                                                 {"required", {"key"}}, {"additionalProperties", false}}}}}}});
  const ojson glob = ojson::array({{{"type", "function"}, {"function", {{"name", "other"}, {"parameters", {{"type", "object"}}}}}}});
  for (bool with_global : {false, true}) {
    for (uint64_t seed : {1, 2, 3, 4}) {
      ojson msgs = ojson::array({{{"role", "system"}, {"tools", dyn}}, {{"role", "user"}, {"content", "look it up"}}});
      ojson body = {{"messages", msgs}, {"tool_choice", with_global ? ojson{{"type", "function"}, {"function", {{"name", "lookup"}}}}
                                                                     : ojson("required")},
                    {"thinking", false}, {"max_tokens", 100}, {"seed", seed}};
      if (with_global) body["tools"] = glob;
      int st = 0;
      const ojson r = kimi_srv().post("/v1/chat/completions", body, &st);
      ASSERT_EQ(st, 200) << r.dump();
      const ojson& c = r["choices"][0];
      ASSERT_EQ(c["finish_reason"], "tool_calls") << r.dump();
      for (const auto& call : c["message"]["tool_calls"]) {
        EXPECT_EQ(call["function"]["name"], "lookup") << r.dump();
        const ojson a = ojson::parse(call["function"]["arguments"].get<std::string>());
        EXPECT_TRUE(a == (ojson{{"key", "a"}}) || a == (ojson{{"key", "b"}})) << a.dump();
      }
    }
  }
  auto with = [&](const ojson& tools, const char* role = "system") {
    return ojson{{"messages", ojson::array({{{"role", role}, {"content", "s"}, {"tools", tools}}, {{"role", "user"}, {"content", "x"}}})},
                 {"max_tokens", 1}};
  };
  expect_400(with(ojson::array({{{"type", "function"}, {"function", {{"name", "bad name"}}}}})), "messages[0].tools[0].function.name");
  expect_400(with(ojson::array({{{"type", "bogus"}, {"function", {{"name", "f"}}}}})), "messages[0].tools[0].type");
  expect_400(with(ojson::array({{{"type", "function"}, {"function", {{"name", "f"}}}}, {{"type", "function"}, {"function", {{"name", "f"}}}}})),
             "messages[0].tools[1].function.name");
  expect_400(with(dyn, "user"), "messages[0].tools");
  ojson both = with(dyn);
  both["tools"] = dyn;  // the same name in the request and a system message
  expect_400(both, "tools");
}

// response_format with thinking on: the end token is not allowed inside the think channel, so an
// answer that ends "stop" holds its response (a sentence of the grammar), never an empty content.
TEST(ServerCompat, ResponseFormatWithThinkingNeverStopsEmpty) {
  const ojson schema = {{"type", "object"}, {"properties", {{"ok", {{"type", "boolean"}}}}}, {"required", {"ok"}},
                        {"additionalProperties", false}};
  int stops = 0;
  for (uint64_t seed = 1; seed <= 12; ++seed) {
    const ojson body = {{"messages", kHi}, {"max_tokens", 120}, {"seed", seed}, {"thinking_budget_tokens", 40},
                        {"response_format", {{"type", "json_schema"}, {"json_schema", {{"name", "r"}, {"schema", schema}}}}}};
    int st = 0;
    const ojson r = kimi_srv().post("/v1/chat/completions", body, &st);
    ASSERT_EQ(st, 200) << r.dump();
    const ojson& c = r["choices"][0];
    if (c["finish_reason"] != "stop") continue;
    ++stops;
    const ojson v = ojson::parse(c["message"]["content"].get<std::string>(), nullptr, false);
    ASSERT_TRUE(v.is_object()) << r.dump();
    EXPECT_TRUE(v.contains("ok") && v["ok"].is_boolean()) << r.dump();
  }
  EXPECT_GT(stops, 0);
}
