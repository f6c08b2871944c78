// Work buffers of the forward pass, grouped by the layer part that uses them, each allocated once
// (sized for a full micro-batch of N tokens) from the backend that runs that part. Nothing here
// is allocated in the decode loop. Shapes are [tokens][...] row-major f32 unless noted.
#pragma once
#include <cstdint>
#include <memory>

#include "backend/backend.h"

namespace kimi {

// a typed view of one backend buffer
template <class T>
struct Buf {
  std::unique_ptr<Buffer> buf;
  T* p = nullptr;
  void alloc(Backend& be, int64_t count, const char* what) {
    buf = be.alloc(static_cast<uint64_t>(count > 0 ? count : 0) * sizeof(T), what);
    p = buf->as<T>();
  }
  uint64_t bytes() const { return buf ? buf->bytes() : 0; }
};

// The residual stream of the micro-batch and the ResMix bank (every backend that runs a part).
struct ResidualScratch {
  Buf<float> stream;     // [N][d] the residual (hidden state) between layer parts
  Buf<float> mixed;      // [N][d] ResMix of bank + stream: the input of the next norm
  Buf<float> normed;     // [N][d] RMS-normed input of the mixer / FFN
  Buf<float> mixer_out;  // [N][d] attention (MLA or KDA) output
  Buf<float> ffn_out;    // [N][d] FFN / MoE output
  Buf<float> bank;       // [n_bank][N][d] block outputs kept for ResMix
  Buf<float> bank_inv;   // [n_bank][N] 1 / rms of each bank entry
};

struct MlaScratch {
  Buf<float> q_latent;    // [N][q_lora] query latent (normed in place)
  Buf<float> q;           // [N][H][nope + rope] per-head queries
  Buf<float> kv_row;      // [N][kv_lora + rope] compressed KV row (normed latent | pe) before caching
  Buf<float> q_absorbed;  // [N][H][kv_lora + rope] W_kb^T q_nope | q_pe
  Buf<float> z;           // [N][H][kv_lora] attention read-out in latent space
  Buf<float> heads_out;   // [N][H * v] W_vb z per head, concatenated
  Buf<float> gate;        // [N][H * v] output gate logits
  Buf<int32_t> selected;  // [N][sel_cap] DSA-selected positions per query (ascending)
  Buf<int32_t> n_selected;  // [N] how many; -1 = every visible position
  int64_t sel_cap = 0;
};

struct IndexerScratch {
  Buf<float> q;        // [N][H_I * D_I] indexer queries
  Buf<float> k;        // [N][D_I] indexer keys (layer-normed) before caching
  Buf<float> head_w;   // [N][H_I] per-head weights (scaled by 1/sqrt(H_I * D_I))
  Buf<float> scores;   // [n_ctx] scores of one query over its visible positions
  Buf<float> topk_tmp; // [n_ctx] top-k threshold scratch
};

struct KdaScratch {
  Buf<float> q, k, v;   // [N][C] projections, then conv + SiLU (+ l2 norm for q, k)
  Buf<float> f_low;     // [N][rank] low-rank decay projection
  Buf<float> decay;     // [N][C] per-key-channel decay (form chosen by the backend's kda_gate)
  Buf<float> beta;      // [N][H] delta-rule step size
  Buf<float> gate;      // [N][C] output gate logits
  Buf<float> out;       // [N][C] recurrence read-out, then normed and gated
};

struct FfnScratch {       // dense SiTU MLP (leading layers and the MoE shared experts)
  Buf<float> gate, up;    // [N][max(n_ff, shared width)]
  Buf<float> shared_out;  // [N][d] shared-expert output (MoE layers)
};

// Hybrid mode (the routed experts on another backend than the FFN): the routed input of n tokens, their
// selection and weights side by side in one buffer, so that one download carries them (one wait):
// [x: n * Lw][sel: n * k int32][weights: n * k], each part starting on 64 bytes; offsets in floats.
struct MoeCrossing {
  int64_t sel = 0, weights = 0, floats = 0;
  MoeCrossing(int64_t n, int64_t Lw, int64_t k) {
    auto a = [](int64_t v) { return (v + 15) / 16 * 16; };
    sel = a(n * Lw), weights = sel + a(n * k), floats = weights + n * k;
  }
};

struct MoeScratch {
  Buf<float> cross;          // MoeCrossing(N, Lw, k) on a device whose layers' experts run elsewhere, else none
  Buf<float> router_logits;  // [N][E] (then the selection scores)
  Buf<float> router_probs;   // [N][E]
  Buf<int32_t> sel;          // [N][k] chosen experts, ranked
  Buf<int32_t> sel_local;    // [N][k] expert parallelism: this rank's experts (index - first), else -1
  Buf<float> weights;        // [N][k] their weights
  Buf<float> latent_in;      // [N][Lw] routed-expert input (latent projection of the normed x)
  Buf<float> latent_acc;     // [N][Lw] weighted sum of the routed experts' outputs
};

// The routed experts' inputs and output on a backend other than their layer's FFN backend.
struct ExpertScratch {
  Buf<float> pack;       // the host's copy of MoeScratch::cross (experts run for a device), else none
  Buf<float> x;          // [N][Lw]
  Buf<int32_t> sel;      // [N][k]
  Buf<float> weights;    // [N][k]
  Buf<float> acc;        // [N][Lw]
};

struct HeadScratch {
  Buf<float> rows;    // [N][d] final-normed rows of the tokens that want logits
  Buf<float> logits;  // [N][V] only on a backend the host cannot read (else written in place)
};

}  // namespace kimi
