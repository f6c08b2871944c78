// Exact speculative decoding (docs/speculative.md): a drafter proposes the next few tokens of a
// sequence, the target model verifies them all in one forward pass (logits at every drafted
// position), the longest prefix the target agrees with is kept and the rest rolled back.
//
//   kimi::NgramDrafter drafter({.n = 3});
//   kimi::Speculator spec(ctx, /*seq*/0, sampler, &drafter, {.n_max = 8});
//   spec.start(prompt, first);            // prompt decoded in ctx; `first` sampled from its logits
//   while (...) {
//     const auto& toks = spec.step(n_left);   // 1..n_max+1 new tokens, in order
//     for (size_t i = 0; i < toks.size(); ++i) use(toks[i], spec.logits(i));
//   }
//
// Exactness. Greedy: every emitted token is the argmax of the target's logits after exactly the
// tokens before it, so the output is the output without speculation. Sampling: a drafted token d
// is kept with probability min(1, p(d) / q(d)) (p: the sampler's final distribution of the target
// at that position, q: the drafter's; a drafter without a distribution proposes with q = 1 at d),
// else the token is drawn from max(0, p - q) renormalised — the standard rule, which leaves the
// distribution of the output that of the target alone.
//
// Rollback. MLA and indexer cache rows are by position (truncating the length drops them). KDA
// conv and recurrent states are recurrent: a verify step snapshots them where the step starts
// (Context::seq_snapshot); after a rejection the sequence goes back there and the tokens kept
// since (the ones already verified) are decoded again at the head of the next step's batch, where
// they cost rows, not a pass (docs/speculative.md "Rollback" gives the measured trade-off).
#pragma once
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "backend/placement.h"
#include "runtime/context.h"
#include "runtime/sampling.h"

namespace kimi {

// Hidden states of the target model at chosen layers, for a drafter that reads them (K3's DSpark
// draft taps layers 2/23/47/71/89). rows: positions pos0 .. pos0 + n_rows - 1 of the sequence,
// the ones the target has just decoded and kept; each row holds layers.size() vectors of n_embd
// floats (layer-major inside the row). Host memory, valid during the call only.
struct TargetTaps {
  std::span<const int> layers;
  int64_t n_embd = 0;
  int32_t pos0 = 0;
  int64_t n_rows = 0;
  const float* data = nullptr;  // [n_rows][layers.size()][n_embd]
};

// What proposes tokens. One Drafter per sequence (it may keep per-sequence state: an index of the
// text, a draft model's cache); models shared between drafters belong to their owner.
class Drafter {
 public:
  virtual ~Drafter() = default;
  virtual std::string name() const = 0;
  // Propose up to n_max tokens continuing `tokens` (the whole sequence so far: prompt and output;
  // its last token is the one the target decodes next). Write them to `draft` (cleared by the
  // callee; its capacity is reserved by the caller, so no allocation is needed). Return how many
  // (0: nothing to propose; the step then decodes one token the plain way).
  virtual int propose(std::span<const int32_t> tokens, int n_max, std::vector<int32_t>& draft) = 0;
  // The drafter's distribution q over the vocabulary for draft[i] of the last proposal (n_vocab
  // floats, summing to 1), or nullptr when the token was chosen without one (q = 1 at draft[i]).
  // Only read with sampling (temperature > 0).
  virtual const float* draft_probs(int i) const {
    (void)i;
    return nullptr;
  }
  // After verification: the target kept the first n_accepted of the last proposal, then emitted
  // one token of its own (the correction or the bonus token).
  virtual void accepted(int n_accepted) { (void)n_accepted; }
  // The sequence was cleared or replaced (a new prompt): forget what belongs to it.
  virtual void reset() {}
  // The sequence now holds only its first n_keep positions (a new request or chat turn reusing a
  // cached prefix): what the drafter keeps about later positions is stale.
  virtual void keep(int32_t n_keep) {
    if (n_keep == 0) reset();
  }
  // Target layers whose hidden states this drafter reads (empty: none). The engine hands them over
  // with observe() for every position the target keeps.
  virtual std::span<const int> tap_layers() const { return {}; }
  virtual void observe(const TargetTaps& taps) { (void)taps; }
};

// Prompt lookup / n-gram drafting (no model): find the latest earlier occurrence of the last n
// tokens (n from n_max_match down to n_min_match) in the sequence and propose what followed it.
struct NgramOptions {
  int n_min_match = 2;  // shortest suffix matched
  int n_max_match = 4;  // longest suffix tried first
};

class NgramDrafter final : public Drafter {
 public:
  explicit NgramDrafter(const NgramOptions& o = {});
  std::string name() const override { return "ngram"; }
  int propose(std::span<const int32_t> tokens, int n_max, std::vector<int32_t>& draft) override;

