// `kimi serve`: what the one job driver (src/server/job_driver.h) gives every API alike — progress
// events during a long prefill that the API's clients count as activity, a forced tool call cut by
// max_tokens in the whole answer as in the stream — and the translation layers' own words: errors
// that name the Messages / Responses request's fields (with the right index after a skipped server
// tool), tool results only in the next user message, Claude Code's billing block kept out of the
// prompt (the prompt cache is reused whatever its per-request hash says).
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "server_fixture.h"

using namespace kimi;
using namespace kimi::test;

namespace {

const ojson kUser = ojson::array({{{"role", "user"}, {"content", "Hello, who are you?"}}});

const ojson kWeatherSchema = ojson::parse(R"({"type":"object","properties":{
  "city":{"enum":["Paris","Oslo"]},"days":{"type":"integer","minimum":1},"units":{"type":"string","enum":["c","f"]},
  "metric":{"type":"boolean"}},"required":["city","days"],"additionalProperties":false})");

RunningServer& srv() {
  static RunningServer s([] {
    server::ServerOptions o = server_opts();
    o.sched.parallel = 2;
    o.quiet = true;
    return o;
  }());
  return s;
}

// A prompt of many chunks: one slot, no prompt cache, 16-token chunks one per step.
server::ServerOptions slow_prefill_opts() {
  server::ServerOptions o = cold_server_opts();
  o.ctx = 4096;
  o.sched.chunk = 16;
  o.sched.max_chunks = 1;
  return o;
}

std::string long_text() {
  std::string s;
  for (int i = 0; i < 12; ++i) s += "The quick brown fox " + std::to_string(i) + " jumps over the lazy dog. ";
  return s;
}

// The progress reports of a stream before its first generated text: each {"total","cache","processed","time_ms"}.
struct ProgressSeen {
  std::vector<ojson> before_first_token;
  bool any_token = false;
};

void check_progress(const ProgressSeen& p, int prompt_tokens, const char* api) {
  SCOPED_TRACE(api);
  ASSERT_FALSE(p.before_first_token.empty()) << "no progress event before the first token";
  int last = -1;
  for (const ojson& g : p.before_first_token) {
    EXPECT_EQ(g["total"], prompt_tokens) << g.dump();
    EXPECT_EQ(g["cache"], 0) << g.dump();
    const int done = g["processed"].get<int>();
    EXPECT_GT(done, 0) << g.dump();
    EXPECT_LT(done, prompt_tokens) << g.dump();
    EXPECT_TRUE(done % 16 == 0 || done == prompt_tokens - 1) << "whole 16-token chunks (the last one ends a token early: "
                                                               "the turn-boundary snapshot): " << g.dump();
    EXPECT_GE(done, last);
    last = done;
    EXPECT_GE(g["time_ms"].get<double>(), 0);
  }
}

}  // namespace

// ------------------------------------------------------------------------------------------------
// Progress during a long prefill: every API streams events its clients count as activity, with the
// prompt tokens done of the total, before the first token.

