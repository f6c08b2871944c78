// The communicator the forward pass uses when one model runs on several processes (ranks), e.g.
// over MPI (src/mpi/, docs/distributed.md). The model code calls it at a few block boundaries
// (gather the rows or heads each rank computed, combine the routed experts' partial sums, hand the
// residual stream to the next rank in layer mode); it never sees MPI. A null Collective* means one
// process: nothing is split and nothing is communicated.
//
// Rules every implementation keeps:
// - Every call is collective or paired: all ranks make the same calls in the same order (the
//   worker ranks replay rank 0's commands, model/forward.cpp).
// - Buffers are host memory (the distributed forward pass runs on host-visible backends).
// - A failed or timed-out exchange does not return: the implementation names the rank it lost,
//   and ends this process with a non-zero status (docs/distributed.md, "Failures").
#pragma once
#include <cstdint>

namespace kimi {

// How the model is split across ranks (docs/distributed.md).
enum class SplitMode {
  Tensor,  // every rank runs every layer: routed experts, heads and weight rows split (default)
  Layer,   // pipeline: contiguous layers per rank, the residual stream passed on
};

struct CollectiveStats {
  uint64_t bytes_sent = 0, bytes_received = 0;  // payload bytes of this rank
  uint64_t calls = 0;                            // exchanges (each all-gather / send / ... is one)
  double seconds = 0;                            // wall time inside the exchanges
};

// What this rank reads and sends per decode token (kimi bench under MPI).
struct RankTraffic {
  int rank = 0;
  uint64_t dense_weight_bytes = 0;   // always-read weights this rank reads per token
  uint64_t expert_weight_bytes = 0;  // its share of the routed experts (all of its experts' bytes)
  uint64_t expert_bytes_per_token = 0;  // expected routed-expert bytes per token (k/E of them)
  CollectiveStats comm;              // since the last reset
  uint64_t rss_bytes = 0;            // resident memory of the rank's process (Linux; else 0)
  uint64_t model_rss_bytes = 0;      // of it: resident pages of the model file(s) (the mmap)
};

class Collective {
 public:
  virtual ~Collective() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;

  // Every rank contributes bytes[rank()] bytes at `mine`; every rank receives the contributions
  // of all ranks, concatenated in rank order, at `all` (bytes[r] for rank r; `mine` may alias
  // its own block of `all`).
  virtual void all_gather(const void* mine, void* all, const uint64_t* bytes) = 0;
  // Like all_gather, but only rank `root` receives (`all` is ignored elsewhere).
  virtual void gather(const void* mine, void* all, const uint64_t* bytes, int root) = 0;
  // root's bytes at data become every rank's.
  virtual void broadcast(void* data, uint64_t bytes, int root) = 0;
  virtual void send(const void* data, uint64_t bytes, int to) = 0;
  virtual void recv(void* data, uint64_t bytes, int from) = 0;
  // A worker rank waits for rank 0's next command here (no time limit: rank 0 may be idle, e.g.
  // a server waiting for requests); otherwise like broadcast(data, bytes, 0).
  virtual void wait_command(void* data, uint64_t bytes) { broadcast(data, bytes, 0); }

  // Called on a worker rank once rank 0 has closed the model (its forward pass was destroyed): the
  // worker's part is over. The MPI implementation finalizes and ends the process with status 0
  // (the command a worker runs never continues past its context); the default returns.
  virtual void worker_finished() {}

  virtual const CollectiveStats& stats() const = 0;
  virtual void reset_stats() = 0;
};

}  // namespace kimi
