// OpenAI Responses API -> the chat endpoint's internal request, and the engine's output -> a
// Response object / the Responses event stream (api_responses.h).
#include "server/api_responses.h"

#include <fmt/format.h>

#include <cmath>
#include <set>

#include "util/error.h"
#include "util/json.h"

namespace kimi::server {

namespace {

const FieldReader kFields{[](const std::string& param, const std::string& msg) { return fmt::format("'{}': {}", param, msg); },
                          "is required"};
[[noreturn]] void bad(const std::string& param, const std::string& msg) { kFields.bad(param, msg); }
const ojson* get(const ojson& o, const char* k) { return FieldReader::get(o, k); }
std::string str(const ojson& o, const char* k, const std::string& where, bool required) {
  return kFields.str(o, k, where, required);
}

// One text part (input_text, output_text, text, refusal) at `w`.
std::string part_text(const ojson& p, const std::string& w) {
  if (!p.is_object()) bad(w, "must be an object");
  const std::string type = str(p, "type", w, true);
  if (type == "input_text" || type == "output_text" || type == "text") return str(p, "text", w, true);
  if (type == "refusal") return str(p, "refusal", w, true);
  if (type == "input_image")
    bad(w + ".type", "'input_image' is allowed in user, system and developer messages and function_call_output only");
  if (type == "input_file" || type == "input_audio") bad(w + ".type", fmt::format("'{}' is not supported", type));
  bad(w + ".type", fmt::format("content part type '{}' is not supported (input_text, output_text, input_image)", type));
}

// A message's content: a string or text parts.
std::string content_text(const ojson& c, const std::string& where) {
  if (c.is_string()) return c.get<std::string>();
  if (!c.is_array()) bad(where, "must be a string or an array of content parts");
  std::string out;
  for (size_t i = 0; i < c.size(); ++i) out += part_text(c[i], fmt::format("{}[{}]", where, i));
  return out;
}

// User, system and tool content that may hold images: the text alone when there is no input_image
// part, else chat parts in order (text between images concatenated; each input_image an image_url
// part at chat path `path`[k], its errors named by the input part).
ojson content_parts(const ojson& c, const std::string& where, const std::string& path, FieldMap& fm) {
  if (!c.is_array()) return content_text(c, where);
  ojson parts = ojson::array();
  std::string text;
  bool any_image = false;
  for (size_t i = 0; i < c.size(); ++i) {
    const ojson& p = c[i];
    const std::string w = fmt::format("{}[{}]", where, i);
    if (!p.is_object()) bad(w, "must be an object");
    if (str(p, "type", w, true) != "input_image") {
      text += part_text(p, w);
      continue;
    }
    if (get(p, "file_id")) bad(w + ".file_id", "is not supported (the server keeps no files): send image_url as a data: URL");
    const ojson* u = get(p, "image_url");
    if (!u) bad(w + ".image_url", "is required (a data: URL)");
    if (!text.empty()) parts.push_back({{"type", "text"}, {"text", std::move(text)}});
    text.clear();
    const std::string cp = fmt::format("{}[{}]", path, parts.size());
    fm.add(cp, w);
    fm.add(cp + ".image_url", w + ".image_url");
    fm.add(cp + ".image_url.url", w + ".image_url");
    ojson iu = {{"url", *u}};
    if (const ojson* d = get(p, "detail")) iu["detail"] = *d;
    parts.push_back({{"type", "image_url"}, {"image_url", std::move(iu)}});
    any_image = true;
  }
  if (!any_image) return text;
  if (!text.empty()) parts.push_back({{"type", "text"}, {"text", std::move(text)}});
  return parts;
}

void map_tools(const ojson& b, ojson& chat, ojson& echo, FieldMap& fm) {
  std::set<std::string> names;
  if (const ojson* tools = get(b, "tools")) {
    if (!tools->is_array()) bad("tools", "must be an array");
    ojson out = ojson::array();
    for (size_t i = 0; i < tools->size(); ++i) {
      const ojson& t = (*tools)[i];
      const std::string w = fmt::format("tools[{}]", i);
      if (!t.is_object()) bad(w, "must be an object");
      const std::string type = str(t, "type", w, true);
      // hosted tools (web_search, file_search, code_interpreter, mcp, ...) and custom (free-form)
      // tools have nothing to run them here: they are left out
      if (type != "function") continue;
      const std::string name = str(t, "name", w, true);
      if (name.empty()) bad(w + ".name", "must not be empty");
      if (!names.insert(name).second) bad(w + ".name", fmt::format("tool name '{}' is declared twice", name));
      ojson fn = {{"name", name}};
      const std::string desc = str(t, "description", w, false);
      if (!desc.empty()) fn["description"] = desc;
      if (const ojson* p = get(t, "parameters")) {
        if (!p->is_object()) bad(w + ".parameters", "must be an object (a JSON schema)");
        fn["parameters"] = *p;
      }
      fm.add_tool(out.size(), w, "parameters");  // hosted tools left out: other indices
      out.push_back({{"type", "function"}, {"function", std::move(fn)}});
    }
    echo["tools"] = *tools;
    if (!out.empty()) chat["tools"] = std::move(out);
  }
  if (const ojson* tc = get(b, "tool_choice")) {
    echo["tool_choice"] = *tc;
    if (tc->is_string()) {
      const std::string s = tc->get<std::string>();
      if (s != "auto" && s != "none" && s != "required") bad("tool_choice", fmt::format("'{}' is not one of auto, none, required", s));
      if (s == "required" && names.empty()) bad("tool_choice", "'required' needs at least one function tool in 'tools'");
      chat["tool_choice"] = s;
    } else if (tc->is_object()) {
      const std::string type = str(*tc, "type", "tool_choice", true);
      if (type != "function") bad("tool_choice.type", fmt::format("'{}' is not supported (function)", type));
      const std::string name = str(*tc, "name", "tool_choice", true);
      if (!names.count(name)) bad("tool_choice.name", fmt::format("no function tool named '{}' in 'tools'", name));
      chat["tool_choice"] = {{"type", "function"}, {"function", {{"name", name}}}};
    } else {
      bad("tool_choice", "must be a string or an object");
    }
  }
  // false: one tool call at most (echoed as given; default true)
  if (const ojson* pc = get(b, "parallel_tool_calls")) {
    if (!pc->is_boolean()) bad("parallel_tool_calls", "must be a boolean");
    chat["parallel_tool_calls"] = *pc;
    echo["parallel_tool_calls"] = *pc;
  }
}

}  // namespace

ResponsesRequest responses_to_chat(const ojson& b, const Limits& lim) {
  ResponsesRequest r;
  ojson& chat = r.chat;
  chat = ojson::object();
  r.echo = ojson::object();
  for (const char* k : {"previous_response_id", "conversation"})
    if (get(b, k))
      bad(k, "is not supported: kimi serve keeps no responses (stateless, as with store: false); send the whole "
             "conversation in 'input'");
  if (const ojson* bg = get(b, "background"))
    if (!bg->is_boolean() || bg->get<bool>()) bad("background", "background responses are not supported");
  if (get(b, "prompt")) bad("prompt", "stored prompt templates are not supported; send 'instructions' and 'input'");
  if (const ojson* m = get(b, "model"))
    if (!m->is_string()) bad("model", "must be a string");
  if (const ojson* s = get(b, "stream")) {
    if (!s->is_boolean()) bad("stream", "must be a boolean");
    r.stream = s->get<bool>();
  }
  if (const ojson* s = get(b, "store"))
    if (!s->is_boolean()) bad("store", "must be a boolean");
  for (const char* k : {"temperature", "top_p"})
    if (const ojson* v = get(b, k)) {
      chat[k] = *v;
      r.echo[k] = *v;
    }
  if (const ojson* mt = get(b, "max_output_tokens")) {
    if (!mt->is_number_integer() || mt->get<int64_t>() < 1) bad("max_output_tokens", "must be a positive integer");
    chat["max_tokens"] = clamp_output_tokens(mt->get<int64_t>(), lim);
    r.echo["max_output_tokens"] = *mt;
  }
  if (const ojson* md = get(b, "metadata")) {
    if (!md->is_object()) bad("metadata", "must be an object");
    r.echo["metadata"] = *md;
  }
  // reasoning.effort -> K3's thinking (map_reasoning_effort); none given: the K3 default (thinking on)
  if (const ojson* re = get(b, "reasoning")) {
    if (!re->is_object()) bad("reasoning", "must be an object");
    r.echo["reasoning"] = *re;
    if (const ojson* ef = get(*re, "effort")) {
      if (!ef->is_string() || !map_reasoning_effort(ef->get<std::string>(), chat))
        bad("reasoning.effort", fmt::format("{} is not one of none, minimal, low, medium, high, xhigh", ef->dump()));
    }
  }
  if (const ojson* t = get(b, "text")) {
    if (!t->is_object()) bad("text", "must be an object");
    r.echo["text"] = *t;
    if (const ojson* f = get(*t, "format")) {
      if (!f->is_object()) bad("text.format", "must be an object");
      const std::string ft = str(*f, "type", "text.format", true);
      if (ft == "json_schema") {
        const ojson* sc = get(*f, "schema");
        if (!sc || !sc->is_object()) bad("text.format.schema", "must be an object (a JSON schema)");
        const std::string name = str(*f, "name", "text.format", false);
        ojson js = {{"name", name.empty() ? std::string("output") : name}, {"schema", *sc}};
        if (const ojson* st = get(*f, "strict")) js["strict"] = *st;
        chat["response_format"] = {{"type", "json_schema"}, {"json_schema", std::move(js)}};
      } else if (ft == "json_object") {
        chat["response_format"] = {{"type", "json_object"}};
      } else if (ft != "text") {
        bad("text.format.type", fmt::format("'{}' is not one of text, json_schema, json_object", ft));
      }
    }
  }
  FieldMap& fm = r.fields;
  map_tools(b, chat, r.echo, fm);
  for (const char* k : {"temperature", "top_p", "tool_choice", "parallel_tool_calls"}) fm.add(k, k);
  for (const auto& [c, own] : {std::pair{"max_tokens", "max_output_tokens"},
                               {"thinking", "reasoning.effort"},
                               {"thinking_effort", "reasoning.effort"},
                               {"response_format", "text.format"},
                               {"response_format.json_schema.schema", "text.format.schema"},
                               {"response_format.json_schema.name", "text.format.name"},
                               {"response_format.json_schema.strict", "text.format.strict"}})
    fm.add(c, own);

  ojson msgs = ojson::array();
  auto chat_msg = [&] { return fmt::format("messages[{}]", msgs.size()); };  // the next chat message's path
  if (const ojson* ins = get(b, "instructions")) {
    if (!ins->is_string()) bad("instructions", "must be a string");
    r.echo["instructions"] = *ins;
    if (!ins->get<std::string>().empty()) {
      fm.add(chat_msg(), "instructions");
      msgs.push_back({{"role", "system"}, {"content", *ins}});
    }
  }
  const ojson* in = get(b, "input");
  if (!in) bad("input", "is required");
  ojson items = in->is_string() ? ojson::array({{{"role", "user"}, {"content", *in}}}) : *in;
  if (!items.is_array()) bad("input", "must be a string or an array of input items");
  if (items.empty()) bad("input", "must not be empty");
  // consecutive assistant-side items (reasoning, an assistant message, function calls) make one
  // assistant message of the chat
  ojson asst;  // null: none open
  std::set<std::string> call_ids, answered;
  auto flush = [&] {
    if (asst.is_null()) return;
    msgs.push_back(std::move(asst));
    asst = nullptr;
  };
  auto assistant = [&]() -> ojson& {
    if (asst.is_null()) asst = {{"role", "assistant"}, {"content", ""}};
    return asst;
  };
  for (size_t i = 0; i < items.size(); ++i) {
    const ojson& it = items[i];
    const std::string w = fmt::format("input[{}]", i);
    if (!it.is_object()) bad(w, "must be an object");
    std::string type = str(it, "type", w, false);
    if (type.empty()) {
      if (!get(it, "role")) bad(w + ".type", "is required (or a 'role' for a message)");
      type = "message";
    }
    if (type == "message") {
      const std::string role = str(it, "role", w, true);
      const ojson* c = get(it, "content");
      if (!c) bad(w + ".content", "is required");
      if (role == "assistant") {
        const std::string text = content_text(*c, w + ".content");
        ojson& a = assistant();
        if (a.contains("tool_calls")) {  // text after calls: a new assistant turn
          flush();
          assistant();
        }
        asst["content"] = asst["content"].get<std::string>() + text;
        fm.add(chat_msg(), w);
        fm.add(chat_msg() + ".content", w + ".content");
      } else if (role == "user" || role == "system" || role == "developer") {
        flush();
        ojson content = content_parts(*c, w + ".content", chat_msg() + ".content", fm);
        fm.add(chat_msg(), w);
        msgs.push_back({{"role", role == "developer" ? "system" : role}, {"content", std::move(content)}});
      } else {
        bad(w + ".role", fmt::format("'{}' is not one of user, assistant, system, developer", role));
      }
    } else if (type == "reasoning") {
      std::string text;
      if (const ojson* c = get(it, "content")) {
        if (!c->is_array()) bad(w + ".content", "must be an array");
        for (size_t j = 0; j < c->size(); ++j) text += str((*c)[j], "text", fmt::format("{}.content[{}]", w, j), true);
      }
      if (text.empty())
        if (const ojson* s = get(it, "summary")) {
          if (!s->is_array()) bad(w + ".summary", "must be an array");
          for (size_t j = 0; j < s->size(); ++j) text += str((*s)[j], "text", fmt::format("{}.summary[{}]", w, j), true);
        }
      if (!asst.is_null() && (asst.contains("tool_calls") || !asst["content"].get<std::string>().empty())) flush();
      ojson& a = assistant();
      a["reasoning_content"] = a.value("reasoning_content", std::string()) + text;
      fm.add(chat_msg() + ".reasoning_content", w);
    } else if (type == "function_call") {
      const std::string id = str(it, "call_id", w, true);
      const std::string name = str(it, "name", w, true);
      if (id.empty()) bad(w + ".call_id", "must not be empty");
      if (name.empty()) bad(w + ".name", "must not be empty");
      if (!call_ids.insert(id).second) bad(w + ".call_id", fmt::format("call_id '{}' is used twice", id));
      const std::string args = str(it, "arguments", w, true);
      const ojson parsed = try_parse_json<ojson>(args);
      if (parsed.is_discarded() || !parsed.is_object())
        bad(w + ".arguments", "must be a JSON object (as a string)");
      ojson& a = assistant();
      if (!a.contains("tool_calls")) a["tool_calls"] = ojson::array();
      fm.add_call(fmt::format("{}.tool_calls[{}]", chat_msg(), a["tool_calls"].size()), w, "call_id", "arguments");
      a["tool_calls"].push_back({{"id", id}, {"type", "function"}, {"function", {{"name", name}, {"arguments", parsed}}}});
    } else if (type == "function_call_output") {
      const std::string id = str(it, "call_id", w, true);
      if (!call_ids.count(id)) bad(w + ".call_id", fmt::format("no function_call with call_id '{}' before it", id));
      if (!answered.insert(id).second) bad(w + ".call_id", fmt::format("function_call '{}' already has an output", id));
      const ojson* o = get(it, "output");
      if (!o) bad(w + ".output", "is required");
      flush();
      ojson out = content_parts(*o, w + ".output", chat_msg() + ".content", fm);
      fm.add(chat_msg(), w);
      fm.add(chat_msg() + ".tool_call_id", w + ".call_id");
      fm.add(chat_msg() + ".content", w + ".output");
      msgs.push_back({{"role", "tool"}, {"tool_call_id", id}, {"content", out}});
    } else {
      bad(w + ".type",
          fmt::format("input item type '{}' is not supported (message, reasoning, function_call, "
                      "function_call_output)", type));
    }
  }
  flush();
  chat["messages"] = std::move(msgs);
  return r;
}

namespace {

// A Response object, or the Responses event stream (every event with its sequence_number):
// response.created and response.in_progress, output items (reasoning, message, function_call whose
// arguments arrive in delta pieces) added, filled and done, then response.completed or
// response.incomplete with the whole Response; response.in_progress again while the prompt is read
// (with its progress) and as keep-alive. A stream that does not end normally ends with an error event.
class ResponsesRenderer final : public Renderer {
 public:
  ResponsesRenderer(const Endpoint& e, const ResponsesRequest& rq) : e_(e), rq_(rq), created_(unix_seconds()) {}
  const char* id_prefix() const override { return "resp_"; }

