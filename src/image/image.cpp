// Preprocessing (docs/spec/vision.md §3.1): navit size, Pillow's bicubic resize, patches.
#include "image/image.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "util/error.h"

namespace kimi::image {

const char* format_name(Format f) {
  switch (f) {
    case Format::Png: return "PNG";
    case Format::Jpeg: return "JPEG";
    case Format::Webp: return "WebP";
    case Format::Gif: return "GIF";
    default: return "unknown";
  }
}

Format sniff(const uint8_t* d, size_t n) {
  if (n >= 8 && std::memcmp(d, "\x89PNG\r\n\x1a\n", 8) == 0) return Format::Png;
  if (n >= 3 && d[0] == 0xFF && d[1] == 0xD8 && d[2] == 0xFF) return Format::Jpeg;
  if (n >= 12 && std::memcmp(d, "RIFF", 4) == 0 && std::memcmp(d + 8, "WEBP", 4) == 0) return Format::Webp;
  if (n >= 6 && (std::memcmp(d, "GIF87a", 6) == 0 || std::memcmp(d, "GIF89a", 6) == 0)) return Format::Gif;
  return Format::Unknown;
}

Format format_from_mime(const std::string& m) {
  if (m == "image/png") return Format::Png;
  if (m == "image/jpeg" || m == "image/jpg") return Format::Jpeg;
  if (m == "image/webp") return Format::Webp;
  if (m == "image/gif") return Format::Gif;
  return Format::Unknown;
}

NavitSize navit_size(int64_t width, int64_t height, int64_t P, int64_t merge, int64_t patch_limit,
                     int64_t side_limit) {
  check(width > 0 && height > 0, "image of {}x{} pixels (it must have at least one pixel)", width, height);
  const double w = static_cast<double>(width), h = static_cast<double>(height);
  const double s1 = std::sqrt(static_cast<double>(patch_limit) /
                              (std::max(1.0, static_cast<double>(width / P)) *
                               std::max(1.0, static_cast<double>(height / P))));
  const double s2 = static_cast<double>(side_limit * P) / w;
  const double s3 = static_cast<double>(side_limit * P) / h;
  const double scale = std::min({1.0, s1, s2, s3});
  NavitSize s;
  s.new_w = std::min(std::max<int64_t>(1, static_cast<int64_t>(w * scale)), side_limit * P);
  s.new_h = std::min(std::max<int64_t>(1, static_cast<int64_t>(h * scale)), side_limit * P);
  const int64_t f = merge * P;
  s.pad_w = (f - s.new_w % f) % f;
  s.pad_h = (f - s.new_h % f) % f;
  s.gw = (s.new_w + s.pad_w) / P;
  s.gh = (s.new_h + s.pad_h) / P;
  s.tokens = (s.gw / merge) * (s.gh / merge);
  return s;
}

namespace {

constexpr int kPrecisionBits = 32 - 8 - 2;  // Pillow's 8-bit coefficient precision

double bicubic(double x) {
  constexpr double a = -0.5;
  if (x < 0) x = -x;
  if (x < 1) return ((a + 2) * x - (a + 3)) * x * x + 1;
  if (x < 2) return (((x - 5) * x + 8) * x - 4) * a;
  return 0;
}

// Integer coefficients of one pass (vision.md §3.1.1): for output i, taps [xmin[i], xmin[i] + cnt[i]).
struct Coeffs {
  int64_t ksize = 0;
  std::vector<int64_t> xmin, cnt;
  std::vector<int32_t> k;  // [out][ksize]
};

Coeffs coeffs(int64_t in, int64_t out) {
  const double scale = static_cast<double>(in) / static_cast<double>(out);
  const double fs = std::max(scale, 1.0);
  const double support = 2.0 * fs;
  Coeffs c;
  c.ksize = static_cast<int64_t>(std::ceil(support)) * 2 + 1;
  c.xmin.resize(static_cast<size_t>(out));
  c.cnt.resize(static_cast<size_t>(out));
  c.k.assign(static_cast<size_t>(out * c.ksize), 0);
  std::vector<double> w(static_cast<size_t>(c.ksize));
  for (int64_t i = 0; i < out; ++i) {
    const double center = (static_cast<double>(i) + 0.5) * scale;
    int64_t xmin = static_cast<int64_t>(center - support + 0.5);
    if (xmin < 0) xmin = 0;
    int64_t xmax = static_cast<int64_t>(center + support + 0.5);
    if (xmax > in) xmax = in;
    xmax -= xmin;
    double ww = 0;
    for (int64_t x = 0; x < xmax; ++x) {
      w[static_cast<size_t>(x)] = bicubic((static_cast<double>(x + xmin) - center + 0.5) / fs);
      ww += w[static_cast<size_t>(x)];
    }
    for (int64_t x = 0; x < xmax; ++x) {
      double v = ww != 0 ? w[static_cast<size_t>(x)] / ww : w[static_cast<size_t>(x)];
      v *= static_cast<double>(1 << kPrecisionBits);
      c.k[static_cast<size_t>(i * c.ksize + x)] = static_cast<int32_t>(v < 0 ? v - 0.5 : v + 0.5);
    }
    c.xmin[static_cast<size_t>(i)] = xmin;
    c.cnt[static_cast<size_t>(i)] = xmax;
  }
  return c;
}

uint8_t clip8(int32_t v) {
  v >>= kPrecisionBits;
  return static_cast<uint8_t>(v < 0 ? 0 : v > 255 ? 255 : v);
}

Rgb pass_horizontal(const Rgb& in, int64_t out_w) {
  const Coeffs c = coeffs(in.width, out_w);
  Rgb o;
  o.width = out_w;
  o.height = in.height;
  o.px.resize(static_cast<size_t>(out_w * in.height * 3));
  for (int64_t y = 0; y < in.height; ++y) {
    const uint8_t* row = in.px.data() + y * in.width * 3;
    uint8_t* dst = o.px.data() + y * out_w * 3;
    for (int64_t x = 0; x < out_w; ++x) {
      const int32_t* k = c.k.data() + x * c.ksize;
      const int64_t x0 = c.xmin[static_cast<size_t>(x)], n = c.cnt[static_cast<size_t>(x)];
      int32_t s[3] = {1 << (kPrecisionBits - 1), 1 << (kPrecisionBits - 1), 1 << (kPrecisionBits - 1)};
      for (int64_t j = 0; j < n; ++j)
        for (int ch = 0; ch < 3; ++ch) s[ch] += static_cast<int32_t>(row[(x0 + j) * 3 + ch]) * k[j];
      for (int ch = 0; ch < 3; ++ch) dst[x * 3 + ch] = clip8(s[ch]);
    }
  }
  return o;
}

Rgb pass_vertical(const Rgb& in, int64_t out_h) {
  const Coeffs c = coeffs(in.height, out_h);
  Rgb o;
  o.width = in.width;
  o.height = out_h;
  o.px.resize(static_cast<size_t>(in.width * out_h * 3));
  const int64_t stride = in.width * 3;
  for (int64_t y = 0; y < out_h; ++y) {
    const int32_t* k = c.k.data() + y * c.ksize;
    const int64_t y0 = c.xmin[static_cast<size_t>(y)], n = c.cnt[static_cast<size_t>(y)];
    uint8_t* dst = o.px.data() + y * stride;
    for (int64_t x = 0; x < stride; ++x) {
      int32_t s = 1 << (kPrecisionBits - 1);
      for (int64_t j = 0; j < n; ++j) s += static_cast<int32_t>(in.px[static_cast<size_t>((y0 + j) * stride + x)]) * k[j];
      dst[x] = clip8(s);
    }
  }
  return o;
}

}  // namespace

Rgb resize_bicubic(const Rgb& in, int64_t new_w, int64_t new_h) {
  check(in.width > 0 && in.height > 0 && new_w > 0 && new_h > 0, "resize of a {}x{} image to {}x{}", in.width,
        in.height, new_w, new_h);
  if (new_w == in.width && new_h == in.height) return in;
  if (new_w == in.width) return pass_vertical(in, new_h);
  Rgb h = pass_horizontal(in, new_w);
  if (new_h == in.height) return h;
  return pass_vertical(h, new_h);
}

Patches preprocess(const Rgb& img, int64_t P, int64_t merge, int64_t patch_limit, int64_t side_limit) {
  Patches out;
  out.width = img.width;
  out.height = img.height;
  out.patch = P;
  out.size = navit_size(img.width, img.height, P, merge, patch_limit, side_limit);
  const NavitSize& s = out.size;
  const Rgb r = resize_bicubic(img, s.new_w, s.new_h);
  // normalised value of every 8-bit level: (v / 255 - 0.5) / 0.5 (vision.md §3.1 step 5)
  float lut[256];
  for (int v = 0; v < 256; ++v) lut[v] = static_cast<float>((v / 255.0 - 0.5) / 0.5);
  const int64_t per = 3 * P * P;
  out.values.assign(static_cast<size_t>(s.gh * s.gw * per), lut[0]);  // padding: black
  for (int64_t gy = 0; gy < s.gh; ++gy)
    for (int64_t gx = 0; gx < s.gw; ++gx) {
      float* p = out.values.data() + (gy * s.gw + gx) * per;
      for (int64_t c = 0; c < 3; ++c)
        for (int64_t py = 0; py < P; ++py) {
          const int64_t y = gy * P + py;
          if (y >= r.height) continue;
          for (int64_t px = 0; px < P; ++px) {
            const int64_t x = gx * P + px;
            if (x >= r.width) continue;
            p[(c * P + py) * P + px] = lut[r.at(x, y, static_cast<int>(c))];
          }
        }
    }
  return out;
}

uint64_t content_hash(const Patches& p) {
  uint64_t h = 1469598103934665603ull;
  auto mix = [&](const void* d, size_t n) {
    const auto* b = static_cast<const uint8_t*>(d);
    for (size_t i = 0; i < n; ++i) h = (h ^ b[i]) * 1099511628211ull;
  };
  mix(&p.size.gh, sizeof p.size.gh);
  mix(&p.size.gw, sizeof p.size.gw);
  mix(p.values.data(), p.values.size() * sizeof(float));
  return h;
}

}  // namespace kimi::image
