// The MPI implementation of the forward pass's communicator (backend/collective.h), built with
// -DKIMI_MPI=ON (Open MPI from Debian). Only this module includes <mpi.h>.
//
// Every exchange is made of non-blocking point-to-point messages that this rank polls with a
// deadline, so that a rank that died or lost its link is NAMED (the peers whose messages did not
// arrive) instead of hanging the job: on an MPI error or after `timeout_s` seconds without
// progress the rank prints "kimi: rank R: lost rank X ..." and ends the job with a non-zero
// status (docs/distributed.md, "Failures"). wait_command (a worker waiting for rank 0's next
// command) has no deadline, only the error check. Under `mpirun --enable-recovery` (the launcher
// then leaves a lost rank to the job) a rank that ends the job first sends every other rank a
// note, which ends them too (naming who lost which rank); without it mpirun itself ends the job
// (SIGTERM, then SIGKILL) and rank 0 names the ranks that did not answer its SIGTERM roll call.
#pragma once
#include <memory>
#include <string>

#include "backend/collective.h"

namespace kimi::dist {

// True when this process was started by an MPI launcher (mpirun/mpiexec/srun set PMIx/OMPI
// variables); then init() must be called before any other MPI use.
bool launched_by_mpi();

class MpiCollective final : public Collective {
 public:
  // MPI_Init (MPI_THREAD_MULTIPLE: the exchanges come from one thread at a time, e.g. the server's
  // scheduler, and a watcher thread answers the launcher's SIGTERM so that rank 0 can name a lost
  // rank, docs/distributed.md "Failures") and the error handler; timeout_s from KIMI_MPI_TIMEOUT
  // (seconds, default 20).
  static std::unique_ptr<MpiCollective> init(int* argc, char*** argv);
  ~MpiCollective() override;  // MPI_Finalize

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  void all_gather(const void* mine, void* all, const uint64_t* bytes) override;
  void gather(const void* mine, void* all, const uint64_t* bytes, int root) override;
  void broadcast(void* data, uint64_t bytes, int root) override;
  void send(const void* data, uint64_t bytes, int to) override;
  void recv(void* data, uint64_t bytes, int from) override;
  void wait_command(void* data, uint64_t bytes) override;
  [[noreturn]] void worker_finished() override;
  const CollectiveStats& stats() const override { return stats_; }
  void reset_stats() override { stats_ = {}; }

  // End the whole job now: message on stderr, then MPI_Abort with `code` (never returns).
  [[noreturn]] void abort_job(const std::string& why, int code = 1);
  // MPI_Finalize now (idempotent; the destructor calls it too).
  void finalize();
  double timeout_s() const { return timeout_s_; }

 private:
  MpiCollective() = default;
  // Waits for reqs_[0..n) (peer_[i] = the rank on the other side); `op` names the exchange.
  void wait_all(int n, const char* op, bool deadline);
  void bcast(void* data, uint64_t bytes, int root, bool deadline);
  int rank_ = 0, size_ = 1;
  double timeout_s_ = 20;
  bool finalized_ = false;
  CollectiveStats stats_;
  struct Pending;                     // the MPI requests of one exchange (mpi_collective.cpp)
  std::unique_ptr<Pending> pending_;
};

}  // namespace kimi::dist
