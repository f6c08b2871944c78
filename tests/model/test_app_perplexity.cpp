// `kimi perplexity` on the tiny synthetic model (kimi synth --preset tiny + kimi convert; DSA top-k 16):
// the seed's experiment (top-k >= context == indexer off, bit for bit; top-k < context differs),
// sparse vs dense, PPL against an independent double-precision scoring of `kimi eval --all-logits`,
// KL divergence against a saved base, and error handling.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <regex>
#include <sstream>

#include "io/gguf.h"
#include "model/model.h"
#include "runtime/perplexity.h"
#include "test_util.h"
#include "tokenizer/tokenizer.h"

using namespace kimi;
using nlohmann::json;

namespace {

const std::string kText = std::string(KIMI_SOURCE_DIR) + "/data/ppl-sample.txt";

std::string q(const std::string& s) { return "'" + s + "'"; }

struct PplRun {
  test::RunResult r;
  json j;                               // the --json object (when the run succeeded)
  std::vector<std::string> chunk_lines; // "[i/n] PPL x +/- e (chunk c)" without the timing
};

PplRun run_ppl(const std::string& args) {
  PplRun p;
  p.r = test::run_kimi("perplexity -m " + q(test::tiny_gguf(1)) + " -t 1 --json " + args);
  if (p.r.exit_code != 0) return p;
  const size_t at = p.r.out.rfind("\n{\n");
  const size_t start = p.r.out.rfind("{\n", 0) == 0 ? 0 : at + 1;
  EXPECT_NE(at == std::string::npos && start != 0, true) << p.r.out;
  size_t end = p.r.out.find("\n}", start);
  p.j = json::parse(p.r.out.substr(start, end + 2 - start));
  static const std::regex line_re(R"(^(\[\d+/\d+\] PPL \S+ \+/- \S+ \(chunk \S+\)( KLD \S+ top-1 \S+ base PPL \S+)?))");
  std::istringstream is(p.r.out);
  std::string line;
  std::smatch m;
  while (std::getline(is, line))
    if (std::regex_search(line, m, line_re)) p.chunk_lines.push_back(m[1]);
  return p;
}

// exact (bitwise) equality of the final numbers of two runs
void expect_identical(const PplRun& a, const PplRun& b, const std::string& what) {
  ASSERT_EQ(a.r.exit_code, 0) << a.r.out;
  ASSERT_EQ(b.r.exit_code, 0) << b.r.out;
  EXPECT_EQ(a.chunk_lines, b.chunk_lines) << what;
  EXPECT_FALSE(a.chunk_lines.empty()) << what;
  EXPECT_EQ(a.j["ppl"].get<double>(), b.j["ppl"].get<double>()) << what;
  EXPECT_EQ(a.j["ppl_err"].get<double>(), b.j["ppl_err"].get<double>()) << what;
  EXPECT_EQ(a.j["running_ppl"].get<std::vector<double>>(), b.j["running_ppl"].get<std::vector<double>>()) << what;
  EXPECT_EQ(a.j["chunk_ppl"].get<std::vector<double>>(), b.j["chunk_ppl"].get<std::vector<double>>()) << what;
}

double rel(double a, double b) { return std::fabs(a - b) / std::max(std::fabs(a), std::fabs(b)); }

std::vector<int32_t> sample_tokens() {
  auto m = Model::load(test::tiny_gguf(1));
  auto tok = tok::Tokenizer::from_gguf(m->reader());
  return tok.encode(test::read_file(kText), false);
}

}  // namespace

TEST(Perplexity, SampleTextIsLongEnough) {
  const std::string text = test::read_file(kText);
  EXPECT_GE(text.size(), 30000u);
  EXPECT_LE(text.size(), 60000u);
  EXPECT_GE(sample_tokens().size(), 2u * 512);  // -c 512 possible on the tiny vocabulary
}

