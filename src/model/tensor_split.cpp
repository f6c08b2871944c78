// TensorSplit (layers.h): one exchange of several parts, packed into one message per peer, and
// the LM head's row split.
#include <cstring>

#include "model/layers.h"
#include "util/error.h"

namespace kimi {

int64_t TensorSplit::Exchange::floats(const Part& p, int r) const {
  if (p.counts) return p.counts[r];
  int64_t lo = 0, hi = 0;
  t_.units(p.total / p.unit, r, lo, hi);
  return p.n * (hi - lo) * p.unit;
}

float* TensorSplit::Exchange::cols(float* full, int64_t n, int64_t total, int64_t unit) {
  check(n_ < 4, "tensor split: more than 4 parts in one exchange");
  Part& p = parts_[n_++];
  p = {full, n, total, unit, nullptr};
  float* at = t_.local.data() + used_;
  used_ += floats(p, t_.rank);
  check(used_ <= static_cast<int64_t>(t_.local.size()), "tensor split: exchange of {} floats exceeds the {} reserved",
        used_, t_.local.size());
  return at;
}

float* TensorSplit::Exchange::block(float* dest, const int64_t* counts) {
  check(n_ < 4, "tensor split: more than 4 parts in one exchange");
  Part& p = parts_[n_++];
  p = {dest, 0, 0, 1, counts};
  float* at = t_.local.data() + used_;
  used_ += counts[t_.rank];
  check(used_ <= static_cast<int64_t>(t_.local.size()), "tensor split: exchange of {} floats exceeds the {} reserved",
        used_, t_.local.size());
  return at;
}

void TensorSplit::Exchange::run(int root) {
  int64_t all = 0;
  for (int r = 0; r < t_.size; ++r) {
    int64_t f = 0;
    for (int i = 0; i < n_; ++i) f += floats(parts_[i], r);
    t_.bytes[static_cast<size_t>(r)] = static_cast<uint64_t>(f) * 4;
    all += f;
  }
  check(all <= static_cast<int64_t>(t_.gathered.size()), "tensor split: exchange of {} floats exceeds the {} reserved",
        all, t_.gathered.size());
  if (root < 0)
    t_.c->all_gather(t_.local.data(), t_.gathered.data(), t_.bytes.data());
  else
    t_.c->gather(t_.local.data(), t_.gathered.data(), t_.bytes.data(), root);
  if (root >= 0 && t_.rank != root) return;
  // unpack: rank by rank, part by part (pure copies: the values are the senders' bits)
  const float* src = t_.gathered.data();
  int64_t block_at[4] = {0, 0, 0, 0};
  for (int r = 0; r < t_.size; ++r)
    for (int i = 0; i < n_; ++i) {
      const Part& p = parts_[i];
      const int64_t f = floats(p, r);
      if (p.counts) {
        std::memcpy(p.dest + block_at[i], src, static_cast<size_t>(f) * 4);
        block_at[i] += f;
      } else if (f > 0) {
        int64_t lo = 0, hi = 0;
        t_.units(p.total / p.unit, r, lo, hi);
        const int64_t w = (hi - lo) * p.unit;
        for (int64_t t = 0; t < p.n; ++t)
          std::memcpy(p.dest + t * p.total + lo * p.unit, src + t * w, static_cast<size_t>(w) * 4);
      }
      src += f;
    }
}

void lm_head_tp(TensorSplit& tp, Backend& be, const MatView& W, int64_t V, const float* x, int64_t n, float* logits) {
  TensorSplit::Exchange ex(tp);
  float* mine = ex.cols(logits, n, V, 1);
  if (W.rows > 0) be.matmul(W, x, n, mine);
  ex.run(0);
}

}  // namespace kimi
