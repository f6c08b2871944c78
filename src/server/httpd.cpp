#include "server/httpd.h"

#if defined(__GLIBC__)
#include <malloc.h>
#endif

#include <fmt/format.h>

#include <algorithm>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <mutex>
#include <thread>

#include "util/error.h"
#include "util/net.h"

namespace kimi::server::httpd {

using Clock = std::chrono::steady_clock;

namespace {

Clock::time_point after(Clock::time_point t, double s) {
  return t + std::chrono::microseconds(static_cast<int64_t>(s * 1e6));
}

char lower_ch(char c) { return c >= 'A' && c <= 'Z' ? static_cast<char>(c - 'A' + 'a') : c; }

bool ieq(std::string_view a, std::string_view b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i)
    if (lower_ch(a[i]) != lower_ch(b[i])) return false;
  return true;
}

bool is_tchar(char c) {  // RFC 9110 token characters
  if ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9')) return true;
  return std::strchr("!#$%&'*+-.^_`|~", c) != nullptr && c != 0;
}

std::string_view trim_ows(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t')) s.remove_suffix(1);
  return s;
}

// Writes all of `d` to a non-blocking socket; false when the peer is gone or no byte could be
// written for `timeout_s`.
bool send_all(net::Socket fd, std::string_view d, double timeout_s) {
  while (!d.empty()) {
    const long n = net::send(fd, d.data(), d.size());
    if (n > 0) {
      d.remove_prefix(static_cast<size_t>(n));
      continue;
    }
    const int e = n < 0 ? net::last_error() : 0;
    if (n < 0 && net::interrupted(e)) continue;
    if (n < 0 && net::would_block(e)) {
      net::PollFd p{fd, net::kPollOut, 0};
      const int r = net::poll(&p, 1, static_cast<int>(timeout_s * 1000));
      if (r < 0 && net::interrupted(net::last_error())) continue;
      if (r <= 0) return false;
      continue;
    }
    return false;
  }
  return true;
}

// Status line and headers. `length` < 0: chunked (when `chunked`) or none (until close / 204).
std::string format_head(int status, const std::string& content_type, const Headers& defaults, const Headers& extra,
                        int64_t length, bool chunked, bool close, int minor) {
  std::string h = fmt::format("HTTP/1.1 {} {}\r\n", status, reason_phrase(status));
  if (!content_type.empty()) h += "Content-Type: " + content_type + "\r\n";
  if (length >= 0) h += fmt::format("Content-Length: {}\r\n", length);
  if (chunked) h += "Transfer-Encoding: chunked\r\n";
  if (close) h += "Connection: close\r\n";
  else if (minor == 0) h += "Connection: keep-alive\r\n";
  for (const auto* hs : {&defaults, &extra})
    for (const auto& [k, v] : *hs) h += k + ": " + v + "\r\n";
  h += "\r\n";
  return h;
}

// `head_only`: the answer to a HEAD request: the headers a GET would get (Content-Length of the
// body included), no body (RFC 9110 9.3.2), so that the next response on the connection parses.
std::string format_reply(const Reply& r, const Headers& defaults, bool close, int minor, bool head_only) {
  const bool no_body = r.status == 204 || r.status == 304 || (r.status >= 100 && r.status < 200);
  std::string s = format_head(r.status, no_body ? std::string() : r.content_type, defaults, r.headers,
                              no_body ? -1 : static_cast<int64_t>(r.body.size()), false, close, minor);
  if (!no_body && !head_only) s += r.body;
  return s;
}

bool is_head(const Request& rq) { return rq.method == "HEAD"; }

}  // namespace

const char* reason_phrase(int status) {
  switch (status) {
    case 100: return "Continue";
    case 200: return "OK";
    case 204: return "No Content";
    case 400: return "Bad Request";
    case 401: return "Unauthorized";
    case 403: return "Forbidden";
    case 404: return "Not Found";
    case 405: return "Method Not Allowed";
    case 408: return "Request Timeout";
    case 411: return "Length Required";
    case 413: return "Content Too Large";
    case 417: return "Expectation Failed";
    case 429: return "Too Many Requests";
    case 431: return "Request Header Fields Too Large";
    case 500: return "Internal Server Error";
    case 501: return "Not Implemented";
    case 503: return "Service Unavailable";
    case 505: return "HTTP Version Not Supported";
    default: return status < 300 ? "OK" : status < 500 ? "Bad Request" : "Internal Server Error";
  }
}

const std::string* Request::header(std::string_view lower_name) const {
  for (const auto& [k, v] : headers)
    if (k == lower_name) return &v;
  return nullptr;
}

