// In-process `kimi serve` on an ephemeral port for the server tests (the tiny synthetic model),
// with small HTTP helpers (cpp-httplib client).
#pragma once
#include <gtest/gtest.h>
#include <httplib.h>

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
