// The job driver (job_driver.h): submission, the whole-answer wait, the stream loop and the error
// mapping of every generation API.
#include "server/job_driver.h"

#include <fmt/format.h>

#include <algorithm>
#include <cctype>
#include <chrono>
#include <map>

#include "util/error.h"
#include "util/json.h"

namespace kimi::server {

int64_t unix_seconds() {
  return std::chrono::duration_cast<std::chrono::seconds>(std::chrono::system_clock::now().time_since_epoch()).count();
}

std::string wire_json(const ojson& j) { return j.dump(-1, ' ', false, ojson::error_handler_t::replace); }

httpd::Reply json_reply(const ojson& j, int status) {
  httpd::Reply r;
  r.status = status;
  r.body = wire_json(j);
  return r;
}

httpd::Reply error_reply(const ApiError& e) {
  return json_reply(error_json(e.status, e.what(), e.type, e.param, e.code), e.status);
}

std::string sse_event(const std::string& type, const ojson& data) {
  return "event: " + type + "\ndata: " + wire_json(data) + "\n\n";
}

std::string sse_data(const ojson& data) { return "data: " + wire_json(data) + "\n\n"; }

int64_t clamp_output_tokens(int64_t asked, const Limits& lim) {
  const int64_t cap = lim.max_tokens > 0 ? lim.max_tokens : lim.n_ctx;
  return std::max<int64_t>(1, std::min(asked, cap));
}

ojson tool_call_input(const tok::ParsedToolCall& c) {
  if (!c.arguments_json.empty()) {  // the parser's compact JSON, as a stream sends it (tok::ToolCallDelta)
    const ojson v = try_parse_json<ojson>(c.arguments_json, nullptr, kJsonMaxDepth + 1);
    if (!v.is_discarded() && v.is_object()) return v;
  }
  if (!c.raw_json.empty()) {
    const ojson v = try_parse_json<ojson>(c.raw_json);
    if (!v.is_discarded() && v.is_object()) return v;
  }
  return c.arguments.is_object() ? c.arguments : ojson::object();
}

void FieldReader::bad(const std::string& param, const std::string& msg) const {
  throw ApiError(400, param.empty() ? msg : quoted(param, msg), "invalid_request_error", param);
}

const ojson* FieldReader::get(const ojson& o, const char* k) {
  auto it = o.find(k);
  return it == o.end() || it->is_null() ? nullptr : &*it;
}

std::string FieldReader::str(const ojson& o, const char* k, const std::string& where, bool required) const {
  const ojson* v = get(o, k);
  if (!v) {
    if (required) bad(where + "." + k, missing);
    return {};
  }
  if (!v->is_string()) bad(where + "." + k, fmt::format("must be a string (got {})", v->type_name()));
  return v->get<std::string>();
}

std::string FieldMap::own(const std::string& chat_path) const {
  const std::pair<std::string, std::string>* best = nullptr;
  for (const auto& pm : paths) {
    const std::string& c = pm.first;
    if (chat_path.compare(0, c.size(), c) != 0) continue;
    if (chat_path.size() > c.size() && chat_path[c.size()] != '.' && chat_path[c.size()] != '[') continue;
    if (!best || c.size() > best->first.size()) best = &pm;
  }
  return best ? best->second + chat_path.substr(best->first.size()) : chat_path;
}

void FieldMap::add_tool(size_t i, const std::string& own, const char* schema_key) {
  const std::string c = fmt::format("tools[{}]", i);
  add(c, own);
  add(c + ".function", own);
  add(c + ".function.name", own + ".name");
  add(c + ".function.description", own + ".description");
  add(c + ".function.parameters", own + "." + schema_key);
}

void FieldMap::add_call(const std::string& call, const std::string& own, const char* id_key, const char* arguments_key) {
  add(call, own);
  add(call + ".id", own + "." + id_key);
  add(call + ".function", own);
  add(call + ".function.name", own + ".name");
  add(call + ".function.arguments", own + "." + arguments_key);
}

std::string FieldMap::rename(const std::string& text) const {
  auto word = [](char c) { return std::isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '.'; };
  std::string out;
  for (size_t i = 0; i < text.size();) {
    const std::pair<std::string, std::string>* best = nullptr;
    if (i == 0 || !word(text[i - 1]))
      for (const auto& pm : paths) {
        const std::string& c = pm.first;
        if (text.compare(i, c.size(), c) != 0 || (best && c.size() <= best->first.size())) continue;
        const char next = i + c.size() < text.size() ? text[i + c.size()] : ' ';
        if (std::isalnum(static_cast<unsigned char>(next)) || next == '_') continue;  // "tools" in "tools_x"
        best = &pm;
      }
    if (best) {
      out += best->second;
      i += best->first.size();
    } else {
      out += text[i++];
    }
  }
  return out;
}

ParsedRequest parse_as_chat(const ojson& chat, const FieldMap& map, const tok::Tokenizer& tok, const Limits& lim) {
  try {
    return parse_chat_request(wire_json(chat), tok, lim);
  } catch (const ApiError& e) {
    if (e.param.empty()) throw;
    throw ApiError(e.status, map.rename(e.what()), e.type, map.own(e.param), e.code);
  }
}

bool job_error(const Job::Result& r, ApiError& err) {
  if (is_answer(r.finish_reason) && r.http_status < 400) return false;
  if (r.http_status >= 400) {
    err = ApiError(r.http_status, r.error.empty() ? std::string(to_string(r.finish_reason)) : r.error,
                   error_type_for(r.http_status));
  } else if (r.finish_reason == FinishReason::Timeout) {
    err = ApiError(408, r.error.empty() ? "request timed out" : r.error, error_type_for(408));
  } else {
    err = ApiError(503, r.error.empty() ? "the request was cancelled (client gone or server shutting down); the output is incomplete" : r.error,
                   "server_unavailable_error", "", "cancelled");
  }
  return true;
}

void add_cut_calls(JobOutput& out) {
  struct Cut {
    std::string name, args;
    bool started = false, done = false;
  };
  std::map<size_t, Cut> calls;  // by the parser's call index
  for (const tok::ToolCallDelta& td : out.tool_deltas) {
    Cut& c = calls[td.call];
    if (td.started) {
      c.started = true;
      c.name = td.name;
    }
    c.args += td.arguments;
    c.done = c.done || td.done;
  }
  for (auto& [i, c] : calls) {
    if (!c.started || c.done || i < out.tool_calls.size()) continue;
    tok::ParsedToolCall p;
    p.name = c.name;
    p.arguments_json = c.args.empty() ? "{}" : c.args;
    p.complete = false;
    out.tool_calls.push_back(std::move(p));
  }
}

namespace {

// Progress events while the prompt is read: after the first prompt chunk, then at most this often.
constexpr std::chrono::milliseconds kProgressEvery{100};

// Renders one drained piece of a choice's output as the renderer's events.
void render(Renderer& r, size_t k, const JobOutput& out, std::string& buf) {
  if (!out.logprobs.empty()) r.logprobs(k, out.logprobs);
  if (!out.text.empty()) r.text(k, out.text, buf);
  if (!out.reasoning.empty()) r.thinking(k, out.reasoning, buf);
  if (!out.content.empty()) r.content(k, out.content, buf);
  for (const tok::ToolCallDelta& td : out.tool_deltas) {
    if (td.started) r.tool_start(k, td.name, buf);
    if (!td.arguments.empty()) r.tool_args(k, td.arguments, buf);
    if (td.done) r.tool_done(k, buf);
  }
  r.flush(k, buf);
}

// Waits for the ends of jobs whose stream was cut (they are cancelled): their results.
std::vector<Job::Result> wait_ends(const std::vector<std::shared_ptr<Job>>& jobs) {
  std::vector<Job::Result> rs;
  for (auto& j : jobs) {
    JobOutput rest;
    while (!j->wait(rest, std::chrono::milliseconds(50))) {}
    rs.push_back(j->result());
  }
  return rs;
}

// The stream of a request's jobs; returns their results (every job has ended).
std::vector<Job::Result> stream(const Endpoint& e, httpd::Responder& res, Renderer& r,
                                const std::vector<std::shared_ptr<Job>>& jobs, Clock::time_point t0) {
  auto cancel_all = [&] {
    for (auto& j : jobs) j->cancel();
  };
  if (!res.begin_stream(200, "text/event-stream", {{"Cache-Control", "no-cache"}, {"X-Accel-Buffering", "no"}})) {
    cancel_all();
    return wait_ends(jobs);
  }
  auto write = [&](const std::string& s) {
    if (res.write(s)) return true;
    cancel_all();  // the client is gone
    return false;
  };
  const size_t n = jobs.size();
  std::vector<bool> done(n, false), started(n, false);  // started: output came (the prompt is read)
  std::vector<int> prompt_done(n, 0);
  std::vector<Job::Result> rs(n);
  size_t n_done = 0;
  // the prompt's progress: the first choice still reading its prompt
  auto progress = [&] {
    Progress p;
    p.time_ms = std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
    p.reading = false;
    for (size_t k = 0; k < n; ++k) {
      if (done[k] || started[k]) continue;
      p.reading = true;
      p.total = static_cast<int>(jobs[k]->prompt().size());
      p.cache = jobs[k]->result().n_cached;
      p.processed = std::max(prompt_done[k], p.cache);
      break;
    }
    if (!p.reading && n > 0) p.total = p.processed = static_cast<int>(jobs[0]->prompt().size());
    return p;
  };
  try {
    if (!write(r.stream_head(n))) return wait_ends(jobs);
    auto last_write = Clock::now(), last_progress = last_write;
    bool progress_sent = false;
    std::string tail_err;
    while (n_done < n) {
      std::string buf;
      bool reported = false;
      for (size_t k = 0; k < n; ++k) {
        if (done[k]) continue;
        JobOutput out;
        const bool fin = jobs[k]->wait(out, std::chrono::milliseconds(n == 1 ? 50 : 10));
        if (out.prompt_done >= 0) {
          prompt_done[k] = out.prompt_done;
          reported = reported || !started[k];
        }
        if (reported && buf.empty() && (!progress_sent || Clock::now() - last_progress >= kProgressEvery)) {
          buf += r.progress(progress());  // before the tokens drained with it
          progress_sent = true;
          last_progress = Clock::now();
        }
        out.prompt_done = -1;
        if (!out.empty()) started[k] = true;
        render(r, k, out, buf);
        if (!fin) continue;
        done[k] = true;
        ++n_done;
        rs[k] = jobs[k]->result();
        ApiError err(0, "");
        if (job_error(rs[k], err)) tail_err = r.stream_error(err);
        else r.finish(k, rs[k], buf);
      }
      if (!tail_err.empty()) {  // one choice failed: the whole stream ends with the error
        cancel_all();
        if (write(buf + tail_err)) res.end();
        return wait_ends(jobs);
      }
      if (!buf.empty()) {
        if (!write(buf)) return wait_ends(jobs);
        last_write = Clock::now();
      } else if (n_done < n) {
        if (res.peer_closed()) {
          cancel_all();
        } else if (Clock::now() - last_write >= e.keepalive) {
          if (!write(r.progress(progress()))) return wait_ends(jobs);  // also finds a dead peer
          last_write = Clock::now();
        }
      }
    }
    if (write(r.stream_tail(rs))) res.end();
    return rs;
  } catch (const std::exception& ex) {
    cancel_all();
    if (write(r.stream_error(ApiError(500, std::string("internal error: ") + ex.what(), "server_error")))) res.end();
  }
  return wait_ends(jobs);
}

}  // namespace

void answer(httpd::Responder& res, Renderer& r, const std::function<void()>& f) {
  try {
    f();
  } catch (const ApiError& err) {
    if (!res.started()) res.send(r.error(err));
  } catch (const kimi::Error& err) {
    if (!res.started()) res.send(r.error(ApiError(400, err.what())));
  } catch (const std::exception& err) {
    if (!res.started()) res.send(r.error(ApiError(500, std::string("internal error: ") + err.what(), "server_error")));
  }
}

void drive(const Endpoint& e, httpd::Responder& res, Renderer& r,
           const std::function<ParsedRequest(const Limits& lim)>& parse) {
  std::vector<std::shared_ptr<Job>> jobs;
  struct CancelOnThrow {  // a request that fails half-submitted gives its jobs up
    std::vector<std::shared_ptr<Job>>& js;
    bool armed = true;
    ~CancelOnThrow() {
      if (armed)
        for (auto& j : js) j->cancel();
    }
  } guard{jobs};
  answer(res, r, [&] {
    const auto t0 = Clock::now();
    Limits lim = e.lim;  // this request's: compiling its grammar or schema stops when its client goes
    lim.budget.cancelled = [&res, last = Clock::now()]() mutable {
      if (Clock::now() - last < std::chrono::milliseconds(50)) return false;
      last = Clock::now();
      return res.peer_closed();
    };
    ParsedRequest pr = parse(lim);
    pr.gen.progress = pr.stream;
    for (int i = 0; i < pr.n; ++i) {
      GenParams g = pr.gen;
      g.sampler.seed = pr.gen.sampler.seed + static_cast<uint64_t>(i);  // n choices: n different samples
      jobs.push_back(e.submit(i + 1 < pr.n ? pr.prompt : std::move(pr.prompt), g));
    }
    guard.armed = false;
    r.id = e.new_id(r.id_prefix());
    if (pr.stream) {
      e.finished(r.id, stream(e, res, r, jobs, t0));
      return;
    }
    std::vector<Choice> cs(jobs.size());
    int polls = 0;
    for (size_t k = 0; k < jobs.size(); ++k)
      while (!jobs[k]->wait(cs[k].out, std::chrono::milliseconds(50)))
        if (++polls % 2 == 0 && res.peer_closed())
          for (auto& j : jobs) j->cancel();
    std::vector<Job::Result> rs;
    for (size_t k = 0; k < jobs.size(); ++k) {
      cs[k].out.prompt_done = -1;
      cs[k].result = jobs[k]->result();
      rs.push_back(cs[k].result);
    }
    // logged before the answer goes out (or the error), so a client that has the answer also finds
    // the line (a test reading stderr right after its request raced the line when it came after)
    e.finished(r.id, rs);
    for (const Choice& c : cs) {
      ApiError err(0, "");
      if (job_error(c.result, err)) throw err;
    }
    for (Choice& c : cs) add_cut_calls(c.out);
    res.send(r.whole(cs));
  });
}

}  // namespace kimi::server
