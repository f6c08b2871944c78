// A small TCP socket layer for the HTTP server (src/server/httpd.cpp): POSIX sockets + poll() on
// Linux (and every POSIX system), Winsock 2 + WSAPoll() on Windows. Every socket it makes is
// non-blocking and not inherited by child processes. Winsock is started once, on first use.
//
//   net::ListenError why;
//   net::Socket l = net::listen_tcp("127.0.0.1", 0, 1024, &port, &why);   // kNoSocket on failure
//   net::PollFd p{l, net::kPollIn, 0};  net::poll(&p, 1, 100);
//   std::string addr; int peer_port; int err;
//   net::Socket s = net::accept(l, &addr, &peer_port, &err);
//   long n = net::recv(s, buf, sizeof buf);          // < 0: net::last_error() says why
//   net::close(s);
//
// Errors: the functions that return < 0 / kNoSocket leave the reason in net::last_error() (errno,
// or WSAGetLastError()); would_block(), interrupted() and error_text() read it portably.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>

#if !defined(_WIN32)
#include <poll.h>
#endif

namespace kimi::net {

#if defined(_WIN32)
using Socket = std::intptr_t;  // a SOCKET; INVALID_SOCKET reads as -1
struct PollFd {                // the layout of WSAPOLLFD (checked in net.cpp)
  Socket fd;
  short events;
  short revents;
};
inline constexpr short kPollIn = 0x0300;   // POLLRDNORM | POLLRDBAND
inline constexpr short kPollOut = 0x0010;  // POLLWRNORM
inline constexpr short kPollErr = 0x0001;
inline constexpr short kPollHup = 0x0002;
#else
using Socket = int;
using PollFd = ::pollfd;
inline constexpr short kPollIn = POLLIN;
inline constexpr short kPollOut = POLLOUT;
inline constexpr short kPollErr = POLLERR;
inline constexpr short kPollHup = POLLHUP;
#endif
inline constexpr Socket kNoSocket = -1;

// Starts Winsock (once per process; later calls return at once). Nothing to do elsewhere. The
// functions below call it themselves; it throws kimi::Error when Winsock cannot be started.
void startup();

// The error of the last failed call on this thread (errno or WSAGetLastError()).
int last_error();
bool would_block(int err);   // no data / no room now (EAGAIN, EWOULDBLOCK, WSAEWOULDBLOCK)
bool interrupted(int err);   // EINTR (never on Windows)
bool addr_in_use(int err);   // EADDRINUSE / WSAEADDRINUSE
bool conn_aborted(int err);  // ECONNABORTED / WSAECONNABORTED / WSAECONNRESET (from accept)
// What `err` means, in one line (strerror, or FormatMessage's text as UTF-8).
std::string error_text(int err);

struct ListenError {
  bool unresolved = false;  // the host name did not resolve (`text` is getaddrinfo's reason)
  bool in_use = false;      // the port is taken by another socket
  std::string text;         // why, in one line; empty when no address was usable at all
};
// A non-blocking listening TCP socket on the first address of host:port that works (host empty:
// every address). SO_REUSEADDR on POSIX (rebind past TIME_WAIT, never SO_REUSEPORT);
// SO_EXCLUSIVEADDRUSE on Windows (where SO_REUSEADDR would let another program take the port).
// Returns kNoSocket and fills *why on failure; *bound_port receives the port (for port 0).
Socket listen_tcp(const std::string& host, int port, int backlog, int* bound_port, ListenError* why);

// A TCP connection to host:port (a client: the tests, tools), made blocking, then switched to
// non-blocking like every other socket here. kNoSocket on failure (*err: the reason's code, or
// -1 when the host did not resolve).
Socket connect_tcp(const std::string& host, int port, int* err);

// Accepts one pending connection as a non-blocking socket, with the peer's numeric address and
// port. kNoSocket when none is pending or on error (*err: last_error()).
Socket accept(Socket listener, std::string* addr, int* port, int* err);

// send() without SIGPIPE and without blocking; the count sent, or -1 (last_error()).
long send(Socket s, const void* data, size_t n);
// recv(); the count received, 0 at end of stream, or -1 (last_error()).
long recv(Socket s, void* buf, size_t n);
// Whether the peer closed its side or the connection failed, checked without consuming input.
bool peer_closed(Socket s);
void shutdown_send(Socket s);  // no more sends (FIN), reading goes on
void close(Socket s);          // kNoSocket: nothing
// poll() / WSAPoll(); the number of entries with events, 0 on timeout, -1 on error.
int poll(PollFd* fds, size_t n, int timeout_ms);

// Wakes a thread that waits in net::poll(): add {fd(), kPollIn} to the poll set, call notify()
// from any thread, drain() after the poll reported it. A pipe on POSIX, a UDP socket that sends
// to itself on the loopback address on Windows (WSAPoll takes sockets only).
class Waker {
 public:
  Waker();  // throws kimi::Error when neither can be made
  ~Waker();
  Waker(const Waker&) = delete;
  Waker& operator=(const Waker&) = delete;
  Socket fd() const { return r_; }
  void notify();
  void drain();

 private:
  Socket r_ = kNoSocket, w_ = kNoSocket;
};

}  // namespace kimi::net
