// Internal to src/model: the layer parts the forward pass (forward.cpp) calls. Each one is a
// short sequence of backend ops on buffers of that backend: x = the RMS-normed input [n][d],
// out = the part's output [n][d].
#pragma once
#include <cstdint>

#include "backend/backend.h"
#include "model/model.h"
#include "model/scratch.h"

namespace kimi {

// what every layer part runs with: the backend, the hyper-parameters, the micro-batch (host)
struct PartRun {
  Backend& be;
  const HParams& hp;
  const BatchEntry* e;
  int64_t n;
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

// where a layer's routed experts run: its own FFN backend (remote == nullptr) or another one
struct ExpertSite {
  Backend* be = nullptr;
  ExpertScratch* s = nullptr;
};
// moe.cpp
void moe_ffn(const PartRun& r, const LayerWeights& L, MoeScratch& s, FfnScratch& f, const ExpertSite& experts,
             const float* x, float* out);

}  // namespace kimi
