// Matmul micro-benchmarks at small-preset shapes (run `KIMI_ISA=avx2 bench/bench_matmul` etc. to
// compare levels). GEMV: bytes_per_second = weight bytes streamed (several copies of the matrix
// rotate so it never sits in cache). GEMM: items_per_second = FLOPs (2 per multiply-add).
#include <benchmark/benchmark.h>

#include <cstdlib>
#include <cstring>
#include <random>
#include <vector>

#include "backend/cpu/dispatch.h"
#include "backend/cpu/matmul.h"
#include "tensor/quants.h"

using namespace kimi;
using namespace kimi::kern;

namespace {

// KIMI_BENCH_THREADS=n sets the pool size (default: all hardware threads)
ThreadPool& pool() {
  static ThreadPool p([] {
    const char* e = std::getenv("KIMI_BENCH_THREADS");
    return e ? std::atoi(e) : 0;
  }());
  return p;
}

// Random weights of a type: quantized from random floats (plain types converted), `copies`
// copies of one rows x cols matrix one after another (the copies only have to be different
// memory, so the matrix is quantized once: the reference quantizers are slow).
std::vector<uint8_t> make_weights(GgmlType t, int64_t rows, int64_t cols, int copies = 1) {
  const uint64_t rb = row_bytes(t, static_cast<uint64_t>(cols));
  const uint64_t mat = rb * static_cast<uint64_t>(rows);
  std::vector<uint8_t> w(mat * static_cast<uint64_t>(copies));
  std::mt19937 rng(42);
  std::normal_distribution<float> nd(0.0f, 0.02f);
  std::vector<float> row(static_cast<size_t>(cols));
  for (int64_t r = 0; r < rows; ++r) {
    for (auto& v : row) v = nd(rng);
    quantize_row(t, row.data(), w.data() + static_cast<uint64_t>(r) * rb, cols);
  }
  for (int c = 1; c < copies; ++c) std::memcpy(w.data() + mat * static_cast<uint64_t>(c), w.data(), mat);
  return w;
}

std::vector<float> make_x(int64_t n) {
  std::vector<float> x(static_cast<size_t>(n));
  std::mt19937 rng(7);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  for (auto& v : x) v = nd(rng);
  return x;
}

// GEMV over `copies` stacked copies of a rows x cols matrix (total > cache), one copy per call.
void gemv(benchmark::State& st, GgmlType t, int64_t rows, int64_t cols, int copies, Precision prec) {
  const auto w = make_weights(t, rows, cols, copies);
  const uint64_t mat_bytes = row_bytes(t, static_cast<uint64_t>(cols)) * static_cast<uint64_t>(rows);
  const auto x = make_x(cols);
  std::vector<float> y(static_cast<size_t>(rows));
  int i = 0;
  for (auto _ : st) {
    MatView W{t, w.data() + mat_bytes * static_cast<uint64_t>(i), rows, cols, row_bytes(t, static_cast<uint64_t>(cols))};
    matmul(W, x.data(), 1, y.data(), pool(), prec);
    benchmark::DoNotOptimize(y.data());
    i = (i + 1) % copies;
  }
  st.SetBytesProcessed(static_cast<int64_t>(st.iterations()) * static_cast<int64_t>(mat_bytes));
  st.SetLabel(active_isa());
}

// MoE decode pattern: 8 of 64 experts (each rows x cols MXFP4) per iteration.
void moe_gemv(benchmark::State& st, int64_t rows, int64_t cols) {
  const int n_exp = 64;
  const auto w = make_weights(GgmlType::MXFP4, rows, cols, n_exp);
  const uint64_t rb = row_bytes(GgmlType::MXFP4, static_cast<uint64_t>(cols));
  const uint64_t exp_bytes = rb * static_cast<uint64_t>(rows);
  const auto x = make_x(cols);
  std::vector<float> y(static_cast<size_t>(rows));
  std::mt19937 rng(3);
  for (auto _ : st) {
    for (int k = 0; k < 8; ++k) {
      const int e = static_cast<int>(rng() % n_exp);
      MatView W{GgmlType::MXFP4, w.data() + exp_bytes * static_cast<uint64_t>(e), rows, cols, rb};
      matmul(W, x.data(), 1, y.data(), pool());
    }
    benchmark::DoNotOptimize(y.data());
  }
  st.SetBytesProcessed(static_cast<int64_t>(st.iterations()) * 8 * static_cast<int64_t>(exp_bytes));
  st.SetLabel(active_isa());
}

void gemm(benchmark::State& st, GgmlType t, int64_t rows, int64_t cols, int64_t nt) {
  const auto w = make_weights(t, rows, cols);
  const auto x = make_x(cols * nt);
  std::vector<float> y(static_cast<size_t>(rows * nt));
  MatView W{t, w.data(), rows, cols, row_bytes(t, static_cast<uint64_t>(cols))};
  for (auto _ : st) {
    matmul(W, x.data(), nt, y.data(), pool());
    benchmark::DoNotOptimize(y.data());
  }
  st.SetItemsProcessed(static_cast<int64_t>(st.iterations()) * 2 * rows * cols * nt);
  st.SetLabel(active_isa());
}

}  // namespace

