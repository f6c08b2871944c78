// The command-line options every engine command shares (run, chat, serve, bench, perplexity,
// eval), defined once: the model file, the engine (threads, context, batch, precision, attention,
// caches), weight placement (--device, -ngl, --cpu-moe, --n-cpu-moe, -ot) and, for the commands
// that generate, the sampling flags. Each command adds them to its CLI11 app, then turns them into
// the library's ModelOptions / ContextOptions / SamplerParams.
//
//   CLI::App app{"..."};
//   kimi::app::EngineArgs ea;
//   kimi::app::add_engine_options(app, ea);          // -m -t -c -b --attn ... --device -ngl -ot
//   kimi::SamplerParams sp;
//   kimi::app::add_sampling_options(app, sp);        // --temp --top-k ... --seed
//   if (int rc = kimi::app::parse_engine_cli(app, argc, argv); rc >= 0) return rc;
//   auto model = kimi::Model::load(ea.model, kimi::app::model_options(ea));
//   kimi::Context ctx(*model, kimi::app::context_options(ea, n_ctx, n_batch));
#pragma once
#include <CLI/CLI.hpp>
#include <cstdint>
#include <string>
#include <vector>

#include "backend/placement.h"
#include "model/model.h"
#include "runtime/context.h"
#include "runtime/sampling.h"
#include "runtime/speculative.h"
#include <memory>

