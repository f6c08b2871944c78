// Kimi-K3 chat format: renders checked by hand against the template text (Kimi-K3.jinja as
// llama.cpp ships it), one feature per test, and the streaming output parser.
#include <gtest/gtest.h>

#include "tokenizer/chat.h"
#include "util/error.h"

using namespace kimi::tok;

namespace {
std::string render(const char* json) { return render_chat_request(ojson::parse(json)); }
std::string error_of(const char* json) {
  try {
    render(json);
  } catch (const kimi::Error& e) {
    return e.what();
  }
  return "(no error)";
}
const std::string EFFORT_MAX =
    "<|open|>message role=\"system\" type=\"thinking-effort\"<|sep|>`thinking_effort` guides on how much to think in "
    "your thinking channel (not including the response channel), supported values include `low`, `medium`, `high`, "
    "and `max`.\nNow the system is invoked with `thinking_effort=max`.<|close|>message<|sep|><|end_of_msg|>";
const std::string GEN_THINK = "<|open|>message role=\"assistant\"<|sep|><|open|>think<|sep|>";
const std::string GEN_RESP = "<|open|>message role=\"assistant\"<|sep|><|open|>response<|sep|>";
}  // namespace

TEST(ChatRender, DefaultsThinkingOnEffortMax) {
  EXPECT_EQ(render(R"({"messages":[{"role":"system","content":"S"},{"role":"user","content":"Hi"}]})"),
            EFFORT_MAX + "<|open|>message role=\"system\"<|sep|>S<|close|>message<|sep|><|end_of_msg|>" +
                "<|open|>message role=\"user\"<|sep|>Hi<|close|>message<|sep|><|end_of_msg|>" + GEN_THINK);
}

TEST(ChatRender, ThinkingOffAndEffortValues) {
  EXPECT_EQ(render(R"({"messages":[{"role":"user","content":"Hi"},{"role":"assistant","content":"Yo","reasoning_content":"r"}],
                       "thinking":false,"add_generation_prompt":true})"),
            "<|open|>message role=\"user\"<|sep|>Hi<|close|>message<|sep|><|end_of_msg|>"
            "<|open|>message role=\"assistant\"<|sep|><|open|>response<|sep|>Yo<|close|>response<|sep|>"
            "<|close|>message<|sep|><|end_of_msg|>" + GEN_RESP);
  const std::string low = render(R"({"messages":[],"thinking_effort":"low"})");
  EXPECT_NE(low.find("Now the system is invoked with `thinking_effort=low`."), std::string::npos);
  EXPECT_EQ(render(R"({"messages":[],"thinking_effort":null})"), GEN_THINK);  // null: no effort message
  EXPECT_EQ(error_of(R"({"messages":[],"thinking_effort":"extreme"})"),
            "Unsupported thinking_effort=extreme; supported values are low, medium, high, and max.");
  EXPECT_EQ(error_of(R"({"messages":[],"thinking_effort":3})"),
            "Unsupported thinking_effort=3; supported values are low, medium, high, and max.");
  EXPECT_EQ(render(R"({"messages":[],"thinking":false,"thinking_effort":"extreme"})"), GEN_RESP);  // not checked when off
  EXPECT_EQ(render(R"({"messages":[],"thinking":false,"add_generation_prompt":false})"), "");
}

TEST(ChatRender, ContentPartsNamesAndEscaping) {
  EXPECT_EQ(render(R"({"messages":[{"role":"user","name":"a&b \"c\"","content":[{"type":"text","text":"x"},
                        {"type":"image_url","image_url":{"url":"u"}},{"type":"text","text":"y"},{"type":"text"}]}],
                       "thinking":false,"add_generation_prompt":false})"),
            "<|open|>message role=\"user\" name=\"a&amp;b &quot;c&quot;\"<|sep|>x<|kimi_image_placeholder|>y"
            "<|close|>message<|sep|><|end_of_msg|>");
  // unknown roles and non-object messages are skipped, as the template skips them
  EXPECT_EQ(render(R"({"messages":[{"role":"developer","content":"d"},5],"thinking":false,"add_generation_prompt":false})"), "");
}

