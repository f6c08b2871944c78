// `kimi bench`: the machine's ceilings measured in the same run (backend/cpu/ceiling.h), and the
// measured speeds as a share of them: decode as % of the read bandwidth (bytes a token reads x
// tokens/s), prefill as % of the compute peak (the pass's matmul work at the peak of the
// arithmetic each weight's kernel runs, over the measured time).
#pragma once
#include <cstdio>
#include <string>

#include <nlohmann/json.hpp>

#include "backend/cpu/ceiling.h"
#include "backend/placement.h"
#include "model/model.h"
#include "model/phase_times.h"

namespace kimi::app {

// Multiply-add work (2 ops each) of one prefill pass of n_prompt tokens, per activation arithmetic:
// every matmul weight once per token (routed experts: n_expert_used of n_expert), the output head
// once (the pass wants the last token's logits). The token embedding (a lookup), 1-D tensors,
// attention scores and the KDA recurrence are not counted.
struct PrefillWork {
  double ops[kern::kActTypes] = {};
  double total() const { return ops[0] + ops[1] + ops[2] + ops[3]; }
};
PrefillWork prefill_work(const Model& m, int n_prompt, Precision prec);

// The share of a run that one accelerator of the placement does: the bytes of its weights a decoded token
// reads (routed experts: k of E) and the multiply-add work of its weights in one prefill pass (counted as
// prefill_work does, 2 flops per multiply-add).
struct DeviceShare {
  double tg_bytes_per_token = 0;
  double pp_flops = 0;
  double tg_expert_bytes_per_token = 0, pp_expert_flops = 0;  // the routed experts' part of the two
};
DeviceShare device_share(const Model& m, const Placement& p, int device, int n_prompt);

// The roofline of one prefill pass, per phase of the forward pass (PhaseTimes' parts, grouped):
//   kda            KDA layers' mixer: its projections, and the recurrence (7 flops per state element and
//                  token: the decay multiply and three multiply-adds, kda.h's recurrent form)
//   mla_indexer    MLA layers' mixer with the DSA indexer: projections (attn_k_b / attn_v_b as products
//                  too), attention 2 (2 r + p) flops per head and (query, row) pair it visits (sparse:
//                  min(visible, top_k) rows, dense or without indexer: all visible rows), indexer scores
//                  2 H_I D_I flops per (query, row) pair where the query sees more than top_k rows
//   routed_experts the MoE layers' routed experts: k of E experts per token (the expert tensors)
//   ffn_shared     the rest of the FFN part: dense FFN, router, latent down/up projections, shared experts
//   head           the output matmul for the one token that wants logits
// FLOPs: 2 per multiply-add, matmuls by the arithmetic their kernel runs (prefill_work's rule), the rest
// f32. Bytes read, at least: every weight once per micro-batch (the routed experts: the expected number
// of distinct experts u tokens pick, E (1 - (1 - k/E)^u), uniform routing), the head once; the MLA cache
// rows and indexer keys a micro-batch sees once per micro-batch; the KDA recurrent state once per
// micro-batch. 1-D tensors, the convolution, norms, activations and the embedding lookup are not counted
// (PhaseTimes' "other" has no bound: it counts in the whole pass's time only).
constexpr int kRoofPhases = 5;
const char* roof_phase_name(int p);  // "kda", "mla_indexer", "routed_experts", "ffn_shared", "head"
// which roofline phase a GGUF tensor belongs to (-1: none: the embedding, ResMix scores, norms)
int roof_phase_of(const std::string& tensor, const HParams& hp);

struct RoofWork {
  double ops[kern::kActTypes] = {};  // matmul ops by arithmetic
  double f32_ops = 0;                // the non-matmul work (recurrence, attention, indexer scores), f32
  double weight_bytes = 0;           // weights read over the pass
  double state_bytes = 0;            // caches and states read over the pass
  double flops() const { return ops[0] + ops[1] + ops[2] + ops[3] + f32_ops; }
  double bytes() const { return weight_bytes + state_bytes; }
};

struct RoofInputs {
  int n_prompt = 0;
  int n_ubatch = 512;          // tokens per micro-batch
  int depth = 0;               // positions already in the cache
  Precision prec = Precision::Fast;
  int top_k = 0;               // the indexer's effective top-k (0: off)
  bool sparse = true;          // attention visits only the selected rows (else all visible rows)
  double cache_elem_bytes = 2;  // MLA cache element
  double idx_key_bytes = 0;    // bytes per indexer key row
};

struct Roofline {
  RoofInputs in;
  int micro_batches = 0;
  RoofWork ph[kRoofPhases];
};
Roofline roofline_work(const Model& m, const RoofInputs& in);

// The bound of phase p at the measured peaks: max(compute time, read time); compute time =
// sum over arithmetic of ops / peak (the f32 work at the f32 peak).
struct RoofBound {
  double compute_s = 0, read_s = 0;
  double bound_s() const { return compute_s > read_s ? compute_s : read_s; }
  bool memory_bound() const { return read_s > compute_s; }
};
RoofBound roof_bound(const RoofWork& w, const kern::Ceiling& c);

struct RooflineReport {
  Roofline r;
  double measured_s[kRoofPhases] = {};  // mean wall time of the phase per pass (PhaseTimes)
  double other_s = 0;                   // PhaseTimes' "other" per pass
  double pass_best_s = 0, pass_mean_s = 0;
  double bound_s(const kern::Ceiling& c) const;  // the whole pass at the peaks
  void print(FILE* f, const kern::Ceiling& c) const;
  void to_json(nlohmann::ordered_json& j, const kern::Ceiling& c) const;
};

// The report of a run: the work of that run's prefill (in) and its phase times summed over reps passes.
RooflineReport make_roofline(const Model& m, const RoofInputs& in, const PhaseTimes& sum, int reps, double pass_best_s,
                             double pass_mean_s);

struct CeilingReport {
  kern::Ceiling c;
  double tg_bytes_per_token = 0, tg_best = 0, tg_mean = 0;  // t/s
  double pp_best = 0, pp_mean = 0;                          // t/s
  int n_prompt = 0;
  PrefillWork work;
  double tg_pct(double tps) const { return c.read.bytes_per_s > 0 ? 100.0 * tps * tg_bytes_per_token / c.read.bytes_per_s : 0; }
  double pp_ideal_s() const;  // the pass's time at the peaks
  double pp_pct(double tps) const { return tps > 0 && n_prompt > 0 ? 100.0 * pp_ideal_s() / (n_prompt / tps) : 0; }
  bool with_roofline = false;
  RooflineReport roof;
  void print(FILE* f) const;
  void to_json(nlohmann::ordered_json& j) const;
};

}  // namespace kimi::app
