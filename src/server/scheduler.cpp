#include "server/scheduler.h"

#include "runtime/vision_input.h"

#include "server/tool_grammar.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <future>

#include "util/error.h"

namespace kimi::server {

// ---------------------------------------------------------------------------------------------
// Scheduler

Scheduler::Scheduler(const Model& model, const tok::Tokenizer& tok, const ContextOptions& copts,
                     const SchedulerOptions& so)
    : model_(model), tok_(tok), so_(so) {
  check(so_.parallel >= 1, "--parallel must be >= 1 (got {})", so_.parallel);
  check(so_.chunk >= 1, "--chunk must be >= 1 (got {})", so_.chunk);
  check(so_.max_chunks >= 1, "--max-chunks must be >= 1 (got {})", so_.max_chunks);
  // with the prompt-cache store, spare live sequences are not needed (the store keeps conversations)
  if (so_.cache_slots < 0) so_.cache_slots = so_.prompt_cache && so_.cache_ram > 0 ? 0 : so_.parallel;
  // the thinking budget's close sequence: what the K3 template writes between an assistant turn's
  // think channel and its response channel (tok::render_chat: close_tag("think") + open_tag("response")),
  // kept below only when the vocabulary has the structural tags
  think_close_ = tok_.encode("<|close|>think<|sep|><|open|>response<|sep|>", true);
  ContextOptions o = copts;
  o.n_seq_max = so_.parallel + so_.cache_slots;
  // a step holds up to max_chunks prefill chunks and, per generating request, its sampled token
  // and the forced tokens known after it (the close sequence)
  o.n_batch_max = std::max(o.n_batch_max, so_.chunk * so_.max_chunks +
                                              so_.parallel * static_cast<int>(1 + think_close_.size()));
  if (so_.spec_type != SpecType::Off || !so_.draft_model.empty())
    o.n_snapshots_max += 1;  // a verify step's snapshot (docs/speculative.md)
  ctx_ = std::make_unique<Context>(model_, o);
  n_ctx_ = o.n_ctx_max;
  if (!so_.draft_model.empty()) {  // the DSpark draft: one runner, a drafter per sequence (dspark_for)
    check(ctx_->n_ranks() <= 1, "--model-draft: the DSpark draft runs in a single process, not across MPI ranks");
    std::shared_ptr<const DsparkModel> dm = DsparkModel::load(so_.draft_model);
    DsparkDrafterOptions d;
    d.n_seq = o.n_seq_max;
    d.n_ctx = n_ctx_ + static_cast<int>(dm->hparams().block);  // a block reaches past the last position
    d.n_batch = std::max(16, so_.chunk);
    d.n_threads = so_.draft_threads;
    d.precision = copts.precision;
    dspark_ = std::make_shared<DsparkRunner>(std::move(dm), model_, d);
    ctx_->set_tap_layers(dspark_->taps);  // the target's hidden states at the draft's tap layers, every row
    dspark_drafters_.resize(static_cast<size_t>(o.n_seq_max));
    dspark_seen_.resize(static_cast<size_t>(o.n_seq_max));
  }
  any_prefix_ = model_.hparams().n_kda_layers() == 0;
  if (so_.prompt_cache && so_.cache_ram > 0 && ctx_->n_ranks() <= 1)
    cache_ = std::make_unique<PromptCache>(*ctx_, PromptCacheOptions{so_.cache_ram, so_.cache_dir, so_.cache_disk});
  seqs_.resize(static_cast<size_t>(o.n_seq_max));
  // chat output keeps only the structural special tokens (the parser needs them as text)
  drop_special_.assign(static_cast<size_t>(ctx_->n_vocab()), 0);
  for (int32_t id = 0; id < std::min(ctx_->n_vocab(), tok_.n_vocab()); ++id) {
    if (!tok_.is_special(id)) continue;
    const std::string& p = tok_.token_to_piece(id);
    drop_special_[static_cast<size_t>(id)] = p != "<|open|>" && p != "<|close|>" && p != "<|sep|>" && p != "<|end_of_msg|>";
    if (p == "<|close|>") close_id_ = id;
    if (p == "<|open|>") open_id_ = id;
    if (p == "<|sep|>") sep_id_ = id;
    if (p == "<|end_of_msg|>") eom_id_ = id;
  }
  if (!think_close_.empty() && (close_id_ < 0 || open_id_ < 0 || sep_id_ < 0 || think_close_.front() != close_id_))
    think_close_.clear();
  if (const char* e = std::getenv("KIMI_GRAMMAR_FULL_SCAN")) grammar_full_scan_ = std::string(e) == "1";
  for (int32_t t = 0; t < std::min(ctx_->n_vocab(), tok_.n_vocab()); ++t)
    if (tok_.is_eog(t) || t == model_.hparams().eos_id) end_ids_.push_back(t);
  st_.slots = so_.parallel;
  st_.sequences = o.n_seq_max;
  slot_info_.resize(static_cast<size_t>(o.n_seq_max));
  for (int i = 0; i < o.n_seq_max; ++i) slot_info_[static_cast<size_t>(i)].id = i;
  if (so_.vision) {
    st_.vision = true;
    vworker_ = std::make_unique<VisionWorker>(
        *so_.vision, model_.hparams().n_embd, so_.vision_cache,
        [this] {
          {
            std::lock_guard<std::mutex> lk(mu_);
            tower_woke_ = true;
          }
          cv_.notify_all();
        },
        so_.vision_hook);
  }
  thread_ = std::thread([this] { loop(); });
}

Scheduler::~Scheduler() { shutdown(std::chrono::milliseconds(0)); }

bool Scheduler::submit(const std::shared_ptr<Job>& job) {
  {
    std::lock_guard<std::mutex> lk(mu_);
    if (stop_ || draining_.load()) return false;
    const int waiting = static_cast<int>(queue_.size());
    const int free_slots = so_.parallel - static_cast<int>(st_.active);
    if (waiting - std::max(0, free_slots) >= so_.queue_limit) return false;
    queue_.push_back(job);
    st_.queue_depth = static_cast<int>(queue_.size());
    ++st_.requests_started;  // every accepted job ends in exactly one outcome (finish, or cancelled / timed out in the queue)
  }
  cv_.notify_all();
  return true;
}

void Scheduler::request_stop(std::chrono::milliseconds grace) {
  {
    std::lock_guard<std::mutex> lk(mu_);
    draining_.store(true);
    const auto end = Clock::now() + grace;
    if (end < grace_end_) grace_end_ = end;
    stop_ = true;
  }
  cv_.notify_all();
}

void Scheduler::shutdown(std::chrono::milliseconds grace) {
  request_stop(grace);
  std::lock_guard<std::mutex> lk(join_mu_);
  if (thread_.joinable()) thread_.join();
}

std::vector<SlotInfo> Scheduler::slots() const {
  std::lock_guard<std::mutex> lk(mu_);
  return slot_info_;
}

void Scheduler::update_slots() {
  std::lock_guard<std::mutex> lk(mu_);
  for (size_t i = 0; i < seqs_.size(); ++i) {
    SlotInfo& si = slot_info_[i];
    si.busy = seqs_[i].busy;
    si.prefix = seqs_[i].prefix;
    si.n_cached = static_cast<int>(seqs_[i].toks.size());
    si.n_prompt = si.n_prompt_done = si.n_decoded = 0;
  }
  for (const auto& a : active_) {
    if (a->done || a->seq < 0) continue;
    SlotInfo& si = slot_info_[static_cast<size_t>(a->seq)];
    si.n_prompt = static_cast<int>(a->job->prompt().size());
    si.n_prompt_done = static_cast<int>(a->pos);
    si.n_decoded = a->n_gen;
  }
}

SchedulerStats Scheduler::stats() const {
  std::lock_guard<std::mutex> lk(mu_);
  SchedulerStats s = st_;
  if (cache_) s.cache = cache_->stats();
  if (vworker_) s.vis = vworker_->stats();
  if (rate_.size() >= 2) {
    const double span = std::chrono::duration<double>(rate_.back().first - rate_.front().first).count();
    uint64_t n = 0;
    for (size_t i = 1; i < rate_.size(); ++i) n += static_cast<uint64_t>(rate_[i].second);
    const double age = std::chrono::duration<double>(Clock::now() - rate_.back().first).count();
    s.tokens_per_s = span > 0 && age < 10 ? n / span : 0.0;
  }
  return s;
}

void Scheduler::loop() {
  for (;;) {
    std::vector<std::shared_ptr<Job>> admitted;
    std::deque<std::function<void()>> tasks;  // slot actions (between_steps)
    {
      std::unique_lock<std::mutex> lk(mu_);
      cv_.wait(lk, [&] { return stop_ || !queue_.empty() || !active_.empty() || !ctl_.empty(); });
      tasks.swap(ctl_);
      if (stop_ && Clock::now() >= grace_end_) {
        // grace over: cancel everything still queued or running
        for (auto& j : queue_) j->cancel();
        for (auto& a : active_) a->job->cancel();
      }
      if (stop_ && queue_.empty() && active_.empty() && tasks.empty()) break;
      lk.unlock();
      for (auto& t : tasks) t();  // before admitting: a restored slot is there for the next request
      update_slots();
      lk.lock();
      const auto now = Clock::now();  // drop queued jobs that were given up or timed out
      for (auto it = queue_.begin(); it != queue_.end();) {
        const bool late = now >= (*it)->params().deadline;
        if (!(*it)->cancelled() && !late) { ++it; continue; }
        Job::Result r;
        r.finish_reason = late ? FinishReason::Timeout : FinishReason::Cancelled;
        r.http_status = late ? 408 : 200;
        r.error = late ? "request timed out while queued" : "";
        r.n_prompt = static_cast<int>((*it)->prompt().size());
        (*it)->finish(r);
        ++(late ? st_.requests_timeout : st_.requests_cancelled);
        it = queue_.erase(it);
      }
      while (!queue_.empty() && static_cast<int>(active_.size() + admitted.size()) < so_.parallel) {
        admitted.push_back(queue_.front());
        queue_.pop_front();
      }
      st_.queue_depth = static_cast<int>(queue_.size());
    }
    for (auto& j : admitted) {
      auto a = std::make_unique<Active>();
      a->job = j;
      if (j->cancelled()) {  // given up while waiting: never touches the context
        Job::Result r;
        r.finish_reason = FinishReason::Cancelled;
        r.n_prompt = static_cast<int>(j->prompt().size());
        j->finish(r);
        std::lock_guard<std::mutex> lk(mu_);
        ++st_.requests_cancelled;
        continue;
      }
      try {
        start(*a);
        active_.push_back(std::move(a));
      } catch (const std::exception& e) {
        Job::Result r;
        r.finish_reason = FinishReason::Error;
        r.http_status = 500;
        r.error = e.what();
        j->finish(r);
        std::lock_guard<std::mutex> lk(mu_);
        ++st_.requests_failed;
      }
    }
    // cancellations and timeouts
    const auto now = Clock::now();
    for (auto& a : active_) {
      if (a->job->cancelled()) finish(*a, FinishReason::Cancelled);
      else if (now >= a->job->params().deadline) finish(*a, FinishReason::Timeout, 408, "request timed out");
    }
    active_.erase(std::remove_if(active_.begin(), active_.end(), [](auto& a) { return a->done; }), active_.end());
    if (active_.empty()) continue;
    try {
      step();
    } catch (const std::exception& e) {  // never let the scheduler thread die: fail what was running
      for (auto& a : active_) {
        if (a->done) continue;
        ctx_->seq_clear(a->seq);
        seqs_[static_cast<size_t>(a->seq)].toks.clear();
        finish(*a, FinishReason::Error, 500, std::string("internal error: ") + e.what());
      }
    }
    active_.erase(std::remove_if(active_.begin(), active_.end(), [](auto& a) { return a->done; }), active_.end());
    update_slots();
    if (batch_.empty() && tower_waiting_) {
      // nothing to decode but sequences waiting for the tower: sleep until the worker wakes us, a
      // job or slot action comes, or the earliest deadline; cancellation (a flag on the job) is
      // checked every 50 ms meanwhile
      auto until = Clock::now() + std::chrono::milliseconds(50);
      for (const auto& a : active_) until = std::min(until, a->job->params().deadline);
      std::unique_lock<std::mutex> lk(mu_);
      cv_.wait_until(lk, until, [&] {
        return tower_woke_ || stop_ || !ctl_.empty() ||
               (!queue_.empty() && static_cast<int>(active_.size()) < so_.parallel);
      });
      tower_woke_ = false;
    }
  }
  std::lock_guard<std::mutex> lk(mu_);
  st_.active = 0;
  st_.queue_depth = 0;
}

const std::string& Scheduler::identity() {
  std::call_once(identity_once_, [this] { identity_ = ctx_->state_identity(); });
  return identity_;
}

Scheduler::SlotAction Scheduler::slot_precheck(int id) const {
  SlotAction r;
  if (id < 0 || id >= static_cast<int>(seqs_.size())) {
    r.status = 404;
    r.error = fmt::format("slot {} does not exist (slots 0..{})", id, seqs_.size() - 1);
  } else if (ctx_->n_ranks() > 1) {  // the other ranks' rows and states are not reachable from here
    r.status = 501;
    r.error = "slot files are not supported with several MPI ranks";
  }
  return r;
}

Scheduler::SlotAction Scheduler::between_steps(int id, const std::function<SlotAction(SeqRec&)>& fn) {
  SlotAction r = slot_precheck(id);
  if (r.status != 200) return r;
  std::promise<SlotAction> done;
  auto fut = done.get_future();
  {
    std::lock_guard<std::mutex> lk(mu_);
    if (stop_ || draining_.load()) {
      r.status = 503;
      r.error = "server is shutting down";
      return r;
    }
    ctl_.emplace_back([&, id] {
      const auto t0 = Clock::now();
      SlotAction a;
      SeqRec& s = seqs_[static_cast<size_t>(id)];
      if (s.busy) {
        a.status = 409;
        a.error = fmt::format("slot {} is busy processing a request; try again when it is idle", id);
      } else {
        try {
          a = fn(s);
        } catch (const std::exception& e) {
          a.status = 500;
          a.error = e.what();
        }
      }
      a.ms = std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
      update_slots();  // /slots shows the result as soon as the answer is sent
      done.set_value(std::move(a));
    });
  }
  cv_.notify_all();
  return fut.get();
}

Scheduler::SlotAction Scheduler::slot_save(int id, const std::string& path) {
  return between_steps(id, [&, id](SeqRec& s) {
    SlotAction a;
    if (s.toks.empty()) {
      a.status = 400;
      a.error = fmt::format("slot {} holds no tokens: nothing to save", id);
      return a;
    }
    a.bytes = save_sequence_file(*ctx_, identity(), id, s.toks, path);
    a.n = static_cast<int>(s.toks.size());
    return a;
  });
}

Scheduler::SlotAction Scheduler::slot_restore(int id, const std::string& path) {
  SlotAction a = slot_precheck(id);
  if (a.status != 200) return a;
  SequenceFile f;
  try {
    // read and checked whole on the caller's thread, before the slot is touched: a large file never
    // stalls the scheduler
    f = read_sequence_file(*ctx_, identity(), path);
  } catch (const std::exception& e) {
    a.status = 400;
    a.error = e.what();
    return a;
  }
  return between_steps(id, [&, id](SeqRec& s) {
    SlotAction a;
    try {
      load_sequence_file(*ctx_, id, f);
    } catch (...) {  // the sequence may be half written: empty it
      ctx_->seq_clear(id);
      s.toks.clear();
      throw;
    }
    s.restored = f.toks;
    s.toks = std::move(f.toks);
    s.prefix = false;
    s.used = ++tick_;
    a.n = static_cast<int>(s.toks.size());
    a.bytes = f.bytes;
    return a;
  });
}

Scheduler::SlotAction Scheduler::slot_erase(int id) {
  return between_steps(id, [&, id](SeqRec& s) {
    SlotAction a;
    a.n = static_cast<int>(s.toks.size());
    ctx_->seq_clear(id);
    s.toks.clear();
    s.prefix = false;
    // what the prompt cache made from a restored slot file goes with it
    if (cache_ && !s.restored.empty()) cache_->drop_prefix(s.restored);
    s.restored.clear();
    return a;
  });
}

static size_t common_prefix(const std::vector<int32_t>& a, const std::vector<int32_t>& b) {
  const size_t n = std::min(a.size(), b.size());
  size_t i = 0;
  while (i < n && a[i] == b[i]) ++i;
  return i;
}

int Scheduler::pick_victim(int exclude) const {
  int best = -1;
  for (int i = 0; i < static_cast<int>(seqs_.size()); ++i) {
    const SeqRec& s = seqs_[static_cast<size_t>(i)];
    if (i == exclude || s.busy) continue;
    if (best < 0) { best = i; continue; }
    const SeqRec& b = seqs_[static_cast<size_t>(best)];
    const bool se = s.toks.empty(), be = b.toks.empty();
    if (se != be) { if (se) best = i; continue; }
    if (s.used < b.used) best = i;
  }
  return best;
}

void Scheduler::start(Active& a) {
  const std::vector<int32_t>& P = a.job->prompt();
  check(!P.empty(), "empty prompt");
  const size_t cap = P.size() - 1;  // the last prompt token is always decoded (its logits)
  const GenParams& gp = a.job->params();
  const SpecType spec_t = gp.spec_type.value_or(so_.spec_type);
  const bool free_output = !gp.grammar && !gp.tool_grammar && gp.thinking_budget < 0 && !gp.tool_must_finish && !gp.images;
  // "auto" drafts with the DSpark draft when -md loaded one (as kimi run/chat), else n-gram
  const bool auto_dspark = spec_t == SpecType::Auto && !so_.make_drafter;
  const bool dspark_req = dspark_ && (spec_t == SpecType::Dspark || auto_dspark) && free_output &&
                          (gp.spec_n_max >= 0 ? gp.spec_n_max : so_.spec.n_max) > 0;
  int src = -1;
  size_t best_r = 0, L = 0;
  for (int i = 0; i < static_cast<int>(seqs_.size()); ++i) {
    const SeqRec& s = seqs_[static_cast<size_t>(i)];
    const size_t l = std::min(common_prefix(s.toks, P), cap);
    L = std::max(L, l);
    size_t r = 0;
    if (s.toks.size() <= l) r = s.toks.size();
    else if (any_prefix_) r = l;
    else  // the longest engine snapshot (chunk or turn boundary) inside the common prefix
      for (int32_t sp : ctx_->seq_snapshot_positions(i))
        if (sp > 0 && static_cast<size_t>(sp) <= l) r = std::max(r, static_cast<size_t>(sp));
    // a DSpark request resumes a sequence only as far as that sequence's draft saw the same tokens
    // (r must stay a point the engine can resume at: a shorter common prefix rules the sequence out)
    if (dspark_req && common_prefix(dspark_seen_[static_cast<size_t>(i)], P) < r) r = 0;
    if (r == 0 || !so_.prompt_cache) continue;
    const bool better = r > best_r || (r == best_r && src >= 0 && seqs_[static_cast<size_t>(src)].busy && !s.busy);
    if (better) { best_r = r; src = i; }
  }
  int target = cache_ ? restore_from_store(P, cap, best_r, L, src) : -1;
  const bool from_store = target >= 0;
  if (from_store) {
    // loaded from the prompt-cache store
  } else if (src >= 0 && !seqs_[static_cast<size_t>(src)].busy && !seqs_[static_cast<size_t>(src)].prefix) {
    target = src;
  } else {
    target = pick_victim(src);
    if (target < 0) target = src;  // only the (idle) prefix entry itself is free: take it over
    check(target >= 0, "internal: no free sequence for a new request");
  }
  SeqRec& t = seqs_[static_cast<size_t>(target)];
  if (from_store) {
    // loaded: the sequence holds exactly P[0, best_r)
  } else if (best_r == 0) {
    ctx_->seq_clear(target);
    t.toks.clear();
  } else {
    if (target != src) {
      // only the rows [0, best_r) (and the KDA states of the snapshot there, if any) are copied
      const SeqRec& s = seqs_[static_cast<size_t>(src)];
      ctx_->seq_copy(src, target, static_cast<int32_t>(best_r));
      t.toks.assign(s.toks.begin(), s.toks.begin() + static_cast<std::ptrdiff_t>(best_r));
      seqs_[static_cast<size_t>(src)].used = ++tick_;
    } else if (t.toks.size() > best_r) {
      ctx_->seq_truncate(target, static_cast<int32_t>(best_r));
      t.toks.resize(best_r);
    }
  }
  if (dspark_req) {
    // the draft reads the target's hidden states of every position: a cached prefix is reused only as
    // far as this sequence's draft saw the same tokens (else the prompt is decoded again from the start)
    std::vector<int32_t>& seen = dspark_seen_[static_cast<size_t>(target)];
    if (common_prefix(seen, P) < best_r) {
      best_r = 0;
      ctx_->seq_clear(target);
      t.toks.clear();
    }
    dspark_for(target)->keep(static_cast<int32_t>(best_r));
    seen.resize(std::min(seen.size(), best_r));
  }
  if (best_r > 0 && best_r + 1 == P.size() && ctx_->seq_snapshot_pos(target) != static_cast<int32_t>(best_r))
    ctx_->seq_snapshot(target);
  t.busy = true;
  t.prefix = false;
  t.used = ++tick_;
  a.seq = target;
  a.pos = best_r;
  a.t_admit = Clock::now();
  a.split_at = (so_.prompt_cache && (so_.cache_slots > 0 || cache_) && L >= best_r + static_cast<size_t>(so_.min_prefix_entry)) ? static_cast<int>(L) : -1;
  if (cache_ && eom_id_ >= 0 && cap > 0)  // the last message boundary inside the prompt: a store entry there
    for (size_t b = cap - 1; b > best_r; --b)
      if (P[b - 1] == eom_id_) {
        a.save_at = static_cast<int>(b);
        break;
      }
  a.sampler.emplace(gp.sampler, ctx_->n_vocab());
  {  // speculative decoding: the request's choice, else the server's
    const SpecType t = spec_t;
    a.spec = so_.spec;
    if (gp.spec_n_max >= 0) a.spec.n_max = gp.spec_n_max;
    if (gp.spec_n_min >= 0) a.spec.n_min = gp.spec_n_min;
    a.spec.n_min = std::min(a.spec.n_min, a.spec.n_max);
    a.spec.adaptive = t == SpecType::Auto;  // drafts only while it pays (SpecAuto, spec_draft)
    a.drafter = nullptr;
    a.own_drafter.reset();
    if (dspark_req) {
      a.drafter = dspark_for(target);
    } else if ((t == SpecType::Ngram || t == SpecType::Auto) && free_output && a.spec.n_max > 0) {
      a.own_drafter = so_.make_drafter ? so_.make_drafter() : std::make_unique<NgramDrafter>();
      a.drafter = a.own_drafter.get();
    }
    if (a.spec.adaptive && a.drafter && !spec_cost_)
      spec_cost_ = so_.spec.cost ? so_.spec.cost
                                 : std::make_shared<const VerifyCostModel>(VerifyCostModel::of(model_, ctx_->placement()));
    a.spec_auto = SpecAuto{};
    a.spec_paused = 0;
    a.n_draft_meas = 0;
    a.t_draft = 0;
    a.draft.clear();
    a.redo.clear();
    a.draft.reserve(static_cast<size_t>(a.spec.n_max));
  }
  if (gp.sampler.repeat_penalty != 1.0f)
    for (int32_t tkn : P) a.sampler->accept(tkn < 0 && gp.images ? gp.images->placeholder : tkn);
  a.img_rows.clear();
  a.vision_s = -1;
  a.vision_cached = 0;
  a.tower.reset();
  if (gp.images) {
    a.drafter = nullptr;  // image keys are no tokens to draft
    // the images with a position past what the prompt cache restored go to the tower worker now
    const PromptImages& im = *gp.images;
    std::vector<int64_t> first_row(im.images.size() + 1, 0);
    for (size_t k = 0; k < im.images.size(); ++k) first_row[k + 1] = first_row[k] + im.images[k].size.tokens;
    std::vector<uint8_t> need(im.images.size(), 0);
    bool any = false;
    for (size_t i = best_r; i < P.size(); ++i) {
      if (im.row[i] < 0) continue;
      const size_t k = static_cast<size_t>(std::upper_bound(first_row.begin(), first_row.end(), im.row[i]) - first_row.begin() - 1);
      any = any || !need[k];
      need[k] = 1;
    }
    if (any && vworker_) a.tower = vworker_->submit(gp.images, std::move(need));
  }
  a.detok.emplace(tok_, false);
  if (gp.chat) a.parser.emplace(gp.start_in_think);
  a.in_think = gp.chat && gp.start_in_think;
  if (gp.grammar) {
    a.matcher.emplace(gp.grammar);
    a.constrained = !gp.chat || !gp.start_in_think;  // thinking: once the response channel opens
    a.masked.assign(static_cast<size_t>(ctx_->n_vocab()), 0.0f);
  }
  if (gp.tool_grammar) {
    a.tool_matcher.emplace(gp.tool_grammar);
    a.tool_on = gp.tool_trigger.empty();
    a.masked.assign(static_cast<size_t>(ctx_->n_vocab()), 0.0f);
  }
  a.think_budget = gp.thinking_budget;
  if (gp.tool_must_finish && a.in_think && a.tool_matcher && a.tool_on) {
    // a required call must come: the think channel gets at most max_tokens - (3 T / 2 + 16) tokens,
    // T the tokens of the cheapest whole answer (GenParams::tool_must_finish, docs/server.md)
    std::vector<int32_t> q;
    if (completion_tokens(*a.tool_matcher, q)) {
      const int t = static_cast<int>(q.size());
      const int room = std::min(gp.max_tokens, n_ctx_ - 2 - static_cast<int>(P.size()));  // max_tokens, or the context
      const int cap = std::max(0, room - (t + t / 2 + 16));
      a.think_budget = a.think_budget < 0 ? cap : std::min(a.think_budget, cap);
    }
  }
  if (a.think_budget >= 0 || gp.tool_must_finish) a.drafter = nullptr;  // forced tokens may come: no drafts
  {
    Job::Result r;  // record prompt/cached counts early (visible in the final result)
    std::lock_guard<std::mutex> lk(a.job->mu_);
    a.job->result_.n_prompt = static_cast<int>(P.size());
    a.job->result_.n_cached = static_cast<int>(best_r);
  }
  std::lock_guard<std::mutex> lk(mu_);
  ++st_.active;
  st_.prompt_tokens += P.size();
  st_.cached_tokens += best_r;
}

int64_t Scheduler::image_rows(Active& a, size_t from, size_t n) {
  const PromptImages& im = *a.job->params().images;
  if (!a.img_rows.empty()) return static_cast<int64_t>(n);
  size_t first = from;  // the first image position in the range
  while (first < from + n && im.row[first] < 0) ++first;
  if (first == from + n) return static_cast<int64_t>(n);
  try {
    check(a.tower != nullptr, "the server has no vision tower");
    if (!a.tower->done()) {  // still running (or queued): the text before the image goes on
      tower_waiting_ = true;
      return static_cast<int64_t>(first - from);
    }
    std::shared_ptr<VisionWorker::Task> t = std::move(a.tower);
    if (!t->error.empty()) fail("{}", t->error);
    a.vision_s = t->tower_s;
    a.vision_cached = t->cached;
    a.img_rows = std::move(t->rows);
    check(static_cast<int64_t>(a.img_rows.size()) == im.n_rows * model_.hparams().n_embd,
          "the vision tower gave {} floats for {} rows of {}", a.img_rows.size(), im.n_rows, model_.hparams().n_embd);
  } catch (const std::exception& e) {
    a.img_rows.clear();
    finish(a, FinishReason::Error, 500, std::string("the vision tower failed: ") + e.what());
    return -1;
  }
  return static_cast<int64_t>(n);
}

int Scheduler::restore_from_store(const std::vector<int32_t>& P, size_t cap, size_t& best_r, size_t& L, int& src) {
  L = std::max(L, std::min(cache_->longest_common(P), cap));
  const PromptCache::Hit h = cache_->find(P, cap);
  if (h.n <= best_r) return -1;
  const int target = pick_victim(-1);
  if (target < 0) return -1;
  SeqRec& t = seqs_[static_cast<size_t>(target)];
  bool ok = false;
  try {
    ok = cache_->load(h, target);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "kimi serve: prompt cache: loading an entry failed: %s\n", e.what());
  }
  if (!ok) {  // the sequence was emptied: prefill from the start (or from another live sequence)
    ctx_->seq_clear(target);
    t.toks.clear();
    if (target == src) {
      src = -1;
      best_r = 0;
    }
    return -1;
  }
  t.toks.assign(P.begin(), P.begin() + static_cast<std::ptrdiff_t>(h.n));
  best_r = h.n;
  return target;
}