  std::string stream_head(size_t) override {
    const ojson initial = object("in_progress", ojson::array(), nullptr, nullptr);
    std::string head = ev("response.created", {{"response", initial}});  // in this order: sequence numbers
    return head + ev("response.in_progress", {{"response", initial}});
  }
  void thinking(size_t, const std::string& t, std::string& buf) override { delta(buf, Reasoning, t); }
  void content(size_t, const std::string& t, std::string& buf) override { delta(buf, Message, t); }
  // a function call as it is generated: the item is added with its name, the arguments arrive in
  // delta pieces (together exactly the whole answer's arguments), the item is done with the call
  void tool_start(size_t, const std::string& name, std::string& buf) override {
    close(buf);
    open_ = Call;
    ++out_index_;
    call_name_ = name;
    call_done_ = false;
    const size_t i = n_calls_++;
    buf += ev("response.output_item.added", {{"output_index", out_index_}, {"item", call_item(i, name, "", "in_progress")}});
  }
  void tool_args(size_t, const std::string& piece, std::string& buf) override {
    if (open_ != Call) return;
    text_ += piece;
    buf += ev("response.function_call_arguments.delta", {{"item_id", fc(n_calls_ - 1)}, {"output_index", out_index_}, {"delta", piece}});
  }
  void tool_done(size_t, std::string& buf) override {
    if (open_ != Call) return;
    call_done_ = true;
    close(buf);
  }
  std::string progress(const Progress& p) override {
    ojson d = {{"response", object("in_progress", output_, nullptr, nullptr)}};
    if (p.reading)
      d["prompt_progress"] = {{"total", p.total}, {"cache", p.cache}, {"processed", p.processed}, {"time_ms", std::round(p.time_ms)}};
    return ev("response.in_progress", std::move(d));
  }
  void finish(size_t, const Job::Result& r, std::string& buf) override {
    if (output_.empty() && open_ == None) delta(buf, Message, "");  // an answer has at least its (empty) message
    close(buf);
    const bool incomplete = is_cut(r.finish_reason);
    buf += ev(incomplete ? "response.incomplete" : "response.completed",
              {{"response", object(incomplete ? "incomplete" : "completed", output_, usage_of(r), incomplete_details(r))}});
  }
  std::string stream_tail(const std::vector<Job::Result>&) override { return {}; }
  std::string stream_error(const ApiError& err) override {
    return ev("error", {{"code", err.status >= 500 ? "server_error" : "invalid_request_error"}, {"message", err.what()}, {"param", nullptr}});
  }

