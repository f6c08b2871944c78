// Random small HF checkpoints and a tensor patcher for the reference tests.
#include "ref/ref_checkpoint.h"

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>

#include "io/safetensors.h"
#include "ref/reference.h"
#include "util/error.h"

namespace fs = std::filesystem;

namespace kimi::ref {

namespace {

uint16_t to_bf16_bits(double v) {
  float f = static_cast<float>(v);
  uint32_t u;
  std::memcpy(&u, &f, 4);
  check((u & 0x7fffffffu) <= 0x7f800000u, "to_bf16_bits: NaN");
  u += 0x7fffu + ((u >> 16) & 1u);  // round to nearest, ties to even
  return static_cast<uint16_t>(u >> 16);
}

uint16_t to_f16_bits(double v) {
  const double r = round_to_f16(v);
  uint16_t sign = std::signbit(r) ? 0x8000 : 0;
  const double a = std::fabs(r);
  if (std::isinf(a)) return sign | 0x7c00;
  if (a == 0.0) return sign;
  int ex;
  std::frexp(a, &ex);
  int e = ex - 1;  // a = 1.m * 2^e
  if (e < -14) return sign | static_cast<uint16_t>(std::lround(std::ldexp(a, 24)));  // subnormal
  const int mant = static_cast<int>(std::lround(std::ldexp(a, 10 - e))) - 1024;
  return sign | static_cast<uint16_t>(((e + 15) << 10) | mant);
}

struct Builder {
  std::mt19937_64 rng;
  struct T {
    std::string name;
    st::Dtype dt;
    std::vector<int64_t> shape;
    std::vector<uint8_t> bytes;
  };
  std::vector<T> ts;

  double uni(double a) { return std::uniform_real_distribution<double>(-a, a)(rng); }

