// kimi imatrix: importance matrix of a model over a calibration text (io/imatrix.h, runtime/imatrix_collect.h), written
// in llama.cpp's GGUF imatrix format. docs/quantize.md.
#include <CLI/CLI.hpp>
#include <chrono>
#include <cstdio>
#include <filesystem>

#include "command.h"
#include "engine_args.h"
#include "model/model.h"
#include "runtime/context.h"
#include "io/imatrix.h"
#include "runtime/imatrix_collect.h"
#include "runtime/perplexity.h"
#include "tokenizer/tokenizer.h"
#include "util/error.h"
#include "util/paths.h"

namespace {

int cmd_imatrix(int argc, char** argv) {
  CLI::App app{"Importance matrix: mean squared input activation per column of every weight matrix (per expert for "
               "the routed experts) over a calibration text, in chunks of -c tokens as perplexity. Written in "
               "llama.cpp's GGUF imatrix format (usable by llama-quantize and `kimi quantize --imatrix`)."};
  kimi::app::EngineArgs ea;
  kimi::app::EngineSpec spec;
  spec.ctx_help = "tokens per chunk (default 512)";
  kimi::app::add_engine_options(app, ea, spec);
  std::string text_path, out = "imatrix.gguf";
  int chunks = -1;
  double rare_frac = 0.1;
  app.add_option("-f,--file", text_path, "calibration text")->required();
  app.add_option("-o,--output", out, "output imatrix GGUF (default imatrix.gguf)");
  app.add_option("--chunks", chunks, "use at most N chunks")->check(CLI::Range(1, INT32_MAX));
  app.add_option("--rare", rare_frac,
                 "flag experts that saw fewer than this fraction of their layer's mean token count (default 0.1)")
      ->check(CLI::Range(0.0, 1.0));
  if (int rc = kimi::app::parse_engine_cli(app, argc, argv); rc >= 0) return rc;
  kimi::check(ea.device == "cpu", "imatrix: runs on the CPU backend only (--device {} given)", ea.device);
  kimi::check(std::filesystem::exists(text_path), "{}: cannot open the text file (no such file)", text_path);
  kimi::check(!std::filesystem::is_directory(text_path), "{}: is a directory (expected a text file)", text_path);
  {
    const auto parent = std::filesystem::path(out).parent_path();
    kimi::check(parent.empty() || std::filesystem::is_directory(parent), "-o {}: directory '{}' does not exist", out,
                parent.string());
    kimi::check(!std::filesystem::is_directory(out), "-o {}: is a directory (expected a file path)", out);
  }
  const std::string text = kimi::read_input_file(text_path);

  auto model = kimi::Model::load(ea.model, kimi::app::model_options(ea));
  {
    std::vector<std::string> inputs;
    for (size_t i = 0; i < model->reader().n_files(); ++i) inputs.push_back(model->reader().file_path(i));
    inputs.push_back(text_path);
    kimi::check_outputs_distinct(inputs, {out}, "-o");
  }
  kimi::check(model->reader().has("tokenizer.ggml.tokens"), "{}: the model has no tokenizer, needed to tokenize {}",
              ea.model, text_path);
  auto tok = kimi::tok::Tokenizer::from_gguf(model->reader());
  const std::vector<int32_t> tokens = tok.encode(text, /*allow_special=*/false);

  kimi::ppl::Options po;
  po.n_ctx = ea.ctx > 0 ? ea.ctx : 512;
  po.max_chunks = chunks;
  if (tok.add_bos() && tok.bos_id() >= 0) po.bos_id = tok.bos_id();
  const int n_chunk = kimi::ppl::plan_chunks(static_cast<int64_t>(tokens.size()), po, text_path);

  // every layer and the output on the collecting backend; the context's own CPU backend keeps the
  // token embedding only (one thread: the work runs on the collector's pool)
  kimi::imatrix::Data data;
  kimi::ThreadPool pool(ea.threads);
  kimi::ContextOptions co = kimi::app::context_options(ea, po.n_ctx, std::min(ea.batch, po.n_ctx));
  kimi::imatrix::ImatrixBackend collector(pool, co.precision, data);
  co.n_threads = 1;
  co.placement = kimi::PlacementRules{};
  co.placement.n_gpu_layers = -1;
  co.extra_backends = {&collector};
  kimi::Context ctx(*model, co);
  std::fprintf(stderr, "imatrix: %s: %zu tokens, %d chunks of %d, %d threads\n", text_path.c_str(), tokens.size(),
               n_chunk, po.n_ctx, pool.size());
  const auto t0 = std::chrono::steady_clock::now();
  auto on_chunk = [&](const kimi::ppl::ChunkReport& r) {
    const double el = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    const double eta = r.chunk > 0 ? el / r.chunk * (r.n_chunk - r.chunk) : 0.0;
    std::fprintf(stderr, "[%d/%d] PPL %.4f  %.1f s elapsed, ETA %.1f s\n", r.chunk, r.n_chunk, r.ppl, el, eta);
    std::fflush(stderr);
  };
  const kimi::ppl::Result res = kimi::ppl::evaluate(ctx, tokens, po, on_chunk);
  data.datasets = {std::filesystem::path(text_path).filename().string()};
  data.chunk_count = static_cast<uint32_t>(res.n_chunk);
  data.chunk_size = static_cast<uint32_t>(po.n_ctx);
  data.write_gguf(out);

  size_t n_exp_tensors = 0;
  for (const auto& [name, e] : data.entries) n_exp_tensors += e.n_mat > 1;
  std::printf("imatrix: wrote %s: %zu weight matrices (%zu per-expert stacks), %d chunks x %d tokens, PPL %.4f, "
              "%.1f s\n",
              out.c_str(), data.entries.size(), n_exp_tensors, res.n_chunk, po.n_ctx, res.stats.ppl(), res.seconds);
  const auto rare = kimi::imatrix::rare_experts(data, rare_frac);
  size_t unseen = 0;
  for (const auto& r : rare) unseen += r.count == 0;
  std::printf("imatrix: %zu rare expert slots (< %.0f%% of their tensor's mean token count; %zu never reached)%s\n",
              rare.size(), 100.0 * rare_frac, unseen, rare.empty() ? "" : ":");
  size_t shown = 0;
  for (const auto& r : rare) {
    if (r.name.find("ffn_gate_exps") == std::string::npos) continue;  // gate/up/down share the counts
    if (++shown > 40) {
      std::printf("  ...\n");
      break;
    }
    std::printf("  %s expert %lld: %.0f tokens (mean %.1f)\n", r.name.c_str(), static_cast<long long>(r.expert),
                r.count, r.mean);
  }
  return 0;
}

kimi::app::Registrar reg_imatrix("imatrix", "importance matrix over a calibration text (llama.cpp GGUF imatrix format)",
                         cmd_imatrix);

}  // namespace
