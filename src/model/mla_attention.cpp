// MLA (k3-architecture.md §3.4: NoPE, absorbed form) with the K3.1 DSA indexer selecting the rows
// (dsa_indexer.cpp). Steps: query latent -> per-head queries; compressed KV row -> cache;
// indexer selection; absorb W_kb into the queries; attention over the cached latent rows; W_vb
// per head; sigmoid output gate; output projection.
#include <cmath>

#include "model/layers.h"

namespace kimi {

void mla_attention(const PartRun& r, const LayerWeights& L, const MlaCache& cache, MlaScratch& s,
                   IndexerScratch* idx, int top_k, AttnPath path, const float* x, float* out) {
  const HParams& hp = r.hp;
  Backend& be = r.be;
  const int64_t n = r.n, H = hp.n_head, ql = hp.q_lora, kvl = hp.kv_lora, W = hp.mla_row(), vd = hp.n_v;
  const float eps = hp.rms_eps;

  // 1. query latent (normed) and per-head queries; the compressed KV row and the output gate (step 7)
  // are projections of x too: one set
  if (L.attn_gate)
    r.matmuls<3>(x, n, {&L.attn_q_a.mat, &L.attn_kv_a_mqa.mat, &L.attn_gate.mat}, {s.q_latent.p, s.kv_row.p, s.gate.p});
  else
    r.matmuls<2>(x, n, {&L.attn_q_a.mat, &L.attn_kv_a_mqa.mat}, {s.q_latent.p, s.kv_row.p});
  be.rms_norm_rows(s.q_latent.p, ql, L.attn_q_a_norm.f32, s.q_latent.p, ql, n, ql, eps);
  r.matmul(L.attn_q_b.mat, s.q_latent.p, n, s.q.p);

  // 2. compressed KV row [normed latent | pe] -> cache
  be.rms_norm_rows(s.kv_row.p, W, L.attn_kv_a_norm.f32, s.kv_row.p, W, n, kvl, eps);
  be.store_cache_rows(s.kv_row.p, W, r.e, n, cache.latent);

  // 3. which cached rows each query attends to
  if (top_k > 0) {
    const double t0 = PhaseTimes::now();
    dsa_indexer(r, L, cache.index_keys, *idx, top_k, x, s.q_latent.p, s);
    if (r.times) {  // the caller adds the whole of this call to Mla
      const double dt = PhaseTimes::now() - t0;
      r.times->s[PhaseTimes::Indexer] += dt;
      r.times->s[PhaseTimes::Mla] -= dt;
    }
  } else {
    be.set_i32(s.n_selected.p, n, -1);
  }

  // 4. absorption: q_abs,h = W_kb,h^T q_nope,h, concatenated with q_pe,h
  be.mla_absorb_queries(L.attn_k_b.mat, L.attn_k_b.slice_bytes, s.q.p, n, H, hp.n_nope, hp.n_rope, s.q_absorbed.p);

  // 5. attention over the selected latent rows (softmax scale 1/sqrt(key length))
  const float scale = 1.0f / std::sqrt(static_cast<float>(hp.n_kq));
  be.mla_attention(cache.latent, kvl, r.e, n, H, s.q_absorbed.p, s.selected.p, s.n_selected.p, s.sel_cap, scale, path,
                   s.z.p);

  // 6. o_h = W_vb,h z_h
  be.mla_value_heads(L.attn_v_b.mat, L.attn_v_b.slice_bytes, s.z.p, n, H, s.heads_out.p);

  // 7. sigmoid output gate on the concatenated heads, output projection
  if (L.attn_gate) {
    be.mul_sigmoid_rows(s.heads_out.p, s.gate.p, n, H * vd);
  }
  r.matmul(L.attn_output.mat, s.heads_out.p, n, out);
}

}  // namespace kimi