void Scheduler::store_save(Active& a, size_t n) {
  if (!cache_ || a.seq < 0) return;
  try {
    cache_->save(a.seq, seqs_[static_cast<size_t>(a.seq)].toks, n);
  } catch (const std::exception& e) {  // never fails the request: the entry is just not kept
    std::fprintf(stderr, "kimi serve: prompt cache: saving %zu tokens failed: %s\n", n, e.what());
  }
}

void Scheduler::make_prefix_entry(Active& a) {
  if (cache_) return store_save(a, a.pos);  // an entry of the store instead of a spare sequence
  const int v = pick_victim(a.seq);
  if (v < 0) return;
  ctx_->seq_copy(a.seq, v);
  SeqRec& d = seqs_[static_cast<size_t>(v)];
  const SeqRec& s = seqs_[static_cast<size_t>(a.seq)];
  d.toks = s.toks;
  d.prefix = true;
  d.used = ++tick_;
  std::lock_guard<std::mutex> lk(mu_);
  ++st_.prefix_entries;
}

void Scheduler::step() {
  batch_.clear();
  tower_waiting_ = false;
  int prefill_tokens = 0;
  struct Part { Active* a; size_t n; size_t row0; };  // prefill part of this step (its first batch row)
  std::vector<Part> parts;
  // the step's rows and token-emitting sequences before any draft ("auto" weighs a draft against
  // them; a prompt chunk counted at its most likely length, min(--chunk, what is left))
  SpecBatch sb{0, 0, 0.0};
  {
    int chunks = 0;
    for (const auto& up : active_) {
      const Active& a = *up;
      if (a.generating) {
        sb.rows += static_cast<int>(a.redo.size() + 1 + a.ahead.size());
        ++sb.seqs;
      } else if (chunks < so_.max_chunks && a.seq >= 0) {
        sb.rows += static_cast<int>(std::min(static_cast<size_t>(so_.chunk), a.job->prompt().size() - a.pos));
        ++chunks;
      }
    }
  }
  for (auto& up : active_) {
    Active& a = *up;
    if (!a.generating) continue;
    // the sampled token, then the forced ones known to follow it (one chunk of the sequence): logits
    // at the last row (sampling), at the others only for the forced tokens' logprobs
    const int32_t base = static_cast<int32_t>(seqs_[static_cast<size_t>(a.seq)].toks.size());
    feed_forced(a, static_cast<size_t>(base));
    const bool lp = a.job->params().logprobs >= 0;
    // speculative decoding: kept tokens to decode again (after a rollback), then the sampled token
    // and this step's draft, logits at each drafted position
    const int32_t r = static_cast<int32_t>(a.redo.size());
    a.obs_row0 = batch_.size();
    for (int32_t i = 0; i < r; ++i) batch_.add(a.redo[static_cast<size_t>(i)], a.seq, base + i, false);
    a.spec_base = base;
    if (a.drafter && a.ahead.empty()) {
      spec_draft(a, base, sb);
      sb.rows += static_cast<int>(a.draft.size());  // a later sequence's drafts join these rows too
    }
    batch_.add(a.pending, a.seq, base + r, lp || a.ahead.empty());
    const int pending_row = static_cast<int>(batch_.size()) - 1;
    for (size_t i = 0; i < a.draft.size(); ++i)
      batch_.add(a.draft[i], a.seq, base + r + 1 + static_cast<int32_t>(i), true);
    for (size_t i = 0; i < a.ahead.size(); ++i)
      batch_.add(a.ahead[i], a.seq, base + 1 + static_cast<int32_t>(i), lp || i + 1 == a.ahead.size());
    a.logit_idx = a.draft.empty() ? static_cast<int>(batch_.size()) - 1 : pending_row;
  }
  int chunks = 0;
  for (auto& up : active_) {
    Active& a = *up;
    if (a.generating || chunks >= so_.max_chunks) continue;
    const auto& P = a.job->prompt();
    size_t n = std::min(static_cast<size_t>(so_.chunk), P.size() - a.pos);
    // stop at |P| - 1 for the turn-boundary snapshot (an identical prompt can then resume there)
    const size_t snap_at = P.size() - 1;
    if (snap_at > 0 && a.pos < snap_at) n = std::min(n, snap_at - a.pos);
    if (a.split_at > static_cast<int>(a.pos)) n = std::min(n, static_cast<size_t>(a.split_at) - a.pos);
    if (a.save_at > static_cast<int>(a.pos)) n = std::min(n, static_cast<size_t>(a.save_at) - a.pos);
    // stop at multiples of snapshot_every too: a later prompt diverging mid-way resumes there
    if (chunk_snaps()) {
      const size_t E = static_cast<size_t>(so_.snapshot_every);
      n = std::min(n, (a.pos / E + 1) * E - a.pos);
    }
    const PromptImages* im = a.job->params().images.get();
    if (im) {  // the tower's rows, or the text up to the first image position while it runs
      const int64_t k = image_rows(a, a.pos, n);
      if (k <= 0) continue;
      n = static_cast<size_t>(k);
    }
    const bool last = a.pos + n == P.size();
    const int32_t base = static_cast<int32_t>(seqs_[static_cast<size_t>(a.seq)].toks.size());
    // budget 0: the close sequence follows the prompt's last token in its chunk
    if (last) feed_forced(a, static_cast<size_t>(base) + n - 1);
    const bool lp = a.job->params().logprobs >= 0;
    const size_t row0 = batch_.size();
    for (size_t i = 0; i < n; ++i) {
      const bool want = last && i + 1 == n && (lp || a.ahead.empty());
      const int32_t t = P[a.pos + i];
      if (t < 0 && im)  // an image position: the tower's row instead of the token's
        batch_.add_embd(im->placeholder, a.img_rows.data() + static_cast<size_t>(im->row[a.pos + i]) * static_cast<size_t>(model_.hparams().n_embd),
                        a.seq, base + static_cast<int32_t>(i), want);
      else
        batch_.add(t, a.seq, base + static_cast<int32_t>(i), want);
    }
    for (size_t i = 0; i < a.ahead.size(); ++i)
      batch_.add(a.ahead[i], a.seq, base + static_cast<int32_t>(n + i), lp || i + 1 == a.ahead.size());
    a.logit_idx = last ? static_cast<int>(batch_.size()) - 1 : -1;
    parts.push_back({&a, n, row0});
    prefill_tokens += static_cast<int>(n);
    ++chunks;
  }
  if (batch_.empty()) return;
  const auto t0 = Clock::now();
  try {
    ctx_->decode(batch_);
  } catch (const std::exception& e) {
    // the state of the sequences in this batch is unknown: drop their cache and fail the jobs
    for (auto& up : active_) {
      Active& a = *up;
      if (!a.generating && std::none_of(parts.begin(), parts.end(), [&](const Part& p) { return p.a == &a; })) continue;
      ctx_->seq_clear(a.seq);
      seqs_[static_cast<size_t>(a.seq)].toks.clear();
      finish(a, FinishReason::Error, 500, std::string("decode failed: ") + e.what());
    }
    return;
  }
  const auto t1 = Clock::now();
  {
    // counted before any request of this step finishes (a client may read the stats right after)
    std::lock_guard<std::mutex> lk(mu_);
    ++st_.decode_steps;
    st_.prefill_tokens += static_cast<uint64_t>(prefill_tokens);
    st_.busy_s += std::chrono::duration<double>(t1 - t0).count();
  }
  {  // the mean step time ("auto": a proposal's time is weighed against it)
    const double x = std::chrono::duration<double>(t1 - t0).count();
    t_step_ = n_step_meas_++ == 0 ? x : t_step_ + (x - t_step_) / 8.0;
    n_step_meas_ = std::min(n_step_meas_, 1 << 20);
  }
  int generated = 0;
  // generating requests: the pending token is now in the cache
  std::vector<Active*> gen_now;
  for (auto& up : active_) {
    Active& a = *up;
    if (!a.generating) continue;
    std::vector<int32_t>& toks = seqs_[static_cast<size_t>(a.seq)].toks;
    const size_t base = toks.size();
    toks.insert(toks.end(), a.redo.begin(), a.redo.end());
    a.redo.clear();
    toks.push_back(a.pending);
    toks.insert(toks.end(), a.ahead.begin(), a.ahead.end());
    // the rows kept (a verify step hands its rows over once it knows which drafts were kept)
    if (a.draft.empty()) spec_observe(a, a.obs_row0, static_cast<int32_t>(base), static_cast<int64_t>(toks.size() - base));
    gen_now.push_back(&a);
  }
  for (const Part& p : parts) {
    Active& a = *p.a;
    SeqRec& s = seqs_[static_cast<size_t>(a.seq)];
    const auto& P = a.job->prompt();
    const size_t base = s.toks.size();
    s.toks.insert(s.toks.end(), P.begin() + static_cast<std::ptrdiff_t>(a.pos),
                  P.begin() + static_cast<std::ptrdiff_t>(a.pos + p.n));
    a.pos += p.n;
    if (a.job->params().progress && a.pos < P.size()) {  // the prefill's progress (job driver: progress events)
      JobOutput o;
      o.prompt_done = static_cast<int>(a.pos);
      a.job->push(std::move(o));
    }
    if (a.split_at >= 0 && a.pos == static_cast<size_t>(a.split_at)) {
      a.split_at = -1;
      if (a.pos < P.size()) make_prefix_entry(a);
    }
    if (a.save_at >= 0 && a.pos == static_cast<size_t>(a.save_at)) {
      a.save_at = -1;
      store_save(a, a.pos);  // the last message boundary of the prompt
    }
    if (a.pos + 1 == P.size() && a.pos > 0) {
      ctx_->seq_snapshot(a.seq);  // turn boundary: later turns (or the same prompt) resume here
      store_save(a, a.pos);
    } else if (chunk_snaps() && a.pos < P.size() && a.pos % static_cast<size_t>(so_.snapshot_every) == 0) {
      ctx_->seq_snapshot(a.seq);  // chunk boundary of a long prompt
    }
    if (a.pos == P.size()) {
      s.toks.insert(s.toks.end(), a.ahead.begin(), a.ahead.end());  // the forced tokens after the prompt
      a.generating = true;
      gen_now.push_back(&a);
    }
    spec_observe(a, p.row0, static_cast<int32_t>(base), static_cast<int64_t>(s.toks.size() - base));
  }
  for (Active* a : gen_now) {
    if (!a->draft.empty()) {  // a verify step (speculative decoding)
      generated += spec_verify(*a);
      continue;
    }
    // one row per token this step decoded for the sequence: the token that follows row i is the
    // forced a->ahead[i] (already decoded, its logits only for logprobs), after the last row it is
    // sampled (or forced, when the chunk was cut short); exactly what one token per step gives
    const size_t n_rows = a->ahead.size() + 1;
    const std::vector<int32_t> ahead = std::move(a->ahead);
    a->ahead.clear();
    for (size_t i = 0; i < n_rows && !a->done; ++i) {
      const bool last = i + 1 == n_rows;
      const float* lg = last || a->job->params().logprobs >= 0
                            ? ctx_->logits(static_cast<size_t>(a->logit_idx) - (n_rows - 1 - i))
                            : nullptr;
      int32_t t = -1;
      bool forced = forced_token(*a, t);
      if (!last && (!forced || t != ahead[i]))
        fail("internal: sequence {} decoded the forced token {}, but {} is due", a->seq, ahead[i], forced ? t : -1);
      if (!forced) t = a->constrained || tool_active(*a) ? sample_constrained(*a, lg) : a->sampler->sample(lg);
      if (!forced && a->matcher && !a->constrained && (tok_.is_eog(t) || t == model_.hparams().eos_id)) {
        // a response format is required: the answer cannot end before its response (in the think channel)
        std::copy(lg, lg + ctx_->n_vocab(), a->masked.begin());
        for (int32_t e : end_ids_) a->masked[static_cast<size_t>(e)] = -INFINITY;
        t = a->sampler->sample(a->masked.data());
      }
      if (!forced && finish_due(*a, t)) forced = forced_token(*a, t);
      a->sampler->accept(t);
      ++generated;
      {
        // count before on_token: it may finish the job and wake the client, which can read /metrics
        std::lock_guard<std::mutex> lk(mu_);
        ++st_.generated_tokens;
        if (forced) ++st_.forced_tokens;
        if (!last) ++st_.forced_batched;
      }
      on_token(*a, t, lg);
    }
  }
  const ExpertStreamStats xs = ctx_->expert_stream_stats();  // this thread runs the context: no race
  std::lock_guard<std::mutex> lk(mu_);
  st_.hot_picks = xs.hot_picks, st_.host_picks = xs.host_picks, st_.hot_reranks = xs.hot_reranks;
  rate_.emplace_back(t1, generated);
  while (rate_.size() > 2 && std::chrono::duration<double>(t1 - rate_.front().first).count() > 10) rate_.pop_front();
}

