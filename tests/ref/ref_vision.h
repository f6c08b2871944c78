// Independent float64 reference of K3's image path, written from docs/spec/vision.md (§3.1
// preprocessing, §3.2-§3.6 the tower and projector). It reads the HUGGING FACE checkpoint's vision
// tensors (vision_tower.*, mm_projector.*) directly, never the projector GGUF, so comparing the
// engine against it checks the converter, the loader and the tower together. No engine code: own
// loops, double everywhere (8-bit resize results are integers by definition of the resize).
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace kimi::ref {

struct RefNavit {
  int64_t new_w = 0, new_h = 0, pad_w = 0, pad_h = 0, gh = 0, gw = 0, tokens = 0;
};
// vision.md §3.1 steps 2 and 4 with K3's constants (patch 14, merge 2, 65536 patches, 512 a side)
RefNavit ref_navit(int64_t width, int64_t height);

// vision.md §3.1.1: Pillow's bicubic resize of interleaved 8-bit RGB
std::vector<uint8_t> ref_resize(const std::vector<uint8_t>& rgb, int64_t w, int64_t h, int64_t nw, int64_t nh);

// vision.md §3.1 steps 3-6: patches [gh*gw][3*14*14] of an RGB image
struct RefImage {
  RefNavit size;
  std::vector<std::vector<double>> patches;
};
RefImage ref_preprocess(const std::vector<uint8_t>& rgb, int64_t w, int64_t h);

class RefVision {
 public:
  static RefVision load(const std::string& hf_dir);
  RefVision(RefVision&&) noexcept;
  ~RefVision();
  int64_t text_hidden() const;
  // The projector's rows for the images in order: [sum of gh*gw/4][text hidden]
  std::vector<std::vector<double>> forward(const std::vector<const RefImage*>& images) const;
  struct Impl;

 private:
  RefVision() = default;
  std::unique_ptr<Impl> impl_;
};

}  // namespace kimi::ref
