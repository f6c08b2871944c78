// Windows (MinGW-w64) only: the few POSIX names kimi.cpp uses that the MinGW C runtime lacks.
// CMakeLists.txt force-includes this header into every translation unit of a Windows build and puts
// include/ (sys/mman.h, sys/resource.h, sys/wait.h, sys/syscall.h) on the include path, so the
// portable code keeps one spelling. The functions are in posix_win32.cpp. Files are opened in
// binary mode by default (posix_win32.cpp sets the C runtime's _fmode at start-up, and the build
// links MinGW's binmode.o). Never included elsewhere.
#pragma once
#if defined(_WIN32)
#include <errno.h>
#include <fcntl.h>
#include <direct.h>
#include <io.h>
#include <process.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/types.h>
#ifdef __cplusplus
#include <pthread.h>  // before the sigwait / pthread_kill names below
extern "C" {
#endif

#ifndef O_CLOEXEC
#define O_CLOEXEC _O_NOINHERIT
#endif
#define O_NONBLOCK 0  // regular files only: FIFOs do not exist on Windows
#define O_NOCTTY 0
#define O_DIRECTORY 0
#ifndef S_ISSOCK
#define S_ISSOCK(m) 0
#endif
#define F_GETFL 3
#define F_SETFL 4
int fcntl(int fd, int cmd, ...);  // F_GETFL / F_SETFL on a file: 0 (no flags to change)
int fsync(int fd);                // _commit
#define _SC_PAGESIZE 30
#define _SC_NPROCESSORS_ONLN 84
#define _SC_PHYS_PAGES 85
long sysconf(int name);
// only sig 0 (is the process alive): 0, or -1 with ESRCH; an int pid (MinGW has no pid_t without _POSIX)
int kill(int pid, int sig);
// The identity of an existing file or directory (UTF-8 path): volume serial + file index; 0 on
// success (util/paths.cpp, where stat() has no inode on Windows).
int kimi_file_id(const char* path, unsigned long long* dev, unsigned long long* ino);
// rename(from, to) replacing an existing file `to` (MoveFileExW, MOVEFILE_REPLACE_EXISTING); 0 on success.
int kimi_rename_replace(const char* from, const char* to);

// Signals the C runtime does not have: never raised on Windows, so a handler for them is never run.
#define SIGHUP 1
#define SIGKILL 9
#define SIGPIPE 13
#define SA_SIGINFO 4
#define SA_RESTART 0x10000000
typedef _sigset_t sigset_t;  // sys/types.h declares it only under _POSIX
#define SIG_BLOCK 0
#define SIG_UNBLOCK 1
#define SIG_SETMASK 2
typedef struct {
  int si_signo;
} siginfo_t;
struct sigaction {
  void (*sa_handler)(int);
  void (*sa_sigaction)(int, siginfo_t*, void*);
  sigset_t sa_mask;
  int sa_flags;
};
// sigaction over the C runtime's signal(): SIGINT (Ctrl-C), SIGTERM, SIGBREAK. The runtime runs the
// handler on a thread of its own and resets it to SIG_DFL first; posix_win32.cpp re-installs it.
int sigaction(int sig, const struct sigaction* sa, struct sigaction* old);
int sigemptyset(sigset_t* set);
int sigaddset(sigset_t* set, int sig);
// sigwait for SIGINT / SIGTERM: waits until one arrives, or until kimi_pthread_kill wakes it.
int kimi_sigwait(const sigset_t* set, int* sig);
int kimi_pthread_kill(pthread_t t, int sig);
#undef sigwait
#define sigwait kimi_sigwait
#define pthread_kill kimi_pthread_kill

#ifdef __cplusplus
}
inline int mkdir(const char* path, int /*mode*/) { return _mkdir(path); }
#endif
#endif  // _WIN32
