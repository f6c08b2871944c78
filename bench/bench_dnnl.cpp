// The GEMM anchor (docs/performance.md "GEMM anchor"): oneDNN's matmul (Debian libdnnl-dev) side by side
// with kimi's matmul on the same prefill shapes, one binary, the cases interleaved (kimi, then oneDNN, per
// shape). items_per_second = FLOPs (2 per multiply-add) of rows x cols x tokens.
//   bf16:  kimi: BF16 weights in place, f32 activations (converted to bf16 inside the kernel);
//          oneDNN: bf16 x bf16 -> f32, its weights reordered once into the layout it prefers (what a
//          backend would do at load time), the activations given as bf16 (their conversion not timed)
//   int8:  kimi: Q8_0 and MXFP4 weights (its int8 path: activations quantized to int8 per block inside);
//          oneDNN: u8 x s8 -> s32 with prepacked weights, activations given as u8 (not timed), no scales
// Threads: KIMI_BENCH_THREADS for kimi's pool (default: all), OMP_NUM_THREADS for oneDNN (default: all).
// Built only when CMake finds oneDNN (bench/CMakeLists.txt); install it with
//   sudo apt-get install libdnnl-dev
#include <benchmark/benchmark.h>

#include <cstdlib>
#include <cstring>
#include <memory>
#include <oneapi/dnnl/dnnl.hpp>
#include <random>
#include <string>
#include <unordered_map>
#include <vector>

#include "backend/cpu/dispatch.h"
#include "backend/cpu/matmul.h"
#include "backend/cpu/repack.h"
#include "tensor/quants.h"
#include "tensor/types.h"

using namespace kimi;
using namespace kimi::kern;

namespace {

ThreadPool& pool() {
  static ThreadPool p([] {
    const char* e = std::getenv("KIMI_BENCH_THREADS");
    return e ? std::atoi(e) : 0;
  }());
  return p;
}

std::vector<float> normal_floats(int64_t n, float sd, uint32_t seed) {
  std::vector<float> v(static_cast<size_t>(n));
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd(0.0f, sd);
  for (auto& x : v) x = nd(rng);
  return v;
}

// ---- kimi: matmul(W [rows x cols] of type t, x [tokens x cols]) -> y [tokens x rows]
// packed: with the load-time copy the CPU backend makes (repack.h: BF16 in the bf16 x16 order on AVX-512
// without AMX, the AMX tile order with it), as `kimi` runs the weight; else the rows in place.
void kimi_gemm(benchmark::State& st, GgmlType t, int64_t rows, int64_t cols, int64_t nt, bool packed = false) {
  const uint64_t rb = row_bytes(t, static_cast<uint64_t>(cols));
  std::vector<uint8_t> w(rb * static_cast<uint64_t>(rows));
  const std::vector<float> row = normal_floats(cols, 0.02f, 42);
  for (int64_t r = 0; r < rows; ++r) quantize_row(t, row.data(), w.data() + static_cast<uint64_t>(r) * rb, cols);
  const std::vector<float> x = normal_floats(cols * nt, 1.0f, 7);
  std::vector<float> y(static_cast<size_t>(rows * nt));
  MatView W{t, w.data(), rows, cols, rb};
  const std::unique_ptr<PackedWeight> P = packed ? pack_weight(W, &pool()) : nullptr;
  W.packed = P.get();
  kern::matmul(W, x.data(), nt, y.data(), pool());  // warm: first-touch, the activation buffers
  for (auto _ : st) {
    kern::matmul(W, x.data(), nt, y.data(), pool());
    benchmark::DoNotOptimize(y.data());
  }
  st.SetItemsProcessed(static_cast<int64_t>(st.iterations()) * 2 * rows * cols * nt);
  st.SetLabel(std::string("kimi ") + active_isa() + (P ? " packed " : " ") + std::to_string(pool().size()) + " threads");
}

// ---- oneDNN: src [tokens x cols] x weights [cols x rows] -> dst [tokens x rows]
void onednn_gemm(benchmark::State& st, bool int8, int64_t rows, int64_t cols, int64_t nt) {
  using namespace dnnl;
  using dt = memory::data_type;
  using tag = memory::format_tag;
  engine eng(engine::kind::cpu, 0);
  stream s(eng);
  const dt a_type = int8 ? dt::u8 : dt::bf16, w_type = int8 ? dt::s8 : dt::bf16, d_type = int8 ? dt::s32 : dt::f32;
  const memory::desc a_md({nt, cols}, a_type, tag::ab);
  const memory::desc w_any({cols, rows}, w_type, tag::any);
  const memory::desc w_plain({cols, rows}, w_type, tag::ba);  // the GGUF layout: rows of cols
  const memory::desc d_md({nt, rows}, d_type, tag::ab);
  dnnl::matmul::primitive_desc pd(dnnl::matmul::desc(a_md, w_any, d_md), eng);
  memory a(a_md, eng), wp(w_plain, eng), w(pd.weights_desc(), eng), d(d_md, eng);
  // values: small random integers (int8) or bf16 of normal floats
  std::mt19937 rng(3);
  const size_t na = static_cast<size_t>(nt * cols), nw = static_cast<size_t>(cols * rows);
  if (int8) {
    auto* pa = static_cast<uint8_t*>(a.get_data_handle());
    auto* pw = static_cast<int8_t*>(wp.get_data_handle());
    for (size_t i = 0; i < na; ++i) pa[i] = static_cast<uint8_t>(rng() % 256);
    for (size_t i = 0; i < nw; ++i) pw[i] = static_cast<int8_t>(int(rng() % 255) - 127);
  } else {
    auto* pa = static_cast<uint16_t*>(a.get_data_handle());
    auto* pw = static_cast<uint16_t*>(wp.get_data_handle());
    const std::vector<float> fa = normal_floats(static_cast<int64_t>(na), 1.0f, 7);
    const std::vector<float> fw = normal_floats(static_cast<int64_t>(nw), 0.02f, 42);
    for (size_t i = 0; i < na; ++i) pa[i] = f32_to_bf16(fa[i]);
    for (size_t i = 0; i < nw; ++i) pw[i] = f32_to_bf16(fw[i]);
  }
  reorder(wp, w).execute(s, wp, w);  // once, as at load time
  dnnl::matmul mm(pd);
  const std::unordered_map<int, memory> args{{DNNL_ARG_SRC, a}, {DNNL_ARG_WEIGHTS, w}, {DNNL_ARG_DST, d}};
  mm.execute(s, args);
  s.wait();
  for (auto _ : st) {
    mm.execute(s, args);
    s.wait();
    benchmark::DoNotOptimize(d.get_data_handle());
  }
  st.SetItemsProcessed(static_cast<int64_t>(st.iterations()) * 2 * rows * cols * nt);
  const char* impl = nullptr;
  dnnl_primitive_desc_query(pd.get(), dnnl_query_impl_info_str, 0, &impl);
  st.SetLabel(std::string("oneDNN ") + (impl ? impl : "?"));
}

}  // namespace

