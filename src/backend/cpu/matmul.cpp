// matmul driver: validation, kernel choice by ISA, activation preparation (once per call) and the
// split of rows x token tiles over the thread pool.
#include "backend/cpu/matmul.h"

#include <algorithm>
#include <array>
#include <cstdlib>
#include <cstring>
#include <vector>
#if defined(__x86_64__) && defined(__linux__)
#include <sys/syscall.h>
#include <unistd.h>
#endif

#include "backend/cpu/dispatch.h"
#include "backend/cpu/matmul_amx.h"
#include "backend/cpu/matmul_mx_lanes.h"
#include "backend/cpu/repack.h"
#include "backend/cpu/vec.h"
#include "tensor/quants.h"
#include "util/error.h"
#include "util/per_thread.h"

namespace kimi::kern {

namespace {

bool matmul_type_supported(GgmlType t) {
  switch (t) {
    case GgmlType::F32: case GgmlType::F16: case GgmlType::BF16: case GgmlType::Q8_0: case GgmlType::Q4_0:
    case GgmlType::Q5_0: case GgmlType::Q5_1: case GgmlType::MXFP4: case GgmlType::Q4_K: case GgmlType::Q5_K:
    case GgmlType::Q6_K: case GgmlType::Q2_K: case GgmlType::Q3_K: case GgmlType::IQ4_XS: case GgmlType::IQ2_XS:
      return true;
    default:
      return false;
  }
}

void validate(const MatView& W, const float* x, int64_t n_tokens, const float* y) {
  check(matmul_type_supported(W.type), "matmul: weight type {} is not supported (F32, F16, BF16, Q8_0, Q4_0, "
        "Q5_0, Q5_1, MXFP4, Q4_K, Q5_K, Q6_K, Q2_K, Q3_K, IQ4_XS, IQ2_XS are)", type_name(W.type));
  check(W.rows >= 0 && W.cols > 0, "matmul: bad {} weight shape rows={} cols={}", type_name(W.type), W.rows, W.cols);
  const auto& tr = traits(W.type);
  check(W.cols % tr.block == 0, "matmul: {} weight has {} columns, not a multiple of the block size {}",
        tr.name, W.cols, tr.block);
  const uint64_t rb = row_bytes(W.type, static_cast<uint64_t>(W.cols));
  check(W.row_bytes == rb, "matmul: {} weight with {} columns needs row_bytes {}, got {}", tr.name, W.cols, rb,
        W.row_bytes);
  check(n_tokens >= 0, "matmul: negative n_tokens {}", n_tokens);
  if (W.rows > 0 && n_tokens > 0)
    check(W.data != nullptr && x != nullptr && y != nullptr, "matmul: null weight/input/output pointer");
}


// Thread-local scratch that only grows (no allocation once warmed up); slot 1: the packed kernels'
// activations (a packed matmul with rows outside its groups prepares both kinds).
uint8_t* act_scratch(size_t bytes, int slot = 0) {
  auto& buf = per_thread<std::array<std::vector<uint8_t>, 2>, struct ActScratch>();
  auto& b = buf[slot & 1];
  if (b.size() < bytes) b.resize(bytes + 64);
  return b.data();
}

struct Prepared {
  const uint8_t* act;
  size_t stride;
};

// (pad_rows: rows of room after the last token's, for kernels that read whole groups of rows)
template <class K>
Prepared prepare(const K& k, const float* x, int64_t n_tokens, int64_t cols, ThreadPool* pool, int slot = 0,
                 int64_t pad_rows = 0) {
  if (!k.act_bytes) return {reinterpret_cast<const uint8_t*>(x), static_cast<size_t>(cols) * sizeof(float)};
  const size_t stride = (k.act_bytes(cols) + 63) / 64 * 64;
  uint8_t* buf = act_scratch(stride * static_cast<size_t>(n_tokens + pad_rows), slot);
  if (pad_rows > 0) std::memset(buf + stride * static_cast<size_t>(n_tokens), 0, stride * static_cast<size_t>(pad_rows));
  if (pool && pool->size() > 1 && n_tokens >= 8) {
    pool->parallel_for(n_tokens, [&](int64_t t, int) { k.prep(x + t * cols, cols, buf + t * stride); });
  } else {
    for (int64_t t = 0; t < n_tokens; ++t) k.prep(x + t * cols, cols, buf + t * stride);
  }
  return {buf, stride};
}

// W's packed copy when the running level has a kernel for it (and the precision allows it). A
// view made from the packed one by moving data (a 3-D slice, a rank's narrowed rows) reads the
// original; one with fewer rows from the same start uses the groups inside them.
// A type whose one-token product reads the original (PackedKernel::gemv false: Q6_K) reads the
// original for fewer than kBatchInvariantTokens tokens too, so that a token's row of such a batch is
// the same bits as the token alone (speculative verification relies on it, docs/speculative.md "Exact"):
// the packed and the plain kernels sum the blocks in different orders.
bool packed_usable(const MatView& W, int64_t n_tokens, Precision prec, PackedKernel* pk) {
  if (W.packed == nullptr || prec != Precision::Fast) return false;
  const PackedWeight& P = *W.packed;
  if (P.src != W.data || P.type != W.type || P.cols != W.cols || P.group_rows != kPackRows) return false;
  return pick_packed_kernel(W.type, pk) && (pk->gemv || n_tokens >= kBatchInvariantTokens);
}

// Rows [r0, r1) of W for n tokens: the packed groups inside the range through the packed kernel
// (threaded on pool when given), the rows outside them through the plain kernel on this thread.
void matmul_packed(const MatView& W, const PackedKernel& pk, const float* x, int64_t n, float* y, ThreadPool* pool,
                   int64_t r0, int64_t r1) {
  const PackedWeight& P = *W.packed;
  const int64_t g0 = std::min(P.groups, (r0 + kPackRows - 1) / kPackRows);
  const int64_t g1 = std::max(g0, P.groups_below(r1));
  const int64_t p0 = g0 * kPackRows, p1 = std::min(r1, g1 * kPackRows);  // packed rows [p0, p1)
  if (r0 < p0 || p1 < r1 || g0 == g1) {
    const MatKernel k = pick_matmul_kernel(W.type, Precision::Fast);
    const Prepared a = prepare(k, x, n, W.cols, nullptr);
    if (g0 == g1) return k.run(W, a.act, a.stride, n, r0, r1, y, W.rows);
    if (r0 < p0) k.run(W, a.act, a.stride, n, r0, p0, y, W.rows);
    if (p1 < r1) k.run(W, a.act, a.stride, n, p1, r1, y, W.rows);
  }
  // AMX tiles for 16+ tokens (Q4_K / Q5_K, matmul_amx.h; the same results): they read 16 activation rows
  // at a time, so the buffer gets 15 rows of room
  AmxPackedRun amx_run = nullptr;
  const bool amx = n >= 16 && amx_int8_usable() && amx_packed_run(W.type, &amx_run);
  const Prepared a = prepare(pk, x, n, W.cols, pool, 1, amx ? 15 : 0);
  const auto run = amx ? amx_run : pk.run;
  const int nth = pool ? pool->size() : 1;
  const int64_t ng = g1 - g0;
  const bool serial = nth <= 1 || static_cast<double>(ng) * kPackRows * static_cast<double>(W.cols) * n < 65536.0;
  if (n == 1) {  // GEMV: contiguous chunks of groups, about 8 per thread
    if (serial) return pk.run(P, a.act, a.stride, 1, g0, g1, y, W.rows);
    const int64_t gc = std::max<int64_t>(1, (ng + nth * 8 - 1) / (nth * 8));
    pool->parallel_for((ng + gc - 1) / gc, [&](int64_t i, int) {
      const int64_t ga = g0 + i * gc;
      pk.run(P, a.act, a.stride, 1, ga, std::min(g1, ga + gc), y, W.rows);
    });
    return;
  }
  // GEMM: token tiles (a multiple of 8 tokens, <= ~512 KiB of activations; AMX: 128) x chunks of 3 groups
  int64_t tok_tile = amx ? 128 : std::clamp<int64_t>((512 << 10) / static_cast<int64_t>(a.stride), 8, 64) / 8 * 8;
  // BF16 (one pass over all columns per register tile, activations read as 4-byte broadcasts): 96 tokens,
  // a multiple of its 6-token tile, so a weight panel is streamed once per 96 tokens
  if (W.type == GgmlType::BF16 && !amx) tok_tile = 96;
  tok_tile = std::min(tok_tile, n);
  const int64_t n_tt = (n + tok_tile - 1) / tok_tile;
  // (BF16: 8 groups, two of its 4-group register panels)
  const int64_t gc = serial ? ng : W.type == GgmlType::BF16 ? 8 : 3, n_gc = (ng + gc - 1) / gc;
  auto item = [&](int64_t it, int) {
    const int64_t tt = it / n_gc, gi = it % n_gc;
    const int64_t t0 = tt * tok_tile, nt = std::min(tok_tile, n - t0);
    const int64_t ga = g0 + gi * gc;
    run(P, a.act + static_cast<size_t>(t0) * a.stride, a.stride, nt, ga, std::min(g1, ga + gc), y + t0 * W.rows,
        W.rows);
  };
  if (serial) {
    for (int64_t it = 0; it < n_gc * n_tt; ++it) item(it, 0);
  } else {
    pool->parallel_for(n_gc * n_tt, item);
  }
}

}  // namespace

namespace {
// fn(i, thread) for every i < count: on the pool when one with several threads is given, else here
template <class F>
void each_item(ThreadPool* pool, int64_t count, F&& fn) {
  if (pool && pool->size() > 1) pool->parallel_for(count, fn);
  else for (int64_t i = 0; i < count; ++i) fn(i, 0);
}

// AMX-TILE present, KIMI_AMX not 0 and the tile state granted (checked once; the OS request is made on the
// first call).
bool amx_granted() {
#if defined(__x86_64__) && defined(__linux__)
  static const bool granted = [] {
    const CpuFeatures& c = cpu_features();
    const char* e = std::getenv("KIMI_AMX");
    if (!c.amx_tile || !(c.amx_bf16 || c.amx_int8) || (e && e[0] == '0')) return false;
    // Linux (5.16+) hands out the 8 KiB tile data state only on request (ARCH_REQ_XCOMP_PERM = 0x1023,
    // XFEATURE_XTILEDATA = 18); without the grant the first tile instruction would kill the process.
    return syscall(SYS_arch_prctl, 0x1023, 18) == 0;
  }();
  return granted && family_isa(KernelFamily::Matmul) == Isa::Avx512;
#else
  return false;
#endif
}
}  // namespace

bool amx_bf16_usable() { return amx_granted() && cpu_features().amx_bf16; }
bool amx_int8_usable() { return amx_granted() && cpu_features().amx_int8; }

bool amx_bf16_takes(const MatView& W, int64_t n) {
  return W.type == GgmlType::BF16 && W.cols % 32 == 0 && W.rows > 0 && n > 0 && amx_bf16_usable();
}

// This thread's AMX buffers (grow once; the pool's workers only read / use their own panel): the
// activations of nb token blocks in the tiles' pair order, and one 64-byte aligned weight panel (32 rows x
// cols bf16) per pool thread.
struct AmxScratch {
  uint32_t* bt;
  uint8_t* panels;
  size_t panel;  // bytes per panel
  uint8_t* panel_of(int th, int nth) const { return panels + panel * static_cast<size_t>(std::min(th, nth - 1)); }
};
AmxScratch amx_scratch(int64_t cols, int64_t nb, int nth) {
  auto& t_bt = per_thread<std::vector<uint32_t>, struct AmxBt>();
  auto& t_panels = per_thread<std::vector<uint8_t>, struct AmxPanels>();
  const size_t need = static_cast<size_t>(nb * cols * 8), panel = std::max(static_cast<size_t>(cols) * 64, kAmxBlockScratch);
  if (t_bt.size() < need) t_bt.resize(need);
  if (t_panels.size() < panel * nth + 64) t_panels.resize(panel * nth + 64);
  return {t_bt.data(), t_panels.data() + (64 - reinterpret_cast<uintptr_t>(t_panels.data()) % 64) % 64, panel};
}

// W's packed copy in the AMX tile order (repack.h) when it was made from this view's data, else nullptr
const uint8_t* amx_packed(const MatView& W) {
  const PackedWeight* P = W.packed;
  if (P == nullptr || P->type != GgmlType::BF16 || P->group_rows != kAmxPackRows || P->src != W.data ||
      P->cols != W.cols || P->groups * kAmxPackRows < W.rows)
    return nullptr;
  return P->data;
}

int64_t matmul_amx_bf16(const MatView& W, const float* x, int64_t n, float* y, ThreadPool* pool, int64_t r0,
                        int64_t r1) {
  const int64_t end = r1;
  if (!amx_bf16_takes(W, n) || r0 >= end) return r0;
  const int64_t nb = (n + 15) / 16;
  const int nth = pool ? pool->size() : 1;
  const AmxScratch sc = amx_scratch(W.cols, nb, nth);
  const uint8_t* pk = amx_packed(W);
  each_item(pool, nb, [&](int64_t b, int) { amx_bf16_prep(x, n, W.cols, b, sc.bt); });
  if (nb >= 2) {  // prefill: K-blocked items of kAmxRowBlock rows (from r0 rounded down to 32) x token groups
    const int64_t base = r0 / 32 * 32, n_rb = (end - base + kAmxRowBlock - 1) / kAmxRowBlock;
    const int64_t n_tg = (nb + kAmxTokenGroup - 1) / kAmxTokenGroup;
    each_item(pool, n_rb * n_tg, [&](int64_t it, int th) {
      const int64_t tg = it / n_rb, row = base + kAmxRowBlock * (it % n_rb);
      amx_bf16_block(W, sc.bt, n, row, std::min<int64_t>(kAmxRowBlock, end - row), tg * kAmxTokenGroup,
                     std::min(nb, tg * kAmxTokenGroup + kAmxTokenGroup), y, W.rows, sc.panel_of(th, nth), r0, end, pk);
    });
    return end;
  }
  // decode and short prompts (one token block): items of 32-row blocks (aligned to row 0, clipped to
  // [r0, end); a 16-row one where <= 16 remain)
  const int64_t blk0 = r0 / 32, n_rb = (end + 31) / 32 - blk0;
  each_item(pool, n_rb, [&](int64_t it, int th) {
    const int64_t row = 32 * (blk0 + it);
    amx_bf16_rows(W, sc.bt, n, row, W.rows - row > 16 ? 32 : 16, y, W.rows, sc.panel_of(th, nth), r0, end, pk);
  });
  return end;
}

bool amx_nib_type(GgmlType type) {
  return type == GgmlType::MXFP4 || type == GgmlType::Q4_0 || type == GgmlType::Q8_0;
}

bool amx_nib_takes(const MatView& W, int64_t n) { return amx_nib_type(W.type) && n >= 16 && W.rows > 0 && amx_int8_usable(); }

int64_t matmul_amx_nib(const MatView& W, const float* x, int64_t n, float* y, ThreadPool* pool, int64_t r0, int64_t r1) {
  if (!amx_nib_takes(W, n) || r0 >= r1) return r0;
  const int nth = pool ? pool->size() : 1;
  // the AVX-512 kernel's q8-nibble (Q8_0: q8-byte) activations, then run_lanes' tiles of them (matmul_amx.h)
  const MatKernel k = pick_matmul_kernel(W.type, Precision::Fast);
  const Prepared a = prepare(k, x, n, W.cols, pool);
  const int64_t nb = W.cols / 32, ntv = (n + 15) / 16;
  const size_t ts = static_cast<size_t>(nb) * kAmxNibTileBlock;
  constexpr int64_t kRows = 64, kVecs = 8;  // an item: 64 rows (the decoded panel) x 8 token vectors
  const size_t wbytes = static_cast<size_t>(kRows * nb * 32), panel = wbytes + static_cast<size_t>(kRows * nb * 4) + 64;
  auto& t_tiles = per_thread<std::vector<uint8_t>, struct Int8Tiles>();
  auto& t_panels = per_thread<std::vector<uint8_t>, struct Int8Panels>();
  if (t_tiles.size() < ts * ntv + 64) t_tiles.resize(ts * ntv + 64);
  if (t_panels.size() < panel * nth + 64) t_panels.resize(panel * nth + 64);
  auto align = [](uint8_t* p) { return p + (64 - reinterpret_cast<uintptr_t>(p) % 64) % 64; };
  uint8_t* tiles = align(t_tiles.data());
  uint8_t* panels = align(t_panels.data());
  each_item(pool, ntv, [&](int64_t v, int) { amx_nib_act_tiles(W.type, a.act, a.stride, n, W.cols, v, tiles + v * ts); });
  const int64_t base = r0 / 16 * 16, n_rb = (r1 - base + kRows - 1) / kRows, n_tg = (ntv + kVecs - 1) / kVecs;
  // An item decodes its rows once and runs them over its token groups: every group when there are enough
  // row items for the threads (a panel used for every token of the product), else one group each (more
  // items, each decoding the panel again). The same products either way.
  const int64_t tg_per_item = n_rb >= 2 * nth ? n_tg : 1, n_ti = (n_tg + tg_per_item - 1) / tg_per_item;
  each_item(pool, n_rb * n_ti, [&](int64_t it, int th) {
    const int64_t row = base + kRows * (it % n_rb), tg0 = (it / n_rb) * tg_per_item;
    const int nr = static_cast<int>(std::min<int64_t>(kRows, (r1 - row + 15) / 16 * 16));
    uint8_t* p = panels + panel * static_cast<size_t>(std::min(th, nth - 1));
    int8_t* w = reinterpret_cast<int8_t*>(p);
    float* dw = reinterpret_cast<float*>(p + wbytes);
    amx_nib_weights(W.type, W.data + static_cast<uint64_t>(row) * W.row_bytes, W.row_bytes,
                    std::min<int64_t>(nr, W.rows - row), nr, W.cols, w, dw);
    for (int64_t tg = tg0; tg < std::min(n_tg, tg0 + tg_per_item); ++tg)
      amx_nib_rows(w, dw, nr, nb, tiles, ts, tg * kVecs, std::min(ntv, tg * kVecs + kVecs), n, y, W.rows, row, r0, r1);
  });
  return r1;
}

bool select_kernel(const KernelRow* table, size_t n, GgmlType type, Precision prec, MatKernel* k) {
  const bool f32 = prec == Precision::F32 || type == GgmlType::F32;
  for (size_t i = 0; i < n; ++i)
    if (table[i].type == type && table[i].f32 == f32) {
      *k = table[i].k;
      return true;
    }
  *k = MatKernel{};
  return false;
}

MatKernel pick_matmul_kernel(GgmlType type, Precision prec, Isa* level) {
  MatKernel k;
  // the highest level of the chain that has a kernel for the type (dispatch.h: lower_isa)
  for (Isa isa = family_isa(KernelFamily::Matmul);; isa = lower_isa(isa)) {
    if (level_kernel(isa, type, prec, &k)) {
      if (level) *level = isa;
      return k;
    }
    if (isa == Isa::Scalar) fail("matmul: no kernel for weight type {}", type_name(type));
  }
}

bool level_kernel(Isa level, GgmlType type, Precision prec, MatKernel* k) {
  switch (level) {
    case Isa::Scalar: return scalar_kernel(type, prec, k);
    case Isa::Avx2: return avx2_kernel(type, prec, k);
    case Isa::Avx512: return avx512_kernel(type, prec, k);
    case Isa::Neon: return neon_kernel(type, prec, k);
    case Isa::NeonDot: return neon_dot_kernel(type, prec, k);
    case Isa::NeonI8mm: return neon_i8mm_kernel(type, prec, k);
  }
  return false;
}

Isa matmul_kernel_isa(GgmlType type, Precision prec) {
  Isa level = Isa::Scalar;
  pick_matmul_kernel(type, prec, &level);
  return level;
}

namespace {
thread_local float* t_lent = nullptr;  // scratch lent by matmul to this thread for one item
thread_local int64_t t_lent_n = 0;
struct LendScratch {
  float* prev;
  int64_t prev_n;
  LendScratch(float* p, int64_t n) : prev(t_lent), prev_n(t_lent_n) {
    t_lent = p;
    t_lent_n = n;
  }
  ~LendScratch() {
    t_lent = prev;
    t_lent_n = prev_n;
  }
};
}  // namespace

float* f32_scratch(int64_t n, int slot) {
  if (slot == 1 && t_lent != nullptr && n <= t_lent_n) return t_lent;
  auto& bufs = per_thread<std::array<std::vector<float>, 4>, struct F32Scratch>();
  auto& b = bufs[slot & 3];
  if (static_cast<int64_t>(b.size()) < n) b.resize(static_cast<size_t>(n) + 16);
  return b.data();
}

void matmul(const MatView& W, const float* x, int64_t n_tokens, float* y, ThreadPool& pool, Precision prec) {
  validate(W, x, n_tokens, y);
  if (W.rows == 0 || n_tokens == 0) return;
  if (PackedKernel pk; packed_usable(W, n_tokens, prec, &pk)) return matmul_packed(W, pk, x, n_tokens, y, &pool, 0, W.rows);
  if (prec == Precision::Fast && amx_bf16_takes(W, n_tokens)) {  // AMX tiles (matmul_amx.h)
    matmul_amx_bf16(W, x, n_tokens, y, &pool, 0, W.rows);
    return;
  }
  if (prec == Precision::Fast && amx_nib_takes(W, n_tokens)) {
    matmul_amx_nib(W, x, n_tokens, y, &pool, 0, W.rows);
    return;
  }
  if (mx_lanes_takes(W, n_tokens, prec)) {  // MXFP4 prefill, rows in lanes (matmul_mx_lanes.h)
    matmul_mx_lanes(W, x, n_tokens, y, &pool, 0, W.rows);
    return;
  }
  const MatKernel k = pick_matmul_kernel(W.type, prec);
  const Prepared a = prepare(k, x, n_tokens, W.cols, &pool);
  const int nth = pool.size();
  // per-thread decode scratch, owned by the calling thread (grows once; workers never allocate)
  const int64_t per = k.scratch_rows > 0 ? (k.scratch_rows * W.cols + 15) / 16 * 16 : 0;
  float* const lend = per > 0 ? f32_scratch(per * nth, 3) : nullptr;
  const double work = static_cast<double>(W.rows) * static_cast<double>(W.cols) * static_cast<double>(n_tokens);
  const bool serial = nth <= 1 || work < 65536.0;
  if (n_tokens == 1) {  // GEMV: one sequential sweep over contiguous row chunks
    if (serial) return k.run(W, a.act, a.stride, 1, 0, W.rows, y, W.rows);
    // chunks of >= 16 rows, about 8 per thread for dynamic balance on a loaded machine
    int64_t rc = (W.rows + nth * 8 - 1) / (nth * 8);
    rc = std::max<int64_t>(16, (rc + 15) / 16 * 16);
    const int64_t n_rc = (W.rows + rc - 1) / rc;
    pool.parallel_for(n_rc, [&](int64_t ri, int th) {
      LendScratch lent(lend && th < nth ? lend + th * per : nullptr, per);
      const int64_t r0 = ri * rc, r1 = std::min(W.rows, r0 + rc);
      k.run(W, a.act, a.stride, 1, r0, r1, y, W.rows);
    });
    return;
  }
  // GEMM: token tiles keep a slice of the prepared activations in L2 (<= ~512 KiB) while the
  // row chunks (a few register panels each, L1/L2 resident) stream by; both serial and threaded
  // runs use the same blocking.
  const int64_t act_row = static_cast<int64_t>(a.stride);
  int64_t tok_tile = std::clamp<int64_t>((512 << 10) / std::max<int64_t>(act_row, 1), 8, 64);
  tok_tile = std::min(tok_tile, n_tokens);
  const int64_t n_tt = (n_tokens + tok_tile - 1) / tok_tile;
  const int64_t rc = serial ? W.rows : std::min<int64_t>(W.rows, 48);
  const int64_t n_rc = (W.rows + rc - 1) / rc;
  auto item = [&](int64_t it, int th) {
    LendScratch lent(lend && th < nth ? lend + th * per : nullptr, per);
    const int64_t tt = it / n_rc, ri = it % n_rc;
    const int64_t t0 = tt * tok_tile, nt = std::min(tok_tile, n_tokens - t0);
    const int64_t r0 = ri * rc, r1 = std::min(W.rows, r0 + rc);
    k.run(W, a.act + static_cast<size_t>(t0) * a.stride, a.stride, nt, r0, r1, y + t0 * W.rows, W.rows);
  };
  if (serial) {
    for (int64_t it = 0; it < n_rc * n_tt; ++it) item(it, 0);
  } else {
    pool.parallel_for(n_rc * n_tt, item);
  }
}

void matmul_set(const MatView* const* W, float* const* y, int count, const float* x, int64_t n_tokens,
                ThreadPool& pool, Precision prec) {
  constexpr int kMaxW = 8;
  const int nth = pool.size();
  static const bool off = [] {  // KIMI_MATMUL_SET=0: one matmul per weight (for A/B measurements)
    const char* e = std::getenv("KIMI_MATMUL_SET");
    return e && e[0] == '0';
  }();
  if (n_tokens != 1 || count > kMaxW || nth <= 1 || off) {
    for (int i = 0; i < count; ++i) matmul(*W[i], x, n_tokens, y[i], pool, prec);
    return;
  }
  // per weight: its kernel (packed or plain) and its prepared activation (one per prep function)
  struct One {
    bool packed = false;
    bool amx = false;  // a BF16 weight on AMX tiles (matmul_amx.h), as matmul() runs it
    PackedKernel pk{};
    MatKernel k{};
    const uint8_t* act = nullptr;
    int64_t g1 = 0;  // packed groups [0, g1)
  } w[kMaxW];
  struct Item {
    int8_t wi;
    bool packed, amx;
    int64_t a, b;  // packed: groups [a, b); plain and amx: rows [a, b)
  };
  // the CALLER's list, grown on the first calls only (workers read it through this reference)
  std::vector<Item>& items = per_thread<std::vector<Item>, struct MatmulItems>();
  items.clear();
  using Prep = void (*)(const float*, int64_t, uint8_t*);
  Prep preps[kMaxW];
  size_t offs[kMaxW], total = 0;
  int n_preps = 0;
  int64_t per = 0;  // lent f32 scratch per thread (plain kernels that ask for it)
  auto act_for = [&](size_t (*bytes)(int64_t), Prep prep, int64_t cols) -> int {
    for (int p = 0; p < n_preps; ++p)
      if (preps[p] == prep) return p;
    preps[n_preps] = prep;
    offs[n_preps] = total;
    total += (bytes(cols) + 63) / 64 * 64;
    return n_preps++;
  };
  int prep_of[kMaxW], tail_prep[kMaxW];
  for (int i = 0; i < count; ++i) {
    validate(*W[i], x, 1, y[i]);
    check(i == 0 || W[i]->cols == W[0]->cols, "matmul_set: weight {} has {} columns, weight 0 {}", i, W[i]->cols,
          W[0]->cols);
    One& o = w[i];
    o.packed = W[i]->rows > 0 && packed_usable(*W[i], 1, prec, &o.pk);
    o.amx = !o.packed && prec == Precision::Fast && amx_bf16_takes(*W[i], 1);
    if (!o.packed) o.k = pick_matmul_kernel(W[i]->type, prec);
    const bool has_prep = o.amx ? false : o.packed ? o.pk.act_bytes != nullptr : o.k.act_bytes != nullptr;
    prep_of[i] = !has_prep ? -1 : o.packed ? act_for(o.pk.act_bytes, o.pk.prep, W[i]->cols)
                                           : act_for(o.k.act_bytes, o.k.prep, W[i]->cols);
    if (!o.packed && !o.amx && o.k.scratch_rows > 0) per = std::max<int64_t>(per, (o.k.scratch_rows * W[i]->cols + 15) / 16 * 16);
    // a packed weight's rows past its groups: the plain kernel, on its own prepared activation (shared
    // with the other weights that prepare the same way: K-quants' packed and plain preps differ, BF16's not)
    tail_prep[i] = -2;
    if (o.packed && W[i]->packed->groups_below(W[i]->rows) * kPackRows < W[i]->rows) {
      o.k = pick_matmul_kernel(W[i]->type, Precision::Fast);
      tail_prep[i] = o.k.act_bytes ? act_for(o.k.act_bytes, o.k.prep, W[i]->cols) : -1;
      if (o.k.scratch_rows > 0) per = std::max<int64_t>(per, (o.k.scratch_rows * W[i]->cols + 15) / 16 * 16);
    }
  }
  // the prepared activations, one after another in this thread's scratch (grows once)
  uint8_t* buf = act_scratch(total + 64, 0);
  for (int p = 0; p < n_preps; ++p) preps[p](x, W[0]->cols, buf + offs[p]);
  // the AMX weights' activation in the tiles' pair order (one token block; the set shares its columns)
  // and one zero-padded weight panel per pool thread for the blocks with a weight's last rows
  AmxScratch ax{};
  if (std::any_of(w, w + count, [](const One& o) { return o.amx; })) {
    ax = amx_scratch(W[0]->cols, 1, nth);
    amx_bf16_prep(x, 1, W[0]->cols, 0, ax.bt);
  }
  const uint8_t* xb = reinterpret_cast<const uint8_t*>(x);
  for (int i = 0; i < count; ++i) {
    One& o = w[i];
    o.act = prep_of[i] < 0 ? xb : buf + offs[prep_of[i]];
    const MatView& M = *W[i];
    if (M.rows == 0) continue;
    auto add = [&](bool packed, int64_t a, int64_t b, bool amx = false) {
      items.push_back(Item{static_cast<int8_t>(i), packed, amx, a, b});
    };
    if (o.amx) {
      for (int64_t r = 0; r < M.rows; r += 32) add(false, r, std::min(M.rows, r + 32), true);
    } else if (o.packed) {
      const PackedWeight& P = *M.packed;
      o.g1 = P.groups_below(M.rows);
      const int64_t gc = std::max<int64_t>(1, (o.g1 + nth * 8 - 1) / (nth * 8));
      for (int64_t g = 0; g < o.g1; g += gc) add(true, g, std::min(o.g1, g + gc));
      if (o.g1 * kPackRows < M.rows) add(false, o.g1 * kPackRows, M.rows);  // past the last packed group: o.k
    } else {
      int64_t rc = (M.rows + nth * 8 - 1) / (nth * 8);
      rc = std::max<int64_t>(16, (rc + 15) / 16 * 16);
      for (int64_t r = 0; r < M.rows; r += rc) add(false, r, std::min(M.rows, r + rc));
    }
  }
  const uint8_t* tail_act[kMaxW] = {};
  for (int i = 0; i < count; ++i)
    if (tail_prep[i] != -2) tail_act[i] = tail_prep[i] < 0 ? xb : buf + offs[tail_prep[i]];
  float* const lend = per > 0 ? f32_scratch(per * nth, 3) : nullptr;
  pool.parallel_for(static_cast<int64_t>(items.size()), [&](int64_t it, int th) {
    const Item& m = items[it];
    const One& o = w[m.wi];
    const MatView& M = *W[m.wi];
    if (m.packed) return o.pk.run(*M.packed, o.act, 0, 1, m.a, m.b, y[m.wi], M.rows);
    if (m.amx)  // a block with the last rows % 32 (<= 16 rows: one tile) is zero-padded in this thread's panel
      return amx_bf16_rows(M, ax.bt, 1, m.a, m.b - m.a > 16 ? 32 : 16, y[m.wi], M.rows, ax.panel_of(th, nth),
                           m.a, m.b, amx_packed(M));
    LendScratch lent(lend && th < nth ? lend + th * per : nullptr, per);
    o.k.run(M, o.packed ? tail_act[m.wi] : o.act, 0, 1, m.a, m.b, y[m.wi], M.rows);
  });
}

void matmul_rows(const MatView& W, const float* x, int64_t n_tokens, float* y, int64_t r0, int64_t r1,
                 Precision prec) {
  validate(W, x, n_tokens, y);
  check(r0 >= 0 && r0 <= r1 && r1 <= W.rows, "matmul_rows: row range [{}, {}) outside the {} rows", r0, r1, W.rows);
  if (r0 == r1 || n_tokens == 0) return;
  if (PackedKernel pk; packed_usable(W, n_tokens, prec, &pk)) return matmul_packed(W, pk, x, n_tokens, y, nullptr, r0, r1);
  // AMX as matmul() (matmul_amx.h: the same sums whatever the split)
  if (prec == Precision::Fast && amx_bf16_takes(W, n_tokens)) {
    matmul_amx_bf16(W, x, n_tokens, y, nullptr, r0, r1);
    return;
  }
  if (prec == Precision::Fast && amx_nib_takes(W, n_tokens)) {
    matmul_amx_nib(W, x, n_tokens, y, nullptr, r0, r1);
    return;
  }
  if (mx_lanes_takes(W, n_tokens, prec)) {
    matmul_mx_lanes(W, x, n_tokens, y, nullptr, r0, r1);
    return;
  }
  const MatKernel k = pick_matmul_kernel(W.type, prec);
  const Prepared a = prepare(k, x, n_tokens, W.cols, nullptr);
  k.run(W, a.act, a.stride, n_tokens, r0, r1, y, W.rows);
}

void dequantize(GgmlType type, const void* src, float* dst, int64_t n) {
  const auto& tr = traits(type);
  check(n >= 0 && n % tr.block == 0, "dequantize: {} elements of {} is not a multiple of the block size {}", n,
        tr.name, tr.block);
  if (type == GgmlType::BF16) return vec::bf16_to_f32_row(static_cast<const uint16_t*>(src), dst, n);
  kimi::dequantize_row(type, src, dst, n);
}

void dequantize_row(const MatView& W, int64_t r, float* out) {
  check(r >= 0 && r < W.rows, "dequantize_row: row {} outside the {} rows of a {} weight", r, W.rows,
        type_name(W.type));
  check(W.data != nullptr, "dequantize_row: null weight data");
  dequantize(W.type, W.data + static_cast<uint64_t>(r) * W.row_bytes, out, W.cols);
}

}  // namespace kimi::kern
