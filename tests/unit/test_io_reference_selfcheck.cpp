// Self-checks of the float64 reference (tests/ref) against hand computations. These run without
// the engine or the converter: they prove the reference's building blocks are right before the
// reference is used to judge anything else.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>

#include "ref/ref_checkpoint.h"
#include "ref/reference.h"
#include "test_util.h"
#include "util/error.h"

using namespace kimi::ref;

namespace {

// formats-quant.md §3.7: codes 0..15 then 15..0, scale byte 0x7E (2^-1).
const uint8_t kCtPacked[16] = {0x10, 0x32, 0x54, 0x76, 0x98, 0xBA, 0xDC, 0xFE,
                               0xEF, 0xCD, 0xAB, 0x89, 0x67, 0x45, 0x23, 0x01};
const uint8_t kGgmlQs[16] = {0xF0, 0xE1, 0xD2, 0xC3, 0xB4, 0xA5, 0x96, 0x87,
                             0x78, 0x69, 0x5A, 0x4B, 0x3C, 0x2D, 0x1E, 0x0F};
const double kExample[32] = {0, .25, .5, .75, 1, 1.5, 2, 3, 0, -.25, -.5, -.75, -1, -1.5, -2, -3,
                             -3, -2, -1.5, -1, -.75, -.5, -.25, 0, 3, 2, 1.5, 1, .75, .5, .25, 0};

}  // namespace

TEST(RefSelfcheck, E2M1Table) {
  const double want[16] = {0, 0.5, 1, 1.5, 2, 3, 4, 6, -0.0, -0.5, -1, -1.5, -2, -3, -4, -6};
  for (int c = 0; c < 16; ++c) EXPECT_EQ(e2m1_value(c), want[c]) << "code " << c;
  EXPECT_THROW(e2m1_value(16), kimi::Error);
}

TEST(RefSelfcheck, Mxfp4WorkedExample) {
  const uint8_t scale = 0x7E;
  double out[32];
  mxfp4_decode_row(kCtPacked, &scale, 32, out);
  for (int i = 0; i < 32; ++i) EXPECT_EQ(out[i], kExample[i]) << "element " << i;
  // The ggml block of the same data decodes to the same values with ggml's nibble order: this is
  // the repack relation of formats-quant §3.5.
  mxfp4_decode_row(kGgmlQs, &scale, 32, out, /*ggml_order=*/true);
  for (int i = 0; i < 32; ++i) EXPECT_EQ(out[i], kExample[i]) << "element " << i;
  // The nibble-order trap on the source bytes gives different values: element 1 = low nibble of
  // byte 0x32 = code 2 = 1.0, times 0.5.
  mxfp4_decode_row(kCtPacked, &scale, 32, out, /*ggml_order=*/true);
  EXPECT_EQ(out[1], 0.5);
  EXPECT_EQ(out[16], 0.25);  // high nibble of byte 0x10 = code 1 = 0.5, times 0.5
}

TEST(RefSelfcheck, Mxfp4ScaleAndNan) {
  const uint8_t scale_one = 127, scale_nan = 0xFF;
  double out[32];
  mxfp4_decode_row(kCtPacked, &scale_one, 32, out);
  EXPECT_EQ(out[7], 6.0);    // code 7 at scale 2^0
  EXPECT_EQ(out[16], -6.0);  // code 15
  mxfp4_decode_row(kCtPacked, &scale_one, 32, out, false, /*half_scale=*/true);
  EXPECT_EQ(out[7], 3.0);
  EXPECT_THROW(mxfp4_decode_row(kCtPacked, &scale_nan, 32, out), kimi::Error);
}

TEST(RefSelfcheck, NumberRounding) {
  EXPECT_EQ(bf16_bits_to_double(0x3F80), 1.0);
  EXPECT_EQ(bf16_bits_to_double(0xC040), -3.0);
  EXPECT_EQ(f16_bits_to_double(0x3C00), 1.0);
  EXPECT_EQ(f16_bits_to_double(0x0001), std::ldexp(1.0, -24));
  EXPECT_EQ(f16_bits_to_double(0xFBFF), -65504.0);
  // bf16 keeps 8 significant bits: 1 + 2^-8 is a tie between 1 and 1 + 2^-7 -> even (1)
  EXPECT_EQ(round_to_bf16(1.0 + std::ldexp(1.0, -8)), 1.0);
  EXPECT_EQ(round_to_bf16(1.0 + 3 * std::ldexp(1.0, -8)), 1.0 + std::ldexp(1.0, -6));
  EXPECT_EQ(round_to_f16(1.0 + std::ldexp(1.0, -11)), 1.0);
  EXPECT_EQ(round_to_f16(70000.0), INFINITY);
  // Q8_0: block max 127 -> d = 1 exactly, values rounded half away from zero
  std::vector<double> x(32, 0.0);
  x[0] = 127.0;
  x[1] = 2.5;
  x[2] = -2.5;
  x[3] = 0.4;
  round_q8_0(x.data(), 32);
  EXPECT_EQ(x[0], 127.0);
  EXPECT_EQ(x[1], 3.0);
  EXPECT_EQ(x[2], -3.0);
  EXPECT_EQ(x[3], 0.0);
}

