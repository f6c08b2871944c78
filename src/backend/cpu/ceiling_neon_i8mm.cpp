// The ceiling loops of the neon_i8mm level (ARMv8.6-A + dotprod + i8mm + bf16;
// backend/cpu/ceiling.h): the neon reads and fmla.4s, bfdot for bf16, smmla for int8.
#include "backend/cpu/ceiling.h"

#if defined(__aarch64__)
#include "backend/cpu/ceiling_neon_impl.h"

namespace kimi::kern::detail {
namespace {
double peak(ActType type, int64_t iters, int one) {
  if (type == ActType::F32) return neon_peak_f32(iters, one);
  if (type == ActType::Bf16) {
    float32x4_t acc[kNeonAcc];
    for (auto& a : acc) a = vdupq_n_f32(0.0f);
    const bfloat16x8_t x = vcvtq_low_bf16_f32(vdupq_n_f32(static_cast<float>(one)));
    const bfloat16x8_t y = vcvtq_high_bf16_f32(x, vdupq_n_f32(static_cast<float>(one)));
    for (int64_t i = 0; i < iters; ++i) {
      _Pragma("GCC unroll 16") for (int a = 0; a < kNeonAcc; ++a) acc[a] = vbfdotq_f32(acc[a], y, y);
    }
    return neon_sum(acc, kNeonAcc);
  }
  int32x4_t acc[kNeonAcc];
  for (auto& a : acc) a = vdupq_n_s32(0);
  const int8x16_t x = vdupq_n_s8(static_cast<int8_t>(one));
  for (int64_t i = 0; i < iters; ++i) {
    _Pragma("GCC unroll 16") for (int a = 0; a < kNeonAcc; ++a) acc[a] = vmmlaq_s32(acc[a], x, x);
  }
  return neon_sum(acc, kNeonAcc);
}
}  // namespace

bool ceiling_loops_neon_i8mm(CeilingLoops* out) {
  out->read = neon_read;
  out->peak = peak;
  out->products_per_iter[0] = 4 * kNeonAcc;
  out->products_per_iter[1] = 8 * kNeonAcc;
  out->products_per_iter[2] = 32 * kNeonAcc;
  out->instr[0] = "fmla .4s";
  out->instr[1] = "bfdot .4s";
  out->instr[2] = "smmla .4s";
  return true;
}
}  // namespace kimi::kern::detail

#else
namespace kimi::kern::detail {
bool ceiling_loops_neon_i8mm(CeilingLoops*) { return false; }
}  // namespace kimi::kern::detail
#endif
