// Continuous-batching scheduler for `kimi serve`: ONE thread owns the kimi::Context. Each step
// decodes one token for every generating request and up to `max_chunks` prefill chunks of
// requests still reading their prompt, all in one batch. A request whose next tokens are known in
// advance (the close sequence the thinking budget forces) feeds them in the same step, after its
// last sampled token: one chunk of that sequence, processed token by token afterwards.
//
// Prompt cache (correct with recurrent KDA layers): the context holds parallel + cache_slots
// sequences. A finished request leaves its tokens in its sequence. A sequence can be resumed at
// two kinds of positions only: its current length (the KDA states are current there) and its
// engine snapshots, which the scheduler takes at the end of every prompt prefill (the turn
// boundary) and every `snapshot_every` prompt tokens (chunk boundaries; the engine keeps up to
// ContextOptions::n_snapshots_max per sequence, spread out). A new prompt P restores the longest
// such position r <= min(LCP, |P| - 1) over all sequences (LCP = common prefix with the
// sequence's tokens): an idle ordinary sequence is taken over, otherwise its first r positions
// are copied (seq_copy(src, dst, r)) into the least recently used idle sequence; then P[r..] is
// prefilled. When P shares a longer prefix L with some sequence than any restore point
// offers (a common system prompt, a conversation branched mid-way), the prefill is cut at L and
// the sequence is copied there into a spare "prefix entry" (a restore point at exactly L for later
// requests). The latent / indexer caches are by position, so rows [0, r) are reused as they are.
//
// The prompt-cache store (server/prompt_cache.h, SchedulerOptions::cache_ram) keeps host copies of
// sequences apart from the live ones: at the end of each prompt (|P| - 1), at its last message
// boundary (after the last <|end_of_msg|>), at the end of each generation and at divergence points
// (instead of spare "prefix entry" sequences). A store entry longer than every live restore point
// is loaded into the least recently used idle sequence (restore_from_store) and P[n..] prefilled.
#pragma once
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "model/model.h"
#include "runtime/context.h"
#include "runtime/dspark_drafter.h"
#include "runtime/sampling.h"
#include "runtime/speculative.h"
#include "server/grammar.h"
#include "server/job.h"
#include "server/prompt_cache.h"
#include "server/vision_worker.h"
#include "tokenizer/tokenizer.h"

namespace kimi {
class VisionRunner;
}

