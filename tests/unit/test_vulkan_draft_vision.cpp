// The Vulkan backend's ops of the DSpark draft (silu_mul_rows, rope_rows) and of the vision tower
// (gelu, rope_2d, segment_attention) against the CPU backend in f32 (whose ops the float64
// references in tests/ref check: test_app_dspark, test_vision_tower), on random inputs of odd shapes.
#include "unit/vulkan_fixture.h"

#include "util/error.h"

using namespace kimi;
using kimi::test::random_floats;
using kimi::test::rel_rms;

using VulkanDraftVision = kimi::test::VulkanOps;

TEST_F(VulkanDraftVision, SiluMulRows) {
  for (int64_t n : {1, 7}) {
    const int64_t w = 333;
    auto g = both(random_floats(static_cast<size_t>(n * w), 1, 6.0f));
    auto u = both(random_floats(static_cast<size_t>(n * w), 2, 2.0f));
    cpu_->silu_mul_rows(g.cp<float>(), u.cp<float>(), n, w);
    gpu_->silu_mul_rows(g.gp<float>(), u.gp<float>(), n, w);
    auto [c, x] = read(g);
    EXPECT_LT(rel_rms(x, c), 1e-6) << "n = " << n;
    auto [cu, xu] = read(u);
    EXPECT_EQ(cu, xu) << "u is not written";
  }
}

// rope_rows as the draft calls it: the latent row's rope tail (one head, head_stride 0) and the
// queries' rope parts (3 heads of 13 values, rope over the last 6, row stride 41), positions of two
// sequences out of order; the table of 40 positions has a magnitude factor folded in
TEST_F(VulkanDraftVision, RopeRows) {
  const int64_t n_ctx = 40, n_rot = 6;
  std::vector<float> table(static_cast<size_t>(n_ctx * n_rot));
  for (int64_t p = 0; p < n_ctx; ++p)
    for (int64_t i = 0; i < n_rot / 2; ++i) {
      const double a = static_cast<double>(p) * std::pow(10000.0, -2.0 * static_cast<double>(i) / n_rot);
      table[static_cast<size_t>((p * n_rot / 2 + i) * 2)] = static_cast<float>(1.3 * std::cos(a));
      table[static_cast<size_t>((p * n_rot / 2 + i) * 2 + 1)] = static_cast<float>(1.3 * std::sin(a));
    }
  auto cs = both(table);
  std::vector<BatchEntry> e(5);
  const int32_t pos[] = {39, 0, 7, 7, 22};
  for (size_t t = 0; t < 5; ++t) e[t].pos = pos[t], e[t].seq_id = static_cast<int32_t>(t % 2);
  {  // queries: 3 heads of 13 (nope 7 + rope 6), rows of 41 floats
    auto x = both(random_floats(5 * 41, 3, 2.0f));
    cpu_->rope_rows(x.cp<float>() + 7, 41, e.data(), 5, 3, 13, n_rot, cs.cp<float>());
    gpu_->rope_rows(x.gp<float>() + 7, 41, e.data(), 5, 3, 13, n_rot, cs.gp<float>());
    auto [c, g] = read(x);
    EXPECT_LT(rel_rms(g, c), 1e-6);
    EXPECT_EQ(c[0], g[0]) << "values before the rope part are not touched";
  }
  {  // latent rows: width 11, rope over the last 6, one head
    auto x = both(random_floats(5 * 11, 4, 2.0f));
    cpu_->rope_rows(x.cp<float>() + 5, 11, e.data(), 5, 1, 0, n_rot, cs.cp<float>());
    gpu_->rope_rows(x.gp<float>() + 5, 11, e.data(), 5, 1, 0, n_rot, cs.gp<float>());
    auto [c, g] = read(x);
    EXPECT_LT(rel_rms(g, c), 1e-6);
  }
}

