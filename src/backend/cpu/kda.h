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

// Chunked (WY) form of the same recurrence: L <= kKdaChunk consecutive tokens of one head at
// once (prefill). Token r's q, k, v, g and o rows are at q + r * ld etc., its beta at
// beta[r * ldb]; g holds log decays, or the decay factors themselves when g_is_decay. With the
// cumulative decay b_r = a_0 ... a_r (a = exp(g), per key channel), the chunk's start state S0
// and the deltas d_r = beta_r (v_r - p_r):
//   p_r = S0^T (b_r k_r) + sum_{s<r} A[r][s] d_s,        A[r][s] = sum_i b_r[i] k_r[i] k_s[i] / b_s[i]
//   o_r = scale (S0^T (b_r q_r) + sum_{s<=r} B[r][s] d_s),  B[r][s] = sum_i b_r[i] q_r[i] k_s[i] / b_s[i]
//   S   = diag(b_{L-1}) S0 + sum_s ((b_{L-1} / b_s) k_s) d_s^T
// i.e. the state is read and written once per chunk instead of once per token, and the work is
// small matrix products. The deltas come from a forward substitution over r. The same result
// as kda_step token by token up to f32 rounding. Returns false, with S and o untouched, when a
// channel's decay over the chunk falls below kKdaMinDecay (1 / b_s would leave the f32 range;
// with the K3 gate lower bound of -5 per token, 16 tokens stay above it): the caller then runs
// kda_step. work: kda_chunk_work_floats(D) floats.
constexpr int64_t kKdaChunk = 16;
constexpr float kKdaMinDecay = 1e-37f;
int64_t kda_chunk_work_floats(int64_t D);
bool kda_chunk(float* S, const float* q, const float* k, const float* v, const float* g, bool g_is_decay,
               const float* beta, int64_t ld, int64_t ldb, int64_t L, float scale, float* o, int64_t D, float* work);

}  // namespace kimi::kern
