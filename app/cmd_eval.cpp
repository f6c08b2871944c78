// kimi eval: logits of a token sequence as raw float32 [n_tokens x n_vocab] (or the last row).
#include <CLI/CLI.hpp>
#include <cstdio>
#include <filesystem>
#include <unistd.h>

#include "command.h"
#include "engine_args.h"
#include "model/model.h"
#include "runtime/context.h"
#include "util/error.h"
#include "util/paths.h"
#include "util/tempfile.h"

namespace {

int cmd_eval(int argc, char** argv) {
  CLI::App app{"Evaluate a token sequence and write its logits (raw little-endian float32, row-major)"};
  kimi::app::EngineArgs ea;
  kimi::app::add_engine_options(app, ea);
  std::string tokens, out;
  bool all = false;
  app.add_option("--tokens", tokens, "comma-separated token ids")->required();
  app.add_option("--logits-out", out, "output file")->required();
  app.add_flag("--all-logits", all, "write every position's logits (default: the last one only)");
  if (int rc = kimi::app::parse_engine_cli(app, argc, argv); rc >= 0) return rc;

  auto in = kimi::app::parse_token_list(tokens);
  kimi::check(!in.empty(), "--tokens is empty");
  {
    const auto parent = std::filesystem::path(out).parent_path();
    kimi::check(parent.empty() || std::filesystem::is_directory(parent), "--logits-out {}: directory '{}' does not exist",
                out, parent.string());
    kimi::check(!std::filesystem::is_directory(out), "--logits-out {}: is a directory (expected a file path)", out);
  }
  auto model = kimi::Model::load(ea.model, kimi::app::model_options(ea));
  {  // the logits must not replace the model (or one of its shards)
    std::vector<std::string> inputs;
    for (size_t i = 0; i < model->reader().n_files(); ++i) inputs.push_back(model->reader().file_path(i));
    kimi::check_outputs_distinct(inputs, {out}, "--logits-out");
  }
  const int n = static_cast<int>(in.size());
  kimi::Context ctx(*model, kimi::app::context_options(ea, n, std::min(ea.batch, n)));
  kimi::app::print_engine_summary(ea, ctx);
  kimi::Batch b;
  b.add_sequence(in, 0, 0, true, all);
  ctx.decode(b);

  const kimi::TempFile tf = kimi::create_temp_file(out);  // unique name, removed on SIGINT/SIGTERM/SIGHUP
  const std::string& tmp = tf.path;
  FILE* f = ::fdopen(tf.fd, "wb");
  if (!f) {
    ::close(tf.fd);
    kimi::discard_temp(tmp);
    kimi::fail("{}: cannot open for writing", tmp);
  }
  const size_t V = static_cast<size_t>(ctx.n_vocab());
  bool ok = true;
  for (size_t i = all ? 0 : in.size() - 1; i < in.size(); ++i) ok &= std::fwrite(ctx.logits(i), 4, V, f) == V;
  ok &= std::fclose(f) == 0;
  if (!ok) {
    kimi::discard_temp(tmp);
    kimi::fail("{}: write failed", out);
  }
  try {
    kimi::commit_temp(tmp, out);
  } catch (...) {
    kimi::discard_temp(tmp);
    throw;
  }
  std::fprintf(stderr, "wrote %zu x %zu logits to %s\n", all ? in.size() : size_t(1), V, out.c_str());
  return 0;
}

kimi::app::Registrar reg_eval("eval", "write the logits of a token sequence to a file", cmd_eval);

}  // namespace
