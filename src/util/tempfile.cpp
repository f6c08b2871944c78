#include "util/tempfile.h"

#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>
#if !defined(_WIN32)
#include <sys/syscall.h>
#endif

#include <atomic>
#include <cerrno>
#include <climits>
#include <cstring>
#include <filesystem>
#include <mutex>
#include <random>

#include <fmt/format.h>

#include "util/error.h"

namespace fs = std::filesystem;

namespace kimi {

namespace {

// O_EXCL already refuses a name that exists, a symbolic link included; O_NOFOLLOW says so twice
#if defined(O_NOFOLLOW)
constexpr int kNoFollow = O_NOFOLLOW;
#else
constexpr int kNoFollow = 0;
#endif

// ---- registry of live temps, read by the signal handler --------------------------------------
// A slot is free (0), being filled or emptied (1), or holds a path (2). The handler only reads
// slots in state 2, and only calls async-signal-safe functions.
struct Slot {
  std::atomic<int> state{0};
  bool dir = false;
  char path[PATH_MAX] = {};
};
constexpr int kSlots = 256;
Slot g_slots[kSlots];

// SIGPIPE too: `kimi convert ... | head` is killed by it when head exits (unless it is ignored)
constexpr int kSignals[] = {SIGINT, SIGTERM, SIGHUP, SIGPIPE};
constexpr int kNumSignals = sizeof(kSignals) / sizeof(kSignals[0]);
struct sigaction g_old[kNumSignals];
bool g_hooked[kNumSignals] = {};
std::once_flag g_install_once;

// Removes the entries directly inside directory PATH, then PATH itself (async-signal-safe: raw
// getdents64, unlinkat, rmdir; no allocation).
void remove_dir_signal_safe(const char* path) {
#if defined(_WIN32)
  // the C runtime runs signal handlers on a thread of their own, where the library may be used
  std::error_code ec;
  fs::remove_all(fs::u8path(path), ec);
#else
  int dfd = ::open(path, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dfd >= 0) {
    alignas(8) char buf[4096];
    for (int pass = 0; pass < 16; ++pass) {  // deleting while reading may skip entries: rescan
      bool removed = false;
      ::lseek(dfd, 0, SEEK_SET);
      for (;;) {
        long n = ::syscall(SYS_getdents64, dfd, buf, sizeof(buf));
        if (n <= 0) break;
        for (long off = 0; off < n;) {
          // struct linux_dirent64: u64 ino, s64 off, u16 reclen, u8 type, char name[]
          unsigned short reclen;
          std::memcpy(&reclen, buf + off + 16, sizeof(reclen));
          const char* name = buf + off + 19;
          if (!(name[0] == '.' && (name[1] == 0 || (name[1] == '.' && name[2] == 0)))) {
            if (::unlinkat(dfd, name, 0) == 0) removed = true;
          }
          off += reclen;
        }
      }
      if (!removed) break;
    }
    ::close(dfd);
  }
  ::rmdir(path);
#endif
}

void remove_all_registered() {
  for (auto& s : g_slots) {
    if (s.state.load(std::memory_order_acquire) != 2) continue;
    if (s.dir)
      remove_dir_signal_safe(s.path);
    else
      ::unlink(s.path);
  }
}

void on_signal(int sig, siginfo_t* info, void* uctx) {
  const int saved_errno = errno;
  remove_all_registered();
  for (int i = 0; i < kNumSignals; ++i) {
    if (kSignals[i] != sig || !g_hooked[i]) continue;
    const struct sigaction& old = g_old[i];
    if (old.sa_flags & SA_SIGINFO) {
      if (old.sa_sigaction) old.sa_sigaction(sig, info, uctx);
    } else if (old.sa_handler == SIG_DFL) {
      // restore the default action and re-raise: the signal is blocked while this handler runs, so
      // it is delivered (and terminates the process with the right status) when the handler returns
      ::sigaction(sig, &old, nullptr);
      ::raise(sig);
    } else if (old.sa_handler != SIG_IGN) {
      old.sa_handler(sig);
    }
  }
  errno = saved_errno;
}

void install_handlers() {
  for (int i = 0; i < kNumSignals; ++i) {
    struct sigaction old {};
    if (::sigaction(kSignals[i], nullptr, &old) != 0) continue;
    if (!(old.sa_flags & SA_SIGINFO) && old.sa_handler == SIG_IGN) continue;  // e.g. SIGHUP under nohup
    g_old[i] = old;
    g_hooked[i] = true;
    struct sigaction sa {};
    sa.sa_sigaction = on_signal;
    sa.sa_flags = SA_SIGINFO | SA_RESTART;
    sigemptyset(&sa.sa_mask);
    for (int s : kSignals) sigaddset(&sa.sa_mask, s);
    ::sigaction(kSignals[i], &sa, nullptr);
  }
}

void register_temp(const std::string& path, bool dir) {
  std::call_once(g_install_once, install_handlers);
  if (path.size() >= PATH_MAX) return;  // cannot be registered; still removed on every normal path
  for (auto& s : g_slots) {
    int expect = 0;
    if (!s.state.compare_exchange_strong(expect, 1, std::memory_order_acq_rel)) continue;
    std::memcpy(s.path, path.c_str(), path.size() + 1);
    s.dir = dir;
    s.state.store(2, std::memory_order_release);
    return;
  }
}

std::string random_suffix() {
  static std::mutex mu;
  static std::mt19937_64 rng{std::random_device{}() ^ (static_cast<uint64_t>(::getpid()) << 32)};
  std::lock_guard<std::mutex> lock(mu);
  return fmt::format("{:08x}", static_cast<uint32_t>(rng()));
}

std::string temp_name(const std::string& final_path) {
  return fmt::format("{}.kimi-tmp.{}.{}", final_path, static_cast<long>(::getpid()), random_suffix());
}

bool all_digits(std::string_view s) {
  if (s.empty() || s.size() > 10) return false;
  for (char c : s)
    if (c < '0' || c > '9') return false;
  return true;
}

// NAME is a temp of BASE: BASE.kimi-tmp.<pid>.<x> or BASE.tmp<pid>; *pid gets the pid.
bool parse_temp_name(const std::string& name, const std::string& base, long* pid) {
  if (name.size() <= base.size() || name.compare(0, base.size(), base) != 0) return false;
  std::string_view rest(name);
  rest.remove_prefix(base.size());
  std::string_view digits;
  constexpr std::string_view kNew = ".kimi-tmp.", kOld = ".tmp";
  if (rest.substr(0, kNew.size()) == kNew) {
    rest.remove_prefix(kNew.size());
    size_t dot = rest.find('.');
    if (dot == std::string_view::npos || dot + 1 >= rest.size()) return false;
    digits = rest.substr(0, dot);
  } else if (rest.substr(0, kOld.size()) == kOld) {
    digits = rest.substr(kOld.size());
  } else {
    return false;
  }
  if (!all_digits(digits)) return false;
  if (pid) *pid = std::stol(std::string(digits));
  return true;
}

bool pid_alive(long pid) {
  if (pid <= 0) return true;  // not ours to judge
  return ::kill(static_cast<pid_t>(pid), 0) == 0 || errno == EPERM;
}

}  // namespace

bool is_temp_name_of(const std::string& name, const std::string& base) { return parse_temp_name(name, base, nullptr); }

size_t remove_stale_temps(const std::string& final_path) noexcept {
  size_t n = 0;
  try {
    fs::path p(final_path);
    const std::string base = p.filename().string();
    if (base.empty()) return 0;
    fs::path dir = p.parent_path();
    if (dir.empty()) dir = ".";
    std::error_code ec;
    for (fs::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
      const std::string name = it->path().filename().string();
      long pid = 0;
      if (!parse_temp_name(name, base, &pid) || pid == ::getpid() || pid_alive(pid)) continue;
      std::error_code rec;
      if (fs::remove_all(it->path(), rec) > 0 && !rec) ++n;
    }
  } catch (...) {
  }
  return n;
}

TempFile create_temp_file(const std::string& final_path) {
  remove_stale_temps(final_path);
  for (int attempt = 0; attempt < 100; ++attempt) {
    TempFile t;
    t.path = temp_name(final_path);
    // register first: a signal between open() and registration must not leave the file behind
    register_temp(t.path, false);
    t.fd = ::open(t.path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC | kNoFollow, 0666);
    if (t.fd >= 0) return t;
    const int e = errno;
    unregister_temp(t.path);
    if (e != EEXIST) fail("cannot create '{}': {}", t.path, std::strerror(e));
  }
  fail("cannot create a temp file next to '{}': too many name collisions", final_path);
}

std::string create_temp_dir(const std::string& final_path) {
  remove_stale_temps(final_path);
  for (int attempt = 0; attempt < 100; ++attempt) {
    std::string p = temp_name(final_path);
    register_temp(p, true);
    if (::mkdir(p.c_str(), 0777) == 0) return p;
    const int e = errno;
    unregister_temp(p);
    if (e != EEXIST) fail("cannot create directory '{}': {}", p, std::strerror(e));
  }
  fail("cannot create a temp directory next to '{}': too many name collisions", final_path);
}

void unregister_temp(const std::string& path) {
  for (auto& s : g_slots) {
    if (s.state.load(std::memory_order_acquire) != 2 || path != s.path) continue;
    int expect = 2;
    if (s.state.compare_exchange_strong(expect, 1, std::memory_order_acq_rel)) {
      s.path[0] = 0;
      s.state.store(0, std::memory_order_release);
    }
    return;
  }
}

void discard_temp(const std::string& path) noexcept {
  std::error_code ec;
  fs::remove_all(path, ec);
  unregister_temp(path);
}

void commit_temp(const std::string& temp_path, const std::string& final_path) {
#if defined(_WIN32)
  // the C runtime's rename() refuses an existing target there: replace it as POSIX rename does
  if (kimi_rename_replace(temp_path.c_str(), final_path.c_str()) != 0)
#else
  if (std::rename(temp_path.c_str(), final_path.c_str()) != 0)
#endif
    fail("cannot rename '{}' to '{}': {}", temp_path, final_path, std::strerror(errno));
  unregister_temp(temp_path);
}

}  // namespace kimi