// The seed's experiment: top-k >= context gives exactly the indexer-off result (per chunk, final,
// and the saved distributions byte for byte), on both attention paths.
TEST(Perplexity, TopKAtLeastContextEqualsIndexerOffBitForBit) {
  test::TempDir d;
  struct Case {
    int ctx;
    std::string topk;  // "" = the file's 16
  };
  for (const std::string& attn : std::vector<std::string>{"sparse", "dense"}) {
    for (const Case& c : {Case{16, ""}, Case{64, "64"}, Case{128, "4096"}}) {
      const std::string common = " -f " + q(kText) + " --attn " + attn + " -c " + std::to_string(c.ctx) + " --chunks 4";
      const std::string fa = d.file("a-" + attn + std::to_string(c.ctx) + ".kld");
      const std::string fb = d.file("b-" + attn + std::to_string(c.ctx) + ".kld");
      auto a = run_ppl(common + (c.topk.empty() ? "" : " --attn-top-k " + c.topk) + " --kl-divergence-base " + q(fa));
      auto b = run_ppl(common + " --attn-top-k 0 --kl-divergence-base " + q(fb));
      const std::string what = attn + " ctx " + std::to_string(c.ctx);
      expect_identical(a, b, what);
      EXPECT_EQ(a.j["top_k"].get<int>(), c.topk.empty() ? 16 : std::stoi(c.topk)) << what;
      EXPECT_EQ(b.j["top_k"].get<int>(), 0) << what;
      EXPECT_EQ(a.j["n_chunk"].get<int>(), 4);
      const std::string ba = test::read_file(fa), bb = test::read_file(fb);
      EXPECT_GT(ba.size(), 1000u);
      EXPECT_TRUE(ba == bb) << what << ": KLD base files differ";
    }
  }
}

// top-k below the context changes the result; report by how much.
TEST(Perplexity, TopKBelowContextDiffers) {
  test::TempDir d;
  for (int ctx : {64, 128}) {
    const std::string common = " -f " + q(kText) + " -c " + std::to_string(ctx) + " --chunks 4";
    const std::string base = d.file("off" + std::to_string(ctx) + ".kld");
    auto off = run_ppl(common + " --attn-top-k 0 --kl-divergence-base " + q(base));
    ASSERT_EQ(off.r.exit_code, 0) << off.r.out;
    const double p0 = off.j["ppl"].get<double>();
    for (const std::string& k : std::vector<std::string>{"", "8", "4"}) {
      auto on = run_ppl(common + (k.empty() ? "" : " --attn-top-k " + k) + " --kl-divergence " + q(base));
      ASSERT_EQ(on.r.exit_code, 0) << on.r.out;
      const double p = on.j["ppl"].get<double>();
      const json& kl = on.j["kld"];
      std::printf("tiny ctx %d top-k %s: PPL %.6f vs indexer off %.6f (ratio %.6f), mean KLD %.6g, top-1 %.2f%%\n",
                  ctx, k.empty() ? "16 (file)" : k.c_str(), p, p0, p / p0, kl["mean"].get<double>(),
                  100 * kl["top1_agree"].get<double>());
      EXPECT_NE(p, p0) << "ctx " << ctx << " top-k " << k;
      EXPECT_GT(kl["mean"].get<double>(), 0.0);
      EXPECT_GT(kl["max"].get<double>(), kl["median"].get<double>());
      EXPECT_DOUBLE_EQ(kl["base_ppl"].get<double>(), p0);
      EXPECT_NEAR(kl["delta_ppl"].get<double>(), p - p0, 1e-9 * p0);
      // a random-weight model still stays in the same range (a bug would rather explode)
      EXPECT_LT(rel(p, p0), 0.5);
    }
  }
}