// ---- speculative decoding (docs/speculative.md) ----

void Scheduler::spec_draft(Active& a, int32_t base, SpecBatch batch) {
  a.draft.clear();
  if (static_cast<int>(a.redo.size()) > a.spec.n_max) return;  // commit the tokens to decode again first
  const GenParams& gp = a.job->params();
  const int32_t r = static_cast<int32_t>(a.redo.size());
  // no token past max_tokens, no position past the context (on_token ends the request there)
  int n = std::min({a.spec.n_max, gp.max_tokens - a.n_gen - 1, n_ctx_ - base - r - 3,
                    kSpecMaxStepRows - r - 1});  // with redo + pending: < 16 rows, bit-exact
  const int k_min = std::max(1, a.spec.n_min);
  if (n < k_min) return;
  if (a.spec.adaptive) {  // "auto": draft only where it pays in this step's batch (SpecAuto)
    batch.rows = std::max(batch.rows, 1);
    batch.seqs = std::max(batch.seqs, 1);
    batch.draft_cost = a.n_draft_meas > 0 && t_step_ > 0 ? a.t_draft / t_step_ : 0.0;
    a.spec_batch = batch;
    a.spec_kmax = n;
    const int len = a.spec_auto.draft_len(*spec_cost_, batch, k_min, n);
    if (len == 0) {  // a plain step: paused, or no draft length pays beside these rows
      ++a.spec_paused;
      std::lock_guard<std::mutex> lk(mu_);
      ++st_.spec_paused;
      return;
    }
    n = std::min(n, len);
  }
  std::vector<int32_t>& toks = seqs_[static_cast<size_t>(a.seq)].toks;
  const size_t n0 = toks.size();  // the drafter reads the whole text: context + redo + pending
  toks.insert(toks.end(), a.redo.begin(), a.redo.end());
  toks.push_back(a.pending);
  const auto td = Clock::now();
  const int k = std::min(a.drafter->propose(toks, n, a.draft), n);
  if (a.spec.adaptive) {  // the time of a proposal (a draft model's forward; n-gram: microseconds)
    const double x = std::chrono::duration<double>(Clock::now() - td).count();
    a.t_draft = a.n_draft_meas++ == 0 ? x : a.t_draft + (x - a.t_draft) / 8.0;
    a.n_draft_meas = std::min(a.n_draft_meas, 1 << 20);
  }
  toks.resize(n0);
  if (k < std::max(1, a.spec.n_min)) {
    a.draft.clear();
    return;
  }
  a.draft.resize(static_cast<size_t>(k));
  a.spec_snap_new = false;
  if (model_.hparams().n_kda_layers() > 0) {  // the KDA states where this step starts (the rollback)
    a.spec_snap_new = !ctx_->seq_has_snapshot(a.seq, base);
    ctx_->seq_snapshot(a.seq);
  }
}

