// The MoonViT3D vision tower and patchmergerv2 projector (docs/spec/vision.md §3) over the projector
// GGUF that `kimi convert` writes (vision.md §2.2).
//
//   auto vm = kimi::VisionModel::load("model.mmproj.gguf", text_hidden);  // throws naming key/tensor
//   kimi::VisionEncoder enc(*vm, backend);            // places the weights on the backend
//   std::vector<float> rows = enc.encode({&patches}); // [sum of tokens][text hidden], host
//
// The encoder runs through the Backend interface (matmul, rms_norm_rows, add, gather_rows and the
// tower's gelu, rope_2d, segment_attention); images of one call are batched: every matmul runs over
// all their patches at once and the attention stays inside each image.
#pragma once
#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "image/image.h"
#include "io/gguf.h"

namespace kimi {

struct VisionHParams {
  int64_t patch = 0, width = 0, qkv = 0, heads = 0, head_dim = 0, ff = 0, blocks = 0;
  int64_t grid_h = 0, grid_w = 0, merge = 2, text_hidden = 0;
  int32_t placeholder = 0;            // <|media_pad|>
  int64_t patch_limit = 65536, side_patch_limit = 512;
  float eps = 0.0078125f, proj_eps = 1e-5f;
  float rope_theta = 10000.0f;
};

class VisionModel {
 public:
  // text_hidden: the text model's hidden size the projector must produce (0: not checked)
  static std::unique_ptr<VisionModel> load(const std::string& path, int64_t text_hidden = 0);
  const VisionHParams& hp() const { return hp_; }
  const gguf::Reader& reader() const { return *rd_; }
  const std::string& path() const { return path_; }
  // Preprocessing with this model's patch size and limits (vision.md §3.1).
  image::Patches preprocess(const image::Rgb& img) const;

  struct Block {
    const gguf::TensorInfo *ln1, *qkv, *out, *ln2, *up, *down;
  };
  const gguf::TensorInfo *patch_embd = nullptr, *pos_embd = nullptr, *post_norm = nullptr;
  const gguf::TensorInfo *mm1 = nullptr, *mm2 = nullptr, *mm_norm = nullptr;
  std::vector<Block> blocks;

 private:
  VisionModel() = default;
  std::unique_ptr<gguf::Reader> rd_;
  VisionHParams hp_;
  std::string path_;
};

// The bilinear half-pixel resample of the position grid (vision.md §3.2) for a gh x gw patch grid:
// [gh * gw][width] floats, in double then rounded.
std::vector<float> resample_pos_grid(const VisionModel& m, int64_t gh, int64_t gw);

class VisionEncoder {
 public:
  VisionEncoder(const VisionModel& m, Backend& be);
  // The projector's rows for each image in order (image i gives patches.size.tokens rows of
  // text_hidden floats), on the host. cancel (may be null): checked before each block; once set,
  // the work already recorded is waited for and encode throws kimi::Error "vision: cancelled".
  std::vector<float> encode(const std::vector<const image::Patches*>& images,
                            const std::atomic<bool>* cancel = nullptr);

 private:
  struct W {
    MatView mat;
    const float* f32 = nullptr;
  };
  W place(const gguf::TensorInfo* t);
  const VisionModel& m_;
  Backend& be_;
  W patch_, post_, mm1_, mm2_, mmn_;
  struct B {
    W ln1, qkv, out, ln2, up, down;
  };
  std::vector<B> blk_;
};

}  // namespace kimi
