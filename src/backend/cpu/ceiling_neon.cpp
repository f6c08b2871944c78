// The ceiling loops of the neon level (ARMv8-A AdvSIMD; backend/cpu/ceiling.h): 128-bit stream
// reads, fmla.4s, and smull + sadalp for int8 (this level has no dot-product instruction; bf16
// weights are widened to f32).
#include "backend/cpu/ceiling.h"

#if defined(__aarch64__)
#include "backend/cpu/ceiling_neon_impl.h"

namespace kimi::kern::detail {
namespace {
constexpr int kI8Acc = 8;

double peak(ActType type, int64_t iters, int one) {
  if (type != ActType::Int8) return neon_peak_f32(iters, one);
  int32x4_t acc[kI8Acc];
  for (auto& a : acc) a = vdupq_n_s32(0);
  const int8x8_t x = vdup_n_s8(static_cast<int8_t>(one));
  for (int64_t i = 0; i < iters; ++i) {
    _Pragma("GCC unroll 8") for (int a = 0; a < kI8Acc; ++a) acc[a] = vpadalq_s16(acc[a], vmull_s8(x, x));
  }
  return neon_sum(acc, kI8Acc);
}
}  // namespace

bool ceiling_loops_neon(CeilingLoops* out) {
  out->read = neon_read;
  out->peak = peak;
  out->products_per_iter[0] = 4 * kNeonAcc;
  out->products_per_iter[1] = 4 * kNeonAcc;
  out->products_per_iter[2] = 8 * kI8Acc;
  out->instr[0] = "fmla .4s";
  out->instr[1] = "fmla .4s (bf16 widened)";
  out->instr[2] = "smull+sadalp";
  return true;
}
}  // namespace kimi::kern::detail

#else
namespace kimi::kern::detail {
bool ceiling_loops_neon(CeilingLoops*) { return false; }
}  // namespace kimi::kern::detail
#endif