  void floats(const std::string& name, std::vector<int64_t> shape, st::Dtype dt, const std::function<double()>& gen) {
    int64_t n = 1;
    for (auto s : shape) n *= s;
    T t{name, dt, shape, {}};
    t.bytes.resize(static_cast<size_t>(n) * st::dtype_size(dt));
    for (int64_t i = 0; i < n; ++i) {
      const double v = gen();
      if (dt == st::Dtype::BF16) {
        uint16_t h = to_bf16_bits(v);
        std::memcpy(&t.bytes[2 * i], &h, 2);
      } else {
        float f = static_cast<float>(v);
        std::memcpy(&t.bytes[4 * i], &f, 4);
      }
    }
    ts.push_back(std::move(t));
  }
  void mat(const std::string& name, int64_t out, int64_t in) {
    const double a = std::sqrt(3.0 / static_cast<double>(in));  // unit variance outputs for unit inputs
    floats(name, {out, in}, st::Dtype::BF16, [&] { return uni(a); });
  }
  void norm(const std::string& name, int64_t n, st::Dtype dt = st::Dtype::BF16) {
    floats(name, {n}, dt, [&] { return 1.0 + uni(0.3); });
  }
  void mxfp4(const std::string& base, int64_t out, int64_t in) {
    T pk{base + ".weight_packed", st::Dtype::U8, {out, in / 2}, {}};
    T sc{base + ".weight_scale", st::Dtype::U8, {out, in / 32}, {}};
    const int s0 = 127 + static_cast<int>(std::lround(std::log2(0.5 / std::sqrt(static_cast<double>(in)))));
    std::uniform_int_distribution<int> byte(0, 255), ds(-1, 1);
    for (int64_t i = 0; i < out * in / 2; ++i) pk.bytes.push_back(static_cast<uint8_t>(byte(rng)));
    for (int64_t i = 0; i < out * in / 32; ++i) sc.bytes.push_back(static_cast<uint8_t>(s0 + ds(rng)));
    ts.push_back(std::move(pk));
    ts.push_back(std::move(sc));
  }
};

}  // namespace

void write_random_checkpoint(const std::string& dir, const RandomSpec& s) {
  using nlohmann::json;
  const int64_t H = s.n_head, D = s.kda_dim, C = H * D;
  const int64_t a_log_len = s.a_log_len > 0 ? s.a_log_len : std::max(H, D);
  json lac = {{"full_attn_layers", s.full_attn_1based}, {"head_dim", D}, {"num_heads", H},
              {"short_conv_kernel_size", s.conv_k}, {"gate_lower_bound", -5.0}};
  json tc = {{"model_type", "kimi_linear"}, {"architectures", {"KimiLinearForCausalLM"}},
             {"num_hidden_layers", s.n_layer}, {"hidden_size", s.d}, {"vocab_size", s.vocab},
             {"num_attention_heads", H}, {"num_key_value_heads", H}, {"intermediate_size", s.dense_width},
             {"rms_norm_eps", 1e-5}, {"hidden_act", "situ"}, {"activation_situ_beta", 4.0},
             {"activation_situ_linear_beta", 25.0}, {"attn_res_block_size", s.block_size},
             {"q_lora_rank", s.q_lora}, {"kv_lora_rank", s.kv_lora}, {"qk_nope_head_dim", s.nope},
             {"qk_rope_head_dim", s.rope}, {"v_head_dim", s.vdim}, {"mla_use_nope", true},
             {"num_experts", s.n_expert}, {"num_experts_per_token", s.n_used}, {"num_shared_experts", s.n_shared},
             {"moe_intermediate_size", s.moe_width}, {"routed_expert_hidden_size", s.latent},
             {"first_k_dense_replace", 1}, {"routed_scaling_factor", s.routed_scale}, {"moe_renormalize", true},
             {"moe_router_activation_func", "sigmoid"}, {"tie_word_embeddings", false},
             {"max_position_embeddings", 4096}, {"linear_attn_config", lac}, {"index_n_heads", s.idx_heads},
             {"index_head_dim", s.idx_dim}, {"index_topk", s.idx_topk}};
  json root = {{"architectures", {"KimiK3ForConditionalGeneration"}}, {"model_type", "kimi_k3"},
               {"text_config", tc}};
  if (s.mxfp4)
    root["quantization_config"] = {{"quant_method", "compressed-tensors"}, {"format", "mxfp4-pack-quantized"}};
  std::ofstream(fs::path(dir) / "config.json") << root.dump(2);

  Builder b{std::mt19937_64(s.seed), {}};
  const std::string P = "language_model.";
  const auto F32 = st::Dtype::F32;
  b.floats(P + "model.embed_tokens.weight", {s.vocab, s.d}, st::Dtype::BF16, [&] { return b.uni(1.7); });
  b.mat(P + "lm_head.weight", s.vocab, s.d);
  b.norm(P + "model.norm.weight", s.d);
  b.norm(P + "model.output_attn_res_norm.weight", s.d);
  b.floats(P + "model.output_attn_res_proj.weight", {1, s.d}, st::Dtype::BF16, [&] { return b.uni(0.5); });
  std::vector<bool> mla(static_cast<size_t>(s.n_layer), false);
  for (auto l : s.full_attn_1based) mla[static_cast<size_t>(l - 1)] = true;
  for (int64_t il = 0; il < s.n_layer; ++il) {
    const std::string L = P + "model.layers." + std::to_string(il) + ".";
    b.norm(L + "input_layernorm.weight", s.d);
    b.norm(L + "post_attention_layernorm.weight", s.d);
    for (const char* r : {"self_attention_res", "mlp_res"}) {
      b.norm(L + r + "_norm.weight", s.d);
      b.floats(L + r + "_proj.weight", {1, s.d}, st::Dtype::BF16, [&] { return b.uni(0.5); });
    }
    const std::string A = L + "self_attn.";
    if (!mla[static_cast<size_t>(il)]) {
      for (const char* x : {"q", "k", "v"}) {
        b.mat(A + x + "_proj.weight", C, s.d);
        b.floats(A + x + "_conv1d.weight", {C, 1, s.conv_k}, F32, [&] { return b.uni(0.8); });
      }
      b.mat(A + "f_a_proj.weight", D, s.d);
      b.mat(A + "f_b_proj.weight", C, D);
      b.floats(A + "A_log", {a_log_len}, F32, [&] { return std::log(1.0 + 15.0 * (0.5 + 0.5 * b.uni(1.0))); });
      b.floats(A + "dt_bias", {C}, F32, [&] { return b.uni(1.0); });
      b.mat(A + "b_proj.weight", H, s.d);
      b.mat(A + "g_proj.weight", C, s.d);
      b.norm(A + "o_norm.weight", D, F32);
      b.mat(A + "o_proj.weight", s.d, C);
    } else {
      b.mat(A + "q_a_proj.weight", s.q_lora, s.d);
      b.norm(A + "q_a_layernorm.weight", s.q_lora);
      b.mat(A + "q_b_proj.weight", H * (s.nope + s.rope), s.q_lora);
      b.mat(A + "kv_a_proj_with_mqa.weight", s.kv_lora + s.rope, s.d);
      b.norm(A + "kv_a_layernorm.weight", s.kv_lora);
      b.mat(A + "kv_b_proj.weight", H * (s.nope + s.vdim), s.kv_lora);
      b.mat(A + "g_proj.weight", H * s.vdim, s.d);
      b.mat(A + "o_proj.weight", s.d, H * s.vdim);
      if (s.idx_topk > 0) {
        b.mat(A + "indexer.wq_b.weight", s.idx_heads * s.idx_dim, s.q_lora);
        b.mat(A + "indexer.wk.weight", s.idx_dim, s.d);
        b.norm(A + "indexer.k_norm.weight", s.idx_dim);
        b.floats(A + "indexer.k_norm.bias", {s.idx_dim}, st::Dtype::BF16, [&] { return b.uni(0.3); });
        b.mat(A + "indexer.weights_proj.weight", s.idx_heads, s.d);
      }
    }
    if (il == 0) {
      b.mat(L + "mlp.gate_proj.weight", s.dense_width, s.d);
      b.mat(L + "mlp.up_proj.weight", s.dense_width, s.d);
      b.mat(L + "mlp.down_proj.weight", s.d, s.dense_width);
      continue;
    }
    const std::string M = L + "block_sparse_moe.";
    b.mat(M + "gate.weight", s.n_expert, s.d);
    b.floats(M + "gate.e_score_correction_bias", {s.n_expert}, F32, [&] { return b.uni(0.1); });
    b.mat(M + "routed_expert_down_proj.weight", s.latent, s.d);
    b.norm(M + "routed_expert_norm.weight", s.latent);
    b.mat(M + "routed_expert_up_proj.weight", s.d, s.latent);
    b.mat(M + "shared_experts.gate_proj.weight", s.n_shared * s.moe_width, s.d);
    b.mat(M + "shared_experts.up_proj.weight", s.n_shared * s.moe_width, s.d);
    b.mat(M + "shared_experts.down_proj.weight", s.d, s.n_shared * s.moe_width);
    for (int64_t e = 0; e < s.n_expert; ++e) {
      const std::string E = M + "experts." + std::to_string(e) + ".";
      if (s.mxfp4) {
        b.mxfp4(E + "w1", s.moe_width, s.latent);
        b.mxfp4(E + "w3", s.moe_width, s.latent);
        b.mxfp4(E + "w2", s.latent, s.moe_width);
      } else {
        b.mat(E + "w1.weight", s.moe_width, s.latent);
        b.mat(E + "w3.weight", s.moe_width, s.latent);
        b.mat(E + "w2.weight", s.latent, s.moe_width);
      }
    }
  }
  st::Writer w((fs::path(dir) / "model.safetensors").string());
  w.add_metadata("format", "pt");
  for (const auto& t : b.ts) w.add_tensor(t.name, t.dt, t.shape);
  w.begin();
  for (const auto& t : b.ts) w.write(t.name, t.bytes.data(), t.bytes.size());
  w.finish();
}

void patch_checkpoint(const std::string& src, const std::string& dst, const std::map<std::string, TensorEdit>& edits) {
  fs::create_directories(dst);
  std::map<std::string, bool> done;
  for (const auto& kv : edits) done[kv.first] = false;
  for (const auto& ent : fs::directory_iterator(src)) {
    if (!ent.is_regular_file()) continue;
    const fs::path out = fs::path(dst) / ent.path().filename();
    if (ent.path().extension() != ".safetensors") {
      fs::copy_file(ent.path(), out, fs::copy_options::overwrite_existing);
      continue;
    }
    auto ck = st::Checkpoint::open(ent.path().string());
    st::Writer w(out.string());
    for (const auto& m : ck->metadata()) w.add_metadata(m.first, m.second);
    for (const auto& name : ck->names()) {
      const auto& t = ck->get(name);
      w.add_tensor(name, t.dtype, t.shape);
    }
    w.begin();
    for (const auto& name : ck->names()) {
      const auto& t = ck->get(name);
      auto it = edits.find(name);
      if (it == edits.end()) {
        w.write(name, t.data, t.nbytes);
        continue;
      }
      done[name] = true;
      const int64_t n = t.numel();
      std::vector<double> v(static_cast<size_t>(n));
      std::vector<uint8_t> bytes(t.nbytes);
      for (int64_t i = 0; i < n; ++i) {
        uint16_t h;
        float f;
        switch (t.dtype) {
          case st::Dtype::BF16: std::memcpy(&h, t.data + 2 * i, 2); v[i] = bf16_bits_to_double(h); break;
          case st::Dtype::F16: std::memcpy(&h, t.data + 2 * i, 2); v[i] = f16_bits_to_double(h); break;
          case st::Dtype::F32: std::memcpy(&f, t.data + 4 * i, 4); v[i] = f; break;
          default: fail("patch_checkpoint: tensor '{}' has dtype {}, only BF16/F16/F32 can be edited", name,
                        st::dtype_name(t.dtype));
        }
      }
      it->second(v, t.shape);
      check(static_cast<int64_t>(v.size()) == n, "patch_checkpoint: edit of '{}' changed its size", name);
      for (int64_t i = 0; i < n; ++i) {
        if (t.dtype == st::Dtype::F32) {
          float f = static_cast<float>(v[i]);
          std::memcpy(&bytes[4 * i], &f, 4);
        } else {
          uint16_t h = t.dtype == st::Dtype::BF16 ? to_bf16_bits(v[i]) : to_f16_bits(v[i]);
          std::memcpy(&bytes[2 * i], &h, 2);
        }
      }
      w.write(name, bytes.data(), bytes.size());
    }
    w.finish();
  }
  for (const auto& kv : done) check(kv.second, "patch_checkpoint: tensor '{}' not found in {}", kv.first, src);
}

}  // namespace kimi::ref
