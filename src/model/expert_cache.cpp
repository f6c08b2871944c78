// Routed experts streamed from disk (expert_cache.h).
#include "model/expert_cache.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <new>

#include "io/imatrix.h"
#include "util/error.h"
#include "util/file_read.h"
#include "util/progress.h"

namespace kimi {

namespace {

constexpr uint64_t kAlign = 64;               // kernels read the slices with aligned loads
constexpr uint64_t kChunk = uint64_t{2} << 20;  // one pread: at most 2 MiB, split at 2 MiB file offsets

uint64_t align_up(uint64_t v, uint64_t a) { return (v + a - 1) / a * a; }

const WeightView* expert_tensor(const LayerWeights& L, int which) {
  return which == 0 ? &L.ffn_gate_exps : which == 1 ? &L.ffn_up_exps : &L.ffn_down_exps;
}

// gate, up, down offsets inside a slot for layer L, and the slot size
uint64_t slot_layout(const LayerWeights& L, uint64_t off[3]) {
  uint64_t at = 0;
  for (int w = 0; w < 3; ++w) {
    off[w] = at;
    at += align_up(expert_tensor(L, w)->slice_bytes, kAlign);
  }
  return at;
}

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

}  // namespace

ExpertStreamStats ExpertStreamStats::minus(const ExpertStreamStats& o) const {
  ExpertStreamStats d = *this;
  d.lookups -= o.lookups;
  d.hits -= o.hits;
  d.misses -= o.misses;
  d.evictions -= o.evictions;
  d.bytes_read -= o.bytes_read;
  d.bypass_calls -= o.bypass_calls;
  d.wait_s -= o.wait_s;
  d.hot_picks -= o.hot_picks;
  d.host_picks -= o.host_picks;
  d.hot_reranks -= o.hot_reranks;
  d.hot_reloads -= o.hot_reloads;
  d.offload_steps -= o.offload_steps;
  d.offload_declined -= o.offload_declined;
  d.offload_picks -= o.offload_picks;
  d.offload_bytes -= o.offload_bytes;
  d.offload_chunks -= o.offload_chunks;
  d.offload_split_steps -= o.offload_split_steps;
  return d;
}

void ExpertStreamStats::add(const ExpertStreamStats& o) {
  lookups += o.lookups;
  hits += o.hits;
  misses += o.misses;
  evictions += o.evictions;
  bytes_read += o.bytes_read;
  bypass_calls += o.bypass_calls;
  wait_s += o.wait_s;
  hot_picks += o.hot_picks;
  host_picks += o.host_picks;
  hot_reranks += o.hot_reranks;
  hot_reloads += o.hot_reloads;
  offload_steps += o.offload_steps;
  offload_declined += o.offload_declined;
  offload_picks += o.offload_picks;
  offload_bytes += o.offload_bytes;
  offload_chunks += o.offload_chunks;
  offload_split_steps += o.offload_split_steps;
  if (!o.offload_plan.empty()) offload_plan = o.offload_plan, offload_device = o.offload_device;
  if (o.hot_per_layer) hot_per_layer = o.hot_per_layer, hot_device = o.hot_device;
}

std::string ExpertStreamStats::hot_summary() const {
  std::string s = fmt::format("routed expert picks on {} ({} resident experts per layer): {:.1f} % ({} of {})", hot_device,
                              hot_per_layer, 100.0 * hot_share(), hot_picks, hot_picks + host_picks);
  if (hot_reranks)
    s += fmt::format(", re-ranked {} ({} experts re-uploaded)",
                     hot_reranks == 1 ? std::string("once") : fmt::format("{} times", hot_reranks), hot_reloads);
  return s;
}

std::string ExpertStreamStats::summary(double wall_s) const {
  if (!enabled) return "experts: not streamed (read through the file mapping)";
  std::string s = fmt::format(
      "experts streamed from disk ({}, cache {} = {} x {}): {} lookups, hit rate {:.1f} %, {} evictions, {:.2f} GB "
      "read",
      mode == StreamMode::Pread ? "pread" : "madvise", format_bytes(budget_bytes), slots, format_bytes(slot_bytes),
      lookups, 100.0 * hit_rate(), evictions, double(bytes_read) * 1e-9);
  if (wall_s > 0) s += fmt::format(" = {:.0f} MB/s over {:.2f} s", double(bytes_read) * 1e-6 / wall_s, wall_s);
  if (mode == StreamMode::Pread) s += fmt::format(", waited {:.2f} s for reads", wait_s);
  if (bypass_calls) s += fmt::format(", {} layer calls through the mapping (more experts than slots)", bypass_calls);
  return s;
}

// ------------------------------------------------------------------------------------------------
// hot experts (--gpu-experts)

HotExperts::HotExperts(const Model& m, Backend& dev, const std::vector<uint8_t>& on_host, const HotExpertOptions& o,
                       int64_t n_tokens)
    : dev_(dev), model_(m) {
  const HParams& hp = m.hparams();
  const int64_t E = hp.n_expert, k = hp.n_expert_used;
  layers_.resize(hp.n_layer);
  counts_.resize(hp.n_layer);
  std::vector<uint32_t> hot_layers;
  uint64_t expert_bytes = 0;  // one expert's gate + up + down, the largest layer's
  for (uint32_t il = 0; il < hp.n_layer && il < on_host.size(); ++il) {
    if (!on_host[il] || !m.layer(il).ffn_gate_exps) continue;
    check(hp.file_experts() == hp.n_expert, "--gpu-experts: the file holds a shard of the experts ({} of {})",
          hp.file_experts(), hp.n_expert);
    const bool given = il < o.counts.size() && !o.counts[il].empty();
    check(!given || int64_t(o.counts[il].size()) == E,
          "--gpu-experts: the expert counts of layer {} list {} experts, the model has {}", il,
          given ? o.counts[il].size() : 0, E);
    counts_[il] = given ? o.counts[il] : std::vector<double>(size_t(E), 0.0);
    hot_layers.push_back(il);
    const LayerWeights& L = m.layer(il);
    expert_bytes = std::max(expert_bytes, L.ffn_gate_exps.slice_bytes + L.ffn_up_exps.slice_bytes +
                                              L.ffn_down_exps.slice_bytes);
  }
  if (hot_layers.empty() || o.per_layer == 0) return;
  // scratch first (it must fit in any case), then the experts
  dsel_ = dev.alloc(uint64_t(n_tokens * k) * 4, "hot experts routing");
  dw_ = dev.alloc(uint64_t(n_tokens * k) * 4, "hot experts weights");
  int64_t Lw = hp.n_latent ? hp.n_latent : hp.n_embd;
  dacc_ = dev.alloc(uint64_t(n_tokens * Lw) * 4, "hot experts output");
  hsel_.assign(size_t(n_tokens * k), 0);
  hw_.assign(size_t(n_tokens * k), 0.0f);
  int64_t per = o.per_layer;
  if (per < 0) {  // auto: the device memory left free, less 10 % and reserve_bytes, over the hot layers
    const uint64_t cap = dev.memory_capacity(), used = dev.stats().device_bytes;
    const uint64_t keep = cap / 10 + o.reserve_bytes;
    const uint64_t free_bytes = cap > used + keep ? cap - used - keep : 0;
    per = cap == 0 ? E : int64_t(free_bytes / (expert_bytes * hot_layers.size()));
  }
  per_layer_ = std::clamp<int64_t>(per, 0, E);
  if (per_layer_ == 0) return;
  rerank_tokens_ = std::max<int64_t>(o.rerank_tokens, 0);
  grow_per_token_ = o.decay_tokens > 0 ? std::exp2(1.0 / double(o.decay_tokens)) : 1.0;
  next_rerank_ = std::min<int64_t>(64, rerank_tokens_);
  counts_out_ = o.counts_out;
  order_.resize(size_t(E));
  top_.assign(size_t(E), 0);
  free_.resize(size_t(per_layer_));
  static const char* const kWhat[3] = {"hot experts gate", "hot experts up", "hot experts down"};
  for (uint32_t il : hot_layers) {
    const LayerWeights& L = m.layer(il);
    Layer& h = layers_[il];
    for (int64_t e = 0; e < E; ++e) order_[size_t(e)] = int32_t(e);
    const std::vector<double>& c = counts_[il];
    std::stable_sort(order_.begin(), order_.end(), [&](int32_t a, int32_t b) { return c[size_t(a)] > c[size_t(b)]; });
    h.n = per_layer_;
    h.slot.assign(size_t(E), -1);
    h.expert.assign(order_.begin(), order_.begin() + h.n);  // slot i = the i-th most picked
    for (int64_t i = 0; i < h.n; ++i) h.slot[size_t(h.expert[size_t(i)])] = int32_t(i);
    // one device buffer per stack (not a placed weight: re-ranking rewrites its slots), the experts in their
    // GGUF blocks, uploaded slot by slot
    const WeightView* w[3] = {&L.ffn_gate_exps, &L.ffn_up_exps, &L.ffn_down_exps};
    MatView* dst[3] = {&h.mats.gate, &h.mats.up, &h.mats.down};
    uint64_t* sl[3] = {&h.mats.gate_slice, &h.mats.up_slice, &h.mats.down_slice};
    for (int j = 0; j < 3; ++j) {
      const uint64_t sb = w[j]->slice_bytes;
      stacks_.push_back(dev.alloc(sb * uint64_t(h.n), kWhat[j]));
      auto* base = stacks_.back()->as<uint8_t>();
      for (int64_t i = 0; i < h.n; ++i) dev.upload(base + sb * uint64_t(i), w[j]->slice(h.expert[size_t(i)]).data, sb);
      *dst[j] = w[j]->mat;
      dst[j]->packed = nullptr;
      dst[j]->data = base;
      *sl[j] = sb;
      bytes_ += sb * uint64_t(h.n);
    }
  }
}

HotExperts::~HotExperts() {
  if (counts_out_.empty()) return;
  try {
    save_counts(counts_out_);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "kimi: --expert-counts-out: %s\n", e.what());
  }
}

