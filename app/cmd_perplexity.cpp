// kimi perplexity: chunked perplexity of a text file, KLD base files and KL-divergence comparison.
// docs/perplexity.md; the library part is src/runtime/perplexity.h.
#include <CLI/CLI.hpp>
#include <chrono>
#include <cstdio>
#include <algorithm>
#include <filesystem>
#include <fmt/format.h>
#include <fstream>
#include <iterator>
#include <nlohmann/json.hpp>
#include <optional>
#include <sstream>

#include "command.h"
#include "engine_args.h"
#include "model/model.h"
#include "runtime/context.h"
#include "runtime/perplexity.h"
#include "tokenizer/tokenizer.h"
#include "util/error.h"
#include "util/paths.h"

namespace {

std::string read_text(const std::string& path) {
  kimi::check(!std::filesystem::is_directory(path), "{}: is a directory (expected a text file)", path);
  kimi::check(std::filesystem::exists(path), "{}: cannot open the text file (no such file)", path);
  return kimi::read_input_file(path);  // regular files only: a FIFO would block
}

int cmd_perplexity(int argc, char** argv) {
  CLI::App app{
      "Perplexity of a text file (chunks of -c tokens, each from an empty context, second half scored), "
      "optionally saving or comparing against a KL-divergence base"};
  kimi::app::EngineArgs ea;
  kimi::app::add_engine_options(app, ea);
  std::string text_path, kld_base_out, kld_base_in, per_token_out, paired_in;
  int chunks = -1, top_n = 32;
  bool json = false;
  app.add_option("-f,--file", text_path,
                 "text file to score (optional with --kl-divergence: the base holds the tokens)");
  app.add_option("--chunks", chunks, "evaluate at most N chunks")->check(CLI::Range(1, INT32_MAX));
  auto* o_base = app.add_option("--kl-divergence-base", kld_base_out,
                                "write the reference distributions (top-N log-probs per scored token) to this file");
  auto* o_cmp =
      app.add_option("--kl-divergence", kld_base_in, "compare against a base written by --kl-divergence-base");
  o_base->excludes(o_cmp);
  app.add_option("--kld-per-token", per_token_out,
                 "with --kl-divergence: write every scored token's KLD, same-top-1 and NLL to this file (text)")
      ->needs(o_cmp);
  app.add_option("--kld-paired", paired_in,
                 "with --kl-divergence: compare this run token by token with another run's --kld-per-token file "
                 "on the same base (mean difference +/- its standard error)")
      ->needs(o_cmp);
  app.add_option("--top-n", top_n, "tokens kept per scored position in a KLD base (default 32)")
      ->check(CLI::Range(1, 65536));
  app.add_flag("--json", json, "print the final numbers as one JSON object on stdout");
  if (int rc = kimi::app::parse_engine_cli(app, argc, argv); rc >= 0) return rc;

  kimi::check(!text_path.empty() || !kld_base_in.empty(), "perplexity: -f TEXT is required (or --kl-divergence BASE)");
  if (!kld_base_out.empty()) {  // fail before the run, not after it
    const auto parent = std::filesystem::path(kld_base_out).parent_path();
    kimi::check(parent.empty() || std::filesystem::is_directory(parent),
                "--kl-divergence-base {}: directory '{}' does not exist", kld_base_out, parent.string());
    kimi::check(!std::filesystem::is_directory(kld_base_out),
                "--kl-divergence-base {}: is a directory (expected a file path)", kld_base_out);
  }

  if (!per_token_out.empty()) {
    const auto parent = std::filesystem::path(per_token_out).parent_path();
    kimi::check(parent.empty() || std::filesystem::is_directory(parent),
                "--kld-per-token {}: directory '{}' does not exist", per_token_out, parent.string());
    kimi::check(!std::filesystem::is_directory(per_token_out),
                "--kld-per-token {}: is a directory (expected a file path)", per_token_out);
  }

  // Load the base first: a bad base file should fail before the model is loaded.
  std::optional<kimi::ppl::KldBase> base;
  if (!kld_base_in.empty()) {
    if (std::filesystem::exists(kld_base_in)) kimi::check_input_regular(kld_base_in);  // a FIFO would block
    base.emplace(kimi::ppl::KldBase::load(kld_base_in));
  }
  std::optional<kimi::ppl::PerTokenFile> paired;
  if (!paired_in.empty()) {
    if (std::filesystem::exists(paired_in)) kimi::check_input_regular(paired_in);
    paired.emplace(kimi::ppl::read_per_token(paired_in));
    kimi::check(paired->n_ctx == base->n_ctx(),
                "--kld-paired {}: made with a context of {} tokens, the KLD base {} has {}", paired_in, paired->n_ctx,
                kld_base_in, base->n_ctx());
  }

  auto model = kimi::Model::load(ea.model, kimi::app::model_options(ea));
  const int n_vocab = static_cast<int>(model->hparams().n_vocab);
  if (!kld_base_out.empty()) {  // the base must not replace the model, the text or the other base
    std::vector<std::string> inputs;
    for (size_t i = 0; i < model->reader().n_files(); ++i) inputs.push_back(model->reader().file_path(i));
    if (!text_path.empty()) inputs.push_back(text_path);
    if (!kld_base_in.empty()) inputs.push_back(kld_base_in);
    kimi::check_outputs_distinct(inputs, {kld_base_out}, "--kl-divergence-base");
  }
  if (!per_token_out.empty()) {  // nor the per-token file any input (the paired file included)
    std::vector<std::string> inputs;
    for (size_t i = 0; i < model->reader().n_files(); ++i) inputs.push_back(model->reader().file_path(i));
    if (!text_path.empty()) inputs.push_back(text_path);
    inputs.push_back(kld_base_in);
    if (!paired_in.empty()) inputs.push_back(paired_in);
    kimi::check_outputs_distinct(inputs, {per_token_out}, "--kld-per-token");
  }

  kimi::ppl::Options po;
  po.top_n = top_n;
  po.max_chunks = chunks;
  po.n_ctx = ea.ctx > 0 ? ea.ctx : (base ? base->n_ctx() : 512);

  std::vector<int32_t> tokens;
  size_t text_bytes = 0;
  double tok_seconds = 0;
  std::optional<kimi::tok::Tokenizer> tok;
  if (!text_path.empty()) {
    const std::string text = read_text(text_path);
    text_bytes = text.size();
    kimi::check(model->reader().has("tokenizer.ggml.tokens"),
                "{}: the model has no tokenizer (tokenizer.ggml.tokens), needed to tokenize {}", ea.model, text_path);
    tok.emplace(kimi::tok::Tokenizer::from_gguf(model->reader()));
    const auto t0 = std::chrono::steady_clock::now();
    tokens = tok->encode(text, /*allow_special=*/false);
    tok_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (tok->add_bos() && tok->bos_id() >= 0) po.bos_id = tok->bos_id();
  } else {
    tokens = base->tokens();
    po.bos_id = base->bos_replaced();
  }
  if (base) {
    kimi::check(po.n_ctx == base->n_ctx(), "{}: the KLD base was made with a context of {} tokens, this run uses {}",
                kld_base_in, base->n_ctx(), po.n_ctx);
    if (po.max_chunks < 0) po.max_chunks = base->n_chunk();
    kimi::check(po.max_chunks <= base->n_chunk(), "{}: the KLD base has {} chunks, --chunks asks for {}",
                kld_base_in, base->n_chunk(), po.max_chunks);
  }
  const int n_chunk = kimi::ppl::plan_chunks(static_cast<int64_t>(tokens.size()), po,
                                             text_path.empty() ? kld_base_in : text_path);
  if (paired)  // before the run: the other run must have scored the same chunks
    kimi::check(paired->n_chunk == n_chunk,
                "--kld-paired {}: has {} chunks, this run evaluates {} (use the same --chunks)", paired_in,
                paired->n_chunk, n_chunk);

  kimi::Context ctx(*model, kimi::app::context_options(ea, po.n_ctx, std::min(ea.batch, po.n_ctx)));
  kimi::app::print_engine_summary(ea, ctx);
  const int eff_top_k = ctx.effective_top_k();
  const int per_chunk = po.n_ctx - 1 - po.n_ctx / 2;
  if (!text_path.empty())
    std::fprintf(stderr, "perplexity: %s: %zu bytes -> %zu tokens (%.2f s)\n", text_path.c_str(), text_bytes,
                 tokens.size(), tok_seconds);
  std::fprintf(stderr,
               "perplexity: %d chunks of %d tokens, %d scored per chunk; DSA top-k %d%s, attn %s, precision %s, "
               "%d threads\n",
               n_chunk, po.n_ctx, per_chunk, eff_top_k, eff_top_k == 0 ? " (indexer off)" : "", ea.attn.c_str(),
               ea.precision.c_str(), ctx.pool().size());

  double elapsed = 0;  // for the ETA: the mean chunk time so far times the chunks left
  auto on_chunk = [&](const kimi::ppl::ChunkReport& r) {
    elapsed += r.seconds;
    const double eta = r.chunk > 0 ? elapsed / r.chunk * (r.n_chunk - r.chunk) : 0.0;
    const std::string tail = fmt::format("  {:.2f} s, {:.0f}% done, ETA {:.1f} s", r.seconds,
                                         100.0 * r.chunk / std::max(1, r.n_chunk), eta);
    if (r.has_kld)
      std::fprintf(stderr, "[%d/%d] PPL %.8f +/- %.8f (chunk %.8f) KLD %.8f top-1 %.4f%% base PPL %.8f%s\n",
                   r.chunk, r.n_chunk, r.ppl, r.ppl_err, r.chunk_ppl, r.kld_mean, 100.0 * r.top1_agree, r.base_ppl,
                   tail.c_str());
    else
      std::fprintf(stderr, "[%d/%d] PPL %.8f +/- %.8f (chunk %.8f)%s\n", r.chunk, r.n_chunk, r.ppl, r.ppl_err,
                   r.chunk_ppl, tail.c_str());
    std::fflush(stderr);
  };
  const kimi::ppl::Result res = kimi::ppl::evaluate(ctx, tokens, po, on_chunk, kld_base_out, base ? &*base : nullptr);
  const double tps = res.seconds > 0 ? double(res.n_chunk) * po.n_ctx / res.seconds : 0.0;
  if (!kld_base_out.empty()) std::fprintf(stderr, "perplexity: wrote the KLD base to %s\n", kld_base_out.c_str());
  if (!per_token_out.empty()) {
    kimi::ppl::write_per_token(per_token_out, kld_base_in, po.n_ctx, res.per_token);
    std::fprintf(stderr, "perplexity: wrote %zu per-token KLDs to %s\n", res.per_token.size(), per_token_out.c_str());
  }
  std::optional<kimi::ppl::PairedComparison> pc;
  if (paired) pc = kimi::ppl::paired_compare(res.per_token, paired->rows, "--kld-paired " + paired_in);
  auto z = [](double d, double se) { return se > 0 ? d / se : 0.0; };

  if (json) {
    nlohmann::ordered_json j;
    j["model"] = ea.model;
    j["text"] = text_path;
    j["n_tokens"] = res.n_tokens;
    j["n_vocab"] = n_vocab;
    j["n_ctx"] = res.n_ctx;
    j["n_batch"] = std::min(ea.batch, po.n_ctx);
    j["n_chunk"] = res.n_chunk;
    j["n_scored"] = res.stats.count;
    j["bos_replaced"] = po.bos_id;
    j["top_k"] = eff_top_k;
    j["attn"] = ea.attn;
    j["precision"] = ea.precision;
    j["cache_type"] = kimi::CacheType::F32 == ctx.cache_type() ? "f32" : "f16";
    j["ppl"] = res.stats.ppl();
    j["ppl_err"] = res.stats.ppl_err();
    j["nll_mean"] = res.stats.mean();
    j["running_ppl"] = res.running_ppl;
    j["chunk_ppl"] = res.chunk_ppl;
    j["seconds"] = res.seconds;
    j["tokens_per_second"] = tps;
    if (!kld_base_out.empty()) j["kld_base_out"] = kld_base_out;
    if (res.kld) {
      const auto& k = *res.kld;
      nlohmann::ordered_json kj;
      kj["base"] = kld_base_in;
      kj["base_chunks"] = k.n_chunk_file;
      kj["count"] = k.count;
      kj["mean"] = k.kld_mean;
      kj["mean_err"] = k.kld_err;
      kj["median"] = k.kld_median;
      kj["p90"] = k.kld_p90;
      kj["p95"] = k.kld_p95;
      kj["p99"] = k.kld_p99;
      kj["max"] = k.kld_max;
      kj["min"] = k.kld_min;
      kj["top1_agree"] = k.top1_agree;
      kj["top1_agree_err"] = k.top1_err;
      kj["base_ppl"] = k.base_ppl;
      kj["base_ppl_err"] = k.base_ppl_err;
      kj["delta_ppl"] = k.delta_ppl;
      kj["ppl_ratio"] = k.ppl_ratio;
      kj["dp_mean"] = k.dp_mean;
      kj["dp_rms"] = k.dp_rms;
      j["kld"] = kj;
    }
    if (pc) {
      nlohmann::ordered_json pj;
      pj["other"] = paired_in;
      pj["count"] = pc->count;
      pj["n_chunk"] = pc->n_chunk;
      auto put = [&](const char* name, const kimi::ppl::PairedDiff& d) {
        nlohmann::ordered_json dj;
        dj["this"] = d.mean_a;
        dj["other"] = d.mean_b;
        dj["diff"] = d.diff;
        dj["rel"] = d.rel;
        dj["se_token"] = d.se_token;
        dj["se_chunk"] = d.se_chunk;
        dj["z_token"] = z(d.diff, d.se_token);
        dj["z_chunk"] = z(d.diff, d.se_chunk);
        pj[name] = dj;
      };
      put("kld", pc->kld);
      put("top1", pc->top1);
      put("nll", pc->nll);
      j["paired"] = pj;
    }
    std::printf("%s\n", j.dump(2).c_str());
    return 0;
  }

  std::printf("Final estimate: PPL = %.8f +/- %.8f  (%lld tokens scored, %d chunks of %d, %.2f s, %.1f tokens/s)\n",
              res.stats.ppl(), res.stats.ppl_err(), static_cast<long long>(res.stats.count), res.n_chunk,
              res.n_ctx, res.seconds, tps);
  if (res.kld) {
    const auto& k = *res.kld;
    std::printf("====== KL divergence against %s (%lld tokens, %d of %d chunks) ======\n", kld_base_in.c_str(),
                static_cast<long long>(k.count), res.n_chunk, k.n_chunk_file);
    std::printf("PPL(model)          : %.8f +/- %.8f\n", k.ppl, k.ppl_err);
    std::printf("PPL(base)           : %.8f +/- %.8f\n", k.base_ppl, k.base_ppl_err);
    std::printf("PPL(model)/PPL(base): %.8f\n", k.ppl_ratio);
    std::printf("PPL(model)-PPL(base): %.8f\n", k.delta_ppl);
    std::printf("Mean KLD            : %.8f +/- %.8f\n", k.kld_mean, k.kld_err);
    std::printf("Median KLD          : %.8f\n", k.kld_median);
    std::printf("90%% KLD             : %.8f\n", k.kld_p90);
    std::printf("95%% KLD             : %.8f\n", k.kld_p95);
    std::printf("99%% KLD             : %.8f\n", k.kld_p99);
    std::printf("Maximum KLD         : %.8f\n", k.kld_max);
    std::printf("Same top-1          : %.4f +/- %.4f %%\n", 100.0 * k.top1_agree, 100.0 * k.top1_err);
    std::printf("Mean dp(target)     : %.6f %%  (RMS %.6f %%)\n", 100.0 * k.dp_mean, 100.0 * k.dp_rms);
  }
  if (pc) {
    std::printf("====== Paired with %s (%lld tokens, %d chunks): this run - other, +/- SE (chunks) / SE (tokens) "
                "======\n",
                paired_in.c_str(), static_cast<long long>(pc->count), pc->n_chunk);
    auto line = [&](const char* name, const kimi::ppl::PairedDiff& d, double scale, const char* unit) {
      std::printf("%-13s: %.8g%s vs %.8g%s: %+.8g%s (%+.2f %%) +/- %.3g / %.3g = %+.2f / %+.2f SE\n", name,
                  scale * d.mean_a, unit, scale * d.mean_b, unit, scale * d.diff, unit, 100.0 * d.rel,
                  scale * d.se_chunk, scale * d.se_token, z(d.diff, d.se_chunk), z(d.diff, d.se_token));
    };
    line("Mean KLD", pc->kld, 1.0, "");
    line("Same top-1", pc->top1, 100.0, " %");
    line("Mean NLL", pc->nll, 1.0, "");
  }
  return 0;
}

kimi::app::Registrar reg_perplexity("perplexity", "perplexity of a text file, KL divergence against a saved base", cmd_perplexity);

}  // namespace
