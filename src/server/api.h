// OpenAI-compatible request parsing / validation and response building for `kimi serve`.
// Pure functions (no HTTP, no engine) so that they can be unit-tested directly.
#pragma once
#include <nlohmann/json.hpp>
#include <stdexcept>
#include <string>
#include <vector>

#include "server/scheduler.h"
#include "tokenizer/chat.h"
#include "tokenizer/tokenizer.h"

namespace kimi::server {

using ojson = nlohmann::ordered_json;

// A request error: becomes {"error":{"message","type","param","code"}} with `status`.
struct ApiError : std::runtime_error {
  ApiError(int status, std::string message, std::string type = "invalid_request_error", std::string param = "",
           std::string code = "")
      : std::runtime_error(message), status(status), type(std::move(type)), param(std::move(param)),
        code(std::move(code)) {}
  int status;
  std::string type, param, code;
};

ojson error_json(int status, const std::string& message, const std::string& type = "", const std::string& param = "",
                 const std::string& code = "");
std::string error_type_for(int status);  // 400 invalid_request_error, 401 authentication_error, ...

struct Limits {
  int n_ctx = 4096;             // positions per sequence
  int max_prompt_tokens = 0;    // 0: n_ctx - 1
  int max_tokens = 0;           // upper bound for a request's max_tokens (0: n_ctx)
  int default_max_tokens = 0;   // chat default when the request has none (0: what the context allows)
  double timeout_s = 600;       // per request (0: none)
  size_t max_token_bytes = 0;   // longest token in bytes (Tokenizer::max_token_bytes; 0: unknown):
                                // a prompt text longer than limit * this is refused untokenized
  // Sampling of a request that leaves a field out (kimi serve --temp, --top-k, ...; OpenAI's
  // temperature 1 by default). The seed: a random one per request unless fixed_seed.
  SamplerParams sampling = {.temp = 1.0f};
  bool fixed_seed = false;
};

// The prompt token limit these limits give (max_prompt_tokens or n_ctx - 1, whichever is smaller).
int prompt_limit(const Limits& lim);

struct ParsedRequest {
  std::vector<int32_t> prompt;
  GenParams gen;
  int n = 1;                   // choices (n): n jobs with seeds seed, seed + 1, ...
  bool stream = false;
  bool include_usage = false;  // stream_options.include_usage
  std::string model;           // as given (informational)
  std::string rendered;        // chat: the rendered prompt text
};

// Parse + validate a request body (throws ApiError). Renders chat messages with the K3 template
// and tokenizes the prompt.
ParsedRequest parse_chat_request(const std::string& body, const tok::Tokenizer& tok, const Limits& lim);
ParsedRequest parse_completion_request(const std::string& body, const tok::Tokenizer& tok, const Limits& lim);

// Parses a JSON body into an object (ApiError 400 for malformed JSON, nesting deeper than
// kJsonMaxDepth, a number out of range (the message and `param` name the field), not an object).
ojson parse_body(const std::string& body);

// Feeds raw model text through a chat parser into `out` (what the scheduler does per token).
void apply_chat_text(tok::ChatParser& parser, const std::string& text, JobOutput& out);

// OpenAI tool call object for a parsed call (arguments as a JSON string).
ojson tool_call_json(const tok::ParsedToolCall& c, const std::string& id);
ojson usage_json(const Job::Result& r);

ojson usage_json(const std::vector<Job::Result>& rs);  // n choices: the prompt counted once

// One choice of a response: its output and result.
struct Choice {
  JobOutput out;
  Job::Result result;
};

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

// OpenAI finish_reason for a scheduler result ("timeout" / "cancelled" map to "length" / "stop").
std::string openai_finish_reason(const std::string& r);

bool constant_time_equal(const std::string& a, const std::string& b);

}  // namespace kimi::server
