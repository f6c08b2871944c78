// Per-rank model files (docs/distributed.md, "Per-rank files"): `kimi shard MODEL.gguf --ranks N`
// writes one GGUF per rank that holds only what that rank reads in tensor mode: its routed
// experts, its head / row slices of the split matrices (split_rule below) and the small tensors
// whole, with the split recorded in the metadata:
//   kimi.shard.ranks, kimi.shard.rank, kimi.shard.expert_first, kimi.shard.expert_count (u32),
//   kimi.shard.source (string: the source model's id, model_id() below).
// A split tensor keeps its name; its split dimension holds only the rank's range.
// A rank may load its shard or the full file; all ranks check at start that they run the same model
// (model_id) and that each shard belongs to its rank of an N-rank job.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "io/gguf.h"

namespace kimi {

struct HParams;

// How a tensor is split over the ranks in tensor mode (docs/distributed.md): rank r of N holds
// units [U*r/N, U*(r+1)/N) of its split dimension (U = total / unit), i.e. elements
// [lo, hi) = those units times `unit`. A unit is a head (its rows), an expert, or one row.
struct SplitRule {
  int dim = 0;         // 0: not split (whole on every rank); 1: rows (ne[1]); 2: stacked slices (ne[2])
  int64_t unit = 1;    // rows / slices per unit
  int64_t total = 0;   // rows / slices of the whole tensor
  explicit operator bool() const { return dim != 0; }
  void range(int ranks, int r, int64_t& lo, int64_t& hi) const {
    const int64_t u = unit > 0 ? total / unit : 0;
    lo = u * r / ranks * unit;
    hi = u * (r + 1) / ranks * unit;
  }
};
// The rule for tensor `name` of a model with these (full-model) hyper-parameters.
SplitRule split_rule(const std::string& name, const HParams& hp);

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
