// kimi verify HF_DIR FILE.gguf: independent re-derivation of every tensor and metadata key.
#include <CLI/CLI.hpp>
#include <cstdio>

#include "command.h"
#include "convert/verify.h"
#include "util/cli.h"

namespace {

int cmd_verify(int argc, char** argv) {
  CLI::App app{"Check a converted GGUF against its Hugging Face source: every tensor re-derived and compared "
               "exactly, every kimi-k3.* key against config.json, the tokenizer against tiktoken.model",
               "kimi verify"};
  kimi::convert::VerifyOptions o;
  app.add_option("HF_DIR", o.hf_dir, "Hugging Face model directory the GGUF was converted from")->required();
  app.add_option("GGUF", o.gguf_path, "converted GGUF (any shard of a split file)")->required();
  app.add_flag("--quiet,-q", o.quiet, "no progress output");
  app.add_option("--max-report", o.max_report, "print at most N mismatch lines (default 50)");
  if (int rc = kimi::parse_cli(app, argc, argv); rc >= 0) return rc;
  auto r = kimi::convert::verify(o);
  for (const auto& p : r.problems) std::printf("MISMATCH %s\n", p.c_str());
  size_t total = r.n_mismatched + r.n_missing + r.n_keys_mismatch;
  if (total > r.problems.size()) std::printf("... %zu more problems not shown\n", total - r.problems.size());
  std::printf("%s\n", r.summary().c_str());
  return r.ok() ? 0 : 1;
}

kimi::app::Registrar reg_verify("verify", "check a converted GGUF against its Hugging Face source", cmd_verify);

}  // namespace
