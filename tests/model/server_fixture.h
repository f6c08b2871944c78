// In-process `kimi serve` on an ephemeral port for the server tests (the tiny synthetic model),
// with small HTTP helpers (cpp-httplib client).
#pragma once
#include <gtest/gtest.h>
#include <httplib.h>

#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "model/model.h"
#include "runtime/context.h"
#include "server/api.h"
#include "server/server.h"
#include "test_util.h"

namespace kimi::test {

using server::ojson;

inline server::ServerOptions server_opts() {
  server::ServerOptions o;
  o.model_path = tiny_gguf();
  o.port = 0;
  o.threads = 2;
  o.ctx = 1024;
  o.precision = "f32";
  o.sched.parallel = 4;
  o.sched.chunk = 64;
  o.grace_s = 5;
  return o;
}

struct RunningServer {
  explicit RunningServer(const server::ServerOptions& o) : s(std::make_unique<server::Server>(o)) {
    port = s->bind();
    t = std::thread([this] { s->run(); });
  }
  ~RunningServer() {
    s->shutdown();
    t.join();
  }
  httplib::Client client() const {
    httplib::Client c("127.0.0.1", port);
    c.set_read_timeout(60, 0);
    return c;
  }
  // POST a body; returns the parsed JSON (discarded when not JSON) and the status.
  ojson post(const std::string& path, const std::string& body, int* status = nullptr,
             const std::string& content_type = "application/json") const {
    auto c = client();
    auto res = c.Post(path.c_str(), body, content_type.c_str());
    EXPECT_TRUE(res) << "no response for " << path;
    if (!res) return {};
    if (status) *status = res->status;
    return ojson::parse(res->body, nullptr, false);
  }
  ojson post(const std::string& path, const ojson& body, int* status = nullptr) const {
    return post(path, body.dump(), status);
  }
  ojson get(const std::string& path, int* status = nullptr) const {
    auto c = client();
    auto res = c.Get(path.c_str());
    EXPECT_TRUE(res) << "no response for " << path;
    if (!res) return {};
    if (status) *status = res->status;
    return ojson::parse(res->body, nullptr, false);
  }
  // POST a streaming request; returns the raw SSE body.
  std::string post_stream(const std::string& path, const ojson& body) const {
    auto c = client();
    auto res = c.Post(path.c_str(), body.dump(), "application/json");
    EXPECT_TRUE(res) << "no response for " << path;
    return res ? res->body : std::string();
  }
  std::unique_ptr<server::Server> s;
  int port = 0;
  std::thread t;
};

// Raw sockets, for what an HTTP client library hides (pipelining, HEAD, slow and half-sent requests).
inline int raw_connect(int port) {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<uint16_t>(port));
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) {
    ::close(fd);
    return -1;
  }
  return fd;
}

inline bool raw_send(int fd, const std::string& s) {
  return ::send(fd, s.data(), s.size(), MSG_NOSIGNAL) == static_cast<ssize_t>(s.size());
}

// Reads until `done(got)` or EOF or `timeout`; *eof tells whether the server closed.
inline std::string raw_read(int fd, std::chrono::milliseconds timeout, const std::function<bool(const std::string&)>& done,
                     bool* eof = nullptr) {
  std::string got;
  const auto end = std::chrono::steady_clock::now() + timeout;
  if (eof) *eof = false;
  while (!done(got)) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(end - std::chrono::steady_clock::now());
    if (left.count() <= 0) break;
    pollfd p{fd, POLLIN, 0};
    if (::poll(&p, 1, static_cast<int>(left.count())) <= 0) break;
    char buf[65536];
    const ssize_t n = ::recv(fd, buf, sizeof buf, 0);
    if (n <= 0) {
      if (eof) *eof = true;
      break;
    }
    got.append(buf, static_cast<size_t>(n));
  }
  return got;
}

// Splits complete HTTP/1.1 responses (Content-Length bodies) off the front of `s`; the i-th
// response has no body when head_only[i] (the answer to a HEAD request, whose Content-Length is
// the size of the body a GET would get).
struct RawResponse {
  int status = 0;
  std::string head, body;
};
inline std::vector<RawResponse> split_responses(const std::string& s, const std::vector<bool>& head_only = {}) {
  std::vector<RawResponse> out;
  size_t p = 0;
  for (;;) {
    const size_t e = s.find("\r\n\r\n", p);
    if (e == std::string::npos) break;
    RawResponse r;
    r.head = s.substr(p, e - p);
    r.status = std::atoi(r.head.c_str() + 9);
    size_t len = 0;
    std::string lower = r.head;
    for (char& c : lower) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    const size_t cl = lower.find("content-length:");
    if (cl != std::string::npos) len = std::stoul(lower.substr(cl + 15));
    if (out.size() < head_only.size() && head_only[out.size()]) len = 0;
    if (s.size() < e + 4 + len) break;
    r.body = s.substr(e + 4, len);
    out.push_back(r);
    p = e + 4 + len;
  }
  return out;
}

