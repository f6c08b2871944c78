// The OpenAI API (api_openai.h): chat/completions and completions bodies -> the internal request,
// the driver's events -> chat.completion(.chunk) / text_completion objects.
#include "server/api_openai.h"

#include <fmt/format.h>

#include "util/error.h"
#include "util/json.h"

namespace kimi::server {

ojson tool_call_json(const tok::ParsedToolCall& c, const std::string& id) {
  std::string args;
  if (!c.arguments_json.empty()) {  // what a stream sent for the call, piece by piece (tok::ToolCallDelta)
    args = c.arguments_json;
  } else if (!c.raw_json.empty()) {
    const ojson parsed = try_parse_json<ojson>(c.raw_json);
    args = !parsed.is_discarded() && parsed.is_object() ? parsed.dump() : c.raw_json;
  } else {
    args = c.arguments.dump();
  }
  return ojson{{"id", id}, {"type", "function"}, {"function", {{"name", c.name}, {"arguments", args}}}};
}

ojson usage_json(const Job::Result& r) {
  return ojson{{"prompt_tokens", r.n_prompt},
               {"completion_tokens", r.n_generated},
               {"total_tokens", r.n_prompt + r.n_generated},
               {"prompt_tokens_details", {{"cached_tokens", r.n_cached}}}};
}

std::string openai_finish_reason(FinishReason r) {
  switch (r) {
    case FinishReason::ToolCalls: return "tool_calls";
    case FinishReason::GrammarDeadEnd: return "grammar_dead_end";
    case FinishReason::Length:
    case FinishReason::Timeout: return "length";
    default: return "stop";
  }
}

namespace {

ojson bytes_json(const std::string& piece) {
  ojson b = ojson::array();
  for (unsigned char c : piece) b.push_back(static_cast<int>(c));
  return b;
}

const std::string& piece_of(const tok::Tokenizer& tok, int32_t id) {
  static const std::string none;
  return id >= 0 && id < tok.n_vocab() ? tok.token_to_piece(id) : none;
}

ojson chat_entry(const TokenLogprob& l, const tok::Tokenizer& tok) {
  ojson top = ojson::array();
  for (const auto& [id, lp] : l.top) {
    const std::string& p = piece_of(tok, id);
    top.push_back({{"token", p}, {"logprob", lp}, {"bytes", bytes_json(p)}});
  }
  return {{"token", l.piece}, {"logprob", l.logprob}, {"bytes", bytes_json(l.piece)}, {"top_logprobs", std::move(top)}};
}

}  // namespace

ojson chat_logprobs_json(const std::vector<TokenLogprob>& lp, const tok::Tokenizer& tok) {
  ojson content = ojson::array(), reasoning = ojson::array();
  for (const TokenLogprob& l : lp) {
    if (l.channel == TokenLogprob::Reasoning) reasoning.push_back(chat_entry(l, tok));
    else if (l.channel == TokenLogprob::Content || l.channel == TokenLogprob::Text) content.push_back(chat_entry(l, tok));
  }
  ojson j = {{"content", std::move(content)}};
  if (!reasoning.empty()) j["reasoning_content"] = std::move(reasoning);
  return j;
}

ojson completion_logprobs_json(const std::vector<TokenLogprob>& lp, const tok::Tokenizer& tok, size_t text_offset0) {
  ojson tokens = ojson::array(), lps = ojson::array(), tops = ojson::array(), offs = ojson::array();
  size_t off = text_offset0;
  for (const TokenLogprob& l : lp) {
    tokens.push_back(l.piece);
    lps.push_back(l.logprob);
    ojson t = ojson::object();
    for (const auto& [id, v] : l.top) t[piece_of(tok, id)] = v;  // same piece twice: the better one stays
    tops.push_back(std::move(t));
    offs.push_back(off);
    off += l.piece.size();
  }
  return {{"tokens", std::move(tokens)}, {"token_logprobs", std::move(lps)}, {"top_logprobs", std::move(tops)},
          {"text_offset", std::move(offs)}};
}

ojson usage_json(const std::vector<Job::Result>& rs) {
  int gen = 0;
  for (const auto& r : rs) gen += r.n_generated;
  const int prompt = rs.empty() ? 0 : rs[0].n_prompt;
  int cached = 0;
  for (const auto& r : rs) cached = std::max(cached, r.n_cached);
  return ojson{{"prompt_tokens", prompt},
               {"completion_tokens", gen},
               {"total_tokens", prompt + gen},
               {"prompt_tokens_details", {{"cached_tokens", cached}}}};
}

ojson chat_response(const std::string& id, const std::string& model, int64_t created, const std::vector<Choice>& cs,
                    const tok::Tokenizer* tok) {
  ojson choices = ojson::array();
  std::vector<Job::Result> rs;
  for (size_t k = 0; k < cs.size(); ++k) {
    const JobOutput& out = cs[k].out;
    ojson msg = ojson::object();
    msg["role"] = "assistant";
    msg["content"] = out.content.empty() && !out.tool_calls.empty() ? ojson(nullptr) : ojson(out.content);
    if (!out.reasoning.empty()) msg["reasoning_content"] = out.reasoning;
    if (!out.tool_calls.empty()) {
      ojson calls = ojson::array();
      for (size_t i = 0; i < out.tool_calls.size(); ++i)
        calls.push_back(tool_call_json(out.tool_calls[i], cs.size() == 1 ? fmt::format("call_{}_{}", id, i)
                                                                          : fmt::format("call_{}_{}_{}", id, k, i)));
      msg["tool_calls"] = std::move(calls);
    }
    const bool lp = tok != nullptr;  // asked for: a list even when it is empty
    choices.push_back({{"index", k}, {"message", msg}, {"logprobs", lp ? chat_logprobs_json(out.logprobs, *tok) : ojson(nullptr)},
                       {"finish_reason", openai_finish_reason(cs[k].result.finish_reason)}});
    rs.push_back(cs[k].result);
  }
  return ojson{{"id", id},       {"object", "chat.completion"}, {"created", created},
               {"model", model}, {"choices", std::move(choices)}, {"usage", usage_json(rs)}};
}

ojson completion_response(const std::string& id, const std::string& model, int64_t created,
                          const std::vector<Choice>& cs, const tok::Tokenizer* tok) {
  ojson choices = ojson::array();
  std::vector<Job::Result> rs;
  for (size_t k = 0; k < cs.size(); ++k) {
    const JobOutput& out = cs[k].out;
    const bool lp = tok != nullptr;
    choices.push_back({{"text", out.text}, {"index", k},
                       {"logprobs", lp ? completion_logprobs_json(out.logprobs, *tok) : ojson(nullptr)},
                       {"finish_reason", openai_finish_reason(cs[k].result.finish_reason)}});
    rs.push_back(cs[k].result);
  }
  return ojson{{"id", id},       {"object", "text_completion"}, {"created", created},
               {"model", model}, {"choices", std::move(choices)}, {"usage", usage_json(rs)}};
}

ojson chat_chunk(const std::string& id, const std::string& model, int64_t created, const ojson& delta,
                 const std::string& finish_reason, int index, const ojson& logprobs) {
  ojson choice = {{"index", index}, {"delta", delta}, {"logprobs", logprobs},
                  {"finish_reason", finish_reason.empty() ? ojson(nullptr) : ojson(finish_reason)}};
  return ojson{{"id", id}, {"object", "chat.completion.chunk"}, {"created", created}, {"model", model},
               {"choices", ojson::array({choice})}};
}

ojson completion_chunk(const std::string& id, const std::string& model, int64_t created, const std::string& text,
                       const std::string& finish_reason, int index, const ojson& logprobs) {
  ojson choice = {{"text", text}, {"index", index}, {"logprobs", logprobs},
                  {"finish_reason", finish_reason.empty() ? ojson(nullptr) : ojson(finish_reason)}};
  return ojson{{"id", id}, {"object", "text_completion"}, {"created", created}, {"model", model},
               {"choices", ojson::array({choice})}};
}



// ---------------------------------------------------------------------------------------------
// The handlers

namespace {

// llama-server's `timings` of a streamed choice's last chunk (the web page shows them): prompt_n tokens
// evaluated (not cached) in prompt_ms, cache_n reused, predicted_n generated in predicted_ms (first
// token -> end: total_s - ttft_s, the interval the log line takes); the speeds are the log line's
// (generation: the tokens after the first).
ojson timings_json(const Job::Result& r) {
  const int prompt_n = r.n_prompt - r.n_cached;
  const double gen_s = r.n_generated > 0 && r.ttft_s >= 0 ? std::max(0.0, r.total_s - r.ttft_s) : 0.0;
  return ojson{{"prompt_n", prompt_n}, {"prompt_ms", r.prefill_s * 1e3},
               {"prompt_per_second", r.prefill_s > 0 ? prompt_n / r.prefill_s : 0.0},
               {"predicted_n", r.n_generated}, {"predicted_ms", gen_s * 1e3},
               {"predicted_per_second", gen_s > 0 && r.n_generated > 1 ? (r.n_generated - 1) / gen_s : 0.0},
               {"cache_n", r.n_cached}};
}

// The prompt's progress as llama-server's `prompt_progress` (docs/server.md, "Progress").
ojson progress_json(const Progress& p) {
  return {{"total", p.total}, {"cache", p.cache}, {"processed", p.processed}, {"time_ms", std::round(p.time_ms)}};
}

// Chat and completions in OpenAI's wire format. A stream: `data:` chunks (with n > 1 the choices'
// chunks interleave, each with its index), then the usage chunk (stream_options.include_usage) and
// `data: [DONE]`; a stream that does not end normally (an engine error, a timeout, the shutdown
// grace running out) ends with an error chunk and no [DONE].
class OpenAiRenderer final : public Renderer {
 public:
  OpenAiRenderer(const Endpoint& e, bool chat) : e_(e), chat_(chat), created_(unix_seconds()) {}
  const char* id_prefix() const override { return chat_ ? "chatcmpl-" : "cmpl-"; }
  void set(const ParsedRequest& pr) {
    include_usage_ = pr.include_usage;
    logprobs_ = pr.gen.logprobs >= 0;
  }

