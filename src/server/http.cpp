// HTTP endpoints of `kimi serve` on the small HTTP/1.1 server in httpd.h.
#include <atomic>
#include <cstdio>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <map>
#include <set>
#include <mutex>
#include <optional>
#include <thread>

#include "runtime/vision_input.h"
#include "server/api.h"
#include "server/api_anthropic.h"
#include "server/api_openai.h"
#include "server/api_responses.h"
#include "server/httpd.h"
#include "server/server.h"
#include "server/web_ui.h"
#include "util/error.h"

namespace kimi::server {

namespace {

httpd::Reply error_reply(int status, const std::string& msg, const std::string& type = "", const std::string& param = "",
                         const std::string& code = "") {
  return json_reply(error_json(status, msg, type, param, code), status);
}

// `Authorization: Bearer KEY`; the scheme is case-insensitive (RFC 9110 11.1).
std::string bearer_token(const std::string* h) {
  if (!h) return {};
  const std::string& v = *h;
  size_t i = 0;
  while (i < v.size() && v[i] != ' ' && v[i] != '\t') ++i;
  const std::string scheme = v.substr(0, i);
  if (scheme.size() != 6) return {};
  for (size_t k = 0; k < 6; ++k)
    if (std::tolower(static_cast<unsigned char>(scheme[k])) != "bearer"[k]) return {};
  while (i < v.size() && (v[i] == ' ' || v[i] == '\t')) ++i;
  return v.substr(i);
}

const char* const kKnownPaths[] = {"/health", "/metrics", "/v1/models", "/v1/chat/completions", "/v1/completions",
                                   "/tokenize", "/detokenize", "/props", "/slots", "/v1/messages",
                                   "/v1/messages/count_tokens", "/v1/responses"};

bool is_embeddings(const std::string& p) {
  return p == "/v1/embeddings" || p == "/embeddings" || p == "/embedding" || p == "/v1/embedding";
}

}  // namespace

struct Server::Impl {
  ServerOptions o;
  std::unique_ptr<Model> model;
  std::optional<tok::Tokenizer> tok;
  std::unique_ptr<VisionRunner> vision;  // the projector file's tower (nullptr: text only); outlives sched
  std::unique_ptr<Scheduler> sched;
  std::unique_ptr<httpd::HttpServer> http;
  Limits lim;
  int port = -1;
  std::atomic<bool> stopping{false};
  std::atomic<bool> ready{false};   // model, tokenizer and scheduler are loaded
  std::thread loader;               // load_in_background
  std::string load_error;
  std::atomic<int> in_flight{0};
  std::atomic<uint64_t> next_id{1};
  Clock::time_point t_start = Clock::now();
  std::once_flag stop_once;

  mutable std::mutex mmu;
  std::map<std::pair<std::string, int>, uint64_t> http_counts;  // (path, status) -> n
  double ttft_sum = 0;
  uint64_t ttft_n = 0;

