// Options shared by `kimi run`, `kimi eval` and `kimi bench` (header-only, CLI11).
#pragma once
#include <CLI/CLI.hpp>
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "runtime/context.h"
#include "util/error.h"

namespace kimi::cli {

struct EngineArgs {
  std::string model;
  int threads = 0;
  std::string attn = "sparse";
  int attn_top_k = -1;
  std::string precision = "fast";
  std::string cache_type = "f16";
  int ctx = 0;  // 0: sized by the command
  bool verbose = false;
};

inline void add_engine_options(CLI::App& app, EngineArgs& a) {
  app.add_option("-m,--model", a.model, "GGUF model file (kimi-k3)")->required();
  app.add_option("-t,--threads", a.threads, "threads (0 = all cores)");
  app.add_option("--attn", a.attn, "attention path: sparse (gather the selected rows) or dense (masked softmax)")
      ->check(CLI::IsMember({"sparse", "dense"}));
  app.add_option("--attn-top-k", a.attn_top_k, "DSA top-k: -1 = from the file, 0 = indexer off, N = override");
  app.add_option("--precision", a.precision, "fast (bf16/Q8_0 activations, F16 caches) or f32")
      ->check(CLI::IsMember({"fast", "f32"}));
  app.add_option("--cache-type", a.cache_type, "cache element type in fast mode: f16 or f32")
      ->check(CLI::IsMember({"f16", "f32"}));
  app.add_option("-c,--ctx", a.ctx, "context size per sequence (default: what the command needs)")
      ->check(CLI::Range(0, 1 << 24));
  app.add_flag("-v,--verbose", a.verbose, "print the model and context summary to stderr");
}

inline ContextOptions context_options(const EngineArgs& a, int n_ctx, int n_batch) {
  ContextOptions o;
  o.n_threads = a.threads;
  o.n_seq_max = 1;
  o.n_ctx_max = a.ctx > 0 ? a.ctx : n_ctx;
  o.n_batch_max = n_batch;
  o.attn = a.attn == "dense" ? AttnPath::Dense : AttnPath::Sparse;
  o.attn_top_k = a.attn_top_k;
  o.precision = a.precision == "f32" ? kern::Precision::F32 : kern::Precision::Fast;
  o.cache_type = a.cache_type == "f32" ? CacheType::F32 : CacheType::F16;
  return o;
}

// "1,2,3" (spaces allowed) -> ids
inline std::vector<int32_t> parse_token_list(const std::string& s) {
  std::vector<int32_t> out;
  size_t i = 0;
  while (i < s.size()) {
    while (i < s.size() && (s[i] == ' ' || s[i] == ',')) ++i;
    if (i >= s.size()) break;
    size_t j = i;
    while (j < s.size() && s[j] != ',' && s[j] != ' ') ++j;
    const std::string t = s.substr(i, j - i);
    try {
      size_t used = 0;
      long v = std::stol(t, &used);
      check(used == t.size() && v >= 0 && v <= INT32_MAX, "--tokens: '{}' is not a token id", t);
      out.push_back(static_cast<int32_t>(v));
    } catch (const std::logic_error&) {
      fail("--tokens: '{}' is not a token id", t);
    }
    i = j;
  }
  return out;
}

}  // namespace kimi::cli
