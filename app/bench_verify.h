// kimi bench --verify-k: what a speculative verify step costs (docs/speculative.md). For each k,
// one forward pass of k + 1 tokens of one sequence with logits at every row (the verify step of k
// drafted tokens) against one single-token decode step at the same depth, interleaved over the
// repetitions; the distinct routed experts the step touches (the expert-union share) and the bytes
// it reads; from them the speedup at each acceptance length.
#pragma once
#include <string>
#include <vector>

#include "model/model.h"
#include "runtime/context.h"

namespace kimi::app {

// "1..8", "1,2,4", "4" -> the k values (each 1..256, ascending, distinct); kimi::Error naming --verify-k otherwise
std::vector<int> parse_verify_k(const std::string& s);

struct VerifyBenchOptions {
  std::vector<int> ks;
  int depth = 0;             // sequence length before the step (filled once, untimed)
  bool fill_synthetic = false;
  int reps = 3;
  uint64_t seed = 1;
  std::string output = "md";  // md | json | jsonl
  std::string model_name;
  std::string precision;
};

// Runs the measurement on seq 0 of ctx (n_ctx >= depth + max k + 1, n_batch >= max k + 1) and
// prints the tables. Returns the process exit code.
int run_verify_bench(const Model& model, Context& ctx, const VerifyBenchOptions& o);

}  // namespace kimi::app