// ---------------------------------------------------------------------------------------------
// Responder (worker side)

Responder::Responder(net::Socket fd, const Request& req, const Headers& defaults, double write_timeout_s, bool close_after)
    : fd_(fd), req_(req), defaults_(defaults), write_timeout_s_(write_timeout_s), close_after_(close_after) {}

bool Responder::raw(std::string_view data) {
  if (failed_) return false;
  if (!send_all(fd_, data, write_timeout_s_)) failed_ = true;
  return !failed_;
}

bool Responder::send(const Reply& r) {
  if (started_) return false;
  started_ = true;
  status_ = r.status;
  return raw(format_reply(r, defaults_, close_after_, req_.minor, is_head(req_)));
}

bool Responder::begin_stream(int status, const std::string& content_type, const Headers& headers) {
  if (started_) return false;
  started_ = streaming_ = true;
  status_ = status;
  chunked_ = req_.minor >= 1;  // an HTTP/1.0 client reads the stream until the connection closes
  return raw(format_head(status, content_type, defaults_, headers, -1, chunked_, close_after_ || !chunked_, req_.minor));
}

bool Responder::write(std::string_view data) {
  if (!streaming_ || ended_) return false;
  if (data.empty() || is_head(req_)) return !failed_;  // HEAD: the head only
  if (!chunked_) return raw(data);
  std::string frame = fmt::format("{:x}\r\n", data.size());
  frame.append(data);
  frame += "\r\n";
  return raw(frame);
}

bool Responder::end() {
  if (!streaming_ || ended_) return !failed_;
  ended_ = true;
  return chunked_ && !is_head(req_) ? raw("0\r\n\r\n") : !failed_;
}

// A reset (or another socket error) is a disconnect; the end of the client's input is not: a client
// may shut down its sending side after the request (`nc -N`, some proxies) and still read the
// answer. TCP cannot tell that from a client that closed its socket until something is written, so
// the first time the end of input is seen before the answer has started, an interim
// `100 Continue` (HTTP/1.1 clients must accept 1xx responses before the final one) is written: to a
// closed socket the client's system answers with a reset, which the next call sees.
bool Responder::peer_closed() {
  if (failed_) return true;
  net::PollFd p{fd_, net::kPollIn, 0};
  if (net::poll(&p, 1, 0) > 0 && (p.revents & (net::kPollErr | net::kPollHup))) return true;
  if (!net::peer_closed(fd_)) return false;  // nothing to read, or pipelined input: still there
  if (probed_ || started_ || req_.minor < 1) return false;
  probed_ = true;
  return !raw("HTTP/1.1 100 Continue\r\n\r\n");
}

// ---------------------------------------------------------------------------------------------
// HttpServer

namespace {

struct Conn {
  net::Socket fd = net::kNoSocket;
  std::string addr;
  int port = 0;
  std::string in;    // received, not yet consumed (may hold the start of the next request)
  std::string out;   // event thread: reply bytes not yet written
  enum class St { Head, Body, Chunked, Linger } st = St::Head;
  Clock::time_point since;        // Head: start of the wait for this request; Body: end of the head
  Clock::time_point out_since;    // first unwritten byte of `out`
  Clock::time_point heard;        // Linger: when the client last sent a bulk of data
  uint64_t heard_bytes = 0;       // Linger: dropped since `heard`
  bool close_after_out = false;   // linger + close once `out` is written
  bool peer_eof = false;          // the client shut down its sending side (it may still read)
  Request req;                    // the request being read
  uint64_t body_len = 0;
  bool keep_alive = true;
  // chunked request body
  uint64_t ck_left = 0;
  bool ck_data = false, ck_trailer = false;
  std::unique_ptr<Reply> early;  // the answer of Options::head_check to this request's head
  // bytes this connection holds for a request still arriving (counted against Options::max_pending)
  size_t pending() const { return st == St::Linger ? 0 : in.size() + req.body.size(); }
  void release() {  // give the buffers back (clear() keeps their capacity)
    std::string().swap(in);
    std::string().swap(req.body);
  }
};

enum class Step { More, Ready, Error };

}  // namespace

struct HttpServer::Impl {
  Options o;
  Handler handler;
  QuickHandler quick;
  Logger logger;
  net::Socket listen_fd = net::kNoSocket;
  net::Waker waker;
  int port = -1;
  std::atomic<int> busy{0};
  std::atomic<bool> draining{false}, stopping{false};

  std::mutex mu;
  std::condition_variable cv;
  std::deque<std::unique_ptr<Conn>> work;      // complete requests for the workers
  std::vector<std::unique_ptr<Conn>> returned;  // connections handed back by workers
  bool workers_exit = false;
  std::vector<std::thread> workers;

