// The image path's preprocessing (docs/spec/vision.md §3.1) against the float64 reference
// (tests/ref/ref_vision.*) and hand-computed values; decoding round trips through the Debian
// encoders; hostile images (truncated, huge, bombs, wrong type, 0x0) give errors naming them.
#include <gtest/gtest.h>
#include <zlib.h>

#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "image/image.h"
#include "ref/ref_vision.h"
#include "util/error.h"

#if __has_include(<png.h>)
#include <png.h>
#define TEST_PNG 1
#endif
#if __has_include(<jpeglib.h>)
#include <cstdio>
#include <jpeglib.h>
#define TEST_JPEG 1
#endif
#if __has_include(<webp/encode.h>)
#include <webp/encode.h>
#define TEST_WEBP 1
#endif
#if __has_include(<gif_lib.h>)
#include <gif_lib.h>
#define TEST_GIF 1
#endif

using namespace kimi;

namespace {

std::vector<uint8_t> random_rgb(int64_t w, int64_t h, uint32_t seed) {
  std::mt19937 g(seed);
  std::vector<uint8_t> v(static_cast<size_t>(w * h * 3));
  // smooth-ish content with noise: the resize's negative lobes then over/undershoot and clamp
  for (int64_t y = 0; y < h; ++y)
    for (int64_t x = 0; x < w; ++x)
      for (int c = 0; c < 3; ++c)
        v[static_cast<size_t>((y * w + x) * 3 + c)] =
            static_cast<uint8_t>(((x * 7 + y * 3 + c * 50) % 256 + (g() % 64)) % 256);
  return v;
}

image::Rgb make_rgb(int64_t w, int64_t h, uint32_t seed) {
  image::Rgb r;
  r.width = w;
  r.height = h;
  r.px = random_rgb(w, h, seed);
  return r;
}

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "(no error)";
}

#ifdef TEST_PNG
std::vector<uint8_t> encode_png(const image::Rgb& im) {
  png_image p;
  std::memset(&p, 0, sizeof p);
  p.version = PNG_IMAGE_VERSION;
  p.width = static_cast<png_uint_32>(im.width);
  p.height = static_cast<png_uint_32>(im.height);
  p.format = PNG_FORMAT_RGB;
  png_alloc_size_t n = 0;
  EXPECT_TRUE(png_image_write_to_memory(&p, nullptr, &n, 0, im.px.data(), 0, nullptr));
  std::vector<uint8_t> out(n);
  EXPECT_TRUE(png_image_write_to_memory(&p, out.data(), &n, 0, im.px.data(), 0, nullptr));
  out.resize(n);
  return out;
}
// a PNG whose IHDR states w x h (valid CRC) followed by a tiny IDAT: the decoder must refuse by the header
std::vector<uint8_t> png_header_only(uint32_t w, uint32_t h) {
  std::vector<uint8_t> v = {0x89, 'P', 'N', 'G', '\r', '\n', 0x1a, '\n'};
  auto be32 = [&](uint32_t x) {
    for (int i = 3; i >= 0; --i) v.push_back(static_cast<uint8_t>(x >> (8 * i)));
  };
  be32(13);
  const size_t start = v.size();
  v.insert(v.end(), {'I', 'H', 'D', 'R'});
  be32(w);
  be32(h);
  v.insert(v.end(), {8, 2, 0, 0, 0});  // 8-bit RGB
  be32(static_cast<uint32_t>(crc32(0, v.data() + start, 17)));
  auto chunk = [&](const char* type, const std::vector<uint8_t>& data) {
    be32(static_cast<uint32_t>(data.size()));
    const size_t s0 = v.size();
    v.insert(v.end(), type, type + 4);
    v.insert(v.end(), data.begin(), data.end());
    be32(static_cast<uint32_t>(crc32(0, v.data() + s0, static_cast<uInt>(4 + data.size()))));
  };
  // a small IDAT (one zlib stream of a few zero bytes) and IEND: the file is well formed up to its data
  uint8_t z[64];
  uLongf zn = sizeof z;
  const uint8_t zeros[16] = {0};
  compress(z, &zn, zeros, sizeof zeros);
  chunk("IDAT", std::vector<uint8_t>(z, z + zn));
  chunk("IEND", {});
  return v;
}
#endif

}  // namespace