// Sparse (gathered rows, online softmax) and dense (masked softmax) attention differ only by float
// rounding. In f32 precision that stays at rounding level; in fast precision the activations are
// rounded to bf16 before the matmuls, so a last-bit difference occasionally crosses a bf16 rounding
// boundary and the hard thresholds downstream (MoE routing, the next DSA layer's top-k) amplify it
// on a random-weight model: most chunks are bit-identical, a few differ by up to ~2 %.
TEST(Perplexity, SparseAndDensePathsAgree) {
  for (const std::string& prec : std::vector<std::string>{"f32", "fast"}) {
    for (const std::string& k : std::vector<std::string>{"", "8", "0"}) {
      const std::string common = " -f " + q(kText) + " -c 64 --chunks 4 --precision " + prec +
                                 (k.empty() ? "" : " --attn-top-k " + k);
      auto s = run_ppl(common + " --attn sparse");
      auto dn = run_ppl(common + " --attn dense");
      ASSERT_EQ(s.r.exit_code, 0) << s.r.out;
      ASSERT_EQ(dn.r.exit_code, 0) << dn.r.out;
      const double tol = prec == "f32" ? 1e-5 : 5e-3;
      const std::string what = prec + " top-k " + (k.empty() ? "16" : k);
      std::printf("tiny ctx 64 %s: sparse PPL %.8f, dense %.8f (rel. diff %.3g)\n", what.c_str(),
                  s.j["ppl"].get<double>(), dn.j["ppl"].get<double>(),
                  rel(s.j["ppl"].get<double>(), dn.j["ppl"].get<double>()));
      EXPECT_LT(rel(s.j["ppl"].get<double>(), dn.j["ppl"].get<double>()), tol) << what;
      auto rs = s.j["running_ppl"].get<std::vector<double>>(), rd = dn.j["running_ppl"].get<std::vector<double>>();
      ASSERT_EQ(rs.size(), rd.size());
      for (size_t i = 0; i < rs.size(); ++i) EXPECT_LT(rel(rs[i], rd[i]), tol) << what << " chunk " << i + 1;
    }
  }
}

// PPL == exp(mean NLL) computed here, in double, from `kimi eval --all-logits` of the same chunks.
TEST(Perplexity, MatchesIndependentScoringOfEvalLogits) {
  const int ctx = 32, n_chunk = 3;
  const auto toks = sample_tokens();
  ASSERT_GE(toks.size(), size_t(ctx * n_chunk));
  auto run = run_ppl(" -f " + q(kText) + " -c 32 -b 32 --chunks 3");
  ASSERT_EQ(run.r.exit_code, 0) << run.r.out;
  EXPECT_EQ(run.j["n_tokens"].get<size_t>(), toks.size());
  test::TempDir d;
  double sum = 0, sum2 = 0;
  int64_t count = 0;
  std::vector<double> chunk_ppl;
  for (int c = 0; c < n_chunk; ++c) {
    std::string list;
    for (int i = 0; i < ctx; ++i) list += (i ? "," : "") + std::to_string(toks[size_t(c * ctx + i)]);
    const std::string out = d.file("l" + std::to_string(c) + ".bin");
    auto r = test::run_kimi("eval -m " + q(test::tiny_gguf(1)) + " -t 1 -b 32 --all-logits --tokens " + list +
                            " --logits-out " + q(out));
    ASSERT_EQ(r.exit_code, 0) << r.out;
    const std::string raw = test::read_file(out);
    const size_t V = raw.size() / 4 / ctx;
    ASSERT_EQ(raw.size(), V * 4 * ctx);
    std::vector<float> lg(V * ctx);
    std::memcpy(lg.data(), raw.data(), raw.size());
    double cs = 0;
    for (int i = ctx / 2; i < ctx - 1; ++i) {
      const float* row = lg.data() + size_t(i) * V;
      double mx = row[0];
      for (size_t v = 0; v < V; ++v) mx = std::max(mx, double(row[v]));
      double s = 0;
      for (size_t v = 0; v < V; ++v) s += std::exp(double(row[v]) - mx);
      const double nll = -(double(row[toks[size_t(c * ctx + i + 1)]]) - mx - std::log(s));
      sum += nll;
      sum2 += nll * nll;
      cs += nll;
      ++count;
    }
    chunk_ppl.push_back(std::exp(cs / (ctx - 1 - ctx / 2)));
  }
  const double mean = sum / count;
  const double expect_ppl = std::exp(mean);
  const double var = sum2 / count - mean * mean;
  const double expect_err = expect_ppl * std::sqrt(var / (count - 1));
  EXPECT_EQ(run.j["n_scored"].get<int64_t>(), count);
  EXPECT_LT(rel(run.j["ppl"].get<double>(), expect_ppl), 1e-10);
  EXPECT_LT(rel(run.j["ppl_err"].get<double>(), expect_err), 1e-8);
  auto cp = run.j["chunk_ppl"].get<std::vector<double>>();
  ASSERT_EQ(cp.size(), chunk_ppl.size());
  for (size_t i = 0; i < cp.size(); ++i) EXPECT_LT(rel(cp[i], chunk_ppl[i]), 1e-10) << "chunk " << i + 1;
}