const HotExperts::Layer* HotExperts::layer(uint32_t il) const {
  return il < layers_.size() && layers_[il].n > 0 ? &layers_[il] : nullptr;
}

void HotExperts::split(uint32_t il, int32_t* host_sel, const float* host_weights, int64_t count) {
  const Layer& h = layers_[il];
  std::vector<double>& c = counts_[il];
  check(count <= int64_t(hsel_.size()), "hot experts: {} picks beyond the {} reserved", count, hsel_.size());
  for (int64_t i = 0; i < count; ++i) {
    const int32_t e = host_sel[i];
    const int32_t slot = e >= 0 && size_t(e) < h.slot.size() ? h.slot[size_t(e)] : -1;
    if (e >= 0 && size_t(e) < c.size()) c[size_t(e)] += weight_;
    if (slot >= 0) {
      hsel_[size_t(i)] = slot, hw_[size_t(i)] = host_weights[i];
      host_sel[i] = -1;
      ++hot_picks_;
    } else {
      hsel_[size_t(i)] = -1, hw_[size_t(i)] = 0.0f;  // skipped on the device (its rows are 0, weighted 0)
      if (e >= 0) ++host_picks_;
    }
  }
  dev_.upload(dev_sel(), hsel_.data(), uint64_t(count) * 4);
  dev_.upload(dev_weights(), hw_.data(), uint64_t(count) * 4);
}