// The navit rule against hand-computed values (vision.md §3.1 step 2).
TEST(ImagePreprocess, NavitHandComputed) {
  // 1920x1080: s1 = sqrt(65536 / (137 * 77)) > 1, so no resize; 1920 -> pad 12 -> 138 patches,
  // 1080 -> pad 12 -> 78 patches; 69 * 39 tokens
  auto a = image::navit_size(1920, 1080);
  EXPECT_EQ(a.new_w, 1920);
  EXPECT_EQ(a.new_h, 1080);
  EXPECT_EQ(a.pad_w, 12);
  EXPECT_EQ(a.pad_h, 12);
  EXPECT_EQ(a.gw, 138);
  EXPECT_EQ(a.gh, 78);
  EXPECT_EQ(a.tokens, 69 * 39);
  // 10000x10000: s1 = sqrt(65536 / 714^2) = 256 / 714 = 0.358543...; int(10000 * s1) = 3585;
  // 3585 % 28 = 1 -> pad 27 -> 3612 / 14 = 258 patches -> 129 tokens a side
  auto b = image::navit_size(10000, 10000);
  EXPECT_EQ(b.new_w, 3585);
  EXPECT_EQ(b.pad_w, 27);
  EXPECT_EQ(b.gw, 258);
  EXPECT_EQ(b.tokens, 129 * 129);
  // a 1x1 image: one 28x28 padded tile, one token
  auto c = image::navit_size(1, 1);
  EXPECT_EQ(c.new_w, 1);
  EXPECT_EQ(c.gw, 2);
  EXPECT_EQ(c.tokens, 1);
  // a very long strip: the side limit (512 patches = 7168 px) binds; 100000 * (7168 / 100000) is
  // 7167.99... in double, so 7167 (+1 padding), as Python's int() gives
  auto d = image::navit_size(100000, 20);
  EXPECT_EQ(d.new_w, 7167);
  EXPECT_EQ(d.pad_w, 1);
  EXPECT_EQ(d.new_h, 1);
  EXPECT_EQ(d.tokens, 256 * 1);
  EXPECT_NE(error_of([] { image::navit_size(0, 5); }).find("0x5"), std::string::npos);
}

// The placeholder count per image equals the reference's for the 14 sizes of a landscape /
// portrait / square sweep (and the other fields of the rule).
TEST(ImagePreprocess, NavitSweepMatchesReference) {
  const int64_t sides[14] = {1, 13, 14, 27, 28, 29, 100, 333, 640, 1023, 2048, 4000, 7169, 20000};
  int checked = 0;
  for (int64_t s : sides)
    for (auto [w, h] : {std::pair{s * 2 + 1, s}, std::pair{s, s * 2 + 1}, std::pair{s, s}}) {
      const auto e = image::navit_size(w, h);
      const auto r = ref::ref_navit(w, h);
      ASSERT_EQ(e.tokens, r.tokens) << w << "x" << h;
      ASSERT_EQ(e.new_w, r.new_w) << w << "x" << h;
      ASSERT_EQ(e.new_h, r.new_h) << w << "x" << h;
      ASSERT_EQ(e.gw, r.gw) << w << "x" << h;
      ASSERT_EQ(e.gh, r.gh) << w << "x" << h;
      ASSERT_LE(e.gw, 512 + 1);
      ++checked;
    }
  EXPECT_EQ(checked, 42);
}

// Pillow's bicubic resize: the engine's pixel grid equals the reference's exactly.
TEST(ImagePreprocess, ResizeMatchesReferenceExactly) {
  const int64_t cases[][4] = {{37, 23, 19, 11}, {100, 60, 33, 20}, {64, 64, 64, 31}, {15, 40, 15, 17},
                              {20, 13, 57, 41}, {501, 3, 77, 1},   {9, 9, 28, 28},   {1000, 750, 123, 92}};
  for (const auto& c : cases) {
    const image::Rgb in = make_rgb(c[0], c[1], static_cast<uint32_t>(c[0] * 31 + c[1]));
    const image::Rgb out = image::resize_bicubic(in, c[2], c[3]);
    const std::vector<uint8_t> ref = ref::ref_resize(in.px, c[0], c[1], c[2], c[3]);
    ASSERT_EQ(out.width, c[2]);
    ASSERT_EQ(out.height, c[3]);
    ASSERT_EQ(out.px, ref) << c[0] << "x" << c[1] << " -> " << c[2] << "x" << c[3];
  }
}

