#include "backend/cpu/conv.h"

namespace kimi::kern {

void conv_step(const float* w, int64_t K, float* state, const float* u, float* out, int64_t C) {
  const int64_t S = K - 1;
  for (int64_t c = 0; c < C; ++c) {
    const float* wc = w + c * K;
    float* st = state + c * S;
    float acc = 0.0f;
    for (int64_t j = 0; j < S; ++j) acc += wc[j] * st[j];
    acc += wc[S] * u[c];
    for (int64_t j = 0; j + 1 < S; ++j) st[j] = st[j + 1];
    if (S > 0) st[S - 1] = u[c];
    out[c] = acc;
  }
}

}  // namespace kimi::kern
