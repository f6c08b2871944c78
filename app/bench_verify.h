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
#include "runtime/speculative.h"

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

// kimi bench --spec TYPE: greedy generation of n_gen tokens with and without speculative decoding,
// interleaved over the repetitions, on a prompt the model repeats: P (n_prompt random tokens), G (the
// model's own greedy continuation of P, n_gen tokens, untimed), then P again — after which the
// model mostly writes G again and an n-gram drafter finds it. Reports t/s (min / median / max) of
// both, drafted and accepted tokens per step, the acceptance length, the verify step's cost
// relative to a decode step and the speedup. Checks that both runs emit the same tokens.
struct SpecBenchOptions {
  int n_prompt = 64, n_gen = 64, reps = 3;
  uint64_t seed = 1;
  std::string output = "md";
  std::string model_name, spec_name;
  // >= 0: instead of `drafter`, one that knows the plain run's answer and drafts it, wrong at this
  // block position (>= --draft-max: always right): a measured step at acceptance length `accept`
  int accept = -1;
};
int run_spec_bench(const Model& model, Context& ctx, Drafter& drafter, const SpecParams& sp,
                   const SpecBenchOptions& o);

}  // namespace kimi::app
