// `kimi serve`: the APIs coding agents speak — Anthropic Messages (/v1/messages, count_tokens) and
// OpenAI Responses (/v1/responses) — checked against the chat endpoint (the same request in chat
// form must give the same prompt tokens and, greedy, the same text), their streams against their
// whole answers, bad input against 400s that name the field, and enforced tool calls (a required or
// named tool on the random-weight model: a call of that tool whose arguments fit the schema).
// The official SDKs and the agent CLIs are tested by tests/agents/ (node).
#include <gtest/gtest.h>

#include <set>

#include "server_fixture.h"
#include "server/tool_grammar.h"
#include "tokenizer/chat.h"
#include "util/json.h"

using namespace kimi;
using namespace kimi::test;

namespace {

server::ServerOptions agent_opts() {
  server::ServerOptions o = server_opts();
  o.sched.parallel = 2;
  return o;
}

RunningServer& srv() {
  static RunningServer s(agent_opts());
  return s;
}

const ojson kUser = ojson::array({{{"role", "user"}, {"content", "Hello, who are you?"}}});


// Greedy chat completion of the same conversation (the reference of the other APIs).
ojson chat_greedy(const ojson& messages, int max_tokens, bool thinking, const ojson& extra = ojson::object()) {
  ojson body = {{"messages", messages}, {"max_tokens", max_tokens}, {"temperature", 0}, {"thinking", thinking}};
  for (auto it = extra.begin(); it != extra.end(); ++it) body[it.key()] = it.value();
  int st = 0;
  ojson r = srv().post("/v1/chat/completions", body, &st);
  EXPECT_EQ(st, 200) << r.dump();
  return r;
}

void expect_anthropic_error(const ojson& r, int status, int want_status, const std::string& names) {
  EXPECT_EQ(status, want_status) << r.dump();
  ASSERT_TRUE(r.is_object()) << r.dump();
  EXPECT_EQ(r.value("type", ""), "error") << r.dump();
  ASSERT_TRUE(r.contains("error")) << r.dump();
  EXPECT_EQ(r["error"]["type"], want_status == 400 ? "invalid_request_error" : r["error"]["type"]);
  EXPECT_NE(r["error"]["message"].get<std::string>().find(names), std::string::npos) << r.dump();
}

}  // namespace

// ------------------------------------------------------------------------------------------------
// Anthropic Messages

TEST(ServerAgents, AnthropicMessageEqualsChatGreedy) {
  const ojson ref = chat_greedy(kUser, 12, false);
  int st = 0;
  const ojson r = srv().post("/v1/messages?beta=true",
                             ojson{{"model", "m"}, {"max_tokens", 12}, {"temperature", 0}, {"messages", kUser},
                                   {"metadata", {{"user_id", "u1"}}}, {"context_management", {{"edits", ojson::array()}}}},
                             &st);
  ASSERT_EQ(st, 200) << r.dump();
  EXPECT_EQ(r["type"], "message");
  EXPECT_EQ(r["role"], "assistant");
  EXPECT_EQ(r["id"].get<std::string>().rfind("msg_", 0), 0u);
  std::string text;
  for (const auto& b : r["content"])
    if (b["type"] == "text") text += b["text"].get<std::string>();
  EXPECT_EQ(text, ref["choices"][0]["message"]["content"].get<std::string>());
  const std::string fr = ref["choices"][0]["finish_reason"];
  EXPECT_EQ(r["stop_reason"], fr == "length" ? "max_tokens" : "end_turn");
  // usage: input = prompt - cache reads, the same prompt tokens as the chat request's
  const int prompt = ref["usage"]["prompt_tokens"];
  EXPECT_EQ(r["usage"]["input_tokens"].get<int>() + r["usage"]["cache_read_input_tokens"].get<int>(), prompt);
  EXPECT_EQ(r["usage"]["output_tokens"], ref["usage"]["completion_tokens"]);
  // count_tokens: the same prompt size
  const ojson ct = srv().post("/v1/messages/count_tokens", ojson{{"model", "m"}, {"messages", kUser}}, &st);
  ASSERT_EQ(st, 200) << ct.dump();
  EXPECT_EQ(ct["input_tokens"], prompt);
}

TEST(ServerAgents, AnthropicSystemThinkingAndHistoryRenderAsChat) {
  // system blocks, thinking on, an earlier turn with thinking + a tool call and its result
  const ojson tools = ojson::array({{{"name", "get_weather"}, {"description", "weather"},
                                     {"input_schema", {{"type", "object"}, {"properties", {{"city", {{"type", "string"}}}}}}}}});
  const ojson amsgs = ojson::array(
      {{{"role", "user"}, {"content", "Weather in Paris?"}},
       {{"role", "assistant"},
        {"content", ojson::array({{{"type", "thinking"}, {"thinking", "Call the tool."}, {"signature", "x"}},
                                  {{"type", "text"}, {"text", "Let me check."}},
                                  {{"type", "tool_use"}, {"id", "toolu_1"}, {"name", "get_weather"}, {"input", {{"city", "Paris"}}}}})}},
       {{"role", "user"},
        {"content", ojson::array({{{"type", "tool_result"}, {"tool_use_id", "toolu_1"}, {"content", "sunny"}},
                                  {{"type", "text"}, {"text", "Thanks"}}})}}});
  const ojson system = ojson::array({{{"type", "text"}, {"text", "You are K."}, {"cache_control", {{"type", "ephemeral"}}}},
                                     {{"type", "text"}, {"text", "Be brief."}}});
  int st = 0;
  const ojson ct = srv().post("/v1/messages/count_tokens",
                              ojson{{"model", "m"}, {"system", system}, {"messages", amsgs}, {"tools", tools},
                                    {"thinking", {{"type", "enabled"}, {"budget_tokens", 4096}}}},
                              &st);
  ASSERT_EQ(st, 200) << ct.dump();
  // the same conversation in chat form
  const ojson cmsgs = ojson::array(
      {{{"role", "system"}, {"content", "You are K.\nBe brief."}},
       {{"role", "user"}, {"content", "Weather in Paris?"}},
       {{"role", "assistant"}, {"content", "Let me check."}, {"reasoning_content", "Call the tool."},
        {"tool_calls", ojson::array({{{"id", "toolu_1"}, {"type", "function"},
                                      {"function", {{"name", "get_weather"}, {"arguments", {{"city", "Paris"}}}}}}})}},
       {{"role", "tool"}, {"tool_call_id", "toolu_1"}, {"content", "sunny"}},
       {{"role", "user"}, {"content", "Thanks"}}});
  const ojson ctools = ojson::array({{{"type", "function"}, {"function", {{"name", "get_weather"}, {"description", "weather"},
                                      {"parameters", tools[0]["input_schema"]}}}}});
  const ojson ref = chat_greedy(cmsgs, 1, true, {{"tools", ctools}, {"thinking_effort", "high"}});
  EXPECT_EQ(ct["input_tokens"], ref["usage"]["prompt_tokens"]);
}

TEST(ServerAgents, AnthropicStreamEqualsWhole) {
  const ojson body = {{"model", "m"}, {"max_tokens", 16}, {"temperature", 0}, {"messages", kUser},
                      {"thinking", {{"type", "adaptive"}}}, {"output_config", {{"effort", "low"}}}};
  int st = 0;
  const ojson whole = srv().post("/v1/messages", body, &st);
  ASSERT_EQ(st, 200) << whole.dump();
  ojson sb = body;
  sb["stream"] = true;
  const auto ev = named_events(srv().post_stream("/v1/messages", sb));
  ASSERT_GE(ev.size(), 3u);
  EXPECT_EQ(ev.front().first, "message_start");
  EXPECT_EQ(ev.back().first, "message_stop");
  std::string thinking, text;
  int open = -1;
  ojson delta;
  for (const auto& [name, d] : ev) {
    EXPECT_EQ(d["type"], name);  // the event line names the data's type
    if (name == "content_block_start") {
      EXPECT_EQ(open, -1);
      open = d["index"];
    } else if (name == "content_block_stop") {
      EXPECT_EQ(d["index"], open);
      open = -1;
    } else if (name == "content_block_delta") {
      EXPECT_EQ(d["index"], open);
      if (d["delta"]["type"] == "thinking_delta") thinking += d["delta"]["thinking"].get<std::string>();
      if (d["delta"]["type"] == "text_delta") text += d["delta"]["text"].get<std::string>();
    } else if (name == "message_delta") {
      delta = d;
    }
  }
  std::string w_thinking, w_text;
  for (const auto& b : whole["content"]) {
    if (b["type"] == "thinking") w_thinking += b["thinking"].get<std::string>();
    if (b["type"] == "text") w_text += b["text"].get<std::string>();
  }
  EXPECT_EQ(thinking, w_thinking);
  EXPECT_EQ(text, w_text);
  EXPECT_FALSE(thinking.empty());  // thinking on: the prompt ends in the think channel
  EXPECT_EQ(delta["delta"]["stop_reason"], whole["stop_reason"]);
  EXPECT_EQ(delta["usage"]["output_tokens"], whole["usage"]["output_tokens"]);
}

