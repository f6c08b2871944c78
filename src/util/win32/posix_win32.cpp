// Windows (MinGW-w64) implementations of the POSIX names declared in posix_shim.h and
// include/sys/*.h. Compiled to nothing elsewhere.
#if defined(_WIN32)
#ifndef NOMINMAX
#define NOMINMAX
#endif
#ifndef WIN32_LEAN_AND_MEAN
#define WIN32_LEAN_AND_MEAN
#endif
#include <windows.h>
#include <psapi.h>

#include <sys/mman.h>
#include <sys/resource.h>

#include <atomic>
#include <condition_variable>
#include <csignal>
#include <cstdarg>
#include <mutex>
#include <string>

namespace {

// ---- signals over the C runtime's signal() ----
constexpr int kMaxSig = 32;
struct Handler {
  void (*plain)(int) = SIG_DFL;
  void (*info)(int, siginfo_t*, void*) = nullptr;
};
Handler g_handlers[kMaxSig];

void trampoline(int sig) {
  if (sig < 0 || sig >= kMaxSig) return;
  std::signal(sig, trampoline);  // the runtime reset it to SIG_DFL before calling us
  const Handler h = g_handlers[sig];
  if (h.info) {
    siginfo_t si{sig};
    h.info(sig, &si, nullptr);
  } else if (h.plain != SIG_DFL && h.plain != SIG_IGN) {
    h.plain(sig);
  }
}

bool runtime_signal(int sig) { return sig == SIGINT || sig == SIGTERM || sig == SIGBREAK || sig == SIGABRT; }

// ---- sigwait ----
std::mutex g_wait_mu;
std::condition_variable g_wait_cv;
int g_pending = 0;  // a signal that arrived, or -1: woken by kimi_pthread_kill

void post(int sig) {
  {
    std::lock_guard<std::mutex> lock(g_wait_mu);
    g_pending = sig;
  }
  g_wait_cv.notify_all();
}
void on_waited_signal(int sig) {
  std::signal(sig, on_waited_signal);
  post(sig);
}

// Console events while a sigwait() waits (`kimi serve`): Ctrl-C is SIGINT; Ctrl-Break, closing the
// console window, log-off and shutdown are SIGTERM. Handled here (ahead of the C runtime's
// handler, which knows Ctrl-C and Ctrl-Break only, and whose SIGBREAK would end the process).
std::atomic<unsigned> g_waited{0};  // the signals of the sigwait() set (stays set, as a blocked mask would)
BOOL WINAPI on_console_event(DWORD ev) {
  const int sig = ev == CTRL_C_EVENT ? SIGINT : SIGTERM;
  if (!(g_waited.load() & (1u << sig))) return FALSE;  // not waited for: the next handler decides
  post(sig);
  // the process ends as soon as this returns from a close / log-off / shutdown event: leave the
  // server the time Windows grants (about 5 s) to shut down; its exit ends this thread
  if (ev == CTRL_CLOSE_EVENT || ev == CTRL_LOGOFF_EVENT || ev == CTRL_SHUTDOWN_EVENT) ::Sleep(INFINITE);
  return TRUE;
}

// A UTF-8 string as UTF-16 for the wide Windows API (empty when it is not valid UTF-8).
std::wstring widen(const char* s) {
  const int n = ::MultiByteToWideChar(CP_UTF8, 0, s, -1, nullptr, 0);
  if (n <= 0) return std::wstring();
  std::wstring w(static_cast<size_t>(n), L'\0');
  ::MultiByteToWideChar(CP_UTF8, 0, s, -1, w.data(), n);
  w.resize(static_cast<size_t>(n - 1));
  return w;
}

// The console shows what the program writes as UTF-8 (the text kimi prints is UTF-8); the
// application manifest (kimi.manifest) makes the ANSI API, argv and file names UTF-8 too.
struct ConsoleUtf8 {  // and binary files
  ConsoleUtf8() {
    _fmode = _O_BINARY;  // open() without _O_TEXT/_O_BINARY: binary (text mode turns \n into \r\n)
    ::SetConsoleOutputCP(CP_UTF8);
    ::SetConsoleCP(CP_UTF8);
  }
} g_console_utf8;

}  // namespace