int Scheduler::spec_verify(Active& a) {
  const int32_t base = a.spec_base;
  const size_t k = a.draft.size();
  std::vector<int32_t>& toks = seqs_[static_cast<size_t>(a.seq)].toks;  // base + redo + pending
  a.spec_out.clear();
  size_t m = 0;  // drafted tokens kept
  for (size_t i = 0; i <= k; ++i) {
    const float* lg = ctx_->logits(static_cast<size_t>(a.logit_idx) + i);
    bool acc = false;
    const int32_t t = i < k ? a.sampler->verify(lg, a.draft[i], a.drafter->draft_probs(static_cast<int>(i)), acc)
                            : a.sampler->sample(lg);
    a.sampler->accept(t);
    a.spec_out.push_back(t);
    if (!acc) break;
    toks.push_back(a.draft[i]);
    ++m;
  }
  // the rows kept: the tokens decoded again, the pending one and the drafts accepted
  spec_observe(a, a.obs_row0, base, static_cast<int64_t>(toks.size()) - base);
  a.drafter->accepted(static_cast<int>(m));
  if (a.spec.adaptive)  // the acceptance rate, and on or off by the batch this step had
    a.spec_auto.verified(*spec_cost_, a.spec_batch, std::max(1, a.spec.n_min), a.spec_kmax, static_cast<int>(k),
                         static_cast<int>(m));
  a.spec_drafted += static_cast<int>(k);
  a.spec_accepted += static_cast<int>(m);
  ++a.spec_steps;
  const bool kda = model_.hparams().n_kda_layers() > 0;
  uint64_t recomputed = 0;
  if (m < k) {  // roll back the rejected drafts
    if (kda) {  // to the step's start; what was kept since is decoded again in the next step
      ctx_->seq_truncate(a.seq, base);
      a.redo.assign(toks.begin() + base, toks.end());
      toks.resize(static_cast<size_t>(base));
      recomputed = a.redo.size();
    } else {  // rows only: to the last kept token
      ctx_->seq_truncate(a.seq, static_cast<int32_t>(toks.size()));
    }
  }
  if (a.spec_snap_new) ctx_->seq_snapshot_drop(a.seq, base);
  a.spec_snap_new = false;
  {
    std::lock_guard<std::mutex> lk(mu_);
    ++st_.spec_verify_steps;
    st_.spec_drafted += k;
    st_.spec_accepted += m;
    st_.spec_recomputed += recomputed;
  }
  int emitted = 0;
  for (size_t i = 0; i < a.spec_out.size() && !a.done; ++i) {
    {
      std::lock_guard<std::mutex> lk(mu_);  // before on_token: it may finish the job and wake the client
      ++st_.generated_tokens;
    }
    ++emitted;
    on_token(a, a.spec_out[i], ctx_->logits(static_cast<size_t>(a.logit_idx) + i));
  }
  a.draft.clear();
  return emitted;
}

