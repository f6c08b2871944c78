// `kimi synth`: determinism, checkpoint layout (k3-architecture.md §1), MXFP4 packing
// (formats-quant.md §3.4), weight scales, config/tokenizer files and the CLI.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <map>
#include <nlohmann/json.hpp>
#include <regex>
#include <set>
#include <string>
#include <vector>

#include "convert/synth.h"
#include "io/safetensors.h"
#include "test_util.h"
#include "util/error.h"

namespace fs = std::filesystem;
using kimi::st::Checkpoint;
using kimi::st::Dtype;
using kimi::test::TempDir;

namespace {

std::string write_tiny(const std::string& dir, uint64_t seed, void (*tweak)(kimi::synth::Config&) = nullptr) {
  auto c = kimi::synth::preset("tiny");
  c.seed = seed;
  if (tweak) tweak(c);
  kimi::synth::WriteOptions o;
  o.quiet = true;
  kimi::synth::write_checkpoint(c, dir, o);
  return dir;
}

std::string bytes_of(const kimi::st::Tensor& t) {
  return std::string(reinterpret_cast<const char*>(t.data), t.nbytes);
}

float bf16(uint16_t h) {
  uint32_t u = uint32_t(h) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

std::vector<double> as_double(const kimi::st::Tensor& t) {
  std::vector<double> v(size_t(t.numel()));
  if (t.dtype == Dtype::BF16) {
    for (size_t i = 0; i < v.size(); ++i) {
      uint16_t h;
      std::memcpy(&h, t.data + 2 * i, 2);
      v[i] = bf16(h);
    }
  } else if (t.dtype == Dtype::F32) {
    for (size_t i = 0; i < v.size(); ++i) {
      float f;
      std::memcpy(&f, t.data + 4 * i, 4);
      v[i] = f;
    }
  } else {
    ADD_FAILURE() << t.name << ": not a float tensor";
  }
  return v;
}

double mean(const std::vector<double>& v) {
  double s = 0;
  for (double x : v) s += x;
  return s / double(v.size());
}
double stdev(const std::vector<double>& v) {
  double m = mean(v), s = 0;
  for (double x : v) s += (x - m) * (x - m);
  return std::sqrt(s / double(v.size()));
}

// E2M1 value of a 4-bit code (formats-quant.md §3.1), written independently of the quantizer.
double e2m1(int code) {
  static const double mag[8] = {0, 0.5, 1, 1.5, 2, 3, 4, 6};
  return (code & 8 ? -1 : 1) * mag[code & 7];
}

// expected tensors of the tiny preset (k3-architecture.md §1.3 with tiny sizes)
std::map<std::string, std::pair<Dtype, std::vector<int64_t>>> expected_tiny(bool indexer, bool mxfp4, int layers) {
  const int64_t d = 64, H = 4, hd = 16, C = H * hd, ql = 32, kvl = 32, nope = 16, rope = 8, v = 16, F = 128;
  const int64_t E = 8, Fm = 32, Lt = 32, HI = 4, DI = 16, V = 1024;
  std::map<std::string, std::pair<Dtype, std::vector<int64_t>>> m;
  const std::string P = "language_model.model.";
  auto bf = [&](const std::string& n, std::vector<int64_t> s) { m[n] = {Dtype::BF16, s}; };
  auto f32 = [&](const std::string& n, std::vector<int64_t> s) { m[n] = {Dtype::F32, s}; };
  bf(P + "embed_tokens.weight", {V, d});
  bf("language_model.lm_head.weight", {V, d});
  bf(P + "norm.weight", {d});
  bf(P + "output_attn_res_norm.weight", {d});
  bf(P + "output_attn_res_proj.weight", {1, d});
  for (int L = 0; L < layers; ++L) {
    std::string p = P + "layers." + std::to_string(L) + ".";
    for (auto n : {"input_layernorm.weight", "post_attention_layernorm.weight", "self_attention_res_norm.weight",
                   "mlp_res_norm.weight"})
      bf(p + n, {d});
    bf(p + "self_attention_res_proj.weight", {1, d});
    bf(p + "mlp_res_proj.weight", {1, d});
    std::string a = p + "self_attn.";
    bool mla = L == 3 || L == 7;  // full_attn_layers [4, 8] are 1-indexed
    if (!mla) {
      for (auto x : {"q", "k", "v"}) {
        bf(a + x + "_proj.weight", {C, d});
        f32(a + x + "_conv1d.weight", {C, 1, 4});
      }
      bf(a + "f_a_proj.weight", {hd, d});
      bf(a + "f_b_proj.weight", {C, hd});
      f32(a + "A_log", {std::max(H, hd)});
      f32(a + "dt_bias", {C});
      bf(a + "b_proj.weight", {H, d});
      bf(a + "g_proj.weight", {C, d});
      f32(a + "o_norm.weight", {hd});
      bf(a + "o_proj.weight", {d, C});
    } else {
      bf(a + "q_a_proj.weight", {ql, d});
      bf(a + "q_a_layernorm.weight", {ql});
      bf(a + "q_b_proj.weight", {H * (nope + rope), ql});
      bf(a + "kv_a_proj_with_mqa.weight", {kvl + rope, d});
      bf(a + "kv_a_layernorm.weight", {kvl});
      bf(a + "kv_b_proj.weight", {H * (nope + v), kvl});
      bf(a + "g_proj.weight", {H * v, d});
      bf(a + "o_proj.weight", {d, H * v});
      if (indexer) {
        bf(a + "indexer.wq_b.weight", {HI * DI, ql});
        bf(a + "indexer.wk.weight", {DI, d});
        bf(a + "indexer.k_norm.weight", {DI});
        bf(a + "indexer.k_norm.bias", {DI});
        bf(a + "indexer.weights_proj.weight", {HI, d});
      }
    }
    if (L == 0) {
      bf(p + "mlp.gate_proj.weight", {F, d});
      bf(p + "mlp.up_proj.weight", {F, d});
      bf(p + "mlp.down_proj.weight", {d, F});
    } else {
      std::string b = p + "block_sparse_moe.";
      bf(b + "gate.weight", {E, d});
      f32(b + "gate.e_score_correction_bias", {E});
      bf(b + "routed_expert_down_proj.weight", {Lt, d});
      bf(b + "routed_expert_norm.weight", {Lt});
      bf(b + "routed_expert_up_proj.weight", {d, Lt});
      bf(b + "shared_experts.gate_proj.weight", {2 * Fm, d});
      bf(b + "shared_experts.up_proj.weight", {2 * Fm, d});
      bf(b + "shared_experts.down_proj.weight", {d, 2 * Fm});
      for (int e = 0; e < E; ++e) {
        std::string x = b + "experts." + std::to_string(e) + ".";
        for (auto w : {"w1", "w2", "w3"}) {
          int64_t out = std::string(w) == "w2" ? Lt : Fm, in = std::string(w) == "w2" ? Fm : Lt;
          if (mxfp4) {
            m[x + w + ".weight_packed"] = {Dtype::U8, {out, in / 2}};
            m[x + w + ".weight_scale"] = {Dtype::U8, {out, in / 32}};
          } else {
            bf(x + w + ".weight", {out, in});
          }
        }
      }
    }
  }
  return m;
}

class SynthTiny : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new TempDir();
    write_tiny(dir_->file("a"), 1);
    write_tiny(dir_->file("bf16"), 1, [](kimi::synth::Config& c) { c.mxfp4_experts = false; });
  }
  static void TearDownTestSuite() { delete dir_; }
  static std::string path(const std::string& n) { return dir_->file(n); }
  static TempDir* dir_;
};
TempDir* SynthTiny::dir_ = nullptr;

}  // namespace

