// Anthropic Messages API -> the chat endpoint's internal request, and the engine's output -> a
// Message / Anthropic's event stream (api_anthropic.h).
#include "server/api_anthropic.h"

#include <fmt/format.h>

#include <chrono>
#include <set>

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

// The text of a `system` value or of a tool_result's content: a string or text blocks.
std::string text_of(const ojson& v, const std::string& where) {
  if (v.is_string()) return v.get<std::string>();
  if (!v.is_array()) bad(where, "must be a string or an array of text blocks");
  std::string out;
  for (size_t i = 0; i < v.size(); ++i) {
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
      effort = n <= 2048 ? "low" : n <= 8192 ? "medium" : n <= 32768 ? "high" : "max";
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
      if (thinking) effort = e->get<std::string>();
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

void map_tools(const ojson& b, ojson& chat, std::set<std::string>& names) {
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
    for (size_t i = 0; i < ss->size(); ++i) {
      const ojson& s = (*ss)[i];
      if (!s.is_string() || s.get<std::string>().empty())
        bad(fmt::format("stop_sequences[{}]", i), "must be a non-empty string");
      r.stop_sequences.push_back(s.get<std::string>());
    }
  }
  if (const ojson* md = get(b, "metadata"))
    if (!md->is_object()) bad("metadata", "must be an object");
  if (const ojson* mcp = get(b, "mcp_servers"))
    if (!mcp->is_array() || !mcp->empty()) bad("mcp_servers", "MCP servers are not supported (kimi serve connects to no server)");
  map_thinking(b, chat);
  std::set<std::string> tool_names;
  map_tools(b, chat, tool_names);

  ojson msgs = ojson::array();
  if (const ojson* sys = get(b, "system")) {
    const std::string s = text_of(*sys, "system");
    if (!s.empty()) msgs.push_back({{"role", "system"}, {"content", s}});
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
      msgs.push_back({{"role", "system"}, {"content", text_of(*content, w + ".content")}});
      continue;
    }
    ojson blocks = content->is_string() ? ojson::array({{{"type", "text"}, {"text", *content}}}) : *content;
    if (!blocks.is_array()) bad(w + ".content", "must be a string or an array of content blocks");
    if (role == "user") {
      std::string text;
      for (size_t j = 0; j < blocks.size(); ++j) {
        const ojson& bl = blocks[j];
        const std::string bw = fmt::format("{}.content[{}]", w, j);
        if (!bl.is_object()) bad(bw, "must be an object");
        const std::string type = str(bl, "type", bw, true);
        if (type == "text") {
          if (!text.empty()) text += "\n";
          text += str(bl, "text", bw, true);
        } else if (type == "tool_result") {
          const std::string id = str(bl, "tool_use_id", bw, true);
          if (!open_calls.count(id))
            bad(bw + ".tool_use_id",
                all_ids.count(id) ? fmt::format("tool_use '{}' already has a result", id)
                                  : fmt::format("no tool_use with id '{}' in the preceding assistant message", id));
          open_calls.erase(id);
          std::string out;
          if (const ojson* c = get(bl, "content")) out = text_of(*c, bw + ".content");
          const ojson* err = get(bl, "is_error");
          if (err && !err->is_boolean()) bad(bw + ".is_error", "must be a boolean");
          if (err && err->get<bool>()) out = "Error: " + out;
          msgs.push_back({{"role", "tool"}, {"tool_call_id", id}, {"content", out}});
        } else if (type == "image" || type == "document") {
          bad(bw + ".type", fmt::format("'{}' blocks are not supported (the engine is text-only)", type));
        } else {
          bad(bw + ".type", fmt::format("content block type '{}' is not supported in a user message (text, tool_result)", type));
        }
      }
      if (!text.empty() || blocks.empty()) msgs.push_back({{"role", "user"}, {"content", text}});
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
        calls.push_back({{"id", id}, {"type", "function"}, {"function", {{"name", name}, {"arguments", *in}}}});
        open_calls.insert(id);
      } else {
        bad(bw + ".type",
            fmt::format("content block type '{}' is not supported in an assistant message (text, thinking, "
                        "redacted_thinking, tool_use)", type));
      }
    }
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
  if (r.finish_reason == "tool_calls") return "tool_use";
  if (r.finish_reason == "length" || r.finish_reason == "timeout") return "max_tokens";
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

httpd::Reply reply(const ojson& j, int status = 200) {
  httpd::Reply r;
  r.status = status;
  r.body = wire_json(j);
  return r;
}

ojson usage(const Job::Result& r) {
  return {{"input_tokens", r.n_prompt - r.n_cached},
          {"cache_creation_input_tokens", 0},
          {"cache_read_input_tokens", r.n_cached},
          {"output_tokens", r.n_generated}};
}

// The request as the engine's: the chat body through parse_chat_request, then what it cannot say.
ParsedRequest parse(const Endpoint& e, const httpd::Request& req, bool count_only, AnthropicRequest& ar) {
  const ojson b = parse_body(req.body);
  ar = anthropic_to_chat(b, e.lim, count_only);
  ParsedRequest pr = parse_chat_request(wire_json(ar.chat), e.tok, e.lim);
  pr.gen.stop = ar.stop_sequences;
  return pr;
}

void send_error(httpd::Responder& res, int status, const std::string& msg) {
  if (!res.started()) res.send(reply(anthropic_error_json(status, msg), status));
}

template <class F>
void guarded(httpd::Responder& res, F&& f) {
  try {
    f();
  } catch (const ApiError& e) {
    send_error(res, e.status, e.what());
  } catch (const kimi::Error& e) {
    send_error(res, 400, e.what());
  } catch (const std::exception& e) {
    send_error(res, 500, std::string("internal error: ") + e.what());
  }
}

void stream(const Endpoint& e, Job& job, httpd::Responder& res, const std::string& id, int n_prompt) {
  if (!res.begin_stream(200, "text/event-stream", {{"Cache-Control", "no-cache"}, {"X-Accel-Buffering", "no"}})) {
    job.cancel();
    return;
  }
  auto write = [&](const std::string& s) {
    if (res.write(s)) return true;
    job.cancel();
    return false;
  };
  const ojson start = {
      {"type", "message_start"},
      {"message",
       {{"id", id}, {"type", "message"}, {"role", "assistant"}, {"content", ojson::array()}, {"model", e.model_id},
        {"stop_reason", nullptr}, {"stop_sequence", nullptr},
        {"usage", {{"input_tokens", n_prompt}, {"cache_creation_input_tokens", 0}, {"cache_read_input_tokens", 0},
                   {"output_tokens", 0}}}}}};
  if (!write(sse_event("message_start", start) + sse_event("ping", {{"type", "ping"}}))) return;
  int index = -1;        // the open content block
  std::string open;      // its type ("" none)
  int n_calls = 0;
  auto close_block = [&](std::string& buf) {
    if (open.empty()) return;
    buf += sse_event("content_block_stop", {{"type", "content_block_stop"}, {"index", index}});
    open.clear();
  };
  auto text_delta = [&](std::string& buf, const char* type, const std::string& text) {
    const bool thinking = std::string(type) == "thinking";
    if (open != type) {
      close_block(buf);
      open = type;
      ++index;
      const ojson block = thinking ? ojson{{"type", "thinking"}, {"thinking", ""}, {"signature", ""}}
                                   : ojson{{"type", "text"}, {"text", ""}};
      buf += sse_event("content_block_start", {{"type", "content_block_start"}, {"index", index}, {"content_block", block}});
    }
    const ojson d = thinking ? ojson{{"type", "thinking_delta"}, {"thinking", text}} : ojson{{"type", "text_delta"}, {"text", text}};
    buf += sse_event("content_block_delta", {{"type", "content_block_delta"}, {"index", index}, {"delta", d}});
  };
  auto idle_since = Clock::now();
  try {
    for (;;) {
      JobOutput out;
      const bool fin = job.wait(out, std::chrono::milliseconds(50));
      std::string buf;
      if (!out.reasoning.empty()) text_delta(buf, "thinking", out.reasoning);
      if (!out.content.empty()) text_delta(buf, "text", out.content);
      // a tool call as it is generated: its block starts with the name, its input arrives in
      // input_json_delta pieces (together exactly the whole answer's input), the block stops with the call
      for (const auto& td : out.tool_deltas) {
        if (td.started) {
          close_block(buf);
          ++index;
          open = "tool_use";
          const std::string cid = fmt::format("toolu_{}_{}", id, n_calls++);
          buf += sse_event("content_block_start",
                           {{"type", "content_block_start"}, {"index", index},
                            {"content_block", {{"type", "tool_use"}, {"id", cid}, {"name", td.name}, {"input", ojson::object()}}}});
        }
        if (open != "tool_use") continue;
        if (!td.arguments.empty())
          buf += sse_event("content_block_delta", {{"type", "content_block_delta"}, {"index", index},
                                                   {"delta", {{"type", "input_json_delta"}, {"partial_json", td.arguments}}}});
        if (td.done) close_block(buf);
      }
      if (fin) {
        const Job::Result r = job.result();
        e.finished(id, r);
        if (r.http_status >= 400 || r.finish_reason == "cancelled" || r.finish_reason == "error") {
          // a stream that did not end normally: an error event and no message_stop
          const int st = r.http_status >= 400 ? r.http_status : 503;
          const std::string msg = !r.error.empty() ? r.error
                                  : "the request was cancelled (server shutting down); the output is incomplete";
          buf += sse_event("error", anthropic_error_json(st, msg));
          if (write(buf)) res.end();
          return;
        }
        close_block(buf);
        const ojson u = usage(r);
        buf += sse_event("message_delta",
                         {{"type", "message_delta"},
                          {"delta", {{"stop_reason", anthropic_stop_reason(r)},
                                     {"stop_sequence", r.stop_string.empty() ? ojson(nullptr) : ojson(r.stop_string)}}},
                          {"usage", u}});
        buf += sse_event("message_stop", {{"type", "message_stop"}});
        if (write(buf)) res.end();
        return;
      }
      if (!buf.empty()) {
        if (!write(buf)) return;
        idle_since = Clock::now();
      } else if (res.peer_closed()) {
        job.cancel();
      } else if (Clock::now() - idle_since > std::chrono::seconds(5)) {
        if (!write(sse_event("ping", {{"type", "ping"}}))) return;  // also finds a dead peer
        idle_since = Clock::now();
      }
    }
  } catch (const std::exception& ex) {
    job.cancel();
    if (write(sse_event("error", anthropic_error_json(500, std::string("internal error: ") + ex.what())))) res.end();
  }
}

}  // namespace

