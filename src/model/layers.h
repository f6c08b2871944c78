// Internal to src/model: the layer parts the forward pass (forward.cpp) calls. Each one is a
// short sequence of backend ops on buffers of that backend: x = the RMS-normed input [n][d],
// out = the part's output [n][d].
#pragma once
#include <cstdint>

#include <vector>

#include "backend/backend.h"
#include "backend/collective.h"
#include "model/model.h"
#include "model/phase_times.h"
#include "model/scratch.h"

namespace kimi {

// Tensor parallelism over ranks (SplitMode::Tensor, docs/distributed.md), made once by Forward:
// - the always-read matrices are split by output rows (rank r computes rows [R*r/P, R*(r+1)/P)),
//   and the rows are all-gathered: each output element is the same dot product as on one
//   process, so the result is bit for bit the single-process one;
// - the routed experts of every MoE layer are split into contiguous ranges; each rank sums its
//   experts' weighted outputs and the partial sums are all-gathered and added in rank order (the
//   same bits on every rank; differs from one process only by the order of the f32 additions).
// Host memory only (the distributed pass runs on the CPU backend). All scratch is sized once.
struct TensorSplit {
  Collective* c = nullptr;
  int rank = 0, size = 1;
  int64_t min_rows = 0;              // matrices with fewer rows are computed whole on every rank
  std::vector<int64_t> expert_lo;    // size + 1 boundaries over the routed experts
  int64_t expert_file_first = 0;     // the first expert the model file holds (a per-rank file: its first)
  std::vector<float> local, gathered;  // [N * max rows] row slices / gathered rows
  std::vector<uint64_t> bytes;       // per-rank payload of the current exchange
  uint64_t weight_bytes = 0;         // bytes of the always-read matrices this rank reads per token

  static void range(int64_t total, int parts, int r, int64_t& lo, int64_t& hi) {
    lo = total * r / parts;
    hi = total * (r + 1) / parts;
  }
  // y (n x W.rows) = W x: this rank's rows, then all-gathered (root >= 0: only root receives)
  void matmul(Backend& be, const MatView& W, const float* x, int64_t n, float* y, int root = -1);
  // acc (count floats, this rank's partial sum) = the sum over ranks in rank order, on every rank
  void sum_partials(Backend& be, float* acc, int64_t count);
};

// what every layer part runs with: the backend, the hyper-parameters, the micro-batch (host),
// and the tensor split when the model runs on several ranks (nullptr: one process)
struct PartRun {
  Backend& be;
  const HParams& hp;
  const BatchEntry* e;
  int64_t n;
  TensorSplit* tp = nullptr;
  PhaseTimes* times = nullptr;  // the forward pass's split (mla_attention moves the indexer's share)
  // y = W x, split over the ranks when tp is set and W is large enough
  void matmul(const MatView& W, const float* x, int64_t nt, float* y) const {
    if (tp && W.rows >= tp->min_rows)
      tp->matmul(be, W, x, nt, y);
    else
      be.matmul(W, x, nt, y);
  }
};

struct MlaCache {
  CacheRows latent;      // normed latent | pe rows
  CacheRows index_keys;  // DSA indexer keys (data == nullptr when the indexer is off)
};

// mla_attention.cpp
void mla_attention(const PartRun& r, const LayerWeights& L, const MlaCache& cache, MlaScratch& s,
                   IndexerScratch* idx, int top_k, AttnPath path, const float* x, float* out);
// dsa_indexer.cpp: keys of the batch into the cache, then per query score -> top-k -> selection
void dsa_indexer(const PartRun& r, const LayerWeights& L, const CacheRows& keys, IndexerScratch& s, int top_k,
                 const float* x, const float* q_latent, MlaScratch& sel);
// kda_attention.cpp
void kda_attention(const PartRun& r, const LayerWeights& L, const SeqStates& conv, const SeqStates& rec,
                   KdaScratch& s, const float* x, float* out);
// dense_ffn.cpp: out = W_down SiTU(W_gate x, W_up x)
void dense_ffn(const PartRun& r, const WeightView& gate, const WeightView& up, const WeightView& down, FfnScratch& s,
               const float* x, float* out);

// every weight view of a layer (absent ones included: test with operator bool)
template <class F>
inline void for_each_layer_weight(LayerWeights& L, F&& f) {
  for (WeightView* w :
       {&L.attn_norm, &L.ffn_norm, &L.attn_res_score, &L.ffn_res_score, &L.attn_q, &L.attn_k, &L.attn_v, &L.conv_q,
        &L.conv_k, &L.conv_v, &L.ssm_f_a, &L.ssm_f_b, &L.ssm_beta, &L.ssm_a, &L.ssm_dt_b, &L.ssm_g, &L.ssm_norm,
        &L.attn_q_a, &L.attn_q_a_norm, &L.attn_q_b, &L.attn_kv_a_mqa, &L.attn_kv_a_norm, &L.attn_k_b, &L.attn_v_b,
        &L.attn_gate, &L.attn_output, &L.idx_q_b, &L.idx_k, &L.idx_k_norm_w, &L.idx_k_norm_b, &L.idx_proj,
        &L.ffn_gate, &L.ffn_up, &L.ffn_down, &L.ffn_gate_inp, &L.exp_probs_b, &L.ffn_gate_exps, &L.ffn_up_exps,
        &L.ffn_down_exps, &L.ffn_routed_down, &L.ffn_routed_up, &L.ffn_routed_norm, &L.ffn_gate_shexp,
        &L.ffn_up_shexp, &L.ffn_down_shexp})
    f(*w);
}

// where a layer's routed experts run: its own FFN backend (remote == nullptr) or another one
struct ExpertSite {
  Backend* be = nullptr;
  ExpertScratch* s = nullptr;
};
// moe.cpp
void moe_ffn(const PartRun& r, const LayerWeights& L, MoeScratch& s, FfnScratch& f, const ExpertSite& experts,
             const float* x, float* out);

}  // namespace kimi
