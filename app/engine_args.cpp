// Shared engine / placement / sampling options of the engine commands (engine_args.h).
#include "engine_args.h"

#include <algorithm>
#include <cstdio>
#include <cctype>
#include <cstdlib>
#include <filesystem>
#include <regex>
#include <sstream>

#ifdef KIMI_HAVE_VULKAN
#include "backend/vulkan/vulkan_backend.h"
#endif
#include "io/imatrix.h"
#include "model/dspark.h"
#include "runtime/dspark_drafter.h"
#include "util/cli.h"
#include "util/error.h"
#include "util/numa.h"
#include "util/thread_pool.h"

namespace kimi::app {

namespace {

// Backends kimi.cpp knows of but this build does not have (the error says so instead of "unknown").
constexpr const char* kOtherBackends[] = {"vulkan", "cuda", "hip", "rocm", "metal", "sycl", "opencl", "mpi"};

std::string device_list() {
  std::string s;
  for (const auto& d : compiled_devices()) s += (s.empty() ? "" : ", ") + d;
  return s;
}

#ifdef KIMI_HAVE_VULKAN
// "vulkan" or "vulkan:N": a Vulkan device (opened, and so checked, when the context is made)
bool is_vulkan_item(const std::string& item) {
  if (item == "vulkan") return true;
  if (item.rfind("vulkan:", 0) != 0 || item.size() == 7 || item.size() > 11) return false;
  return item.find_first_not_of("0123456789", 7) == std::string::npos;
}
#endif

// --device item: "cpu", "vulkan[:N]" when compiled in, or BACKEND[:N] for a backend that is not
// compiled in (an error naming what this build has).
std::string check_device(const std::string& item) {
  for (const auto& d : compiled_devices())
    if (item == d) return "";
#ifdef KIMI_HAVE_VULKAN
  if (is_vulkan_item(item)) return "";
#endif
  const std::string backend = item.substr(0, item.find(':'));
  for (const char* b : kOtherBackends)
    if (backend == b)
      return fmt::format("backend '{}' not compiled in (device '{}'; this build has: {})", backend, item, device_list());
  return fmt::format("unknown device '{}' (this build has: {})", item, device_list());
}

std::string check_devices(const std::string& value) {
  const std::vector<std::string> items = split_devices(value);
  if (items.empty()) return "no device given";
  for (size_t i = 0; i < items.size(); ++i) {
    if (std::string e = check_device(items[i]); !e.empty()) return e;
    for (size_t j = 0; j < i; ++j)
      if (items[j] == items[i]) return fmt::format("device '{}' is listed twice", items[i]);
  }
  return "";
}

// -ot value: REGEX=DEV items; the regex must compile and DEV must name a device of this build.
std::string check_override(const std::string& value) {
  try {
    PlacementRules r;
    r.overrides = parse_tensor_overrides(value);
    std::vector<std::string> devs{"cpu"};  // every device name an -ot rule may use in this build
#ifdef KIMI_HAVE_VULKAN
    for (int i = 0; i < 8; ++i) devs.push_back(fmt::format("vulkan:{}", i));
#endif
    resolve_placement(r, devs, {}, 0);  // compiles the patterns, looks the devices up
    return "";
  } catch (const Error& e) {
    return e.what();
  }
}

// -m: a Hugging Face checkpoint directory gets the command that converts it.
std::string check_model_file(const std::string& path) {
  std::error_code ec;
  if (!std::filesystem::is_directory(path, ec)) return "";
  if (std::filesystem::exists(std::filesystem::path(path) / "config.json", ec))
    return fmt::format("'{}' is a Hugging Face checkpoint; convert it with `kimi convert {} -o FILE.gguf`", path, path);
  return "";  // the model loader names the problem
}

std::string check_mem_budget(const std::string& v) {
  try {
    (void)parse_mem_budget(v);
    return "";
  } catch (const Error& e) {
    // CLI11 puts the option's name in front of a validator's message: do not say it twice
    const std::string m = e.what(), prefix = "--mem-budget: ";
    return m.rfind(prefix, 0) == 0 ? m.substr(prefix.size()) : m;
  }
}

// A sampling value in [lo, hi] (or (lo, hi] when lo_open): an error that names the range.
std::string in_range(const std::string& v, double lo, double hi, bool lo_open) {
  char* end = nullptr;
  const double d = std::strtod(v.c_str(), &end);
  if (end == v.c_str() || *end) return fmt::format("'{}' is not a number", v);
  if (!(d <= hi && (lo_open ? d > lo : d >= lo)))
    return fmt::format("{} is out of range {}{}, {}]", v, lo_open ? "(" : "[", lo, hi);
  return "";
}
CLI::Validator range_check(double lo, double hi, bool lo_open = false) {
  return CLI::Validator([=](std::string& v) { return in_range(v, lo, hi, lo_open); },
                        fmt::format("{}{},{}]", lo_open ? "(" : "[", lo, hi), "range");
}

}  // namespace

std::vector<std::string> split_devices(const std::string& value) {
  std::vector<std::string> out;
  std::istringstream in(value);
  for (std::string item; std::getline(in, item, ',');)
    if (!item.empty()) out.push_back(item);
  return out;
}

const std::vector<std::string>& compiled_devices() {
#ifdef KIMI_HAVE_VULKAN
  static const std::vector<std::string> d = {"cpu", "vulkan"};
#else
  static const std::vector<std::string> d = {"cpu"};
#endif
  return d;
}

std::vector<Backend*> open_accelerators(const EngineArgs& a) {
  std::vector<Backend*> out;
#ifdef KIMI_HAVE_VULKAN
  // opened once and kept for the process (contexts come and go; device start-up is slow)
  static auto* opened = new std::vector<std::pair<std::string, std::unique_ptr<Backend>>>();
#endif
  for (const std::string& item : split_devices(a.device)) {
    if (item == "cpu") continue;
#ifdef KIMI_HAVE_VULKAN
    if (is_vulkan_item(item)) {
      const int idx = item == "vulkan" ? 0 : std::stoi(item.substr(7));
      const std::string key = fmt::format("vulkan:{}", idx);
      Backend* be = nullptr;
      for (auto& [k, b] : *opened)
        if (k == key) be = b.get();
      if (!be) {
        opened->emplace_back(key, make_vulkan_backend(idx, a.precision == "f32" ? Precision::F32 : Precision::Fast));
        be = opened->back().second.get();
      }
      out.push_back(be);
      continue;
    }
#endif
    fail("--device: '{}' is not available in this build", item);
  }
  return out;
}

void add_engine_options(CLI::App& app, EngineArgs& a, const EngineSpec& spec) {
  a.ctx = spec.ctx_default;
  app.add_option("-m,--model", a.model, spec.model_help)->required()->check(CLI::Validator(check_model_file, "FILE.gguf", "model"));
  app.add_option("-t,--threads", a.threads, spec.threads_help);
  app.add_option("--attn", a.attn, "attention path: sparse (gather the selected rows) or dense (masked softmax)")
      ->check(CLI::IsMember({"sparse", "dense"}));
  app.add_option("--attn-top-k", a.attn_top_k, "DSA top-k: -1 = from the file, 0 = indexer off, N = override");
  app.add_option("--precision", a.precision, "fast (bf16/Q8_0 activations, F16 caches) or f32")
      ->check(CLI::IsMember({"fast", "f32"}));
  app.add_option("--cache-type", a.cache_type, "cache element type in fast mode: f16 or f32")
      ->check(CLI::IsMember({"f16", "f32"}));
  app.add_flag("--indexer-int8", a.indexer_int8,
               "K3.1 DSA indexer: int8 keys (136 instead of 256 bytes per key and layer) and int8 scores (VNNI, "
               "~5x faster scans at long context); scores change at the 1e-2 level, so near-tied positions may be "
               "selected differently (default: f16 keys, f32 scores); cpu only, fast precision only");
  app.add_option("--split-mode", a.split_mode,
                 "under mpirun: tensor (experts, heads and rows split over the ranks) or layer (contiguous "
                 "layers per rank); docs/distributed.md")
      ->check(CLI::IsMember({"tensor", "layer"}));
  app.add_option("-c,--ctx,--ctx-size", a.ctx, spec.ctx_help)->check(CLI::Range(spec.ctx_min, 1 << 24));
  if (spec.batch)
    app.add_option("-b,--batch,--batch-size,--ubatch-size", a.batch, spec.batch_help)->check(CLI::Range(1, INT32_MAX));
  app.add_option("--flash-attn", a.flash_attn, "-fa on|off|auto: accepted for llama.cpp scripts; no effect (attention is always fused)")
      ->check(CLI::IsMember({"on", "off", "auto"}));
  app.add_flag("-v,--verbose", a.verbose, spec.verbose_help);
  app.add_option("--numa", a.numa,
                 "NUMA placement: distribute (threads spread over the nodes, memory interleaved), isolate "
                 "(threads and memory on the starting node), numactl (the CPUs numactl gave); needs libnuma")
      ->check(CLI::IsMember({"distribute", "isolate", "numactl"}));
  app.add_option("--cpu-affinity", a.cpu_affinity,
                 "pin the threads to these CPUs, in order (e.g. 0-15,32-47; thread i on the i-th, repeating); "
                 "with --numa it replaces the CPUs --numa picks")
      ->type_name("LIST");
  // after parsing (before any command loads the model): the memory policy and each thread's CPU
  app.parse_complete_callback([&a] {
    try {
      if (!a.cpu_affinity.empty()) {
        a.cpus = numa::parse_cpu_list(a.cpu_affinity, "--cpu-affinity");
        const std::vector<int> ok = allowed_cpus();
        for (int c : a.cpus)
          if (!ok.empty() && std::find(ok.begin(), ok.end(), c) == ok.end())
            fail("--cpu-affinity: CPU {} is not one this process may run on ({} CPUs allowed)", c, ok.size());
      }
      if (!a.numa.empty()) {
        std::vector<int> cpus = numa::setup(*numa::mode_from_name(a.numa), a.threads);
        if (a.cpus.empty()) a.cpus = std::move(cpus);
      }
    } catch (const Error& e) {
      throw CLI::ValidationError(e.what());
    }
    if (a.threads == 0 && !a.cpus.empty()) a.threads = static_cast<int>(a.cpus.size());
  });

  app.add_option("--device", a.device,
                 "backends to run on, comma-separated: cpu, vulkan or vulkan:N (the default placement puts "
                 "everything that fits on the accelerator, routed experts on the cpu first)")
      ->check(CLI::Validator(check_devices, "DEV[,DEV..]", "device"));
  app.add_option("--n-gpu-layers", a.n_gpu_layers,
                 "-ngl N: the last N layers on the accelerator(s) (-1 = all and the output; no effect on cpu)")
      ->check(CLI::Range(-1, INT32_MAX));
  app.add_flag("--cpu-moe", a.cpu_moe, "keep every layer's routed experts on the cpu");
  app.add_option("--n-cpu-moe", a.n_cpu_moe, "keep the routed experts of the first N layers on the cpu")
      ->check(CLI::Range(0, INT32_MAX));
  app.add_option("--override-tensor", a.override_tensor,
                 "-ot REGEX=DEV: tensors whose name matches REGEX go to device DEV (repeatable; first match wins)")
      ->allow_extra_args(false)  // one value per -ot, as llama.cpp takes it; repeat the flag for more
      ->check(CLI::Validator(check_override, "REGEX=DEV", "override"));
  app.add_option("--mem-budget", a.mem_budget,
                 "memory for routed experts streamed from disk (e.g. 16G): the most used stay cached, the "
                 "others are read when the router picks them; auto = only when the model is larger than "
                 "80 % of the memory, off = read everything through the file mapping")
      ->check(CLI::Validator(check_mem_budget, "SIZE|auto|off", "size"))
      ->capture_default_str();
  app.add_option("--stream-mode", a.stream_mode,
                 "how streamed experts are held: pread (copies in a buffer of the budget's size) or madvise "
                 "(the file mapping, read ahead and dropped by expert)")
      ->check(CLI::IsMember({"pread", "madvise"}))
      ->capture_default_str();
  app.add_option("--stream-threads", a.stream_threads, "streamed experts: reads in flight at once (pread)")
      ->check(CLI::Range(1, 256))
      ->capture_default_str();
  app.add_option("--moe-offload", a.moe_offload,
                 "hybrid mode: run a long micro-batch's routed experts on the accelerator, their weights copied there "
                 "for the step (auto: when the rates measured at load say it beats the CPU; on: always; off: never)")
      ->check(CLI::IsMember({"auto", "on", "off"}))
      ->capture_default_str();
  app.add_option("--moe-offload-min", a.moe_offload_min,
                 "--moe-offload: the smallest micro-batch offloaded, in tokens (0 = 32 x experts / experts per token)")
      ->check(CLI::Validator(
          [](std::string& v) -> std::string {
            char* end = nullptr;
            const long long t = std::strtoll(v.c_str(), &end, 10);
            if (end == v.c_str() || *end || t < 0 || t == 1 || t > INT32_MAX)
              return "'" + v + "' is not 0 or a number of tokens >= 2 (decode never offloads)";
            return "";
          },
          "N", "tokens"))
      ->capture_default_str();
  app.add_option("--moe-offload-pool", a.moe_offload_pool,
                 "--moe-offload: device memory for the experts being copied (two halves, e.g. 2G; auto = 1/8 of the "
                 "device's free memory)")
      ->check(CLI::Validator(
          [](std::string& v) -> std::string {
            if (v == "auto") return "";
            try {
              if (parse_mem_budget(v) > 0) return "";
            } catch (const Error&) {
            }
            return "'" + v + "' is not a size (e.g. 2G, 512M) or auto";
          },
          "SIZE|auto", "size"))
      ->capture_default_str();
  app.add_option("--gpu-experts", a.gpu_experts,
                 "hybrid mode (--cpu-moe / --n-cpu-moe with an accelerator): keep the N most-picked routed experts of "
                 "each such layer on the accelerator too and run their picks there (auto: as many as fit in its free "
                 "memory); ranked by --expert-counts and the picks counted while running (--expert-rerank)")
      ->check(CLI::Validator(
          [](std::string& v) -> std::string {
            if (v == "auto" || (!v.empty() && v.size() < 7 && v.find_first_not_of("0123456789") == std::string::npos))
              return "";
            return "'" + v + "' is not a whole number of experts or auto";
          },
          "N|auto", "experts"))
      ->capture_default_str();
  app.add_option("--expert-counts", a.expert_counts,
                 "an imatrix file of this model (kimi imatrix, or --expert-counts-out): its per-expert token counts "
                 "rank the experts --gpu-experts keeps first (without it: counted while running)");
  app.add_option("--expert-rerank", a.expert_rerank,
                 "--gpu-experts: re-rank the resident experts by the picks counted so far every N tokens (the first "
                 "after 64, then doubling up to N), re-uploading only the experts that changed; 0 = never")
      ->check(CLI::Range(int64_t(0), int64_t(1) << 40))
      ->capture_default_str();
  app.add_option("--expert-decay", a.expert_decay,
                 "--gpu-experts: the counts' half-life in tokens: a pick seen N tokens ago (or a starting count) weighs "
                 "half as much as one seen now, so a long-running server follows its current workload; 0 = never")
      ->check(CLI::Range(int64_t(0), int64_t(1) << 40))
      ->capture_default_str();
  app.add_option("--expert-counts-out", a.expert_counts_out,
                 "--gpu-experts: write the per-expert pick counts (the starting counts plus the picks seen) to FILE "
                 "when the program ends, as an imatrix file --expert-counts reads");
  app.add_option("--hybrid-overlap", a.hybrid_overlap,
                 "hybrid mode: the accelerator runs each MoE layer's shared and hot experts while the CPU runs its "
                 "routed experts (off: one after the other; the results are the same)")
      ->check(CLI::IsMember({"on", "off"}))
      ->capture_default_str();
}

void add_sampling_options(CLI::App& app, SamplerParams& p) {
  app.add_option("--temp", p.temp, "temperature (0 = greedy)")->check(range_check(0, 100));
  app.add_option("--top-k", p.top_k, "top-k sampling (0 = off)")->check(range_check(0, INT32_MAX));
  app.add_option("--top-p", p.top_p, "top-p (nucleus) sampling (1 = off)")->check(range_check(0, 1, true));
  app.add_option("--min-p", p.min_p, "min-p sampling (0 = off)")->check(range_check(0, 1));
  app.add_option("--repeat-penalty", p.repeat_penalty, "repetition penalty (1 = off)")->check(range_check(0, 100, true));
  app.add_option("--repeat-last-n", p.repeat_last_n, "tokens the repetition penalty looks back (-1 = all)")
      ->check(range_check(-1, INT32_MAX));
  app.add_option("--seed", p.seed, "random seed");
}

int parse_engine_cli(CLI::App& app, int argc, char** argv) {
  // llama.cpp's multi-letter short flags, spelled as the long flag of the same meaning
  static const char* const kAliases[][2] = {{"-ngl", "--n-gpu-layers"}, {"-ot", "--override-tensor"},
                                            {"-np", "--parallel"},       {"-ub", "--ubatch-size"},
                                            {"-fa", "--flash-attn"},     {"-md", "--model-draft"}};
  std::vector<std::string> args(argv, argv + argc);
  for (size_t i = 1; i < args.size() && args[i] != "--"; ++i)
    for (const auto& al : kAliases)
      if (args[i] == al[0] && app.get_option_no_throw(al[1])) args[i] = al[1];
  std::vector<char*> ptrs;
  for (auto& s : args) ptrs.push_back(s.data());
  return parse_cli(app, argc, ptrs.data());
}

void add_spec_options(CLI::App& app, SpecArgs& a) {
  app.add_option("--spec", a.type,
                 "speculative decoding (docs/speculative.md): off, ngram (prompt lookup: propose what followed the "
                 "last tokens earlier in the text), dspark (the DSpark draft model of -md), auto (the drafter of -md, "
                 "else ngram, while the cost model of the placement and the measured acceptance say it pays)")
      ->check(CLI::IsMember({"off", "auto", "ngram", "dspark"}))
      ->capture_default_str();
  app.add_option("--model-draft", a.draft_model, "draft model GGUF for --spec dspark or auto (llama.cpp: -md)");
  app.add_option("--draft-max", a.draft_max, "tokens drafted per step at most")
      ->check(CLI::Range(0, 256))
      ->capture_default_str();
  app.add_option("--draft-min", a.draft_min, "shortest draft worth verifying (shorter: a plain step)")
      ->check(CLI::Range(0, 256))
      ->capture_default_str();
}

std::string spec_summary(const SpecArgs& a, const SpecStats& st, const std::string& draft_backend) {
  return fmt::format(
      "speculative ({}{}{}): {} steps, {} with a draft: {} drafted, {} accepted ({:.1f} %), {:.2f} accepted per verify "
      "step, {:.2f} tokens per step, verify step {:.2f}x a decode step{}",
      a.type, a.type != "auto" ? "" : a.draft_model.empty() ? ", ngram" : ", dspark",
      draft_backend.empty() ? std::string() : ", draft on " + draft_backend, st.steps, st.verify_steps, st.drafted, st.accepted,
      100.0 * st.accept_rate(), st.accept_len(), st.tokens_per_step(), st.verify_cost(),
      st.paused ? fmt::format(", {} steps without drafting (did not pay)", st.paused) : std::string());
}

SpecParams spec_params(const SpecArgs& a, bool draft_any_type) {
  check(a.draft_min <= a.draft_max, "--draft-min ({}) must not exceed --draft-max ({})", a.draft_min, a.draft_max);
  const SpecType t = parse_spec_type(a.type, "--spec");
  check(t == SpecType::Dspark || t == SpecType::Auto || draft_any_type || a.draft_model.empty(),
        "-md/--model-draft is used only with --spec dspark or auto");
  SpecParams p;
  p.n_max = a.draft_max;
  p.n_min = a.draft_min;
  p.adaptive = t == SpecType::Auto;
  return p;
}

std::shared_ptr<Backend> side_backend(const EngineArgs& a) {
  if (a.n_gpu_layers == 0) return nullptr;
#ifdef KIMI_HAVE_VULKAN
  for (const std::string& item : split_devices(a.device))
    if (is_vulkan_item(item))
      return make_vulkan_backend(item == "vulkan" ? 0 : std::stoi(item.substr(7)),
                                 a.precision == "f32" ? Precision::F32 : Precision::Fast);
#endif
  return nullptr;
}

std::unique_ptr<Drafter> make_drafter(const SpecArgs& a, const Model& target, int n_ctx, int n_threads,
                                      Precision precision, std::shared_ptr<Backend> backend) {
  switch (parse_spec_type(a.type, "--spec")) {
    case SpecType::Off: return nullptr;
    case SpecType::Ngram: return std::make_unique<NgramDrafter>();
    case SpecType::Auto:  // the DSpark draft when -md gives one, else n-gram
      if (a.draft_model.empty()) return std::make_unique<NgramDrafter>();
      [[fallthrough]];
    case SpecType::Dspark: {
      check(!a.draft_model.empty(), "--spec dspark needs the draft model: -md/--model-draft FILE");
      std::shared_ptr<const DsparkModel> dm = DsparkModel::load(a.draft_model);
      DsparkDrafterOptions o;
      o.n_ctx = n_ctx;
      o.n_threads = n_threads;
      o.precision = precision;
      o.backend = std::move(backend);
      return std::make_unique<DsparkDrafter>(std::move(dm), target, o);
    }
  }
  return nullptr;
}

ModelOptions model_options(const EngineArgs& a) {
  ModelOptions o;
  o.verbose = a.verbose;
  return o;
}

PlacementRules placement_rules(const EngineArgs& a) {
  PlacementRules r;
  r.n_gpu_layers = a.n_gpu_layers;
  if (a.n_gpu_layers == -2) {  // -ngl not given: every layer and the head on the accelerator, if they fit
    r.n_gpu_layers = -1;
    r.auto_fit = true;
  }
  r.cpu_moe = a.cpu_moe;
  r.n_cpu_moe = a.n_cpu_moe;
  for (const auto& v : a.override_tensor)
    for (auto& o : parse_tensor_overrides(v)) r.overrides.push_back(std::move(o));
  return r;
}

ContextOptions context_options(const EngineArgs& a, int n_ctx, int n_batch) {
  ContextOptions o;
  o.n_threads = a.threads;
  o.cpus = a.cpus;
  o.n_seq_max = 1;
  o.n_ctx_max = a.ctx > 0 ? a.ctx : n_ctx;
  o.n_batch_max = n_batch;
  o.attn = a.attn == "dense" ? AttnPath::Dense : AttnPath::Sparse;
  o.attn_top_k = a.attn_top_k;
  o.precision = a.precision == "f32" ? Precision::F32 : Precision::Fast;
  o.cache_type = a.cache_type == "f32" ? CacheType::F32 : CacheType::F16;
  o.indexer_int8 = a.indexer_int8;
  o.placement = placement_rules(a);
  o.collective = collective();
  o.split_mode = split_mode(a);
  o.extra_backends = open_accelerators(a);
  o.stream = stream_options(a);
  return o;
}

ExpertStreamOptions stream_options(const EngineArgs& a) {
  ExpertStreamOptions s;
  s.offload.mode = a.moe_offload == "on"    ? ExpertOffloadOptions::Mode::On
                   : a.moe_offload == "off" ? ExpertOffloadOptions::Mode::Off
                                            : ExpertOffloadOptions::Mode::Auto;
  s.offload.min_tokens = a.moe_offload_min;
  s.offload.pool_bytes = a.moe_offload_pool == "auto" ? -1 : parse_mem_budget(a.moe_offload_pool);
  s.budget_bytes = parse_mem_budget(a.mem_budget);
  s.mode = a.stream_mode == "madvise" ? StreamMode::Madvise : StreamMode::Pread;
  s.io_threads = a.stream_threads;
  s.hot = hot_expert_options(a);
  s.hybrid_overlap = a.hybrid_overlap != "off";
  return s;
}

HotExpertOptions hot_expert_options(const EngineArgs& a) {
  HotExpertOptions h;
  h.per_layer = a.gpu_experts == "auto" ? -1 : std::stoll(a.gpu_experts);
  check(h.per_layer != 0 || a.expert_counts_out.empty(),
        "--expert-counts-out: needs --gpu-experts N|auto (the hot experts count the picks)");
  if (h.per_layer == 0) return h;
  h.rerank_tokens = a.expert_rerank;
  h.decay_tokens = a.expert_decay;
  h.counts_out = a.expert_counts_out;
  if (a.expert_counts.empty()) return h;  // counted while running, from zero
  imatrix::Data d;
  try {
    d = imatrix::Data::load(a.expert_counts);
  } catch (const Error& e) {
    fail("--expert-counts: {}", e.what());
  }
  static const std::regex name(R"(blk\.(\d+)\.ffn_gate_exps\.weight)");
  for (const auto& [n, e] : d.entries) {
    std::smatch m;
    if (!std::regex_match(n, m, name)) continue;
    const size_t il = std::stoul(m[1].str());
    check(il < 4096, "--expert-counts {}: layer {} out of range", a.expert_counts, il);
    if (h.counts.size() <= il) h.counts.resize(il + 1);
    h.counts[il] = e.count;
  }
  check(!h.counts.empty(), "--expert-counts {}: no per-expert counts (blk.N.ffn_gate_exps.weight): not an imatrix of a "
        "MoE model", a.expert_counts);
  return h;
}

int64_t parse_mem_budget(const std::string& s) {
  if (s == "auto") return -1;
  if (s == "off") return 0;
  char* end = nullptr;
  const double v = std::strtod(s.c_str(), &end);
  std::string unit = end ? std::string(end) : "";
  for (auto& c : unit) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  if (!unit.empty() && unit.back() == 'B') unit.pop_back();
  if (unit.size() == 2 && unit[1] == 'I') unit.pop_back();  // GiB = G (binary units either way)
  double mul = 0;
  if (unit.empty()) mul = 1;
  else if (unit == "K") mul = 1024.0;
  else if (unit == "M") mul = 1048576.0;
  else if (unit == "G") mul = 1073741824.0;
  else if (unit == "T") mul = 1099511627776.0;
  check(end != s.c_str() && mul > 0 && v >= 0 && v * mul < 9.2e18,
        "--mem-budget: '{}' is not a size (e.g. 16G, 512M, auto, off)", s);
  return static_cast<int64_t>(v * mul);
}

namespace {
Collective* g_collective = nullptr;
}
Collective* collective() { return g_collective; }
void set_collective(Collective* c) { g_collective = c && c->size() > 1 ? c : nullptr; }
SplitMode split_mode(const EngineArgs& a) { return a.split_mode == "layer" ? SplitMode::Layer : SplitMode::Tensor; }

void print_engine_summary(const EngineArgs& a, const Context& ctx) {
  if (!a.verbose) return;
  std::fprintf(stderr, "%s%s", ctx.memory_summary().c_str(), ctx.placement().summary().c_str());
  if (const std::string plan = ctx.expert_stream_stats().offload_plan; !plan.empty())
    std::fprintf(stderr, "%s\n", plan.c_str());
  if (!a.cpus.empty() || !a.numa.empty())
    std::fprintf(stderr, "%s\n",
                 numa::describe(a.numa.empty() ? numa::Mode::None : *numa::mode_from_name(a.numa), a.cpus).c_str());
}

std::vector<int32_t> parse_token_list(const std::string& s) {
  std::vector<int32_t> out;
  size_t i = 0;
  while (i < s.size()) {
    while (i < s.size() && (s[i] == ' ' || s[i] == ',')) ++i;
    if (i >= s.size()) break;
    size_t j = i;
    while (j < s.size() && s[j] != ',' && s[j] != ' ') ++j;
    const std::string t = s.substr(i, j - i);
    try {
      size_t used = 0;
      long v = std::stol(t, &used);
      check(used == t.size() && v >= 0 && v <= INT32_MAX, "--tokens: '{}' is not a token id", t);
      out.push_back(static_cast<int32_t>(v));
    } catch (const std::logic_error&) {
      fail("--tokens: '{}' is not a token id", t);
    }
    i = j;
  }
  return out;
}

}  // namespace kimi::app
