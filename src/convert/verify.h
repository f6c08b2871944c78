// `kimi verify HF_DIR FILE.gguf`: re-derives every GGUF tensor from the Hugging Face source
// independently of the converter (own name map, own index arithmetic for the kv_b split, own scalar
// MXFP4 repack from the closed form of formats-quant.md §3.5) and compares bytes exactly; checks every
// kimi-k3.* key against config.json and the tokenizer arrays against tiktoken.model.
#pragma once
#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

namespace kimi::convert {

struct VerifyOptions {
  std::string hf_dir;
  std::string gguf_path;
  bool quiet = false;      // no progress output
  size_t max_report = 50;  // mismatch lines printed at most (all are counted)
};

struct VerifyResult {
  size_t n_tensors = 0;        // GGUF tensors checked
  size_t n_exact = 0;
  size_t n_mismatched = 0;     // tensors whose bytes, type or shape differ, or that have no source
  size_t n_missing = 0;        // source tensors (non-vision, kept layers) absent from the GGUF
  size_t n_keys_match = 0;
  size_t n_keys_mismatch = 0;
  std::vector<std::string> problems;  // one line per problem (up to max_report)
  bool ok() const { return n_mismatched == 0 && n_missing == 0 && n_keys_mismatch == 0; }
  std::string summary() const;  // "verified N tensors: N exact, 0 mismatched; metadata: M keys match"
};

// A projector file (general.architecture moonvit3d, docs/spec/vision.md §2.2) is checked by
// verify_vision: every tensor element against its source, every moonvit3d.* key against vision_config.
VerifyResult verify(const VerifyOptions& opts);

}  // namespace kimi::convert