TEST(Perplexity, KlDivergenceAgainstBase) {
  test::TempDir d;
  const std::string base = d.file("base.kld");
  auto b = run_ppl(" -f " + q(kText) + " -c 64 --chunks 5 --kl-divergence-base " + q(base));
  ASSERT_EQ(b.r.exit_code, 0) << b.r.out;

  // the base file: header values, tokens = the text's first chunks, base PPL stored
  auto kb = ppl::KldBase::load(base);
  EXPECT_EQ(kb.n_ctx(), 64);
  EXPECT_EQ(kb.n_chunk(), 5);
  EXPECT_EQ(kb.top_n(), 32);
  EXPECT_EQ(kb.ppl(), b.j["ppl"].get<double>());
  const auto toks = sample_tokens();
  EXPECT_TRUE(std::equal(kb.tokens().begin(), kb.tokens().end(), toks.begin()));
  for (int64_t j = 0; j < 5 * kb.scored_per_chunk(); ++j) {
    double mass = std::exp(double(kb.log_rest(j)));
    for (int k = 0; k < kb.top_n(); ++k) {
      mass += std::exp(double(kb.top_logp(j, k)));
      if (k) {
        ASSERT_LE(kb.top_logp(j, k), kb.top_logp(j, k - 1));
      }
    }
    ASSERT_NEAR(mass, 1.0, 1e-5) << "scored token " << j;
  }

  // the same model against its own base: KLD exactly 0, 100% top-1, same PPL (with or without -f)
  for (const std::string& f : {" -f " + q(kText), std::string()}) {
    auto s = run_ppl(f + " --kl-divergence " + q(base));
    ASSERT_EQ(s.r.exit_code, 0) << s.r.out;
    const json& k = s.j["kld"];
    EXPECT_EQ(k["mean"].get<double>(), 0.0);
    EXPECT_EQ(k["max"].get<double>(), 0.0);
    EXPECT_EQ(k["top1_agree"].get<double>(), 1.0);
    EXPECT_EQ(k["delta_ppl"].get<double>(), 0.0);
    EXPECT_EQ(k["dp_rms"].get<double>(), 0.0);
    EXPECT_EQ(s.j["n_ctx"].get<int>(), 64);
    EXPECT_EQ(s.j["n_chunk"].get<int>(), 5);
    EXPECT_EQ(k["count"].get<int64_t>(), 5 * 31);
  }
  // a prefix of the base's chunks
  auto p2 = run_ppl(" --chunks 2 --kl-divergence " + q(base));
  ASSERT_EQ(p2.r.exit_code, 0) << p2.r.out;
  EXPECT_EQ(p2.j["kld"]["base_ppl"].get<double>(), p2.j["ppl"].get<double>());
  EXPECT_EQ(p2.j["ppl"].get<double>(), b.j["running_ppl"][1].get<double>());

  // top-N = the whole vocabulary (no rest mass) and top-N = 1: self-comparison still exactly 0,
  // and the coarser the base, the smaller the (lower-bound) KLD against f32
  std::map<int, double> kld_f32;
  for (int tn : {1, 1024}) {
    const std::string bn = d.file("top" + std::to_string(tn) + ".kld");
    auto bt = run_ppl(" -f " + q(kText) + " -c 64 --chunks 2 --top-n " + std::to_string(tn) +
                      " --kl-divergence-base " + q(bn));
    ASSERT_EQ(bt.r.exit_code, 0) << bt.r.out;
    auto kt = ppl::KldBase::load(bn);
    EXPECT_EQ(kt.top_n(), tn);
    if (tn == 1024) {
      EXPECT_TRUE(std::isinf(kt.log_rest(0)));
    }
    auto st = run_ppl(" --kl-divergence " + q(bn));
    ASSERT_EQ(st.r.exit_code, 0) << st.r.out;
    EXPECT_EQ(st.j["kld"]["max"].get<double>(), 0.0);
    auto ft = run_ppl(" --precision f32 --kl-divergence " + q(bn));
    ASSERT_EQ(ft.r.exit_code, 0) << ft.r.out;
    kld_f32[tn] = ft.j["kld"]["mean"].get<double>();
  }
  EXPECT_GT(kld_f32[1], 0.0);
  EXPECT_LT(kld_f32[1], kld_f32[1024]);

  // f32 precision: small but non-zero divergence
  auto f = run_ppl(" -f " + q(kText) + " --precision f32 --kl-divergence " + q(base));
  ASSERT_EQ(f.r.exit_code, 0) << f.r.out;
  const json& k = f.j["kld"];
  std::printf("tiny ctx 64, fast vs f32: mean KLD %.6g (median %.6g, p99 %.6g, max %.6g), top-1 %.2f%%, PPL %.6f vs "
              "%.6f\n",
              k["mean"].get<double>(), k["median"].get<double>(), k["p99"].get<double>(), k["max"].get<double>(),
              100 * k["top1_agree"].get<double>(), f.j["ppl"].get<double>(), k["base_ppl"].get<double>());
  EXPECT_GT(k["mean"].get<double>(), 0.0);
  EXPECT_LT(k["mean"].get<double>(), 0.2);
  EXPECT_GT(k["top1_agree"].get<double>(), 0.5);
  EXPECT_LT(k["top1_agree"].get<double>(), 1.0 + 1e-12);
  EXPECT_LE(k["median"].get<double>(), k["p90"].get<double>());
  EXPECT_LE(k["p90"].get<double>(), k["p95"].get<double>());
  EXPECT_LE(k["p95"].get<double>(), k["p99"].get<double>());
  EXPECT_LE(k["p99"].get<double>(), k["max"].get<double>());
  EXPECT_NE(f.j["ppl"].get<double>(), b.j["ppl"].get<double>());
  EXPECT_EQ(k["base_ppl"].get<double>(), b.j["ppl"].get<double>());
}