TEST(ChatRender, ToolDeclarationSortedKeys) {
  const std::string out = render(R"({"messages":[],"thinking":false,"add_generation_prompt":false,
      "tools":[{"type":"function","function":{"name":"get","description":"Get ü <x> & 'y'",
      "parameters":{"type":"object","required":["b"],"properties":{"b":{"type":"string"},"A":{"type":"number","default":1.5}}}}}]})");
  EXPECT_EQ(out,
            "<|open|>message role=\"system\" type=\"tool-declare\"<|sep|># Tools\nHere are the available tools, described "
            "in JSONSchema.\n\n```json\n"
            R"([{"function":{"description":"Get ü <x> & 'y'","name":"get","parameters":{"properties":{"A":{"default":1.5,"type":"number"},"b":{"type":"string"}},"required":["b"],"type":"object"}},"type":"function"}])"
            "\n```<|close|>message<|sep|><|end_of_msg|>");
  // a system message carrying tools declares them dynamically
  const std::string dyn = render(R"({"messages":[{"role":"system","tools":[{"name":"t"}]}],"thinking":false,"add_generation_prompt":false})");
  EXPECT_EQ(dyn, "<|open|>message role=\"system\" type=\"tool-declare\"<|sep|>## New Tools Available\nThe system "
                 "dynamically extends the toolset via lazy-loading.\nYou have access to all existing and extended "
                 "tools.\nHere are the specs for the extended tools.\n\n```json\n[{\"name\":\"t\"}]\n```"
                 "<|close|>message<|sep|><|end_of_msg|>");
}

TEST(ChatRender, AssistantReasoningAndTypedToolCalls) {
  const std::string out = render(R"({"messages":[{"role":"assistant","reasoning_content":"think\n","content":"ok",
      "tool_calls":[{"id":"c1","type":"function","function":{"name":"f","arguments":{"s":"a\"b","i":3,"x":1.0,"e":1e-05,
      "t":true,"n":null,"o":{"k":[1,"v"]},"l":[1,2]}}},
      {"id":"c2","function":{"name":"g","arguments":"{\"q\": 1}"}}, {"function":{"name":"h","arguments":""}}]}],
      "add_generation_prompt":false,"thinking_effort":null})");
  EXPECT_EQ(out,
            "<|open|>message role=\"assistant\"<|sep|><|open|>think<|sep|>think\n<|close|>think<|sep|>"
            "<|open|>response<|sep|>ok<|close|>response<|sep|><|open|>tools<|sep|>"
            "<|open|>call tool=\"f\" index=\"1\"<|sep|>"
            "<|open|>argument key=\"s\" type=\"string\"<|sep|>a\"b<|close|>argument<|sep|>"
            "<|open|>argument key=\"i\" type=\"number\"<|sep|>3<|close|>argument<|sep|>"
            "<|open|>argument key=\"x\" type=\"number\"<|sep|>1.0<|close|>argument<|sep|>"
            "<|open|>argument key=\"e\" type=\"number\"<|sep|>1e-05<|close|>argument<|sep|>"
            "<|open|>argument key=\"t\" type=\"boolean\"<|sep|>true<|close|>argument<|sep|>"
            "<|open|>argument key=\"n\" type=\"null\"<|sep|>null<|close|>argument<|sep|>"
            "<|open|>argument key=\"o\" type=\"object\"<|sep|>{\"k\": [1, \"v\"]}<|close|>argument<|sep|>"
            "<|open|>argument key=\"l\" type=\"array\"<|sep|>[1, 2]<|close|>argument<|sep|>"
            "<|close|>call<|sep|>"
            "<|open|>call tool=\"g\" index=\"2\"<|sep|><|open|>json type=\"object\"<|sep|>{\"q\": 1}<|close|>json<|sep|>"
            "<|close|>call<|sep|>"
            "<|open|>call tool=\"h\" index=\"3\"<|sep|><|close|>call<|sep|>"
            "<|close|>tools<|sep|><|close|>message<|sep|><|end_of_msg|>");
  // empty / whitespace reasoning gives an empty think block
  EXPECT_EQ(render(R"({"messages":[{"role":"assistant","content":"a","reasoning_content":"  "}],"add_generation_prompt":false,"thinking_effort":null})"),
            "<|open|>message role=\"assistant\"<|sep|><|open|>think<|sep|><|close|>think<|sep|><|open|>response<|sep|>a"
            "<|close|>response<|sep|><|close|>message<|sep|><|end_of_msg|>");
  EXPECT_EQ(error_of(R"({"messages":[{"role":"assistant","tool_calls":[{"function":{"arguments":{}}}]}]})"),
            "Kimi K3 tool calls require a function name.");
  EXPECT_EQ(error_of(R"({"messages":[{"role":"assistant","tool_calls":[{"name":"f","arguments":[1]}]}]})"),
            "Kimi K3 tool call arguments must be a mapping or a JSON object string.");
  EXPECT_EQ(error_of(R"({"messages":[{"role":"assistant","tool_calls":["x"]}]})"), "Kimi K3 tool calls must be mappings.");
}

