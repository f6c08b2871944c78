// Rule table of `kimi quantize` (src/convert/quant_rules.h) on names and shapes only. Expected
// types are written from formats-quant.md §5 (tables 5.2, 5.3, 5.6) and spec/README.md
// decision 5, not read back from the code.
#include <gtest/gtest.h>

#include <map>
#include <set>
#include <string>
#include <vector>

#include "convert/quant_rules.h"
#include "tensor/quants.h"
#include "util/error.h"

using namespace kimi;
using namespace kimi::quant;

namespace {

constexpr GgmlType F32 = GgmlType::F32, F16 = GgmlType::F16, BF16 = GgmlType::BF16, Q8_0 = GgmlType::Q8_0,
                   Q4_0 = GgmlType::Q4_0, Q5_0 = GgmlType::Q5_0, Q5_1 = GgmlType::Q5_1, Q4_K = GgmlType::Q4_K,
                   Q5_K = GgmlType::Q5_K, Q6_K = GgmlType::Q6_K, MXFP4 = GgmlType::MXFP4;


// A Kimi-K3.1-shaped tensor list (k3-architecture.md §2.3 + spec/README.md decision 2), names,
// types and shapes only. MLA layers: every 4th (0-based 3, 7, ...) and the last one (24 of 93,
// as K3); layer 0 dense.
struct Model {
  std::vector<TensorDesc> t;
  ModelFacts facts;
  std::map<std::string, size_t> idx;
  void add(std::string n, GgmlType ty, std::array<int64_t, 4> ne) {
    idx[n] = t.size();
    t.push_back({std::move(n), ty, ne});
  }
};

bool is_mla(int il, int n_layer) { return il % 4 == 3 || il == n_layer - 1; }

Model k3(int n_layer, int n_expert, int64_t d = 7168, bool tied = false) {
  Model m;
  m.facts = {n_layer, n_expert};
  const int64_t kda = 12288, ql = 1536, ff = 3072, lat = 3584, shx = 6144;
  m.add("token_embd.weight", BF16, {d, 1000, 1, 1});
  for (int il = 0; il < n_layer; ++il) {
    auto n = [&](const char* s) { return "blk." + std::to_string(il) + "." + s; };
    m.add(n("attn_norm.weight"), F32, {d, 1, 1, 1});
    m.add(n("attn_res_score.weight"), F32, {d, 1, 1, 1});
    if (!is_mla(il, n_layer)) {  // KDA
      m.add(n("attn_q.weight"), BF16, {d, kda, 1, 1});
      m.add(n("attn_k.weight"), BF16, {d, kda, 1, 1});
      m.add(n("attn_v.weight"), BF16, {d, kda, 1, 1});
      m.add(n("ssm_conv1d_q.weight"), F32, {4, 1, kda, 1});
      m.add(n("ssm_f_a.weight"), BF16, {d, 128, 1, 1});
      m.add(n("ssm_f_b.weight"), BF16, {128, kda, 1, 1});
      m.add(n("ssm_a"), F32, {96, 1, 1, 1});
      m.add(n("ssm_dt.bias"), F32, {kda, 1, 1, 1});
      m.add(n("ssm_beta.weight"), BF16, {d, 96, 1, 1});
      m.add(n("ssm_g.weight"), BF16, {d, kda, 1, 1});
      m.add(n("ssm_norm.weight"), F32, {128, 1, 1, 1});
    } else {  // MLA + indexer
      m.add(n("attn_q_a.weight"), BF16, {d, ql, 1, 1});
      m.add(n("attn_q_a_norm.weight"), F32, {ql, 1, 1, 1});
      m.add(n("attn_q_b.weight"), BF16, {ql, 18432, 1, 1});
      m.add(n("attn_kv_a_mqa.weight"), BF16, {d, 576, 1, 1});
      m.add(n("attn_k_b.weight"), BF16, {128, 512, 96, 1});
      m.add(n("attn_v_b.weight"), BF16, {512, 128, 96, 1});
      m.add(n("indexer.attn_q_b.weight"), BF16, {ql, 8192, 1, 1});
      m.add(n("indexer.attn_k.weight"), BF16, {d, 128, 1, 1});
      m.add(n("indexer.k_norm.weight"), F32, {128, 1, 1, 1});
      m.add(n("indexer.k_norm.bias"), F32, {128, 1, 1, 1});
      m.add(n("indexer.proj.weight"), F32, {d, 64, 1, 1});
    }
    m.add(n("attn_output.weight"), BF16, {kda, d, 1, 1});
    m.add(n("ffn_norm.weight"), F32, {d, 1, 1, 1});
    if (il == 0) {
      m.add(n("ffn_gate.weight"), BF16, {d, 33792, 1, 1});
      m.add(n("ffn_up.weight"), BF16, {d, 33792, 1, 1});
      m.add(n("ffn_down.weight"), BF16, {33792, d, 1, 1});
    } else {
      m.add(n("ffn_gate_inp.weight"), F32, {d, n_expert, 1, 1});
      m.add(n("exp_probs_b.bias"), F32, {n_expert, 1, 1, 1});
      m.add(n("ffn_gate_exps.weight"), MXFP4, {lat, ff, n_expert, 1});
      m.add(n("ffn_up_exps.weight"), MXFP4, {lat, ff, n_expert, 1});
      m.add(n("ffn_down_exps.weight"), MXFP4, {ff, lat, n_expert, 1});
      m.add(n("ffn_routed_down.weight"), BF16, {d, lat, 1, 1});
      m.add(n("ffn_routed_up.weight"), BF16, {lat, d, 1, 1});
      m.add(n("ffn_gate_shexp.weight"), BF16, {d, shx, 1, 1});
      m.add(n("ffn_up_shexp.weight"), BF16, {d, shx, 1, 1});
      m.add(n("ffn_down_shexp.weight"), BF16, {shx, d, 1, 1});
    }
  }
  m.add("output_norm.weight", F32, {d, 1, 1, 1});
  if (!tied) m.add("output.weight", BF16, {d, 1000, 1, 1});
  return m;
}

RuleOptions opts(const std::string& target) {
  RuleOptions o;
  o.target = parse_target(target);
  // the IQ2_XS names need one (tested on their own in MoeMixNeedsImatrixForIq2 / LlamaNamesOnK3); Q4_0 with
  // one asks for Q4_1, which kimi cannot make (LlamaNamesOnK3)
  o.have_imatrix = target != "Q4_0";
  return o;
}

struct Planned {
  Model m;
  std::vector<Decision> d;
  const Decision& at(const std::string& name) const { return d.at(m.idx.at(name)); }
  GgmlType type(const std::string& name) const { return at(name).type; }
};
Planned run(Model m, const RuleOptions& o) {
  Planned p{std::move(m), {}};
  p.d = plan(p.m.t, p.m.facts, o);
  return p;
}

// more_bits layer sets as spelled out in formats-quant.md §5.6 (n = 93) and by hand for n = 8
// (n/8 = 1, 7n/8 = 7: {0} u {7} u {i : (i - 1) % 3 == 2} = {0, 3, 6, 7}).
std::set<int> more_bits_93() {
  std::set<int> s;
  for (int i = 0; i <= 10; ++i) s.insert(i);
  for (int i = 81; i <= 92; ++i) s.insert(i);
  for (int i = 13; i <= 79; i += 3) s.insert(i);
  return s;
}
const std::set<int> kMoreBits8 = {0, 3, 6, 7};

bool is_indexer_matrix_name(const std::string& n) {
  return n.find("indexer.attn_q_b") != std::string::npos || n.find("indexer.attn_k.") != std::string::npos ||
         n.find("indexer.proj") != std::string::npos;
}

}  // namespace

