// Dense SiTU MLP (the leading dense layers and the MoE shared experts; k3-architecture.md §3.2).
#include "model/layers.h"

namespace kimi {

void dense_ffn(const PartRun& r, const WeightView& gate, const WeightView& up, const WeightView& down, FfnScratch& s,
               const float* x, float* out) {
  const int64_t w = gate.mat.rows;
  r.matmuls<2>(x, r.n, {&gate.mat, &up.mat}, {s.gate.p, s.up.p});
  r.be.situ_rows(s.gate.p, s.up.p, r.n, w, r.hp.situ_beta, r.hp.situ_lambda);
  r.matmul(down.mat, s.gate.p, r.n, out);
}

}  // namespace kimi
