#include "util/net.h"

#if defined(_WIN32)
#include <winsock2.h>
#include <ws2tcpip.h>
#include <windows.h>
#else
#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>
#endif

#include <cerrno>
#include <climits>
#include <cstddef>
#include <cstring>
#include <mutex>

#include "util/error.h"

namespace kimi::net {

namespace {

#if defined(_WIN32)
static_assert(sizeof(Socket) == sizeof(SOCKET) && static_cast<Socket>(INVALID_SOCKET) == kNoSocket);
static_assert(sizeof(PollFd) == sizeof(WSAPOLLFD) && offsetof(PollFd, events) == offsetof(WSAPOLLFD, events) &&
              offsetof(PollFd, revents) == offsetof(WSAPOLLFD, revents));
static_assert(kPollIn == POLLIN && kPollOut == POLLOUT && kPollErr == POLLERR && kPollHup == POLLHUP);

SOCKET native(Socket s) { return static_cast<SOCKET>(s); }

// Non-blocking, and not inherited by the processes this one starts.
void prepare(SOCKET s) {
  u_long one = 1;
  ::ioctlsocket(s, FIONBIO, &one);
  ::SetHandleInformation(reinterpret_cast<HANDLE>(s), HANDLE_FLAG_INHERIT, 0);
}

int clamp_len(size_t n) { return n > static_cast<size_t>(INT_MAX) ? INT_MAX : static_cast<int>(n); }
#else
void set_nonblock(int fd) { ::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL, 0) | O_NONBLOCK); }
void set_cloexec(int fd) { ::fcntl(fd, F_SETFD, ::fcntl(fd, F_GETFD, 0) | FD_CLOEXEC); }
#endif

}  // namespace

void startup() {
#if defined(_WIN32)
  static std::once_flag once;
  static int rc = 0;
  std::call_once(once, [] {
    WSADATA d;
    rc = ::WSAStartup(MAKEWORD(2, 2), &d);
  });
  check(rc == 0, "cannot start Windows sockets (WSAStartup): {}", error_text(rc));
#endif
}

int last_error() {
#if defined(_WIN32)
  return ::WSAGetLastError();
#else
  return errno;
#endif
}

bool would_block(int err) {
#if defined(_WIN32)
  return err == WSAEWOULDBLOCK;
#else
  return err == EAGAIN || err == EWOULDBLOCK;
#endif
}

bool interrupted(int err) {
#if defined(_WIN32)
  return err == WSAEINTR;
#else
  return err == EINTR;
#endif
}

bool addr_in_use(int err) {
#if defined(_WIN32)
  return err == WSAEADDRINUSE || err == WSAEACCES;  // WSAEACCES: held with SO_EXCLUSIVEADDRUSE
#else
  return err == EADDRINUSE;
#endif
}

bool conn_aborted(int err) {
#if defined(_WIN32)
  return err == WSAECONNABORTED || err == WSAECONNRESET;
#else
  return err == ECONNABORTED;
#endif
}

std::string error_text(int err) {
#if defined(_WIN32)
  wchar_t* w = nullptr;
  const DWORD n = ::FormatMessageW(
      FORMAT_MESSAGE_ALLOCATE_BUFFER | FORMAT_MESSAGE_FROM_SYSTEM | FORMAT_MESSAGE_IGNORE_INSERTS, nullptr,
      static_cast<DWORD>(err), 0, reinterpret_cast<wchar_t*>(&w), 0, nullptr);
  std::string s;
  if (n > 0 && w) {
    const int len = ::WideCharToMultiByte(CP_UTF8, 0, w, static_cast<int>(n), nullptr, 0, nullptr, nullptr);
    if (len > 0) {
      s.resize(static_cast<size_t>(len));
      ::WideCharToMultiByte(CP_UTF8, 0, w, static_cast<int>(n), s.data(), len, nullptr, nullptr);
    }
  }
  if (w) ::LocalFree(w);
  while (!s.empty() && (s.back() == '\r' || s.back() == '\n' || s.back() == ' ' || s.back() == '.')) s.pop_back();
  if (s.empty()) return "Windows socket error " + std::to_string(err);
  return s + " (" + std::to_string(err) + ")";
#else
  return std::strerror(err);
#endif
}