// ------------------------------------------------------------------------------------------------
// determinism

TEST_F(SynthTiny, SameSeedGivesIdenticalFiles) {
  TempDir t;
  std::string b = write_tiny(t.file("b"), 1);
  std::set<std::string> files_a, files_b;
  for (auto& e : fs::directory_iterator(path("a"))) files_a.insert(e.path().filename().string());
  for (auto& e : fs::directory_iterator(b)) files_b.insert(e.path().filename().string());
  EXPECT_EQ(files_a, files_b);
  EXPECT_GE(files_a.size(), 6u);
  for (auto& f : files_a)
    EXPECT_TRUE(kimi::test::read_file(path("a") + "/" + f) == kimi::test::read_file(b + "/" + f)) << f;
  // nothing but the output is left next to it (no temp directory of any name)
  EXPECT_EQ(std::distance(fs::directory_iterator(t.path), fs::directory_iterator()), 1);
}

TEST_F(SynthTiny, DifferentSeedChangesEveryWeightButNotTheVocabulary) {
  TempDir t;
  std::string b = write_tiny(t.file("b"), 2);
  auto ca = Checkpoint::open(path("a")), cb = Checkpoint::open(b);
  ASSERT_EQ(ca->names(), cb->names());
  size_t same = 0;
  for (auto& n : ca->names()) {
    auto& x = ca->get(n);
    auto& y = cb->get(n);
    EXPECT_EQ(x.shape, y.shape) << n;
    if (bytes_of(x) == bytes_of(y)) {
      ++same;
      ADD_FAILURE() << n << " did not change with the seed";
    }
  }
  EXPECT_EQ(same, 0u);
  for (auto f : {"tiktoken.model", "tokenizer_config.json", "config.json"})
    EXPECT_EQ(kimi::test::read_file(path("a") + "/" + f), kimi::test::read_file(b + "/" + f)) << f;
}

