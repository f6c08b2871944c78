// Matmul micro-benchmarks at small-preset and K3 shapes (run `KIMI_ISA=avx2 bench/bench_matmul` etc.
// to compare levels). GEMV: bytes_per_second = weight bytes streamed (several copies of the matrix
// rotate so it never sits in cache). GEMM: items_per_second = FLOPs (2 per multiply-add).
// `packed_*`: the K-quants and BF16 through their load-time copy (repack.h: row-interleaved x16; BF16 in
// the AMX tile order or, on AVX-512 BF16 without AMX, the bf16 x16 order), as the CPU
// backend runs them. `peak_*`: the dot-product peak of one instruction kind per thread count
// (independent accumulators, no memory), the reference for the GEMM efficiency: items = MACs.
#include <benchmark/benchmark.h>
#if defined(__x86_64__)
// GCC 12 warns about _mm512_undefined_* inside its own intrinsic headers (the reductions below)
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <immintrin.h>
#endif

#include <cstdlib>
#include <cstring>
#include <memory>
#include <random>
#include <vector>

#include "backend/cpu/dispatch.h"
#include "backend/cpu/matmul.h"
#include "backend/cpu/matmul_amx.h"
#include "backend/cpu/matmul_mx_lanes.h"
#include "backend/cpu/repack.h"
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