TEST(RefSelfcheck, SituByHand) {
  // situ(g, u) = 4 tanh(g/4) sigmoid(g) * 25 tanh(u/25)
  // g=1, u=2: 4 * 0.24491866240370913 * 0.7310585786300049 * 25 * 0.07982976911113136
  EXPECT_NEAR(situ(1, 2, 4, 25), 1.4293511315552199, 1e-15);
  EXPECT_NEAR(situ(-3, 0.5, 4, 25), -0.060236955949608845, 1e-15);
  EXPECT_NEAR(situ(10, -40, 4, 25), -90.92900922276634, 1e-12);
  // lambda <= 0: the up branch is u itself
  EXPECT_NEAR(situ(1, 2, 4, 0), 1.4323991137345409, 1e-15);
  EXPECT_EQ(situ(0, 5, 4, 25), 0.0);
}

TEST(RefSelfcheck, ResMixByHand) {
  const std::vector<double> w = {1.0, 0.0};
  const std::vector<double> b0 = {2.0, 0.0}, c = {0.0, 3.0};
  // eps = 0: b0/rms(b0) = (sqrt2, 0) -> score sqrt2; c/rms(c) = (0, sqrt2) -> score 0.
  // pi_b0 = e^sqrt2 / (e^sqrt2 + 1) = 0.8044296825069569; result = pi_b0 * b0 + pi_c * c (raw vectors)
  const double pb = 0.8044296825069569, pc = 1.0 - pb;
  auto r = res_mix({&b0}, c, w, 0.0);
  ASSERT_EQ(r.size(), 2u);
  EXPECT_NEAR(r[0], 2.0 * pb, 1e-15);
  EXPECT_NEAR(r[1], 3.0 * pc, 1e-15);
  // empty bank: the current stream unchanged
  EXPECT_EQ(res_mix({}, c, w, 0.0), c);
  // three candidates: b1 = (1, -1), rms 1 -> score 1; softmax over (sqrt2, 1, 0)
  const std::vector<double> b1 = {1.0, -1.0};
  r = res_mix({&b0, &b1}, c, w, 0.0);
  const double e0 = std::exp(std::sqrt(2.0)), e1 = std::exp(1.0), ec = 1.0, z = e0 + e1 + ec;
  EXPECT_NEAR(r[0], (2.0 * e0 + 1.0 * e1) / z, 1e-15);
  EXPECT_NEAR(r[1], (-1.0 * e1 + 3.0 * ec) / z, 1e-15);
  // the traps produce something else
  auto t1 = res_mix({&b0}, c, w, 0.0, Trap::CurrentFirstInSoftmax);
  EXPECT_NEAR(t1[0], 2.0 * pc, 1e-15);
  auto t2 = res_mix({&b0}, c, w, 0.0, Trap::ResSumNormalized);
  EXPECT_NEAR(t2[0], std::sqrt(2.0) * pb, 1e-15);
  // eps enters as sqrt(mean(x^2) + eps)
  r = res_mix({&b0}, c, w, 1.0);
  const double s0 = 2.0 / std::sqrt(2.0 + 1.0), sc = 0.0;
  const double pb2 = std::exp(s0) / (std::exp(s0) + std::exp(sc));
  EXPECT_NEAR(r[0], 2.0 * pb2, 1e-15);
}

