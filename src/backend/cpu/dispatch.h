// Run-time CPU dispatch for the CPU kernels. The best level is detected once
// (__builtin_cpu_supports); env KIMI_ISA=scalar|avx2|avx512 (read on first use) or set_isa() can
// force a LOWER level, never a higher one. Code in *_avx2.cpp / *_avx512.cpp is only reached
// through the tables below after this check.
#pragma once
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string_view>

#include "backend/cpu/matmul.h"

namespace kimi::kern {

enum class Isa : int { Scalar = 0, Avx2 = 1, Avx512 = 2 };

struct CpuFeatures {
  bool avx2 = false, fma = false, f16c = false, bmi2 = false;
  bool avx512f = false, avx512bw = false, avx512vl = false, avx512dq = false;
  bool avx512vnni = false, avx512bf16 = false;
};
const CpuFeatures& cpu_features();

Isa best_isa();      // highest level this CPU supports (AVX-512 level needs F/BW/VL/DQ/VNNI/BF16)
Isa current_isa();   // level in use (after KIMI_ISA / set_isa)
Isa set_isa(Isa want);  // force a level (clamped to best_isa()); returns the level now in use
const char* isa_name(Isa isa);
std::optional<Isa> isa_from_name(std::string_view name);  // "scalar", "avx2", "avx512"

// ---- internal: one matmul kernel = activation preparation + tile runner ----
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

// Fill *k for (type, precision) at that level; false when the level has no kernel for it.
bool scalar_kernel(GgmlType type, Precision prec, MatKernel* k);
bool avx2_kernel(GgmlType type, Precision prec, MatKernel* k);
bool avx512_kernel(GgmlType type, Precision prec, MatKernel* k);

}  // namespace kimi::kern