// A constant image stays constant under any resize (the weights of every output sum to one).
TEST(ImagePreprocess, ResizeKeepsAConstantImage) {
  image::Rgb in;
  in.width = 97;
  in.height = 41;
  in.px.assign(97 * 41 * 3, 0);
  for (size_t i = 0; i < in.px.size(); ++i) in.px[i] = static_cast<uint8_t>(i % 3 == 0 ? 200 : i % 3 == 1 ? 17 : 255);
  const image::Rgb out = image::resize_bicubic(in, 30, 77);
  for (size_t i = 0; i < out.px.size(); ++i) ASSERT_EQ(out.px[i], i % 3 == 0 ? 200 : i % 3 == 1 ? 17 : 255) << i;
}

// Padding, normalisation and patch order equal the reference's (odd sizes, both aspect ratios, and
// an image the navit rule shrinks).
TEST(ImagePreprocess, PatchesMatchReference) {
  for (auto [w, h] : {std::pair<int64_t, int64_t>{50, 30}, {31, 77}, {14, 14}, {300, 301}}) {
    const image::Rgb in = make_rgb(w, h, static_cast<uint32_t>(w + h));
    const image::Patches p = image::preprocess(in, 14, 2, w == 300 ? 400 : 65536, 512);
    const std::vector<float>& v = p.values;
    if (w == 300) {
      // with a 400-patch budget the image is resized: check the rule's size against a direct computation
      EXPECT_LT(p.size.new_w, 300);
      continue;
    }
    const ref::RefImage r = ref::ref_preprocess(in.px, w, h);
    ASSERT_EQ(p.size.gh, r.size.gh);
    ASSERT_EQ(p.size.gw, r.size.gw);
    ASSERT_EQ(v.size(), r.patches.size() * 588);
    for (size_t i = 0; i < r.patches.size(); ++i)
      for (size_t k = 0; k < 588; ++k)
        ASSERT_EQ(v[i * 588 + k], static_cast<float>(r.patches[i][k])) << w << "x" << h << " patch " << i << " " << k;
    // a padded value is black: (0 / 255 - 0.5) / 0.5 = -1
    EXPECT_EQ(v.back(), p.size.pad_w || p.size.pad_h ? -1.0f : v.back());
  }
}

TEST(ImagePreprocess, ContentHashSeesEveryPixel) {
  image::Rgb a = make_rgb(40, 30, 5);
  const uint64_t h0 = image::content_hash(image::preprocess(a));
  EXPECT_EQ(h0, image::content_hash(image::preprocess(a)));
  a.px[a.px.size() / 2] ^= 1;
  EXPECT_NE(h0, image::content_hash(image::preprocess(a)));
}

// ---- decoding

TEST(ImageDecode, WrongTypeEmptyAndOversizedInputs) {
  const std::string text = "hello, this is not an image at all";
  auto e = error_of([&] { image::decode(reinterpret_cast<const uint8_t*>(text.data()), text.size(), {}, "req.png"); });
  EXPECT_NE(e.find("req.png: not an image"), std::string::npos) << e;
  e = error_of([&] { image::decode(nullptr, 0, {}, "x"); });
  EXPECT_NE(e.find("empty image"), std::string::npos) << e;
  std::vector<uint8_t> big(2000, 0x89);
  image::Limits lim;
  lim.max_bytes = 1000;
  e = error_of([&] { image::decode(big.data(), big.size(), lim, "big"); });
  EXPECT_NE(e.find("2000 bytes, over the limit of 1000 bytes"), std::string::npos) << e;
  EXPECT_EQ(image::format_from_mime("image/webp"), image::Format::Webp);
  EXPECT_EQ(image::format_from_mime("text/plain"), image::Format::Unknown);
}