void HotExperts::begin_pass(int64_t n) {
  if (per_layer_ > 0 && rerank_tokens_ > 0 && since_ >= next_rerank_) {
    rerank();
    since_ = 0;
    next_rerank_ = std::min(next_rerank_ * 2, rerank_tokens_);
  }
  since_ += n;
  if (grow_per_token_ != 1.0) {
    weight_ *= std::pow(grow_per_token_, double(n));
    if (weight_ > 0x1p200) {  // fold the weight into the counts (same ranking) before it overflows
      for (auto& c : counts_)
        for (double& x : c) x /= weight_;
      weight_ = 1.0;
    }
  }
}

std::vector<double> HotExperts::counts(uint32_t il) const {
  std::vector<double> c = counts_[il];
  for (double& x : c) x /= weight_;
  return c;
}

void HotExperts::rerank() {
  const int64_t E = int64_t(order_.size());
  for (uint32_t il = 0; il < layers_.size(); ++il) {
    Layer& h = layers_[il];
    if (h.n == 0) continue;
    const std::vector<double>& c = counts_[il];
    for (int64_t e = 0; e < E; ++e) order_[size_t(e)] = int32_t(e);
    // more picks first; ties: a resident expert first (no upload for a tie), then the lower id
    std::sort(order_.begin(), order_.end(), [&](int32_t a, int32_t b) {
      if (c[size_t(a)] != c[size_t(b)]) return c[size_t(a)] > c[size_t(b)];
      const bool ra = h.slot[size_t(a)] >= 0, rb = h.slot[size_t(b)] >= 0;
      if (ra != rb) return ra;
      return a < b;
    });
    for (int64_t i = 0; i < h.n; ++i) top_[size_t(order_[size_t(i)])] = 1;
    int64_t n_free = 0;  // slots whose expert left the top n: as many as the top n's experts not resident
    for (int64_t s = 0; s < h.n; ++s)
      if (!top_[size_t(h.expert[size_t(s)])]) free_[size_t(n_free++)] = int32_t(s);
    const LayerWeights& L = model_.layer(il);
    const WeightView* w[3] = {&L.ffn_gate_exps, &L.ffn_up_exps, &L.ffn_down_exps};
    const MatView* st[3] = {&h.mats.gate, &h.mats.up, &h.mats.down};
    int64_t used = 0;
    for (int64_t i = 0; i < h.n; ++i) {
      const int32_t e = order_[size_t(i)];
      top_[size_t(e)] = 0;
      if (h.slot[size_t(e)] >= 0) continue;
      const int32_t s = free_[size_t(used++)];
      h.slot[size_t(h.expert[size_t(s)])] = -1;
      h.slot[size_t(e)] = s;
      h.expert[size_t(s)] = e;
      for (int j = 0; j < 3; ++j) {
        const uint64_t sb = w[j]->slice_bytes;
        dev_.upload(const_cast<uint8_t*>(st[j]->data) + sb * uint64_t(s), w[j]->slice(e).data, sb);
      }
      ++reloads_;
    }
    check(used == n_free, "hot experts: re-ranking of layer {} lost track of its slots", il);
  }
  ++reranks_;
}

