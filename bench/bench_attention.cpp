// Micro-benchmarks of the attention-side kernels at small-preset shapes, one thread:
//   BM_KdaTokens / BM_KdaChunks: the KDA recurrence over 512 tokens of one head (D = 128), token
//     steps vs the chunked form (items = tokens);
//   BM_IndexerScores: one query's DSA indexer scores (32 heads x 128) over n f16 keys (items = keys);
//   BM_TopK: the indexer's top-2048 threshold selection over n scores (items = scores);
//   BM_TopKNthElement: its former core, nth_element over a copy of the n scores.
#include <benchmark/benchmark.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

#include "backend/cpu/attention.h"
#include "backend/cpu/kda.h"
#include "backend/cpu/ops.h"
#include "backend/cpu/topk.h"

using namespace kimi;

namespace {

constexpr int64_t kD = 128, kT = 512;

struct KdaData {
  std::vector<float> q, k, v, a, beta, o, S, tmp, work;
  KdaData() : q(kT * kD), k(kT * kD), v(kT * kD), a(kT * kD), beta(kT), o(kT * kD), S(kD * kD, 0.0f), tmp(kD),
              work(static_cast<size_t>(kern::kda_chunk_work_floats(kD))) {
    std::mt19937 rng(1);
    std::uniform_real_distribution<float> U(-1.0f, 1.0f), G(-5.0f, 0.0f);
    for (int64_t t = 0; t < kT; ++t) {
      for (int64_t i = 0; i < kD; ++i) {
        q[t * kD + i] = U(rng) / 8, k[t * kD + i] = U(rng) / 8, v[t * kD + i] = U(rng);
        a[t * kD + i] = std::exp(G(rng) * 0.1f);
      }
      beta[t] = 0.5f;
    }
  }
};

void BM_KdaTokens(benchmark::State& st) {
  KdaData d;
  for (auto _ : st) {
    for (int64_t t = 0; t < kT; ++t)
      kern::kda_step_decay(d.S.data(), &d.q[t * kD], &d.k[t * kD], &d.v[t * kD], &d.a[t * kD], d.beta[t], 0.1f,
                           &d.o[t * kD], kD, d.tmp.data());
    benchmark::DoNotOptimize(d.o.data());
  }
  st.SetItemsProcessed(st.iterations() * kT);
}
BENCHMARK(BM_KdaTokens);

void BM_KdaChunks(benchmark::State& st) {
  KdaData d;
  for (auto _ : st) {
    for (int64_t t = 0; t < kT; t += kern::kKdaChunk)
      kern::kda_chunk(d.S.data(), &d.q[t * kD], &d.k[t * kD], &d.v[t * kD], &d.a[t * kD], true, &d.beta[t], kD, 1,
                      kern::kKdaChunk, 0.1f, &d.o[t * kD], kD, d.work.data());
    benchmark::DoNotOptimize(d.o.data());
  }
  st.SetItemsProcessed(st.iterations() * kT);
}
BENCHMARK(BM_KdaChunks);

void BM_IndexerScores(benchmark::State& st) {
  const int64_t n = st.range(0), H = 32;
  std::mt19937 rng(2);
  std::uniform_real_distribution<float> U(-1.0f, 1.0f);
  std::vector<float> q(H * kD), w(H), scores(static_cast<size_t>(n)), kf(static_cast<size_t>(n * kD));
  for (auto& x : q) x = U(rng);
  for (auto& x : w) x = U(rng);
  for (auto& x : kf) x = U(rng);
  std::vector<uint16_t> keys(kf.size());
  kern::f32_to_f16_row(kf.data(), keys.data(), static_cast<int64_t>(kf.size()));
  for (auto _ : st) {
    kern::indexer_scores(q.data(), w.data(), H, keys.data(), true, kD, n, scores.data());
    benchmark::DoNotOptimize(scores.data());
  }
  st.SetItemsProcessed(st.iterations() * n);
}
BENCHMARK(BM_IndexerScores)->Arg(4096)->Arg(32768);

void BM_TopK(benchmark::State& st) {
  const int64_t n = st.range(0);
  std::mt19937 rng(3);
  std::uniform_real_distribution<float> U(-1.0f, 1.0f);
  std::vector<float> s(static_cast<size_t>(n)), tmp(static_cast<size_t>(n));
  for (auto& x : s) x = U(rng);
  std::vector<int32_t> out(2048);
  for (auto _ : st) {
    benchmark::DoNotOptimize(kern::topk_indices_threshold(s.data(), n, 2048, out.data(), tmp.data()));
  }
  st.SetItemsProcessed(st.iterations() * n);
}
BENCHMARK(BM_TopK)->Arg(32768)->Arg(131072);

// what the threshold selection did before the radix step: nth_element over a copy of all scores
void BM_TopKNthElement(benchmark::State& st) {
  const int64_t n = st.range(0);
  std::mt19937 rng(3);
  std::uniform_real_distribution<float> U(-1.0f, 1.0f);
  std::vector<float> s(static_cast<size_t>(n)), tmp(static_cast<size_t>(n));
  for (auto& x : s) x = U(rng);
  for (auto _ : st) {
    std::copy(s.begin(), s.end(), tmp.begin());
    std::nth_element(tmp.begin(), tmp.begin() + 2047, tmp.end(), [](float a, float b) { return a > b; });
    benchmark::DoNotOptimize(tmp[2047]);
  }
  st.SetItemsProcessed(st.iterations() * n);
}
BENCHMARK(BM_TopKNthElement)->Arg(32768)->Arg(131072);

}  // namespace

BENCHMARK_MAIN();
