// Wall time of each part of the forward pass, summed over Forward::run calls (kimi bench prints
// the split). Two clock reads per part per layer (steady_clock, no allocation): nothing measurable
// next to a decoded token. The times are host wall time: on a backend that queues work (Vulkan)
// they show submission, not execution, unless the part synchronises.
#pragma once
#include <chrono>

namespace kimi {

struct PhaseTimes {
  enum Phase : int {
    Kda,      // KDA layers: projections, conv, gate, recurrence, norm, output
    Mla,      // MLA layers without the indexer: projections, cache rows, attention, output
    Indexer,  // DSA indexer: keys, queries, scores, top-k
    Moe,      // MoE FFN layers: router, latent projections, shared experts (the routed experts: Experts)
    Experts,  // MoE FFN layers: the routed experts (grouped per expert, with their copies in hybrid mode)
    Ffn,      // dense FFN layers
    Head,     // final norm + lm head
    Other,    // embeddings, ResMix, norms, residual adds, moving the stream between backends
    Count
  };
  double s[Count] = {};
  // routed-expert picks of the MoE layer steps whose router ran on the host, and the distinct experts
  // among each step's picks, summed (their ratio: the expert-union share of a multi-token step;
  // kimi bench --verify-k)
  uint64_t moe_steps = 0, expert_picks = 0, expert_distinct = 0;
  static const char* name(int p) {
    static const char* const names[Count] = {"kda", "mla", "indexer", "moe", "experts", "ffn", "head", "other"};
    return p >= 0 && p < Count ? names[p] : "?";
  }
  double total() const {
    double t = 0;
    for (double x : s) t += x;
    return t;
  }
  static double now() { return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(); }
};

}  // namespace kimi
