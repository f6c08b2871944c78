// Engine tests on models made by `kimi synth` + `kimi convert` (the tiny preset), and the
// run / eval / bench commands.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <nlohmann/json.hpp>
#include <sstream>

#include "model/model.h"
#include "runtime/context.h"
#include "runtime/sampling.h"
#include "test_util.h"
#include "util/error.h"

using namespace kimi;

namespace {

std::vector<int32_t> toks_n(int n, int mul = 37) {
  std::vector<int32_t> t;
  for (int i = 0; i < n; ++i) t.push_back((i * mul + 11) % 700);
  return t;
}

std::vector<std::vector<float>> logits_all(const Model& m, const std::vector<int32_t>& toks, int top_k,
                                           AttnPath path = AttnPath::Sparse) {
  ContextOptions o;
  o.n_threads = 1;
  o.n_ctx_max = 128;
  o.attn_top_k = top_k;
  o.attn = path;
  Context c(m, o);
  Batch b;
  b.add_sequence(toks, 0, 0, true, true);
  c.decode(b);
  std::vector<std::vector<float>> r;
  for (size_t i = 0; i < toks.size(); ++i) r.emplace_back(c.logits(i), c.logits(i) + c.n_vocab());
  return r;
}

std::string join(const std::vector<int32_t>& t) {
  std::string s;
  for (size_t i = 0; i < t.size(); ++i) s += (i ? "," : "") + std::to_string(t[i]);
  return s;
}

}  // namespace

TEST(ConvertedTiny, PlainK3FileEqualsK31WithTopKAtLeastContext) {
  auto m31 = Model::load(test::tiny_gguf(1));
  auto m3 = Model::load(test::tiny_gguf(1, "--no-indexer"));
  ASSERT_TRUE(m31->hparams().has_indexer);
  ASSERT_FALSE(m3->hparams().has_indexer);
  auto toks = toks_n(44);
  for (AttnPath p : {AttnPath::Sparse, AttnPath::Dense}) {
    auto a = logits_all(*m3, toks, -1, p);
    auto b = logits_all(*m31, toks, 64, p);
    ASSERT_EQ(a.size(), b.size());
    for (size_t i = 0; i < a.size(); ++i)
      ASSERT_EQ(0, std::memcmp(a[i].data(), b[i].data(), a[i].size() * 4)) << "position " << i;
    // with the file's top_k (16) the K3.1 model differs once the context exceeds 16 tokens
    auto c = logits_all(*m31, toks, -1, p);
    EXPECT_EQ(0, std::memcmp(a[10].data(), c[10].data(), a[10].size() * 4));
    double md = 0;
    for (size_t j = 0; j < a[43].size(); ++j) md = std::max(md, double(std::fabs(a[43][j] - c[43][j])));
    EXPECT_GT(md, 1e-4);
  }
}

TEST(ConvertedTiny, EvalCommandWritesTheEngineLogits) {
  const std::string g = test::tiny_gguf(1);
  test::TempDir d;
  auto toks = toks_n(20);
  auto r = test::run_kimi("eval -m " + g + " -t 1 --tokens " + join(toks) + " --all-logits --logits-out " +
                          d.file("all.bin"));
  ASSERT_EQ(r.exit_code, 0) << r.out;
  r = test::run_kimi("eval -m " + g + " -t 1 --tokens " + join(toks) + " --logits-out " + d.file("last.bin"));
  ASSERT_EQ(r.exit_code, 0) << r.out;
  auto m = Model::load(g);
  auto ref = logits_all(*m, toks, -1);
  const std::string all = test::read_file(d.file("all.bin")), last = test::read_file(d.file("last.bin"));
  const size_t V = m->hparams().n_vocab;
  ASSERT_EQ(all.size(), toks.size() * V * 4);
  ASSERT_EQ(last.size(), V * 4);
  for (size_t i = 0; i < toks.size(); ++i) EXPECT_EQ(0, std::memcmp(all.data() + i * V * 4, ref[i].data(), V * 4));
  EXPECT_EQ(0, std::memcmp(last.data(), ref.back().data(), V * 4));
}

TEST(ConvertedTiny, RunCommandGreedyMatchesLibrary) {
  const std::string g = test::tiny_gguf(1);
  auto m = Model::load(g);
  auto prompt = toks_n(6);
  // library greedy decode
  ContextOptions o;
  o.n_threads = 1;
  o.n_ctx_max = 64;
  Context c(*m, o);
  Sampler s({}, c.n_vocab());
  Batch b;
  b.add_sequence(prompt, 0, 0, true);
  c.decode(b);
  std::vector<int32_t> gen;
  const float* lg = c.logits(b.size() - 1);
  for (int i = 0; i < 8; ++i) {
    gen.push_back(s.sample(lg));
    b.clear();
    b.add(gen.back(), 0, c.seq_len(0), true);
    c.decode(b);
    lg = c.logits(0);
  }
  auto r = test::run_kimi("run -m " + g + " -t 1 --ids --ignore-eos -n 8 --tokens " + join(prompt));
  ASSERT_EQ(r.exit_code, 0) << r.out;
  std::istringstream is(r.out);
  std::vector<int32_t> got;
  int32_t v;
  for (int i = 0; i < 8 && (is >> v); ++i) got.push_back(v);
  EXPECT_EQ(got, gen) << r.out;
  // text prompt through the GGUF tokenizer
  r = test::run_kimi("run -m " + g + " -t 1 -p 'hello world' -n 4 --temp 0.8 --seed 3");
  EXPECT_EQ(r.exit_code, 0) << r.out;
  EXPECT_NE(r.out.find("generated"), std::string::npos) << r.out;
}

TEST(ConvertedTiny, CommandErrorsAreClear) {
  const std::string g = test::tiny_gguf(1);
  auto r = test::run_kimi("run -m /nonexistent/x.gguf --tokens 1,2 -n 2");
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.out.find("/nonexistent/x.gguf"), std::string::npos) << r.out;
  r = test::run_kimi("run -m " + g + " --tokens 1,abc -n 2");
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.out.find("'abc'"), std::string::npos) << r.out;
  r = test::run_kimi("run -m " + g + " --tokens 1,99999 -n 2");
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.out.find("99999"), std::string::npos) << r.out;
  r = test::run_kimi("eval -m " + g + " --tokens 1,2");
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.out.find("logits-out"), std::string::npos) << r.out;
}

TEST(ConvertedTiny, BenchReportsBothTests) {
  const std::string g = test::tiny_gguf(1);
  auto r = test::run_kimi("bench -m " + g + " -t 1 -p 24 -n 4 -d 20 -r 2 --json");
  ASSERT_EQ(r.exit_code, 0) << r.out;
  auto j = nlohmann::json::parse(r.out.substr(r.out.find('{')));
  EXPECT_EQ(j["depth"], 20);
  EXPECT_EQ(j["pp"]["samples"].size(), 2u);
  EXPECT_EQ(j["tg"]["samples"].size(), 2u);
  EXPECT_GT(j["pp"]["tok_s"].get<double>(), 0.0);
  r = test::run_kimi("bench -m " + g + " -t 1 -p 8 -n 2 -r 1 --attn dense");
  ASSERT_EQ(r.exit_code, 0) << r.out;
  EXPECT_NE(r.out.find("pp8"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("tg2"), std::string::npos) << r.out;
}
