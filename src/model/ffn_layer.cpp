// FFN: dense SiTU MLP (leading layers) and the latent MoE (k3-architecture.md §3.2, §3.5).
// Routed experts run grouped: the tokens routed to each expert are gathered and go through one
// matmul per expert matrix (GEMM in prefill, GEMV in decode).
#include <algorithm>
#include <cmath>
#include <cstring>

#include "backend/cpu/ops.h"
#include "backend/cpu/topk.h"
#include "runtime/context_impl.h"

namespace kimi {

namespace {

void situ_rows(Context::Impl& c, float* g, const float* u, int64_t n, int64_t w) {
  const float beta = c.hp.situ_beta, lambda = c.hp.situ_lambda;
  const bool fast = c.prec == kern::Precision::Fast;
  c.par(n, w * 16, [&](int64_t t, int) {
    if (fast)
      kern::situ_fast(g + t * w, u + t * w, g + t * w, w, beta, lambda);
    else
      kern::situ(g + t * w, u + t * w, g + t * w, w, beta, lambda);
  });
}

// out = W_down situ(W_gate y, W_up y)
void mlp(Context::Impl& c, const WeightView& gate, const WeightView& up, const WeightView& down, const float* y,
         int64_t n, float* out) {
  const int64_t w = gate.mat.rows;
  c.mm(gate, y, n, c.fg.data());
  c.mm(up, y, n, c.fu.data());
  situ_rows(c, c.fg.data(), c.fu.data(), n, w);
  c.mm(down, c.fg.data(), n, out);
}

void moe(Context::Impl& c, const LayerWeights& L, const float* y, float* out) {
  const HParams& hp = c.hp;
  const int64_t n = c.n_ub, d = hp.n_embd, E = hp.n_expert, k = hp.n_expert_used, F = hp.n_ff_exp;
  const bool latent = hp.n_latent > 0;
  const int64_t Lw = latent ? hp.n_latent : d;

  // 1-3. router on the full width: probabilities, selection (+ bias), weights (unbiased, renormalised)
  c.mm(L.ffn_gate_inp, y, n, c.rlogits.data());
  const float* bias = L.exp_probs_b ? L.exp_probs_b.f32 : nullptr;
  for (int64_t t = 0; t < n; ++t) {
    const float* lg = c.rlogits.data() + t * E;
    float* p = c.rprob.data() + t * E;
    if (hp.gating_func == 2) {
      for (int64_t i = 0; i < E; ++i) p[i] = 1.0f / (1.0f + std::exp(-lg[i]));
    } else {
      float mx = lg[0];
      for (int64_t i = 1; i < E; ++i) mx = std::max(mx, lg[i]);
      float s = 0;
      for (int64_t i = 0; i < E; ++i) s += (p[i] = std::exp(lg[i] - mx));
      for (int64_t i = 0; i < E; ++i) p[i] /= s;
    }
    float* choice = c.rlogits.data() + t * E;  // reuse: selection scores
    for (int64_t i = 0; i < E; ++i) choice[i] = p[i] + (bias ? bias[i] : 0.0f);
    int32_t* sel = c.rsel.data() + t * k;
    kern::topk_ranked(choice, E, k, sel, c.rscratch.data());
    float* w = c.rw.data() + t * k;
    float sum = 0;
    for (int64_t j = 0; j < k; ++j) sum += (w[j] = p[sel[j]]);
    if (hp.expert_weights_norm) {
      const float inv = 1.0f / std::max(sum, 6.1035e-5f);
      for (int64_t j = 0; j < k; ++j) w[j] *= inv;
    }
    if (hp.expert_weights_scale != 1.0f)
      for (int64_t j = 0; j < k; ++j) w[j] *= hp.expert_weights_scale;
  }

  // group tokens by expert (expert-major, tokens in batch order)
  std::fill(c.ecount.begin(), c.ecount.end(), 0);
  for (int64_t t = 0; t < n * k; ++t) ++c.ecount[c.rsel[t]];
  c.eoff[0] = 0;
  for (int64_t i = 0; i < E; ++i) c.eoff[i + 1] = c.eoff[i] + c.ecount[i];
  std::fill(c.ecount.begin(), c.ecount.end(), 0);
  for (int64_t t = 0; t < n; ++t)
    for (int64_t j = 0; j < k; ++j) {
      const int32_t ex = c.rsel[t * k + j];
      const int32_t slot = c.eoff[ex] + c.ecount[ex]++;
      c.etok[slot] = static_cast<int32_t>(t);
      c.ewt[slot] = c.rw[t * k + j];
    }

  // 4. latent input
  const float* xl = y;
  if (latent) {
    c.mm(L.ffn_routed_down, y, n, c.lat.data());
    xl = c.lat.data();
  }
  // 5-6. experts, weighted sum in expert order
  std::fill(c.lacc.begin(), c.lacc.begin() + n * Lw, 0.0f);
  if (n * k <= c.N) {
    // all routed slots fit the gather buffers (decode, small batches): every active expert's
    // gate/up rows in ONE parallel job, SiTU, every expert's down rows in one more job
    for (int64_t slot = 0; slot < n * k; ++slot)
      std::memcpy(c.ex.data() + slot * Lw, xl + static_cast<int64_t>(c.etok[slot]) * Lw, static_cast<size_t>(Lw) * 4);
    int32_t* act = c.eact.data();
    int64_t na = 0;
    for (int64_t ex = 0; ex < E; ++ex)
      if (c.eoff[ex + 1] > c.eoff[ex]) act[na++] = static_cast<int32_t>(ex);
    const int64_t want = 4 * static_cast<int64_t>(c.n_threads);
    auto chunks = [&](int64_t rows, int64_t per_expert_items) {  // row chunks (multiples of 16)
      int64_t nch = std::max<int64_t>(1, (want + na * per_expert_items - 1) / (na * per_expert_items));
      int64_t rc = (rows + nch - 1) / nch;
      rc = (rc + 15) / 16 * 16;
      return rc;
    };
    const int64_t rcF = chunks(F, 2), nchF = (F + rcF - 1) / rcF;
    c.par(na * 2 * nchF, Lw * rcF * (n * k / na + 1) * 2, [&](int64_t item, int) {
      const int64_t ex = act[item / (2 * nchF)], which = (item / nchF) % 2, ch = item % nchF;
      const int64_t o = c.eoff[ex], cnt = c.eoff[ex + 1] - o;
      const int64_t r0 = ch * rcF, r1 = std::min(F, r0 + rcF);
      const WeightView& w = which == 0 ? L.ffn_gate_exps : L.ffn_up_exps;
      float* dst = (which == 0 ? c.eg.data() : c.eu.data()) + o * F;
      kern::matmul_rows(w.slice(ex), c.ex.data() + o * Lw, cnt, dst, r0, r1, c.prec);
    });
    situ_rows(c, c.eg.data(), c.eu.data(), n * k, F);
    const int64_t rcL = chunks(Lw, 1), nchL = (Lw + rcL - 1) / rcL;
    c.par(na * nchL, F * rcL * (n * k / na + 1) * 2, [&](int64_t item, int) {
      const int64_t ex = act[item / nchL], ch = item % nchL;
      const int64_t o = c.eoff[ex], cnt = c.eoff[ex + 1] - o;
      const int64_t r0 = ch * rcL, r1 = std::min(Lw, r0 + rcL);
      kern::matmul_rows(L.ffn_down_exps.slice(ex), c.eg.data() + o * F, cnt, c.er.data() + o * Lw, r0, r1, c.prec);
    });
    for (int64_t i = 0; i < na; ++i) {
      const int64_t ex = act[i];
      for (int64_t slot = c.eoff[ex]; slot < c.eoff[ex + 1]; ++slot)
        kern::axpy_f32(c.ewt[slot], c.er.data() + slot * Lw, c.lacc.data() + static_cast<int64_t>(c.etok[slot]) * Lw, Lw);
    }
  } else {
    for (int64_t ex = 0; ex < E; ++ex) {
      const int64_t cnt = c.eoff[ex + 1] - c.eoff[ex];
      if (cnt == 0) continue;
      const int32_t* toks = c.etok.data() + c.eoff[ex];
      const float* wts = c.ewt.data() + c.eoff[ex];
      for (int64_t i = 0; i < cnt; ++i) std::memcpy(c.ex.data() + i * Lw, xl + toks[i] * Lw, Lw * 4);
      kern::matmul(L.ffn_gate_exps.slice(ex), c.ex.data(), cnt, c.eg.data(), c.pool, c.prec);
      kern::matmul(L.ffn_up_exps.slice(ex), c.ex.data(), cnt, c.eu.data(), c.pool, c.prec);
      situ_rows(c, c.eg.data(), c.eu.data(), cnt, F);
      kern::matmul(L.ffn_down_exps.slice(ex), c.eg.data(), cnt, c.er.data(), c.pool, c.prec);
      for (int64_t i = 0; i < cnt; ++i) kern::axpy_f32(wts[i], c.er.data() + i * Lw, c.lacc.data() + toks[i] * Lw, Lw);
    }
  }
  if (latent) {
    if (L.ffn_routed_norm) {
      c.par(n, Lw * 3, [&](int64_t t, int) {
        kern::rms_norm(c.lacc.data() + t * Lw, L.ffn_routed_norm.f32, c.lacc.data() + t * Lw, Lw, hp.rms_eps);
      });
    }
    c.mm(L.ffn_routed_up, c.lacc.data(), n, out);
  } else {
    std::memcpy(out, c.lacc.data(), static_cast<size_t>(n * d) * 4);
  }
  // 7-8. shared experts at full width
  if (L.ffn_gate_shexp) {
    float* sh = c.orows.data();  // free until the lm head
    mlp(c, L.ffn_gate_shexp, L.ffn_up_shexp, L.ffn_down_shexp, y, n, sh);
    for (int64_t i = 0; i < n * d; ++i) out[i] += sh[i];
  }
}

}  // namespace

void ffn_layer(Context::Impl& c, uint32_t il, const float* y, float* out) {
  const LayerWeights& L = c.model.layer(il);
  if (!c.hp.is_moe(il))
    mlp(c, L.ffn_gate, L.ffn_up, L.ffn_down, y, c.n_ub, out);
  else
    moe(c, L, y, out);
}

}  // namespace kimi