// The per-token file of --kld-per-token, parsed here independently of ppl::read_per_token.
struct TokenRows {
  std::vector<int> chunk, pos, next, same;
  std::vector<long double> kld, nll;
  std::string header;
};
TokenRows parse_rows(const std::string& path) {
  TokenRows t;
  std::istringstream is(test::read_file(path));
  std::string line;
  for (int i = 0; i < 4 && std::getline(is, line); ++i) t.header += line + "\n";
  while (std::getline(is, line)) {
    std::vector<std::string> f;
    std::stringstream ls(line);
    for (std::string x; std::getline(ls, x, '\t');) f.push_back(x);
    EXPECT_EQ(f.size(), 6u) << line;
    if (f.size() != 6) break;
    t.chunk.push_back(std::stoi(f[0]));
    t.pos.push_back(std::stoi(f[1]));
    t.next.push_back(std::stoi(f[2]));
    t.kld.push_back(std::stold(f[3]));
    t.same.push_back(std::stoi(f[4]));
    t.nll.push_back(std::stold(f[5]));
  }
  return t;
}

// mean, SE over tokens and SE over chunk means of a - b, computed the textbook way in long double
struct Ref {
  long double diff, se_token, se_chunk;
};
Ref paired_ref(const std::vector<long double>& a, const std::vector<long double>& b, const std::vector<int>& chunk) {
  const size_t n = a.size();
  long double m = 0;
  for (size_t i = 0; i < n; ++i) m += a[i] - b[i];
  m /= n;
  long double v = 0;
  for (size_t i = 0; i < n; ++i) v += (a[i] - b[i] - m) * (a[i] - b[i] - m);
  v /= (n - 1);
  std::map<int, std::pair<long double, int>> per;
  for (size_t i = 0; i < n; ++i) {
    per[chunk[i]].first += a[i] - b[i];
    per[chunk[i]].second += 1;
  }
  long double cm = 0;
  for (auto& [c, sn] : per) cm += sn.first / sn.second;
  cm /= per.size();
  long double cv = 0;
  for (auto& [c, sn] : per) cv += (sn.first / sn.second - cm) * (sn.first / sn.second - cm);
  cv /= (per.size() - 1);
  return {m, std::sqrt(v / n), std::sqrt(cv / per.size())};
}