  std::string stream_head(size_t n) override {
    per_.assign(n, PerChoice{});
    std::string s;
    if (chat_)
      for (size_t k = 0; k < n; ++k) s += sse_data(chunk({{"role", "assistant"}, {"content", ""}}, "", k));
    return s;
  }
  void logprobs(size_t k, const std::vector<TokenLogprob>& lp) override {
    if (!logprobs_) return;
    PerChoice& c = per_[k];
    if (chat_) {
      c.lp = chat_logprobs_json(lp, e_.tok);
    } else {
      c.lp = completion_logprobs_json(lp, e_.tok, c.text_off);
      for (const auto& l : lp) c.text_off += l.piece.size();
    }
  }
  void text(size_t k, const std::string& t, std::string&) override { per_[k].text += t; }
  void thinking(size_t k, const std::string& t, std::string&) override { per_[k].reasoning += t; }
  void content(size_t k, const std::string& t, std::string&) override { per_[k].content += t; }
  // tool calls as they are generated: a chunk with the id and name when a call starts, then its
  // arguments in pieces (the index counts the calls of the choice, as in the whole answer)
  void tool_start(size_t k, const std::string& name, std::string& buf) override {
    flush(k, buf);
    PerChoice& c = per_[k];
    const std::string cid = per_.size() == 1 ? fmt::format("call_{}_{}", id, c.n_tool) : fmt::format("call_{}_{}_{}", id, k, c.n_tool);
    buf += sse_data(chunk({{"tool_calls", ojson::array({ojson{{"index", c.n_tool}, {"id", cid}, {"type", "function"},
                                                              {"function", {{"name", name}, {"arguments", ""}}}}})}}, "", k));
    ++c.n_tool;
  }
  void tool_args(size_t k, const std::string& piece, std::string& buf) override {
    PerChoice& c = per_[k];
    if (c.n_tool == 0) return;
    buf += sse_data(chunk({{"tool_calls", ojson::array({ojson{{"index", c.n_tool - 1}, {"function", {{"arguments", piece}}}}})}}, "", k));
  }
  void tool_done(size_t, std::string&) override {}
  void flush(size_t k, std::string& buf) override {
    PerChoice& c = per_[k];
    if (!chat_) {
      if (!c.text.empty() || !c.lp.is_null()) buf += sse_data(completion_chunk(id, e_.model_id, created_, c.text, "", static_cast<int>(k), c.lp));
    } else {
      if (!c.reasoning.empty()) {
        buf += sse_data(chunk({{"reasoning_content", c.reasoning}}, "", k, c.content.empty() ? c.lp : ojson(nullptr)));
        if (c.content.empty()) c.lp = nullptr;
      }
      if (!c.content.empty()) {
        buf += sse_data(chunk({{"content", c.content}}, "", k, c.lp));
        c.lp = nullptr;
      }
      if (!c.lp.is_null())  // tokens whose text is held back or structural: their records still come
        buf += sse_data(chunk(ojson::object(), "", k, c.lp));
    }
    c.text.clear();
    c.reasoning.clear();
    c.content.clear();
    c.lp = nullptr;
  }
  // an empty delta (every OpenAI client takes it), with the prompt's progress while it is read
  std::string progress(const Progress& p) override {
    ojson j = chat_ ? chunk(ojson::object(), "", 0) : completion_chunk(id, e_.model_id, created_, "", "", 0);
    if (p.reading) j["prompt_progress"] = progress_json(p);
    return sse_data(j);
  }
  void finish(size_t k, const Job::Result& r, std::string& buf) override {
    const std::string fr = openai_finish_reason(r.finish_reason);
    ojson last = chat_ ? chunk(ojson::object(), fr, k) : completion_chunk(id, e_.model_id, created_, "", fr, static_cast<int>(k));
    last["timings"] = timings_json(r);
    buf += sse_data(last);
  }
  std::string stream_tail(const std::vector<Job::Result>& rs) override {
    std::string tail;
    if (include_usage_)
      tail += sse_data(ojson{{"id", id}, {"object", chat_ ? "chat.completion.chunk" : "text_completion"},
                             {"created", created_}, {"model", e_.model_id}, {"choices", ojson::array()},
                             {"usage", usage_json(rs)}});
    return tail + "data: [DONE]\n\n";
  }
  std::string stream_error(const ApiError& err) override {
    return sse_data(error_json(err.status, err.what(), err.type, err.param, err.code));
  }