TEST_F(SynthTiny, NoIndexerKeepsEveryOtherTensor) {
  TempDir t;
  std::string b = write_tiny(t.file("b"), 1, [](kimi::synth::Config& c) { c.indexer = false; });
  auto ca = Checkpoint::open(path("a")), cb = Checkpoint::open(b);
  std::set<std::string> only_a;
  for (auto& n : ca->names()) {
    if (auto* y = cb->find(n)) EXPECT_TRUE(bytes_of(ca->get(n)) == bytes_of(*y)) << n;
    else only_a.insert(n);
  }
  for (auto& n : cb->names()) EXPECT_TRUE(ca->find(n)) << n << " only without the indexer";
  std::set<std::string> want;
  for (int L : {3, 7})
    for (auto s : {"wq_b.weight", "wk.weight", "k_norm.weight", "k_norm.bias", "weights_proj.weight"})
      want.insert("language_model.model.layers." + std::to_string(L) + ".self_attn.indexer." + s);
  EXPECT_EQ(only_a, want);
  auto cfg = nlohmann::json::parse(kimi::test::read_file(b + "/config.json"));
  EXPECT_FALSE(cfg["text_config"].contains("index_topk"));
  EXPECT_FALSE(cfg["text_config"].contains("index_n_heads"));
  EXPECT_FALSE(cfg["text_config"].contains("index_head_dim"));
}

TEST_F(SynthTiny, FewerLayersAreThePrefixOfTheDeeperModel) {
  TempDir t;
  std::string b = write_tiny(t.file("b"), 1, [](kimi::synth::Config& c) { kimi::synth::set_layers(c, 4); });
  auto ca = Checkpoint::open(path("a")), cb = Checkpoint::open(b);
  std::regex layer_re(R"(language_model\.model\.layers\.(\d+)\.)");
  size_t checked = 0;
  for (auto& n : ca->names()) {
    std::smatch m;
    bool in_b = !std::regex_search(n, m, layer_re) || std::stoi(m[1]) < 4;
    const auto* y = cb->find(n);
    EXPECT_EQ(in_b, y != nullptr) << n;
    if (y) {
      EXPECT_TRUE(bytes_of(ca->get(n)) == bytes_of(*y)) << n;
      ++checked;
    }
  }
  EXPECT_EQ(checked, cb->names().size());
  auto cfg = nlohmann::json::parse(kimi::test::read_file(b + "/config.json"))["text_config"];
  EXPECT_EQ(cfg["num_hidden_layers"], 4);
  EXPECT_EQ(cfg["linear_attn_config"]["full_attn_layers"], nlohmann::json({4}));
  EXPECT_EQ(cfg["linear_attn_config"]["kda_layers"], nlohmann::json({1, 2, 3}));
}

TEST_F(SynthTiny, OutlierChannelsScaleOnlyTheChosenNormChannels) {
  // --outlier-channels 4:30: the six kinds of norm that feed weight matrices get 4 channels x30, the
  // same indices for every norm of one width; every other tensor, and every other channel, unchanged
  TempDir t;
  std::string b = write_tiny(t.file("b"), 1, [](kimi::synth::Config& c) { kimi::synth::set_outlier_channels(c, "4:30"); });
  auto cfg = kimi::synth::preset("tiny");
  cfg.seed = 1;
  kimi::synth::set_outlier_channels(cfg, "4:30");
  auto ca = Checkpoint::open(path("a")), cb = Checkpoint::open(b);
  ASSERT_EQ(ca->names(), cb->names());
  const std::regex norm_re(
      R"(^language_model\.model\.(layers\.\d+\.(input_layernorm|post_attention_layernorm|self_attn\.q_a_layernorm|self_attn\.kv_a_layernorm|block_sparse_moe\.routed_expert_norm)|norm)\.weight$)");
  std::map<int64_t, std::set<int64_t>> seen;  // width -> outlier channels found
  size_t norms = 0;
  for (auto& n : ca->names()) {
    auto& x = ca->get(n);
    auto& y = cb->get(n);
    if (!std::regex_match(n, norm_re)) {
      EXPECT_TRUE(bytes_of(x) == bytes_of(y)) << n << " changed";
      continue;
    }
    ++norms;
    const auto va = as_double(x), vb = as_double(y);
    std::set<int64_t> diff;
    for (size_t i = 0; i < va.size(); ++i) {
      if (va[i] == vb[i]) continue;
      diff.insert(int64_t(i));
      // both sides rounded to BF16 (8 significant bits): within two roundings of x30
      EXPECT_NEAR(vb[i] / va[i], 30.0, 30.0 * 2 * 0x1.0p-8) << n << " channel " << i;
    }
    EXPECT_EQ(diff.size(), 4u) << n;
    const int64_t w = int64_t(va.size());
    auto want = kimi::synth::outlier_channel_indices(cfg, w);
    EXPECT_EQ(std::set<int64_t>(want.begin(), want.end()), diff) << n;
    if (seen.count(w)) {
      EXPECT_EQ(seen[w], diff) << n << ": other channels than the other norms of width " << w;
    }
    seen[w] = diff;
  }
  // 8 layers x input/post-attention, 2 MLA layers x q_a/kv_a, 7 MoE layers x routed_expert_norm, final norm
  EXPECT_EQ(norms, 8u * 2 + 2 * 2 + 7 + 1);
  // another seed picks other channels
  auto c2 = cfg;
  c2.seed = 2;
  EXPECT_NE(kimi::synth::outlier_channel_indices(c2, cfg.hidden), kimi::synth::outlier_channel_indices(cfg, cfg.hidden));
  EXPECT_TRUE(kimi::synth::outlier_channel_indices(kimi::synth::preset("tiny"), 64).empty());  // off by default
}

