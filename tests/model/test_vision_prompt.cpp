// Images in the prompt (docs/spec/vision.md §4, docs/engine.md "Images"): the tower's rows enter the
// forward pass at the <|media_pad|> positions. Checked on the tiny preset (seed 1, --precision f32):
// the image changes the logits (the rows are used), a prompt with an image evaluated in one batch,
// in chunks and token by token gives the same logits (prefill == decode), a sequence with an image
// in a batch with another sequence equals it alone, and the placeholder count must match the rows.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>

#include "image/image.h"
#include "image_fixture.h"
#include "model/model.h"
#include "runtime/context.h"
#include "runtime/vision_input.h"
#include "test_util.h"
#include "tokenizer/tokenizer.h"
#include "util/error.h"

using namespace kimi;

namespace {

using test::random_image;

struct VisionSetup {
  std::string dir = test::tiny_vision_dir(1);
  std::unique_ptr<Model> model = Model::load(dir + "/model.gguf");
  tok::Tokenizer tok = tok::Tokenizer::from_gguf(model->reader());
  VisionRunner vision{dir + "/model.mmproj.gguf", model->hparams().n_embd, 2, Precision::F32};
  int64_t d = model->hparams().n_embd;
  std::vector<float> rows;
  std::vector<int32_t> tokens;
  VisionSetup() {
    auto a = vision.preprocess(random_image(60, 33, 3));
    auto b = vision.preprocess(random_image(29, 50, 4));
    rows = vision.encode({&a, &b});
    tokens = tok.encode("Look: " + media_text(a) + " and " + media_text(b) + " What differs?");
  }
  ContextOptions opts(int n_batch, int n_seq = 1) const {
    ContextOptions o;
    o.n_threads = 2;
    o.precision = Precision::F32;
    o.n_batch_max = n_batch;
    o.n_ctx_max = 512;
    o.n_seq_max = n_seq;
    return o;
  }
};

std::vector<float> last_logits(Context& ctx, const Batch& b) {
  const float* l = ctx.logits(static_cast<int32_t>(b.size() - 1));
  return std::vector<float>(l, l + ctx.n_vocab());
}

}  // namespace

TEST(VisionPrompt, ImageRowsReachTheModelAndPrefillEqualsDecode) {
  VisionSetup s;
  const int32_t ph = s.vision.model().hp().placeholder;
  ASSERT_EQ(s.tok.token_id("<|media_pad|>"), ph);
  const int64_t n_rows = static_cast<int64_t>(s.rows.size()) / s.d;
  ASSERT_GT(n_rows, 2);

  // one batch
  Context whole(*s.model, s.opts(512));
  Batch b;
  add_prompt_with_images(b, s.tokens, ph, s.rows.data(), n_rows, s.d, 0, 0, true);
  whole.decode(b);
  const std::vector<float> ref = last_logits(whole, b);

  // the same tokens without the rows: the placeholder's own embedding row -> different logits
  Context plain(*s.model, s.opts(512));
  Batch pb;
  pb.add_sequence(s.tokens, 0, 0, true);
  plain.decode(pb);
  const std::vector<float> pl = last_logits(plain, pb);
  double diff = 0, norm = 0;
  for (size_t i = 0; i < ref.size(); ++i) diff += std::fabs(ref[i] - pl[i]), norm += std::fabs(ref[i]);
  EXPECT_GT(diff / norm, 1e-3) << "the image rows did not change the logits";

  // micro-batches of 7 and token by token: the same logits
  for (int nb : {7, 1}) {
    Context c(*s.model, s.opts(nb));
    Batch cb;
    add_prompt_with_images(cb, s.tokens, ph, s.rows.data(), n_rows, s.d, 0, 0, true);
    c.decode(cb);
    const std::vector<float> got = last_logits(c, cb);
    for (size_t i = 0; i < ref.size(); ++i) ASSERT_NEAR(got[i], ref[i], 1e-5f * (1 + std::fabs(ref[i]))) << nb << " " << i;
  }
  {
    Context c(*s.model, s.opts(512));
    size_t r = 0;
    for (size_t i = 0; i < s.tokens.size(); ++i) {
      Batch one;
      if (s.tokens[i] == ph)
        one.add_embd(ph, s.rows.data() + (r++) * s.d, 0, static_cast<int32_t>(i), true);
      else
        one.add(s.tokens[i], 0, static_cast<int32_t>(i), true);
      c.decode(one);
      if (i + 1 == s.tokens.size()) {
        const std::vector<float> got = last_logits(c, one);
        for (size_t k = 0; k < ref.size(); ++k) ASSERT_NEAR(got[k], ref[k], 1e-5f * (1 + std::fabs(ref[k]))) << k;
      }
    }
  }
  // in a batch with another (text) sequence: the same logits
  {
    Context c(*s.model, s.opts(512, 2));
    Batch two;
    const std::vector<int32_t> other = s.tok.encode("Another sequence, text only.");
    two.add_sequence(other, 1, 0, true);
    add_prompt_with_images(two, s.tokens, ph, s.rows.data(), n_rows, s.d, 0, 0, true);
    c.decode(two);
    const std::vector<float> got = last_logits(c, two);
    for (size_t i = 0; i < ref.size(); ++i) ASSERT_NEAR(got[i], ref[i], 1e-5f * (1 + std::fabs(ref[i]))) << i;
  }
}

