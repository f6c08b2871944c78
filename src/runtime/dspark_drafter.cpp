// DsparkDrafter (dspark_drafter.h): the DSpark draft behind the Drafter interface.
#include "runtime/dspark_drafter.h"

#include <algorithm>

#include "backend/cpu/cpu_backend.h"
#include "util/error.h"
#include "util/thread_pool.h"

namespace kimi {

DsparkDrafter::DsparkDrafter(std::shared_ptr<const DsparkModel> dm, const Model& target,
                             const DsparkDrafterOptions& o)
    : dm_(std::move(dm)), n_batch_(std::max(1, o.n_batch)), n_ctx_(std::max(1, o.n_ctx)) {
  check(dm_ != nullptr, "dspark drafter: no draft model");
  dm_->check_target(target.hparams());
  be_ = o.backend;
  if (!be_) {
    pool_ = std::make_unique<ThreadPool>(o.n_threads);
    cpu_ = std::make_unique<CpuBackend>(*pool_, o.precision);
    be_ = std::shared_ptr<Backend>(cpu_.get(), [](Backend*) {});  // owned by cpu_
  }
  draft_ = std::make_unique<DsparkDraft>(*dm_, target, *be_,
                                         DsparkOptions{.n_seq = 1, .n_ctx = n_ctx_, .n_batch = n_batch_});
  for (uint32_t t : dm_->hparams().taps) taps_.push_back(static_cast<int>(t));
  entries_.resize(static_cast<size_t>(n_batch_));
  out_.resize(dm_->hparams().block);
}

DsparkDrafter::~DsparkDrafter() = default;

void DsparkDrafter::observe(const TargetTaps& t) {
  const auto& hp = dm_->hparams();
  check(t.layers.size() == taps_.size() && std::equal(t.layers.begin(), t.layers.end(), taps_.begin()) &&
            t.n_embd == hp.target_n_embd,
        "dspark drafter: the target's taps do not match the draft's tap layers");
  if (t.n_rows <= 0) return;
  check(t.pos0 >= 0 && t.pos0 + t.n_rows <= n_ctx_, "dspark drafter: positions {}..{} outside the context of {}",
        t.pos0, t.pos0 + t.n_rows - 1, n_ctx_);
  const int64_t row = static_cast<int64_t>(taps_.size()) * t.n_embd;
  for (int64_t r0 = 0; r0 < t.n_rows; r0 += n_batch_) {
    const int64_t n = std::min<int64_t>(n_batch_, t.n_rows - r0);
    for (int64_t i = 0; i < n; ++i) entries_[size_t(i)] = {0, 0, static_cast<int32_t>(t.pos0 + r0 + i), false};
    draft_->add_context(entries_.data(), n, t.data + r0 * row);
  }
  // rows 0..covered_-1 stay valid: rows at and after pos0 were just rewritten (dspark.md §3.2: a
  // rejected draft's rows are overwritten, never rolled back)
  if (t.pos0 <= covered_) covered_ = std::max<int32_t>(covered_, static_cast<int32_t>(t.pos0 + t.n_rows));
}

int DsparkDrafter::propose(std::span<const int32_t> tokens, int n_max, std::vector<int32_t>& draft) {
  draft.clear();
  if (tokens.empty() || n_max <= 0) return 0;
  const int32_t pos = static_cast<int32_t>(tokens.size()) - 1;
  const int32_t B = static_cast<int32_t>(dm_->hparams().block);
  if (covered_ < pos || pos + B > n_ctx_) return 0;  // context rows missing, or no room for the block
  const int n = draft_->draft_greedy(0, tokens.back(), pos, n_max, out_.data());
  draft.assign(out_.begin(), out_.begin() + n);
  return n;
}

}  // namespace kimi
