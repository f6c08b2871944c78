// Latent MoE (k3-architecture.md §3.5): router on the full width, routed experts grouped per
// expert on the latent width, latent up-projection, shared experts at full width.
#include "model/expert_cache.h"
#include "model/layers.h"

namespace kimi {

void moe_ffn(const PartRun& r, const LayerWeights& L, MoeScratch& s, FfnScratch& f, const ExpertSite& site,
             const float* x, float* out) {
  const HParams& hp = r.hp;
  Backend& be = r.be;
  const int64_t n = r.n, d = hp.n_embd, k = hp.n_expert_used, E = hp.n_expert;
  const bool latent = hp.n_latent > 0;
  const int64_t Lw = latent ? hp.n_latent : d;

  // 1. router: probabilities, selection (+ bias), weights (unbiased, renormalised, scaled)
  r.matmul(L.ffn_gate_inp.mat, x, n, s.router_logits.p);
  const RouterParams rp{E, k, hp.gating_func == 1, hp.expert_weights_norm, hp.expert_weights_scale};
  be.moe_route(s.router_logits.p, L.exp_probs_b ? L.exp_probs_b.f32 : nullptr, n, rp, s.router_probs.p, s.sel.p,
               s.weights.p);
  // streamed experts: their reads start now and overlap the latent projection and shared experts
  const bool streamed = site.cache && !r.tp && be.host_visible() && site.cache->request(site.layer, s.sel.p, n * k);

  // 2. the routed experts' input: the latent projection of x (or x itself), and the shared experts
  // at full width (added at the end; dense_ffn's steps), their x projections together. Experts on
  // another backend (hybrid mode) with overlap: the latent projection only; the shared experts are
  // recorded after the routed input went to the experts' backend, so the device runs them (and its hot
  // experts) while the host runs its routed experts (docs/gpu.md, "Overlap").
  const bool apart = site.be != nullptr && site.be != &be;
  const bool overlap = apart && site.overlap;
  const float* xl = latent ? s.latent_in.p : x;
  const MatView* wx[3];
  float* yx[3];
  int nx = 0;
  if (latent) wx[nx] = &L.ffn_routed_down.mat, yx[nx++] = s.latent_in.p;
  const int n_latent_mm = nx;
  if (L.ffn_gate_shexp) {
    wx[nx] = &L.ffn_gate_shexp.mat, yx[nx++] = f.gate.p;
    wx[nx] = &L.ffn_up_shexp.mat, yx[nx++] = f.up.p;
  }
  // the shared experts from their x projections on (those from wx[from])
  auto shared_experts = [&](int from) {
    if (nx > from) be.matmul_set(wx + from, yx + from, nx - from, x, n);
    if (L.ffn_gate_shexp) {
      be.situ_rows(f.gate.p, f.up.p, n, L.ffn_gate_shexp.mat.rows, hp.situ_beta, hp.situ_lambda);
      r.matmul(L.ffn_down_shexp.mat, f.gate.p, n, f.shared_out.p);
    }
  };
  if (!apart) {
    shared_experts(0);
  } else {  // the same products in both orders (overlap on or off: bit-identical results)
    if (n_latent_mm) be.matmul_set(wx, yx, n_latent_mm, x, n);
    if (!overlap) shared_experts(n_latent_mm);
  }

  // 3. routed experts, weighted sum (on the experts' backend, with copies when it is another one)
  const ExpertMats em{L.ffn_gate_exps.mat, L.ffn_up_exps.mat, L.ffn_down_exps.mat,
                      L.ffn_gate_exps.slice_bytes, L.ffn_up_exps.slice_bytes, L.ffn_down_exps.slice_bytes,
                      streamed ? site.cache->wait() : nullptr};
  if (!apart) {
    be.moe_experts(em, xl, n, Lw, s.sel.p, s.weights.p, k, E, hp.situ_beta, hp.situ_lambda, s.latent_acc.p);
  } else {
    Backend& xb = *site.be;
    ExpertScratch& es = *site.s;
    // one crossing each way: the routed input, selection and weights to the experts' backend (the
    // device's recorded work up to here runs and is waited for), the routed sum back
    copy_between(xb, es.x.p, be, xl, static_cast<uint64_t>(n * Lw) * 4);
    copy_between(xb, es.sel.p, be, s.sel.p, static_cast<uint64_t>(n * k) * 4);
    copy_between(xb, es.weights.p, be, s.weights.p, static_cast<uint64_t>(n * k) * 4);
    // hot experts (--gpu-experts): the picks of the experts resident on this backend run here, the host
    // skips them (its selection is host memory: the experts' backend is the host's)
    const HotExperts::Layer* hot = site.hot && xb.host_visible() ? site.hot->layer(site.layer) : nullptr;
    if (hot) {
      site.hot->split(site.layer, es.sel.p, es.weights.p, n * k);
      be.moe_experts(hot->mats, xl, n, Lw, site.hot->dev_sel(), site.hot->dev_weights(), k, hot->n, hp.situ_beta,
                     hp.situ_lambda, site.hot->dev_acc());
    }
    if (overlap) {  // the device starts its hot experts and shared experts; the host runs its experts meanwhile
      shared_experts(n_latent_mm);
      be.flush();
    }
    // prefill offload (model/expert_offload.h): a long micro-batch's host picks (all, or the most-picked
    // experts' while the host runs the others) may run here instead; host sum + offloaded sum, in this order
    using Offload = ExpertOffload::Result;
    const Offload off = site.offload ? site.offload->run(site.layer, em, xl, n, Lw, es.sel.p, es.weights.p, k,
                                                         hp.situ_beta, hp.situ_lambda, s.latent_acc.p)
                                     : Offload::None;
    if (off != Offload::All) {
      xb.moe_experts(em, es.x.p, n, Lw, es.sel.p, es.weights.p, k, E, hp.situ_beta, hp.situ_lambda, es.acc.p);
      copy_between(be, s.latent_acc.p, xb, es.acc.p, static_cast<uint64_t>(n * Lw) * 4);
    }
    if (off == Offload::Part) be.add(s.latent_acc.p, site.offload->part_sum(), n * Lw);
    if (hot) be.add(s.latent_acc.p, site.hot->dev_acc(), n * Lw);  // host sum + device sum, in this order
  }

  // 4. back to the full width
  if (latent) {
    if (L.ffn_routed_norm)
      be.rms_norm_rows(s.latent_acc.p, Lw, L.ffn_routed_norm.f32, s.latent_acc.p, Lw, n, Lw, hp.rms_eps);
    r.matmul(L.ffn_routed_up.mat, s.latent_acc.p, n, out);
  } else {
    be.copy(out, s.latent_acc.p, static_cast<uint64_t>(n * d) * 4);
  }

  // 5. shared experts (computed before the routed sum is needed)
  if (L.ffn_gate_shexp) be.add(out, f.shared_out.p, n * d);
}

}  // namespace kimi