  void load();
  bool quick(const httpd::Request& req, bool workers_free, bool draining, httpd::Reply& out);
  bool key_refused(const httpd::Request& req, httpd::Reply& out) const;  // 401 into out: no valid key
  void handle(const httpd::Request& req, httpd::Responder& res);
  void log(const httpd::Request& req, int status);
  httpd::Reply health() const;
  httpd::Reply models() const;
  ojson model_json() const;
  httpd::Reply model_by_id(const std::string& id) const;
  httpd::Reply props() const;
  httpd::Reply slots() const;
  httpd::Reply slot_action(const httpd::Request& req);  // POST /slots/{id}?action=save|restore|erase
  httpd::Reply tokenize(const httpd::Request& req) const;
  httpd::Reply detokenize(const httpd::Request& req) const;
  Endpoint endpoint(const httpd::Request& req);  // for the generation APIs (job_driver.h)
  void log_generation(const httpd::Request& req, const std::string& id, const std::vector<Job::Result>& rs,
                      double total_s);
  void record_ttft(const Job::Result& r);
  std::string metrics() const;
  std::string new_id(const char* prefix) { return fmt::format("{}{:08x}", prefix, next_id.fetch_add(1)); }
};

Server::Server(const ServerOptions& opts) : impl_(std::make_unique<Impl>()) {
  Impl& I = *impl_;
  I.o = opts;
  if (I.o.model_id.empty()) I.o.model_id = std::filesystem::path(opts.model_path).stem().string();
  check(opts.ctx >= 8, "--ctx must be >= 8 (got {})", opts.ctx);
  I.lim.n_ctx = opts.ctx;
  I.lim.max_prompt_tokens = opts.max_prompt_tokens;
  I.lim.max_tokens = opts.max_tokens;
  I.lim.default_max_tokens = opts.default_max_tokens;
  I.lim.timeout_s = opts.timeout_s;
  I.lim.sampling = opts.sampling;
  I.lim.fixed_seed = opts.fixed_seed;
  check(opts.reasoning_budget >= -1, "--reasoning-budget must be >= -1 (got {})", opts.reasoning_budget);
  I.lim.thinking_budget = opts.reasoning_budget;
  I.lim.model_path = opts.model_path;
  I.lim.image_max_count = opts.image_max_count;
  I.lim.image_max_bytes = opts.image_max_bytes;
  I.lim.image_max_pixels = opts.image_max_pixels;
  I.lim.dspark = !opts.sched.draft_model.empty();
  Sampler check_sampling(opts.sampling, 1);  // a bad default (e.g. --top-p 2) fails at startup

  httpd::Options h;
  h.host = opts.host;
  h.port = opts.port;
  h.workers = std::max(1, opts.max_connections);
  h.max_open = std::max(opts.max_connections, opts.max_open_connections);
  h.max_body = opts.max_body;
  h.head_timeout_s = opts.head_timeout_s;
  h.body_timeout_s = opts.body_timeout_s;
  if (!opts.cors_origin.empty())
    h.default_headers = {{"Access-Control-Allow-Origin", opts.cors_origin},
                         {"Access-Control-Allow-Headers", "Authorization, Content-Type, x-api-key, anthropic-version, anthropic-beta"},
                         {"Access-Control-Allow-Methods", "GET, POST, OPTIONS"},
                         {"Vary", "Origin"}};
  h.error_reply = [](int status, const std::string& msg) { return error_reply(status, msg); };
  // the API key is checked on the request head: a client without it never gets its body stored
  h.head_check = [&I](const httpd::Request& rq, httpd::Reply& out) {
    if (!I.key_refused(rq, out)) return false;
    anthropic_reshape_error(rq, out);
    return true;
  };
  I.http = std::make_unique<httpd::HttpServer>(
      h, [&I](const httpd::Request& rq, httpd::Responder& rs) { I.handle(rq, rs); },
      [&I](const httpd::Request& rq, bool free, bool draining, httpd::Reply& out) {
        const bool answered = I.quick(rq, free, draining, out);
        if (answered) anthropic_reshape_error(rq, out);  // /v1/messages: errors in Anthropic's shape
        return answered;
      },
      [&I](const httpd::Request& rq, int status) { I.log(rq, status); });
  if (!opts.load_in_background) I.load();
}

// The model, tokenizer and scheduler; requests are served once this has returned.
void Server::Impl::load() {
  model = Model::load(o.model_path, {o.verbose});
  check(model->reader().has("tokenizer.ggml.tokens"),
        "{}: the GGUF has no tokenizer (tokenizer.ggml.tokens); kimi serve needs one", o.model_path);
  tok.emplace(tok::Tokenizer::from_gguf(model->reader()));
  // kimi serve passes the engine options app/engine_args made (threads pinned by --cpu-affinity /
  // --numa included); a library user may set the fields one by one instead
  ContextOptions co = o.engine ? *o.engine : ContextOptions{};
  if (!o.engine) {
    co.n_threads = o.threads;
    co.attn = o.attn == "dense" ? AttnPath::Dense : AttnPath::Sparse;
    co.attn_top_k = o.attn_top_k;
    co.precision = o.precision == "f32" ? Precision::F32 : Precision::Fast;
    co.cache_type = o.cache_type == "f32" ? CacheType::F32 : CacheType::F16;
    co.indexer_int8 = o.indexer_int8;
    co.placement = o.placement;
    co.collective = o.collective;
    co.split_mode = o.split_mode;
    co.extra_backends = o.extra_backends;
    co.stream = o.stream;
  }
  co.n_ctx_max = o.ctx;
  co.n_batch_max = o.sched.chunk * o.sched.max_chunks + o.sched.parallel;
  // the vision tower (docs/server.md "Images"): --mmproj, else MODEL.mmproj.gguf beside the model
  SchedulerOptions so = o.sched;
  const std::string mmproj = o.mmproj.empty() ? find_mmproj(o.model_path) : o.mmproj;
  if (!mmproj.empty() && !o.no_mmproj) {
    vision = std::make_unique<VisionRunner>(mmproj, model->hparams().n_embd,
                                            o.vision_threads > 0 ? o.vision_threads : co.n_threads, co.precision,
                                            o.vision_backend);
    check(tok->token_id("<|media_pad|>") == vision->model().hp().placeholder,
          "{}: the projector's placeholder id {} is not the tokenizer's <|media_pad|> ({})", mmproj,
          vision->model().hp().placeholder, tok->token_id("<|media_pad|>"));
    so.vision = vision.get();
    lim.vision = &vision->model();
  }
  sched = std::make_unique<Scheduler>(*model, *tok, co, so);
  lim.max_token_bytes = tok->max_token_bytes();
  ready.store(true, std::memory_order_release);
  if (o.on_loaded) o.on_loaded();
}

Server::~Server() {
  shutdown();
  impl_->http.reset();  // joins the handler threads (run() may never have been called)
  if (impl_->loader.joinable()) impl_->loader.join();
  if (impl_->sched) impl_->sched->shutdown(std::chrono::milliseconds(0));
}

Scheduler& Server::scheduler() {
  check(impl_->ready.load(std::memory_order_acquire), "Server::scheduler(): the model is not loaded yet");
  return *impl_->sched;
}
std::string Server::metrics_text() const { return impl_->metrics(); }
bool Server::loaded() const { return impl_->ready.load(std::memory_order_acquire); }

int Server::bind() {
  Impl& I = *impl_;
  I.port = I.http->bind();
  return I.port;
}

void Server::run() {
  Impl& I = *impl_;
  check(I.port > 0, "Server::run() before bind()");
  if (!I.ready.load()) {
    I.loader = std::thread([&I] {
      try {
        if (I.o.test_load_delay_ms > 0) std::this_thread::sleep_for(std::chrono::milliseconds(I.o.test_load_delay_ms));
        if (!I.stopping.load()) I.load();
      } catch (const std::exception& e) {
        I.load_error = e.what();
        I.stopping.store(true);
        I.http->drain();
      }
    });
  }
  // returns once shutdown() was called and no request is being handled any more; until then
  // /health answers 503 and new requests are refused with 503
  I.http->run();
  if (I.loader.joinable()) I.loader.join();
  if (I.sched) I.sched->shutdown(std::chrono::milliseconds(static_cast<int64_t>(I.o.grace_s * 1000)));
  if (!I.load_error.empty()) throw Error(I.load_error);
}

void Server::shutdown() {
  Impl& I = *impl_;
  std::call_once(I.stop_once, [&] {
    I.stopping.store(true);
    // the scheduler keeps serving in-flight requests for the grace period, then cancels them
    if (I.ready.load(std::memory_order_acquire))
      I.sched->request_stop(std::chrono::milliseconds(static_cast<int64_t>(I.o.grace_s * 1000)));
    I.http->drain();
  });
}

void Server::Impl::log(const httpd::Request& req, int status) {
  {
    std::lock_guard<std::mutex> lk(mmu);
    bool known = false;
    for (const char* p : kKnownPaths) known = known || req.path == p;
    ++http_counts[{known ? req.path : std::string("other"), status}];
  }
  if (o.verbose) std::fprintf(stderr, "%s %s -> %d\n", req.method.c_str(), req.path.c_str(), status);
}

// On the event thread: everything that needs no engine work and never blocks.
bool Server::Impl::quick(const httpd::Request& req, bool workers_free, bool draining, httpd::Reply& out) {
  if (req.method == "OPTIONS" && !o.cors_origin.empty()) {
    out.status = 204;
    out.body.clear();
    return true;
  }
  if (req.path == "/" || req.path == "/index.html") {  // the built-in chat page: static, no key needed
    if (req.method != "GET" && req.method != "HEAD") {
      out = error_reply(405, fmt::format("method not allowed: {} {} (use GET)", req.method, req.path));
      out.headers.emplace_back("Allow", "GET, HEAD");
      return true;
    }
    out.status = 200;
    out.content_type = "text/html; charset=utf-8";
    out.body = std::string(web_index_html());
    out.headers.emplace_back("Cache-Control", "no-cache");
    return true;
  }
  if (key_refused(req, out)) return true;
  const bool get = req.method == "GET" || req.method == "HEAD";  // HEAD: the same headers, no body (httpd)
  const bool post = req.method == "POST";
  auto wrong_method = [&](const char* m) {
    out = error_reply(405, fmt::format("method not allowed: {} {} (use {})", req.method, req.path, m));
    out.headers.emplace_back("Allow", m);
    return true;
  };
  if (req.path == "/health") {
    if (!get) return wrong_method("GET, HEAD");
    out = health();
    return true;
  }
  if (is_embeddings(req.path)) {
    out = error_reply(501,
                      "embeddings are not supported: kimi-k3 is a generative chat model and kimi serve has no "
                      "embedding (pooled hidden state) output; use an embedding model",
                      "not_implemented_error", "", "embeddings_not_supported");
    return true;
  }
  const bool models_path = req.path == "/v1/models" || req.path.rfind("/v1/models/", 0) == 0;
  if (req.path == "/metrics" || models_path || req.path == "/props" || req.path == "/slots") {
    if (!get) return wrong_method("GET, HEAD");
    if (!ready.load(std::memory_order_acquire) && req.path != "/metrics") {
      out = error_reply(503, "the model is loading", "server_unavailable_error", "", "loading");
      out.headers.emplace_back("Retry-After", "1");
      return true;
    }
    if (req.path == "/v1/models") {
      out = models();
    } else if (models_path) {
      out = model_by_id(req.path.substr(std::strlen("/v1/models/")));
    } else if (req.path == "/props") {
      out = props();
    } else if (req.path == "/slots") {
      out = slots();
    } else {
      out.content_type = "text/plain; version=0.0.4";
      out.body = metrics();
    }
    return true;
  }
  if (req.path.rfind("/slots/", 0) == 0) {  // slot save / restore / erase: on a handler thread
    if (!post) return wrong_method("POST");
    if (o.slot_save_path.empty()) {
      out = error_reply(501, "This server does not support slots action. Start it with `--slot-save-path`",
                        "not_supported_error");
      return true;
    }
    if (draining || stopping.load() || !ready.load(std::memory_order_acquire) || !workers_free) {
      out = error_reply(503, !ready.load(std::memory_order_acquire) ? "the model is loading" : "the server is busy or shutting down",
                        "server_unavailable_error");
      return true;
    }
    return false;
  }
  if (req.path == "/v1/chat/completions" || req.path == "/v1/completions" || req.path == "/tokenize" ||
      req.path == "/detokenize" || req.path == "/v1/messages" || req.path == "/v1/messages/count_tokens" ||
      req.path == "/v1/responses") {
    if (!post) return wrong_method("POST");
    if (draining || stopping.load()) {
      out = error_reply(503, "server is shutting down", "server_unavailable_error");
      return true;
    }
    if (!ready.load(std::memory_order_acquire)) {
      out = error_reply(503, "the model is loading", "server_unavailable_error", "", "loading");
      out.headers.emplace_back("Retry-After", "1");
      return true;
    }
    if (!workers_free) {
      out = error_reply(503, "too many concurrent requests", "server_unavailable_error");
      return true;
    }
    return false;  // to a handler thread
  }
  out = error_reply(404, "no such endpoint: " + req.method + " " + req.path);
  return true;
}

// The key as `Authorization: Bearer KEY` or as Anthropic's `x-api-key: KEY`; the chat page, /health
// and CORS preflights need none. Called on the request head (httpd's head_check) and again in quick().
bool Server::Impl::key_refused(const httpd::Request& req, httpd::Reply& out) const {
  if (o.api_key.empty() || req.path == "/health" || req.path == "/" || req.path == "/index.html") return false;
  if (req.method == "OPTIONS" && !o.cors_origin.empty()) return false;
  const std::string* x_api_key = req.header("x-api-key");
  if (constant_time_equal(bearer_token(req.header("authorization")), o.api_key) ||
      (x_api_key && constant_time_equal(*x_api_key, o.api_key)))
    return false;
  out = error_reply(401, "invalid or missing API key (Authorization: Bearer KEY or x-api-key: KEY)",
                    "authentication_error", "", "invalid_api_key");
  return true;
}

httpd::Reply Server::Impl::health() const {
  if (stopping.load()) return json_reply(ojson{{"status", "shutting down"}}, 503);
  if (!ready.load(std::memory_order_acquire)) return json_reply(ojson{{"status", "loading model"}}, 503);
  const SchedulerStats s = sched->stats();
  return json_reply(ojson{{"status", "ok"}, {"slots", s.slots}, {"slots_busy", s.active}, {"queue", s.queue_depth}});
}

ojson Server::Impl::model_json() const {
  const auto& hp = model->hparams();
  return {{"id", o.model_id},
          {"object", "model"},
          {"created", unix_seconds()},
          {"owned_by", "kimi.cpp"},
          {"meta", {{"n_ctx", o.ctx}, {"n_vocab", hp.n_vocab}, {"n_layer", hp.n_layer}, {"n_embd", hp.n_embd}}}};
}

httpd::Reply Server::Impl::models() const {
  return json_reply(ojson{{"object", "list"}, {"data", ojson::array({model_json()})}});
}

httpd::Reply Server::Impl::model_by_id(const std::string& id) const {
  if (id != o.model_id)
    return error_reply(404, fmt::format("model '{}' not found (this server has '{}')", id, o.model_id),
                       "not_found_error", "model", "model_not_found");
  return json_reply(model_json());
}

// llama-server's /props: the model, context, chat template and the defaults of a request.
httpd::Reply Server::Impl::props() const {
  const SamplerParams& d = lim.sampling;
  ojson dflt = {{"n_ctx", o.ctx},
                {"temperature", d.temp},
                {"top_k", d.top_k},
                {"top_p", d.top_p},
                {"min_p", d.min_p},
                {"repeat_penalty", d.repeat_penalty},
                {"repeat_last_n", d.repeat_last_n},
                {"seed", lim.fixed_seed ? ojson(d.seed) : ojson(nullptr)},
                {"max_tokens", lim.default_max_tokens > 0 ? ojson(lim.default_max_tokens) : ojson(nullptr)},
                {"completion_max_tokens", 16},
                {"thinking", true},
                {"thinking_effort", "max"},
                // --reasoning-budget: the thinking cap of a request that gives none (null: no cap)
                {"thinking_budget_tokens", lim.thinking_budget >= 0 ? ojson(lim.thinking_budget) : ojson(nullptr)}};
  return json_reply(ojson{{"model", o.model_id},
                          {"model_path", o.model_path},
                          {"n_ctx", o.ctx},
                          {"total_slots", o.sched.parallel},
                          {"chat_template", "kimi-k3 (built in: tokenizer/chat.cpp renders the K3 template)"},
                          {"max_prompt_tokens", prompt_limit(lim)},
                          {"max_tokens", lim.max_tokens > 0 ? lim.max_tokens : o.ctx},
                          {"default_generation_settings", dflt}});
}

// llama-server's /slots: one entry per sequence of the context (the first --parallel run
// requests; the rest keep earlier prompts), with the tokens each holds in its cache.
httpd::Reply Server::Impl::slots() const {
  ojson arr = ojson::array();
  for (const SlotInfo& s : sched->slots()) {
    ojson j = {{"id", s.id},
               {"state", s.busy ? "processing" : "idle"},
               {"is_processing", s.busy},
               {"prefix_entry", s.prefix},
               {"n_ctx", o.ctx},
               {"n_tokens_cached", s.n_cached}};
    if (s.busy) j["request"] = {{"n_prompt_tokens", s.n_prompt}, {"n_prompt_tokens_processed", s.n_prompt_done},
                                {"n_decoded", s.n_decoded}};
    arr.push_back(std::move(j));
  }
  return json_reply(arr);
}

// llama-server's slot actions: POST /slots/{id}?action=save|restore (body {"filename": NAME}, a file
// in --slot-save-path) and ?action=erase. The scheduler does them between steps on an idle slot.
httpd::Reply Server::Impl::slot_action(const httpd::Request& req) {
  const std::string sid = req.path.substr(std::strlen("/slots/"));
  if (sid.empty() || sid.size() > 9 || sid.find_first_not_of("0123456789") != std::string::npos)
    throw ApiError(400, fmt::format("invalid slot id '{}' in the path (POST /slots/ID?action=...)", sid),
                   "invalid_request_error", "id_slot");
  const int id = std::stoi(sid);
  std::string action;
  std::set<std::string> seen;  // a parameter given twice is ambiguous (?action=save&action=restore): 400
  for (size_t p = 0; p < req.query.size();) {
    size_t e = req.query.find('&', p);
    if (e == std::string::npos) e = req.query.size();
    const std::string kv = req.query.substr(p, e - p);
    const std::string key = kv.substr(0, kv.find('='));
    if (!key.empty() && !seen.insert(key).second)
      throw ApiError(400, fmt::format("query parameter '{}' is given more than once", key.substr(0, 64)),
                     "invalid_request_error", key.substr(0, 64));
    if (key == "action") action = kv.size() > 7 ? kv.substr(7) : std::string();
    p = e + 1;
  }
  if (action != "save" && action != "restore" && action != "erase")
    throw ApiError(400, fmt::format("invalid action '{}': use ?action=save, restore or erase", action),
                   "invalid_request_error", "action");
  Scheduler::SlotAction r;
  std::string filename;
  if (action == "erase") {
    r = sched->slot_erase(id);
  } else {
    const ojson b = parse_body(req.body);
    const ojson* f = b.is_object() && b.contains("filename") ? &b["filename"] : nullptr;
    if (!f || !f->is_string())
      throw ApiError(400, "'filename' is required: a string, the name of a file in --slot-save-path",
                     "invalid_request_error", "filename");
    filename = f->get<std::string>();
    // at most 200 bytes: the temporary name written next to it (NAME.kimi-tmp.PID.RANDOM) must fit
    // the 255 bytes a file name can have
    bool plain = !filename.empty() && filename.size() <= 200 && filename != "." && filename.find("..") == std::string::npos;
    for (unsigned char ch : filename) plain = plain && ch >= 0x20 && ch != 0x7f && ch != '/' && ch != '\\' && ch != ':';
    if (!plain)
      throw ApiError(400,
                     fmt::format("invalid 'filename' {}: a plain file name (1 to 200 bytes, not '.', no '/', '\\', ':', "
                                 "'..' or control characters)", ojson(filename.substr(0, 256)).dump(-1, ' ', false, ojson::error_handler_t::replace)),
                     "invalid_request_error", "filename");
    const std::filesystem::path path = std::filesystem::path(o.slot_save_path) / filename;
    if (action == "save") {
      std::error_code ec;
      std::filesystem::create_directories(o.slot_save_path, ec);
      r = sched->slot_save(id, path.string());
    } else {
      r = sched->slot_restore(id, path.string());
      if (r.status == 400) r.error = fmt::format("cannot restore slot {} from '{}': {}", id, filename, r.error);
    }
  }
  if (r.status != 200) {
    const char* type = r.status == 404   ? "not_found_error"
                       : r.status == 501 ? "not_supported_error"
                       : r.status >= 500 ? "server_error"
                                         : "invalid_request_error";
    return error_reply(r.status, r.error, type, r.status == 404 || r.status == 409 ? "id_slot" : action == "erase" ? "" : "filename");
  }
  const double ms = std::round(r.ms * 1000) / 1000;
  if (action == "save")
    return json_reply(ojson{{"id_slot", id}, {"filename", filename}, {"n_saved", r.n}, {"n_written", r.bytes},
                            {"timings", {{"save_ms", ms}}}});
  if (action == "restore")
    return json_reply(ojson{{"id_slot", id}, {"filename", filename}, {"n_restored", r.n}, {"n_read", r.bytes},
                            {"timings", {{"restore_ms", ms}}}});
  return json_reply(ojson{{"id_slot", id}, {"n_erased", r.n}});
}

// On a handler thread.
void Server::Impl::handle(const httpd::Request& req, httpd::Responder& res) {
  in_flight.fetch_add(1);
  struct Dec {
    std::atomic<int>& c;
    ~Dec() { c.fetch_sub(1); }
  } dec{in_flight};
  try {
    if (req.path == "/v1/chat/completions") return openai_chat(endpoint(req), req, res);
    if (req.path == "/v1/completions") return openai_completions(endpoint(req), req, res);
    if (req.path == "/tokenize") return void(res.send(tokenize(req)));
    if (req.path == "/v1/messages") return anthropic_messages(endpoint(req), req, res);
    if (req.path == "/v1/messages/count_tokens") return anthropic_count_tokens(endpoint(req), req, res);
    if (req.path == "/v1/responses") return openai_responses(endpoint(req), req, res);
    if (req.path == "/detokenize") return void(res.send(detokenize(req)));
    if (req.path.rfind("/slots/", 0) == 0) return void(res.send(slot_action(req)));
    res.send(error_reply(404, "no such endpoint: " + req.method + " " + req.path));
  } catch (const ApiError& e) {
    if (!res.started()) res.send(server::error_reply(e));
  } catch (const kimi::Error& e) {
    if (!res.started()) res.send(error_reply(400, e.what()));
  } catch (const std::exception& e) {
    if (!res.started()) res.send(error_reply(500, std::string("internal error: ") + e.what()));
  }
}

httpd::Reply Server::Impl::tokenize(const httpd::Request& req) const {
  const ojson b = parse_body(req.body);
  const ojson* c = nullptr;
  for (const char* k : {"content", "text", "prompt"})
    if (b.contains(k)) {
      c = &b[k];
      break;
    }
  if (!c) throw ApiError(400, "'content' is required", "invalid_request_error", "content");
  if (!c->is_string()) throw ApiError(400, "'content' must be a string", "invalid_request_error", "content");
  bool special = true;
  if (b.contains("special")) {
    if (!b["special"].is_boolean()) throw ApiError(400, "'special' must be a boolean", "invalid_request_error", "special");
    special = b["special"].get<bool>();
  }
  bool pieces = false;
  if (b.contains("with_pieces")) {
    if (!b["with_pieces"].is_boolean())
      throw ApiError(400, "'with_pieces' must be a boolean", "invalid_request_error", "with_pieces");
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
  return json_reply(out);
}

httpd::Reply Server::Impl::detokenize(const httpd::Request& req) const {
  const ojson b = parse_body(req.body);
  if (!b.contains("tokens")) throw ApiError(400, "'tokens' is required", "invalid_request_error", "tokens");
  const ojson& t = b["tokens"];
  if (!t.is_array()) throw ApiError(400, "'tokens' must be an array of token ids", "invalid_request_error", "tokens");
  std::vector<int32_t> ids;
  const int64_t nv = tok->n_vocab();
  for (size_t i = 0; i < t.size(); ++i) {
    if (!t[i].is_number_integer())
      throw ApiError(400, fmt::format("'tokens[{}]' must be an integer", i), "invalid_request_error", "tokens");
    const int64_t id = t[i].is_number_unsigned() && t[i].get<uint64_t>() > static_cast<uint64_t>(INT64_MAX) ? -1 : t[i].get<int64_t>();
    if (id < 0 || id >= nv)
      throw ApiError(400, fmt::format("'tokens[{}]': token id {} is out of range 0..{}", i, t[i].dump(), nv - 1),
                     "invalid_request_error", "tokens");
    ids.push_back(static_cast<int32_t>(id));
  }
  return json_reply(ojson{{"content", tok->decode(ids)}});
}

void Server::Impl::record_ttft(const Job::Result& r) {
  if (r.ttft_s < 0) return;
  std::lock_guard<std::mutex> lk(mmu);
  ttft_sum += r.ttft_s;
  ++ttft_n;
}

Endpoint Server::Impl::endpoint(const httpd::Request& req) {
  const auto t0 = Clock::now();
  return Endpoint{*tok, lim, o.model_id,
                  [this](std::vector<int32_t> prompt, const GenParams& gen) {
                    if (stopping.load()) throw ApiError(503, "server is shutting down", "server_unavailable_error");
                    auto job = std::make_shared<Job>(std::move(prompt), gen);
                    if (!sched->submit(job)) {
                      if (sched->shutting_down()) throw ApiError(503, "server is shutting down", "server_unavailable_error");
                      throw ApiError(503, fmt::format("server is busy: the request queue is full ({} waiting)",
                                                      sched->options().queue_limit),
                                     "server_unavailable_error", "", "queue_full");
                    }
                    return job;
                  },
                  [this](const char* prefix) { return new_id(prefix); },
                  [this, &req, t0](const std::string& id, const std::vector<Job::Result>& rs) {
                    for (const Job::Result& r : rs) record_ttft(r);
                    log_generation(req, id, rs, std::chrono::duration<double>(Clock::now() - t0).count());
                  }};
}

// One line per generation request on stderr: prompt and generation speed (as llama-server logs).
void Server::Impl::log_generation(const httpd::Request& req, const std::string& id, const std::vector<Job::Result>& rs,
                                  double total_s) {
  if (rs.empty() || o.quiet) return;
  // The prompt: the first choice's evaluation (admitted -> first token, or -> its end when it ended
  // before one). The generation: every choice's tokens over one interval, from the first token of any
  // choice to the end of the last (the choices overlap, or run one after another when n > slots);
  // the very first token belongs to the prompt's time.
  int n_gen = 0;
  double first = 1e300, last = 0;
  for (const auto& r : rs) {
    n_gen += r.n_generated;
    if (r.n_generated > 0) {
      first = std::min(first, r.ttft_s);
      last = std::max(last, r.total_s);
    }
  }
  const double gen_s = n_gen > 0 ? std::max(0.0, last - first) : 0.0;
  const Job::Result& r0 = rs[0];
  const double prefill_s = r0.prefill_s;
  const int evaluated = r0.n_prompt - r0.n_cached;
  std::fprintf(stderr,
               "kimi serve: %s %s %s: %s; prompt %d tokens (%d cached) %.3f s, %.1f tok/s; generated %d tokens "
               "%.3f s, %.1f tok/s; total %.3f s\n",
               req.method.c_str(), req.path.c_str(), id.c_str(), std::string(to_string(r0.finish_reason)).c_str(), r0.n_prompt, r0.n_cached,
               prefill_s, prefill_s > 0 ? evaluated / prefill_s : 0.0, n_gen, gen_s,
               gen_s > 0 && n_gen > 1 ? (n_gen - 1) / gen_s : 0.0,
               total_s);
  if (r0.n_images > 0) {  // the tower's part of the prompt time
    const std::string hits =
        r0.n_images_cached > 0 ? fmt::format(", {} from the tower cache", r0.n_images_cached) : std::string();
    if (r0.vision_s >= 0)
      std::fprintf(stderr, "kimi serve: %s images: %d, %d tokens, vision tower %.3f s%s\n", id.c_str(), r0.n_images,
                   r0.n_image_tokens, r0.vision_s, hits.c_str());
    else if (r0.n_images_cached > 0)
      std::fprintf(stderr, "kimi serve: %s images: %d, %d tokens, vision tower skipped%s\n", id.c_str(), r0.n_images,
                   r0.n_image_tokens, hits.c_str());
    else
      std::fprintf(stderr, "kimi serve: %s images: %d, %d tokens, all from the prompt cache\n", id.c_str(),
                   r0.n_images, r0.n_image_tokens);
  }
  int drafted = 0, accepted = 0, steps = 0, paused = 0;
  for (const auto& r : rs) drafted += r.spec_drafted, accepted += r.spec_accepted, steps += r.spec_steps, paused += r.spec_paused;
  if (drafted > 0)
    std::fprintf(stderr, "kimi serve: %s speculative: %d drafted, %d accepted (%.1f %%) in %d verify steps, %.2f accepted per step%s\n",
                 id.c_str(), drafted, accepted, 100.0 * accepted / drafted, steps, steps ? double(accepted) / steps : 0.0,
                 paused ? fmt::format(", {} steps without drafting (did not pay)", paused).c_str() : "");
}

std::string Server::Impl::metrics() const {
  const SchedulerStats s = ready.load(std::memory_order_acquire) ? sched->stats() : SchedulerStats{};
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
  metric("kimi_thinking_forced_tokens_total", "counter",
         "tokens of the close of thinking forced by a thinking budget (decoded in the step of the token before them)",
         one("kimi_thinking_forced_tokens_total", s.forced_tokens));
  metric("kimi_decode_seconds_total", "counter", "time spent in batched decode", one("kimi_decode_seconds_total", s.busy_s));
  // speculative decoding (docs/speculative.md)
  metric("kimi_spec_verify_steps_total", "counter", "speculative verify steps (a request's draft checked in a step)",
         one("kimi_spec_verify_steps_total", s.spec_verify_steps));
  metric("kimi_spec_drafted_tokens_total", "counter", "tokens drafted and verified", one("kimi_spec_drafted_tokens_total", s.spec_drafted));
  metric("kimi_spec_accepted_tokens_total", "counter", "drafted tokens accepted", one("kimi_spec_accepted_tokens_total", s.spec_accepted));
  metric("kimi_spec_recomputed_tokens_total", "counter", "accepted tokens decoded again after a KDA rollback",
         one("kimi_spec_recomputed_tokens_total", s.spec_recomputed));
  metric("kimi_spec_paused_steps_total", "counter", "steps of \"auto\" requests decoded without a draft because drafting did not pay",
         one("kimi_spec_paused_steps_total", s.spec_paused));
  metric("kimi_prefix_cache_entries_total", "counter", "prefix entries stored at divergence points",
         one("kimi_prefix_cache_entries_total", s.prefix_entries));
  // the prompt-cache store (server/prompt_cache.h; all 0 without --cache-ram)
  metric("kimi_prompt_cache_entries", "gauge", "entries in the prompt-cache store", one("kimi_prompt_cache_entries", s.cache.entries));
  metric("kimi_prompt_cache_bytes", "gauge", "memory held by the prompt-cache store", one("kimi_prompt_cache_bytes", s.cache.bytes));
  metric("kimi_prompt_cache_hits_total", "counter", "requests resumed from the prompt-cache store",
         one("kimi_prompt_cache_hits_total", s.cache.hits));
  metric("kimi_prompt_cache_evictions_total", "counter", "store entries evicted under --cache-ram",
         one("kimi_prompt_cache_evictions_total", s.cache.evictions));
  metric("kimi_prompt_cache_disk_writes_total", "counter", "store entries written to --cache-dir",
         one("kimi_prompt_cache_disk_writes_total", s.cache.disk_writes));
  metric("kimi_prompt_cache_disk_loads_total", "counter", "store entries read back from --cache-dir",
         one("kimi_prompt_cache_disk_loads_total", s.cache.disk_loads));
  if (s.hot_picks + s.host_picks > 0) {  // --gpu-experts (docs/gpu.md, "Hot experts")
    metric("kimi_routed_expert_picks_total", "counter", "routed expert picks run by the GPU's hot experts / by the CPU",
           fmt::format("kimi_routed_expert_picks_total{{device=\"gpu\"}} {}\nkimi_routed_expert_picks_total{{device=\"cpu\"}} {}\n",
                       s.hot_picks, s.host_picks));
    metric("kimi_hot_expert_reranks_total", "counter", "re-rankings of the GPU's hot experts by the picks counted",
           one("kimi_hot_expert_reranks_total", s.hot_reranks));
  }
  if (s.vision) {
    metric("kimi_vision_images_total", "counter", "images of requests by where their tower output came from",
           fmt::format("kimi_vision_images_total{{source=\"tower\"}} {}\nkimi_vision_images_total{{source=\"cache\"}} {}\n",
                       s.vis.images_encoded, s.vis.images_cached));
    metric("kimi_vision_tower_runs_total", "counter", "vision tower runs (one per request that needed it)",
           one("kimi_vision_tower_runs_total", s.vis.runs));
    metric("kimi_vision_tower_seconds_total", "counter", "time spent in the vision tower",
           one("kimi_vision_tower_seconds_total", s.vis.tower_s));
    metric("kimi_vision_cache_entries", "gauge", "images in the tower-output cache",
           one("kimi_vision_cache_entries", s.vis.cache_entries));
    metric("kimi_vision_cache_bytes", "gauge", "memory held by the tower-output cache",
           one("kimi_vision_cache_bytes", s.vis.cache_bytes));
    metric("kimi_vision_cache_evictions_total", "counter", "tower outputs evicted under --vision-cache",
           one("kimi_vision_cache_evictions_total", s.vis.cache_evictions));
  }
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