Drafter* Scheduler::dspark_for(int seq) {
  check(dspark_ != nullptr, "internal: no DSpark draft");
  auto& d = dspark_drafters_[static_cast<size_t>(seq)];
  if (!d) {
    d = std::make_unique<DsparkDrafter>(dspark_, seq);
    dspark_seen_[static_cast<size_t>(seq)].reserve(static_cast<size_t>(n_ctx_) + 1);
  }
  return d.get();
}

void Scheduler::spec_observe(Active& a, size_t row0, int32_t pos0, int64_t n) {
  if (!a.drafter || a.drafter->tap_layers().empty() || n <= 0) return;
  observe_taps(*a.drafter, *ctx_, row0, pos0, n);
  std::vector<int32_t>& seen = dspark_seen_[static_cast<size_t>(a.seq)];
  if (static_cast<size_t>(pos0) > seen.size()) return;  // a gap: the drafter does not cover these rows
  seen.resize(static_cast<size_t>(pos0));
  for (int64_t i = 0; i < n; ++i) seen.push_back(ctx_->tap_entry(row0 + static_cast<size_t>(i)).token);
}

void Scheduler::emit(Active& a, const std::string& text) {
  if (text.empty() && a.lp_pending.empty()) return;
  JobOutput o;
  if (a.parser) {
    apply_chat_text(*a.parser, text, o);
    // the records of the tokens whose text this is go where the text went
    const TokenLogprob::Channel ch = !o.content.empty()     ? TokenLogprob::Content
                                     : !o.reasoning.empty() ? TokenLogprob::Reasoning
                                                            : TokenLogprob::Other;
    for (auto& l : a.lp_pending) l.channel = ch;
  } else {
    o.text = text;
  }
  o.logprobs.swap(a.lp_pending);
  a.job->push(std::move(o));
}

