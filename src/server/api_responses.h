// The OpenAI Responses API on kimi serve: POST /v1/responses. A translation layer: `input` items and
// `instructions` become the chat endpoint's internal request (an OpenAI chat body rendered with the
// K3 template: responses_to_chat, then parse_chat_request), and the job's output goes back as a
// Response object or as the Responses event stream (every event with its sequence_number).
// Stateless: nothing is stored, so previous_response_id is refused. docs/server.md has the fields.
#pragma once
#include <string>

#include "server/job_driver.h"

namespace kimi::server {

struct ResponsesRequest {
  ojson chat;           // the OpenAI chat body parse_chat_request takes
  bool stream = false;
  ojson echo;           // request fields a Response object repeats (instructions, tools, ...)
  FieldMap fields;      // the chat body's fields -> the Responses request's
};

// Translates and validates a Responses body (throws ApiError whose `param` is the Responses field,
// e.g. "input[3].call_id").
ResponsesRequest responses_to_chat(const ojson& body, const Limits& lim);

void openai_responses(const Endpoint& e, const httpd::Request& req, httpd::Responder& res);

}  // namespace kimi::server
