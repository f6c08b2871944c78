// OpenAI Responses API -> the chat endpoint's internal request, and the engine's output -> a
// Response object / the Responses event stream (api_responses.h).
#include "server/api_responses.h"

#include <fmt/format.h>

#include <chrono>
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

// A message's content: a string or parts (input_text, output_text, text, refusal).
std::string content_text(const ojson& c, const std::string& where) {
  if (c.is_string()) return c.get<std::string>();
  if (!c.is_array()) bad(where, "must be a string or an array of content parts");
  std::string out;
  for (size_t i = 0; i < c.size(); ++i) {
    const ojson& p = c[i];
    const std::string w = fmt::format("{}[{}]", where, i);
    if (!p.is_object()) bad(w, "must be an object");
    const std::string type = str(p, "type", w, true);
    if (type == "input_text" || type == "output_text" || type == "text") {
      out += str(p, "text", w, true);
    } else if (type == "refusal") {
      out += str(p, "refusal", w, true);
    } else if (type == "input_image" || type == "input_file" || type == "input_audio") {
      bad(w + ".type", fmt::format("'{}' is not supported (the engine is text-only)", type));
    } else {
      bad(w + ".type", fmt::format("content part type '{}' is not supported (input_text, output_text)", type));
    }
  }
  return out;
}

