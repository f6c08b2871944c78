// `kimi convert`: Hugging Face Kimi-K3 / K3.1 checkpoint -> GGUF (k3-architecture.md §2,
// spec/README.md decisions 1-2). Streaming: all tensors are declared first, then each tensor's
// bytes are produced in order and written; source pages are released after use.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "convert/transforms.h"
#include "io/gguf.h"

namespace kimi {
struct HfConfig;
}

namespace kimi::convert {

struct ConvertOptions {
  std::string hf_dir;
  std::string out_path;
  OutType outtype = OutType::Auto;
  int64_t layers = -1;            // keep the first N layers (-1 = all)
  uint64_t split_max_bytes = 0;   // 0 = one file
  bool quiet = false;             // no progress output
  // The vision tower + projector go to a companion GGUF (docs/spec/vision.md §2.2): mmproj_path, or
  // default_mmproj_path(out_path) when empty. no_vision: write only the text file.
  bool no_vision = false;
  std::string mmproj_path;
};

struct ConvertResult {
  size_t n_tensors = 0;
  uint64_t tensor_bytes = 0;
  size_t n_dropped = 0;           // vision tower / projector tensors dropped
  std::string dropped_what = "vision";  // what they were ("vision"; a DSpark draft: "unused draft")
  uint64_t dropped_bytes = 0;
  size_t n_metadata = 0;
  double seconds = 0;
  FileType ftype = FileType::MOSTLY_BF16;
  OutType outtype = OutType::BF16;
  std::vector<std::string> outputs;  // written file(s)
  std::string vision_path;           // the projector GGUF written ("" = none)
  size_t n_vision = 0;               // its tensors
  uint64_t vision_bytes = 0;
};

// The GGUF metadata (general.*, kimi-k3.*, tokenizer.*) for a model directory, in write order.
std::vector<gguf::KV> build_metadata(const std::string& hf_dir, const HfConfig& cfg, const K3Dims& dims,
                                     int64_t n_layers, FileType ftype);

ConvertResult convert(const ConvertOptions& opts);

}  // namespace kimi::convert
