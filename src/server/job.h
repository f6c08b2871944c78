// The job layer of `kimi serve`, under the scheduler and every API: one generation request (Job)
// with its parameters (GenParams), the output it produces (JobOutput) and how it ended
// (FinishReason). The scheduler fills jobs; the job driver (job_driver.h) submits and drains them;
// the wire formats (api_openai, api_anthropic, api_responses) translate FinishReason into their
// own words.
#pragma once
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <ostream>
#include <string>
#include <string_view>
#include <vector>

#include "image/image.h"
#include "runtime/sampling.h"
#include "runtime/speculative.h"
#include "server/grammar.h"
#include "tokenizer/chat.h"

namespace kimi::server {

using Clock = std::chrono::steady_clock;

// How a job ended. Stop: an end token, a stop string, the grammar's sentence complete or the chat
// message done; ToolCalls: a Stop whose message holds tool calls; Length: max_tokens or the
// context is full; GrammarDeadEnd: the grammar allowed no token (the answer is cut, not a Stop);
// Cancelled: the client went away or the shutdown grace ran out; Timeout: the request's deadline;
// Error: the engine failed (Job::Result::http_status and error say more).
enum class FinishReason : uint8_t { Stop, ToolCalls, Length, GrammarDeadEnd, Cancelled, Timeout, Error };

std::string_view to_string(FinishReason r);  // "stop", "tool_calls", "length", "grammar_dead_end", ...
inline std::ostream& operator<<(std::ostream& os, FinishReason r) { return os << to_string(r); }
// The job produced an answer (its output is whole as far as it goes): Stop, ToolCalls, Length,
// GrammarDeadEnd.
inline bool is_answer(FinishReason r) { return r <= FinishReason::GrammarDeadEnd; }
// The answer was cut before its natural end (Length, GrammarDeadEnd, Timeout).
inline bool is_cut(FinishReason r) {
  return r == FinishReason::Length || r == FinishReason::GrammarDeadEnd || r == FinishReason::Timeout;
}

// The images of a prompt (docs/spec/vision.md §4, docs/engine.md "Images in the server"), decoded
// and preprocessed when the request is parsed. In the job's prompt every <|media_pad|> position
// holds an image key instead of the placeholder id: a negative value made from the image's
// content hash and the position inside the image (image_key), so that the prompt cache, which
// compares token ids, matches an image span only when the same image is at the same place. The
// scheduler feeds `placeholder` with the tower's row `row[i]` at such a position i.
struct PromptImages {
  std::vector<image::Patches> images;  // in prompt order
  std::vector<int32_t> row;            // per prompt token: its row of the tower's output, -1 for a text token
  int32_t placeholder = -1;            // <|media_pad|>
  int64_t n_rows = 0;                  // sum of the images' tokens
};

// The key of the j-th <|media_pad|> of an image with content hash h: a value in [-2^30, -1]
// (token ids are >= 0); two different images differ at their first position but with
// probability 2^-30.
inline int32_t image_key(uint64_t h, int64_t j) {
  uint64_t x = h + 0x9E3779B97F4A7C15ull * static_cast<uint64_t>(j + 1);
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  x ^= x >> 31;
  return -1 - static_cast<int32_t>(x & 0x3FFFFFFFu);
}

struct GenParams {
  SamplerParams sampler;
  int max_tokens = 16;
  std::vector<std::string> stop;  // stop strings (searched in the raw generated text)
  bool chat = false;              // parse the output with tok::ChatParser
  bool start_in_think = true;     // the prompt ended with the think tag open
  bool ignore_eos = false;
  // Chat with start_in_think: at most this many tokens are generated in the think channel; the
  // next tokens are then forced to be the template's close sequence (Scheduler::think_close(),
  // "<|close|>think<|sep|><|open|>response<|sep|>") and the answer follows. -1: no cap; 0: the
  // close sequence comes first (an empty think channel). A think channel the model closes itself
  // (a whole tag that leaves it: <|close|>think<|sep|>, <|open|>response<|sep|>, ...) ends the
  // count (nothing is forced); a bare <|open|> / <|close|> inside it is thinking and counts.
  int thinking_budget = -1;
  int logprobs = -1;              // -1: none; N >= 0: each token's log-probability and the N most likely
  // The answer must be a sentence of this grammar (response_format, json_schema, grammar): the
  // whole output of a completion; in chat the response channel only (thinking and tool calls are
  // free), which ends as soon as the grammar is complete and the model closes it.
  std::shared_ptr<const grammar::Grammar> grammar;
  // Enforced tool calls (tool_grammar.h): the output is held to this grammar, in which the
  // structural special tokens <|open|>, <|close|>, <|sep|> are the code points U+E000..U+E002; from
  // the first token when tool_trigger is empty, else once the raw output ends with tool_trigger
  // (the lazy constraint of tool_choice auto). While `grammar` constrains the response channel,
  // it has precedence (that answer ends with the response).
  std::shared_ptr<const grammar::Grammar> tool_grammar;
  std::string tool_trigger;
  // The tool grammar must end with its calls (tool_choice required or a named tool): once the
  // tokens left (max_tokens) are only just enough for the cheapest completion of the grammar's
  // sentence (grammar::Matcher::cheapest_completion tokenized, plus the end token), that completion
  // is forced, so the answer ends with a whole call instead of being cut by max_tokens.
  bool tool_must_finish = false;
  Clock::time_point deadline = Clock::time_point::max();
  // Speculative decoding of this request (the request's "speculative" object; docs/speculative.md):
  // unset fields take the server's --spec / --draft-max / --draft-min (SchedulerOptions). Used only
  // when the output is unconstrained (no grammar, tool grammar or thinking budget).
  std::optional<SpecType> spec_type;
  int spec_n_max = -1, spec_n_min = -1;
  // Report the prefill's progress (JobOutput::prompt_done) after every prompt chunk (the job driver
  // turns it into progress events of a stream).
  bool progress = false;
  // The prompt's images (nullptr: a text prompt); see PromptImages.
  std::shared_ptr<const PromptImages> images;
};

// The log-probability of one generated token (log-softmax of the raw logits, temperature 1) and
// the most likely alternatives, best first.
struct TokenLogprob {
  int32_t id = -1;
  std::string piece;              // the token's bytes (may be part of a UTF-8 character)
  float logprob = 0;
  std::vector<std::pair<int32_t, float>> top;
  enum Channel : uint8_t { Text, Reasoning, Content, Other } channel = Text;  // chat: where its text went
};

// Output produced since the last drain (or, accumulated, the whole output).
struct JobOutput {
  std::string text;                             // raw text after stop filtering (completions)
  std::string reasoning, content;               // chat: parsed channels
  std::vector<tok::ParsedToolCall> tool_calls;  // chat: completed tool calls
  std::vector<tok::ToolCallDelta> tool_deltas;  // chat: tool calls as they are generated (streams)
  std::vector<TokenLogprob> logprobs;           // GenParams::logprobs >= 0: one per generated token
  // GenParams::progress: the prompt tokens in the cache so far (restored ones included) while the
  // prompt is read, the latest report (-1: none since the last drain)
  int prompt_done = -1;
  void append(JobOutput&& o);
  bool empty() const {
    return text.empty() && reasoning.empty() && content.empty() && tool_calls.empty() && tool_deltas.empty() &&
           logprobs.empty() && prompt_done < 0;
  }
};

// One generation request. Created by the HTTP handler, filled by the scheduler thread.
class Job {
 public:
  Job(std::vector<int32_t> prompt, GenParams params);
  const std::vector<int32_t>& prompt() const { return prompt_; }
  const GenParams& params() const { return params_; }