  std::vector<std::unique_ptr<Conn>> conns;   // event thread only
  Clock::time_point accept_pause_until{};     // out of file descriptors: stop polling the listener briefly

  void wake() { waker.notify(); }
  Reply error(int status, const std::string& msg) const {
    if (o.error_reply) return o.error_reply(status, msg);
    Reply r;
    r.status = status;
    r.content_type = "text/plain";
    r.body = msg + "\n";
    return r;
  }
  void log(const Request& rq, int status) {
    if (logger) logger(rq, status);
  }

  // event thread
  void loop();
  void accept_all();
  bool read_some(Conn& c);
  void process(std::unique_ptr<Conn>& c);
  // after process(): a connection whose client ended its input and that has nothing left to answer
  // or write is closed (its requests were all answered; a partial one can never complete)
  void close_if_ended(std::unique_ptr<Conn>& c) {
    if (c && c->fd >= 0 && c->peer_eof && c->out.empty() && c->st != Conn::St::Linger) close_conn(*c);
  }
  Step advance(Conn& c, int* status, std::string* msg);
  int open_count() const {
    int n = 0;
    for (const auto& c : conns) n += c && c->fd >= 0;
    return n;
  }
  bool evict_one();
  void bound_pending();
  Step parse_head(Conn& c, int* status, std::string* msg);
  Step read_chunked(Conn& c, int* status, std::string* msg);
  void queue_reply(Conn& c, const Reply& r, bool close);
  void flush(Conn& c);
  void start_linger(Conn& c);
  void close_conn(Conn& c);
  void check_deadlines(Conn& c, Clock::time_point now);

  void worker();
};

HttpServer::HttpServer(Options o, Handler handler, QuickHandler quick, Logger logger) : impl_(std::make_unique<Impl>()) {
  impl_->o = std::move(o);
  impl_->handler = std::move(handler);
  impl_->quick = std::move(quick);
  impl_->logger = std::move(logger);
}

HttpServer::~HttpServer() {
  Impl& I = *impl_;
  {
    std::lock_guard<std::mutex> lk(I.mu);
    I.workers_exit = true;
  }
  I.cv.notify_all();
  for (auto& t : I.workers)
    if (t.joinable()) t.join();
  for (auto& c : I.conns)
    if (c) net::close(c->fd);
  for (auto& c : I.returned)
    if (c) net::close(c->fd);
  net::close(I.listen_fd);
}

int HttpServer::busy() const { return impl_->busy.load(); }

int HttpServer::bind() {
  Impl& I = *impl_;
  check(I.listen_fd < 0, "HttpServer::bind() called twice");
  net::ListenError why;
  I.listen_fd = net::listen_tcp(I.o.host, I.o.port, 1024, &I.port, &why);
  check(!why.unresolved, "cannot listen on {}:{}: the address cannot be resolved ({})", I.o.host, I.o.port, why.text);
  if (why.in_use) why.text += " (another process is listening on this port; choose another with --port)";
  check(I.listen_fd != net::kNoSocket, "cannot listen on {}:{}: {}", I.o.host, I.o.port,
        why.text.empty() ? "no usable address" : why.text);
  return I.port;
}

void HttpServer::drain() {
  impl_->draining.store(true);
  impl_->wake();
}

void HttpServer::stop() {
  impl_->stopping.store(true);
  impl_->wake();
}

void HttpServer::run() {
  Impl& I = *impl_;
  check(I.listen_fd >= 0, "HttpServer::run() before bind()");
  {
    std::lock_guard<std::mutex> lk(I.mu);
    I.workers_exit = false;
  }
  for (int i = 0; i < std::max(1, I.o.workers); ++i) I.workers.emplace_back([&I] { I.worker(); });
  I.loop();
  {
    std::lock_guard<std::mutex> lk(I.mu);
    I.workers_exit = true;
  }
  I.cv.notify_all();
  for (auto& t : I.workers) t.join();
  I.workers.clear();
  for (auto& c : I.conns)
    if (c) I.close_conn(*c);
  I.conns.clear();
  std::lock_guard<std::mutex> lk(I.mu);
  for (auto& c : I.returned) I.close_conn(*c);
  I.returned.clear();
  net::close(I.listen_fd);
  I.listen_fd = net::kNoSocket;
}

void HttpServer::Impl::close_conn(Conn& c) {
  net::close(c.fd);
  c.fd = net::kNoSocket;
}

