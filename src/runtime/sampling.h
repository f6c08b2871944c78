// Token sampling: greedy, temperature, top-k, top-p, min-p, repetition penalty, seeded RNG.
//
// Order of operations in sample(): repetition penalty on the last `repeat_last_n` accepted tokens
// (positive logits divided by R, negative multiplied) -> if temp <= 0: argmax (lowest id on ties)
// -> top-k -> softmax(logits / temp) -> top-p (smallest prefix of the sorted distribution with
// mass >= p, at least one token) -> min-p (drop p < min_p * p_max) -> renormalise -> draw.
#pragma once
#include <cstdint>
#include <random>
#include <vector>

namespace kimi {

struct SamplerParams {
  float temp = 0.0f;          // <= 0: greedy
  int top_k = 0;              // <= 0: off
  float top_p = 1.0f;         // >= 1: off
  float min_p = 0.0f;         // <= 0: off
  float repeat_penalty = 1.0f;// 1: off
  int repeat_last_n = 64;     // window of recent tokens the penalty looks at (-1: all)
  uint64_t seed = 0;
};

class Sampler {
 public:
  Sampler(const SamplerParams& p, int n_vocab);
  // Picks a token from n_vocab logits (not modified). Does not record it: call accept().
  int32_t sample(const float* logits);
  // Speculative verification (runtime/speculative.h) of a drafted token `draft` against these
  // logits. Greedy: the token sample() returns; accepted = it is `draft`. Sampling: `draft` is kept
  // with probability min(1, p(draft) / q(draft)) (p: the final distribution sample() draws from,
  // q: q_probs[draft], or 1 when q_probs is nullptr), else the token is drawn from max(0, p - q)
  // renormalised (q: q_probs, or 1 at draft only). Does not record the token: call accept().
  int32_t verify(const float* logits, int32_t draft, const float* q_probs, bool& accepted);
  void accept(int32_t token);  // record a token (prompt or generated) for the repetition penalty
  void reserve(size_t n_tokens) { history_.reserve(n_tokens); }  // room for n accepted tokens: no allocation in accept()
  void reset();                // forget accepted tokens, re-seed
  const SamplerParams& params() const { return p_; }

 private:
  SamplerParams p_;
  int n_vocab_;
  std::mt19937_64 rng_;
  std::vector<int32_t> history_;
  struct Cand { float logit; int32_t id; };
  // greedy: the argmax; else fills cand_[0..n) and probs_[0..n) (unnormalised, sum in total)
  int32_t penalise_and_argmax(const float* logits);
  size_t distribution(double& total);
  std::vector<Cand> cand_;     // scratch, sized n_vocab once
  std::vector<float> probs_;
};

}  // namespace kimi
