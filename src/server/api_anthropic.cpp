// Anthropic Messages API -> the chat endpoint's internal request, and the engine's output -> a
// Message / Anthropic's event stream (api_anthropic.h).
#include "server/api_anthropic.h"

#include <fmt/format.h>

#include <cmath>
#include <set>
#include <string_view>

#include "util/error.h"

namespace kimi::server {

namespace {

const FieldReader kFields{[](const std::string& param, const std::string& msg) { return param + ": " + msg; },
                          "Field required"};
[[noreturn]] void bad(const std::string& param, const std::string& msg) { kFields.bad(param, msg); }
const ojson* get(const ojson& o, const char* k) { return FieldReader::get(o, k); }
std::string str(const ojson& o, const char* k, const std::string& where, bool required) {
  return kFields.str(o, k, where, required);
}

// Claude Code's first system block, "x-anthropic-billing-header: cc_version=...; cc_entrypoint=...;
// cch=...;": metadata for Anthropic's billing, not an instruction. Some versions put a per-request
// hash (cch=) in it, which would change the prompt's first tokens on every request and so miss the
// prompt cache every time: the block is left out of the prompt (docs/server.md).
constexpr std::string_view kBillingHeader = "x-anthropic-billing-header:";

bool is_billing_block(const ojson& b) {
  if (!b.is_object()) return false;
  const ojson* type = get(b, "type");
  const ojson* text = get(b, "text");
  return type && *type == "text" && text && text->is_string() &&
         text->get_ref<const std::string&>().compare(0, kBillingHeader.size(), kBillingHeader) == 0;
}

// The text of a `system` value or of a tool_result's content: a string or text blocks (`from`: the
// first block taken).
std::string text_of(const ojson& v, const std::string& where, size_t from = 0) {
  if (v.is_string()) return v.get<std::string>();
  if (!v.is_array()) bad(where, "must be a string or an array of text blocks");
  std::string out;
  for (size_t i = from; i < v.size(); ++i) {
    const ojson& b = v[i];
    const std::string w = fmt::format("{}[{}]", where, i);
    if (!b.is_object()) bad(w, "must be an object");
    const std::string type = str(b, "type", w, true);
    if (type != "text")
      bad(w + ".type", fmt::format("content block type '{}' is not supported here (text only: the engine reads text)", type));
    if (!out.empty()) out += "\n";
    out += str(b, "text", w, true);
  }
  return out;
}

// An image block ({"type":"image","source":{"type":"base64","media_type","data"}}) as a chat
// image_url part (a data: URL); its chat path `part` names the block `bw` in errors.
ojson image_part(const ojson& bl, const std::string& bw, const std::string& part, FieldMap& fm) {
  const ojson* src = get(bl, "source");
  if (!src) bad(bw + ".source", "Field required");
  if (!src->is_object()) bad(bw + ".source", "must be an object");
  const std::string type = str(*src, "type", bw + ".source", true);
  if (type == "url")
    bad(bw + ".source.type", "the server fetches nothing from the network: send the image as a base64 source "
                             "({\"type\": \"base64\", \"media_type\": \"image/png\", \"data\": ...})");
  if (type != "base64") bad(bw + ".source.type", fmt::format("image source type '{}' is not supported (base64)", type));
  const std::string mt = str(*src, "media_type", bw + ".source", true);
  const std::string data = str(*src, "data", bw + ".source", true);
  fm.add(part, bw);
  fm.add(part + ".image_url", bw + ".source");
  fm.add(part + ".image_url.url", bw + ".source.data");
  return {{"type", "image_url"}, {"image_url", {{"url", "data:" + mt + ";base64," + data}}}};
}

// Content blocks (text, image) as chat content: the text alone (blocks joined by "\n") when there
// is no image, else parts in order (consecutive text blocks joined by "\n"). `path`: the chat
// message's content path. `prefix` goes before the text.
ojson blocks_content(const ojson& v, const std::string& where, const std::string& path, FieldMap& fm,
                     const std::string& prefix = "") {
  if (v.is_string()) return prefix + v.get<std::string>();
  if (!v.is_array()) bad(where, "must be a string or an array of text and image blocks");
  ojson parts = ojson::array();
  std::string text = prefix;
  bool any_image = false, open = !prefix.empty();
  for (size_t i = 0; i < v.size(); ++i) {
    const ojson& b = v[i];
    const std::string w = fmt::format("{}[{}]", where, i);
    if (!b.is_object()) bad(w, "must be an object");
    const std::string type = str(b, "type", w, true);
    if (type == "text") {
      if (open && !text.empty() && text != prefix) text += "\n";
      text += str(b, "text", w, true);
      open = true;
    } else if (type == "image") {
      if (open) parts.push_back({{"type", "text"}, {"text", text}});
      text.clear();
      open = false;
      parts.push_back(image_part(b, w, fmt::format("{}[{}]", path, parts.size()), fm));
      any_image = true;
    } else {
      bad(w + ".type", fmt::format("content block type '{}' is not supported here (text, image)", type));
    }
  }
  if (!any_image) return text;
  if (open) parts.push_back({{"type", "text"}, {"text", text}});
  return parts;
}

// The request's `system`: its text without Claude Code's billing block (system[0] only).
std::string system_text(const ojson& sys) {
  return text_of(sys, "system", sys.is_array() && !sys.empty() && is_billing_block(sys[0]) ? 1 : 0);
}

// The thinking / effort fields onto K3's thinking on/off, thinking_effort and the thinking budget
// (budget_tokens: a hard cap on the think channel, chat's thinking_budget_tokens).
void map_thinking(const ojson& b, ojson& chat) {
  bool thinking = false;  // Anthropic's default: no extended thinking
  std::string effort;
  int64_t budget = -1;
  if (const ojson* t = get(b, "thinking")) {
    if (!t->is_object()) bad("thinking", "must be an object");
    const std::string type = str(*t, "type", "thinking", true);
    if (type == "enabled") {
      thinking = true;
      const ojson* bt = get(*t, "budget_tokens");
      if (!bt) bad("thinking.budget_tokens", "Field required when thinking.type is \"enabled\"");
      if (!bt->is_number_integer() || bt->get<int64_t>() < 1) bad("thinking.budget_tokens", "must be a positive integer");
      const int64_t n = bt->get<int64_t>();
      effort = n <= 2048 ? "low" : n <= 32768 ? "high" : "max";  // K3 knows no medium
      budget = n < 2147483647 ? n : 2147483647;  // beyond: no cap in practice
    } else if (type == "adaptive") {
      thinking = true;
      effort = "high";
    } else if (type != "disabled") {
      bad("thinking.type", fmt::format("'{}' is not one of enabled, disabled, adaptive", type));
    }
  }
  if (const ojson* oc = get(b, "output_config")) {
    if (!oc->is_object()) bad("output_config", "must be an object");
    if (const ojson* e = get(*oc, "effort")) {
      if (!e->is_string() || (*e != "low" && *e != "medium" && *e != "high" && *e != "max"))
        bad("output_config.effort", fmt::format("{} is not one of low, medium, high, max", e->dump()));
      if (thinking) effort = *e == "medium" ? "high" : e->get<std::string>();  // K3 knows no medium
    }
    if (const ojson* f = get(*oc, "format")) {
      if (!f->is_object()) bad("output_config.format", "must be an object");
      const std::string ft = str(*f, "type", "output_config.format", true);
      if (ft != "json_schema") bad("output_config.format.type", fmt::format("'{}' is not supported (json_schema)", ft));
      const ojson* sc = get(*f, "schema");
      if (!sc || !sc->is_object()) bad("output_config.format.schema", "must be an object");
      chat["response_format"] = {{"type", "json_schema"}, {"json_schema", {{"name", "output"}, {"schema", *sc}}}};
    }
  }
  chat["thinking"] = thinking;
  if (thinking && !effort.empty()) chat["thinking_effort"] = effort;
  if (thinking && budget >= 0) chat["thinking_budget_tokens"] = budget;
}

void map_tools(const ojson& b, ojson& chat, std::set<std::string>& names, FieldMap& fm) {
  const ojson* tools = get(b, "tools");
  if (tools) {
    if (!tools->is_array()) bad("tools", "must be an array");
    ojson out = ojson::array();
    for (size_t i = 0; i < tools->size(); ++i) {
      const ojson& t = (*tools)[i];
      const std::string w = fmt::format("tools[{}]", i);
      if (!t.is_object()) bad(w, "must be an object");
      const std::string type = str(t, "type", w, false);
      // server tools (web_search_..., bash_..., text_editor_..., code_execution_...) run on
      // Anthropic's side: kimi has none, so they are left out
      if (!type.empty() && type != "custom") continue;
      const std::string name = str(t, "name", w, true);
      if (name.empty()) bad(w + ".name", "must not be empty");
      if (!names.insert(name).second) bad(w + ".name", fmt::format("tool name '{}' is declared twice", name));
      ojson fn = {{"name", name}};
      const std::string desc = str(t, "description", w, false);
      if (!desc.empty()) fn["description"] = desc;
      const ojson* sc = get(t, "input_schema");
      if (!sc) bad(w + ".input_schema", "Field required");
      if (!sc->is_object()) bad(w + ".input_schema", "must be an object (a JSON schema)");
      fn["parameters"] = *sc;
      fm.add_tool(out.size(), w, "input_schema");  // server tools left out: other indices
      out.push_back({{"type", "function"}, {"function", std::move(fn)}});
    }
    if (!out.empty()) chat["tools"] = std::move(out);
  }
  if (const ojson* tc = get(b, "tool_choice")) {
    if (!tc->is_object()) bad("tool_choice", "must be an object {\"type\": auto|any|tool|none}");
    const std::string type = str(*tc, "type", "tool_choice", true);
    if (type == "auto" || type == "none") {
      chat["tool_choice"] = type;
    } else if (type == "any" || type == "tool") {
      if (names.empty()) bad("tool_choice.type", fmt::format("'{}' needs at least one tool in 'tools'", type));
      if (type == "any") {
        chat["tool_choice"] = "required";
      } else {
        const std::string name = str(*tc, "name", "tool_choice", true);
        if (!names.count(name)) bad("tool_choice.name", fmt::format("no tool named '{}' in 'tools'", name));
        chat["tool_choice"] = {{"type", "function"}, {"function", {{"name", name}}}};
      }
    } else {
      bad("tool_choice.type", fmt::format("'{}' is not one of auto, any, tool, none", type));
    }
    // one tool call at most (chat's parallel_tool_calls false)
    if (const ojson* dp = get(*tc, "disable_parallel_tool_use")) {
      if (!dp->is_boolean()) bad("tool_choice.disable_parallel_tool_use", "must be a boolean");
      if (dp->get<bool>()) chat["parallel_tool_calls"] = false;
    }
  }
}

}  // namespace

AnthropicRequest anthropic_to_chat(const ojson& b, const Limits& lim, bool count_only) {
  AnthropicRequest r;
  ojson& chat = r.chat;
  chat = ojson::object();
  if (const ojson* m = get(b, "model"))
    if (!m->is_string()) bad("model", "must be a string");
  if (!count_only) {
    const ojson* mt = get(b, "max_tokens");
    if (!mt) bad("max_tokens", "Field required");
    if (!mt->is_number_integer() || mt->get<int64_t>() < 1) bad("max_tokens", "must be a positive integer");
    chat["max_tokens"] = clamp_output_tokens(mt->get<int64_t>(), lim);
  }
  if (const ojson* s = get(b, "stream")) {
    if (!s->is_boolean()) bad("stream", "must be a boolean");
    r.stream = s->get<bool>();
  }
  for (const char* k : {"temperature", "top_p"}) {
    if (const ojson* v = get(b, k)) {
      if (!v->is_number() || v->get<double>() < 0 || v->get<double>() > 1) bad(k, "must be a number between 0 and 1");
      chat[k] = *v;
    }
  }
  if (const ojson* v = get(b, "top_k")) {
    if (!v->is_number_integer() || v->get<int64_t>() < 0) bad("top_k", "must be a non-negative integer");
    chat["top_k"] = *v;
  }
  if (const ojson* ss = get(b, "stop_sequences")) {
    if (!ss->is_array()) bad("stop_sequences", "must be an array of strings");
    // every stop string is matched against the text after every token: bounded (520 000 of them
    // cost 5 ms per token on the scheduler thread)
    if (ss->size() > kMaxStopSequences)
      bad("stop_sequences", fmt::format("at most {} stop sequences are allowed", kMaxStopSequences));
    for (size_t i = 0; i < ss->size(); ++i) {
      const ojson& s = (*ss)[i];
      if (!s.is_string() || s.get<std::string>().empty())
        bad(fmt::format("stop_sequences[{}]", i), "must be a non-empty string");
      if (s.get<std::string>().size() > kMaxStopBytes)
        bad(fmt::format("stop_sequences[{}]", i), fmt::format("may have at most {} bytes", kMaxStopBytes));
      r.stop_sequences.push_back(s.get<std::string>());
    }
  }
  if (const ojson* md = get(b, "metadata"))
    if (!md->is_object()) bad("metadata", "must be an object");
  if (const ojson* mcp = get(b, "mcp_servers"))
    if (!mcp->is_array() || !mcp->empty()) bad("mcp_servers", "MCP servers are not supported (kimi serve connects to no server)");
  map_thinking(b, chat);
  std::set<std::string> tool_names;
  FieldMap& fm = r.fields;
  map_tools(b, chat, tool_names, fm);
  for (const char* k : {"max_tokens", "temperature", "top_p", "top_k", "tool_choice", "thinking"}) fm.add(k, k);
  for (const auto& [c, own] : {std::pair{"thinking_budget_tokens", "thinking.budget_tokens"},
                               {"thinking_effort", "output_config.effort"},
                               {"response_format", "output_config.format"},
                               {"response_format.json_schema.schema", "output_config.format.schema"},
                               {"parallel_tool_calls", "tool_choice.disable_parallel_tool_use"}})
    fm.add(c, own);

  ojson msgs = ojson::array();
  auto chat_msg = [&] { return fmt::format("messages[{}]", msgs.size()); };  // the next chat message's path
  if (const ojson* sys = get(b, "system")) {
    const std::string s = system_text(*sys);
    if (!s.empty()) {
      fm.add(chat_msg(), "system");
      msgs.push_back({{"role", "system"}, {"content", s}});
    }
  }
  const ojson* m = get(b, "messages");
  if (!m) bad("messages", "Field required");
  if (!m->is_array()) bad("messages", "must be an array");
  if (m->empty()) bad("messages", "must contain at least one message");
  std::set<std::string> open_calls;  // tool_use ids of the last assistant message without a result yet
  std::set<std::string> all_ids;
  for (size_t i = 0; i < m->size(); ++i) {
    const ojson& msg = (*m)[i];
    const std::string w = fmt::format("messages[{}]", i);
    if (!msg.is_object()) bad(w, "must be an object");
    const std::string role = str(msg, "role", w, true);
    if (role != "user" && role != "assistant" && role != "system")
      bad(w + ".role", fmt::format("'{}' is not one of user, assistant, system", role));
    const ojson* content = get(msg, "content");
    if (!content) bad(w + ".content", "Field required");
    if (role == "system") {  // Claude Code sends system messages between the turns too
      fm.add(chat_msg(), w);
      msgs.push_back({{"role", "system"}, {"content", text_of(*content, w + ".content")}});
      continue;
    }
    ojson blocks = content->is_string() ? ojson::array({{{"type", "text"}, {"text", *content}}}) : *content;
    if (!blocks.is_array()) bad(w + ".content", "must be a string or an array of content blocks");
    if (role == "user") {
      std::string text;
      ojson parts = ojson::array();  // with an image: the message's parts (text blocks joined by "\n")
      bool open = false;              // text holds a part not yet in parts
      for (size_t j = 0; j < blocks.size(); ++j) {
        const ojson& bl = blocks[j];
        const std::string bw = fmt::format("{}.content[{}]", w, j);
        if (!bl.is_object()) bad(bw, "must be an object");
        const std::string type = str(bl, "type", bw, true);
        if (type == "text") {
          if (open) text += "\n";
          text += str(bl, "text", bw, true);
          open = true;
        } else if (type == "image") {
          if (open) parts.push_back({{"type", "text"}, {"text", text}});
          text.clear();
          open = false;
          // the user message comes after this block's tool results: its path is known at the end
          parts.push_back(image_part(bl, bw, fmt::format("@user.content[{}]", parts.size()), fm));
        } else if (type == "tool_result") {
          const std::string id = str(bl, "tool_use_id", bw, true);
          if (!open_calls.count(id))
            bad(bw + ".tool_use_id",
                all_ids.count(id) ? fmt::format("tool_use '{}' already has a result", id)
                                  : fmt::format("no tool_use with id '{}' in the preceding assistant message", id));
          open_calls.erase(id);
          const ojson* err = get(bl, "is_error");
          if (err && !err->is_boolean()) bad(bw + ".is_error", "must be a boolean");
          ojson out = "";
          if (const ojson* c = get(bl, "content"))
            out = blocks_content(*c, bw + ".content", chat_msg() + ".content", fm, err && err->get<bool>() ? "Error: " : "");
          else if (err && err->get<bool>())
            out = "Error: ";
          fm.add(chat_msg(), bw);
          fm.add(chat_msg() + ".tool_call_id", bw + ".tool_use_id");
          msgs.push_back({{"role", "tool"}, {"tool_call_id", id}, {"content", out}});
        } else if (type == "document") {
          bad(bw + ".type", "'document' blocks are not supported (text, image and tool_result are)");
        } else {
          bad(bw + ".type",
              fmt::format("content block type '{}' is not supported in a user message (text, image, tool_result)", type));
        }
      }
      if (!parts.empty()) {  // with images: the parts in order (their paths were recorded as @user)
        if (open) parts.push_back({{"type", "text"}, {"text", text}});
        fm.rebase("@user", chat_msg());
        fm.add(chat_msg(), w);
        msgs.push_back({{"role", "user"}, {"content", std::move(parts)}});
      } else if (!text.empty() || blocks.empty()) {
        fm.add(chat_msg(), w);
        msgs.push_back({{"role", "user"}, {"content", text}});
      }
      // docs/server.md: the results of an assistant's tool calls are in the very next user message
      if (!open_calls.empty())
        bad(w, fmt::format("tool_use '{}' has no tool_result in this message (the user message right after it)",
                           *open_calls.begin()));
      continue;
    }
    if (!open_calls.empty())
      bad(w, fmt::format("tool_use '{}' has no tool_result in the next user message", *open_calls.begin()));
    if (i + 1 == m->size()) bad(w, "a final assistant message (prefill) is not supported; end with a user message");
    std::string text, reasoning;
    ojson calls = ojson::array();
    for (size_t j = 0; j < blocks.size(); ++j) {
      const ojson& bl = blocks[j];
      const std::string bw = fmt::format("{}.content[{}]", w, j);
      if (!bl.is_object()) bad(bw, "must be an object");
      const std::string type = str(bl, "type", bw, true);
      if (type == "text") {
        text += str(bl, "text", bw, true);
      } else if (type == "thinking") {
        reasoning += str(bl, "thinking", bw, true);
      } else if (type == "redacted_thinking") {
        // encrypted reasoning of another model: nothing K3 can read
      } else if (type == "tool_use") {
        const std::string id = str(bl, "id", bw, true);
        const std::string name = str(bl, "name", bw, true);
        if (id.empty()) bad(bw + ".id", "must not be empty");
        if (name.empty()) bad(bw + ".name", "must not be empty");
        if (!all_ids.insert(id).second) bad(bw + ".id", fmt::format("tool_use id '{}' is used twice", id));
        const ojson* in = get(bl, "input");
        if (!in) bad(bw + ".input", "Field required");
        if (!in->is_object()) bad(bw + ".input", fmt::format("must be a JSON object (got {})", in->type_name()));
        fm.add_call(fmt::format("{}.tool_calls[{}]", chat_msg(), calls.size()), bw, "id", "input");
        calls.push_back({{"id", id}, {"type", "function"}, {"function", {{"name", name}, {"arguments", *in}}}});
        open_calls.insert(id);
      } else {
        bad(bw + ".type",
            fmt::format("content block type '{}' is not supported in an assistant message (text, thinking, "
                        "redacted_thinking, tool_use)", type));
      }
    }
    fm.add(chat_msg(), w);
    ojson am = {{"role", "assistant"}, {"content", text}};
    if (!reasoning.empty()) am["reasoning_content"] = reasoning;
    if (!calls.empty()) am["tool_calls"] = std::move(calls);
    msgs.push_back(std::move(am));
  }
  if (!open_calls.empty())
    bad("messages", fmt::format("tool_use '{}' has no tool_result in the next user message", *open_calls.begin()));
  chat["messages"] = std::move(msgs);
  return r;
}

std::string anthropic_error_type(int status) {
  switch (status) {
    case 400: return "invalid_request_error";
    case 401: return "authentication_error";
    case 403: return "permission_error";
    case 404: return "not_found_error";
    case 408: return "timeout_error";
    case 413: return "request_too_large";
    case 429: return "rate_limit_error";
    case 503: return "overloaded_error";
    default: return status >= 500 ? "api_error" : "invalid_request_error";
  }
}

ojson anthropic_error_json(int status, const std::string& message) {
  return {{"type", "error"}, {"error", {{"type", anthropic_error_type(status)}, {"message", message}}}};
}

std::string anthropic_stop_reason(const Job::Result& r) {
  if (r.finish_reason == FinishReason::ToolCalls) return "tool_use";
  if (r.finish_reason == FinishReason::Length || r.finish_reason == FinishReason::Timeout) return "max_tokens";
  if (!r.stop_string.empty()) return "stop_sequence";
  return "end_turn";
}

void anthropic_reshape_error(const httpd::Request& req, httpd::Reply& out) {
  if (out.status < 400 || req.path.rfind("/v1/messages", 0) != 0) return;
  const ojson j = ojson::parse(out.body, nullptr, false);
  std::string msg = "error";
  if (j.is_object() && j.contains("error") && j["error"].is_object() && j["error"].contains("message"))
    msg = j["error"]["message"].get<std::string>();
  out.body = wire_json(anthropic_error_json(out.status, msg));
  out.content_type = "application/json";
}

namespace {

ojson usage(const Job::Result& r) {
  return {{"input_tokens", r.n_prompt - r.n_cached},
          {"cache_creation_input_tokens", 0},
          {"cache_read_input_tokens", r.n_cached},
          {"output_tokens", r.n_generated}};
}

// The request as the engine's: the chat body through parse_chat_request, then what it cannot say.
ParsedRequest parse(const Endpoint& e, const httpd::Request& req, const Limits& lim, bool count_only, AnthropicRequest& ar) {
  const ojson b = parse_body(req.body);
  ar = anthropic_to_chat(b, lim, count_only);
  ParsedRequest pr = parse_as_chat(ar.chat, ar.fields, e.tok, lim);
  pr.gen.stop = ar.stop_sequences;
  return pr;
}

// A Message, or Anthropic's event stream: message_start, content blocks (thinking, text, tool_use
// whose input arrives in input_json_delta pieces), message_delta with the stop reason and usage,
// message_stop; `ping` while the prompt is read (with its progress) and as keep-alive. A stream
// that does not end normally ends with an error event and no message_stop.
class AnthropicRenderer final : public Renderer {
 public:
  explicit AnthropicRenderer(const Endpoint& e) : e_(e) {}
  const char* id_prefix() const override { return "msg_"; }
  int n_prompt = 0;