 private:
  NgramOptions o_;
};

// Hands rows row0 .. row0 + n - 1 of the context's last decoded batch (positions pos0 .. pos0 + n - 1
// of one sequence, kept by the target) to a drafter that reads the target's hidden states; nothing
// for a drafter without tap layers. The context must tap the drafter's layers (Context::set_tap_layers).
void observe_taps(Drafter& d, const Context& ctx, size_t row0, int32_t pos0, int64_t n);

enum class SpecType { Off, Auto, Ngram, Dspark };
// "off" | "auto" | "ngram" | "dspark" (kimi::Error naming `what` otherwise)
SpecType parse_spec_type(const std::string& s, const char* what);
const char* spec_type_name(SpecType t);

// The most rows one sequence puts in a verify step (the pending tokens and the draft): the CPU's
// matmul kernels compute a row with the same bits as alone only in batches of fewer than 16 tokens
// (from 16 on the token-lane and AMX kernels sum in another order; Matmul.BatchRowEqualsAlone), so a
// longer step would make fast-precision greedy output differ from plain decoding. The draft is cut
// to fit (a step after a rollback, which decodes its kept tokens again, drafts fewer).
inline constexpr int kSpecMaxStepRows = 15;

// ---- --spec auto: the cost model (docs/speculative.md "When auto drafts") ----

// What a verify step of k drafts (k + 1 rows of one sequence) costs relative to one decode step,
// from the bytes each reads: the non-expert weights once per step whatever k, the routed experts
// once per distinct expert the rows pick, each side (host RAM, accelerator memory) at its own
// bandwidth, one after the other (decode is bound by reading weights, docs/gpu.md).
struct VerifyCostModel {
  double host_fixed = 0, dev_fixed = 0;    // non-expert weight bytes per step on the host / accelerators
  double host_expert = 0, dev_expert = 0;  // bytes of one routed expert in every MoE layer on each side
  int n_expert = 0, top_k = 0;             // experts per layer, picked per token
  double host_bw = 1, dev_bw = 8;          // relative bandwidths (only the ratio matters)
  // measured[k] (k = 0.. size-1): a verify step of k drafts / a decode step, measured (kimi bench
  // --verify-k); when set it replaces the model for those k
  std::vector<double> measured;
  // distinct experts per MoE layer that k + 1 tokens pick (each token top_k of n_expert, uniformly:
  // n (1 - (1 - top_k / n)^(k + 1)); a skewed router overlaps more, so this errs towards cost)
  double union_experts(int k) const;
  double step_time(int k) const;  // the model's time of a step of k + 1 rows (bytes / bandwidth)
  double rel(int k) const;        // verify step of k drafts / decode step (rel(0) = 1)
  // A step of `rows` rows of any sequences (a server's batch) relative to a step of one row: rel(rows - 1)
  // (the union of the picks of all rows; the measured table where it has the entry)
  double rows_rel(int rows) const { return rel(rows - 1); }
  // The same step with k more rows (one sequence's drafts) relative to the step without them:
  // rows_rel(rows + k) / rows_rel(rows); the marginal cost of the drafts in a shared step
  double batch_rel(int rows, int k) const;
  // From the weights of `m` as the placement puts them (device 0: host; others: accelerators).
  static VerifyCostModel of(const Model& m, const Placement& p);
};

// Tokens a verify step of k drafts emits on average when each drafted token is right with
// probability p given that the ones before it were: 1 + p + p^2 + ... + p^k.
double spec_expected_tokens(double p, int k);

// --spec auto's rule. For k in [k_min, k_max] (k_min >= 1) the expected speedup over plain decoding
// is spec_expected_tokens(p, k) / (c.rel(k) + draft_cost) (draft_cost: one proposal's time relative
// to a decode step; n-gram ~0). The best k is taken when its speedup is above 1 + margin (drafting
// off) or at least 1, break-even (drafting on: hysteresis, so a run near break-even does not flip
// every step); else k = 0: decode without drafting.
struct SpecDecision {
  int k = 0;             // drafts per step (0: plain decoding)
  double speedup = 1.0;  // expected at the best k (even when below the threshold)
};
SpecDecision spec_decide(const VerifyCostModel& c, double p, double draft_cost, int k_min, int k_max, bool on,
                         double margin = 0.05);

// The same rule for one sequence of a shared step (kimi serve, docs/speculative.md "auto in kimi
// serve"). The step decodes `rows` rows without this sequence's drafts (its own pending and
// re-decoded tokens, the other requests' rows, prompt chunks) and emits a token for each of `seqs`
// sequences (this one included). Drafting k adds k rows and a proposal: the step takes
// batch_rel(rows, k) + draft_cost of its time T without them (draft_cost relative to T). The
// sequence is charged its share of the step, T / seqs, plus the whole time its drafts add, and
// emits E(p, k) tokens for it instead of 1:
//   S = E(p, k) / (1 + seqs (batch_rel(rows, k) - 1 + draft_cost))
// S > 1 exactly where the step's throughput grows ((E - 1) T / seqs, the accepted tokens at the
// step's time per token, above the added time); the margin applies to the sequence's own gain, so
// it does not shrink with the batch. rows = seqs = 1: spec_decide. The best k and the hysteresis as there.
SpecDecision spec_decide_batch(const VerifyCostModel& c, double p, double draft_cost, int k_min, int k_max, bool on,
                               int rows, int seqs, double margin = 0.05);

// The step a sequence's draft would join (spec_decide_batch's inputs).
struct SpecBatch {
  int rows = 1;             // the step's rows without this sequence's drafts
  int seqs = 1;             // sequences the step emits a token for (this one included)
  double draft_cost = 0.0;  // one proposal's time relative to the step's time
};

// --spec auto for one sequence of a server (no server types; the scheduler asks it at each step):
// the running acceptance rate (exponential, weight 1/8, as SpecParams::adaptive) and the on/off
// state with its probe schedule. The first draft is a probe at k_max. While on, every step drafts
// the best k of spec_decide_batch for that step's batch, or, where no k pays, goes off; after a
// verify step the rule is applied to the new acceptance rate with that step's batch. Off: 8 plain
// steps, then a probe drafting k_max; a probe that does not pay doubles the wait (16, 32, ... 256),
// one that pays turns drafting on. Never changes which tokens come out.
class SpecAuto {
 public:
  // This step's draft length: 0 = a plain step (paused, or no k pays with this batch), else 1..k_max
  int draft_len(const VerifyCostModel& c, const SpecBatch& b, int k_min, int k_max);
  // After a verify step of k drafts of which the first m were kept; b: the batch of that step
  void verified(const VerifyCostModel& c, const SpecBatch& b, int k_min, int k_max, int k, int m);
  double accept_estimate() const { return tries_ > 0 ? hits_ / tries_ : 0.5; }
  bool on() const { return on_; }
  bool probing() const { return tries_ == 0 || (!on_ && pause_ == 0); }  // the next draft is a probe
  uint64_t paused() const { return paused_; }  // plain steps taken because drafting did not pay