void HotExperts::save_counts(const std::string& path) const {
  imatrix::Data d;
  d.datasets.push_back("routed expert picks counted by kimi (--gpu-experts)");
  for (uint32_t il = 0; il < counts_.size(); ++il) {
    if (counts_[il].empty()) continue;
    imatrix::Entry& e = d.entries[fmt::format("blk.{}.ffn_gate_exps.weight", il)];
    e.n_in = 1;
    e.n_mat = int64_t(counts_[il].size());
    e.sum2.assign(counts_[il].size(), 0.0);
    e.count = counts(il);
  }
  d.write_gguf(path);
}

void HotExperts::add_stats(ExpertStreamStats& s) const {
  s.hot_picks += hot_picks_;
  s.host_picks += host_picks_;
  s.hot_reranks += reranks_;
  s.hot_reloads += reloads_;
  s.hot_per_layer = per_layer_;
  s.hot_device = dev_.name();
}

uint64_t ExpertCache::slot_bytes(const Model& m) {
  const HParams& hp = m.hparams();
  uint64_t best = 0, off[3];
  for (uint32_t il = 0; il < hp.n_layer; ++il)
    if (hp.is_moe(il) && m.layer(il).ffn_gate_exps) best = std::max(best, slot_layout(m.layer(il), off));
  return best;
}