TEST(VisionPrompt, PlaceholderCountMustMatchTheRows) {
  VisionSetup s;
  const int32_t ph = s.vision.model().hp().placeholder;
  Batch b;
  try {
    add_prompt_with_images(b, s.tokens, ph, s.rows.data(), static_cast<int64_t>(s.rows.size()) / s.d - 1, s.d, 0, 0,
                           true);
    FAIL() << "a prompt with more placeholders than rows was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("image placeholder tokens"), std::string::npos) << e.what();
  }
}

// kimi run / kimi chat with --image (docs/engine.md "Images", docs/chat.md): a text-only model says
// how to get a projector; a chat with images resumes from its cached prompt on the next turn.
TEST(VisionPrompt, RunAndChatTakeImages) {
  const std::string dir = test::tiny_vision_dir(1);
  const std::string img = std::string(KIMI_SOURCE_DIR) + "/data/images/red-square.png";
  auto r = test::run_kimi("run -m " + dir + "/model.gguf --image " + img + " -p 'What is it?' -n 4 --ids");
  ASSERT_EQ(r.exit_code, 0) << r.out;
  // a text-only file of the same model: no projector next to it
  test::TempDir td;
  std::filesystem::copy_file(dir + "/model.gguf", td.file("text.gguf"));
  r = test::run_kimi("run -m " + td.file("text.gguf") + " --image " + img + " -p 'What is it?' -n 4");
  EXPECT_EQ(r.exit_code, 1) << r.out;
  EXPECT_NE(r.out.find("has no vision projector"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("writes MODEL.mmproj.gguf"), std::string::npos) << r.out;
  // a broken image names itself
  test::write_file(td.file("bad.png"), "\x89PNG\r\n\x1a\nnot really");
  r = test::run_kimi("run -m " + dir + "/model.gguf --image " + td.file("bad.png") + " -p x -n 1");
  EXPECT_EQ(r.exit_code, 1) << r.out;
  EXPECT_NE(r.out.find("bad.png: PNG"), std::string::npos) << r.out;
  // chat: an image with the first message, another with the third; every turn after the first
  // reuses the cached prompt (images included)
  test::write_file(td.file("in.txt"), "Describe it.\nAnd now?\n/image " + img + "\nCompare the two.\n");
  r = test::run_kimi("chat -m " + dir + "/model.gguf --image " + img + " -n 3 --precision f32 --no-history < " +
                     td.file("in.txt"));
  ASSERT_EQ(r.exit_code, 0) << r.out;
  std::vector<int> reused;
  for (size_t p = r.out.find("[prompt "); p != std::string::npos; p = r.out.find("[prompt ", p + 1)) {
    const size_t q = r.out.find(" new, ", p);
    reused.push_back(std::atoi(r.out.c_str() + q + 6));
  }
  ASSERT_EQ(reused.size(), 3u) << r.out;
  EXPECT_EQ(reused[0], 0);
  EXPECT_GT(reused[1], 30) << r.out;  // the first turn's image placeholders are in the cache
  EXPECT_GT(reused[2], reused[1]) << r.out;
  EXPECT_EQ(r.out.find("re-renders differently"), std::string::npos) << r.out;
}
