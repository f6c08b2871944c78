// HTTP layer of `kimi serve` (cpp-httplib).
#include <arpa/inet.h>
#include <dirent.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdio>
#include <filesystem>
#include <httplib.h>
#include <map>
#include <mutex>
#include <optional>

#include "server/api.h"
#include "server/server.h"
#include "util/error.h"

namespace kimi::server {

namespace {

// ---- connection liveness (httplib 0.11 has no API for it): find the accepted socket of a
// request by its addresses and peek it. recv() == 0 means the peer closed its side.
bool sock_port(const sockaddr_storage& ss, std::string* addr, int* port) {
  char buf[INET6_ADDRSTRLEN] = {0};
  if (ss.ss_family == AF_INET) {
    auto* a = reinterpret_cast<const sockaddr_in*>(&ss);
    inet_ntop(AF_INET, &a->sin_addr, buf, sizeof buf);
    *port = ntohs(a->sin_port);
  } else if (ss.ss_family == AF_INET6) {
    auto* a = reinterpret_cast<const sockaddr_in6*>(&ss);
    inet_ntop(AF_INET6, &a->sin6_addr, buf, sizeof buf);
    *port = ntohs(a->sin6_port);
  } else {
    return false;
  }
  *addr = buf;
  return true;
}

int find_connection_fd(const std::string& remote_addr, int remote_port, int local_port) {
  DIR* d = opendir("/proc/self/fd");
  if (!d) return -1;
  int found = -1;
  while (dirent* e = readdir(d)) {
    char* end = nullptr;
    const long fd = std::strtol(e->d_name, &end, 10);
    if (!end || *end || fd < 0) continue;
    sockaddr_storage peer{}, local{};
    socklen_t pl = sizeof peer, ll = sizeof local;
    if (getpeername(static_cast<int>(fd), reinterpret_cast<sockaddr*>(&peer), &pl) != 0) continue;
    if (getsockname(static_cast<int>(fd), reinterpret_cast<sockaddr*>(&local), &ll) != 0) continue;
    std::string pa, la;
    int pp = -1, lp = -1;
    if (!sock_port(peer, &pa, &pp) || !sock_port(local, &la, &lp)) continue;
    if (pp == remote_port && lp == local_port && pa == remote_addr) {
      found = static_cast<int>(fd);
      break;
    }
  }
  closedir(d);
  return found;
}

bool peer_closed(int fd) {
  if (fd < 0) return false;
  char c;
  const ssize_t n = ::recv(fd, &c, 1, MSG_PEEK | MSG_DONTWAIT);
  if (n > 0) return false;
  if (n == 0) return true;
  return !(errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR);
}

int64_t unix_now() { return std::chrono::duration_cast<std::chrono::seconds>(std::chrono::system_clock::now().time_since_epoch()).count(); }

std::string sse(const ojson& j) { return "data: " + j.dump(-1, ' ', false, ojson::error_handler_t::replace) + "\n\n"; }

void set_error(httplib::Response& res, int status, const std::string& msg, const std::string& type = "",
               const std::string& param = "", const std::string& code = "") {
  res.status = status;
  res.set_content(error_json(status, msg, type, param, code).dump(), "application/json");
}

}  // namespace

struct Server::Impl {
  ServerOptions o;
  std::unique_ptr<Model> model;
  std::optional<tok::Tokenizer> tok;
  std::unique_ptr<Scheduler> sched;
  httplib::Server http;
  Limits lim;
  int port = -1;
  std::atomic<bool> stopping{false};
  std::atomic<int> in_flight{0};
  std::atomic<uint64_t> next_id{1};
  Clock::time_point t_start = Clock::now();
  std::once_flag stop_once;

  mutable std::mutex mmu;
  std::map<std::pair<std::string, int>, uint64_t> http_counts;  // (path, status) -> n
  double ttft_sum = 0;
  uint64_t ttft_n = 0;

