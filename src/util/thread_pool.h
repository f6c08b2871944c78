// Persistent thread pool: workers spin briefly, then sleep; parallel_for splits [0, n) into
// chunks handed out dynamically. The calling thread takes part as worker 0.
#pragma once
#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace kimi {

class ThreadPool {
 public:
  explicit ThreadPool(int n_threads = 0);  // 0 = all hardware threads
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  int size() const { return n_threads_; }
  // Calls fn(i, thread_index) for every i in [0, n). Blocks until all are done. Not reentrant:
  // fn must not call parallel_for on the same pool (nested calls run serially on the caller).
  void parallel_for(int64_t n, const std::function<void(int64_t, int)>& fn);
  // Calls fn(thread_index, n_threads) once on every thread.
  void run_on_all(const std::function<void(int, int)>& fn);

 private:
  void worker(int idx);
  void run_job(int idx);
  int n_threads_ = 1;
  std::vector<std::thread> threads_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::atomic<uint64_t> generation_{0};
  std::atomic<int> remaining_{0};
  std::atomic<int64_t> next_{0};
  int64_t n_items_ = 0;
  const std::function<void(int64_t, int)>* item_fn_ = nullptr;
  const std::function<void(int, int)>* all_fn_ = nullptr;
  std::atomic<bool> stop_{false};
  std::atomic<bool> busy_{false};
};

}  // namespace kimi