TEST(Synth, OutlierChannelsOption) {
  auto c = kimi::synth::preset("tiny");
  kimi::synth::set_outlier_channels(c, "8");
  EXPECT_EQ(c.outlier_channels, 8);
  EXPECT_EQ(c.outlier_scale, 20.0f);
  kimi::synth::set_outlier_channels(c, "3:12.5");
  EXPECT_EQ(c.outlier_channels, 3);
  EXPECT_EQ(c.outlier_scale, 12.5f);
  for (const char* bad : {"", "0", "-1", "x", "4:", "4:0", "4:-2", "4:abc", "4:30x", ":30", "4:30:2", "1e3",
                          "4:nan", "4:inf", "100000"}) {
    EXPECT_THROW(kimi::synth::set_outlier_channels(c, bad), kimi::Error) << bad;
  }
  EXPECT_EQ(c.outlier_channels, 3);  // unchanged by the refused values
  auto r = kimi::test::run_kimi("synth --preset tiny --outlier-channels 4:x -o /nonexistent/x");
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.out.find("expected N or N:SCALE"), std::string::npos) << r.out;
}

TEST(Synth, ExpertCountOverride) {
  auto c = kimi::synth::preset("tiny");
  kimi::synth::set_experts(c, 1);
  EXPECT_EQ(c.experts, 1);
  EXPECT_EQ(c.top_k, 1);
  EXPECT_THROW(kimi::synth::set_experts(c, 0), kimi::Error);
  EXPECT_THROW(kimi::synth::set_layers(c, 0), kimi::Error);
  EXPECT_THROW(kimi::synth::preset("huge"), kimi::Error);
  kimi::synth::set_experts(c, 3);
  size_t packed = 0;
  for (auto& t : kimi::synth::tensor_list(c)) {
    if (t.name.find("e_score_correction_bias") != std::string::npos) {
      EXPECT_EQ(t.shape, std::vector<int64_t>{3});
    }
    if (t.name.find("weight_packed") != std::string::npos) ++packed;
  }
  EXPECT_EQ(packed, 7u * 3 * 3);  // 7 MoE layers x 3 experts x w1/w2/w3
}

// ------------------------------------------------------------------------------------------------
// layout

TEST_F(SynthTiny, LayoutMatchesTheSpec) {
  for (bool mxfp4 : {true, false}) {
    auto ck = Checkpoint::open(path(mxfp4 ? "a" : "bf16"));
    auto want = expected_tiny(true, mxfp4, 8);
    std::set<std::string> seen;
    size_t vision = 0, projector = 0;
    for (auto& n : ck->names()) {
      const auto& t = ck->get(n);
      if (n.rfind("vision_tower.", 0) == 0 || n.rfind("mm_projector.", 0) == 0) {
        (n[0] == 'v' ? vision : projector)++;
        EXPECT_EQ(t.dtype, Dtype::BF16) << n;
        continue;
      }
      auto it = want.find(n);
      if (it == want.end()) {
        ADD_FAILURE() << "unexpected tensor " << n;
        continue;
      }
      seen.insert(n);
      EXPECT_EQ(t.dtype, it->second.first) << n;
      EXPECT_EQ(t.shape, it->second.second) << n << " " << t.shape_string();
    }
    EXPECT_EQ(seen.size(), want.size());
    EXPECT_GE(vision, 2u);
    EXPECT_GE(projector, 1u);
    // the library's own list agrees with the files
    auto cfg = kimi::synth::preset("tiny");
    cfg.mxfp4_experts = mxfp4;
    EXPECT_EQ(kimi::synth::tensor_list(cfg).size(), ck->names().size());
  }
}

TEST_F(SynthTiny, IndexerOnlyInFullAttentionLayers) {
  auto ck = Checkpoint::open(path("a"));
  std::set<std::string> layers;
  std::regex re(R"(layers\.(\d+)\.self_attn\.indexer\.)");
  for (auto& n : ck->names()) {
    std::smatch m;
    if (std::regex_search(n, m, re)) layers.insert(m[1]);
  }
  EXPECT_EQ(layers, (std::set<std::string>{"3", "7"}));
}

TEST_F(SynthTiny, ShardsAndIndexAreConsistent) {
  auto idx = nlohmann::json::parse(kimi::test::read_file(path("a") + "/model.safetensors.index.json"));
  auto ck = Checkpoint::open(path("a"));
  std::set<std::string> shards;
  std::regex name_re(R"(model-(\d{5})-of-(\d{5})\.safetensors)");
  uint64_t total = 0;
  ASSERT_TRUE(idx["weight_map"].is_object());
  EXPECT_EQ(idx["weight_map"].size(), ck->names().size());
  for (auto& [n, f] : idx["weight_map"].items()) {
    std::string file = f.get<std::string>();
    EXPECT_TRUE(std::regex_match(file, name_re)) << file;
    shards.insert(file);
    const auto& t = ck->get(n);
    EXPECT_EQ(fs::path(t.file).filename().string(), file) << n;
    total += t.nbytes;
  }
  EXPECT_GE(shards.size(), 2u);
  for (auto& s : shards) {
    std::smatch m;
    ASSERT_TRUE(std::regex_match(s, m, name_re));
    EXPECT_EQ(std::stoul(m[2]), shards.size());
    EXPECT_TRUE(fs::exists(path("a") + "/" + s));
  }
  EXPECT_EQ(idx["metadata"]["total_size"].get<uint64_t>(), total);
}

