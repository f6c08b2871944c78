// Constrained sampling's worst case: the set of tokens a grammar allows next, over a real-size
// vocabulary (tiktoken's o200k_base from the npm package when installed, else 163840 synthetic
// pieces; KIMI_BENCH_VOCAB=FILE picks another), at three points of a JSON-schema answer.
// FullScan asks accepts_bytes token by token (what the server did before the trie); TrieWalk is
// Matcher::allowed_tokens with its DFA already built (later tokens of a request), TrieWalkCold on
// a fresh matcher (the first refusal of a request).
#include <benchmark/benchmark.h>

#include <cstdlib>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <random>

#include "server/grammar.h"
#include "tokenizer/tiktoken_file.h"

using namespace kimi::server::grammar;

namespace {

const std::vector<std::string>& vocab() {
  static const std::vector<std::string> v = [] {
    std::vector<std::string> r;
    const char* env = std::getenv("KIMI_BENCH_VOCAB");  // a tiktoken file (JSON or .tiktoken)
    const std::string p = env ? env : std::string(KIMI_SOURCE_DIR) + "/tools/tiktoken/node_modules/tiktoken/encoders/o200k_base.json";
    if (std::filesystem::exists(p)) {
      for (auto& [bytes, rank] : kimi::tok::read_tiktoken_file(p).ranks) {
        if (rank >= static_cast<int32_t>(r.size())) r.resize(static_cast<size_t>(rank) + 1);
        r[static_cast<size_t>(rank)] = bytes;
      }
      return r;
    }
    std::mt19937 rng(1);
    for (int b = 0; b < 256; ++b) r.push_back(std::string(1, static_cast<char>(b)));
    const char* parts[] = {" the", "ing", " a", "er", "\"", ",", ":", " {", "}", "0", "12", "\xc3\xa9", "tion", " in", "s"};
    while (r.size() < 163840) {
      std::string s;
      for (int k = 1 + static_cast<int>(rng() % 3); k > 0; --k) s += parts[rng() % 15];
      r.push_back(s);
    }
    return r;
  }();
  return v;
}

std::shared_ptr<const Grammar> schema_grammar() {
  static const auto g = Grammar::parse(schema_to_gbnf(nlohmann::ordered_json::parse(R"({"type": "object",
      "properties": {"name": {"type": "string"}, "count": {"type": "integer"}, "tags": {"type": "array",
      "items": {"type": "string"}}}, "required": ["name", "count", "tags"], "additionalProperties": false})")));
  return g;
}

const char* kPoints[] = {"", "{\"name\": \"some te", "{\"name\": \"x\", \"count\": 12"};

void FullScan(benchmark::State& st) {
  Matcher m(schema_grammar());
  m.advance_bytes(kPoints[st.range(0)]);
  const auto& v = vocab();
  size_t n = 0;
  for (auto _ : st) {
    n = 0;
    for (const auto& p : v) n += !p.empty() && m.accepts_bytes(p);
    benchmark::DoNotOptimize(n);
  }
  st.counters["vocab"] = static_cast<double>(v.size());
  st.counters["allowed"] = static_cast<double>(n);
}

void TrieWalk(benchmark::State& st) {
  static const TokenTrie trie(vocab());
  Matcher m(schema_grammar());
  m.advance_bytes(kPoints[st.range(0)]);
  std::vector<uint8_t> ok;
  m.allowed_tokens(trie, ok);  // builds the DFA states this point needs
  for (auto _ : st) {
    m.allowed_tokens(trie, ok);
    benchmark::DoNotOptimize(ok.data());
  }
  size_t n = 0;
  for (uint8_t b : ok) n += b;
  st.counters["allowed"] = static_cast<double>(n);
  st.counters["trie_nodes"] = static_cast<double>(trie.n_nodes());
}

void TrieWalkCold(benchmark::State& st) {
  static const TokenTrie trie(vocab());
  std::vector<uint8_t> ok;
  for (auto _ : st) {
    Matcher m(schema_grammar());
    m.advance_bytes(kPoints[st.range(0)]);
    m.allowed_tokens(trie, ok);
    benchmark::DoNotOptimize(ok.data());
  }
}

void TrieBuild(benchmark::State& st) {
  for (auto _ : st) {
    TokenTrie t(vocab());
    benchmark::DoNotOptimize(t.n_nodes());
  }
}

}  // namespace

BENCHMARK(FullScan)->DenseRange(0, 2)->Unit(benchmark::kMillisecond);
BENCHMARK(TrieWalk)->DenseRange(0, 2)->Unit(benchmark::kMillisecond);
BENCHMARK(TrieWalkCold)->DenseRange(0, 2)->Unit(benchmark::kMillisecond);
BENCHMARK(TrieBuild)->Unit(benchmark::kMillisecond);
BENCHMARK_MAIN();
