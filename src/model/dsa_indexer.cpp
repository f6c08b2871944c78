// The K3.1 DSA indexer (dsa-indexer.md §1.2, §1.4, §1.5; spec/README.md decision 3): every token's key goes into the layer's indexer
// cache; each query that sees more positions than top_k scores them,
//   score(s) = sum_h w_h ReLU(q_h . k_s),
// and keeps the top_k best (ties: the earlier position) as the rows its MLA attention visits.
#include <cmath>

#include "model/layers.h"

namespace kimi {

void dsa_indexer(const PartRun& r, const LayerWeights& L, const CacheRows& keys, IndexerScratch& s, int top_k,
                 const float* x, const float* q_latent, MlaScratch& sel) {
  const HParams& hp = r.hp;
  Backend& be = r.be;
  const int64_t n = r.n, HI = hp.idx_heads, DI = hp.idx_dim;

  // 1. keys (layer-normed) of every token, written to the cache (with the per-head weights of step 2,
  // the other projection of x)
  r.matmuls<2>(x, n, {&L.idx_k.mat, &L.idx_proj.mat}, {s.k.p, s.head_w.p});
  be.layer_norm_rows(s.k.p, L.idx_k_norm_w.f32, L.idx_k_norm_b.f32, n, DI, 1e-6f);
  be.store_cache_rows(s.k.p, DI, r.e, n, keys);

  // 2. queries from the MLA query latent, per-head weights
  r.matmul(L.idx_q_b.mat, q_latent, n, s.q.p);
  be.scale_rows(s.head_w.p, n, HI, 1.0f / std::sqrt(static_cast<float>(HI * DI)));

  // 3. per query: score -> top-k -> selection (queries that see at most top_k positions select
  // everything). The query's own key is read back from the cache like every other key
  // (f16-rounded in F16 mode), so prefill == decode.
  be.indexer_select(keys, r.e, n, s.q.p, s.head_w.p, HI, top_k, sel.selected.p, sel.sel_cap, sel.n_selected.p,
                    s.scores.p, s.topk_tmp.p);
}

}  // namespace kimi
