// Importance-matrix files (io/imatrix.h): a golden file in llama.cpp's GGUF imatrix layout, written
// byte by byte by tests/data/quants/make_imatrix_golden.py, loads with the right means; our writer
// reproduces it byte for byte; importances of rare / unseen experts; bad files are clear errors.
#include <gtest/gtest.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "io/imatrix.h"
#include "util/error.h"

using namespace kimi;
using namespace kimi::imatrix;

namespace {

const std::string kGolden = std::string(KIMI_TEST_DATA) + "/quants/imatrix_golden.gguf";

std::vector<char> bytes_of(const std::string& p) {
  std::ifstream f(p, std::ios::binary);
  return {std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>()};
}

std::string tmp_path(const char* name) {
  return (std::filesystem::temp_directory_path() / (std::string("kimi_test_") + std::to_string(::getpid()) + name)).string();
}

TEST(Imatrix, GoldenLoads) {
  const Data d = Data::load(kGolden);
  EXPECT_EQ(d.chunk_count, 3u);
  EXPECT_EQ(d.chunk_size, 64u);
  ASSERT_EQ(d.datasets.size(), 1u);
  EXPECT_EQ(d.datasets[0], "calib.txt");
  ASSERT_EQ(d.entries.size(), 2u);
  const Entry& q = d.entries.at("blk.0.attn_q.weight");
  EXPECT_EQ(q.n_in, 8);
  EXPECT_EQ(q.n_mat, 1);
  EXPECT_EQ(q.count[0], 6.0);
  std::vector<float> w;
  ASSERT_TRUE(d.importance("blk.0.attn_q.weight", w));
  ASSERT_EQ(w.size(), 8u);
  for (int i = 0; i < 8; ++i) EXPECT_FLOAT_EQ(w[i], (i * i + 1) / 6.0f) << i;
  // experts: means per expert; expert 1 saw no token -> the mean over all experts' tokens
  ASSERT_TRUE(d.importance("blk.1.ffn_up_exps.weight", w));
  ASSERT_EQ(w.size(), 12u);
  const float all[4] = {3.0f / 3, 4.5f / 3, 6.25f / 3, 11.0f / 3};
  const float e0[4] = {1, 2, 3, 4}, e2[4] = {1, 0.5f, 0.25f, 3};
  for (int i = 0; i < 4; ++i) {
    EXPECT_FLOAT_EQ(w[i], e0[i]);
    EXPECT_FLOAT_EQ(w[4 + i], all[i]);
    EXPECT_FLOAT_EQ(w[8 + i], e2[i]);
  }
  // with a prior of 2 tokens: (sum2 + 2 * mean) / (count + 2)
  ASSERT_TRUE(d.importance("blk.1.ffn_up_exps.weight", w, 2.0));
  EXPECT_FLOAT_EQ(w[8], (1.0f + 2 * all[0]) / 3.0f);
  EXPECT_FLOAT_EQ(w[4], all[0]);
  EXPECT_FALSE(d.importance("blk.9.nothing.weight", w));
  // rare experts (mean count 1, at least 1 token): frac 0.6 -> below 1 token: expert 1 (0 tokens);
  // frac 1.5 -> below 1.5 tokens: experts 1 and 2
  const auto rare = rare_experts(d, 0.6);
  ASSERT_EQ(rare.size(), 1u);
  EXPECT_EQ(rare[0].expert, 1);
  EXPECT_EQ(rare_experts(d, 1.5).size(), 2u);
}

TEST(Imatrix, WriterReproducesGoldenBytes) {
  const Data d = Data::load(kGolden);
  const std::string p = tmp_path("_imatrix.gguf");
  d.write_gguf(p);
  EXPECT_EQ(bytes_of(p), bytes_of(kGolden));
  std::filesystem::remove(p);
}

TEST(Imatrix, BadFiles) {
  auto err = [](const std::string& path) -> std::string {
    try {
      Data::load(path);
    } catch (const Error& e) {
      return e.what();
    }
    return "";
  };
  EXPECT_NE(err("/nonexistent/x.gguf").find("no such file"), std::string::npos);
  // a GGUF without imatrix tensors
  Data empty;
  const std::string p = tmp_path("_empty.gguf");
  empty.write_gguf(p);
  EXPECT_NE(err(p).find("in_sum2"), std::string::npos) << err(p);
  // a negative sum
  Data bad = Data::load(kGolden);
  bad.entries.at("blk.0.attn_q.weight").sum2[3] = -1.0;
  bad.write_gguf(p);
  const std::string e = err(p);
  EXPECT_NE(e.find("blk.0.attn_q.weight"), std::string::npos) << e;
  // not a GGUF at all
  { std::ofstream(p) << "hello"; }
  EXPECT_FALSE(err(p).empty());
  std::filesystem::remove(p);
}

}  // namespace
