// The ceiling loops of the neon_dot level (ARMv8.2-A + dotprod; backend/cpu/ceiling.h): the neon
// reads and fmla.4s, sdot for int8 (bf16 weights are widened to f32 at this level).
#include "backend/cpu/ceiling.h"

#if defined(__aarch64__)
#include "backend/cpu/ceiling_neon_impl.h"

namespace kimi::kern::detail {
namespace {
double peak(ActType type, int64_t iters, int one) {
  if (type != ActType::Int8) return neon_peak_f32(iters, one);
  int32x4_t acc[kNeonAcc];
  for (auto& a : acc) a = vdupq_n_s32(0);
  const int8x16_t x = vdupq_n_s8(static_cast<int8_t>(one));
  for (int64_t i = 0; i < iters; ++i) {
    _Pragma("GCC unroll 16") for (int a = 0; a < kNeonAcc; ++a) acc[a] = vdotq_s32(acc[a], x, x);
  }
  return neon_sum(acc, kNeonAcc);
}
}  // namespace

bool ceiling_loops_neon_dot(CeilingLoops* out) {
  out->read = neon_read;
  out->peak = peak;
  out->products_per_iter[0] = 4 * kNeonAcc;
  out->products_per_iter[1] = 4 * kNeonAcc;
  out->products_per_iter[2] = 16 * kNeonAcc;
  out->instr[0] = "fmla .4s";
  out->instr[1] = "fmla .4s (bf16 widened)";
  out->instr[2] = "sdot .4s";
  return true;
}
}  // namespace kimi::kern::detail

#else
namespace kimi::kern::detail {
bool ceiling_loops_neon_dot(CeilingLoops*) { return false; }
}  // namespace kimi::kern::detail
#endif
