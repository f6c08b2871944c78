// The Kimi-K3 / K3.1 forward pass over one or more backends (src/backend/backend.h):
//
//   embeddings -> for each layer: [ResMix] -> RMSNorm -> MLA (+ DSA indexer) or KDA -> residual
//                                 [ResMix] -> RMSNorm -> dense SiTU MLP or latent MoE -> residual
//              -> [ResMix] -> RMSNorm -> lm head
//
// (k3-architecture.md §3.1; forward.cpp reads top to bottom in this order.) Every part of a
// layer runs on the backend the Placement gives it; the residual stream is copied when
// consecutive parts are on different backends, the routed experts' inputs and outputs when the
// experts are placed apart from their layer. Caches and states live in one StateStore per
// backend. The runtime (runtime/context.h) owns sequences and batching and calls run().
#pragma once
#include <cstdint>
#include <memory>
#include <vector>

#include "backend/backend.h"
#include "backend/collective.h"
#include "backend/placement.h"
#include "backend/state_store.h"
#include "model/expert_cache.h"
#include "model/model.h"
#include "model/phase_times.h"
#include "model/scratch.h"

namespace kimi {

struct TensorSplit;  // model/layers.h

struct ForwardOptions {
  int n_seq = 1;          // sequence ids 0..n_seq-1
  int n_ctx = 1;          // positions per sequence
  int n_batch = 1;        // tokens per run() (micro-batch capacity)
  int top_k = 0;          // DSA top-k (0 = indexer off, plain attention)
  AttnPath attn = AttnPath::Sparse;
  bool cache_f16 = true;  // cache element type
  bool index_i8 = false;  // DSA indexer keys as int8 rows (CPU backend only; CacheRows::i8)
  int n_snapshots = 1;    // KDA snapshot slots per sequence
  // Several ranks (docs/distributed.md): every rank builds the same Forward; rank 0 calls the
  // methods below, the other ranks call serve_worker(), which replays them. nullptr or one rank:
  // a single process.
  Collective* coll = nullptr;
  SplitMode split = SplitMode::Tensor;
  // routed experts on the host streamed from disk under a memory budget (model/expert_cache.h;
  // one process only)
  ExpertStreamOptions stream;
};


class Forward {
 public:
  // backends[0] is the host CPU backend; placement.devices must match backends in number.
  Forward(const Model& m, const std::vector<Backend*>& backends, const Placement& placement, const ForwardOptions& o);
  ~Forward();

  // Evaluates n <= n_batch tokens (the caller validated them: positions continue each sequence)
  // and writes the logits of the entries with want_logits, in order, to logits (host, rows of V).
  // embd (host, optional): per entry a row of n_embd floats that replaces its token_embd row
  // (docs/spec/vision.md §4), or nullptr.
  void run(const BatchEntry* e, int64_t n, float* logits, const float* const* embd = nullptr);

  // Hidden-state taps for a draft model (docs/spec/dspark.md §3.1): after each run() the residual
  // stream after each of `layers` (0-based, ascending) for every row of that run, on the host:
  // dst[(k * n + t) * n_embd ..] for tap k and row t of the n rows. dst holds n_batch rows per tap
  // layer and outlives the taps. An empty list turns them off. One process only (no MPI ranks).
  void set_taps(std::vector<uint32_t> layers, float* dst);

  // per-sequence caches and states, on every backend
  void seq_clear(int32_t seq);
  void seq_copy(int32_t src, int32_t dst, int32_t n_rows);
  void snapshot_save(int32_t seq, int32_t slot);
  void snapshot_restore(int32_t src, int32_t slot, int32_t dst);
  void snapshot_copy(int32_t src, int32_t dst, int32_t slot);
  // benchmark fill: pseudo-random cache rows 0..n-1 of seq (see Context::seq_fill_synthetic)
  void fill_synthetic(int32_t seq, int32_t n, uint64_t seed);
  // host copies of a sequence for the prompt cache (Context::seq_save_rows ...; one process only):
  // every backend's store in turn, in StateStore's layout
  std::vector<uint64_t> row_parts() const;
  uint64_t kda_state_bytes() const;
  void save_rows(int32_t seq, int32_t from, int32_t to, uint8_t* host) const;
  void load_rows(int32_t seq, int32_t from, int32_t to, const uint8_t* host);
  void save_state(int32_t seq, int32_t slot, uint8_t* host) const;  // slot -1: current states
  void load_state(int32_t seq, const uint8_t* host);

  // Ranks > 0: replay rank 0's calls until rank 0's Forward is destroyed.
  void serve_worker();
  bool is_worker() const;
  // Rank 0: every rank's traffic (gathered); reset = zero the communication counters after.
  std::vector<RankTraffic> traffic(bool reset);

  // wall time per part of the forward pass since the last reset (this process's share only)
  const PhaseTimes& phase_times() const { return phase_; }
  void reset_phase_times() { phase_ = {}; }

  const Placement& placement() const { return place_; }
  uint64_t cache_bytes() const;
  uint64_t state_bytes() const;
  uint64_t work_bytes() const;  // scratch of every part and backend
  // counters of the expert stream (enabled == false: experts read through the mapping)
  ExpertStreamStats expert_stream_stats() const;

  struct Device;  // per-backend scratch and store (forward.cpp)
  struct Dist;    // the ranks: split, worker protocol (forward_dist.cpp)

 private:
  void move_residual(int& dev, int to, int64_t n, uint32_t nb);
  void copy_tap(uint32_t il, int dev, int64_t n);
  void run_local(const BatchEntry* e, int64_t n, float* logits, const float* const* embd = nullptr);
  void seq_clear_local(int32_t seq);
  void seq_copy_local(int32_t src, int32_t dst, int32_t n_rows);
  void snapshot_save_local(int32_t seq, int32_t slot);
  void snapshot_restore_local(int32_t src, int32_t slot, int32_t dst);
  void snapshot_copy_local(int32_t src, int32_t dst, int32_t slot);
  void fill_synthetic_local(int32_t seq, int32_t n, uint64_t seed);
  void setup_dist();
  void size_dist();
  TensorSplit* tensor_split();
  int64_t kda_heads_here() const;  // KDA heads whose states this rank keeps (all without a tensor split)
  bool layer_mode_logits(int64_t nw, float* logits);
  // layer mode: does this rank run layer il (always true without ranks)
  bool owns_layer(uint32_t il) const;
  void pass_layer_boundary(uint32_t il, int64_t n, uint32_t nb);
  float* layer_logits();
  std::unique_ptr<Dist> dist_;
  const Model& model_;
  const HParams& hp_;
  ForwardOptions opts_;
  PhaseTimes phase_;
  Placement place_;
  std::vector<std::unique_ptr<Device>> devs_;
  std::vector<LayerWeights> layers_;      // weights as placed (data on their backend)
  WeightView token_embd_, output_, output_norm_, output_res_score_;
  std::vector<int32_t> cache_slot_;       // layer -> MLA or KDA slot in its attn backend's store
  std::vector<int32_t> wanted_;           // rows of the micro-batch that want logits (host)
  std::vector<uint32_t> taps_;            // layers whose output stream is copied out (set_taps)
  float* taps_dst_ = nullptr;
  uint32_t n_bank_max_ = 0;
  std::unique_ptr<ExpertCache> xcache_;   // routed experts streamed from disk (nullptr: mapping)
  std::unique_ptr<HotExperts> hot_;       // --gpu-experts: hot experts on the FFN's accelerator (nullptr: none)
  std::unique_ptr<ExpertOffload> offload_;  // prefill offload in hybrid mode (nullptr: no hybrid layer)
};

}  // namespace kimi