TEST(Perplexity, PairedComparisonOfPerTokenFiles) {
  test::TempDir d;
  const std::string base = d.file("base.kld"), fa = d.file("a.tsv"), fb = d.file("b.tsv");
  ASSERT_EQ(run_ppl(" -f " + q(kText) + " -c 64 --chunks 5 --kl-divergence-base " + q(base)).r.exit_code, 0);
  // two different perturbations of the base: f32 precision, and DSA top-k 8 instead of the file's 16
  auto a = run_ppl(" --precision f32 --kl-divergence " + q(base) + " --kld-per-token " + q(fa));
  ASSERT_EQ(a.r.exit_code, 0) << a.r.out;
  auto b = run_ppl(" --attn-top-k 8 --kl-divergence " + q(base) + " --kld-per-token " + q(fb) + " --kld-paired " +
                   q(fa));
  ASSERT_EQ(b.r.exit_code, 0) << b.r.out;

  const TokenRows ra = parse_rows(fa), rb = parse_rows(fb);
  EXPECT_EQ(ra.header, "# kimi kld-per-token 1\n# base " + base + "\n# n_ctx 64 first 32 n_chunk 5 count 155\n"
                       "chunk\tpos\tnext\tkld\tsame_top1\tnll\n");
  ASSERT_EQ(ra.kld.size(), 155u);
  ASSERT_EQ(rb.kld.size(), 155u);
  // the rows are the scored tokens in order: chunk c, positions 32..62, the next token of the text
  const auto toks = sample_tokens();
  for (size_t i = 0; i < 155; ++i) {
    ASSERT_EQ(ra.chunk[i], int(i / 31));
    ASSERT_EQ(ra.pos[i], 32 + int(i % 31));
    ASSERT_EQ(ra.next[i], toks[64 * (i / 31) + 32 + i % 31 + 1]);
    ASSERT_EQ(rb.next[i], ra.next[i]);
  }
  // the rows reproduce each run's own summary
  for (auto [r, run] : {std::pair{&ra, &a}, std::pair{&rb, &b}}) {
    long double sk = 0, ss = 0, sn = 0, mx = 0;
    for (size_t i = 0; i < 155; ++i) {
      sk += r->kld[i];
      ss += r->same[i];
      sn += r->nll[i];
      mx = std::max(mx, r->kld[i]);
    }
    EXPECT_NEAR(double(sk / 155), run->j["kld"]["mean"].get<double>(), 1e-15);
    EXPECT_EQ(double(mx), run->j["kld"]["max"].get<double>());
    EXPECT_NEAR(double(ss / 155), run->j["kld"]["top1_agree"].get<double>(), 1e-15);
    EXPECT_NEAR(double(sn / 155), run->j["nll_mean"].get<double>(), 1e-12);
  }
  EXPECT_GT(double(ra.kld[0] + ra.kld[100]), 0.0);

  // the paired statistics against the textbook computation on the two files
  const json& pj = b.j["paired"];
  EXPECT_EQ(pj["count"].get<int64_t>(), 155);
  EXPECT_EQ(pj["n_chunk"].get<int>(), 5);
  auto as_ld = [](const std::vector<int>& v) { return std::vector<long double>(v.begin(), v.end()); };
  const std::pair<const char*, std::pair<std::vector<long double>, std::vector<long double>>> series[] = {
      {"kld", {rb.kld, ra.kld}}, {"top1", {as_ld(rb.same), as_ld(ra.same)}}, {"nll", {rb.nll, ra.nll}}};
  for (const auto& [name, ab] : series) {
    const Ref ref = paired_ref(ab.first, ab.second, ra.chunk);
    const json& s = pj[name];
    const double tol = 1e-9 * std::max(1e-12, std::fabs(double(ref.se_token)));
    EXPECT_NEAR(s["diff"].get<double>(), double(ref.diff), tol) << name;
    EXPECT_NEAR(s["se_token"].get<double>(), double(ref.se_token), tol) << name;
    EXPECT_NEAR(s["se_chunk"].get<double>(), double(ref.se_chunk), tol) << name;
    EXPECT_NEAR(s["z_chunk"].get<double>(), double(ref.diff / ref.se_chunk), 1e-9) << name;
    EXPECT_NEAR(s["this"].get<double>() - s["other"].get<double>(), s["diff"].get<double>(), 1e-15) << name;
    EXPECT_GT(s["se_token"].get<double>(), 0.0) << name;
  }
  EXPECT_NEAR(pj["kld"]["this"].get<double>(), b.j["kld"]["mean"].get<double>(), 1e-15);
  EXPECT_NEAR(pj["kld"]["other"].get<double>(), a.j["kld"]["mean"].get<double>(), 1e-15);
  EXPECT_NEAR(pj["kld"]["rel"].get<double>(), pj["kld"]["diff"].get<double>() / a.j["kld"]["mean"].get<double>(),
              1e-12);

  // the same run paired with itself: every difference exactly 0; text output names both sides
  auto self = test::run_kimi("perplexity -m " + q(test::tiny_gguf(1)) + " -t 1 --precision f32 --kl-divergence " +
                             q(base) + " --kld-paired " + q(fa));
  ASSERT_EQ(self.exit_code, 0) << self.out;
  EXPECT_NE(self.out.find("Paired with " + fa + " (155 tokens, 5 chunks)"), std::string::npos) << self.out;
  EXPECT_NE(self.out.find("Mean KLD     : "), std::string::npos) << self.out;
  EXPECT_NE(self.out.find("+0 (+0.00 %) +/- 0 / 0 = +0.00 / +0.00 SE"), std::string::npos) << self.out;

  // bad inputs: clear errors, before the model runs where possible
  auto expect_fail = [](const test::RunResult& r, const std::string& needle) {
    EXPECT_NE(r.exit_code, 0) << r.out;
    EXPECT_NE(r.out.find(needle), std::string::npos) << "expected '" << needle << "' in:\n" << r.out;
  };
  const std::string g = "perplexity -m " + q(test::tiny_gguf(1)) + " -t 1 ";
  expect_fail(test::run_kimi(g + "-f " + q(kText) + " -c 64 --chunks 2 --kld-per-token " + q(d.file("x.tsv"))),
              "--kl-divergence");
  expect_fail(test::run_kimi(g + "--chunks 2 --kl-divergence " + q(base) + " --kld-paired " + q(fa)),
              "has 5 chunks, this run evaluates 2");
  expect_fail(test::run_kimi(g + "--kl-divergence " + q(base) + " --kld-paired " + q(d.file("none.tsv"))),
              "none.tsv: cannot open");
  expect_fail(test::run_kimi(g + "--kl-divergence " + q(base) + " --kld-paired " + q(base)),
              "not a per-token KLD file");
  std::string txt = test::read_file(fa);
  const size_t row7 = [&] {
    size_t at = 0;
    for (int i = 0; i < 10; ++i) at = txt.find('\n', at) + 1;
    return at;
  }();
  test::write_file(d.file("cut.tsv"), txt.substr(0, row7));
  expect_fail(test::run_kimi(g + "--kl-divergence " + q(base) + " --kld-paired " + q(d.file("cut.tsv"))),
              "ends before all its rows");
  std::string bad = txt;
  bad.replace(row7, bad.find('\t', row7) - row7, "3");
  test::write_file(d.file("bad.tsv"), bad);
  expect_fail(test::run_kimi(g + "--kl-divergence " + q(base) + " --kld-paired " + q(d.file("bad.tsv"))),
              "bad.tsv:11: row 6 must be chunk 0 position 38");
  expect_fail(test::run_kimi(g + "--kl-divergence " + q(base) + " --kld-per-token " + q(base)), "--kld-per-token");
  // a base of other tokens (other text) with the same shape: the rows do not pair
  const std::string base2 = d.file("base2.kld");
  test::write_file(d.file("other.txt"), "Completely different opening words. " + test::read_file(kText));
  ASSERT_EQ(run_ppl(" -f " + q(d.file("other.txt")) + " -c 64 --chunks 5 --kl-divergence-base " + q(base2)).r.exit_code,
            0);
  expect_fail(test::run_kimi(g + "--kl-divergence " + q(base2) + " --kld-paired " + q(fa)), "not the same tokens");
}