// ---------------------------------------------------------------------------------------------
TEST(QuantRules, ParseTargetNamesAliasesNumbers) {
  struct Row { const char* in; const char* name; FileType ft; GgmlType def; };
  const Row rows[] = {
      {"Q8_0", "Q8_0", FileType::MOSTLY_Q8_0, Q8_0},     {"q6_k", "Q6_K", FileType::MOSTLY_Q6_K, Q6_K},
      {"Q5_K_M", "Q5_K_M", FileType::MOSTLY_Q5_K_M, Q5_K}, {"Q5_K", "Q5_K_M", FileType::MOSTLY_Q5_K_M, Q5_K},
      {"Q5_K_S", "Q5_K_S", FileType::MOSTLY_Q5_K_S, Q5_K}, {"q4_k_m", "Q4_K_M", FileType::MOSTLY_Q4_K_M, Q4_K},
      {"Q4_K", "Q4_K_M", FileType::MOSTLY_Q4_K_M, Q4_K},   {"Q4_K_S", "Q4_K_S", FileType::MOSTLY_Q4_K_S, Q4_K},
      {"Q4_0", "Q4_0", FileType::MOSTLY_Q4_0, Q4_0},       {"bf16", "BF16", FileType::MOSTLY_BF16, BF16},
      {"F16", "F16", FileType::MOSTLY_F16, F16},           {"15", "Q4_K_M", FileType::MOSTLY_Q4_K_M, Q4_K},
      {"7", "Q8_0", FileType::MOSTLY_Q8_0, Q8_0},          {"18", "Q6_K", FileType::MOSTLY_Q6_K, Q6_K},
      {"32", "BF16", FileType::MOSTLY_BF16, BF16},
      // llama-quantize's other names that kimi makes (llama.cpp's quantize.cpp, llama_ftype_get_default_type)
      {"Q2_K", "Q2_K", FileType::MOSTLY_Q2_K, GgmlType::Q2_K}, {"q2_k_s", "Q2_K_S", FileType::MOSTLY_Q2_K_S, GgmlType::Q2_K},
      {"Q3_K", "Q3_K_M", FileType::MOSTLY_Q3_K_M, GgmlType::Q3_K}, {"Q3_K_S", "Q3_K_S", FileType::MOSTLY_Q3_K_S, GgmlType::Q3_K},
      {"Q3_K_M", "Q3_K_M", FileType::MOSTLY_Q3_K_M, GgmlType::Q3_K}, {"13", "Q3_K_L", FileType::MOSTLY_Q3_K_L, GgmlType::Q3_K},
      {"IQ2_XS", "IQ2_XS", FileType::MOSTLY_IQ2_XS, GgmlType::IQ2_XS}, {"iq4_xs", "IQ4_XS", FileType::MOSTLY_IQ4_XS, GgmlType::IQ4_XS},
      {"Q5_0", "Q5_0", FileType::MOSTLY_Q5_0, Q5_0},     {"9", "Q5_1", FileType::MOSTLY_Q5_1, Q5_1},
      {"MXFP4_MOE", "MXFP4_MOE", FileType::MOSTLY_MXFP4_MOE, MXFP4}, {"0", "F32", FileType::ALL_F32, F32},
      {"12", "Q3_K_M", FileType::MOSTLY_Q3_K_M, GgmlType::Q3_K}, {"21", "Q2_K_S", FileType::MOSTLY_Q2_K_S, GgmlType::Q2_K},
  };
  for (const auto& r : rows) {
    Target t = parse_target(r.in);
    EXPECT_EQ(t.name, r.name) << r.in;
    EXPECT_EQ(t.ftype, r.ft) << r.in;
    EXPECT_EQ(t.default_type, r.def) << r.in;
    EXPECT_FALSE(t.copy);
  }
  // §4.7 numbers: Q4_K_M 15, Q5_K_M 17, Q4_K_S 14, Q5_K_S 16, Q6_K 18, Q8_0 7, Q4_0 2, BF16 32, F16 1
  EXPECT_EQ(static_cast<uint32_t>(parse_target("Q5_K_M").ftype), 17u);
  EXPECT_EQ(static_cast<uint32_t>(parse_target("Q4_K_S").ftype), 14u);
  EXPECT_EQ(static_cast<uint32_t>(parse_target("Q5_K_S").ftype), 16u);
  EXPECT_EQ(static_cast<uint32_t>(parse_target("Q4_0").ftype), 2u);
  EXPECT_TRUE(parse_target("copy").copy);
  for (const char* bad : {"Q3_K_XL", "IQ9_XS", "Q4", "", "99", "Q4_K_MM", "15x", "34"}) {
    try {
      parse_target(bad);
      ADD_FAILURE() << "accepted '" << bad << "'";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("unknown quantization type"), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find("Q4_K_M"), std::string::npos) << "lists the choices: " << e.what();
    }
  }
  // llama-quantize names whose recipe needs a type kimi has no quantizer for: one line saying so
  struct Cannot { const char* in; const char* needs; };
  for (const Cannot& c : {Cannot{"IQ1_S", "IQ1_S"}, Cannot{"iq1_m", "IQ1_M"}, Cannot{"IQ2_XXS", "IQ2_XXS"},
                          Cannot{"IQ2_S", "IQ3_S"}, Cannot{"IQ2_M", "IQ2_S"}, Cannot{"IQ3_XXS", "IQ3_XXS"},
                          Cannot{"IQ3_XS", "IQ3_S"}, Cannot{"IQ3_S", "IQ3_S"}, Cannot{"IQ3_M", "IQ3_S"},
                          Cannot{"IQ4_NL", "IQ4_NL"}, Cannot{"Q4_1", "Q4_1"}, Cannot{"TQ1_0", "TQ1_0"},
                          Cannot{"TQ2_0", "TQ2_0"}, Cannot{"Q1_0", "Q1_0"}, Cannot{"Q2_0", "Q2_0"}, Cannot{"24", "IQ1_S"},
                          Cannot{"19", "IQ2_XXS"}}) {
    try {
      parse_target(c.in);
      ADD_FAILURE() << "accepted '" << c.in << "'";
    } catch (const Error& e) {
      const std::string s = e.what();
      EXPECT_NE(s.find("cannot be made by kimi"), std::string::npos) << s;
      EXPECT_NE(s.find(c.needs), std::string::npos) << s;
      EXPECT_EQ(s.find('\n'), std::string::npos) << "one line: " << s;
    }
  }
  // every name of the help table parses (or says it cannot be made); numbers are unique per name
  for (const auto& i : target_table()) {
    if (!i.cannot.empty()) {
      EXPECT_THROW(parse_target(i.name), Error) << i.name;
      continue;
    }
    const Target t = parse_target(i.name);
    EXPECT_EQ(t.name, i.alias_of.empty() ? i.name : i.alias_of);
    if (i.ftype >= 0) {
      EXPECT_EQ(static_cast<int>(t.ftype), i.ftype) << i.name;
    }
    EXPECT_EQ(t.moe_mix, i.mix) << i.name;
  }
  EXPECT_NE(targets_help().find("IQ1_S"), std::string::npos);
  EXPECT_NE(targets_help().find("not made by kimi"), std::string::npos);
}