TEST_F(SynthTiny, ConfigJson) {
  auto root = nlohmann::json::parse(kimi::test::read_file(path("a") + "/config.json"));
  EXPECT_EQ(root["architectures"], nlohmann::json({"KimiK3ForConditionalGeneration"}));
  EXPECT_EQ(root["model_type"], "kimi_k3");
  EXPECT_TRUE(root["vision_config"].is_object());
  EXPECT_EQ(root["media_placeholder_token_id"], 1024 - 256 + 21);
  const auto& t = root["text_config"];
  EXPECT_EQ(t["model_type"], "kimi_linear");
  EXPECT_EQ(t["architectures"], nlohmann::json({"KimiLinearForCausalLM"}));
  std::map<std::string, nlohmann::json> want = {
      {"num_hidden_layers", 8}, {"hidden_size", 64}, {"vocab_size", 1024}, {"num_attention_heads", 4},
      {"num_key_value_heads", 4}, {"intermediate_size", 128}, {"max_position_embeddings", 4096},
      {"rms_norm_eps", 1e-5}, {"hidden_act", "situ"}, {"activation_situ_beta", 4.0},
      {"activation_situ_linear_beta", 25.0}, {"attn_res_block_size", 3}, {"q_lora_rank", 32},
      {"kv_lora_rank", 32}, {"qk_nope_head_dim", 16}, {"qk_rope_head_dim", 8}, {"v_head_dim", 16},
      {"mla_use_nope", true}, {"mla_use_output_gate", true}, {"num_experts", 8}, {"num_experts_per_token", 2},
      {"num_shared_experts", 2}, {"moe_intermediate_size", 32}, {"routed_expert_hidden_size", 32},
      {"latent_moe_use_norm", true}, {"first_k_dense_replace", 1}, {"moe_layer_freq", 1},
      {"routed_scaling_factor", 2.5}, {"moe_renormalize", true}, {"moe_router_activation_func", "sigmoid"},
      {"use_grouped_topk", true}, {"topk_method", "noaux_tc"}, {"num_expert_group", 1}, {"topk_group", 1},
      {"tie_word_embeddings", false}, {"num_nextn_predict_layers", 0}, {"bos_token_id", 768},
      {"eos_token_id", 770}, {"pad_token_id", 1023}, {"index_n_heads", 4}, {"index_head_dim", 16},
      {"index_topk", 16}};
  for (auto& [k, v] : want) EXPECT_EQ(t.value(k, nlohmann::json()), v) << k;
  const auto& lin = t["linear_attn_config"];
  EXPECT_EQ(lin["full_attn_layers"], nlohmann::json({4, 8}));
  EXPECT_EQ(lin["kda_layers"], nlohmann::json({1, 2, 3, 5, 6, 7}));
  EXPECT_EQ(lin["head_dim"], 16);
  EXPECT_EQ(lin["num_heads"], 4);
  EXPECT_EQ(lin["short_conv_kernel_size"], 4);
  EXPECT_EQ(lin["gate_lower_bound"], -5.0);
  const auto& q = root["quantization_config"];
  EXPECT_EQ(q["quant_method"], "compressed-tensors");
  EXPECT_EQ(q["format"], "mxfp4-pack-quantized");
  ASSERT_TRUE(q["config_groups"].is_object());
  const auto& g = q["config_groups"].begin().value();
  EXPECT_EQ(g["targets"], nlohmann::json({"Linear"}));
  EXPECT_EQ(g["weights"]["num_bits"], 4);
  EXPECT_EQ(g["weights"]["type"], "float");
  EXPECT_EQ(g["weights"]["group_size"], 32);
  EXPECT_EQ(g["weights"]["strategy"], "group");
  EXPECT_EQ(g["weights"]["symmetric"], true);
  EXPECT_EQ(g["weights"]["scale_dtype"], "uint8");
  EXPECT_TRUE(q["ignore"].is_array() && !q["ignore"].empty());

  auto rb = nlohmann::json::parse(kimi::test::read_file(path("bf16") + "/config.json"));
  EXPECT_FALSE(rb.contains("quantization_config"));
  EXPECT_FALSE(rb["text_config"].contains("quantization_config"));
}

