// Routed experts streamed from disk for models larger than memory (docs/performance.md, section 4).
//
// A cache of whole experts (one layer's gate, up and down slices) under a memory budget. After
// the router of a layer has picked its experts, request() looks them up, evicts the least
// recently used experts that this call does not need, and starts reading the missing ones on
// I/O threads; the caller computes what does not need them (latent projection, shared experts)
// and then wait()s for the reads and gets a pointer per expert slice (ExpertMats::slices). The
// kernels read the same bytes as from the mapping, so the logits are bit-identical.
//
// Two ways of holding an expert:
// - Pread: a fixed buffer of budget bytes (slots), filled with pread(); the page cache the reads
//   went through is dropped (posix_fadvise DONTNEED), so memory stays at the budget;
// - Madvise: the experts stay in the file mapping; a miss asks the kernel to read the pages ahead
//   (MADV_WILLNEED), an eviction drops them from the process and the page cache (MADV_DONTNEED +
//   POSIX_FADV_DONTNEED). No copy; the budget counts the resident experts.
// Not thread-safe: one forward pass calls it, layer after layer.
#pragma once
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "model/model.h"

namespace kimi {

class ReadOnlyFile;

enum class StreamMode { Pread, Madvise };

struct ExpertStreamOptions {
  int64_t budget_bytes = -1;  // memory for cached routed experts: -1 = auto (stream only when the
                              // model does not fit in memory), 0 = off (plain mapping)
  StreamMode mode = StreamMode::Pread;
  int io_threads = 16;        // concurrent reads in flight (pread mode)
};

struct ExpertStreamStats {
  bool enabled = false;
  StreamMode mode = StreamMode::Pread;
  uint64_t budget_bytes = 0, slot_bytes = 0;
  int64_t slots = 0;
  uint64_t lookups = 0, hits = 0, misses = 0, evictions = 0;
  uint64_t bytes_read = 0;    // expert bytes read from the file (misses)
  uint64_t bypass_calls = 0;  // layer calls with more distinct experts than slots (read through the mapping)
  double wait_s = 0;          // time the forward pass waited for reads
  double hit_rate() const { return lookups ? double(hits) / double(lookups) : 0.0; }
  ExpertStreamStats minus(const ExpertStreamStats& o) const;  // counters since snapshot o
  void add(const ExpertStreamStats& d);                       // += d's counters
  // "experts streamed (pread, 7.5 GiB = 440 slots): hit rate 64.1 %, 1.23 GB read, 812 MB/s over 1.5 s"
  std::string summary(double wall_s) const;
};

// The budget the engine uses for `o` on model `m` (0 = no streaming): auto streams when the model
// file is larger than 80 % of the physical memory, with a cache of 85 % of it less the always-read
// weights (at least one layer's worth of experts).
uint64_t resolve_stream_budget(const Model& m, const ExpertStreamOptions& o);

class ExpertCache {
 public:
  // Experts of the MoE layers il with on_host[il] (others are never requested). Throws
  // kimi::Error when the budget holds fewer experts than one token uses.
  ExpertCache(const Model& m, const std::vector<uint8_t>& on_host, uint64_t budget_bytes,
              const ExpertStreamOptions& o);
  ~ExpertCache();
  ExpertCache(const ExpertCache&) = delete;
  ExpertCache& operator=(const ExpertCache&) = delete;

  // Bytes one cached expert takes (the largest layer's gate + up + down slices, 64-aligned).
  static uint64_t slot_bytes(const Model& m);

  // The experts sel[0..count) (-1 = skipped) of layer il: false when they are more than the
  // slots (the caller reads them through the mapping); else reads of the missing ones started.
  bool request(uint32_t il, const int32_t* sel, int64_t count);
  // After a successful request: waits for its reads; [3 * n_expert] slice pointers.
  const uint8_t* const* wait();

  const ExpertStreamStats& stats() const { return stats_; }

 private:
  struct Range {
    uint32_t file = 0;
    uint64_t off = 0, bytes = 0;
    const uint8_t* mapped = nullptr;
  };
  struct Job {
    const ReadOnlyFile* f;
    uint64_t off, bytes;
    uint8_t* dst;
  };
  void io_worker();
  const Range& range(uint32_t il, int64_t e, int which) const {
    return ranges_[(static_cast<size_t>(il) * static_cast<size_t>(E_) + static_cast<size_t>(e)) * 3 + static_cast<size_t>(which)];
  }
  void release(int64_t key);

  int64_t E_ = 0;
  uint32_t n_layer_ = 0;
  StreamMode mode_;
  uint64_t slot_bytes_ = 0;
  std::vector<Range> ranges_;                       // [layer][expert][gate, up, down]
  std::vector<std::unique_ptr<ReadOnlyFile>> files_;
  std::vector<int32_t> where_;                      // [layer * E + e] -> slot, -1
  std::vector<int64_t> slot_key_;                   // slot -> layer * E + e, -1
  std::vector<uint64_t> slot_used_;                 // slot -> stamp of its last use (0: free)
  std::vector<uint64_t> slot_call_;                 // slot -> the request that last used it
  uint64_t tick_ = 0, clock_ = 0;                   // requests, uses
  uint8_t* buf_ = nullptr;                          // pread mode: slots * slot_bytes
  std::vector<const uint8_t*> ptrs_;                // [3 E] of the current request
  std::vector<int32_t> distinct_;
  std::vector<uint64_t> seen_;                      // [E] tick of the request that listed e
  std::vector<uint64_t> layer_off_;                 // [layer][gate, up, down] offsets in a slot
  ExpertStreamStats stats_;

  // I/O threads (pread mode)
  std::vector<std::thread> threads_;
  std::mutex mu_;
  std::condition_variable cv_work_, cv_done_;
  std::deque<Job> jobs_;
  int64_t pending_ = 0;
  bool stop_ = false;
  std::string error_;
};

}  // namespace kimi