TEST(QuantRules, ParseTensorTypeAndOverride) {
  EXPECT_EQ(parse_tensor_type("q8_0", "x"), Q8_0);
  EXPECT_EQ(parse_tensor_type("Q4_K", "x"), Q4_K);
  EXPECT_EQ(parse_tensor_type("bf16", "x"), BF16);
  EXPECT_THROW(parse_tensor_type("q9_9", "--output-tensor-type"), Error);
  EXPECT_THROW(parse_tensor_type("Q8_K", "x"), Error);  // activation-only
  EXPECT_THROW(parse_tensor_type("IQ2_XXS", "x"), Error);
  EXPECT_EQ(parse_tensor_type("q2_k", "x"), GgmlType::Q2_K);
  EXPECT_EQ(parse_tensor_type("Q3_K", "x"), GgmlType::Q3_K);
  EXPECT_EQ(parse_tensor_type("iq4_xs", "x"), GgmlType::IQ4_XS);
  EXPECT_EQ(parse_tensor_type("IQ2_XS", "x"), GgmlType::IQ2_XS);

  Override o = parse_override("ATTN_K=q4_0");
  EXPECT_EQ(o.pattern, "attn_k");
  EXPECT_EQ(o.type, Q4_0);
  auto msg = [](const std::string& s) -> std::string {
    try {
      parse_override(s);
    } catch (const Error& e) {
      return e.what();
    }
    return "";
  };
  EXPECT_NE(msg("attn_k").find("PATTERN=TYPE"), std::string::npos);
  EXPECT_NE(msg("=q4_0").find("empty pattern"), std::string::npos);
  EXPECT_NE(msg("blk.(3=q4_0").find("bad regular expression"), std::string::npos);
  EXPECT_NE(msg("ffn=q7_7").find("unknown tensor type"), std::string::npos);
}

TEST(QuantRules, Categories) {
  EXPECT_EQ(category("output.weight"), Category::Output);
  EXPECT_EQ(category("token_embd.weight"), Category::TokenEmbd);
  EXPECT_EQ(category("blk.3.attn_output.weight"), Category::AttnOut);  // not OUTPUT
  EXPECT_EQ(category("blk.0.attn_v.weight"), Category::AttnV);
  EXPECT_EQ(category("blk.0.attn_kv_b.weight"), Category::AttnV);
  EXPECT_EQ(category("blk.0.attn_qkv.weight"), Category::AttnV);
  EXPECT_EQ(category("blk.0.attn_k.weight"), Category::AttnK);
  EXPECT_EQ(category("blk.0.attn_q.weight"), Category::AttnQ);
  EXPECT_EQ(category("blk.1.ffn_down_exps.weight"), Category::FfnDown);
  EXPECT_EQ(category("blk.1.ffn_down_shexp.weight"), Category::FfnDown);
  EXPECT_EQ(category("blk.0.ffn_down.weight"), Category::FfnDown);
  EXPECT_EQ(category("blk.1.ffn_up_exps.weight"), Category::FfnUp);
  EXPECT_EQ(category("blk.1.ffn_gate_shexp.weight"), Category::FfnGate);
  // K3 names that merely look similar
  EXPECT_EQ(category("blk.3.attn_k_b.weight"), Category::Other);
  EXPECT_EQ(category("blk.3.attn_v_b.weight"), Category::Other);
  EXPECT_EQ(category("blk.3.attn_q_b.weight"), Category::Other);
  EXPECT_EQ(category("blk.1.ffn_routed_down.weight"), Category::Other);
  EXPECT_EQ(category("blk.1.ffn_routed_up.weight"), Category::Other);
  // the indexer: `attn_k.weight` inside `indexer.attn_k.weight` must not make it an attention K
  EXPECT_EQ(category("blk.3.indexer.attn_k.weight"), Category::Indexer);
  EXPECT_EQ(category("blk.3.indexer.attn_q_b.weight"), Category::Indexer);
  EXPECT_EQ(category("blk.3.indexer.proj.weight"), Category::Indexer);
  EXPECT_TRUE(is_indexer_tensor("blk.91.indexer.k_norm.bias"));
  EXPECT_FALSE(is_indexer_tensor("blk.3.attn_k.weight"));
  EXPECT_FALSE(is_indexer_tensor("blk.3.reindexer_x.weight"));
}

TEST(QuantRules, LayerIndexAndDims) {
  EXPECT_EQ(layer_index("blk.0.ffn_down.weight"), 0);
  EXPECT_EQ(layer_index("blk.92.ffn_down_exps.weight"), 92);
  EXPECT_EQ(layer_index("output.weight"), std::nullopt);
  EXPECT_EQ(layer_index("blk.x.ffn_down.weight"), std::nullopt);
  EXPECT_EQ(layer_index("blk.12"), std::nullopt);
  EXPECT_EQ(n_dims({64, 1, 1, 1}), 1);
  EXPECT_EQ(n_dims({64, 2, 1, 1}), 2);
  EXPECT_EQ(n_dims({4, 1, 64, 1}), 3);
}

TEST(QuantRules, MoreBitsLayerSets) {
  const std::set<int> want93 = more_bits_93();
  for (int i = 0; i < 93; ++i) EXPECT_EQ(more_bits(i, 93), want93.count(i) == 1) << "layer " << i << " of 93";
  EXPECT_EQ(want93.size(), 11u + 12u + 23u);
  for (int i = 0; i < 8; ++i) EXPECT_EQ(more_bits(i, 8), kMoreBits8.count(i) == 1) << "layer " << i << " of 8";
}

TEST(QuantRules, BlockSizeFallbackTable) {
  ASSERT_TRUE(can_quantize(Q5_0));  // the §5.2 fallbacks are writable, so plans use them as-is
  ASSERT_TRUE(can_quantize(Q5_1));
  // §5.2 (ne[0] % 256 != 0 for K-quants; then F16 if the fallback's block does not fit either)
  EXPECT_EQ(block_fallback(Q4_K, 64), Q5_0);
  EXPECT_EQ(block_fallback(Q5_K, 64), Q5_1);
  EXPECT_EQ(block_fallback(Q6_K, 64), Q8_0);
  EXPECT_EQ(block_fallback(GgmlType::Q2_K, 96), Q4_0);
  EXPECT_EQ(block_fallback(GgmlType::Q3_K, 96), Q4_0);
  EXPECT_EQ(block_fallback(GgmlType::IQ4_XS, 96), GgmlType::IQ4_NL);
  EXPECT_EQ(block_fallback(GgmlType::IQ2_XXS, 96), GgmlType::IQ4_NL);
  EXPECT_EQ(block_fallback(Q4_K, 16), F16);   // Q5_0 needs 32 too
  EXPECT_EQ(block_fallback(Q6_K, 48), F16);
  EXPECT_EQ(block_fallback(Q8_0, 16), F16);   // 32-block types are kept, else F16
  EXPECT_EQ(block_fallback(MXFP4, 48), F16);
  for (GgmlType t : {Q4_K, Q5_K, Q6_K, Q8_0, Q4_0}) {
    EXPECT_EQ(block_fallback(t, 256), t);
    EXPECT_EQ(block_fallback(t, 7168), t);
  }
  EXPECT_EQ(block_fallback(Q8_0, 64), Q8_0);
  EXPECT_EQ(block_fallback(BF16, 3), BF16);
}