TEST(ServerDriver, LongPrefillStreamsProgressInEveryApi) {
  RunningServer s(slow_prefill_opts());
  const std::string text = long_text();
  const ojson msgs = ojson::array({{{"role", "user"}, {"content", text}}});
  int st = 0;
  const ojson tk = s.post("/v1/chat/completions", ojson{{"messages", msgs}, {"max_tokens", 1}, {"thinking", false}}, &st);
  ASSERT_EQ(st, 200) << tk.dump();
  const int n_chat = tk["usage"]["prompt_tokens"].get<int>();
  ASSERT_GT(n_chat, 5 * 16) << "the prompt takes several chunks";

  {  // chat completions: chunks with an empty delta and `prompt_progress`
    ProgressSeen p;
    bool done = false;
    const ojson body = {{"messages", msgs}, {"max_tokens", 4}, {"stream", true}, {"thinking", false}, {"temperature", 0},
                        {"ignore_eos", true}};
    for (const ojson& e : sse_events(s.post_stream("/v1/chat/completions", body), &done)) {
      if (e.contains("prompt_progress")) {
        ASSERT_EQ(e["object"], "chat.completion.chunk");
        ASSERT_EQ(e["choices"].size(), 1u) << e.dump();
        EXPECT_EQ(e["choices"][0]["delta"], ojson::object());
        if (!p.any_token) p.before_first_token.push_back(e["prompt_progress"]);
      } else if (!e["choices"].empty() && e["choices"][0]["delta"].contains("content") &&
                 !e["choices"][0]["delta"]["content"].get<std::string>().empty()) {
        p.any_token = true;
      } else if (!e["choices"].empty() && e["choices"][0]["delta"].contains("reasoning_content")) {
        p.any_token = true;
      }
    }
    EXPECT_TRUE(done);
    check_progress(p, n_chat, "chat");
  }
  {  // completions: the same on text_completion chunks
    const ojson pt = s.post("/tokenize", ojson{{"content", text}}, &st);
    ProgressSeen p;
    bool done = false;
    const ojson body = {{"prompt", text}, {"max_tokens", 8}, {"stream", true}, {"temperature", 0}, {"ignore_eos", true}};
    for (const ojson& e : sse_events(s.post_stream("/v1/completions", body), &done)) {
      if (e.contains("prompt_progress")) {
        EXPECT_EQ(e["choices"][0]["text"], "");
        if (!p.any_token) p.before_first_token.push_back(e["prompt_progress"]);
      } else if (!e["choices"].empty() && !e["choices"][0]["text"].get<std::string>().empty()) {
        p.any_token = true;
      }
    }
    EXPECT_TRUE(done);
    check_progress(p, pt["count"].get<int>(), "completions");
  }
  {  // Anthropic: ping events with prompt_progress
    ProgressSeen p;
    int n_prompt = 0;
    const ojson body = {{"model", "k"}, {"max_tokens", 4}, {"stream", true}, {"messages", msgs}, {"temperature", 0}};
    for (const auto& [name, d] : named_events(s.post_stream("/v1/messages", body))) {
      if (name == "message_start") n_prompt = d["message"]["usage"]["input_tokens"].get<int>();
      if (name == "ping" && d.contains("prompt_progress") && !p.any_token) p.before_first_token.push_back(d["prompt_progress"]);
      if (name == "content_block_delta") p.any_token = true;
    }
    check_progress(p, n_prompt, "anthropic");
  }
  {  // Responses: response.in_progress events (real events, not SSE comments) with prompt_progress
    ProgressSeen p;
    int n_prompt = 0, last_seq = -1;
    const ojson body = {{"model", "k"}, {"max_output_tokens", 4}, {"stream", true}, {"input", text}, {"temperature", 0}};
    for (const auto& [name, d] : named_events(s.post_stream("/v1/responses", body))) {
      EXPECT_EQ(d["sequence_number"].get<int>(), last_seq + 1);
      last_seq = d["sequence_number"].get<int>();
      if (name == "response.in_progress" && d.contains("prompt_progress")) {
        EXPECT_EQ(d["response"]["status"], "in_progress");
        if (!p.any_token) p.before_first_token.push_back(d["prompt_progress"]);
      }
      if (name == "response.output_text.delta" || name == "response.reasoning_text.delta") p.any_token = true;
      if (name == "response.completed" || name == "response.incomplete") n_prompt = d["response"]["usage"]["input_tokens"].get<int>();
    }
    check_progress(p, n_prompt, "responses");
  }
}

// ------------------------------------------------------------------------------------------------
// A forced tool call cut by max_tokens: in the whole answer of every API as in its stream (the
// call with the arguments streamed so far, closed to one JSON object by the parser).

