// Internal to src/model: the layer parts the forward pass (forward.cpp) calls. Each one is a
// short sequence of backend ops on buffers of that backend: x = the RMS-normed input [n][d],
// out = the part's output [n][d].
#pragma once
#include <cstdint>

#include <vector>

#include "backend/backend.h"
#include "backend/collective.h"
#include "model/expert_cache.h"
#include "model/model.h"
#include "model/phase_times.h"
#include "model/scratch.h"

namespace kimi {

// Tensor parallelism over ranks (SplitMode::Tensor, docs/distributed.md), made once by Forward.
// Every rank holds its heads (KDA, MLA and indexer heads: their rows of the projections, their
// slices of k_b / v_b, their KDA states) and its rows of every other split matrix (model/shard.h,
// split_rule), and its contiguous range of routed experts. A block computes its heads locally and
// ends with exchanges that only MOVE values (all-gathers of head outputs and of row slices of the
// output projections): every value is computed by exactly the ops of one process, so the result is
// the single-process one bit for bit. The routed experts' outputs are exchanged per routed slot and
// summed on every rank in the single process's order (ascending expert) with the backend's axpy.
// Host memory only (the distributed pass runs on the CPU backend). All scratch is sized once.
struct TensorSplit {
  Collective* c = nullptr;
  int rank = 0, size = 1;
  std::vector<int64_t> expert_lo;      // size + 1 boundaries over the routed experts
  std::vector<float> local, gathered;  // this rank's packed payload / every rank's, in rank order
  std::vector<uint64_t> bytes;         // per-rank payload of the current exchange
  uint64_t weight_bytes = 0;           // bytes of the always-read matrices this rank reads per token
  // MoE (per routed slot): inputs / outputs of this rank's slots, every rank's slot outputs, the
  // slot of (token, j) in `slot_out`, this rank's expert of each of its slots, unit weights
  std::vector<float> slot_x, slot_y, slot_out, ones;
  std::vector<int32_t> slot_at, slot_expert;
  std::vector<int64_t> counts;         // per-rank floats of a block part

  // units [lo, hi) of `total` units that rank r holds (the same split as model/shard.h)
  void units(int64_t total, int r, int64_t& lo, int64_t& hi) const {
    lo = total * r / size;
    hi = total * (r + 1) / size;
  }
  void units(int64_t total, int64_t& lo, int64_t& hi) const { units(total, rank, lo, hi); }

  // One exchange of up to 4 parts. cols(): rank r contributes columns [u_lo*unit, u_hi*unit) (its
  // units) of every row of full [n][total]; block(): rank r contributes counts[r] floats, placed in
  // rank order at dest. Each returns where this rank writes its own part (the packed payload);
  // run(root) exchanges (root < 0: every rank receives, else only root) and unpacks.
  class Exchange {
   public:
    explicit Exchange(TensorSplit& t) : t_(t) {}
    float* cols(float* full, int64_t n, int64_t total, int64_t unit);
    float* block(float* dest, const int64_t* counts);
    void run(int root = -1);

   private:
    struct Part {
      float* dest = nullptr;
      int64_t n = 0, total = 0, unit = 1;
      const int64_t* counts = nullptr;
    };
    int64_t floats(const Part& p, int r) const;
    TensorSplit& t_;
    Part parts_[4];
    int n_ = 0;
    int64_t used_ = 0;
  };
};

// what every layer part runs with: the backend, the hyper-parameters, the micro-batch (host),
// and the tensor split when the model runs on several ranks (nullptr: one process; the parts
// below then run whole, the *_tp variants of tensor_layers.cpp split)
struct PartRun {
  Backend& be;
  const HParams& hp;
  const BatchEntry* e;
  int64_t n;
  TensorSplit* tp = nullptr;
  PhaseTimes* times = nullptr;  // the forward pass's split (mla_attention moves the indexer's share)
  void matmul(const MatView& W, const float* x, int64_t nt, float* y) const { be.matmul(W, x, nt, y); }
  // several weights on the same input x (Backend::matmul_set): {W, y} pairs
  template <int N>
  void matmuls(const float* x, int64_t nt, const MatView* const (&W)[N], float* const (&y)[N]) const {
    be.matmul_set(W, y, N, x, nt);
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

// tensor_layers.cpp: the same parts over the ranks of r.tp (L: this rank's slices, Forward narrows
// the views), each ending with exchanges that only move values (see TensorSplit)
void kda_attention_tp(const PartRun& r, const LayerWeights& L, const SeqStates& conv, const SeqStates& rec,
                      KdaScratch& s, const float* x, float* out);
void mla_attention_tp(const PartRun& r, const LayerWeights& L, const MlaCache& cache, MlaScratch& s,
                      IndexerScratch* idx, int top_k, AttnPath path, const float* x, float* out);
void dense_ffn_tp(const PartRun& r, const WeightView& gate, const WeightView& up, const WeightView& down,
                  FfnScratch& s, const float* x, float* out);
void moe_ffn_tp(const PartRun& r, const LayerWeights& L, MoeScratch& s, FfnScratch& f, const float* x, float* out);
// the LM head's rows of this rank, gathered on rank 0 (logits: [n][V] there)
void lm_head_tp(TensorSplit& tp, Backend& be, const MatView& W, int64_t V, const float* x, int64_t n, float* logits);

// where a layer's routed experts run: its own FFN backend (remote == nullptr) or another one
// cache: the experts are streamed from disk (model/expert_cache.h), layer il's
struct ExpertSite {
  Backend* be = nullptr;
  ExpertScratch* s = nullptr;
  ExpertCache* cache = nullptr;
  uint32_t layer = 0;
  HotExperts* hot = nullptr;  // --gpu-experts: the FFN backend's resident experts (model/expert_cache.h)
  ExpertOffload* offload = nullptr;  // prefill offload: long micro-batches' host picks may run on the FFN backend
  bool overlap = true;        // experts on another backend: its routed experts run while this one runs the shared
                              // and hot experts (ExpertStreamOptions::hybrid_overlap)
};
// moe.cpp
void moe_ffn(const PartRun& r, const LayerWeights& L, MoeScratch& s, FfnScratch& f, const ExpertSite& experts,
             const float* x, float* out);

}  // namespace kimi