TEST(ServerAgents, AnthropicStopSequence) {
  const ojson body = {{"model", "m"}, {"max_tokens", 24}, {"temperature", 0}, {"messages", kUser}};
  int st = 0;
  const ojson whole = srv().post("/v1/messages", body, &st);
  ASSERT_EQ(st, 200);
  const std::string text = whole["content"][0]["text"];
  ASSERT_GE(text.size(), 6u) << "the greedy answer is too short to cut: " << text;
  // a stop string from the middle of the greedy answer (ASCII-safe cut: bytes 3..5)
  const std::string stop = text.substr(3, 3);
  ojson sb = body;
  sb["stop_sequences"] = ojson::array({"zzzz-never", stop});
  const ojson cut = srv().post("/v1/messages", sb, &st);
  ASSERT_EQ(st, 200) << cut.dump();
  EXPECT_EQ(cut["stop_reason"], "stop_sequence");
  EXPECT_EQ(cut["stop_sequence"], stop);
  const std::string got = cut["content"].empty() ? "" : cut["content"][0]["text"].get<std::string>();
  EXPECT_EQ(got, text.substr(0, text.find(stop)));
}

TEST(ServerAgents, AnthropicBadInputIs400NamingTheField) {
  auto msgs_with = [](const ojson& content) {
    return ojson::array({{{"role", "user"}, {"content", "hi"}},
                         {{"role", "assistant"}, {"content", ojson::array({{{"type", "tool_use"}, {"id", "t1"}, {"name", "f"}, {"input", ojson::object()}}})}},
                         {{"role", "user"}, {"content", content}}});
  };
  struct Case {
    ojson body;
    std::string names;
  };
  const std::vector<Case> cases = {
      {{{"messages", kUser}}, "max_tokens"},
      {{{"max_tokens", 4}, {"messages", msgs_with(ojson::array({{{"type", "tool_result"}, {"tool_use_id", "nope"}, {"content", "x"}}}))}},
       "messages[2].content[0].tool_use_id"},
      {{{"max_tokens", 4}, {"messages", msgs_with(ojson::array({{{"type", "text"}, {"text", "no result"}}}))}},
       "tool_use 't1' has no tool_result"},
      {{{"max_tokens", 4},
        {"messages", ojson::array({{{"role", "user"}, {"content", "hi"}},
                                   {{"role", "assistant"}, {"content", ojson::array({{{"type", "tool_use"}, {"id", "t1"}, {"name", "f"}, {"input", "{not json"}}})}},
                                   {{"role", "user"}, {"content", "x"}}})}},
       "messages[1].content[0].input"},
      {{{"max_tokens", 4}, {"messages", ojson::array({{{"role", "user"}, {"content", ojson::array({{{"type", "hologram"}}})}}})}},
       "messages[0].content[0].type"},
      {{{"max_tokens", 4}, {"messages", ojson::array({{{"role", "user"}, {"content", ojson::array({{{"type", "image"}, {"source", ojson::object()}}})}}})}},
       "messages[0].content[0].source.type"},
      {{{"max_tokens", 4}, {"messages", kUser}, {"tools", ojson::array({{{"name", "f"}}})}}, "tools[0].input_schema"},
      {{{"max_tokens", 4}, {"messages", kUser}, {"tools", ojson::array({{{"name", "f"}, {"input_schema", "x"}}})}}, "tools[0].input_schema"},
      {{{"max_tokens", 4}, {"messages", kUser}, {"tool_choice", {{"type", "tool"}, {"name", "f"}}}}, "tool_choice.type"},
      {{{"max_tokens", 4}, {"messages", kUser}, {"thinking", {{"type", "sometimes"}}}}, "thinking.type"},
      {{{"max_tokens", 4}, {"messages", kUser}, {"output_config", {{"effort", "extreme"}}}}, "output_config.effort"},
      {{{"max_tokens", 4}, {"messages", kUser}, {"temperature", 1.5}}, "temperature"},
      {{{"max_tokens", 4}, {"messages", ojson::array({{{"role", "user"}, {"content", std::string(200000, 'x')}}})}}, "context"},
      {{{"max_tokens", 4}, {"messages", ojson::array({{{"role", "user"}, {"content", "a"}}, {{"role", "assistant"}, {"content", "b"}}})}}, "prefill"},
  };
  for (const Case& c : cases) {
    int st = 0;
    const ojson r = srv().post("/v1/messages", c.body, &st);
    SCOPED_TRACE(c.body.dump().substr(0, 300));
    expect_anthropic_error(r, st, 400, c.names);
  }
  int st = 0;
  const ojson r = srv().post("/v1/messages", std::string("{\"max_tokens\": 4, \"messages\": ["), &st);
  expect_anthropic_error(r, st, 400, "not valid JSON");
}

TEST(ServerAgents, AnthropicApiKeyHeaderAndErrorShape) {
  server::ServerOptions o = agent_opts();
  o.api_key = "sekret";
  RunningServer s(o);
  auto c = s.client();
  const std::string body = ojson{{"max_tokens", 2}, {"messages", kUser}}.dump();
  auto r = c.Post("/v1/messages", httplib::Headers{{"x-api-key", "sekret"}, {"anthropic-version", "2023-06-01"}}, body,
                  "application/json");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 200) << r->body;
  r = c.Post("/v1/messages", httplib::Headers{{"x-api-key", "wrong"}}, body, "application/json");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 401);
  const ojson e = ojson::parse(r->body);
  EXPECT_EQ(e["type"], "error");
  EXPECT_EQ(e["error"]["type"], "authentication_error");
  // the chat endpoint takes the same header; its errors keep OpenAI's shape
  r = c.Post("/v1/chat/completions", httplib::Headers{{"x-api-key", "wrong"}}, "{}", "application/json");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 401);
  EXPECT_TRUE(ojson::parse(r->body).contains("error"));
  EXPECT_FALSE(ojson::parse(r->body).contains("type"));
}

// ------------------------------------------------------------------------------------------------
// OpenAI Responses

TEST(ServerAgents, ResponsesEqualsChatGreedy) {
  const ojson ref = chat_greedy(ojson::array({{{"role", "system"}, {"content", "Be brief."}}, kUser[0]}), 12, false);
  int st = 0;
  const ojson r = srv().post("/v1/responses",
                             ojson{{"model", "m"}, {"instructions", "Be brief."}, {"input", "Hello, who are you?"},
                                   {"max_output_tokens", 12}, {"temperature", 0}, {"reasoning", {{"effort", "none"}}},
                                   {"store", false}, {"include", ojson::array({"reasoning.encrypted_content"})},
                                   {"prompt_cache_key", "abc"}},
                             &st);
  ASSERT_EQ(st, 200) << r.dump();
  EXPECT_EQ(r["object"], "response");
  std::string text;
  for (const auto& it : r["output"])
    if (it["type"] == "message")
      for (const auto& p : it["content"]) text += p["text"].get<std::string>();
  EXPECT_EQ(text, ref["choices"][0]["message"]["content"].get<std::string>());
  EXPECT_EQ(r["usage"]["input_tokens"], ref["usage"]["prompt_tokens"]);
  EXPECT_EQ(r["usage"]["output_tokens"], ref["usage"]["completion_tokens"]);
  const bool cut = ref["choices"][0]["finish_reason"] == "length";
  EXPECT_EQ(r["status"], cut ? "incomplete" : "completed");
}

TEST(ServerAgents, ResponsesStreamEqualsWhole) {
  const ojson body = {{"model", "m"}, {"input", ojson::array({{{"type", "message"}, {"role", "user"},
                                                               {"content", ojson::array({{{"type", "input_text"}, {"text", "Hi"}}})}}})},
                      {"max_output_tokens", 16}, {"temperature", 0}, {"reasoning", {{"effort", "low"}}}};
  int st = 0;
  const ojson whole = srv().post("/v1/responses", body, &st);
  ASSERT_EQ(st, 200) << whole.dump();
  ojson sb = body;
  sb["stream"] = true;
  const auto ev = named_events(srv().post_stream("/v1/responses", sb));
  ASSERT_GE(ev.size(), 3u);
  EXPECT_EQ(ev[0].first, "response.created");
  EXPECT_EQ(ev[1].first, "response.in_progress");
  std::string reasoning, text;
  for (size_t i = 0; i < ev.size(); ++i) {
    EXPECT_EQ(ev[i].second["sequence_number"], i);
    EXPECT_EQ(ev[i].second["type"], ev[i].first);
    if (ev[i].first == "response.reasoning_text.delta") reasoning += ev[i].second["delta"].get<std::string>();
    if (ev[i].first == "response.output_text.delta") text += ev[i].second["delta"].get<std::string>();
  }
  const ojson& fin = ev.back().second["response"];
  EXPECT_TRUE(ev.back().first == "response.completed" || ev.back().first == "response.incomplete");
  std::string w_reasoning, w_text;
  for (const auto& it : whole["output"]) {
    if (it["type"] == "reasoning") w_reasoning += it["content"][0]["text"].get<std::string>();
    if (it["type"] == "message") w_text += it["content"][0]["text"].get<std::string>();
  }
  EXPECT_FALSE(reasoning.empty());
  EXPECT_EQ(reasoning, w_reasoning);
  EXPECT_EQ(text, w_text);
  ASSERT_EQ(fin["output"].size(), whole["output"].size());
  for (size_t i = 0; i < fin["output"].size(); ++i) {  // the same items (their ids differ: another response)
    EXPECT_EQ(fin["output"][i]["type"], whole["output"][i]["type"]);
    EXPECT_EQ(fin["output"][i]["content"], whole["output"][i]["content"]);
  }
  for (const char* k : {"input_tokens", "output_tokens", "output_tokens_details", "total_tokens"})
    EXPECT_EQ(fin["usage"][k], whole["usage"][k]) << k;
}