void HttpServer::Impl::queue_reply(Conn& c, const Reply& r, bool close) {
  if (c.out.empty()) c.out_since = Clock::now();
  c.out += format_reply(r, o.default_headers, close, c.req.minor, is_head(c.req));
  if (close) c.close_after_out = true;
}

void HttpServer::Impl::start_linger(Conn& c) {
  // the reply is written: stop sending, then read and drop what the client still sends for a
  // moment, so that closing with unread input does not reset the connection before the client
  // has read the reply
  net::shutdown_send(c.fd);
  c.st = Conn::St::Linger;
  c.release();
  c.since = c.heard = Clock::now();
  c.heard_bytes = 0;
}

void HttpServer::Impl::flush(Conn& c) {
  while (!c.out.empty()) {
    const long n = net::send(c.fd, c.out.data(), c.out.size());
    if (n > 0) {
      c.out.erase(0, static_cast<size_t>(n));
      c.out_since = Clock::now();
      continue;
    }
    const int e = n < 0 ? net::last_error() : 0;
    if (n < 0 && net::interrupted(e)) continue;
    if (n < 0 && net::would_block(e)) return;
    close_conn(c);
    return;
  }
  if (c.close_after_out && c.st != Conn::St::Linger) start_linger(c);
}

// Reads what is available; false when the connection is finished (EOF or error).
bool HttpServer::Impl::read_some(Conn& c) {
  char buf[65536];
  for (int i = 0; i < 16; ++i) {  // at most 1 MiB per wake-up: the other connections get their turn
    const long n = net::recv(c.fd, buf, sizeof buf);
    if (n > 0) {
      if (c.st != Conn::St::Linger) c.in.append(buf, static_cast<size_t>(n));
      else if ((c.heard_bytes += static_cast<uint64_t>(n)) >= (64u << 10)) {
        c.heard = Clock::now();  // still uploading in bulk (a refused body): keep draining
        c.heard_bytes = 0;
      }
      if (static_cast<size_t>(n) < sizeof buf) return true;
      continue;
    }
    if (n == 0) {  // end of input: what is buffered may still be a whole request to answer
      c.peer_eof = true;
      return c.st != Conn::St::Linger && !c.in.empty();
    }
    const int e = net::last_error();
    if (net::interrupted(e)) continue;
    return net::would_block(e);
  }
  return true;
}

// At max_open: closes the connection that has waited the longest, idle ones (keep-alive, lingering)
// first, then requests still arriving (a slow client), never one whose reply is being written.
// False when there is none (every connection is writing a reply).
bool HttpServer::Impl::evict_one() {
  Conn* v = nullptr;
  int v_rank = 0;
  for (auto& c : conns) {
    if (!c || c->fd < 0 || !c->out.empty()) continue;
    const bool idle = c->st == Conn::St::Linger || (c->st == Conn::St::Head && c->in.empty());
    const int rank = idle ? 0 : 1;
    if (!v || rank < v_rank || (rank == v_rank && c->since < v->since)) {
      v = c.get();
      v_rank = rank;
    }
  }
  if (!v) return false;
  close_conn(*v);
  return true;
}

// Keeps the bytes buffered by requests still arriving under max_pending: beyond it, the request
// that has been arriving the longest is refused (503, closed) and its buffers are freed.
void HttpServer::Impl::bound_pending() {
  const size_t cap = o.max_pending ? o.max_pending : std::max<size_t>(32 * o.max_body, size_t{256} << 20);
  size_t total = 0;
  for (const auto& c : conns)
    if (c && c->fd >= 0) total += c->pending();
  while (total > cap) {
    Conn* v = nullptr;
    for (auto& c : conns)
      if (c && c->fd >= 0 && c->out.empty() && c->st != Conn::St::Linger && (!c->in.empty() || !c->req.body.empty()) &&
          (!v || c->since < v->since))
        v = c.get();
    if (!v) return;
    total -= v->pending();
    v->release();
    Reply r = error(503, "the server holds too many partly received requests; retry later");
    r.headers.emplace_back("Retry-After", "1");
    queue_reply(*v, r, true);
    log(v->req, 503);
    flush(*v);
  }
}

void HttpServer::Impl::accept_all() {
  for (;;) {
    std::string addr;
    int port = 0, e = 0;
    const net::Socket fd = net::accept(listen_fd, &addr, &port, &e);
    if (fd == net::kNoSocket) {
      if (net::interrupted(e) || net::conn_aborted(e)) continue;
      // out of descriptors (EMFILE, ENFILE) or memory: the pending connection stays in the backlog;
      // leave the listener alone for a moment instead of spinning on it
      if (!net::would_block(e)) accept_pause_until = after(Clock::now(), 0.1);
      return;
    }
    if (open_count() >= o.max_open && !evict_one()) {
      const std::string s = format_reply(error(503, "too many open connections"), o.default_headers, true, 1, false);
      [[maybe_unused]] long n = net::send(fd, s.data(), s.size());
      net::close(fd);
      continue;
    }
    auto c = std::make_unique<Conn>();
    c->fd = fd;
    c->port = port;
    c->addr = std::move(addr);
    c->since = Clock::now();
    conns.push_back(std::move(c));
  }
}

