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

// ---------------------------------------------------------------------------------------------
// Tool-call arguments as they are generated (ToolCallDelta): the pieces of a call concatenate to
// exactly the compact JSON the server sends for the whole call, in every chunking of the text.

namespace {

std::string compact(const ojson& v) { return v.dump(-1, ' ', false, ojson::error_handler_t::replace); }

bool valid_utf8(std::string_view s) {
  for (size_t i = 0; i < s.size();) {
    const unsigned char b = static_cast<unsigned char>(s[i]);
    const size_t n = b < 0x80 ? 1 : (b >> 5) == 6 ? 2 : (b >> 4) == 14 ? 3 : (b >> 3) == 30 ? 4 : 0;
    if (n == 0 || i + n > s.size()) return false;
    for (size_t k = 1; k < n; ++k)
      if ((static_cast<unsigned char>(s[i + k]) & 0xC0) != 0x80) return false;
    i += n;
  }
  return true;
}

// What the deltas of one run said about each call.
struct StreamedCall {
  std::string name, json;
  int index = 0;
  std::vector<std::string> pieces;
  bool started = false, done = false;
};

struct StreamRun {
  std::vector<StreamedCall> calls;
  std::vector<size_t> completed;
  ParsedMessage msg;
};

// Feeds `out` in the chunks given by the cut positions, then finish(); checks the order rules.
StreamRun run_chunks(const std::string& out, const std::vector<size_t>& cuts, bool think = false) {
  ChatParser p(think);
  StreamRun r;
  auto take = [&](const ChatDelta& d) {
    r.completed.insert(r.completed.end(), d.tool_calls_completed.begin(), d.tool_calls_completed.end());
    for (const ToolCallDelta& td : d.tool_call_deltas) {
      if (td.started) {
        EXPECT_EQ(td.call, r.calls.size()) << "a call starts once, in order";
        r.calls.emplace_back();
        r.calls.back().started = true;
        r.calls.back().name = td.name;
        r.calls.back().index = td.index;
      }
      EXPECT_LT(td.call, r.calls.size()) << "arguments before the call started";
      if (td.call >= r.calls.size()) continue;
      StreamedCall& c = r.calls[td.call];
      EXPECT_FALSE(c.done) << "arguments after the call ended";
      EXPECT_TRUE(td.started || !td.arguments.empty() || td.done) << "an empty delta";
      if (!td.arguments.empty()) {
        EXPECT_TRUE(valid_utf8(td.arguments)) << "a piece splits a UTF-8 character";
        c.pieces.push_back(td.arguments);
        c.json += td.arguments;
        // never inside an escape sequence at the end of a piece
        bool in_str = false;
        int esc = 0;  // characters of an escape still to come
        for (char ch : c.json) {
          if (esc > 0) {
            esc = (esc == 5 && ch == 'u') ? 4 : esc == 5 ? 0 : esc - 1;
          } else if (in_str && ch == '\\') {
            esc = 5;
          } else if (ch == '"') {
            in_str = !in_str;
          }
        }
        EXPECT_EQ(esc, 0) << "a piece ends inside an escape: " << c.json;
      }
      if (td.done) c.done = true;
    }
  };
  size_t prev = 0;
  for (size_t cut : cuts) {
    take(p.push(std::string_view(out).substr(prev, cut - prev)));
    prev = cut;
  }
  take(p.push(std::string_view(out).substr(prev)));
  take(p.finish());
  r.msg = p.message();
  EXPECT_EQ(r.calls.size(), r.msg.tool_calls.size());
  for (size_t i = 0; i < r.calls.size() && i < r.msg.tool_calls.size(); ++i) {
    EXPECT_EQ(r.calls[i].json, r.msg.tool_calls[i].arguments_json) << i;
    EXPECT_EQ(r.calls[i].name, r.msg.tool_calls[i].name);
    EXPECT_EQ(r.calls[i].index, r.msg.tool_calls[i].index);
    EXPECT_EQ(r.calls[i].done, r.msg.tool_calls[i].complete);
  }
  return r;
}

// Every chunking this test uses: one byte at a time, whole, every cut into two, and random ones.
std::vector<std::vector<size_t>> chunkings(size_t n, unsigned seed) {
  std::vector<std::vector<size_t>> all;
  std::vector<size_t> ones;
  for (size_t i = 1; i < n; ++i) ones.push_back(i);
  all.push_back(ones);
  all.push_back({});
  for (size_t i = 1; i < n; ++i) all.push_back({i});
  uint64_t x = 0x9E3779B97F4A7C15ull ^ seed;
  for (int k = 0; k < 20; ++k) {
    std::vector<size_t> cuts;
    for (size_t i = 0;;) {
      x ^= x << 13, x ^= x >> 7, x ^= x << 17;
      i += 1 + x % 9;
      if (i >= n) break;
      cuts.push_back(i);
    }
    all.push_back(cuts);
  }
  return all;
}

const std::string kOpenTools = "<|close|>response<|sep|><|open|>tools<|sep|>";
const std::string kEnd = "<|close|>tools<|sep|><|close|>message<|sep|><|end_of_msg|>";
std::string call_open(const std::string& tool, int index) {
  return "<|open|>call tool=\"" + tool + "\" index=\"" + std::to_string(index) + "\"<|sep|>";
}
const std::string kCallClose = "<|close|>call<|sep|>";
std::string typed(const std::string& key, const std::string& type, const std::string& value) {
  return "<|open|>argument key=\"" + key + "\" type=\"" + type + "\"<|sep|>" + value + "<|close|>argument<|sep|>";
}
std::string block(const std::string& text) { return "<|open|>json type=\"object\"<|sep|>" + text + "<|close|>json<|sep|>"; }

// The output text, and per call the JSON value it must stream.
void expect_streams(const std::string& out, const std::vector<ojson>& want, unsigned seed) {
  for (const auto& cuts : chunkings(out.size(), seed)) {
    const StreamRun r = run_chunks(out, cuts);
    SCOPED_TRACE(testing::Message() << cuts.size() << " cuts, first " << (cuts.empty() ? 0 : cuts[0]));
    ASSERT_EQ(r.calls.size(), want.size());
    for (size_t i = 0; i < want.size(); ++i) {
      EXPECT_EQ(r.calls[i].json, compact(want[i])) << i;  // the exact text
      EXPECT_EQ(ojson::parse(r.calls[i].json), want[i]) << i;
      EXPECT_TRUE(r.calls[i].done);
    }
    if (cuts.size() + 1 == out.size()) {  // one byte at a time: a long string arrives in many pieces
      for (const auto& c : r.calls) {
        if (c.json.size() > 40) { EXPECT_GE(c.pieces.size(), 3u) << c.json; }
      }
    }
  }
}

}  // namespace