TEST(ServerAgents, ResponsesBadInputIs400NamingTheField) {
  struct Case {
    ojson body;
    std::string param;
  };
  const ojson call = {{"type", "function_call"}, {"call_id", "c1"}, {"name", "f"}, {"arguments", "{}"}};
  const std::vector<Case> cases = {
      {{{"input", "hi"}, {"previous_response_id", "resp_1"}}, "previous_response_id"},
      {{{"input", ojson::array({{{"role", "user"}, {"content", "hi"}},
                                {{"type", "function_call"}, {"call_id", "c1"}, {"name", "f"}, {"arguments", "{oops"}}})}},
       "input[1].arguments"},
      {{{"input", ojson::array({{{"role", "user"}, {"content", "hi"}}, call,
                                {{"type", "function_call_output"}, {"call_id", "c2"}, {"output", "x"}}})}},
       "input[2].call_id"},
      {{{"input", ojson::array({{{"type", "item_reference"}, {"id", "x"}}})}}, "input[0].type"},
      {{{"input", ojson::array({{{"role", "user"}, {"content", ojson::array({{{"type", "input_image"}}})}}})}}, "input[0].content[0].image_url"},
      {{{"input", "hi"}, {"reasoning", {{"effort", "extreme"}}}}, "reasoning.effort"},
      {{{"input", "hi"}, {"tools", ojson::array({{{"type", "function"}}})}}, "tools[0].name"},
      {{{"input", "hi"}, {"tool_choice", {{"type", "function"}, {"name", "nope"}}}}, "tool_choice.name"},
      {{{"input", std::string(200000, 'x')}}, "messages"},
      {{{"input", ojson::array()}}, "input"},
  };
  for (const Case& c : cases) {
    int st = 0;
    const ojson r = srv().post("/v1/responses", c.body, &st);
    SCOPED_TRACE(c.body.dump().substr(0, 300));
    EXPECT_EQ(st, 400) << r.dump();
    ASSERT_TRUE(r.contains("error")) << r.dump();
    EXPECT_EQ(r["error"]["param"], c.param) << r.dump();
  }
}

TEST(ServerAgents, ChatReasoningEffortMapAndThinkingEffortCheck) {
  int st = 0;
  // thinking_effort: K3's own values
  for (const char* e : {"low", "high", "max"}) {
    const ojson r = srv().post("/v1/chat/completions",
                               ojson{{"messages", kUser}, {"max_tokens", 1}, {"thinking_effort", e}}, &st);
    EXPECT_EQ(st, 200) << e << ": " << r.dump();
  }
  // medium: the K3 template's check refuses it (its text lists it): the template's own message
  ojson med = srv().post("/v1/chat/completions", ojson{{"messages", kUser}, {"max_tokens", 1}, {"thinking_effort", "medium"}}, &st);
  EXPECT_EQ(st, 400) << med.dump();
  EXPECT_EQ(med["error"]["param"], "thinking_effort");
  EXPECT_EQ(med["error"]["message"], "Unsupported thinking_effort=medium; supported values are low, medium, high, and max.");
  // OpenAI's medium: mapped onto high (a level the model knows)
  const ojson high = srv().post("/v1/chat/completions", ojson{{"messages", kUser}, {"max_tokens", 1}, {"thinking_effort", "high"}}, &st);
  med = srv().post("/v1/chat/completions", ojson{{"messages", kUser}, {"max_tokens", 1}, {"reasoning_effort", "medium"}}, &st);
  ASSERT_EQ(st, 200) << med.dump();
  EXPECT_EQ(med["usage"]["prompt_tokens"], high["usage"]["prompt_tokens"]);
  ojson r = srv().post("/v1/chat/completions", ojson{{"messages", kUser}, {"max_tokens", 1}, {"thinking_effort", "extreme"}}, &st);
  EXPECT_EQ(st, 400);
  EXPECT_EQ(r["error"]["param"], "thinking_effort");
  EXPECT_NE(r["error"]["message"].get<std::string>().find("low, medium, high"), std::string::npos) << r.dump();
  // reasoning_effort: OpenAI's values through the map (none: no thinking -> the prompt of thinking off)
  const ojson off = chat_greedy(kUser, 1, false);
  r = srv().post("/v1/chat/completions", ojson{{"messages", kUser}, {"max_tokens", 1}, {"reasoning_effort", "none"}}, &st);
  ASSERT_EQ(st, 200) << r.dump();
  EXPECT_EQ(r["usage"]["prompt_tokens"], off["usage"]["prompt_tokens"]);
  const ojson hi = srv().post("/v1/chat/completions", ojson{{"messages", kUser}, {"max_tokens", 1}, {"thinking_effort", "max"}}, &st);
  r = srv().post("/v1/chat/completions", ojson{{"messages", kUser}, {"max_tokens", 1}, {"reasoning_effort", "xhigh"}}, &st);
  ASSERT_EQ(st, 200) << r.dump();
  EXPECT_EQ(r["usage"]["prompt_tokens"], hi["usage"]["prompt_tokens"]);
  for (const char* e : {"minimal", "low", "medium", "high"}) {
    r = srv().post("/v1/chat/completions", ojson{{"messages", kUser}, {"max_tokens", 1}, {"reasoning_effort", e}}, &st);
    EXPECT_EQ(st, 200) << e << ": " << r.dump();
  }
  r = srv().post("/v1/chat/completions", ojson{{"messages", kUser}, {"max_tokens", 1}, {"reasoning_effort", "extreme"}}, &st);
  EXPECT_EQ(st, 400) << r.dump();
  EXPECT_NE(r["error"]["message"].get<std::string>().find("none, minimal, low, medium, high, xhigh"), std::string::npos);
  EXPECT_EQ(r["error"]["param"], "reasoning_effort");
}

// ------------------------------------------------------------------------------------------------
// Enforced tool calls

namespace {

// Independent check of a call's arguments against the test schema (written out here, not the
// server's grammar): city a string, days an integer 1..16 digits, units "c" or "f", metric a
// boolean; city and days required, nothing else.
void expect_args_fit(const ojson& a) {
  ASSERT_TRUE(a.is_object()) << a.dump();
  for (auto it = a.begin(); it != a.end(); ++it)
    EXPECT_TRUE(it.key() == "city" || it.key() == "days" || it.key() == "units" || it.key() == "metric") << a.dump();
  ASSERT_TRUE(a.contains("days")) << a.dump();
  EXPECT_TRUE(a["days"].is_number_integer()) << a.dump();
  ASSERT_TRUE(a.contains("city")) << a.dump();
  EXPECT_TRUE(a["city"].is_string()) << a.dump();
  if (a.contains("units")) { EXPECT_TRUE(a["units"] == "c" || a["units"] == "f") << a.dump(); }
  if (a.contains("metric")) { EXPECT_TRUE(a["metric"].is_boolean()) << a.dump(); }
}

const ojson kWeatherSchema = ojson::parse(R"({"type":"object","properties":{
  "city":{"enum":["Paris","Oslo"]},"days":{"type":"integer","minimum":1},"units":{"type":"string","enum":["c","f"]},
  "metric":{"type":"boolean"}},"required":["city","days"],"additionalProperties":false})");

ojson chat_tools() {
  return ojson::array({{{"type", "function"}, {"function", {{"name", "get_weather"}, {"parameters", kWeatherSchema}}}},
                       {{"type", "function"}, {"function", {{"name", "get_time"}, {"parameters", {{"type", "object"},
                          {"properties", {{"zone", {{"enum", ojson::array({"UTC", "CET"})}}}}}, {"required", ojson::array({"zone"})}}}}}}});
}

// K3 text with the structural tokens as the tool grammar's code points.
std::string as_markers(std::string s) {
  for (const auto& [tag, cp] : {std::pair<std::string, std::string>{"<|open|>", server::kToolOpen},
                                {"<|close|>", server::kToolClose}, {"<|sep|>", server::kToolSep}})
    for (size_t p = 0; (p = s.find(tag, p)) != std::string::npos;) s.replace(p, tag.size(), cp);
  return s;
}

}  // namespace

