// What every backend shares about a weight matrix: a view of a GGUF 2-D weight (or one 2-D slice
// of a stacked 3-D tensor) and the precision the matmul runs at. Device-neutral: `data` is an
// address the owning backend reads (the mmap for the CPU, an uploaded copy for a device).
#pragma once
#include <cstdint>

#include "tensor/types.h"

namespace kimi {

// A copy of a weight in a layout one backend made for its kernels at load time (the CPU's
// row-interleaved K-quants, backend/cpu/repack.h). Opaque here; only the backend that made it reads it.
struct PackedWeight;

struct MatView {
  GgmlType type = GgmlType::F32;
  const uint8_t* data = nullptr;
  int64_t rows = 0;       // output features (ne[1])
  int64_t cols = 0;       // input features (ne[0], a multiple of the type's block size)
  uint64_t row_bytes = 0; // bytes per row (row_bytes(type, cols))
  // The backend's prepared copy of the same matrix (Backend::prepare_weight), or nullptr. `data`
  // stays valid: a kernel without a packed variant (or Precision::F32) reads the original.
  const PackedWeight* packed = nullptr;
};

// Precision::Fast: activations are rounded to the weight's dot type (bf16 for BF16, f16 for F16,
//   Q8_0 blocks for Q8_0/MXFP4/Q4_0, Q8_K for K-quants), int32/f32 accumulation.
// Precision::F32: weights are decoded to f32 on the fly and dotted with f32 activations.
enum class Precision { Fast, F32 };

}  // namespace kimi
