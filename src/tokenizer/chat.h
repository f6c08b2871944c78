// The Kimi-K3 chat format ("XTML"): native rendering of what the Kimi-K3 Jinja chat template
// (llama.cpp models/templates/Kimi-K3.jinja) renders for an OpenAI-style request, and an
// incremental parser for the model's output (reasoning / response / tool calls).
//
// Rendering follows the template under the Hugging Face transformers Jinja environment (its
// `tojson` is Python json.dumps: ", " / ": " separators, no HTML escaping, ensure_ascii=false;
// `dictsort` is case-insensitive; `|string` is Python str()). See docs/tokenizer.md.
#pragma once
#include <nlohmann/json.hpp>
#include <cstdint>
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
// What the template renders for an image part of a message (type "image" or "image_url"); the
// server replaces it with the image's media tokens (docs/spec/vision.md §4).
inline constexpr const char* kImagePlaceholder = "<|kimi_image_placeholder|>";
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
  // The arguments as compact JSON text (nlohmann's dump form: no spaces, UTF-8 unescaped, invalid
  // UTF-8 as U+FFFD), written while the call is generated and reported in pieces
  // (ChatDelta::tool_call_deltas): `{`, each typed argument in order (a string one character by
  // character as it arrives), the members of a json block (each value once it is known, a string
  // value character by character), `}` at the end of the call. A key given twice keeps its first
  // value; a json block that breaks off or turns malformed keeps its members up to there (open
  // strings and containers closed). Always one JSON object once the call is complete (or the
  // parser finished); for a well-formed call it is the compact dump of `arguments` / the block.
  std::string arguments_json;
};

struct ParsedMessage {
  std::string reasoning, content;
  std::vector<ParsedToolCall> tool_calls;
  bool done = false;  // <|end_of_msg|> (or <|close|>message) seen
};

// A tool call as it is generated: in one push() a call may start, grow its arguments and end.
// All `arguments` pieces of a call, in order, concatenate to its arguments_json (a piece never
// splits a UTF-8 character or an escape sequence).
struct ToolCallDelta {
  size_t call = 0;        // index into message().tool_calls
  bool started = false;   // the call began: `name` and `index` are known (first delta of a call)
  bool done = false;      // the call ended (<|close|>call); after `arguments`
  std::string name;       // when started
  int index = 0;          // when started: the call's index attribute
  std::string arguments;  // JSON text appended to the call's arguments_json
};

// What one push() added.
struct ChatDelta {
  std::string reasoning, content;
  std::vector<size_t> tool_calls_completed;  // indices into message().tool_calls
  std::vector<ToolCallDelta> tool_call_deltas;  // in order, one entry per call touched (started -> arguments -> done)
};

// Incremental parser of the assistant output that follows the generation prompt. Feed it the
// detokenized text (special tokens as their text) in any chunking; a chunk may end in the middle
// of a tag, which is held back until complete. In the think and response channels (and between
// sections) a bare tag -- <|open|> or <|close|> not followed by a header and <|sep|> before the
// next "<|" (or within kMaxTagHeader bytes), or a <|sep|> alone -- is dropped from the text (the
// text after it is kept), so stray tags of the model never reach a client verbatim. start_in_think: the prompt ended with the think
// tag open (thinking on); otherwise with the response tag open.
class ChatParser {
 public:
  explicit ChatParser(bool start_in_think = true);
  ChatDelta push(std::string_view text);
  ChatDelta finish();  // end of stream: flushes held text
  const ParsedMessage& message() const { return msg_; }

 private:
  enum class Where { Think, Response, Tools, Call, Argument, Json, Outside, Done };
  // A tag header (between <|open|> / <|close|> and <|sep|>) longer than this, in a channel or
  // between sections, makes the tag a bare one (dropped; its text is kept).
  static constexpr size_t kMaxTagHeader = 256;
  bool free_text() const { return where_ == Where::Think || where_ == Where::Response || where_ == Where::Outside; }
  void handle_tag(bool open, std::string_view header, ChatDelta& d);
  void emit_text(std::string_view text, ChatDelta& d);
  Where where_;
  std::string buf_, arg_key_, arg_type_, arg_value_;
  ParsedMessage msg_;

  // Writing the open call's arguments_json (chat.cpp, "Streamed arguments").
  enum class Block : uint8_t { None, Start, Value, Key, Colon, After, Str, Esc, Hex, Num, Lit, Done, Error };
  struct Frame {
    char type = '{';                // '{' or '['
    bool shown = true;              // its opening bracket was written (not inside a skipped value)
    size_t count = 0;               // members / elements written
    std::vector<std::string> keys;  // an object's keys so far (written or skipped)
  };
  struct Args {
    bool open = false;              // the last call's JSON is not closed yet
    std::vector<Frame> frames;      // frames[0]: the call's object; then the json block's open containers
    bool arg_string = false;        // a typed string argument is being written
    bool arg_skip = false;          // the open typed argument repeats a key: not written
    std::string utf8_hold;          // bytes of an unfinished UTF-8 character of the open string
    Block block = Block::None;      // the json block's lexer
    bool first = false;             // a container was just opened (may close at once)
    bool key_str = false;           // the open string is a key
    std::string tok, key, prefix;   // a key, number, literal or \\u escape being read; the member's key; what precedes the value
    uint32_t hi_surrogate = 0;      // a \\uD800..\\uDBFF escape waiting for its low half
    size_t skip_depth = 0;          // > 0: inside the value of a repeated key, at frames.size() == skip_depth
  } args_;
  void args_out(std::string_view s, ChatDelta& d);
  void args_string_bytes(std::string_view bytes, bool flush, ChatDelta& d);
  void args_typed_open(ChatDelta& d);  // <|open|>argument: a string one starts its member at once
  void args_typed_end(ChatDelta& d);   // closes an open typed string argument
  void args_close(ChatDelta& d);       // closes the call's JSON (open string, containers, the object)
  void block_char(char c, ChatDelta& d);
  void block_end(ChatDelta& d);        // the json block ends: finish a number or literal, close what is open
  void block_error(ChatDelta& d);      // malformed: close what is open, ignore the rest of the block
  void block_string_bytes(std::string_view bytes, ChatDelta& d);
  void block_unit(uint32_t u, ChatDelta& d);  // a UTF-16 unit of an escape
  void block_close_container(ChatDelta& d);
  std::string member_prefix(const std::string& key) const;  // "," and the key of the next member of the top frame
  void value_started(ChatDelta& d, bool deferred);
  void value_ended();
};

}  // namespace kimi::tok