namespace kimi::server {

struct SchedulerOptions {
  int parallel = 4;       // concurrent requests (slots)
  int cache_slots = -1;   // extra sequences that keep earlier prompts (-1: 0 with the store (cache_ram), else parallel)
  int chunk = 256;        // prefill chunk (tokens)
  int max_chunks = 2;     // prefill chunks per step
  int queue_limit = 64;   // waiting requests beyond the active slots; submit() fails beyond
  int min_prefix_entry = 32;  // least gain (tokens) for which a prefix entry is stored
  int snapshot_every = 256;   // KDA snapshot every this many prompt tokens (0: only at turn ends);
                              // the engine keeps ContextOptions::n_snapshots_max per sequence
  bool prompt_cache = true;   // false: every request prefills its whole prompt
  // The prompt-cache store (server/prompt_cache.h): host copies of sequences at the end of each
  // prompt, its last message boundary (after the last <|end_of_msg|>), the end of each generation
  // and divergence points, LRU under cache_ram bytes (0: no store; prefix entries then take spare
  // sequences as before), written to cache_dir (if set) under cache_disk bytes.
  uint64_t cache_ram = 0;
  std::string cache_dir;
  uint64_t cache_disk = uint64_t{10} << 30;
  // speculative decoding for requests that do not choose (--spec, --draft-max, --draft-min)
  SpecType spec_type = SpecType::Off;
  SpecParams spec;
  // the drafter of a request that drafts (unset: the n-gram drafter); tests give one that knows
  // the answer, to force acceptances and rejections at chosen positions
  std::function<std::unique_ptr<Drafter>()> make_drafter;
  // The vision tower (runtime/vision_input.h; not owned, outlives the scheduler; nullptr: a text
  // model). A job with images (GenParams::images) hands the images whose positions the prompt
  // cache did not restore to the tower worker (server/vision_worker.h) when it is admitted; the
  // worker runs the tower on its own thread, one job at a time in admission order, while the
  // scheduler keeps decoding the other sequences and prefills this one's text up to its first
  // image position; the rows then take those positions (Batch::embd).
  VisionRunner* vision = nullptr;
  // The tower-output cache (--vision-cache): bytes of tower rows kept per image (content hash and
  // patch grid), least recently used first out; 0: none (every job runs the tower).
  uint64_t vision_cache = uint64_t{256} << 20;
  // Tests: called on the tower worker before each tower run with the number of images it encodes;
  // it may block (holds the tower while the scheduler goes on).
  std::function<void(int)> vision_hook;
  // The DSpark draft of requests that choose "dspark" (-md/--model-draft; empty: none): loaded with
  // the model, one drafter per sequence on the draft's own draft_threads threads (0: all cores)
  std::string draft_model;
  int draft_threads = 0;
};

// One sequence of the context, for /slots: a slot running a request, or one that keeps a prompt.
struct SlotInfo {
  int id = 0;
  bool busy = false;             // running a request
  bool prefix = false;           // a prefix entry (kept for prompts that share its start)
  int n_cached = 0;              // tokens held in this sequence's cache
  int n_prompt = 0, n_prompt_done = 0, n_decoded = 0;  // busy: the request's progress
};

struct SchedulerStats {
  uint64_t requests_started = 0, requests_finished = 0, requests_cancelled = 0, requests_timeout = 0,
           requests_failed = 0;
  uint64_t prompt_tokens = 0, cached_tokens = 0, prefill_tokens = 0, generated_tokens = 0, decode_steps = 0;
  // tokens the thinking budget forced (GenParams::thinking_budget; counted in generated_tokens too),
  // and how many of them were decoded in the step of an earlier token of their sequence (the decode
  // steps the batched close saved)
  uint64_t forced_tokens = 0, forced_batched = 0;
  uint64_t prefix_entries = 0;
  int queue_depth = 0, active = 0, slots = 0, sequences = 0;
  double tokens_per_s = 0;      // generated tokens/s over the last ~10 s
  double busy_s = 0;            // time spent in decode
  PromptCacheStats cache;       // the prompt-cache store (SchedulerOptions::cache_ram)
  // hybrid mode with --gpu-experts: routed expert picks the GPU's resident experts ran / the CPU ran
  uint64_t hot_picks = 0, host_picks = 0, hot_reranks = 0;
  // speculative decoding (docs/speculative.md): verify steps of the requests that draft, tokens
  // drafted and accepted, kept tokens decoded again after a KDA rollback
  uint64_t spec_verify_steps = 0, spec_drafted = 0, spec_accepted = 0, spec_recomputed = 0;
  bool vision = false;          // the server has a vision tower (the fields below are counted)
  VisionStats vis;              // the tower worker and its output cache (server/vision_worker.h)
  // plain steps of "auto" requests where drafting did not pay (SpecAuto)
  uint64_t spec_paused = 0;
};

class Scheduler {
 public:
  Scheduler(const Model& model, const tok::Tokenizer& tok, const ContextOptions& copts, const SchedulerOptions& so);
  ~Scheduler();
  Scheduler(const Scheduler&) = delete;
  Scheduler& operator=(const Scheduler&) = delete;

  // Queues a job; false when the queue is full or the scheduler is shutting down.
  bool submit(const std::shared_ptr<Job>& job);
  // Stops taking jobs; in-flight and queued jobs may finish until `grace` is over, then the rest
  // is cancelled. Blocks until the scheduler thread has exited.
  void shutdown(std::chrono::milliseconds grace);
  // The same without waiting (the scheduler thread exits by itself once drained).
  void request_stop(std::chrono::milliseconds grace);
  bool shutting_down() const { return draining_.load(); }

