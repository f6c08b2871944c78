// OpenAI-compatible request parsing / validation and response building for `kimi serve`.
// Pure functions (no HTTP, no engine) so that they can be unit-tested directly.
#pragma once
#include <nlohmann/json.hpp>
#include <stdexcept>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "model/vision.h"
#include "server/api_error.h"
#include "server/grammar.h"
#include "server/job.h"
#include "tokenizer/chat.h"
#include "tokenizer/tokenizer.h"

namespace kimi::server {

using ojson = nlohmann::ordered_json;

// Stop strings are matched against the text after every generated token, on the scheduler thread:
// their number and length are bounded (docs/server.md "Chat request fields"). Chat `stop`: at most 4
// (OpenAI's limit); Anthropic `stop_sequences`: at most 64; each at most 1024 bytes.
inline constexpr size_t kMaxStopSequences = 64;
inline constexpr size_t kMaxStopBytes = 1024;

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
  SamplerParams sampling = {.temp = 1.0f, .top_p = 0.95f};  // K3's sampling contract
  bool fixed_seed = false;
  // The thinking budget of a chat request that gives none (kimi serve --reasoning-budget;
  // GenParams::thinking_budget): -1 no cap.
  int thinking_budget = -1;
  // A DSpark draft is loaded (kimi serve -md): requests may choose "speculative": {"type": "dspark"}.
  bool dspark = false;
  // The compile budget of grammars, schemas and tool parameter schemas (grammar.h); its
  // `cancelled` is set per request (the client has gone).
  grammar::Budget budget;
  // Images in chat messages (docs/server.md "Images"): the vision model whose preprocessing they go
  // through (nullptr: a text-only model, an image is refused with a 400 that says how to get a
  // vision-capable file; `model_path` names the model there), and the limits of one request:
  // images, bytes of each image file (after base64), pixels of each image (width x height as its
  // header states it, checked before any pixel is decoded).
  const VisionModel* vision = nullptr;
  std::string model_path;
  int image_max_count = 16;
  uint64_t image_max_bytes = uint64_t{20} << 20;
  uint64_t image_max_pixels = 40'000'000;
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
  std::string grammar_param;   // the field the output constraint came from (gen.grammar set)
};

// Parse + validate a request body (throws ApiError). Renders chat messages with the K3 template
// and tokenizes the prompt.
ParsedRequest parse_chat_request(const std::string& body, const tok::Tokenizer& tok, const Limits& lim);
ParsedRequest parse_completion_request(const std::string& body, const tok::Tokenizer& tok, const Limits& lim);

// Parses a JSON body into an object (ApiError 400 for malformed JSON, nesting deeper than
// kJsonMaxDepth, a number out of range (the message and `param` name the field), not an object).
ojson parse_body(const std::string& body);

// One choice of a response: its output and result.
struct Choice {
  JobOutput out;
  Job::Result result;
};

// OpenAI's reasoning effort onto K3's thinking: none -> thinking off; minimal, low -> low;
// medium, high -> high (the K3 template's check takes low, high, max); xhigh -> max. Sets
// "thinking" / "thinking_effort" of a chat body; false for a value not in the map (chat's
// reasoning_effort, Responses' reasoning.effort).
inline bool map_reasoning_effort(const std::string& effort, ojson& chat) {
  if (effort == "none") {
    chat["thinking"] = false;
    chat.erase("thinking_effort");
    return true;
  }
  const char* k3 = effort == "minimal" || effort == "low"  ? "low"
                   : effort == "medium" || effort == "high" ? "high"  // K3 knows no medium
                   : effort == "xhigh"                      ? "max"
                                                            : nullptr;
  if (!k3) return false;
  chat["thinking"] = true;
  chat["thinking_effort"] = k3;
  return true;
}

bool constant_time_equal(const std::string& a, const std::string& b);

// ---------------------------------------------------------------------------------------------
// Checks shared by every API that takes tools, tool results and user text (chat completions and
// the translation layers of other APIs). Each throws ApiError 400 whose `param` names the field
// (prefixed with the `param` given) and whose message names the rule.

// OpenAI's tool name rule: ^[a-zA-Z0-9_-]{1,64}$.
bool valid_tool_name(std::string_view name);
void check_tool_name(const ojson& name, const std::string& param);  // a string that passes valid_tool_name
// A tool's `parameters`: an object that is a JSON schema of the subset the grammar compiler takes
// (grammar.h schema_to_gbnf, within the compile budget): {"type":"bogus"} is refused.
void check_tool_parameters(const ojson& parameters, const std::string& param);
// OpenAI `tools`: [{"type":"function","function":{"name","description"?,"parameters"?,"strict"?}}];
// every name valid and unique, description a string, parameters as above. Returns the names in order.
std::vector<std::string> check_tools(const ojson& tools, const std::string& param = "tools");
// `tool_choice`: "none" | "auto" | "required" | {"type":"function","function":{"name"}} whose name is
// one of `tool_names`; "required" and a named function need at least one tool.
void check_tool_choice(const ojson& tool_choice, const std::vector<std::string>& tool_names,
                       const std::string& param = "tool_choice");
// OpenAI-shaped messages: every {"role":"tool"} message carries a `tool_call_id` that an earlier
// assistant message issued (tool_calls[].id) and that no earlier tool message answered; an
// assistant's call ids are unique within the conversation.
void check_tool_call_ids(const ojson& messages, const std::string& param = "messages");

// Renders the chat template for `template_request` (what tok::render_chat_request takes) and
// tokenizes it so that no text taken from the request can become a special token: the template's
// own tags are special tokens, every user-supplied string (contents, names, tool definitions, tool
// results, arguments, schemas) is tokenized as plain text, whatever it contains ("<|open|>" stays
// 8 characters). Outside user text the tokens are exactly those of tok.encode(rendered, true).
// `rendered` (optional) receives the plain prompt text. Throws ApiError 400
// (context_length_exceeded) as the prompt limit of `lim` requires; template errors propagate.
// `images`: the request's images in the order of its image parts; each image part the template
// renders (tok::kImagePlaceholder) becomes that image's media tokens, <|media_begin|>image WxH
// <|media_content|> + its tokens x <|media_pad|> + <|media_end|> (docs/spec/vision.md §4).
std::vector<int32_t> render_chat_tokens(const ojson& template_request, const tok::Tokenizer& tok, const Limits& lim,
                                        std::string* rendered = nullptr,
                                        const std::vector<image::Patches>* images = nullptr);

// The output constraint compilers (GBNF text, JSON schema) under the one compile budget
// (grammar::Budget: nesting depth, expanded size, time, cancellation): ApiError 400 naming `param`
// and the limit (code invalid_grammar, unsupported_schema, or grammar_too_complex), never a library
// error. The grammar's language must not be empty.
std::shared_ptr<const grammar::Grammar> compile_gbnf(const std::string& gbnf, const std::string& param,
                                                     const grammar::Budget& budget);
std::string compile_schema(const ojson& schema, const std::string& param, const grammar::Budget& budget);

}  // namespace kimi::server
