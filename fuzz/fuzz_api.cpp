// libFuzzer target: the server's request path (src/server/api.*), HTTP body -> validated request
// -> prompt tokens, as `kimi serve` runs it for POST /v1/chat/completions and /v1/completions,
// and the agent APIs' translation layers in front of the chat path (api_anthropic, api_responses).
// The first input byte picks the endpoint (bits 4-5: 1 Anthropic /v1/messages, 2 OpenAI
// /v1/responses, 3 /v1/messages/count_tokens; 0: bit 0 picks chat / completion) and the limits
// (bits 1-2: context 64, 256, 4096 or 32768 tokens; bit 3: a max_tokens cap); the rest is the body. The
// tokenizer is the tiny synthetic model's (from its GGUF). Every bad request must be an
// ApiError (400 naming the field); a crash, a sanitizer report, any other exception (a library's
// type_error, out_of_range, ...) is a bug. For an accepted chat request the first message's text
// is run through the response side as model output would be (tokens -> detokenizer -> chat
// parser -> chat_response JSON -> dump).
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "common.h"
#include "io/gguf.h"
#include "server/api.h"
#include "server/api_anthropic.h"
#include "server/api_openai.h"
#include "server/api_responses.h"
#include "tokenizer/chat.h"
#include "tokenizer/tokenizer.h"
#include "util/error.h"

using namespace kimi;

namespace {
const tok::Tokenizer& tokenizer() {
  static const tok::Tokenizer t = [] {
    auto r = gguf::Reader::open(fuzz::tiny_gguf());
    return tok::Tokenizer::from_gguf(*r);
  }();
  return t;
}

size_t respond(const server::ParsedRequest& req, const server::ojson& body, const tok::Tokenizer& t) {
  const auto& msgs = body["messages"];
  if (!msgs.is_array() || msgs.empty() || !msgs[0].contains("content") || !msgs[0]["content"].is_string()) return 0;
  const std::string text = msgs[0]["content"].get<std::string>();
  tok::ChatParser parser(req.gen.start_in_think);
  server::JobOutput out;
  tok::Detokenizer detok(t);
  for (int32_t id : t.encode(text, true)) server::apply_chat_text(parser, detok.push(id), out);
  server::apply_chat_text(parser, detok.flush(), out);
  server::Job::Result res;
  res.finish_reason = out.tool_calls.empty() ? server::FinishReason::Stop : server::FinishReason::ToolCalls;
  res.n_prompt = static_cast<int>(req.prompt.size());
  return server::chat_response("id", req.model, 0, {server::Choice{out, res}}, &t).dump().size();
}
}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  tokenizer();
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const uint8_t mode = data[0];
  const std::string body(reinterpret_cast<const char*>(data + 1), size - 1);
  server::Limits lim;
  static const int kCtx[4] = {64, 256, 4096, 32768};
  lim.n_ctx = kCtx[(mode >> 1) & 3];
  if (mode & 8) lim.max_tokens = 32;
  const tok::Tokenizer& t = tokenizer();
  size_t sink = 0;
  try {
    const int api = (mode >> 4) & 3;
    if (api != 0) {  // the translation into the chat request, then the chat path
      const server::ojson b = server::parse_body(body);
      const server::ojson chat = api == 2 ? server::responses_to_chat(b, lim).chat
                                          : server::anthropic_to_chat(b, lim, api == 3).chat;
      const server::ParsedRequest r = server::parse_chat_request(server::wire_json(chat), t, lim);
      sink += r.prompt.size() + r.rendered.size() + static_cast<size_t>(r.gen.max_tokens);
    } else if (mode & 1) {
      const server::ParsedRequest r = server::parse_completion_request(body, t, lim);
      sink += r.prompt.size() + static_cast<size_t>(r.gen.max_tokens);
    } else {
      const server::ParsedRequest r = server::parse_chat_request(body, t, lim);
      sink += r.prompt.size() + r.rendered.size() + static_cast<size_t>(r.gen.max_tokens);
      sink += respond(r, server::parse_body(body), t);
    }
  } catch (const server::ApiError& e) {
    if (e.status != 400) __builtin_trap();  // a request error is always a 400 here
    sink += e.param.size();
  }
  if (sink == 0xdeadbeef) return 1;  // keep `sink` alive
  return 0;
}
