// Deterministic top-k selection: the k largest scores, ties broken by the LOWER index (the
// earlier position / lower expert id wins). Result indices are sorted ascending.
#pragma once
#include <cstdint>

namespace kimi::kern {

struct ScoreIdx {
  float score;
  int32_t idx;
};

// Writes min(k, n) indices into out (ascending). `scratch` must hold n entries. NaN scores rank
// lowest. O(n) average (nth_element) + O(k log k).
int64_t topk_indices(const float* scores, int64_t n, int64_t k, int32_t* out, ScoreIdx* scratch);

// Same selection as topk_indices (ties -> lower index, NaN lowest, result ascending) by a threshold:
// nth_element on a float copy finds the k-th largest score, then one pass in index order keeps
// every score above it and the earliest ones equal to it. No final sort. `tmp`: n floats scratch.
int64_t topk_indices_threshold(const float* scores, int64_t n, int64_t k, int32_t* out, float* tmp);

// Same, but returns the selected indices in rank order (best first), as the MoE router wants.
int64_t topk_ranked(const float* scores, int64_t n, int64_t k, int32_t* out, ScoreIdx* scratch);

}  // namespace kimi::kern
