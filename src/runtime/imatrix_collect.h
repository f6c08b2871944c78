// ImatrixBackend (`kimi imatrix`): a CpuBackend that records the input activations of its matmul()
// moe_experts() and MLA per-head calls into an imatrix::Data (io/imatrix.h; weights are known by the pointers
// place_weight handed out) and then runs the normal CPU kernels, so the forward pass is unchanged.
// A context places every layer and the output on it (ContextOptions::extra_backends +
// n_gpu_layers = -1). For the experts' down projection the input (SiTU(gate x) * up x of each
// expert) is recomputed on the side with the same kernels.
#pragma once
#include <map>
#include <string>
#include <vector>

#include "backend/cpu/cpu_backend.h"
#include "io/imatrix.h"

namespace kimi::imatrix {

class ImatrixBackend : public CpuBackend {
 public:
  ImatrixBackend(ThreadPool& pool, kern::Precision prec, Data& out) : CpuBackend(pool, prec), pool_(pool), d_(out) {}
  const char* name() const override { return "cpu-imatrix"; }
  const uint8_t* place_weight(const std::string& name, const uint8_t* host, uint64_t bytes) override;
  void matmul(const kern::MatView& W, const float* x, int64_t n, float* y) override;
  // every weight of a set through matmul() above (recorded), not the CPU's one-job set
  void matmul_set(const kern::MatView* const* W, float* const* y, int count, const float* x, int64_t n) override {
    Backend::matmul_set(W, y, count, x, n);
  }
  void moe_experts(const ExpertMats& m, const float* x, int64_t n, int64_t width, const int32_t* sel,
                   const float* weights, int64_t n_used, int64_t n_expert, float situ_beta, float situ_lambda,
                   float* acc) override;
  // MLA's per-head matrices (3-D attn_k_b / attn_v_b): one vector and one count per head, as the
  // experts (the input of head h is q_nope of head h, resp. the head's attended latent z).
  void mla_absorb_queries(const kern::MatView& k_b, uint64_t slice_bytes, const float* q, int64_t n, int64_t H,
                          int64_t nope, int64_t pe, float* qcat) override;
  void mla_value_heads(const kern::MatView& v_b, uint64_t slice_bytes, const float* z, int64_t n, int64_t H,
                       float* o) override;

 private:
  const std::string* name_of(const uint8_t* p) const;
  Entry& entry(const std::string& name, int64_t n_in, int64_t n_mat);
  ThreadPool& pool_;
  Data& d_;
  std::map<const uint8_t*, std::string> names_;
  std::vector<float> xg_, g_, u_;  // per-expert scratch for the down projection's input
};

}  // namespace kimi::imatrix
