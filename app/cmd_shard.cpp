// kimi shard MODEL.gguf --ranks N -o DIR: one GGUF per MPI rank with only that rank's routed experts
// (docs/distributed.md, "Per-rank files"; the work is in model/shard.cpp).
#include <CLI/CLI.hpp>
#include <cstdio>

#include "command.h"
#include "model/shard.h"
#include "util/cli.h"

namespace {

int cmd_shard(int argc, char** argv) {
  CLI::App app{"Write one GGUF per MPI rank holding that rank's routed experts and every other tensor, for "
               "`mpirun -np N kimi ... -m 'DIR/MODEL.rank{rank}-of-N.gguf'`",
               "kimi shard"};
  kimi::ShardOptions o;
  app.add_option("MODEL", o.input, "the full model (GGUF)")->required();
  app.add_option("--ranks", o.ranks, "number of ranks (mpirun -np)")->required()->check(CLI::Range(2, 4096));
  app.add_option("-o,--output", o.out_dir, "output directory (created if missing)")->required();
  app.add_flag("-q,--quiet", o.quiet, "no progress output");
  if (int rc = kimi::parse_cli(app, argc, argv); rc >= 0) return rc;
  const auto paths = kimi::write_shards(o);
  for (const auto& p : paths) std::printf("%s\n", p.c_str());
  return 0;
}

kimi::app::Registrar reg_shard("shard", "split a model into per-rank files for MPI (docs/distributed.md)", cmd_shard);

}  // namespace
