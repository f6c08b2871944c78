// kimi synth: write a deterministic random-weight Kimi-K3.1 Hugging Face checkpoint.
#include <CLI/CLI.hpp>
#include <cstdio>

#include "command.h"
#include "convert/dspark.h"
#include "convert/synth.h"
#include "util/progress.h"
#include "util/cli.h"
#include "util/error.h"

namespace {

int cmd_synth(int argc, char** argv) {
  CLI::App app{"Write a synthetic Kimi-K3.1 Hugging Face checkpoint (random weights, real layout, learned BPE "
               "vocabulary)",
               "kimi synth"};
  std::string preset_name = "tiny", out;
  uint64_t seed = 1;
  int64_t layers = 0, experts = 0;
  bool no_indexer = false, no_vision = false, bf16_experts = false, force = false, quiet = false;
  std::vector<std::string> presets = kimi::synth::preset_names();
  for (auto& p : kimi::dspark::preset_names()) presets.push_back(p);
  app.add_option("--preset", preset_name,
                 "tiny | small | k3-layers; dspark-tiny | dspark-small: a K3 DSpark draft model for the tiny / small "
                 "target of the same --seed (docs/spec/dspark.md §4)")
      ->check(CLI::IsMember(presets))
      ->capture_default_str();
  app.add_option("--seed", seed, "random seed (weights depend only on seed and tensor name)")->capture_default_str();
  app.add_option("--layers", layers, "number of layers (default: the preset's); keeps the first N layers");
  app.add_option("--experts", experts, "number of routed experts (default: the preset's)");
  int64_t experts_used = 0;
  app.add_option("--experts-used", experts_used, "routed experts per token (default: the preset's, at most --experts)");
  std::string router = "spread";
  app.add_option("--router", router,
                 "the router's selection bias: spread (default: nearly every token picks the same experts) or "
                 "zipf[:S] (expert popularity per layer Zipf-like with exponent S, default 1, in a random order "
                 "per layer; the choices vary from token to token)")
      ->capture_default_str();
  app.add_flag("--no-indexer", no_indexer, "no DSA indexer (a plain K3 checkpoint)");
  app.add_flag("--no-vision", no_vision, "no vision tower, projector or vision_config (a text-only checkpoint)");
  app.add_flag("--bf16-experts", bf16_experts, "routed experts as BF16 instead of MXFP4 (no quantization_config)");
  std::string outliers;
  app.add_option("--outlier-channels", outliers,
                 "experimental: N[:SCALE] (SCALE default 20): N channels of the RMSNorm weights before weight "
                 "matrices (the same channels in every layer) get SCALE times their value, so the normed "
                 "activations have outlier channels as trained LLMs do (docs/quantize.md); off by default");
  app.add_option("-o,--output", out, "output directory (written as DIR.tmp, then renamed)")->required();
  app.add_flag("--force", force, "replace an existing non-empty output directory");
  app.add_flag("-q,--quiet", quiet, "no progress output");
  if (int rc = kimi::parse_cli(app, argc, argv); rc >= 0) return rc;

  if (kimi::dspark::is_preset(preset_name)) {
    if (layers || app.count("--experts") || app.count("--experts-used") || no_indexer || bf16_experts ||
        !outliers.empty() || router != "spread")
      kimi::fail("synth: --preset {} takes only --seed, -o, --force and --quiet", preset_name);
    auto dc = kimi::dspark::synth_preset(preset_name);
    dc.seed = seed;
    auto s = kimi::dspark::write_synth(dc, out, force);
    std::string taps;
    for (auto t : dc.taps) taps += (taps.empty() ? "" : ", ") + std::to_string(t);
    std::printf("synth: wrote %s (preset %s, seed %llu): K3 DSpark draft for the %s target\n", out.c_str(),
                preset_name.c_str(), static_cast<unsigned long long>(seed), dc.target_preset.c_str());
    std::printf("  %zu tensors, %s of tensor data, %llu parameters; %lld layers, block %lld, Markov rank %lld, "
                "taps at target layers %s\n",
                s.tensors, kimi::format_bytes(s.bytes).c_str(), static_cast<unsigned long long>(s.parameters),
                static_cast<long long>(dc.layers), static_cast<long long>(dc.block), static_cast<long long>(dc.rank),
                taps.c_str());
    return 0;
  }
  auto cfg = kimi::synth::preset(preset_name);
  cfg.seed = seed;
  if (layers) kimi::synth::set_layers(cfg, layers);
  if (app.count("--experts")) kimi::synth::set_experts(cfg, experts);
  if (app.count("--experts-used")) kimi::synth::set_experts_used(cfg, experts_used);
  kimi::synth::set_router(cfg, router);
  cfg.indexer = !no_indexer;
  cfg.vision = !no_vision;
  cfg.mxfp4_experts = !bf16_experts;
  if (!outliers.empty()) kimi::synth::set_outlier_channels(cfg, outliers);

  kimi::synth::WriteOptions opt;
  opt.force = force;
  opt.quiet = quiet;
  auto s = kimi::synth::write_checkpoint(cfg, out, opt);
  std::printf("synth: wrote %s (preset %s, seed %llu%s%s)\n", out.c_str(), preset_name.c_str(),
              static_cast<unsigned long long>(seed), cfg.indexer ? "" : ", no indexer",
              cfg.mxfp4_experts ? ", MXFP4 experts" : ", BF16 experts");
  if (cfg.router_zipf >= 0)
    std::printf("  router: Zipf expert popularity, exponent %g, a random order per layer (--router zipf)\n",
                cfg.router_zipf);
  if (cfg.outlier_channels > 0)
    std::printf("  outlier channels: %lld per norm, scale %g (experimental, --outlier-channels)\n",
                static_cast<long long>(cfg.outlier_channels), double(cfg.outlier_scale));
  std::printf("  %zu tensors in %zu shards, %s of tensor data (%llu bytes)\n", s.tensors, s.shards,
              kimi::format_bytes(s.tensor_bytes).c_str(), static_cast<unsigned long long>(s.tensor_bytes));
  std::printf("  %llu parameters (%.3f B), %lld layers (%zu MLA), %lld routed experts top-%lld\n",
              static_cast<unsigned long long>(s.parameters), double(s.parameters) * 1e-9,
              static_cast<long long>(cfg.layers), cfg.full_attn_layers.size(), static_cast<long long>(cfg.experts),
              static_cast<long long>(cfg.top_k));
  std::printf("  vocabulary %lld (%lld BPE tokens learned from %zu bytes of text + 256 specials)\n",
              static_cast<long long>(cfg.vocab), static_cast<long long>(cfg.vocab - 256), s.vocab_text_bytes);
  return 0;
}

kimi::app::Registrar reg_synth("synth", "write a synthetic Kimi-K3.1 HF checkpoint (random weights, real layout)",
                         cmd_synth);

}  // namespace