TEST_F(VulkanDraftVision, Gelu) {
  for (bool tanh_approx : {true, false}) {
    auto xs = random_floats(10007, 5, 7.0f);
    xs[0] = 0.0f, xs[1] = 1e-4f, xs[2] = -0.49f, xs[3] = 0.51f, xs[4] = -30.0f, xs[5] = 30.0f;
    auto x = both(xs);
    cpu_->gelu(x.cp<float>(), 10007, tanh_approx);
    gpu_->gelu(x.gp<float>(), 10007, tanh_approx);
    auto [c, g] = read(x);
    EXPECT_LT(rel_rms(g, c), 1e-6) << (tanh_approx ? "tanh" : "erf");
    double worst = 0;
    for (size_t i = 0; i < c.size(); ++i) worst = std::max(worst, std::fabs(double(g[i]) - c[i]));
    EXPECT_LT(worst, 2e-6) << (tanh_approx ? "tanh" : "erf") << ": largest absolute difference";
  }
}

// rope_2d on the q and k parts of a fused qkv row (3 heads of 20, rows of 3 * 60 floats), row and
// column positions of a 7 x 5 patch grid and a second 2 x 3 image
TEST_F(VulkanDraftVision, Rope2d) {
  const int64_t H = 3, D = 20, Q = H * D, n = 41;
  std::vector<int32_t> row, col;
  for (int32_t r = 0; r < 7; ++r)
    for (int32_t c = 0; c < 5; ++c) row.push_back(r), col.push_back(c);
  for (int32_t r = 0; r < 2; ++r)
    for (int32_t c = 0; c < 3; ++c) row.push_back(r), col.push_back(c);
  ASSERT_EQ(static_cast<int64_t>(row.size()), n);
  for (float theta : {10000.0f, 100.0f}) {
    auto x = both(random_floats(static_cast<size_t>(n * 3 * Q), 6, 2.0f));
    for (int part = 0; part < 2; ++part) {
      cpu_->rope_2d(x.cp<float>() + part * Q, 3 * Q, n, H, D, row.data(), col.data(), theta);
      gpu_->rope_2d(x.gp<float>() + part * Q, 3 * Q, n, H, D, row.data(), col.data(), theta);
    }
    auto [c, g] = read(x);
    EXPECT_LT(rel_rms(g, c), 1e-6) << "theta " << theta;
    EXPECT_EQ(c[static_cast<size_t>(2 * Q)], g[static_cast<size_t>(2 * Q)]) << "v is not touched";
  }
  // a large position: the angle tables match the CPU's to rounding
  std::vector<int32_t> big_r = {511, 0, 300}, big_c = {2, 511, 299};
  auto x = both(random_floats(3 * 3 * Q, 7, 2.0f));
  cpu_->rope_2d(x.cp<float>(), 3 * Q, 3, H, D, big_r.data(), big_c.data(), 10000.0f);
  gpu_->rope_2d(x.gp<float>(), 3 * Q, 3, H, D, big_r.data(), big_c.data(), 10000.0f);
  auto [c, g] = read(x);
  EXPECT_LT(rel_rms(g, c), 1e-6);
}

