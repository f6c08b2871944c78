// A multi-turn chat over one sequence of a kimi::Context (what `kimi chat` runs).
//
//   kimi::ChatSession s(ctx, tok, sampler_params, {.system = "Be brief.", .thinking = true});
//   auto st = s.prefill_turn("Hello");              // renders the conversation, prefills only new tokens
//   auto r  = s.generate([](const kimi::tok::ChatDelta& d) { ... stream d.reasoning / d.content ... });
//   s.save("chat.json");                             // {"thinking": true, "messages": [...]}
//
// Caching. The context holds exactly the tokens of cached_tokens(). Each turn the whole conversation
// (system, all earlier turns with the replies as parsed from the model output, the new user message,
// the generation prompt) is rendered with the Kimi-K3 chat format (tokenizer/chat.h) and tokenized;
// the result N is compared token-for-token with the cached tokens C:
//   * C is a prefix of N (the normal case): only N[|C|..] is prefilled;
//   * otherwise the history re-renders differently (a reply that re-tokenizes differently, a changed
//     system message, ...): the cache is cut back to the longest usable prefix and the rest is
//     re-prefilled, with a note (TurnStats::note). Usable prefixes: the KDA-state snapshot taken at
//     the end of the previous prompt (so a differently re-tokenized reply costs only that reply),
//     any prefix when the model has no KDA layer, else nothing (a full re-prefill).
// After prefill_turn() the context therefore always holds exactly encode(render(conversation)), so a
// reply is the same as a fresh run of the full rendered prompt (up to float rounding of batching).
//
// Generation stops at an end-of-generation token (<|end_of_msg|>, [EOS], [EOT], the GGUF eos), at
// max_tokens, when the context is full, or when the stop callback returns true (checked between
// tokens; Ctrl-C in `kimi chat`). The last sampled token is not evaluated (it is the first new token
// of the next turn if the re-rendered reply ends with it). The reply text is parsed into reasoning
// and response (tok::ChatParser) and kept as an assistant message {content, reasoning_content}.
#pragma once
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "runtime/context.h"
#include "runtime/sampling.h"
#include "runtime/speculative.h"
#include "tokenizer/chat.h"
#include "tokenizer/tokenizer.h"

namespace kimi {

struct ChatOptions {
  std::string system;                // system message; empty: none
  bool thinking = true;              // the template's `thinking` (reply starts in <think>)
  std::string thinking_effort;       // low|medium|high|max; empty: the template default (max)
  int max_tokens = -1;               // per reply; < 0: until end of generation or a full context
  int32_t seq_id = 0;                // sequence of the context used for the conversation
};

enum class StopReason { Eog, MaxTokens, ContextFull, Interrupted };
const char* stop_reason_name(StopReason r);

struct TurnStats {
  int n_prompt = 0;      // tokens of the rendered conversation (incl. the generation prompt)
  int n_reused = 0;      // tokens kept from the cache
  int n_prefilled = 0;   // tokens evaluated for this turn (= n_prompt - n_reused when complete)
  bool rerendered = false;  // the cache did not extend token-for-token (see note)
  std::string note;         // human-readable explanation when rerendered
  bool interrupted = false; // prefill stopped by the stop callback (the user message is dropped)
  double seconds = 0;
};

struct ReplyStats {
  std::vector<int32_t> tokens;  // every sampled token, incl. a final end-of-generation token
  StopReason stop = StopReason::Eog;
  double seconds = 0;
  std::string reasoning, content;  // parsed reply (also stored as the assistant message)
  double tokens_per_second() const;
};

class ChatSession {
 public:
  using StopFn = std::function<bool()>;
  using DeltaFn = std::function<void(const tok::ChatDelta&)>;

  // ctx and tok must outlive the session. The sequence opts.seq_id is cleared.
  ChatSession(Context& ctx, const tok::Tokenizer& tok, const SamplerParams& sp, ChatOptions opts = {});

  // Adds a user message, renders the conversation and brings the context up to date (see the header
  // comment). Throws kimi::Error (with the message dropped and the context still consistent) when
  // the prompt does not fit the context. stop is checked between micro-batches of n_batch_max
  // tokens; when it fires the user message is dropped and TurnStats::interrupted is set.
  TurnStats prefill_turn(const std::string& user_text, const StopFn& stop = {});
  // Samples the reply to the last prefilled turn, streaming parsed text deltas. Requires a
  // successful prefill_turn() since the last generate().
  ReplyStats generate(const DeltaFn& on_delta = {}, const StopFn& stop = {});

  // Speculative decoding of the replies (runtime/speculative.h; nullptr: off). The drafter must
  // outlive the session; the context needs one spare snapshot slot and n_batch_max >= 3 n_max + 2.
  void set_drafter(Drafter* d, const SpecParams& p) {
    drafter_ = d;
    spec_ = p;
  }
  const SpecStats& spec_stats() const { return spec_stats_; }  // summed over the replies

  // Conversation management.
  void reset();                                   // forget all turns (the system message stays)
  void set_system(const std::string& text);       // "" removes it; takes effect at the next turn
  const std::string& system() const { return opts_.system; }
  const ChatOptions& options() const { return opts_; }
  // OpenAI-style messages: [{"role": "system"|"user"|"assistant", "content", "reasoning_content"?}]
  tok::ojson messages() const;
  // {"thinking": bool, ["thinking_effort": ...,] "messages": [...]} — a chat request body that
  // `kimi template render` / tok::render_chat_request turn into the prompt of the next turn.
  tok::ojson to_json() const;
  void save(const std::string& path) const;       // to_json() pretty-printed (temp file + rename)

  // The prompt for the conversation plus `user_text` as the next user turn (no context change).
  std::string render_prompt(const std::optional<std::string>& user_text) const;
  std::vector<int32_t> prompt_tokens(const std::optional<std::string>& user_text) const;

  const std::vector<int32_t>& cached_tokens() const { return cached_; }  // == the context's sequence
  int n_turns() const;  // completed user turns

  // Images for the NEXT prefill_turn (docs/spec/vision.md §4): the tower's rows (rows of the model's
  // hidden size, in placeholder order) of the images whose media text the user text carries. The
  // conversation keeps every image's rows, so a re-prefill after a re-render still has them; a
  // turn that fails or is interrupted drops the pending rows.
  void attach_image_rows(const std::vector<float>& rows, int32_t placeholder);

 private:
  tok::ojson request(const std::optional<std::string>& user_text) const;
  // evaluates toks[from..] into the context, keeping cached_ in sync; false if stopped
  bool eval(const std::vector<int32_t>& toks, size_t from, const StopFn& stop, int& n_done);
  const float* image_row(size_t index) const;

  Context& ctx_;
  const tok::Tokenizer& tok_;
  Sampler sampler_;
  ChatOptions opts_;
  tok::ojson turns_ = tok::ojson::array();  // user/assistant messages (no system)
  std::vector<int32_t> cached_;             // tokens held by the context sequence
  bool ready_ = false;                      // prefill_turn succeeded, generate() not yet run
  size_t logits_entry_ = 0;                 // entry of the last decoded batch holding the logits
  std::vector<float> image_rows_;           // every image's projector rows, conversation order
  size_t committed_rows_ = 0;               // of which belong to completed turns
  int32_t placeholder_ = -1;                // <|media_pad|> (-1: no image yet)
  Drafter* drafter_ = nullptr;
  SpecParams spec_;
  SpecStats spec_stats_;
};

// The prompt of a single user turn (for `kimi run -p TEXT --chat`).
std::string render_single_turn(const std::string& user_text, const std::string& system = "", bool thinking = true);

}  // namespace kimi
