// KDA (Kimi Delta Attention), k3-architecture.md §3.3: projections, causal short conv with the
// sequence's rolling state + SiLU, per-head l2 norm, decay gate, beta, gated delta-rule scan,
// per-head RMSNorm, sigmoid output gate, output projection.
#include <cmath>

#include "model/layers.h"

namespace kimi {

void kda_attention(const PartRun& r, const LayerWeights& L, const SeqStates& conv, const SeqStates& rec,
                   KdaScratch& s, const float* x, float* out) {
  const HParams& hp = r.hp;
  Backend& be = r.be;
  const int64_t n = r.n, H = hp.n_head, D = hp.kda_head_dim, C = H * D;
  const float eps = hp.rms_eps;

  // 1. every projection of x at once: q, k, v, the decay gate's low-rank input, beta, output gate
  r.matmuls<6>(x, n, {&L.attn_q.mat, &L.attn_k.mat, &L.attn_v.mat, &L.ssm_f_a.mat, &L.ssm_beta.mat, &L.ssm_g.mat},
               {s.q.p, s.k.p, s.v.p, s.f_low.p, s.beta.p, s.gate.p});

  // 2. causal depthwise conv (per-sequence state) + SiLU on the three streams
  const float* const conv_w[3] = {L.conv_q.f32, L.conv_k.f32, L.conv_v.f32};
  float* const streams[3] = {s.q.p, s.k.p, s.v.p};
  be.kda_conv_silu(conv_w, hp.conv_kernel, C, conv, r.e, n, streams);

  // 3. l2 norm of q and k per head
  be.l2_norm_rows(s.q.p, n * H, D, eps);
  be.l2_norm_rows(s.k.p, n * H, D, eps);

  // 4. decay gate from the low-rank f projection
  r.matmul(L.ssm_f_b.mat, s.f_low.p, n, s.decay.p);
  be.kda_gate(s.decay.p, L.ssm_dt_b.f32, L.ssm_a.f32, n, H, D, {hp.has_gate_lb, hp.gate_lb});

  // 5. beta = sigmoid(W_beta x)
  be.sigmoid(s.beta.p, n * H);

  // 6. gated delta-rule recurrence (per-sequence state, tokens in order)
  const float scale = 1.0f / std::sqrt(static_cast<float>(D));
  be.kda_scan(rec, r.e, n, H, D, s.q.p, s.k.p, s.v.p, s.decay.p, s.beta.p, scale, s.out.p);

  // 7. per-head RMSNorm (shared weights), sigmoid output gate (W_g x from step 1), output projection
  be.rms_norm_rows(s.out.p, D, L.ssm_norm.f32, s.out.p, D, n * H, D, eps);
  be.mul_sigmoid_rows(s.out.p, s.gate.p, n * H, D);
  r.matmul(L.attn_output.mat, s.out.p, n, out);
}

}  // namespace kimi
