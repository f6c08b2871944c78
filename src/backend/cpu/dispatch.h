// Run-time CPU dispatch for ALL the CPU kernels (matmul and its activation preparation, ops,
// attention, KDA, bf16 rows, top-k, conv): one ISA level, detected once (__builtin_cpu_supports on
// x86-64, the HWCAP bits of getauxval on aarch64 Linux/Android, sysctl on Apple); env
// KIMI_ISA=scalar|avx2|avx512|neon|neon_dot|neon_i8mm (read on first use) or set_isa() can force a
// LOWER level of the same chain, never a higher one, and every kernel family follows it.
// The levels form one chain per architecture: scalar < avx2 < avx512 on x86-64,
// scalar < neon < neon_dot < neon_i8mm on aarch64 (lower_isa). Code in *_avx2.cpp / *_avx512.cpp is only
// reached after this check, through family_isa() (or the matmul kernel tables below).
//
// One feature set per level, the exact set its files are compiled with (CMakeLists.txt):
//   avx2   = AVX2 + FMA + F16C + BMI2                          (*_avx2.cpp)
//   avx512 = avx2 + AVX-512 F + BW + DQ + VL + VNNI + BF16     (*_avx512.cpp)
//   neon      = ARMv8-A AdvSIMD (every aarch64 CPU)                   (*_neon.cpp)
//   neon_dot  = neon + dotprod (SDOT)                               (*_neon_dot.cpp)
//   neon_i8mm = neon_dot + i8mm (SMMLA) + bf16 (BFDOT)               (*_neon_i8mm.cpp)
// Every *_avx512.cpp file gets all six AVX-512 flags, so the compiler may emit any of them there:
// a CPU with AVX-512F but without VNNI or BF16 (Skylake-X) runs the avx2 level for every family.
//
// A family without code at a level uses the next lower level it has (family_isa): ops,
// attention, KDA, bf16 rows and the activation preparation have scalar + avx512 code, matmul
// scalar + avx2 + avx512 (per weight type: AVX2 has no Q5_0 / Q5_1 kernel), top-k and conv are
// portable only. On aarch64: matmul has code at every NEON level (per weight type: the K-quants and
// F16 have no i8mm variant and take neon_dot's); ops, attention and KDA have neon code.
#pragma once
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "backend/cpu/matmul.h"

