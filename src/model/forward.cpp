// The forward pass (forward.h): weight placement onto the backends, per-backend scratch and
// stores, and the layer loop with the ResMix residual attention (k3-architecture.md §3.1, §3.6).
#include "model/forward.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <vector>

#include "model/forward_impl.h"
#include "util/error.h"

namespace kimi {


namespace {

// the view of w as the backend that holds it reads it
void place(WeightView& w, Backend& be) {
  if (!w) return;
  const uint8_t* host = w.info->data;
  const uint8_t* at = be.place_weight(w.info->name, host, w.info->nbytes);
  if (w.mat.data) w.mat.data = at + (w.mat.data - host);
  if (w.f32) w.f32 = reinterpret_cast<const float*>(at + (reinterpret_cast<const uint8_t*>(w.f32) - host));
}

}  // namespace

void Forward::set_taps(std::vector<uint32_t> layers, float* dst) {
  check(!dist_, "forward: hidden-state taps need a single process (no MPI ranks)");
  for (size_t i = 0; i < layers.size(); ++i)
    check(layers[i] < hp_.n_layer && (i == 0 || layers[i] > layers[i - 1]),
          "forward: tap layers must be ascending and below {} (got {})", hp_.n_layer, layers[i]);
  check(layers.empty() || dst, "forward: no destination for the tapped hidden states");
  taps_ = std::move(layers);
  taps_dst_ = dst;
}

// the stream after layer il into the tap buffer when il is a tap layer (dspark.md §3.1)
void Forward::copy_tap(uint32_t il, int dev, int64_t n) {
  if (taps_.empty()) return;
  const auto it = std::find(taps_.begin(), taps_.end(), il);
  if (it == taps_.end()) return;
  const int64_t k = it - taps_.begin(), d = hp_.n_embd;
  Device& v = *devs_[static_cast<size_t>(dev)];
  copy_between(*devs_[0]->be, taps_dst_ + k * n * d, *v.be, v.res.stream.p, static_cast<uint64_t>(n * d) * 4);
}

Forward::Forward(const Model& m, const std::vector<Backend*>& backends, const Placement& placement,
                 const ForwardOptions& o)
    : model_(m), hp_(m.hparams()), opts_(o), place_(placement) {
  const HParams& hp = hp_;
  check(!backends.empty() && backends.size() == place_.devices.size(),
        "forward: {} backends for a placement over {} devices", backends.size(), place_.devices.size());
  const int64_t N = o.n_batch, d = hp.n_embd, H = hp.n_head, nctx = o.n_ctx;
  for (Backend* b : backends) {
    devs_.push_back(std::make_unique<Device>());
    devs_.back()->be = b;
  }
  auto dev = [&](int i) -> Device& { return *devs_[static_cast<size_t>(i)]; };
  setup_dist();  // several ranks: which layers / experts / rows are this rank's

  // 1. weights onto the backends that run their parts
  layers_.resize(hp.n_layer);
  for (uint32_t il = 0; il < hp.n_layer; ++il) {
    layers_[il] = m.layer(il);
    for_each_layer_weight(layers_[il], [&](WeightView& w) {
      if (w) place(w, *dev(place_.device_of(w.info->name)).be);
    });
  }
  token_embd_ = m.token_embd();
  place(token_embd_, *dev(place_.input).be);
  output_ = m.output();
  output_norm_ = m.output_norm();
  output_res_score_ = m.output_res_score();
  for (WeightView* w : {&output_, &output_norm_, &output_res_score_}) place(*w, *dev(place_.output).be);

  // 2. which part kinds each backend runs; cache/state slots
  dev(place_.input).runs_any = true;
  dev(place_.output).runs_any = dev(place_.output).runs_output = true;
  cache_slot_.assign(hp.n_layer, -1);
  for (uint32_t il = 0; il < hp.n_layer; ++il) {
    if (!owns_layer(il)) continue;  // layer mode: another rank's layer (no cache, no scratch here)
    Device& a = dev(place_.attn[il]);
    Device& f = dev(place_.ffn[il]);
    a.runs_any = f.runs_any = true;
    if (hp.is_mla[il]) {
      a.runs_mla = true;
      cache_slot_[il] = a.n_mla++;
    } else {
      a.runs_kda = true;
      cache_slot_[il] = a.n_kda++;
    }
    if (!hp.is_moe(il)) {
      f.runs_dense = true;
    } else {
      f.runs_moe = true;
      if (place_.experts[il] != place_.ffn[il]) dev(place_.experts[il]).runs_remote_experts = true, f.moe_apart = true;
    }
  }

  // 3. stores and scratch, on each backend for what it runs
  n_bank_max_ = hp.attn_res_block ? (hp.n_layer + hp.attn_res_block - 1) / hp.attn_res_block : 0;
  check(n_bank_max_ <= 255, "context: {} residual-attention bank entries (block_count / attn_res.block_size) exceed 255",
        n_bank_max_);
  const int64_t C = hp.kda_channels(), D = hp.kda_head_dim, W = hp.mla_row();
  const int64_t E = hp.n_expert, k = hp.n_expert_used, F = hp.n_ff_exp, Lw = hp.n_latent ? hp.n_latent : d;
  StateStore::Shape shape;
  shape.n_seq = o.n_seq;
  shape.n_ctx = o.n_ctx;
  shape.f16 = o.cache_f16;
  shape.latent_width = W;
  shape.index_width = o.top_k > 0 ? hp.idx_dim : 0;
  shape.index_i8 = o.index_i8 && shape.index_width > 0;
  const int64_t Hk = kda_heads_here();  // tensor split: only this rank's heads' states
  shape.conv_floats = hp.n_kda_layers() ? 3 * Hk * D * (hp.conv_kernel - 1) : 0;
  shape.rec_floats = hp.n_kda_layers() ? Hk * D * D : 0;
  shape.n_snapshots = o.n_snapshots;
  int64_t rank = 0;
  for (uint32_t il = 0; il < hp.n_layer; ++il)
    if (!hp.is_mla[il]) rank = std::max<int64_t>(rank, m.layer(il).ssm_f_a.mat.rows);
  int64_t fw = 0;  // dense / shared-expert MLP width
  if (hp.n_dense_lead > 0) fw = hp.n_ff;
  if (hp.n_dense_lead < hp.n_layer) fw = std::max<int64_t>(fw, F * hp.n_expert_shared);

  for (auto& dp : devs_) {
    Device& v = *dp;
    Backend& be = *v.be;
    check(!shape.index_i8 || v.n_mla == 0 || &be == backends.front(),
          "--indexer-int8: the int8 indexer keys are scored by the cpu backend only, and {} runs {} MLA layer(s); "
          "keep the attention layers on the cpu or drop the option", be.name(), v.n_mla);
    v.store = std::make_unique<StateStore>(be, shape, v.n_mla, v.n_kda);
    WorkLimits lim;
    lim.n_tokens = N;
    lim.n_ctx = nctx;
    lim.n_heads = H;
    lim.dense_attn = o.attn == AttnPath::Dense && v.runs_mla;
    if (v.runs_mla) {
      lim.head_io = std::max<int64_t>({hp.n_nope, hp.kv_lora, hp.n_v});
      lim.row = std::max<int64_t>(W, hp.idx_dim);
    }
    if (v.runs_kda) lim.row = std::max<int64_t>(lim.row, D);
    if ((v.runs_moe && hp.n_dense_lead < hp.n_layer) || v.runs_remote_experts) {
      lim.n_expert = E;
      lim.n_expert_used = k;
      lim.expert_ff = F;
      lim.expert_width = Lw;
    }
    be.reserve(lim);
    if (v.runs_any) {
      v.res.stream.alloc(be, N * d, "residual stream");
      v.res.mixed.alloc(be, N * d, "resmix output");
      v.res.normed.alloc(be, N * d, "normed input");
      v.res.mixer_out.alloc(be, N * d, "attention output");
      v.res.ffn_out.alloc(be, N * d, "ffn output");
      v.res.bank.alloc(be, static_cast<int64_t>(n_bank_max_) * N * d, "resmix bank");
      v.res.bank_inv.alloc(be, static_cast<int64_t>(n_bank_max_) * N, "resmix bank 1/rms");
    }
    if (v.runs_mla) {
      MlaScratch& s = v.mla;
      s.q_latent.alloc(be, N * hp.q_lora, "mla q latent");
      s.q.alloc(be, N * H * hp.n_kq, "mla q");
      s.kv_row.alloc(be, N * W, "mla kv row");
      s.q_absorbed.alloc(be, N * H * W, "mla absorbed q");
      s.z.alloc(be, N * H * hp.kv_lora, "mla z");
      s.heads_out.alloc(be, N * H * hp.n_v, "mla heads out");
      s.gate.alloc(be, N * H * hp.n_v, "mla gate");
      s.sel_cap = o.top_k > 0 ? std::min<int64_t>(o.top_k, nctx) : 0;
      s.selected.alloc(be, N * s.sel_cap, "dsa selection");
      s.n_selected.alloc(be, N, "dsa selection counts");
      if (o.top_k > 0) {
        IndexerScratch& x = v.idx;
        x.q.alloc(be, N * hp.idx_heads * hp.idx_dim, "indexer q");
        x.k.alloc(be, N * hp.idx_dim, "indexer k");
        x.head_w.alloc(be, N * hp.idx_heads, "indexer head weights");
        x.scores.alloc(be, nctx, "indexer scores");
        x.topk_tmp.alloc(be, nctx, "indexer top-k scratch");
      }
    }
    if (v.runs_kda) {
      KdaScratch& s = v.kda;
      for (auto* b : {&s.q, &s.k, &s.v, &s.decay, &s.gate, &s.out}) b->alloc(be, N * C, "kda activations");
      s.f_low.alloc(be, N * rank, "kda f low-rank");
      s.beta.alloc(be, N * H, "kda beta");
    }
    if (v.runs_dense || v.runs_moe) {
      v.ffn.gate.alloc(be, N * fw, "ffn gate");
      v.ffn.up.alloc(be, N * fw, "ffn up");
      if (v.runs_moe && hp.n_expert_shared > 0) v.ffn.shared_out.alloc(be, N * d, "shared experts out");
    }
    if (v.runs_moe) {
      MoeScratch& s = v.moe;
      s.router_logits.alloc(be, N * E, "router logits");
      s.router_probs.alloc(be, N * E, "router probabilities");
      s.sel.alloc(be, N * k, "routed experts");
      if (tensor_split()) s.sel_local.alloc(be, N * k, "routed experts of this rank");
      s.weights.alloc(be, N * k, "routed expert weights");
      if (hp.n_latent) s.latent_in.alloc(be, N * Lw, "moe latent input");
      s.latent_acc.alloc(be, N * Lw, "moe latent sum");
      if (v.moe_apart && !be.host_visible()) s.cross.alloc(be, MoeCrossing(N, Lw, k).floats, "moe crossing");
    }
    if (v.runs_remote_experts) {
      v.experts.x.alloc(be, N * Lw, "experts input");
      if (be.host_visible()) v.experts.pack.alloc(be, MoeCrossing(N, Lw, k).floats, "experts crossing");
      v.experts.sel.alloc(be, N * k, "experts routing");
      v.experts.weights.alloc(be, N * k, "experts weights");
      v.experts.acc.alloc(be, N * Lw, "experts output");
    }
    if (v.runs_output) {
      v.head.rows.alloc(be, N * d, "lm head rows");
      if (!be.host_visible()) v.head.logits.alloc(be, N * hp.n_vocab, "logits");
    }
  }
  wanted_.assign(static_cast<size_t>(N), 0);
  size_dist();

  // 3b. the backends' load-time copies (CPU: K-quants row-interleaved, backend/cpu/repack.h) of the
  // 2-D weights this process multiplies with, made after size_dist narrowed them to this rank's
  // rows (another rank's layers and rows are not copied; a 3-D expert stack has ne[2] > 1 and the
  // embedding table is only read by rows)
  auto prepare = [&](WeightView& w, int device) {
    if (w && w.mat.data && !w.f32 && w.info->ne[2] == 1 && w.info->ne[3] == 1)
      w.mat.packed = dev(device).be->prepare_weight(w.mat);
  };
  for (uint32_t il = 0; il < hp.n_layer; ++il) {
    if (!owns_layer(il)) continue;
    for_each_layer_weight(layers_[il], [&](WeightView& w) {
      if (w) prepare(w, place_.device_of(w.info->name));
    });
  }
  if (!dist_ || dist_->mode == SplitMode::Tensor || dist_->rank == dist_->size - 1) prepare(output_, place_.output);

  // 4. routed experts on the host streamed from disk when the model does not fit in memory
  if (const uint64_t budget = dist_ ? 0 : resolve_stream_budget(m, o.stream)) {
    std::vector<uint8_t> on_host(hp.n_layer, 0);
    for (uint32_t il = 0; il < hp.n_layer; ++il) on_host[il] = hp.is_moe(il) && place_.experts[il] == 0;
    xcache_ = std::make_unique<ExpertCache>(m, on_host, budget, o.stream);
  }
  // the hybrid layers: routed experts on the host while the rest of the FFN runs on an accelerator (one)
  std::vector<uint8_t> hybrid(hp.n_layer, 0);
  int acc = -1;
  for (uint32_t il = 0; il < hp.n_layer && !dist_; ++il)
    if (hp.is_moe(il) && place_.experts[il] == 0 && place_.ffn[il] != 0 && (acc < 0 || acc == place_.ffn[il]))
      hybrid[il] = 1, acc = place_.ffn[il];
  // 5. hot experts (--gpu-experts): the hybrid layers keep their most-picked experts on that accelerator too
  if (o.stream.hot.per_layer != 0 && !dist_) {
    if (acc > 0)
      hot_ = std::make_unique<HotExperts>(m, *dev(acc).be, hybrid, o.stream.hot, N);
    else
      std::fprintf(stderr, "kimi: --gpu-experts: no layer runs in hybrid mode (routed experts in RAM, the rest of its "
                           "FFN on an accelerator: --cpu-moe / --n-cpu-moe); ignored\n");
  }
  // 6. prefill offload (model/expert_offload.h): in the same hybrid layers, a long micro-batch's host picks may
  // run on the accelerator, their experts uploaded into a pool made now (after the hot experts took theirs)
  if (acc > 0 && dev(0).be->host_visible())
    offload_ = std::make_unique<ExpertOffload>(m, *dev(acc).be, *dev(0).be, hybrid, o.stream.offload, N);
}

ExpertStreamStats Forward::expert_stream_stats() const {
  ExpertStreamStats s = xcache_ ? xcache_->stats() : ExpertStreamStats{};
  if (hot_) hot_->add_stats(s);
  if (offload_) offload_->add_stats(s);
  return s;
}

// The residual stream (and the ResMix bank) moves to the backend of the next part.
void Forward::move_residual(int& dev, int to, int64_t n, uint32_t nb) {
  if (dev == to) return;
  Device& a = *devs_[static_cast<size_t>(dev)];
  Device& b = *devs_[static_cast<size_t>(to)];
  const int64_t d = hp_.n_embd, N = opts_.n_batch;
  copy_between(*b.be, b.res.stream.p, *a.be, a.res.stream.p, static_cast<uint64_t>(n * d) * 4);
  for (uint32_t k = 0; k < nb; ++k) {
    const int64_t off = static_cast<int64_t>(k) * N;
    copy_between(*b.be, b.res.bank.p + off * d, *a.be, a.res.bank.p + off * d, static_cast<uint64_t>(n * d) * 4);
    copy_between(*b.be, b.res.bank_inv.p + off, *a.be, a.res.bank_inv.p + off, static_cast<uint64_t>(n) * 4);
  }
  dev = to;
}

void Forward::run_local(const BatchEntry* e, int64_t n, float* logits, const float* const* embd) {
  // the split of this call's wall time: each part adds its own; the rest goes to Other at return
  struct PhaseCall {
    PhaseTimes& t;
    double start = PhaseTimes::now(), parts0 = t.total() - t.s[PhaseTimes::Other];
    ~PhaseCall() { t.s[PhaseTimes::Other] += PhaseTimes::now() - start - (t.total() - t.s[PhaseTimes::Other] - parts0); }
  } phase_call{phase_};
  const HParams& hp = hp_;
  const int64_t d = hp.n_embd, N = opts_.n_batch;
  const uint32_t B = hp.attn_res_block;
  const float eps = hp.rms_eps;

  TensorSplit* tp = tensor_split();
  const bool layer_mode = dist_ && !tp;
  if (hot_) hot_->begin_pass(n);  // between passes: the hot experts may be re-ranked by the picks counted so far

  // embeddings (layer mode: on rank 0, which runs the first layers)
  int dev = place_.input;
  if (owns_layer(0)) {
    Device& in = *devs_[static_cast<size_t>(dev)];
    in.be->embed_rows(token_embd_.mat, e, n, in.res.stream.p);
    // image rows at the placeholder positions (docs/spec/vision.md §4)
    if (embd)
      for (int64_t i = 0; i < n; ++i)
        if (embd[i]) in.be->upload(in.res.stream.p + i * d, embd[i], static_cast<uint64_t>(d) * 4);
  }

  uint32_t nb = 0;  // ResMix bank entries so far
  // ResMix (when the file has it) of the bank and the stream: the input of the part's RMSNorm
  auto resmix = [&](Device& v, const WeightView& score) {
    const float* x = v.res.stream.p;
    if (B > 0) {
      v.be->res_mix(v.res.stream.p, score.f32, v.res.bank.p, v.res.bank_inv.p, nb, N, n, d, eps, v.res.mixed.p);
      x = v.res.mixed.p;
    }
    return x;
  };
  for (uint32_t il = 0; il < hp.n_layer; ++il) {
    const LayerWeights& L = layers_[il];
    if (layer_mode) {  // the stream comes from the rank that ran the previous layer
      if (il > 0 && owns_layer(il) != owns_layer(il - 1)) pass_layer_boundary(il, n, nb);
      if (!owns_layer(il)) {
        if (B > 0 && il % B == 0) ++nb;
        continue;
      }
    }

    // attention part: ResMix, bank entry at block starts, norm, MLA or KDA, residual
    move_residual(dev, place_.attn[il], n, nb);
    {
      Device& v = *devs_[static_cast<size_t>(dev)];
      Backend& be = *v.be;
      const float* x = resmix(v, L.attn_res_score);
      const bool bank_layer = B > 0 && il % B == 0;
      if (bank_layer) {
        be.bank_append(v.res.stream.p, n, d, eps, v.res.bank.p + static_cast<int64_t>(nb) * N * d,
                       v.res.bank_inv.p + static_cast<int64_t>(nb) * N);
        ++nb;
      }
      be.rms_norm_rows(x, d, L.attn_norm.f32, v.res.normed.p, d, n, d, eps);
      const PartRun r{be, hp, e, n, tp, &phase_};
      const int slot = cache_slot_[il];
      const double t0 = PhaseTimes::now();
      if (hp.is_mla[il]) {
        const MlaCache cache{v.store->latent(slot), v.store->index_keys(slot)};
        (tp ? mla_attention_tp : mla_attention)(r, L, cache, v.mla, opts_.top_k > 0 ? &v.idx : nullptr, opts_.top_k,
                                                opts_.attn, v.res.normed.p, v.res.mixer_out.p);
      } else {
        (tp ? kda_attention_tp : kda_attention)(r, L, v.store->conv(slot), v.store->rec(slot), v.kda, v.res.normed.p,
                                                v.res.mixer_out.p);
      }
      phase_.s[hp.is_mla[il] ? PhaseTimes::Mla : PhaseTimes::Kda] += PhaseTimes::now() - t0;
      if (bank_layer)  // a block starts: the stream restarts from this mixer's output
        be.copy(v.res.stream.p, v.res.mixer_out.p, static_cast<uint64_t>(n * d) * 4);
      else
        be.add(v.res.stream.p, v.res.mixer_out.p, n * d);
    }

    // FFN part: ResMix, norm, dense MLP or MoE, residual
    move_residual(dev, place_.ffn[il], n, nb);
    {
      Device& v = *devs_[static_cast<size_t>(dev)];
      Backend& be = *v.be;
      const float* x = resmix(v, L.ffn_res_score);
      be.rms_norm_rows(x, d, L.ffn_norm.f32, v.res.normed.p, d, n, d, eps);
      const PartRun r{be, hp, e, n, tp, &phase_};
      const double t0 = PhaseTimes::now();
      if (!hp.is_moe(il)) {
        (tp ? dense_ffn_tp : dense_ffn)(r, L.ffn_gate, L.ffn_up, L.ffn_down, v.ffn, v.res.normed.p, v.res.ffn_out.p);
      } else if (tp) {
        moe_ffn_tp(r, L, v.moe, v.ffn, v.res.normed.p, v.res.ffn_out.p);
      } else {
        ExpertSite site;
        if (place_.experts[il] != dev) {
          Device& xd = *devs_[static_cast<size_t>(place_.experts[il])];
          site = {xd.be, &xd.experts};
        }
        if (xcache_ && place_.experts[il] == 0) site.cache = xcache_.get(), site.layer = il;
        if (hot_ && hot_->layer(il)) site.hot = hot_.get(), site.layer = il;
        if (offload_ && offload_->active()) site.offload = offload_.get(), site.layer = il;
        site.overlap = opts_.stream.hybrid_overlap;
        moe_ffn(r, L, v.moe, v.ffn, site, v.res.normed.p, v.res.ffn_out.p);
      }
      phase_.s[hp.is_moe(il) ? PhaseTimes::Moe : PhaseTimes::Ffn] += PhaseTimes::now() - t0;
      be.add(v.res.stream.p, v.res.ffn_out.p, n * d);
    }
    copy_tap(il, dev, n);
  }

  // final ResMix, norm, lm head for the requested rows (layer mode: on the last rank, whose
  // logits go to rank 0)
  int64_t nw = 0;
  for (int64_t t = 0; t < n; ++t)
    if (e[t].want_logits) wanted_[static_cast<size_t>(nw++)] = static_cast<int32_t>(t);
  if (layer_mode && !owns_layer(hp.n_layer - 1)) {
    if (nw > 0) layer_mode_logits(nw, logits);
    return;
  }
  move_residual(dev, place_.output, n, nb);
  Device& v = *devs_[static_cast<size_t>(dev)];
  Backend& be = *v.be;
  const float* fin = resmix(v, output_res_score_);
  if (nw == 0) return;
  struct HeadTime {  // the lm head, whichever branch below returns
    PhaseTimes& t;
    double t0;
    ~HeadTime() { t.s[PhaseTimes::Head] += PhaseTimes::now() - t0; }
  } head_time{phase_, PhaseTimes::now()};
  be.gather_rows(fin, d, wanted_.data(), nw, v.head.rows.p);
  be.rms_norm_rows(v.head.rows.p, d, output_norm_.f32, v.head.rows.p, d, nw, d, eps);
  const int64_t V = hp.n_vocab;
  if (tp) {  // vocabulary rows split over the ranks, gathered on rank 0
    lm_head_tp(*tp, be, output_.mat, V, v.head.rows.p, nw, logits);
  } else if (layer_mode) {
    be.matmul(output_.mat, v.head.rows.p, nw, layer_logits());
    layer_mode_logits(nw, logits);
  } else if (be.host_visible()) {
    be.matmul(output_.mat, v.head.rows.p, nw, logits);
  } else {
    be.matmul(output_.mat, v.head.rows.p, nw, v.head.logits.p);
    be.sync();
    be.download(logits, v.head.logits.p, static_cast<uint64_t>(nw * V) * 4);
  }
}

// ---- per-sequence state on every backend ----

void Forward::seq_clear_local(int32_t seq) {
  for (auto& v : devs_) v->store->seq_clear(seq);
}
void Forward::seq_copy_local(int32_t src, int32_t dst, int32_t n_rows) {
  for (auto& v : devs_) v->store->seq_copy(src, dst, n_rows);
}
void Forward::snapshot_save_local(int32_t seq, int32_t slot) {
  for (auto& v : devs_) v->store->snapshot_save(seq, slot);
}
void Forward::snapshot_restore_local(int32_t src, int32_t slot, int32_t dst) {
  for (auto& v : devs_) v->store->snapshot_restore(src, slot, dst);
}
void Forward::snapshot_copy_local(int32_t src, int32_t dst, int32_t slot) {
  for (auto& v : devs_) v->store->snapshot_copy(src, dst, slot);
}

void Forward::fill_synthetic_local(int32_t seq, int32_t n_tokens, uint64_t seed) {
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
  const int64_t W = hp_.mla_row(), DI = hp_.idx_dim;
  std::vector<float> row(static_cast<size_t>(std::max<int64_t>(W, DI)));
  // layers in order (the same numbers as a single-backend context)
  for (uint32_t il = 0; il < hp_.n_layer; ++il) {
    if (!hp_.is_mla[il]) continue;
    const bool mine = owns_layer(il);  // layer mode: other ranks' layers only advance the numbers
    StateStore& st_ = *devs_[static_cast<size_t>(place_.attn[il])]->store;
    const CacheRows lat = mine ? st_.latent(cache_slot_[il]) : CacheRows{};
    const bool with_keys = opts_.top_k > 0;
    const CacheRows keys = mine && with_keys ? st_.index_keys(cache_slot_[il]) : CacheRows{};
    for (int32_t p = 0; p < n_tokens; ++p) {
      for (int64_t j = 0; j < W; ++j) row[static_cast<size_t>(j)] = next();
      if (mine) st_.write_row(lat, seq, p, row.data());
      if (with_keys) {
        for (int64_t j = 0; j < DI; ++j) row[static_cast<size_t>(j)] = next();
        if (mine) st_.write_row(keys, seq, p, row.data());
      }
    }
  }
}

// ---- host copies for the prompt cache (one process: the ranks' stores are not reachable here) ----

std::vector<uint64_t> Forward::row_parts() const {
  std::vector<uint64_t> r;
  for (auto& v : devs_)
    for (uint64_t b : v->store->row_parts()) r.push_back(b);
  return r;
}
uint64_t Forward::kda_state_bytes() const {
  uint64_t b = 0;
  for (auto& v : devs_) b += v->store->kda_state_bytes();
  return b;
}
void Forward::save_rows(int32_t seq, int32_t from, int32_t to, uint8_t* host) const {
  check(!dist_, "prompt cache: saving a sequence is not supported with several ranks");
  for (auto& v : devs_) {
    v->store->save_rows(seq, from, to, host);
    for (uint64_t b : v->store->row_parts()) host += b * static_cast<uint64_t>(to - from);
  }
}
void Forward::load_rows(int32_t seq, int32_t from, int32_t to, const uint8_t* host) {
  check(!dist_, "prompt cache: loading a sequence is not supported with several ranks");
  for (auto& v : devs_) {
    v->store->load_rows(seq, from, to, host);
    for (uint64_t b : v->store->row_parts()) host += b * static_cast<uint64_t>(to - from);
  }
}
void Forward::save_state(int32_t seq, int32_t slot, uint8_t* host) const {
  check(!dist_, "prompt cache: saving a sequence is not supported with several ranks");
  for (auto& v : devs_) {
    v->store->save_state(seq, slot, host);
    host += v->store->kda_state_bytes();
  }
}
void Forward::load_state(int32_t seq, const uint8_t* host) {
  check(!dist_, "prompt cache: loading a sequence is not supported with several ranks");
  for (auto& v : devs_) {
    v->store->load_state(seq, host);
    host += v->store->kda_state_bytes();
  }
}

uint64_t Forward::cache_bytes() const {
  uint64_t b = 0;
  for (auto& v : devs_) b += v->store->cache_bytes();
  return b;
}

uint64_t Forward::state_bytes() const {
  uint64_t b = 0;
  for (auto& v : devs_) b += v->store->state_bytes();
  return b;
}

uint64_t Forward::work_bytes() const {
  uint64_t b = 0;
  for (auto& vp : devs_) {
    const Device& v = *vp;
    b += v.be->scratch_bytes();
    for (auto* x : {&v.res.stream, &v.res.mixed, &v.res.normed, &v.res.mixer_out, &v.res.ffn_out, &v.res.bank,
                    &v.res.bank_inv, &v.mla.q_latent, &v.mla.q, &v.mla.kv_row, &v.mla.q_absorbed, &v.mla.z,
                    &v.mla.heads_out, &v.mla.gate, &v.idx.q, &v.idx.k, &v.idx.head_w, &v.idx.scores,
                    &v.idx.topk_tmp, &v.kda.q, &v.kda.k, &v.kda.v, &v.kda.f_low, &v.kda.decay, &v.kda.beta,
                    &v.kda.gate, &v.kda.out, &v.ffn.gate, &v.ffn.up, &v.ffn.shared_out, &v.moe.router_logits,
                    &v.moe.router_probs, &v.moe.weights, &v.moe.latent_in, &v.moe.latent_acc, &v.experts.x,
                    &v.experts.weights, &v.experts.acc, &v.head.rows, &v.head.logits, &v.moe.cross, &v.experts.pack})
      b += x->bytes();
    b += v.mla.selected.bytes() + v.mla.n_selected.bytes() + v.moe.sel.bytes() + v.experts.sel.bytes();
  }
  return b;
}

}  // namespace kimi
