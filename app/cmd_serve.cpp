// kimi serve: the command line of the OpenAI-compatible HTTP server. The server itself is the
// library class kimi::server::Server (src/server/server.h, docs/server.md); this file only turns
// flags into ServerOptions and runs it until SIGINT/SIGTERM (graceful shutdown, exit 0).
#include <pthread.h>
#if defined(__GLIBC__)
#include <malloc.h>
#endif

#include <CLI/CLI.hpp>
#include <atomic>
#include <csignal>
#include <cstdio>
#include <filesystem>
#include <thread>

#include "command.h"
#include "engine_args.h"
#include "runtime/vision_input.h"
#include "server/server.h"
#include "util/error.h"
#include "util/numa.h"

namespace {

int cmd_serve(int argc, char** argv) {
  CLI::App app{"OpenAI-compatible HTTP server (continuous batching, prompt cache)"};
  kimi::server::ServerOptions o;
  kimi::app::EngineArgs ea;
  kimi::app::EngineSpec spec;
  spec.model_help = "GGUF model file (kimi-k3, with tokenizer)";
  spec.threads_help = "engine threads (0 = all cores)";
  spec.ctx_help = "context positions per sequence";
  spec.ctx_default = o.ctx;  // 4096
  spec.ctx_min = 8;
  spec.batch = false;  // the step size is --chunk x --max-chunks
  spec.verbose_help = "log the model summary and every request to stderr";
  kimi::app::add_engine_options(app, ea, spec);
  kimi::app::add_sampling_options(app, o.sampling);  // defaults for requests (temperature 1)
  kimi::app::SpecArgs sa;  // speculative decoding for requests that do not choose ("speculative")
  kimi::app::add_spec_options(app, sa);
  app.add_option("--host", o.host, "address to bind (default 127.0.0.1; 0.0.0.0 exposes the server)");
  app.add_option("--port", o.port, "port (0 = ephemeral; the chosen port is printed)")->check(CLI::Range(0, 65535));
  app.add_option("--alias", o.model_id, "model id reported by the API (default: file name stem)");
  app.add_option("-P,--parallel", o.sched.parallel, "slots: requests decoded concurrently (also -np)")->check(CLI::Range(1, 256));
  app.add_option("--cache-slots", o.sched.cache_slots, "extra sequences that keep earlier prompts (-1 = 0 with the prompt-cache store, else --parallel)")
      ->check(CLI::Range(-1, 256));
  bool no_cache = false;
  app.add_flag("--no-prompt-cache", no_cache, "disable the prompt cache (every request prefills its whole prompt)");
  int64_t cache_ram_mib = -1, cache_disk_mib = 10240;
  app.add_option("--cache-ram", cache_ram_mib,
                 "memory of the prompt-cache store in MiB (-1 = min(25% of RAM, 8 GiB); 0 = no store)")
      ->check(CLI::Range(int64_t{-1}, int64_t{1} << 30));
  app.add_option("--cache-dir", o.sched.cache_dir,
                 "write prompt-cache entries to DIR (created) and read them back after a restart");
  app.add_option("--cache-disk", cache_disk_mib, "disk budget of --cache-dir in MiB (oldest files removed first)")
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 30));
  app.add_option("--slot-save-path", o.slot_save_path,
                 "enable POST /slots/ID?action=save|restore|erase; the files are in DIR (created)")
      ->option_text("DIR");
  app.add_option("--chunk,-b,--batch-size,--ubatch-size", o.sched.chunk,
                 "prefill chunk size (tokens); llama-server's -b / -ub are taken as this")
      ->check(CLI::Range(1, 65536));
  app.add_option("--max-chunks", o.sched.max_chunks, "prefill chunks per step")->check(CLI::Range(1, 64));
  app.add_option("--queue", o.sched.queue_limit, "requests waiting for a slot before 503")->check(CLI::Range(0, 1 << 20));
  app.add_option("--api-key", o.api_key, "require Authorization: Bearer KEY (also env KIMI_API_KEY)")->envname("KIMI_API_KEY");
  app.add_option("--cors", o.cors_origin, "allow cross-origin requests from ORIGIN (or *)");
  app.add_option("--max-body", o.max_body, "request body limit (bytes)");
  app.add_option("--mmproj", o.mmproj, "the vision projector file (default: MODEL.mmproj.gguf next to the model, if present)");
  app.add_flag("--no-mmproj", o.no_mmproj, "serve text only, even when MODEL.mmproj.gguf is there");
  app.add_option("--image-max-count", o.image_max_count, "images in one request at most")->check(CLI::NonNegativeNumber);
  app.add_option("--image-max-bytes", o.image_max_bytes, "bytes of one image file at most (after base64)");
  app.add_option("--image-max-pixels", o.image_max_pixels, "pixels (width x height) of one image at most");
  int64_t vision_cache_mib = 256;
  app.add_option("--vision-cache", vision_cache_mib,
                 "memory of the tower-output cache in MiB (images that skip the vision tower; 0 = none)")
      ->check(CLI::Range(int64_t{0}, int64_t{1} << 30));
  app.add_option("--vision-threads", o.vision_threads,
                 "threads of the vision tower on the CPU (0 = as --threads); it runs beside the decode steps")
      ->check(CLI::Range(0, 4096));
  app.add_option("--max-prompt-tokens", o.max_prompt_tokens, "prompt token limit (0 = ctx - 1)")->check(CLI::NonNegativeNumber);
  app.add_option("--max-tokens", o.max_tokens, "limit for a request's max_tokens (0 = ctx)")->check(CLI::NonNegativeNumber);
  app.add_option("--default-max-tokens", o.default_max_tokens, "chat max_tokens when the request has none (0 = up to ctx)")
      ->check(CLI::NonNegativeNumber);
  app.add_option("--reasoning-budget", o.reasoning_budget,
                 "thinking tokens of a request that sets no budget; then the answer is forced (-1 = no cap)")
      ->check(CLI::Range(-1, INT32_MAX));
  app.add_option("--max-connections", o.max_connections, "requests handled concurrently (handler threads)")
      ->check(CLI::Range(1, 4096));
  app.add_option("--max-open-connections", o.max_open_connections, "open connections (slow or idle ones hold no thread)")
      ->check(CLI::Range(1, 1 << 20));
  app.add_option("--head-timeout", o.head_timeout_s, "seconds within which a whole request head must arrive")
      ->check(CLI::PositiveNumber);
  app.add_option("--body-timeout", o.body_timeout_s, "seconds within which a whole request body must arrive")
      ->check(CLI::PositiveNumber);
  app.add_option("--timeout", o.timeout_s, "per-request time limit in seconds (0 = none)")->check(CLI::NonNegativeNumber);
  app.add_flag("-q,--quiet", o.quiet, "no log line per generation request");
  app.add_option("--grace", o.grace_s, "shutdown grace period in seconds")->check(CLI::NonNegativeNumber);
  if (int rc = kimi::app::parse_engine_cli(app, argc, argv); rc >= 0) return rc;
  // SIGINT/SIGTERM are handled by a dedicated thread (blocked everywhere else: set before any thread starts,
  // the accelerators' driver threads included, or a signal may land on one of them and end the process at once)
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGINT);
  sigaddset(&set, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &set, nullptr);
  o.sched.prompt_cache = !no_cache;
  // -md loads the DSpark draft whatever --spec is: requests may then choose "dspark" themselves
  o.sched.spec = kimi::app::spec_params(sa, /*draft_any_type=*/true);
  o.sched.spec_type = kimi::parse_spec_type(sa.type, "--spec");
  kimi::check(o.sched.spec_type != kimi::SpecType::Dspark || !sa.draft_model.empty(),
              "--spec dspark needs the draft model: -md/--model-draft FILE");
  o.sched.draft_model = sa.draft_model;
  o.sched.draft_threads = ea.threads;
  o.sched.cache_ram = cache_ram_mib < 0 ? kimi::server::default_prompt_cache_ram() : uint64_t(cache_ram_mib) << 20;
  o.sched.cache_disk = uint64_t(cache_disk_mib) << 20;
  o.sched.vision_cache = uint64_t(vision_cache_mib) << 20;
  if (!o.sched.cache_dir.empty() && (no_cache || o.sched.cache_ram == 0))
    throw kimi::Error("--cache-dir needs the prompt-cache store (drop --no-prompt-cache / --cache-ram 0)");
  if (!o.sched.cache_dir.empty() && !o.slot_save_path.empty()) {
    // the prompt cache removes files of its own form from its folder to keep its disk budget
    std::error_code ec;
    auto folder = [&](const std::string& d) { return std::filesystem::weakly_canonical(std::filesystem::path(d) / ".", ec); };
    const bool same = folder(o.sched.cache_dir) == folder(o.slot_save_path);
    if (same)
      throw kimi::Error("--slot-save-path and --cache-dir name the same folder ('" + o.slot_save_path +
                        "'): the prompt cache could remove saved slots to keep its disk budget; give them two folders");
  }
  o.model_path = ea.model;
  o.ctx = ea.ctx;
  // the engine options every engine command builds the same way (threads, --cpu-affinity / --numa,
  // precision, placement, accelerators, expert streaming); the server sets positions and batch size
  o.engine = kimi::app::context_options(ea, ea.ctx, 0);
  o.threads = ea.threads;
  // the vision tower on a Vulkan backend of its own when the layers are on Vulkan and there is a tower
  if (!o.no_mmproj && !(o.mmproj.empty() && kimi::find_mmproj(ea.model).empty()))
    o.vision_backend = kimi::app::side_backend(ea);
  if (ea.verbose && (!ea.cpus.empty() || !ea.numa.empty()))
    std::fprintf(stderr, "kimi serve: %s\n",
                 kimi::numa::describe(ea.numa.empty() ? kimi::numa::Mode::None : *kimi::numa::mode_from_name(ea.numa), ea.cpus)
                     .c_str());
  o.fixed_seed = app.count("--seed") > 0;
  o.verbose = ea.verbose;
  o.load_in_background = true;  // bound first: /health says 503 "loading model" until it is loaded
  int port = 0;
  o.on_loaded = [&] {  // scripts wait for this line: from here requests are served
    std::printf("kimi serve: listening on http://%s:%d (model %s, %d slots, ctx %d)\n", o.host.c_str(), port,
                o.model_path.c_str(), o.sched.parallel, o.ctx);
    if (o.ctx < 32768)
      std::printf("kimi serve: a context of %d tokens is short for coding agents (Claude Code, Codex and the like "
                  "send 20-100K-token prompts): give them -c 65536 or more\n",
                  o.ctx);
    std::fflush(stdout);
  };