TEST(QuantRules, NotQuantizableReasons) {
  EXPECT_STREQ(not_quantizable_reason("blk.0.attn_norm.weight", {64, 1, 1, 1}, false), "1-D");
  EXPECT_STREQ(not_quantizable_reason("blk.0.ssm_a", {4, 1, 1, 1}, false), "1-D");
  EXPECT_STREQ(not_quantizable_reason("blk.0.foo.bias", {4, 4, 1, 1}, false), "name does not end in 'weight'");
  EXPECT_STREQ(not_quantizable_reason("blk.0.x_norm.weight", {4, 4, 1, 1}, false), "norm");
  EXPECT_STREQ(not_quantizable_reason("blk.1.ffn_gate_inp.weight", {64, 8, 1, 1}, false), "router (ffn_gate_inp)");
  EXPECT_STREQ(not_quantizable_reason("blk.0.ssm_conv1d_k.weight", {4, 1, 64, 1}, false), "short conv (ssm_conv1d)");
  EXPECT_STREQ(not_quantizable_reason("output.weight", {64, 64, 1, 1}, true), "--leave-output-tensor");
  EXPECT_EQ(not_quantizable_reason("output.weight", {64, 64, 1, 1}, false), nullptr);
  EXPECT_EQ(not_quantizable_reason("blk.0.attn_q.weight", {64, 64, 1, 1}, false), nullptr);
}

// The real K3.1 layout (93 layers, 896 experts) under Q4_K_M: formats-quant §5.6 + decision 5.
TEST(QuantRules, K3Q4KM) {
  Planned p = run(k3(93, 896), opts("Q4_K_M"));
  const std::set<int> mb = more_bits_93();
  EXPECT_EQ(p.type("output.weight"), Q6_K);
  EXPECT_EQ(p.type("token_embd.weight"), Q4_K);  // untied: default
  // ffn_down (dense, shexp) bumped in more_bits layers; MoE: i = the layer from the name
  EXPECT_EQ(p.type("blk.0.ffn_down.weight"), Q6_K);
  for (int il = 1; il < 93; ++il) {
    const std::string n = "blk." + std::to_string(il) + ".";
    EXPECT_EQ(p.type(n + "ffn_down_shexp.weight"), mb.count(il) ? Q6_K : Q4_K) << il;
    EXPECT_EQ(p.type(n + "ffn_gate_shexp.weight"), Q4_K) << il;
    EXPECT_EQ(p.type(n + "ffn_routed_down.weight"), Q4_K) << "category OTHER, no bump: " << il;
    for (const char* e : {"ffn_gate_exps.weight", "ffn_up_exps.weight", "ffn_down_exps.weight"}) {
      const Decision& d = p.at(n + e);
      EXPECT_EQ(d.type, MXFP4) << n + e;
      EXPECT_TRUE(d.copy);
      EXPECT_EQ(d.why, Why::ExpertsKept);
    }
    EXPECT_EQ(p.type(n + "ffn_gate_inp.weight"), F32);
  }
  // attn_v-like: running index over the 69 KDA attn_v tensors, n = 69
  int iv = 0;
  for (int il = 0; il < 93; ++il) {
    if (is_mla(il, 93)) continue;
    const std::string n = "blk." + std::to_string(il) + ".";
    const bool bump = iv < 69 / 8 || iv >= 7 * 69 / 8 || (iv - 69 / 8) % 3 == 2;  // §5.3 more_bits(i, n)
    EXPECT_EQ(p.type(n + "attn_v.weight"), bump ? Q6_K : Q4_K) << "attn_v #" << iv;
    EXPECT_EQ(p.type(n + "attn_k.weight"), Q4_K) << "896 experts: no 8-expert rule";
    EXPECT_EQ(p.type(n + "attn_q.weight"), Q4_K);
    EXPECT_EQ(p.type(n + "attn_output.weight"), Q4_K);
    EXPECT_EQ(p.type(n + "ssm_g.weight"), Q4_K);
    EXPECT_EQ(p.type(n + "ssm_conv1d_q.weight"), F32);
    EXPECT_EQ(p.type(n + "ssm_a"), F32);
    EXPECT_EQ(p.type(n + "ssm_dt.bias"), F32);
    // ssm_f_b rows are 128 wide: Q4_K -> Q5_0 (§5.2)
    const Decision& fb = p.at(n + "ssm_f_b.weight");
    EXPECT_EQ(fb.type, Q5_0);
    EXPECT_TRUE(fb.fallback);
    ++iv;
  }
  EXPECT_EQ(iv, 69);
  for (int il = 3; il < 93; il += il == 91 ? 1 : 4) {
    const std::string n = "blk." + std::to_string(il) + ".";
    EXPECT_EQ(p.type(n + "attn_k_b.weight"), Q5_0) << "qk_nope 128 % 256";
    EXPECT_EQ(p.type(n + "attn_v_b.weight"), Q4_K);
    EXPECT_EQ(p.type(n + "attn_q_b.weight"), Q4_K);
    // the indexer: kept at the converter's type, byte copy
    EXPECT_EQ(p.type(n + "indexer.attn_q_b.weight"), BF16);
    EXPECT_EQ(p.type(n + "indexer.attn_k.weight"), BF16);
    EXPECT_EQ(p.type(n + "indexer.proj.weight"), F32);
    EXPECT_EQ(p.at(n + "indexer.attn_k.weight").why, Why::Indexer);
    EXPECT_TRUE(p.at(n + "indexer.proj.weight").copy);
    EXPECT_EQ(p.type(n + "indexer.k_norm.weight"), F32);
  }
}

TEST(QuantRules, K3Q5KMAndQ4KS) {
  const std::set<int> mb = more_bits_93();
  Planned p5 = run(k3(93, 896), opts("Q5_K_M"));
  EXPECT_EQ(p5.type("output.weight"), Q6_K);
  EXPECT_EQ(p5.type("token_embd.weight"), Q5_K);
  EXPECT_EQ(p5.type("blk.0.ffn_down.weight"), Q6_K);
  EXPECT_EQ(p5.type("blk.1.ffn_down_shexp.weight"), Q6_K);   // layer 1 < 93/8
  EXPECT_EQ(p5.type("blk.12.ffn_down_shexp.weight"), Q5_K);  // not more_bits
  EXPECT_EQ(p5.type("blk.13.ffn_down_shexp.weight"), Q6_K);  // (13 - 11) % 3 == 2
  EXPECT_EQ(p5.type("blk.0.attn_v.weight"), Q6_K);
  EXPECT_EQ(p5.type("blk.1.ssm_f_b.weight"), Q5_1);   // Q5_K at 128 wide -> Q5_1
  EXPECT_EQ(p5.type("blk.1.attn_output.weight"), Q5_K);

  Planned ps = run(k3(93, 896), opts("Q4_K_S"));
  EXPECT_EQ(ps.type("output.weight"), Q6_K);
  // first 4 attn_v-like tensors -> Q5_K (KDA layers 0, 1, 2, 4), then Q4_K
  EXPECT_EQ(ps.type("blk.0.attn_v.weight"), Q5_K);
  EXPECT_EQ(ps.type("blk.4.attn_v.weight"), Q5_K);
  EXPECT_EQ(ps.type("blk.5.attn_v.weight"), Q4_K);
  // ffn_down in layers < 93/8 = 11 -> Q5_K
  EXPECT_EQ(ps.type("blk.0.ffn_down.weight"), Q5_K);
  EXPECT_EQ(ps.type("blk.10.ffn_down_shexp.weight"), Q5_K);
  EXPECT_EQ(ps.type("blk.11.ffn_down_shexp.weight"), Q4_K);
  EXPECT_EQ(ps.type("blk.90.ffn_down_shexp.weight"), Q4_K);

  Planned pks = run(k3(93, 896), opts("Q5_K_S"));
  EXPECT_EQ(pks.type("output.weight"), Q6_K);
  EXPECT_EQ(pks.type("blk.0.attn_v.weight"), Q5_K);
  EXPECT_EQ(pks.type("blk.0.ffn_down.weight"), Q5_K);
}

