// kimi::parse_json (util/json.h) over request-body shapes that were quadratic before issue 38: an
// array of N empty objects and an object of N keys, into ordered_json (what the server parses
// bodies into). Time per element should not grow with N (docs/server.md "Shutdown and safety").
#include <benchmark/benchmark.h>

#include <string>

#include "util/json.h"

namespace {

std::string array_of_objects(int64_t n) {
  std::string s = "[";
  for (int64_t i = 0; i < n; ++i) s += i ? ",{}" : "{}";
  return s + "]";
}

std::string object_of_keys(int64_t n) {
  std::string s = "{";
  for (int64_t i = 0; i < n; ++i) s += (i ? ",\"k" : "\"k") + std::to_string(i) + "\":" + std::to_string(i);
  return s + "}";
}

void run(benchmark::State& st, const std::string& text) {
  for (auto _ : st) {
    auto j = kimi::parse_json<nlohmann::ordered_json>(text, "body");
    benchmark::DoNotOptimize(j);
  }
  st.SetItemsProcessed(st.iterations() * st.range(0));
  st.SetBytesProcessed(st.iterations() * static_cast<int64_t>(text.size()));
}

void Array(benchmark::State& st) { run(st, array_of_objects(st.range(0))); }
void Keys(benchmark::State& st) { run(st, object_of_keys(st.range(0))); }

}  // namespace

BENCHMARK(Array)->Arg(10000)->Arg(100000)->Arg(1000000)->Unit(benchmark::kMillisecond);
BENCHMARK(Keys)->Arg(10000)->Arg(100000)->Arg(1000000)->Unit(benchmark::kMillisecond);
BENCHMARK_MAIN();
