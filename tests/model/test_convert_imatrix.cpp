// `kimi imatrix` and `kimi quantize --imatrix` / the MoE mix presets end to end: the importance
// matrix of the tiny synthetic model (entries for every weight matrix the forward pass multiplies,
// per-expert token counts that add up to tokens x experts used, gate/up fed the same input), and a
// hand-made K3-style GGUF with 256-wide rows quantized with the presets, with and without an
// importance matrix (types, indexer untouched, importance-weighted error lower with it, metadata,
// clean errors for a mismatched or missing imatrix).
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "io/gguf.h"
#include "io/imatrix.h"
#include "tensor/quants.h"
#include "test_util.h"

namespace fs = std::filesystem;
using namespace kimi;
using kimi::test::run_kimi;
using kimi::test::TempDir;

namespace {

std::string q(const std::string& s) { return "'" + s + "'"; }
const std::string kText = std::string(KIMI_SOURCE_DIR) + "/data/ppl-sample.txt";

TEST(Imatrix, TinyModelEntriesAndExpertCounts) {
  TempDir td;
  const std::string src = kimi::test::tiny_gguf();
  const std::string out = td.file("imat.gguf");
  auto r = run_kimi("imatrix -m " + q(src) + " -f " + q(kText) + " -c 16 --chunks 3 -o " + q(out));
  ASSERT_EQ(r.exit_code, 0) << r.out;
  EXPECT_NE(r.out.find("[3/3]"), std::string::npos) << "progress per chunk: " << r.out;
  EXPECT_NE(r.out.find("ETA"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("rare expert slots"), std::string::npos) << r.out;
  auto model = gguf::Reader::open(src);
  const int64_t n_expert = model->get_u32("kimi-k3.expert_count");
  const int64_t n_used = model->get_u32("kimi-k3.expert_used_count");
  const imatrix::Data d = imatrix::Data::load(out);
  EXPECT_EQ(d.chunk_count, 3u);
  EXPECT_EQ(d.chunk_size, 16u);
  const double n_tok = 3 * 16;
  int n_stacks = 0, n_dense = 0, n_heads = 0;
  for (const auto& t : model->tensors()) {
    const bool exps = t.name.find("_exps.weight") != std::string::npos;
    // MLA's per-head matrices: one entry per head, every token reaches every head
    if (t.name.find("attn_k_b.weight") != std::string::npos || t.name.find("attn_v_b.weight") != std::string::npos) {
      ++n_heads;
      auto it = d.entries.find(t.name);
      ASSERT_NE(it, d.entries.end()) << "no imatrix entry for " << t.name;
      EXPECT_EQ(it->second.n_in, t.ne[0]) << t.name;
      ASSERT_EQ(it->second.n_mat, t.ne[2]) << t.name;
      for (double c : it->second.count) EXPECT_EQ(c, n_tok) << t.name;
      for (int64_t h = 0; h < t.ne[2]; ++h) {
        double s = 0;
        for (int64_t i = 0; i < t.ne[0]; ++i) s += it->second.sum2[static_cast<size_t>(h * t.ne[0] + i)];
        EXPECT_GT(s, 0) << t.name << " head " << h;
      }
      continue;
    }
    const bool dense_mat = t.n_dims == 2 && t.name.find("token_embd") == std::string::npos &&
                           t.name.find("ssm_conv1d") == std::string::npos;
    if (!exps && !dense_mat) continue;
    auto it = d.entries.find(t.name);
    ASSERT_NE(it, d.entries.end()) << "no imatrix entry for " << t.name;
    const imatrix::Entry& e = it->second;
    EXPECT_EQ(e.n_in, t.ne[0]) << t.name;
    if (exps) {
      ++n_stacks;
      ASSERT_EQ(e.n_mat, n_expert) << t.name;
      double sum = 0;
      for (double c : e.count) sum += c;
      EXPECT_EQ(sum, n_tok * static_cast<double>(n_used)) << t.name << ": every token reaches n_used experts";
    } else {
      ++n_dense;
      EXPECT_EQ(e.n_mat, 1) << t.name;
      // the lm head runs only for the scored positions (ctx - 1 - ctx/2 per chunk, as perplexity)
      EXPECT_EQ(e.count[0], t.name == "output.weight" ? 3.0 * (16 - 1 - 8) : n_tok) << t.name;
    }
    double s = 0;
    for (double v : e.sum2) {
      ASSERT_TRUE(std::isfinite(v) && v >= 0) << t.name;
      s += v;
    }
    EXPECT_GT(s, 0) << t.name;
  }
  EXPECT_EQ(n_stacks, 21);
  EXPECT_GT(n_heads, 0) << "the tiny model has MLA layers";
  EXPECT_GT(n_dense, 20);
  // gate and up of a layer's experts see the same input; down sees a different one
  const auto& g = d.entries.at("blk.1.ffn_gate_exps.weight");
  const auto& u = d.entries.at("blk.1.ffn_up_exps.weight");
  EXPECT_EQ(g.sum2, u.sum2);
  EXPECT_EQ(g.count, u.count);
  EXPECT_EQ(d.entries.at("blk.1.ffn_down_exps.weight").count, g.count);

  // quantize with it (tiny rows fall back from the K-quants; the imatrix must be accepted)
  auto z = run_kimi("quantize " + q(src) + " " + q(td.file("q.gguf")) + " Q4_K_M --imatrix " + q(out) + " --quiet");
  ASSERT_EQ(z.exit_code, 0) << z.out;
  EXPECT_NE(z.out.find("importance matrix"), std::string::npos) << z.out;
  auto qr = gguf::Reader::open(td.file("q.gguf"));
  EXPECT_EQ(qr->get_str("quantize.imatrix.file"), out);
  EXPECT_EQ(qr->get_u32("quantize.imatrix.chunks_count"), 3u);
  // bad inputs
  auto e1 = run_kimi("imatrix -m " + q(src) + " -f /nonexistent.txt -o " + q(td.file("x.gguf")));
  EXPECT_NE(e1.exit_code, 0);
  EXPECT_NE(e1.out.find("nonexistent.txt"), std::string::npos) << e1.out;
  auto e2 = run_kimi("quantize " + q(src) + " " + q(td.file("y.gguf")) + " Q4_K_M --imatrix " + q(src));
  EXPECT_NE(e2.exit_code, 0);
  EXPECT_NE(e2.out.find("in_sum2"), std::string::npos) << "a model is not an imatrix: " << e2.out;
}

// ---- a small K3-style GGUF with 256-wide rows (the presets' types fit) ----
struct Spec {
  std::string name;
  GgmlType type;
  std::vector<int64_t> ne;
};
const std::vector<Spec> kWide = {
    {"token_embd.weight", GgmlType::BF16, {256, 32}},
    {"blk.0.attn_norm.weight", GgmlType::F32, {256}},
    {"blk.0.attn_q.weight", GgmlType::BF16, {256, 16}},
    {"blk.0.ffn_down.weight", GgmlType::BF16, {512, 16}},
    {"blk.1.ffn_gate_inp.weight", GgmlType::F32, {256, 4}},
    {"blk.1.ffn_gate_exps.weight", GgmlType::MXFP4, {256, 32, 4}},
    {"blk.1.ffn_up_exps.weight", GgmlType::BF16, {256, 32, 4}},
    {"blk.1.ffn_down_exps.weight", GgmlType::BF16, {256, 32, 4}},
    {"blk.1.ffn_down_shexp.weight", GgmlType::BF16, {256, 16}},
    {"blk.3.indexer.attn_q_b.weight", GgmlType::BF16, {256, 16}},
    {"blk.3.indexer.attn_k.weight", GgmlType::BF16, {256, 16}},
    {"blk.3.indexer.proj.weight", GgmlType::F32, {256, 8}},
    {"output_norm.weight", GgmlType::F32, {256}},
    {"output.weight", GgmlType::BF16, {256, 32}},
};

std::vector<float> decoded(const gguf::TensorInfo& t) {
  std::vector<float> v(static_cast<size_t>(t.nelements()));
  dequantize_row(t.type, t.data, v.data(), t.nelements());
  return v;
}

void write_wide(const std::string& path) {
  gguf::Writer w(path);
  w.add_kv("general.architecture", gguf::Value::str("kimi-k3"));
  w.add_kv("general.file_type", gguf::Value::u32(38));
  w.add_kv("kimi-k3.block_count", gguf::Value::u32(8));
  w.add_kv("kimi-k3.expert_count", gguf::Value::u32(4));
  for (const auto& s : kWide) w.add_tensor(s.name, s.type, s.ne);
  w.begin();
  std::mt19937 rng(5);
  std::normal_distribution<float> nd(0.0f, 0.02f);
  for (const auto& s : kWide) {
    int64_t n = 1;
    for (auto e : s.ne) n *= e;
    std::vector<float> x(static_cast<size_t>(n));
    for (auto& v : x) v = nd(rng);
    std::vector<uint8_t> buf(static_cast<size_t>(row_bytes(s.type, static_cast<uint64_t>(n))));
    quantize_row(s.type, x.data(), buf.data(), n);
    w.write_tensor_data(s.name, buf.data(), buf.size());
  }
  w.finish();
}

// An importance matrix for the wide model: every 4th input column 100x as important.
imatrix::Data wide_imatrix() {
  imatrix::Data d;
  d.datasets = {"synthetic"};
  d.chunk_count = 1;
  d.chunk_size = 64;
  for (const auto& s : kWide) {
    if (s.ne.size() < 2 || s.name.find("norm") != std::string::npos) continue;
    imatrix::Entry e;
    e.n_in = s.ne[0];
    e.n_mat = s.ne.size() > 2 ? s.ne[2] : 1;
    e.count.assign(static_cast<size_t>(e.n_mat), 64.0);
    for (int64_t j = 0; j < e.n_mat; ++j)
      for (int64_t i = 0; i < e.n_in; ++i) e.sum2.push_back(64.0 * (i % 4 == 0 ? 100.0 : 1.0));
    d.entries[s.name] = e;
  }
  return d;
}

double weighted_err(const std::vector<float>& a, const std::vector<float>& b, int64_t n_in) {
  double e = 0;
  for (size_t i = 0; i < a.size(); ++i) e += ((i % static_cast<size_t>(n_in)) % 4 == 0 ? 100.0 : 1.0) * (a[i] - b[i]) * (a[i] - b[i]);
  return e;
}

TEST(Imatrix, WidePresetsWithAndWithoutImatrix) {
  TempDir td;
  const std::string src = td.file("wide.gguf");
  write_wide(src);
  const std::string imat = td.file("imat.gguf");
  wide_imatrix().write_gguf(imat);
  auto in = gguf::Reader::open(src);
  struct Want { const char* preset; GgmlType gate_up, down, rest; };
  const Want wants[] = {{"Q2_K_MOE", GgmlType::Q2_K, GgmlType::Q3_K, GgmlType::Q4_K},
                        {"IQ2_XS_MOE", GgmlType::IQ2_XS, GgmlType::Q2_K, GgmlType::Q4_K},
                        {"Q3_K_MOE", GgmlType::Q3_K, GgmlType::Q4_K, GgmlType::Q5_K},
                        {"IQ4_XS_MOE", GgmlType::IQ4_XS, GgmlType::IQ4_XS, GgmlType::Q6_K}};
  for (const auto& w : wants) {
    SCOPED_TRACE(w.preset);
    std::map<int, std::unique_ptr<gguf::Reader>> outs;
    for (int with = 0; with < 2; ++with) {
      const std::string out = td.file(std::string(w.preset) + std::to_string(with) + ".gguf");
      std::string args = "quantize " + q(src) + " " + q(out) + " " + w.preset + " -v";
      if (with) args += " --imatrix " + q(imat) + " --error-imatrix " + q(imat);
      else if (w.gate_up == GgmlType::IQ2_XS) args += " --allow-no-imatrix";
      auto r = run_kimi(args);
      ASSERT_EQ(r.exit_code, 0) << r.out;
      auto o = gguf::Reader::open(out);
      EXPECT_EQ(o->tensor("blk.1.ffn_gate_exps.weight").type, w.gate_up) << "MXFP4 experts re-quantized";
      EXPECT_EQ(o->tensor("blk.1.ffn_up_exps.weight").type, w.gate_up);
      EXPECT_EQ(o->tensor("blk.1.ffn_down_exps.weight").type, w.down);
      EXPECT_EQ(o->tensor("blk.0.attn_q.weight").type, w.rest);
      EXPECT_EQ(o->tensor("blk.0.ffn_down.weight").type, GgmlType::Q6_K) << "more_bits layer 0";
      EXPECT_EQ(o->tensor("output.weight").type, GgmlType::Q6_K);
      EXPECT_EQ(o->tensor("blk.1.ffn_gate_inp.weight").type, GgmlType::F32);
      for (const char* n : {"blk.3.indexer.attn_q_b.weight", "blk.3.indexer.attn_k.weight", "blk.3.indexer.proj.weight"}) {
        const auto& a = in->tensor(n);
        const auto& b = o->tensor(n);
        EXPECT_EQ(a.type, b.type) << n;
        EXPECT_EQ(0, std::memcmp(a.data, b.data, static_cast<size_t>(a.nbytes))) << n << " must be byte-identical";
      }
      EXPECT_EQ(o->has("quantize.imatrix.file"), with == 1);
      if (with) {
        EXPECT_NE(r.out.find("blk.1.ffn_up_exps.weight"), std::string::npos);
        EXPECT_NE(r.out.find("[imatrix]"), std::string::npos) << r.out;
      }
      if (with) {  // --error-imatrix: the relative weighted error of each tensor, recomputed here
        const std::string n = "blk.1.ffn_up_exps.weight";
        const auto ref = decoded(in->tensor(n));
        double den = 0;
        for (size_t i = 0; i < ref.size(); ++i) den += ((i % 256) % 4 == 0 ? 100.0 : 1.0) * ref[i] * ref[i];
        const double want = weighted_err(decoded(o->tensor(n)), ref, 256) / den;
        const size_t at = r.out.find(n + " ");
        ASSERT_NE(at, std::string::npos) << r.out;
        const size_t w0 = r.out.find("[weighted error ", at);
        ASSERT_NE(w0, std::string::npos) << r.out;
        const double got = std::stod(r.out.substr(w0 + 16));
        EXPECT_NEAR(got, want, 1e-3 * want) << r.out.substr(at, 200);
        EXPECT_NE(r.out.find("weighted error (importances of"), std::string::npos) << r.out;
      }
      outs[with] = std::move(o);
    }
    // the importance-weighted error of every quantized expert stack drops with the imatrix
    for (const char* n : {"blk.1.ffn_up_exps.weight", "blk.1.ffn_down_exps.weight", "blk.0.attn_q.weight"}) {
      const auto ref = decoded(in->tensor(n));
      const double e0 = weighted_err(decoded(outs[0]->tensor(n)), ref, 256);
      const double e1 = weighted_err(decoded(outs[1]->tensor(n)), ref, 256);
      EXPECT_LT(e1, 0.8 * e0) << n << ": weighted error " << e1 << " with vs " << e0 << " without";
    }
  }
  // IQ2_XS without an imatrix: refused, naming the tensor and the way out
  auto r = run_kimi("quantize " + q(src) + " " + q(td.file("n.gguf")) + " IQ2_XS_M");
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.out.find("blk.1.ffn_gate_exps.weight"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("--imatrix"), std::string::npos) << r.out;
  EXPECT_FALSE(fs::exists(td.file("n.gguf")));
  // an imatrix entry of the wrong shape
  imatrix::Data bad = wide_imatrix();
  bad.entries["blk.1.ffn_up_exps.weight"].n_mat = 2;
  bad.entries["blk.1.ffn_up_exps.weight"].count.resize(2);
  bad.entries["blk.1.ffn_up_exps.weight"].sum2.resize(512);
  bad.write_gguf(td.file("bad.gguf"));
  r = run_kimi("quantize " + q(src) + " " + q(td.file("b.gguf")) + " Q2_K_M --imatrix " + q(td.file("bad.gguf")));
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.out.find("blk.1.ffn_up_exps.weight"), std::string::npos) << r.out;
  // --requantize-experts with a new type
  r = run_kimi("quantize " + q(src) + " " + q(td.file("r.gguf")) + " Q4_K_M --requantize-experts Q3_K --quiet");
  ASSERT_EQ(r.exit_code, 0) << r.out;
  EXPECT_EQ(gguf::Reader::open(td.file("r.gguf"))->tensor("blk.1.ffn_gate_exps.weight").type, GgmlType::Q3_K);
}

}  // namespace
