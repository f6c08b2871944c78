// KDA (Kimi Delta Attention) layer, k3-architecture.md §3.3: batched projections, causal short
// conv with per-sequence state, SiLU, per-head l2 norm, gated delta-rule scan, per-head RMSNorm,
// sigmoid output gate, output projection.
#include <cmath>
#include <cstring>

#include "backend/cpu/conv.h"
#include "backend/cpu/kda.h"
#include "backend/cpu/ops.h"
#include "runtime/context_impl.h"

namespace kimi {

void kda_layer(Context::Impl& c, uint32_t il, const float* y, float* out) {
  const HParams& hp = c.hp;
  const LayerWeights& L = c.model.layer(il);
  const int64_t n = c.n_ub, H = hp.n_head, D = hp.kda_head_dim, C = H * D, K = hp.conv_kernel;
  const int64_t ki = c.kda_idx[il];
  const BatchEntry* e = c.ub;

  // 1. projections
  c.mm(L.attn_q, y, n, c.kq.data());
  c.mm(L.attn_k, y, n, c.kk.data());
  c.mm(L.attn_v, y, n, c.kv.data());

  // 2-3. causal depthwise conv (tokens in batch order, per-sequence state) + SiLU; parallel over
  // channel blocks of the three streams
  const int64_t S = K - 1;
  const bool fast = c.prec == kern::Precision::Fast;
  constexpr int64_t kBlk = 64;
  const int64_t nblk = (C + kBlk - 1) / kBlk;
  c.par(3 * nblk, n * kBlk * K * 2, [&](int64_t item, int) {
    const int64_t which = item / nblk, c0 = (item % nblk) * kBlk, c1 = std::min<int64_t>(C, c0 + kBlk);
    const WeightView& w = which == 0 ? L.conv_q : which == 1 ? L.conv_k : L.conv_v;
    float* buf = which == 0 ? c.kq.data() : which == 1 ? c.kk.data() : c.kv.data();
    float tmp[kBlk];
    for (int64_t t = 0; t < n; ++t) {
      SeqState& ss = c.seqs[static_cast<size_t>(e[t].seq_id)];
      float* st = ss.conv.data() + ki * c.conv_per_layer + which * C * S + c0 * S;
      float* u = buf + t * C + c0;
      kern::conv_step(w.f32 + c0 * K, K, st, u, tmp, c1 - c0);
      if (fast)
        kern::silu_fast(tmp, u, c1 - c0);
      else
        for (int64_t j = 0; j < c1 - c0; ++j) u[j] = tmp[j] / (1.0f + std::exp(-tmp[j]));
    }
  });

  // 4. l2 norm of q and k per head
  const float eps = hp.rms_eps;
  c.par(n * H, D * 6, [&](int64_t i, int) {
    kern::l2_norm(c.kq.data() + i * D, c.kq.data() + i * D, D, eps);
    kern::l2_norm(c.kk.data() + i * D, c.kk.data() + i * D, D, eps);
  });

  // 5. decay gate g (log space) from the low-rank f projection
  c.mm(L.ssm_f_a, y, n, c.kfa.data());
  c.mm(L.ssm_f_b, c.kfa.data(), n, c.kg.data());
  const float* dtb = L.ssm_dt_b.f32;
  const float* ssm_a = L.ssm_a.f32;  // = -exp(A_log)
  c.par(n, C * 16, [&](int64_t t, int) {
    float* g = c.kg.data() + t * C;
    for (int64_t h = 0; h < H; ++h) {
      const float ea = -ssm_a[h];  // exp(A_log) > 0
      if (fast && hp.has_gate_lb) {
        float* gh = g + h * D;
        const float* bh = dtb + h * D;
        for (int64_t i = 0; i < D; ++i) gh[i] = ea * (gh[i] + bh[i]);
        kern::sigmoid_inplace_fast(gh, D);
        for (int64_t i = 0; i < D; ++i) gh[i] *= hp.gate_lb;
        continue;
      }
      for (int64_t i = 0; i < D; ++i) {
        const float a = g[h * D + i] + dtb[h * D + i];
        if (hp.has_gate_lb) {
          g[h * D + i] = hp.gate_lb / (1.0f + std::exp(-ea * a));
        } else {
          const float sp = a > 20.0f ? a : std::log1p(std::exp(a));
          g[h * D + i] = -ea * sp;
        }
      }
    }
    if (fast) kern::exp_fast(g, g, C);  // decay factors exp(g) for kda_step_decay
  });

  // 6. beta
  c.mm(L.ssm_beta, y, n, c.kbeta.data());
  if (fast)
    kern::sigmoid_inplace_fast(c.kbeta.data(), n * H);
  else
    kern::sigmoid_inplace(c.kbeta.data(), n * H);

  // 7. recurrence: heads in parallel, tokens in batch order
  const float scale = 1.0f / std::sqrt(static_cast<float>(D));
  c.par(H, n * D * D * 4, [&](int64_t h, int th) {
    float* tmp = c.th_row.data() + th * c.th_row_stride;  // D floats
    for (int64_t t = 0; t < n; ++t) {
      SeqState& ss = c.seqs[static_cast<size_t>(e[t].seq_id)];
      float* Sm = ss.rec.data() + ki * c.rec_per_layer + h * D * D;
      const int64_t o = t * C + h * D;
      if (fast)
        kern::kda_step_decay(Sm, c.kq.data() + o, c.kk.data() + o, c.kv.data() + o, c.kg.data() + o,
                             c.kbeta[t * H + h], scale, c.ko.data() + o, D, tmp);
      else
        kern::kda_step(Sm, c.kq.data() + o, c.kk.data() + o, c.kv.data() + o, c.kg.data() + o, c.kbeta[t * H + h],
                       scale, c.ko.data() + o, D, tmp);
    }
  });

  // 8. per-head RMSNorm (shared weights), sigmoid gate, output projection
  c.mm(L.ssm_g, y, n, c.kgate.data());
  const float* nw = L.ssm_norm.f32;
  c.par(n * H, D * 20, [&](int64_t i, int) {
    float* o = c.ko.data() + i * D;
    kern::rms_norm(o, nw, o, D, eps);
    if (fast)
      kern::mul_sigmoid_fast(o, c.kgate.data() + i * D, D);
    else
      kern::mul_sigmoid(o, c.kgate.data() + i * D, D);
  });
  c.mm(L.attn_output, c.ko.data(), n, out);
}

}  // namespace kimi
