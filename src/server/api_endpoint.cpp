#include "server/api_endpoint.h"

#include <fmt/format.h>

#include <chrono>

#include "util/json.h"

namespace kimi::server {

int64_t unix_seconds() {
  return std::chrono::duration_cast<std::chrono::seconds>(std::chrono::system_clock::now().time_since_epoch()).count();
}

std::string wire_json(const ojson& j) { return j.dump(-1, ' ', false, ojson::error_handler_t::replace); }

std::string sse_event(const std::string& type, const ojson& data) {
  return "event: " + type + "\ndata: " + wire_json(data) + "\n\n";
}

int64_t clamp_output_tokens(int64_t asked, const Limits& lim) {
  const int64_t cap = lim.max_tokens > 0 ? lim.max_tokens : lim.n_ctx;
  return std::max<int64_t>(1, std::min(asked, cap));
}

JobOutput wait_whole(Job& job, httpd::Responder& res) {
  JobOutput out;
  int polls = 0;
  while (!job.wait(out, std::chrono::milliseconds(50)))
    if (++polls % 2 == 0 && res.peer_closed()) job.cancel();
  return out;
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

}  // namespace kimi::server