  void cancel() { cancelled_.store(true); }
  bool cancelled() const { return cancelled_.load(); }

  // Handler side: waits up to `timeout` for new output or the end; moves new output into `out`
  // (appending). Returns true once the job has finished and all its output has been drained.
  bool wait(JobOutput& out, std::chrono::milliseconds timeout);

  struct Result {
    FinishReason finish_reason = FinishReason::Stop;
    int http_status = 200;      // for errors
    std::string error;
    std::string stop_string;    // the stop string that ended the output ("": none)
    int n_prompt = 0, n_cached = 0, n_generated = 0;
    int n_thinking = 0;         // chat: tokens generated in the think channel (the forced close not counted)
    double ttft_s = -1;         // enqueue -> first generated token
    double total_s = 0;
    double prefill_s = 0;       // admitted to a slot -> first generated token (prompt evaluation)
    double gen_s = 0;           // first generated token -> end
    int spec_drafted = 0, spec_accepted = 0, spec_steps = 0;  // speculative decoding: tokens drafted, kept; verify steps
    int spec_paused = 0;  // "auto": plain steps where drafting did not pay
    int n_images = 0, n_image_tokens = 0;  // GenParams::images: images and their tokens in the prompt
    double vision_s = -1;  // the vision tower's time for them (part of prefill_s; -1: it did not run, e.g. all cached)
    int n_images_cached = 0;  // images whose tower output came from the tower-output cache (the tower skipped them)
  };
  Result result() const;  // valid after wait() returned true
  bool finished() const;

 private:
  friend class Scheduler;
  void push(JobOutput&& o);
  void finish(Result r);

  std::vector<int32_t> prompt_;
  GenParams params_;
  std::atomic<bool> cancelled_{false};
  Clock::time_point t_submit_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  JobOutput pending_;
  bool finished_ = false;
  Result result_;
};

// Feeds raw model text through a chat parser into `out` (what the scheduler does per token).
void apply_chat_text(tok::ChatParser& parser, const std::string& text, JobOutput& out);

}  // namespace kimi::server