// The kernel family a product of type t runs on: the ISA level, "+amx" when AMX tiles take it.
std::string kernel_label(GgmlType t, Precision prec = Precision::Fast) {
  std::string l = active_isa();
  if (prec == Precision::Fast && t == GgmlType::BF16 && amx_bf16_usable()) l += "+amx";
  return l;
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

// The from-memory cases rotate over copies of their matrix that together hold at least kDramBytes, so
// that no last-level cache holds them (a 2-core cloud VM here reports a 480 MB L3: with the 75-100 MB
// these cases used to rotate over, a Q4_K GEMV "from memory" measured 35-42 GB/s, from 1 GiB 18-19,
// which is what decode sees). copies == 1: the cache-resident ("hot") cases, unchanged.
constexpr uint64_t kDramBytes = uint64_t{1} << 30;
int dram_copies(uint64_t mat_bytes, int copies) {
  if (copies <= 1) return copies;
  return static_cast<int>(std::max<uint64_t>(static_cast<uint64_t>(copies), (kDramBytes + mat_bytes - 1) / mat_bytes));
}

// GEMV over stacked copies of a rows x cols matrix (dram_copies), one copy per call.
void gemv(benchmark::State& st, GgmlType t, int64_t rows, int64_t cols, int copies, Precision prec) {
  const uint64_t mat_bytes = row_bytes(t, static_cast<uint64_t>(cols)) * static_cast<uint64_t>(rows);
  copies = dram_copies(mat_bytes, copies);
  const auto w = make_weights(t, rows, cols, copies);
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
  st.SetLabel(kernel_label(t, prec));
}

// MoE decode pattern: 8 random experts (each rows x cols MXFP4) per iteration, out of as many as hold
// kDramBytes (a model's layers hold that many between two visits of one layer).
void moe_gemv(benchmark::State& st, int64_t rows, int64_t cols) {
  const uint64_t rb = row_bytes(GgmlType::MXFP4, static_cast<uint64_t>(cols));
  const uint64_t exp_bytes = rb * static_cast<uint64_t>(rows);
  const int n_exp = dram_copies(exp_bytes, 64);
  const auto w = make_weights(GgmlType::MXFP4, rows, cols, n_exp);
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
  st.SetLabel(kernel_label(t));
}

// MXFP4 / Q8_0 A/B on one binary: arg 1 = the lane path with register broadcasts (matmul_mx_lanes.h), 0 = the lane kernel it
// replaced (set_mx_lanes); run with --benchmark_enable_random_interleaving=true and repetitions so the
// two alternate (docs/performance.md, section 6.6).
void gemm_mx(benchmark::State& st, int64_t rows, int64_t cols, int64_t nt, GgmlType t = GgmlType::MXFP4) {
  const bool on = st.range(0) != 0;
  const auto w = make_weights(t, rows, cols);
  const auto x = make_x(cols * nt);
  std::vector<float> y(static_cast<size_t>(rows * nt));
  MatView W{t, w.data(), rows, cols, row_bytes(t, static_cast<uint64_t>(cols))};
  set_mx_lanes(on);
  const bool took = mx_lanes_takes(W, nt, Precision::Fast);
  for (auto _ : st) {
    matmul(W, x.data(), nt, y.data(), pool());
    benchmark::DoNotOptimize(y.data());
  }
  set_mx_lanes(true);
  st.SetItemsProcessed(static_cast<int64_t>(st.iterations()) * 2 * rows * cols * nt);
  st.SetLabel(kernel_label(t) + (took ? " mx-lanes" : " q8-lanes"));
}

// The same through packed copies (one per rotated copy), as CpuBackend::prepare_weight makes them.
// matmul uses a packed copy for one token where PackedKernel::gemv is set (Q4_K, and Q5_K since
// 2026-12-06): the Q6_K cases below time the plain kernel on the original rows.
void gemv_packed(benchmark::State& st, GgmlType t, int64_t rows, int64_t cols, int copies) {
  const uint64_t rb = row_bytes(t, static_cast<uint64_t>(cols));
  const uint64_t mat_bytes = rb * static_cast<uint64_t>(rows);
  copies = dram_copies(mat_bytes, copies);
  const auto w = make_weights(t, rows, cols, copies);
  std::vector<MatView> views;
  std::vector<std::unique_ptr<PackedWeight>> packs;
  for (int c = 0; c < copies; ++c) {
    views.push_back(MatView{t, w.data() + mat_bytes * static_cast<uint64_t>(c), rows, cols, rb});
    packs.push_back(pack_weight(views.back(), &pool()));
    views.back().packed = packs.back().get();
  }
  if (!packs[0]) st.SkipWithError("no packed kernel at this ISA level");
  const auto x = make_x(cols);
  std::vector<float> y(static_cast<size_t>(rows));
  int i = 0;
  for (auto _ : st) {
    matmul(views[static_cast<size_t>(i)], x.data(), 1, y.data(), pool());
    benchmark::DoNotOptimize(y.data());
    i = (i + 1) % copies;
  }
  st.SetBytesProcessed(static_cast<int64_t>(st.iterations()) * static_cast<int64_t>(mat_bytes));
  st.SetLabel(active_isa());
}

void gemm_packed(benchmark::State& st, GgmlType t, int64_t rows, int64_t cols, int64_t nt) {
  const auto w = make_weights(t, rows, cols);
  const auto x = make_x(cols * nt);
  std::vector<float> y(static_cast<size_t>(rows * nt));
  MatView W{t, w.data(), rows, cols, row_bytes(t, static_cast<uint64_t>(cols))};
  const auto P = pack_weight(W, &pool());
  if (!P) st.SkipWithError("no packed kernel at this ISA level");
  W.packed = P.get();
  for (auto _ : st) {
    matmul(W, x.data(), nt, y.data(), pool());
    benchmark::DoNotOptimize(y.data());
  }
  st.SetItemsProcessed(static_cast<int64_t>(st.iterations()) * 2 * rows * cols * nt);
  st.SetLabel(kernel_label(t));
}

#if defined(__x86_64__)
// Peak loops: 12 independent accumulators (more than latency x throughput), operands kept in
// registers. Compiled for AVX-512 here only; run only where the CPU has it.
constexpr int kAcc = 12;
__attribute__((target("avx512f,avx512bw,avx512vnni"), noinline)) int64_t peak_vnni_loop(int64_t n) {
  __m512i c[kAcc];
  __m512i a = _mm512_set1_epi8(1), b = _mm512_set1_epi8(2);
  for (auto& v : c) v = _mm512_setzero_si512();
  for (int64_t i = 0; i < n; ++i) {
    for (auto& v : c) v = _mm512_dpbusd_epi32(v, a, b);
    asm volatile("" : "+v"(a), "+v"(b));
  }
  int64_t s = 0;
  for (auto& v : c) s += _mm512_reduce_add_epi32(v);
  return s;
}
__attribute__((target("avx512f,avx512bw,avx512bf16"), noinline)) float peak_bf16_loop(int64_t n) {
  __m512 c[kAcc];
  __m512i a = _mm512_set1_epi16(0x3f80), b = _mm512_set1_epi16(0x3f80);
  for (auto& v : c) v = _mm512_setzero_ps();
  for (int64_t i = 0; i < n; ++i) {
    for (auto& v : c) v = _mm512_dpbf16_ps(v, (__m512bh)a, (__m512bh)b);
    asm volatile("" : "+v"(a), "+v"(b));
  }
  float s = 0;
  for (auto& v : c) s += _mm512_reduce_add_ps(v);
  return s;
}
__attribute__((target("avx512f"), noinline)) float peak_fma_loop(int64_t n) {
  __m512 c[kAcc];
  __m512 a = _mm512_set1_ps(1.0f), b = _mm512_set1_ps(0.5f);
  for (auto& v : c) v = _mm512_setzero_ps();
  for (int64_t i = 0; i < n; ++i) {
    for (auto& v : c) v = _mm512_fmadd_ps(a, b, v);
    asm volatile("" : "+v"(a), "+v"(b));
  }
  float s = 0;
  for (auto& v : c) s += _mm512_reduce_add_ps(v);
  return s;
}

// kind 0: vpdpbusd (64 u8 x s8 MACs per chain), 1: vdpbf16ps (32 bf16), 2: vfmadd231ps (16 f32), each over
// kAcc chains; 3: AMX tdpbf16ps, 4 independent C tiles (kAmxPeakProductsPerIter per iteration): the bf16 peak
// `kimi bench` states on AMX machines; 4: AMX tdpbssd likewise (kAmxInt8PeakProductsPerIter): its int8 tile peak
void peak(benchmark::State& st, int kind) {
  const CpuFeatures& f = cpu_features();
  const bool tiles = kind >= 3;
  if (kind == 3 ? !amx_bf16_usable()
      : kind == 4 ? !amx_int8_usable()
                  : !(f.avx512f && f.avx512bw && (kind != 0 || f.avx512vnni) && (kind != 1 || f.avx512bf16))) {
    st.SkipWithError(tiles ? "no AMX on this CPU (or not granted by the OS)" : "no AVX-512 VNNI/BF16 on this CPU");
    return;
  }
  const int nth = static_cast<int>(st.range(0));
  ThreadPool tp(nth);
  const int64_t iters = tiles ? 200000 : 2000000;
  std::vector<double> sink(static_cast<size_t>(nth));
  for (auto _ : st) {
    tp.run_on_all([&](int ti, int) {
      sink[static_cast<size_t>(ti)] = kind == 0   ? static_cast<double>(peak_vnni_loop(iters))
                                      : kind == 1 ? peak_bf16_loop(iters)
                                      : kind == 2 ? peak_fma_loop(iters)
                                      : kind == 3 ? amx_bf16_peak_loop(iters)
                                                  : amx_int8_peak_loop(iters);
    });
    benchmark::DoNotOptimize(sink.data());
  }
  const int64_t per_iter = kind == 3   ? kAmxPeakProductsPerIter
                           : kind == 4 ? kAmxInt8PeakProductsPerIter
                                       : kAcc * (kind == 0 ? 64 : kind == 1 ? 32 : 16);
  st.SetItemsProcessed(static_cast<int64_t>(st.iterations()) * nth * iters * per_iter);
}
#endif

}  // namespace

