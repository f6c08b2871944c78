// Memory bandwidth on this machine: a read-only sum (what a GEMV does: stream weights) and the
// STREAM triad a[i] = b[i] + s*c[i], over 512 MiB arrays, with 1 thread and with all threads.
// Reported as bytes_per_second (read bytes for "read", read+write for triad).
#include <benchmark/benchmark.h>

#include <cstdint>
#include <cstring>
#include <vector>

#include "util/thread_pool.h"

namespace {

constexpr size_t kN = (size_t{512} << 20) / sizeof(float);  // 512 MiB per array

std::vector<float>& arr(int i) {
  static std::vector<float> a[3] = {std::vector<float>(kN, 1.0f), std::vector<float>(kN, 2.0f),
                                    std::vector<float>(kN, 3.0f)};
  return a[i];
}

void BM_Read(benchmark::State& st) {
  const int nth = static_cast<int>(st.range(0));
  kimi::ThreadPool pool(nth);
  const float* b = arr(1).data();
  std::vector<float> part(static_cast<size_t>(nth) * 16);
  for (auto _ : st) {
    pool.run_on_all([&](int ti, int n) {
      const size_t lo = kN * ti / n, hi = kN * (ti + 1) / n;
      float s[16] = {};
      for (size_t i = lo; i + 16 <= hi; i += 16)
        for (int j = 0; j < 16; ++j) s[j] += b[i + j];
      std::memcpy(&part[static_cast<size_t>(ti) * 16], s, sizeof(s));
    });
    benchmark::DoNotOptimize(part.data());
  }
  st.SetBytesProcessed(static_cast<int64_t>(st.iterations()) * static_cast<int64_t>(kN * sizeof(float)));
}

void BM_Triad(benchmark::State& st) {
  const int nth = static_cast<int>(st.range(0));
  kimi::ThreadPool pool(nth);
  float* a = arr(0).data();
  const float* b = arr(1).data();
  const float* c = arr(2).data();
  for (auto _ : st) {
    pool.run_on_all([&](int ti, int n) {
      const size_t lo = kN * ti / n, hi = kN * (ti + 1) / n;
      for (size_t i = lo; i < hi; ++i) a[i] = b[i] + 0.5f * c[i];
    });
    benchmark::ClobberMemory();
  }
  st.SetBytesProcessed(static_cast<int64_t>(st.iterations()) * static_cast<int64_t>(3 * kN * sizeof(float)));
}

}  // namespace

BENCHMARK(BM_Read)->Arg(1)->Arg(2)->UseRealTime()->Unit(benchmark::kMillisecond);
BENCHMARK(BM_Triad)->Arg(1)->Arg(2)->UseRealTime()->Unit(benchmark::kMillisecond);
BENCHMARK_MAIN();