uint64_t resolve_stream_budget(const Model& m, const ExpertStreamOptions& o) {
  const HParams& hp = m.hparams();
  const uint64_t slot = ExpertCache::slot_bytes(m);
  if (o.budget_bytes == 0 || slot == 0 || !ReadOnlyFile::supported()) return 0;
  if (o.budget_bytes > 0) return static_cast<uint64_t>(o.budget_bytes);
  uint64_t total = 0, experts = 0;
  for (const auto& t : m.reader().tensors()) total += t.nbytes;
  for (uint32_t il = 0; il < hp.n_layer; ++il)
    if (hp.is_moe(il))
      for (int w = 0; w < 3; ++w)
        if (*expert_tensor(m.layer(il), w)) experts += expert_tensor(m.layer(il), w)->info->nbytes;
  const uint64_t ram = memory_limit_bytes();
  if (ram == 0 || double(total) <= 0.8 * double(ram)) return 0;
  const double room = 0.85 * double(ram) - double(total - experts);
  const uint64_t floor = slot * hp.file_experts();  // one layer's experts (a prefill batch may use all)
  return std::max(floor, room > 0 ? static_cast<uint64_t>(room) / slot * slot : 0);
}

ExpertCache::ExpertCache(const Model& m, const std::vector<uint8_t>& on_host, uint64_t budget_bytes,
                         const ExpertStreamOptions& o)
    : E_(m.hparams().file_experts()), n_layer_(m.hparams().n_layer), mode_(o.mode) {
  const HParams& hp = m.hparams();
  const gguf::Reader& rd = m.reader();
  slot_bytes_ = slot_bytes(m);
  check(slot_bytes_ > 0, "expert streaming: '{}' has no routed experts", m.path());
  const int64_t slots = static_cast<int64_t>(budget_bytes / slot_bytes_);
  check(slots >= hp.n_expert_used,
        "--mem-budget {}: holds {} experts of {} each, fewer than the {} one token uses (at least {})",
        format_bytes(budget_bytes), slots, format_bytes(slot_bytes_), hp.n_expert_used,
        format_bytes(slot_bytes_ * hp.n_expert_used));
  for (size_t i = 0; i < rd.n_files(); ++i) files_.push_back(std::make_unique<ReadOnlyFile>(rd.file_path(i)));
  ranges_.resize(static_cast<size_t>(n_layer_) * static_cast<size_t>(E_) * 3);
  layer_off_.assign(static_cast<size_t>(n_layer_) * 3, 0);
  for (uint32_t il = 0; il < n_layer_; ++il) {
    if (!hp.is_moe(il) || il >= on_host.size() || !on_host[il]) continue;
    const LayerWeights& L = m.layer(il);
    slot_layout(L, &layer_off_[static_cast<size_t>(il) * 3]);
    for (int w = 0; w < 3; ++w) {
      const WeightView& t = *expert_tensor(L, w);
      const MappedFile* mf = rd.mapped_file(t.info->file_index);
      check(mf != nullptr, "expert streaming: '{}' is not a file", m.path());
      for (int64_t e = 0; e < E_; ++e) {
        Range& r = ranges_[(static_cast<size_t>(il) * static_cast<size_t>(E_) + static_cast<size_t>(e)) * 3 +
                           static_cast<size_t>(w)];
        r.file = t.info->file_index;
        r.mapped = t.info->data + t.slice_bytes * static_cast<uint64_t>(e);
        r.off = static_cast<uint64_t>(r.mapped - mf->data());
        r.bytes = t.slice_bytes;
      }
    }
  }
  // the always-read weights (everything but the streamed experts) are read ahead now, in large
  // requests the kernel can issue together: touched first by the forward pass, page fault after
  // page fault, a cold start reads them one request at a time (4x slower here)
  std::vector<const gguf::TensorInfo*> streamed;
  for (uint32_t il = 0; il < n_layer_; ++il)
    if (hp.is_moe(il) && il < on_host.size() && on_host[il])
      for (int w = 0; w < 3; ++w) streamed.push_back(expert_tensor(m.layer(il), w)->info);
  for (const auto& t : rd.tensors())
    if (std::find(streamed.begin(), streamed.end(), &t) == streamed.end()) {
      const MappedFile* mf = rd.mapped_file(t.file_index);
      if (mf) files_[t.file_index]->will_need(static_cast<uint64_t>(t.data - mf->data()), t.nbytes);
    }
  where_.assign(static_cast<size_t>(n_layer_) * static_cast<size_t>(E_), -1);
  slot_key_.assign(static_cast<size_t>(slots), -1);
  slot_used_.assign(static_cast<size_t>(slots), 0);
  slot_call_.assign(static_cast<size_t>(slots), 0);
  seen_.assign(static_cast<size_t>(E_), 0);
  ptrs_.assign(static_cast<size_t>(E_) * 3, nullptr);
  if (mode_ == StreamMode::Pread) {
    // address space now, memory as the slots fill
    buf_ = static_cast<uint8_t*>(::operator new(static_cast<size_t>(slots) * slot_bytes_, std::align_val_t(4096)));
    const int nt = std::clamp(o.io_threads, 1, 256);
    for (int i = 0; i < nt; ++i) threads_.emplace_back([this] { io_worker(); });
  }
  stats_.enabled = true;
  stats_.mode = mode_;
  stats_.slots = slots;
  stats_.slot_bytes = slot_bytes_;
  stats_.budget_bytes = static_cast<uint64_t>(slots) * slot_bytes_;
}