TEST(Perplexity, BadInputsGiveClearErrors) {
  test::TempDir d;
  const std::string g = q(test::tiny_gguf(1));
  auto expect_fail = [](const test::RunResult& r, const std::string& needle) {
    EXPECT_NE(r.exit_code, 0) << r.out;
    EXPECT_NE(r.out.find(needle), std::string::npos) << "expected '" << needle << "' in:\n" << r.out;
  };
  expect_fail(test::run_kimi("perplexity -m " + g + " -f " + q(d.file("nope.txt"))), "nope.txt: cannot open");
  expect_fail(test::run_kimi("perplexity -m " + q(d.file("nope.gguf")) + " -f " + q(kText)), "nope.gguf");
  expect_fail(test::run_kimi("perplexity -m " + g), "-f TEXT is required");
  test::write_file(d.file("short.txt"), "A short text that is far too short for a context of 256 tokens.");
  expect_fail(test::run_kimi("perplexity -m " + g + " -c 256 -f " + q(d.file("short.txt"))),
              "needs at least 512 tokens");

  const std::string base = d.file("base.kld");
  ASSERT_EQ(test::run_kimi("perplexity -m " + g + " -t 1 -c 32 --chunks 3 -f " + q(kText) +
                           " --kl-divergence-base " + q(base))
                .exit_code,
            0);
  const std::string good = test::read_file(base);
  auto with = [&](const std::string& bytes, const std::string& extra = "") {
    const std::string p = d.file("bad.kld");
    test::write_file(p, bytes);
    return test::run_kimi("perplexity -m " + g + " -t 1 --kl-divergence " + q(p) + extra);
  };
  std::string flip = good;
  flip[flip.size() / 2] ^= 0x40;
  expect_fail(with(flip), "checksum mismatch");
  expect_fail(with(good.substr(0, good.size() - 100)), "truncated or corrupt");
  expect_fail(with(good.substr(0, 20)), "too small");
  expect_fail(with(std::string(good.size(), 'x')), "bad magic");
  std::string ver = good;
  ver[8] = 7;
  expect_fail(with(ver), "version 7");
  expect_fail(test::run_kimi("perplexity -m " + g + " --kl-divergence " + q(d.file("missing.kld"))),
              "missing.kld: cannot open");

  // mismatches: other context, other text, more chunks than the base, other vocabulary
  expect_fail(with(good, " -c 64"), "context of 32 tokens, this run uses 64");
  std::string text = test::read_file(kText);
  test::write_file(d.file("other.txt"), "Completely different opening words. " + text);
  expect_fail(with(good, " -f " + q(d.file("other.txt"))), "different text");
  expect_fail(with(good, " --chunks 4"), "has 3 chunks");
  // with --kl-divergence-base and --kl-divergence together
  auto r = test::run_kimi("perplexity -m " + g + " -f " + q(kText) + " --kl-divergence " + q(base) +
                          " --kl-divergence-base " + q(d.file("x.kld")));
  EXPECT_NE(r.exit_code, 0) << r.out;
  // a failed run leaves no partial base file behind
  r = test::run_kimi("perplexity -m " + g + " -c 256 -f " + q(d.file("short.txt")) + " --kl-divergence-base " +
                     q(d.file("partial.kld")));
  EXPECT_NE(r.exit_code, 0);
  EXPECT_FALSE(std::ifstream(d.file("partial.kld")).good());
  // ... and no temp file of any name next to it (temps are unique: partial.kld.kimi-tmp.<pid>.<random>)
  for (const auto& f : std::filesystem::directory_iterator(std::filesystem::path(d.file("partial.kld")).parent_path()))
    EXPECT_EQ(f.path().filename().string().rfind("partial.kld", 0), std::string::npos) << f.path();
}