TEST(ServerAgents, ToolGrammarAcceptsTheTemplatesOwnCalls) {
  // the reference: what the K3 template renders for an assistant turn with calls, in both argument
  // forms (an object: one tag per argument; a string: a json block)
  for (const bool tags : {true, false}) {
    const ojson args = {{"city", "Oslo"}, {"days", 3}, {"metric", true}};
    const ojson calls = ojson::array(
        {{{"id", "a"}, {"type", "function"}, {"function", {{"name", "get_weather"}, {"arguments", tags ? args : ojson(args.dump())}}}},
         {{"id", "b"}, {"type", "function"}, {"function", {{"name", "get_time"}, {"arguments", tags ? ojson{{"zone", "UTC"}} : ojson("{\"zone\": \"CET\"}")}}}}});
    const ojson req = {{"messages", ojson::array({{{"role", "user"}, {"content", "x"}},
                                                  {{"role", "assistant"}, {"content", ""}, {"tool_calls", calls}}})},
                       {"thinking", false}, {"add_generation_prompt", false}};
    const std::string r = tok::render_chat_request(req);
    const std::string open_resp = "<|open|>message role=\"assistant\"<|sep|><|open|>response<|sep|>";
    const size_t a = r.find(open_resp);
    ASSERT_NE(a, std::string::npos) << r;
    const size_t b = r.find("<|end_of_msg|>", a);
    const std::string out = as_markers(r.substr(a + open_resp.size(), b - a - open_resp.size()));
    std::vector<server::ToolSpec> specs;
    for (const auto& t : chat_tools()) specs.push_back({t["function"]["name"], t["function"]["parameters"]});
    for (const std::string forced : {"", "get_weather"}) {
      server::grammar::Matcher m(server::grammar::Grammar::parse(server::tool_gbnf(specs, server::ToolMode::Required, forced, false)));
      const bool ok = m.advance_bytes(out) && m.can_end();
      EXPECT_EQ(ok, forced.empty()) << "tags " << tags << " forced '" << forced << "': " << r.substr(a);
    }
    // auto: the same calls after the trigger
    const size_t t = out.find(std::string(server::kToolOpen) + "tools" + server::kToolSep);
    ASSERT_NE(t, std::string::npos);
    server::grammar::Matcher m(server::grammar::Grammar::parse(server::tool_gbnf(specs, server::ToolMode::Auto, "", false)));
    const size_t t_end = t + std::string(server::kToolOpen).size() + 5 + std::string(server::kToolSep).size();
    EXPECT_TRUE(m.advance_bytes(out.substr(t_end)) && m.can_end()) << out.substr(t_end);
    // arguments that break the schema are refused: a day count as a string, an unknown city
    std::string wrong = out;
    const std::string bad_val = tags ? std::string("type=\"number\"") + server::kToolSep + "3" : "\"days\":3";
    const size_t at = wrong.find(bad_val);
    ASSERT_NE(at, std::string::npos) << out;
    wrong.replace(at, bad_val.size(), tags ? std::string("type=\"string\"") + server::kToolSep + "3" : "\"days\":\"3\"");
    server::grammar::Matcher w(server::grammar::Grammar::parse(server::tool_gbnf(specs, server::ToolMode::Required, "", false)));
    EXPECT_FALSE(w.advance_bytes(wrong) && w.can_end());
  }
}

TEST(ServerAgents, ChatForcedToolCallsFitTheSchema) {
  for (const ojson& choice : {ojson("required"), ojson{{"type", "function"}, {"function", {{"name", "get_weather"}}}}}) {
    for (uint64_t seed : {1, 2, 3}) {
      int st = 0;
      const ojson r = srv().post("/v1/chat/completions",
                                 ojson{{"messages", kUser}, {"tools", chat_tools()}, {"tool_choice", choice}, {"thinking", false},
                                       {"max_tokens", 200}, {"seed", seed}},
                                 &st);
      ASSERT_EQ(st, 200) << r.dump();
      SCOPED_TRACE(r.dump());
      const ojson& c = r["choices"][0];
      EXPECT_EQ(c["finish_reason"], "tool_calls");
      ASSERT_TRUE(c["message"].contains("tool_calls"));
      for (const auto& call : c["message"]["tool_calls"]) {
        const std::string name = call["function"]["name"];
        if (choice.is_object()) { EXPECT_EQ(name, "get_weather"); }
        const ojson args = ojson::parse(call["function"]["arguments"].get<std::string>());
        if (name == "get_weather") {
          expect_args_fit(args);
        } else {
          EXPECT_EQ(name, "get_time");
          EXPECT_TRUE((args == ojson{{"zone", "UTC"}}) || (args == ojson{{"zone", "CET"}}));
        }
      }
    }
  }
}

// Issue 38: with thinking on (the default) the tiny model thought until max_tokens and a required
// call never came (the Vercel AI SDK throws then). The think channel now gets at most max_tokens -
// (3T/2 + 16) tokens and the cheapest completion of the call is forced when only its room is left:
// required and named choices always end with a valid call, whole and streamed.
TEST(ServerAgents, RequiredCallAlwaysComesWithThinkingOn) {
  int calls = 0;
  for (const ojson& choice : {ojson("required"), ojson{{"type", "function"}, {"function", {{"name", "get_weather"}}}}}) {
    for (int max_tokens : {130, 200, 320}) {  // the cheapest call is ~90 tokens of the tiny vocabulary
      for (uint64_t seed : {1, 2, 3}) {
        SCOPED_TRACE(choice.dump() + " max_tokens " + std::to_string(max_tokens) + " seed " + std::to_string(seed));
        ojson body = {{"messages", kUser}, {"tools", chat_tools()}, {"tool_choice", choice}, {"max_tokens", max_tokens},
                      {"seed", seed}};
        int st = 0;
        const ojson r = srv().post("/v1/chat/completions", body, &st);
        ASSERT_EQ(st, 200) << r.dump();
        const ojson& c = r["choices"][0];
        EXPECT_EQ(c["finish_reason"], "tool_calls") << r.dump();
        EXPECT_LE(r["usage"]["completion_tokens"].get<int>(), max_tokens);
        ASSERT_TRUE(c["message"].contains("tool_calls")) << r.dump();
        for (const auto& call : c["message"]["tool_calls"]) {
          ++calls;
          const ojson args = ojson::parse(call["function"]["arguments"].get<std::string>());
          if (call["function"]["name"] == "get_weather") {
            expect_args_fit(args);
          } else {
            EXPECT_EQ(call["function"]["name"], "get_time");
            EXPECT_TRUE((args == ojson{{"zone", "UTC"}}) || (args == ojson{{"zone", "CET"}})) << args.dump();
          }
        }
        if (seed != 1) continue;
        body["stream"] = true;  // streamed: the same call
        bool done = false;
        std::string args, finish;
        for (const ojson& e : sse_events(srv().post_stream("/v1/chat/completions", body), &done)) {
          const ojson& ch = e["choices"][0];
          if (!ch["finish_reason"].is_null()) finish = ch["finish_reason"];
          if (ch["delta"].contains("tool_calls") && ch["delta"]["tool_calls"][0]["index"] == 0)
            args += ch["delta"]["tool_calls"][0]["function"]["arguments"].get<std::string>();
        }
        EXPECT_TRUE(done);
        EXPECT_EQ(finish, "tool_calls");
        EXPECT_EQ(args, c["message"]["tool_calls"][0]["function"]["arguments"]);
      }
    }
  }
  EXPECT_GE(calls, 18);
}

TEST(ServerAgents, ToolChoiceNoneAndAutoNeverGiveBrokenCalls) {
  for (uint64_t seed = 1; seed <= 4; ++seed) {
    int st = 0;
    ojson r = srv().post("/v1/chat/completions",
                         ojson{{"messages", kUser}, {"tools", chat_tools()}, {"tool_choice", "none"}, {"thinking", false},
                               {"max_tokens", 48}, {"seed", seed}},
                         &st);
    ASSERT_EQ(st, 200) << r.dump();
    EXPECT_FALSE(r["choices"][0]["message"].contains("tool_calls")) << r.dump();
    EXPECT_NE(r["choices"][0]["finish_reason"], "tool_calls");
    r = srv().post("/v1/chat/completions",
                   ojson{{"messages", kUser}, {"tools", chat_tools()}, {"thinking", false}, {"max_tokens", 48}, {"seed", seed}}, &st);
    ASSERT_EQ(st, 200) << r.dump();
    if (r["choices"][0]["message"].contains("tool_calls"))
      for (const auto& call : r["choices"][0]["message"]["tool_calls"])
        if (call["function"]["name"] == "get_weather") expect_args_fit(ojson::parse(call["function"]["arguments"].get<std::string>()));
  }
}

