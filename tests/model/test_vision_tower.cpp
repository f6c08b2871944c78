// The MoonViT3D tower + projector (docs/spec/vision.md §3) on a synthetic checkpoint converted to a
// projector file, against the float64 reference that reads the Hugging Face tensors
// (tests/ref/ref_vision.*): f32 within 1e-4 relative RMS, for images of odd sizes and both aspect
// ratios, one and several per call (the batched call equals the images alone).
#include <gtest/gtest.h>

#include <atomic>
#include <cmath>

#include "backend/cpu/cpu_backend.h"
#include "image/image.h"
#include "image_fixture.h"
#include "model/vision.h"
#include "ref/ref_vision.h"
#include "test_util.h"
#include "util/error.h"
#include "util/thread_pool.h"

using namespace kimi;

namespace {

using test::random_image;

double rel_rms(const std::vector<float>& a, size_t off, const std::vector<std::vector<double>>& b) {
  double num = 0, den = 0;
  size_t i = off;
  for (const auto& row : b)
    for (double v : row) {
      const double d = static_cast<double>(a[i++]) - v;
      num += d * d;
      den += v * v;
    }
  return std::sqrt(num / den);
}

struct Tower {
  std::string dir = test::tiny_vision_dir(1);
  std::unique_ptr<VisionModel> vm = VisionModel::load(dir + "/model.mmproj.gguf", 64);
  ThreadPool pool{2};
  CpuBackend be{pool, Precision::F32};
  std::unique_ptr<VisionEncoder> enc;
  Tower() {
    be.reserve({});
    enc = std::make_unique<VisionEncoder>(*vm, be);
  }
};

}  // namespace

TEST(VisionTower, MatchesTheFloat64Reference) {
  Tower t;
  auto ref = ref::RefVision::load(test::tiny_hf(1));
  ASSERT_EQ(ref.text_hidden(), 64);
  // odd sizes: landscape, portrait, square-ish; 8x8 position grid resampled up and down
  const std::pair<int64_t, int64_t> sizes[] = {{50, 30}, {31, 77}, {120, 45}, {14, 14}};
  std::vector<image::Patches> ps;
  std::vector<ref::RefImage> rs;
  for (size_t i = 0; i < std::size(sizes); ++i) {
    const image::Rgb im = random_image(sizes[i].first, sizes[i].second, static_cast<uint32_t>(i + 1));
    ps.push_back(t.vm->preprocess(im));
    rs.push_back(ref::ref_preprocess(im.px, im.width, im.height));
    ASSERT_EQ(ps.back().size.tokens, rs.back().size.tokens);
  }
  std::vector<std::vector<float>> alone;
  for (size_t i = 0; i < ps.size(); ++i) {
    alone.push_back(t.enc->encode({&ps[i]}));
    const auto r = ref.forward({&rs[i]});
    ASSERT_EQ(alone.back().size(), r.size() * 64);
    const double e = rel_rms(alone.back(), 0, r);
    std::printf("%lldx%lld: %zu rows, relative RMS error vs the float64 reference %.3g\n",
                static_cast<long long>(sizes[i].first), static_cast<long long>(sizes[i].second), r.size(), e);
    EXPECT_LT(e, 1e-4) << sizes[i].first << "x" << sizes[i].second;
    EXPECT_GT(e, 0.0);  // f32 vs f64: some rounding must be visible (the comparison is not vacuous)
  }
  // several images in one call: each equals the image alone (attention stays inside an image)
  const std::vector<float> all = t.enc->encode({&ps[0], &ps[1], &ps[2], &ps[3]});
  size_t off = 0;
  for (size_t i = 0; i < ps.size(); ++i) {
    for (size_t k = 0; k < alone[i].size(); ++k) ASSERT_EQ(all[off + k], alone[i][k]) << "image " << i << " value " << k;
    off += alone[i].size();
  }
  EXPECT_EQ(off, all.size());
  const auto rall = ref.forward({&rs[0], &rs[1], &rs[2], &rs[3]});
  EXPECT_LT(rel_rms(all, 0, rall), 1e-4);
}

// The cancel flag (the server's tower worker, docs/engine.md "Images in the server"): set, the
// encoder stops with "vision: cancelled"; clear, the rows are those of a call without it; the
// encoder is usable again after a stopped call.
TEST(VisionTower, CancelFlagStopsTheEncoder) {
  Tower t;
  const auto p = t.vm->preprocess(random_image(60, 40, 3));
  const std::vector<float> plain = t.enc->encode({&p});
  std::atomic<bool> cancel{true};
  try {
    t.enc->encode({&p}, &cancel);
    ADD_FAILURE() << "a cancelled encode returned";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("vision: cancelled"), std::string::npos) << e.what();
  }
  cancel = false;
  EXPECT_EQ(t.enc->encode({&p}, &cancel), plain);
}

// The reference can see the mistakes a tower might make: the same image transposed (rows and
// columns swapped in the rotary embedding and the position grid) gives clearly different rows.
TEST(VisionTower, OutputDependsOnLayout) {
  Tower t;
  const image::Rgb a = random_image(56, 28, 7);
  image::Rgb b = a;
  b.width = 28, b.height = 56;
  for (int64_t y = 0; y < 56; ++y)
    for (int64_t x = 0; x < 28; ++x)
      for (int c = 0; c < 3; ++c) b.px[static_cast<size_t>((y * 28 + x) * 3 + c)] = a.at(y, x, c);
  const auto pa = t.vm->preprocess(a), pb = t.vm->preprocess(b);
  const auto ea = t.enc->encode({&pa}), eb = t.enc->encode({&pb});
  ASSERT_EQ(ea.size(), eb.size());
  double diff = 0, norm = 0;
  for (size_t i = 0; i < ea.size(); ++i) diff += std::fabs(ea[i] - eb[i]), norm += std::fabs(ea[i]);
  EXPECT_GT(diff / norm, 0.05);
}

TEST(VisionTower, LoadRefusesATextModelAndAMismatchedProjector) {
  const std::string dir = test::tiny_vision_dir(1);
  try {
    VisionModel::load(dir + "/model.gguf");
    FAIL() << "a text GGUF loaded as a projector";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("not a vision projector file"), std::string::npos) << e.what();
  }
  try {
    VisionModel::load(dir + "/model.mmproj.gguf", 128);
    FAIL() << "a projector for hidden 64 accepted for 128";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("hidden size is 128"), std::string::npos) << e.what();
  }
}