TEST(QuantRules, PlainTargets) {
  for (const char* tgt : {"Q8_0", "Q6_K", "Q4_0"}) {
    Planned p = run(k3(8, 896), opts(tgt));
    const GgmlType def = parse_target(tgt).default_type;
    EXPECT_EQ(p.type("output.weight"), def == Q8_0 ? Q8_0 : Q6_K) << tgt;
    EXPECT_EQ(p.type("token_embd.weight"), def) << tgt;
    EXPECT_EQ(p.type("blk.0.ffn_down.weight"), def) << tgt << ": no more_bits bump";
    EXPECT_EQ(p.type("blk.0.attn_v.weight"), def) << tgt;
    EXPECT_EQ(p.type("blk.1.ffn_gate_exps.weight"), MXFP4);
  }
  for (const char* tgt : {"BF16", "F16"}) {
    Planned p = run(k3(8, 896), opts(tgt));
    const GgmlType def = parse_target(tgt).default_type;
    EXPECT_EQ(p.type("output.weight"), def) << tgt << ": no mixture for float targets";
    EXPECT_EQ(p.type("blk.3.attn_k_b.weight"), def);
    EXPECT_EQ(p.type("blk.0.attn_norm.weight"), F32);
    EXPECT_EQ(p.type("blk.1.ffn_gate_exps.weight"), MXFP4);
    EXPECT_EQ(p.at("token_embd.weight").copy, def == BF16);
  }
  Planned c = run(k3(8, 896), opts("COPY"));
  for (size_t i = 0; i < c.m.t.size(); ++i) {
    EXPECT_TRUE(c.d[i].copy) << c.m.t[i].name;
    EXPECT_EQ(c.d[i].type, c.m.t[i].type) << c.m.t[i].name;
  }
}

// Mixtral-style 8-expert rules (§5.3): attn_v-like and attn_k -> Q8_0, attn_output -> Q5_K
// under Q4_K_M/Q4_K_S; tiny has 8 experts, so these fire there.
TEST(QuantRules, EightExpertRules) {
  Planned p = run(k3(8, 8), opts("Q4_K_M"));
  EXPECT_EQ(p.type("blk.0.attn_v.weight"), Q8_0);
  EXPECT_EQ(p.type("blk.1.attn_v.weight"), Q8_0);
  EXPECT_EQ(p.type("blk.1.attn_k.weight"), Q8_0);
  EXPECT_EQ(p.type("blk.1.attn_output.weight"), Q5_K);
  EXPECT_EQ(p.type("blk.1.attn_q.weight"), Q4_K);
  EXPECT_EQ(p.type("blk.3.indexer.attn_k.weight"), BF16) << "the indexer key is no attention K";
  Planned q = run(k3(8, 8), opts("Q5_K_M"));
  EXPECT_EQ(q.type("blk.1.attn_output.weight"), Q5_K);  // Q5_K_M is not in the attn_output list: default
  EXPECT_EQ(q.type("blk.1.attn_k.weight"), Q8_0);
  Planned r = run(k3(8, 8), opts("Q4_0"));
  EXPECT_EQ(r.type("blk.1.attn_v.weight"), Q8_0);
  EXPECT_EQ(r.type("blk.1.attn_output.weight"), Q4_0);
}

TEST(QuantRules, EightLayerMoreBitsFfnDown) {
  Planned p = run(k3(8, 896), opts("Q4_K_M"));
  EXPECT_EQ(p.type("blk.0.ffn_down.weight"), Q6_K);
  for (int il = 1; il < 8; ++il)
    EXPECT_EQ(p.type("blk." + std::to_string(il) + ".ffn_down_shexp.weight"), kMoreBits8.count(il) ? Q6_K : Q4_K)
        << il;
}

// tiny preset: hidden 64, so no 2-D tensor can take a K-quant: every one falls back (§5.2).
TEST(QuantRules, TinyWidthsFallBack) {
  Planned p = run(k3(8, 8, /*d=*/64), opts("Q4_K_M"));
  const Decision& q = p.at("blk.1.attn_q.weight");
  EXPECT_EQ(q.type, Q5_0);  // Q4_K -> Q5_0, written as Q5_0 (no "no quantizer" substitution)
  EXPECT_EQ(q.note.find("no quantizer"), std::string::npos) << q.note;
  EXPECT_TRUE(q.fallback);
  EXPECT_NE(q.note.find("fallback Q4_K -> Q5_0"), std::string::npos) << q.note;
  EXPECT_EQ(p.type("blk.0.ffn_down.weight"), Q6_K) << "33792 % 256 == 0: Q6_K fits";
  EXPECT_EQ(p.type("blk.3.ffn_down_shexp.weight"), Q6_K) << "more_bits layer 3; 6144 wide fits Q6_K";
  Planned s = run(k3(8, 896, 64), opts("Q4_K_M"));
  EXPECT_EQ(s.type("output.weight"), Q8_0) << "OUTPUT with ne[0] % 256 != 0 -> Q8_0";
  EXPECT_EQ(s.type("blk.1.ffn_routed_up.weight"), Q4_K) << "3584 wide";
  EXPECT_EQ(s.type("blk.1.ffn_routed_down.weight"), Q5_0) << "64 wide";
  EXPECT_EQ(s.type("blk.1.attn_output.weight"), Q4_K) << "12288 wide";
  Planned s5 = run(k3(8, 896, 64), opts("Q5_K_M"));
  EXPECT_EQ(s5.type("blk.1.attn_q.weight"), Q5_1);
  Planned s6 = run(k3(8, 896, 64), opts("Q6_K"));
  EXPECT_EQ(s6.type("blk.1.attn_q.weight"), Q8_0);
  Planned s8 = run(k3(8, 896, 16), opts("Q8_0"));
  EXPECT_EQ(s8.type("blk.1.attn_q.weight"), F16) << "16 wide: not even a 32-block type fits";
}

TEST(QuantRules, TiedEmbeddingsFollowOutputRule) {
  Planned p = run(k3(8, 896, 7168, /*tied=*/true), opts("Q4_K_M"));
  EXPECT_EQ(p.type("token_embd.weight"), Q6_K);
  RuleOptions o = opts("Q4_K_M");
  o.output_type = Q8_0;
  Planned q = run(k3(8, 896, 7168, true), o);
  EXPECT_EQ(q.type("token_embd.weight"), Q8_0);
}

TEST(QuantRules, PureOverridesAndFlags) {
  RuleOptions o = opts("Q4_K_M");
  o.pure = true;
  Planned p = run(k3(8, 896), o);
  EXPECT_EQ(p.type("output.weight"), Q4_K);
  EXPECT_EQ(p.type("blk.0.ffn_down.weight"), Q4_K);
  EXPECT_EQ(p.type("blk.0.attn_v.weight"), Q4_K);
  EXPECT_EQ(p.type("blk.1.ssm_f_b.weight"), Q5_0) << "fallback still applies with --pure";

  o = opts("Q4_K_M");
  o.overrides = {parse_override("attn_k=q4_0"), parse_override("ffn_down=q8_0"), parse_override("ffn=q6_k")};
  o.output_type = Q8_0;
  o.token_embd_type = Q6_K;
  Planned q = run(k3(8, 896), o);
  EXPECT_EQ(q.type("blk.0.attn_k.weight"), Q4_0);
  EXPECT_EQ(q.at("blk.0.attn_k.weight").why, Why::Override);
  EXPECT_EQ(q.type("blk.0.ffn_down.weight"), Q8_0) << "first matching pattern wins";
  EXPECT_EQ(q.type("blk.0.ffn_up.weight"), Q6_K);
  EXPECT_EQ(q.type("blk.1.ffn_down_exps.weight"), MXFP4) << "overrides do not requantize MXFP4 experts";
  EXPECT_EQ(q.type("output.weight"), Q8_0);
  EXPECT_EQ(q.type("token_embd.weight"), Q6_K);
  EXPECT_EQ(q.type("blk.3.attn_k_b.weight"), Q4_0) << "regex search: 'attn_k' also matches attn_k_b";
  EXPECT_EQ(q.type("blk.3.indexer.attn_k.weight"), BF16) << "but never the indexer";
}