TEST(ChatRender, ToolResultsResolvedByIdOrOrder) {
  // ids match: results are emitted in tool_call order with the call's function name
  const std::string by_id = render(R"({"messages":[
      {"role":"assistant","content":"","tool_calls":[{"id":"a","function":{"name":"fa","arguments":{}}},{"id":"b","function":{"name":"fb","arguments":{}}}]},
      {"role":"tool","tool_call_id":"b","content":"B"},{"role":"tool","tool_call_id":"a","content":"A"}],
      "thinking":false,"add_generation_prompt":false})");
  const std::string results = by_id.substr(by_id.find("<|end_of_msg|>") + 14);
  EXPECT_EQ(results,
            "<|open|>message role=\"tool\" tool=\"fa\" index=\"1\"<|sep|>A<|close|>message<|sep|><|end_of_msg|>"
            "<|open|>message role=\"tool\" tool=\"fb\" index=\"2\"<|sep|>B<|close|>message<|sep|><|end_of_msg|>");
  // no ids: in order, names from `name` or from the calls by position
  const std::string by_order = render(R"({"messages":[
      {"role":"assistant","content":"","tool_calls":[{"function":{"name":"fa","arguments":{}}},{"function":{"name":"fb","arguments":{}}}]},
      {"role":"tool","content":[{"type":"text","text":"1"}]},{"role":"tool","name":"own","content":"2"}],
      "thinking":false,"add_generation_prompt":false})");
  EXPECT_EQ(by_order.substr(by_order.find("<|end_of_msg|>") + 14),
            "<|open|>message role=\"tool\" tool=\"fa\" index=\"1\"<|sep|>1<|close|>message<|sep|><|end_of_msg|>"
            "<|open|>message role=\"tool\" tool=\"own\" index=\"2\"<|sep|>2<|close|>message<|sep|><|end_of_msg|>");
  EXPECT_NE(error_of(R"({"messages":[{"role":"tool","content":"x"}]})").find("Kimi K3 tool messages need a resolvable tool name"),
            std::string::npos);
}

TEST(ChatRender, ToolChoiceAndResponseFormat) {
  const char* tail = "\"thinking\":false,\"add_generation_prompt\":false";
  auto r = [&](const std::string& extra) { return render_chat_request(ojson::parse("{\"messages\":[]," + extra + tail + "}")); };
  EXPECT_EQ(r(R"("tool_choice":"required",)"),
            "<|open|>message role=\"system\" type=\"tool-choice\"<|sep|>The system is invoked with "
            "`tool_choice=required`.\nYou MUST call tools in the next message.<|close|>message<|sep|><|end_of_msg|>");
  EXPECT_EQ(r(R"("tool_choice":"none",)"),
            "<|open|>message role=\"system\" type=\"tool-choice\"<|sep|>The system is invoked with `tool_choice=none`.\n"
            "You MUST NOT call any tools in the next message.<|close|>message<|sep|><|end_of_msg|>");
  EXPECT_EQ(r(R"("tool_choice":"auto",)"), "");
  EXPECT_EQ(r(R"("response_format":{"type":"json_object"},)"),
            "<|open|>message role=\"system\" type=\"response-format\"<|sep|>The system is invoked with "
            "`response_format=json_object`.\nYour response must be raw JSON data without markdown code blocks "
            "(```json) or any additional formatting.<|close|>message<|sep|><|end_of_msg|>");
  const std::string schema_msg =
      "<|open|>message role=\"system\" type=\"response-format\"<|sep|>The system is invoked with "
      "`response_format=json_schema`.\nYour response must be raw JSON data without markdown code blocks (```json) or "
      "any additional formatting.\nThe JSON data must match the following schema:\n```json\n"
      "{\"properties\":{\"a\":{\"type\":\"integer\"}},\"type\":\"object\"}\n```<|close|>message<|sep|><|end_of_msg|>";
  EXPECT_EQ(r(R"("response_format":{"type":"json_schema","json_schema":{"name":"x","schema":{"type":"object","properties":{"a":{"type":"integer"}}}}},)"),
            schema_msg);
  EXPECT_EQ(r(R"("response_format":{"type":"json_schema"},"response_schema":{"type":"object","properties":{"a":{"type":"integer"}}},)"),
            schema_msg);
  EXPECT_NE(r(R"("response_format":{"type":"json_schema"},)").find("```json\nnull\n```"), std::string::npos);
}

TEST(ChatRender, InvalidRequests) {
  EXPECT_EQ(error_of(R"([1])"), "chat request: expected a JSON object, found array");
  EXPECT_EQ(error_of(R"({"tools":[]})"), "chat request: missing 'messages'");
  EXPECT_EQ(error_of(R"({"messages":{}})"), "chat request: 'messages' must be an array, found object");
  EXPECT_EQ(error_of(R"({"messages":[{"content":"x"}]})"), "Kimi K3 messages require a role.");
  EXPECT_EQ(error_of(R"({"messages":[{"role":"user","content":5}]})"),
            "message content must be a string, a list of parts or null, found number");
}