TEST(RefSelfcheck, KdaRecurrenceByHand) {
  // One head, D = 2, two tokens; inputs already normalized.
  const double is2 = 1.0 / std::sqrt(2.0);
  std::vector<std::vector<double>> q = {{0.6, 0.8}, {1.0, 0.0}}, k = {{1.0, 0.0}, {0.6, 0.8}},
                                   v = {{2.0, -1.0}, {1.0, 1.0}},
                                   g = {{std::log(0.5), std::log(0.25)}, {std::log(0.5), std::log(0.25)}};
  std::vector<double> beta = {0.5, 1.0};
  // t0: S = 0 -> p = 0, delta = 0.5*(2,-1) = (1,-0.5), S = k0 delta^T = [[1,-0.5],[0,0]],
  //     o0 = S^T q0 / sqrt2 = (0.6, -0.3)/sqrt2
  // t1: decay rows by (0.5, 0.25): S = [[0.5,-0.25],[0,0]]; p = S^T k1 = (0.3,-0.15);
  //     delta = (0.7, 1.15); S += k1 delta^T = [[0.92,0.44],[0.56,0.92]]; o1 = S^T q1/sqrt2 = (0.92,0.44)/sqrt2
  auto o = kda_recurrence(q, k, v, g, beta);
  ASSERT_EQ(o.size(), 2u);
  EXPECT_NEAR(o[0][0], 0.6 * is2, 1e-15);
  EXPECT_NEAR(o[0][1], -0.3 * is2, 1e-15);
  EXPECT_NEAR(o[1][0], 0.92 * is2, 1e-15);
  EXPECT_NEAR(o[1][1], 0.44 * is2, 1e-15);
  // predicting with the undecayed state: p = (0.6,-0.3), delta = (0.4,1.3), S row0 = (0.74, 0.53)
  auto t = kda_recurrence(q, k, v, g, beta, Trap::DeltaOrderWrong);
  EXPECT_NEAR(t[1][0], 0.74 * is2, 1e-15);
  EXPECT_NEAR(t[1][1], 0.53 * is2, 1e-15);
  // reading before the update: row0 of the decayed state = (0.5, -0.25)
  t = kda_recurrence(q, k, v, g, beta, Trap::ReadBeforeUpdate);
  EXPECT_NEAR(t[1][0], 0.5 * is2, 1e-15);
  EXPECT_NEAR(t[1][1], -0.25 * is2, 1e-15);
}

TEST(RefSelfcheck, IndexerByHand) {
  // 2 heads of dim 2: q_0 = (1,0), q_1 = (0,1); weights (1, -0.5)
  const std::vector<double> q = {1, 0, 0, 1}, w = {1.0, -0.5};
  const std::vector<std::vector<double>> keys = {{1, 1}, {-1, 2}, {2, -1}, {1, 1}};
  // a: relu(1)*1 + relu(1)*-0.5 = 0.5; b: relu(-1)*1 + relu(2)*-0.5 = -1; c: 2 + 0 = 2; d = a = 0.5
  std::vector<double> s;
  for (const auto& k : keys) s.push_back(indexer_score(q, w, k, 2, 2));
  EXPECT_EQ(s, (std::vector<double>{0.5, -1.0, 2.0, 0.5}));
  // top-2: c, then the tie a/d -> the earlier position (0) wins
  EXPECT_EQ(select_top_k(s, 2), (std::vector<int64_t>{0, 2}));
  EXPECT_EQ(select_top_k(s, 2, Trap::IndexerTieLater), (std::vector<int64_t>{2, 3}));
  EXPECT_EQ(select_top_k(s, 3), (std::vector<int64_t>{0, 2, 3}));
  EXPECT_EQ(select_top_k(s, 4), (std::vector<int64_t>{0, 1, 2, 3}));
  EXPECT_EQ(select_top_k(s, 100), (std::vector<int64_t>{0, 1, 2, 3}));
  // without ReLU b scores 1*-1 + -0.5*2 = -2
  EXPECT_EQ(indexer_score(q, w, keys[1], 2, 2, Trap::IndexerNoRelu), -2.0);
}

namespace {

struct RandomModel : ::testing::Test {
  kimi::test::TempDir dir;
  void make(const RandomSpec& s) { write_random_checkpoint(dir.path, s); }
};

bool all_finite(const std::vector<std::vector<double>>& x) {
  for (const auto& r : x)
    for (double v : r)
      if (!std::isfinite(v)) return false;
  return true;
}

}  // namespace

TEST_F(RandomModel, LogitsFiniteAndNonDegenerate) {
  make({});
  auto m = RefModel::load(dir.path);
  std::vector<int32_t> toks = {3, 17, 17, 42, 0, 63, 5, 9};
  auto lg = m.forward(toks);
  ASSERT_EQ(lg.size(), toks.size());
  ASSERT_EQ(lg[0].size(), 64u);
  EXPECT_TRUE(all_finite(lg));
  // not constant across the vocabulary, and different at different positions
  double spread = 0.0;
  for (double v : lg[0]) spread = std::max(spread, std::fabs(v - lg[0][0]));
  EXPECT_GT(spread, 1e-2);
  EXPECT_GT(max_rel_diff({lg[1]}, {lg[2]}), 1e-3);  // same token, different history
  // causality: logits of a prefix do not depend on later tokens
  auto pre = m.forward({3, 17, 17});
  for (size_t t = 0; t < 3; ++t) EXPECT_EQ(pre[t], lg[t]) << "position " << t;
}

