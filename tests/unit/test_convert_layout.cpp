// The converted tiny model checked by hand against k3-architecture.md §2.2/§2.3 and the spec
// decisions (docs/spec/README.md): every metadata value (computed here from the tiny preset's numbers), tensor names,
// types and shapes, and the transformed tensors' values re-computed from the safetensors with
// the index formulas written out in this test.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <map>
#include <set>
#include <string>

#include "io/gguf.h"
#include "io/safetensors.h"
#include "test_util.h"

using kimi::GgmlType;

namespace {

// tiny preset (docs/spec/README.md, synthetic checkpoints)
constexpr int64_t V = 1024, D = 64, NL = 8, H = 4, KDA = 16, QL = 32, KVL = 32, NOPE = 16, ROPE = 8, VD = 16;
constexpr int64_t FF = 128, NE = 8, MF = 32, LAT = 32, IH = 4, ID = 16;

float bf16(const uint8_t* p, int64_t i) {
  uint16_t h;
  std::memcpy(&h, p + 2 * i, 2);
  uint32_t u = static_cast<uint32_t>(h) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
float f32(const uint8_t* p, int64_t i) {
  float f;
  std::memcpy(&f, p + 4 * i, 4);
  return f;
}
float src_val(const kimi::st::Tensor& t, int64_t i) {
  if (t.dtype == kimi::st::Dtype::BF16) return bf16(t.data, i);
  if (t.dtype == kimi::st::Dtype::F32) return f32(t.data, i);
  ADD_FAILURE() << t.name << " unexpected dtype";
  return 0;
}

struct Fixture {
  std::unique_ptr<kimi::gguf::Reader> g;
  std::unique_ptr<kimi::st::Checkpoint> ck;
  const kimi::st::Tensor& src(const std::string& n) { return ck->get("language_model." + n); }
};

void expect_tensor(const kimi::gguf::Reader& g, const std::string& name, GgmlType type, std::vector<int64_t> ne) {
  const auto* t = g.find_tensor(name);
  ASSERT_NE(t, nullptr) << name << " missing";
  EXPECT_EQ(t->type, type) << name << ": " << kimi::type_name(t->type);
  std::array<int64_t, 4> want{1, 1, 1, 1};
  for (size_t i = 0; i < ne.size(); ++i) want[i] = ne[i];
  EXPECT_EQ(t->ne, want) << name << ": " << t->shape_string();
}

}  // namespace

TEST(ConvertLayout, Metadata) {
  auto g = kimi::gguf::Reader::open(kimi::test::tiny_gguf());
  ASSERT_FALSE(g->kvs().empty());
  EXPECT_EQ(g->kvs()[0].key, "general.architecture");
  EXPECT_EQ(g->get_str("general.architecture"), "kimi-k3");
  EXPECT_EQ(g->get_str("general.type"), "model");
  EXPECT_EQ(g->get_u32("general.file_type"), 38u);
  EXPECT_EQ(g->get_u32("general.quantization_version"), 2u);
  const std::map<std::string, uint32_t> u32s = {
      {"block_count", NL}, {"context_length", 4096}, {"embedding_length", D}, {"feed_forward_length", FF},
      {"vocab_size", V}, {"attention.head_count", H}, {"attention.q_lora_rank", QL}, {"attention.kv_lora_rank", KVL},
      {"attention.key_length", KVL + ROPE}, {"attention.value_length", KVL}, {"attention.key_length_mla", NOPE + ROPE},
      {"attention.value_length_mla", VD}, {"rope.dimension_count", ROPE}, {"ssm.conv_kernel", 4}, {"kda.head_dim", KDA},
      {"expert_count", NE}, {"expert_used_count", 2}, {"expert_shared_count", 2}, {"expert_feed_forward_length", MF},
      {"expert_latent_length", LAT}, {"leading_dense_block_count", 1}, {"expert_gating_func", 2},
      {"attn_res.block_size", 3}, {"attention.indexer.head_count", IH}, {"attention.indexer.key_length", ID},
      {"attention.indexer.top_k", 16}};
  for (auto& [k, v] : u32s) {
    const auto* val = g->find("kimi-k3." + k);
    ASSERT_NE(val, nullptr) << k;
    EXPECT_EQ(val->type, kimi::gguf::ValueType::UINT32) << k;
    EXPECT_EQ(g->get_u32("kimi-k3." + k), v) << k;
  }
  EXPECT_EQ(g->get_f32("kimi-k3.attention.layer_norm_rms_epsilon"), 1e-5f);
  EXPECT_EQ(g->get_f32("kimi-k3.kda.gate_lower_bound"), -5.0f);
  EXPECT_EQ(g->get_f32("kimi-k3.expert_weights_scale"), 2.5f);
  EXPECT_EQ(g->get_f32("kimi-k3.activation.situ_beta"), 4.0f);
  EXPECT_EQ(g->get_f32("kimi-k3.activation.situ_linear_beta"), 25.0f);
  EXPECT_TRUE(g->get_bool("kimi-k3.expert_weights_norm"));
  const auto* hkv = g->find("kimi-k3.attention.head_count_kv");
  ASSERT_NE(hkv, nullptr);
  EXPECT_EQ(hkv->elem_type, kimi::gguf::ValueType::INT32);
  EXPECT_EQ(g->get_int_array("kimi-k3.attention.head_count_kv"), (std::vector<int64_t>{0, 0, 0, 1, 0, 0, 0, 1}));
}

TEST(ConvertLayout, Tokenizer) {
  auto g = kimi::gguf::Reader::open(kimi::test::tiny_gguf());
  EXPECT_EQ(g->get_str("tokenizer.ggml.model"), "gpt2");
  EXPECT_EQ(g->get_str("tokenizer.ggml.pre"), "kimi-k2");
  const auto& tok = g->get_str_array("tokenizer.ggml.tokens");
  auto ty = g->get_int_array("tokenizer.ggml.token_type");
  ASSERT_EQ(tok.size(), static_cast<size_t>(V));
  ASSERT_EQ(ty.size(), static_cast<size_t>(V));
  // ranks 0..255 are the single bytes in byte order, GPT-2 mapped
  EXPECT_EQ(tok['A'], "A");
  EXPECT_EQ(tok[' '], "\xC4\xA0");  // Ġ
  EXPECT_EQ(tok['\n'], "\xC4\x8A");  // Ċ
  EXPECT_EQ(tok[0xE9], "\xC3\xA9");  // é maps to itself (Latin-1 printable)
  // specials at V-256+off
  const std::map<int64_t, std::string> sp = {{0, "[BOS]"}, {1, "[EOS]"}, {2, "<|end_of_msg|>"}, {3, "<|open|>"},
                                             {4, "<|close|>"}, {5, "<|sep|>"}, {9, "[EOT]"}, {18, "<|media_begin|>"},
                                             {254, "[UNK]"}, {255, "[PAD]"}, {100, "<|reserved_token_868|>"}};
  for (auto& [off, s] : sp) EXPECT_EQ(tok[V - 256 + off], s) << off;
  for (int64_t i = 0; i < V; ++i) EXPECT_EQ(ty[i], i < V - 256 ? 1 : 3) << i;
  EXPECT_EQ(g->get_u32("tokenizer.ggml.bos_token_id"), V - 256);
  EXPECT_EQ(g->get_u32("tokenizer.ggml.eos_token_id"), V - 254);
  EXPECT_EQ(g->get_u32("tokenizer.ggml.padding_token_id"), V - 1);
  EXPECT_FALSE(g->has("tokenizer.ggml.add_bos_token"));
  EXPECT_FALSE(g->has("tokenizer.chat_template"));
  // merges: "A B" with A+B = a token, in increasing rank of the merged token
  const auto& m = g->get_str_array("tokenizer.ggml.merges");
  ASSERT_GT(m.size(), 100u);
  ASSERT_LE(m.size(), static_cast<size_t>(V - 256 - 256));
  std::map<std::string, int64_t> rank;
  for (int64_t i = 0; i < V - 256; ++i) rank[tok[i]] = i;
  int64_t prev = -1;
  for (const auto& line : m) {
    size_t sp1 = line.find(' ');
    ASSERT_NE(sp1, std::string::npos) << line;
    ASSERT_EQ(line.find(' ', sp1 + 1), std::string::npos) << line;
    std::string a = line.substr(0, sp1), b = line.substr(sp1 + 1);
    ASSERT_TRUE(rank.count(a) && rank.count(b) && rank.count(a + b)) << line;
    EXPECT_LT(rank[a], rank[a + b]);
    EXPECT_LT(rank[b], rank[a + b]);
    EXPECT_GT(rank[a + b], prev) << line;
    prev = rank[a + b];
  }
}

TEST(ConvertLayout, TensorNamesTypesShapes) {
  auto g = kimi::gguf::Reader::open(kimi::test::tiny_gguf());
  EXPECT_EQ(g->tensors().size(), 228u);
  const auto B = GgmlType::BF16, F = GgmlType::F32, M = GgmlType::MXFP4;
  expect_tensor(*g, "token_embd.weight", B, {D, V});
  expect_tensor(*g, "output.weight", B, {D, V});
  expect_tensor(*g, "output_norm.weight", F, {D});
  expect_tensor(*g, "output_res_score.weight", F, {D});
  for (int il = 0; il < NL; ++il) {
    const std::string b = "blk." + std::to_string(il) + ".";
    const bool mla = il == 3 || il == 7;
    expect_tensor(*g, b + "attn_norm.weight", F, {D});
    expect_tensor(*g, b + "ffn_norm.weight", F, {D});
    expect_tensor(*g, b + "attn_res_score.weight", F, {D});
    expect_tensor(*g, b + "ffn_res_score.weight", F, {D});
    if (!mla) {
      for (const char* x : {"q", "k", "v"}) {
        expect_tensor(*g, b + "attn_" + x + ".weight", B, {D, H * KDA});
        expect_tensor(*g, b + "ssm_conv1d_" + x + ".weight", F, {4, 1, H * KDA, 1});
        EXPECT_EQ(g->tensor(b + "ssm_conv1d_" + x + ".weight").n_dims, 4u);
      }
      expect_tensor(*g, b + "ssm_f_a.weight", B, {D, KDA});
      expect_tensor(*g, b + "ssm_f_b.weight", B, {KDA, H * KDA});
      expect_tensor(*g, b + "ssm_beta.weight", B, {D, H});
      expect_tensor(*g, b + "ssm_a", F, {H});
      expect_tensor(*g, b + "ssm_dt.bias", F, {H * KDA});
      expect_tensor(*g, b + "ssm_g.weight", B, {D, H * KDA});
      expect_tensor(*g, b + "ssm_norm.weight", F, {KDA});
      EXPECT_EQ(g->find_tensor(b + "attn_gate.weight"), nullptr);
      EXPECT_EQ(g->find_tensor(b + "indexer.proj.weight"), nullptr);
    } else {
      expect_tensor(*g, b + "attn_q_a.weight", B, {D, QL});
      expect_tensor(*g, b + "attn_q_a_norm.weight", F, {QL});
      expect_tensor(*g, b + "attn_q_b.weight", B, {QL, H * (NOPE + ROPE)});
      expect_tensor(*g, b + "attn_kv_a_mqa.weight", B, {D, KVL + ROPE});
      expect_tensor(*g, b + "attn_kv_a_norm.weight", F, {KVL});
      expect_tensor(*g, b + "attn_k_b.weight", B, {NOPE, KVL, H});
      expect_tensor(*g, b + "attn_v_b.weight", B, {KVL, VD, H});
      expect_tensor(*g, b + "attn_gate.weight", B, {D, H * VD});
      expect_tensor(*g, b + "indexer.attn_q_b.weight", B, {QL, IH * ID});
      expect_tensor(*g, b + "indexer.attn_k.weight", B, {D, ID});
      expect_tensor(*g, b + "indexer.k_norm.weight", F, {ID});
      expect_tensor(*g, b + "indexer.k_norm.bias", F, {ID});
      expect_tensor(*g, b + "indexer.proj.weight", F, {D, IH});
      EXPECT_EQ(g->find_tensor(b + "attn_kv_b.weight"), nullptr);
      EXPECT_EQ(g->find_tensor(b + "ssm_g.weight"), nullptr);
    }
    expect_tensor(*g, b + "attn_output.weight", B, {H * (mla ? VD : KDA), D});
    if (il == 0) {
      expect_tensor(*g, b + "ffn_gate.weight", B, {D, FF});
      expect_tensor(*g, b + "ffn_up.weight", B, {D, FF});
      expect_tensor(*g, b + "ffn_down.weight", B, {FF, D});
    } else {
      expect_tensor(*g, b + "ffn_gate_inp.weight", F, {D, NE});
      expect_tensor(*g, b + "exp_probs_b.bias", F, {NE});
      expect_tensor(*g, b + "ffn_gate_exps.weight", M, {LAT, MF, NE});
      expect_tensor(*g, b + "ffn_up_exps.weight", M, {LAT, MF, NE});
      expect_tensor(*g, b + "ffn_down_exps.weight", M, {MF, LAT, NE});
      expect_tensor(*g, b + "ffn_routed_down.weight", B, {D, LAT});
      expect_tensor(*g, b + "ffn_routed_up.weight", B, {LAT, D});
      expect_tensor(*g, b + "ffn_routed_norm.weight", F, {LAT});
      expect_tensor(*g, b + "ffn_gate_shexp.weight", B, {D, 2 * MF});
      expect_tensor(*g, b + "ffn_up_shexp.weight", B, {D, 2 * MF});
      expect_tensor(*g, b + "ffn_down_shexp.weight", B, {2 * MF, D});
    }
  }
}

TEST(ConvertLayout, TransformedValues) {
  Fixture f{kimi::gguf::Reader::open(kimi::test::tiny_gguf()), kimi::st::Checkpoint::open(kimi::test::tiny_hf())};
  auto& g = *f.g;
  // ssm_a = -exp(A_log[:H]); A_log is padded to max(H, KDA) = 16 values: slice, not reshape
  {
    const auto& a = f.src("model.layers.0.self_attn.A_log");
    ASSERT_EQ(a.numel(), std::max(H, KDA));
    const auto& t = g.tensor("blk.0.ssm_a");
    for (int64_t h = 0; h < H; ++h) {
      double want = -std::exp(static_cast<double>(src_val(a, h)));
      EXPECT_NEAR(f32(t.data, h), want, 1e-6 * std::fabs(want)) << h;
    }
  }
  // kv_b [H*(NOPE+VD), KVL]: per head rows 0..15 = K-nope, 16..31 = V
  {
    const auto& kv = f.src("model.layers.3.self_attn.kv_b_proj.weight");
    const auto& kb = g.tensor("blk.3.attn_k_b.weight");
    const auto& vb = g.tensor("blk.3.attn_v_b.weight");
    for (int64_t h = 0; h < H; ++h)
      for (int64_t l = 0; l < KVL; ++l) {
        for (int64_t n = 0; n < NOPE; ++n)  // k_b element (n, l, h) at n + NOPE*(l + KVL*h)
          ASSERT_EQ(bf16(kb.data, n + NOPE * (l + KVL * h)), src_val(kv, (h * (NOPE + VD) + n) * KVL + l));
        for (int64_t j = 0; j < VD; ++j)  // v_b element (l, j, h) at l + KVL*(j + VD*h)
          ASSERT_EQ(bf16(vb.data, l + KVL * (j + VD * h)), src_val(kv, (h * (NOPE + VD) + NOPE + j) * KVL + l));
      }
  }
  // residual score = res_norm.weight * res_proj.weight (f32 product of the bf16 values, exact)
  for (auto [gg, hf] : {std::pair{"blk.2.attn_res_score.weight", "model.layers.2.self_attention_res"},
                        std::pair{"blk.5.ffn_res_score.weight", "model.layers.5.mlp_res"},
                        std::pair{"output_res_score.weight", "model.output_attn_res"}}) {
    const auto& n = f.src(std::string(hf) + "_norm.weight");
    const auto& p = f.src(std::string(hf) + "_proj.weight");
    const auto& t = g.tensor(gg);
    for (int64_t i = 0; i < D; ++i)
      ASSERT_EQ(f32(t.data, i), static_cast<float>(static_cast<double>(src_val(n, i)) * src_val(p, i))) << gg << " " << i;
  }
  // conv: taps of channel c stay contiguous: ggml (tap j, 0, c) == HF [c, 0, j]
  {
    const auto& s = f.src("model.layers.1.self_attn.k_conv1d.weight");
    const auto& t = g.tensor("blk.1.ssm_conv1d_k.weight");
    for (int64_t c = 0; c < H * KDA; ++c)
      for (int64_t j = 0; j < 4; ++j) ASSERT_EQ(f32(t.data, j + 4 * c), src_val(s, c * 4 + j));
  }
  // g_proj disambiguation, e_score_correction rename, indexer.proj forced F32, dt_bias rename
  EXPECT_EQ(std::memcmp(g.tensor("blk.1.ssm_g.weight").data, f.src("model.layers.1.self_attn.g_proj.weight").data, D * H * KDA * 2), 0);
  EXPECT_EQ(std::memcmp(g.tensor("blk.7.attn_gate.weight").data, f.src("model.layers.7.self_attn.g_proj.weight").data, D * H * VD * 2), 0);
  {
    const auto& s = f.src("model.layers.4.block_sparse_moe.gate.e_score_correction_bias");
    const auto& t = g.tensor("blk.4.exp_probs_b.bias");
    for (int64_t e = 0; e < NE; ++e) EXPECT_EQ(f32(t.data, e), src_val(s, e));
    const auto& pr = f.src("model.layers.7.self_attn.indexer.weights_proj.weight");
    const auto& tp = g.tensor("blk.7.indexer.proj.weight");
    for (int64_t i = 0; i < IH * D; ++i) ASSERT_EQ(f32(tp.data, i), src_val(pr, i));
    const auto& dt = f.src("model.layers.6.self_attn.dt_bias");
    EXPECT_EQ(std::memcmp(g.tensor("blk.6.ssm_dt.bias").data, dt.data, H * KDA * 4), 0);
  }
  // MXFP4 experts: w2 of expert e -> ffn_down_exps slice e, decoded value by value
  {
    static const double e2m1[16] = {0, 0.5, 1, 1.5, 2, 3, 4, 6, 0, -0.5, -1, -1.5, -2, -3, -4, -6};
    const auto& t = g.tensor("blk.2.ffn_down_exps.weight");  // ne {MF, LAT, NE}
    const int64_t rb = MF / 32 * 17;
    for (int64_t e = 0; e < NE; ++e) {
      const auto& pk = f.src("model.layers.2.block_sparse_moe.experts." + std::to_string(e) + ".w2.weight_packed");
      const auto& sc = f.src("model.layers.2.block_sparse_moe.experts." + std::to_string(e) + ".w2.weight_scale");
      for (int64_t r = 0; r < LAT; ++r)
        for (int64_t k = 0; k < MF; ++k) {
          uint8_t b = pk.data[r * (MF / 2) + k / 2];
          double want = e2m1[k % 2 ? b >> 4 : b & 15] * std::ldexp(1.0, sc.data[r * (MF / 32) + k / 32] - 127);
          const uint8_t* blk = t.data + (e * LAT + r) * rb + (k / 32) * 17;
          int j = static_cast<int>(k % 32);
          int code = j < 16 ? (blk[1 + j] & 15) : (blk[1 + j - 16] >> 4);
          double got = e2m1[code] * std::ldexp(1.0, blk[0] - 127);
          ASSERT_EQ(got, want) << "expert " << e << " row " << r << " col " << k;
        }
    }
  }
}

TEST(ConvertLayout, Q8_0TypeRules) {
  auto g = kimi::gguf::Reader::open(kimi::test::tiny_gguf(1, "", "--outtype q8_0"));
  EXPECT_EQ(g->get_u32("general.file_type"), 38u);
  expect_tensor(*g, "token_embd.weight", GgmlType::Q8_0, {D, V});
  expect_tensor(*g, "blk.3.attn_q_a.weight", GgmlType::Q8_0, {D, QL});
  expect_tensor(*g, "blk.3.attn_k_b.weight", GgmlType::F16, {NOPE, KVL, H});  // ne0 16: not a multiple of 32
  expect_tensor(*g, "blk.0.ssm_f_b.weight", GgmlType::F16, {KDA, H * KDA});
  expect_tensor(*g, "blk.3.indexer.attn_q_b.weight", GgmlType::BF16, {QL, IH * ID});  // never quantized
  expect_tensor(*g, "blk.3.indexer.attn_k.weight", GgmlType::BF16, {D, ID});
  expect_tensor(*g, "blk.3.indexer.proj.weight", GgmlType::F32, {D, IH});
  expect_tensor(*g, "blk.1.ffn_gate_inp.weight", GgmlType::F32, {D, NE});
  expect_tensor(*g, "blk.1.ffn_gate_exps.weight", GgmlType::MXFP4, {LAT, MF, NE});
  auto g32 = kimi::gguf::Reader::open(kimi::test::tiny_gguf(1, "", "--outtype f32"));
  expect_tensor(*g32, "blk.3.indexer.attn_q_b.weight", GgmlType::F32, {QL, IH * ID});
  expect_tensor(*g32, "blk.3.attn_k_b.weight", GgmlType::F32, {NOPE, KVL, H});
  auto g16 = kimi::gguf::Reader::open(kimi::test::tiny_gguf(1, "", "--outtype f16"));
  expect_tensor(*g16, "blk.7.indexer.attn_k.weight", GgmlType::F16, {D, ID});
  expect_tensor(*g16, "blk.7.indexer.proj.weight", GgmlType::F32, {D, IH});
}
