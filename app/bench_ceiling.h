// `kimi bench`: the machine's ceilings measured in the same run (backend/cpu/ceiling.h), and the
// measured speeds as a share of them: decode as % of the read bandwidth (bytes a token reads x
// tokens/s), prefill as % of the compute peak (the pass's matmul work at the peak of the
// arithmetic each weight's kernel runs, over the measured time).
#pragma once
#include <cstdio>

#include <nlohmann/json.hpp>

#include "backend/cpu/ceiling.h"
#include "backend/placement.h"
#include "model/model.h"

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

struct CeilingReport {
  kern::Ceiling c;
  double tg_bytes_per_token = 0, tg_best = 0, tg_mean = 0;  // t/s
  double pp_best = 0, pp_mean = 0;                          // t/s
  int n_prompt = 0;
  PrefillWork work;
  double tg_pct(double tps) const { return c.read.bytes_per_s > 0 ? 100.0 * tps * tg_bytes_per_token / c.read.bytes_per_s : 0; }
  double pp_ideal_s() const;  // the pass's time at the peaks
  double pp_pct(double tps) const { return tps > 0 && n_prompt > 0 ? 100.0 * pp_ideal_s() / (n_prompt / tps) : 0; }
  void print(FILE* f) const;
  void to_json(nlohmann::ordered_json& j) const;
};

}  // namespace kimi::app