TEST_F(RandomModel, TopKCoveringEverythingEqualsDenseExactly) {
  make({});
  auto m = RefModel::load(dir.path);
  std::vector<int32_t> toks;
  for (int i = 0; i < 12; ++i) toks.push_back((i * 37 + 5) % 64);
  auto dense = m.forward(toks, {.attn_top_k = 0});
  auto full = m.forward(toks, {.attn_top_k = 12});
  EXPECT_EQ(full, dense);  // bit-identical, not just close
  auto more = m.forward(toks, {.attn_top_k = 1000});
  EXPECT_EQ(more, dense);
  // and the sparse selection with top_k = 4 < 12 does change the later positions only
  auto sparse = m.forward(toks, {.attn_top_k = 4});
  for (size_t t = 0; t < 4; ++t) EXPECT_EQ(sparse[t], dense[t]) << "position " << t;
  std::vector<std::vector<double>> tail_s(sparse.begin() + 4, sparse.end()), tail_d(dense.begin() + 4, dense.end());
  EXPECT_GT(max_rel_diff(tail_s, tail_d), 1e-4);
  // the config default (index_topk = 4) is what forward() uses without options
  EXPECT_EQ(m.forward(toks), sparse);
}

TEST_F(RandomModel, EmulationChangesLittle) {
  make({});
  auto m = RefModel::load(dir.path);
  std::vector<int32_t> toks = {1, 2, 3, 4, 5, 6};
  auto exact = m.forward(toks, {.attn_top_k = 0});
  auto fast = m.forward(toks, {.attn_top_k = 0, .emulate_fast = true});
  const double d = max_rel_diff(fast, exact);
  EXPECT_GT(d, 1e-6);  // the rounding is really applied
  EXPECT_LT(d, 0.1);   // and stays a rounding-level change
}

TEST_F(RandomModel, BadInputsAreErrors) {
  make({});
  auto m = RefModel::load(dir.path);
  EXPECT_THROW(m.forward({64}), kimi::Error);
  EXPECT_THROW(m.forward({-1}), kimi::Error);
  EXPECT_THROW(m.forward({}), kimi::Error);
  EXPECT_THROW(m.forward({1}, {.attn_top_k = -2}), kimi::Error);
  EXPECT_THROW(RefModel::load(dir.path + "/missing"), kimi::Error);
  // the 0-indexed layer schedule ([2, 4] -> layers 2 and 4) treats the MLA layer 1 as KDA: a clear
  // error naming the KDA tensor it cannot find
  try {
    m.forward({1, 2}, {.trap = Trap::ZeroIndexedFullAttn});
    FAIL() << "expected kimi::Error";
  } catch (const kimi::Error& e) {
    EXPECT_NE(std::string(e.what()).find("layers.1.self_attn.q_proj.weight' not found"), std::string::npos) << e.what();
  }
}

TEST_F(RandomModel, PlainExpertsMatchTheirOwnPackedDecode) {
  // Unquantized experts (BF16 .weight) load through the same path as MXFP4 ones.
  RandomSpec s;
  s.mxfp4 = false;
  make(s);
  auto m = RefModel::load(dir.path);
  EXPECT_FALSE(m.config().experts_packed);
  EXPECT_TRUE(all_finite(m.forward({1, 2, 3})));
}

TEST_F(RandomModel, PatchCheckpointRewritesOneTensor) {
  make({});
  kimi::test::TempDir out;
  const std::string name = "language_model.model.layers.1.self_attn.indexer.wk.weight";
  patch_checkpoint(dir.path, out.path, {{name, [](std::vector<double>& v, const std::vector<int64_t>&) {
                                           for (auto& x : v) x = 0.0;
                                         }}});
  auto a = RefModel::load(dir.path), b = RefModel::load(out.path);
  std::vector<int32_t> toks = {1, 2, 3, 4, 5, 6, 7, 8};
  // layer 1 is the first MLA layer; prefix positions up to top_k see everything, so only the
  // selection can differ; with wk = 0 every key is the k_norm bias: all scores tie, so the
  // earliest 4 positions are selected.
  EXPECT_EQ(a.forward(toks, {.attn_top_k = 0}), b.forward(toks, {.attn_top_k = 0}));
  auto tied = b.forward(toks);
  auto later = b.forward(toks, {.trap = Trap::IndexerTieLater});
  EXPECT_GT(max_rel_diff(later, tied), 1e-4);
  EXPECT_THROW(patch_checkpoint(dir.path, out.path + "/x", {{"nope", {}}}), kimi::Error);
}
