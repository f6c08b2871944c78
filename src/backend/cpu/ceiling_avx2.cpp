// The ceiling loops of the avx2 level (backend/cpu/ceiling.h): 256-bit stream reads, and the
// vfmadd231ps ymm and vpmaddubsw + vpmaddwd + vpaddd chains the avx2 matmul kernels are built on
// (bf16 weights are widened to f32 at this level: their peak is the f32 one).
#include "backend/cpu/ceiling.h"

#if defined(__x86_64__)
#include <immintrin.h>

namespace kimi::kern::detail {

namespace {

constexpr int kAcc = 8;  // 16 ymm registers: 8 chains + inputs and temporaries

template <int S, bool NT>
uint64_t read_s(const uint8_t* p, size_t bytes) {
  __m256i acc[S];
  for (int s = 0; s < S; ++s) acc[s] = _mm256_setzero_si256();
  const size_t part = bytes / S;
  auto ld = [](const uint8_t* q) {
    if constexpr (NT) return _mm256_stream_load_si256(reinterpret_cast<const __m256i*>(q));
    else return _mm256_load_si256(reinterpret_cast<const __m256i*>(q));
  };
  for (size_t off = 0; off < part; off += 256) {
    _Pragma("GCC unroll 8") for (int s = 0; s < S; ++s) {
      const uint8_t* q = p + s * part + off;
      __m256i a = _mm256_add_epi64(ld(q), ld(q + 32));
      a = _mm256_add_epi64(a, _mm256_add_epi64(ld(q + 64), ld(q + 96)));
      __m256i b = _mm256_add_epi64(ld(q + 128), ld(q + 160));
      b = _mm256_add_epi64(b, _mm256_add_epi64(ld(q + 192), ld(q + 224)));
      acc[s] = _mm256_add_epi64(acc[s], _mm256_add_epi64(a, b));
    }
  }
  __m256i t = acc[0];
  for (int s = 1; s < S; ++s) t = _mm256_add_epi64(t, acc[s]);
  alignas(32) uint64_t v[4];
  _mm256_store_si256(reinterpret_cast<__m256i*>(v), t);
  return v[0] + v[1] + v[2] + v[3];
}

template <bool NT>
uint64_t read_any(const uint8_t* p, size_t bytes, int streams) {
  switch (streams) {
    case 1: return read_s<1, NT>(p, bytes);
    case 2: return read_s<2, NT>(p, bytes);
    case 4: return read_s<4, NT>(p, bytes);
    case 8: return read_s<8, NT>(p, bytes);
    default: {
      uint64_t t = 0;
      const size_t part = bytes / static_cast<size_t>(streams);
      for (int s = 0; s < streams; ++s) t += read_s<1, NT>(p + static_cast<size_t>(s) * part, part);
      return t;
    }
  }
}

uint64_t read(const uint8_t* p, size_t bytes, int streams, bool nt) {
  return nt ? read_any<true>(p, bytes, streams) : read_any<false>(p, bytes, streams);
}

double peak(ActType type, int64_t iters, int one) {
  if (type == ActType::Int8) {
    const __m256i u = _mm256_set1_epi8(static_cast<char>(one)), ones16 = _mm256_set1_epi16(1);
    __m256i acc[kAcc];
    for (auto& a : acc) a = _mm256_setzero_si256();
    for (int64_t i = 0; i < iters; ++i) {
      _Pragma("GCC unroll 16") for (int a = 0; a < kAcc; ++a) acc[a] =
          _mm256_add_epi32(acc[a], _mm256_madd_epi16(_mm256_maddubs_epi16(u, u), ones16));
    }
    double t = 0;
    for (int a = 0; a < kAcc; ++a) {
      alignas(32) int32_t v[8];
      _mm256_store_si256(reinterpret_cast<__m256i*>(v), acc[a]);
      for (int32_t x : v) t += x;
    }
    return t;
  }
  __m256 acc[kAcc];
  for (auto& a : acc) a = _mm256_setzero_ps();
  const __m256 x = _mm256_set1_ps(static_cast<float>(one));
  for (int64_t i = 0; i < iters; ++i) {
    _Pragma("GCC unroll 16") for (int a = 0; a < kAcc; ++a) acc[a] = _mm256_fmadd_ps(x, x, acc[a]);
  }
  double t = 0;
  for (int a = 0; a < kAcc; ++a) {
    alignas(32) float v[8];
    _mm256_store_ps(v, acc[a]);
    for (float f : v) t += f;
  }
  return t;
}

}  // namespace

bool ceiling_loops_avx2(CeilingLoops* out) {
  out->read = read;
  out->peak = peak;
  out->products_per_iter[0] = 8 * kAcc;
  out->products_per_iter[1] = 8 * kAcc;
  out->products_per_iter[2] = 32 * kAcc;
  out->instr[0] = "vfmadd231ps ymm";
  out->instr[1] = "vfmadd231ps ymm (bf16 widened)";
  out->instr[2] = "vpmaddubsw+vpmaddwd+vpaddd ymm";
  out->has_non_temporal = true;
  return true;
}

}  // namespace kimi::kern::detail

#else
namespace kimi::kern::detail {
bool ceiling_loops_avx2(CeilingLoops*) { return false; }
}  // namespace kimi::kern::detail
#endif