ExpertCache::~ExpertCache() {
  {
    std::lock_guard<std::mutex> lk(mu_);
    stop_ = true;
  }
  cv_work_.notify_all();
  for (auto& t : threads_) t.join();
  if (buf_) ::operator delete(buf_, std::align_val_t(4096));
}

void ExpertCache::io_worker() {
  for (;;) {
    Job j{};
    {
      std::unique_lock<std::mutex> lk(mu_);
      cv_work_.wait(lk, [&] { return stop_ || !jobs_.empty(); });
      if (stop_) return;
      j = jobs_.front();
      jobs_.pop_front();
    }
    std::string err;
    try {
      j.f->read_at(j.off, j.bytes, j.dst);
      j.f->drop_cache(j.off, j.bytes);  // the copy is ours now: the page cache may forget it
    } catch (const Error& e) {
      err = e.what();
    }
    std::lock_guard<std::mutex> lk(mu_);
    if (!err.empty() && error_.empty()) error_ = err;
    if (--pending_ == 0) cv_done_.notify_all();
  }
}

void ExpertCache::release(int64_t key) {
  where_[static_cast<size_t>(key)] = -1;
  ++stats_.evictions;
  if (mode_ != StreamMode::Madvise) return;  // pread: the slot's memory is simply overwritten
  const uint32_t il = static_cast<uint32_t>(key / E_);
  for (int w = 0; w < 3; ++w) {
    const Range& r = range(il, key % E_, w);
    advise_release(r.mapped, static_cast<size_t>(r.bytes));
    files_[r.file]->drop_cache(r.off, r.bytes);
  }
}

