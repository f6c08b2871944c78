// Packing of K-quant weights into the x16 row-interleaved layout (repack.h): portable byte moves.
#include "backend/cpu/repack.h"

#include <cstdlib>
#include <cstring>
#include <new>
#include <sys/mman.h>

#include "backend/cpu/dispatch.h"
#include "backend/cpu/matmul_amx.h"
#include "tensor/quants.h"
#include "util/error.h"

namespace kimi {

PackedWeight::~PackedWeight() {
  if (data) ::operator delete(data, std::align_val_t(kern::kPackedAlign));
}

}  // namespace kimi

namespace kimi::kern {

namespace {

constexpr int kQ6Main = 3328;  // Q6_K packed block without its 16 f16 d (kept at the group's end)

// 4 bytes of row i's block at src_off -> lane i of the 64-byte vector at dst
inline void lane4(uint8_t* dst, int i, const uint8_t* blk, int src_off) { std::memcpy(dst + 4 * i, blk + src_off, 4); }

}  // namespace

uint8_t* alloc_packed(uint64_t bytes) {
  auto* p = static_cast<uint8_t*>(::operator new(bytes, std::align_val_t(kPackedAlign)));
#ifdef MADV_HUGEPAGE
  // transparent huge pages where the system allows them on request (the Debian default): fewer TLB misses
  // for kernels that stream a copy front to back (measured, small preset decode: BF16 tile-order copies
  // +0.5-7.6 %, the K-quant copies no change)
  static const bool thp = !(std::getenv("KIMI_THP") && std::getenv("KIMI_THP")[0] == '0');
  if (thp) (void)::madvise(p, bytes, MADV_HUGEPAGE);
#endif
  return p;
}

int packed_block_bytes(GgmlType t) {
  switch (t) {
    case GgmlType::Q4_K: return 2304;
    case GgmlType::Q5_K: return 2816;
    case GgmlType::Q6_K: return kQ6Main;
    default: return 0;
  }
}

uint64_t packed_group_bytes(GgmlType t, int64_t cols) {
  const int bb = packed_block_bytes(t);
  if (bb == 0 || cols <= 0 || cols % QK_K != 0) return 0;
  const uint64_t nb = static_cast<uint64_t>(cols / QK_K);
  uint64_t b = nb * static_cast<uint64_t>(bb);
  if (t == GgmlType::Q6_K) b += nb * 32;  // the blocks' d, 16 f16 per block
  return (b + 63) / 64 * 64;
}

void pack_group(const MatView& W, int64_t g, uint8_t* out) {
  const int64_t nb = W.cols / QK_K;
  const int bb = packed_block_bytes(W.type);
  const uint8_t* rows[kPackRows];
  for (int i = 0; i < kPackRows; ++i) rows[i] = W.data + static_cast<uint64_t>(g * kPackRows + i) * W.row_bytes;
  std::memset(out, 0, packed_group_bytes(W.type, W.cols));
  for (int64_t b = 0; b < nb; ++b) {
    uint8_t* o = out + b * bb;
    for (int i = 0; i < kPackRows; ++i) {
      if (W.type == GgmlType::Q4_K || W.type == GgmlType::Q5_K) {
        const bool q5 = W.type == GgmlType::Q5_K;
        const uint8_t* blk = rows[i] + b * (q5 ? 176 : 144);
        std::memcpy(o + 2 * i, blk, 2);           // d
        std::memcpy(o + 32 + 2 * i, blk + 2, 2);  // dmin
        for (int k = 0; k < 3; ++k) lane4(o + 64 + 64 * k, i, blk, 4 + 4 * k);
        int qs_at = 256, qs_src = 16;
        if (q5) {
          for (int s = 0; s < 8; ++s) lane4(o + 256 + 64 * s, i, blk, 16 + 4 * s);
          qs_at = 768, qs_src = 48;
        }
        for (int c = 0; c < 4; ++c)
          for (int s = 0; s < 8; ++s) lane4(o + qs_at + 64 * (8 * c + s), i, blk, qs_src + 32 * c + 4 * s);
      } else {  // Q6_K: ql[128] qh[64] sc[16] d
        const uint8_t* blk = rows[i] + b * 210;
        for (int p = 0; p < 8; ++p) std::memcpy(o + 32 * p + 2 * i, blk + 192 + 2 * p, 2);
        for (int h = 0; h < 2; ++h)
          for (int k = 0; k < 2; ++k)
            for (int s = 0; s < 8; ++s) lane4(o + 256 + 64 * (8 * (2 * h + k) + s), i, blk, 64 * h + 32 * k + 4 * s);
        for (int h = 0; h < 2; ++h)
          for (int s = 0; s < 8; ++s) lane4(o + 256 + 2048 + 64 * (8 * h + s), i, blk, 128 + 32 * h + 4 * s);
        std::memcpy(out + nb * kQ6Main + b * 32 + 2 * i, blk + 208, 2);
      }
    }
  }
}

bool pick_packed_kernel(GgmlType type, PackedKernel* k) {
  *k = PackedKernel{};
  if (family_isa(KernelFamily::Matmul) == Isa::Avx512) return avx512_packed_kernel(type, k);
  return false;
}

bool packed_kernel_available(GgmlType t) {
  PackedKernel k;
  return pick_packed_kernel(t, &k);
}

void pack_group_bf16_amx(const MatView& W, int64_t g, uint8_t* out) {
  const int64_t ks = W.cols / 32;
  for (int i = 0; i < kAmxPackRows; ++i) {
    const int64_t row = g * kAmxPackRows + i;
    const uint8_t* src = W.data + static_cast<uint64_t>(row) * W.row_bytes;
    for (int64_t s = 0; s < ks; ++s) {
      uint8_t* dst = out + static_cast<uint64_t>(s) * (kAmxPackRows * 64) + static_cast<uint64_t>(i) * 64;
      if (row < W.rows) std::memcpy(dst, src + s * 64, 64);
      else std::memset(dst, 0, 64);
    }
  }
}

void pack_group_bf16_x16(const MatView& W, int64_t g, uint8_t* out) {
  const int64_t np = W.cols / 2;
  for (int i = 0; i < kPackRows; ++i) {
    if (g * kPackRows + i >= W.rows) {  // the last group's padding
      for (int64_t p = 0; p < np; ++p) std::memset(out + static_cast<uint64_t>(p) * 64 + 4 * i, 0, 4);
      continue;
    }
    const uint8_t* src = W.data + static_cast<uint64_t>(g * kPackRows + i) * W.row_bytes;
    for (int64_t p = 0; p < np; ++p) std::memcpy(out + static_cast<uint64_t>(p) * 64 + 4 * i, src + 4 * p, 4);
  }
}

namespace {
// A copy of W of `groups` groups of gb bytes, group g filled by fill(W, g, its bytes), in parallel on pool.
std::unique_ptr<PackedWeight> make_packed(const MatView& W, int64_t groups, uint64_t gb,
                                          void (*fill)(const MatView&, int64_t, uint8_t*), ThreadPool* pool) {
  auto P = std::make_unique<PackedWeight>();
  P->type = W.type;
  P->src = W.data;
  P->groups = groups;
  P->cols = W.cols;
  P->rows = W.rows;
  P->group_bytes = gb;
  P->data = alloc_packed(gb * static_cast<uint64_t>(groups));
  auto one = [&](int64_t g, int) { fill(W, g, P->data + static_cast<uint64_t>(g) * gb); };
  if (pool && pool->size() > 1)
    pool->parallel_for(groups, one);
  else
    for (int64_t g = 0; g < groups; ++g) one(g, 0);
  return P;
}
}  // namespace

std::unique_ptr<PackedWeight> pack_weight(const MatView& W, ThreadPool* pool) {
  const char* env = std::getenv("KIMI_REPACK");
  if (env && env[0] == '0') return nullptr;
  if (W.data != nullptr && W.type == GgmlType::BF16) {  // the AMX tile order
    if (W.cols % 32 != 0 || W.rows < 1 || W.row_bytes != static_cast<size_t>(W.cols) * 2) return nullptr;
    if (amx_bf16_usable()) {
      auto P = make_packed(W, (W.rows + kAmxPackRows - 1) / kAmxPackRows,
                           static_cast<uint64_t>(W.cols) * 2 * kAmxPackRows, pack_group_bf16_amx, pool);
      P->group_rows = kAmxPackRows;
      return P;
    }
    if (!packed_kernel_available(W.type)) return nullptr;
    return make_packed(W, (W.rows + kPackRows - 1) / kPackRows, static_cast<uint64_t>(W.cols) * 2 * kPackRows,
                       pack_group_bf16_x16, pool);
  }
  if (W.data == nullptr || W.rows < kPackRows || !packed_kernel_available(W.type)) return nullptr;
  const uint64_t gb = packed_group_bytes(W.type, W.cols);
  if (gb == 0 || W.row_bytes != row_bytes(W.type, static_cast<uint64_t>(W.cols))) return nullptr;
  return make_packed(W, W.rows / kPackRows, gb, pack_group, pool);
}

}  // namespace kimi::kern
