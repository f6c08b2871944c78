// The OpenAI Responses API on kimi serve: POST /v1/responses. A translation layer: `input` items and
// `instructions` become the chat endpoint's internal request (an OpenAI chat body rendered with the
// K3 template: responses_to_chat, then parse_chat_request), and the job's output goes back as a
// Response object or as the Responses event stream (every event with its sequence_number).
// Stateless: nothing is stored, so previous_response_id is refused. docs/server.md has the fields.
#pragma once
#include <string>

#include "server/api_endpoint.h"

namespace kimi::server {

struct ResponsesRequest {
  ojson chat;           // the OpenAI chat body parse_chat_request takes
  bool stream = false;
  ojson echo;           // request fields a Response object repeats (instructions, tools, ...)
};

// Translates and validates a Responses body (throws ApiError whose `param` is the Responses field,
// e.g. "input[3].call_id").
ResponsesRequest responses_to_chat(const ojson& body, const Limits& lim);

// OpenAI's reasoning effort onto K3's thinking: none -> thinking off; minimal, low -> low;
// medium -> medium; high -> high; xhigh -> max. Sets "thinking" / "thinking_effort" of a chat body;
// false for a value not in the map. (Inline: api.cpp uses it for chat's reasoning_effort without
// the HTTP side of this layer.)
inline bool map_reasoning_effort(const std::string& effort, ojson& chat) {
  if (effort == "none") {
    chat["thinking"] = false;
    chat.erase("thinking_effort");
    return true;
  }
  const char* k3 = effort == "minimal" || effort == "low" ? "low"
                   : effort == "medium"                   ? "medium"
                   : effort == "high"                     ? "high"
                   : effort == "xhigh"                    ? "max"
                                                          : nullptr;
  if (!k3) return false;
  chat["thinking"] = true;
  chat["thinking_effort"] = k3;
  return true;
}

void openai_responses(const Endpoint& e, const httpd::Request& req, httpd::Responder& res);

}  // namespace kimi::server
