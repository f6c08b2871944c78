// DsparkDrafter (dspark_drafter.h): the DSpark draft behind the Drafter interface.
#include "runtime/dspark_drafter.h"

#include <algorithm>

#include "backend/cpu/cpu_backend.h"
#include "util/error.h"
#include "util/thread_pool.h"

namespace kimi {

DsparkRunner::DsparkRunner(std::shared_ptr<const DsparkModel> m, const Model& target, const DsparkDrafterOptions& o)
    : dm(std::move(m)), n_batch(std::max(1, o.n_batch)), n_ctx(std::max(1, o.n_ctx)), n_seq(std::max(1, o.n_seq)) {
  check(dm != nullptr, "dspark drafter: no draft model");
  dm->check_target(target.hparams());
  be = o.backend;
  if (!be) {
    pool = std::make_unique<ThreadPool>(o.n_threads);
    cpu = std::make_unique<CpuBackend>(*pool, o.precision);
    be = std::shared_ptr<Backend>(cpu.get(), [](Backend*) {});  // owned by cpu
  }
  draft = std::make_unique<DsparkDraft>(*dm, target, *be,
                                        DsparkOptions{.n_seq = n_seq, .n_ctx = n_ctx, .n_batch = n_batch});
  for (uint32_t t : dm->hparams().taps) taps.push_back(static_cast<int>(t));
  entries.resize(static_cast<size_t>(n_batch));
  out.resize(dm->hparams().block);
}

DsparkRunner::~DsparkRunner() = default;

DsparkDrafter::DsparkDrafter(std::shared_ptr<const DsparkModel> dm, const Model& target,
                             const DsparkDrafterOptions& o) {
  DsparkDrafterOptions one = o;
  one.n_seq = 1;
  r_ = std::make_shared<DsparkRunner>(std::move(dm), target, one);
}

DsparkDrafter::DsparkDrafter(std::shared_ptr<DsparkRunner> runner, int32_t seq) : r_(std::move(runner)), seq_(seq) {
  check(r_ != nullptr, "dspark drafter: no runner");
  check(seq >= 0 && seq < r_->n_seq, "dspark drafter: sequence {} outside the runner's 0..{}", seq, r_->n_seq - 1);
}

DsparkDrafter::~DsparkDrafter() = default;

void DsparkDrafter::observe(const TargetTaps& t) {
  const auto& hp = r_->dm->hparams();
  const auto& taps = r_->taps;
  check(t.layers.size() == taps.size() && std::equal(t.layers.begin(), t.layers.end(), taps.begin()) &&
            t.n_embd == hp.target_n_embd,
        "dspark drafter: the target's taps do not match the draft's tap layers");
  if (t.n_rows <= 0) return;
  check(t.pos0 >= 0 && t.pos0 + t.n_rows <= r_->n_ctx, "dspark drafter: positions {}..{} outside the context of {}",
        t.pos0, t.pos0 + t.n_rows - 1, r_->n_ctx);
  const int64_t row = static_cast<int64_t>(taps.size()) * t.n_embd;
  for (int64_t r0 = 0; r0 < t.n_rows; r0 += r_->n_batch) {
    const int64_t n = std::min<int64_t>(r_->n_batch, t.n_rows - r0);
    for (int64_t i = 0; i < n; ++i)
      r_->entries[size_t(i)] = {0, seq_, static_cast<int32_t>(t.pos0 + r0 + i), false};
    r_->draft->add_context(r_->entries.data(), n, t.data + r0 * row);
  }
  // rows 0..pos0-1 stay valid; the sequence was (re)written from pos0 on, so rows past the ones just
  // written are stale (dspark.md §3.2: a rejected draft's rows are overwritten, never rolled back)
  if (t.pos0 <= covered_) covered_ = static_cast<int32_t>(t.pos0 + t.n_rows);
}

int DsparkDrafter::propose(std::span<const int32_t> tokens, int n_max, std::vector<int32_t>& draft) {
  draft.clear();
  if (tokens.empty() || n_max <= 0) return 0;
  const int32_t pos = static_cast<int32_t>(tokens.size()) - 1;
  const int32_t B = static_cast<int32_t>(r_->dm->hparams().block);
  if (covered_ < pos || pos + B > r_->n_ctx) return 0;  // context rows missing, or no room for the block
  const int n = r_->draft->draft_greedy(seq_, tokens.back(), pos, n_max, r_->out.data());
  draft.assign(r_->out.begin(), r_->out.begin() + n);
  return n;
}

}  // namespace kimi
