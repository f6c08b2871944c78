// Per-rank model files (docs/distributed.md, "Per-rank files"): `kimi shard MODEL.gguf --ranks N`
// writes one GGUF per rank that holds only that rank's routed experts (the expert range the tensor
// split gives it) and every other tensor whole, with the split recorded in the metadata:
//   kimi.shard.ranks, kimi.shard.rank, kimi.shard.expert_first, kimi.shard.expert_count (u32),
//   kimi.shard.source (string: the source model's id, model_id() below).
// A rank may load its shard or the full file; all ranks check at start that they run the same model
// (model_id) and that each shard belongs to its rank of an N-rank job.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "io/gguf.h"

namespace kimi {

struct ShardOptions {
  std::string input;    // the full model
  int ranks = 2;        // N >= 2
  std::string out_dir;  // created if missing
  bool quiet = false;
};

// Writes DIR/STEM.rank<r>-of-<N>.gguf for r < N; returns the paths.
std::vector<std::string> write_shards(const ShardOptions& o);

// The file name of rank r's shard of `input` (no directory).
std::string shard_file_name(const std::string& input, int rank, int ranks);

// A 64-bit id of the model a file holds, as 16 hex digits: every tensor's name, type and shape, the
// first and last 32 bytes of every tensor but the routed experts, and the metadata keys other than
// kimi.shard.*.
// A shard carries its source's id, so a shard set and the full file have the same id.
std::string model_id(const gguf::Reader& r);

}  // namespace kimi
