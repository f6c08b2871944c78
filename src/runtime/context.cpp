// kimi::Context: sequences (lengths, KDA snapshot bookkeeping), batch validation and
// micro-batching over the model's forward pass (model/forward.h).
#include "runtime/context.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <thread>

#include <unistd.h>

#include "backend/cpu/cpu_backend.h"
#include "backend/cpu/dispatch.h"
#include "backend/cpu/matmul.h"
#include "backend/cpu/matmul_amx.h"
#include "model/forward.h"
#include "util/error.h"

namespace kimi {

static int resolve_threads(int n) {
  check(n >= 0 && n <= 1024, "context: thread count must be in 0..1024 (0 = all cores; got {})", n);
  if (n > 0) return n;
  unsigned h = std::thread::hardware_concurrency();
  return h ? static_cast<int>(h) : 1;
}

struct Context::Impl {
  const Model& model;
  const HParams& hp;
  ContextOptions opts;
  ThreadPool pool;
  Precision prec;
  bool cache_f16 = true;
  int top_k = 0;  // effective (0 = indexer off)
  int n_threads = 1;
  int64_t N = 0;  // micro-batch capacity
  std::unique_ptr<CpuBackend> cpu;  // device 0
  Placement placement;
  std::unique_ptr<Forward> fwd;
  std::string fit_note;  // how the default placement was fitted to the accelerator (memory_summary)

  struct Snap {  // KDA states saved (in every backend's store, slot `slot`) at length `pos`
    int32_t pos = 0;
    int32_t slot = 0;
  };
  struct Seq {
    int32_t len = 0;
    std::vector<Snap> snaps;  // ascending pos (all <= len), at most opts.n_snapshots_max
  };
  std::vector<Seq> seqs;
  std::vector<float> logits;        // [n_wanted][V] (grows to the largest batch)
  std::vector<int32_t> logit_row;   // per entry of the last batch, -1 = none
  std::vector<int32_t> next_pos;    // decode() validation scratch [n_seq_max]
  // hidden-state taps (set_tap_layers): the forward pass writes a micro-batch tap-major into
  // tap_mb; decode() gathers them per entry into tap_rows [entry][layer][n_embd]
  std::vector<int> tap_layers;
  std::vector<float> tap_mb, tap_rows;
  std::vector<BatchEntry> tap_ent;  // the entries of tap_rows
  int64_t tap_n = 0;                // entries in tap_rows (the last batch)