TEST(ChatRender, PythonJsonFormatting) {
  EXPECT_EQ(py_json_dumps(ojson::parse(R"({"b":[1,2.5,1e16,0.0001,-3.0,1e-7],"a":"\u00e9\n\u0001\"","c":null,"d":true})")),
            "{\"b\": [1, 2.5, 1e+16, 0.0001, -3.0, 1e-07], \"a\": \"é\\n\\u0001\\\"\", \"c\": null, \"d\": true}");
  EXPECT_EQ(py_str(ojson::parse("123456789012345678.0")), "1.2345678901234568e+17");
  EXPECT_EQ(py_str(ojson::parse("false")), "False");
  EXPECT_EQ(py_str(ojson::parse(R"({"a":[1,"it's"]})")), "{'a': [1, \"it's\"]}");
  EXPECT_EQ(json_sorted(ojson::parse(R"({"b":1,"B":2,"a":{"d":[{"z":1,"y":2}]}})")), R"({"a":{"d":[{"y":2,"z":1}]},"b":1,"B":2})");
}

TEST(ChatParse, StreamsReasoningContentAndToolCalls) {
  const std::string out =
      "Let me think <about> it.<|close|>think<|sep|><|open|>response<|sep|>Answer: a<|b.<|close|>response<|sep|>"
      "<|open|>tools<|sep|><|open|>call tool=\"get &amp; set\" index=\"1\"<|sep|>"
      "<|open|>argument key=\"city\" type=\"string\"<|sep|>Paris \"FR\"<|close|>argument<|sep|>"
      "<|open|>argument key=\"n\" type=\"number\"<|sep|>3<|close|>argument<|sep|>"
      "<|open|>argument key=\"o\" type=\"object\"<|sep|>{\"k\": [1, true]}<|close|>argument<|sep|><|close|>call<|sep|>"
      "<|open|>call tool=\"g\" index=\"2\"<|sep|><|open|>json type=\"object\"<|sep|>{\"q\": 1}<|close|>json<|sep|>"
      "<|close|>call<|sep|><|close|>tools<|sep|><|close|>message<|sep|><|end_of_msg|>trailing";
  for (size_t chunk : {1u, 3u, 7u, 1000u}) {
    ChatParser p(true);
    std::string reasoning, content;
    std::vector<size_t> completed;
    for (size_t i = 0; i < out.size(); i += chunk) {
      ChatDelta d = p.push(std::string_view(out).substr(i, chunk));
      reasoning += d.reasoning;
      content += d.content;
      completed.insert(completed.end(), d.tool_calls_completed.begin(), d.tool_calls_completed.end());
    }
    p.finish();
    const ParsedMessage& m = p.message();
    EXPECT_EQ(reasoning, "Let me think <about> it.") << chunk;
    EXPECT_EQ(m.reasoning, reasoning);
    EXPECT_EQ(content, "Answer: a<|b.") << chunk;
    EXPECT_EQ(completed, (std::vector<size_t>{0, 1})) << chunk;
    ASSERT_EQ(m.tool_calls.size(), 2u);
    EXPECT_EQ(m.tool_calls[0].name, "get & set");
    EXPECT_EQ(m.tool_calls[0].index, 1);
    EXPECT_EQ(m.tool_calls[0].arguments, ojson::parse(R"({"city":"Paris \"FR\"","n":3,"o":{"k":[1,true]}})"));
    EXPECT_EQ(m.tool_calls[1].arguments, ojson::parse(R"({"q":1})"));
    EXPECT_EQ(m.tool_calls[1].raw_json, "{\"q\": 1}");
    EXPECT_TRUE(m.done);
  }
  ChatParser r(false);  // thinking off: starts in the response
  r.push("Hello<|clo");
  EXPECT_EQ(r.message().content, "Hello");
  r.push("se|>response<|sep|><|close|>message<|sep|>");
  EXPECT_TRUE(r.message().done);
}

// Found by fuzz_chat: a repeated "<|close|>call" reported the same tool call as completed again,
// so the server listed it twice.
TEST(ChatParse, RepeatedCloseCompletesACallOnce) {
  ChatParser p(false);
  std::vector<size_t> completed;
  for (const char* part : {"<|open|>call tool=\"f\"<|sep|><|close|>call<|sep|>", "<|close|>call<|sep|>",
                           "<|close|>call<|sep|>"}) {
    const ChatDelta d = p.push(part);
    completed.insert(completed.end(), d.tool_calls_completed.begin(), d.tool_calls_completed.end());
  }
  p.finish();
  EXPECT_EQ(completed, (std::vector<size_t>{0}));
  ASSERT_EQ(p.message().tool_calls.size(), 1u);
  EXPECT_TRUE(p.message().tool_calls[0].complete);
}
