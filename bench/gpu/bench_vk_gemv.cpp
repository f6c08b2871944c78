// The Vulkan decode GEMV (mm.comp, the row kernel) per weight type at Kimi-K3.1 shapes, against the
// device's read bandwidth measured in the same run (measure_vulkan_ceiling, as `kimi bench --device
// vulkan` does). bytes_per_second = weight bytes streamed; `pct_read_bw` = that as % of the measured
// read bandwidth (the issue-34 goal for decode: >= 70 % on a GPU). Several copies of each matrix rotate
// (KIMI_BENCH_GEMV_MIB in all, default 512 MiB; 48 MiB on a software device) so none sits in a cache,
// and one iteration records a round over them before one sync, so the submit is not what is timed.
// Runs on the first usable Vulkan device; without one every case is skipped with one line. On
// lavapipe it measures the CPU emulating a GPU: correctness of the setup, not GPU speed.
#include <benchmark/benchmark.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "backend/vulkan/vulkan_backend.h"
#include "tensor/quants.h"
#include "tensor/types.h"

using namespace kimi;

namespace {

struct Device {
  std::unique_ptr<Backend> be;
  DeviceCeiling ceiling;
  bool software = false;
  std::string error;
};

Device& device() {
  static Device d = [] {
    Device r;
    try {
      for (const auto& v : list_vulkan_devices()) {
        if (!v.usable) continue;
        r.be = make_vulkan_backend(v.index, Precision::F32);
        r.software = v.type == "cpu";
        r.ceiling = measure_vulkan_ceiling(*r.be);
        break;
      }
      if (!r.be) r.error = "no usable Vulkan device";
    } catch (const std::exception& e) {
      r.error = e.what();
    }
    return r;
  }();
  return d;
}

// `rows` x `cols` of type t: 16 distinct quantized rows of N(0, 1)-like values, repeated
std::vector<uint8_t> make_weight(GgmlType t, int64_t rows, int64_t cols) {
  const uint64_t rb = row_bytes(t, static_cast<uint64_t>(cols));
  std::vector<uint8_t> strip(rb * 16);
  std::mt19937 g(7);
  std::normal_distribution<float> N(0.0f, 1.0f);
  std::vector<float> f(static_cast<size_t>(cols));
  for (int r = 0; r < 16; ++r) {
    for (auto& v : f) v = N(g);
    uint8_t* dst = strip.data() + rb * static_cast<uint64_t>(r);
    if (t == GgmlType::F16 || t == GgmlType::BF16) {
      auto* h = reinterpret_cast<uint16_t*>(dst);
      for (int64_t c = 0; c < cols; ++c) h[c] = t == GgmlType::F16 ? f32_to_f16(f[static_cast<size_t>(c)]) : f32_to_bf16(f[static_cast<size_t>(c)]);
    } else {
      quantize_row(t, f.data(), dst, cols);
    }
  }
  std::vector<uint8_t> w(rb * static_cast<uint64_t>(rows));
  for (int64_t r = 0; r < rows; ++r)
    std::memcpy(w.data() + rb * static_cast<uint64_t>(r), strip.data() + rb * static_cast<uint64_t>(r % 16), rb);
  return w;
}

void BM_vk_gemv(benchmark::State& st, GgmlType t, int64_t rows, int64_t cols, int64_t n) {
  Device& d = device();
  if (!d.be) {
    st.SkipWithError(("vulkan: " + d.error).c_str());
    return;
  }
  const auto host = make_weight(t, rows, cols);
  const uint64_t bytes = host.size();
  uint64_t budget = (d.software ? 48ull : 512ull) << 20;
  if (const char* e = std::getenv("KIMI_BENCH_GEMV_MIB")) budget = std::strtoull(e, nullptr, 10) << 20;
  const uint64_t copies = std::max<uint64_t>(1, budget / bytes);
  std::vector<std::unique_ptr<Buffer>> ws;
  std::vector<MatView> views;
  for (uint64_t i = 0; i < copies; ++i) {
    ws.push_back(d.be->alloc(bytes, "gemv weight"));
    d.be->upload(ws.back()->data(), host.data(), bytes);
    views.push_back(MatView{t, static_cast<const uint8_t*>(ws.back()->data()), rows, cols,
                            row_bytes(t, static_cast<uint64_t>(cols))});
  }
  std::vector<float> xs(static_cast<size_t>(n * cols));
  std::mt19937 g(8);
  std::uniform_real_distribution<float> U(-1.0f, 1.0f);
  for (auto& v : xs) v = U(g);
  auto x = d.be->alloc(xs.size() * 4, "gemv x");
  auto y = d.be->alloc(static_cast<uint64_t>(n * rows) * 4, "gemv y");
  d.be->upload(x->data(), xs.data(), xs.size() * 4);
  for (const auto& v : views) d.be->matmul(v, x->as<float>(), n, y->as<float>());  // warm: pipelines, caches
  d.be->sync();
  double seconds = 0;
  for (auto _ : st) {
    const auto t0 = std::chrono::steady_clock::now();
    for (const auto& v : views) d.be->matmul(v, x->as<float>(), n, y->as<float>());
    d.be->sync();
    seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  }
  const double streamed = static_cast<double>(st.iterations()) * static_cast<double>(copies * bytes);
  st.SetBytesProcessed(static_cast<int64_t>(streamed));
  if (d.ceiling.read_bytes_per_s > 0 && seconds > 0)
    st.counters["pct_read_bw"] = 100.0 * streamed / seconds / d.ceiling.read_bytes_per_s;
  st.counters["copies"] = static_cast<double>(copies);
  st.SetLabel(std::string(type_name(t)) + " " + std::to_string(rows) + "x" + std::to_string(cols) + ", device read " +
              std::to_string(d.ceiling.read_bytes_per_s / 1e9) + " GB/s");
}

// K3.1: hidden 7168; a routed expert's gate/up 3072 x 7168 and down 7168 x 3072 (MXFP4); dense
// projections 7168 wide in the usual GGUF quants
#define GEMV(T, R, C, N) \
  BENCHMARK_CAPTURE(BM_vk_gemv, T##_##R##x##C##_n##N, GgmlType::T, R, C, N)->Unit(benchmark::kMillisecond)->UseRealTime()
GEMV(MXFP4, 3072, 7168, 1);
GEMV(MXFP4, 7168, 3072, 1);
GEMV(MXFP4, 3072, 7168, 4);
GEMV(Q8_0, 4096, 7168, 1);
GEMV(Q4_K, 4096, 7168, 1);
GEMV(Q6_K, 4096, 7168, 1);
GEMV(Q5_K, 4096, 7168, 1);
GEMV(Q4_0, 4096, 7168, 1);
GEMV(Q5_0, 4096, 7168, 1);
GEMV(Q5_1, 4096, 7168, 1);
GEMV(Q2_K, 4096, 7168, 1);
GEMV(Q3_K, 4096, 7168, 1);
GEMV(IQ4_XS, 4096, 7168, 1);
GEMV(F16, 4096, 7168, 1);
GEMV(BF16, 4096, 7168, 1);

}  // namespace

BENCHMARK_MAIN();
