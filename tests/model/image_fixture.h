// Images for the vision tests: a pseudo-random RGB picture of a given size, the same for the same seed.
#pragma once
#include <cstdint>
#include <random>

#include "image/image.h"

namespace kimi::test {

inline image::Rgb random_image(int64_t w, int64_t h, uint32_t seed) {
  std::mt19937 g(seed);
  image::Rgb r;
  r.width = w;
  r.height = h;
  r.px.resize(static_cast<size_t>(w * h * 3));
  for (auto& v : r.px) v = static_cast<uint8_t>(g() & 255);
  return r;
}

}  // namespace kimi::test