  SchedulerStats stats() const;
  std::vector<SlotInfo> slots() const;  // every sequence (the first `parallel` + cache slots)
  int n_ctx() const { return n_ctx_; }
  const SchedulerOptions& options() const { return so_; }
  // The tokens GenParams::thinking_budget forces: the K3 template's text between a think channel
  // and its response channel, tokenized (empty when the vocabulary lacks the tags: no cap then).
  const std::vector<int32_t>& think_close() const { return think_close_; }

  // POST /slots/{id}?action=save|restore|erase: run on the scheduler thread between two steps, on an
  // idle sequence (no request can take it meanwhile), waited for. status: 200; 404 (no such slot),
  // 409 (it runs a request), 400 (restore: a bad file, `error` says what; the slot is then unchanged),
  // 500 (save: the file cannot be written), 501 (several MPI ranks), 503 (shutting down). n: tokens saved / restored / erased.
  struct SlotAction {
    int status = 200;
    std::string error;
    int n = 0;
    uint64_t bytes = 0;  // written / read
    double ms = 0;
  };
  SlotAction slot_save(int id, const std::string& path);
  SlotAction slot_restore(int id, const std::string& path);
  SlotAction slot_erase(int id);

 private:
  struct SeqRec {
    std::vector<int32_t> toks;  // exactly the tokens stored in the context for this sequence
    bool busy = false;
    bool prefix = false;        // a prefix entry: copied from, never taken over
    uint64_t used = 0;
    std::vector<int32_t> restored;  // the tokens of the slot file last restored here (erase drops what grew from them)
  };
  struct Active {
    std::shared_ptr<Job> job;
    int seq = -1;
    size_t pos = 0;             // next prompt index to feed
    int split_at = -1;          // make a prefix entry when the sequence reaches this length
    int save_at = -1;           // store the sequence in the prompt cache at this length (message boundary)
    bool generating = false;
    int32_t pending = -1;       // sampled, not yet decoded
    std::vector<int32_t> ahead; // forced tokens decoded right after `pending` in this step (think_close_)
    int n_gen = 0;
    int logit_idx = -1;
    std::optional<Sampler> sampler;
    std::optional<tok::Detokenizer> detok;
    std::optional<tok::ChatParser> parser;
    std::string hold;           // text held back while it may start a stop string
    std::string stop_hit;       // the stop string that was found (Result::stop_string)
    bool done = false;
    Clock::time_point t_admit, t_first;
    std::vector<TokenLogprob> lp_pending;  // records of tokens whose text is held back
    std::optional<grammar::Matcher> matcher;  // GenParams::grammar
    bool constrained = false;   // the grammar applies to the next token (chat: in the response)
    std::string raw_tail;       // chat + grammar: the end of the raw output (finds the response tag)
    std::vector<float> masked;  // logits with the tokens the grammar forbids at -inf (n_vocab)
    std::optional<grammar::Matcher> tool_matcher;  // GenParams::tool_grammar
    bool tool_on = false;       // the tool grammar applies to the next token
    std::string tool_tail;      // the end of the raw output (finds GenParams::tool_trigger)
    bool in_think = false;      // chat: still in the think channel the prompt opened
    int think_n = 0;            // tokens generated in it (GenParams::thinking_budget)
    int think_utf8 = 0;         // continuation bytes its text still needs to end on a whole UTF-8 character
    int forced_next = -1;       // >= 0: the next token is think_close_[forced_next] (the close sequence is on)
    int think_budget = -1;      // GenParams::thinking_budget, or less for a required call (Scheduler::start)
    std::string think_tag;      // in think: a tag being written ("+" open / "-" close, then its header so far)
    int think_tag_n = 0;        // think_n before that tag began
    std::vector<int32_t> finish_q;  // GenParams::tool_must_finish: the forced cheapest completion
    size_t finish_i = 0;            // its next token
    // speculative decoding (runtime/speculative.h): the drafter (nullptr: none), this step's draft
    // (decoded after `pending`, logits at each), and the kept tokens to decode again before
    // `pending` after a KDA rollback (the sequence went back to where that step started)
    Drafter* drafter = nullptr;            // own_drafter, or the sequence's DSpark drafter (dspark_)
    std::unique_ptr<Drafter> own_drafter;
    size_t obs_row0 = 0;                   // this step's first batch row of the sequence (taps)
    SpecParams spec;
    std::vector<int32_t> draft, redo;
    bool spec_snap_new = false;      // this step's snapshot was taken for the draft (dropped after)
    int32_t spec_base = 0;           // the sequence's length when this step started
    int spec_drafted = 0, spec_accepted = 0, spec_steps = 0;  // this request's (Job::Result)
    // "auto" (spec.adaptive): the per-sequence rule, the batch and draft length of the step that
    // drafted last, the mean time of a proposal, this request's plain steps where drafting did not pay
    SpecAuto spec_auto;
    SpecBatch spec_batch;
    int spec_kmax = 0, spec_paused = 0, n_draft_meas = 0;
    double t_draft = 0;
    std::vector<int32_t> spec_out;   // scratch: the tokens a verify step emits
    std::vector<float> img_rows;     // GenParams::images: the tower's rows (taken from `tower` once it is done)
    std::shared_ptr<VisionWorker::Task> tower;  // the images' tower task (nullptr: none, or taken)
    double vision_s = -1;            // the tower's time (Job::Result::vision_s)
    int vision_cached = 0;           // images from the tower-output cache (Job::Result::n_images_cached)
  };

