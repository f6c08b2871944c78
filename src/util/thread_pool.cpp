#include "util/thread_pool.h"

#include "util/error.h"

#if defined(__linux__)
#include <pthread.h>
#include <sched.h>
#endif

namespace kimi {

static inline void cpu_relax() {
#if defined(__x86_64__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  asm volatile("yield");
#endif
}

bool pin_current_thread(int cpu) {
#if defined(__linux__)
  if (cpu < 0 || cpu >= CPU_SETSIZE) return false;
  cpu_set_t set;
  CPU_ZERO(&set);
  CPU_SET(cpu, &set);
  return pthread_setaffinity_np(pthread_self(), sizeof set, &set) == 0;
#else
  (void)cpu;
  return false;
#endif
}

std::vector<int> allowed_cpus() {
  std::vector<int> v;
#if defined(__linux__)
  cpu_set_t set;
  CPU_ZERO(&set);
  if (pthread_getaffinity_np(pthread_self(), sizeof set, &set) == 0)
    for (int c = 0; c < CPU_SETSIZE; ++c)
      if (CPU_ISSET(c, &set)) v.push_back(c);
#endif
  return v;
}

namespace {
std::atomic<uint64_t> g_pool_ids{0};
thread_local uint64_t t_pinned_for = 0;  // id of the pool the calling thread was last pinned for
}  // namespace

ThreadPool::ThreadPool(int n_threads, std::vector<int> cpus) : cpus_(std::move(cpus)) {
  if (n_threads <= 0) n_threads = static_cast<int>(std::thread::hardware_concurrency());
  if (n_threads <= 0) n_threads = 1;
  n_threads_ = n_threads;
  id_ = ++g_pool_ids;
#if defined(__linux__)
  if (!cpus_.empty()) {
    const std::vector<int> ok = allowed_cpus();
    for (int c : cpus_)
      check(std::find(ok.begin(), ok.end(), c) != ok.end(),
            "thread pool: CPU {} is not one this process may run on (allowed: {} CPUs)", c, ok.size());
  }
#else
  check(cpus_.empty(), "thread pool: pinning threads to CPUs is only supported on Linux");
#endif
  for (Job& j : jobs_) j.cursors = std::make_unique<Cursor[]>(static_cast<size_t>(n_threads_));
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
  // own range first, then the others' (th+1, th+2, ...): each cursor is touched only by its owner
  // unless the owner is behind
  const int T = n_threads_;
  int64_t did = 0;
  for (int k = 0; k < T; ++k) {
    Cursor& c = job.cursors[static_cast<size_t>((th + k) % T)];
    if (c.next.load(std::memory_order_relaxed) >= c.end) continue;
    for (;;) {
      const int64_t i = c.next.fetch_add(1, std::memory_order_relaxed);
      if (i >= c.end) break;
      job.fn(job.ctx, i, th);
      ++did;
    }
  }
  if (did > 0) job.done.fetch_add(did, std::memory_order_release);
}

void ThreadPool::worker(int idx) {
  if (!cpus_.empty()) pin_current_thread(cpus_[static_cast<size_t>(idx) % cpus_.size()]);
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
  if (!cpus_.empty() && t_pinned_for != id_) {  // the calling thread is thread 0
    pin_current_thread(cpus_[0]);
    t_pinned_for = id_;
  }
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
  for (int t = 0; t < n_threads_; ++t) {
    const auto [lo, hi] = owned_range(n, t, n_threads_);
    Cursor& c = job.cursors[static_cast<size_t>(t)];
    c.next.store(lo, std::memory_order_relaxed);
    c.end = hi;
  }
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