TEST(ServerDriver, CutToolCallIsInTheWholeAnswerOfEveryApi) {
  const ojson chat_tools = ojson::array({{{"type", "function"}, {"function", {{"name", "get_weather"}, {"parameters", kWeatherSchema}}}}});
  int cut = 0;
  for (int max_tokens = 40; max_tokens <= 140; max_tokens += 10) {
    SCOPED_TRACE(max_tokens);
    int st = 0;
    // chat
    const ojson body = {{"messages", kUser}, {"tools", chat_tools}, {"thinking", false}, {"max_tokens", max_tokens}, {"temperature", 0},
                        {"tool_choice", {{"type", "function"}, {"function", {{"name", "get_weather"}}}}}};
    const ojson whole = srv().post("/v1/chat/completions", body, &st);
    ASSERT_EQ(st, 200) << whole.dump();
    ojson sb = body;
    sb["stream"] = true;
    std::string args, finish;
    bool started = false;
    for (const ojson& e : sse_events(srv().post_stream("/v1/chat/completions", sb), nullptr)) {
      if (e["choices"].empty()) continue;
      const ojson& c = e["choices"][0];
      if (!c["finish_reason"].is_null()) finish = c["finish_reason"];
      if (!c["delta"].contains("tool_calls")) continue;
      started = true;
      args += c["delta"]["tool_calls"][0]["function"]["arguments"].get<std::string>();
    }
    EXPECT_EQ(finish, whole["choices"][0]["finish_reason"]);
    const ojson& wmsg = whole["choices"][0]["message"];
    ASSERT_EQ(started, wmsg.contains("tool_calls")) << whole.dump();
    if (!started) continue;
    EXPECT_EQ(wmsg["tool_calls"][0]["function"]["name"], "get_weather");
    EXPECT_EQ(wmsg["tool_calls"][0]["function"]["arguments"], args);
    EXPECT_TRUE(ojson::parse(args, nullptr, false).is_object()) << args;
    if (finish == "length") EXPECT_TRUE(ojson::parse(args, nullptr, false).is_object());

    // Anthropic: the tool_use block with the input streamed so far
    const ojson tools_a = ojson::array({{{"name", "get_weather"}, {"input_schema", kWeatherSchema}}});
    const ojson ab = {{"model", "k"}, {"max_tokens", max_tokens}, {"messages", kUser}, {"tools", tools_a}, {"temperature", 0},
                      {"tool_choice", {{"type", "tool"}, {"name", "get_weather"}}}};
    const ojson aw = srv().post("/v1/messages", ab, &st);
    ASSERT_EQ(st, 200) << aw.dump();
    ojson asb = ab;
    asb["stream"] = true;
    std::string ain, stop;
    for (const auto& [name, d] : named_events(srv().post_stream("/v1/messages", asb))) {
      if (name == "content_block_delta" && d["delta"]["type"] == "input_json_delta") ain += d["delta"]["partial_json"].get<std::string>();
      if (name == "message_delta") stop = d["delta"]["stop_reason"];
    }
    EXPECT_EQ(stop, aw["stop_reason"]);
    EXPECT_TRUE(stop == "max_tokens" || stop == "tool_use") << stop;
    const ojson& last = aw["content"].back();
    ASSERT_EQ(last["type"], "tool_use") << aw.dump();
    EXPECT_EQ(last["input"], ojson::parse(ain)) << ain;

    // Responses: the function_call item, "incomplete" when cut, in the whole answer and in the
    // stream's final response object alike
    const ojson rtools = ojson::array({{{"type", "function"}, {"name", "get_weather"}, {"parameters", kWeatherSchema}}});
    const ojson rb = {{"model", "k"}, {"input", kUser}, {"tools", rtools}, {"tool_choice", {{"type", "function"}, {"name", "get_weather"}}},
                      {"reasoning", {{"effort", "none"}}}, {"max_output_tokens", max_tokens}, {"temperature", 0}};
    const ojson rw = srv().post("/v1/responses", rb, &st);
    ASSERT_EQ(st, 200) << rw.dump();
    ojson rsb = rb;
    rsb["stream"] = true;
    const auto rev = named_events(srv().post_stream("/v1/responses", rsb));
    ASSERT_FALSE(rev.empty());
    const ojson& fin = rev.back().second["response"];
    EXPECT_EQ(rev.back().first, "response." + rw["status"].get<std::string>());
    // the call as the stream announced it: cut (its item "incomplete", the response too) or completed
    std::string announced;
    for (const auto& [name, d] : rev)
      if (name == "response.output_item.done" && d["item"]["type"] == "function_call") announced = d["item"]["status"];
    ASSERT_FALSE(announced.empty());
    cut += announced == "incomplete";
    for (const ojson* o : {&rw, &fin}) {
      if (announced == "incomplete") EXPECT_EQ((*o)["status"], "incomplete");
      ASSERT_FALSE((*o)["output"].empty()) << o->dump();
      const ojson& item = (*o)["output"].back();
      ASSERT_EQ(item["type"], "function_call") << o->dump();
      EXPECT_EQ(item["status"], announced);
      EXPECT_TRUE(ojson::parse(item["arguments"].get<std::string>(), nullptr, false).is_object()) << item.dump();
    }
    EXPECT_EQ(fin["output"].back()["arguments"], rw["output"].back()["arguments"]);
    EXPECT_EQ(fin["output"].size(), rw["output"].size());
  }
  EXPECT_GE(cut, 1) << "some max_tokens cuts the call after it started";
}

