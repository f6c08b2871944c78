// AMX-INT8 tiles for the x16 packed Q4_K / Q5_K weights (repack.h) with 16 or more tokens; entered only
// after amx_int8_usable() (matmul.cpp, matmul_packed). See matmul_amx.h "packed K-quants".
//
// Roles are those of the packed AVX-512 kernel: a C element is (token, weight row) and a C row holds one
// token's 16 rows of a group, as one zmm of the AVX-512 kernel does. The A operand is 16 tokens x 32
// activation bytes of one 32-value sub-block, loaded in place from the prepared Q8_K rows (row stride =
// the activation stride); the B operand is the group's sub-block in the packed layout's own order
// (8 rows of 16 weight rows x 4 consecutive values), decoded to bytes once per super-block (0..15 /
// 0..31, read as s8) and used for every token tile. Per super-block: 8 tile products (one per
// sub-block, exact int32), each scaled by its sub-block scale and summed in int32 (vpmulld), then the
// AVX-512 kernel's two f32 steps (d * d_a * sum, - dmin * d_a * sum m_j s_j): the same integers and the
// same f32 operations in the same order, so the results are bit-identical to the AVX-512 kernel's.
#include "backend/cpu/matmul_amx.h"

#if defined(__x86_64__) && defined(__linux__)
// GCC 12 warns about _mm512_undefined_* inside its own intrinsic headers
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include "backend/cpu/repack_avx512_impl.h"

namespace kimi::kern {

namespace {

// Tile registers (matmul_amx.cpp's int8 configuration): C 0 / 1, A (16 x 32 bytes) 2 / 4, B (8 x 64) 3 / 5.
template <KT K>
void amx_run(const PackedWeight& P, const uint8_t* act, size_t stride, int64_t nt, int64_t g0, int64_t g1, float* y,
             int64_t ldy) {
  amx_tiles_int8();
  const int64_t nb = P.cols / 256;
  alignas(64) uint8_t bw[8][512];   // the super-block's 8 sub-blocks as B tiles
  alignas(64) int32_t cb[8][256];   // one token tile's 8 C tiles
  float* acc = f32_scratch(nt * 16 + 16, 2);
  for (int64_t g = g0; g < g1; ++g) {
    for (int64_t i = 0; i < nt * 16; ++i) acc[i] = 0.0f;
    for (int64_t b = 0; b < nb; ++b) {
      const uint8_t* blk = P.group(g) + b * PK<K>::kBB;
      const typename PK<K>::Hdr45 hd = PK<K>::hdr45(blk);
      for (int c = 0; c < 4; ++c)
        for (int s = 0; s < 8; ++s) {
          __m512i lo, hi;
          PK<K>::q45_values(blk, c, s, &lo, &hi);
          _mm512_store_si512(bw[2 * c] + 64 * s, lo);
          _mm512_store_si512(bw[2 * c + 1] + 64 * s, hi);
        }
      __m512i sc[8];
      KIMI_UNROLL for (int j = 0; j < 8; ++j) sc[j] = PK<K>::scale45(hd, j);
      for (int64_t t0 = 0; t0 < nt; t0 += 16) {
        const uint8_t* a0 = act + static_cast<size_t>(t0) * stride + b * kAB;
        // sub-block j in C tile j % 2; each C tile stored while the next product runs
#define KIMI_KQ_PRODUCT(C, A, B, j)              \
  _tile_zero(C);                                 \
  _tile_loadd(A, a0 + 32 * (j), stride);         \
  _tile_loadd(B, bw[j], 64);                     \
  _tile_dpbssd(C, A, B)
        for (int j = 0; j < 8; j += 2) {  // (tile numbers are immediates: the even / odd sub-block by hand)
          KIMI_KQ_PRODUCT(0, 2, 3, j);
          if (j > 0) _tile_stored(1, cb[j - 1], 64);
          KIMI_KQ_PRODUCT(1, 4, 5, j + 1);
          _tile_stored(0, cb[j], 64);
        }
        _tile_stored(1, cb[7], 64);
#undef KIMI_KQ_PRODUCT
        const int64_t nv = nt - t0 < 16 ? nt - t0 : 16;
        for (int64_t m = 0; m < nv; ++m) {
          __m512i isb = _mm512_mullo_epi32(_mm512_load_si512(cb[0] + 16 * m), sc[0]);
          KIMI_UNROLL for (int j = 1; j < 8; ++j)
            isb = _mm512_add_epi32(isb, _mm512_mullo_epi32(_mm512_load_si512(cb[j] + 16 * m), sc[j]));
          float* am = acc + (t0 + m) * 16;
          _mm512_storeu_ps(am, PK<K>::finish45(hd, isb, a0 + static_cast<size_t>(m) * stride, _mm512_loadu_ps(am)));
        }
      }
    }
    for (int64_t t = 0; t < nt; ++t) std::memcpy(y + t * ldy + g * kPackRows, acc + t * 16, 64);
  }
}

}  // namespace

bool amx_packed_run(GgmlType type, AmxPackedRun* run) {
  switch (type) {
    case GgmlType::Q4_K: *run = amx_run<KT::Q4>; return true;
    case GgmlType::Q5_K: *run = amx_run<KT::Q5>; return true;
    default: return false;
  }
}

}  // namespace kimi::kern

#else

namespace kimi::kern {
bool amx_packed_run(GgmlType, AmxPackedRun*) { return false; }
}  // namespace kimi::kern

#endif