TEST(Perplexity, PercentileAndStatsHelpers) {
  // values against hand-computed ones (linear interpolation between ranks)
  std::vector<double> s{1, 2, 3, 4, 5};
  EXPECT_DOUBLE_EQ(ppl::percentile_sorted(s, 0.5), 3.0);
  EXPECT_DOUBLE_EQ(ppl::percentile_sorted(s, 0.9), 4.6);
  EXPECT_DOUBLE_EQ(ppl::percentile_sorted(s, 1.0), 5.0);
  EXPECT_DOUBLE_EQ(ppl::percentile_sorted(s, 0.0), 1.0);
  ppl::Stats st;
  for (double x : {1.0, 2.0, 4.0}) st.add(x);
  const double m = 7.0 / 3, var = (1 + 4 + 16) / 3.0 - m * m;
  EXPECT_NEAR(st.ppl(), std::exp(m), 1e-12);
  EXPECT_NEAR(st.ppl_err(), std::exp(m) * std::sqrt(var / 2), 1e-12);
  const float lg[4] = {1.0f, 2.0f, 3.0f, -1.0f};
  const double lse = std::log(std::exp(1.0) + std::exp(2.0) + std::exp(3.0) + std::exp(-1.0));
  EXPECT_NEAR(ppl::log_sum_exp(lg, 4), lse, 1e-12);
}
