// The ceiling loops of the avx512 level (backend/cpu/ceiling.h): 512-bit stream reads, and the
// vfmadd231ps / vdpbf16ps / vpdpbusd chains the avx512 matmul kernels are built on.
#include "backend/cpu/ceiling.h"

#if defined(__x86_64__)
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <immintrin.h>

namespace kimi::kern::detail {

namespace {

constexpr int kAcc = 12;  // independent chains: latency 4-6 x 2 ports on current cores

template <int S, bool NT>
uint64_t read_s(const uint8_t* p, size_t bytes) {
  __m512i acc[S];
  for (int s = 0; s < S; ++s) acc[s] = _mm512_setzero_si512();
  const size_t part = bytes / S;
  auto ld = [](const uint8_t* q) {
    if constexpr (NT) return _mm512_stream_load_si512(const_cast<void*>(static_cast<const void*>(q)));
    else return _mm512_load_si512(q);
  };
  for (size_t off = 0; off < part; off += 256) {
    _Pragma("GCC unroll 8") for (int s = 0; s < S; ++s) {
      const uint8_t* q = p + s * part + off;
      const __m512i a = _mm512_add_epi64(ld(q), ld(q + 64));
      const __m512i b = _mm512_add_epi64(ld(q + 128), ld(q + 192));
      acc[s] = _mm512_add_epi64(acc[s], _mm512_add_epi64(a, b));
    }
  }
  __m512i t = acc[0];
  for (int s = 1; s < S; ++s) t = _mm512_add_epi64(t, acc[s]);
  return static_cast<uint64_t>(_mm512_reduce_add_epi64(t));
}

template <bool NT>
uint64_t read_any(const uint8_t* p, size_t bytes, int streams) {
  switch (streams) {
    case 1: return read_s<1, NT>(p, bytes);
    case 2: return read_s<2, NT>(p, bytes);
    case 4: return read_s<4, NT>(p, bytes);
    case 8: return read_s<8, NT>(p, bytes);
    default: {  // other counts: one stream after the other
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

double lanes_f32(const __m512* acc) {
  double t = 0;
  for (int a = 0; a < kAcc; ++a) {
    alignas(64) float v[16];
    _mm512_store_ps(v, acc[a]);
    for (float x : v) t += x;
  }
  return t;
}

double peak(ActType type, int64_t iters, int one) {
  if (type == ActType::Int8) {
    const __m512i u = _mm512_set1_epi8(static_cast<char>(one)), s = _mm512_set1_epi8(static_cast<char>(one));
    __m512i acc[kAcc];
    for (auto& a : acc) a = _mm512_setzero_si512();
    for (int64_t i = 0; i < iters; ++i) {
      _Pragma("GCC unroll 16") for (int a = 0; a < kAcc; ++a) acc[a] = _mm512_dpbusd_epi32(acc[a], u, s);
    }
    double t = 0;
    for (int a = 0; a < kAcc; ++a) {
      alignas(64) int32_t v[16];
      _mm512_store_si512(v, acc[a]);
      for (int32_t x : v) t += x;
    }
    return t;
  }
  __m512 acc[kAcc];
  for (auto& a : acc) a = _mm512_setzero_ps();
  const float f = static_cast<float>(one);
  if (type == ActType::Bf16) {
    uint32_t bits;
    __builtin_memcpy(&bits, &f, 4);
    const __m512i h = _mm512_set1_epi16(static_cast<short>(bits >> 16));
    const __m512bh x = reinterpret_cast<const __m512bh&>(h);
    for (int64_t i = 0; i < iters; ++i) {
      _Pragma("GCC unroll 16") for (int a = 0; a < kAcc; ++a) acc[a] = _mm512_dpbf16_ps(acc[a], x, x);
    }
    return lanes_f32(acc);
  }
  const __m512 x = _mm512_set1_ps(f);
  for (int64_t i = 0; i < iters; ++i) {
    _Pragma("GCC unroll 16") for (int a = 0; a < kAcc; ++a) acc[a] = _mm512_fmadd_ps(x, x, acc[a]);
  }
  return lanes_f32(acc);
}

}  // namespace

bool ceiling_loops_avx512(CeilingLoops* out) {
  out->read = read;
  out->peak = peak;
  out->products_per_iter[0] = 16 * kAcc;
  out->products_per_iter[1] = 32 * kAcc;
  out->products_per_iter[2] = 64 * kAcc;
  out->instr[0] = "vfmadd231ps zmm";
  out->instr[1] = "vdpbf16ps zmm";
  out->instr[2] = "vpdpbusd zmm";
  out->has_non_temporal = true;
  return true;
}

}  // namespace kimi::kern::detail

#else
namespace kimi::kern::detail {
bool ceiling_loops_avx512(CeilingLoops*) { return false; }
}  // namespace kimi::kern::detail
#endif