// shapes (rows x cols, tokens): a K3 KDA projection 7168 -> 12288 at 512 tokens; the small preset's
// 2048 x 2048 and 2048 x 8192; a K3 routed expert's gate 3584 -> 3072 at the tokens one expert gets from a
// micro-batch (64, 128: k3-layers' 64 experts top-16 at 512 and K3's 896 at 4096 give ~128 and ~73)
#define KIMI_ANCHOR(name, rows, cols, nt)                                                                          \
  BENCHMARK_CAPTURE(kimi_gemm, bf16_##name, GgmlType::BF16, rows, cols, nt)->UseRealTime()->Unit(benchmark::kMillisecond); \
  BENCHMARK_CAPTURE(kimi_gemm, bf16_packed_##name, GgmlType::BF16, rows, cols, nt, true)                          \
      ->UseRealTime()                                                                                              \
      ->Unit(benchmark::kMillisecond);                                                                             \
  BENCHMARK_CAPTURE(onednn_gemm, bf16_##name, false, rows, cols, nt)->UseRealTime()->Unit(benchmark::kMillisecond);          \
  BENCHMARK_CAPTURE(kimi_gemm, q8_0_##name, GgmlType::Q8_0, rows, cols, nt)->UseRealTime()->Unit(benchmark::kMillisecond); \
  BENCHMARK_CAPTURE(kimi_gemm, mxfp4_##name, GgmlType::MXFP4, rows, cols, nt)->UseRealTime()->Unit(benchmark::kMillisecond); \
  BENCHMARK_CAPTURE(onednn_gemm, s8_##name, true, rows, cols, nt)->UseRealTime()->Unit(benchmark::kMillisecond);

KIMI_ANCHOR(12288x7168_t512, 12288, 7168, 512)
KIMI_ANCHOR(2048x2048_t512, 2048, 2048, 512)
KIMI_ANCHOR(2048x8192_t512, 2048, 8192, 512)
KIMI_ANCHOR(3072x3584_t64, 3072, 3584, 64)
KIMI_ANCHOR(3072x3584_t128, 3072, 3584, 128)

BENCHMARK_MAIN();
