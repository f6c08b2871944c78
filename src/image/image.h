// Images for the vision tower (docs/spec/vision.md §3.1): decoding PNG / JPEG / WebP / GIF (first
// frame) with the Debian libraries (libpng, libjpeg-turbo, libwebp, giflib — each optional at build
// time: a build without one refuses that format with an error that says so), the navit size rule,
// Pillow's bicubic resize, padding, normalisation and patchify.
//
// Hostile input: the encoded size, the header's width x height and each side are checked against
// Limits BEFORE any pixel is decoded (decompression bombs), a truncated or corrupt file is an error
// (never a partly grey image), and every error is a kimi::Error naming the image (`label`), the
// format and what is wrong.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace kimi::image {

enum class Format { Unknown, Png, Jpeg, Webp, Gif };
const char* format_name(Format f);       // "PNG", ...
Format sniff(const uint8_t* data, size_t n);  // by magic bytes only
bool format_available(Format f);         // this build has the decoder
// "image/png" etc.; Unknown for anything else
Format format_from_mime(const std::string& mime);

struct Limits {
  uint64_t max_bytes = 32ull << 20;      // encoded file size
  uint64_t max_pixels = 40'000'000;      // width * height as the header states it
  int64_t max_side = 32768;              // width and height each
};

// 8-bit RGB, row-major, 3 bytes a pixel.
struct Rgb {
  int64_t width = 0, height = 0;
  std::vector<uint8_t> px;
  uint8_t at(int64_t x, int64_t y, int c) const { return px[static_cast<size_t>((y * width + x) * 3 + c)]; }
};

// Decodes one image (format sniffed from the bytes). Alpha is dropped, grey replicated, palettes
// expanded (Pillow's convert("RGB")); a GIF gives its first frame on the logical screen.
Rgb decode(const uint8_t* data, size_t n, const Limits& lim, const std::string& label);
Rgb decode_file(const std::string& path, const Limits& lim);

// The navit rule (vision.md §3.1 steps 2 and 4).
struct NavitSize {
  int64_t new_w = 0, new_h = 0;  // resized size
  int64_t pad_w = 0, pad_h = 0;  // black padding on the right / bottom
  int64_t gw = 0, gh = 0;        // patch grid
  int64_t tokens = 0;            // gh * gw / merge^2: <|media_pad|> tokens in the prompt
};
NavitSize navit_size(int64_t width, int64_t height, int64_t patch = 14, int64_t merge = 2,
                     int64_t patch_limit = 65536, int64_t side_patch_limit = 512);

// Pillow's Image.resize(BICUBIC) on 8-bit RGB, bit for bit (vision.md §3.1.1).
Rgb resize_bicubic(const Rgb& in, int64_t new_w, int64_t new_h);

// What the tower takes for one image: gh * gw patches of 3 * patch * patch values (vision.md §3.1
// steps 5-6), and the original size for the prompt text.
struct Patches {
  int64_t width = 0, height = 0;  // original (decoded) size
  NavitSize size;
  int64_t patch = 14;
  std::vector<float> values;      // [gh * gw][3 * patch * patch]
};
Patches preprocess(const Rgb& img, int64_t patch = 14, int64_t merge = 2, int64_t patch_limit = 65536,
                   int64_t side_patch_limit = 512);

// FNV-1a 64 of the patch values and grid: the key that identifies an image's embedding input
// (the prompt cache keys images by it).
uint64_t content_hash(const Patches& p);

}  // namespace kimi::image