Step HttpServer::Impl::parse_head(Conn& c, int* status, std::string* msg) {
  auto err = [&](int s, std::string m) {
    *status = s;
    *msg = std::move(m);
    return Step::Error;
  };
  size_t skip = 0;  // empty lines before a request line are ignored (RFC 9112 2.2)
  while (skip + 1 < c.in.size() && c.in[skip] == '\r' && c.in[skip + 1] == '\n') skip += 2;
  if (skip) c.in.erase(0, skip);
  const size_t end = c.in.find("\r\n\r\n");
  if (end == std::string::npos) {
    if (c.in.size() > o.max_head) return err(431, fmt::format("the request head is larger than {} bytes", o.max_head));
    return Step::More;
  }
  if (end + 4 > o.max_head) return err(431, fmt::format("the request head is larger than {} bytes", o.max_head));
  const std::string_view head(c.in.data(), end);
  Request& rq = c.req;
  rq = Request{};
  rq.remote_addr = c.addr;
  rq.remote_port = c.port;
  size_t le = head.find("\r\n");
  const std::string_view line = head.substr(0, le);
  // request line: METHOD SP target SP HTTP/1.x
  const size_t s1 = line.find(' ');
  const size_t s2 = s1 == std::string_view::npos ? s1 : line.find(' ', s1 + 1);
  if (s2 == std::string_view::npos || line.find(' ', s2 + 1) != std::string_view::npos)
    return err(400, "malformed request line (expected: METHOD TARGET HTTP/1.1)");
  const std::string_view method = line.substr(0, s1), target = line.substr(s1 + 1, s2 - s1 - 1),
                         version = line.substr(s2 + 1);
  if (method.empty() || !std::all_of(method.begin(), method.end(), is_tchar)) return err(400, "malformed request method");
  if (target.empty() || std::any_of(target.begin(), target.end(), [](char ch) { return static_cast<unsigned char>(ch) <= 0x20 || ch == 0x7f; }))
    return err(400, "malformed request target");
  if (version == "HTTP/1.1") rq.minor = 1;
  else if (version == "HTTP/1.0") rq.minor = 0;
  else if (version.substr(0, 5) == "HTTP/") return err(505, fmt::format("HTTP version '{}' is not supported (1.0, 1.1)", version));
  else return err(400, "malformed request line (expected: METHOD TARGET HTTP/1.1)");
  rq.method = method;
  rq.target = target;
  const size_t q = target.find('?');
  rq.path = target.substr(0, q);
  if (q != std::string_view::npos) rq.query = target.substr(q + 1);
  // header fields
  bool have_cl = false, chunked = false;
  uint64_t cl = 0;
  c.keep_alive = rq.minor >= 1;
  bool expect_continue = false;
  while (le != std::string_view::npos) {
    const size_t b = le + 2;
    le = head.find("\r\n", b);
    const std::string_view f = head.substr(b, le == std::string_view::npos ? std::string_view::npos : le - b);
    if (f.empty()) continue;
    if (f[0] == ' ' || f[0] == '\t') return err(400, "obsolete header line folding is not accepted");
    const size_t colon = f.find(':');
    if (colon == std::string_view::npos || colon == 0) return err(400, "malformed header line (expected Name: value)");
    const std::string_view name = f.substr(0, colon);
    if (!std::all_of(name.begin(), name.end(), is_tchar)) return err(400, "malformed header name");
    const std::string_view value = trim_ows(f.substr(colon + 1));
    if (std::any_of(value.begin(), value.end(), [](char ch) { return (static_cast<unsigned char>(ch) < 0x20 && ch != '\t') || ch == 0x7f; }))
      return err(400, "control character in a header value");
    std::string lname(name);
    for (char& ch : lname) ch = lower_ch(ch);
    if (lname == "content-length") {
      // digits only: "-5", "+5", "5 5" and values of 2^64 or more are refused
      if (value.empty() || value.size() > 19 || !std::all_of(value.begin(), value.end(), [](char ch) { return ch >= '0' && ch <= '9'; }))
        return err(400, fmt::format("invalid Content-Length '{}' (expected a decimal byte count)", value.substr(0, 40)));
      const uint64_t v = std::stoull(std::string(value));
      if (have_cl && v != cl) return err(400, "conflicting Content-Length headers");
      have_cl = true;
      cl = v;
    } else if (lname == "transfer-encoding") {
      if (!ieq(value, "chunked"))
        return err(501, fmt::format("Transfer-Encoding '{}' is not supported (only chunked)", value.substr(0, 40)));
      if (rq.minor == 0) return err(400, "Transfer-Encoding in an HTTP/1.0 request");
      chunked = true;
    } else if (lname == "connection") {
      std::string_view v = value;
      while (!v.empty()) {
        const size_t cm = v.find(',');
        const std::string_view tok = trim_ows(v.substr(0, cm));
        if (ieq(tok, "close")) c.keep_alive = false;
        else if (ieq(tok, "keep-alive") && rq.minor == 0) c.keep_alive = true;
        v = cm == std::string_view::npos ? std::string_view() : v.substr(cm + 1);
      }
    } else if (lname == "expect") {
      if (!ieq(value, "100-continue")) return err(417, fmt::format("unsupported expectation '{}'", value.substr(0, 40)));
      expect_continue = true;
    }
    rq.headers.emplace_back(std::move(lname), std::string(value));
  }
  if (have_cl && chunked) return err(400, "both Content-Length and Transfer-Encoding given");
  c.in.erase(0, end + 4);
  if (o.head_check) {  // before any of the body is read or stored
    Reply r;
    bool refused = false;
    try {
      refused = o.head_check(rq, r);
    } catch (const std::exception& e) {
      r = error(500, std::string("internal error: ") + e.what());
      refused = true;
    }
    if (refused) {
      c.early = std::make_unique<Reply>(std::move(r));
      return err(c.early->status, "");
    }
  }
  if (have_cl && cl > o.max_body)
    return err(413, fmt::format("request body too large ({} bytes; the limit is {})", cl, o.max_body));
  c.since = Clock::now();  // from here the body deadline runs
  if (chunked) {
    c.st = Conn::St::Chunked;
    c.ck_left = 0;
    c.ck_data = c.ck_trailer = false;
  } else {
    c.st = Conn::St::Body;
    c.body_len = have_cl ? cl : 0;
  }
  if (expect_continue && (chunked || c.in.size() < c.body_len)) {
    if (c.out.empty()) c.out_since = Clock::now();
    c.out += "HTTP/1.1 100 Continue\r\n\r\n";
  }
  return Step::More;
}