  std::string stream_head(size_t) override {
    const ojson start = {
        {"type", "message_start"},
        {"message",
         {{"id", id}, {"type", "message"}, {"role", "assistant"}, {"content", ojson::array()}, {"model", e_.model_id},
          {"stop_reason", nullptr}, {"stop_sequence", nullptr},
          {"usage", {{"input_tokens", n_prompt}, {"cache_creation_input_tokens", 0}, {"cache_read_input_tokens", 0},
                     {"output_tokens", 0}}}}}};
    return sse_event("message_start", start) + sse_event("ping", {{"type", "ping"}});
  }
  void thinking(size_t, const std::string& t, std::string& buf) override { text_delta(buf, "thinking", t); }
  void content(size_t, const std::string& t, std::string& buf) override { text_delta(buf, "text", t); }
  // a tool call as it is generated: its block starts with the name, its input arrives in
  // input_json_delta pieces (together exactly the whole answer's input), the block stops with the call
  void tool_start(size_t, const std::string& name, std::string& buf) override {
    close_block(buf);
    ++index_;
    open_ = "tool_use";
    buf += sse_event("content_block_start",
                     {{"type", "content_block_start"}, {"index", index_},
                      {"content_block", {{"type", "tool_use"}, {"id", call_id(n_calls_++)}, {"name", name}, {"input", ojson::object()}}}});
  }
  void tool_args(size_t, const std::string& piece, std::string& buf) override {
    if (open_ != "tool_use") return;
    buf += sse_event("content_block_delta", {{"type", "content_block_delta"}, {"index", index_},
                                             {"delta", {{"type", "input_json_delta"}, {"partial_json", piece}}}});
  }
  void tool_done(size_t, std::string& buf) override {
    if (open_ == "tool_use") close_block(buf);
  }
  std::string progress(const Progress& p) override {
    ojson ping = {{"type", "ping"}};
    if (p.reading)
      ping["prompt_progress"] = {{"total", p.total}, {"cache", p.cache}, {"processed", p.processed}, {"time_ms", std::round(p.time_ms)}};
    return sse_event("ping", ping);
  }
  void finish(size_t, const Job::Result& r, std::string& buf) override {
    close_block(buf);
    buf += sse_event("message_delta",
                     {{"type", "message_delta"},
                      {"delta", {{"stop_reason", anthropic_stop_reason(r)},
                                 {"stop_sequence", r.stop_string.empty() ? ojson(nullptr) : ojson(r.stop_string)}}},
                      {"usage", usage(r)}});
  }
  std::string stream_tail(const std::vector<Job::Result>&) override { return sse_event("message_stop", {{"type", "message_stop"}}); }
  std::string stream_error(const ApiError& err) override {
    return sse_event("error", anthropic_error_json(err.status, err.what()));
  }