Socket listen_tcp(const std::string& host, int port, int backlog, int* bound_port, ListenError* why) {
  startup();
  *why = ListenError{};
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV;
  addrinfo* res = nullptr;
  const std::string port_s = std::to_string(port);
  const int gai = ::getaddrinfo(host.empty() ? nullptr : host.c_str(), port_s.c_str(), &hints, &res);
  if (gai != 0) {
    why->unresolved = true;
#if defined(_WIN32)
    why->text = error_text(gai);  // getaddrinfo returns a Winsock error code
#else
    why->text = ::gai_strerror(gai);
#endif
    return kNoSocket;
  }
  Socket l = kNoSocket;
  for (addrinfo* a = res; a; a = a->ai_next) {
#if defined(_WIN32)
    const SOCKET s = ::socket(a->ai_family, a->ai_socktype, a->ai_protocol);
    if (s == INVALID_SOCKET) {
      why->text = error_text(last_error());
      continue;
    }
    // Windows' SO_REUSEADDR lets another socket bind a port in use; SO_EXCLUSIVEADDRUSE is what
    // makes a taken port an error here (rebinding past TIME_WAIT works without an option)
    const BOOL one = TRUE;
    ::setsockopt(s, SOL_SOCKET, SO_EXCLUSIVEADDRUSE, reinterpret_cast<const char*>(&one), sizeof one);
    if (::bind(s, a->ai_addr, static_cast<int>(a->ai_addrlen)) != 0 || ::listen(s, backlog) != 0) {
      const int e = last_error();
      why->text = error_text(e);
      why->in_use = addr_in_use(e);
      ::closesocket(s);
      continue;
    }
    prepare(s);
    l = static_cast<Socket>(s);
#else
#ifdef SOCK_CLOEXEC
    const int fd = ::socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, a->ai_protocol);
#else
    const int fd = ::socket(a->ai_family, a->ai_socktype, a->ai_protocol);
    if (fd >= 0) set_cloexec(fd);
#endif
    if (fd < 0) {
      why->text = std::strerror(errno);
      continue;
    }
    // SO_REUSEADDR only (rebinding while old connections sit in TIME_WAIT). No SO_REUSEPORT: with
    // it a second server on the same port would start and share the connections.
    const int one = 1;
    ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    if (::bind(fd, a->ai_addr, a->ai_addrlen) != 0 || ::listen(fd, backlog) != 0) {
      const int e = errno;
      why->text = std::strerror(e);
      why->in_use = addr_in_use(e);
      ::close(fd);
      continue;
    }
    set_nonblock(fd);
    l = fd;
#endif
    why->text.clear();
    why->in_use = false;
    break;
  }
  ::freeaddrinfo(res);
  if (l == kNoSocket) return kNoSocket;
  sockaddr_storage ss{};
  socklen_t sl = sizeof ss;
#if defined(_WIN32)
  ::getsockname(native(l), reinterpret_cast<sockaddr*>(&ss), &sl);
#else
  ::getsockname(l, reinterpret_cast<sockaddr*>(&ss), &sl);
#endif
  *bound_port = ss.ss_family == AF_INET6 ? ntohs(reinterpret_cast<sockaddr_in6*>(&ss)->sin6_port)
                                         : ntohs(reinterpret_cast<sockaddr_in*>(&ss)->sin_port);
  return l;
}

Socket connect_tcp(const std::string& host, int port, int* err) {
  startup();
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_NUMERICSERV;
  addrinfo* res = nullptr;
  const std::string port_s = std::to_string(port);
  if (::getaddrinfo(host.c_str(), port_s.c_str(), &hints, &res) != 0) {
    *err = -1;
    return kNoSocket;
  }
  Socket out = kNoSocket;
  *err = 0;
  for (addrinfo* a = res; a && out == kNoSocket; a = a->ai_next) {
#if defined(_WIN32)
    const SOCKET s = ::socket(a->ai_family, a->ai_socktype, a->ai_protocol);
    if (s == INVALID_SOCKET) {
      *err = last_error();
      continue;
    }
    if (::connect(s, a->ai_addr, static_cast<int>(a->ai_addrlen)) != 0) {
      *err = last_error();
      ::closesocket(s);
      continue;
    }
    prepare(s);
    out = static_cast<Socket>(s);
#else
    const int fd = ::socket(a->ai_family, a->ai_socktype, a->ai_protocol);
    if (fd < 0) {
      *err = errno;
      continue;
    }
    if (::connect(fd, a->ai_addr, a->ai_addrlen) != 0) {
      *err = errno;
      ::close(fd);
      continue;
    }
    set_nonblock(fd);
    set_cloexec(fd);
    out = fd;
#endif
  }
  ::freeaddrinfo(res);
  return out;
}