Step HttpServer::Impl::read_chunked(Conn& c, int* status, std::string* msg) {
  auto err = [&](int s, std::string m) {
    *status = s;
    *msg = std::move(m);
    return Step::Error;
  };
  std::string& body = c.req.body;
  for (;;) {
    if (c.ck_data) {
      const size_t take = static_cast<size_t>(std::min<uint64_t>(c.ck_left, c.in.size()));
      body.append(c.in, 0, take);
      c.in.erase(0, take);
      c.ck_left -= take;
      if (c.ck_left > 0 || c.in.size() < 2) return Step::More;
      if (c.in.compare(0, 2, "\r\n") != 0) return err(400, "malformed chunked body (no CRLF after a chunk)");
      c.in.erase(0, 2);
      c.ck_data = false;
    }
    if (c.ck_trailer) {  // trailer fields (ignored) up to an empty line
      if (c.in.compare(0, 2, "\r\n") == 0) {
        c.in.erase(0, 2);
        return Step::Ready;
      }
      const size_t e = c.in.find("\r\n\r\n");
      if (e == std::string::npos) {
        if (c.in.size() > o.max_head) return err(431, "chunked body trailer too large");
        return Step::More;
      }
      c.in.erase(0, e + 4);
      return Step::Ready;
    }
    const size_t e = c.in.find("\r\n");
    if (e == std::string::npos) {
      if (c.in.size() > 1024) return err(400, "malformed chunked body (chunk size line too long)");
      return Step::More;
    }
    size_t i = 0;
    uint64_t n = 0;
    while (i < e && i < 16 && std::isxdigit(static_cast<unsigned char>(c.in[i]))) {
      const char ch = lower_ch(c.in[i]);
      n = n * 16 + static_cast<uint64_t>(ch <= '9' ? ch - '0' : ch - 'a' + 10);
      ++i;
    }
    if (i == 0 || i >= 16 || (i < e && c.in[i] != ';' && c.in[i] != ' ' && c.in[i] != '\t'))
      return err(400, "malformed chunked body (bad chunk size)");
    c.in.erase(0, e + 2);
    if (n == 0) {
      c.ck_trailer = true;
      continue;
    }
    if (body.size() + n > o.max_body)
      return err(413, fmt::format("request body too large (more than the limit of {} bytes)", o.max_body));
    c.ck_left = n;
    c.ck_data = true;
  }
}