  httpd::Reply whole(const std::vector<Choice>& cs) override {
    const JobOutput& out = cs[0].out;
    const Job::Result& r = cs[0].result;
    ojson content = ojson::array();
    if (!out.reasoning.empty()) content.push_back({{"type", "thinking"}, {"thinking", out.reasoning}, {"signature", ""}});
    if (!out.content.empty() || (out.tool_calls.empty() && out.reasoning.empty()))
      content.push_back({{"type", "text"}, {"text", out.content}});
    for (size_t i = 0; i < out.tool_calls.size(); ++i)  // a call cut by max_tokens too, as its stream sent it
      content.push_back({{"type", "tool_use"}, {"id", call_id(i)}, {"name", out.tool_calls[i].name},
                         {"input", tool_call_input(out.tool_calls[i])}});
    return json_reply({{"id", id}, {"type", "message"}, {"role", "assistant"}, {"model", e_.model_id},
                  {"content", std::move(content)}, {"stop_reason", anthropic_stop_reason(r)},
                  {"stop_sequence", r.stop_string.empty() ? ojson(nullptr) : ojson(r.stop_string)},
                  {"usage", usage(r)}});
  }
  httpd::Reply error(const ApiError& err) override { return json_reply(anthropic_error_json(err.status, err.what()), err.status); }

