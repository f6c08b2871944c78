// `kimi serve`: an OpenAI-compatible HTTP server (httpd.h: one event thread reads requests,
// handler threads answer them) in front of the continuous-batching Scheduler. See docs/server.md for endpoints and flags.
//
//   kimi::server::ServerOptions o;  o.model_path = "m.gguf";  o.port = 0;   // 0: ephemeral
//   kimi::server::Server s(o);      // loads the model, starts the scheduler thread
//   int port = s.bind();            // binds o.host:o.port, returns the port
//   std::thread t([&] { s.run(); });
//   ...
//   s.shutdown();                   // graceful: stop accepting, finish/cancel within the grace
//                                   // (load_in_background: run() loads the model first and throws
//                                   // kimi::Error when that fails)
//   t.join();
#pragma once
#include <functional>
#include <memory>
#include <optional>
#include <string>

#include "server/scheduler.h"

namespace kimi::server {

struct ServerOptions {
  std::string model_path;
  std::string model_id;             // name in /v1/models and responses (default: file stem)
  std::string host = "127.0.0.1";
  int port = 8080;                  // 0: ephemeral
  // engine
  int threads = 0;
  std::string attn = "sparse";
  int attn_top_k = -1;
  std::string precision = "fast";
  std::string cache_type = "f16";
  bool indexer_int8 = false;  // --indexer-int8 (ContextOptions::indexer_int8)
  Collective* collective = nullptr;  // under mpirun: the ranks that run the model with this one
  SplitMode split_mode = SplitMode::Tensor;  // (docs/distributed.md)
  PlacementRules placement;         // which backend holds each weight (-ngl, --cpu-moe, -ot)
  std::vector<Backend*> extra_backends;  // accelerators (devices 1..; not owned, outlive the server)
  ExpertStreamOptions stream;       // routed experts: streamed from disk, hot experts, overlap (ContextOptions::stream)
  // The engine options as one struct (kimi serve: app/engine_args' context_options, which pins
  // threads for --cpu-affinity / --numa); when set, the engine fields above are not read, and the
  // context's positions and batch size are still the server's (ctx, sched).
  std::optional<ContextOptions> engine;
  int ctx = 4096;                   // positions per sequence
  // for requests that leave a field out (Limits::sampling): K3's sampling contract, temperature 1.0, top_p 0.95
  SamplerParams sampling = {.temp = 1.0f, .top_p = 0.95f};
  bool fixed_seed = false;          // requests without "seed" use sampling.seed (else a random one)
  SchedulerOptions sched;
  // images (docs/server.md "Images"): the projector file ("": MODEL.mmproj.gguf beside the model
  // when it exists), no_mmproj: serve text only; the limits of one request
  std::string mmproj;
  bool no_mmproj = false;
  // the tower's own backend (kimi serve: a Vulkan one when the model's layers are on Vulkan,
  // app::side_backend; docs/gpu.md "Side models"); nullptr: a CPU backend of the server's threads
  std::shared_ptr<Backend> vision_backend;
  // threads of the tower's CPU backend (0: the engine's); the tower runs beside the engine's
  // decode steps (docs/engine.md "Images in the server"), so the two counts share the cores then
  int vision_threads = 0;
  int image_max_count = 16;
  uint64_t image_max_bytes = uint64_t{20} << 20;
  uint64_t image_max_pixels = 40'000'000;
  // safety
  std::string api_key;              // empty: no auth
  std::string cors_origin;          // empty: no CORS headers
  size_t max_body = 8u << 20;       // bytes
  int max_prompt_tokens = 0;        // 0: ctx - 1
  int max_tokens = 0;               // per-request max_tokens limit (0: ctx)
  int default_max_tokens = 0;       // chat default (0: what the context allows)
  int reasoning_budget = -1;        // thinking tokens of a chat request that gives no budget (-1: no cap)
  int max_connections = 64;         // requests handled concurrently (handler threads)
  int max_open_connections = 1024;  // open connections (slow or idle ones cost no thread)
  double head_timeout_s = 10;       // a whole request head must arrive within this
  double body_timeout_s = 60;       // a whole request body must arrive within this
  double timeout_s = 600;           // per request, 0 = none
  double grace_s = 10;              // shutdown grace period
  std::string slot_save_path;       // POST /slots/{id}?action=save|restore files go here ("": 501)
  bool verbose = false;             // log every HTTP request to stderr
  bool quiet = false;               // no line per generation request (prompt / generation speed)
  // Load the model in run() (after bind()): meanwhile /health answers 503 {"status":"loading model"}
  // and the other endpoints 503. Default: the constructor loads it (and throws on a bad file).
  bool load_in_background = false;
  int test_load_delay_ms = 0;       // tests: the background load waits this long first
  std::function<void()> on_loaded;  // called (on the loading thread) once requests are served
};

class Server {
 public:
  explicit Server(const ServerOptions& opts);
  ~Server();
  Server(const Server&) = delete;
  Server& operator=(const Server&) = delete;

  int bind();        // throws kimi::Error when the address cannot be bound; returns the port
  void run();        // serves until shutdown(); returns once in-flight requests are done
  void shutdown();   // thread-safe, returns immediately (run() returns when drained; meanwhile
                     // /health and new requests get 503)
  Scheduler& scheduler();
  std::string metrics_text() const;
  bool loaded() const;  // the model is loaded and requests are served

  struct Impl;

 private:
  std::unique_ptr<Impl> impl_;
};

}  // namespace kimi::server