// segment_attention over segments of 1, 70 (more than one 64-key chunk), 0 and 9 rows; head dims
// 20 and 72 (the tower's) and one of 136 (three output values per invocation); in one dispatch and
// in key windows (KIMI_VULKAN_SEG_WINDOW); more than 65535 (row, head) items (several dispatches)
TEST_F(VulkanDraftVision, SegmentAttention) {
  for (int64_t D : {20, 72, 136}) {
    SCOPED_TRACE("head_dim " + std::to_string(D));
    const int64_t H = 3, Q = H * D, n = 80, ld = 3 * Q + 5;
    const int64_t seg[] = {0, 1, 71, 71, 80};
    auto qkv = both(random_floats(static_cast<size_t>(n * ld), 8 + static_cast<uint32_t>(D), 1.5f));
    auto out = zeros(static_cast<size_t>(n * Q));
    const float scale = 1.0f / std::sqrt(static_cast<float>(D));
    cpu_->segment_attention(qkv.cp<float>(), ld, n, H, D, seg, 4, scale, out.cp<float>());
    gpu_->segment_attention(qkv.gp<float>(), ld, n, H, D, seg, 4, scale, out.gp<float>());
    auto [c, g] = read(out);
    EXPECT_LT(rel_rms(g, c), 1e-6);
    // the one-row segment is that row's value, exactly weighted by 1
    for (int64_t d = 0; d < D; ++d) EXPECT_FLOAT_EQ(g[static_cast<size_t>(d)], c[static_cast<size_t>(d)]);
    // one segment over all rows: a row's output differs from the segmented one (the mask matters)
    const int64_t one[] = {0, n};
    auto out2 = zeros(static_cast<size_t>(n * Q));
    cpu_->segment_attention(qkv.cp<float>(), ld, n, H, D, one, 1, scale, out2.cp<float>());
    gpu_->segment_attention(qkv.gp<float>(), ld, n, H, D, one, 1, scale, out2.gp<float>());
    auto [c2, g2] = read(out2);
    EXPECT_LT(rel_rms(g2, c2), 1e-6);
    EXPECT_GT(rel_rms(g2, g), 1e-3);
    // the keys in windows of one 64-key chunk (what lavapipe's loop limit makes of long segments),
    // the running max and sum carried between dispatches: the same result
    ::setenv("KIMI_VULKAN_SEG_WINDOW", "1", 1);
    auto out3 = zeros(static_cast<size_t>(n * Q));
    gpu_->segment_attention(qkv.gp<float>(), ld, n, H, D, seg, 4, scale, out3.gp<float>());
    auto out4 = zeros(static_cast<size_t>(n * Q));
    gpu_->segment_attention(qkv.gp<float>(), ld, n, H, D, one, 1, scale, out4.gp<float>());
    ::unsetenv("KIMI_VULKAN_SEG_WINDOW");
    auto [c3, g3] = read(out3);
    EXPECT_LT(rel_rms(g3, c), 1e-6) << "windowed";
    auto [c4, g4] = read(out4);
    EXPECT_LT(rel_rms(g4, c2), 1e-6) << "windowed, one segment";
  }
  {  // 4400 rows x 16 heads = 70400 items: two dispatches of workgroups
    const int64_t H = 16, D = 8, Q = H * D, n = 4400, ld = 3 * Q;
    std::vector<int64_t> seg;  // 2200 images of 2 patches (cheap on lavapipe)
    for (int64_t b = 0; b <= n; b += 2) seg.push_back(b);
    const int64_t ns = static_cast<int64_t>(seg.size()) - 1;
    auto qkv = both(random_floats(static_cast<size_t>(n * ld), 99, 1.5f));
    auto out = zeros(static_cast<size_t>(n * Q));
    cpu_->segment_attention(qkv.cp<float>(), ld, n, H, D, seg.data(), ns, 0.35f, out.cp<float>());
    gpu_->segment_attention(qkv.gp<float>(), ld, n, H, D, seg.data(), ns, 0.35f, out.gp<float>());
    auto [c, g] = read(out);
    EXPECT_LT(rel_rms(g, c), 1e-6);
    EXPECT_LT(std::fabs(g.back() - c.back()), 1e-5 * (1 + std::fabs(c.back()))) << "the last item";
  }
  // bounds that do not cover the rows: a clear error
  const int64_t bad[] = {0, 5};
  auto qkv = zeros(static_cast<size_t>(9 * 3 * 8));
  auto out = zeros(static_cast<size_t>(9 * 8));
  EXPECT_THROW(gpu_->segment_attention(qkv.gp<float>(), 24, 9, 1, 8, bad, 1, 1.0f, out.gp<float>()), kimi::Error);
}