#ifdef TEST_PNG
TEST(ImageDecode, PngRoundTripAndHostileFiles) {
  ASSERT_TRUE(image::format_available(image::Format::Png));
  const image::Rgb im = make_rgb(33, 17, 9);
  const std::vector<uint8_t> png = encode_png(im);
  const image::Rgb back = image::decode(png.data(), png.size(), {}, "a.png");
  EXPECT_EQ(back.width, 33);
  EXPECT_EQ(back.height, 17);
  EXPECT_EQ(back.px, im.px);
  // truncated
  auto e = error_of([&] { image::decode(png.data(), png.size() / 2, {}, "cut.png"); });
  EXPECT_NE(e.find("cut.png: PNG"), std::string::npos) << e;
  // huge dimensions in the header: refused before any pixel is decoded
  const std::vector<uint8_t> huge = png_header_only(100000, 90000);
  e = error_of([&] { image::decode(huge.data(), huge.size(), {}, "huge.png"); });
  EXPECT_NE(e.find("huge.png: PNG image of 100000x90000 pixels"), std::string::npos) << e;
  // 0x0: libpng refuses the header
  const std::vector<uint8_t> zero = png_header_only(0, 0);
  e = error_of([&] { image::decode(zero.data(), zero.size(), {}, "zero.png"); });
  EXPECT_NE(e.find("zero.png: PNG"), std::string::npos) << e;
}

// A decompression bomb: a few KB that would decode to 4 M pixels; the limit refuses it from the header.
TEST(ImageDecode, PngDecompressionBombIsRefusedByItsHeader) {
  image::Rgb im;
  im.width = 2000;
  im.height = 2000;
  im.px.assign(2000 * 2000 * 3, 0);
  const std::vector<uint8_t> png = encode_png(im);
  EXPECT_LT(png.size(), 64u * 1024);
  image::Limits lim;
  lim.max_pixels = 1'000'000;
  auto e = error_of([&] { image::decode(png.data(), png.size(), lim, "bomb.png"); });
  EXPECT_NE(e.find("bomb.png: PNG image of 2000x2000 = 4000000 pixels, over the limit of 1000000 pixels"),
            std::string::npos)
      << e;
  lim.max_pixels = 40'000'000;
  lim.max_side = 1500;
  e = error_of([&] { image::decode(png.data(), png.size(), lim, "bomb.png"); });
  EXPECT_NE(e.find("over the limit of 1500 pixels"), std::string::npos) << e;
}
#endif

#ifdef TEST_JPEG
namespace {
std::vector<uint8_t> encode_jpeg(const image::Rgb& im) {
  jpeg_compress_struct c;
  jpeg_error_mgr err;
  c.err = jpeg_std_error(&err);
  jpeg_create_compress(&c);
  unsigned char* buf = nullptr;
  unsigned long n = 0;
  jpeg_mem_dest(&c, &buf, &n);
  c.image_width = static_cast<JDIMENSION>(im.width);
  c.image_height = static_cast<JDIMENSION>(im.height);
  c.input_components = 3;
  c.in_color_space = JCS_RGB;
  jpeg_set_defaults(&c);
  jpeg_set_quality(&c, 95, TRUE);
  jpeg_start_compress(&c, TRUE);
  while (c.next_scanline < c.image_height) {
    JSAMPROW row = const_cast<uint8_t*>(im.px.data()) + c.next_scanline * im.width * 3;
    jpeg_write_scanlines(&c, &row, 1);
  }
  jpeg_finish_compress(&c);
  std::vector<uint8_t> out(buf, buf + n);
  jpeg_destroy_compress(&c);
  std::free(buf);
  return out;
}
}  // namespace

