// Decoders (docs/spec/vision.md §3.1 step 1) over the Debian libraries; each is compiled in when
// CMake found it (KIMI_HAVE_PNG / _JPEG / _WEBP / _GIF).
#include <fmt/format.h>

#include <algorithm>
#include <csetjmp>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>

#include "image/image.h"
#include "util/error.h"

#ifdef KIMI_HAVE_PNG
#include <png.h>
#endif
#ifdef KIMI_HAVE_JPEG
#include <jpeglib.h>
#endif
#ifdef KIMI_HAVE_WEBP
#include <webp/decode.h>
#endif
#ifdef KIMI_HAVE_GIF
#include <gif_lib.h>
#endif

namespace kimi::image {

bool format_available(Format f) {
  switch (f) {
#ifdef KIMI_HAVE_PNG
    case Format::Png: return true;
#endif
#ifdef KIMI_HAVE_JPEG
    case Format::Jpeg: return true;
#endif
#ifdef KIMI_HAVE_WEBP
    case Format::Webp: return true;
#endif
#ifdef KIMI_HAVE_GIF
    case Format::Gif: return true;
#endif
    default: return false;
  }
}

namespace {

// The header's size against the limits, before any pixel is decoded.
void check_dims(int64_t w, int64_t h, const Limits& lim, const std::string& label, Format f) {
  check(w > 0 && h > 0, "{}: {} image of {}x{} pixels (empty)", label, format_name(f), w, h);
  check(w <= lim.max_side && h <= lim.max_side, "{}: {} image of {}x{} pixels: a side over the limit of {} pixels",
        label, format_name(f), w, h, lim.max_side);
  check(static_cast<uint64_t>(w) * static_cast<uint64_t>(h) <= lim.max_pixels,
        "{}: {} image of {}x{} = {} pixels, over the limit of {} pixels", label, format_name(f), w, h,
        static_cast<uint64_t>(w) * static_cast<uint64_t>(h), lim.max_pixels);
}

#ifdef KIMI_HAVE_PNG
Rgb decode_png(const uint8_t* d, size_t n, const Limits& lim, const std::string& label) {
  png_image im;
  std::memset(&im, 0, sizeof im);
  im.version = PNG_IMAGE_VERSION;
  if (!png_image_begin_read_from_memory(&im, d, n)) {
    std::string msg = im.message;
    png_image_free(&im);
    fail("{}: PNG: {}", label, msg);
  }
  try {
    check_dims(im.width, im.height, lim, label, Format::Png);
  } catch (...) {
    png_image_free(&im);
    throw;
  }
  im.format = PNG_FORMAT_RGBA;
  std::vector<uint8_t> rgba(PNG_IMAGE_SIZE(im));
  if (!png_image_finish_read(&im, nullptr, rgba.data(), 0, nullptr)) {
    std::string msg = im.message;
    png_image_free(&im);
    fail("{}: PNG: {} (truncated or corrupt)", label, msg);
  }
  Rgb o;
  o.width = im.width;
  o.height = im.height;
  png_image_free(&im);
  o.px.resize(static_cast<size_t>(o.width * o.height * 3));
  for (int64_t i = 0; i < o.width * o.height; ++i)
    for (int c = 0; c < 3; ++c) o.px[static_cast<size_t>(i * 3 + c)] = rgba[static_cast<size_t>(i * 4 + c)];
  return o;
}
#endif

#ifdef KIMI_HAVE_JPEG
struct JpegErr {
  jpeg_error_mgr pub;
  std::jmp_buf jb;
  char msg[JMSG_LENGTH_MAX];
};
void jpeg_on_error(j_common_ptr c) {
  auto* e = reinterpret_cast<JpegErr*>(c->err);
  (*c->err->format_message)(c, e->msg);
  std::longjmp(e->jb, 1);
}
void jpeg_on_message(j_common_ptr c, int level) {
  auto* e = reinterpret_cast<JpegErr*>(c->err);
  if (level < 0) {  // a warning (corrupt data, premature end): kept, the decode fails afterwards
    if (e->pub.num_warnings++ == 0) (*c->err->format_message)(c, e->msg);
  }
}

// No C++ object with a destructor lives in this frame between setjmp and a longjmp.
bool jpeg_decode_raw(const uint8_t* d, size_t n, const Limits* lim, int64_t* w, int64_t* h, uint8_t** out,
                     char* msg, bool* too_big, bool* cmyk, bool* corrupt) {
  jpeg_decompress_struct ci;
  JpegErr err;
  std::memset(&err, 0, sizeof err);
  ci.err = jpeg_std_error(&err.pub);
  err.pub.error_exit = jpeg_on_error;
  err.pub.emit_message = jpeg_on_message;
  uint8_t* volatile buf = nullptr;
  if (setjmp(err.jb)) {
    jpeg_destroy_decompress(&ci);
    std::free(buf);
    std::snprintf(msg, JMSG_LENGTH_MAX, "%s", err.msg);
    return false;
  }
  jpeg_create_decompress(&ci);
  ci.mem->max_memory_to_use = 1l << 30;
  jpeg_mem_src(&ci, d, static_cast<unsigned long>(n));
  jpeg_read_header(&ci, TRUE);
  *w = ci.image_width;
  *h = ci.image_height;
  const uint64_t px = static_cast<uint64_t>(*w) * static_cast<uint64_t>(*h);
  if (*w <= 0 || *h <= 0 || *w > lim->max_side || *h > lim->max_side || px > lim->max_pixels) {
    *too_big = true;
    jpeg_destroy_decompress(&ci);
    return false;
  }
  if (ci.jpeg_color_space == JCS_CMYK || ci.jpeg_color_space == JCS_YCCK) {
    *cmyk = true;
    jpeg_destroy_decompress(&ci);
    return false;
  }
  ci.out_color_space = JCS_RGB;
  jpeg_start_decompress(&ci);
  buf = static_cast<uint8_t*>(std::malloc(static_cast<size_t>(px * 3)));
  if (!buf) {
    jpeg_destroy_decompress(&ci);
    std::snprintf(msg, JMSG_LENGTH_MAX, "out of memory");
    return false;
  }
  while (ci.output_scanline < ci.output_height) {
    JSAMPROW row = buf + static_cast<size_t>(ci.output_scanline) * static_cast<size_t>(*w) * 3;
    jpeg_read_scanlines(&ci, &row, 1);
  }
  jpeg_finish_decompress(&ci);
  jpeg_destroy_decompress(&ci);
  if (err.pub.num_warnings > 0) {
    std::free(buf);
    std::memcpy(msg, err.msg, JMSG_LENGTH_MAX);
    *corrupt = true;
    return false;
  }
  *out = buf;
  return true;
}

Rgb decode_jpeg(const uint8_t* d, size_t n, const Limits& lim, const std::string& label) {
  int64_t w = 0, h = 0;
  uint8_t* buf = nullptr;
  char msg[JMSG_LENGTH_MAX] = {0};
  bool too_big = false, cmyk = false, corrupt = false;
  if (!jpeg_decode_raw(d, n, &lim, &w, &h, &buf, msg, &too_big, &cmyk, &corrupt)) {
    if (too_big) check_dims(w, h, lim, label, Format::Jpeg);
    if (cmyk) fail("{}: JPEG: CMYK colour is not supported (convert the image to RGB)", label);
    if (corrupt) fail("{}: JPEG: {} (truncated or corrupt)", label, msg);
    fail("{}: JPEG: {}", label, msg);
  }
  Rgb o;
  o.width = w;
  o.height = h;
  o.px.assign(buf, buf + static_cast<size_t>(w * h * 3));
  std::free(buf);
  return o;
}
#endif

#ifdef KIMI_HAVE_WEBP
Rgb decode_webp(const uint8_t* d, size_t n, const Limits& lim, const std::string& label) {
  WebPBitstreamFeatures f;
  const VP8StatusCode st = WebPGetFeatures(d, n, &f);
  check(st == VP8_STATUS_OK, "{}: WebP: {} (status {})", label,
        st == VP8_STATUS_NOT_ENOUGH_DATA ? "truncated header" : "not a valid WebP bitstream", static_cast<int>(st));
  check(!f.has_animation, "{}: WebP: an animated WebP is not supported (send one frame as a still image)", label);
  check_dims(f.width, f.height, lim, label, Format::Webp);
  Rgb o;
  o.width = f.width;
  o.height = f.height;
  o.px.resize(static_cast<size_t>(o.width * o.height * 3));
  const uint8_t* r = WebPDecodeRGBInto(d, n, o.px.data(), o.px.size(), static_cast<int>(o.width * 3));
  check(r != nullptr, "{}: WebP: the image data is truncated or corrupt", label);
  return o;
}
#endif

#ifdef KIMI_HAVE_GIF
// giflib's message for an error code ("error N" where it has none: GifErrorString returns NULL then)
std::string gif_error(int code) {
  const char* m = GifErrorString(code);
  return m ? std::string(m) : fmt::format("error {}", code);
}

struct GifMem {
  const uint8_t* p;
  size_t n, off;
};
int gif_read(GifFileType* g, GifByteType* buf, int len) {
  auto* m = static_cast<GifMem*>(g->UserData);
  const size_t k = std::min(static_cast<size_t>(len < 0 ? 0 : len), m->n - m->off);
  std::memcpy(buf, m->p + m->off, k);
  m->off += k;
  return static_cast<int>(k);
}
struct GifCloser {
  GifFileType* g;
  ~GifCloser() {
    int e = 0;
    if (g) DGifCloseFile(g, &e);
  }
};

Rgb decode_gif(const uint8_t* d, size_t n, const Limits& lim, const std::string& label) {
  GifMem mem{d, n, 0};
  int err = 0;
  GifFileType* g = DGifOpen(&mem, gif_read, &err);
  check(g != nullptr, "{}: GIF: {}", label, gif_error(err));
  GifCloser closer{g};
  check_dims(g->SWidth, g->SHeight, lim, label, Format::Gif);
  for (;;) {
    GifRecordType type;
    check(DGifGetRecordType(g, &type) == GIF_OK, "{}: GIF: {} (truncated or corrupt)", label, gif_error(g->Error));
    if (type == TERMINATE_RECORD_TYPE) fail("{}: GIF: no image in the file", label);
    if (type == EXTENSION_RECORD_TYPE) {
      int code = 0;
      GifByteType* ext = nullptr;
      check(DGifGetExtension(g, &code, &ext) == GIF_OK, "{}: GIF: {}", label, gif_error(g->Error));
      while (ext) check(DGifGetExtensionNext(g, &ext) == GIF_OK, "{}: GIF: {}", label, gif_error(g->Error));
      continue;
    }
    if (type != IMAGE_DESC_RECORD_TYPE) continue;
    check(DGifGetImageDesc(g) == GIF_OK, "{}: GIF: {}", label, gif_error(g->Error));
    const GifImageDesc& id = g->Image;
    check(id.Left >= 0 && id.Top >= 0 && id.Width > 0 && id.Height > 0 && id.Left + id.Width <= g->SWidth &&
              id.Top + id.Height <= g->SHeight,
          "{}: GIF: the first frame ({}x{} at {},{}) lies outside the {}x{} screen", label, id.Width, id.Height,
          id.Left, id.Top, g->SWidth, g->SHeight);
    const ColorMapObject* cm = id.ColorMap ? id.ColorMap : g->SColorMap;
    check(cm != nullptr && cm->ColorCount > 0, "{}: GIF: no colour map", label);
    Rgb o;
    o.width = g->SWidth;
    o.height = g->SHeight;
    o.px.assign(static_cast<size_t>(o.width * o.height * 3), 0);
    if (g->SColorMap && g->SBackGroundColor < g->SColorMap->ColorCount) {
      const GifColorType bg = g->SColorMap->Colors[g->SBackGroundColor];
      for (int64_t i = 0; i < o.width * o.height; ++i) {
        o.px[static_cast<size_t>(i * 3)] = bg.Red;
        o.px[static_cast<size_t>(i * 3 + 1)] = bg.Green;
        o.px[static_cast<size_t>(i * 3 + 2)] = bg.Blue;
      }
    }
    std::vector<GifPixelType> line(static_cast<size_t>(id.Width));
    auto put = [&](int row) {
      check(DGifGetLine(g, line.data(), id.Width) == GIF_OK, "{}: GIF: {} (truncated or corrupt)", label,
            gif_error(g->Error));
      uint8_t* dst = o.px.data() + (static_cast<int64_t>(id.Top + row) * o.width + id.Left) * 3;
      for (int x = 0; x < id.Width; ++x) {
        const int idx = line[static_cast<size_t>(x)] < cm->ColorCount ? line[static_cast<size_t>(x)] : 0;
        dst[x * 3] = cm->Colors[idx].Red;
        dst[x * 3 + 1] = cm->Colors[idx].Green;
        dst[x * 3 + 2] = cm->Colors[idx].Blue;
      }
    };
    if (id.Interlace) {
      static const int start[4] = {0, 4, 2, 1}, step[4] = {8, 8, 4, 2};
      for (int p = 0; p < 4; ++p)
        for (int r = start[p]; r < id.Height; r += step[p]) put(r);
    } else {
      for (int r = 0; r < id.Height; ++r) put(r);
    }
    return o;
  }
}
#endif

}  // namespace

Rgb decode(const uint8_t* data, size_t n, const Limits& lim, const std::string& label) {
  check(n > 0, "{}: empty image (0 bytes)", label);
  check(n <= lim.max_bytes, "{}: image of {} bytes, over the limit of {} bytes", label, n, lim.max_bytes);
  const Format f = sniff(data, n);
  check(f != Format::Unknown, "{}: not an image this engine reads (PNG, JPEG, WebP or GIF, by its first bytes)",
        label);
  check(format_available(f), "{}: {} image, but this build of kimi has no {} decoder (rebuild with {})", label,
        format_name(f), format_name(f),
        f == Format::Png ? "libpng-dev" : f == Format::Jpeg ? "libjpeg62-turbo-dev" : f == Format::Webp ? "libwebp-dev"
                                                                                                        : "libgif-dev");
  switch (f) {
#ifdef KIMI_HAVE_PNG
    case Format::Png: return decode_png(data, n, lim, label);
#endif
#ifdef KIMI_HAVE_JPEG
    case Format::Jpeg: return decode_jpeg(data, n, lim, label);
#endif
#ifdef KIMI_HAVE_WEBP
    case Format::Webp: return decode_webp(data, n, lim, label);
#endif
#ifdef KIMI_HAVE_GIF
    case Format::Gif: return decode_gif(data, n, lim, label);
#endif
    default: fail("{}: no decoder", label);
  }
}

Rgb decode_file(const std::string& path, const Limits& lim) {
  std::ifstream f(path, std::ios::binary | std::ios::ate);
  check(f.good(), "{}: cannot open the image", path);
  const std::streamoff size = f.tellg();
  check(size >= 0, "{}: cannot read the image", path);
  check(static_cast<uint64_t>(size) <= lim.max_bytes, "{}: image of {} bytes, over the limit of {} bytes", path,
        static_cast<uint64_t>(size), lim.max_bytes);
  std::string bytes(static_cast<size_t>(size), '\0');
  f.seekg(0);
  f.read(bytes.data(), size);
  check(f.good() || size == 0, "{}: read error", path);
  return decode(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size(), lim, path);
}

}  // namespace kimi::image
