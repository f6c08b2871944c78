// The MoonViT3D tower and patchmergerv2 projector of a K3 checkpoint -> the companion projector
// GGUF (docs/spec/vision.md §2.2). The text GGUF never holds them (why: vision.md §2.2).
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "io/safetensors.h"
#include "tensor/types.h"

namespace kimi {
struct HfConfig;
}

namespace kimi::convert {

struct VisionDims {
  int64_t patch = 0, width = 0, qkv = 0, heads = 0, ff = 0, blocks = 0, grid_h = 0, grid_w = 0;
  int64_t merge = 2, text_hidden = 0, placeholder = 0;
  float proj_eps = 1e-5f;
};

// config.json's vision_config, checked against what the engine implements (vision.md §1.1);
// nullopt when there is none. Throws kimi::Error naming config.json and the key.
std::optional<VisionDims> read_vision_dims(const HfConfig& cfg, int64_t text_hidden, const std::string& label);

// OUT.gguf -> OUT.mmproj.gguf (any other name: NAME.mmproj.gguf).
std::string default_mmproj_path(const std::string& out_path);

struct VisionTensor {
  std::string name;  // GGUF name
  GgmlType type = GgmlType::F32;
  std::vector<int64_t> ne;
  const st::Tensor* src = nullptr;  // same element order (vision.md §2.2): a type conversion only
  uint64_t nbytes = 0;
};

// Every projector-file tensor from the checkpoint, checked (missing / extra / shape / dtype: one
// error listing them). matrix_type: BF16, F16 or F32 (norms and the position grid are F32).
std::vector<VisionTensor> plan_vision(const VisionDims& d, const st::Checkpoint& ck, GgmlType matrix_type,
                                      const std::string& label);

// Writes the projector GGUF; returns the bytes of tensor data written.
uint64_t write_vision(const VisionDims& d, const std::vector<VisionTensor>& plan, const std::string& out_path,
                      const std::vector<std::string>& inputs, const std::string& model_name);

}  // namespace kimi::convert
