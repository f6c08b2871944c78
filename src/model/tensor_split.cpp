// TensorSplit (layers.h): row-split matmuls with an all-gather, and the routed experts' partial
// sums added in rank order.
#include "model/layers.h"

namespace kimi {

void TensorSplit::matmul(Backend& be, const MatView& W, const float* x, int64_t n, float* y, int root) {
  int64_t lo = 0, hi = 0;
  range(W.rows, size, rank, lo, hi);
  MatView mine = W;
  mine.data += static_cast<uint64_t>(lo) * W.row_bytes;
  mine.rows = hi - lo;
  // one token: the gathered slices are the output row in order (gathered in place)
  const bool direct = n == 1 && (root < 0 || rank == root);
  float* part = direct ? y + lo : local.data();
  if (mine.rows > 0) be.matmul(mine, x, n, part);
  for (int r = 0; r < size; ++r) {
    int64_t a = 0, b = 0;
    range(W.rows, size, r, a, b);
    bytes[static_cast<size_t>(r)] = static_cast<uint64_t>(n * (b - a)) * 4;
  }
  float* dst = direct ? y : gathered.data();
  if (root < 0)
    c->all_gather(part, dst, bytes.data());
  else
    c->gather(part, dst, bytes.data(), root);
  if (direct || (root >= 0 && rank != root)) return;
  // [rank][token][its rows] -> [token][all rows]
  const float* src = gathered.data();
  for (int r = 0; r < size; ++r) {
    int64_t a = 0, b = 0;
    range(W.rows, size, r, a, b);
    for (int64_t t = 0; t < n && b > a; ++t)
      be.copy(y + t * W.rows + a, src + t * (b - a), static_cast<uint64_t>(b - a) * 4);
    src += n * (b - a);
  }
}

void TensorSplit::sum_partials(Backend& be, float* acc, int64_t count) {
  for (int r = 0; r < size; ++r) bytes[static_cast<size_t>(r)] = static_cast<uint64_t>(count) * 4;
  float* all = gathered.data();
  c->all_gather(acc, all, bytes.data());
  be.copy(acc, all, static_cast<uint64_t>(count) * 4);
  for (int r = 1; r < size; ++r) be.add(acc, all + r * count, count);
}

}  // namespace kimi