  Impl(const Model& m, const ContextOptions& o);
};

Context::Impl::Impl(const Model& m, const ContextOptions& o)
    : model(m), hp(m.hparams()), opts(o), pool(resolve_threads(o.n_threads), o.cpus) {
  check(opts.n_seq_max >= 1, "context: n_seq_max must be >= 1 (got {})", opts.n_seq_max);
  check(opts.n_ctx_max >= 1, "context: n_ctx_max must be >= 1 (got {})", opts.n_ctx_max);
  check(opts.n_batch_max >= 1, "context: n_batch_max must be >= 1 (got {})", opts.n_batch_max);
  check(opts.n_snapshots_max >= 1, "context: n_snapshots_max must be >= 1 (got {})", opts.n_snapshots_max);
  check(opts.attn_top_k >= -1, "context: attn_top_k must be -1 (file), 0 (off) or > 0 (got {})", opts.attn_top_k);
  prec = opts.precision;
  cache_f16 = prec == Precision::Fast && opts.cache_type == CacheType::F16;
  n_threads = pool.size();
  if (!hp.has_indexer || opts.attn_top_k == 0)
    top_k = 0;
  else
    top_k = opts.attn_top_k > 0 ? opts.attn_top_k : static_cast<int>(hp.idx_top_k);
  N = opts.n_batch_max;
  const int64_t nctx = opts.n_ctx_max, nseq = opts.n_seq_max;
  {  // refuse a context whose caches cannot fit in memory (a clear error instead of a swap storm / OOM kill)
    const double cache_bytes = double(hp.n_mla_layers()) * double(nseq) * double(nctx) *
                               double(hp.mla_row() + (top_k > 0 ? hp.idx_dim : 0)) * double(cache_f16 ? 2 : 4);
    const long pages = ::sysconf(_SC_PHYS_PAGES), page = ::sysconf(_SC_PAGESIZE);
    const double phys = pages > 0 && page > 0 ? double(pages) * double(page) : 0.0;
    check(phys == 0.0 || cache_bytes <= 0.75 * phys,
          "context: {} sequence(s) x {} positions need {:.1f} GiB of attention cache, more than 3/4 of this "
          "machine's {:.1f} GiB of memory; use a smaller context",
          nseq, nctx, cache_bytes / 1073741824.0, phys / 1073741824.0);
  }
  cpu = std::make_unique<CpuBackend>(pool, prec);
  std::vector<Backend*> backends{cpu.get()};
  std::vector<std::string> names{cpu->name()};
  for (Backend* b : opts.extra_backends) {
    check(b != nullptr, "context: extra backend {} is null", backends.size());
    backends.push_back(b);
    names.push_back(b->name());
  }
  {
    std::vector<std::string> tensor_names;
    for (const auto& t : m.reader().tensors()) tensor_names.push_back(t.name);
    PlacementRules rules = opts.placement;
    if (rules.auto_fit && backends.size() > 1) {  // default placement: what fits the accelerator
      std::vector<TensorBytes> tb;
      for (const auto& t : m.reader().tensors()) tb.push_back({t.name, t.nbytes});
      const double cache_bytes = double(hp.n_mla_layers()) * double(nseq) * double(nctx) *
                                 double(hp.mla_row() + (top_k > 0 ? hp.idx_dim : 0)) * double(cache_f16 ? 2 : 4);
      const uint64_t reserve = static_cast<uint64_t>(cache_bytes * 1.25) + (uint64_t{512} << 20);
      rules = fit_to_memory(rules, names, tb, hp.n_layer, backends[1]->memory_capacity(), reserve, &fit_note);
    }
    placement = resolve_placement(rules, names, tensor_names, hp.n_layer);
  }
  ForwardOptions fo;
  fo.n_seq = opts.n_seq_max;
  fo.n_ctx = opts.n_ctx_max;
  fo.n_batch = opts.n_batch_max;
  fo.top_k = top_k;
  fo.attn = opts.attn;
  fo.cache_f16 = cache_f16;
  fo.index_i8 = opts.indexer_int8 && prec == Precision::Fast;
  fo.n_snapshots = opts.n_snapshots_max;
  fo.coll = opts.collective;
  fo.split = opts.split_mode;
  fo.stream = opts.stream;
  fwd = std::make_unique<Forward>(m, backends, placement, fo);
  seqs.resize(static_cast<size_t>(nseq));
  if (fwd->is_worker()) {  // rank > 0: run rank 0's calls until it closes its context
    fwd->serve_worker();
    fwd.reset();
    opts.collective->worker_finished();
  }
}

// ---------------------------------------------------------------------------------------------

Context::Context(const Model& model, const ContextOptions& opts)
    : model_(model), opts_(opts), impl_(std::make_unique<Impl>(model, opts)) {}
Context::~Context() = default;

ThreadPool& Context::pool() { return impl_->pool; }
const Placement& Context::placement() const { return impl_->placement; }
std::vector<RankTraffic> Context::rank_traffic(bool reset) { return impl_->fwd->traffic(reset); }
ExpertStreamStats Context::expert_stream_stats() const { return impl_->fwd->expert_stream_stats(); }
int Context::n_ranks() const { return opts_.collective ? opts_.collective->size() : 1; }
PhaseTimes Context::phase_times() const { return impl_->fwd->phase_times(); }
void Context::reset_phase_times() { impl_->fwd->reset_phase_times(); }
int Context::effective_top_k() const { return impl_->top_k; }
CacheType Context::cache_type() const { return impl_->cache_f16 ? CacheType::F16 : CacheType::F32; }

void Context::decode(const Batch& batch) {
  Impl& c = *impl_;
  const auto& E = batch.entries;
  const int64_t n = static_cast<int64_t>(E.size());
  check(batch.embd.empty() || batch.embd.size() == E.size(), "decode: {} embedding rows for {} entries",
        batch.embd.size(), E.size());
  // validate everything before touching any state
  std::vector<int32_t>& next = c.next_pos;
  next.resize(c.seqs.size());
  for (size_t s = 0; s < c.seqs.size(); ++s) next[s] = c.seqs[s].len;
  int64_t n_logits = 0;
  for (int64_t i = 0; i < n; ++i) {
    const BatchEntry& b = E[static_cast<size_t>(i)];
    check(b.token >= 0 && static_cast<uint32_t>(b.token) < c.hp.n_vocab,
          "decode: entry {}: token {} out of range (vocab size {})", i, b.token, c.hp.n_vocab);
    check(b.seq_id >= 0 && b.seq_id < opts_.n_seq_max, "decode: entry {}: seq_id {} out of range (n_seq_max {})", i,
          b.seq_id, opts_.n_seq_max);
    check(b.pos == next[static_cast<size_t>(b.seq_id)],
          "decode: entry {}: sequence {} expects position {} next, got {} (positions must be consecutive)", i,
          b.seq_id, next[static_cast<size_t>(b.seq_id)], b.pos);
    check(b.pos < opts_.n_ctx_max, "decode: entry {}: position {} exceeds the context size n_ctx_max = {}", i, b.pos,
          opts_.n_ctx_max);
    ++next[static_cast<size_t>(b.seq_id)];
    if (b.want_logits) ++n_logits;
  }
  const size_t need = static_cast<size_t>(n_logits) * c.hp.n_vocab;
  if (c.logits.size() < need) c.logits.resize(need);
  c.logit_row.assign(E.size(), -1);
  int64_t lr = 0;
  for (int64_t i = 0; i < n; ++i)
    if (E[static_cast<size_t>(i)].want_logits) c.logit_row[static_cast<size_t>(i)] = static_cast<int32_t>(lr++);
  if (!c.tap_layers.empty()) {
    const size_t need_t = static_cast<size_t>(n) * c.tap_layers.size() * c.hp.n_embd;
    if (c.tap_rows.size() < need_t) c.tap_rows.resize(need_t);  // grows to the largest batch
    if (c.tap_ent.size() < E.size()) c.tap_ent.resize(E.size());
    std::copy(E.begin(), E.end(), c.tap_ent.begin());
    c.tap_n = n;
  }
  // micro-batches in order
  int64_t lbase = 0;
  for (int64_t i0 = 0; i0 < n; i0 += c.N) {
    const int64_t m = std::min<int64_t>(c.N, n - i0);
    c.fwd->run(E.data() + i0, m, c.logits.data() + lbase * c.hp.n_vocab,
               batch.embd.empty() ? nullptr : batch.embd.data() + i0);
    if (!c.tap_layers.empty()) {  // [layer][row][d] of the micro-batch -> [entry][layer][d]
      const int64_t nk = static_cast<int64_t>(c.tap_layers.size()), d = c.hp.n_embd;
      for (int64_t t = 0; t < m; ++t)
        for (int64_t k = 0; k < nk; ++k)
          std::copy_n(c.tap_mb.data() + (k * m + t) * d, d, c.tap_rows.data() + ((i0 + t) * nk + k) * d);
    }
    for (int64_t i = i0; i < i0 + m; ++i) {
      ++c.seqs[static_cast<size_t>(E[static_cast<size_t>(i)].seq_id)].len;
      if (E[static_cast<size_t>(i)].want_logits) ++lbase;
    }
  }
}

void Context::set_tap_layers(const std::vector<int>& layers) {
  Impl& c = *impl_;
  std::vector<uint32_t> l;
  for (int v : layers) {
    check(v >= 0 && static_cast<uint32_t>(v) < c.hp.n_layer, "taps: layer {} outside the model's 0..{}", v,
          c.hp.n_layer - 1);
    l.push_back(static_cast<uint32_t>(v));
  }
  c.tap_mb.assign(static_cast<size_t>(c.N) * l.size() * c.hp.n_embd, 0.0f);
  c.fwd->set_taps(l, l.empty() ? nullptr : c.tap_mb.data());
  c.tap_layers = layers;
  c.tap_n = 0;
}

const std::vector<int>& Context::tap_layers() const { return impl_->tap_layers; }
int64_t Context::tap_count() const { return impl_->tap_layers.empty() ? 0 : impl_->tap_n; }
const BatchEntry& Context::tap_entry(size_t i) const {
  check(static_cast<int64_t>(i) < tap_count(), "taps: entry {} out of range ({} entries)", i, tap_count());
  return impl_->tap_ent[i];
}

const float* Context::tap_row(size_t i) const {
  const Impl& c = *impl_;
  check(!c.tap_layers.empty(), "taps: no tap layers set");
  check(static_cast<int64_t>(i) < c.tap_n, "taps: entry {} out of range (last batch had {} entries)", i, c.tap_n);
  return c.tap_rows.data() + i * c.tap_layers.size() * c.hp.n_embd;
}

const float* Context::logits(size_t i) const {
  const Impl& c = *impl_;
  check(i < c.logit_row.size(), "logits: entry {} out of range (last batch had {} entries)", i, c.logit_row.size());
  check(c.logit_row[i] >= 0, "logits: entry {} of the last batch did not request logits", i);
  return c.logits.data() + static_cast<size_t>(c.logit_row[i]) * c.hp.n_vocab;
}

static void check_seq(const Context::Impl& c, int32_t seq, const char* what) {
  check(seq >= 0 && static_cast<size_t>(seq) < c.seqs.size(), "{}: seq_id {} out of range (n_seq_max {})", what, seq,
        c.seqs.size());
}

int32_t Context::seq_len(int32_t seq) const {
  check_seq(*impl_, seq, "seq_len");
  return impl_->seqs[static_cast<size_t>(seq)].len;
}

void Context::seq_clear(int32_t seq) {
  check_seq(*impl_, seq, "seq_clear");
  Impl::Seq& s = impl_->seqs[static_cast<size_t>(seq)];
  s.len = 0;
  impl_->fwd->seq_clear(seq);
  s.snaps.clear();
}

void Context::seq_snapshot(int32_t seq) {
  check_seq(*impl_, seq, "seq_snapshot");
  Impl::Seq& s = impl_->seqs[static_cast<size_t>(seq)];
  Forward& f = *impl_->fwd;
  // every snapshot is <= len, so the new one is the last; one at the same length is replaced
  if (!s.snaps.empty() && s.snaps.back().pos == s.len) {
    f.snapshot_save(seq, s.snaps.back().slot);
    return;
  }
  const size_t cap = static_cast<size_t>(opts_.n_snapshots_max);
  if (s.snaps.size() >= cap) {
    // evict the older snapshot whose removal leaves the smallest gap between its neighbours
    // (the newest one, about to be added at len, is the right neighbour of the last); ties: earlier
    size_t victim = 0;
    int64_t best = -1;
    for (size_t i = 0; i < s.snaps.size(); ++i) {
      const int64_t lo = i == 0 ? 0 : s.snaps[i - 1].pos;
      const int64_t hi = i + 1 < s.snaps.size() ? s.snaps[i + 1].pos : s.len;
      if (best < 0 || hi - lo < best) { best = hi - lo; victim = i; }
    }
    const int32_t slot = s.snaps[victim].slot;  // its store slot is reused
    s.snaps.erase(s.snaps.begin() + static_cast<std::ptrdiff_t>(victim));
    s.snaps.push_back({s.len, slot});
    f.snapshot_save(seq, slot);
    return;
  }
  int32_t slot = 0;  // the lowest free slot
  while (std::any_of(s.snaps.begin(), s.snaps.end(), [&](const Impl::Snap& x) { return x.slot == slot; })) ++slot;
  s.snaps.push_back({s.len, slot});
  f.snapshot_save(seq, slot);
}

int32_t Context::seq_snapshot_pos(int32_t seq) const {
  check_seq(*impl_, seq, "seq_snapshot_pos");
  const Impl::Seq& s = impl_->seqs[static_cast<size_t>(seq)];
  return s.snaps.empty() ? -1 : s.snaps.back().pos;
}

std::vector<int32_t> Context::seq_snapshot_positions(int32_t seq) const {
  check_seq(*impl_, seq, "seq_snapshot_positions");
  std::vector<int32_t> r;
  for (const auto& sn : impl_->seqs[static_cast<size_t>(seq)].snaps) r.push_back(sn.pos);
  return r;
}

bool Context::seq_has_snapshot(int32_t seq, int32_t pos) const {
  check_seq(*impl_, seq, "seq_has_snapshot");
  for (const auto& sn : impl_->seqs[static_cast<size_t>(seq)].snaps)
    if (sn.pos == pos) return true;
  return false;
}

void Context::seq_snapshot_drop(int32_t seq, int32_t pos) {
  check_seq(*impl_, seq, "seq_snapshot_drop");
  auto& v = impl_->seqs[static_cast<size_t>(seq)].snaps;
  for (size_t i = 0; i < v.size(); ++i)
    if (v[i].pos == pos) {
      v.erase(v.begin() + static_cast<std::ptrdiff_t>(i));
      return;
    }
}

static std::string snap_list(const Context::Impl::Seq& s) {
  if (s.snaps.empty()) return "none";
  std::string r;
  for (const auto& sn : s.snaps) r += (r.empty() ? "" : ", ") + std::to_string(sn.pos);
  return r;
}

// the snapshot of s at exactly pos n, or nullptr
static const Context::Impl::Snap* find_snap(const Context::Impl::Seq& s, int32_t n) {
  for (const auto& sn : s.snaps)
    if (sn.pos == n) return &sn;
  return nullptr;
}

static void drop_snaps_after(Context::Impl::Seq& s, int32_t n) {
  while (!s.snaps.empty() && s.snaps.back().pos > n) s.snaps.pop_back();
}

void Context::seq_truncate(int32_t seq, int32_t n_keep) {
  check_seq(*impl_, seq, "seq_truncate");
  Impl::Seq& s = impl_->seqs[static_cast<size_t>(seq)];
  if (n_keep == s.len) return;
  if (n_keep == 0) return seq_clear(seq);
  check(n_keep > 0 && n_keep < s.len, "seq_truncate: n_keep {} out of range 0..{} (sequence {})", n_keep, s.len, seq);
  if (impl_->hp.n_kda_layers() == 0) {  // no recurrent state: any prefix works
    s.len = n_keep;
    drop_snaps_after(s, n_keep);
    return;
  }
  const Impl::Snap* sn = find_snap(s, n_keep);
  check(sn != nullptr,
        "seq_truncate: sequence {} cannot be truncated to {} tokens: the KDA states are recurrent and can only go "
        "back to 0 or to a snapshot (snapshots at: {})",
        seq, n_keep, snap_list(s));
  impl_->fwd->snapshot_restore(seq, sn->slot, seq);
  s.len = n_keep;
  drop_snaps_after(s, n_keep);
}

void Context::seq_copy(int32_t src, int32_t dst) {
  check_seq(*impl_, src, "seq_copy");
  seq_copy(src, dst, impl_->seqs[static_cast<size_t>(src)].len);
}

void Context::seq_copy(int32_t src, int32_t dst, int32_t n) {
  check_seq(*impl_, src, "seq_copy");
  check_seq(*impl_, dst, "seq_copy");
  Impl& c = *impl_;
  const Impl::Seq& a = c.seqs[static_cast<size_t>(src)];
  check(n >= 0 && n <= a.len, "seq_copy: n {} out of range 0..{} (length of source sequence {})", n, a.len, src);
  if (src == dst) return seq_truncate(src, n);
  if (n == 0) return seq_clear(dst);
  const Impl::Snap* sn = nullptr;
  if (n < a.len && c.hp.n_kda_layers() > 0) {
    sn = find_snap(a, n);
    check(sn != nullptr,
          "seq_copy: the first {} positions of sequence {} cannot be copied: the KDA states exist only at 0, its "
          "length {} and its snapshots (at: {})",
          n, src, a.len, snap_list(a));
  }
  Forward& f = *c.fwd;
  f.seq_copy(src, dst, n);  // n cache rows and the current KDA states
  if (sn) f.snapshot_restore(src, sn->slot, dst);
  Impl::Seq& b = c.seqs[static_cast<size_t>(dst)];
  b.len = n;
  b.snaps.clear();
  for (const auto& x : a.snaps)
    if (x.pos <= n) {
      f.snapshot_copy(src, dst, x.slot);
      b.snaps.push_back(x);
    }
}

void Context::seq_fill_synthetic(int32_t seq, int32_t n_tokens, uint64_t seed) {
  check_seq(*impl_, seq, "seq_fill_synthetic");
  Impl& c = *impl_;
  check(n_tokens >= 0 && n_tokens <= opts_.n_ctx_max, "seq_fill_synthetic: {} tokens do not fit n_ctx_max = {}",
        n_tokens, opts_.n_ctx_max);
  c.fwd->fill_synthetic(seq, n_tokens, seed);
  Impl::Seq& s = c.seqs[static_cast<size_t>(seq)];
  s.len = n_tokens;
  s.snaps.clear();
}

// ---- host copies for the prompt cache ----

std::vector<uint64_t> Context::seq_row_parts() const { return impl_->fwd->row_parts(); }

uint64_t Context::seq_row_bytes() const {
  uint64_t b = 0;
  for (uint64_t p : impl_->fwd->row_parts()) b += p;
  return b;
}

uint64_t Context::seq_state_bytes() const { return impl_->fwd->kda_state_bytes(); }

void Context::seq_save_rows(int32_t seq, int32_t from, int32_t to, uint8_t* host) const {
  check_seq(*impl_, seq, "seq_save_rows");
  const Impl::Seq& s = impl_->seqs[static_cast<size_t>(seq)];
  check(from >= 0 && from <= to && to <= s.len, "seq_save_rows: rows {}..{} out of range 0..{} (sequence {})", from,
        to, s.len, seq);
  impl_->fwd->save_rows(seq, from, to, host);
}

void Context::seq_save_state(int32_t seq, int32_t at, uint8_t* host) const {
  check_seq(*impl_, seq, "seq_save_state");
  const Impl::Seq& s = impl_->seqs[static_cast<size_t>(seq)];
  check(at >= 0 && at <= s.len, "seq_save_state: position {} out of range 0..{} (sequence {})", at, s.len, seq);
  if (at == s.len || impl_->hp.n_kda_layers() == 0) return impl_->fwd->save_state(seq, -1, host);
  const Impl::Snap* sn = find_snap(s, at);
  check(sn != nullptr,
        "seq_save_state: sequence {} has no KDA states at position {}: only at its length {} and its snapshots (at: {})",
        seq, at, s.len, snap_list(s));
  impl_->fwd->save_state(seq, sn->slot, host);
}

void Context::seq_load_rows(int32_t seq, int32_t from, int32_t to, const uint8_t* host) {
  check_seq(*impl_, seq, "seq_load_rows");
  check(from >= 0 && from <= to && to <= opts_.n_ctx_max, "seq_load_rows: rows {}..{} out of range 0..{}", from, to,
        opts_.n_ctx_max);
  Impl::Seq& s = impl_->seqs[static_cast<size_t>(seq)];
  s.len = 0;
  s.snaps.clear();
  impl_->fwd->load_rows(seq, from, to, host);
}

void Context::seq_load_state(int32_t seq, int32_t n, const uint8_t* host) {
  check_seq(*impl_, seq, "seq_load_state");
  check(n >= 0 && n <= opts_.n_ctx_max, "seq_load_state: length {} out of range 0..{}", n, opts_.n_ctx_max);
  Impl::Seq& s = impl_->seqs[static_cast<size_t>(seq)];
  impl_->fwd->load_state(seq, host);
  s.len = n;
  s.snaps.clear();
}

std::string Context::state_identity() const {
  const Impl& c = *impl_;
  uint64_t h = 0xcbf29ce484222325ull;  // FNV-1a over everything the saved bytes depend on
  auto mix = [&](const void* p, size_t n) {
    const auto* b = static_cast<const uint8_t*>(p);
    for (size_t i = 0; i < n; ++i) h = (h ^ b[i]) * 0x100000001b3ull;
  };
  auto mix_str = [&](const std::string& x) { mix(x.data(), x.size()); mix("\0", 1); };
  const auto& rd = model_.reader();
  for (const auto& kv : rd.kvs()) {
    mix_str(kv.key);
    mix_str(kv.value.to_string(64));
  }
  for (const auto& t : rd.tensors()) {
    mix_str(fmt::format("{} {} {} {} {}", t.name, static_cast<int>(t.type), t.shape_string(), t.offset, t.nbytes));
    if (t.data && t.nbytes > 0) {  // a sample of the weights: their first and last 4 KiB
      const uint64_t k = std::min<uint64_t>(t.nbytes, 4096);
      mix(t.data, k);
      mix(t.data + (t.nbytes - k), k);
    }
  }
  mix_str(fmt::format("prec {} cache {} i8 {} topk {} attn {} isa {} amx {}{}", c.prec == Precision::Fast ? "fast" : "f32",
                      c.cache_f16 ? "f16" : "f32", opts_.indexer_int8 && c.prec == Precision::Fast ? 1 : 0, c.top_k,
                      opts_.attn == AttnPath::Sparse ? "sparse" : "dense", kern::active_isa(),
                      kern::amx_bf16_usable() ? 1 : 0, kern::amx_int8_usable() ? 1 : 0));
  for (int f = 0; f < kern::kKernelFamilies; ++f) mix_str(kern::kernel_impl(static_cast<kern::KernelFamily>(f)));
  if (!c.placement.single_device()) mix_str(c.placement.summary());
  return fmt::format("{:016x}", h);
}

uint64_t Context::memory_bytes() const {
  const Impl& c = *impl_;
  return c.fwd->cache_bytes() + c.fwd->state_bytes() + c.fwd->work_bytes() + c.logits.size() * 4;
}

std::string Context::memory_summary() const {
  const Impl& c = *impl_;
  const uint64_t cache = c.fwd->cache_bytes(), state = c.fwd->state_bytes();
  std::string s = fmt::format(
      "context: {} seq x {} positions, cache {} ({:.1f} MiB), KDA state {:.1f} MiB, total {:.1f} MiB, "
      "threads {}, attention {} top_k {}, precision {}\n",
      opts_.n_seq_max, opts_.n_ctx_max, c.cache_f16 ? "F16" : "F32", cache / 1048576.0, state / 1048576.0,
      memory_bytes() / 1048576.0, c.n_threads, opts_.attn == AttnPath::Sparse ? "sparse" : "dense",
      c.top_k == 0 ? std::string("off") : std::to_string(c.top_k),
      c.prec == Precision::Fast ? "fast" : "f32");
  if (!c.fit_note.empty()) s += c.fit_note + "\n";
  if (const size_t nq = c.cpu->packed_count() - c.cpu->packed_bf16_count(); nq > 0)
    s += fmt::format("cpu: {} K-quant weights repacked for the SIMD kernels ({:.1f} MiB; KIMI_REPACK=0: off)\n", nq,
                     (c.cpu->packed_bytes() - c.cpu->packed_bf16_bytes()) / 1048576.0);
  if (c.cpu->packed_bf16_count() > 0)
    s += fmt::format("cpu: {} BF16 weights repacked for the AMX / AVX-512 BF16 kernels ({:.1f} MiB; KIMI_REPACK=0: off)\n",
                     c.cpu->packed_bf16_count(), c.cpu->packed_bf16_bytes() / 1048576.0);
  if (!c.placement.single_device()) s += c.placement.summary();
  return s;
}

}  // namespace kimi
