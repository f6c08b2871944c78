// libFuzzer target: the HTTP/1.1 request reader of `kimi serve` (server/httpd.cpp: request line,
// header fields, Content-Length and chunked bodies, pipelining, Expect, the head check that refuses
// a request without the API key before its body is read). One HttpServer on an ephemeral loopback
// port serves the whole run; each input is sent on a new connection whose sending side is then shut
// down, and every byte the server answers is read until it closes. The first input byte picks
// whether a key is required (the head check answers 401) and the size limits. The handler echoes
// the body's size and checks it against Content-Length; a crash, a sanitizer report, a hang
// (-timeout), or a reply that is not HTTP/1.1 is a bug.
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <csignal>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <thread>

#include "common.h"
#include "server/httpd.h"

using namespace kimi;
using namespace kimi::server;

namespace {

struct Served {
  std::unique_ptr<httpd::HttpServer> s;
  std::thread t;
  int port = 0;
};

// keyed: the head check requires `x-api-key: k`
Served* start(bool keyed) {
  httpd::Options o;
  o.host = "127.0.0.1";
  o.port = 0;
  o.workers = 2;
  o.max_open = 8;
  o.max_body = 4096;
  o.max_head = 2048;
  o.max_pending = 8192;
  o.head_timeout_s = 2;
  o.body_timeout_s = 2;
  o.keep_alive_s = 2;
  o.write_timeout_s = 2;
  if (keyed)
    o.head_check = [](const httpd::Request& rq, httpd::Reply& out) {
      const std::string* k = rq.header("x-api-key");
      if (k && *k == "k") return false;
      out.status = 401;
      out.body = "no key";
      return true;
    };
  auto handler = [](const httpd::Request& rq, httpd::Responder& rs) {
    const std::string* cl = rq.header("content-length");
    // numerically: "05" is a valid Content-Length of 5 bytes (RFC 9110: 1*DIGIT)
    if (cl && std::strtoull(cl->c_str(), nullptr, 10) != rq.body.size()) fuzz::die("a body that is not its Content-Length");
    if (rq.path == "/stream") {
      rs.begin_stream(200, "text/plain");
      rs.write(rq.body);
      rs.end();
      return;
    }
    httpd::Reply r;
    r.body = std::to_string(rq.body.size());
    rs.send(r);
  };
  auto quick = [](const httpd::Request& rq, bool, bool, httpd::Reply& out) {
    if (rq.path != "/health") return false;
    out.body = "ok";
    return true;
  };
  auto* sv = new Served;
  sv->s = std::make_unique<httpd::HttpServer>(o, handler, quick);
  sv->port = sv->s->bind();
  sv->t = std::thread([sv] { sv->s->run(); });
  return sv;
}

int connect_to(int port) {
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<uint16_t>(port));
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  // the server closes first, so each connection leaves a TIME_WAIT entry for a minute: the clients
  // take their source address from 4 000 loopback addresses (127.1.x.y) in turn, so that thousands
  // of connections a second never run out of (address, port) pairs
  static uint32_t next = 0;
  for (int attempt = 0; attempt < 100; ++attempt) {
    const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in src{};
    src.sin_family = AF_INET;
    src.sin_addr.s_addr = htonl(0x7F010001u + next++ % 4000);
    (void)::bind(fd, reinterpret_cast<sockaddr*>(&src), sizeof src);
    if (::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0) return fd;
    ::close(fd);
    ::usleep(10000);  // out of local ports for a moment (thousands of connections a second)
  }
  fuzz::die("cannot connect to the server");
}

// Closes with a reset: no TIME_WAIT is left behind, so a long run does not use up the local ports.
void close_now(int fd) {
  linger l{1, 0};
  ::setsockopt(fd, SOL_SOCKET, SO_LINGER, &l, sizeof l);
  ::close(fd);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static Served* plain = [] {
    std::signal(SIGPIPE, SIG_IGN);
    return start(false);
  }();
  static Served* keyed = start(true);
  if (size == 0) return 0;
  Served* sv = data[0] & 1 ? keyed : plain;
  const std::string in(reinterpret_cast<const char*>(data + 1), size - 1);
  const int fd = connect_to(sv->port);
  // send while reading (a reply may come before the whole input is sent), then end the input
  std::string got;
  size_t sent = 0;
  bool shut = false;
  // libFuzzer's -timeout check is a SIGALRM every few seconds: it interrupts poll/send/recv on this
  // thread (EINTR), which is neither an answer nor a silence; the 10 s count is of time with no event
  // (CI once read an interrupted poll as a hung server, 2026-12-06)
  auto quiet_since = std::chrono::steady_clock::now();
  for (;;) {
    pollfd p{fd, static_cast<short>(POLLIN | (shut ? 0 : POLLOUT)), 0};
    const int r = ::poll(&p, 1, 1000);
    if (r < 0 && errno != EINTR) fuzz::die(std::string("poll failed: ") + std::strerror(errno));
    if (r <= 0) {
      if (std::chrono::steady_clock::now() - quiet_since > std::chrono::seconds(10))
        fuzz::die("the server neither reads nor answers for 10 s");
      continue;
    }
    quiet_since = std::chrono::steady_clock::now();
    if (p.revents & POLLOUT) {
      const ssize_t n = sent < in.size() ? ::send(fd, in.data() + sent, in.size() - sent, MSG_NOSIGNAL) : 0;
      if (n < 0 && errno == EINTR) continue;
      if (n > 0) sent += static_cast<size_t>(n);
      if (n < 0 || sent == in.size()) {
        ::shutdown(fd, SHUT_WR);
        shut = true;
      }
    }
    if (p.revents & (POLLIN | POLLHUP | POLLERR)) {
      char buf[8192];
      const ssize_t n = ::recv(fd, buf, sizeof buf, 0);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) break;
      got.append(buf, static_cast<size_t>(n));
    }
  }
  close_now(fd);
  if (!got.empty() && got.rfind("HTTP/1.1 ", 0) != 0) fuzz::die("a reply that is not HTTP/1.1: " + got.substr(0, 80));
  return 0;
}
