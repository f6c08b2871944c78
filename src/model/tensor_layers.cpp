// The layer parts over the ranks of a tensor split (layers.h, TensorSplit; docs/distributed.md).
// Each is the single-process part (kda_attention.cpp, mla_attention.cpp, dsa_indexer.cpp,
// dense_ffn.cpp, moe.cpp) with its heads / rows limited to this rank's and exchanges where a
// value needs all ranks' parts. Every value is made by the same ops on the same inputs as in one
// process, so tests/model/test_dist_mpi.cpp can require the single-process logits bit for bit:
// a change to a single-process part must be made here too.
#include <cmath>
#include <cstring>
#include <utility>

#include "model/layers.h"

namespace kimi {

namespace {

void mm(Backend& be, const MatView& W, const float* x, int64_t n, float* y) {
  if (W.rows > 0 && n > 0) be.matmul(W, x, n, y);
}

}  // namespace

// KDA: this rank's heads end to end (their q/k/v/gate rows, conv channels, decay, beta, state),
// then the heads' outputs are all-gathered and the output projection's rows are all-gathered.
void kda_attention_tp(const PartRun& r, const LayerWeights& L, const SeqStates& conv, const SeqStates& rec,
                      KdaScratch& s, const float* x, float* out) {
  const HParams& hp = r.hp;
  Backend& be = r.be;
  TensorSplit& tp = *r.tp;
  const int64_t n = r.n, H = hp.n_head, D = hp.kda_head_dim, C = H * D, K = hp.conv_kernel, d = hp.n_embd;
  const float eps = hp.rms_eps;
  int64_t h0 = 0, h1 = 0;
  tp.units(H, h0, h1);
  const int64_t Hr = h1 - h0, c0 = h0 * D;
  if (Hr > 0) {
    mm(be, L.attn_q.mat, x, n, s.q.p);
    mm(be, L.attn_k.mat, x, n, s.k.p);
    mm(be, L.attn_v.mat, x, n, s.v.p);
    const float* const conv_w[3] = {L.conv_q.f32 + c0 * K, L.conv_k.f32 + c0 * K, L.conv_v.f32 + c0 * K};
    float* const streams[3] = {s.q.p, s.k.p, s.v.p};
    be.kda_conv_silu(conv_w, K, Hr * D, conv, r.e, n, streams);
    be.l2_norm_rows(s.q.p, n * Hr, D, eps);
    be.l2_norm_rows(s.k.p, n * Hr, D, eps);
    mm(be, L.ssm_f_a.mat, x, n, s.f_low.p);  // the low-rank input: whole on every rank
    mm(be, L.ssm_f_b.mat, s.f_low.p, n, s.decay.p);
    be.kda_gate(s.decay.p, L.ssm_dt_b.f32 + c0, L.ssm_a.f32 + h0, n, Hr, D, {hp.has_gate_lb, hp.gate_lb});
    mm(be, L.ssm_beta.mat, x, n, s.beta.p);
    be.sigmoid(s.beta.p, n * Hr);
    const float scale = 1.0f / std::sqrt(static_cast<float>(D));
    be.kda_scan(rec, r.e, n, Hr, D, s.q.p, s.k.p, s.v.p, s.decay.p, s.beta.p, scale, s.out.p);
    mm(be, L.ssm_g.mat, x, n, s.gate.p);
    be.rms_norm_rows(s.out.p, D, L.ssm_norm.f32, s.out.p, D, n * Hr, D, eps);
    be.mul_sigmoid_rows(s.out.p, s.gate.p, n * Hr, D);
  }
  {  // every head's output on every rank (into s.q: [n][C])
    TensorSplit::Exchange ex(tp);
    float* mine = ex.cols(s.q.p, n, C, D);
    if (Hr > 0) std::memcpy(mine, s.out.p, static_cast<size_t>(n * Hr * D) * 4);
    ex.run();
  }
  TensorSplit::Exchange ex(tp);
  mm(be, L.attn_output.mat, s.q.p, n, ex.cols(out, n, d, 1));
  ex.run();
}

// MLA + DSA indexer: the latents (and the indexer's keys and head weights) by rows, one exchange;
// the indexer's query heads, one exchange, then the whole scoring and top-k on every rank (the same
// selection everywhere, equal to one process's); this rank's attention heads; their outputs and
// the output projection's rows, one exchange each.
void mla_attention_tp(const PartRun& r, const LayerWeights& L, const MlaCache& cache, MlaScratch& s,
                      IndexerScratch* idx, int top_k, AttnPath path, const float* x, float* out) {
  const HParams& hp = r.hp;
  Backend& be = r.be;
  TensorSplit& tp = *r.tp;
  const int64_t n = r.n, H = hp.n_head, ql = hp.q_lora, kvl = hp.kv_lora, W = hp.mla_row(), vd = hp.n_v;
  const int64_t d = hp.n_embd, HI = hp.idx_heads, DI = hp.idx_dim;
  const float eps = hp.rms_eps;
  const bool with_idx = top_k > 0;

  // 1. query latent, compressed KV row (and the indexer's keys and head weights): rows, gathered
  {
    TensorSplit::Exchange ex(tp);
    mm(be, L.attn_q_a.mat, x, n, ex.cols(s.q_latent.p, n, ql, 1));
    mm(be, L.attn_kv_a_mqa.mat, x, n, ex.cols(s.kv_row.p, n, W, 1));
    if (with_idx) {
      mm(be, L.idx_k.mat, x, n, ex.cols(idx->k.p, n, DI, 1));
      mm(be, L.idx_proj.mat, x, n, ex.cols(idx->head_w.p, n, HI, 1));
    }
    ex.run();
  }
  be.rms_norm_rows(s.q_latent.p, ql, L.attn_q_a_norm.f32, s.q_latent.p, ql, n, ql, eps);
  be.rms_norm_rows(s.kv_row.p, W, L.attn_kv_a_norm.f32, s.kv_row.p, W, n, kvl, eps);
  be.store_cache_rows(s.kv_row.p, W, r.e, n, cache.latent);

  // 2. the indexer (dsa_indexer.cpp): keys into the cache, query heads gathered, score -> top-k
  if (with_idx) {
    const double t0 = PhaseTimes::now();
    IndexerScratch& xs = *idx;
    be.layer_norm_rows(xs.k.p, L.idx_k_norm_w.f32, L.idx_k_norm_b.f32, n, DI, 1e-6f);
    be.store_cache_rows(xs.k.p, DI, r.e, n, cache.index_keys);
    {
      TensorSplit::Exchange ex(tp);
      mm(be, L.idx_q_b.mat, s.q_latent.p, n, ex.cols(xs.q.p, n, HI * DI, DI));
      ex.run();
    }
    be.scale_rows(xs.head_w.p, n, HI, 1.0f / std::sqrt(static_cast<float>(HI * DI)));
    be.indexer_select(cache.index_keys, r.e, n, xs.q.p, xs.head_w.p, HI, top_k, s.selected.p, s.sel_cap,
                      s.n_selected.p, xs.scores.p, xs.topk_tmp.p);
    if (r.times) {  // the caller adds the whole of this call to Mla
      const double dt = PhaseTimes::now() - t0;
      r.times->s[PhaseTimes::Indexer] += dt;
      r.times->s[PhaseTimes::Mla] -= dt;
    }
  } else {
    be.set_i32(s.n_selected.p, n, -1);
  }

  // 3. this rank's heads: queries, absorption, attention over the (whole, replicated) latent
  // cache, W_vb, output gate
  int64_t h0 = 0, h1 = 0;
  tp.units(H, h0, h1);
  const int64_t Hr = h1 - h0;
  if (Hr > 0) {
    mm(be, L.attn_q_b.mat, s.q_latent.p, n, s.q.p);
    be.mla_absorb_queries(L.attn_k_b.mat, L.attn_k_b.slice_bytes, s.q.p, n, Hr, hp.n_nope, hp.n_rope,
                          s.q_absorbed.p);
    const float scale = 1.0f / std::sqrt(static_cast<float>(hp.n_kq));
    be.mla_attention(cache.latent, kvl, r.e, n, Hr, s.q_absorbed.p, s.selected.p, s.n_selected.p, s.sel_cap, scale,
                     path, s.z.p);
    be.mla_value_heads(L.attn_v_b.mat, L.attn_v_b.slice_bytes, s.z.p, n, Hr, s.heads_out.p);
    if (L.attn_gate) {
      mm(be, L.attn_gate.mat, x, n, s.gate.p);
      be.mul_sigmoid_rows(s.heads_out.p, s.gate.p, n, Hr * vd);
    }
  }
  {  // every head's output on every rank (into s.gate: [n][H * vd])
    TensorSplit::Exchange ex(tp);
    float* mine = ex.cols(s.gate.p, n, H * vd, vd);
    if (Hr > 0) std::memcpy(mine, s.heads_out.p, static_cast<size_t>(n * Hr * vd) * 4);
    ex.run();
  }
  TensorSplit::Exchange ex(tp);
  mm(be, L.attn_output.mat, s.gate.p, n, ex.cols(out, n, d, 1));
  ex.run();
}

// Dense SiTU MLP: this rank's inner rows, the inner activations gathered, the down projection's
// rows gathered.
void dense_ffn_tp(const PartRun& r, const WeightView& gate, const WeightView& up, const WeightView& down,
                  FfnScratch& s, const float* x, float* out) {
  Backend& be = r.be;
  TensorSplit& tp = *r.tp;
  const int64_t n = r.n, d = r.hp.n_embd;
  const int64_t width = down.mat.cols;
  int64_t f0 = 0, f1 = 0;
  tp.units(width, f0, f1);
  const int64_t Fr = f1 - f0;
  if (Fr > 0) {
    mm(be, gate.mat, x, n, s.gate.p);
    mm(be, up.mat, x, n, s.up.p);
    be.situ_rows(s.gate.p, s.up.p, n, Fr, r.hp.situ_beta, r.hp.situ_lambda);
  }
  {
    TensorSplit::Exchange ex(tp);
    float* mine = ex.cols(s.up.p, n, width, 1);
    if (Fr > 0) std::memcpy(mine, s.gate.p, static_cast<size_t>(n * Fr) * 4);
    ex.run();
  }
  TensorSplit::Exchange ex(tp);
  mm(be, down.mat, s.up.p, n, ex.cols(out, n, d, 1));
  ex.run();
}

// Latent MoE: router logits and latent input by rows (one exchange); the routing on every rank;
// this rank's experts run its routed slots one output per slot, exchanged (with the shared
// experts' inner activations) and summed on every rank in ascending expert order like one
// process; the latent up-projection's and the shared down projection's rows, one exchange.
void moe_ffn_tp(const PartRun& r, const LayerWeights& L, MoeScratch& s, FfnScratch& f, const float* x, float* out) {
  const HParams& hp = r.hp;
  Backend& be = r.be;
  TensorSplit& tp = *r.tp;
  const int64_t n = r.n, d = hp.n_embd, k = hp.n_expert_used, E = hp.n_expert;
  const bool latent = hp.n_latent > 0, shared = static_cast<bool>(L.ffn_gate_shexp);
  const int64_t Lw = latent ? hp.n_latent : d;

  // 1. router logits (and the latent input): rows, gathered; the routing (same on every rank)
  {
    TensorSplit::Exchange ex(tp);
    mm(be, L.ffn_gate_inp.mat, x, n, ex.cols(s.router_logits.p, n, E, 1));
    if (latent) mm(be, L.ffn_routed_down.mat, x, n, ex.cols(s.latent_in.p, n, Lw, 1));
    ex.run();
  }
  const RouterParams rp{E, k, hp.gating_func == 1, hp.expert_weights_norm, hp.expert_weights_scale};
  be.moe_route(s.router_logits.p, L.exp_probs_b ? L.exp_probs_b.f32 : nullptr, n, rp, s.router_probs.p, s.sel.p,
               s.weights.p);
  const float* xl = latent ? s.latent_in.p : x;

  // 2. routed slots: (token, j) of rank r's experts go to rank r's block, in (token, j) order
  const int32_t* sel = s.sel.p;
  auto owner = [&](int32_t e) {
    int q = 0;
    while (q + 1 < tp.size && e >= tp.expert_lo[static_cast<size_t>(q) + 1]) ++q;
    return q;
  };
  int64_t mine = 0;
  {
    int64_t at = 0;
    for (int q = 0; q < tp.size; ++q) {
      int64_t c = 0;
      for (int64_t i = 0; i < n * k; ++i)
        if (owner(sel[i]) == q) {
          tp.slot_at[static_cast<size_t>(i)] = static_cast<int32_t>(at + c);
          if (q == tp.rank) {
            std::memcpy(tp.slot_x.data() + c * Lw, xl + (i / k) * Lw, static_cast<size_t>(Lw) * 4);
            tp.slot_expert[static_cast<size_t>(c)] = sel[i] - static_cast<int32_t>(tp.expert_lo[static_cast<size_t>(q)]);
          }
          ++c;
        }
      tp.counts[static_cast<size_t>(q)] = c * Lw;
      if (q == tp.rank) mine = c;
      at += c;
    }
  }
  // each slot alone (weight 1): its expert's output, exactly the vector moe_experts weights and adds
  const int64_t e_lo = tp.expert_lo[static_cast<size_t>(tp.rank)], e_hi = tp.expert_lo[static_cast<size_t>(tp.rank) + 1];
  if (mine > 0) {
    const ExpertMats em{L.ffn_gate_exps.mat, L.ffn_up_exps.mat, L.ffn_down_exps.mat,
                        L.ffn_gate_exps.slice_bytes, L.ffn_up_exps.slice_bytes, L.ffn_down_exps.slice_bytes};
    be.moe_experts(em, tp.slot_x.data(), mine, Lw, tp.slot_expert.data(), tp.ones.data(), 1, e_hi - e_lo,
                   hp.situ_beta, hp.situ_lambda, tp.slot_y.data());
  }
  // the shared experts' inner rows of this rank
  const int64_t S = shared ? L.ffn_down_shexp.mat.cols : 0;
  int64_t s0 = 0, s1 = 0;
  tp.units(S, s0, s1);
  const int64_t Sr = s1 - s0;
  if (shared && Sr > 0) {
    mm(be, L.ffn_gate_shexp.mat, x, n, f.gate.p);
    mm(be, L.ffn_up_shexp.mat, x, n, f.up.p);
    be.situ_rows(f.gate.p, f.up.p, n, Sr, hp.situ_beta, hp.situ_lambda);
  }
  {
    TensorSplit::Exchange ex(tp);
    float* ys = ex.block(tp.slot_out.data(), tp.counts.data());
    if (mine > 0) std::memcpy(ys, tp.slot_y.data(), static_cast<size_t>(mine * Lw) * 4);
    if (shared) {
      float* hs = ex.cols(f.up.p, n, S, 1);
      if (Sr > 0) std::memcpy(hs, f.gate.p, static_cast<size_t>(n * Sr) * 4);
    }
    ex.run();
  }
  // the weighted sum, per token in ascending expert order (moe_experts' order)
  be.fill_zero(s.latent_acc.p, static_cast<uint64_t>(n * Lw) * 4);
  for (int64_t t = 0; t < n; ++t) {
    int32_t order[64];  // k <= 64 (checked by Forward)
    const int64_t kk = k;
    for (int64_t j = 0; j < kk; ++j) order[j] = static_cast<int32_t>(j);
    for (int64_t a = 1; a < kk; ++a)  // insertion sort of the slots by expert
      for (int64_t b = a; b > 0 && sel[t * k + order[b]] < sel[t * k + order[b - 1]]; --b) std::swap(order[b], order[b - 1]);
    for (int64_t j = 0; j < kk; ++j) {
      const int64_t i = t * k + order[j];
      be.axpy(s.latent_acc.p + t * Lw, s.weights.p[i], tp.slot_out.data() + static_cast<int64_t>(tp.slot_at[static_cast<size_t>(i)]) * Lw, Lw);
    }
  }

  // 3. back to the full width: this rank's rows of the up-projection plus the shared experts' down
  if (latent && L.ffn_routed_norm)
    be.rms_norm_rows(s.latent_acc.p, Lw, L.ffn_routed_norm.f32, s.latent_acc.p, Lw, n, Lw, hp.rms_eps);
  int64_t d0 = 0, d1 = 0;
  tp.units(d, d0, d1);
  const int64_t dr = d1 - d0;
  TensorSplit::Exchange ex(tp);
  float* part = ex.cols(out, n, d, 1);
  if (latent) {
    mm(be, L.ffn_routed_up.mat, s.latent_acc.p, n, part);
  } else {
    for (int64_t t = 0; t < n; ++t)
      std::memcpy(part + t * dr, s.latent_acc.p + t * d + d0, static_cast<size_t>(dr) * 4);
  }
  if (shared && dr > 0) {
    mm(be, L.ffn_down_shexp.mat, f.up.p, n, f.shared_out.p);
    be.add(part, f.shared_out.p, n * dr);
  }
  ex.run();
}

}  // namespace kimi
