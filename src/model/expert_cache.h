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

#include "model/expert_offload.h"
#include "model/model.h"

namespace kimi {

class ReadOnlyFile;

enum class StreamMode { Pread, Madvise };

// --gpu-experts (docs/gpu.md, "Hot experts"): in hybrid mode (a layer's routed experts in host memory, the
// rest of its FFN on an accelerator) the most-picked experts of each such layer are also kept on the
// accelerator and run there.
struct HotExpertOptions {
  int64_t per_layer = 0;  // experts per layer kept on the accelerator: 0 = off, -1 = auto (fill its free memory)
  // picks per expert of each layer ([layer][expert], e.g. an imatrix file's ffn_gate_exps counts): the
  // experts with the most picks are kept (ties: the lower id); a layer without counts starts from zeros
  // (experts 0..N-1) and ranks by the picks counted while running
  std::vector<std::vector<double>> counts;
  uint64_t reserve_bytes = 512ull << 20;  // auto: device memory left free besides 10 % of it
  // counted while running: every pick the host sees is added to the counts, and before a forward pass the
  // resident experts are re-ranked by them (only the slots whose expert changed are re-uploaded) once this many
  // tokens ran since the last re-ranking; the first re-ranking comes after min(64, rerank_tokens) tokens, each
  // gap doubles up to rerank_tokens. 0 = never (the starting counts decide for good)
  int64_t rerank_tokens = 1024;
  // the counts fade: a pick seen this many tokens ago weighs half as much as one seen now (the starting counts
  // too), so a long-running server follows its current workload; 0 = never (every pick counts for good)
  int64_t decay_tokens = int64_t(1) << 20;
  std::string counts_out;  // when the context ends: the counts written as an imatrix file (--expert-counts reads it)
};

struct ExpertStreamOptions {
  HotExpertOptions hot;
  ExpertOffloadOptions offload;  // prefill offload in hybrid mode (model/expert_offload.h)
  int64_t budget_bytes = -1;  // memory for cached routed experts: -1 = auto (stream only when the
                              // model does not fit in memory), 0 = off (plain mapping)
  StreamMode mode = StreamMode::Pread;
  int io_threads = 16;        // concurrent reads in flight (pread mode)
  // hybrid mode (routed experts on another backend than their FFN): the FFN's backend runs the shared
  // experts and the hot experts while the experts' backend runs its routed experts (moe.cpp); false: one
  // after the other (--hybrid-overlap off, for A/B). The results are the same bits either way.
  bool hybrid_overlap = true;
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
  // hot experts (HotExperts): routed expert picks run by the accelerator's resident experts / by the host
  uint64_t hot_picks = 0, host_picks = 0;
  int64_t hot_per_layer = 0;  // experts kept per layer (0: none)
  uint64_t hot_reranks = 0, hot_reloads = 0;  // re-rankings done, experts re-uploaded by them (all layers)
  std::string hot_device;
  double hot_share() const { return hot_picks + host_picks ? double(hot_picks) / double(hot_picks + host_picks) : 0.0; }
  // "routed expert picks on vulkan:0 (12 resident experts per layer): 36.5 % (1234 of 3380)", and when re-ranked
  // ", re-ranked 3 times (41 experts re-uploaded)"
  std::string hot_summary() const;
  // prefill offload (ExpertOffload): layer steps whose host picks ran on the accelerator, steps the rates
  // left on the CPU, their picks, the expert bytes uploaded, chunks; the choice made at load (-v)
  uint64_t offload_steps = 0, offload_declined = 0, offload_picks = 0, offload_bytes = 0, offload_chunks = 0;
  uint64_t offload_split_steps = 0;  // of offload_steps: the host ran the picks of the experts not offloaded
  std::string offload_plan, offload_device;
  // "routed experts offloaded to vulkan:0: 14 layer steps (0 left on the CPU by the rates), 3584 picks, ..."
  std::string offload_summary() const;
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

// The hot experts of --gpu-experts on one accelerator `dev`: for each layer with on_host[il] (its routed
// experts in host memory, its FFN on dev) the chosen experts' gate, up and down slices are copied into one
// stack per matrix on dev at construction (place_weight), with device buffers for one micro-batch's split.
// Each MoE step splits the router's picks (split): the device runs the picks of its resident experts, the
// host the others (their host selection set to -1, skipped), and the host's sum is added to the device's.
class HotExperts {
 public:
  // Throws kimi::Error when counts name a layer/expert count that does not match the model.
  HotExperts(const Model& m, Backend& dev, const std::vector<uint8_t>& on_host, const HotExpertOptions& o,
             int64_t n_tokens);
  ~HotExperts();  // writes HotExpertOptions::counts_out (a failure is reported on stderr)
  HotExperts(const HotExperts&) = delete;
  HotExperts& operator=(const HotExperts&) = delete;