namespace kimi::app {

struct EngineArgs {
  std::string model;
  int threads = 0;                   // 0: all cores
  std::string attn = "sparse";       // sparse | dense
  int attn_top_k = -1;               // -1: from the file, 0: indexer off, N: override
  std::string precision = "fast";    // fast | f32
  std::string cache_type = "f16";    // f16 | f32 (fast mode)
  bool indexer_int8 = false;         // --indexer-int8: int8 DSA indexer keys and scores (opt-in)
  int ctx = 0;                       // 0: sized by the command (see EngineSpec::ctx_default)
  int batch = 512;                   // -b: micro-batch cap (tokens per forward step)
  std::string flash_attn = "auto";   // -fa on|off|auto: llama.cpp's flag, accepted, no effect
  bool verbose = false;
  // prefill offload in hybrid mode (model/expert_offload.h, docs/gpu.md "Prefill offload")
  std::string moe_offload = "auto";            // --moe-offload auto|on|off
  int moe_offload_min = 0;                     // --moe-offload-min N (0: 32 x experts / experts used)
  std::string moe_offload_pool = "auto";       // --moe-offload-pool SIZE|auto
  // placement (validated while parsing: a bad value is a usage error naming the flag)
  std::string device = "cpu";                  // --device DEV[,DEV..]: the backends to use
  int n_gpu_layers = -2;                       // -ngl (-2 = not given: fit the accelerator's memory)
  bool cpu_moe = false;                        // --cpu-moe
  int n_cpu_moe = 0;                           // --n-cpu-moe
  std::vector<std::string> override_tensor;    // -ot REGEX=DEV (each may hold several, ',')
  std::string split_mode = "tensor";           // --split-mode tensor|layer (under mpirun)
  // threads and memory (util/numa.h): --numa distribute|isolate|numactl, --cpu-affinity LIST.
  // Resolved once parsing is complete: the memory policy is applied then (before the model is
  // mapped), `cpus` gets the CPU of each pool thread, and threads (when 0) the number of them.
  std::string numa;
  std::string cpu_affinity;
  std::vector<int> cpus;
  // routed experts streamed from disk (model/expert_cache.h, docs/performance.md, section 4)
  std::string mem_budget = "auto";             // --mem-budget SIZE|auto|off
  std::string stream_mode = "pread";           // --stream-mode pread|madvise
  int stream_threads = 16;                     // --stream-threads: reads in flight (pread)
  // hot experts in hybrid mode (model/expert_cache.h HotExperts, docs/gpu.md)
  std::string gpu_experts = "0";               // --gpu-experts N|auto
  std::string expert_counts;                   // --expert-counts FILE (an imatrix's per-expert counts)
  std::string hybrid_overlap = "on";           // --hybrid-overlap on|off (model/moe.cpp)
  int64_t expert_rerank = 1024;                // --expert-rerank N: tokens between re-rankings (0 = never)
  int64_t expert_decay = int64_t(1) << 20;     // --expert-decay N: the counts' half-life in tokens (0 = never)
  std::string expert_counts_out;               // --expert-counts-out FILE: the counts at exit (imatrix format)
};

// What differs between the commands that take EngineArgs.
struct EngineSpec {
  const char* model_help = "GGUF model file (kimi-k3)";
  const char* threads_help = "threads (0 = all cores)";
  const char* ctx_help = "context size per sequence (default: what the command needs)";
  int ctx_default = 0;   // EngineArgs::ctx when -c is not given
  int ctx_min = 0;       // smallest -c accepted
  bool batch = true;     // add -b/--batch (serve sizes its steps with --chunk instead)
  const char* batch_help = "micro-batch size: tokens per forward step";
  const char* verbose_help = "print the model and context summary to stderr";
};

void add_engine_options(CLI::App& app, EngineArgs& a, const EngineSpec& spec = {});

// --temp --top-k --top-p --min-p --repeat-penalty --repeat-last-n --seed, bound to `p` (its values
// are the defaults; the Sampler checks the ranges).
void add_sampling_options(CLI::App& app, SamplerParams& p);

// Speculative decoding (runtime/speculative.h, docs/speculative.md): --spec, -md/--model-draft,
// --draft-max, --draft-min (llama.cpp's names), for run, chat and serve.
struct SpecArgs {
  std::string type = "off";  // --spec auto|off|ngram|dspark
  std::string draft_model;   // -md/--model-draft FILE (the DSpark draft)
  int draft_max = 8;         // --draft-max N
  int draft_min = 0;         // --draft-min N
};
void add_spec_options(CLI::App& app, SpecArgs& a);
// The parameters of the loop (auto: adaptive); kimi::Error naming the flag for a bad combination.
// The summary line of a run with a drafter (stderr of kimi run / kimi chat): steps, drafted and
// accepted tokens, acceptance length, tokens per step, the verify step's cost.
// draft_backend: where the draft runs when not on its own CPU backend ("": nothing said).
std::string spec_summary(const SpecArgs& a, const SpecStats& st, const std::string& draft_backend = "");
// draft_any_type: -md is allowed with any --spec (kimi serve: requests choose dspark themselves)
SpecParams spec_params(const SpecArgs& a, bool draft_any_type = false);
// One drafter for one sequence (nullptr for --spec off): ngram and auto get the n-gram drafter;
// dspark needs -md FILE.
// n_ctx: positions the draft may see (the context's n_ctx_max plus the block); n_threads: the
// draft's own threads (0: all); precision: the draft's (the context's).
// backend: the draft's own (side_backend), nullptr: the draft's own CPU backend.
std::unique_ptr<Drafter> make_drafter(const SpecArgs& a, const Model& target, int n_ctx = 4096, int n_threads = 0,
                                      Precision precision = Precision::Fast,
                                      std::shared_ptr<Backend> backend = nullptr);
// The backend a side model (the DSpark draft, the vision tower) runs on when the target's layers are
// on an accelerator (--device vulkan[:N] and -ngl not 0): a new Vulkan backend on that device, its
// own (a side model reserves its own scratch and runs beside the target's context); nullptr when
// the layers are on the CPU (the side model then makes its own CPU backend).
std::shared_ptr<Backend> side_backend(const EngineArgs& a);

// kimi::parse_cli (util/cli.h) after spelling the llama.cpp-style multi-letter short flags -ngl,
// -ot, -np, -ub, -fa, -md as --n-gpu-layers, --override-tensor, --parallel, --ubatch-size, --flash-attn,
// --model-draft
// where the command has that flag (CLI11 has one-letter short flags only).
int parse_engine_cli(CLI::App& app, int argc, char** argv);

ModelOptions model_options(const EngineArgs& a);
PlacementRules placement_rules(const EngineArgs& a);
// n_ctx: positions per sequence when -c was not given; n_batch: the command's micro-batch.
ContextOptions context_options(const EngineArgs& a, int n_ctx, int n_batch);

// The communicator of this process when it was started by mpirun with more than one rank (set
// by main; nullptr otherwise). context_options passes it on with --split-mode.
Collective* collective();
void set_collective(Collective* c);
SplitMode split_mode(const EngineArgs& a);

// With -v: the context's memory summary and where the placement put each part, on stderr.
void print_engine_summary(const EngineArgs& a, const Context& ctx);

// "16G", "512M", "1.5GiB", "123456" -> bytes; "auto" -> -1; "off", "0" -> 0; kimi::Error naming
// --mem-budget otherwise.
int64_t parse_mem_budget(const std::string& s);

// --gpu-experts / --expert-counts -> the hot experts' options (reads the imatrix file); kimi::Error for a bad file.
HotExpertOptions hot_expert_options(const EngineArgs& a);
// The routed experts' options (ContextOptions::stream): --mem-budget, --stream-*, --moe-offload*, the hot experts,
// --hybrid-overlap; kimi::Error as hot_expert_options.
ExpertStreamOptions stream_options(const EngineArgs& a);

// The backends this build has, in device order (index 0 is the host CPU).
const std::vector<std::string>& compiled_devices();

// The accelerator backends --device names, opened once per process (device order 1..; the CPU
// backend is the context's own device 0). Throws kimi::Error when a device cannot be opened.
std::vector<Backend*> open_accelerators(const EngineArgs& a);

// --device value -> its items ("cpu,vulkan:1" -> cpu, vulkan:1).
std::vector<std::string> split_devices(const std::string& value);

// "1,2,3" (spaces allowed) -> ids; kimi::Error naming --tokens for anything else.
std::vector<int32_t> parse_token_list(const std::string& s);

}  // namespace kimi::app