TEST(QuantRules, LeaveOutputTensor) {
  RuleOptions o = opts("Q4_K_M");
  o.leave_output = true;
  Planned p = run(k3(8, 896), o);
  EXPECT_EQ(p.type("output.weight"), BF16);
  EXPECT_TRUE(p.at("output.weight").copy);
  EXPECT_EQ(p.type("token_embd.weight"), Q4_K);
}

// Decision 5: the three indexer matrices keep their type under every target and every option.
TEST(QuantRules, IndexerExemptUnderEverything) {
  std::vector<RuleOptions> all;
  for (const auto& t : target_names()) all.push_back(opts(t));
  {
    RuleOptions o = opts("Q4_0");
    o.pure = true;
    all.push_back(o);
  }
  for (const char* pat : {"indexer=q4_0", "attn_k=q4_0", "attn_q_b=q8_0", "proj=q4_k", ".*=q4_0", "blk\\.3\\.=bf16",
                          "weight=f16"}) {
    RuleOptions o = opts("Q4_K_M");
    o.overrides = {parse_override(pat)};
    all.push_back(o);
    o.pure = true;
    all.push_back(o);
  }
  {
    RuleOptions o = opts("Q8_0");
    o.output_type = Q4_0;
    o.token_embd_type = Q4_0;
    o.requantize_experts = Q8_0;
    o.allow_requantize = true;
    o.leave_output = true;
    all.push_back(o);
  }
  for (const auto& o : all) {
    // the converter's types (BF16 q_b / k, F32 proj) and other source precisions (F16, F32)
    for (GgmlType src : {BF16, F16, F32}) {
      Model m = k3(8, 896);
      for (auto& t : m.t)
        if (t.name.find("indexer.attn_") != std::string::npos) t.type = src;
      Planned p = run(m, o);
      int n = 0;
      for (size_t i = 0; i < p.m.t.size(); ++i) {
        if (!is_indexer_matrix_name(p.m.t[i].name)) continue;
        ++n;
        EXPECT_EQ(p.d[i].type, p.m.t[i].type) << p.m.t[i].name << " under " << o.target.name;
        EXPECT_TRUE(p.d[i].copy) << p.m.t[i].name;
        EXPECT_EQ(p.d[i].why, Why::Indexer) << p.m.t[i].name;
      }
      EXPECT_EQ(n, 6);  // 2 MLA layers x 3
    }
  }
}

TEST(QuantRules, MxfP4ExpertsAndRequantizeExperts) {
  RuleOptions o = opts("Q4_K_M");
  o.requantize_experts = Q4_K;
  Planned p = run(k3(8, 896), o);
  const Decision& d = p.at("blk.1.ffn_down_exps.weight");  // rows 3072 wide
  EXPECT_EQ(d.type, Q4_K);
  EXPECT_FALSE(d.copy);
  EXPECT_EQ(d.why, Why::ExpertsRequant);
  EXPECT_EQ(p.type("blk.1.ffn_gate_exps.weight"), Q4_K);
  o.requantize_experts = Q8_0;
  o.target = parse_target("COPY");
  Planned c = run(k3(8, 896), o);
  EXPECT_EQ(c.type("blk.1.ffn_up_exps.weight"), Q8_0) << "--requantize-experts is explicit, even with COPY";
  EXPECT_EQ(c.type("blk.1.attn_v.weight"), BF16);
}

TEST(QuantRules, RequantizeNeedsPermission) {
  Model m = k3(8, 896);
  m.t[m.idx["blk.1.attn_q.weight"]].type = Q8_0;  // e.g. converted with --outtype q8_0
  try {
    plan(m.t, m.facts, opts("Q4_K_M"));
    ADD_FAILURE() << "requantization accepted";
  } catch (const Error& e) {
    const std::string s = e.what();
    EXPECT_NE(s.find("blk.1.attn_q.weight"), std::string::npos) << s;
    EXPECT_NE(s.find("--allow-requantize"), std::string::npos) << s;
  }
  // same type: copied
  Planned same = run(m, opts("Q8_0"));
  EXPECT_TRUE(same.at("blk.1.attn_q.weight").copy);
  RuleOptions o = opts("Q4_K_M");
  o.allow_requantize = true;
  Planned ok = run(m, o);
  EXPECT_EQ(ok.type("blk.1.attn_q.weight"), Q4_K);
  EXPECT_FALSE(ok.at("blk.1.attn_q.weight").copy);
}

TEST(QuantRules, MoeFfnDownNeedsLayerName) {
  Model m = k3(8, 896);
  m.add("ffn_down_extra.weight", BF16, {256, 256, 1, 1});
  EXPECT_THROW(plan(m.t, m.facts, opts("Q4_K_M")), Error);
  // a dense model (no experts) uses the running ffn_down counter instead
  Model d;
  d.facts = {8, 0};
  for (int i = 0; i < 8; ++i) d.add("ffn_down_" + std::to_string(i) + ".weight", BF16, {256, 256, 1, 1});
  Planned p = run(d, opts("Q4_K_M"));
  for (int i = 0; i < 8; ++i) EXPECT_EQ(p.d[i].type, kMoreBits8.count(i) ? Q6_K : Q4_K) << i;
}