TEST(ServerAgents, AnthropicAndResponsesForcedToolRoundTrip) {
  const ojson atools = ojson::array({{{"name", "get_weather"}, {"input_schema", kWeatherSchema}}});
  int st = 0;
  ojson msgs = kUser;
  const ojson r = srv().post("/v1/messages", ojson{{"max_tokens", 200}, {"messages", msgs}, {"tools", atools},
                                                   {"tool_choice", {{"type", "tool"}, {"name", "get_weather"}}}}, &st);
  ASSERT_EQ(st, 200) << r.dump();
  EXPECT_EQ(r["stop_reason"], "tool_use") << r.dump();
  ojson use;
  for (const auto& b : r["content"])
    if (b["type"] == "tool_use") use = b;
  ASSERT_TRUE(use.is_object()) << r.dump();
  EXPECT_EQ(use["name"], "get_weather");
  expect_args_fit(use["input"]);
  msgs.push_back({{"role", "assistant"}, {"content", r["content"]}});
  msgs.push_back({{"role", "user"}, {"content", ojson::array({{{"type", "tool_result"}, {"tool_use_id", use["id"]}, {"content", "12 C"}}})}});
  const ojson fin = srv().post("/v1/messages", ojson{{"max_tokens", 16}, {"messages", msgs}, {"tools", atools},
                                                     {"tool_choice", {{"type", "none"}}}}, &st);
  ASSERT_EQ(st, 200) << fin.dump();
  EXPECT_NE(fin["stop_reason"], "tool_use") << fin.dump();

  const ojson rtools = ojson::array({{{"type", "function"}, {"name", "get_weather"}, {"parameters", kWeatherSchema}}});
  ojson input = ojson::array({{{"role", "user"}, {"content", "Weather?"}}});
  const ojson rr = srv().post("/v1/responses", ojson{{"input", input}, {"tools", rtools}, {"tool_choice", "required"},
                                                     {"reasoning", {{"effort", "none"}}}, {"max_output_tokens", 200}}, &st);
  ASSERT_EQ(st, 200) << rr.dump();
  ojson call;
  for (const auto& it : rr["output"])
    if (it["type"] == "function_call") call = it;
  ASSERT_TRUE(call.is_object()) << rr.dump();
  expect_args_fit(ojson::parse(call["arguments"].get<std::string>()));
  input.push_back(call);
  input.push_back({{"type", "function_call_output"}, {"call_id", call["call_id"]}, {"output", "12 C"}});
  const ojson rf = srv().post("/v1/responses", ojson{{"input", input}, {"tools", rtools}, {"tool_choice", "none"},
                                                     {"reasoning", {{"effort", "none"}}}, {"max_output_tokens", 16}}, &st);
  ASSERT_EQ(st, 200) << rf.dump();
  for (const auto& it : rf["output"]) EXPECT_NE(it["type"], "function_call") << rf.dump();
}

// Every field of a valid request replaced by a value of each JSON type: a 200 or a 400 naming
// something, never a 500 or a dropped connection (Anthropic's error shape on /v1/messages).
TEST(ServerAgents, EveryFieldWithEveryTypeIsAnAnswerOrA400) {
  const ojson anthropic = ojson::parse(R"({"model":"m","max_tokens":2,"system":[{"type":"text","text":"s"}],
    "messages":[{"role":"user","content":"hi"},
                {"role":"assistant","content":[{"type":"thinking","thinking":"t","signature":""},{"type":"text","text":"a"},
                                                {"type":"tool_use","id":"u1","name":"f","input":{"x":1}}]},
                {"role":"user","content":[{"type":"tool_result","tool_use_id":"u1","content":[{"type":"text","text":"r"}],"is_error":false}]}],
    "tools":[{"name":"f","description":"d","input_schema":{"type":"object","properties":{"x":{"type":"integer"}}}}],
    "tool_choice":{"type":"auto"},"thinking":{"type":"enabled","budget_tokens":1024},"output_config":{"effort":"low"},
    "stop_sequences":["zz"],"temperature":0.5,"top_p":0.9,"top_k":5,"metadata":{"user_id":"u"}})");
  const ojson responses = ojson::parse(R"({"model":"m","max_output_tokens":2,"instructions":"i",
    "input":[{"type":"message","role":"user","content":[{"type":"input_text","text":"hi"}]},
             {"type":"reasoning","id":"r","summary":[{"type":"summary_text","text":"s"}]},
             {"type":"function_call","call_id":"c1","name":"f","arguments":"{\"x\":1}"},
             {"type":"function_call_output","call_id":"c1","output":"o"}],
    "tools":[{"type":"function","name":"f","parameters":{"type":"object","properties":{"x":{"type":"integer"}}}}],
    "tool_choice":"auto","reasoning":{"effort":"low"},"text":{"format":{"type":"text"}},"temperature":0.5,"store":false})");
  const std::vector<ojson> values = {nullptr, 7, -1.5, "x", "", ojson::array(), ojson::object(), true,
                                     ojson::array({1, "a"}), ojson{{"k", 1}}};
  for (const auto& [path, body] : {std::pair<std::string, ojson>{"/v1/messages", anthropic}, {"/v1/responses", responses}}) {
    const ojson flat = body.flatten();
    std::set<std::string> targets;  // every value and every object / array on the way to one
    for (auto it = flat.begin(); it != flat.end(); ++it)
      for (std::string p = it.key(); !p.empty(); p = p.substr(0, p.rfind('/'))) targets.insert(p);
    int n = 0;
    for (const std::string& t : targets) {
      for (const ojson& v : values) {
        ojson b = body;
        b[ojson::json_pointer(t)] = v;
        int st = 0;
        const ojson r = srv().post(path, b, &st);
        SCOPED_TRACE(path + " " + t + " = " + v.dump());
        ++n;
        ASSERT_TRUE(st == 200 || st == 400) << st << " " << r.dump();
        if (st == 400 && path == "/v1/messages") { EXPECT_EQ(r["type"], "error") << r.dump(); }
        if (st == 400 && path == "/v1/responses") { EXPECT_TRUE(r["error"]["message"].is_string()) << r.dump(); }
      }
    }
    EXPECT_GT(n, 300) << path;
  }
}

// ------------------------------------------------------------------------------------------------
// Tool calls stream as they are generated: the call's start (id, name), its arguments in several
// pieces, in each API's event order; the pieces concatenate to exactly the arguments of the whole
// (non-streamed) answer to the same greedy request.

namespace {
const ojson kNamedChatChoice = {{"type", "function"}, {"function", {{"name", "get_weather"}}}};
}  // namespace

TEST(ServerAgents, ChatStreamsToolCallArgumentsInPieces) {
  const ojson body = {{"messages", kUser}, {"tools", chat_tools()}, {"tool_choice", kNamedChatChoice}, {"thinking", false},
                      {"max_tokens", 200}, {"temperature", 0}};
  int st = 0;
  const ojson whole = srv().post("/v1/chat/completions", body, &st);
  ASSERT_EQ(st, 200) << whole.dump();
  ASSERT_EQ(whole["choices"][0]["finish_reason"], "tool_calls") << whole.dump();
  const ojson& wcall = whole["choices"][0]["message"]["tool_calls"][0];
  const std::string want = wcall["function"]["arguments"];
  ojson sb = body;
  sb["stream"] = true;
  bool saw_done = false;
  const std::vector<ojson> ev = sse_events(srv().post_stream("/v1/chat/completions", sb), &saw_done);
  EXPECT_TRUE(saw_done);
  std::string args, name, id, finish;
  int starts = 0, pieces = 0;
  for (const ojson& e : ev) {
    ASSERT_EQ(e["object"], "chat.completion.chunk") << e.dump();
    const ojson& c = e["choices"][0];
    if (!c["finish_reason"].is_null()) {
      EXPECT_TRUE(finish.empty()) << "one finish_reason";
      finish = c["finish_reason"];
      continue;
    }
    EXPECT_TRUE(finish.empty()) << "nothing after the finish_reason: " << e.dump();
    if (!c["delta"].contains("tool_calls")) continue;
    const ojson& tc = c["delta"]["tool_calls"];
    ASSERT_EQ(tc.size(), 1u) << e.dump();
    EXPECT_EQ(tc[0]["index"], 0) << e.dump();
    if (tc[0].contains("id")) {  // the first chunk of the call: id, type, name and empty arguments
      ++starts;
      EXPECT_EQ(pieces, 0) << "the call starts before its arguments";
      id = tc[0]["id"];
      EXPECT_EQ(tc[0]["type"], "function");
      name = tc[0]["function"]["name"];
      EXPECT_EQ(tc[0]["function"]["arguments"], "");
    } else {
      EXPECT_EQ(starts, 1) << e.dump();
      EXPECT_FALSE(tc[0]["function"].contains("name")) << e.dump();
      args += tc[0]["function"]["arguments"].get<std::string>();
      ++pieces;
    }
  }
  EXPECT_EQ(starts, 1);
  EXPECT_GE(pieces, 2) << "the arguments arrive in more than one delta";
  EXPECT_EQ(finish, "tool_calls");
  EXPECT_EQ(name, "get_weather");
  EXPECT_EQ(id, "call_" + ev[0]["id"].get<std::string>() + "_0");  // as the whole answer names it (another request: its id)
  EXPECT_EQ(wcall["id"], "call_" + whole["id"].get<std::string>() + "_0");
  EXPECT_EQ(args, want);  // the exact text of the whole answer
  const ojson parsed = ojson::parse(args);
  EXPECT_EQ(parsed, ojson::parse(want));
  expect_args_fit(parsed);
}