Step HttpServer::Impl::advance(Conn& c, int* status, std::string* msg) {
  if (c.st == Conn::St::Head) {
    const Step s = parse_head(c, status, msg);
    if (s == Step::Error || c.st == Conn::St::Head) return s;
  }
  if (c.st == Conn::St::Body) {
    if (c.in.size() < c.body_len) return Step::More;
    if (c.in.size() == c.body_len) {
      c.req.body.swap(c.in);  // the usual case: no copy of a large body
      c.in.clear();
    } else {
      c.req.body.assign(c.in, 0, static_cast<size_t>(c.body_len));
      c.in.erase(0, static_cast<size_t>(c.body_len));
    }
    return Step::Ready;
  }
  if (c.st == Conn::St::Chunked) return read_chunked(c, status, msg);
  return Step::More;
}

// Parses and answers (or dispatches) the complete requests buffered on `c`; c becomes null when
// the connection went to a worker.
void HttpServer::Impl::process(std::unique_ptr<Conn>& c) {
  while (c && c->fd >= 0 && c->out.empty() && c->st != Conn::St::Linger) {
    int status = 0;
    std::string msg;
    const Step s = advance(*c, &status, &msg);
    if (s == Step::More) break;
    if (s == Step::Error) {
      const Reply r = c->early ? std::move(*c->early) : error(status, msg);
      c->early.reset();
      c->release();
      queue_reply(*c, r, true);
      log(c->req, r.status);
      break;
    }
    // a complete request
    c->st = Conn::St::Head;
    c->since = Clock::now();
    const bool free = busy.load() < o.workers;
    const bool drain = draining.load() || stopping.load();
    Reply r;
    bool answered = false;
    try {
      answered = quick && quick(c->req, free, drain, r);
    } catch (const std::exception& e) {  // never let the event thread die
      r = error(500, std::string("internal error: ") + e.what());
      answered = true;
    }
    if (!answered && (drain || !free)) {
      r = drain ? error(503, "server is shutting down") : error(503, "too many concurrent requests");
      answered = true;
    }
    if (answered) {
      queue_reply(*c, r, !c->keep_alive || drain);
      log(c->req, r.status);
      c->req = Request{};
      flush(*c);
      continue;
    }
    busy.fetch_add(1);
    {
      std::lock_guard<std::mutex> lk(mu);
      work.push_back(std::move(c));
    }
    cv.notify_one();
  }
  if (c && c->fd >= 0 && !c->out.empty()) flush(*c);
}

void HttpServer::Impl::check_deadlines(Conn& c, Clock::time_point now) {
  if (c.fd < 0) return;
  if (!c.out.empty()) {  // a client that does not read its replies
    if (now > after(c.out_since, o.write_timeout_s)) close_conn(c);
    return;
  }
  switch (c.st) {
    case Conn::St::Linger:
      // a client still uploading the body we refused gets 2 s per 64 KiB, 30 s in all, to finish
      // before the close (a close with unread input resets the connection, and the client may lose
      // the reply it has not read yet); one that trickles is closed after 2 s
      if (now > after(c.heard, 2.0) || now > after(c.since, 30.0)) close_conn(c);
      return;
    case Conn::St::Head:
      if (c.in.empty()) {
        if (now > after(c.since, o.keep_alive_s)) close_conn(c);  // idle: close quietly
        return;
      }
      if (now > after(c.since, o.head_timeout_s)) {
        c.req = Request{};
        queue_reply(c, error(408, fmt::format("the request head was not received within {} s", o.head_timeout_s)), true);
        log(c.req, 408);
        flush(c);
      }
      return;
    case Conn::St::Body:
    case Conn::St::Chunked:
      if (now > after(c.since, o.body_timeout_s)) {
        queue_reply(c, error(408, fmt::format("the request body was not received within {} s", o.body_timeout_s)), true);
        log(c.req, 408);
        flush(c);
      }
      return;
  }
}