// The file checksum of docs/server.md "Slot files": h = 0x9E3779B97F4A7C15, then for every 64-bit
// little-endian word of the bytes (the last one zero-padded) h = rotl64(h ^ w * 0xBF58476D1CE4E5B9,
// 31) * 0x94D049BB133111EB; the value is h ^ (the byte count).
inline uint64_t file_checksum(const std::string& b) {
  uint64_t h = 0x9E3779B97F4A7C15ull;
  for (size_t i = 0; i < b.size(); i += 8) {
    uint64_t w = 0;
    std::memcpy(&w, b.data() + i, std::min<size_t>(8, b.size() - i));
    h ^= w * 0xBF58476D1CE4E5B9ull;
    h = ((h << 31) | (h >> 33)) * 0x94D049BB133111EBull;
  }
  return h ^ b.size();
}

// `good` with the 4 bytes at `at` replaced and a valid checksum again
inline std::string with_bytes(std::string good, size_t at, uint32_t v) {
  std::memcpy(good.data() + at, &v, 4);
  const uint64_t sum = file_checksum(good.substr(0, good.size() - 8));
  std::memcpy(good.data() + good.size() - 8, &sum, 8);
  return good;
}

// One slot, no prompt cache, quiet: every request prefills its whole prompt (the reference that cached and
// restored answers are compared with).
inline server::ServerOptions cold_server_opts() {
  server::ServerOptions o = server_opts();
  o.sched.parallel = 1;
  o.sched.prompt_cache = false;
  o.quiet = true;
  return o;
}

// The events of an SSE body: (event name, data JSON), in order; the name is the last `event:` line's ("" when the
// API sends none). A `data: [DONE]` line ends no event: *saw_done says whether it came.
inline std::vector<std::pair<std::string, ojson>> named_events(const std::string& body, bool* saw_done = nullptr) {
  std::vector<std::pair<std::string, ojson>> ev;
  std::string name;
  if (saw_done) *saw_done = false;
  size_t p = 0;
  while (p < body.size()) {
    size_t e = body.find('\n', p);
    if (e == std::string::npos) e = body.size();
    const std::string line = body.substr(p, e - p);
    p = e + 1;
    if (line.rfind("event: ", 0) == 0) name = line.substr(7);
    if (line.rfind("data: ", 0) != 0) continue;
    if (line.compare(6, std::string::npos, "[DONE]") == 0) {
      if (saw_done) *saw_done = true;
      continue;
    }
    ev.emplace_back(name, ojson::parse(line.substr(6)));
  }
  return ev;
}

// The `data:` events of an SSE body (JSON), and whether `data: [DONE]` came.
inline std::vector<ojson> sse_events(const std::string& body, bool* saw_done) {
  std::vector<ojson> ev;
  for (auto& [name, d] : named_events(body, saw_done)) ev.push_back(std::move(d));
  return ev;
}

// Independent reference of the server's greedy answers: the engine directly (F32), one fresh sequence holding
// `prompt` (one batch), n greedy tokens (argmax, the lower id on ties).
inline std::vector<int32_t> reference_greedy_ids(const Model& m, const std::vector<int32_t>& prompt, int n) {
  ContextOptions co;
  co.n_threads = 1;
  co.n_ctx_max = 1024;
  co.n_batch_max = 512;
  co.precision = Precision::F32;
  Context ctx(m, co);
  Batch b;
  b.add_sequence(prompt, 0, 0, true);
  ctx.decode(b);
  const float* lg = ctx.logits(b.size() - 1);
  std::vector<int32_t> out;
  for (int i = 0; i < n; ++i) {
    int32_t best = 0;
    for (int32_t v = 1; v < ctx.n_vocab(); ++v)
      if (lg[v] > lg[best]) best = v;
    out.push_back(best);
    if (i + 1 == n) break;
    b.clear();
    b.add(best, 0, ctx.seq_len(0), true);
    ctx.decode(b);
    lg = ctx.logits(0);
  }
  return out;
}

}  // namespace kimi::test
