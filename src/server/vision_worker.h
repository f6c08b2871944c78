// The vision tower off the scheduler thread (docs/engine.md "Images in the server"): one worker
// thread runs the tower for one request at a time, first come first served, while the scheduler
// keeps decoding the other sequences; a cache of tower outputs, one entry per image keyed by its
// content (image::content_hash, which covers the patch grid, a second independent hash of the
// patch values and the grid), least recently used first out under a byte budget, so that the `n`
// choices of a request and a repeated image whose prompt-cache entry is gone skip the tower.
//
//   VisionWorker w(runner, n_embd, 256 << 20, [&] { wake_scheduler(); });
//   auto t = w.submit(images, need);   // need[k]: image k's rows are wanted
//   ... later, on the scheduler thread: if (t->done()) use t->rows (or t->error)
//
// The tower runs on the runner's own backend (VisionRunner: a CPU backend with its own thread pool,
// or a Vulkan backend with its own device and queue), never on the context's, so the worker thread
// and the scheduler thread never record on one device at once.
#pragma once
#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <list>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "server/job.h"

namespace kimi {
class VisionRunner;
}

namespace kimi::server {

struct VisionStats {
  uint64_t images_encoded = 0;  // images the tower ran on
  uint64_t images_cached = 0;   // images whose rows came from the cache
  uint64_t runs = 0;            // tower calls (one per request that needed the tower)
  double tower_s = 0;           // time in the tower
  uint64_t cache_entries = 0, cache_bytes = 0, cache_evictions = 0;
};

class VisionWorker {
 public:
  // One request's images. The scheduler thread reads the results once done() is true.
  class Task {
   public:
    bool done() const { return done_.load(std::memory_order_acquire); }
    // not run if not started yet; a run in progress stops before the tower's next block
    void cancel() { cancelled_.store(true, std::memory_order_relaxed); }
    std::vector<float> rows;  // [n_rows][d]: the rows of the images asked for (the others stay 0)
    std::string error;        // the tower failed (rows empty)
    double tower_s = -1;      // this request's tower run (-1: it did not run: all from the cache)
    int encoded = 0, cached = 0;  // images the tower ran on / taken from the cache

   private:
    friend class VisionWorker;
    std::shared_ptr<const PromptImages> images_;
    std::vector<uint8_t> need_;
    std::atomic<bool> done_{false}, cancelled_{false};
  };

  // runner: the tower (not owned; used only by the worker thread from now on); d: the width of a
  // row (the text model's hidden size); cache_bytes: the cache budget (0: no cache); wake: called
  // on the worker thread after a task is done (without any lock of the worker held); hook (tests):
  // called on the worker thread before each tower run with the number of images it encodes, may
  // block (holds the tower).
  VisionWorker(VisionRunner& runner, int64_t d, uint64_t cache_bytes, std::function<void()> wake,
               std::function<void(int)> hook = {});
  ~VisionWorker();  // the run in progress is cancelled, queued tasks end with an error, the thread is joined
  VisionWorker(const VisionWorker&) = delete;
  VisionWorker& operator=(const VisionWorker&) = delete;

  // need: one flag per image of `images` (empty: all); queued behind the earlier tasks
  std::shared_ptr<Task> submit(std::shared_ptr<const PromptImages> images, std::vector<uint8_t> need = {});
  VisionStats stats() const;

 private:
  struct Key {
    uint64_t h1 = 0, h2 = 0;
    int64_t gh = 0, gw = 0;
    bool operator==(const Key& o) const { return h1 == o.h1 && h2 == o.h2 && gh == o.gh && gw == o.gw; }
  };
  struct KeyHash {
    size_t operator()(const Key& k) const { return static_cast<size_t>(k.h1 ^ (k.h2 * 0x9E3779B97F4A7C15ull)); }
  };
  struct Entry {
    Key key;
    std::shared_ptr<const std::vector<float>> rows;
  };
  void loop();
  void run(Task& t);
  std::shared_ptr<const std::vector<float>> lookup(const Key& k);  // under mu_
  void insert(const Key& k, std::shared_ptr<const std::vector<float>> rows);  // under mu_

  VisionRunner& runner_;
  int64_t d_ = 0;
  uint64_t budget_ = 0;
  std::function<void()> wake_;
  std::function<void(int)> hook_;

  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::shared_ptr<Task>> queue_;
  std::shared_ptr<Task> current_;  // the task being run
  bool stop_ = false;
  std::list<Entry> lru_;  // most recently used first
  std::unordered_map<Key, std::list<Entry>::iterator, KeyHash> index_;
  VisionStats st_;
  std::thread thread_;
};

}  // namespace kimi::server