TEST_F(SynthTiny, TokenizerFiles) {
  auto tc = nlohmann::json::parse(kimi::test::read_file(path("a") + "/tokenizer_config.json"));
  EXPECT_EQ(tc["bos_token"], "[BOS]");
  EXPECT_EQ(tc["eos_token"], "[EOS]");
  EXPECT_FALSE(tc.contains("add_bos_token"));
  const auto& add = tc["added_tokens_decoder"];
  ASSERT_EQ(add.size(), 256u);
  std::map<int, std::string> named = {{0, "[BOS]"}, {1, "[EOS]"}, {2, "<|end_of_msg|>"}, {3, "<|open|>"},
                                      {4, "<|close|>"}, {5, "<|sep|>"}, {6, "[start_header_id]"},
                                      {7, "[end_header_id]"}, {9, "[EOT]"}, {18, "<|media_begin|>"},
                                      {19, "<|media_content|>"}, {20, "<|media_end|>"}, {21, "<|media_pad|>"},
                                      {254, "[UNK]"}, {255, "[PAD]"}};
  for (int off = 0; off < 256; ++off) {
    int id = 768 + off;
    const auto& e = add[std::to_string(id)];
    std::string want = named.count(off) ? named[off] : "<|reserved_token_" + std::to_string(id) + "|>";
    EXPECT_EQ(e["content"], want) << id;
    EXPECT_EQ(e["special"], true) << id;
  }
  // tiktoken.model: V-256 base tokens, ranks 0..V-257 in order, the first 256 the single bytes
  std::string tk = kimi::test::read_file(path("a") + "/tiktoken.model");
  size_t lines = 0, pos = 0;
  while (pos < tk.size()) {
    size_t nl = tk.find('\n', pos);
    ASSERT_NE(nl, std::string::npos);
    std::string l = tk.substr(pos, nl - pos);
    EXPECT_EQ(l.substr(l.find(' ') + 1), std::to_string(lines));
    pos = nl + 1;
    ++lines;
  }
  EXPECT_EQ(lines, 768u);
  EXPECT_EQ(tk.substr(0, 7), "AA== 0\n");
  EXPECT_NE(tk.find("\nQQ== 65\n"), std::string::npos);  // 'A'
}

// ------------------------------------------------------------------------------------------------
// MXFP4

TEST(SynthMxfp4, QuantizesTheSpecExample) {
  // formats-quant.md §3.7: codes 0..15 then 15..0 with scale 2^-1 (E8M0 0x7E)
  float x[32];
  for (int i = 0; i < 16; ++i) x[i] = float(0.5 * e2m1(i));
  for (int i = 0; i < 16; ++i) x[16 + i] = float(0.5 * e2m1(15 - i));
  uint8_t packed[16], scale[1];
  kimi::synth::mxfp4_quantize_row(x, 32, packed, scale);
  EXPECT_EQ(scale[0], 0x7E);
  // the spec's bytes, except that -0 (code 8, elements 8 and 23) is written as +0 (code 0)
  const uint8_t want[16] = {0x10, 0x32, 0x54, 0x76, 0x90, 0xBA, 0xDC, 0xFE,
                            0xEF, 0xCD, 0xAB, 0x09, 0x67, 0x45, 0x23, 0x01};
  for (int i = 0; i < 16; ++i) EXPECT_EQ(packed[i], want[i]) << "byte " << i;
  EXPECT_THROW(kimi::synth::mxfp4_quantize_row(x, 31, packed, scale), kimi::Error);
}

TEST(SynthMxfp4, ScaleIsTheSmallestNonClippingPowerOfTwo) {
  float x[64];
  for (int i = 0; i < 64; ++i) x[i] = 0.01f * float((i * 37) % 23 - 11);
  x[5] = 2.7f;    // block 0: amax 2.7 -> 2^-1 (6 * 0.5 = 3 >= 2.7 > 1.5)
  x[40] = -3.1f;  // block 1: amax 3.1 -> 2^0
  uint8_t packed[32], scale[2];
  kimi::synth::mxfp4_quantize_row(x, 64, packed, scale);
  EXPECT_EQ(scale[0], 126);
  EXPECT_EQ(scale[1], 127);
  // 3.1 / 1 rounds to 3 (code 5), sign bit set; element 40 = block 1 element 8 = low nibble of byte 16+4
  EXPECT_EQ(packed[16 + 4] & 0xF, 0x8 | 5);
  // 2.7 / 0.5 = 5.4 rounds to 6 (code 7); element 5 = high nibble of byte 2
  EXPECT_EQ(packed[2] >> 4, 7);
}