  void loop();
  void start(Active& a);
  void step();
  void on_token(Active& a, int32_t t, const float* logits);
  // a.draft for this step (may stay empty); batch: the step's rows and sequences without a's drafts
  void spec_draft(Active& a, int32_t base, SpecBatch batch);
  int spec_verify(Active& a);                  // after the decode: accept, roll back, emit; tokens emitted
  // DSpark: the drafter of sequence seq (made at its first use); hands rows of the last batch to a's drafter
  Drafter* dspark_for(int seq);
  void spec_observe(Active& a, size_t row0, int32_t pos0, int64_t n);
  int32_t sample_constrained(Active& a, const float* logits);
  bool forced_token(Active& a, int32_t& t);  // the thinking budget / a due completion: the next token is forced
  bool finish_due(Active& a, int32_t sampled);  // GenParams::tool_must_finish: builds a.finish_q when due
  bool completion_tokens(const grammar::Matcher& m, std::vector<int32_t>& q) const;
  void track_think(Active& a, int32_t t);       // the think channel's token count (thinking budget)
  bool close_due(const Active& a) const;     // the budget is spent: the close sequence comes next
  bool begin_close(Active& a);               // starts it (when due); true while it is on
  void feed_forced(Active& a, size_t T);  // a.ahead: the forced tokens known after position T
  // how many of prompt [from, from + n) can be fed now: n when a.img_rows are there or no image
  // position is in the range, else up to the first image position (the tower is still running);
  // -1: the tower failed (the job is finished)
  int64_t image_rows(Active& a, size_t from, size_t n);
  bool grammar_allows(const Active& a, int32_t t) const;
  bool tool_allows(const Active& a, int32_t t) const;  // GenParams::tool_grammar
  bool tool_active(const Active& a) const { return a.tool_on && !a.constrained; }
  void build_trie();
  void emit(Active& a, const std::string& text);
  void update_slots();  // slot_info_ from seqs_ / active_ (under mu_)
  void finish(Active& a, FinishReason reason, int status = 200, const std::string& err = "");
  int pick_victim(int exclude) const;
  bool chunk_snaps() const { return so_.prompt_cache && so_.snapshot_every > 0 && !any_prefix_; }
  void make_prefix_entry(Active& a);
  // the prompt-cache store (cache_ != nullptr): restore / save points of a request
  // a store entry longer than best_r (from the live sequence src): loaded into an idle sequence
  // (returned; -1: none), best_r and L (the longest common prefix) updated; a failed load that
  // emptied src resets src and best_r
  int restore_from_store(const std::vector<int32_t>& P, size_t cap, size_t& best_r, size_t& L, int& src);
  void store_save(Active& a, size_t n);  // the first n positions of a's sequence into the store
  SlotAction between_steps(int id, const std::function<SlotAction(SeqRec&)>& fn);  // the slot actions