TEST(ServerAgents, AnthropicStreamsToolInputInPieces) {
  const ojson atools = ojson::array({{{"name", "get_weather"}, {"input_schema", kWeatherSchema}}});
  const ojson body = {{"model", "m"}, {"max_tokens", 200}, {"temperature", 0}, {"messages", kUser}, {"tools", atools},
                      {"tool_choice", {{"type", "tool"}, {"name", "get_weather"}}}};
  int st = 0;
  const ojson whole = srv().post("/v1/messages", body, &st);
  ASSERT_EQ(st, 200) << whole.dump();
  ASSERT_EQ(whole["stop_reason"], "tool_use") << whole.dump();
  ojson use;
  for (const auto& b : whole["content"])
    if (b["type"] == "tool_use") use = b;
  ASSERT_TRUE(use.is_object()) << whole.dump();
  ojson sb = body;
  sb["stream"] = true;
  const auto ev = named_events(srv().post_stream("/v1/messages", sb));
  ASSERT_GE(ev.size(), 6u);
  // message_start, ping, then blocks; a tool_use block: start (name, input {}), input_json_delta
  // pieces, stop; then message_delta and message_stop
  EXPECT_EQ(ev[0].first, "message_start");
  EXPECT_EQ(ev[1].first, "ping");
  EXPECT_EQ(ev[ev.size() - 2].first, "message_delta");
  EXPECT_EQ(ev.back().first, "message_stop");
  EXPECT_EQ(ev[ev.size() - 2].second["delta"]["stop_reason"], "tool_use");
  std::string partial;
  int open = -1, tool_block = -1, pieces = 0, stops = 0;
  for (size_t i = 2; i + 2 < ev.size(); ++i) {
    const auto& [name, d] = ev[i];
    EXPECT_EQ(d["type"], name);
    if (name == "content_block_start") {
      EXPECT_EQ(open, -1) << "blocks do not overlap";
      open = d["index"];
      if (d["content_block"]["type"] == "tool_use") {
        EXPECT_EQ(tool_block, -1) << "one call";
        tool_block = open;
        EXPECT_EQ(d["content_block"]["name"], "get_weather");
        EXPECT_EQ(d["content_block"]["id"], "toolu_" + ev[0].second["message"]["id"].get<std::string>() + "_0");
        EXPECT_EQ(d["content_block"]["input"], ojson::object());
      }
    } else if (name == "content_block_delta") {
      EXPECT_EQ(d["index"], open);
      if (d["index"] == tool_block) {
        EXPECT_EQ(d["delta"]["type"], "input_json_delta");
        partial += d["delta"]["partial_json"].get<std::string>();
        ++pieces;
      }
    } else if (name == "content_block_stop") {
      EXPECT_EQ(d["index"], open);
      if (open == tool_block) ++stops;
      open = -1;
    } else {
      ADD_FAILURE() << "unexpected event " << name;
    }
  }
  EXPECT_EQ(open, -1);
  EXPECT_EQ(stops, 1);
  EXPECT_GE(pieces, 2) << "the input arrives in more than one input_json_delta";
  EXPECT_EQ(partial, use["input"].dump());  // the whole answer's input, as compact text
  EXPECT_EQ(ojson::parse(partial), use["input"]);
  expect_args_fit(ojson::parse(partial));
}

TEST(ServerAgents, ResponsesStreamsFunctionCallArgumentsInPieces) {
  const ojson rtools = ojson::array({{{"type", "function"}, {"name", "get_weather"}, {"parameters", kWeatherSchema}}});
  const ojson body = {{"model", "m"}, {"input", "Weather?"}, {"tools", rtools},
                      {"tool_choice", {{"type", "function"}, {"name", "get_weather"}}},
                      {"reasoning", {{"effort", "none"}}}, {"max_output_tokens", 200}, {"temperature", 0}};
  int st = 0;
  const ojson whole = srv().post("/v1/responses", body, &st);
  ASSERT_EQ(st, 200) << whole.dump();
  ojson wcall;
  for (const auto& it : whole["output"])
    if (it["type"] == "function_call") wcall = it;
  ASSERT_TRUE(wcall.is_object()) << whole.dump();
  const std::string want = wcall["arguments"];
  ojson sb = body;
  sb["stream"] = true;
  const auto ev = named_events(srv().post_stream("/v1/responses", sb));
  ASSERT_GE(ev.size(), 6u);
  EXPECT_EQ(ev[0].first, "response.created");
  EXPECT_EQ(ev[1].first, "response.in_progress");
  EXPECT_EQ(ev.back().first, "response.completed");
  // the call's events: added (arguments ""), deltas, arguments.done, item done -- in this order, nothing between
  std::vector<std::string> kinds;
  std::string args, item_id;
  int index = -1;
  for (size_t i = 0; i < ev.size(); ++i) {
    const auto& [name, d] = ev[i];
    EXPECT_EQ(d["sequence_number"], i);
    const bool of_call = (d.contains("item") && d["item"]["type"] == "function_call") || name.find("function_call") != std::string::npos;
    if (!of_call) continue;
    kinds.push_back(name);
    if (name == "response.output_item.added") {
      index = d["output_index"];
      EXPECT_EQ(d["item"]["name"], "get_weather");
      EXPECT_EQ(d["item"]["arguments"], "");
      EXPECT_EQ(d["item"]["status"], "in_progress");
      EXPECT_EQ(d["item"]["call_id"], "call_" + ev[0].second["response"]["id"].get<std::string>() + "_0");
      item_id = d["item"]["id"];
    } else {
      EXPECT_EQ(d["output_index"], index) << name;
    }
    if (name == "response.function_call_arguments.delta") {
      EXPECT_EQ(d["item_id"], item_id);
      args += d["delta"].get<std::string>();
    }
    if (name == "response.function_call_arguments.done") { EXPECT_EQ(d["arguments"], args); }
    if (name == "response.output_item.done") {
      EXPECT_EQ(d["item"]["arguments"], args);
      EXPECT_EQ(d["item"]["status"], "completed");
    }
  }
  ASSERT_GE(kinds.size(), 5u);
  EXPECT_EQ(kinds.front(), "response.output_item.added");
  for (size_t i = 1; i + 2 < kinds.size(); ++i) EXPECT_EQ(kinds[i], "response.function_call_arguments.delta") << i;
  EXPECT_EQ(kinds[kinds.size() - 2], "response.function_call_arguments.done");
  EXPECT_EQ(kinds.back(), "response.output_item.done");
  EXPECT_GE(kinds.size() - 3, 2u) << "the arguments arrive in more than one delta";
  EXPECT_EQ(args, want);  // the exact text of the whole answer
  const ojson& fin = ev.back().second["response"];
  ojson fcall;
  for (const auto& it : fin["output"])
    if (it["type"] == "function_call") fcall = it;
  ASSERT_TRUE(fcall.is_object()) << fin.dump();
  EXPECT_EQ(fcall["arguments"], want);
  EXPECT_EQ(ojson::parse(args), ojson::parse(want));
  expect_args_fit(ojson::parse(args));
}