// MoE mix presets (docs/quantize.md): experts at 2-4 bits (MXFP4 experts re-quantized), the
// always-read tensors at the preset's type, output Q6_K, more_bits non-expert ffn_down Q6_K.
TEST(QuantRules, MoeMixPresets) {
  struct Row { const char* name; uint32_t ftype; GgmlType gate_up, down, rest; const char* llama_name; };
  const Row rows[] = {
      {"Q2_K_MOE", 10, GgmlType::Q2_K, GgmlType::Q3_K, Q4_K, "Q2_K"},
      {"Q3_K_MOE", 12, GgmlType::Q3_K, Q4_K, Q5_K, "Q3_K_M"},
      {"IQ2_XS_MOE", 20, GgmlType::IQ2_XS, GgmlType::Q2_K, Q4_K, "IQ2_XS"},
      {"IQ4_XS_MOE", 30, GgmlType::IQ4_XS, GgmlType::IQ4_XS, Q6_K, "IQ4_XS"},
  };
  EXPECT_EQ(parse_target("Q2_K_M").name, "Q2_K_MOE");  // the mixes' earlier names
  EXPECT_EQ(parse_target("iq2_xs_m").name, "IQ2_XS_MOE");
  for (const auto& r : rows) {
    EXPECT_EQ(static_cast<uint32_t>(parse_target(r.name).ftype), r.ftype) << r.name;
    EXPECT_TRUE(parse_target(r.name).moe_mix);
    // a number is llama-quantize's name for it, never a mix
    EXPECT_EQ(parse_target(std::to_string(r.ftype)).name, r.llama_name);
    EXPECT_FALSE(parse_target(std::to_string(r.ftype)).moe_mix);
    Planned p = run(k3(8, 896), opts(r.name));
    for (int il = 1; il < 8; ++il) {
      const std::string b = "blk." + std::to_string(il) + ".";
      EXPECT_EQ(p.type(b + "ffn_gate_exps.weight"), r.gate_up) << r.name << " " << b;
      EXPECT_EQ(p.type(b + "ffn_up_exps.weight"), r.gate_up) << r.name;
      EXPECT_EQ(p.type(b + "ffn_down_exps.weight"), r.down) << r.name;
      EXPECT_FALSE(p.at(b + "ffn_down_exps.weight").copy);
      EXPECT_EQ(p.type(b + "ffn_routed_down.weight"), r.rest) << r.name;
      EXPECT_EQ(p.type(b + "ffn_gate_shexp.weight"), r.rest) << r.name;
      EXPECT_EQ(p.type(b + "ffn_down_shexp.weight"), kMoreBits8.count(il) ? Q6_K : r.rest) << r.name << " " << il;
      EXPECT_EQ(p.type(b + "attn_output.weight"), r.rest) << r.name;
      EXPECT_EQ(p.type(b + "ffn_gate_inp.weight"), F32) << "router kept";
    }
    EXPECT_EQ(p.type("blk.1.attn_q.weight"), r.rest);
    EXPECT_EQ(p.type("blk.3.attn_kv_a_mqa.weight"), r.rest);
    EXPECT_EQ(p.type("blk.0.ffn_down.weight"), Q6_K) << "layer 0 is a more_bits layer";
    EXPECT_EQ(p.type("blk.0.ffn_up.weight"), r.rest);
    EXPECT_EQ(p.type("output.weight"), Q6_K);
    EXPECT_EQ(p.type("token_embd.weight"), r.rest);
    EXPECT_EQ(p.type("blk.3.indexer.attn_k.weight"), BF16);
    EXPECT_EQ(p.type("blk.3.indexer.proj.weight"), F32);
    EXPECT_EQ(p.type("blk.3.indexer.attn_q_b.weight"), BF16);
  }
  // --requantize-experts and --tensor-type still win over the preset's expert types
  RuleOptions o = opts("Q2_K_MOE");
  o.requantize_experts = GgmlType::IQ4_XS;
  Planned p = run(k3(8, 896), o);
  EXPECT_EQ(p.type("blk.2.ffn_down_exps.weight"), GgmlType::IQ4_XS);
  EXPECT_EQ(p.type("blk.2.attn_q.weight"), Q4_K);
  o = opts("Q2_K_MOE");
  o.overrides = {parse_override("blk\\.2\\.ffn_down_exps=q6_k")};
  p = run(k3(8, 896), o);
  EXPECT_EQ(p.type("blk.2.ffn_down_exps.weight"), Q6_K);
  EXPECT_EQ(p.at("blk.2.ffn_down_exps.weight").why, Why::Override);
  EXPECT_EQ(p.type("blk.3.ffn_down_exps.weight"), GgmlType::Q3_K);
}

TEST(QuantRules, MoeMixNeedsImatrixForIq2) {
  RuleOptions o = opts("IQ2_XS_M");
  o.have_imatrix = false;
  try {
    plan(k3(8, 896).t, k3(8, 896).facts, o);
    ADD_FAILURE() << "IQ2_XS without an imatrix accepted";
  } catch (const Error& e) {
    const std::string s = e.what();
    EXPECT_NE(s.find("ffn_gate_exps"), std::string::npos) << s;
    EXPECT_NE(s.find("--imatrix"), std::string::npos) << s;
  }
  o.allow_no_imatrix = true;
  EXPECT_EQ(run(k3(8, 896), o).type("blk.1.ffn_up_exps.weight"), GgmlType::IQ2_XS);
  // Q2_K_M does not need one
  RuleOptions q = opts("Q2_K_M");
  q.have_imatrix = false;
  EXPECT_EQ(run(k3(8, 896), q).type("blk.1.ffn_up_exps.weight"), GgmlType::Q2_K);
}

