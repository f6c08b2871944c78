// MpiCollective (mpi_collective.h): exchanges as non-blocking point-to-point messages polled with
// a deadline, so that a lost rank is named instead of hanging the job.
#include "mpi/mpi_collective.h"

#include <mpi.h>

#include <fmt/format.h>

#include <algorithm>
#include <csignal>
#include <pthread.h>
#include <signal.h>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <unistd.h>
#include <vector>

#include "util/error.h"

namespace kimi::dist {

namespace {

constexpr int kTagData = 7;
constexpr int kTagAbort = 9;  // "the job ends" notes between ranks (mpirun --enable-recovery)
constexpr int kAbortBytes = 512;

// MPI counts are int: large payloads go as several messages of at most 1 GiB.
constexpr uint64_t kChunk = uint64_t{1} << 30;

std::string mpi_error_text(int code) {
  char buf[MPI_MAX_ERROR_STRING];
  int len = 0;
  if (MPI_Error_string(code, buf, &len) != MPI_SUCCESS) return "MPI error " + std::to_string(code);
  return std::string(buf, static_cast<size_t>(len));
}

// A worker that gets SIGTERM/SIGINT (mpirun forwards them to every rank) keeps serving rank 0
// until rank 0 closes the model, so that a server's graceful shutdown ends every rank with status
// 0; if rank 0 does not close within kTermGrace seconds, the worker ends (status 1).
volatile std::sig_atomic_t g_term = 0;
constexpr double kTermGrace = 120;
int g_term_pipe[2] = {-1, -1};  // SIGTERM -> the watcher thread (below)
extern "C" void on_term(int) {
  g_term = 1;
  if (g_term_pipe[1] >= 0) {
    const char c = 't';
    [[maybe_unused]] const ssize_t w = ::write(g_term_pipe[1], &c, 1);
  }
}

constexpr int kTagAlive = 11;  // "still here" notes after a SIGTERM (the watcher)
// How long rank 0 waits for the other ranks' notes after a SIGTERM: Open MPI's mpirun sends
// SIGKILL odls_base_sigkill_timeout (1 s) after its SIGTERM.
constexpr double kAliveWait = 0.7;

// Plain mpirun ends the whole job when a rank dies: SIGTERM to every other rank, SIGKILL 1 s later,
// and no event to the survivors (no PMIx notification without --enable-recovery). So that rank 0
// can still name the lost rank, every rank's watcher thread wakes on SIGTERM: a worker sends rank 0
// a note; rank 0 waits kAliveWait s for the notes and names the ranks that sent none ("lost rank 2
// (the launcher is ending the job)"), then ends with status 1. When every rank answers (a plain
// stop, e.g. Ctrl-C) rank 0 ends as a SIGTERM would have ended it. (A server's own SIGTERM handler
// replaces this one on rank 0: its graceful shutdown comes first.)
void watch_term(int rank, int size) {
  char c = 0;
  while (::read(g_term_pipe[0], &c, 1) != 1) {
    if (errno != EINTR) return;
  }
  using clock = std::chrono::steady_clock;
  const auto t0 = clock::now();
  if (rank != 0) {
    int one = rank;
    MPI_Request q;
    if (MPI_Isend(&one, 1, MPI_INT, 0, kTagAlive, MPI_COMM_WORLD, &q) != MPI_SUCCESS) return;
    while (std::chrono::duration<double>(clock::now() - t0).count() < kAliveWait) {
      int done = 0;
      if (MPI_Test(&q, &done, MPI_STATUS_IGNORE) != MPI_SUCCESS || done) break;
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
    }
    return;  // the main thread goes on (a worker told to stop waits for rank 0, wait_all)
  }
  std::vector<MPI_Request> req(static_cast<size_t>(size), MPI_REQUEST_NULL);
  std::vector<int> note(static_cast<size_t>(size), 0), seen(static_cast<size_t>(size), 0);
  for (int r = 1; r < size; ++r)
    MPI_Irecv(&note[static_cast<size_t>(r)], 1, MPI_INT, r, kTagAlive, MPI_COMM_WORLD, &req[static_cast<size_t>(r)]);
  int left = size - 1;
  while (left > 0 && std::chrono::duration<double>(clock::now() - t0).count() < kAliveWait) {
    for (int r = 1; r < size; ++r) {
      if (seen[static_cast<size_t>(r)]) continue;
      int done = 0;
      if (MPI_Test(&req[static_cast<size_t>(r)], &done, MPI_STATUS_IGNORE) == MPI_SUCCESS && done) {
        seen[static_cast<size_t>(r)] = 1;
        --left;
      }
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  if (left == 0) {  // everyone is here: an ordinary stop
    std::signal(SIGTERM, SIG_DFL);
    std::raise(SIGTERM);
    std::_Exit(143);
  }
  std::string lost;
  for (int r = 1; r < size; ++r)
    if (!seen[static_cast<size_t>(r)]) lost += (lost.empty() ? "" : ", ") + std::to_string(r);
  std::fprintf(stderr,
               "kimi: rank 0: lost rank%s %s (the launcher is ending the job: a rank died or was killed; no "
               "word from it within %g s of the launcher's stop)\n",
               left > 1 ? "s" : "", lost.c_str(), kAliveWait);
  std::fflush(stderr);
  std::fflush(stdout);
  std::_Exit(1);
}

// mpirun --enable-recovery sets this MCA parameter in the ranks' environment
bool recovery_mode() {
  const char* v = std::getenv("OMPI_MCA_orte_enable_recovery");
  return v && (std::strcmp(v, "1") == 0 || std::strcmp(v, "true") == 0);
}

}  // namespace

bool launched_by_mpi() {
  for (const char* v : {"OMPI_COMM_WORLD_SIZE", "PMIX_RANK", "PMI_RANK", "PMI_SIZE"})
    if (std::getenv(v)) return true;
  return false;
}

struct MpiCollective::Pending {
  std::vector<MPI_Request> req;
  std::vector<int> peer;
  std::vector<char> is_recv;
  std::vector<char> done;
  int n = 0;
  // always posted: a note from another rank that the job ends
  MPI_Request abort_req = MPI_REQUEST_NULL;
  char abort_note[kAbortBytes] = {};
  void reserve(size_t cap) {
    req.resize(cap);
    peer.resize(cap);
    is_recv.resize(cap);
    done.resize(cap);
  }
  void add(MPI_Request r, int p, bool rcv) {
    req[static_cast<size_t>(n)] = r;
    peer[static_cast<size_t>(n)] = p;
    is_recv[static_cast<size_t>(n)] = rcv ? 1 : 0;
    done[static_cast<size_t>(n)] = 0;
    ++n;
  }
};

std::unique_ptr<MpiCollective> MpiCollective::init(int* argc, char*** argv) {
  int provided = 0;
  // MPI starts helper threads; they must not take the termination signals, which the program
  // handles in its own threads (e.g. the server's graceful shutdown): block them while MPI starts
  // (the new threads inherit the mask), then restore this thread's mask.
  sigset_t block, old;
  sigemptyset(&block);
  for (int sig : {SIGINT, SIGTERM, SIGHUP, SIGQUIT}) sigaddset(&block, sig);
  pthread_sigmask(SIG_BLOCK, &block, &old);
  const int rc = MPI_Init_thread(argc, argv, MPI_THREAD_MULTIPLE, &provided);
  if (rc != MPI_SUCCESS) {
    std::fprintf(stderr, "kimi: MPI_Init failed\n");
    std::exit(1);
  }
  std::unique_ptr<MpiCollective> c(new MpiCollective());
  MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
  MPI_Comm_rank(MPI_COMM_WORLD, &c->rank_);
  MPI_Comm_size(MPI_COMM_WORLD, &c->size_);
  if (const char* t = std::getenv("KIMI_MPI_TIMEOUT")) {
    char* end = nullptr;
    const double v = std::strtod(t, &end);
    if (end == t || *end != 0 || !(v > 0) || v > 86400) {
      std::fprintf(stderr, "kimi: rank %d: KIMI_MPI_TIMEOUT=%s: expected seconds in (0, 86400]\n", c->rank_, t);
      MPI_Abort(MPI_COMM_WORLD, 2);
    }
    c->timeout_s_ = v;
  }
  // the SIGTERM watcher (watch_term; it needs MPI_THREAD_MULTIPLE: it talks while the main thread
  // may be inside an exchange), started while the signals are still blocked so that it never
  // takes them itself
  if (provided >= MPI_THREAD_MULTIPLE && c->size_ > 1 && ::pipe(g_term_pipe) == 0) {
    std::thread(watch_term, c->rank_, c->size_).detach();
    struct sigaction sa {};
    sa.sa_handler = on_term;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGTERM, &sa, nullptr);
  }
  pthread_sigmask(SIG_SETMASK, &old, nullptr);
  c->pending_ = std::make_unique<Pending>();
  // a payload is at most a few 1 GiB chunks per peer; 64 requests per peer cover 32 GiB
  c->pending_->reserve(static_cast<size_t>(c->size_) * 128);
  MPI_Irecv(c->pending_->abort_note, kAbortBytes, MPI_CHAR, MPI_ANY_SOURCE, kTagAbort, MPI_COMM_WORLD,
            &c->pending_->abort_req);
  return c;
}

MpiCollective::~MpiCollective() { finalize(); }

void MpiCollective::finalize() {
  if (finalized_) return;
  finalized_ = true;
  int fin = 0;
  MPI_Finalized(&fin);
  if (fin) return;
  if (pending_ && pending_->abort_req != MPI_REQUEST_NULL) {
    MPI_Cancel(&pending_->abort_req);
    MPI_Wait(&pending_->abort_req, MPI_STATUS_IGNORE);
  }
  MPI_Finalize();
}

void MpiCollective::abort_job(const std::string& why, int code) {
  std::fprintf(stderr, "kimi: rank %d: %s\n", rank_, why.c_str());
  std::fflush(stderr);
  std::fflush(stdout);
  // Under `mpirun --enable-recovery` (docs/distributed.md) the launcher does not end the job when
  // a rank dies, and MPI_Abort then leaves mpirun's status 0: every rank that notices the loss
  // ends itself instead, so each survivor names the lost rank and the job's status is non-zero.
  if (recovery_mode()) {
    // tell every other rank (a worker may be waiting for a command without a deadline), give the
    // notes a moment to leave, then end this rank
    const std::string note = fmt::format("rank {}: {}", rank_, why).substr(0, kAbortBytes - 1);
    std::vector<MPI_Request> reqs;
    for (int r = 0; r < size_; ++r) {
      if (r == rank_) continue;
      MPI_Request q;
      if (MPI_Isend(note.c_str(), static_cast<int>(note.size()) + 1, MPI_CHAR, r, kTagAbort, MPI_COMM_WORLD, &q) ==
          MPI_SUCCESS)
        reqs.push_back(q);
    }
    const auto t0 = std::chrono::steady_clock::now();
    while (std::chrono::steady_clock::now() - t0 < std::chrono::seconds(2)) {
      int all = 0;
      if (MPI_Testall(static_cast<int>(reqs.size()), reqs.data(), &all, MPI_STATUSES_IGNORE) != MPI_SUCCESS || all)
        break;
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    std::_Exit(code);
  }
  // a moment for the other ranks to report their own errors (e.g. every rank of a job started
  // with the wrong per-rank files) before the launcher ends them
  std::this_thread::sleep_for(std::chrono::seconds(1));
  MPI_Abort(MPI_COMM_WORLD, code);
  std::_Exit(code);
}

void MpiCollective::wait_all(int n, const char* op, bool deadline) {
  Pending& p = *pending_;
  using clock = std::chrono::steady_clock;
  const auto t0 = clock::now();
  auto last_progress = t0;
  int left = n, spins = 0;
  while (left > 0) {
    bool progress = false;
    int noted = 0;
    if (MPI_Test(&p.abort_req, &noted, MPI_STATUS_IGNORE) == MPI_SUCCESS && noted) {
      p.abort_note[kAbortBytes - 1] = 0;
      std::fprintf(stderr, "kimi: rank %d: ending: %s\n", rank_, p.abort_note);
      std::fflush(stderr);
      std::_Exit(1);
    }
    for (int i = 0; i < n; ++i) {
      if (p.done[static_cast<size_t>(i)]) continue;
      int flag = 0;
      MPI_Status st;
      const int rc = MPI_Test(&p.req[static_cast<size_t>(i)], &flag, &st);
      if (rc != MPI_SUCCESS)
        abort_job(fmt::format("lost rank {} ({} {} rank {} failed: {}); ending the job", p.peer[static_cast<size_t>(i)],
                              op, p.is_recv[static_cast<size_t>(i)] ? "receive from" : "send to",
                              p.peer[static_cast<size_t>(i)], mpi_error_text(rc)));
      if (flag) {
        p.done[static_cast<size_t>(i)] = 1;
        --left;
        progress = true;
      }
    }
    if (left == 0) break;
    const auto now = clock::now();
    if (progress) {
      last_progress = now;
      spins = 0;
      continue;
    }
    if (!deadline && g_term) {  // a worker told to stop: rank 0 gets kTermGrace seconds to close
      static auto since = now;
      if (std::chrono::duration<double>(now - since).count() > kTermGrace) {
        std::fprintf(stderr, "kimi: rank %d: stopped by a signal; rank 0 did not close the model within %g s\n",
                     rank_, kTermGrace);
        std::_Exit(1);
      }
    }
    if (deadline && std::chrono::duration<double>(now - last_progress).count() > timeout_s_) {
      std::string lost;
      for (int i = 0; i < n; ++i)
        if (!p.done[static_cast<size_t>(i)] && p.is_recv[static_cast<size_t>(i)]) {
          const std::string r = std::to_string(p.peer[static_cast<size_t>(i)]);
          if (lost.find(" " + r + ",") == std::string::npos) lost += " " + r + ",";
        }
      if (lost.empty())
        for (int i = 0; i < n; ++i)
          if (!p.done[static_cast<size_t>(i)]) lost += " " + std::to_string(p.peer[static_cast<size_t>(i)]) + ",";
      lost.pop_back();
      abort_job(fmt::format("lost rank{} (no answer in {} for {:g} s; KIMI_MPI_TIMEOUT sets the limit); ending the job",
                            lost, op, timeout_s_));
    }
    // poll: spin briefly, then yield, then sleep (ranks may share cores)
    if (++spins > 200) std::this_thread::sleep_for(std::chrono::microseconds(spins > 2000 ? 500 : 20));
    else std::this_thread::yield();
  }
  stats_.seconds += std::chrono::duration<double>(clock::now() - t0).count();
  ++stats_.calls;
}

namespace {

// post one payload as chunks of at most kChunk bytes
template <class Post>
void chunks(const void* data, uint64_t bytes, Post&& post) {
  const auto* p = static_cast<const uint8_t*>(data);
  for (uint64_t o = 0; o < bytes || (bytes == 0 && o == 0); o += kChunk) {
    const uint64_t len = std::min(kChunk, bytes - o);
    post(const_cast<uint8_t*>(p + o), static_cast<int>(len));
    if (bytes == 0) break;
  }
}

}  // namespace

void MpiCollective::all_gather(const void* mine, void* all, const uint64_t* bytes) {
  Pending& p = *pending_;
  p.n = 0;
  uint64_t off = 0, my_off = 0;
  for (int r = 0; r < size_; ++r) {
    if (r == rank_) my_off = off;
    off += bytes[r];
  }
  auto* out = static_cast<uint8_t*>(all);
  if (out + my_off != mine) std::memmove(out + my_off, mine, bytes[rank_]);
  off = 0;
  for (int r = 0; r < size_; ++r) {
    if (r != rank_) {
      chunks(out + off, bytes[r], [&](uint8_t* at, int len) {
        MPI_Request q;
        MPI_Irecv(at, len, MPI_BYTE, r, kTagData, MPI_COMM_WORLD, &q);
        p.add(q, r, true);
      });
      chunks(out + my_off, bytes[rank_], [&](uint8_t* at, int len) {
        MPI_Request q;
        MPI_Isend(at, len, MPI_BYTE, r, kTagData, MPI_COMM_WORLD, &q);
        p.add(q, r, false);
      });
      stats_.bytes_sent += bytes[rank_];
      stats_.bytes_received += bytes[r];
    }
    off += bytes[r];
  }
  wait_all(p.n, "all-gather", true);
}

void MpiCollective::gather(const void* mine, void* all, const uint64_t* bytes, int root) {
  Pending& p = *pending_;
  p.n = 0;
  if (rank_ != root) {
    chunks(mine, bytes[rank_], [&](uint8_t* at, int len) {
      MPI_Request q;
      MPI_Isend(at, len, MPI_BYTE, root, kTagData, MPI_COMM_WORLD, &q);
      p.add(q, root, false);
    });
    stats_.bytes_sent += bytes[rank_];
    wait_all(p.n, "gather", true);
    return;
  }
  auto* out = static_cast<uint8_t*>(all);
  uint64_t off = 0;
  for (int r = 0; r < size_; ++r) {
    if (r == rank_) {
      if (out + off != mine) std::memmove(out + off, mine, bytes[r]);
    } else {
      chunks(out + off, bytes[r], [&](uint8_t* at, int len) {
        MPI_Request q;
        MPI_Irecv(at, len, MPI_BYTE, r, kTagData, MPI_COMM_WORLD, &q);
        p.add(q, r, true);
      });
      stats_.bytes_received += bytes[r];
    }
    off += bytes[r];
  }
  wait_all(p.n, "gather", true);
}

void MpiCollective::broadcast(void* data, uint64_t bytes, int root) { bcast(data, bytes, root, true); }

void MpiCollective::bcast(void* data, uint64_t bytes, int root, bool deadline) {
  Pending& p = *pending_;
  p.n = 0;
  if (rank_ == root) {
    for (int r = 0; r < size_; ++r)
      if (r != root) {
        chunks(data, bytes, [&](uint8_t* at, int len) {
          MPI_Request q;
          MPI_Isend(at, len, MPI_BYTE, r, kTagData, MPI_COMM_WORLD, &q);
          p.add(q, r, false);
        });
        stats_.bytes_sent += bytes;
      }
  } else {
    chunks(data, bytes, [&](uint8_t* at, int len) {
      MPI_Request q;
      MPI_Irecv(at, len, MPI_BYTE, root, kTagData, MPI_COMM_WORLD, &q);
      p.add(q, root, true);
    });
    stats_.bytes_received += bytes;
  }
  wait_all(p.n, deadline ? "broadcast" : "waiting for rank 0's next command", deadline);
}

void MpiCollective::send(const void* data, uint64_t bytes, int to) {
  Pending& p = *pending_;
  p.n = 0;
  chunks(data, bytes, [&](uint8_t* at, int len) {
    MPI_Request q;
    MPI_Isend(at, len, MPI_BYTE, to, kTagData, MPI_COMM_WORLD, &q);
    p.add(q, to, false);
  });
  stats_.bytes_sent += bytes;
  wait_all(p.n, "send", true);
}

void MpiCollective::recv(void* data, uint64_t bytes, int from) {
  Pending& p = *pending_;
  p.n = 0;
  chunks(data, bytes, [&](uint8_t* at, int len) {
    MPI_Request q;
    MPI_Irecv(at, len, MPI_BYTE, from, kTagData, MPI_COMM_WORLD, &q);
    p.add(q, from, true);
  });
  stats_.bytes_received += bytes;
  wait_all(p.n, "receive", true);
}

void MpiCollective::worker_finished() {
  std::fflush(stdout);
  std::fflush(stderr);
  finalize();
  std::_Exit(0);
}

void MpiCollective::wait_command(void* data, uint64_t bytes) {
  static bool installed = false;
  if (!installed && rank_ != 0) {
    installed = true;
    struct sigaction sa {};
    sa.sa_handler = on_term;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGTERM, &sa, nullptr);
    sigaction(SIGINT, &sa, nullptr);
  }
  bcast(data, bytes, 0, false);
}

}  // namespace kimi::dist