  httpd::Reply whole(const std::vector<Choice>& cs) override {
    const JobOutput& out = cs[0].out;
    const Job::Result& r = cs[0].result;
    ojson output = ojson::array();
    if (!out.reasoning.empty()) output.push_back(reasoning_item(out.reasoning, true));
    if (!out.content.empty() || (out.tool_calls.empty() && out.reasoning.empty())) output.push_back(message_item(out.content, true));
    for (size_t i = 0; i < out.tool_calls.size(); ++i) {  // a call cut by max_output_tokens too, "incomplete"
      const tok::ParsedToolCall& c = out.tool_calls[i];
      output.push_back(call_item(i, c.name, wire_json(tool_call_input(c)), c.complete ? "completed" : "incomplete"));
    }
    const bool incomplete = is_cut(r.finish_reason);
    return json_reply(object(incomplete ? "incomplete" : "completed", output, usage_of(r), incomplete_details(r)));
  }
  httpd::Reply error(const ApiError& err) override { return error_reply(err); }

 private:
  enum Open { None, Reasoning, Message, Call };
  std::string msg_id() const { return "msg_" + id.substr(5); }
  std::string rs_id() const { return "rs_" + id.substr(5); }
  std::string call_id(size_t i) const { return fmt::format("call_{}_{}", id, i); }
  std::string fc(size_t i) const { return fmt::format("fc_{}_{}", id, i); }
  static ojson incomplete_details(const Job::Result& r) {
    return is_cut(r.finish_reason) ? ojson{{"reason", "max_output_tokens"}} : ojson(nullptr);
  }
  static ojson usage_of(const Job::Result& r) {
    return {{"input_tokens", r.n_prompt},
            {"input_tokens_details", {{"cached_tokens", r.n_cached}}},
            {"output_tokens", r.n_generated},
            {"output_tokens_details", {{"reasoning_tokens", r.n_thinking}}},
            {"total_tokens", r.n_prompt + r.n_generated}};
  }
  ojson object(const std::string& status, const ojson& output, const ojson& usage, const ojson& incomplete) const {
    const ojson parallel = rq_.echo.contains("parallel_tool_calls") ? rq_.echo["parallel_tool_calls"] : ojson(true);
    ojson r = {{"id", id}, {"object", "response"}, {"created_at", created_}, {"status", status},
               {"error", nullptr}, {"incomplete_details", incomplete}, {"model", e_.model_id}, {"output", output},
               {"parallel_tool_calls", parallel}, {"previous_response_id", nullptr}, {"store", false},
               {"truncation", "disabled"}, {"usage", usage}};
    for (const char* k : {"instructions", "max_output_tokens", "metadata", "reasoning", "temperature", "top_p", "tools",
                          "tool_choice", "text"})
      r[k] = rq_.echo.contains(k) ? rq_.echo[k] : ojson(nullptr);
    if (r["tools"].is_null()) r["tools"] = ojson::array();
    if (r["tool_choice"].is_null()) r["tool_choice"] = "auto";
    if (r["text"].is_null()) r["text"] = {{"format", {{"type", "text"}}}};
    if (r["metadata"].is_null()) r["metadata"] = ojson::object();
    return r;
  }
  ojson reasoning_item(const std::string& text, bool done) const {
    ojson content = ojson::array();
    if (done) content.push_back({{"type", "reasoning_text"}, {"text", text}});
    return {{"type", "reasoning"}, {"id", rs_id()}, {"summary", ojson::array()}, {"content", content}};
  }
  ojson message_item(const std::string& text, bool done) const {
    ojson content = ojson::array();
    if (done)
      content.push_back({{"type", "output_text"}, {"text", text}, {"annotations", ojson::array()}, {"logprobs", ojson::array()}});
    return {{"type", "message"}, {"id", msg_id()}, {"status", done ? "completed" : "in_progress"}, {"role", "assistant"},
            {"content", content}};
  }
  ojson call_item(size_t i, const std::string& name, const std::string& arguments, const char* status) const {
    return {{"type", "function_call"}, {"id", fc(i)}, {"call_id", call_id(i)}, {"name", name},
            {"arguments", arguments}, {"status", status}};
  }
  std::string ev(const std::string& type, ojson data) {
    ojson j = {{"type", type}, {"sequence_number", seq_++}};
    for (auto it = data.begin(); it != data.end(); ++it) j[it.key()] = it.value();
    return sse_event(type, j);
  }
  void close(std::string& buf) {
    if (open_ == Reasoning) {
      buf += ev("response.reasoning_text.done", {{"item_id", rs_id()}, {"output_index", out_index_}, {"content_index", 0}, {"text", text_}});
      buf += ev("response.content_part.done", {{"item_id", rs_id()}, {"output_index", out_index_}, {"content_index", 0},
                                               {"part", {{"type", "reasoning_text"}, {"text", text_}}}});
      const ojson item = reasoning_item(text_, true);
      buf += ev("response.output_item.done", {{"output_index", out_index_}, {"item", item}});
      output_.push_back(item);
    } else if (open_ == Message) {
      buf += ev("response.output_text.done", {{"item_id", msg_id()}, {"output_index", out_index_}, {"content_index", 0},
                                              {"text", text_}, {"logprobs", ojson::array()}});
      buf += ev("response.content_part.done", {{"item_id", msg_id()}, {"output_index", out_index_}, {"content_index", 0},
                                               {"part", {{"type", "output_text"}, {"text", text_}, {"annotations", ojson::array()}}}});
      const ojson item = message_item(text_, true);
      buf += ev("response.output_item.done", {{"output_index", out_index_}, {"item", item}});
      output_.push_back(item);
    } else if (open_ == Call) {  // a call cut off (max_output_tokens) ends "incomplete", listed in `output` as announced
      const size_t i = n_calls_ - 1;
      buf += ev("response.function_call_arguments.done",
                {{"item_id", fc(i)}, {"output_index", out_index_}, {"name", call_name_}, {"arguments", text_}});
      const ojson item = call_item(i, call_name_, text_, call_done_ ? "completed" : "incomplete");
      buf += ev("response.output_item.done", {{"output_index", out_index_}, {"item", item}});
      output_.push_back(item);
    }
    open_ = None;
    text_.clear();
  }
  void delta(std::string& buf, Open kind, const std::string& d) {
    if (open_ != kind) {
      close(buf);
      open_ = kind;
      ++out_index_;
      const bool r = kind == Reasoning;
      buf += ev("response.output_item.added",
                {{"output_index", out_index_}, {"item", r ? reasoning_item("", false) : message_item("", false)}});
      buf += ev("response.content_part.added",
                {{"item_id", r ? rs_id() : msg_id()}, {"output_index", out_index_}, {"content_index", 0},
                 {"part", r ? ojson{{"type", "reasoning_text"}, {"text", ""}}
                            : ojson{{"type", "output_text"}, {"text", ""}, {"annotations", ojson::array()}}}});
    }
    if (d.empty()) return;
    text_ += d;
    if (kind == Reasoning)
      buf += ev("response.reasoning_text.delta", {{"item_id", rs_id()}, {"output_index", out_index_}, {"content_index", 0}, {"delta", d}});
    else
      buf += ev("response.output_text.delta", {{"item_id", msg_id()}, {"output_index", out_index_}, {"content_index", 0},
                                               {"delta", d}, {"logprobs", ojson::array()}});
  }

  const Endpoint& e_;
  const ResponsesRequest& rq_;
  int64_t created_;
  int seq_ = 0;
  ojson output_ = ojson::array();  // finished items
  Open open_ = None;
  std::string text_;               // of the open item (a call: its arguments so far)
  std::string call_name_;
  bool call_done_ = false;
  int out_index_ = -1;
  size_t n_calls_ = 0;
};

}  // namespace

void openai_responses(const Endpoint& e, const httpd::Request& req, httpd::Responder& res) {
  ResponsesRequest rq;
  ResponsesRenderer r(e, rq);
  drive(e, res, r, [&](const Limits& lim) {
    rq = responses_to_chat(parse_body(req.body), lim);
    ParsedRequest pr = parse_as_chat(rq.chat, rq.fields, e.tok, lim);
    pr.stream = rq.stream;
    pr.n = 1;
    return pr;
  });
}

}  // namespace kimi::server