// ------------------------------------------------------------------------------------------------
// Errors of /v1/messages and /v1/responses name their own fields

TEST(ServerDriver, AgentApiErrorsNameTheirOwnFields) {
  auto message_of = [](const ojson& r) { return r.contains("error") ? r["error"].value("message", "") : std::string(); };
  const ojson bad_schema = {{"type", "bogus"}};
  int st = 0;
  {  // a server tool first: the bad custom tool is tools[1], its schema `input_schema`
    const ojson body = {{"model", "k"}, {"max_tokens", 4}, {"messages", kUser},
                        {"tools", ojson::array({{{"type", "web_search_20250305"}, {"name", "web_search"}},
                                                {{"name", "f"}, {"input_schema", bad_schema}}})}};
    const ojson r = srv().post("/v1/messages", body, &st);
    EXPECT_EQ(st, 400);
    EXPECT_NE(message_of(r).find("tools[1].input_schema"), std::string::npos) << r.dump();
    EXPECT_EQ(message_of(r).find("function"), std::string::npos) << r.dump();
  }
  {  // a tool_use block with a name OpenAI's rule refuses: messages[1].content[1].name
    const ojson body = {{"model", "k"}, {"max_tokens", 4},
                        {"messages", ojson::array({{{"role", "user"}, {"content", "hi"}},
                                                   {{"role", "assistant"}, {"content", ojson::array({{{"type", "text"}, {"text", "x"}},
                                                       {{"type", "tool_use"}, {"id", "t1"}, {"name", "bad name!"}, {"input", ojson::object()}}})}},
                                                   {{"role", "user"}, {"content", ojson::array({{{"type", "tool_result"}, {"tool_use_id", "t1"}, {"content", "ok"}}})}}})}};
    const ojson r = srv().post("/v1/messages", body, &st);
    EXPECT_EQ(st, 400);
    EXPECT_NE(message_of(r).find("messages[1].content[1].name"), std::string::npos) << r.dump();
    EXPECT_EQ(message_of(r).find("tool_calls"), std::string::npos) << r.dump();
  }
  {  // Responses: a hosted tool first, the function's schema is tools[1].parameters
    const ojson body = {{"model", "k"}, {"input", "hi"},
                        {"tools", ojson::array({{{"type", "web_search"}}, {{"type", "function"}, {"name", "f"}, {"parameters", bad_schema}}})}};
    const ojson r = srv().post("/v1/responses", body, &st);
    EXPECT_EQ(st, 400);
    EXPECT_EQ(r["error"]["param"].get<std::string>().rfind("tools[1].parameters", 0), 0u) << r.dump();
    EXPECT_NE(message_of(r).find("tools[1].parameters"), std::string::npos) << r.dump();
  }
  {  // Responses: a function_call item with a bad name is input[1].name
    const ojson body = {{"model", "k"},
                        {"input", ojson::array({{{"role", "user"}, {"content", "hi"}},
                                                {{"type", "function_call"}, {"call_id", "c1"}, {"name", "bad name!"}, {"arguments", "{}"}},
                                                {{"type", "function_call_output"}, {"call_id", "c1"}, {"output", "ok"}}})}};
    const ojson r = srv().post("/v1/responses", body, &st);
    EXPECT_EQ(st, 400);
    EXPECT_EQ(r["error"]["param"], "input[1].name") << r.dump();
    EXPECT_NE(message_of(r).find("input[1].name"), std::string::npos) << r.dump();
  }
  {  // a tool_result in a later user message than the next one: 400 at the message that lacks it
    const ojson body = {{"model", "k"}, {"max_tokens", 4},
                        {"messages", ojson::array({{{"role", "user"}, {"content", "hi"}},
                                                   {{"role", "assistant"}, {"content", ojson::array({{{"type", "tool_use"}, {"id", "t1"}, {"name", "f"}, {"input", ojson::object()}}})}},
                                                   {{"role", "user"}, {"content", "what now?"}},
                                                   {{"role", "user"}, {"content", ojson::array({{{"type", "tool_result"}, {"tool_use_id", "t1"}, {"content", "ok"}}})}}})}};
    const ojson r = srv().post("/v1/messages", body, &st);
    EXPECT_EQ(st, 400) << r.dump();
    EXPECT_NE(message_of(r).find("messages[2]"), std::string::npos) << r.dump();
    EXPECT_NE(message_of(r).find("tool_use 't1' has no tool_result"), std::string::npos) << r.dump();
  }
}

