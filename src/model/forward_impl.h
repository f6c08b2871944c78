// Internal to src/model: what Forward keeps per backend (Device) and, with several ranks, the
// split and the worker protocol's state (Dist). forward.cpp and forward_dist.cpp share these.
#pragma once
#include <memory>
#include <vector>

#include "backend/collective.h"
#include "model/forward.h"
#include "model/layers.h"

namespace kimi {

// What one backend holds for this forward pass: its store (caches/states of the layers whose
// attention it runs) and the scratch of the part kinds it runs.
struct Forward::Device {
  Backend* be = nullptr;
  std::unique_ptr<StateStore> store;
  bool runs_any = false, runs_mla = false, runs_kda = false, runs_dense = false, runs_moe = false;
  bool runs_remote_experts = false, runs_output = false;
  bool moe_apart = false;  // a MoE layer's FFN runs here and its routed experts on another backend
  int n_mla = 0, n_kda = 0;
  ResidualScratch res;
  MlaScratch mla;
  IndexerScratch idx;
  KdaScratch kda;
  FfnScratch ffn;
  MoeScratch moe;
  ExpertScratch experts;
  HeadScratch head;
};

// the traffic record as it travels (plain words)
struct TrafficWire {
  uint64_t dense = 0, experts = 0, experts_tok = 0, sent = 0, received = 0, calls = 0;
  double seconds = 0;
  uint64_t rss = 0, model_rss = 0;
};

struct Forward::Dist {
  Collective* c = nullptr;
  int rank = 0, size = 1;
  SplitMode mode = SplitMode::Tensor;
  TensorSplit tp;                      // tensor mode
  std::vector<uint32_t> layer_lo;      // layer mode: size + 1 boundaries over the layers
  std::vector<BatchEntry> batch;       // workers: the micro-batch being replayed
  std::vector<float> logits;           // layer mode, last rank: [N][V] before the send to rank 0
  std::vector<TrafficWire> traffic;    // rank 0: gathered records
  std::vector<uint64_t> bytes;         // per-rank payloads
  uint64_t dense_bytes = 0, expert_bytes = 0, expert_tok = 0;
  bool closed = false;

  int owner(uint32_t il) const {
    int r = 0;
    while (r + 1 < size && il >= layer_lo[static_cast<size_t>(r) + 1]) ++r;
    return r;
  }
};

}  // namespace kimi