// llama-quantize's other names on K3 shapes, expected types written from llama.cpp v0.5.0's
// llama_tensor_get_type_impl (llama.cpp's llama-quant.cpp) for a model with 896 experts and n_gqa 0 (K3's
// layer 0 is KDA: head_count_kv 0): every MXFP4 expert stack stays MXFP4.
TEST(QuantRules, LlamaNamesOnK3) {
  const GgmlType Q2_K = GgmlType::Q2_K, Q3_K = GgmlType::Q3_K;
  Planned q2 = run(k3(93, 896), opts("Q2_K"));
  EXPECT_EQ(q2.type("output.weight"), Q6_K);
  EXPECT_EQ(q2.type("token_embd.weight"), Q2_K);
  EXPECT_EQ(q2.type("blk.0.attn_v.weight"), Q3_K) << "n_gqa < 4";
  EXPECT_EQ(q2.type("blk.0.attn_k.weight"), Q2_K);
  EXPECT_EQ(q2.type("blk.0.ffn_down.weight"), Q3_K);
  EXPECT_EQ(q2.type("blk.40.ffn_down_shexp.weight"), Q3_K);
  EXPECT_EQ(q2.type("blk.40.attn_output.weight"), Q3_K);
  EXPECT_EQ(q2.type("blk.40.ffn_gate_shexp.weight"), Q2_K);
  EXPECT_EQ(q2.type("blk.40.ssm_f_b.weight"), Q4_0) << "128 wide: Q2_K -> Q4_0";
  EXPECT_EQ(q2.type("blk.3.attn_k_b.weight"), Q4_0);
  EXPECT_EQ(q2.type("blk.3.attn_v_b.weight"), Q2_K);
  EXPECT_EQ(q2.at("blk.40.ffn_down_exps.weight").why, Why::ExpertsKept);
  Model g = k3(93, 896);
  g.facts.n_gqa = 4;
  EXPECT_EQ(run(g, opts("Q2_K")).type("blk.0.attn_v.weight"), Q4_K) << "n_gqa >= 4";
  Planned q2e = run(k3(8, 8), opts("Q2_K"));
  EXPECT_EQ(q2e.type("blk.0.attn_v.weight"), Q8_0) << "8 experts: after the Q2_K rule";
  EXPECT_EQ(q2e.type("blk.1.attn_k.weight"), Q8_0);
  EXPECT_EQ(q2e.type("blk.1.attn_output.weight"), Q5_K);

  Planned m = run(k3(93, 896), opts("Q3_K_M"));
  EXPECT_EQ(m.type("blk.0.attn_v.weight"), Q5_K) << "the first 2 attn_v";
  EXPECT_EQ(m.type("blk.1.attn_v.weight"), Q5_K);
  EXPECT_EQ(m.type("blk.2.attn_v.weight"), Q4_K);
  EXPECT_EQ(m.type("blk.0.ffn_down.weight"), Q5_K) << "layer < 93/16 = 5";
  EXPECT_EQ(m.type("blk.4.ffn_down_shexp.weight"), Q5_K);
  EXPECT_EQ(m.type("blk.5.ffn_down_shexp.weight"), Q4_K);
  EXPECT_EQ(m.type("blk.50.attn_output.weight"), Q4_K);
  EXPECT_EQ(m.type("blk.50.attn_q.weight"), Q3_K);
  EXPECT_EQ(m.type("output.weight"), Q6_K);
  Planned l = run(k3(93, 896), opts("Q3_K_L"));
  EXPECT_EQ(l.type("blk.50.attn_v.weight"), Q5_K);
  EXPECT_EQ(l.type("blk.50.ffn_down_shexp.weight"), Q5_K);
  EXPECT_EQ(l.type("blk.50.attn_output.weight"), Q5_K);
  EXPECT_EQ(l.type("blk.50.attn_q.weight"), Q3_K);
  Planned s = run(k3(93, 896), opts("Q3_K_S"));
  EXPECT_EQ(s.type("blk.0.attn_v.weight"), Q3_K);
  EXPECT_EQ(s.type("blk.0.ffn_down.weight"), Q3_K);
  EXPECT_EQ(s.type("blk.50.attn_output.weight"), Q3_K);
  EXPECT_EQ(s.type("output.weight"), Q6_K);

  Planned ks = run(k3(93, 896), opts("Q2_K_S"));
  EXPECT_EQ(ks.type("blk.10.ffn_down_shexp.weight"), Q4_K) << "layer < 93/8 = 11";
  EXPECT_EQ(ks.type("blk.11.ffn_down_shexp.weight"), Q2_K);
  EXPECT_EQ(ks.type("blk.0.attn_v.weight"), Q2_K) << "n_gqa < 4";
  RuleOptions no = opts("Q2_K_S");
  no.have_imatrix = false;  // Q2_K in a Q2_K_S file needs one (not token_embd / output)
  try {
    plan(k3(93, 896).t, k3(93, 896).facts, no);
    ADD_FAILURE() << "Q2_K_S without an imatrix accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("--imatrix"), std::string::npos) << e.what();
    EXPECT_EQ(std::string(e.what()).find("token_embd"), std::string::npos) << e.what();
  }
  EXPECT_EQ(run(k3(93, 896), opts("Q2_K")).type("blk.1.attn_q.weight"), Q2_K) << "plain Q2_K needs none";

  Planned x = run(k3(93, 896), opts("IQ2_XS"));
  EXPECT_EQ(x.type("output.weight"), Q5_K);
  EXPECT_EQ(x.type("token_embd.weight"), Q2_K);
  EXPECT_EQ(x.type("blk.0.attn_v.weight"), Q4_K) << "n_expert >= 4";
  EXPECT_EQ(x.type("blk.0.attn_k.weight"), GgmlType::IQ2_XS);
  EXPECT_EQ(x.type("blk.0.ffn_down.weight"), Q2_K) << "ffn_down #0 of the first 93/8 = 11";
  EXPECT_EQ(x.type("blk.5.ffn_down_shexp.weight"), Q2_K) << "#10 (layers 1-5: exps + shexp each)";
  EXPECT_EQ(x.type("blk.6.ffn_down_shexp.weight"), GgmlType::IQ2_XS) << "#12";
  EXPECT_EQ(x.type("blk.50.attn_output.weight"), GgmlType::IQ2_XS);
  const Decision& nl = x.at("blk.50.ssm_f_b.weight");  // IQ2_XS -> IQ4_NL (128 wide), which kimi cannot make
  EXPECT_EQ(nl.type, Q5_0);
  EXPECT_NE(nl.note.find("IQ4_NL"), std::string::npos) << nl.note;

  Planned iq4 = run(k3(93, 896), opts("IQ4_XS"));  // opts() says an imatrix is given
  EXPECT_EQ(iq4.type("output.weight"), Q6_K);
  EXPECT_EQ(iq4.type("blk.0.ffn_down.weight"), GgmlType::IQ4_XS);
  EXPECT_EQ(iq4.type("blk.0.attn_v.weight"), GgmlType::IQ4_XS);
  RuleOptions ni = opts("IQ4_XS");
  ni.have_imatrix = false;
  Planned iq4n = run(k3(93, 896), ni);
  EXPECT_EQ(iq4n.type("blk.0.ffn_down.weight"), Q5_K) << "no imatrix: layers < n/8";
  EXPECT_EQ(iq4n.type("blk.10.ffn_down_shexp.weight"), Q5_K);
  EXPECT_EQ(iq4n.type("blk.11.ffn_down_shexp.weight"), GgmlType::IQ4_XS);

  Planned mx = run(k3(8, 896), opts("MXFP4_MOE"));
  EXPECT_EQ(mx.type("output.weight"), Q8_0);
  EXPECT_EQ(mx.type("token_embd.weight"), Q8_0);
  EXPECT_EQ(mx.type("blk.3.attn_k_b.weight"), MXFP4) << "3-D";
  EXPECT_EQ(mx.type("blk.3.attn_v_b.weight"), MXFP4);
  EXPECT_EQ(mx.type("blk.1.attn_q.weight"), Q8_0);
  EXPECT_EQ(mx.type("blk.1.ssm_f_b.weight"), Q8_0);
  EXPECT_TRUE(mx.at("blk.1.ffn_up_exps.weight").copy);
  EXPECT_EQ(mx.type("blk.3.indexer.proj.weight"), F32);

  Planned q5 = run(k3(93, 896), opts("Q5_0"));  // with an imatrix
  EXPECT_EQ(q5.type("blk.0.ffn_down.weight"), Q5_1);
  EXPECT_EQ(q5.type("blk.11.ffn_down_shexp.weight"), Q5_0);
  EXPECT_EQ(q5.type("output.weight"), Q6_K);
  RuleOptions q5n = opts("Q5_0");
  q5n.have_imatrix = false;
  EXPECT_EQ(run(k3(93, 896), q5n).type("blk.0.ffn_down.weight"), Q5_0);
  // Q4_0 with an imatrix: llama.cpp gives the first ffn_down Q4_1, which kimi cannot make
  RuleOptions q4i = opts("Q4_0");
  q4i.have_imatrix = true;
  try {
    plan(k3(93, 896).t, k3(93, 896).facts, q4i);
    ADD_FAILURE() << "Q4_1 planned";
  } catch (const Error& e) {
    const std::string w = e.what();
    EXPECT_NE(w.find("blk.0.ffn_down.weight"), std::string::npos) << w;
    EXPECT_NE(w.find("Q4_1"), std::string::npos) << w;
  }
  EXPECT_EQ(run(k3(93, 896), opts("Q4_0")).type("blk.0.ffn_down.weight"), Q4_0) << "without an imatrix";
}

// llama.cpp decides the tensors in its loader's order (per layer, then by name), not the file's:
// its running ffn_down counter (IQ2_XS: the first n/8 ffn_down tensors get Q2_K) sees a layer's
// ffn_down_exps before its ffn_down_shexp even where the file has them the other way round.
TEST(QuantRules, LlamaOrderForRunningCounters) {
  Model m;
  m.facts = {16, 896};
  auto add = [&](int il, const char* n, GgmlType t, std::array<int64_t, 4> ne) {
    m.add("blk." + std::to_string(il) + "." + n, t, ne);
  };
  add(0, "ffn_down.weight", BF16, {2048, 512, 1, 1});
  for (int il = 1; il < 16; ++il) {
    add(il, "ffn_down_shexp.weight", BF16, {2048, 512, 1, 1});  // the converter's order: shexp first
    add(il, "ffn_down_exps.weight", MXFP4, {2048, 512, 4, 1});
  }
  Planned p = run(m, opts("IQ2_XS"));
  EXPECT_EQ(p.type("blk.0.ffn_down.weight"), GgmlType::Q2_K) << "#0 < 16/8";
  EXPECT_EQ(p.type("blk.1.ffn_down_shexp.weight"), GgmlType::IQ2_XS) << "#2: blk.1.ffn_down_exps was #1";
  EXPECT_EQ(p.at("blk.1.ffn_down_exps.weight").why, Why::ExpertsKept);
}
