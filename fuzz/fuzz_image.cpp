// libFuzzer target: image bytes -> decode (PNG / JPEG / WebP / GIF by magic bytes, with limits) ->
// the navit size, Pillow's bicubic resize and patches (docs/spec/vision.md §3.1). Limits keep every
// input cheap (1 M pixels, a 1024-patch budget): a hostile header must be refused before decoding,
// and whatever decodes must preprocess into the grid the rule promises. A malformed input must end
// in kimi::Error; anything else (crash, sanitizer report, a mismatch below) is a bug.
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdlib>

#include "image/image.h"
#include "util/error.h"

using namespace kimi;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  image::Limits lim;
  lim.max_bytes = 1 << 20;
  lim.max_pixels = 1 << 20;
  lim.max_side = 4096;
  image::Rgb img;
  try {
    img = image::decode(data, size, lim, "fuzz");
  } catch (const Error&) {
    return 0;
  }
  if (img.width <= 0 || img.height <= 0 || static_cast<uint64_t>(img.width * img.height) > lim.max_pixels ||
      img.px.size() != static_cast<size_t>(img.width * img.height * 3))
    std::abort();
  const image::Patches p = image::preprocess(img, 14, 2, 1024, 64);
  const auto& s = p.size;
  if (s.gh % 2 || s.gw % 2 || s.gh < 2 || s.gw < 2 || s.gw > 64 || s.gh > 64 ||
      p.values.size() != static_cast<size_t>(s.gh * s.gw * 588) || s.tokens != s.gh * s.gw / 4)
    std::abort();
  for (float v : p.values)
    if (!(v >= -1.0f && v <= 1.0f)) std::abort();
  return 0;
}