#if defined(__x86_64__)
BENCHMARK_CAPTURE(peak, amx_bf16_mac, 3)->Arg(1)->Arg(2)->UseRealTime();
BENCHMARK_CAPTURE(peak, amx_s8s8_mac, 4)->Arg(1)->Arg(2)->UseRealTime();
BENCHMARK_CAPTURE(peak, vnni_u8s8_mac, 0)->Arg(1)->Arg(2)->UseRealTime();
BENCHMARK_CAPTURE(peak, bf16_mac, 1)->Arg(1)->Arg(2)->UseRealTime();
BENCHMARK_CAPTURE(peak, f32_fma_mac, 2)->Arg(1)->Arg(2)->UseRealTime();
#endif

// K-quants through their packed copies: small-preset FFN down and K3 shapes (7168 hidden:
// KDA q/k/v 7168 -> 12288, routed/shared expert 7168 -> 3072 and back)
BENCHMARK_CAPTURE(gemv_packed, q4_K_2048x8192, GgmlType::Q4_K, 2048, 8192, 8)->UseRealTime();
// small-preset KDA projection (2048 -> 2048)
BENCHMARK_CAPTURE(gemv_packed, q4_K_2048x2048, GgmlType::Q4_K, 2048, 2048, 2)->UseRealTime();
BENCHMARK_CAPTURE(gemv_packed, q5_K_2048x8192, GgmlType::Q5_K, 2048, 8192, 8)->UseRealTime();
BENCHMARK_CAPTURE(gemv_packed, q6_K_2048x8192, GgmlType::Q6_K, 2048, 8192, 8)->UseRealTime();
BENCHMARK_CAPTURE(gemv_packed, q4_K_12288x7168, GgmlType::Q4_K, 12288, 7168, 2)->UseRealTime();
BENCHMARK_CAPTURE(gemv_packed, q6_K_12288x7168, GgmlType::Q6_K, 12288, 7168, 2)->UseRealTime();
// cache-resident (one 256 x 4096 copy, ~0.6-1.1 MB: L2): the kernel's own speed with no DRAM in the
// way; far above the DRAM cases = decode there is memory-bound, about equal = compute-bound
BENCHMARK_CAPTURE(gemv_packed, q4_K_hot_256x4096, GgmlType::Q4_K, 256, 4096, 1)->UseRealTime();
BENCHMARK_CAPTURE(gemv_packed, q5_K_hot_256x4096, GgmlType::Q5_K, 256, 4096, 1)->UseRealTime();
BENCHMARK_CAPTURE(gemv_packed, q6_K_hot_256x4096, GgmlType::Q6_K, 256, 4096, 1)->UseRealTime();
BENCHMARK_CAPTURE(gemv, q4_K_hot_256x4096, GgmlType::Q4_K, 256, 4096, 1, Precision::Fast)->UseRealTime();
BENCHMARK_CAPTURE(gemv, q5_K_hot_256x4096, GgmlType::Q5_K, 256, 4096, 1, Precision::Fast)->UseRealTime();
BENCHMARK_CAPTURE(gemv, q6_K_hot_256x4096, GgmlType::Q6_K, 256, 4096, 1, Precision::Fast)->UseRealTime();
BENCHMARK_CAPTURE(gemv, q8_0_hot_256x4096, GgmlType::Q8_0, 256, 4096, 1, Precision::Fast)->UseRealTime();
BENCHMARK_CAPTURE(gemv, bf16_hot_128x4096, GgmlType::BF16, 128, 4096, 1, Precision::Fast)->UseRealTime();
BENCHMARK_CAPTURE(gemv, mxfp4_hot_256x4096, GgmlType::MXFP4, 256, 4096, 1, Precision::Fast)->UseRealTime();
BENCHMARK_CAPTURE(gemv, q4_K_12288x7168, GgmlType::Q4_K, 12288, 7168, 2, Precision::Fast)->UseRealTime();
BENCHMARK_CAPTURE(gemv, q8_0_12288x7168, GgmlType::Q8_0, 12288, 7168, 2, Precision::Fast)->UseRealTime();
BENCHMARK_CAPTURE(gemv, bf16_12288x7168, GgmlType::BF16, 12288, 7168, 2, Precision::Fast)->UseRealTime();
BENCHMARK_CAPTURE(gemv_packed, bf16_12288x7168, GgmlType::BF16, 12288, 7168, 2)->UseRealTime();
BENCHMARK_CAPTURE(gemv, mxfp4_3072x7168, GgmlType::MXFP4, 3072, 7168, 8, Precision::Fast)->UseRealTime();
BENCHMARK_CAPTURE(gemm_packed, q4_K_2048x2048_t512, GgmlType::Q4_K, 2048, 2048, 512)->UseRealTime()->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(gemm_packed, q5_K_2048x2048_t512, GgmlType::Q5_K, 2048, 2048, 512)->UseRealTime()->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(gemm_packed, q6_K_2048x2048_t512, GgmlType::Q6_K, 2048, 2048, 512)->UseRealTime()->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(gemm_packed, q5_K_2048x8192_t8, GgmlType::Q5_K, 2048, 8192, 8)->UseRealTime();
BENCHMARK_CAPTURE(gemm_packed, q6_K_2048x8192_t8, GgmlType::Q6_K, 2048, 8192, 8)->UseRealTime();
BENCHMARK_CAPTURE(gemm_packed, q4_K_3072x7168_t512, GgmlType::Q4_K, 3072, 7168, 512)->UseRealTime()->Unit(benchmark::kMillisecond);
// Small batches (speculative verify steps, short prefill chunks) of the packed K-quants as the backend runs
// them: args rows, cols, tokens (the always-read Q4_K_M shapes of the small preset and a K3 7168-wide one)
void gemm_packed_n(benchmark::State& st, GgmlType t) { gemm_packed(st, t, st.range(0), st.range(1), st.range(2)); }
BENCHMARK_CAPTURE(gemm_packed_n, q4_K, GgmlType::Q4_K)->ArgsProduct({{2048}, {8192}, {1, 2, 4, 8, 15, 16}})->Args({7168, 2048, 1})->Args({7168, 2048, 2})->Args({7168, 2048, 4})->Args({7168, 2048, 8})->Args({7168, 2048, 15})->Args({7168, 2048, 16})->UseRealTime();
BENCHMARK_CAPTURE(gemm_packed_n, q5_K, GgmlType::Q5_K)->ArgsProduct({{2048}, {8192}, {1, 2, 4, 8, 15, 16}})->Args({7168, 2048, 1})->Args({7168, 2048, 2})->Args({7168, 2048, 4})->Args({7168, 2048, 8})->Args({7168, 2048, 15})->Args({7168, 2048, 16})->UseRealTime();
BENCHMARK_CAPTURE(gemm_packed_n, q6_K, GgmlType::Q6_K)->ArgsProduct({{2048}, {8192}, {1, 2, 4, 8, 15, 16}})->Args({7168, 2048, 1})->Args({7168, 2048, 2})->Args({7168, 2048, 4})->Args({7168, 2048, 8})->Args({7168, 2048, 15})->Args({7168, 2048, 16})->UseRealTime();