  const Model& model_;
  const tok::Tokenizer& tok_;
  SchedulerOptions so_;
  std::unique_ptr<Context> ctx_;
  int n_ctx_ = 0;
  bool any_prefix_ = false;
  std::unique_ptr<PromptCache> cache_;  // the prompt-cache store (nullptr: none)
  int32_t eom_id_ = -1;                 // <|end_of_msg|>: message boundaries are right after it
  int32_t close_id_ = -1;              // <|close|>: ends the constrained response channel
  int32_t open_id_ = -1, sep_id_ = -1;  // <|open|>, <|sep|> (tool grammars: U+E000, U+E002)
  std::vector<int32_t> end_ids_;        // the tokens that end an answer (end of generation, eos)
  std::vector<int32_t> think_close_;    // GenParams::thinking_budget: the tokens that close thinking
  std::vector<int32_t> marker_text_;   // text tokens whose bytes hold U+E000..U+E003 (never in a tool call)
  std::vector<uint8_t> drop_special_;  // per token id: special, not structural (chat output skips it)
  // constrained sampling (sample_constrained): the text tokens as a trie, built at the first use;
  // the other ids (special, end of the answer, no text) are checked one by one
  std::unique_ptr<grammar::TokenTrie> trie_;
  std::vector<int32_t> trie_others_;
  std::vector<uint8_t> allowed_;       // scratch: per token id, may it come next
  bool grammar_full_scan_ = false;     // KIMI_GRAMMAR_FULL_SCAN=1: check every id one by one (the reference)  // no KDA layer: any prefix of a sequence can be resumed

  // the DSpark draft (SchedulerOptions::draft_model): its runner, a drafter per sequence and the
  // tokens whose context rows each holds (a request reuses a cached prefix only where they match)
  std::shared_ptr<DsparkRunner> dspark_;
  std::vector<std::unique_ptr<Drafter>> dspark_drafters_;
  std::vector<std::vector<int32_t>> dspark_seen_;
  // "auto" requests: the verify-cost model (SchedulerOptions::spec.cost, or made from the model and
  // placement at the first such request), the mean time of a decode step (a proposal's cost relative to it)
  std::shared_ptr<const VerifyCostModel> spec_cost_;
  double t_step_ = 0;
  int n_step_meas_ = 0;

  std::vector<SeqRec> seqs_;
  std::vector<std::unique_ptr<Active>> active_;
  Batch batch_;
  uint64_t tick_ = 0;

  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::shared_ptr<Job>> queue_;
  std::deque<std::function<void()>> ctl_;  // slot actions, run by the scheduler thread between steps
  std::string identity_;                    // Context::state_identity(), once a slot file needs it
  std::once_flag identity_once_;
  const std::string& identity();            // any thread
  SlotAction slot_precheck(int id) const;   // 404 / 501 before anything is read
  bool stop_ = false;
  std::atomic<bool> draining_{false};
  Clock::time_point grace_end_ = Clock::time_point::max();
  std::thread thread_;
  std::mutex join_mu_;
  // the tower worker (so_.vision; destroyed before mu_ / cv_, which its wake-up uses)
  bool tower_woke_ = false;      // a tower task finished since the scheduler last waited (under mu_)
  bool tower_waiting_ = false;   // this step skipped a prefill that waits for the tower
  std::unique_ptr<VisionWorker> vworker_;

  // stats (guarded by mu_)
  SchedulerStats st_;
  std::vector<SlotInfo> slot_info_;
  std::deque<std::pair<Clock::time_point, int>> rate_;  // (step end, tokens generated)
};

}  // namespace kimi::server
