// Speculative decoding: the n-gram drafter and the draft-verify-accept loop of one sequence
// (runtime/speculative.h, docs/speculative.md).
#include "runtime/speculative.h"

#include <algorithm>
#include <chrono>
#include <cmath>

#include "util/error.h"

namespace kimi {

// ---- n-gram / prompt lookup ----

NgramDrafter::NgramDrafter(const NgramOptions& o) : o_(o) {
  check(o.n_min_match >= 1 && o.n_max_match >= o.n_min_match,
        "ngram drafter: match lengths must satisfy 1 <= min ({}) <= max ({})", o.n_min_match, o.n_max_match);
}

int NgramDrafter::propose(std::span<const int32_t> t, int n_max, std::vector<int32_t>& draft) {
  draft.clear();
  const int64_t N = static_cast<int64_t>(t.size());
  if (n_max <= 0) return 0;
  for (int64_t n = std::min<int64_t>(o_.n_max_match, N - 1); n >= o_.n_min_match; --n) {
    const int32_t* suf = t.data() + (N - n);
    // the latest earlier occurrence of the last n tokens (start i < N - n)
    for (int64_t i = N - n - 1; i >= 0; --i) {
      if (t[static_cast<size_t>(i)] != suf[0] || !std::equal(suf, suf + n, t.data() + i)) continue;
      // what followed it; past the end it continues with the draft itself (a repeating pattern
      // continues with its period)
      for (int64_t j = i + n; static_cast<int>(draft.size()) < n_max; ++j)
        draft.push_back(j < N ? t[static_cast<size_t>(j)] : draft[static_cast<size_t>(j - N)]);
      return static_cast<int>(draft.size());
    }
  }
  return 0;
}

// ---- flags ----

SpecType parse_spec_type(const std::string& s, const char* what) {
  if (s == "off" || s == "none") return SpecType::Off;
  if (s == "auto") return SpecType::Auto;
  if (s == "ngram") return SpecType::Ngram;
  if (s == "dspark") return SpecType::Dspark;
  fail("{}: unknown speculative decoding type '{}' (use auto, off, ngram or dspark)", what, s);
}

const char* spec_type_name(SpecType t) {
  switch (t) {
    case SpecType::Off: return "off";
    case SpecType::Auto: return "auto";
    case SpecType::Ngram: return "ngram";
    case SpecType::Dspark: return "dspark";
  }
  return "?";
}

void SpecStats::add(const SpecStats& o) {
  steps += o.steps;
  verify_steps += o.verify_steps;
  drafted += o.drafted;
  accepted += o.accepted;
  emitted += o.emitted;
  recomputed += o.recomputed;
  paused += o.paused;
  verify_s += o.verify_s;
  plain_s += o.plain_s;
}

// ---- --spec auto: the cost model ----

double VerifyCostModel::union_experts(int k) const {
  if (n_expert <= 0 || top_k <= 0) return 0;
  const double q = 1.0 - double(std::min(top_k, n_expert)) / double(n_expert);
  return double(n_expert) * (1.0 - std::pow(q, double(k + 1)));
}

double VerifyCostModel::step_time(int k) const {
  const double u = union_experts(k);
  return (host_fixed + u * host_expert) / host_bw + (dev_fixed + u * dev_expert) / dev_bw;
}

double VerifyCostModel::rel(int k) const {
  if (k <= 0) return 1.0;
  if (static_cast<size_t>(k) < measured.size() && measured[static_cast<size_t>(k)] > 0) return measured[static_cast<size_t>(k)];
  const double t0 = step_time(0);
  return t0 > 0 ? step_time(k) / t0 : 1.0;
}

double VerifyCostModel::batch_rel(int rows, int k) const {
  rows = std::max(rows, 1);
  if (k <= 0) return 1.0;
  const double t = rows_rel(rows);
  return t > 0 ? rows_rel(rows + k) / t : 1.0;
}

VerifyCostModel VerifyCostModel::of(const Model& m, const Placement& p) {
  const HParams& hp = m.hparams();
  VerifyCostModel c;
  c.n_expert = static_cast<int>(hp.n_expert);
  c.top_k = static_cast<int>(hp.n_expert_used);
  const double n_file = double(std::max<uint32_t>(hp.file_experts(), 1));
  for (const auto& t : m.reader().tensors()) {
    if (t.name == "token_embd.weight") continue;  // one row per token: nothing next to the rest
    auto it = p.tensors.find(t.name);
    const bool dev = it != p.tensors.end() && it->second != 0;
    const bool expert = t.name.size() > 12 && t.name.compare(t.name.size() - 12, 12, "_exps.weight") == 0;
    // an expert tensor holds every expert of its layer: bytes of one expert of that layer
    (expert ? (dev ? c.dev_expert : c.host_expert) : (dev ? c.dev_fixed : c.host_fixed)) +=
        expert ? double(t.nbytes) / n_file : double(t.nbytes);
  }
  return c;
}

double spec_expected_tokens(double p, int k) {
  double e = 1, q = 1;
  for (int i = 0; i < k; ++i) e += (q *= p);
  return e;
}

SpecDecision spec_decide(const VerifyCostModel& c, double p, double draft_cost, int k_min, int k_max, bool on,
                         double margin) {
  return spec_decide_batch(c, p, draft_cost, k_min, k_max, on, 1, 1, margin);
}

SpecDecision spec_decide_batch(const VerifyCostModel& c, double p, double draft_cost, int k_min, int k_max, bool on,
                               int rows, int seqs, double margin) {
  rows = std::max(rows, 1);
  const double n = double(std::max(seqs, 1));
  SpecDecision best;
  best.speedup = 0;
  for (int k = std::max(1, k_min); k <= k_max; ++k) {
    // (rel + c) + (n - 1)(rel - 1 + c) = 1 + n (rel - 1 + c); written so that n = 1 gives spec_decide's bits
    const double x = c.batch_rel(rows, k) + std::max(0.0, draft_cost);
    const double s = spec_expected_tokens(p, k) / (x + (n - 1.0) * (x - 1.0));
    if (s > best.speedup) best = {k, s};
  }
  if (best.k == 0) return {0, 1.0};
  // on: off below break-even; off: on only above break-even + margin (hysteresis)
  if (on ? best.speedup < 1.0 : best.speedup <= 1.0 + margin) best.k = 0;
  return best;
}

// ---- kimi serve: --spec auto of one sequence ----

int SpecAuto::draft_len(const VerifyCostModel& c, const SpecBatch& b, int k_min, int k_max) {
  if (k_max < 1) return 0;
  if (probing()) return k_max;  // no acceptance measured yet, or the probe after a pause
  if (on_) {
    const SpecDecision d = spec_decide_batch(c, accept_estimate(), b.draft_cost, k_min, k_max, true, b.rows, b.seqs);
    if (d.k > 0) return d.k;
    on_ = false;  // this batch makes it not pay: 8 plain steps (this one included), then a probe
    pause_ = 8;
    backoff_ = 16;
  }
  --pause_;
  ++paused_;
  return 0;
}

void SpecAuto::verified(const VerifyCostModel& c, const SpecBatch& b, int k_min, int k_max, int k, int m) {
  if (k <= 0) return;
  // drafts tried: the kept ones and the first rejected one (the geometric model of spec_decide)
  hits_ = hits_ * 0.875 + m;
  tries_ = tries_ * 0.875 + m + (m < k ? 1 : 0);
  const SpecDecision d = spec_decide_batch(c, accept_estimate(), b.draft_cost, k_min, k_max, on_, b.rows, b.seqs);
  if (d.k > 0) {
    on_ = true;
    backoff_ = 8;
  } else {  // off: plain steps, then a probe (8 steps, doubling up to 256 while probes lose)
    pause_ = on_ ? 8 : backoff_;
    backoff_ = on_ ? 16 : std::min(backoff_ * 2, 256);
    on_ = false;
  }
}

// ---- the loop ----

Speculator::Speculator(Context& ctx, int32_t seq, Sampler& sampler, Drafter* drafter, const SpecParams& p)
    : ctx_(ctx), seq_(seq), sampler_(sampler), drafter_(drafter), kda_(ctx.model().hparams().n_kda_layers() > 0) {
  set_params(p);
  hist_.reserve(static_cast<size_t>(ctx.options().n_ctx_max) + 1);
  // the sampler records every token (repetition penalty): no allocation for them in the loop
  sampler_.reserve(static_cast<size_t>(ctx.options().n_ctx_max) + kSpecMaxStepRows + 1);
}

void Speculator::set_params(const SpecParams& p) {
  check(p.n_max >= 0 && p.n_max <= 256, "speculative: --draft-max must be in 0..256 (got {})", p.n_max);
  check(p.n_min >= 0 && p.n_min <= std::max(p.n_max, 0),
        "speculative: --draft-min ({}) must be in 0..--draft-max ({})", p.n_min, p.n_max);
  p_ = p;
  if (p.adaptive) {
    cost_ = p.cost ? p.cost : std::make_shared<const VerifyCostModel>(VerifyCostModel::of(ctx_.model(), ctx_.placement()));
    auto_k_ = p.n_max;
  }
  const size_t k = static_cast<size_t>(p.n_max);
  draft_.reserve(k);
  out_.reserve(k + 1);
  rows_.reserve(k + 1);
  batch_.entries.reserve(3 * k + 2);  // pending tokens (<= 2 n_max + 1) and a draft
}

void Speculator::start(std::span<const int32_t> history, int32_t next, bool observe_prompt) {
  check(static_cast<size_t>(ctx_.seq_len(seq_)) == history.size(),
        "speculative: sequence {} holds {} positions but the history has {} tokens", seq_, ctx_.seq_len(seq_),
        history.size());
  hist_.assign(history.begin(), history.end());
  hist_.push_back(next);
  // a drafter that reads hidden states gets the taps of this sequence's rows of the last batch
  // (the prompt; the caller set the context's tap layers before decoding it, dspark.md §3.5)
  if (observe_prompt && drafter_ && !drafter_->tap_layers().empty() && ctx_.tap_count() > 0) {
    int64_t i0 = -1, n = 0;
    for (int64_t i = 0; i < ctx_.tap_count(); ++i)
      if (ctx_.tap_entry(size_t(i)).seq_id == seq_) {
        if (i0 < 0) i0 = i;
        if (i == i0 + n) ++n;
      }
    if (n > 0) observe_rows(size_t(i0), ctx_.tap_entry(size_t(i0)).pos, n);
  }
  pending_ = 1;
  out_.clear();
  rows_.clear();
}

const std::vector<int32_t>& Speculator::step(int max_new) {
  check(max_new >= 1, "speculative: a step must be allowed at least one token (got {})", max_new);
  check(pending_ >= 1, "speculative: step() before start()");
  const int32_t L = ctx_.seq_len(seq_);
  const int p = pending_;
  const int room = ctx_.options().n_ctx_max - L - p;  // positions left for a draft
  check(room >= 0, "speculative: sequence {} is full ({} positions)", seq_, ctx_.options().n_ctx_max);
  int k = 0;
  bool may_draft = drafter_ && p_.n_max > 0;
  int k_cap = p_.n_max;
  if (may_draft && p_.adaptive) {
    if (n_plain_meas_ == 0) {
      may_draft = false;  // a plain step first: the time a proposal is compared with
    } else if (!on_ && pause_ > 0) {
      --pause_;
      may_draft = false;
      ++st_.paused;
    } else if (on_) {
      k_cap = std::max(1, auto_k_);  // the draft length spec_decide chose (off: a probe at n_max)
    }
  }
  // Drafting pauses while more than n_max tokens wait to be decoded again after rollbacks; the
  // plain step that follows commits them (a bound on the batch: 2 n_max + 1 + n_max rows).
  if (may_draft && p <= p_.n_max + 1) {
    const int n = std::min({k_cap, max_new - 1, room, kSpecMaxStepRows - p});
    if (n > 0) {
      const auto td = std::chrono::steady_clock::now();
      k = std::min(drafter_->propose(hist_, n, draft_), n);
      if (p_.adaptive) {  // the time of a proposal (a draft model's forward; n-gram: microseconds)
        const double x = std::chrono::duration<double>(std::chrono::steady_clock::now() - td).count();
        t_draft_ = n_draft_meas_++ == 0 ? x : t_draft_ + (x - t_draft_) / 8.0;
      }
      if (k < std::max(p_.n_min, 1)) k = 0;
    }
  }
  batch_.clear();
  const size_t H = hist_.size();
  for (int i = 0; i < p; ++i) batch_.add(hist_[H - static_cast<size_t>(p - i)], seq_, L + i, i == p - 1);
  for (int j = 0; j < k; ++j) batch_.add(draft_[static_cast<size_t>(j)], seq_, L + p + j, true);
  const bool snap = k > 0 && kda_;
  const bool had_snap = snap && ctx_.seq_has_snapshot(seq_, L);
  if (snap) ctx_.seq_snapshot(seq_);  // the KDA states where this step starts
  const auto t0 = std::chrono::steady_clock::now();
  ctx_.decode(batch_);
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();

  out_.clear();
  rows_.clear();
  int m = 0;  // drafted tokens kept
  for (int i = 0; i <= k; ++i) {
    const size_t row = static_cast<size_t>(p - 1 + i);
    const float* lg = ctx_.logits(row);
    bool acc = false;
    const int32_t t = i < k ? sampler_.verify(lg, draft_[static_cast<size_t>(i)], drafter_->draft_probs(i), acc)
                            : sampler_.sample(lg);
    sampler_.accept(t);
    out_.push_back(t);
    rows_.push_back(row);
    if (!acc) break;
    ++m;
  }
  hist_.insert(hist_.end(), out_.begin(), out_.end());
  observe_rows(0, L, p + m);  // the rows kept: the pending tokens and the accepted drafts
  ++st_.steps;
  st_.emitted += out_.size();
  (k > 0 ? st_.verify_s : st_.plain_s) += secs;
  if (p_.adaptive) {
    if (k == 0 && p == 1) {  // a plain step's time: what a proposal's time is measured against
      t_plain_ = n_plain_meas_ == 0 ? secs : t_plain_ + (secs - t_plain_) / 8.0;
      n_plain_meas_ = std::min(n_plain_meas_ + 1, 1 << 20);
    } else if (k > 0) {
      // drafts tried: the kept ones and the first rejected one (the geometric model of spec_decide)
      acc_hit_ = acc_hit_ * 0.875 + m;
      acc_try_ = acc_try_ * 0.875 + m + (m < k ? 1 : 0);
      const double draft_cost = n_plain_meas_ > 0 && t_plain_ > 0 ? t_draft_ / t_plain_ : 0.0;
      const SpecDecision d =
          spec_decide(*cost_, accept_estimate(), draft_cost, std::max(1, p_.n_min), p_.n_max, on_);
      if (d.k > 0) {
        on_ = true;
        auto_k_ = d.k;
        backoff_ = 8;
      } else {  // off: plain steps, then a probe (8 steps, doubling up to 256 while probes lose)
        pause_ = on_ ? 8 : backoff_;
        backoff_ = on_ ? 16 : std::min(backoff_ * 2, 256);
        on_ = false;
      }
    }
  }
  if (k > 0) {
    ++st_.verify_steps;
    st_.drafted += static_cast<uint64_t>(k);
    st_.accepted += static_cast<uint64_t>(m);
    drafter_->accepted(m);
  }
  if (k == 0 || m == k) {  // everything decoded is kept
    pending_ = 1;
    if (snap && !had_snap) ctx_.seq_snapshot_drop(seq_, L);
  } else if (kda_) {
    // back to the start of the step (rows and KDA states); the tokens kept are decoded again at
    // the head of the next step's batch
    ctx_.seq_truncate(seq_, L);
    if (!had_snap) ctx_.seq_snapshot_drop(seq_, L);
    pending_ = p + m + 1;
    st_.recomputed += static_cast<uint64_t>(p + m);
  } else {  // rows only: drop the rejected ones
    ctx_.seq_truncate(seq_, L + p + m);
    pending_ = 1;
  }
  return out_;
}

const float* Speculator::logits(size_t i) const {
  check(i < rows_.size(), "speculative: logits({}) of a step with {} tokens", i, rows_.size());
  return ctx_.logits(rows_[i]);
}

void Speculator::settle() {
  if (pending_ <= 1) return;
  const int32_t L = ctx_.seq_len(seq_);
  const size_t H = hist_.size();
  batch_.clear();
  for (int i = 0; i + 1 < pending_; ++i)
    batch_.add(hist_[H - static_cast<size_t>(pending_ - i)], seq_, L + i, false);
  ctx_.decode(batch_);
  observe_rows(0, L, pending_ - 1);
  pending_ = 1;
}

void Speculator::observe_rows(size_t row0, int32_t pos0, int64_t n) {
  if (drafter_) observe_taps(*drafter_, ctx_, row0, pos0, n);
}

void observe_taps(Drafter& d, const Context& ctx, size_t row0, int32_t pos0, int64_t n) {
  if (d.tap_layers().empty() || n <= 0) return;
  const auto& tl = ctx.tap_layers();
  const auto want = d.tap_layers();
  check(tl.size() == want.size() && std::equal(tl.begin(), tl.end(), want.begin()),
        "speculative: the drafter reads target layers the context does not tap (Context::set_tap_layers)");
  TargetTaps t;
  t.layers = want;
  t.n_embd = ctx.model().hparams().n_embd;
  t.pos0 = pos0;
  t.n_rows = n;
  t.data = ctx.tap_row(row0);
  d.observe(t);
}

}  // namespace kimi