 private:
  std::string call_id(size_t i) const { return fmt::format("toolu_{}_{}", id, i); }
  void close_block(std::string& buf) {
    if (open_.empty()) return;
    buf += sse_event("content_block_stop", {{"type", "content_block_stop"}, {"index", index_}});
    open_.clear();
  }
  void text_delta(std::string& buf, const char* type, const std::string& text) {
    const bool thinking = std::string(type) == "thinking";
    if (open_ != type) {
      close_block(buf);
      open_ = type;
      ++index_;
      const ojson block = thinking ? ojson{{"type", "thinking"}, {"thinking", ""}, {"signature", ""}}
                                   : ojson{{"type", "text"}, {"text", ""}};
      buf += sse_event("content_block_start", {{"type", "content_block_start"}, {"index", index_}, {"content_block", block}});
    }
    const ojson d = thinking ? ojson{{"type", "thinking_delta"}, {"thinking", text}} : ojson{{"type", "text_delta"}, {"text", text}};
    buf += sse_event("content_block_delta", {{"type", "content_block_delta"}, {"index", index_}, {"delta", d}});
  }
  const Endpoint& e_;
  int index_ = -1;     // the open content block
  std::string open_;   // its type ("" none)
  size_t n_calls_ = 0;
};

}  // namespace

void anthropic_messages(const Endpoint& e, const httpd::Request& req, httpd::Responder& res) {
  AnthropicRenderer r(e);
  drive(e, res, r, [&](const Limits& lim) {
    AnthropicRequest ar;
    ParsedRequest pr = parse(e, req, lim, false, ar);
    pr.stream = ar.stream;
    pr.n = 1;
    r.n_prompt = static_cast<int>(pr.prompt.size());
    return pr;
  });
}

void anthropic_count_tokens(const Endpoint& e, const httpd::Request& req, httpd::Responder& res) {
  AnthropicRenderer r(e);
  answer(res, r, [&] {
    AnthropicRequest ar;
    const ParsedRequest pr = parse(e, req, e.lim, true, ar);
    res.send(json_reply({{"input_tokens", pr.prompt.size()}}));
  });
}

}  // namespace kimi::server
