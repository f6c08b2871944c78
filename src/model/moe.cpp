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

  const bool apart = site.be != nullptr && site.be != &be;
  // experts on the host for a device: the routed input, selection and weights are written side by side
  // (MoeScratch::cross) and cross in one download
  const bool packed = apart && s.cross.p && site.s->pack.p && site.be->host_visible();
  const MoeCrossing cl(n, Lw, k);
  int32_t* sel = packed ? reinterpret_cast<int32_t*>(s.cross.p + cl.sel) : s.sel.p;
  float* weights = packed ? s.cross.p + cl.weights : s.weights.p;

  // 1. router: probabilities, selection (+ bias), weights (unbiased, renormalised, scaled)
  r.matmul(L.ffn_gate_inp.mat, x, n, s.router_logits.p);
  const RouterParams rp{E, k, hp.gating_func == 1, hp.expert_weights_norm, hp.expert_weights_scale};
  be.moe_route(s.router_logits.p, L.exp_probs_b ? L.exp_probs_b.f32 : nullptr, n, rp, s.router_probs.p, sel,
               weights);
  if (r.times && be.host_visible() && E <= 4096) {  // how many distinct experts this step's picks touch
    uint64_t seen[64] = {};
    uint64_t distinct = 0;
    for (int64_t i = 0; i < n * k; ++i) {
      const uint32_t e = static_cast<uint32_t>(sel[i]);
      if (e >= static_cast<uint32_t>(E)) continue;
      const uint64_t bit = uint64_t{1} << (e & 63);
      distinct += (seen[e >> 6] & bit) == 0;
      seen[e >> 6] |= bit;
    }
    ++r.times->moe_steps;
    r.times->expert_picks += static_cast<uint64_t>(n * k);
    r.times->expert_distinct += distinct;
  }
  // streamed experts: their reads start now and overlap the latent projection and shared experts
  const bool streamed = site.cache && !r.tp && be.host_visible() && site.cache->request(site.layer, sel, n * k);

  // 2. the routed experts' input: the latent projection of x (or x itself), and the shared experts
  // at full width (added at the end; dense_ffn's steps), their x projections together. Experts on
  // another backend (hybrid mode) with overlap: the latent projection only; the shared experts are
  // recorded after the routed input went to the experts' backend, so the device runs them (and its hot
  // experts) while the host runs its routed experts (docs/gpu.md, "Overlap").
  const bool overlap = apart && site.overlap;
  float* const lin = packed ? s.cross.p : s.latent_in.p;
  const float* xl = latent ? lin : x;
  const MatView* wx[3];
  float* yx[3];
  int nx = 0;
  if (latent) wx[nx] = &L.ffn_routed_down.mat, yx[nx++] = lin;
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
    if (packed && !latent) be.copy(s.cross.p, x, static_cast<uint64_t>(n * Lw) * 4), xl = s.cross.p;
    if (!overlap) shared_experts(n_latent_mm);
  }

  // 3. routed experts, weighted sum (on the experts' backend, with copies when it is another one); their
  // time moves from Moe to Experts (kimi bench's split)
  const double experts_t0 = PhaseTimes::now();
  const ExpertMats em{L.ffn_gate_exps.mat, L.ffn_up_exps.mat, L.ffn_down_exps.mat,
                      L.ffn_gate_exps.slice_bytes, L.ffn_up_exps.slice_bytes, L.ffn_down_exps.slice_bytes,
                      streamed ? site.cache->wait() : nullptr};
  if (!apart) {
    be.moe_experts(em, xl, n, Lw, sel, weights, k, E, hp.situ_beta, hp.situ_lambda, s.latent_acc.p);
  } else {
    Backend& xb = *site.be;
    ExpertScratch& es = *site.s;
    // one crossing each way: the routed input, selection and weights to the experts' backend (the
    // device's recorded work up to here runs and is waited for; one download when packed), the routed sum back
    float* hx = es.x.p;
    int32_t* hsel = es.sel.p;
    float* hw = es.weights.p;
    if (packed) {
      copy_between(xb, es.pack.p, be, s.cross.p, static_cast<uint64_t>(cl.floats) * 4);
      hx = es.pack.p, hsel = reinterpret_cast<int32_t*>(es.pack.p + cl.sel), hw = es.pack.p + cl.weights;
    } else {
      copy_between(xb, hx, be, xl, static_cast<uint64_t>(n * Lw) * 4);
      copy_between(xb, hsel, be, sel, static_cast<uint64_t>(n * k) * 4);
      copy_between(xb, hw, be, weights, static_cast<uint64_t>(n * k) * 4);
    }
    // hot experts (--gpu-experts): the picks of the experts resident on this backend run here, the host
    // skips them (its selection is host memory: the experts' backend is the host's)
    const HotExperts::Layer* hot = site.hot && xb.host_visible() ? site.hot->layer(site.layer) : nullptr;
    if (hot) {
      site.hot->split(site.layer, hsel, hw, n * k);
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
    const Offload off = site.offload ? site.offload->run(site.layer, em, xl, n, Lw, hsel, hw, k, hp.situ_beta,
                                                         hp.situ_lambda, s.latent_acc.p)
                                     : Offload::None;
    if (off != Offload::All) {
      xb.moe_experts(em, hx, n, Lw, hsel, hw, k, E, hp.situ_beta, hp.situ_lambda, es.acc.p);
      copy_between(be, s.latent_acc.p, xb, es.acc.p, static_cast<uint64_t>(n * Lw) * 4);
    }
    if (off == Offload::Part) be.add(s.latent_acc.p, site.offload->part_sum(), n * Lw);
    if (hot) be.add(s.latent_acc.p, site.hot->dev_acc(), n * Lw);  // host sum + device sum, in this order
  }
  if (r.times) {
    const double dt = PhaseTimes::now() - experts_t0;
    r.times->s[PhaseTimes::Experts] += dt;
    r.times->s[PhaseTimes::Moe] -= dt;
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