// dense FFN of the small preset: gate/up {2048 -> 8192}, down {8192 -> 2048}
BENCHMARK_CAPTURE(gemv, bf16_8192x2048, GgmlType::BF16, 8192, 2048, 4, Precision::Fast)->UseRealTime();
BENCHMARK_CAPTURE(gemv, bf16_2048x8192, GgmlType::BF16, 2048, 8192, 4, Precision::Fast)->UseRealTime();
BENCHMARK_CAPTURE(gemv_packed, bf16_2048x8192, GgmlType::BF16, 2048, 8192, 4)->UseRealTime();
BENCHMARK_CAPTURE(gemv, q8_0_2048x8192, GgmlType::Q8_0, 2048, 8192, 4, Precision::Fast)->UseRealTime();
BENCHMARK_CAPTURE(gemv, q4_0_2048x8192, GgmlType::Q4_0, 2048, 8192, 8, Precision::Fast)->UseRealTime();
BENCHMARK_CAPTURE(gemv, mxfp4_2048x8192, GgmlType::MXFP4, 2048, 8192, 8, Precision::Fast)->UseRealTime();
BENCHMARK_CAPTURE(gemv, f16_2048x8192, GgmlType::F16, 2048, 8192, 4, Precision::Fast)->UseRealTime();
BENCHMARK_CAPTURE(gemv, f32_2048x4096, GgmlType::F32, 2048, 4096, 4, Precision::Fast)->UseRealTime();
BENCHMARK_CAPTURE(gemv, q4_K_2048x8192, GgmlType::Q4_K, 2048, 8192, 8, Precision::Fast)->UseRealTime();
BENCHMARK_CAPTURE(gemv, q5_K_2048x8192, GgmlType::Q5_K, 2048, 8192, 8, Precision::Fast)->UseRealTime();
BENCHMARK_CAPTURE(gemv, q6_K_2048x8192, GgmlType::Q6_K, 2048, 8192, 8, Precision::Fast)->UseRealTime();
// the small preset's output head (2048 -> 32768; Q6_K in Q4_K_M files)
BENCHMARK_CAPTURE(gemv, q6_K_32768x2048, GgmlType::Q6_K, 32768, 2048, 2, Precision::Fast)->UseRealTime();
BENCHMARK_CAPTURE(gemv, bf16_f32prec_2048x8192, GgmlType::BF16, 2048, 8192, 4, Precision::F32)->UseRealTime();
// routed experts of the small preset: 64 experts {1024 -> 768}, 8 active
BENCHMARK_CAPTURE(moe_gemv, mxfp4_768x1024_8of64, 768, 1024)->UseRealTime();
// prefill GEMM, 512 tokens
BENCHMARK_CAPTURE(gemm, bf16_2048x2048_t512, GgmlType::BF16, 2048, 2048, 512)->UseRealTime()->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(gemm, bf16_2048x8192_t512, GgmlType::BF16, 2048, 8192, 512)->UseRealTime()->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(gemm, bf16_8192x2048_t512, GgmlType::BF16, 8192, 2048, 512)->UseRealTime()->Unit(benchmark::kMillisecond);
// K3 shapes: a KDA projection (7168 -> 12288) and a routed expert's gate (3584 -> 3072) at 64 tokens
BENCHMARK_CAPTURE(gemm, bf16_12288x7168_t512, GgmlType::BF16, 12288, 7168, 512)->UseRealTime()->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(gemm_packed, bf16_12288x7168_t512, GgmlType::BF16, 12288, 7168, 512)->UseRealTime()->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(gemm_packed, bf16_2048x2048_t512, GgmlType::BF16, 2048, 2048, 512)->UseRealTime()->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(gemm, mxfp4_3072x3584_t64, GgmlType::MXFP4, 3072, 3584, 64)->UseRealTime()->Unit(benchmark::kMillisecond);
// K3's routed experts (gate / up 3584 -> 3072, down 3072 -> 3584) at the tokens an expert gets: A/B
BENCHMARK_CAPTURE(gemm_mx, k3_gate_3072x3584_t9, 3072, 3584, 9)->Arg(0)->Arg(1)->UseRealTime()->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(gemm_mx, k3_gate_3072x3584_t16, 3072, 3584, 16)->Arg(0)->Arg(1)->UseRealTime()->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(gemm_mx, k3_gate_3072x3584_t64, 3072, 3584, 64)->Arg(0)->Arg(1)->UseRealTime()->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(gemm_mx, k3_gate_3072x3584_t128, 3072, 3584, 128)->Arg(0)->Arg(1)->UseRealTime()->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(gemm_mx, k3_down_3584x3072_t64, 3584, 3072, 64)->Arg(0)->Arg(1)->UseRealTime()->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(gemm_mx, k3_down_3584x3072_t128, 3584, 3072, 128)->Arg(0)->Arg(1)->UseRealTime()->Unit(benchmark::kMillisecond);
// the same expert shape with Q8_0 weights (K-quant conversions keep some experts in Q8_0)
BENCHMARK_CAPTURE(gemm_mx, q8_0_gate_3072x3584_t64, 3072, 3584, 64, GgmlType::Q8_0)->Arg(0)->Arg(1)->UseRealTime()->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(gemm_mx, q8_0_gate_3072x3584_t128, 3072, 3584, 128, GgmlType::Q8_0)->Arg(0)->Arg(1)->UseRealTime()->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(gemm, mxfp4_1024x768_t64, GgmlType::MXFP4, 1024, 768, 64)->UseRealTime()->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(gemm, q8_0_2048x2048_t512, GgmlType::Q8_0, 2048, 2048, 512)->UseRealTime()->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(gemm, mxfp4_768x1024_t512, GgmlType::MXFP4, 768, 1024, 512)->UseRealTime()->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(gemm, q4_0_2048x2048_t512, GgmlType::Q4_0, 2048, 2048, 512)->UseRealTime()->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(gemm, q4_K_2048x2048_t512, GgmlType::Q4_K, 2048, 2048, 512)->UseRealTime()->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(gemm, q6_K_2048x2048_t512, GgmlType::Q6_K, 2048, 2048, 512)->UseRealTime()->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(gemm, f32_2048x2048_t64, GgmlType::F32, 2048, 2048, 64)->UseRealTime()->Unit(benchmark::kMillisecond);

BENCHMARK_MAIN();
