// Internal: the state behind kimi::Context (caches, per-sequence states, preallocated work
// buffers) and the layer functions of the forward pass (src/model/*_layer.cpp).
#pragma once
#include <cstdint>
#include <memory>
#include <vector>

#include "backend/cpu/matmul.h"
#include "backend/cpu/topk.h"
#include "model/model.h"
#include "runtime/context.h"
#include "util/thread_pool.h"

namespace kimi {

struct SeqState {
  int32_t len = 0;
  std::vector<float> conv;  // per KDA layer: [3 (q,k,v)][C][K-1]
  std::vector<float> rec;   // per KDA layer: [H][D (key i)][D (value j)]
  struct Snap {             // KDA states saved when the sequence was `pos` tokens long
    int32_t pos = 0;
    std::vector<float> conv, rec;
  };
  std::vector<Snap> snaps;  // ascending pos (all <= len), at most ContextOptions::n_snapshots_max
};

struct Context::Impl {
  const Model& model;
  const HParams& hp;
  ContextOptions opts;
  ThreadPool pool;
  kern::Precision prec;
  bool cache_f16 = true;
  int top_k = 0;  // effective (0 = indexer off)
  int n_threads = 1;
  int64_t N = 0;  // micro-batch capacity
  Placement placement;  // resolved from opts.placement (one device for now: the CPU)

  // layer -> index among MLA / KDA layers (-1 if other kind)
  std::vector<int32_t> mla_idx, kda_idx;
  uint32_t n_mla = 0, n_kda = 0;

  // caches: per MLA layer, [seq][pos][row] (elements: uint16 F16 or float)
  std::vector<std::vector<uint8_t>> latent;   // row width mla_row()
  std::vector<std::vector<uint8_t>> idx_keys; // row width idx_dim
  std::vector<SeqState> seqs;
  uint64_t conv_per_layer = 0, rec_per_layer = 0;  // floats per KDA layer per sequence

  // the micro-batch being evaluated
  const BatchEntry* ub = nullptr;
  int64_t n_ub = 0;

  // ---- work buffers (sized for N tokens) ----
  std::vector<float> P, h, y, out, ffn_out;
  std::vector<float> bank;       // [n_bank_max][N][d]
  std::vector<float> bank_inv;   // [n_bank_max][N] 1/rms of each bank entry
  uint32_t n_bank_max = 0;
  // KDA
  std::vector<float> kq, kk, kv, kfa, kg, kbeta, kgate, ko;
  // MLA
  std::vector<float> mqa, mq, mkv, mqcat, mz, mo, mgate;
  std::vector<float> iq, ik, iw;                 // indexer q, k, weights
  std::vector<int32_t> sel_idx;                  // [N][sel_cap]
  std::vector<int32_t> sel_n;                    // [N] (-1 = all visible rows)
  int64_t sel_cap = 0;
  std::vector<float> idx_scores, idx_tmp;        // [n_ctx]
  // per-thread scratch
  std::vector<float> th_a, th_b;                 // [threads][N * max(nope, kvl, v)]
  std::vector<float> th_row;                     // [threads][row width]
  std::vector<float> th_scores;                  // [threads][heads_per_item * n_ctx] (dense path)
  std::vector<uint8_t> th_sel;                   // [threads][n_ctx]
  int64_t th_ab_stride = 0, th_row_stride = 0, th_scores_stride = 0;
  int heads_per_item = 1;
  // FFN / MoE
  std::vector<float> fg, fu;                     // [N][max(n_ff, shared width)]
  std::vector<float> rlogits, rprob;             // [N][E]
  std::vector<int32_t> rsel;                     // [N][k]
  std::vector<float> rw;                         // [N][k]
  std::vector<float> lat, lacc;                  // [N][Lw]
  std::vector<float> ex, eg, eu, er;             // per-expert gathers [N][Lw or F]
  std::vector<int32_t> ecount, eoff, etok;       // expert grouping
  std::vector<int32_t> eact;                     // [E] active experts of the batch
  std::vector<float> ewt;
  std::vector<kern::ScoreIdx> rscratch;          // [E]
  // output
  std::vector<float> orows;                      // [N][d]
  std::vector<float> logits;                     // [n_wanted][V] (grows to the largest batch)
  std::vector<int32_t> logit_row;                // per entry of the last batch, -1 = none
  std::vector<int32_t> next_pos;                 // decode() validation scratch [n_seq_max]

  Impl(const Model& m, const ContextOptions& o);
  void run_ubatch(const BatchEntry* e, int64_t n, int64_t logit_base);

  // cache row pointers
  size_t elt() const { return cache_f16 ? 2 : 4; }
  uint8_t* latent_row(uint32_t mi, int32_t seq, int32_t pos) {
    return latent[mi].data() + ((static_cast<size_t>(seq) * opts.n_ctx_max + pos) * hp.mla_row()) * elt();
  }
  uint8_t* idx_row(uint32_t mi, int32_t seq, int32_t pos) {
    return idx_keys[mi].data() + ((static_cast<size_t>(seq) * opts.n_ctx_max + pos) * hp.idx_dim) * elt();
  }
  void store_row(uint8_t* dst, const float* src, int64_t n);

  // parallel_for over n items of ~`work` elementary operations each; runs inline when the whole
  // job is too small to be worth waking the pool (the decode loop issues many tiny jobs)
  template <class F>
  void par(int64_t n, int64_t work, F&& fn) {
    if (n <= 0) return;
    if (n_threads == 1 || n == 1 || n * work < (int64_t{1} << 15)) {
      for (int64_t i = 0; i < n; ++i) fn(i, 0);
      return;
    }
    const auto* fp = &fn;  // one pointer: fits std::function's small buffer (no allocation)
    pool.parallel_for(n, [fp](int64_t i, int th) { (*fp)(i, th); });
  }

  void mm(const WeightView& w, const float* x, int64_t n, float* y) { kern::matmul(w.mat, x, n, y, pool, prec); }
};

// layer functions (src/model/*_layer.cpp): y = normed input [n][d], out = mixer/FFN output [n][d]
void kda_layer(Context::Impl& c, uint32_t il, const float* y, float* out);
void mla_layer(Context::Impl& c, uint32_t il, const float* y, float* out);
void ffn_layer(Context::Impl& c, uint32_t il, const float* y, float* out);

}  // namespace kimi