TEST_F(SynthTiny, PackedExpertsDecodeToTheirFloatWeights) {
  auto q = Checkpoint::open(path("a")), b = Checkpoint::open(path("bf16"));
  auto cfg = kimi::synth::preset("tiny");
  cfg.seed = 1;
  size_t groups = 0;
  for (int L : {1, 4, 7})
    for (int e : {0, 5, 7})
      for (std::string w : {"w1", "w2", "w3"}) {
        std::string base = "language_model.model.layers." + std::to_string(L) + ".block_sparse_moe.experts." +
                           std::to_string(e) + "." + w;
        const auto& pk = q->get(base + ".weight_packed");
        const auto& sc = q->get(base + ".weight_scale");
        auto ref16 = as_double(b->get(base + ".weight"));  // the --bf16-experts file
        auto ref = kimi::synth::tensor_values(cfg, base + ".weight");
        const int64_t rows = pk.shape[0], cols = pk.shape[1] * 2;
        ASSERT_EQ(int64_t(ref.size()), rows * cols);
        double err2 = 0, ref2 = 0;
        for (int64_t r = 0; r < rows; ++r)
          for (int64_t g = 0; g < cols / 32; ++g) {
            const double s = std::ldexp(1.0, int(sc.data[r * (cols / 32) + g]) - 127);
            double amax = 0;
            for (int k = 0; k < 32; ++k) {
              const int64_t i = r * cols + g * 32 + k;
              const uint8_t byte = pk.data[i / 2];
              const double dec = e2m1(i % 2 ? byte >> 4 : byte & 15) * s;
              // round to nearest: within half the widest E2M1 step (2 units -> 1 unit of scale)
              EXPECT_LE(std::fabs(dec - ref[i]), s * 1.0 + 1e-12) << base << " " << i;
              EXPECT_LE(std::fabs(dec - ref16[i]), s * 1.0 + std::fabs(ref16[i]) * 0x1p-8) << base << " " << i;
              EXPECT_NEAR(ref16[i], ref[i], std::fabs(ref[i]) * 0x1p-8 + 1e-30);
              err2 += (dec - ref[i]) * (dec - ref[i]);
              ref2 += ref[i] * ref[i];
              amax = std::max(amax, std::fabs(double(ref[i])));
            }
            EXPECT_GE(6 * s, amax);     // nothing clipped
            EXPECT_LT(3 * s, amax);     // and the smallest such power of two
            ++groups;
          }
        EXPECT_LT(std::sqrt(err2 / ref2), 0.15) << base;  // MXFP4 keeps ~10% relative RMS
      }
  EXPECT_GT(groups, 100u);
}

// ------------------------------------------------------------------------------------------------
// weight scales (k3-architecture.md §3: activations O(1), non-degenerate logits and routing)

TEST_F(SynthTiny, WeightScales) {
  auto ck = Checkpoint::open(path("bf16"));
  const double d = 64;
  auto ends = [](const std::string& s, const std::string& suf) {
    return s.size() >= suf.size() && s.compare(s.size() - suf.size(), suf.size(), suf) == 0;
  };
  size_t matrices = 0;
  for (auto& n : ck->names()) {
    if (n.rfind("language_model.", 0) != 0) continue;
    const auto& t = ck->get(n);
    auto v = as_double(t);
    const double sd = stdev(v), n_el = double(v.size());
    if (ends(n, "norm.weight") || ends(n, "layernorm.weight")) {
      EXPECT_NEAR(mean(v), 1.0, 0.1) << n;
      for (double x : v) EXPECT_TRUE(x > 0.5 && x < 1.5) << n;
    } else if (ends(n, "A_log")) {
      for (double x : v) EXPECT_TRUE(std::exp(x) >= 0.5 - 1e-6 && std::exp(x) <= 2.0 + 1e-6) << n;
      EXPECT_GT(sd, 0.1) << n;
    } else if (ends(n, "dt_bias")) {
      EXPECT_NEAR(sd, 0.5, 0.15) << n;
    } else if (ends(n, "_conv1d.weight")) {
      // the last tap (current token) ~1, the three older taps ~0, all with noise ~0.3
      const int64_t K = t.shape[2];
      ASSERT_EQ(K, 4);
      std::vector<double> cur, old;
      for (size_t i = 0; i < v.size(); ++i) (int64_t(i) % K == K - 1 ? cur : old).push_back(v[i]);
      EXPECT_NEAR(mean(cur), 1.0, 0.1) << n;
      EXPECT_NEAR(mean(old), 0.0, 0.1) << n;
      EXPECT_NEAR(stdev(old), 0.3, 0.08) << n;
    } else if (ends(n, "e_score_correction_bias")) {
      std::vector<double> s = v;
      std::sort(s.begin(), s.end());
      for (size_t i = 1; i < s.size(); ++i) EXPECT_GT(s[i] - s[i - 1], 0.05) << n;  // wide, distinct
      EXPECT_GT(s.back() - s.front(), 0.5) << n;
    } else if (ends(n, "k_norm.bias")) {
      EXPECT_LT(sd, 0.3) << n;
    } else if (ends(n, "weights_proj.weight")) {
      // per-head weights sum to ~0 over the heads: positive and negative heads for every query
      const int64_t rows = t.shape[0], cols = t.shape[1];
      for (int64_t j = 0; j < cols; ++j) {
        double s = 0, a = 0;
        for (int64_t r = 0; r < rows; ++r) s += v[r * cols + j], a += std::fabs(v[r * cols + j]);
        EXPECT_LT(std::fabs(s), 0.05 * a + 1e-6) << n << " column " << j;
      }
      EXPECT_GT(sd * std::sqrt(d), 0.5) << n;
    } else if (t.shape.size() == 2 && t.shape[0] == 1) {  // res_proj [1, d]
      EXPECT_NEAR(sd * std::sqrt(d), 1.0, 0.35) << n;
    } else if (t.shape.size() == 2) {
      const double in = double(t.shape[1]);
      double want = 1.0;
      if (ends(n, "embed_tokens.weight")) want = std::sqrt(in);  // std 1
      if (ends(n, "lm_head.weight")) want = 2.0;                 // logits std ~2
      if (ends(n, "v_proj.weight")) want = 3.0;                  // large KDA values
      const double tol = 5.0 / std::sqrt(2 * n_el) + 0.03;
      EXPECT_NEAR(sd * std::sqrt(in) / want, 1.0, tol) << n;
      EXPECT_NEAR(mean(v), 0.0, 5 * sd / std::sqrt(n_el)) << n;
      ++matrices;
    }
  }
  EXPECT_GT(matrices, 100u);
}

