// The OpenAI API on kimi serve: POST /v1/chat/completions and /v1/completions. A translation
// file on the job driver (job_driver.h): the body becomes the internal request (parse_chat_request,
// parse_completion_request in api.h), the driver's events become chat.completion(.chunk) /
// text_completion objects. docs/server.md lists the fields.
#pragma once
#include <string>
#include <vector>

#include "server/job_driver.h"

namespace kimi::server {

// OpenAI tool call object for a parsed call (arguments as a JSON string).
ojson tool_call_json(const tok::ParsedToolCall& c, const std::string& id);
ojson usage_json(const Job::Result& r);

ojson usage_json(const std::vector<Job::Result>& rs);  // n choices: the prompt counted once

// `logprobs` of a choice (null when the request asked for none): chat {"content": [{"token",
// "logprob","bytes","top_logprobs"}], "reasoning_content": [...]} (OpenAI's chat form; reasoning
// tokens in their own list); completions {"tokens","token_logprobs","top_logprobs","text_offset"}
// (the legacy form). `text_offset0`: offset of the first token in the choice's text (streaming).
ojson chat_logprobs_json(const std::vector<TokenLogprob>& lp, const tok::Tokenizer& tok);
ojson completion_logprobs_json(const std::vector<TokenLogprob>& lp, const tok::Tokenizer& tok, size_t text_offset0 = 0);

// Full (non-streaming) responses; `tok` is needed only for logprobs (nullptr: none asked).
ojson chat_response(const std::string& id, const std::string& model, int64_t created, const std::vector<Choice>& cs,
                    const tok::Tokenizer* tok = nullptr);
ojson completion_response(const std::string& id, const std::string& model, int64_t created,
                          const std::vector<Choice>& cs, const tok::Tokenizer* tok = nullptr);

// Streaming chunks (one SSE `data:` payload each).
ojson chat_chunk(const std::string& id, const std::string& model, int64_t created, const ojson& delta,
                 const std::string& finish_reason, int index = 0,
                 const ojson& logprobs = nullptr);  // finish_reason "" -> null
ojson completion_chunk(const std::string& id, const std::string& model, int64_t created, const std::string& text,
                       const std::string& finish_reason, int index = 0, const ojson& logprobs = nullptr);

// OpenAI finish_reason for a job's end: stop, tool_calls, length (max_tokens or a timeout: the
// answer is cut), grammar_dead_end (the grammar allowed no token).
std::string openai_finish_reason(FinishReason r);

void openai_chat(const Endpoint& e, const httpd::Request& req, httpd::Responder& res);
void openai_completions(const Endpoint& e, const httpd::Request& req, httpd::Responder& res);

}  // namespace kimi::server
