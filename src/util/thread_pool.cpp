#include "util/thread_pool.h"

#include <chrono>

namespace kimi {

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

void ThreadPool::run_job(int idx) {
  if (all_fn_) {
    (*all_fn_)(idx, n_threads_);
  } else {
    // dynamic chunking: small chunks keep both cores busy when items differ in cost
    for (;;) {
      int64_t i = next_.fetch_add(1, std::memory_order_relaxed);
      if (i >= n_items_) break;
      (*item_fn_)(i, idx);
    }
  }
}

void ThreadPool::worker(int idx) {
  uint64_t seen = 0;
  for (;;) {
    // spin a little before sleeping: decode steps issue many short jobs
    uint64_t g = generation_.load(std::memory_order_acquire);
    for (int spin = 0; g == seen && spin < 20000; ++spin) {
#if defined(__x86_64__)
      __builtin_ia32_pause();
#endif
      g = generation_.load(std::memory_order_acquire);
    }
    if (g == seen) {
      std::unique_lock<std::mutex> lk(mu_);
      cv_.wait(lk, [&] { return generation_.load() != seen; });
      g = generation_.load();
    }
    seen = g;
    if (stop_.load()) return;
    run_job(idx);
    remaining_.fetch_sub(1, std::memory_order_acq_rel);
  }
}

void ThreadPool::parallel_for(int64_t n, const std::function<void(int64_t, int)>& fn) {
  if (n <= 0) return;
  if (n_threads_ == 1 || n == 1 || busy_.exchange(true)) {
    // single thread, trivial job, or a nested call: run inline
    bool was_nested = n_threads_ > 1 && n > 1;
    for (int64_t i = 0; i < n; ++i) fn(i, 0);
    (void)was_nested;
    return;
  }
  item_fn_ = &fn;
  all_fn_ = nullptr;
  n_items_ = n;
  next_.store(0);
  remaining_.store(n_threads_ - 1);
  {
    std::lock_guard<std::mutex> lk(mu_);
    generation_.fetch_add(1, std::memory_order_release);
  }
  cv_.notify_all();
  run_job(0);
  while (remaining_.load(std::memory_order_acquire) > 0) {
#if defined(__x86_64__)
    __builtin_ia32_pause();
#endif
  }
  busy_.store(false);
}

void ThreadPool::run_on_all(const std::function<void(int, int)>& fn) {
  if (n_threads_ == 1 || busy_.exchange(true)) {
    fn(0, 1);
    return;
  }
  all_fn_ = &fn;
  item_fn_ = nullptr;
  remaining_.store(n_threads_ - 1);
  {
    std::lock_guard<std::mutex> lk(mu_);
    generation_.fetch_add(1, std::memory_order_release);
  }
  cv_.notify_all();
  run_job(0);
  while (remaining_.load(std::memory_order_acquire) > 0) {
#if defined(__x86_64__)
    __builtin_ia32_pause();
#endif
  }
  busy_.store(false);
}

}  // namespace kimi
