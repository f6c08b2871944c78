// `kimi bench` under mpirun (docs/distributed.md): each rank's weight bytes per token, the bytes it
// sends and receives per token, the time in exchanges, and its resident memory.
#pragma once
#include <cstdio>
#include <vector>

#include <nlohmann/json.hpp>

#include "runtime/context.h"

namespace kimi::app {

struct RankTrafficSum {
  std::vector<RankTraffic> sum;  // per rank, communication summed over the measured phases
  // zero the counters (before a measured phase) / add the phase's counters (after it)
  void start(Context& ctx) const;
  void stop(Context& ctx);
  void print(FILE* f, double tokens) const;  // nothing with one rank
  void to_json(nlohmann::ordered_json& j, double tokens) const;
};

}  // namespace kimi::app