// May token t come next under the grammar? Text tokens: their bytes must continue a sentence;
// the end of the answer (an end-of-generation token, or <|close|> in chat) only when the sentence
// is complete; other special tokens never.
bool Scheduler::grammar_allows(const Active& a, int32_t t) const {
  if (tool_active(a)) return tool_allows(a, t);
  const bool end = tok_.is_eog(t) || t == model_.hparams().eos_id || (a.job->params().chat && t == close_id_);
  if (end) return a.matcher->can_end();
  if (t < 0 || t >= tok_.n_vocab() || tok_.is_special(t)) return false;
  const std::string& piece = tok_.token_to_piece(t);
  return !piece.empty() && a.matcher->accepts_bytes(piece);
}

// Could the bytes of a text token make (part of) the code points that stand for the structural
// tokens in a tool grammar (U+E000.., UTF-8 EE 80 xx, also split over two tokens)?
static bool marker_bytes(const std::string& piece) {
  return piece.find("\xEE\x80") != std::string::npos || (!piece.empty() && piece.back() == '\xEE');
}

// The tool grammar: the structural tokens as their code points, the end of the answer where the
// grammar is complete, no other special token, and text tokens by their bytes.
bool Scheduler::tool_allows(const Active& a, int32_t t) const {
  if (tok_.is_eog(t) || t == model_.hparams().eos_id) return a.tool_matcher->can_end();
  if (t >= 0 && (t == open_id_ || t == close_id_ || t == sep_id_))
    return a.tool_matcher->accepts_bytes(t == open_id_ ? kToolOpen : t == close_id_ ? kToolClose : kToolSep);
  if (t < 0 || t >= tok_.n_vocab() || tok_.is_special(t)) return false;
  const std::string& piece = tok_.token_to_piece(t);
  return !piece.empty() && !marker_bytes(piece) && a.tool_matcher->accepts_bytes(piece);
}

void Scheduler::build_trie() {
  const int nv = ctx_->n_vocab();
  std::vector<std::string> pieces(static_cast<size_t>(nv));
  for (int32_t t = 0; t < nv; ++t) {
    const bool text = t < tok_.n_vocab() && !tok_.is_special(t) && !tok_.is_eog(t) && t != model_.hparams().eos_id &&
                      t != close_id_ && !tok_.token_to_piece(t).empty();
    if (text) pieces[static_cast<size_t>(t)] = tok_.token_to_piece(t);
    else trie_others_.push_back(t);
    if (text && marker_bytes(pieces[static_cast<size_t>(t)])) marker_text_.push_back(t);
  }
  trie_ = std::make_unique<grammar::TokenTrie>(pieces);
}

// Sample first; only when the grammar refuses that token is the whole vocabulary checked (one walk
// of the token trie: grammar_allows for every id, at the cost of the prefixes the grammar admits)
// and the refused ones masked. The usual case costs one check.
int32_t Scheduler::sample_constrained(Active& a, const float* logits) {
  const int32_t first = a.sampler->sample(logits);
  if (grammar_allows(a, first)) return first;
  const int nv = ctx_->n_vocab();
  if (grammar_full_scan_) {
    allowed_.resize(static_cast<size_t>(nv));
    for (int32_t i = 0; i < nv; ++i) allowed_[static_cast<size_t>(i)] = grammar_allows(a, i);
  } else {
    if (!trie_) build_trie();
    if (tool_active(a)) {
      a.tool_matcher->allowed_tokens(*trie_, allowed_);
      for (int32_t t : marker_text_) allowed_[static_cast<size_t>(t)] = 0;  // bytes of a structural code point
    } else {
      a.matcher->allowed_tokens(*trie_, allowed_);
    }
    for (int32_t t : trie_others_) allowed_[static_cast<size_t>(t)] = grammar_allows(a, t);
  }
  int32_t best = -1;
  for (int32_t i = 0; i < nv; ++i) {
    const bool ok = allowed_[static_cast<size_t>(i)] != 0;
    a.masked[static_cast<size_t>(i)] = ok ? logits[i] : -INFINITY;
    if (ok && (best < 0 || logits[i] > logits[best])) best = i;
  }
  if (best < 0) return -1;  // nothing can follow: the caller ends the answer
  const int32_t t = a.sampler->sample(a.masked.data());
  return grammar_allows(a, t) ? t : best;
}

// The thinking budget (GenParams::thinking_budget): once the think channel holds that many tokens,
// the next ones are the close sequence, taken as if sampled (decoded, counted, parsed and checked
// like any token), so the sequence equals one whose prompt contained them. When the last thinking
// token ended in the middle of a UTF-8 character, up to kUtf8Slack more tokens may complete it
// first (the reasoning text stays whole characters). A tool grammar that holds the think channel
// (tool_choice required / none) must accept the whole sequence, else thinking goes on. Its tokens
// are decoded in the step of the last thinking token (feed_forced), and each still reports the
// model's own log-probability at its position (logprobs: the logits of the row before it).
constexpr int kUtf8Slack = 3;