  httpd::Reply whole(const std::vector<Choice>& cs) override {
    const tok::Tokenizer* lp_tok = logprobs_ ? &e_.tok : nullptr;
    return json_reply(chat_ ? chat_response(id, e_.model_id, created_, cs, lp_tok)
                            : completion_response(id, e_.model_id, created_, cs, lp_tok));
  }
  httpd::Reply error(const ApiError& err) override { return error_reply(err); }

 private:
  struct PerChoice {
    std::string text, reasoning, content;  // of the drained piece
    ojson lp;                              // its logprobs (null: none)
    int n_tool = 0;
    size_t text_off = 0;                   // completions: offset of the next token in the choice's text
  };
  ojson chunk(const ojson& delta, const std::string& fr, size_t k, const ojson& lp = nullptr) const {
    return chat_chunk(id, e_.model_id, created_, delta, fr, static_cast<int>(k), lp);
  }
  const Endpoint& e_;
  bool chat_;
  int64_t created_;
  bool include_usage_ = false, logprobs_ = false;
  std::vector<PerChoice> per_;
};

void generate(const Endpoint& e, const httpd::Request& req, httpd::Responder& res, bool chat) {
  OpenAiRenderer r(e, chat);
  drive(e, res, r, [&](const Limits& lim) {
    ParsedRequest pr = chat ? parse_chat_request(req.body, e.tok, lim) : parse_completion_request(req.body, e.tok, lim);
    r.set(pr);
    return pr;
  });
}

}  // namespace

void openai_chat(const Endpoint& e, const httpd::Request& req, httpd::Responder& res) { generate(e, req, res, true); }
void openai_completions(const Endpoint& e, const httpd::Request& req, httpd::Responder& res) {
  generate(e, req, res, false);
}

}  // namespace kimi::server