// A call cut off by max_tokens: the streamed arguments still end as one JSON object, the stream ends
// like the whole answer (length / incomplete), which lists the call with the same arguments; Responses
// ends the item as incomplete and lists it in the final output, as the whole answer does. A call that
// was complete before the cut is in both, with the same arguments.
TEST(ServerAgents, ToolCallsCutByMaxTokensStreamValidJson) {
  int cut_calls = 0;
  const ojson rtools = ojson::array({{{"type", "function"}, {"name", "get_weather"}, {"parameters", kWeatherSchema}}});
  for (int max_tokens = 40; max_tokens <= 140; max_tokens += 10) {
    SCOPED_TRACE(max_tokens);
    const ojson body = {{"messages", kUser}, {"tools", chat_tools()}, {"tool_choice", kNamedChatChoice}, {"thinking", false},
                        {"max_tokens", max_tokens}, {"temperature", 0}};
    int st = 0;
    const ojson whole = srv().post("/v1/chat/completions", body, &st);
    ASSERT_EQ(st, 200) << whole.dump();
    ojson sb = body;
    sb["stream"] = true;
    bool saw_done = false;
    const std::vector<ojson> ev = sse_events(srv().post_stream("/v1/chat/completions", sb), &saw_done);
    std::string args, finish;
    bool started = false;
    for (const ojson& e : ev) {
      const ojson& c = e["choices"][0];
      if (!c["finish_reason"].is_null()) finish = c["finish_reason"];
      if (!c["delta"].contains("tool_calls")) continue;
      started = true;
      args += c["delta"]["tool_calls"][0]["function"]["arguments"].get<std::string>();
    }
    EXPECT_EQ(finish, whole["choices"][0]["finish_reason"]);
    if (started) {
      const ojson v = ojson::parse(args, nullptr, false);
      EXPECT_TRUE(v.is_object()) << args;
    }
    const ojson& wmsg = whole["choices"][0]["message"];
    EXPECT_EQ(started, wmsg.contains("tool_calls"));  // a cut call too (job_driver.h add_cut_calls)
    if (wmsg.contains("tool_calls")) EXPECT_EQ(args, wmsg["tool_calls"][0]["function"]["arguments"]);
    if (started && finish == "length") ++cut_calls;
    // Responses: the same request
    const ojson rbody = {{"model", "m"}, {"input", kUser}, {"tools", rtools}, {"tool_choice", {{"type", "function"}, {"name", "get_weather"}}},
                         {"reasoning", {{"effort", "none"}}}, {"max_output_tokens", max_tokens}, {"temperature", 0}};
    const ojson rwhole = srv().post("/v1/responses", rbody, &st);
    ASSERT_EQ(st, 200) << rwhole.dump();
    ojson rsb = rbody;
    rsb["stream"] = true;
    const auto rev = named_events(srv().post_stream("/v1/responses", rsb));
    ASSERT_FALSE(rev.empty());
    std::string rargs;
    bool listed = false;
    std::string listed_status;
    for (const auto& it : rwhole["output"])
      if (it["type"] == "function_call") listed = true, listed_status = it["status"];
    for (const auto& [name, d] : rev) {
      if (name == "response.function_call_arguments.delta") rargs += d["delta"].get<std::string>();
      if (name == "response.output_item.done" && d["item"]["type"] == "function_call") {
        EXPECT_EQ(d["item"]["arguments"], rargs);
        EXPECT_TRUE(ojson::parse(rargs, nullptr, false).is_object()) << rargs;
        EXPECT_TRUE(listed);  // announced, so listed (a cut one as "incomplete")
        EXPECT_EQ(d["item"]["status"], listed_status);  // "incomplete" when it was cut
      }
    }
    const ojson& fin = rev.back().second["response"];
    EXPECT_EQ(fin["status"], rwhole["status"]);
    ASSERT_EQ(fin["output"].size(), rwhole["output"].size()) << fin.dump() << "\n" << rwhole.dump();
    for (size_t i = 0; i < fin["output"].size(); ++i) {
      EXPECT_EQ(fin["output"][i]["type"], rwhole["output"][i]["type"]);
      if (fin["output"][i]["type"] == "function_call") { EXPECT_EQ(fin["output"][i]["arguments"], rwhole["output"][i]["arguments"]); }
    }
  }
  // (a named call whose cheapest completion fits in max_tokens is finished: issue 38; the smaller
  // max_tokens here cannot hold the call at all)
  EXPECT_GE(cut_calls, 1) << "some max_tokens cuts the call after it started";
}

// ------------------------------------------------------------------------------------------------
// One tool call at most: chat / Responses `parallel_tool_calls: false`, Anthropic
// `tool_choice.disable_parallel_tool_use: true`.

TEST(ServerAgents, OneCallToolGrammarAcceptsOneCallAndRefusesASecond) {
  // the reference: the K3 template's own rendering of an assistant turn with two calls
  const ojson calls = ojson::array(
      {{{"id", "a"}, {"type", "function"}, {"function", {{"name", "get_weather"}, {"arguments", {{"city", "Oslo"}, {"days", 3}}}}}},
       {{"id", "b"}, {"type", "function"}, {"function", {{"name", "get_time"}, {"arguments", {{"zone", "UTC"}}}}}}});
  const ojson req = {{"messages", ojson::array({{{"role", "user"}, {"content", "x"}},
                                                {{"role", "assistant"}, {"content", ""}, {"tool_calls", calls}}})},
                     {"thinking", false}, {"add_generation_prompt", false}};
  const std::string r = tok::render_chat_request(req);
  const std::string open_resp = "<|open|>message role=\"assistant\"<|sep|><|open|>response<|sep|>";
  const size_t a = r.find(open_resp);
  ASSERT_NE(a, std::string::npos) << r;
  const size_t b = r.find("<|end_of_msg|>", a);
  const std::string two = as_markers(r.substr(a + open_resp.size(), b - a - open_resp.size()));
  const std::string second = std::string(server::kToolOpen) + "call tool=\"get_time\"";
  const size_t at = two.find(second);
  ASSERT_NE(at, std::string::npos) << two;
  const std::string one = two.substr(0, at) + server::kToolClose + "tools" + server::kToolSep;  // the first call alone
  std::vector<server::ToolSpec> specs;
  for (const auto& t : chat_tools()) specs.push_back({t["function"]["name"], t["function"]["parameters"]});
  const std::string tools_open = std::string(server::kToolOpen) + "tools" + server::kToolSep;
  for (const auto mode : {server::ToolMode::Required, server::ToolMode::Auto}) {
    for (const bool one_call : {false, true}) {
      SCOPED_TRACE(testing::Message() << "mode " << static_cast<int>(mode) << " one_call " << one_call);
      // auto: the lazy grammar starts after the trigger; with one call at most it holds from the first token
      const size_t skip = mode == server::ToolMode::Auto && !one_call ? two.find(tools_open) + tools_open.size() : 0;
      const auto g = server::grammar::Grammar::parse(server::tool_gbnf(specs, mode, "", false, one_call));
      server::grammar::Matcher m2(g);  // both calls: only with several calls allowed
      EXPECT_EQ(m2.advance_bytes(two.substr(skip)) && m2.can_end(), !one_call);
      server::grammar::Matcher m1(g);  // one call, then the section's close: always
      EXPECT_TRUE(m1.advance_bytes(one.substr(skip)) && m1.can_end());
      server::grammar::Matcher ms(g);  // after the first call: a second call's start only with several calls
      ASSERT_TRUE(ms.advance_bytes(two.substr(skip, at - skip)));
      EXPECT_EQ(ms.accepts_bytes(server::kToolOpen), !one_call);
      EXPECT_TRUE(ms.accepts_bytes(std::string(server::kToolClose) + "tools" + server::kToolSep));
    }
  }
  // auto with one call at most, from the first token: free response text, then the tools section or
  // the end; a call outside the section cannot start
  const auto g = server::grammar::Grammar::parse(server::tool_gbnf(specs, server::ToolMode::Auto, "", false, true));
  const std::string close_resp = std::string(server::kToolClose) + "response" + server::kToolSep;
  server::grammar::Matcher text(g);
  ASSERT_TRUE(text.advance_bytes("It is sunny, a < b."));
  EXPECT_FALSE(text.accepts_bytes(std::string(server::kToolOpen) + "call"));
  EXPECT_FALSE(text.accepts_bytes("<|"));
  EXPECT_TRUE(text.advance_bytes(close_resp) && text.can_end());
  EXPECT_FALSE(text.accepts_bytes(std::string(server::kToolOpen) + "call"));
  EXPECT_TRUE(text.advance_bytes(one.substr(close_resp.size())) && text.can_end());
  EXPECT_FALSE(text.can_continue() && text.accepts_bytes(server::kToolOpen));
  // thinking: the think channel first
  server::grammar::Matcher th(server::grammar::Grammar::parse(server::tool_gbnf(specs, server::ToolMode::Auto, "", true, true)));
  EXPECT_TRUE(th.advance_bytes(std::string("hmm") + server::kToolClose + "think" + server::kToolSep + server::kToolOpen +
                               "response" + server::kToolSep + "Hi" + one) && th.can_end());
}

namespace {

// A second tiny model (seed 3, as tests/agents/sdk_test.js): greedy, its forced calls go on call after
// call, so several calls in one message are what it writes when they are allowed.
RunningServer& srv3() {
  static RunningServer s([] {
    server::ServerOptions o = agent_opts();
    o.model_path = tiny_gguf(3);
    return o;
  }());
  return s;
}

}  // namespace