#if !defined(_WIN32)  // Windows has no SIGPIPE (a send to a closed socket fails with an error)
  std::signal(SIGPIPE, SIG_IGN);
#endif

#if defined(__GLIBC__)
  // Memory of large requests goes back to the system. glibc raises its mmap and trim thresholds
  // after every large free (up to 32 / 64 MiB), and then a handler thread's arena keeps the heap top
  // it freed, which neither free() nor malloc_trim() returns: each 4 MB /tokenize left ~+30 MB
  // resident on a new handler thread. Fixed thresholds: blocks of 1 MiB or more are their own
  // mappings, and an arena's free top beyond 4 MiB is returned.
  mallopt(M_MMAP_THRESHOLD, 1 << 20);
  mallopt(M_TRIM_THRESHOLD, 4 << 20);
#endif
  kimi::server::Server server(o);
  port = server.bind();
  std::fprintf(stderr, "kimi serve: bound to %s:%d, loading %s (/health answers 503 until it is loaded)\n",
               o.host.c_str(), port, o.model_path.c_str());
  std::atomic<bool> done{false}, got_signal{false};
  std::thread sig([&] {
    int s = 0;
    sigwait(&set, &s);
    got_signal.store(true);
    if (done.load()) return;
    std::fprintf(stderr, "kimi serve: %s received, shutting down (grace %.1f s)\n", s == SIGINT ? "SIGINT" : "SIGTERM",
                 o.grace_s);
    server.shutdown();
  });
  std::string load_error;
  try {
    server.run();
  } catch (const kimi::Error& e) {  // the model could not be loaded
    load_error = e.what();
  }
  done.store(true);
  // wake the signal thread if it is still waiting
  if (!got_signal.load()) pthread_kill(sig.native_handle(), SIGTERM);
  sig.join();
  if (!load_error.empty()) throw kimi::Error(load_error);
  std::fprintf(stderr, "kimi serve: stopped\n");
  return 0;
}

kimi::app::Registrar reg("serve", "OpenAI-compatible HTTP server (continuous batching, prompt cache)", cmd_serve);

}  // namespace