TEST(ChatParse, TypedStringArgumentsStreamExactly) {
  const std::string s = "say \"hi\" \\ C:\\dir\nnext\tline \x01 caf\xC3\xA9 \xE6\x97\xA5\xE6\x9C\xAC \xF0\x9F\x98\x80 a<|b <x";
  const std::string out = kOpenTools + call_open("write", 1) + typed("path", "string", "/tmp/a b.txt") +
                          typed("content", "string", s) + typed("empty", "string", "") + kCallClose + kEnd;
  const ojson want = ojson{{"path", "/tmp/a b.txt"}, {"content", s}, {"empty", ""}};
  expect_streams(out, {want}, 1);
  // the same value as the parsed arguments (what the server sent before it streamed)
  const StreamRun r = run_chunks(out, {});
  EXPECT_EQ(r.msg.tool_calls[0].arguments_json, compact(r.msg.tool_calls[0].arguments));
  EXPECT_EQ(r.completed, (std::vector<size_t>{0}));
}

TEST(ChatParse, TypedValuesOfOtherTypesStreamExactly) {
  const std::string out = kOpenTools + call_open("f", 1) + typed("n", "number", "1.50") + typed("i", "integer", "-7") +
                          typed("b", "boolean", "true") + typed("z", "null", "null") +
                          typed("o", "object", "{\"k\": [1, true, \"x\\\"y\"], \"e\": {}}") + typed("a", "array", "[1e2, \"\\u00e9\"]") +
                          typed("bad", "number", "12 apples") + typed("s", "string", "last") + kCallClose + kEnd;
  const ojson want = ojson::parse(R"({"n":1.5,"i":-7,"b":true,"z":null,"o":{"k":[1,true,"x\"y"],"e":{}},"a":[100.0,"é"],"bad":"12 apples","s":"last"})");
  expect_streams(out, {want}, 2);
  const StreamRun r = run_chunks(out, {});
  EXPECT_EQ(r.msg.tool_calls[0].arguments_json, compact(r.msg.tool_calls[0].arguments));
}

TEST(ChatParse, JsonBlockStreamsItsCompactForm) {
  const std::string text =
      "{\n  \"path\" : \"lib/a.cpp\",\n  \"edits\": [ {\"old\": \"a\\\"b\\\\c\\n\\t\\/\", \"new\": \"caf\\u00e9 \\ud83d\\ude00 \xE2\x82\xAC\"},"
      " {\"old\": \"\", \"new\": \"x\"} ],\n  \"n\": -0.5e1, \"big\": 12345678901234567890, \"t\": true, \"f\": false, \"z\": null,"
      " \"deep\": {\"a\": [[], {}, [1, [2, {\"b\": \"c\"}]]]}\n}\n";
  const std::string out = kOpenTools + call_open("edit", 1) + block(text) + kCallClose + kEnd;
  const ojson want = ojson::parse(text);
  expect_streams(out, {want}, 3);
  const StreamRun r = run_chunks(out, {});
  // what the server sent before it streamed: the block parsed and dumped
  EXPECT_EQ(r.msg.tool_calls[0].arguments_json, compact(ojson::parse(r.msg.tool_calls[0].raw_json)));
  std::vector<StreamedCall> calls = run_chunks(out, chunkings(out.size(), 0)[0]).calls;
  EXPECT_GE(calls[0].pieces.size(), 10u);
}