bool ExpertCache::request(uint32_t il, const int32_t* sel, int64_t count) {
  ++tick_;
  distinct_.clear();
  for (int64_t i = 0; i < count; ++i) {
    const int32_t e = sel[i];
    if (e < 0 || e >= E_ || seen_[static_cast<size_t>(e)] == tick_) continue;
    seen_[static_cast<size_t>(e)] = tick_;
    distinct_.push_back(e);
  }
  const int64_t slots = static_cast<int64_t>(slot_key_.size());
  if (static_cast<int64_t>(distinct_.size()) > slots) {
    ++stats_.bypass_calls;
    return false;
  }
  stats_.lookups += distinct_.size();
  for (int32_t e : distinct_) {  // this call's hits must not be evicted by its misses
    const int32_t s = where_[static_cast<size_t>(il) * static_cast<size_t>(E_) + static_cast<size_t>(e)];
    if (s >= 0) slot_call_[static_cast<size_t>(s)] = tick_;
  }
  bool queued = false;
  for (int32_t e : distinct_) {  // in selection order: each use stamps its slot
    const int64_t key = static_cast<int64_t>(il) * E_ + e;
    if (const int32_t s = where_[static_cast<size_t>(key)]; s >= 0) {
      slot_used_[static_cast<size_t>(s)] = ++clock_;
      ++stats_.hits;
      continue;
    }
    // the least recently used slot this call does not use (free slots: stamp 0)
    size_t v = slot_used_.size();
    for (size_t s = 0; s < slot_used_.size(); ++s)
      if (slot_call_[s] != tick_ && (v == slot_used_.size() || slot_used_[s] < slot_used_[v])) v = s;
    if (slot_key_[v] >= 0) release(slot_key_[v]);
    slot_key_[v] = key;
    slot_call_[v] = tick_;
    slot_used_[v] = ++clock_;
    where_[static_cast<size_t>(key)] = static_cast<int32_t>(v);
    ++stats_.misses;
    for (int w = 0; w < 3; ++w) {
      const Range& r = range(il, e, w);
      stats_.bytes_read += r.bytes;
      if (mode_ == StreamMode::Madvise) {
        advise_willneed(r.mapped, static_cast<size_t>(r.bytes));
        continue;
      }
      uint8_t* dst = buf_ + v * slot_bytes_ + layer_off_[static_cast<size_t>(il) * 3 + static_cast<size_t>(w)];
      std::lock_guard<std::mutex> lk(mu_);
      for (uint64_t at = r.off, end = r.off + r.bytes; at < end;) {
        const uint64_t next = std::min(end, (at / kChunk + 1) * kChunk);
        jobs_.push_back({files_[r.file].get(), at, next - at, dst + (at - r.off)});
        ++pending_;
        at = next;
      }
      queued = true;
    }
  }
  if (queued) cv_work_.notify_all();
  for (int32_t e : distinct_) {
    const int32_t s = where_[static_cast<size_t>(il) * static_cast<size_t>(E_) + static_cast<size_t>(e)];
    for (int w = 0; w < 3; ++w)
      ptrs_[static_cast<size_t>(e) * 3 + static_cast<size_t>(w)] =
          mode_ == StreamMode::Madvise
              ? range(il, e, w).mapped
              : buf_ + static_cast<uint64_t>(s) * slot_bytes_ + layer_off_[static_cast<size_t>(il) * 3 + static_cast<size_t>(w)];
  }
  return true;
}

const uint8_t* const* ExpertCache::wait() {
  if (mode_ == StreamMode::Pread) {
    const auto t0 = std::chrono::steady_clock::now();
    std::unique_lock<std::mutex> lk(mu_);
    cv_done_.wait(lk, [&] { return pending_ == 0; });
    stats_.wait_s += seconds_since(t0);
    if (!error_.empty()) {
      const std::string e = error_;
      error_.clear();
      std::fill(where_.begin(), where_.end(), -1);  // which slots hold what they should is unknown
      std::fill(slot_key_.begin(), slot_key_.end(), -1);
      std::fill(slot_used_.begin(), slot_used_.end(), 0);
      std::fill(slot_call_.begin(), slot_call_.end(), 0);
      fail("expert streaming: {}", e);
    }
  }
  return ptrs_.data();
}

}  // namespace kimi
