// kern::matmul makes no heap allocation per call once warmed up (thread-local scratch only grows),
// with 1 and 2 threads, GEMV and GEMM, for every weight type and both precisions. Counts
// operator new calls in this binary (the thread pool and the kernels are linked statically).
#include <gtest/gtest.h>

#include <atomic>
#include <cstdlib>
#include <new>
#include <vector>

#include "backend/cpu/dispatch.h"
#include "backend/cpu/matmul.h"
#include "tensor/types.h"

#include "count_allocs.h"

using namespace kimi;
using namespace kimi::kern;

TEST(KernelsNoAlloc, MatmulDoesNotAllocateAfterWarmup) {
  const int64_t rows = 300, cols = 512;
  for (GgmlType t : {GgmlType::F32, GgmlType::F16, GgmlType::BF16, GgmlType::Q8_0, GgmlType::Q4_0, GgmlType::MXFP4,
                     GgmlType::Q4_K, GgmlType::Q5_K, GgmlType::Q6_K}) {
    // all-zero bytes are a valid block of every type (zero scales)
    std::vector<uint8_t> w(row_bytes(t, cols) * rows, 0);
    const MatView W{t, w.data(), rows, cols, row_bytes(t, cols)};
    std::vector<float> x(cols * 40, 0.5f), y(rows * 40);
    for (int threads : {1, 2}) {
      ThreadPool pool(threads);
      for (Precision p : {Precision::Fast, Precision::F32}) {
        auto run = [&] {
          for (int64_t nt : {1, 3, 40, 1, 17}) matmul(W, x.data(), nt, y.data(), pool, p);
        };
        for (int i = 0; i < 4; ++i) run();  // warm-up: every pool thread has seen every shape
        const long before = g_allocs.load();
        for (int i = 0; i < 8; ++i) run();
        EXPECT_EQ(g_allocs.load() - before, 0) << type_name(t) << " threads " << threads << " prec " << int(p);
      }
    }
  }
}