TEST(ChatParse, TwoCallsStreamOneAfterTheOther) {
  const std::string out = "Let me look.<|close|>think<|sep|><|open|>response<|sep|>" + kOpenTools + call_open("read", 1) +
                          typed("path", "string", "a.txt") + kCallClose + call_open("grep", 2) +
                          block("{\"pattern\": \"TODO\", \"n\": 3}") + kCallClose + kEnd;
  for (const auto& cuts : chunkings(out.size(), 4)) {
    const StreamRun r = run_chunks(out, cuts, true);
    ASSERT_EQ(r.calls.size(), 2u);
    EXPECT_EQ(r.calls[0].name, "read");
    EXPECT_EQ(r.calls[1].name, "grep");
    EXPECT_EQ(r.calls[1].index, 2);
    EXPECT_EQ(r.calls[0].json, R"({"path":"a.txt"})");
    EXPECT_EQ(r.calls[1].json, R"({"pattern":"TODO","n":3})");
    EXPECT_EQ(r.completed, (std::vector<size_t>{0, 1}));
  }
}

TEST(ChatParse, StreamedArgumentsOfMalformedCallsAreStillOneObject) {
  struct Case {
    std::string body;  // what the call holds
    const char* want;  // the streamed (and complete) arguments
  };
  const std::vector<Case> cases = {
      // invalid UTF-8 becomes U+FFFD, as the server's JSON writer does for the whole value
      {typed("s", "string", "a\xFF" "b\xE2\x82" "A\xF0\x9F"), "{\"s\":\"a\xEF\xBF\xBD" "b\xEF\xBF\xBD" "A\xEF\xBF\xBD\"}"},
      // a key given twice keeps its first value
      {typed("k", "string", "one") + typed("k", "string", "two") + typed("m", "number", "2"), R"({"k":"one","m":2})"},
      {block(R"({"k": 1, "k": {"x": [1]}, "j": 2})"), R"({"k":1,"j":2})"},
      // typed arguments and a json block together: one object
      {typed("a", "string", "x") + block(R"({"b": [true], "a": 5})"), R"({"a":"x","b":[true]})"},
      // a block cut off (the call ends inside it): what was complete, open strings and containers closed
      {block(R"({"a": "abc", "b": [1, {"c": "de)"), R"({"a":"abc","b":[1,{"c":"de"}]})"},
      {block(R"({"a": 1, "b": 2.)"), R"({"a":1})"},
      {block(R"({"a": 1, "b")"), R"({"a":1})"},
      // malformed: members up to the error, the rest of the block ignored
      {block(R"({"a": [1, 2}, "b": 3})"), R"({"a":[1,2]})"},
      {block(R"({"a": tru, "b": 3})"), R"({})"},
      {block(R"([1, 2])"), R"({})"},
      {block(R"({"a": "x\q"})"), R"({"a":"x"})"},
      {block(R"({"a": 1} trailing)"), R"({"a":1})"},
      // the response channel opened inside the call: the arguments end there
      {typed("a", "string", "x") + "<|open|>response<|sep|>text" + typed("b", "number", "1"), R"({"a":"x"})"},
      {block(R"({"a": [1, )") + "<|open|>response<|sep|>" + block(R"({"b": 2})"), R"({"a":[1]})"},
      // lone surrogates as U+FFFD
      {block(R"({"s": "\ud800x\udc00"})"), "{\"s\":\"\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBDx\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD\"}"},
  };
  for (const Case& c : cases) {
    const std::string out = kOpenTools + call_open("f", 1) + c.body + kCallClose + kEnd;
    SCOPED_TRACE(c.body);
    for (const auto& cuts : chunkings(out.size(), 5)) {
      const StreamRun r = run_chunks(out, cuts);
      ASSERT_EQ(r.calls.size(), 1u);
      EXPECT_EQ(r.calls[0].json, c.want);
      EXPECT_EQ(compact(ojson::parse(r.calls[0].json)), r.calls[0].json);  // its own compact form
    }
  }
}

TEST(ChatParse, CallCutOffStillStreamsAnObject) {
  // generation ends inside a call (max_tokens): finish() closes the string and the object, but the call
  // is not complete
  for (const std::string& tail : {typed("a", "string", "x") + "<|open|>argument key=\"b\" type=\"string\"<|sep|>caf\xC3",
                                 block("{\"a\": [1, \"x") , std::string("<|open|>json type=\"object\"<|sep|>{\"a\": 1, \"b\": tr"),
                                 typed("a", "string", "x") + "<|open|>argument key=\"b\" type=\"string\"<|sep|>y<|close|>argument"}) {
    const std::string out = kOpenTools + call_open("f", 1) + tail;
    for (const auto& cuts : chunkings(out.size(), 6)) {
      const StreamRun r = run_chunks(out, cuts);
      ASSERT_EQ(r.calls.size(), 1u);
      EXPECT_FALSE(r.calls[0].done);
      EXPECT_TRUE(r.completed.empty());
      const ojson v = ojson::parse(r.calls[0].json);
      EXPECT_TRUE(v.is_object()) << r.calls[0].json;
      EXPECT_EQ(compact(v), r.calls[0].json);
      EXPECT_EQ(r.calls[0].json.find("<|"), std::string::npos) << "a tag's beginning is not an argument";
    }
  }
}

// Random outputs made of the format's tags and JSON's characters: whatever the model writes, each
// call's streamed arguments end as one JSON object in its own compact form.
TEST(ChatParse, RandomCallsAlwaysStreamOneObject) {
  const std::vector<std::string> parts = {
      call_open("f", 1), kCallClose, "<|open|>json type=\"object\"<|sep|>", "<|close|>json<|sep|>",
      "<|open|>argument key=\"a\" type=\"string\"<|sep|>", "<|open|>argument key=\"b\" type=\"number\"<|sep|>",
      "<|close|>argument<|sep|>", "{", "}", "[", "]", ",", ":", "\"", "\\", "\\u", "d83d", "dc00", "00e9", "a", "1",
      "-", ".", "e", "true", "null", " ", "\n", "\xC3", "\xA9", "\xFF", "<|", "<", "<|open|>response<|sep|>"};
  uint64_t x = 12345;
  for (int it = 0; it < 3000; ++it) {
    std::string out = kOpenTools + call_open("f", 1);
    const int n = 1 + static_cast<int>(x % 40);
    for (int k = 0; k < n; ++k) {
      x ^= x << 13, x ^= x >> 7, x ^= x << 17;
      out += parts[x % parts.size()];
    }
    x ^= x << 13, x ^= x >> 7, x ^= x << 17;
    if (x % 2) out += kCallClose;
    std::vector<size_t> cuts;
    for (size_t i = 1 + x % 5; i < out.size(); i += 1 + (i * 7 + x) % 6) cuts.push_back(i);
    const StreamRun r = run_chunks(out, cuts);
    const StreamRun whole = run_chunks(out, {});
    ASSERT_EQ(r.calls.size(), whole.calls.size()) << out;
    for (size_t i = 0; i < r.calls.size(); ++i) {
      EXPECT_EQ(r.calls[i].json, whole.calls[i].json) << out;  // any chunking: the same text
      const ojson v = ojson::parse(r.calls[i].json, nullptr, false);
      ASSERT_TRUE(v.is_object()) << out << "\n-> " << r.calls[i].json;
      EXPECT_EQ(compact(v), r.calls[i].json) << out;
    }
  }
}

// Issue 38: bare tags the model writes inside its thinking (an <|open|> or <|close|> that no tag
// name and <|sep|> follow, a <|sep|> alone) reached clients verbatim; they are dropped, the text
// around them kept, in any chunking. A real close still ends the think channel.
TEST(ChatParse, BareTagsAreDroppedFromTheChannels) {
  const std::string out =
      "one<|close|>two<|open|><|open|>three<|sep|>four<|close|>think<|sep|><|open|>response<|sep|>five<|close|>six";
  for (size_t chunk : {1u, 2u, 5u, 1000u}) {
    ChatParser p(true);
    std::string reasoning, content;
    for (size_t i = 0; i < out.size(); i += chunk) {
      ChatDelta d = p.push(std::string_view(out).substr(i, chunk));
      reasoning += d.reasoning;
      content += d.content;
    }
    ChatDelta d = p.finish();
    reasoning += d.reasoning;
    content += d.content;
    EXPECT_EQ(reasoning, "onetwofour") << chunk;  // <|open|>three<|sep|>: a whole tag of no known name, dropped
    EXPECT_EQ(content, "fivesix") << chunk;
    EXPECT_EQ(p.message().reasoning, reasoning);
  }
  // a header longer than ChatParser::kMaxTagHeader without <|sep|>: a bare tag, not held back
  ChatParser q(true);
  const ChatDelta d = q.push("<|open|>" + std::string(300, 'x'));
  EXPECT_EQ(d.reasoning, std::string(300, 'x'));
}