 private:
  double hits_ = 0, tries_ = 0;
  bool on_ = true;
  int pause_ = 0, backoff_ = 8;
  uint64_t paused_ = 0;
};

struct SpecParams {
  int n_max = 8;  // --draft-max: tokens drafted per step at most
  int n_min = 0;  // --draft-min: a proposal shorter than this is not verified (plain step)
  // --spec auto: draft only while it pays, by spec_decide: the cost model (`cost`, or one made from
  // the context's model and placement) and the drafter's running acceptance rate (an exponential
  // mean over verify steps, weight 1/8) choose the draft length, or no draft; while off, one probe
  // step drafts after 8 plain steps (doubling up to 256 while probes keep losing) to measure the
  // acceptance again. Never changes which tokens come out, only how fast.
  bool adaptive = false;
  std::shared_ptr<const VerifyCostModel> cost;
};

// Counters of a Speculator (or a sum of them).
struct SpecStats {
  uint64_t steps = 0;         // target forward passes
  uint64_t verify_steps = 0;  // of them with a draft
  uint64_t drafted = 0;       // tokens proposed and verified
  uint64_t accepted = 0;      // drafted tokens kept
  uint64_t emitted = 0;       // tokens produced (accepted + one of the target's per step)
  uint64_t recomputed = 0;    // kept tokens decoded again after a KDA rollback
  uint64_t paused = 0;        // plain steps taken because drafting did not pay (--spec auto)
  double verify_s = 0, plain_s = 0;  // wall time of the verify / plain steps
  uint64_t plain_steps() const { return steps - verify_steps; }
  // verify step time over plain step time (0: not both measured)
  double verify_cost() const {
    return verify_steps && plain_steps() && plain_s > 0
               ? (verify_s / double(verify_steps)) / (plain_s / double(plain_steps()))
               : 0.0;
  }
  double accept_rate() const { return drafted ? double(accepted) / double(drafted) : 0.0; }
  // tokens per target forward pass (1 = no gain)
  double tokens_per_step() const { return steps ? double(emitted) / double(steps) : 0.0; }
  // mean tokens accepted per verify step
  double accept_len() const { return verify_steps ? double(accepted) / double(verify_steps) : 0.0; }
  void add(const SpecStats& o);
};

// The draft-verify-accept loop of one sequence in a Context. The context must allow
// n_ctx >= positions used + n_max + 1 and n_batch >= 1; a verify batch longer than n_batch is split
// into micro-batches by the context (still exact).
class Speculator {
 public:
  // drafter == nullptr: plain decoding through the same interface
  Speculator(Context& ctx, int32_t seq, Sampler& sampler, Drafter* drafter, const SpecParams& p);
  // history: every token of seq so far (ctx.seq_len(seq) == history.size()); next: the token
  // sampled from the logits of its last position, not yet decoded. observe_prompt: hand the rows
  // of this sequence in the context's last batch to a drafter that reads taps (false: the caller
  // did, e.g. for a prompt decoded in several batches).
  void start(std::span<const int32_t> history, int32_t next, bool observe_prompt = true);
  // One target forward pass. Returns the new tokens (at least 1, at most max_new, at most
  // n_max + 1), each already accepted into the sampler. max_new >= 1.
  const std::vector<int32_t>& step(int max_new);
  // The target's logits (n_vocab floats) that tokens()[i] of the last step was sampled from; valid
  // until the context decodes again.
  const float* logits(size_t i) const;
  const std::vector<int32_t>& tokens() const { return out_; }
  // prompt + every token emitted so far (the first of start() included)
  const std::vector<int32_t>& history() const { return hist_; }
  // Tokens of history() not yet in the context's sequence (1 after a step without rollback)
  int pending() const { return pending_; }
  // Decode the pending tokens but the last, so that ctx.seq_len(seq) == history().size() - 1 (the
  // usual state between plain decode steps). Costs a forward pass only when something is pending.
  void settle();
  const SpecStats& stats() const { return st_; }
  // --spec auto: the acceptance rate it estimates, whether drafting is on, the draft length chosen
  double accept_estimate() const { return acc_try_ > 0 ? acc_hit_ / acc_try_ : 0.5; }
  bool drafting_on() const { return on_; }
  int auto_draft_len() const { return auto_k_; }
  const VerifyCostModel* cost_model() const { return cost_.get(); }
  void set_drafter(Drafter* d) { drafter_ = d; }
  Drafter* drafter() const { return drafter_; }
  const SpecParams& params() const { return p_; }
  void set_params(const SpecParams& p);

 private:
  // hands rows row0.. of the last batch (positions pos0..pos0+n-1 of seq) to a drafter that reads taps
  void observe_rows(size_t row0, int32_t pos0, int64_t n);
  Context& ctx_;
  int32_t seq_;
  Sampler& sampler_;
  Drafter* drafter_;
  SpecParams p_;
  bool kda_;
  std::vector<int32_t> hist_;
  int pending_ = 0;  // the last pending_ tokens of hist_ are not in the context
  std::vector<int32_t> draft_, out_;
  std::vector<size_t> rows_;  // logits entry of out_[i] in the last batch
  Batch batch_;
  SpecStats st_;
  // --spec auto (spec_decide): the cost model, the acceptance rate's running counts (exponential,
  // weight 1/8: kept drafts / drafts tried up to the first rejection), the mean times of a plain
  // step and of a proposal, drafting on or off, the current draft length, the probe schedule
  std::shared_ptr<const VerifyCostModel> cost_;
  double acc_hit_ = 0, acc_try_ = 0, t_plain_ = 0, t_draft_ = 0;
  int n_plain_meas_ = 0, n_draft_meas_ = 0;
  bool on_ = true;
  int auto_k_ = 0, pause_ = 0, backoff_ = 8;

};

}  // namespace kimi
