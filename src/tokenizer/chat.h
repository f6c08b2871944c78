// The Kimi-K3 chat format ("XTML"): native rendering of what the Kimi-K3 Jinja chat template
// (llama.cpp models/templates/Kimi-K3.jinja) renders for an OpenAI-style request, and an
// incremental parser for the model's output (reasoning / response / tool calls).
//
// Rendering follows the template under the Hugging Face transformers Jinja environment (its
// `tojson` is Python json.dumps: ", " / ": " separators, no HTML escaping, ensure_ascii=false;
// `dictsort` is case-insensitive; `|string` is Python str()). See docs/tokenizer.md.
#pragma once
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace kimi::tok {

using ojson = nlohmann::ordered_json;  // keeps the request's key order (argument order matters)

// Template variables. A request JSON maps onto them (render_chat_request): messages, tools,
// tool_choice, response_format, response_schema, thinking, thinking_effort, add_generation_prompt.
// A variable absent from the request is "undefined" for the template (std::nullopt here).
struct ChatRequest {
  ojson messages = ojson::array();
  std::optional<ojson> tools, tool_choice, response_format, response_schema, thinking, thinking_effort;
  bool add_generation_prompt = true;

  // Throws kimi::Error for a request that is not a JSON object or whose messages are not an array.
  static ChatRequest from_json(const ojson& body);
};

// Renders the prompt. Throws kimi::Error with the template's own message where it raises
// (unsupported thinking_effort, a message without role, a tool call without a name, ...).
std::string render_chat(const ChatRequest& req);
std::string render_chat_request(const ojson& body);

// The same rendering with every string taken from the request (message contents, names, reasoning,
// tool definitions, tool-call names, argument keys and values, tool results, the response schema)
// enclosed in kUserTextBegin ... kUserTextEnd: bytes that never occur in UTF-8, so no request text
// can contain them. A caller tokenizes the user ranges without special-token parsing (no user text
// can then forge the format's tags); strip_user_marks gives exactly render_chat's text and the
// user ranges in it ([begin, end) byte offsets, in order, not overlapping).
inline constexpr const char* kUserTextBegin = "\xFE";
inline constexpr const char* kUserTextEnd = "\xFF";
std::string render_chat_marked(const ChatRequest& req);
std::string strip_user_marks(std::string_view marked, std::vector<std::pair<size_t, size_t>>* user_ranges);

// Helpers exposed for tests.
std::string py_json_dumps(const ojson& v);  // Python json.dumps(v, ensure_ascii=False)
std::string json_sorted(const ojson& v);    // the template's json_sorted macro
std::string py_str(const ojson& v);         // Python str(v) of the JSON value

struct ParsedToolCall {
  std::string name;
  int index = 0;
  ojson arguments = ojson::object();  // typed arguments (or the parsed json block)
  std::string raw_json;               // the json block text when the call used one
  bool complete = false;
};

struct ParsedMessage {
  std::string reasoning, content;
  std::vector<ParsedToolCall> tool_calls;
  bool done = false;  // <|end_of_msg|> (or <|close|>message) seen
};

// What one push() added.
struct ChatDelta {
  std::string reasoning, content;
  std::vector<size_t> tool_calls_completed;  // indices into message().tool_calls
};

// Incremental parser of the assistant output that follows the generation prompt. Feed it the
// detokenized text (special tokens as their text) in any chunking; a chunk may end in the middle
// of a tag, which is held back until complete. start_in_think: the prompt ended with the think
// tag open (thinking on); otherwise with the response tag open.
class ChatParser {
 public:
  explicit ChatParser(bool start_in_think = true);
  ChatDelta push(std::string_view text);
  ChatDelta finish();  // end of stream: flushes held text
  const ParsedMessage& message() const { return msg_; }

 private:
  enum class Where { Think, Response, Tools, Call, Argument, Json, Outside, Done };
  void handle_tag(bool open, std::string_view header, ChatDelta& d);
  void emit_text(std::string_view text, ChatDelta& d);
  Where where_;
  std::string buf_, arg_key_, arg_type_, arg_value_;
  ParsedMessage msg_;
};

}  // namespace kimi::tok
