// MLA layer (k3-architecture.md §3.4, NoPE, absorbed) with the K3.1 DSA indexer
// (spec/README.md decision 3, dsa-indexer.md §1.2/§4.8).
#include <algorithm>
#include <cmath>
#include <cstring>

#include "backend/cpu/attention.h"
#include "backend/cpu/ops.h"
#include "backend/cpu/topk.h"
#include "runtime/context_impl.h"

namespace kimi {

namespace {

// Indexer scores of one query token against positions [0, nvis) of its sequence:
// score(s) = sum_h w_h * ReLU(q_h . k_s). Parallel over position chunks.
void indexer_scores(Context::Impl& c, uint32_t mi, int32_t seq, const float* q, const float* w, int64_t nvis,
                    float* scores) {
  const int64_t HI = c.hp.idx_heads, DI = c.hp.idx_dim;
  constexpr int64_t kChunk = 256;
  const int64_t nch = (nvis + kChunk - 1) / kChunk;
  const uint8_t* keys = c.idx_row(mi, seq, 0);
  const size_t row_bytes = static_cast<size_t>(DI) * c.elt();
  c.par(nch, kChunk * HI * DI * 2, [&](int64_t ch, int) {
    const int64_t s0 = ch * kChunk, s1 = std::min(nvis, s0 + kChunk);
    kern::indexer_scores(q, w, HI, keys + static_cast<size_t>(s0) * row_bytes, c.cache_f16, DI, s1 - s0, scores + s0);
  });
}

}  // namespace

void mla_layer(Context::Impl& c, uint32_t il, const float* y, float* out) {
  const HParams& hp = c.hp;
  const LayerWeights& L = c.model.layer(il);
  const int64_t n = c.n_ub, H = hp.n_head, ql = hp.q_lora, kvl = hp.kv_lora, pe = hp.n_rope;
  const int64_t nope = hp.n_nope, kq = hp.n_kq, vd = hp.n_v, W = hp.mla_row();
  const uint32_t mi = static_cast<uint32_t>(c.mla_idx[il]);
  const BatchEntry* e = c.ub;
  const float eps = hp.rms_eps;

  // 1. query latent (normed) and per-head queries
  c.mm(L.attn_q_a, y, n, c.mqa.data());
  c.par(n, ql * 3, [&](int64_t t, int) {
    kern::rms_norm(c.mqa.data() + t * ql, L.attn_q_a_norm.f32, c.mqa.data() + t * ql, ql, eps);
  });
  c.mm(L.attn_q_b, c.mqa.data(), n, c.mq.data());

  // 2-3. compressed KV row [normed latent | pe] -> cache
  c.mm(L.attn_kv_a_mqa, y, n, c.mkv.data());
  c.par(n, W * 4, [&](int64_t t, int) {
    float* row = c.mkv.data() + t * W;
    kern::rms_norm(row, L.attn_kv_a_norm.f32, row, kvl, eps);
    c.store_row(c.latent_row(mi, e[t].seq_id, e[t].pos), row, W);
  });

  // DSA indexer: keys for every token (always written), then top-k per query where needed
  const bool use_idx = c.top_k > 0;
  if (use_idx) {
    const int64_t HI = hp.idx_heads, DI = hp.idx_dim;
    c.mm(L.idx_q_b, c.mqa.data(), n, c.iq.data());
    c.mm(L.idx_k, y, n, c.ik.data());
    c.mm(L.idx_proj, y, n, c.iw.data());
    const float wscale = 1.0f / std::sqrt(static_cast<float>(HI * DI));
    c.par(n, DI * 6 + HI, [&](int64_t t, int) {
      float* k = c.ik.data() + t * DI;
      kern::layer_norm(k, L.idx_k_norm_w.f32, L.idx_k_norm_b.f32, k, DI, 1e-6f);
      c.store_row(c.idx_row(mi, e[t].seq_id, e[t].pos), k, DI);
      float* w = c.iw.data() + t * HI;
      for (int64_t h = 0; h < HI; ++h) w[h] *= wscale;
    });
    // In F16-cache mode the query side is dotted against the f16-rounded keys; the current token's
    // own key is read back from the cache like every other key, so prefill == decode.
    for (int64_t t = 0; t < n; ++t) {
      const int64_t nvis = static_cast<int64_t>(e[t].pos) + 1;
      if (c.top_k >= nvis) {
        c.sel_n[t] = -1;  // everything visible is selected: plain attention, no scoring
        continue;
      }
      indexer_scores(c, mi, e[t].seq_id, c.iq.data() + t * HI * DI, c.iw.data() + t * HI, nvis, c.idx_scores.data());
      c.sel_n[t] = static_cast<int32_t>(kern::topk_indices_threshold(
          c.idx_scores.data(), nvis, c.top_k, c.sel_idx.data() + t * c.sel_cap, c.idx_tmp.data()));
    }
  } else {
    for (int64_t t = 0; t < n; ++t) c.sel_n[t] = -1;
  }

  // 4. absorption: q_abs,h = W_kb,h^T q_nope,h (attn_k_b slice h: rows kvl, cols nope); heads in
  // parallel, each thread gathers its head's q_nope for all tokens
  c.par(H, n * nope * kvl * 2, [&](int64_t h, int th) {
    float* a = c.th_a.data() + th * c.th_ab_stride;  // [n][nope]
    float* b = c.th_b.data() + th * c.th_ab_stride;  // [n][kvl]
    for (int64_t t = 0; t < n; ++t) std::memcpy(a + t * nope, c.mq.data() + (t * H + h) * kq, nope * 4);
    kern::matmul_rows(L.attn_k_b.slice(h), a, n, b, 0, kvl, c.prec);
    for (int64_t t = 0; t < n; ++t) {
      float* qc = c.mqcat.data() + (t * H + h) * W;
      std::memcpy(qc, b + t * kvl, kvl * 4);
      std::memcpy(qc + kvl, c.mq.data() + (t * H + h) * kq + nope, pe * 4);
    }
  });

  // 5-6. attention over the selected cache rows (per token, per group of heads)
  const float scale = 1.0f / std::sqrt(static_cast<float>(kq));
  const int64_t hg = c.heads_per_item, ngroups = (H + hg - 1) / hg;
  const bool dense = c.opts.attn == AttnPath::Dense;
  c.par(n * ngroups, (static_cast<int64_t>(e[n - 1].pos) + 1) * hg * W * 4, [&](int64_t item, int th) {
    const int64_t t = item / ngroups, h0 = (item % ngroups) * hg, nh = std::min(hg, H - h0);
    const int32_t seq = e[t].seq_id;
    const int64_t nvis = static_cast<int64_t>(e[t].pos) + 1;
    kern::LatentRows rows{c.latent_row(mi, seq, 0), c.cache_f16, W, kvl};
    const float* q = c.mqcat.data() + (t * H + h0) * W;
    float* z = c.mz.data() + (t * H + h0) * kvl;
    float* rb = c.th_row.data() + th * c.th_row_stride;
    const int32_t ns = c.sel_n[t];
    const int32_t* idx = ns < 0 ? nullptr : c.sel_idx.data() + t * c.sel_cap;
    if (!dense) {
      kern::mla_attend_sparse(q, nh, rows, idx, ns < 0 ? nvis : ns, scale, z, rb);
    } else {
      uint8_t* sel = nullptr;
      if (idx) {
        sel = c.th_sel.data() + static_cast<size_t>(th) * c.opts.n_ctx_max;
        std::memset(sel, 0, static_cast<size_t>(nvis));
        for (int32_t i = 0; i < ns; ++i) sel[idx[i]] = 1;
      }
      kern::mla_attend_dense(q, nh, rows, nvis, sel, scale, z, c.th_scores.data() + th * c.th_scores_stride, rb);
    }
  });

  // o_h = W_vb,h z_h (attn_v_b slice h: rows vd, cols kvl)
  c.par(H, n * kvl * vd * 2, [&](int64_t h, int th) {
    float* a = c.th_a.data() + th * c.th_ab_stride;  // [n][kvl]
    float* b = c.th_b.data() + th * c.th_ab_stride;  // [n][vd]
    for (int64_t t = 0; t < n; ++t) std::memcpy(a + t * kvl, c.mz.data() + (t * H + h) * kvl, kvl * 4);
    kern::matmul_rows(L.attn_v_b.slice(h), a, n, b, 0, vd, c.prec);
    for (int64_t t = 0; t < n; ++t) std::memcpy(c.mo.data() + t * H * vd + h * vd, b + t * vd, vd * 4);
  });

  // 7. sigmoid output gate on the concatenated heads, output projection
  if (L.attn_gate) {
    c.mm(L.attn_gate, y, n, c.mgate.data());
    c.par(n, H * vd * 16, [&](int64_t t, int) {
      if (c.prec == kern::Precision::Fast)
        kern::mul_sigmoid_fast(c.mo.data() + t * H * vd, c.mgate.data() + t * H * vd, H * vd);
      else
        kern::mul_sigmoid(c.mo.data() + t * H * vd, c.mgate.data() + t * H * vd, H * vd);
    });
  }
  c.mm(L.attn_output, c.mo.data(), n, out);
}

}  // namespace kimi