TEST(ServerAgents, OneToolCallAtMostInEveryApi) {
  // chat: parallel_tool_calls
  for (const ojson& parallel : {ojson(nullptr), ojson(true), ojson(false)}) {
    SCOPED_TRACE("chat parallel_tool_calls " + parallel.dump());
    ojson body = {{"messages", kUser}, {"tools", chat_tools()}, {"tool_choice", "required"}, {"thinking", false},
                  {"max_tokens", 240}, {"temperature", 0}};
    if (!parallel.is_null()) body["parallel_tool_calls"] = parallel;
    const bool one = parallel == false;
    int st = 0;
    const ojson whole = srv3().post("/v1/chat/completions", body, &st);
    ASSERT_EQ(st, 200) << whole.dump();
    const ojson& msg = whole["choices"][0]["message"];
    ASSERT_TRUE(msg.contains("tool_calls")) << whole.dump();
    if (!one) {  // the premise: with several calls allowed this request gets more than one
      ASSERT_GE(msg["tool_calls"].size(), 2u) << whole.dump();
      continue;
    }
    ASSERT_EQ(msg["tool_calls"].size(), 1u) << whole.dump();
    EXPECT_EQ(whole["choices"][0]["finish_reason"], "tool_calls");
    ojson sb = body;
    sb["stream"] = true;
    bool saw_done = false;
    std::string args, name, finish;
    int starts = 0;
    for (const ojson& e : sse_events(srv3().post_stream("/v1/chat/completions", sb), &saw_done)) {
      const ojson& c = e["choices"][0];
      if (!c["finish_reason"].is_null()) finish = c["finish_reason"];
      if (!c["delta"].contains("tool_calls")) continue;
      for (const ojson& tc : c["delta"]["tool_calls"]) {
        EXPECT_EQ(tc["index"], 0) << e.dump();
        if (tc.contains("id")) ++starts, name = tc["function"]["name"];
        args += tc["function"]["arguments"].get<std::string>();
      }
    }
    EXPECT_TRUE(saw_done);
    EXPECT_EQ(starts, 1);
    EXPECT_EQ(finish, "tool_calls");
    EXPECT_EQ(name, msg["tool_calls"][0]["function"]["name"]);
    EXPECT_EQ(args, msg["tool_calls"][0]["function"]["arguments"]);
  }
  // Anthropic: tool_choice.disable_parallel_tool_use
  ojson atools = ojson::array();
  for (const auto& t : chat_tools()) atools.push_back({{"name", t["function"]["name"]}, {"input_schema", t["function"]["parameters"]}});
  for (const bool disable : {false, true}) {
    SCOPED_TRACE(testing::Message() << "anthropic disable_parallel_tool_use " << disable);
    const ojson body = {{"model", "m"}, {"max_tokens", 240}, {"temperature", 0}, {"messages", kUser}, {"tools", atools},
                        {"tool_choice", {{"type", "any"}, {"disable_parallel_tool_use", disable}}}};
    int st = 0;
    const ojson whole = srv3().post("/v1/messages", body, &st);
    ASSERT_EQ(st, 200) << whole.dump();
    std::vector<ojson> uses;
    for (const auto& b : whole["content"])
      if (b["type"] == "tool_use") uses.push_back(b);
    if (!disable) {
      ASSERT_GE(uses.size(), 2u) << whole.dump();
      continue;
    }
    ASSERT_EQ(uses.size(), 1u) << whole.dump();
    EXPECT_EQ(whole["stop_reason"], "tool_use");
    ojson sb = body;
    sb["stream"] = true;
    std::string partial, name, stop;
    int starts = 0, tool_block = -1;
    for (const auto& [ev, d] : named_events(srv3().post_stream("/v1/messages", sb))) {
      if (ev == "content_block_start" && d["content_block"]["type"] == "tool_use") {
        ++starts;
        tool_block = d["index"];
        name = d["content_block"]["name"];
      }
      if (ev == "content_block_delta" && d["index"] == tool_block) partial += d["delta"]["partial_json"].get<std::string>();
      if (ev == "message_delta") stop = d["delta"]["stop_reason"];
    }
    EXPECT_EQ(starts, 1);
    EXPECT_EQ(stop, "tool_use");
    EXPECT_EQ(name, uses[0]["name"]);
    EXPECT_EQ(partial, uses[0]["input"].dump());
  }
  // Responses: parallel_tool_calls, echoed
  ojson rtools = ojson::array();
  for (const auto& t : chat_tools())
    rtools.push_back({{"type", "function"}, {"name", t["function"]["name"]}, {"parameters", t["function"]["parameters"]}});
  for (const ojson& parallel : {ojson(nullptr), ojson(false)}) {
    SCOPED_TRACE("responses parallel_tool_calls " + parallel.dump());
    ojson body = {{"model", "m"}, {"input", kUser}, {"tools", rtools}, {"tool_choice", "required"},
                  {"reasoning", {{"effort", "none"}}}, {"max_output_tokens", 240}, {"temperature", 0}};
    if (!parallel.is_null()) body["parallel_tool_calls"] = parallel;
    const bool one = parallel == false;
    int st = 0;
    const ojson whole = srv3().post("/v1/responses", body, &st);
    ASSERT_EQ(st, 200) << whole.dump();
    EXPECT_EQ(whole["parallel_tool_calls"], !one);  // the real value (default true)
    std::vector<ojson> calls;
    for (const auto& it : whole["output"])
      if (it["type"] == "function_call") calls.push_back(it);
    if (!one) {
      ASSERT_GE(calls.size(), 2u) << whole.dump();
      continue;
    }
    ASSERT_EQ(calls.size(), 1u) << whole.dump();
    EXPECT_EQ(whole["status"], "completed");
    ojson sb = body;
    sb["stream"] = true;
    const auto ev = named_events(srv3().post_stream("/v1/responses", sb));
    ASSERT_FALSE(ev.empty());
    int added = 0;
    std::string args;
    for (const auto& [name, d] : ev) {
      if (name == "response.output_item.added" && d["item"]["type"] == "function_call") ++added;
      if (name == "response.function_call_arguments.delta") args += d["delta"].get<std::string>();
    }
    EXPECT_EQ(added, 1);
    EXPECT_EQ(args, calls[0]["arguments"]);
    EXPECT_EQ(ev.front().second["response"]["parallel_tool_calls"], false);
    ASSERT_EQ(ev.back().first, "response.completed");
    const ojson& fin = ev.back().second["response"];
    EXPECT_EQ(fin["parallel_tool_calls"], false);
    std::vector<ojson> fcalls;
    for (const auto& it : fin["output"])
      if (it["type"] == "function_call") fcalls.push_back(it);
    ASSERT_EQ(fcalls.size(), 1u) << fin.dump();
    EXPECT_EQ(fcalls[0]["name"], calls[0]["name"]);
    EXPECT_EQ(fcalls[0]["arguments"], calls[0]["arguments"]);
  }
}

TEST(ServerAgents, OneToolCallFieldsThatAreNotBooleansAre400) {
  const std::vector<ojson> bad = {"false", 0, ojson::array(), ojson::object()};
  for (const ojson& v : bad) {
    SCOPED_TRACE(v.dump());
    int st = 0;
    ojson r = srv().post("/v1/chat/completions",
                         ojson{{"messages", kUser}, {"tools", chat_tools()}, {"max_tokens", 2}, {"parallel_tool_calls", v}}, &st);
    EXPECT_EQ(st, 400) << r.dump();
    EXPECT_EQ(r["error"]["param"], "parallel_tool_calls") << r.dump();
    r = srv().post("/v1/responses", ojson{{"input", "hi"}, {"max_output_tokens", 2}, {"parallel_tool_calls", v}}, &st);
    EXPECT_EQ(st, 400) << r.dump();
    EXPECT_EQ(r["error"]["param"], "parallel_tool_calls") << r.dump();
    const ojson atools = ojson::array({{{"name", "get_weather"}, {"input_schema", kWeatherSchema}}});
    r = srv().post("/v1/messages", ojson{{"max_tokens", 2}, {"messages", kUser}, {"tools", atools},
                                         {"tool_choice", {{"type", "auto"}, {"disable_parallel_tool_use", v}}}}, &st);
    expect_anthropic_error(r, st, 400, "tool_choice.disable_parallel_tool_use");
  }
}

// tool_choice auto with one call at most: the grammar holds from the first token (free text, then at
// most one call); the answers stay answers (no dead end), streamed as whole.
TEST(ServerAgents, OneToolCallAutoHoldsFromTheFirstToken) {
  for (const bool thinking : {false, true}) {
    for (uint64_t seed = 1; seed <= 3; ++seed) {
      SCOPED_TRACE(testing::Message() << "thinking " << thinking << " seed " << seed);
      const ojson body = {{"messages", kUser}, {"tools", chat_tools()}, {"thinking", thinking}, {"max_tokens", 60},
                          {"seed", seed}, {"parallel_tool_calls", false}};
      int st = 0;
      const ojson r = srv3().post("/v1/chat/completions", body, &st);
      ASSERT_EQ(st, 200) << r.dump();
      const ojson& c = r["choices"][0];
      const std::string fr = c["finish_reason"];
      EXPECT_TRUE(fr == "stop" || fr == "length" || fr == "tool_calls") << r.dump();
      if (c["message"].contains("tool_calls")) { EXPECT_EQ(c["message"]["tool_calls"].size(), 1u) << r.dump(); }
      const std::string content = c["message"]["content"].is_string() ? c["message"]["content"].get<std::string>() : "";
      EXPECT_EQ(content.find("<|"), std::string::npos) << r.dump();
      ojson sb = body;
      sb["stream"] = true;
      std::string text, finish;
      bool saw_done = false;
      for (const ojson& e : sse_events(srv3().post_stream("/v1/chat/completions", sb), &saw_done)) {
        const ojson& ch = e["choices"][0];
        if (!ch["finish_reason"].is_null()) finish = ch["finish_reason"];
        if (ch["delta"].contains("content") && ch["delta"]["content"].is_string()) text += ch["delta"]["content"].get<std::string>();
      }
      EXPECT_EQ(finish, fr);
      EXPECT_EQ(text, content);
    }
  }
}
