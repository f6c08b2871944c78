#include "backend/cpu/dispatch.h"

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <string>
#if defined(__x86_64__)
#include <cpuid.h>
#elif defined(__aarch64__) && defined(__linux__)
#include <sys/auxv.h>
#elif defined(__aarch64__) && defined(__APPLE__)
#include <sys/sysctl.h>
#endif

namespace kimi::kern {

int packed_gemv_prefetch_bytes() {
  static const int bytes = cpu_features().intel ? 1024 : 3072;
  return bytes;
}

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
    c.avx512vbmi = __builtin_cpu_supports("avx512vbmi");
    {  // CPUID.(7,0):EDX bits 22 (AMX-BF16), 24 (AMX-TILE), 25 (AMX-INT8)
      unsigned a = 0, b = 0, cx = 0, d = 0;
      if (__get_cpuid_count(7, 0, &a, &b, &cx, &d)) {
        c.amx_bf16 = d >> 22 & 1u;
        c.amx_tile = d >> 24 & 1u;
        c.amx_int8 = d >> 25 & 1u;
      }
    }
    {  // CPUID.0: the vendor string in EBX, EDX, ECX
      unsigned a = 0, b = 0, cx = 0, d = 0;
      c.intel = __get_cpuid(0, &a, &b, &cx, &d) && b == 0x756e6547u && d == 0x49656e69u && cx == 0x6c65746eu;
    }
#elif defined(__aarch64__)
    c.neon = true;  // AdvSIMD is part of every AArch64 CPU
#if defined(__linux__)
    // the kernel's HWCAP bits (Linux and Android; the values of <asm/hwcap.h>)
    const unsigned long hw = getauxval(AT_HWCAP), hw2 = getauxval(AT_HWCAP2);
    c.dotprod = (hw >> 20) & 1;  // HWCAP_ASIMDDP
    c.i8mm = (hw2 >> 13) & 1;    // HWCAP2_I8MM
    c.bf16 = (hw2 >> 14) & 1;    // HWCAP2_BF16
#elif defined(__APPLE__)
    auto flag = [](const char* name) {
      int v = 0;
      size_t len = sizeof v;
      return sysctlbyname(name, &v, &len, nullptr, 0) == 0 && v != 0;
    };
    c.dotprod = flag("hw.optional.arm.FEAT_DotProd");
    c.i8mm = flag("hw.optional.arm.FEAT_I8MM");
    c.bf16 = flag("hw.optional.arm.FEAT_BF16");
#endif
#endif
    return c;
  }();
  return f;
}

namespace {
std::atomic<bool> g_vbmi_on{true};
}
bool vbmi_kernels() { return cpu_features().avx512vbmi && g_vbmi_on.load(std::memory_order_relaxed); }
void set_vbmi_kernels(bool on) { g_vbmi_on.store(on, std::memory_order_relaxed); }

bool isa_supported(Isa isa, const CpuFeatures& c) {
  const bool avx2 = c.avx2 && c.fma && c.f16c && c.bmi2;
  switch (isa) {
    case Isa::Scalar: return true;
    case Isa::Avx2: return avx2;
    case Isa::Avx512:
      return avx2 && c.avx512f && c.avx512bw && c.avx512dq && c.avx512vl && c.avx512vnni && c.avx512bf16;
    case Isa::Neon: return c.neon;
    case Isa::NeonDot: return c.neon && c.dotprod;
    case Isa::NeonI8mm: return c.neon && c.dotprod && c.i8mm && c.bf16;
  }
  return false;
}

Isa best_isa_for(const CpuFeatures& c) {
  if (isa_supported(Isa::Avx512, c)) return Isa::Avx512;
  if (isa_supported(Isa::Avx2, c)) return Isa::Avx2;
  for (Isa isa : {Isa::NeonI8mm, Isa::NeonDot, Isa::Neon})
    if (isa_supported(isa, c)) return isa;
  return Isa::Scalar;
}

Isa best_isa() {
  static const Isa best = best_isa_for(cpu_features());
  return best;
}

std::vector<Isa> supported_isas() {
  std::vector<Isa> v;
  for (Isa isa = best_isa();; isa = lower_isa(isa)) {
    v.insert(v.begin(), isa);
    if (isa == Isa::Scalar) break;
  }
  return v;
}

const char* isa_name(Isa isa) {
  switch (isa) {
    case Isa::Avx512: return "avx512";
    case Isa::Avx2: return "avx2";
    case Isa::Neon: return "neon";
    case Isa::NeonDot: return "neon_dot";
    case Isa::NeonI8mm: return "neon_i8mm";
    default: return "scalar";
  }
}

std::optional<Isa> isa_from_name(std::string_view name) {
  if (name == "scalar") return Isa::Scalar;
  if (name == "avx2") return Isa::Avx2;
  if (name == "avx512") return Isa::Avx512;
  if (name == "neon") return Isa::Neon;
  if (name == "neon_dot") return Isa::NeonDot;
  if (name == "neon_i8mm") return Isa::NeonI8mm;
  return std::nullopt;
}

Isa isa_for_env(const char* value, Isa best, std::string* warning) {
  if (warning) warning->clear();
  if (value == nullptr || *value == '\0') return best;
  const auto want = isa_from_name(value);
  if (!want) {
    if (warning)
      *warning = std::string("kimi: warning: KIMI_ISA=\"") + value +
                 "\" is not scalar, avx2, avx512, neon, neon_dot or neon_i8mm: ignored (using " + isa_name(best) + ")";
    return best;
  }
  return isa_at_most(*want, best) ? *want : best;  // a level of another architecture: best
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
  Isa isa = isa_at_most(want, best) ? want : best;
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