TEST_F(SynthTiny, ExpertsAreCorrelatedAndRoutingIsNotDegenerate) {
  auto ck = Checkpoint::open(path("bf16"));
  const std::string P = "language_model.model.layers.2.block_sparse_moe.";
  auto e0 = as_double(ck->get(P + "experts.0.w1.weight")), e1 = as_double(ck->get(P + "experts.1.w1.weight"));
  double s01 = 0, s00 = 0, s11 = 0;
  for (size_t i = 0; i < e0.size(); ++i) s01 += e0[i] * e1[i], s00 += e0[i] * e0[i], s11 += e1[i] * e1[i];
  const double corr = s01 / std::sqrt(s00 * s11);
  EXPECT_GT(corr, 0.8);
  EXPECT_LT(corr, 0.97);

  // logits and router outputs for RMS-normalised embeddings (the scale every layer sees)
  auto emb = as_double(ck->get("language_model.model.embed_tokens.weight"));
  auto head = as_double(ck->get("language_model.lm_head.weight"));
  auto router = as_double(ck->get(P + "gate.weight"));
  auto bias = as_double(ck->get(P + "gate.e_score_correction_bias"));
  const int d = 64, V = 1024, E = 8, K = 2;
  std::set<std::vector<int>> choices;
  for (int tok = 0; tok < 64; ++tok) {
    std::vector<double> x(emb.begin() + tok * d, emb.begin() + (tok + 1) * d);
    double ms = 0;
    for (double a : x) ms += a * a;
    for (double& a : x) a /= std::sqrt(ms / d + 1e-5);
    std::vector<double> logits(V);
    for (int r = 0; r < V; ++r)
      for (int j = 0; j < d; ++j) logits[r] += head[size_t(r) * d + j] * x[j];
    const double ls = stdev(logits);
    EXPECT_GT(ls, 1.0) << tok;
    EXPECT_LT(ls, 3.0) << tok;
    std::vector<std::pair<double, int>> sel(E);
    for (int e = 0; e < E; ++e) {
      double l = 0;
      for (int j = 0; j < d; ++j) l += router[size_t(e) * d + j] * x[j];
      sel[e] = {1.0 / (1.0 + std::exp(-l)) + bias[e], e};
    }
    std::sort(sel.rbegin(), sel.rend());
    std::vector<int> top;
    for (int k = 0; k < K; ++k) top.push_back(sel[k].second);
    std::sort(top.begin(), top.end());
    choices.insert(top);
  }
  EXPECT_GE(choices.size(), 3u);  // routing depends on the token, not only on the bias
}

// ------------------------------------------------------------------------------------------------
// CLI

TEST(SynthCli, WritesSummaryAndRefusesToOverwrite) {
  TempDir t;
  std::string out = t.file("m");
  auto r = kimi::test::run_kimi("synth --preset tiny --seed 3 -o " + out);
  ASSERT_EQ(r.exit_code, 0) << r.out;
  EXPECT_NE(r.out.find("tensors"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("parameters"), std::string::npos) << r.out;
  EXPECT_TRUE(fs::exists(out + "/config.json"));
  EXPECT_EQ(std::distance(fs::directory_iterator(t.path), fs::directory_iterator()), 1);  // no temp left
  std::string before = kimi::test::read_file(out + "/model.safetensors.index.json");

  r = kimi::test::run_kimi("synth --preset tiny --seed 4 -o " + out);
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.out.find("--force"), std::string::npos) << r.out;
  EXPECT_EQ(kimi::test::read_file(out + "/model.safetensors.index.json"), before);  // untouched

  r = kimi::test::run_kimi("synth --preset tiny --seed 4 --layers 4 --no-indexer --bf16-experts --force -q -o " + out);
  ASSERT_EQ(r.exit_code, 0) << r.out;
  auto cfg = nlohmann::json::parse(kimi::test::read_file(out + "/config.json"));
  EXPECT_EQ(cfg["text_config"]["num_hidden_layers"], 4);
  EXPECT_FALSE(cfg.contains("quantization_config"));
  EXPECT_FALSE(cfg["text_config"].contains("index_topk"));

  r = kimi::test::run_kimi("synth --preset nope -o " + t.file("x"));
  EXPECT_NE(r.exit_code, 0);
  EXPECT_FALSE(fs::exists(t.file("x")));
}

TEST(SynthCli, FixtureMatchesTheLibrary) {
  // the shared test fixture (kimi synth via the CLI) equals a library-written checkpoint
  std::string fix = kimi::test::tiny_hf(1);
  TempDir t;
  std::string lib = write_tiny(t.file("m"), 1);
  auto a = Checkpoint::open(fix), b = Checkpoint::open(lib);
  ASSERT_EQ(a->names(), b->names());
  for (auto& n : a->names()) EXPECT_TRUE(bytes_of(a->get(n)) == bytes_of(b->get(n))) << n;
}