Socket accept(Socket listener, std::string* addr, int* port, int* err) {
  sockaddr_storage ss{};
  socklen_t sl = sizeof ss;
#if defined(_WIN32)
  const SOCKET s = ::accept(native(listener), reinterpret_cast<sockaddr*>(&ss), &sl);
  if (s == INVALID_SOCKET) {
    *err = last_error();
    return kNoSocket;
  }
  prepare(s);
  const Socket fd = static_cast<Socket>(s);
#elif defined(__linux__)
  const int fd = ::accept4(listener, reinterpret_cast<sockaddr*>(&ss), &sl, SOCK_NONBLOCK | SOCK_CLOEXEC);
  if (fd < 0) {
    *err = errno;
    return kNoSocket;
  }
#else
  const int fd = ::accept(listener, reinterpret_cast<sockaddr*>(&ss), &sl);
  if (fd < 0) {
    *err = errno;
    return kNoSocket;
  }
  set_nonblock(fd);
  set_cloexec(fd);
#endif
  char host[INET6_ADDRSTRLEN] = {0};
  *port = 0;
  if (ss.ss_family == AF_INET) {
    auto* a = reinterpret_cast<sockaddr_in*>(&ss);
    ::inet_ntop(AF_INET, &a->sin_addr, host, sizeof host);
    *port = ntohs(a->sin_port);
  } else if (ss.ss_family == AF_INET6) {
    auto* a = reinterpret_cast<sockaddr_in6*>(&ss);
    ::inet_ntop(AF_INET6, &a->sin6_addr, host, sizeof host);
    *port = ntohs(a->sin6_port);
  }
  *addr = host;
  return fd;
}

long send(Socket s, const void* data, size_t n) {
#if defined(_WIN32)
  return ::send(native(s), static_cast<const char*>(data), clamp_len(n), 0);
#elif defined(MSG_NOSIGNAL)
  return static_cast<long>(::send(s, data, n, MSG_NOSIGNAL | MSG_DONTWAIT));
#else  // macOS: SO_NOSIGPIPE would be needed; SIGPIPE is ignored by `kimi serve`
  return static_cast<long>(::send(s, data, n, MSG_DONTWAIT));
#endif
}

long recv(Socket s, void* buf, size_t n) {
#if defined(_WIN32)
  return ::recv(native(s), static_cast<char*>(buf), clamp_len(n), 0);
#else
  return static_cast<long>(::recv(s, buf, n, 0));
#endif
}

bool peer_closed(Socket s) {
  char c;
#if defined(_WIN32)
  const int n = ::recv(native(s), &c, 1, MSG_PEEK);  // the socket is non-blocking
#else
  const ssize_t n = ::recv(s, &c, 1, MSG_PEEK | MSG_DONTWAIT);
#endif
  if (n > 0) return false;
  if (n == 0) return true;
  const int e = last_error();
  return !(would_block(e) || interrupted(e));
}

void shutdown_send(Socket s) {
#if defined(_WIN32)
  ::shutdown(native(s), SD_SEND);
#else
  ::shutdown(s, SHUT_WR);
#endif
}

void close(Socket s) {
  if (s == kNoSocket) return;
#if defined(_WIN32)
  ::closesocket(native(s));
#else
  ::close(s);
#endif
}

int poll(PollFd* fds, size_t n, int timeout_ms) {
#if defined(_WIN32)
  return ::WSAPoll(reinterpret_cast<WSAPOLLFD*>(fds), static_cast<ULONG>(n), timeout_ms);
#else
  return ::poll(fds, static_cast<nfds_t>(n), timeout_ms);
#endif
}

Waker::Waker() {
#if defined(_WIN32)
  startup();
  const SOCKET s = ::socket(AF_INET, SOCK_DGRAM, IPPROTO_UDP);
  check(s != INVALID_SOCKET, "kimi serve: cannot create a wake-up socket: {}", error_text(last_error()));
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  int al = sizeof a;
  if (::bind(s, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0 ||
      ::getsockname(s, reinterpret_cast<sockaddr*>(&a), &al) != 0 ||
      ::connect(s, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) {
    const int e = last_error();
    ::closesocket(s);
    fail("kimi serve: cannot set up a wake-up socket on 127.0.0.1: {}", error_text(e));
  }
  prepare(s);
  r_ = w_ = static_cast<Socket>(s);
#else
  int p[2];
#if defined(__linux__)
  const int rc = ::pipe2(p, O_NONBLOCK | O_CLOEXEC);
#else
  const int rc = ::pipe(p);
  if (rc == 0)
    for (int fd : p) set_nonblock(fd), set_cloexec(fd);
#endif
  check(rc == 0, "kimi serve: cannot create a pipe: {}", std::strerror(errno));
  r_ = p[0];
  w_ = p[1];
#endif
}

Waker::~Waker() {
  close(r_);
  if (w_ != r_) close(w_);
}

void Waker::notify() {
  const char c = 1;
#if defined(_WIN32)
  ::send(native(w_), &c, 1, 0);
#else
  [[maybe_unused]] ssize_t n = ::write(w_, &c, 1);
#endif
}

void Waker::drain() {
  char buf[256];
#if defined(_WIN32)
  while (::recv(native(r_), buf, sizeof buf, 0) > 0) {
  }
#else
  while (::read(r_, buf, sizeof buf) > 0) {
  }
#endif
}

}  // namespace kimi::net