extern "C" {

// MinGW-w64's round / roundf round the largest float below 0.5 (0.49999997f) up to 1: they add 0.5
// first. The quantizers use roundf (ggml's rule: half away from zero), so these replace them;
// x - trunc(x) is exact, and infinities and NaN pass through.
float roundf(float x) {
  const float t = __builtin_truncf(x);
  return __builtin_fabsf(x - t) >= 0.5f ? t + __builtin_copysignf(1.0f, x) : t;
}
double round(double x) {
  const double t = __builtin_trunc(x);
  return __builtin_fabs(x - t) >= 0.5 ? t + __builtin_copysign(1.0, x) : t;
}

int fcntl(int fd, int cmd, ...) {
  if (_get_osfhandle(fd) == -1) {
    errno = EBADF;
    return -1;
  }
  return 0;
}

int fsync(int fd) { return _commit(fd); }

long sysconf(int name) {
  SYSTEM_INFO si;
  ::GetSystemInfo(&si);
  switch (name) {
    case _SC_PAGESIZE: return static_cast<long>(si.dwPageSize);
    case _SC_NPROCESSORS_ONLN: return static_cast<long>(si.dwNumberOfProcessors);
    case _SC_PHYS_PAGES: {
      MEMORYSTATUSEX ms{};
      ms.dwLength = sizeof ms;
      if (!::GlobalMemoryStatusEx(&ms)) return -1;
      return static_cast<long>(ms.ullTotalPhys / si.dwPageSize);
    }
    default: errno = EINVAL; return -1;
  }
}

int kill(int pid, int sig) {
  if (sig != 0) {
    errno = EINVAL;
    return -1;
  }
  HANDLE h = ::OpenProcess(PROCESS_QUERY_LIMITED_INFORMATION, FALSE, static_cast<DWORD>(pid));
  if (!h) {
    errno = ::GetLastError() == ERROR_ACCESS_DENIED ? EPERM : ESRCH;
    return -1;
  }
  DWORD code = 0;
  const bool alive = ::GetExitCodeProcess(h, &code) && code == STILL_ACTIVE;
  ::CloseHandle(h);
  if (alive) return 0;
  errno = ESRCH;
  return -1;
}

int kimi_file_id(const char* path, unsigned long long* dev, unsigned long long* ino) {
  const std::wstring w = widen(path);
  if (w.empty()) return -1;
  HANDLE h = ::CreateFileW(w.c_str(), 0, FILE_SHARE_READ | FILE_SHARE_WRITE | FILE_SHARE_DELETE, nullptr,
                           OPEN_EXISTING, FILE_FLAG_BACKUP_SEMANTICS, nullptr);
  if (h == INVALID_HANDLE_VALUE) return -1;
  BY_HANDLE_FILE_INFORMATION fi{};
  const bool ok = ::GetFileInformationByHandle(h, &fi);
  ::CloseHandle(h);
  if (!ok) return -1;
  *dev = fi.dwVolumeSerialNumber;
  *ino = (static_cast<unsigned long long>(fi.nFileIndexHigh) << 32) | fi.nFileIndexLow;
  return 0;
}

int kimi_rename_replace(const char* from, const char* to) {
  if (::MoveFileExW(widen(from).c_str(), widen(to).c_str(), MOVEFILE_REPLACE_EXISTING | MOVEFILE_COPY_ALLOWED)) return 0;
  errno = ::GetLastError() == ERROR_ACCESS_DENIED ? EACCES : ENOENT;
  return -1;
}

int sigemptyset(sigset_t* set) {
  *set = 0;
  return 0;
}
int sigaddset(sigset_t* set, int sig) {
  if (sig <= 0 || sig >= kMaxSig) {
    errno = EINVAL;
    return -1;
  }
  *set |= sigset_t(1) << sig;
  return 0;
}

int sigaction(int sig, const struct sigaction* sa, struct sigaction* old) {
  if (sig <= 0 || sig >= kMaxSig || !runtime_signal(sig)) {
    errno = EINVAL;
    return -1;
  }
  Handler& h = g_handlers[sig];
  if (old) {
    *old = {};
    old->sa_handler = h.plain;
    old->sa_sigaction = h.info;
    old->sa_flags = h.info ? SA_SIGINFO : 0;
  }
  if (!sa) return 0;
  h = {};
  if (sa->sa_flags & SA_SIGINFO) {
    h.info = sa->sa_sigaction;
    std::signal(sig, trampoline);
  } else if (sa->sa_handler == SIG_DFL || sa->sa_handler == SIG_IGN) {
    h.plain = sa->sa_handler;
    std::signal(sig, sa->sa_handler);
  } else {
    h.plain = sa->sa_handler;
    std::signal(sig, trampoline);
  }
  return 0;
}

int kimi_sigwait(const sigset_t* set, int* sig) {
  for (int s : {SIGINT, SIGTERM, SIGBREAK})
    if (*set & (sigset_t(1) << s)) std::signal(s, on_waited_signal);
  g_waited.fetch_or(static_cast<unsigned>(*set & ((sigset_t(1) << SIGINT) | (sigset_t(1) << SIGTERM))));
  static std::once_flag console_handler;
  std::call_once(console_handler, [] { ::SetConsoleCtrlHandler(on_console_event, TRUE); });
  std::unique_lock<std::mutex> lock(g_wait_mu);
  g_wait_cv.wait(lock, [] { return g_pending != 0; });
  *sig = g_pending > 0 ? g_pending : SIGTERM;
  g_pending = 0;
  return 0;
}

int kimi_pthread_kill(pthread_t, int sig) {
  if (sig != 0) post(-1);
  return 0;
}

void* mmap(void*, size_t len, int, int, int fd, long long off) {
  const HANDLE file = reinterpret_cast<HANDLE>(_get_osfhandle(fd));
  if (file == INVALID_HANDLE_VALUE) {
    errno = EBADF;
    return MAP_FAILED;
  }
  HANDLE map = ::CreateFileMappingW(file, nullptr, PAGE_READONLY, 0, 0, nullptr);
  if (!map) {
    errno = EACCES;
    return MAP_FAILED;
  }
  void* p = ::MapViewOfFile(map, FILE_MAP_READ, static_cast<DWORD>(static_cast<unsigned long long>(off) >> 32),
                            static_cast<DWORD>(off & 0xffffffffu), len);
  ::CloseHandle(map);  // the view keeps the mapping alive
  if (!p) {
    errno = ENOMEM;
    return MAP_FAILED;
  }
  return p;
}

int munmap(void* addr, size_t) { return ::UnmapViewOfFile(addr) ? 0 : -1; }

int madvise(void*, size_t, int) { return 0; }  // a hint only

int getrusage(int, struct rusage* ru) {
  FILETIME c, e, k, u;
  *ru = {};
  if (!::GetProcessTimes(::GetCurrentProcess(), &c, &e, &k, &u)) return -1;
  auto to_tv = [](const FILETIME& ft, struct timeval* tv) {
    const unsigned long long t = (static_cast<unsigned long long>(ft.dwHighDateTime) << 32) | ft.dwLowDateTime;
    tv->tv_sec = static_cast<long>(t / 10000000ull);
    tv->tv_usec = static_cast<long>(t % 10000000ull / 10);
  };
  to_tv(u, &ru->ru_utime);
  to_tv(k, &ru->ru_stime);
  PROCESS_MEMORY_COUNTERS pmc{};
  if (::GetProcessMemoryInfo(::GetCurrentProcess(), &pmc, sizeof pmc))
    ru->ru_maxrss = static_cast<long>(pmc.PeakWorkingSetSize / 1024);
  return 0;
}

}  // extern "C"
#endif  // _WIN32