namespace kimi::kern {

enum class Isa : int { Scalar = 0, Avx2 = 1, Avx512 = 2, Neon = 3, NeonDot = 4, NeonI8mm = 5 };
constexpr int kIsaLevels = 6;

// The next lower level of isa's chain (Scalar for Scalar, Avx2, Neon).
constexpr Isa lower_isa(Isa isa) {
  switch (isa) {
    case Isa::Avx512: return Isa::Avx2;
    case Isa::NeonI8mm: return Isa::NeonDot;
    case Isa::NeonDot: return Isa::Neon;
    default: return Isa::Scalar;
  }
}
// Whether a is b or a level below it in b's chain.
constexpr bool isa_at_most(Isa a, Isa b) {
  for (;; b = lower_isa(b)) {
    if (a == b) return true;
    if (b == Isa::Scalar) return false;
  }
}

struct CpuFeatures {
  bool avx2 = false, fma = false, f16c = false, bmi2 = false;
  bool avx512f = false, avx512bw = false, avx512vl = false, avx512dq = false;
  bool avx512vnni = false, avx512bf16 = false, avx512vbmi = false;  // vbmi: optional kernels (MXFP4 GEMV)
  bool amx_tile = false, amx_bf16 = false, amx_int8 = false;  // CPUID only (the OS grant: amx_bf16_usable)
  bool neon = false, dotprod = false, i8mm = false, bf16 = false;  // aarch64
  bool intel = false;  // x86 vendor "GenuineIntel" (per-vendor tuning, never a feature test)
};
const CpuFeatures& cpu_features();
// The packed Q4_K GEMV's software prefetch distance, bytes ahead of the block being read: 1 KiB on
// Intel (a Xeon with AMX, from DRAM: Q4_K 12288 x 7168 22-23 -> 25-27 GB/s against 3 KiB; 256 B to
// 1 KiB equal), 3 KiB elsewhere (tuned on AMD Zen 5, where it was chosen).
int packed_gemv_prefetch_bytes();
// Kernels for an optional extension within the AVX-512 level (AVX512-VBMI: the MXFP4 GEMV; every
// AVX-512 BF16 CPU but Cooper Lake has it). On where the CPU has it; tests switch it off to compare
// with the kernels it replaces (bit for bit).
bool vbmi_kernels();
void set_vbmi_kernels(bool on);

// The feature-set definition of each level (see above); Scalar is always supported.
bool isa_supported(Isa isa, const CpuFeatures& f);
Isa best_isa_for(const CpuFeatures& f);  // highest level whose feature set f has

Isa best_isa();      // best_isa_for(cpu_features())
std::vector<Isa> supported_isas();  // best_isa()'s chain, lowest (scalar) first: the levels tests can run
Isa set_isa(Isa want);  // force a level (clamped to best_isa()); returns the level now in use
const char* isa_name(Isa isa);
std::optional<Isa> isa_from_name(std::string_view name);  // "scalar", "avx2", ..., "neon_i8mm"

// The level KIMI_ISA=value selects on a CPU whose best level is `best`: value's level when it is
// not higher, else best (unset or empty: best). An unknown value is ignored, with *warning set to
// the line init_isa prints to stderr for it.
Isa isa_for_env(const char* value, Isa best, std::string* warning);

namespace detail {
extern std::atomic<int> g_isa;  // level in use; -1 until first use (constant-initialised)
int init_isa();                 // detects best_isa(), applies KIMI_ISA, stores and returns it
}  // namespace detail

// Level in use (after KIMI_ISA / set_isa). Inline: the kernels check it on every call. Not to be
// called from *_avx2.cpp / *_avx512.cpp (an inline function emitted there with the ISA flags could
// be the copy the linker keeps for everyone).
inline Isa current_isa() {
  int v = detail::g_isa.load(std::memory_order_relaxed);
  if (__builtin_expect(v < 0, 0)) v = detail::init_isa();
  return static_cast<Isa>(v);
}

// ---- kernel families ----
enum class KernelFamily : int { Matmul, QuantizeAct, Ops, Attention, Kda, Vec, TopK, Conv };
constexpr int kKernelFamilies = 8;
const char* family_name(KernelFamily f);  // "matmul", "quantize_act", "ops", "attention", "kda", "vec", "topk", "conv"

// Whether the family has its own code at that level.
constexpr bool family_has_code(KernelFamily f, Isa isa) {
  if (isa == Isa::Scalar) return true;
  switch (f) {
    case KernelFamily::Matmul: return true;
    case KernelFamily::QuantizeAct: case KernelFamily::Vec:
      return isa == Isa::Avx512;
    case KernelFamily::Ops: case KernelFamily::Attention: case KernelFamily::Kda:
      return isa == Isa::Avx512 || isa == Isa::Neon;
    default: return false;  // TopK, Conv: portable only
  }
}
// The level a family runs at now: the highest level <= current_isa() it has code for. Each
// family's entry points branch on this (and nothing else), so the answer names the code that runs.
inline Isa family_isa(KernelFamily f) {
  Isa isa = current_isa();
  while (isa != Isa::Scalar && !family_has_code(f, isa)) isa = lower_isa(isa);
  return isa;
}
const char* kernel_impl(KernelFamily f);  // isa_name(family_isa(f))

// ---- matmul: one kernel per (weight type, precision) and level ----
struct MatKernel {
  // Bytes of one prepared activation row; nullptr = the runner reads the f32 x rows directly.
  size_t (*act_bytes)(int64_t cols) = nullptr;
  // Prepare one token's activation (cols f32 values) into out (act_bytes(cols) bytes).
  void (*prep)(const float* x, int64_t cols, uint8_t* out) = nullptr;
  // Rows [r0, r1) for tokens [0, nt): activation row t at act + t*act_stride;
  // writes y[t*ldy + r].
  void (*run)(const MatView& W, const uint8_t* act, size_t act_stride, int64_t nt, int64_t r0, int64_t r1,
              float* y, int64_t ldy) = nullptr;
  // f32 scratch the runner takes with f32_scratch(scratch_rows * cols, 1) (decoded weight rows);
  // matmul lends every pool thread its share of one caller-owned buffer, so worker threads never
  // allocate (0 = none).
  int scratch_rows = 0;
};
// Thread-local f32 scratch that only grows (slot 0..3 are independent buffers). Slot 1 returns the
// buffer lent to this thread by matmul (see MatKernel::scratch_rows) when one is lent and large enough.
float* f32_scratch(int64_t n, int slot = 0);

// A level's matmul kernels: one row per (weight type, precision) it has a kernel for. `f32`: the
// Precision::F32 kernel (f32 activations, no rounding); F32 weights take their f32 row at either
// precision. select_kernel applies that rule to a table (the one type switch of every level).
struct KernelRow {
  GgmlType type;
  bool f32;
  MatKernel k;
};
bool select_kernel(const KernelRow* table, size_t n, GgmlType type, Precision prec, MatKernel* k);

// Fill *k for (type, precision) at that level; false when the level has no kernel for it.
bool scalar_kernel(GgmlType type, Precision prec, MatKernel* k);
bool avx2_kernel(GgmlType type, Precision prec, MatKernel* k);
bool avx512_kernel(GgmlType type, Precision prec, MatKernel* k);
bool neon_kernel(GgmlType type, Precision prec, MatKernel* k);       // matmul_neon.cpp
bool neon_dot_kernel(GgmlType type, Precision prec, MatKernel* k);   // matmul_neon_dot.cpp
bool neon_i8mm_kernel(GgmlType type, Precision prec, MatKernel* k);  // matmul_neon_i8mm.cpp
bool level_kernel(Isa level, GgmlType type, Precision prec, MatKernel* k);  // the one of that level

// ---- matmul over a packed weight (repack.h): one kernel per weight type and level ----
struct PackedKernel {
  size_t (*act_bytes)(int64_t cols) = nullptr;
  void (*prep)(const float* x, int64_t cols, uint8_t* out) = nullptr;
  // Groups [g0, g1) of P for tokens [0, nt): activation row t at act + t*act_stride; writes
  // y[t*ldy + 16g + i] for row i of group g.
  void (*run)(const PackedWeight& P, const uint8_t* act, size_t act_stride, int64_t nt, int64_t g0, int64_t g1,
              float* y, int64_t ldy) = nullptr;
  // whether matmul uses it for one token too (false: GEMV reads the original layout, which decodes
  // faster there; see docs/performance.md); it always serves two or more tokens
  bool gemv = true;
};
bool avx512_packed_kernel(GgmlType type, PackedKernel* k);  // repack_avx512.cpp
// The packed kernel of the running level for type (false: none; matmul reads the original).
bool pick_packed_kernel(GgmlType type, PackedKernel* k);

// The kernel matmul runs for (type, precision) now: the one of the highest level <= current_isa()
// that has one; *level (optional) gets that level. Fails for a type no level supports.
MatKernel pick_matmul_kernel(GgmlType type, Precision prec, Isa* level = nullptr);
Isa matmul_kernel_isa(GgmlType type, Precision prec);  // the level pick_matmul_kernel takes it from

}  // namespace kimi::kern
