// Test helpers for the engine tests: a tiny kimi-k3 GGUF written directly with gguf::Writer
// (random weights, shapes of the `tiny` preset unless changed) and a GGUF copy-with-edits helper
// for loader error tests. Header-only; included by tests/{unit,model}/test_model_*.cpp.
#pragma once
#include <cmath>
#include <cstring>
#include <functional>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "io/gguf.h"
#include "tensor/quants.h"
#include "tensor/types.h"

namespace kimi::test {

struct TinySpec {
  int64_t d = 64, n_layer = 8, H = 4, D = 16, q_lora = 32, kv_lora = 32, nope = 16, rope = 8, v = 16;
  int64_t n_ff = 128, E = 8, k = 2, n_shared = 2, F = 32, latent = 32, block = 3;
  int64_t idx_heads = 4, idx_dim = 16, top_k = 16;  // top_k 0: plain K3 file (no indexer)
  int64_t vocab = 1024;
  std::vector<int> mla_layers{3, 7};  // 0-based
  float routed_scale = 2.5f;
  bool gate_lb = true;
  bool mxfp4 = true;  // routed experts MXFP4 (else BF16)
  uint32_t seed = 1;
};

// Deterministic values per tensor name (so files with and without the indexer share weights).
inline std::vector<float> fixture_values(const std::string& name, int64_t n, float scale, float offset,
                                         uint32_t seed) {
  std::seed_seq ss(name.begin(), name.end());
  std::vector<uint32_t> s(1);
  ss.generate(s.begin(), s.end());
  std::mt19937 rng(s[0] ^ (seed * 2654435761u));
  std::uniform_real_distribution<float> U(-1.0f, 1.0f);
  std::vector<float> v(static_cast<size_t>(n));
  for (auto& x : v) x = offset + scale * U(rng);
  return v;
}

inline void write_tiny_gguf(const std::string& path, const TinySpec& sp) {
  using gguf::Value;
  gguf::Writer w(path);
  const std::string a = "kimi-k3.";
  w.add_kv("general.architecture", Value::str("kimi-k3"));
  w.add_kv(a + "block_count", Value::u32(uint32_t(sp.n_layer)));
  w.add_kv(a + "context_length", Value::u32(4096));
  w.add_kv(a + "embedding_length", Value::u32(uint32_t(sp.d)));
  w.add_kv(a + "vocab_size", Value::u32(uint32_t(sp.vocab)));
  w.add_kv(a + "feed_forward_length", Value::u32(uint32_t(sp.n_ff)));
  w.add_kv(a + "attention.head_count", Value::u32(uint32_t(sp.H)));
  std::vector<int32_t> hkv(size_t(sp.n_layer), 0);
  auto is_mla = [&](int il) {
    for (int m : sp.mla_layers)
      if (m == il) return true;
    return false;
  };
  for (int il = 0; il < sp.n_layer; ++il) hkv[size_t(il)] = is_mla(il) ? 1 : 0;
  w.add_kv(a + "attention.head_count_kv", Value::arr_i32(hkv));
  w.add_kv(a + "attention.layer_norm_rms_epsilon", Value::f32(1e-5f));
  w.add_kv(a + "attention.q_lora_rank", Value::u32(uint32_t(sp.q_lora)));
  w.add_kv(a + "attention.kv_lora_rank", Value::u32(uint32_t(sp.kv_lora)));
  w.add_kv(a + "attention.key_length", Value::u32(uint32_t(sp.kv_lora + sp.rope)));
  w.add_kv(a + "attention.value_length", Value::u32(uint32_t(sp.kv_lora)));
  w.add_kv(a + "attention.key_length_mla", Value::u32(uint32_t(sp.nope + sp.rope)));
  w.add_kv(a + "attention.value_length_mla", Value::u32(uint32_t(sp.v)));
  w.add_kv(a + "rope.dimension_count", Value::u32(uint32_t(sp.rope)));
  w.add_kv(a + "ssm.conv_kernel", Value::u32(4));
  w.add_kv(a + "kda.head_dim", Value::u32(uint32_t(sp.D)));
  if (sp.gate_lb) w.add_kv(a + "kda.gate_lower_bound", Value::f32(-5.0f));
  w.add_kv(a + "expert_count", Value::u32(uint32_t(sp.E)));
  w.add_kv(a + "expert_used_count", Value::u32(uint32_t(sp.k)));
  w.add_kv(a + "expert_shared_count", Value::u32(uint32_t(sp.n_shared)));
  w.add_kv(a + "expert_feed_forward_length", Value::u32(uint32_t(sp.F)));
  w.add_kv(a + "expert_latent_length", Value::u32(uint32_t(sp.latent)));
  w.add_kv(a + "leading_dense_block_count", Value::u32(1));
  w.add_kv(a + "expert_weights_scale", Value::f32(sp.routed_scale));
  w.add_kv(a + "expert_weights_norm", Value::boolean(true));
  w.add_kv(a + "expert_gating_func", Value::u32(2));
  w.add_kv(a + "attn_res.block_size", Value::u32(uint32_t(sp.block)));
  w.add_kv(a + "activation.situ_beta", Value::f32(4.0f));
  w.add_kv(a + "activation.situ_linear_beta", Value::f32(25.0f));
  if (sp.top_k > 0) {
    w.add_kv(a + "attention.indexer.head_count", Value::u32(uint32_t(sp.idx_heads)));
    w.add_kv(a + "attention.indexer.key_length", Value::u32(uint32_t(sp.idx_dim)));
    w.add_kv(a + "attention.indexer.top_k", Value::u32(uint32_t(sp.top_k)));
  }

  struct T {
    std::string name;
    GgmlType type;
    std::vector<int64_t> ne;
    float scale, offset;
  };
  std::vector<T> ts;
  auto mat = [&](const std::string& n, std::vector<int64_t> ne, GgmlType t = GgmlType::BF16) {
    ts.push_back({n, t, ne, 1.0f / std::sqrt(float(ne[0])), 0.0f});
  };
  auto vec = [&](const std::string& n, std::vector<int64_t> ne, float scale, float offset) {
    ts.push_back({n, GgmlType::F32, ne, scale, offset});
  };
  const int64_t d = sp.d, C = sp.H * sp.D;
  mat("token_embd.weight", {d, sp.vocab});
  ts.back().scale = 1.0f;
  mat("output.weight", {d, sp.vocab});
  vec("output_norm.weight", {d}, 0.1f, 1.0f);
  vec("output_res_score.weight", {d}, 0.3f, 0.0f);
  for (int il = 0; il < sp.n_layer; ++il) {
    auto n = [&](const char* s) { return "blk." + std::to_string(il) + "." + s; };
    vec(n("attn_norm.weight"), {d}, 0.1f, 1.0f);
    vec(n("ffn_norm.weight"), {d}, 0.1f, 1.0f);
    vec(n("attn_res_score.weight"), {d}, 0.3f, 0.0f);
    vec(n("ffn_res_score.weight"), {d}, 0.3f, 0.0f);
    if (!is_mla(il)) {
      mat(n("attn_q.weight"), {d, C});
      mat(n("attn_k.weight"), {d, C});
      mat(n("attn_v.weight"), {d, C});
      vec(n("ssm_conv1d_q.weight"), {4, 1, C, 1}, 0.5f, 0.0f);
      vec(n("ssm_conv1d_k.weight"), {4, 1, C, 1}, 0.5f, 0.0f);
      vec(n("ssm_conv1d_v.weight"), {4, 1, C, 1}, 0.5f, 0.0f);
      mat(n("ssm_f_a.weight"), {d, sp.D});
      mat(n("ssm_f_b.weight"), {sp.D, C});
      mat(n("ssm_beta.weight"), {d, sp.H});
      vec(n("ssm_a"), {sp.H}, 0.5f, -1.0f);  // -exp(A_log) in (-1.5, -0.5)
      vec(n("ssm_dt.bias"), {C}, 0.5f, 0.0f);
      mat(n("ssm_g.weight"), {d, C});
      vec(n("ssm_norm.weight"), {sp.D}, 0.1f, 1.0f);
      mat(n("attn_output.weight"), {C, d});
    } else {
      mat(n("attn_q_a.weight"), {d, sp.q_lora});
      vec(n("attn_q_a_norm.weight"), {sp.q_lora}, 0.1f, 1.0f);
      mat(n("attn_q_b.weight"), {sp.q_lora, sp.H * (sp.nope + sp.rope)});
      mat(n("attn_kv_a_mqa.weight"), {d, sp.kv_lora + sp.rope});
      vec(n("attn_kv_a_norm.weight"), {sp.kv_lora}, 0.1f, 1.0f);
      mat(n("attn_k_b.weight"), {sp.nope, sp.kv_lora, sp.H});
      mat(n("attn_v_b.weight"), {sp.kv_lora, sp.v, sp.H});
      mat(n("attn_gate.weight"), {d, sp.H * sp.v});
      mat(n("attn_output.weight"), {sp.H * sp.v, d});
      if (sp.top_k > 0) {
        mat(n("indexer.attn_q_b.weight"), {sp.q_lora, sp.idx_heads * sp.idx_dim});
        mat(n("indexer.attn_k.weight"), {d, sp.idx_dim});
        vec(n("indexer.k_norm.weight"), {sp.idx_dim}, 0.1f, 1.0f);
        vec(n("indexer.k_norm.bias"), {sp.idx_dim}, 0.1f, 0.0f);
        mat(n("indexer.proj.weight"), {d, sp.idx_heads}, GgmlType::F32);
      }
    }
    if (il == 0) {
      mat(n("ffn_gate.weight"), {d, sp.n_ff});
      mat(n("ffn_up.weight"), {d, sp.n_ff});
      mat(n("ffn_down.weight"), {sp.n_ff, d});
    } else {
      mat(n("ffn_gate_inp.weight"), {d, sp.E}, GgmlType::F32);
      vec(n("exp_probs_b.bias"), {sp.E}, 0.05f, 0.0f);
      const GgmlType et = sp.mxfp4 ? GgmlType::MXFP4 : GgmlType::BF16;
      mat(n("ffn_gate_exps.weight"), {sp.latent, sp.F, sp.E}, et);
      mat(n("ffn_up_exps.weight"), {sp.latent, sp.F, sp.E}, et);
      mat(n("ffn_down_exps.weight"), {sp.F, sp.latent, sp.E}, et);
      mat(n("ffn_routed_down.weight"), {d, sp.latent});
      mat(n("ffn_routed_up.weight"), {sp.latent, d});
      vec(n("ffn_routed_norm.weight"), {sp.latent}, 0.1f, 1.0f);
      mat(n("ffn_gate_shexp.weight"), {d, sp.F * sp.n_shared});
      mat(n("ffn_up_shexp.weight"), {d, sp.F * sp.n_shared});
      mat(n("ffn_down_shexp.weight"), {sp.F * sp.n_shared, d});
    }
  }
  for (auto& t : ts) w.add_tensor(t.name, t.type, t.ne);
  w.begin();
  for (auto& t : ts) {
    int64_t n = 1;
    for (auto e : t.ne) n *= e;
    auto v = fixture_values(t.name, n, t.scale, t.offset, sp.seed);
    std::vector<uint8_t> bytes;
    if (t.type == GgmlType::F32) {
      bytes.resize(size_t(n) * 4);
      std::memcpy(bytes.data(), v.data(), bytes.size());
    } else if (t.type == GgmlType::BF16) {
      bytes.resize(size_t(n) * 2);
      for (int64_t i = 0; i < n; ++i) {
        uint16_t b = f32_to_bf16(v[size_t(i)]);
        std::memcpy(bytes.data() + i * 2, &b, 2);
      }
    } else {  // MXFP4
      bytes.resize(size_t(n / 32) * sizeof(block_mxfp4));
      quantize_row_mxfp4(v.data(), reinterpret_cast<block_mxfp4*>(bytes.data()), n);
    }
    w.write_tensor_data(t.name, bytes.data(), bytes.size());
  }
  w.finish();
}

// Copies a GGUF, letting `edit_tensor` drop (return false) or re-declare (change type/ne of) each
// tensor (the data is copied truncated/zero-padded to the new size), and `extra` add KVs/tensors.
struct GgufEdit {
  std::function<bool(const std::string& name, GgmlType& type, std::vector<int64_t>& ne)> edit_tensor;
  std::vector<std::pair<std::string, gguf::Value>> set_kv;
  std::vector<std::string> drop_kv;
  struct Extra {
    std::string name;
    GgmlType type;
    std::vector<int64_t> ne;
  };
  std::vector<Extra> add_tensor;
};

inline uint64_t fixture_nbytes(GgmlType t, const std::vector<int64_t>& ne) {
  uint64_t rows = 1;
  for (size_t i = 1; i < ne.size(); ++i) rows *= uint64_t(ne[i]);
  return row_bytes(t, uint64_t(ne[0])) * rows;
}

inline void copy_gguf(const std::string& src, const std::string& dst, const GgufEdit& ed) {
  auto r = gguf::Reader::open(src);
  gguf::Writer w(dst);
  for (const auto& kv : r->kvs()) {
    bool drop = false;
    for (auto& k : ed.drop_kv) drop |= k == kv.key;
    if (!drop) w.add_kv(kv.key, kv.value);
  }
  for (const auto& kv : ed.set_kv) w.add_kv(kv.first, kv.second);
  struct Out {
    const gguf::TensorInfo* src;
    std::string name;
    GgmlType type;
    std::vector<int64_t> ne;
  };
  std::vector<Out> outs;
  for (const auto& t : r->tensors()) {
    GgmlType ty = t.type;
    std::vector<int64_t> ne(t.ne.begin(), t.ne.begin() + t.n_dims);
    if (ed.edit_tensor && !ed.edit_tensor(t.name, ty, ne)) continue;
    outs.push_back({&t, t.name, ty, ne});
  }
  for (const auto& x : ed.add_tensor) outs.push_back({nullptr, x.name, x.type, x.ne});
  for (auto& o : outs) w.add_tensor(o.name, o.type, o.ne);
  w.begin();
  for (auto& o : outs) {
    std::vector<uint8_t> buf(fixture_nbytes(o.type, o.ne), 0);
    if (o.src) std::memcpy(buf.data(), o.src->data, std::min<size_t>(buf.size(), o.src->nbytes));
    w.write_tensor_data(o.name, buf.data(), buf.size());
  }
  w.finish();
}

}  // namespace kimi::test