void HttpServer::Impl::loop() {
  std::vector<net::PollFd> pfd;
  const size_t in_cap = o.max_body + o.max_head + (1u << 20);
  for (;;) {
    std::vector<std::unique_ptr<Conn>> back;
    {
      std::lock_guard<std::mutex> lk(mu);
      back.swap(returned);
    }
    for (auto& c : back) {
      if (c->st == Conn::St::Linger) {
        c->since = Clock::now();
      } else {
        c->since = Clock::now();
        process(c);  // pipelined requests already buffered
        close_if_ended(c);
      }
      if (c) conns.push_back(std::move(c));
    }
    if (stopping.load()) break;
    if (draining.load() && busy.load() == 0) {
      std::lock_guard<std::mutex> lk(mu);
      if (work.empty() && returned.empty()) break;
    }
    pfd.clear();
    pfd.push_back({waker.fd(), net::kPollIn, 0});
    pfd.push_back({listen_fd, static_cast<short>(Clock::now() < accept_pause_until ? 0 : net::kPollIn), 0});
    for (auto& c : conns) {
      short ev = 0;
      if (!c->out.empty()) ev = net::kPollOut;
      else if (c->st == Conn::St::Linger || c->in.size() < in_cap) ev = net::kPollIn;
      pfd.push_back({c->fd, ev, 0});
    }
    const int n = net::poll(pfd.data(), pfd.size(), 100);
    if (n < 0) {
      const int e = net::last_error();
      if (!net::interrupted(e)) fail("kimi serve: poll failed: {}", net::error_text(e));
    }
    if (n > 0) {
      if (pfd[0].revents) waker.drain();
      for (size_t i = 0; i < conns.size(); ++i) {
        auto& c = conns[i];
        const short re = pfd[i + 2].revents;
        if (!c || !re || c->fd < 0) continue;
        if (re & net::kPollOut) {
          flush(*c);
          if (c->fd >= 0 && c->out.empty() && c->st != Conn::St::Linger) process(c);
          continue;
        }
        if (re & (net::kPollIn | net::kPollHup | net::kPollErr)) {
          if (!read_some(*c)) {
            close_conn(*c);  // the client closed (or reset): drop what it left half-sent
            continue;
          }
          if (c->st != Conn::St::Linger) {
            process(c);
            close_if_ended(c);
          }
        }
      }
      if (pfd[1].revents & net::kPollIn) accept_all();
    }
    bound_pending();
    const auto now = Clock::now();
    for (auto& c : conns)
      if (c) check_deadlines(*c, now);
    conns.erase(std::remove_if(conns.begin(), conns.end(), [](const auto& c) { return !c || c->fd < 0; }), conns.end());
  }
}

namespace {
constexpr size_t kTrimAbove = 16u << 20;  // freed heap held by the allocator that is worth a malloc_trim
// Bytes the allocator holds free in all its arenas (0 where that cannot be asked).
size_t heap_held_free() {
#if defined(__GLIBC__) && (__GLIBC__ > 2 || (__GLIBC__ == 2 && __GLIBC_MINOR__ >= 33))
  const struct mallinfo2 mi = ::mallinfo2();
  return mi.fordblks;
#else
  return 0;
#endif
}
}  // namespace

void HttpServer::Impl::worker() {
  for (;;) {
    std::unique_ptr<Conn> c;
    {
      std::unique_lock<std::mutex> lk(mu);
      cv.wait(lk, [&] { return workers_exit || !work.empty(); });
      if (work.empty()) return;
      c = std::move(work.front());
      work.pop_front();
    }
    const bool keep = c->keep_alive && !draining.load() && !stopping.load();
    Responder rs(c->fd, c->req, o.default_headers, o.write_timeout_s, !keep);
    try {
      handler(c->req, rs);
    } catch (const std::exception& e) {
      if (!rs.started()) rs.send(error(500, std::string("internal error: ") + e.what()));
    } catch (...) {
      if (!rs.started()) rs.send(error(500, "internal error"));
    }
    if (!rs.started()) rs.send(error(500, "internal error: no response"));
    rs.end();
    log(c->req, rs.status());
    const bool big = c->req.body.size() >= (1u << 20) || c->in.capacity() >= (1u << 20);
    c->req = Request{};
    if (big) std::string(c->in).swap(c->in);
    // give the memory of a large request back to the system: glibc keeps freed heap in its arenas
    // (one per thread that allocated), so a 4 MB body, a 10 000-value enum grammar or the matcher
    // states of a long constrained answer would otherwise stay resident after the request
    if (big || heap_held_free() >= kTrimAbove) {
#if defined(__GLIBC__)
      ::malloc_trim(0);
#endif
    }
    if (rs.close_after() || draining.load() || stopping.load()) {
      if (rs.failed()) {
        close_conn(*c);
        c.reset();
      } else {
        start_linger(*c);
      }
    }
    {
      std::lock_guard<std::mutex> lk(mu);
      if (c) returned.push_back(std::move(c));
    }
    busy.fetch_sub(1);
    wake();
  }
}

}  // namespace kimi::server::httpd