void map_tools(const ojson& b, ojson& chat, ojson& echo) {
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
  map_tools(b, chat, r.echo);

  ojson msgs = ojson::array();
  if (const ojson* ins = get(b, "instructions")) {
    if (!ins->is_string()) bad("instructions", "must be a string");
    r.echo["instructions"] = *ins;
    if (!ins->get<std::string>().empty()) msgs.push_back({{"role", "system"}, {"content", *ins}});
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
      const std::string text = content_text(*c, w + ".content");
      if (role == "assistant") {
        ojson& a = assistant();
        if (a.contains("tool_calls")) {  // text after calls: a new assistant turn
          flush();
          assistant();
        }
        asst["content"] = asst["content"].get<std::string>() + text;
      } else if (role == "user" || role == "system" || role == "developer") {
        flush();
        msgs.push_back({{"role", role == "developer" ? "system" : role}, {"content", text}});
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
      a["tool_calls"].push_back({{"id", id}, {"type", "function"}, {"function", {{"name", name}, {"arguments", parsed}}}});
    } else if (type == "function_call_output") {
      const std::string id = str(it, "call_id", w, true);
      if (!call_ids.count(id)) bad(w + ".call_id", fmt::format("no function_call with call_id '{}' before it", id));
      if (!answered.insert(id).second) bad(w + ".call_id", fmt::format("function_call '{}' already has an output", id));
      const ojson* o = get(it, "output");
      if (!o) bad(w + ".output", "is required");
      const std::string out = content_text(*o, w + ".output");
      flush();
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

struct Ids {
  std::string resp, msg, rs;
  std::string call(size_t i) const { return fmt::format("call_{}_{}", resp, i); }
  std::string fc(size_t i) const { return fmt::format("fc_{}_{}", resp, i); }
};

ojson response_object(const Endpoint& e, const ResponsesRequest& rq, const Ids& ids, int64_t created,
                      const std::string& status, const ojson& output, const ojson& usage, const ojson& incomplete) {
  const ojson parallel = rq.echo.contains("parallel_tool_calls") ? rq.echo["parallel_tool_calls"] : ojson(true);
  ojson r = {{"id", ids.resp}, {"object", "response"}, {"created_at", created}, {"status", status},
             {"error", nullptr}, {"incomplete_details", incomplete}, {"model", e.model_id}, {"output", output},
             {"parallel_tool_calls", parallel}, {"previous_response_id", nullptr}, {"store", false},
             {"truncation", "disabled"}, {"usage", usage}};
  for (const char* k : {"instructions", "max_output_tokens", "metadata", "reasoning", "temperature", "top_p", "tools",
                        "tool_choice", "text"})
    r[k] = rq.echo.contains(k) ? rq.echo[k] : ojson(nullptr);
  if (r["tools"].is_null()) r["tools"] = ojson::array();
  if (r["tool_choice"].is_null()) r["tool_choice"] = "auto";
  if (r["text"].is_null()) r["text"] = {{"format", {{"type", "text"}}}};
  if (r["metadata"].is_null()) r["metadata"] = ojson::object();
  return r;
}

ojson usage_of(const Job::Result& r, int reasoning_tokens) {
  return {{"input_tokens", r.n_prompt},
          {"input_tokens_details", {{"cached_tokens", r.n_cached}}},
          {"output_tokens", r.n_generated},
          {"output_tokens_details", {{"reasoning_tokens", reasoning_tokens}}},
          {"total_tokens", r.n_prompt + r.n_generated}};
}

ojson reasoning_item(const Ids& ids, const std::string& text, bool done) {
  ojson content = ojson::array();
  if (done) content.push_back({{"type", "reasoning_text"}, {"text", text}});
  return {{"type", "reasoning"}, {"id", ids.rs}, {"summary", ojson::array()}, {"content", content}};
}
ojson message_item(const Ids& ids, const std::string& text, bool done) {
  ojson content = ojson::array();
  if (done) content.push_back({{"type", "output_text"}, {"text", text}, {"annotations", ojson::array()}, {"logprobs", ojson::array()}});
  return {{"type", "message"}, {"id", ids.msg}, {"status", done ? "completed" : "in_progress"}, {"role", "assistant"},
          {"content", content}};
}
ojson call_item(const Ids& ids, size_t i, const std::string& name, const std::string& arguments, const char* status) {
  return {{"type", "function_call"}, {"id", ids.fc(i)}, {"call_id", ids.call(i)}, {"name", name},
          {"arguments", arguments}, {"status", status}};
}
ojson call_item(const Ids& ids, size_t i, const tok::ParsedToolCall& c) {
  return call_item(ids, i, c.name, wire_json(tool_call_input(c)), "completed");
}

void send_error(httpd::Responder& res, const ApiError& err) {
  if (res.started()) return;
  httpd::Reply r;
  r.status = err.status;
  r.body = wire_json(error_json(err.status, err.what(), err.type, err.param, err.code));
  res.send(r);
}

void stream(const Endpoint& e, const ResponsesRequest& rq, Job& job, httpd::Responder& res, const Ids& ids) {
  if (!res.begin_stream(200, "text/event-stream", {{"Cache-Control", "no-cache"}, {"X-Accel-Buffering", "no"}})) {
    job.cancel();
    return;
  }
  const int64_t created = unix_seconds();
  int seq = 0;
  auto ev = [&](const std::string& type, ojson data) {
    ojson j = {{"type", type}, {"sequence_number", seq++}};
    for (auto it = data.begin(); it != data.end(); ++it) j[it.key()] = it.value();
    return sse_event(type, j);
  };
  auto write = [&](const std::string& s) {
    if (res.write(s)) return true;
    job.cancel();
    return false;
  };
  const ojson initial = response_object(e, rq, ids, created, "in_progress", ojson::array(), nullptr, nullptr);
  std::string head = ev("response.created", {{"response", initial}});
  head += ev("response.in_progress", {{"response", initial}});
  if (!write(head)) return;
  ojson output = ojson::array();  // finished items
  enum Open { None, Reasoning, Message, Call } open = None;
  std::string text;  // of the open item (a call: its arguments so far)
  std::string call_name;
  bool call_done = false;
  std::string reasoning_all;
  int out_index = -1;
  size_t n_calls = 0;
  auto close = [&](std::string& buf) {
    if (open == Reasoning) {
      buf += ev("response.reasoning_text.done", {{"item_id", ids.rs}, {"output_index", out_index}, {"content_index", 0}, {"text", text}});
      buf += ev("response.content_part.done", {{"item_id", ids.rs}, {"output_index", out_index}, {"content_index", 0},
                                               {"part", {{"type", "reasoning_text"}, {"text", text}}}});
      const ojson item = reasoning_item(ids, text, true);
      buf += ev("response.output_item.done", {{"output_index", out_index}, {"item", item}});
      output.push_back(item);
    } else if (open == Message) {
      buf += ev("response.output_text.done", {{"item_id", ids.msg}, {"output_index", out_index}, {"content_index", 0},
                                              {"text", text}, {"logprobs", ojson::array()}});
      buf += ev("response.content_part.done", {{"item_id", ids.msg}, {"output_index", out_index}, {"content_index", 0},
                                               {"part", {{"type", "output_text"}, {"text", text}, {"annotations", ojson::array()}}}});
      const ojson item = message_item(ids, text, true);
      buf += ev("response.output_item.done", {{"output_index", out_index}, {"item", item}});
      output.push_back(item);
    } else if (open == Call) {  // a call cut off (max_output_tokens) ends incomplete and stays out of `output`
      const size_t i = n_calls - 1;
      buf += ev("response.function_call_arguments.done",
                {{"item_id", ids.fc(i)}, {"output_index", out_index}, {"name", call_name}, {"arguments", text}});
      const ojson item = call_item(ids, i, call_name, text, call_done ? "completed" : "incomplete");
      buf += ev("response.output_item.done", {{"output_index", out_index}, {"item", item}});
      if (call_done) output.push_back(item);
    }
    open = None;
    text.clear();
  };
  auto delta = [&](std::string& buf, Open kind, const std::string& d) {
    if (open != kind) {
      close(buf);
      open = kind;
      ++out_index;
      const bool r = kind == Reasoning;
      const std::string& item_id = r ? ids.rs : ids.msg;
      buf += ev("response.output_item.added",
                {{"output_index", out_index}, {"item", r ? reasoning_item(ids, "", false) : message_item(ids, "", false)}});
      buf += ev("response.content_part.added",
                {{"item_id", item_id}, {"output_index", out_index}, {"content_index", 0},
                 {"part", r ? ojson{{"type", "reasoning_text"}, {"text", ""}}
                            : ojson{{"type", "output_text"}, {"text", ""}, {"annotations", ojson::array()}}}});
    }
    if (d.empty()) return;
    text += d;
    if (kind == Reasoning) {
      reasoning_all += d;
      buf += ev("response.reasoning_text.delta", {{"item_id", ids.rs}, {"output_index", out_index}, {"content_index", 0}, {"delta", d}});
    } else {
      buf += ev("response.output_text.delta", {{"item_id", ids.msg}, {"output_index", out_index}, {"content_index", 0},
                                               {"delta", d}, {"logprobs", ojson::array()}});
    }
  };
  auto idle_since = Clock::now();
  try {
    for (;;) {
      JobOutput out;
      const bool fin = job.wait(out, std::chrono::milliseconds(50));
      std::string buf;
      if (!out.reasoning.empty()) delta(buf, Reasoning, out.reasoning);
      if (!out.content.empty()) delta(buf, Message, out.content);
      // a function call as it is generated: the item is added with its name, the arguments arrive in
      // delta pieces (together exactly the whole answer's arguments), the item is done with the call
      for (const auto& td : out.tool_deltas) {
        if (td.started) {
          close(buf);
          open = Call;
          ++out_index;
          call_name = td.name;
          call_done = false;
          const size_t i = n_calls++;
          buf += ev("response.output_item.added", {{"output_index", out_index}, {"item", call_item(ids, i, td.name, "", "in_progress")}});
        }
        if (open != Call) continue;
        if (!td.arguments.empty()) {
          text += td.arguments;
          buf += ev("response.function_call_arguments.delta",
                    {{"item_id", ids.fc(n_calls - 1)}, {"output_index", out_index}, {"delta", td.arguments}});
        }
        if (td.done) {
          call_done = true;
          close(buf);
        }
      }
      if (fin) {
        const Job::Result r = job.result();
        e.finished(ids.resp, r);
        if (r.http_status >= 400 || r.finish_reason == "cancelled" || r.finish_reason == "error") {
          const int st = r.http_status >= 400 ? r.http_status : 503;
          const std::string msg = !r.error.empty() ? r.error
                                  : "the request was cancelled (server shutting down); the output is incomplete";
          buf += ev("error", {{"code", st >= 500 ? "server_error" : "invalid_request_error"}, {"message", msg}, {"param", nullptr}});
          if (write(buf)) res.end();
          return;
        }
        if (output.empty() && (open == None || (open == Call && !call_done)))
          delta(buf, Message, "");  // an answer has at least its (empty) message
        close(buf);
        const bool incomplete = r.finish_reason == "length" || r.finish_reason == "timeout";
        const ojson final = response_object(e, rq, ids, created, incomplete ? "incomplete" : "completed", output,
                                            usage_of(r, r.n_thinking),
                                            incomplete ? ojson{{"reason", "max_output_tokens"}} : ojson(nullptr));
        buf += ev(incomplete ? "response.incomplete" : "response.completed", {{"response", final}});
        if (write(buf)) res.end();
        return;
      }
      if (!buf.empty()) {
        if (!write(buf)) return;
        idle_since = Clock::now();
      } else if (res.peer_closed()) {
        job.cancel();
      } else if (Clock::now() - idle_since > std::chrono::seconds(5)) {
        if (!write(": keep-alive\n\n")) return;
        idle_since = Clock::now();
      }
    }
  } catch (const std::exception& ex) {
    job.cancel();
    if (write(ev("error", {{"code", "server_error"}, {"message", std::string("internal error: ") + ex.what()}, {"param", nullptr}})))
      res.end();
  }
}

}  // namespace

void openai_responses(const Endpoint& e, const httpd::Request& req, httpd::Responder& res) {
  try {
    const ojson b = parse_body(req.body);
    const ResponsesRequest rq = responses_to_chat(b, e.lim);
    ParsedRequest pr = parse_chat_request(wire_json(rq.chat), e.tok, e.lim);
    const std::shared_ptr<Job> job = e.submit(pr);
    Ids ids;
    ids.resp = e.new_id("resp_");
    ids.msg = "msg_" + ids.resp.substr(5);
    ids.rs = "rs_" + ids.resp.substr(5);
    if (rq.stream) return stream(e, rq, *job, res, ids);
    const int64_t created = unix_seconds();
    const JobOutput out = wait_whole(*job, res);
    const Job::Result r = job->result();
    e.finished(ids.resp, r);
    if (r.http_status >= 400) throw ApiError(r.http_status, r.error.empty() ? r.finish_reason : r.error);
    if (r.finish_reason == "cancelled")
      throw ApiError(503, "the request was cancelled (client gone or server shutting down)", "server_unavailable_error");
    ojson output = ojson::array();
    if (!out.reasoning.empty()) output.push_back(reasoning_item(ids, out.reasoning, true));
    if (!out.content.empty() || (out.tool_calls.empty() && out.reasoning.empty()))
      output.push_back(message_item(ids, out.content, true));
    for (size_t i = 0; i < out.tool_calls.size(); ++i) output.push_back(call_item(ids, i, out.tool_calls[i]));
    const bool incomplete = r.finish_reason == "length" || r.finish_reason == "timeout";
    httpd::Reply rep;
    rep.body = wire_json(response_object(e, rq, ids, created, incomplete ? "incomplete" : "completed", output,
                                         usage_of(r, r.n_thinking),
                                         incomplete ? ojson{{"reason", "max_output_tokens"}} : ojson(nullptr)));
    res.send(rep);
  } catch (const ApiError& err) {
    send_error(res, err);
  } catch (const kimi::Error& err) {
    send_error(res, ApiError(400, err.what()));
  } catch (const std::exception& err) {
    send_error(res, ApiError(500, std::string("internal error: ") + err.what(), "server_error"));
  }
}

}  // namespace kimi::server