  struct Layer {
    int64_t n = 0;                // resident experts
    std::vector<int32_t> slot;    // [E]: expert -> slot in the stack, -1 = on the host only
    std::vector<int32_t> expert;  // [n]: slot -> expert
    ExpertMats mats;              // the stacks on the device
  };
  // nullptr when layer il keeps no expert on the device
  const Layer* layer(uint32_t il) const;
  // Splits count = n * k picks of layer il: host_sel[i] becomes -1 for a resident expert's pick; the device
  // selection (its slot, or -1 = skipped for a host pick, weight 0) and weights go to dev_sel() / dev_weights().
  // Both backends' moe_experts skip a pick of expert -1 (as for the experts of another rank).
  // The picks are also counted (counts()).
  void split(uint32_t il, int32_t* host_sel, const float* host_weights, int64_t count);
  // Between forward passes (no device work of this object in flight or recorded): a pass of n tokens starts;
  // re-ranks first when rerank_tokens (see HotExpertOptions) ran since the last time. Allocates nothing.
  void begin_pass(int64_t n);
  // Re-ranks every layer by its counts now (ties: a resident expert first, then the lower id) and re-uploads
  // the slots whose expert changed.
  void rerank();
  // Layer il's counts in picks as of now (the starting counts plus the picks seen, faded by decay_tokens).
  std::vector<double> counts(uint32_t il) const;
  // The counts of every layer as an imatrix file (blk.N.ffn_gate_exps.weight.counts; in_sum2 is one zero per
  // expert, so the file ranks experts but does not guide quantization). Throws kimi::Error.
  void save_counts(const std::string& path) const;
  int32_t* dev_sel() const { return dsel_->as<int32_t>(); }
  float* dev_weights() const { return dw_->as<float>(); }
  float* dev_acc() const { return dacc_->as<float>(); }
  int64_t per_layer() const { return per_layer_; }
  uint64_t device_bytes() const { return bytes_; }
  void add_stats(ExpertStreamStats& s) const;  // hot_* fields

 private:
  Backend& dev_;
  const Model& model_;
  std::vector<Layer> layers_;
  std::unique_ptr<Buffer> dsel_, dw_, dacc_;
  std::vector<std::unique_ptr<Buffer>> stacks_;  // gate, up, down stacks of each layer with experts here
  std::vector<int32_t> hsel_;
  std::vector<float> hw_;
  // [layer][E]: starting counts + picks seen, in units of weight_: a pick adds weight_, which grows by 2 every
  // decay_tokens (fading every older count by the same factor without touching it); rescaled before it overflows
  std::vector<std::vector<double>> counts_;
  double weight_ = 1.0, grow_per_token_ = 1.0;
  std::vector<int32_t> order_, free_;          // re-ranking scratch: [E], [per layer]
  std::vector<uint8_t> top_;                   // [E]
  int64_t per_layer_ = 0, rerank_tokens_ = 0, next_rerank_ = 0, since_ = 0;
  std::string counts_out_;
  uint64_t bytes_ = 0, hot_picks_ = 0, host_picks_ = 0, reranks_ = 0, reloads_ = 0;
};

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
