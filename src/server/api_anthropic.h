// The Anthropic Messages API on kimi serve: POST /v1/messages (`?beta=true` accepted) and
// POST /v1/messages/count_tokens. A translation layer: the request becomes the chat endpoint's
// internal request (an OpenAI chat body rendered with the K3 template: anthropic_to_chat, then
// parse_chat_request), and the job's output goes back as a Message or as Anthropic's server-sent
// events. Errors have Anthropic's shape {"type":"error","error":{"type","message"}}. docs/server.md
// lists the fields and what is ignored or refused.
#pragma once
#include <string>
#include <vector>

#include "server/job_driver.h"

namespace kimi::server {

// What a Messages request asks beyond the chat body.
struct AnthropicRequest {
  ojson chat;                               // the OpenAI chat body parse_chat_request takes
  std::vector<std::string> stop_sequences;  // any number (the chat body allows 4)
  bool stream = false;
  FieldMap fields;                          // the chat body's fields -> the Messages request's
};

// Translates and validates a Messages body (throws ApiError whose `param` is the Anthropic field,
// e.g. "messages[2].content[0].tool_use_id"). count_only: /count_tokens (no max_tokens needed).
AnthropicRequest anthropic_to_chat(const ojson& body, const Limits& lim, bool count_only);

// {"type":"error","error":{"type":...,"message":...}} and the error type for an HTTP status.
ojson anthropic_error_json(int status, const std::string& message);
std::string anthropic_error_type(int status);

// stop_reason for a job's result (stop_string: the stop sequence that ended it, if any).
std::string anthropic_stop_reason(const Job::Result& r);

// The handlers (on a handler thread; they answer every error themselves).
void anthropic_messages(const Endpoint& e, const httpd::Request& req, httpd::Responder& res);
void anthropic_count_tokens(const Endpoint& e, const httpd::Request& req, httpd::Responder& res);

// The event thread's own replies (401, 404, 405, 503) on /v1/messages paths in Anthropic's shape.
void anthropic_reshape_error(const httpd::Request& req, httpd::Reply& out);

}  // namespace kimi::server
