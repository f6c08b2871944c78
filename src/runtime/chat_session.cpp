#include "runtime/chat_session.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>

#include "util/error.h"

namespace kimi {

namespace {
using clk = std::chrono::steady_clock;
double since(clk::time_point t0) { return std::chrono::duration<double>(clk::now() - t0).count(); }
}  // namespace

const char* stop_reason_name(StopReason r) {
  switch (r) {
    case StopReason::Eog: return "end of message";
    case StopReason::MaxTokens: return "token limit";
    case StopReason::ContextFull: return "context full";
    case StopReason::Interrupted: return "interrupted";
  }
  return "?";
}

double ReplyStats::tokens_per_second() const {
  // the first token comes from the prompt's logits; the others each cost one decode
  const size_t n = tokens.size();
  return n > 1 && seconds > 0 ? static_cast<double>(n - 1) / seconds : 0.0;
}

ChatSession::ChatSession(Context& ctx, const tok::Tokenizer& tok, const SamplerParams& sp, ChatOptions opts)
    : ctx_(ctx), tok_(tok), sampler_(sp, ctx.n_vocab()), opts_(std::move(opts)) {
  check(opts_.seq_id >= 0 && opts_.seq_id < ctx_.options().n_seq_max, "chat: sequence id {} out of range 0..{}",
        opts_.seq_id, ctx_.options().n_seq_max - 1);
  check(tok_.n_vocab() <= ctx_.n_vocab(), "chat: the tokenizer has {} tokens but the model only {}", tok_.n_vocab(),
        ctx_.n_vocab());
  const std::string& e = opts_.thinking_effort;
  check(e.empty() || e == "low" || e == "high" || e == "max",  // what the K3 template's check takes
        "chat: thinking effort '{}' is not one of low, high, max", e);
  ctx_.seq_clear(opts_.seq_id);
}

tok::ojson ChatSession::messages() const {
  tok::ojson m = tok::ojson::array();
  if (!opts_.system.empty()) m.push_back({{"role", "system"}, {"content", opts_.system}});
  for (const auto& t : turns_) m.push_back(t);
  return m;
}

tok::ojson ChatSession::request(const std::optional<std::string>& user_text) const {
  tok::ojson body = tok::ojson::object();
  body["thinking"] = opts_.thinking;
  if (!opts_.thinking_effort.empty()) body["thinking_effort"] = opts_.thinking_effort;
  body["messages"] = messages();
  if (user_text) body["messages"].push_back({{"role", "user"}, {"content", *user_text}});
  return body;
}

tok::ojson ChatSession::to_json() const { return request(std::nullopt); }

std::string ChatSession::render_prompt(const std::optional<std::string>& user_text) const {
  return tok::render_chat_request(request(user_text));
}

std::vector<int32_t> ChatSession::prompt_tokens(const std::optional<std::string>& user_text) const {
  return tok_.encode(render_prompt(user_text), /*allow_special=*/true);
}

int ChatSession::n_turns() const {
  int n = 0;
  for (const auto& t : turns_) n += t["role"] == "user";
  return n;
}

void ChatSession::reset() {
  turns_ = tok::ojson::array();
  ctx_.seq_clear(opts_.seq_id);
  if (drafter_) drafter_->reset();
  cached_.clear();
  image_rows_.clear();
  committed_rows_ = 0;
  sampler_.reset();
  ready_ = false;
}

void ChatSession::set_system(const std::string& text) {
  opts_.system = text;
}

void ChatSession::save(const std::string& path) const {
  const std::string text = to_json().dump(2) + "\n";
  const std::string tmp = path + ".tmp";
  {
    std::ofstream f(tmp, std::ios::binary | std::ios::trunc);
    check(f.good(), "cannot write '{}'", tmp);
    f.write(text.data(), static_cast<std::streamsize>(text.size()));
    f.close();
    check(f.good(), "error writing '{}'", tmp);
  }
  std::error_code ec;
  std::filesystem::rename(tmp, path, ec);
  if (ec) {
    std::filesystem::remove(tmp, ec);
    fail("cannot rename '{}' to '{}'", tmp, path);
  }
}

void ChatSession::attach_image_rows(const std::vector<float>& rows, int32_t placeholder) {
  const size_t d = ctx_.model().hparams().n_embd;
  check(rows.size() % d == 0, "chat: image rows of {} floats are not rows of the hidden size {}", rows.size(), d);
  check(placeholder_ < 0 || placeholder_ == placeholder, "chat: image placeholder id changed");
  placeholder_ = placeholder;
  image_rows_.insert(image_rows_.end(), rows.begin(), rows.end());
}

const float* ChatSession::image_row(size_t index) const {
  const size_t d = ctx_.model().hparams().n_embd;
  check((index + 1) * d <= image_rows_.size(),
        "chat: the conversation has more image placeholders (<|media_pad|>) than the images attached give rows "
        "({}); an image placeholder typed as text is not an image",
        image_rows_.size() / d);
  return image_rows_.data() + index * d;
}

bool ChatSession::eval(const std::vector<int32_t>& toks, size_t from, const StopFn& stop, int& n_done) {
  const size_t chunk = static_cast<size_t>(std::max(1, ctx_.options().n_batch_max));
  Batch b;
  // image rows: the k-th placeholder of the conversation takes row k (vision.md §4)
  size_t n_ph = 0;
  if (placeholder_ >= 0)
    for (size_t j = 0; j < from; ++j) n_ph += toks[j] == placeholder_;
  for (size_t i = from; i < toks.size(); i += chunk) {
    if (stop && stop()) return false;
    const size_t end = std::min(toks.size(), i + chunk);
    b.clear();
    for (size_t j = i; j < end; ++j) {
      const bool last = j + 1 == toks.size();
      if (placeholder_ >= 0 && toks[j] == placeholder_)
        b.add_embd(toks[j], image_row(n_ph++), opts_.seq_id, static_cast<int32_t>(j), last);
      else
        b.add(toks[j], opts_.seq_id, static_cast<int32_t>(j), last);
    }
    ctx_.decode(b);
    // a drafter that reads the target's hidden states (dspark) gets every prompt row
    if (drafter_) observe_taps(*drafter_, ctx_, 0, static_cast<int32_t>(i), static_cast<int64_t>(end - i));
    logits_entry_ = end - i - 1;
    cached_.insert(cached_.end(), toks.begin() + static_cast<std::ptrdiff_t>(i),
                   toks.begin() + static_cast<std::ptrdiff_t>(end));
    for (size_t j = i; j < end; ++j) sampler_.accept(toks[j]);
    n_done += static_cast<int>(end - i);
  }
  return true;
}

TurnStats ChatSession::prefill_turn(const std::string& user_text, const StopFn& stop) {
  const auto t0 = clk::now();
  ready_ = false;
  TurnStats st;
  const std::vector<int32_t> toks = prompt_tokens(user_text);
  check(!toks.empty(), "chat: the rendered conversation is empty");
  // a failed or interrupted turn drops its pending image rows
  struct DropPending {
    std::vector<float>& rows;
    size_t keep;
    bool armed = true;
    ~DropPending() {
      if (armed) rows.resize(keep);
    }
  } drop{image_rows_, committed_rows_};
  if (placeholder_ >= 0) {
    size_t n_ph = 0;
    for (int32_t t : toks) n_ph += t == placeholder_;
    const size_t d = ctx_.model().hparams().n_embd;
    check(n_ph * d == image_rows_.size(),
          "chat: the conversation has {} image placeholder tokens but its images give {} rows", n_ph,
          image_rows_.size() / d);
  }
  st.n_prompt = static_cast<int>(toks.size());
  const int n_ctx = ctx_.options().n_ctx_max;
  check(st.n_prompt < n_ctx,
        "the conversation is {} tokens with this message, which leaves no room for a reply in the context of {} "
        "tokens (use /reset, or a larger -c/--ctx)",
        st.n_prompt, n_ctx);

  // longest common prefix of what is cached and the new rendering
  size_t lcp = 0;
  while (lcp < cached_.size() && lcp < toks.size() && cached_[lcp] == toks[lcp]) ++lcp;
  // at least one token must be evaluated: the reply needs the logits of the last prompt token
  const size_t limit = std::min(lcp, toks.size() - 1);
  size_t keep = cached_.size();
  if (limit < cached_.size()) {
    const int32_t snap = ctx_.seq_snapshot_pos(opts_.seq_id);
    if (ctx_.model().hparams().n_kda_layers() == 0) keep = limit;
    else if (snap >= 0 && static_cast<size_t>(snap) <= limit && static_cast<size_t>(snap) <= cached_.size()) keep = snap;
    else keep = 0;
    if (lcp < cached_.size()) {
      st.rerendered = true;
      st.note = fmt::format(
          "the conversation re-renders differently from the cached tokens (first difference at token {} of {}); ",
          lcp, cached_.size());
      st.note += keep == 0 ? fmt::format("re-prefilling all {} tokens", toks.size())
                           : fmt::format("keeping {} tokens and re-prefilling {}", keep, toks.size() - keep);
    }
    if (drafter_) drafter_->keep(static_cast<int32_t>(keep));
    if (keep == 0) ctx_.seq_clear(opts_.seq_id);
    else ctx_.seq_truncate(opts_.seq_id, static_cast<int32_t>(keep));
    cached_.resize(keep);
    // the repetition-penalty window must describe the kept tokens only
    sampler_.reset();
    const int w = sampler_.params().repeat_last_n;
    const size_t first = w < 0 ? 0 : keep - std::min(keep, static_cast<size_t>(w));
    for (size_t i = first; i < keep; ++i) sampler_.accept(cached_[i]);
  }
  st.n_reused = static_cast<int>(keep);
  if (!eval(toks, keep, stop, st.n_prefilled)) {
    st.interrupted = true;  // the message is not added; the context keeps the evaluated prefix
    if (image_rows_.size() > committed_rows_) {
      // the prefix may hold placeholders of this turn's images, whose rows are dropped: a later turn
      // with other images would match those tokens, so nothing of it is kept
      ctx_.seq_clear(opts_.seq_id);
      cached_.clear();
    }
    st.seconds = since(t0);
    return st;
  }
  turns_.push_back({{"role", "user"}, {"content", user_text}});
  drop.armed = false;
  committed_rows_ = image_rows_.size();
  ctx_.seq_snapshot(opts_.seq_id);  // a re-tokenized reply can go back here next turn
  ready_ = true;
  st.seconds = since(t0);
  return st;
}

ReplyStats ChatSession::generate(const DeltaFn& on_delta, const StopFn& stop) {
  check(ready_, "chat: generate() needs a successful prefill_turn() first");
  ready_ = false;
  const auto t0 = clk::now();
  ReplyStats r;
  tok::Detokenizer detok(tok_, /*skip_special=*/false);
  tok::ChatParser parser(/*start_in_think=*/opts_.thinking);
  auto feed = [&](const std::string& text) {
    if (text.empty()) return;
    tok::ChatDelta d = parser.push(text);
    if (on_delta && (!d.reasoning.empty() || !d.content.empty())) on_delta(d);
  };
  const int n_ctx = ctx_.options().n_ctx_max;
  const int32_t eos = ctx_.model().hparams().eos_id;
  // the prompt's last token is the last entry of the last prefill micro-batch
  const float* lg = ctx_.logits(logits_entry_);
  Batch b;
  r.stop = StopReason::Eog;
  // one sampled token: true when the reply ends with it
  auto take = [&](int32_t next) {
    r.tokens.push_back(next);
    feed(detok.push(next));
    if (tok_.is_eog(next) || next == eos) {
      r.stop = StopReason::Eog;
      return true;
    }
    if (opts_.max_tokens >= 0 && static_cast<int>(r.tokens.size()) >= opts_.max_tokens) {
      r.stop = StopReason::MaxTokens;
      return true;
    }
    return false;
  };
  if (drafter_) {  // speculative decoding: several tokens per forward pass, the same reply
    if (stop && stop()) {
      r.stop = StopReason::Interrupted;
    } else if (opts_.max_tokens == 0) {
      r.stop = StopReason::MaxTokens;
    } else {
      const int32_t first = sampler_.sample(lg);
      sampler_.accept(first);
      Speculator spec(ctx_, opts_.seq_id, sampler_, drafter_, spec_);
      spec.start(cached_, first, /*observe_prompt=*/false);  // eval() handed the prompt's rows over
      bool done = take(first);
      while (!done) {
        if (stop && stop()) {
          r.stop = StopReason::Interrupted;
          break;
        }
        if (ctx_.seq_len(opts_.seq_id) + spec.pending() > n_ctx) {
          r.stop = StopReason::ContextFull;
          break;
        }
        const int left = opts_.max_tokens >= 0 ? opts_.max_tokens - static_cast<int>(r.tokens.size()) : 1 << 30;
        for (int32_t t : spec.step(left))
          if ((done = take(t))) break;
      }
      // the tokens the context's sequence now holds
      cached_.assign(spec.history().begin(), spec.history().begin() + ctx_.seq_len(opts_.seq_id));
      spec_stats_.add(spec.stats());
    }
  }
  for (; !drafter_;) {
    if (stop && stop()) {
      r.stop = StopReason::Interrupted;
      break;
    }
    if (opts_.max_tokens == 0) {
      r.stop = StopReason::MaxTokens;
      break;
    }
    const int32_t next = sampler_.sample(lg);
    sampler_.accept(next);
    if (take(next)) break;
    if (static_cast<int>(cached_.size()) >= n_ctx) {
      r.stop = StopReason::ContextFull;
      break;
    }
    b.clear();
    b.add(next, opts_.seq_id, static_cast<int32_t>(cached_.size()), true);
    ctx_.decode(b);
    cached_.push_back(next);
    lg = ctx_.logits(0);
  }
  feed(detok.flush());
  tok::ChatDelta d = parser.finish();
  if (on_delta && (!d.reasoning.empty() || !d.content.empty())) on_delta(d);
  r.seconds = since(t0);
  r.reasoning = parser.message().reasoning;
  r.content = parser.message().content;
  tok::ojson msg = {{"role", "assistant"}, {"content", r.content}};
  if (opts_.thinking) msg["reasoning_content"] = r.reasoning;
  turns_.push_back(std::move(msg));
  return r;
}

std::string render_single_turn(const std::string& user_text, const std::string& system, bool thinking) {
  tok::ojson body = tok::ojson::object();
  body["thinking"] = thinking;
  body["messages"] = tok::ojson::array();
  if (!system.empty()) body["messages"].push_back({{"role", "system"}, {"content", system}});
  body["messages"].push_back({{"role", "user"}, {"content", user_text}});
  return tok::render_chat_request(body);
}

}  // namespace kimi