void anthropic_messages(const Endpoint& e, const httpd::Request& req, httpd::Responder& res) {
  guarded(res, [&] {
    AnthropicRequest ar;
    ParsedRequest pr = parse(e, req, false, ar);
    const int n_prompt = static_cast<int>(pr.prompt.size());
    const std::shared_ptr<Job> job = e.submit(pr);
    const std::string id = e.new_id("msg_");
    if (ar.stream) return stream(e, *job, res, id, n_prompt);
    const JobOutput out = wait_whole(*job, res);
    const Job::Result r = job->result();
    e.finished(id, r);
    if (r.http_status >= 400) throw ApiError(r.http_status, r.error.empty() ? r.finish_reason : r.error);
    if (r.finish_reason == "cancelled")
      throw ApiError(503, "the request was cancelled (client gone or server shutting down)", "overloaded_error");
    ojson content = ojson::array();
    if (!out.reasoning.empty()) content.push_back({{"type", "thinking"}, {"thinking", out.reasoning}, {"signature", ""}});
    if (!out.content.empty() || (out.tool_calls.empty() && out.reasoning.empty()))
      content.push_back({{"type", "text"}, {"text", out.content}});
    for (size_t i = 0; i < out.tool_calls.size(); ++i)
      content.push_back({{"type", "tool_use"}, {"id", fmt::format("toolu_{}_{}", id, i)}, {"name", out.tool_calls[i].name},
                         {"input", tool_call_input(out.tool_calls[i])}});
    res.send(reply({{"id", id}, {"type", "message"}, {"role", "assistant"}, {"model", e.model_id},
                    {"content", std::move(content)}, {"stop_reason", anthropic_stop_reason(r)},
                    {"stop_sequence", r.stop_string.empty() ? ojson(nullptr) : ojson(r.stop_string)},
                    {"usage", usage(r)}}));
  });
}

void anthropic_count_tokens(const Endpoint& e, const httpd::Request& req, httpd::Responder& res) {
  guarded(res, [&] {
    AnthropicRequest ar;
    const ParsedRequest pr = parse(e, req, true, ar);
    res.send(reply({{"input_tokens", pr.prompt.size()}}));
  });
}

}  // namespace kimi::server
