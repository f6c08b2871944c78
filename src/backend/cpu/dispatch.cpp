#include "backend/cpu/dispatch.h"

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <string>
#if defined(__x86_64__)
#include <cpuid.h>
#endif

namespace kimi::kern {

const CpuFeatures& cpu_features() {
  static const CpuFeatures f = [] {
    CpuFeatures c;
#if defined(__x86_64__)
    __builtin_cpu_init();
    c.avx2 = __builtin_cpu_supports("avx2");
    c.fma = __builtin_cpu_supports("fma");
    {  // CPUID.1:ECX bit 29 (clang before 15 has no "f16c" in __builtin_cpu_supports)
      unsigned a = 0, b = 0, cx = 0, d = 0;
      c.f16c = __get_cpuid(1, &a, &b, &cx, &d) && (cx >> 29 & 1u);
    }
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

bool isa_supported(Isa isa, const CpuFeatures& c) {
  const bool avx2 = c.avx2 && c.fma && c.f16c && c.bmi2;
  switch (isa) {
    case Isa::Scalar: return true;
    case Isa::Avx2: return avx2;
    case Isa::Avx512:
      return avx2 && c.avx512f && c.avx512bw && c.avx512dq && c.avx512vl && c.avx512vnni && c.avx512bf16;
  }
  return false;
}

Isa best_isa_for(const CpuFeatures& c) {
  if (isa_supported(Isa::Avx512, c)) return Isa::Avx512;
  if (isa_supported(Isa::Avx2, c)) return Isa::Avx2;
  return Isa::Scalar;
}

Isa best_isa() {
  static const Isa best = best_isa_for(cpu_features());
  return best;
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

Isa isa_for_env(const char* value, Isa best, std::string* warning) {
  if (warning) warning->clear();
  if (value == nullptr || *value == '\0') return best;
  const auto want = isa_from_name(value);
  if (!want) {
    if (warning)
      *warning = std::string("kimi: warning: KIMI_ISA=\"") + value + "\" is not scalar, avx2 or avx512: ignored (using " +
                 isa_name(best) + ")";
    return best;
  }
  return static_cast<int>(*want) < static_cast<int>(best) ? *want : best;
}

namespace detail {
constinit std::atomic<int> g_isa{-1};

int init_isa() {
  // the level KIMI_ISA asks for, computed once; a concurrent first use waits for the same value
  static const int level = [] {
    std::string warning;
    const Isa isa = isa_for_env(std::getenv("KIMI_ISA"), best_isa(), &warning);
    if (!warning.empty()) std::fprintf(stderr, "%s\n", warning.c_str());
    return static_cast<int>(isa);
  }();
  int expected = -1;  // a set_isa() that ran first wins
  g_isa.compare_exchange_strong(expected, level, std::memory_order_relaxed);
  return g_isa.load(std::memory_order_relaxed);
}
}  // namespace detail

Isa set_isa(Isa want) {
  Isa best = best_isa();
  Isa isa = static_cast<int>(want) < static_cast<int>(best) ? want : best;
  detail::g_isa.store(static_cast<int>(isa), std::memory_order_relaxed);
  return isa;
}

const char* family_name(KernelFamily f) {
  switch (f) {
    case KernelFamily::Matmul: return "matmul";
    case KernelFamily::QuantizeAct: return "quantize_act";
    case KernelFamily::Ops: return "ops";
    case KernelFamily::Attention: return "attention";
    case KernelFamily::Kda: return "kda";
    case KernelFamily::Vec: return "vec";
    case KernelFamily::TopK: return "topk";
    case KernelFamily::Conv: return "conv";
  }
  return "?";
}

const char* kernel_impl(KernelFamily f) { return isa_name(family_isa(f)); }

const char* active_isa() { return isa_name(current_isa()); }

}  // namespace kimi::kern
