// The job driver of `kimi serve`: runs one generation request of any API, once for all of them.
// It owns the request's compile budget (grammar compiling stops when the client goes), the
// submission of its jobs (n choices: seeds seed, seed + 1, ...), the wait for a whole answer, the
// stream loop (drain, write, peer-gone cancellation, progress events during the prefill,
// keep-alive), and the mapping of a job's end onto an error status. Each API is a translation
// file on top of it (api_openai: chat/completions and completions, api_anthropic: Messages,
// api_responses: Responses): it parses its wire format into the one internal request
// (ParsedRequest, naming its own fields in every error) and renders the driver's events in its
// own format (a Renderer).
#pragma once
#include <chrono>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "server/api.h"
#include "server/httpd.h"

namespace kimi::server {

// What an API handler needs from the server.
struct Endpoint {
  const tok::Tokenizer& tok;
  const Limits& lim;
  const std::string& model_id;
  // Queues one job; throws ApiError 503 when the queue is full or the server is shutting down.
  std::function<std::shared_ptr<Job>(std::vector<int32_t> prompt, const GenParams& gen)> submit;
  std::function<std::string(const char* prefix)> new_id;
  // A request's jobs have ended (first choice first): the time-to-first-token metric and the log line.
  std::function<void(const std::string& id, const std::vector<Job::Result>& rs)> finished;
  // A stream with nothing to send for this long sends a progress event (the client sees activity).
  std::chrono::milliseconds keepalive{5000};
};

// How far a stream's prompt has been read: `processed` of `total` prompt tokens are in the cache
// (`cache` of them were reused from the prompt cache); `reading`: the prompt is still being read
// (false once tokens come, and while the job waits in the queue processed is 0).
struct Progress {
  int total = 0, cache = 0, processed = 0;
  double time_ms = 0;  // since the request was submitted
  bool reading = true;
};

// One API's wire format. The driver calls the stream events in order per choice k; a renderer
// appends what it sends to `buf`.
class Renderer {
 public:
  virtual ~Renderer() = default;
  std::string id;  // the response id (set by the driver from id_prefix() before anything is rendered)
  virtual const char* id_prefix() const = 0;

  // ---- a stream
  virtual std::string stream_head(size_t n_choices) = 0;  // right after the 200 head
  virtual void logprobs(size_t k, const std::vector<TokenLogprob>& lp) { (void)k, (void)lp; }  // before the text they belong to
  virtual void text(size_t k, const std::string& t, std::string& buf) { (void)k, (void)t, (void)buf; }  // completions
  virtual void thinking(size_t k, const std::string& t, std::string& buf) = 0;
  virtual void content(size_t k, const std::string& t, std::string& buf) = 0;
  virtual void tool_start(size_t k, const std::string& name, std::string& buf) = 0;
  virtual void tool_args(size_t k, const std::string& piece, std::string& buf) = 0;
  virtual void tool_done(size_t k, std::string& buf) = 0;
  virtual void flush(size_t k, std::string& buf) { (void)k, (void)buf; }  // after each drained piece of output
  // An event the client counts as activity, with the prompt's progress where the API can say it.
  virtual std::string progress(const Progress& p) = 0;
  virtual void finish(size_t k, const Job::Result& r, std::string& buf) = 0;  // choice k ended with an answer
  virtual std::string stream_tail(const std::vector<Job::Result>& rs) = 0;    // every choice ended so
  virtual std::string stream_error(const ApiError& e) = 0;  // the stream ends with this (no normal end)

  // ---- a whole answer, or an error before anything was sent
  virtual httpd::Reply whole(const std::vector<Choice>& cs) = 0;
  virtual httpd::Reply error(const ApiError& e) = 0;
};

// Runs one generation request: `parse` reads the body into the internal request under the limits
// given (their compile budget is cancelled when the client goes); its jobs are submitted; the
// answer is streamed (ParsedRequest::stream) or sent whole through `r`. Every error becomes
// r.error() (nothing sent yet) or r.stream_error() (a stream had begun).
void drive(const Endpoint& e, httpd::Responder& res, Renderer& r,
           const std::function<ParsedRequest(const Limits& lim)>& parse);

// Runs f; an exception it throws becomes r.error() (ApiError as it is, kimi::Error 400, others 500)
// when nothing has been sent yet (a begun stream has ended with r.stream_error() already).
void answer(httpd::Responder& res, Renderer& r, const std::function<void()>& f);

// The error a job's end means (none for an answer): its own status and message, 503 for a
// cancelled job, 408 for a timeout without one.
bool job_error(const Job::Result& r, ApiError& err);

// A whole output's tool calls that were cut (started, not completed: max_tokens), appended to
// out.tool_calls with complete = false and as arguments exactly the pieces a stream sent for them
// (the parser closes open strings and containers at the end: one JSON object).
void add_cut_calls(JobOutput& out);

// A JSON reply; an ApiError as OpenAI's {"error":{"message","type","param","code"}} (the OpenAI
// APIs, Responses, and the endpoints that are not an API's own).
httpd::Reply json_reply(const ojson& j, int status = 200);
httpd::Reply error_reply(const ApiError& e);

int64_t unix_seconds();
// JSON text for the wire (invalid UTF-8 in model output replaced, never an exception).
std::string wire_json(const ojson& j);
// One server-sent event: with an `event:` line (Anthropic and Responses name their events), or
// only its data line (OpenAI's chat and completions streams).
std::string sse_event(const std::string& type, const ojson& data);
std::string sse_data(const ojson& data);
// A request's max output tokens: `asked` clamped to what the server allows (agents ask for
// 32000 and more; the answer then ends at the server's limit with max_tokens / incomplete).
int64_t clamp_output_tokens(int64_t asked, const Limits& lim);
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

// The fields of the chat body a translation layer builds, by path, and what they were in its own
// request ("tools[0].function.parameters" -> "tools[1].input_schema" when a server tool came first):
// parse_as_chat renames the field of every error the chat parser raises into the API's own words.
struct FieldMap {
  std::vector<std::pair<std::string, std::string>> paths;  // (chat path, own path)
  void add(std::string chat, std::string own) { paths.emplace_back(std::move(chat), std::move(own)); }
  // the chat paths that start with `from` (a placeholder for a message whose index is known later)
  // start with `to` instead
  void rebase(const std::string& from, const std::string& to) {
    for (auto& pm : paths)
      if (pm.first.compare(0, from.size(), from) == 0) pm.first = to + pm.first.substr(from.size());
  }
  // chat's tools[i] ({"type":"function","function":{"name","description","parameters"}}) was the
  // API's tool at `own`, its schema at own.<schema_key>
  void add_tool(size_t i, const std::string& own, const char* schema_key);
  // a chat tool call at `call` (messages[m].tool_calls[c]: id, function.name, function.arguments) was
  // the API's item at `own` (its id at own.<id_key>, name at own.name, arguments at own.<arguments_key>)
  void add_call(const std::string& call, const std::string& own, const char* id_key, const char* arguments_key);
  // the own path of a chat path: its longest mapped prefix (ending at a '.' or '[') replaced; an
  // unmapped path as it is
  std::string own(const std::string& chat_path) const;
  // a message with every chat path in it (the longest that matches at a word start) as its own path
  std::string rename(const std::string& text) const;
};

// parse_chat_request of a translated body; an ApiError it throws names the API's own field (param
// and message) through `map`.
ParsedRequest parse_as_chat(const ojson& chat, const FieldMap& map, const tok::Tokenizer& tok, const Limits& lim);

}  // namespace kimi::server
