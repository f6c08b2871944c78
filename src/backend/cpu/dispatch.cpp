#include "backend/cpu/dispatch.h"

#include <atomic>
#include <cstdlib>
#include <string>

namespace kimi::kern {

const CpuFeatures& cpu_features() {
  static const CpuFeatures f = [] {
    CpuFeatures c;
#if defined(__x86_64__)
    __builtin_cpu_init();
    c.avx2 = __builtin_cpu_supports("avx2");
    c.fma = __builtin_cpu_supports("fma");
    c.f16c = __builtin_cpu_supports("f16c");
    c.bmi2 = __builtin_cpu_supports("bmi2");
    c.avx512f = __builtin_cpu_supports("avx512f");
    c.avx512bw = __builtin_cpu_supports("avx512bw");
    c.avx512vl = __builtin_cpu_supports("avx512vl");
    c.avx512dq = __builtin_cpu_supports("avx512dq");
    c.avx512vnni = __builtin_cpu_supports("avx512vnni");
    c.avx512bf16 = __builtin_cpu_supports("avx512bf16");
#endif
    return c;
  }();
  return f;
}

Isa best_isa() {
  const auto& c = cpu_features();
  const bool avx2 = c.avx2 && c.fma && c.f16c && c.bmi2;
  if (avx2 && c.avx512f && c.avx512bw && c.avx512vl && c.avx512dq && c.avx512vnni && c.avx512bf16)
    return Isa::Avx512;
  if (avx2) return Isa::Avx2;
  return Isa::Scalar;
}

const char* isa_name(Isa isa) {
  switch (isa) {
    case Isa::Avx512: return "avx512";
    case Isa::Avx2: return "avx2";
    default: return "scalar";
  }
}

std::optional<Isa> isa_from_name(std::string_view name) {
  if (name == "scalar") return Isa::Scalar;
  if (name == "avx2") return Isa::Avx2;
  if (name == "avx512") return Isa::Avx512;
  return std::nullopt;
}

namespace {
std::atomic<int>& isa_state() {
  static std::atomic<int> s = [] {
    Isa isa = best_isa();
    if (const char* env = std::getenv("KIMI_ISA"); env && *env) {
      if (auto want = isa_from_name(env); want && static_cast<int>(*want) < static_cast<int>(isa)) isa = *want;
    }
    return static_cast<int>(isa);
  }();
  return s;
}
}  // namespace

Isa current_isa() { return static_cast<Isa>(isa_state().load(std::memory_order_relaxed)); }

Isa set_isa(Isa want) {
  Isa best = best_isa();
  Isa isa = static_cast<int>(want) < static_cast<int>(best) ? want : best;
  isa_state().store(static_cast<int>(isa), std::memory_order_relaxed);
  return isa;
}

const char* active_isa() { return isa_name(current_isa()); }

}  // namespace kimi::kern
