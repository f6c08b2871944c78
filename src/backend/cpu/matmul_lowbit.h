// Matmul kernels of the low-bit weight types Q2_K, Q3_K, IQ4_XS and IQ2_XS (all against Q8_K
// activations, quantize_act.h prep_q8_K), one table per ISA level. Each level's *_kernel
// (dispatch.h) falls back to its *_lowbit_kernel for these types.
//   scalar (matmul_lowbit.cpp): integer dot per 16-element group, the reference of the others;
//     also the Precision::F32 rows (decode to f32, then dot) for every level.
//   avx2 / avx512 (matmul_lowbit_avx2.cpp / _avx512.cpp): each super-block decoded once per
//     register tile to u8 magnitudes + a sign mask (natural element order), the sign moved onto
//     the activation, vpmaddubsw (no saturation: |w|, |a| <= 127), vpmaddwd with the s16 group
//     scales; Q2_K's mins through the activation's 16-element sums.
#pragma once
#include "backend/cpu/dispatch.h"

namespace kimi::kern {

bool scalar_lowbit_kernel(GgmlType type, Precision prec, MatKernel* k);
bool avx2_lowbit_kernel(GgmlType type, Precision prec, MatKernel* k);
bool avx512_lowbit_kernel(GgmlType type, Precision prec, MatKernel* k);

}  // namespace kimi::kern
