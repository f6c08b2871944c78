// Row-interleaved ("x16") copies of K-quant weights, made once at load time for the SIMD kernels.
// The GGUF file is not changed: the CPU backend packs each 2-D Q4_K / Q5_K / Q6_K weight it is
// given (Backend::prepare_weight) into anonymous memory and hands the kernels both views; the
// mmap'd original stays mapped (Precision::F32, the ISA levels without packed kernels and the
// rows % 16 tail read it) but is not read on the hot path any more, so its page-cache pages are
// clean and reclaimable.
//
// Layout: rows in groups of 16 (group g = rows 16g .. 16g+15; rows beyond the last full group are
// not packed). A group is nb = cols/256 packed super-blocks, one after another, then (Q6_K) the
// nb x 16 f16 block scales; group_bytes is a multiple of 64. In a packed super-block every 64-byte
// vector holds 4 bytes of each of the 16 rows (lane i = row i), so one vpdpbusd with a broadcast
// activation dword does 4 multiply-adds for 16 rows and the results land one row per lane: no
// horizontal sums, the block scales of 16 rows are one vector.
//   Q4_K (2304 bytes = 16 x 144):  d[16] f16 | dmin[16] f16 | 3 x 64: dword k of each row's 12
//     scale bytes (lane i) | qs: 32 vectors, vector 8c+s = qs[32c + 4s .. 4s+3] of each row
//     (low nibbles: elements 64c + 4s.., high nibbles: 64c + 32 + 4s..).
//   Q5_K (2816 = 16 x 176): as Q4_K, with 8 qh vectors (vector s = qh[4s .. 4s+3] of each row)
//     between the scales and qs.
//   Q6_K (3328 per block + 32 bytes of d at the group's end = 16 x 210): 8 x 32 scale bytes
//     (pair p: row i's sc[2p], sc[2p+1] at bytes 2i, 2i+1) | ql: 32 vectors, vector 8(2h+k)+s =
//     ql[64h + 32k + 4s ..] | qh: 16 vectors, vector 8h+s = qh[32h + 4s ..].
// Every value is the original bits moved: the packed kernels compute what the reference does.
//
// BF16 weights on CPUs with AVX-512 BF16 but without usable AMX tiles get the "bf16 x16" order (groups of
// 16 rows, the last one zero-padded: every row goes through the packed kernel; cols % 32 == 0): a group is cols / 2 vectors of 64 bytes, vector p
// holding columns 2p and 2p + 1 of each of the 16 rows (lane i = row i's bf16 pair), so one vdpbf16ps with
// a token's column pair broadcast does 2 multiply-adds for 16 rows, each row summing in its own lane from
// the first pair to the last. Every product of a packed group (one token or many, any K block) sums in that
// one order: a token's row is the same bits alone and in any batch (repack_avx512.cpp, run_packed_bf16).
//
// BF16 weights on CPUs whose AMX-BF16 tiles are usable (matmul_amx.h) get the tiles' own order instead:
// groups of kAmxPackRows = 32 rows (the last zero-padded; groups = ceil(rows / 32)), a group being
// cols / 32 column steps of 32 rows x 64 bytes (row i's bf16 columns 32s .. 32s + 31 at 64 i), i.e. the two
// 16-row A tiles of a step one after the other. The AMX kernels load their tiles straight from it and a
// weight is read front to back; reading the rows in place meant 32 streams 14 KiB apart for decode and, for
// prefill, a copy of each K block's 512-byte row pieces to a panel (~30 % of the GEMM's time).
#pragma once
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <memory>

#include "backend/cpu/matmul.h"

namespace kimi {

// (declared opaque in backend/mat_view.h)
struct PackedWeight {
  GgmlType type = GgmlType::F32;
  int64_t groups = 0;           // packed groups of 16 rows (rows 0 .. 16*groups-1); BF16 (AMX order): of 32
  int group_rows = 16;          // rows per group: 16 (x16 orders), 32 (the AMX tile order)
  int64_t cols = 0;
  int64_t rows = 0;              // W's rows (bf16 x16: the last group zero-padded past them)
  uint64_t group_bytes = 0;     // bytes per group (a multiple of 64)
  uint8_t* data = nullptr;      // kPackedAlign aligned (alloc_packed), groups * group_bytes
  const uint8_t* src = nullptr; // the view's data it was made from: a view whose data moved since
                                // (a slice, a rank's narrowed rows) does not use it
  PackedWeight() = default;
  PackedWeight(const PackedWeight&) = delete;
  PackedWeight& operator=(const PackedWeight&) = delete;
  ~PackedWeight();
  const uint8_t* group(int64_t g) const { return data + static_cast<uint64_t>(g) * group_bytes; }
  // The end of the groups a product of rows [.., r1) runs packed: the groups wholly below r1, and the
  // zero-padded last group when r1 is W's last row (its kernel writes only the rows < rows).
  int64_t groups_below(int64_t r1) const {
    if (r1 >= rows && groups * group_rows > rows) return groups;
    return std::min<int64_t>(groups, r1 / group_rows);
  }
};

}  // namespace kimi

namespace kimi::kern {

constexpr int kPackRows = 16;
// Packed copies are allocated 2 MiB aligned (and advised as transparent huge pages: env KIMI_THP=0 does not).
constexpr size_t kPackedAlign = size_t{1} << 21;
uint8_t* alloc_packed(uint64_t bytes);

// Bytes of one packed super-block / of one group of 16 rows with `cols` columns; 0 for a type
// without a packed layout.
int packed_block_bytes(GgmlType t);
uint64_t packed_group_bytes(GgmlType t, int64_t cols);

// Pack group g of W (rows 16g .. 16g+15, all present) into out (packed_group_bytes bytes).
void pack_group(const MatView& W, int64_t g, uint8_t* out);
// Group g of a BF16 W in the AMX tile order (rows 32g .. 32g + 31; rows past W.rows zero): cols * 64 bytes.
constexpr int kAmxPackRows = 32;
void pack_group_bf16_amx(const MatView& W, int64_t g, uint8_t* out);

// Group g of a BF16 W in the bf16 x16 order (rows 16g .. 16g + 15; rows past W.rows zero): cols * 32 bytes.
void pack_group_bf16_x16(const MatView& W, int64_t g, uint8_t* out);

// Whether the running ISA level has packed kernels for type t.
bool packed_kernel_available(GgmlType t);

// The packed copy of W; nullptr when the running ISA has no packed kernel for W's type, W has
// fewer than 16 rows (K-quants), or env KIMI_REPACK=0. BF16 (cols % 32 == 0): the AMX tile order where
// amx_bf16_usable(), else the bf16 x16 order where the running level has its kernel (AVX-512 BF16) and W
// has 1 row or more (the last group zero-padded, so that a row's value does not depend on how many rows
// W has: a rank's slice of a tensor split gives one process's bits). Groups are packed in parallel on `pool` (if given).
std::unique_ptr<PackedWeight> pack_weight(const MatView& W, ThreadPool* pool = nullptr);

}  // namespace kimi::kern
