// Kimi Delta Attention recurrence for one head and one token (k3-architecture.md §3.3 step 7).
#pragma once
#include <cstdint>

namespace kimi::kern {

// S: D x D state, S[i*D + j] (i = key index, j = value index), updated in place:
//   S[i][:] *= exp(g[i]);  p = sum_i k[i] S[i][:];  d = beta (v - p);  S[i][:] += k[i] d;
//   o[:] = scale * sum_i q[i] S[i][:]
// q, k already l2-normalised; g = log-space decay per key channel. tmp: D floats scratch.
void kda_step(float* S, const float* q, const float* k, const float* v, const float* g, float beta,
              float scale, float* o, int64_t D, float* tmp);

// Same with the decay already exponentiated: a[i] = exp(g[i]) (the engine computes it for all
// heads and tokens at once with exp_fast in Precision::Fast).
void kda_step_decay(float* S, const float* q, const float* k, const float* v, const float* a, float beta,
                    float scale, float* o, int64_t D, float* tmp);

}  // namespace kimi::kern