// The think channel's tokens until a whole tag leaves it, as tok::ChatParser sees the channel:
// <|close|>think<|sep|> (the real close), <|close|>response<|sep|>, <|open|>response|tools|call|
// argument|json ...<|sep|>. The tokens of such a tag do not count; a bare <|open|> / <|close|> (no
// such name, another tag before its <|sep|>, or a header longer than 256 bytes) is thinking text
// and counts, so the budget still ends a think channel the model fills with stray tags.
void Scheduler::track_think(Active& a, int32_t t) {
  if (t == open_id_ || t == close_id_) {
    a.think_tag = t == open_id_ ? "+" : "-";
    a.think_tag_n = a.think_n;
  } else if (t == sep_id_ && !a.think_tag.empty()) {
    const std::string name = a.think_tag.substr(1, a.think_tag.find(' ') == std::string::npos ? std::string::npos
                                                                                               : a.think_tag.find(' ') - 1);
    const bool open = a.think_tag[0] == '+';
    const bool leaves = open ? (name == "response" || name == "tools" || name == "call" || name == "argument" || name == "json")
                             : (name == "think" || name == "response" || name == "message");
    a.think_tag.clear();
    if (leaves) {
      a.in_think = false;
      a.think_n = a.think_tag_n;
      return;
    }
  } else if (!a.think_tag.empty()) {
    if (t >= 0 && t < tok_.n_vocab() && !tok_.is_special(t)) a.think_tag += tok_.token_to_piece(t);
    else a.think_tag.clear();
    if (a.think_tag.size() > 257) a.think_tag.clear();
  }
  ++a.think_n;
  if (t >= 0 && t < tok_.n_vocab() && !tok_.is_special(t)) {
    for (unsigned char c : tok_.token_to_piece(t)) {  // where the text's last UTF-8 character stands
      if ((c & 0xC0) == 0x80) a.think_utf8 = std::max(0, a.think_utf8 - 1);
      else a.think_utf8 = c >= 0xF0 ? 3 : c >= 0xE0 ? 2 : c >= 0xC0 ? 1 : 0;
    }
  }
}

bool Scheduler::close_due(const Active& a) const {
  if (a.finish_i < a.finish_q.size()) return false;  // a forced completion writes the close itself
  const int budget = a.think_budget;
  if (!a.in_think || budget < 0 || a.think_n < budget || think_close_.empty()) return false;
  if (a.think_utf8 > 0 && a.think_n < budget + kUtf8Slack) return false;
  if (tool_active(a)) {
    std::string bytes;
    for (int32_t c : think_close_)
      bytes += c == open_id_ ? kToolOpen : c == close_id_ ? kToolClose : c == sep_id_ ? kToolSep : tok_.token_to_piece(c);
    if (!a.tool_matcher->accepts_bytes(bytes)) return false;
  }
  return true;
}

bool Scheduler::begin_close(Active& a) {
  if (a.forced_next >= 0) return true;
  if (!close_due(a)) return false;
  a.in_think = false;
  a.forced_next = 0;
  return true;
}

bool Scheduler::forced_token(Active& a, int32_t& t) {
  if (a.finish_i < a.finish_q.size()) {
    t = a.finish_q[a.finish_i++];
    return true;
  }
  if (!begin_close(a)) return false;
  t = think_close_[static_cast<size_t>(a.forced_next)];
  if (static_cast<size_t>(++a.forced_next) == think_close_.size()) a.forced_next = -1;
  return true;
}

// GenParams::tool_must_finish: the token `sampled` (-1: none yet) would leave the grammar's cheapest
// completion (plus the end token) more tokens than max_tokens has left? Then that completion, from
// the state before it, is forced instead (a.finish_q: its text tokenized, the structural code
// points as their special tokens, then the end token). Checked only near the end (the cost of a
// copy of the matcher per token).
bool Scheduler::finish_due(Active& a, int32_t sampled) {
  const GenParams& gp = a.job->params();
  if (!gp.tool_must_finish || !tool_active(a) || a.forced_next >= 0 || a.finish_i < a.finish_q.size()) return false;
  // tokens that may still be generated, including the one chosen now: max_tokens, and the context
  // (on_token ends the answer once the sequence holds n_ctx - 1 positions)
  const int64_t in_ctx = static_cast<int64_t>(n_ctx_) - 1 - static_cast<int64_t>(seqs_[static_cast<size_t>(a.seq)].toks.size());
  const int64_t left = std::min<int64_t>(static_cast<int64_t>(gp.max_tokens) - a.n_gen, in_ctx);
  // far from the end (the cost in bytes bounds the tokens from above): nothing to check
  const uint64_t now = a.tool_matcher->min_cost();
  if (now == UINT64_MAX || static_cast<int64_t>(now) + 1 + 64 < left) return false;
  std::vector<int32_t> q;
  if (sampled >= 0) {  // would the sampled token still leave room for a completion (and the end token)?
    if (tok_.is_eog(sampled) || sampled == model_.hparams().eos_id) return false;
    grammar::Matcher m = *a.tool_matcher;
    const bool st = sampled == open_id_ || sampled == close_id_ || sampled == sep_id_;
    if (!m.advance_bytes(st ? (sampled == open_id_ ? kToolOpen : sampled == close_id_ ? kToolClose : kToolSep)
                            : tok_.token_to_piece(sampled)))
      return false;
    if (m.min_cost() != UINT64_MAX && completion_tokens(m, q) && static_cast<int64_t>(q.size()) <= left - 1) return false;
  }
  if (!completion_tokens(*a.tool_matcher, q)) return false;
  if (sampled < 0 && static_cast<int64_t>(q.size()) < left) return false;
  if (static_cast<int64_t>(q.size()) > left) return false;  // cannot fit after all: sampled as before
  a.finish_q = std::move(q);
  a.finish_i = 0;
  return true;
}

// The tokens of m's cheapest completion: its text tokenized, the structural code points as their
// special tokens, then the end token. False when there is none (dead, or inside a UTF-8 character).
bool Scheduler::completion_tokens(const grammar::Matcher& m, std::vector<int32_t>& q) const {
  q.clear();
  if (m.min_cost() == UINT64_MAX) return false;
  const std::string text = m.cheapest_completion();
  size_t b = 0;
  for (size_t i = 0; i <= text.size(); ++i) {
    const bool mark = i + 3 <= text.size() && text.compare(i, 2, "\xEE\x80") == 0 &&
                      static_cast<unsigned char>(text[i + 2]) >= 0x80 && static_cast<unsigned char>(text[i + 2]) <= 0x82;
    if (!mark && i < text.size()) continue;
    if (i > b) {
      const std::vector<int32_t> part = tok_.encode(text.substr(b, i - b), false);
      q.insert(q.end(), part.begin(), part.end());
    }
    if (mark) {
      const unsigned char k = static_cast<unsigned char>(text[i + 2]);
      q.push_back(k == 0x80 ? open_id_ : k == 0x81 ? close_id_ : sep_id_);
      i += 2;
      b = i + 1;
    }
  }
  q.push_back(eom_id_ >= 0 && tok_.is_eog(eom_id_) ? eom_id_ : model_.hparams().eos_id);
  return true;
}

// The forced tokens that follow a.pending (at position T) are known before it is decoded (nothing
// between its on_token and the next token's choice changes the request's state), so they join its
// row in the step: the close sequence costs no decode step of its own. Budget 0: they follow the
// prompt's last token (at T) in its chunk the same way. Cut where one token per step would have
// ended the request by length (max_tokens, the context): the cache then holds what one token per
// step left in it, and a request never holds more positions than n_ctx allows. (Another end inside
// the close, a stop string, leaves the rest of the chunk in the cache; SeqRec::toks lists it.)
void Scheduler::feed_forced(Active& a, size_t T) {
  a.ahead.clear();
  if (!begin_close(a)) return;
  const GenParams& gp = a.job->params();
  size_t n = think_close_.size() - static_cast<size_t>(a.forced_next);
  // ahead[i] is generated token number n_gen + i + 1, and on_token ends the request at max_tokens,
  // or once the cache (which then holds all T + 1 + n rows) reaches n_ctx - 1 positions
  n = std::min(n, static_cast<size_t>(std::max(0, gp.max_tokens - a.n_gen - 1)));
  n = std::min(n, static_cast<size_t>(std::max<int64_t>(0, static_cast<int64_t>(n_ctx_) - static_cast<int64_t>(T) - 3)));
  a.ahead.assign(think_close_.begin() + a.forced_next, think_close_.begin() + a.forced_next + static_cast<std::ptrdiff_t>(n));
}

