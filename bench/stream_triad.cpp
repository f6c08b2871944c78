// Memory bandwidth on this machine, with 1 thread and with all threads:
//   BM_Read   the read ceiling `kimi bench` measures (backend/cpu/ceiling.h): every thread sums its
//             own first-touched slice as 1, 2, 4 or 8 interleaved streams of the widest loads the
//             CPU has (plain and non-temporal), the best pass counts; counters: the streams and
//             load kind of the best pass, the plain one-stream-per-thread rate and the buffer
//             size (its default: at least twice the last-level cache)
//   BM_ReadOneStream  the former BM_Read, for comparison: one stream per thread, summed as floats
//             in portable code (SSE2 on x86-64) - it reached ~60 % of BM_Read here
//   BM_Triad  STREAM triad a[i] = b[i] + s*c[i] (bytes = 2 reads + 1 write; the write-allocate read
//             of a is not counted, as STREAM does not)
// Reported as bytes_per_second. Run: build/bench/stream_triad [--benchmark_filter=Read]
#include <benchmark/benchmark.h>

#include <cstdint>
#include <cstring>
#include <thread>
#include <vector>

#include "backend/cpu/ceiling.h"
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
  kimi::kern::CeilingOptions o;
  o.read_seconds = 0.2;
  kimi::kern::ReadCeiling best;
  for (auto _ : st) {
    const kimi::kern::ReadCeiling r = kimi::kern::measure_read(pool, o);
    st.SetIterationTime(double(r.buffer_bytes) / r.bytes_per_s);  // one pass at the sweep's best rate
    if (r.bytes_per_s > best.bytes_per_s) best = r;
  }
  st.SetBytesProcessed(static_cast<int64_t>(st.iterations()) * static_cast<int64_t>(best.buffer_bytes));
  st.counters["best_GB_s"] = best.bytes_per_s / 1e9;  // bytes_per_second is the mean over iterations, in GiB/s
  st.counters["streams"] = best.streams;
  st.counters["non_temporal"] = best.non_temporal ? 1 : 0;
  st.counters["one_stream_GB_s"] = best.one_stream_bytes_per_s / 1e9;
  st.counters["buffer_MiB"] = double(best.buffer_bytes >> 20);
}

void BM_ReadOneStream(benchmark::State& st) {
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

void thread_args(benchmark::internal::Benchmark* b) {
  const int hw = static_cast<int>(std::thread::hardware_concurrency());
  b->Arg(1);
  if (hw > 1) b->Arg(hw);
}

}  // namespace

BENCHMARK(BM_Read)->Apply(thread_args)->UseManualTime()->Iterations(3)->Unit(benchmark::kMillisecond);
BENCHMARK(BM_ReadOneStream)->Apply(thread_args)->UseRealTime()->Unit(benchmark::kMillisecond);
BENCHMARK(BM_Triad)->Apply(thread_args)->UseRealTime()->Unit(benchmark::kMillisecond);
BENCHMARK_MAIN();