// dense FFN of the small preset: gate/up {2048 -> 8192}, down {8192 -> 2048}
BENCHMARK_CAPTURE(gemv, bf16_8192x2048, GgmlType::BF16, 8192, 2048, 4, Precision::Fast)->UseRealTime();
BENCHMARK_CAPTURE(gemv, bf16_2048x8192, GgmlType::BF16, 2048, 8192, 4, Precision::Fast)->UseRealTime();
BENCHMARK_CAPTURE(gemv, q8_0_2048x8192, GgmlType::Q8_0, 2048, 8192, 4, Precision::Fast)->UseRealTime();
BENCHMARK_CAPTURE(gemv, q4_0_2048x8192, GgmlType::Q4_0, 2048, 8192, 8, Precision::Fast)->UseRealTime();
BENCHMARK_CAPTURE(gemv, mxfp4_2048x8192, GgmlType::MXFP4, 2048, 8192, 8, Precision::Fast)->UseRealTime();
BENCHMARK_CAPTURE(gemv, f16_2048x8192, GgmlType::F16, 2048, 8192, 4, Precision::Fast)->UseRealTime();
BENCHMARK_CAPTURE(gemv, f32_2048x4096, GgmlType::F32, 2048, 4096, 4, Precision::Fast)->UseRealTime();
BENCHMARK_CAPTURE(gemv, q4_K_2048x8192, GgmlType::Q4_K, 2048, 8192, 8, Precision::Fast)->UseRealTime();
BENCHMARK_CAPTURE(gemv, q5_K_2048x8192, GgmlType::Q5_K, 2048, 8192, 8, Precision::Fast)->UseRealTime();
BENCHMARK_CAPTURE(gemv, q6_K_2048x8192, GgmlType::Q6_K, 2048, 8192, 8, Precision::Fast)->UseRealTime();
BENCHMARK_CAPTURE(gemv, bf16_f32prec_2048x8192, GgmlType::BF16, 2048, 8192, 4, Precision::F32)->UseRealTime();
// routed experts of the small preset: 64 experts {1024 -> 768}, 8 active
BENCHMARK_CAPTURE(moe_gemv, mxfp4_768x1024_8of64, 768, 1024)->UseRealTime();
// prefill GEMM, 512 tokens
BENCHMARK_CAPTURE(gemm, bf16_2048x2048_t512, GgmlType::BF16, 2048, 2048, 512)->UseRealTime()->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(gemm, bf16_2048x8192_t512, GgmlType::BF16, 2048, 8192, 512)->UseRealTime()->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(gemm, bf16_8192x2048_t512, GgmlType::BF16, 8192, 2048, 512)->UseRealTime()->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(gemm, mxfp4_1024x768_t64, GgmlType::MXFP4, 1024, 768, 64)->UseRealTime()->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(gemm, q8_0_2048x2048_t512, GgmlType::Q8_0, 2048, 2048, 512)->UseRealTime()->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(gemm, mxfp4_768x1024_t512, GgmlType::MXFP4, 768, 1024, 512)->UseRealTime()->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(gemm, q4_0_2048x2048_t512, GgmlType::Q4_0, 2048, 2048, 512)->UseRealTime()->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(gemm, q4_K_2048x2048_t512, GgmlType::Q4_K, 2048, 2048, 512)->UseRealTime()->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(gemm, q6_K_2048x2048_t512, GgmlType::Q6_K, 2048, 2048, 512)->UseRealTime()->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(gemm, f32_2048x2048_t64, GgmlType::F32, 2048, 2048, 64)->UseRealTime()->Unit(benchmark::kMillisecond);

BENCHMARK_MAIN();
