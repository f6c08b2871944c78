// NEON matmul kernels at the neon_dot level: ARMv8.2-A + dotprod (SDOT integer dots).
// The kernels are matmul_neon_impl.h compiled with this file's flags (cmake/KimiIsa.cmake); reached
// only through dispatch (neon_dot_kernel) after the run-time CPU check.
#include "backend/cpu/dispatch.h"

#if defined(__aarch64__)
#include "backend/cpu/matmul_neon_impl.h"

namespace kimi::kern {
bool neon_dot_kernel(GgmlType type, Precision prec, MatKernel* k) {
  return select_kernel(kNeonKernels, sizeof(kNeonKernels) / sizeof(kNeonKernels[0]), type, prec, k);
}
}  // namespace kimi::kern
#else
namespace kimi::kern {
bool neon_dot_kernel(GgmlType, Precision, MatKernel*) { return false; }
}  // namespace kimi::kern
#endif