  void routes();
  void generate(const httplib::Request& req, httplib::Response& res, bool chat);
  std::string metrics() const;
  std::string new_id(const char* prefix) { return fmt::format("{}{:08x}", prefix, next_id.fetch_add(1)); }
};

Server::Server(const ServerOptions& opts) : impl_(std::make_unique<Impl>()) {
  Impl& I = *impl_;
  I.o = opts;
  I.model = Model::load(opts.model_path, {opts.verbose});
  check(I.model->reader().has("tokenizer.ggml.tokens"),
        "{}: the GGUF has no tokenizer (tokenizer.ggml.tokens); kimi serve needs one", opts.model_path);
  I.tok.emplace(tok::Tokenizer::from_gguf(I.model->reader()));
  if (I.o.model_id.empty()) I.o.model_id = std::filesystem::path(opts.model_path).stem().string();
  check(opts.ctx >= 8, "--ctx must be >= 8 (got {})", opts.ctx);
  ContextOptions co;
  co.n_threads = opts.threads;
  co.n_ctx_max = opts.ctx;
  co.attn = opts.attn == "dense" ? AttnPath::Dense : AttnPath::Sparse;
  co.attn_top_k = opts.attn_top_k;
  co.precision = opts.precision == "f32" ? kern::Precision::F32 : kern::Precision::Fast;
  co.cache_type = opts.cache_type == "f32" ? CacheType::F32 : CacheType::F16;
  co.n_batch_max = opts.sched.chunk * opts.sched.max_chunks + opts.sched.parallel;
  I.sched = std::make_unique<Scheduler>(*I.model, *I.tok, co, opts.sched);
  I.lim.n_ctx = opts.ctx;
  I.lim.max_prompt_tokens = opts.max_prompt_tokens;
  I.lim.max_tokens = opts.max_tokens;
  I.lim.default_max_tokens = opts.default_max_tokens;
  I.lim.timeout_s = opts.timeout_s;
  I.routes();
}

Server::~Server() {
  shutdown();
  if (impl_->sched) impl_->sched->shutdown(std::chrono::milliseconds(0));
}

Scheduler& Server::scheduler() { return *impl_->sched; }
std::string Server::metrics_text() const { return impl_->metrics(); }

int Server::bind() {
  Impl& I = *impl_;
  errno = 0;
  if (I.o.port == 0) {
    I.port = I.http.bind_to_any_port(I.o.host);
  } else {
    I.port = I.http.bind_to_port(I.o.host, I.o.port) ? I.o.port : -1;
  }
  check(I.port > 0, "cannot listen on {}:{} ({})", I.o.host, I.o.port,
        errno ? std::strerror(errno) : "the address cannot be resolved or is not available");
  return I.port;
}

void Server::run() {
  Impl& I = *impl_;
  check(I.port > 0, "Server::run() before bind()");
  if (!I.stopping.load()) I.http.listen_after_bind();
  // listen returns after stop(); its worker threads are joined (in-flight requests finished)
  I.sched->shutdown(std::chrono::milliseconds(static_cast<int64_t>(I.o.grace_s * 1000)));
}

void Server::shutdown() {
  Impl& I = *impl_;
  std::call_once(I.stop_once, [&] {
    I.stopping.store(true);
    // the scheduler keeps serving in-flight requests for the grace period, then cancels them
    I.sched->request_stop(std::chrono::milliseconds(static_cast<int64_t>(I.o.grace_s * 1000)));
    I.http.stop();
  });
}

void Server::Impl::routes() {
  http.new_task_queue = [this] { return new httplib::ThreadPool(static_cast<size_t>(std::max(2, o.max_connections))); };
  http.set_payload_max_length(o.max_body);
  http.set_keep_alive_timeout(5);
  http.set_read_timeout(30);
  http.set_write_timeout(30);
  if (!o.cors_origin.empty()) {
    http.set_default_headers({{"Access-Control-Allow-Origin", o.cors_origin},
                              {"Access-Control-Allow-Headers", "Authorization, Content-Type"},
                              {"Access-Control-Allow-Methods", "GET, POST, OPTIONS"},
                              {"Vary", "Origin"}});
  }
  http.set_pre_routing_handler([this](const httplib::Request& req, httplib::Response& res) {
    if (req.method == "OPTIONS" && !o.cors_origin.empty()) {
      res.status = 204;
      return httplib::Server::HandlerResponse::Handled;
    }
    if (!o.api_key.empty() && req.path != "/health") {
      const std::string h = req.get_header_value("Authorization");
      const std::string prefix = "Bearer ";
      const std::string given = h.compare(0, prefix.size(), prefix) == 0 ? h.substr(prefix.size()) : std::string();
      if (!constant_time_equal(given, o.api_key)) {
        set_error(res, 401, "invalid or missing API key (Authorization: Bearer KEY)", "authentication_error", "",
                  "invalid_api_key");
        return httplib::Server::HandlerResponse::Handled;
      }
    }
    if (in_flight.load() >= o.max_connections) {
      set_error(res, 503, "too many concurrent requests", "server_unavailable_error");
      return httplib::Server::HandlerResponse::Handled;
    }
    return httplib::Server::HandlerResponse::Unhandled;
  });
  http.set_error_handler([](const httplib::Request& req, httplib::Response& res) {
    if (!res.body.empty()) return;
    std::string msg = res.status == 404   ? "no such endpoint: " + req.method + " " + req.path
                      : res.status == 413 ? "request body too large"
                      : res.status == 405 ? "method not allowed"
                                          : "bad request";
    set_error(res, res.status, msg);
  });
  http.set_exception_handler([](const httplib::Request&, httplib::Response& res, std::exception_ptr ep) {
    try {
      std::rethrow_exception(ep);
    } catch (const ApiError& e) {
      set_error(res, e.status, e.what(), e.type, e.param, e.code);
    } catch (const std::exception& e) {
      set_error(res, 500, std::string("internal error: ") + e.what());
    } catch (...) {
      set_error(res, 500, "internal error");
    }
  });
  http.set_logger([this](const httplib::Request& req, const httplib::Response& res) {
    {
      std::lock_guard<std::mutex> lk(mmu);
      const bool known = req.path == "/health" || req.path == "/metrics" || req.path == "/v1/models" ||
                         req.path == "/v1/chat/completions" || req.path == "/v1/completions" ||
                         req.path == "/tokenize" || req.path == "/detokenize";
      ++http_counts[{known ? req.path : std::string("other"), res.status}];
    }
    if (o.verbose) std::fprintf(stderr, "%s %s -> %d\n", req.method.c_str(), req.path.c_str(), res.status);
  });

  // wraps a handler: in-flight count, ApiError -> OpenAI error shape
  auto wrap = [this](auto fn) {
    return [this, fn](const httplib::Request& req, httplib::Response& res) {
      in_flight.fetch_add(1);
      struct Dec { std::atomic<int>& c; ~Dec() { c.fetch_sub(1); } } dec{in_flight};
      try {
        fn(req, res);
      } catch (const ApiError& e) {
        set_error(res, e.status, e.what(), e.type, e.param, e.code);
      } catch (const kimi::Error& e) {
        set_error(res, 400, e.what());
      } catch (const std::exception& e) {
        set_error(res, 500, std::string("internal error: ") + e.what());
      }
    };
  };

  http.Get("/health", wrap([this](const httplib::Request&, httplib::Response& res) {
    if (stopping.load()) {
      res.status = 503;
      res.set_content(R"({"status":"shutting down"})", "application/json");
      return;
    }
    const SchedulerStats s = sched->stats();
    ojson j = {{"status", "ok"}, {"slots", s.slots}, {"slots_busy", s.active}, {"queue", s.queue_depth}};
    res.set_content(j.dump(), "application/json");
  }));
  http.Get("/v1/models", wrap([this](const httplib::Request&, httplib::Response& res) {
    const auto& hp = model->hparams();
    ojson m = {{"id", o.model_id},
               {"object", "model"},
               {"created", unix_now()},
               {"owned_by", "kimi.cpp"},
               {"meta", {{"n_ctx", o.ctx}, {"n_vocab", hp.n_vocab}, {"n_layer", hp.n_layer}, {"n_embd", hp.n_embd}}}};
    res.set_content(ojson{{"object", "list"}, {"data", ojson::array({m})}}.dump(), "application/json");
  }));
  http.Get("/metrics", wrap([this](const httplib::Request&, httplib::Response& res) {
    res.set_content(metrics(), "text/plain; version=0.0.4");
  }));
  http.Post("/tokenize", wrap([this](const httplib::Request& req, httplib::Response& res) {
    const ojson b = parse_body(req.body);
    const ojson* c = nullptr;
    for (const char* k : {"content", "text", "prompt"})
      if (b.contains(k)) { c = &b[k]; break; }
    if (!c) throw ApiError(400, "'content' is required", "invalid_request_error", "content");
    if (!c->is_string()) throw ApiError(400, "'content' must be a string", "invalid_request_error", "content");
    bool special = true;
    if (b.contains("special")) {
      if (!b["special"].is_boolean()) throw ApiError(400, "'special' must be a boolean", "invalid_request_error", "special");
      special = b["special"].get<bool>();
    }
    bool pieces = false;
    if (b.contains("with_pieces")) {
      if (!b["with_pieces"].is_boolean()) throw ApiError(400, "'with_pieces' must be a boolean", "invalid_request_error", "with_pieces");
      pieces = b["with_pieces"].get<bool>();
    }
    const std::vector<int32_t> ids = tok->encode(c->get<std::string>(), special);
    ojson out = ojson::object();
    if (pieces) {
      ojson arr = ojson::array();
      for (int32_t id : ids) arr.push_back({{"id", id}, {"piece", tok->token_to_piece(id)}});
      out["tokens"] = std::move(arr);
    } else {
      out["tokens"] = ids;
    }
    out["count"] = ids.size();
    res.set_content(out.dump(-1, ' ', false, ojson::error_handler_t::replace), "application/json");
  }));
  http.Post("/detokenize", wrap([this](const httplib::Request& req, httplib::Response& res) {
    const ojson b = parse_body(req.body);
    if (!b.contains("tokens")) throw ApiError(400, "'tokens' is required", "invalid_request_error", "tokens");
    const ojson& t = b["tokens"];
    if (!t.is_array()) throw ApiError(400, "'tokens' must be an array of token ids", "invalid_request_error", "tokens");
    std::vector<int32_t> ids;
    const int64_t nv = tok->n_vocab();
    for (size_t i = 0; i < t.size(); ++i) {
      if (!t[i].is_number_integer())
        throw ApiError(400, fmt::format("'tokens[{}]' must be an integer", i), "invalid_request_error", "tokens");
      const int64_t id = t[i].get<int64_t>();
      if (id < 0 || id >= nv)
        throw ApiError(400, fmt::format("'tokens[{}]': token id {} is out of range 0..{}", i, id, nv - 1),
                       "invalid_request_error", "tokens");
      ids.push_back(static_cast<int32_t>(id));
    }
    ojson out = {{"content", tok->decode(ids)}};
    res.set_content(out.dump(-1, ' ', false, ojson::error_handler_t::replace), "application/json");
  }));
  http.Post("/v1/chat/completions",
            wrap([this](const httplib::Request& req, httplib::Response& res) { generate(req, res, true); }));
  http.Post("/v1/completions",
            wrap([this](const httplib::Request& req, httplib::Response& res) { generate(req, res, false); }));
}

void Server::Impl::generate(const httplib::Request& req, httplib::Response& res, bool chat) {
  if (stopping.load()) throw ApiError(503, "server is shutting down", "server_unavailable_error");
  ParsedRequest pr = chat ? parse_chat_request(req.body, *tok, lim) : parse_completion_request(req.body, *tok, lim);
  auto job = std::make_shared<Job>(std::move(pr.prompt), pr.gen);
  if (!sched->submit(job)) {
    if (sched->shutting_down()) throw ApiError(503, "server is shutting down", "server_unavailable_error");
    throw ApiError(503, fmt::format("server is busy: the request queue is full ({} waiting)", sched->options().queue_limit),
                   "server_unavailable_error", "", "queue_full");
  }
  const std::string id = new_id(chat ? "chatcmpl-" : "cmpl-");
  const int64_t created = unix_now();
  const std::string model_id = o.model_id;
  const int local_port = port;
  const std::string raddr = req.remote_addr;
  const int rport = req.remote_port;
  auto record_ttft = [this](const Job::Result& r) {
    if (r.ttft_s < 0) return;
    std::lock_guard<std::mutex> lk(mmu);
    ttft_sum += r.ttft_s;
    ++ttft_n;
  };

  if (!pr.stream) {
    const int fd = find_connection_fd(raddr, rport, local_port);
    JobOutput out;
    int polls = 0;
    while (!job->wait(out, std::chrono::milliseconds(50))) {
      if (++polls % 2 == 0 && peer_closed(fd)) job->cancel();
    }
    const Job::Result r = job->result();
    record_ttft(r);
    if (r.http_status >= 400) throw ApiError(r.http_status, r.error.empty() ? r.finish_reason : r.error);
    if (r.finish_reason == "cancelled")
      throw ApiError(503, "the request was cancelled (client gone or server shutting down)", "server_unavailable_error");
    const ojson j = chat ? chat_response(id, model_id, created, out, r) : completion_response(id, model_id, created, out, r);
    res.set_content(j.dump(-1, ' ', false, ojson::error_handler_t::replace), "application/json");
    return;
  }

  res.set_header("Cache-Control", "no-cache");
  res.set_header("X-Accel-Buffering", "no");
  const bool include_usage = pr.include_usage;
  res.set_chunked_content_provider(
      "text/event-stream",
      [job, id, model_id, created, chat, include_usage, raddr, rport, local_port, record_ttft](
          size_t, httplib::DataSink& sink) {
        const int fd = find_connection_fd(raddr, rport, local_port);
        auto write = [&](const std::string& s) {
          if (!sink.write(s.data(), s.size())) {
            job->cancel();
            return false;
          }
          return true;
        };
        if (chat && !write(sse(chat_chunk(id, model_id, created, {{"role", "assistant"}, {"content", ""}}, ""))))
          return false;
        int n_tool = 0;
        auto idle_since = Clock::now();
        for (;;) {
          JobOutput out;
          const bool done = job->wait(out, std::chrono::milliseconds(50));
          std::string buf;
          if (chat) {
            if (!out.reasoning.empty())
              buf += sse(chat_chunk(id, model_id, created, {{"reasoning_content", out.reasoning}}, ""));
            if (!out.content.empty()) buf += sse(chat_chunk(id, model_id, created, {{"content", out.content}}, ""));
            for (const auto& c : out.tool_calls) {
              ojson tc = tool_call_json(c, fmt::format("call_{}_{}", id, n_tool));
              ojson d = {{"tool_calls", ojson::array({ojson{{"index", n_tool}, {"id", tc["id"]}, {"type", "function"},
                                                            {"function", tc["function"]}}})}};
              ++n_tool;
              buf += sse(chat_chunk(id, model_id, created, d, ""));
            }
          } else if (!out.text.empty()) {
            buf += sse(completion_chunk(id, model_id, created, out.text, ""));
          }
          if (!buf.empty()) {
            if (!write(buf)) return false;
            idle_since = Clock::now();
          } else if (!done) {
            if (peer_closed(fd)) {
              job->cancel();
            } else if (Clock::now() - idle_since > std::chrono::seconds(5)) {
              if (!write(": keep-alive\n\n")) return false;  // SSE comment; also detects a dead peer
              idle_since = Clock::now();
            }
          }
          if (!done) continue;
          const Job::Result r = job->result();
          record_ttft(r);
          std::string tail;
          if (r.http_status >= 400) {
            tail += sse(error_json(r.http_status, r.error.empty() ? r.finish_reason : r.error));
          } else {
            const std::string fr = openai_finish_reason(r.finish_reason);
            tail += sse(chat ? chat_chunk(id, model_id, created, ojson::object(), fr)
                             : completion_chunk(id, model_id, created, "", fr));
            if (include_usage) {
              ojson u = {{"id", id},         {"object", chat ? "chat.completion.chunk" : "text_completion"},
                         {"created", created}, {"model", model_id},
                         {"choices", ojson::array()}, {"usage", usage_json(r)}};
              tail += sse(u);
            }
          }
          tail += "data: [DONE]\n\n";
          if (!write(tail)) return false;
          sink.done();
          return true;
        }
      },
      [job](bool success) {
        if (!success) job->cancel();
      });
}

std::string Server::Impl::metrics() const {
  const SchedulerStats s = sched->stats();
  std::string out;
  auto metric = [&](const char* name, const char* type, const char* help, const std::string& samples) {
    out += fmt::format("# HELP {} {}\n# TYPE {} {}\n{}", name, help, name, type, samples);
  };
  auto one = [](const char* name, double v) { return fmt::format("{} {}\n", name, v); };
  {
    std::lock_guard<std::mutex> lk(mmu);
    std::string samples;
    for (auto& [k, n] : http_counts)
      samples += fmt::format("kimi_http_requests_total{{path=\"{}\",status=\"{}\"}} {}\n", k.first, k.second, n);
    metric("kimi_http_requests_total", "counter", "HTTP requests by path and status", samples);
    metric("kimi_time_to_first_token_seconds", "summary", "time from submission to the first generated token",
           fmt::format("kimi_time_to_first_token_seconds_sum {}\nkimi_time_to_first_token_seconds_count {}\n", ttft_sum,
                       ttft_n));
  }
  metric("kimi_requests_total", "counter", "generation requests by outcome",
         fmt::format("kimi_requests_total{{result=\"started\"}} {}\nkimi_requests_total{{result=\"finished\"}} {}\n"
                     "kimi_requests_total{{result=\"cancelled\"}} {}\nkimi_requests_total{{result=\"timeout\"}} {}\n"
                     "kimi_requests_total{{result=\"error\"}} {}\n",
                     s.requests_started, s.requests_finished, s.requests_cancelled, s.requests_timeout,
                     s.requests_failed));
  metric("kimi_prompt_tokens_total", "counter", "prompt tokens of started requests", one("kimi_prompt_tokens_total", s.prompt_tokens));
  metric("kimi_prompt_tokens_cached_total", "counter", "prompt tokens reused from the prompt cache",
         one("kimi_prompt_tokens_cached_total", s.cached_tokens));
  metric("kimi_prefill_tokens_total", "counter", "prompt tokens evaluated", one("kimi_prefill_tokens_total", s.prefill_tokens));
  metric("kimi_generated_tokens_total", "counter", "generated tokens", one("kimi_generated_tokens_total", s.generated_tokens));
  metric("kimi_decode_steps_total", "counter", "scheduler steps (batched decode calls)", one("kimi_decode_steps_total", s.decode_steps));
  metric("kimi_decode_seconds_total", "counter", "time spent in batched decode", one("kimi_decode_seconds_total", s.busy_s));
  metric("kimi_prefix_cache_entries_total", "counter", "prefix entries stored at divergence points",
         one("kimi_prefix_cache_entries_total", s.prefix_entries));
  metric("kimi_queue_depth", "gauge", "requests waiting for a slot", one("kimi_queue_depth", s.queue_depth));
  metric("kimi_slots_busy", "gauge", "slots generating or prefilling", one("kimi_slots_busy", s.active));
  metric("kimi_slots_total", "gauge", "slots (--parallel)", one("kimi_slots_total", s.slots));
  metric("kimi_tokens_per_second", "gauge", "generated tokens per second over the last ~10 s",
         one("kimi_tokens_per_second", s.tokens_per_s));
  metric("kimi_http_requests_in_flight", "gauge", "HTTP requests being handled", one("kimi_http_requests_in_flight", in_flight.load()));
  metric("kimi_uptime_seconds", "gauge", "seconds since start",
         one("kimi_uptime_seconds", std::chrono::duration<double>(Clock::now() - t_start).count()));
  return out;
}

}  // namespace kimi::server
