// The driver of the MXFP4 / Q8_0 lane path with register broadcasts (matmul_mx_lanes.h): per pass of up to
// kMxTokChunk tokens their activation tiles once, then items of kMxItemRows rows over the pool; an item
// decodes its rows into records and runs them over every token of the pass, K chunk by K chunk.
#include "backend/cpu/matmul_mx_lanes.h"

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <vector>

#include "backend/cpu/dispatch.h"
#include "backend/cpu/matmul_amx.h"
#include "util/per_thread.h"

namespace kimi::kern {

namespace {
std::atomic<bool>& enabled_flag() {
  static std::atomic<bool> on{[] {
    const char* e = std::getenv("KIMI_MX_LANES");
    return !(e && e[0] == '0');
  }()};
  return on;
}

uint8_t* aligned64(uint8_t* p) { return p + (64 - reinterpret_cast<uintptr_t>(p) % 64) % 64; }
}  // namespace

void set_mx_lanes(bool on) { enabled_flag().store(on); }
bool mx_lanes_enabled() { return enabled_flag().load(std::memory_order_relaxed); }

bool mx_lanes_takes(const MatView& W, int64_t n, Precision prec) {
  return (W.type == GgmlType::MXFP4 || W.type == GgmlType::Q8_0) && prec == Precision::Fast && n >= kMxLanesMinTokens && W.rows > 0 &&
         W.cols % 32 == 0 && mx_lanes_enabled() && family_isa(KernelFamily::Matmul) == Isa::Avx512 &&
         !amx_int8_usable();
}

int64_t matmul_mx_lanes(const MatView& W, const float* x, int64_t n, float* y, ThreadPool* pool, int64_t r0,
                        int64_t r1) {
  if (r0 >= r1 || n <= 0) return r1;
  const int nth = pool ? pool->size() : 1;
  const bool q8 = W.type == GgmlType::Q8_0;
  const int64_t nb = W.cols / 32;
  const size_t tile_stride = static_cast<size_t>(nb) * kMxTileBlk;
  const int64_t pass = std::min(n, kMxTokChunk), pass_v = (pass + 15) / 16;
  const size_t rec_bytes = (mx_lanes_item_scratch(W.cols) + 63) / 64 * 64;
  // the calling thread's scratch (grows once; the pool's workers use their own record panel of it)
  auto& t_tiles = per_thread<std::vector<uint8_t>, struct MxLanesTiles>();
  auto& t_rec = per_thread<std::vector<uint8_t>, struct MxLanesRec>();
  if (t_tiles.size() < tile_stride * static_cast<size_t>(pass_v) + 64)
    t_tiles.resize(tile_stride * static_cast<size_t>(pass_v) + 64);
  if (t_rec.size() < rec_bytes * static_cast<size_t>(nth) + 64) t_rec.resize(rec_bytes * static_cast<size_t>(nth) + 64);
  uint8_t* tiles = aligned64(t_tiles.data());
  uint8_t* recs = aligned64(t_rec.data());
  auto each = [&](int64_t count, auto&& fn) {
    if (pool && nth > 1 && count > 1) pool->parallel_for(count, fn);
    else for (int64_t i = 0; i < count; ++i) fn(i, 0);
  };
  const int64_t n_items = (r1 - r0 + kMxItemRows - 1) / kMxItemRows;
  for (int64_t t0 = 0; t0 < n; t0 += pass) {
    const int64_t nt = std::min(pass, n - t0), ntv = (nt + 15) / 16;
    each(ntv, [&](int64_t v, int) {
      mx_lanes_tiles(x + t0 * W.cols, nt, W.cols, v, q8 ? 1.0f : 0.5f, tiles + static_cast<size_t>(v) * tile_stride);
    });
    each(n_items, [&](int64_t it, int th) {
      const int64_t row = r0 + kMxItemRows * it;
      const int nr = static_cast<int>(std::min<int64_t>(kMxItemRows, r1 - row));
      mx_lanes_item(q8, W.data + static_cast<uint64_t>(row) * W.row_bytes, W.row_bytes, nr, W.cols, tiles, tile_stride, nt,
                    y + t0 * W.rows + row, W.rows, recs + rec_bytes * static_cast<size_t>(std::min(th, nth - 1)));
    });
  }
  return r1;
}

}  // namespace kimi::kern
