// What the translation layers of the agent APIs (api_anthropic.cpp: Anthropic Messages,
// api_responses.cpp: OpenAI Responses) need from the server: the tokenizer and limits, a way to
// queue one job, ids, and the per-request log line. Each layer parses its wire format into the
// chat endpoint's internal request (parse_chat_request) and writes the job's output back in its
// own format, whole or as server-sent events.
#pragma once
#include <functional>
#include <memory>
#include <string>

#include "server/api.h"
#include "server/httpd.h"

namespace kimi::server {

struct Endpoint {
  const tok::Tokenizer& tok;
  const Limits& lim;
  const std::string& model_id;
  // Queues one job for the request (its prompt is moved out); throws ApiError 503 when the queue
  // is full or the server is shutting down.
  std::function<std::shared_ptr<Job>(ParsedRequest&)> submit;
  std::function<std::string(const char* prefix)> new_id;
  // A finished job: the time-to-first-token metric and the request's log line.
  std::function<void(const std::string& id, const Job::Result& r)> finished;
};

int64_t unix_seconds();
// JSON text for the wire (invalid UTF-8 in model output replaced, never an exception).
std::string wire_json(const ojson& j);
// One server-sent event with an `event:` line (Anthropic and Responses streams name their events).
std::string sse_event(const std::string& type, const ojson& data);
// A request's max output tokens: `asked` clamped to what the server allows (agents ask for
// 32000 and more; the answer then ends at the server's limit with max_tokens / incomplete).
int64_t clamp_output_tokens(int64_t asked, const Limits& lim);
// Waits for a non-streamed job's whole output; cancels it when the client goes away.
JobOutput wait_whole(Job& job, httpd::Responder& res);
// A tool call's arguments as a JSON object: the parser's arguments_json, whose pieces a stream sends
// as they are generated (tok::ToolCallDelta), so wire_json of this is exactly their concatenation.
ojson tool_call_input(const tok::ParsedToolCall& c);

// Reading a request's fields in one API's own words: bad() throws ApiError 400
// invalid_request_error whose param names the field and whose message is quoted(param, msg)
// (each API quotes the field its way); a missing required field says `missing`.
struct FieldReader {
  std::string (*quoted)(const std::string& param, const std::string& msg);
  const char* missing;
  [[noreturn]] void bad(const std::string& param, const std::string& msg) const;
  // o[k], or nullptr when it is absent or JSON null
  static const ojson* get(const ojson& o, const char* k);
  // o[k] as a string ("" when absent and not required); `where` names o in errors
  std::string str(const ojson& o, const char* k, const std::string& where, bool required) const;
};

}  // namespace kimi::server
