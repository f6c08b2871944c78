// kimi quantize IN.gguf OUT.gguf TYPE [--imatrix FILE] [--requantize-experts T] [--tensor-type PATTERN=T ...] [--pure]
//   [--output-tensor-type T] [--token-embedding-type T] [--leave-output-tensor] [--allow-requantize]
//   [--error-imatrix FILE] [--threads N] [--split-max-size SIZE] [--dry-run] [--verbose] [--quiet]
#include <CLI/CLI.hpp>
#include <cstdio>

#include "command.h"
#include "convert/quantize.h"
#include "util/progress.h"
#include "util/cli.h"

namespace {

int cmd_quantize(int argc, char** argv) {
  CLI::App app{"Quantize a kimi-k3 GGUF with llama-quantize's type names and per-tensor rules. Norms, 1-D tensors, "
               "router, conv, ssm_a/dt stay F32; MXFP4 routed experts are copied byte for byte (unless "
               "--requantize-experts or one of kimi's MoE mixes: Q2_K_MOE, Q3_K_MOE, IQ2_XS_MOE, IQ4_XS_MOE); the DSA "
               "indexer matrices (indexer.attn_q_b, indexer.attn_k, indexer.proj) always keep their source type. "
               "See docs/quantize.md.",
               "kimi quantize"};
  app.footer(kimi::quant::targets_help());
  std::string in, out, type, requant_experts, out_type, embd_type, split;
  std::vector<std::string> overrides;
  kimi::quant::QuantizeOptions o;
  bool verbose = false;
  app.add_option("IN", in, "input GGUF (any shard of a split file)")->required();
  app.add_option("OUT", out, "output GGUF")->required();
  app.add_option("TYPE", type, "target: a llama-quantize type name or its number, or a MoE mix (list below)")
      ->required();
  app.add_option("--requantize-experts", requant_experts,
                 "re-quantize the routed experts (*_exps) to this tensor type (e.g. Q2_K, IQ2_XS, IQ4_XS, Q4_K, Q8_0; "
                 "overrides a preset's expert types)");
  app.add_option("--imatrix", o.imatrix_path,
                 "importance matrix (llama.cpp GGUF imatrix, from `kimi imatrix` or llama-imatrix): importance-weighted "
                 "quantization for Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, IQ4_XS, IQ2_XS");
  app.add_option("--error-imatrix", o.error_imatrix_path,
                 "measure each converted tensor's error weighted by this importance matrix (e.g. one from held-out "
                 "text: the relative expected matmul output error); per tensor with --verbose, per type in the summary");
  app.add_flag("--allow-no-imatrix", o.rules.allow_no_imatrix,
               "quantize to IQ2_XS (or Q2_K_S) without an importance matrix");
  app.add_option("--imatrix-prior", o.imatrix_prior,
                 "tokens' worth of the layer's mean importance blended into each expert's (default 16; 0 = none)")
      ->check(CLI::Range(0.0, 1e9));
  app.add_option("--tensor-type", overrides,
                 "PATTERN=TYPE: tensors whose name matches the regex PATTERN get TYPE (repeatable, first match wins; "
                 "never applies to the indexer)")
      ->allow_extra_args(false);
  app.add_flag("--pure", o.rules.pure, "no mixture rules: every quantizable tensor gets the default type");
  app.add_option("--output-tensor-type", out_type, "type for output.weight");
  app.add_option("--token-embedding-type", embd_type, "type for token_embd.weight");
  app.add_flag("--leave-output-tensor", o.rules.leave_output, "keep output.weight as it is");
  app.add_flag("--allow-requantize", o.rules.allow_requantize,
               "allow re-quantizing tensors that are already quantized (other than the MXFP4 experts)");
  app.add_option("--threads,-t", o.threads, "threads (default: all cores)")->check(CLI::Range(0, 1024));
  app.add_option("--split-max-size", split, "split the output into shards of at most SIZE tensor bytes (e.g. 2G)");
  app.add_flag("--dry-run", o.dry_run, "decide and print the summary, write nothing");
  app.add_flag("--verbose,-v", verbose, "one line per tensor (name, shape, types, sizes, rule)");
  app.add_flag("--quiet,-q", o.quiet, "no progress bar");
  if (int rc = kimi::parse_cli(app, argc, argv); rc >= 0) return rc;
  o.in_path = in;
  o.out_path = out;
  o.rules.target = kimi::quant::parse_target(type);
  if (!requant_experts.empty())
    o.rules.requantize_experts = kimi::quant::parse_tensor_type(requant_experts, "--requantize-experts");
  if (!out_type.empty()) o.rules.output_type = kimi::quant::parse_tensor_type(out_type, "--output-tensor-type");
  if (!embd_type.empty()) o.rules.token_embd_type = kimi::quant::parse_tensor_type(embd_type, "--token-embedding-type");
  for (const auto& s : overrides) o.rules.overrides.push_back(kimi::quant::parse_override(s));
  o.split_max_bytes = split.empty() ? 0 : kimi::parse_size(split);
  if (verbose) o.quiet = true;  // the per-tensor lines are the progress

  auto r = kimi::quant::quantize(o, [&](const kimi::quant::TensorReport& t) {
    if (verbose) {
      std::printf("%s\n", t.line().c_str());
      std::fflush(stdout);
    }
  });
  std::printf("%s", r.summary().c_str());
  return 0;
}

kimi::app::Registrar reg_quantize("quantize", "quantize a GGUF (llama-quantize's names: Q4_K_M, Q2_K, IQ4_XS, ...; MoE mixes Q2_K_MOE, ...; --imatrix; indexer exempt)",
                         cmd_quantize);

}  // namespace
