// Causal depthwise short convolution (KDA q/k/v), one token at a time with a rolling state.
#pragma once
#include <cstdint>

namespace kimi::kern {

// For every channel c < C with kernel K: out[c] = sum_{j<K-1} w[c*K+j]*state[c*(K-1)+j] + w[c*K+K-1]*u[c]
// (tap K-1 = current token, tap 0 = K-1 tokens back), then the state shifts left and takes u[c]
// as its newest entry. state layout: per channel the last K-1 inputs, oldest first.
void conv_step(const float* w, int64_t K, float* state, const float* u, float* out, int64_t C);

}  // namespace kimi::kern
