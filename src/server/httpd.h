// A small HTTP/1.1 server for `kimi serve` (replaces cpp-httplib's server side).
//
// Why our own: cpp-httplib 0.11 gives every connection a worker thread from the moment it is
// accepted, with a per-read timeout only, so a few dozen clients that trickle their request head one
// byte at a time hold every worker (and /health) for as long as they like; it sets SO_REUSEPORT (two
// servers share a port), loses pipelined requests, and waits on a negative Content-Length. Here
//
//  * one event thread (poll, or WSAPoll on Windows: util/net.h) accepts connections and reads
//    request heads and bodies for all of them, without blocking, each against a deadline (whole
//    head: head_timeout_s, whole body: body_timeout_s, idle keep-alive: keep_alive_s); a late
//    client gets 408 and is closed;
//  * only a complete request goes to one of `workers` handler threads, which writes the response
//    (whole or chunked) and hands the connection back; bytes of the next request that came in the
//    same read stay buffered, so pipelined requests are answered in order;
//  * cheap requests (/health, errors, 503 when every worker is busy or the server drains) are
//    answered on the event thread itself, so they are answered whatever the workers are doing;
//  * the listening socket has SO_REUSEADDR only: a port in use is an error, whoever holds it;
//  * a request's head is checked (Options::head_check: the API key) before its body is read: a
//    refused request is answered at once and its body is never stored (read and dropped while the
//    connection closes);
//  * memory held by requests still arriving is bounded: all their buffered bytes together stay
//    under Options::max_pending (beyond it the connection that has been arriving the longest gets
//    503 and is closed), and at max_open connections a new one takes the place of the idle or
//    unfinished connection that has waited the longest, so slow clients never lock out new ones;
//  * a HEAD request is answered with the headers its GET would have (Content-Length included),
//    never a body, whatever the status.
//
//   httpd::Options o;  o.port = 0;
//   httpd::HttpServer s(o, handler, quick);
//   int port = s.bind();
//   std::thread t([&] { s.run(); });     // returns after drain() once no handler is running
//   ...  s.drain();  t.join();
#pragma once
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "util/net.h"

namespace kimi::server::httpd {

using Headers = std::vector<std::pair<std::string, std::string>>;

struct Request {
  std::string method, target, path, query;  // target = path [? query]
  int minor = 1;                            // HTTP/1.<minor>
  Headers headers;                          // names lower-cased, in order
  std::string body;
  std::string remote_addr;
  int remote_port = 0;
  // The value of a header (name in lower case); nullptr when absent.
  const std::string* header(std::string_view lower_name) const;
};

// A complete, small response (what the event thread can send without blocking).
struct Reply {
  int status = 200;
  std::string content_type = "application/json";
  std::string body;
  Headers headers;
};

// Handed to a worker's handler: send() one whole response, or begin_stream() + write()* + end().
class Responder {
 public:
  Responder(net::Socket fd, const Request& req, const Headers& defaults, double write_timeout_s, bool close_after);
  bool send(const Reply& r);
  bool begin_stream(int status, const std::string& content_type, const Headers& headers = {});
  bool write(std::string_view data);  // false: the peer is gone or stopped reading (write timeout)
  bool end();
  // The client is gone: a reset or a failed write (checked without reading). The end of its input
  // alone is not (a half-closed client still reads the answer); before the answer has started it
  // is probed once with an interim `100 Continue` (HTTP/1.1), which a closed socket answers with a
  // reset.
  bool peer_closed();
  bool started() const { return started_; }
  bool failed() const { return failed_; }
  int status() const { return status_; }
  // the connection cannot carry another request: asked to close, a write failed, or a stream that
  // is not chunked (HTTP/1.0) or was not ended
  bool close_after() const { return close_after_ || failed_ || (streaming_ && (!chunked_ || !ended_)); }

 private:
  bool raw(std::string_view data);
  std::string head(int status, const std::string& content_type, const Headers& headers, const std::string* length);
  net::Socket fd_;
  const Request& req_;
  const Headers& defaults_;
  double write_timeout_s_;
  bool close_after_;
  bool started_ = false, streaming_ = false, chunked_ = false, ended_ = false, failed_ = false, probed_ = false;
  int status_ = 0;
};

struct Options {
  std::string host = "127.0.0.1";
  int port = 8080;                 // 0: ephemeral
  int workers = 64;                // requests handled concurrently (handler threads)
  int max_open = 1024;             // open connections (beyond: 503 and close)
  size_t max_body = 8u << 20;      // bytes (beyond: 413)
  size_t max_head = 64u << 10;     // request line + headers (beyond: 431)
  double head_timeout_s = 10;      // whole request head
  double body_timeout_s = 60;      // whole request body
  double keep_alive_s = 5;         // idle connection between requests
  double write_timeout_s = 30;     // no progress writing a response
  size_t max_pending = 0;          // bytes received of all requests still arriving (0: max(32 x max_body, 256 MiB))
  Headers default_headers;         // added to every response (CORS)
  // Body of the replies the server makes itself (malformed request, 408, 413, 503, ...).
  std::function<Reply(int status, const std::string& message)> error_reply;
  // Runs on the event thread once a request's head is parsed (Request::body still empty), before
  // any of the body is read; must not block. Returning true answers with `out` at once and closes
  // the connection: the body is never stored (e.g. a missing API key: 401).
  std::function<bool(const Request&, Reply& out)> head_check;
};

// Runs on a worker thread for every complete request the quick handler did not answer.
using Handler = std::function<void(const Request&, Responder&)>;
// Runs on the event thread first; must not block. Returns true when it answered into `out`.
// `workers_free`: false when every handler thread is busy; `draining`: drain() was called.
using QuickHandler = std::function<bool(const Request&, bool workers_free, bool draining, Reply& out)>;
// Called once per answered request (any thread), for logs and metrics.
using Logger = std::function<void(const Request&, int status)>;

class HttpServer {
 public:
  HttpServer(Options o, Handler handler, QuickHandler quick, Logger logger = nullptr);
  ~HttpServer();
  HttpServer(const HttpServer&) = delete;
  HttpServer& operator=(const HttpServer&) = delete;

  int bind();      // throws kimi::Error naming the address and the reason; returns the port
  void run();      // serves until drain() and no handler is running, or stop()
  void drain();    // keep answering (503 via the quick handler), return from run() once idle
  void stop();     // return from run() now (handlers still running are waited for)
  int busy() const;  // requests handed to handler threads and not yet answered

  struct Impl;

 private:
  std::unique_ptr<Impl> impl_;
};

// Reason phrase for a status code ("OK", "Bad Request", ...).
const char* reason_phrase(int status);

}  // namespace kimi::server::httpd
