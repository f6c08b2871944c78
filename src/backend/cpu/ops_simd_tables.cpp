// The SIMD primitive tables of ops_simd.h, one per level that has them, and simd_ops(). Compiled
// without ISA flags: it only takes addresses. A level of another architecture has no table (its
// files compile to nothing there), and the dispatch never selects it.
#include "backend/cpu/ops_simd.h"

namespace kimi::kern {

namespace {
#define KIMI_SIMD_TABLE(ns, idx_i8, chunk, idx_prep)                                                          \
  SimdOps {                                                                                                   \
    ns::dot_f32, ns::sum_sq, ns::dot_f16, ns::axpy_f32, ns::axpy_f16, ns::f16_to_f32_row, ns::f32_to_f16_row, \
        ns::sigmoid_inplace, ns::silu, ns::situ, ns::mul_sigmoid, ns::exp_row, ns::indexer_scores,             \
        ns::block_scores, ns::attn_accumulate, ns::kda_step, idx_i8, chunk, idx_prep                          \
  }
#if defined(__x86_64__)
const SimdOps kAvx512 =
    KIMI_SIMD_TABLE(avx512, avx512::indexer_scores_i8, avx512::kda_chunk, avx512::indexer_scores_prepared);
#endif
#if defined(__aarch64__)
const SimdOps kNeon = KIMI_SIMD_TABLE(neon, nullptr, nullptr, nullptr);
#endif
#undef KIMI_SIMD_TABLE
}  // namespace

const SimdOps* simd_ops(KernelFamily f) {
  switch (family_isa(f)) {
#if defined(__x86_64__)
    case Isa::Avx512: return &kAvx512;
#endif
#if defined(__aarch64__)
    case Isa::Neon: return &kNeon;
#endif
    default: return nullptr;
  }
}

}  // namespace kimi::kern