// Log-softmax of the raw logits for the sampled token `t`, and the k most likely tokens.
static TokenLogprob token_logprob(const float* lg, int n_vocab, int32_t t, int k) {
  float mx = -INFINITY;
  for (int i = 0; i < n_vocab; ++i) mx = std::max(mx, lg[i]);
  double sum = 0;
  for (int i = 0; i < n_vocab; ++i) sum += std::exp(static_cast<double>(lg[i]) - mx);
  const double lse = mx + std::log(sum);
  TokenLogprob r;
  r.id = t;
  r.logprob = static_cast<float>(lg[t] - lse);
  k = std::min(k, n_vocab);
  r.top.reserve(static_cast<size_t>(k));
  for (int i = 0; i < n_vocab && k > 0; ++i) {  // insertion into the k best (ties: the lower id first)
    if (static_cast<int>(r.top.size()) == k && lg[i] <= r.top.back().second) continue;
    auto it = r.top.begin();
    while (it != r.top.end() && it->second >= lg[i]) ++it;
    r.top.insert(it, {i, lg[i]});
    if (static_cast<int>(r.top.size()) > k) r.top.pop_back();
  }
  for (auto& p : r.top) p.second = static_cast<float>(p.second - lse);
  return r;
}

void Scheduler::on_token(Active& a, int32_t t, const float* logits) {
  ++a.n_gen;
  if (a.n_gen == 1) {
    a.t_first = Clock::now();
    std::lock_guard<std::mutex> lk(a.job->mu_);
    a.job->result_.ttft_s = std::chrono::duration<double>(a.t_first - a.job->t_submit_).count();
  }
  if (a.in_think) track_think(a, t);
  const GenParams& gp = a.job->params();
  if (a.tool_matcher && !a.constrained) {
    if (a.tool_on) {
      if (t < 0) return finish(a, FinishReason::Stop);  // the tool grammar allows nothing more
      if (t == open_id_ || t == close_id_ || t == sep_id_)
        a.tool_matcher->advance_bytes(t == open_id_ ? kToolOpen : t == close_id_ ? kToolClose : kToolSep);
      else if (t < tok_.n_vocab() && !tok_.is_special(t))
        a.tool_matcher->advance_bytes(tok_.token_to_piece(t));
    } else if (t >= 0 && t < tok_.n_vocab()) {  // auto: watch for the tools section
      a.tool_tail += tok_.token_to_piece(t);
      const std::string& trig = gp.tool_trigger;
      if (a.tool_tail.size() >= trig.size() && a.tool_tail.compare(a.tool_tail.size() - trig.size(), trig.size(), trig) == 0)
        a.tool_on = true;
      if (a.tool_tail.size() > 64) a.tool_tail.erase(0, a.tool_tail.size() - 32);
    }
  }
  if (a.matcher) {
    // no token can continue the sentence, which is not complete (the vocabulary cannot spell what the
    // grammar needs, or the matcher's limits on an ambiguous grammar): not a "stop", the answer is cut
    if (t < 0) return finish(a, FinishReason::GrammarDeadEnd);
    if (a.constrained) {
      // the answer ends with the grammar's sentence: an end token, <|close|> in chat
      if (tok_.is_eog(t) || t == model_.hparams().eos_id || (gp.chat && t == close_id_)) return finish(a, FinishReason::Stop);
      a.matcher->advance_bytes(tok_.token_to_piece(t));
    } else if (t >= 0 && t < tok_.n_vocab()) {  // chat, thinking: watch for the response channel
      a.raw_tail += tok_.token_to_piece(t);
      static const std::string kResponse = "<|open|>response<|sep|>";
      if (a.raw_tail.size() >= kResponse.size() &&
          a.raw_tail.compare(a.raw_tail.size() - kResponse.size(), kResponse.size(), kResponse) == 0)
        a.constrained = true;
      if (a.raw_tail.size() > 64) a.raw_tail.erase(0, a.raw_tail.size() - 32);
    }
  }
  if (!gp.ignore_eos && (tok_.is_eog(t) || t == model_.hparams().eos_id)) return finish(a, FinishReason::Stop);
  if (gp.logprobs >= 0) {
    a.lp_pending.push_back(token_logprob(logits, ctx_->n_vocab(), t, gp.logprobs));
    if (t < tok_.n_vocab()) a.lp_pending.back().piece = tok_.token_to_piece(t);
  }
  if (t >= 0 && t < tok_.n_vocab() && !(gp.chat && drop_special_[static_cast<size_t>(t)])) a.hold += a.detok->push(t);
  const auto& stops = gp.stop;
  if (!stops.empty()) {
    size_t cut = std::string::npos;
    for (const auto& s : stops) {
      const size_t at = a.hold.find(s);
      if (at < cut) cut = at, a.stop_hit = s;
    }
    if (cut != std::string::npos) {
      a.hold.resize(cut);
      emit(a, a.hold);
      a.hold.clear();
      a.detok->reset();
      return finish(a, FinishReason::Stop);
    }
    size_t keep = 0;  // longest suffix of hold that is a proper prefix of a stop string
    for (const auto& s : stops)
      for (size_t k = std::min(s.size() - 1, a.hold.size()); k > keep; --k)
        if (a.hold.compare(a.hold.size() - k, k, s, 0, k) == 0) { keep = k; break; }
    emit(a, a.hold.substr(0, a.hold.size() - keep));
    a.hold.erase(0, a.hold.size() - keep);
  } else {
    emit(a, a.hold);
    a.hold.clear();
  }
  if (a.parser && a.parser->message().done) return finish(a, FinishReason::Stop);
  if (a.constrained && !a.matcher->can_continue()) return finish(a, FinishReason::Stop);  // the sentence is complete
  if (tool_active(a) && !a.tool_matcher->can_continue()) return finish(a, FinishReason::Stop);
  if (a.n_gen >= gp.max_tokens) return finish(a, FinishReason::Length);
  if (static_cast<int>(seqs_[static_cast<size_t>(a.seq)].toks.size()) + 1 >= n_ctx_) return finish(a, FinishReason::Length);
  a.pending = t;
}

void Scheduler::finish(Active& a, FinishReason reason, int status, const std::string& err) {
  if (a.done) return;
  a.done = true;
  const bool ok = is_answer(reason);
  if (ok) {
    std::string rest = a.hold + (a.detok ? a.detok->flush() : std::string());
    a.hold.clear();
    emit(a, rest);
    if (a.parser) {
      tok::ChatDelta d = a.parser->finish();
      JobOutput o;
      o.reasoning = std::move(d.reasoning);
      o.content = std::move(d.content);
      o.tool_deltas = std::move(d.tool_call_deltas);  // a call cut off: its arguments' closing brackets
      a.job->push(std::move(o));
    }
  }
  Job::Result r;
  r.finish_reason = reason;
  if (reason == FinishReason::Stop && a.parser && !a.parser->message().tool_calls.empty())
    r.finish_reason = FinishReason::ToolCalls;
  r.http_status = status;
  r.error = err;
  r.stop_string = a.stop_hit;
  r.n_prompt = static_cast<int>(a.job->prompt().size());
  {
    std::lock_guard<std::mutex> lk(a.job->mu_);
    r.n_cached = a.job->result_.n_cached;
  }
  r.n_generated = a.n_gen;
  r.n_thinking = a.think_n;
  if (const PromptImages* im = a.job->params().images.get()) {
    r.n_images = static_cast<int>(im->images.size());
    r.n_image_tokens = static_cast<int>(im->n_rows);
    r.vision_s = a.vision_s;
    r.n_images_cached = a.vision_cached;
  }
  if (a.tower) {  // ended before the tower's rows were taken: not run if it has not started
    a.tower->cancel();
    a.tower.reset();
  }
  r.spec_drafted = a.spec_drafted;
  r.spec_accepted = a.spec_accepted;
  r.spec_steps = a.spec_steps;
  r.spec_paused = a.spec_paused;
  if (a.n_gen > 0) {
    r.prefill_s = std::chrono::duration<double>(a.t_first - a.t_admit).count();
    r.gen_s = std::chrono::duration<double>(Clock::now() - a.t_first).count();
  } else if (a.seq >= 0) {  // ended while reading its prompt (cancelled, timed out): the prefill so far
    r.prefill_s = std::chrono::duration<double>(Clock::now() - a.t_admit).count();
  }
  if (ok && a.seq >= 0 && a.n_gen > 0)  // end of the generation: the next turn may continue it
    store_save(a, seqs_[static_cast<size_t>(a.seq)].toks.size());
  if (a.seq >= 0) {
    SeqRec& s = seqs_[static_cast<size_t>(a.seq)];
    s.busy = false;
    s.used = ++tick_;
  }
  {
    std::lock_guard<std::mutex> lk(mu_);  // stats first: a client may ask /metrics or /slots right after
    if (a.seq >= 0) {
      --st_.active;
      SlotInfo& si = slot_info_[static_cast<size_t>(a.seq)];
      si.busy = false;
      si.n_cached = static_cast<int>(seqs_[static_cast<size_t>(a.seq)].toks.size());
      si.n_prompt = si.n_prompt_done = si.n_decoded = 0;
    }
    if (reason == FinishReason::Cancelled) ++st_.requests_cancelled;
    else if (reason == FinishReason::Timeout) ++st_.requests_timeout;
    else if (reason == FinishReason::Error) ++st_.requests_failed;
    else ++st_.requests_finished;  // stop, length, tool_calls, grammar_dead_end: an answer
  }
  a.job->finish(r);
}

}  // namespace kimi::server