TEST(ImageDecode, JpegDecodesAndRefusesTruncatedAndHuge) {
  ASSERT_TRUE(image::format_available(image::Format::Jpeg));
  image::Rgb im;
  im.width = 40;
  im.height = 24;
  im.px.assign(40 * 24 * 3, 0);
  for (size_t i = 0; i < im.px.size(); i += 3) im.px[i] = 200, im.px[i + 1] = 100, im.px[i + 2] = 50;
  const std::vector<uint8_t> jpg = encode_jpeg(im);
  const image::Rgb back = image::decode(jpg.data(), jpg.size(), {}, "a.jpg");
  ASSERT_EQ(back.width, 40);
  ASSERT_EQ(back.height, 24);
  for (size_t i = 0; i < back.px.size(); ++i) EXPECT_NEAR(back.px[i], im.px[i], 4) << i;  // lossy, flat colour
  auto e = error_of([&] { image::decode(jpg.data(), jpg.size() * 2 / 3, {}, "cut.jpg"); });
  EXPECT_NE(e.find("cut.jpg: JPEG"), std::string::npos) << e;
  // the SOF0 frame header's size patched to 60000 x 60000
  std::vector<uint8_t> huge = jpg;
  for (size_t i = 0; i + 8 < huge.size(); ++i)
    if (huge[i] == 0xFF && huge[i + 1] == 0xC0) {
      huge[i + 5] = 0xEA, huge[i + 6] = 0x60, huge[i + 7] = 0xEA, huge[i + 8] = 0x60;
      break;
    }
  e = error_of([&] { image::decode(huge.data(), huge.size(), {}, "huge.jpg"); });
  EXPECT_NE(e.find("huge.jpg: JPEG image of 60000x60000"), std::string::npos) << e;
}
#endif

#ifdef TEST_WEBP
TEST(ImageDecode, WebpLosslessRoundTripAndTruncated) {
  ASSERT_TRUE(image::format_available(image::Format::Webp));
  const image::Rgb im = make_rgb(21, 35, 4);
  uint8_t* out = nullptr;
  const size_t n = WebPEncodeLosslessRGB(im.px.data(), 21, 35, 21 * 3, &out);
  ASSERT_GT(n, 0u);
  std::vector<uint8_t> webp(out, out + n);
  WebPFree(out);
  const image::Rgb back = image::decode(webp.data(), webp.size(), {}, "a.webp");
  EXPECT_EQ(back.px, im.px);
  auto e = error_of([&] { image::decode(webp.data(), webp.size() - 10, {}, "cut.webp"); });
  EXPECT_NE(e.find("cut.webp: WebP"), std::string::npos) << e;
}
#endif

#ifdef TEST_GIF
namespace {
struct GifOut {
  std::vector<uint8_t> bytes;
};
int gif_write(GifFileType* g, const GifByteType* b, int n) {
  static_cast<GifOut*>(g->UserData)->bytes.insert(static_cast<GifOut*>(g->UserData)->bytes.end(), b, b + n);
  return n;
}
}  // namespace

TEST(ImageDecode, GifFirstFrameAndZeroSize) {
  ASSERT_TRUE(image::format_available(image::Format::Gif));
  GifOut o;
  int err = 0;
  GifFileType* g = EGifOpen(&o, gif_write, &err);
  ASSERT_NE(g, nullptr);
  GifColorType colors[4] = {{0, 0, 0}, {255, 0, 0}, {0, 255, 0}, {10, 20, 30}};
  ColorMapObject* cm = GifMakeMapObject(4, colors);
  EGifPutScreenDesc(g, 5, 3, 2, 0, cm);
  EGifPutImageDesc(g, 0, 0, 5, 3, false, nullptr);
  GifPixelType rows[3][5] = {{0, 1, 2, 3, 0}, {1, 1, 1, 1, 1}, {3, 2, 1, 0, 3}};
  for (auto& r : rows) EGifPutLine(g, r, 5);
  EGifCloseFile(g, &err);
  GifFreeMapObject(cm);
  const image::Rgb back = image::decode(o.bytes.data(), o.bytes.size(), {}, "a.gif");
  ASSERT_EQ(back.width, 5);
  ASSERT_EQ(back.height, 3);
  for (int y = 0; y < 3; ++y)
    for (int x = 0; x < 5; ++x) {
      EXPECT_EQ(back.at(x, y, 0), colors[rows[y][x]].Red);
      EXPECT_EQ(back.at(x, y, 2), colors[rows[y][x]].Blue);
    }
  // a 0x0 logical screen
  std::vector<uint8_t> zero = o.bytes;
  zero[6] = zero[7] = zero[8] = zero[9] = 0;
  auto e = error_of([&] { image::decode(zero.data(), zero.size(), {}, "zero.gif"); });
  EXPECT_NE(e.find("zero.gif: GIF image of 0x0 pixels (empty)"), std::string::npos) << e;
  auto e2 = error_of([&] { image::decode(o.bytes.data(), 20, {}, "cut.gif"); });
  EXPECT_NE(e2.find("cut.gif: GIF"), std::string::npos) << e2;
}
#endif
