#include "util/thread_pool.h"

namespace kimi {

static inline void cpu_relax() {
#if defined(__x86_64__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  asm volatile("yield");
#endif
}

ThreadPool::ThreadPool(int n_threads) {
  if (n_threads <= 0) n_threads = static_cast<int>(std::thread::hardware_concurrency());
  if (n_threads <= 0) n_threads = 1;
  n_threads_ = n_threads;
  for (int i = 1; i < n_threads_; ++i) threads_.emplace_back([this, i] { worker(i); });
}

ThreadPool::~ThreadPool() {
  {
    std::lock_guard<std::mutex> lk(mu_);
    stop_.store(true);
    generation_.fetch_add(1);
  }
  cv_.notify_all();
  for (auto& t : threads_) t.join();
}

void ThreadPool::work_on(Job& job, int th) {
  for (;;) {
    int64_t i = job.next.fetch_add(1, std::memory_order_relaxed);
    if (i >= job.n) break;
    job.fn(job.ctx, i, th);
    job.done.fetch_add(1, std::memory_order_release);
  }
}

void ThreadPool::worker(int idx) {
  uint64_t seen = 0;
  for (;;) {
    uint64_t g = generation_.load(std::memory_order_acquire);
    for (int spin = 0; g == seen && spin < 4000; ++spin) {
      cpu_relax();
      g = generation_.load(std::memory_order_acquire);
    }
    if (g == seen) {
      std::unique_lock<std::mutex> lk(mu_);
      sleepers_.fetch_add(1);
      cv_.wait(lk, [&] { return generation_.load() != seen; });
      sleepers_.fetch_sub(1);
    }
    // Announce that we may read a Job, THEN read the generation: the caller only rewrites a Job
    // slot after seeing active_ == 0, and slot g&1 is never rewritten while generation_ == g.
    active_.fetch_add(1, std::memory_order_acq_rel);
    g = generation_.load(std::memory_order_acquire);
    if (stop_.load()) {
      active_.fetch_sub(1);
      return;
    }
    seen = g;
    work_on(jobs_[g & 1], idx);
    active_.fetch_sub(1, std::memory_order_release);
  }
}

void ThreadPool::run(int64_t n, Trampoline fn, void* ctx) {
  if (n <= 0) return;
  if (n_threads_ == 1 || n == 1 || busy_.exchange(true, std::memory_order_acquire)) {
    for (int64_t i = 0; i < n; ++i) fn(ctx, i, 0);  // single thread, trivial or nested call
    return;
  }
  // No worker may still be reading the slot we are about to fill (a straggler from two jobs ago).
  while (active_.load(std::memory_order_acquire) != 0) cpu_relax();
  const uint64_t g = generation_.load(std::memory_order_relaxed) + 1;
  Job& job = jobs_[g & 1];
  job.fn = fn;
  job.ctx = ctx;
  job.n = n;
  job.next.store(0, std::memory_order_relaxed);
  job.done.store(0, std::memory_order_relaxed);
  generation_.store(g, std::memory_order_release);
  if (sleepers_.load(std::memory_order_acquire) > 0) {
    std::lock_guard<std::mutex> lk(mu_);  // pairs with the predicate check under the mutex
    cv_.notify_all();
  }
  work_on(job, 0);
  while (job.done.load(std::memory_order_acquire) < n) cpu_relax();
  // Workers that are still inside this job will find no items; the next call waits for them
  // (active_ == 0) before reusing this slot's sibling, and slots alternate.
  busy_.store(false, std::memory_order_release);
}

}  // namespace kimi
