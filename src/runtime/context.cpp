// kimi::Context: caches, sequences, batch validation and the top-level forward pass
// (k3-architecture.md §3.1: ResMix residual attention, layer loop, final mix, lm head).
#include "runtime/context.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <thread>

#include <unistd.h>

#include "backend/cpu/ops.h"
#include "runtime/context_impl.h"
#include "util/error.h"

namespace kimi {

static int resolve_threads(int n) {
  check(n >= 0 && n <= 1024, "context: thread count must be in 0..1024 (0 = all cores; got {})", n);
  if (n > 0) return n;
  unsigned h = std::thread::hardware_concurrency();
  return h ? static_cast<int>(h) : 1;
}

Context::Impl::Impl(const Model& m, const ContextOptions& o)
    : model(m), hp(m.hparams()), opts(o), pool(resolve_threads(o.n_threads)) {
  check(opts.n_seq_max >= 1, "context: n_seq_max must be >= 1 (got {})", opts.n_seq_max);
  check(opts.n_ctx_max >= 1, "context: n_ctx_max must be >= 1 (got {})", opts.n_ctx_max);
  check(opts.n_batch_max >= 1, "context: n_batch_max must be >= 1 (got {})", opts.n_batch_max);
  check(opts.n_snapshots_max >= 1, "context: n_snapshots_max must be >= 1 (got {})", opts.n_snapshots_max);
  check(opts.attn_top_k >= -1, "context: attn_top_k must be -1 (file), 0 (off) or > 0 (got {})", opts.attn_top_k);
  prec = opts.precision;
  cache_f16 = prec == kern::Precision::Fast && opts.cache_type == CacheType::F16;
  n_threads = pool.size();
  if (!hp.has_indexer || opts.attn_top_k == 0)
    top_k = 0;
  else
    top_k = opts.attn_top_k > 0 ? opts.attn_top_k : static_cast<int>(hp.idx_top_k);
  N = opts.n_batch_max;
  {
    std::vector<std::string> names;
    for (const auto& t : m.reader().tensors()) names.push_back(t.name);
    placement = resolve_placement(opts.placement, {"cpu"}, names, hp.n_layer);
  }

  const int64_t d = hp.n_embd, H = hp.n_head, nctx = opts.n_ctx_max, nseq = opts.n_seq_max;
  mla_idx.assign(hp.n_layer, -1);
  kda_idx.assign(hp.n_layer, -1);
  for (uint32_t il = 0; il < hp.n_layer; ++il) {
    if (hp.is_mla[il])
      mla_idx[il] = static_cast<int32_t>(n_mla++);
    else
      kda_idx[il] = static_cast<int32_t>(n_kda++);
  }
  // caches
  const size_t es = elt();
  {  // refuse a context whose caches cannot fit in memory (a clear error instead of a swap storm / OOM kill)
    const double cache_bytes = double(n_mla) * double(nseq) * double(nctx) *
                               double(hp.mla_row() + (top_k > 0 ? hp.idx_dim : 0)) * double(es);
    const long pages = ::sysconf(_SC_PHYS_PAGES), page = ::sysconf(_SC_PAGESIZE);
    const double phys = pages > 0 && page > 0 ? double(pages) * double(page) : 0.0;
    check(phys == 0.0 || cache_bytes <= 0.75 * phys,
          "context: {} sequence(s) x {} positions need {:.1f} GiB of attention cache, more than 3/4 of this "
          "machine's {:.1f} GiB of memory; use a smaller context",
          nseq, nctx, cache_bytes / 1073741824.0, phys / 1073741824.0);
  }
  latent.resize(n_mla);
  idx_keys.resize(n_mla);
  for (uint32_t i = 0; i < n_mla; ++i) {
    latent[i].assign(static_cast<size_t>(nseq) * nctx * hp.mla_row() * es, 0);
    if (top_k > 0) idx_keys[i].assign(static_cast<size_t>(nseq) * nctx * hp.idx_dim * es, 0);
  }
  const int64_t C = hp.kda_channels(), D = hp.kda_head_dim;
  conv_per_layer = n_kda ? 3 * C * (hp.conv_kernel - 1) : 0;
  rec_per_layer = n_kda ? H * D * D : 0;
  seqs.resize(nseq);
  for (auto& s : seqs) {
    s.conv.assign(n_kda * conv_per_layer, 0.0f);
    s.rec.assign(n_kda * rec_per_layer, 0.0f);
  }

  // work buffers
  auto alloc = [](std::vector<float>& v, int64_t n) { v.assign(static_cast<size_t>(n), 0.0f); };
  alloc(P, N * d);
  alloc(h, N * d);
  alloc(y, N * d);
  alloc(out, N * d);
  alloc(ffn_out, N * d);
  n_bank_max = hp.attn_res_block ? (hp.n_layer + hp.attn_res_block - 1) / hp.attn_res_block : 0;
  check(n_bank_max <= 255, "context: {} residual-attention bank entries (block_count / attn_res.block_size) exceed 255", n_bank_max);
  alloc(bank, static_cast<int64_t>(n_bank_max) * N * d);
  alloc(bank_inv, static_cast<int64_t>(n_bank_max) * N);
  if (n_kda) {
    int64_t rank = 0;
    for (uint32_t il = 0; il < hp.n_layer; ++il)
      if (!hp.is_mla[il]) rank = std::max<int64_t>(rank, m.layer(il).ssm_f_a.mat.rows);
    alloc(kq, N * C);
    alloc(kk, N * C);
    alloc(kv, N * C);
    alloc(kfa, N * rank);
    alloc(kg, N * C);
    alloc(kbeta, N * H);
    alloc(kgate, N * C);
    alloc(ko, N * C);
  }
  int64_t ab = 0;
  if (n_mla) {
    const int64_t W = hp.mla_row();
    alloc(mqa, N * hp.q_lora);
    alloc(mq, N * H * hp.n_kq);
    alloc(mkv, N * W);
    alloc(mqcat, N * H * W);
    alloc(mz, N * H * hp.kv_lora);
    alloc(mo, N * H * hp.n_v);
    alloc(mgate, N * H * hp.n_v);
    ab = std::max<int64_t>({hp.n_nope, hp.kv_lora, hp.n_v});
    // one thread: all heads (up to 16) share each block's row conversion; else groups of 8 so
    // a decode token's attention spreads over the threads
    heads_per_item = static_cast<int>(std::min<int64_t>(H, n_threads == 1 ? 16 : 8));
    th_row_stride = std::max<int64_t>(W, hp.idx_dim);
    th_scores_stride = static_cast<int64_t>(heads_per_item) * nctx;
    if (top_k > 0) {
      alloc(iq, N * hp.idx_heads * hp.idx_dim);
      alloc(ik, N * hp.idx_dim);
      alloc(iw, N * hp.idx_heads);
      sel_cap = std::min<int64_t>(top_k, nctx);
      sel_idx.assign(static_cast<size_t>(N * sel_cap), 0);
      alloc(idx_scores, nctx);
      alloc(idx_tmp, nctx);
    }
    sel_n.assign(static_cast<size_t>(N), -1);
  }
  th_ab_stride = N * ab;
  th_row_stride = std::max<int64_t>(th_row_stride, hp.kda_head_dim);
  alloc(th_a, n_threads * th_ab_stride);
  alloc(th_b, n_threads * th_ab_stride);
  alloc(th_row, n_threads * th_row_stride);
  alloc(th_scores, opts.attn == AttnPath::Dense ? n_threads * th_scores_stride : 0);
  th_sel.assign(opts.attn == AttnPath::Dense ? static_cast<size_t>(n_threads) * nctx : 0, 0);
  // FFN
  int64_t fw = 0;
  if (hp.n_dense_lead > 0) fw = hp.n_ff;
  if (hp.n_dense_lead < hp.n_layer) {
    const int64_t E = hp.n_expert, k = hp.n_expert_used, F = hp.n_ff_exp;
    const int64_t Lw = hp.n_latent ? hp.n_latent : d;
    fw = std::max<int64_t>(fw, F * hp.n_expert_shared);
    alloc(rlogits, N * E);
    alloc(rprob, N * E);
    rsel.assign(static_cast<size_t>(N * k), 0);
    alloc(rw, N * k);
    alloc(lat, N * Lw);
    alloc(lacc, N * Lw);
    alloc(ex, N * Lw);
    alloc(eg, N * F);
    alloc(eu, N * F);
    alloc(er, N * Lw);
    ecount.assign(static_cast<size_t>(E), 0);
    eact.assign(static_cast<size_t>(E), 0);
    eoff.assign(static_cast<size_t>(E + 1), 0);
    etok.assign(static_cast<size_t>(N * k), 0);
    alloc(ewt, N * k);
    rscratch.resize(static_cast<size_t>(E));
  }
  alloc(fg, N * fw);
  alloc(fu, N * fw);
  alloc(orows, N * d);
}

void Context::Impl::store_row(uint8_t* dst, const float* src, int64_t n) {
  if (cache_f16)
    kern::f32_to_f16_row(src, reinterpret_cast<uint16_t*>(dst), n);
  else
    std::memcpy(dst, src, static_cast<size_t>(n) * 4);
}

static constexpr uint32_t kMaxBank = 255;

// ResMix (k3-architecture.md §3.1): softmax over [bank..., current] of normalized-vector scores,
// sum of raw vectors. Writes dst[t] for every token.
static void res_mix(Context::Impl& c, const float* cur, const float* w, uint32_t nb, float* dst) {
  const int64_t d = c.hp.n_embd, n = c.n_ub;
  const float eps = c.hp.rms_eps;
  c.par(n, (nb + 1) * d * 4, [&](int64_t t, int) {
    const float* ct = cur + t * d;
    float* out = dst + t * d;
    if (nb == 0) {
      std::memcpy(out, ct, static_cast<size_t>(d) * 4);
      return;
    }
    float s[kMaxBank + 1];
    const double ss = kern::sum_sq(ct, d);
    const float inv_c = 1.0f / std::sqrt(static_cast<float>(ss / static_cast<double>(d)) + eps);
    for (uint32_t k = 0; k < nb; ++k) {
      const float* b = c.bank.data() + (static_cast<int64_t>(k) * c.N + t) * d;
      s[k] = kern::dot_f32(b, w, d) * c.bank_inv[static_cast<size_t>(k) * c.N + t];
    }
    s[nb] = kern::dot_f32(ct, w, d) * inv_c;
    float mx = s[0];
    for (uint32_t k = 1; k <= nb; ++k) mx = std::max(mx, s[k]);
    float sum = 0;
    for (uint32_t k = 0; k <= nb; ++k) {
      s[k] = std::exp(s[k] - mx);
      sum += s[k];
    }
    for (uint32_t k = 0; k <= nb; ++k) s[k] /= sum;
    for (int64_t j = 0; j < d; ++j) out[j] = 0.0f;
    for (uint32_t k = 0; k < nb; ++k)
      kern::axpy_f32(s[k], c.bank.data() + (static_cast<int64_t>(k) * c.N + t) * d, out, d);
    kern::axpy_f32(s[nb], ct, out, d);
  });
}

static void rms_norm_rows(Context::Impl& c, const float* x, const float* w, float* y) {
  const int64_t d = c.hp.n_embd;
  const float eps = c.hp.rms_eps;
  c.par(c.n_ub, d * 3, [&](int64_t t, int) { kern::rms_norm(x + t * d, w, y + t * d, d, eps); });
}

void Context::Impl::run_ubatch(const BatchEntry* e, int64_t n, int64_t logit_base) {
  ub = e;
  n_ub = n;
  const int64_t d = hp.n_embd;
  const uint32_t B = hp.attn_res_block;
  // embeddings
  par(n, d * 2, [&](int64_t t, int) { kern::dequantize_row(model.token_embd().mat, e[t].token, P.data() + t * d); });
  uint32_t nb = 0;
  for (uint32_t il = 0; il < hp.n_layer; ++il) {
    const LayerWeights& L = model.layer(il);
    const float* hin = P.data();
    if (B > 0) {
      res_mix(*this, P.data(), L.attn_res_score.f32, nb, h.data());
      hin = h.data();
    }
    const bool bank_layer = B > 0 && il % B == 0;
    if (bank_layer) {
      float* dst = bank.data() + static_cast<int64_t>(nb) * N * d;
      std::memcpy(dst, P.data(), static_cast<size_t>(n * d) * 4);
      for (int64_t t = 0; t < n; ++t) {
        const double ss = kern::sum_sq(dst + t * d, d);
        bank_inv[static_cast<size_t>(nb) * N + t] =
            1.0f / std::sqrt(static_cast<float>(ss / static_cast<double>(d)) + hp.rms_eps);
      }
      ++nb;
    }
    rms_norm_rows(*this, hin, L.attn_norm.f32, y.data());
    if (hp.is_mla[il])
      mla_layer(*this, il, y.data(), out.data());
    else
      kda_layer(*this, il, y.data(), out.data());
    if (bank_layer)
      std::memcpy(P.data(), out.data(), static_cast<size_t>(n * d) * 4);
    else
      for (int64_t i = 0; i < n * d; ++i) P[i] += out[i];

    hin = P.data();
    if (B > 0) {
      res_mix(*this, P.data(), L.ffn_res_score.f32, nb, h.data());
      hin = h.data();
    }
    rms_norm_rows(*this, hin, L.ffn_norm.f32, y.data());
    ffn_layer(*this, il, y.data(), ffn_out.data());
    for (int64_t i = 0; i < n * d; ++i) P[i] += ffn_out[i];
  }
  // final mix, norm, lm head for the requested rows
  const float* fin = P.data();
  if (B > 0) {
    res_mix(*this, P.data(), model.output_res_score().f32, nb, h.data());
    fin = h.data();
  }
  int64_t nw = 0;
  for (int64_t t = 0; t < n; ++t)
    if (e[t].want_logits) {
      kern::rms_norm(fin + t * d, model.output_norm().f32, orows.data() + nw * d, d, hp.rms_eps);
      ++nw;
    }
  if (nw > 0) {
    const int64_t V = hp.n_vocab;
    kern::matmul(model.output().mat, orows.data(), nw, logits.data() + logit_base * V, pool, prec);
  }
}

// ---------------------------------------------------------------------------------------------

Context::Context(const Model& model, const ContextOptions& opts)
    : model_(model), opts_(opts), impl_(std::make_unique<Impl>(model, opts)) {}
Context::~Context() = default;

ThreadPool& Context::pool() { return impl_->pool; }
int Context::effective_top_k() const { return impl_->top_k; }
CacheType Context::cache_type() const { return impl_->cache_f16 ? CacheType::F16 : CacheType::F32; }

void Context::decode(const Batch& batch) {
  Impl& c = *impl_;
  const auto& E = batch.entries;
  const int64_t n = static_cast<int64_t>(E.size());
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
  // micro-batches in order
  int64_t lbase = 0;
  for (int64_t i0 = 0; i0 < n; i0 += c.N) {
    const int64_t m = std::min<int64_t>(c.N, n - i0);
    c.run_ubatch(E.data() + i0, m, lbase);
    for (int64_t i = i0; i < i0 + m; ++i) {
      ++c.seqs[static_cast<size_t>(E[static_cast<size_t>(i)].seq_id)].len;
      if (E[static_cast<size_t>(i)].want_logits) ++lbase;
    }
  }
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
  SeqState& s = impl_->seqs[static_cast<size_t>(seq)];
  s.len = 0;
  std::fill(s.conv.begin(), s.conv.end(), 0.0f);
  std::fill(s.rec.begin(), s.rec.end(), 0.0f);
  s.snaps.clear();
}

void Context::seq_snapshot(int32_t seq) {
  check_seq(*impl_, seq, "seq_snapshot");
  SeqState& s = impl_->seqs[static_cast<size_t>(seq)];
  // every snapshot is <= len, so the new one is the last; one at the same length is replaced
  if (!s.snaps.empty() && s.snaps.back().pos == s.len) {
    s.snaps.back().conv = s.conv;
    s.snaps.back().rec = s.rec;
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
    SeqState::Snap reuse = std::move(s.snaps[victim]);  // keeps its buffers (no reallocation)
    s.snaps.erase(s.snaps.begin() + static_cast<std::ptrdiff_t>(victim));
    reuse.pos = s.len;
    reuse.conv = s.conv;
    reuse.rec = s.rec;
    s.snaps.push_back(std::move(reuse));
    return;
  }
  s.snaps.push_back({s.len, s.conv, s.rec});
}

int32_t Context::seq_snapshot_pos(int32_t seq) const {
  check_seq(*impl_, seq, "seq_snapshot_pos");
  const SeqState& s = impl_->seqs[static_cast<size_t>(seq)];
  return s.snaps.empty() ? -1 : s.snaps.back().pos;
}

std::vector<int32_t> Context::seq_snapshot_positions(int32_t seq) const {
  check_seq(*impl_, seq, "seq_snapshot_positions");
  std::vector<int32_t> r;
  for (const auto& sn : impl_->seqs[static_cast<size_t>(seq)].snaps) r.push_back(sn.pos);
  return r;
}

static std::string snap_list(const SeqState& s) {
  if (s.snaps.empty()) return "none";
  std::string r;
  for (const auto& sn : s.snaps) r += (r.empty() ? "" : ", ") + std::to_string(sn.pos);
  return r;
}

// the snapshot of s at exactly pos n, or nullptr
static const SeqState::Snap* find_snap(const SeqState& s, int32_t n) {
  for (const auto& sn : s.snaps)
    if (sn.pos == n) return &sn;
  return nullptr;
}

static void drop_snaps_after(SeqState& s, int32_t n) {
  while (!s.snaps.empty() && s.snaps.back().pos > n) s.snaps.pop_back();
}

void Context::seq_truncate(int32_t seq, int32_t n_keep) {
  check_seq(*impl_, seq, "seq_truncate");
  SeqState& s = impl_->seqs[static_cast<size_t>(seq)];
  if (n_keep == s.len) return;
  if (n_keep == 0) return seq_clear(seq);
  check(n_keep > 0 && n_keep < s.len, "seq_truncate: n_keep {} out of range 0..{} (sequence {})", n_keep, s.len, seq);
  if (impl_->n_kda == 0) {  // no recurrent state: any prefix works
    s.len = n_keep;
    drop_snaps_after(s, n_keep);
    return;
  }
  const SeqState::Snap* sn = find_snap(s, n_keep);
  check(sn != nullptr,
        "seq_truncate: sequence {} cannot be truncated to {} tokens: the KDA states are recurrent and can only go "
        "back to 0 or to a snapshot (snapshots at: {})",
        seq, n_keep, snap_list(s));
  s.conv = sn->conv;
  s.rec = sn->rec;
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
  const SeqState& a = c.seqs[static_cast<size_t>(src)];
  check(n >= 0 && n <= a.len, "seq_copy: n {} out of range 0..{} (length of source sequence {})", n, a.len, src);
  if (src == dst) return seq_truncate(src, n);
  if (n == 0) return seq_clear(dst);
  const SeqState::Snap* sn = nullptr;
  if (n < a.len && c.n_kda > 0) {
    sn = find_snap(a, n);
    check(sn != nullptr,
          "seq_copy: the first {} positions of sequence {} cannot be copied: the KDA states exist only at 0, its "
          "length {} and its snapshots (at: {})",
          n, src, a.len, snap_list(a));
  }
  SeqState& b = c.seqs[static_cast<size_t>(dst)];
  b.len = n;
  b.conv = sn ? sn->conv : a.conv;  // (n < len without KDA layers: the states are empty)
  b.rec = sn ? sn->rec : a.rec;
  b.snaps.clear();
  for (const auto& x : a.snaps)
    if (x.pos <= n) b.snaps.push_back(x);
  for (uint32_t mi = 0; mi < c.n_mla; ++mi) {
    std::memcpy(c.latent_row(mi, dst, 0), c.latent_row(mi, src, 0), static_cast<size_t>(n) * c.hp.mla_row() * c.elt());
    if (c.top_k > 0)
      std::memcpy(c.idx_row(mi, dst, 0), c.idx_row(mi, src, 0), static_cast<size_t>(n) * c.hp.idx_dim * c.elt());
  }
}

void Context::seq_fill_synthetic(int32_t seq, int32_t n_tokens, uint64_t seed) {
  check_seq(*impl_, seq, "seq_fill_synthetic");
  Impl& c = *impl_;
  check(n_tokens >= 0 && n_tokens <= opts_.n_ctx_max, "seq_fill_synthetic: {} tokens do not fit n_ctx_max = {}",
        n_tokens, opts_.n_ctx_max);
  uint64_t st = seed * 0x9E3779B97F4A7C15ull + 1;
  auto next = [&]() {  // ~N(0, 1): sum of 4 uniforms, rescaled
    float acc = 0;
    for (int i = 0; i < 4; ++i) {
      st ^= st << 13;
      st ^= st >> 7;
      st ^= st << 17;
      acc += static_cast<float>(st >> 40) * (1.0f / 16777216.0f);
    }
    return (acc - 2.0f) * 1.7320508f;
  };
  const int64_t W = c.hp.mla_row(), DI = c.hp.idx_dim;
  std::vector<float> row(static_cast<size_t>(std::max<int64_t>(W, DI)));
  for (uint32_t mi = 0; mi < c.n_mla; ++mi)
    for (int32_t p = 0; p < n_tokens; ++p) {
      for (int64_t j = 0; j < W; ++j) row[static_cast<size_t>(j)] = next();
      c.store_row(c.latent_row(mi, seq, p), row.data(), W);
      if (c.top_k > 0) {
        for (int64_t j = 0; j < DI; ++j) row[static_cast<size_t>(j)] = next();
        c.store_row(c.idx_row(mi, seq, p), row.data(), DI);
      }
    }
  SeqState& s = c.seqs[static_cast<size_t>(seq)];
  s.len = n_tokens;
  s.snaps.clear();
}

uint64_t Context::memory_bytes() const {
  const Impl& c = *impl_;
  uint64_t b = 0;
  for (auto& v : c.latent) b += v.size();
  for (auto& v : c.idx_keys) b += v.size();
  for (auto& s : c.seqs) b += (s.conv.size() + s.rec.size()) * 4;
  auto f = [&](const std::vector<float>& v) { b += v.size() * 4; };
  for (auto* v : {&c.P, &c.h, &c.y, &c.out, &c.ffn_out, &c.bank, &c.kq, &c.kk, &c.kv, &c.kfa, &c.kg, &c.kgate, &c.ko,
                  &c.mqa, &c.mq, &c.mkv, &c.mqcat, &c.mz, &c.mo, &c.mgate, &c.iq, &c.ik, &c.iw, &c.th_a, &c.th_b,
                  &c.th_scores, &c.fg, &c.fu, &c.rlogits, &c.rprob, &c.lat, &c.lacc, &c.ex, &c.eg, &c.eu, &c.er,
                  &c.orows, &c.logits})
    f(*v);
  return b;
}

std::string Context::memory_summary() const {
  const Impl& c = *impl_;
  uint64_t cache = 0, state = 0;
  for (auto& v : c.latent) cache += v.size();
  for (auto& v : c.idx_keys) cache += v.size();
  for (auto& s : c.seqs) state += (s.conv.size() + s.rec.size()) * 4;
  return fmt::format(
      "context: {} seq x {} positions, cache {} ({:.1f} MiB), KDA state {:.1f} MiB, total {:.1f} MiB, "
      "threads {}, attention {} top_k {}, precision {}\n",
      opts_.n_seq_max, opts_.n_ctx_max, c.cache_f16 ? "F16" : "F32", cache / 1048576.0, state / 1048576.0,
      memory_bytes() / 1048576.0, c.n_threads, opts_.attn == AttnPath::Sparse ? "sparse" : "dense",
      c.top_k == 0 ? std::string("off") : std::to_string(c.top_k),
      c.prec == kern::Precision::Fast ? "fast" : "f32");
}

}  // namespace kimi
