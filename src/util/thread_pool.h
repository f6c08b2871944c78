// Persistent thread pool: workers spin briefly, then sleep; parallel_for hands out the items of
// [0, n) dynamically and the calling thread takes part as worker 0. The caller returns as soon as
// every item is DONE — workers that wake up late (descheduled on a loaded machine) never hold it
// up: they find no items left and go back to waiting.
// parallel_for takes any callable by reference (no std::function, no allocation per call).
#pragma once
#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <thread>
#include <utility>
#include <vector>

namespace kimi {

class ThreadPool {
 public:
  explicit ThreadPool(int n_threads = 0);  // 0 = all hardware threads
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  int size() const { return n_threads_; }

  // Calls fn(i, thread_index) for every i in [0, n); blocks until all calls returned.
  // thread_index < size(). A nested call (from inside fn) runs serially on the caller.
  template <typename F>
  void parallel_for(int64_t n, F&& fn) {
    using Fn = std::remove_reference_t<F>;
    run(n, [](void* ctx, int64_t i, int th) { (*static_cast<Fn*>(ctx))(i, th); },
        const_cast<void*>(static_cast<const void*>(&fn)));
  }
  // Calls fn(thread_index, n_threads) once for every thread index (an item per index: on a
  // loaded machine one OS thread may run several indices).
  template <typename F>
  void run_on_all(F&& fn) {
    const int n = n_threads_;
    parallel_for(n, [&](int64_t i, int) { fn(static_cast<int>(i), n); });
  }

 private:
  using Trampoline = void (*)(void*, int64_t, int);
  struct alignas(64) Job {
    Trampoline fn = nullptr;
    void* ctx = nullptr;
    int64_t n = 0;
    std::atomic<int64_t> next{0};
    std::atomic<int64_t> done{0};
  };
  void run(int64_t n, Trampoline fn, void* ctx);
  void work_on(Job& job, int th);
  void worker(int idx);

  int n_threads_ = 1;
  std::vector<std::thread> threads_;
  std::mutex mu_;
  std::condition_variable cv_;
  Job jobs_[2];                        // double-buffered: job g lives in jobs_[g & 1]
  std::atomic<uint64_t> generation_{0};
  std::atomic<int> active_{0};         // workers currently reading a Job
  std::atomic<int> sleepers_{0};
  std::atomic<bool> stop_{false};
  std::atomic<bool> busy_{false};
};

}  // namespace kimi
