// Persistent thread pool: workers spin briefly, then sleep; the calling thread takes part as
// worker 0. parallel_for splits [0, n) into one contiguous range per thread (thread t owns items
// [t*n/T, (t+1)*n/T), up to rounding), each with its own cursor on its own cache line: a thread
// takes the items of its range first, then steals from the other ranges. So on an idle machine
// every thread runs the same rows of a weight at every call (its caches and NUMA node keep them),
// the only atomic a thread touches per item is its own cursor (no shared counter, no false
// sharing on the hot path), and the caller still returns as soon as every item is DONE: a worker
// that wakes up late (descheduled on a loaded machine) finds its range taken and never holds it
// up. Each thread adds its count of finished items to the job's `done` once per job.
// Optionally each thread is pinned to a CPU (cpus[i % cpus.size()] for thread i; thread 0 is the
// thread that calls parallel_for, pinned at its first call).
// parallel_for takes any callable by reference (no std::function, no allocation per call).
#pragma once
#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <thread>
#include <utility>
#include <vector>

namespace kimi {

class ThreadPool {
 public:
  // n_threads 0 = all hardware threads. cpus: the CPU of each thread (empty = not pinned); a CPU
  // the process may not run on makes the constructor throw kimi::Error naming it.
  explicit ThreadPool(int n_threads = 0, std::vector<int> cpus = {});
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  int size() const { return n_threads_; }
  const std::vector<int>& cpus() const { return cpus_; }  // empty when not pinned

  // Calls fn(i, thread_index) for every i in [0, n); blocks until all calls returned.
  // thread_index < size(). A nested call (from inside fn) runs serially on the caller.
  template <typename F>
  void parallel_for(int64_t n, F&& fn) {
    using Fn = std::remove_reference_t<F>;
    run(n, [](void* ctx, int64_t i, int th) { (*static_cast<Fn*>(ctx))(i, th); },
        const_cast<void*>(static_cast<const void*>(&fn)));
  }
  // Calls fn(thread_index, n_threads) once for every thread index (an item per index: thread t
  // runs index t unless it is late, then another thread runs it).
  template <typename F>
  void run_on_all(F&& fn) {
    const int n = n_threads_;
    parallel_for(n, [&](int64_t i, int) { fn(static_cast<int>(i), n); });
  }

  // The range of items thread th of n_threads owns in a job of n items (balanced: the first
  // n % n_threads ranges hold one item more). Exposed for tests.
  static std::pair<int64_t, int64_t> owned_range(int64_t n, int th, int n_threads) {
    const int64_t base = n / n_threads, rem = n % n_threads;
    const int64_t lo = th * base + std::min<int64_t>(th, rem);
    return {lo, lo + base + (th < rem ? 1 : 0)};
  }

 private:
  using Trampoline = void (*)(void*, int64_t, int);
  struct alignas(64) Cursor {  // one thread's range: next item to take, end (exclusive)
    std::atomic<int64_t> next{0};
    int64_t end = 0;
  };
  struct Job {
    Trampoline fn = nullptr;
    void* ctx = nullptr;
    int64_t n = 0;
    std::unique_ptr<Cursor[]> cursors;  // n_threads_ of them
    alignas(64) std::atomic<int64_t> done{0};
  };
  void run(int64_t n, Trampoline fn, void* ctx);
  void work_on(Job& job, int th);
  void worker(int idx);

  int n_threads_ = 1;
  uint64_t id_ = 0;  // distinguishes pools for the caller's one-time pinning
  std::vector<int> cpus_;
  std::vector<std::thread> threads_;
  std::mutex mu_;
  std::condition_variable cv_;
  Job jobs_[2];                        // double-buffered: job g lives in jobs_[g & 1]
  alignas(64) std::atomic<uint64_t> generation_{0};
  std::atomic<int> sleepers_{0};
  std::atomic<bool> stop_{false};
  alignas(64) std::atomic<int> active_{0};  // workers currently reading a Job
  alignas(64) std::atomic<bool> busy_{false};
};

// Pins the calling thread to one CPU (Linux; elsewhere a no-op that returns false). False when the
// CPU is not one the process may run on.
bool pin_current_thread(int cpu);
// The CPUs the calling thread may run on (its affinity mask), ascending; empty where unknown.
std::vector<int> allowed_cpus();

}  // namespace kimi