// ------------------------------------------------------------------------------------------------
// Claude Code's `x-anthropic-billing-header: ...` system[0] block (a per-request cch= hash in some
// versions) is not part of the prompt: two requests that differ only there reuse the cache.

TEST(ServerDriver, BillingHeaderBlockDoesNotBustThePromptCache) {
  server::ServerOptions o = server_opts();
  o.ctx = 4096;
  o.sched.parallel = 1;
  o.quiet = true;
  RunningServer s(o);
  auto body = [](const std::string& cch) {
    return ojson{{"model", "k"}, {"max_tokens", 2}, {"temperature", 0},
                 {"system", ojson::array({{{"type", "text"}, {"text", "x-anthropic-billing-header: cc_version=2.1.332.abc; cc_entrypoint=cli; cch=" + cch + ";"}},
                                          {{"type", "text"}, {"text", "You are Claude Code. " + long_text()}}})},
                 {"messages", ojson::array({{{"role", "user"}, {"content", "Say hi"}}})}};
  };
  int st = 0;
  const ojson c1 = s.post("/v1/messages/count_tokens", body("1f2e3"), &st);
  ASSERT_EQ(st, 200) << c1.dump();
  const ojson c2 = s.post("/v1/messages/count_tokens", body("9a8b7c6d"), &st);
  EXPECT_EQ(c1["input_tokens"], c2["input_tokens"]) << "the block's text is not rendered";
  const ojson a = s.post("/v1/messages", body("1f2e3"), &st);
  ASSERT_EQ(st, 200) << a.dump();
  EXPECT_EQ(a["usage"]["cache_read_input_tokens"], 0);
  const ojson b = s.post("/v1/messages", body("9a8b7c6d"), &st);
  ASSERT_EQ(st, 200) << b.dump();
  const int total = b["usage"]["input_tokens"].get<int>() + b["usage"]["cache_read_input_tokens"].get<int>();
  EXPECT_EQ(total, c1["input_tokens"].get<int>());
  EXPECT_GE(b["usage"]["cache_read_input_tokens"].get<int>(), total - 1) << b.dump();
  // the same text elsewhere than system[0] is the user's own: it stays
  ojson moved = body("1");
  moved["system"] = ojson::array({moved["system"][1], moved["system"][0]});
  const ojson c3 = s.post("/v1/messages/count_tokens", moved, &st);
  EXPECT_GT(c3["input_tokens"].get<int>(), c1["input_tokens"].get<int>());
}
