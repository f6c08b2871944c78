#include "convert/transforms.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <map>
#include <cstring>
#include <fmt/ranges.h>

#include "io/hf_config.h"
#include "tensor/quants.h"
#include "util/error.h"

namespace kimi::convert {

namespace {

std::string lower(std::string s) {
  for (auto& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

std::string shape_str(const std::vector<int64_t>& s) {
  std::string r = "[";
  for (size_t i = 0; i < s.size(); ++i) r += (i ? ", " : "") + std::to_string(s[i]);
  return r + "]";
}

int64_t pos_int(const HfConfig& c, const std::string& key) {
  int64_t v = c.get_int(key);
  check(v > 0, "{}: key '{}' must be positive, got {}", c.path, key, v);
  return v;
}

}  // namespace

void refuse_indexer_rope(const HfConfig& cfg) {
  auto scan = [&](const nlohmann::json& j, const std::string& where) {
    if (!j.is_object()) return;
    for (auto it = j.begin(); it != j.end(); ++it) {
      std::string k = lower(it.key());
      if (k.find("index") != std::string::npos && k.find("rope") != std::string::npos)
        fail("{}: indexer rotary setting '{}{}' is not supported: the Kimi-K3.1 indexer is NoPE "
             "(spec/README.md decision 3); refusing to convert",
             cfg.path, where, it.key());
    }
  };
  scan(cfg.root, "");
  if (cfg.root.contains("text_config")) scan(cfg.root["text_config"], "text_config.");
  if (cfg.merged.contains("linear_attn_config")) scan(cfg.merged["linear_attn_config"], "linear_attn_config.");
}

K3Dims read_dims(const HfConfig& c, uint64_t max_tensors) {
  const std::string arch = c.top_architecture();
  check(arch == "KimiK3ForConditionalGeneration",
        "{}: unsupported architecture '{}' (architectures[0]); expected 'KimiK3ForConditionalGeneration'", c.path,
        arch.empty() ? std::string("<none>") : arch);
  refuse_indexer_rope(c);
  if (c.has("hidden_act"))
    check(c.get_str("hidden_act") == "situ", "{}: key 'hidden_act' is '{}', expected 'situ'", c.path,
          c.get_str("hidden_act"));
  if (c.has("mla_use_nope"))
    check(c.get_bool("mla_use_nope"), "{}: key 'mla_use_nope' is false; only NoPE MLA (K3) is supported", c.path);
  if (c.has("moe_router_activation_func"))
    check(c.get_str("moe_router_activation_func") == "sigmoid",
          "{}: key 'moe_router_activation_func' is '{}', expected 'sigmoid'", c.path,
          c.get_str("moe_router_activation_func"));
  if (c.has("moe_layer_freq"))
    check(c.get_int("moe_layer_freq") == 1, "{}: key 'moe_layer_freq' must be 1", c.path);
  K3Dims d;
  auto bounded = [&](const std::string& key, const char* what) {
    const int64_t v = pos_int(c, key);
    check(static_cast<uint64_t>(v) <= max_tensors,
          "{}: key '{}' = {} is more {} than the checkpoint can hold: it has only {} tensors", c.path, key, v, what,
          max_tensors);
    return v;
  };
  d.n_layer = bounded("num_hidden_layers", "layers");
  d.d = pos_int(c, "hidden_size");
  d.vocab = pos_int(c, "vocab_size");
  d.n_head = pos_int(c, "num_attention_heads");
  d.n_head_kv = c.has("num_key_value_heads") ? pos_int(c, "num_key_value_heads") : d.n_head;
  d.kda_dim = pos_int(c, "linear_attn_config.head_dim");
  d.conv_kernel = pos_int(c, "linear_attn_config.short_conv_kernel_size");
  d.q_lora = pos_int(c, "q_lora_rank");
  d.kv_lora = pos_int(c, "kv_lora_rank");
  d.nope = pos_int(c, "qk_nope_head_dim");
  d.rope = pos_int(c, "qk_rope_head_dim");
  d.v_dim = pos_int(c, "v_head_dim");
  if (c.has("prefix_dense_intermediate_size")) d.ff_dense = pos_int(c, "prefix_dense_intermediate_size");
  else if (c.has("dense_intermediate_size")) d.ff_dense = pos_int(c, "dense_intermediate_size");
  else d.ff_dense = pos_int(c, "intermediate_size");
  d.n_expert = bounded("num_experts", "routed experts");
  d.n_expert_used = pos_int(c, "num_experts_per_token");
  check(d.n_expert_used <= d.n_expert, "{}: num_experts_per_token {} > num_experts {}", c.path, d.n_expert_used,
        d.n_expert);
  d.n_shared = c.get_int_or("num_shared_experts", 0);
  check(d.n_shared >= 0, "{}: key 'num_shared_experts' must be >= 0", c.path);
  d.moe_ff = pos_int(c, "moe_intermediate_size");
  d.latent = c.has("routed_expert_hidden_size") ? pos_int(c, "routed_expert_hidden_size") : d.d;
  d.first_dense = c.get_int_or("first_k_dense_replace", 0);
  check(d.first_dense >= 0 && d.first_dense <= d.n_layer, "{}: key 'first_k_dense_replace' = {} out of range",
        c.path, d.first_dense);
  d.tie_embeddings = c.get_bool_or("tie_word_embeddings", false);
  d.output_gate = c.get_bool_or("mla_use_output_gate", true);
  d.routed_norm = c.get_bool_or("latent_moe_use_norm", true);
  d.mxfp4_experts = c.experts_mxfp4_packed();
  d.full_attn_1based = c.full_attn_layers_1based();
  d.is_mla.assign(d.n_layer, false);
  for (int64_t l : d.full_attn_1based) {
    check(l >= 1 && l <= d.n_layer,
          "{}: linear_attn_config.full_attn_layers entry {} outside 1..{} (the list is 1-indexed)", c.path, l,
          d.n_layer);
    d.is_mla[l - 1] = true;
  }
  d.idx_topk = c.get_int_or("index_topk", 0);
  check(d.idx_topk >= 0, "{}: key 'index_topk' must be >= 0", c.path);
  if (d.idx_topk > 0) {
    d.idx_heads = pos_int(c, "index_n_heads");
    d.idx_dim = pos_int(c, "index_head_dim");
  }
  if (d.mxfp4_experts) {
    check(d.latent % 32 == 0 && d.moe_ff % 32 == 0,
          "{}: MXFP4 experts need routed_expert_hidden_size ({}) and moe_intermediate_size ({}) multiples of 32",
          c.path, d.latent, d.moe_ff);
  }
  return d;
}

OutType parse_outtype(const std::string& s) {
  std::string l = lower(s);
  if (l == "auto") return OutType::Auto;
  if (l == "bf16") return OutType::BF16;
  if (l == "f16") return OutType::F16;
  if (l == "f32") return OutType::F32;
  if (l == "q8_0") return OutType::Q8_0;
  fail("unknown --outtype '{}': expected auto, bf16, f16, f32 or q8_0", s);
}

const char* outtype_name(OutType t) {
  switch (t) {
    case OutType::Auto: return "auto";
    case OutType::BF16: return "bf16";
    case OutType::F16: return "f16";
    case OutType::F32: return "f32";
    case OutType::Q8_0: return "q8_0";
  }
  return "?";
}

bool q8_0_available() { return true; }

// ---------------------------------------------------------------------------------------------
// element conversion

void decode_f32(const st::Tensor& t, int64_t first, int64_t n, float* out) {
  const uint8_t* p = t.data;
  switch (t.dtype) {
    case st::Dtype::F32:
      std::memcpy(out, p + first * 4, static_cast<size_t>(n) * 4);
      break;
    case st::Dtype::BF16: {
      const uint8_t* q = p + first * 2;
      for (int64_t i = 0; i < n; ++i) {
        uint16_t h;
        std::memcpy(&h, q + 2 * i, 2);
        out[i] = bf16_to_f32(h);
      }
      break;
    }
    case st::Dtype::F16: {
      const uint8_t* q = p + first * 2;
      for (int64_t i = 0; i < n; ++i) {
        uint16_t h;
        std::memcpy(&h, q + 2 * i, 2);
        out[i] = f16_to_f32(h);
      }
      break;
    }
    case st::Dtype::F64: {
      const uint8_t* q = p + first * 8;
      for (int64_t i = 0; i < n; ++i) {
        double v;
        std::memcpy(&v, q + 8 * i, 8);
        out[i] = static_cast<float>(v);
      }
      break;
    }
    default:
      fail("tensor '{}' in {}: dtype {} is not a float type", t.name, t.file, st::dtype_name(t.dtype));
  }
}

void encode_rows(const float* x, int64_t n, int64_t row_len, GgmlType type, void* out) {
  switch (type) {
    case GgmlType::F32:
      std::memcpy(out, x, static_cast<size_t>(n) * 4);
      break;
    case GgmlType::F16: {
      auto* o = static_cast<uint16_t*>(out);
      for (int64_t i = 0; i < n; ++i) o[i] = f32_to_f16(x[i]);
      break;
    }
    case GgmlType::BF16: {
      auto* o = static_cast<uint16_t*>(out);
      for (int64_t i = 0; i < n; ++i) o[i] = f32_to_bf16(x[i]);
      break;
    }
    case GgmlType::Q8_0: {
      check(row_len % QK8_0 == 0 && n % row_len == 0, "Q8_0 rows must be a multiple of 32 elements (row {})",
            row_len);
      auto* o = static_cast<block_q8_0*>(out);
      for (int64_t r = 0; r < n / row_len; ++r) quantize_row_q8_0(x + r * row_len, o + r * (row_len / QK8_0), row_len);
      break;
    }
    default:
      fail("cannot encode to type {}", type_name(type));
  }
}

void repack_mxfp4_row(const uint8_t* packed, const uint8_t* scales, int64_t n_groups, uint8_t* out) {
  for (int64_t g = 0; g < n_groups; ++g) {
    const uint8_t* P = packed + g * 16;
    uint8_t* o = out + g * 17;
    o[0] = scales[g];
    // codes c[2i] = P[i] & 15, c[2i+1] = P[i] >> 4; qs[j] = c[j] | c[j+16] << 4
    for (int j = 0; j < 16; j += 2) {
      const uint8_t lo = P[j >> 1], hi = P[8 + (j >> 1)];
      o[1 + j] = static_cast<uint8_t>((lo & 0x0F) | ((hi & 0x0F) << 4));
      o[2 + j] = static_cast<uint8_t>((lo >> 4) | (hi & 0xF0));
    }
  }
}

// ---------------------------------------------------------------------------------------------
// schema and plan

namespace {

enum class Cls { Float, Packed, Scale };
enum class Rule { ForceF32, Float, IndexerSrc, Mxfp4 };

struct Expect {
  std::vector<std::vector<int64_t>> shapes;  // accepted shapes
  Cls cls = Cls::Float;
  int64_t layer = -1;
};

struct OutSpec {
  std::string name;
  Op op;
  std::vector<std::string> srcs;
  std::vector<int64_t> ne;
  Rule rule;
  int64_t layer;
  int64_t n_head = 0, nope = 0, v_dim = 0, kv_lora = 0;
};

const char* cls_name(Cls c) {
  switch (c) {
    case Cls::Float: return "a float type (BF16, F16, F32)";
    case Cls::Packed: return "U8 (packed FP4 codes)";
    case Cls::Scale: return "U8 or F8_E8M0 (E8M0 scales)";
  }
  return "?";
}

bool dtype_ok(Cls c, st::Dtype t) {
  switch (c) {
    case Cls::Float: return t == st::Dtype::BF16 || t == st::Dtype::F16 || t == st::Dtype::F32 || t == st::Dtype::F64;
    case Cls::Packed: return t == st::Dtype::U8;
    case Cls::Scale: return t == st::Dtype::U8 || t == st::Dtype::F8_E8M0;
  }
  return false;
}

struct Schema {
  std::map<std::string, Expect> expect;  // stripped HF name -> expectation
  std::vector<OutSpec> outs;

  void src(const std::string& name, std::vector<std::vector<int64_t>> shapes, int64_t layer, Cls cls = Cls::Float) {
    expect[name] = Expect{std::move(shapes), cls, layer};
  }
  // 1:1 tensor: GGUF ne = reversed HF shape
  void simple(const std::string& hf, const std::string& gg, std::vector<int64_t> shape, Rule rule, int64_t layer) {
    src(hf, {shape}, layer);
    std::vector<int64_t> ne(shape.rbegin(), shape.rend());
    outs.push_back(OutSpec{gg, Op::Copy, {hf}, ne, rule, layer});
  }
};

Schema build_schema(const K3Dims& D) {
  Schema S;
  const int64_t d = D.d, H = D.n_head, C = D.n_head * D.kda_dim;
  auto mat = [&](const std::string& hf, const std::string& gg, int64_t out, int64_t in, int64_t layer) {
    S.simple(hf, gg, {out, in}, Rule::Float, layer);
  };
  auto vec = [&](const std::string& hf, const std::string& gg, int64_t n, int64_t layer) {
    S.simple(hf, gg, {n}, Rule::ForceF32, layer);
  };
  auto res = [&](const std::string& base, const std::string& gg, int64_t layer) {
    S.src(base + "_norm.weight", {{d}}, layer);
    S.src(base + "_proj.weight", {{1, d}, {d}}, layer);
    S.outs.push_back(OutSpec{gg, Op::ResScore, {base + "_norm.weight", base + "_proj.weight"}, {d}, Rule::ForceF32, layer});
  };

  mat("model.embed_tokens.weight", "token_embd.weight", D.vocab, d, -1);
  for (int64_t il = 0; il < D.n_layer; ++il) {
    const std::string p = "model.layers." + std::to_string(il) + ".";
    const std::string b = "blk." + std::to_string(il) + ".";
    vec(p + "input_layernorm.weight", b + "attn_norm.weight", d, il);
    res(p + "self_attention_res", b + "attn_res_score.weight", il);
    const std::string a = p + "self_attn.";
    if (!D.is_mla[il]) {
      for (const char* x : {"q", "k", "v"}) mat(a + x + "_proj.weight", b + "attn_" + x + ".weight", C, d, il);
      for (const char* x : {"q", "k", "v"}) {
        std::string hf = a + x + "_conv1d.weight";
        S.src(hf, {{C, 1, D.conv_kernel}, {C, D.conv_kernel}}, il);
        S.outs.push_back(OutSpec{b + "ssm_conv1d_" + x + ".weight", Op::ConvReshape, {hf}, {D.conv_kernel, 1, C, 1},
                                 Rule::ForceF32, il});
      }
      mat(a + "f_a_proj.weight", b + "ssm_f_a.weight", D.kda_dim, d, il);
      mat(a + "f_b_proj.weight", b + "ssm_f_b.weight", C, D.kda_dim, il);
      // A_log: padded to max(heads, head_dim) in K3; any length >= heads, extra dims of size 1 allowed
      {
        std::vector<std::vector<int64_t>> shapes;
        for (int64_t n : {H, D.kda_dim, std::max(H, D.kda_dim)}) {
          if (n < H) continue;
          shapes.push_back({n});
          shapes.push_back({1, 1, n, 1});
        }
        S.src(a + "A_log", shapes, il);
        S.outs.push_back(OutSpec{b + "ssm_a", Op::NegExpSlice, {a + "A_log"}, {H}, Rule::ForceF32, il});
      }
      S.simple(a + "dt_bias", b + "ssm_dt.bias", {C}, Rule::ForceF32, il);
      mat(a + "b_proj.weight", b + "ssm_beta.weight", H, d, il);
      mat(a + "g_proj.weight", b + "ssm_g.weight", C, d, il);
      vec(a + "o_norm.weight", b + "ssm_norm.weight", D.kda_dim, il);
      mat(a + "o_proj.weight", b + "attn_output.weight", d, C, il);
    } else {
      mat(a + "q_a_proj.weight", b + "attn_q_a.weight", D.q_lora, d, il);
      vec(a + "q_a_layernorm.weight", b + "attn_q_a_norm.weight", D.q_lora, il);
      mat(a + "q_b_proj.weight", b + "attn_q_b.weight", H * (D.nope + D.rope), D.q_lora, il);
      mat(a + "kv_a_proj_with_mqa.weight", b + "attn_kv_a_mqa.weight", D.kv_lora + D.rope, d, il);
      vec(a + "kv_a_layernorm.weight", b + "attn_kv_a_norm.weight", D.kv_lora, il);
      {
        const int64_t hkv = D.n_head_kv;
        std::string hf = a + "kv_b_proj.weight";
        S.src(hf, {{hkv * (D.nope + D.v_dim), D.kv_lora}}, il);
        OutSpec k{b + "attn_k_b.weight", Op::KvbK, {hf}, {D.nope, D.kv_lora, hkv}, Rule::Float, il};
        k.n_head = hkv, k.nope = D.nope, k.v_dim = D.v_dim, k.kv_lora = D.kv_lora;
        OutSpec v = k;
        v.name = b + "attn_v_b.weight", v.op = Op::KvbV, v.ne = {D.kv_lora, D.v_dim, hkv};
        S.outs.push_back(k);
        S.outs.push_back(v);
      }
      if (D.output_gate) mat(a + "g_proj.weight", b + "attn_gate.weight", H * D.v_dim, d, il);
      mat(a + "o_proj.weight", b + "attn_output.weight", d, H * D.v_dim, il);
      if (D.idx_topk > 0) {
        const std::string x = a + "indexer.", bi = b + "indexer.";
        S.simple(x + "wq_b.weight", bi + "attn_q_b.weight", {D.idx_heads * D.idx_dim, D.q_lora}, Rule::IndexerSrc, il);
        S.simple(x + "wk.weight", bi + "attn_k.weight", {D.idx_dim, d}, Rule::IndexerSrc, il);
        vec(x + "k_norm.weight", bi + "k_norm.weight", D.idx_dim, il);
        vec(x + "k_norm.bias", bi + "k_norm.bias", D.idx_dim, il);
        S.simple(x + "weights_proj.weight", bi + "proj.weight", {D.idx_heads, d}, Rule::ForceF32, il);
      }
    }
    vec(p + "post_attention_layernorm.weight", b + "ffn_norm.weight", d, il);
    res(p + "mlp_res", b + "ffn_res_score.weight", il);
    if (!D.is_moe(il)) {
      mat(p + "mlp.gate_proj.weight", b + "ffn_gate.weight", D.ff_dense, d, il);
      mat(p + "mlp.up_proj.weight", b + "ffn_up.weight", D.ff_dense, d, il);
      mat(p + "mlp.down_proj.weight", b + "ffn_down.weight", d, D.ff_dense, il);
    } else {
      const std::string m = p + "block_sparse_moe.";
      S.simple(m + "gate.weight", b + "ffn_gate_inp.weight", {D.n_expert, d}, Rule::ForceF32, il);
      S.simple(m + "gate.e_score_correction_bias", b + "exp_probs_b.bias", {D.n_expert}, Rule::ForceF32, il);
      mat(m + "routed_expert_down_proj.weight", b + "ffn_routed_down.weight", D.latent, d, il);
      if (D.routed_norm) vec(m + "routed_expert_norm.weight", b + "ffn_routed_norm.weight", D.latent, il);
      mat(m + "routed_expert_up_proj.weight", b + "ffn_routed_up.weight", d, D.latent, il);
      if (D.n_shared > 0) {
        const int64_t sw = D.n_shared * D.moe_ff;
        mat(m + "shared_experts.gate_proj.weight", b + "ffn_gate_shexp.weight", sw, d, il);
        mat(m + "shared_experts.up_proj.weight", b + "ffn_up_shexp.weight", sw, d, il);
        mat(m + "shared_experts.down_proj.weight", b + "ffn_down_shexp.weight", d, sw, il);
      }
      struct W { const char* w; const char* gg; int64_t out, in; };
      const W ws[3] = {{"w1", "ffn_gate_exps", D.moe_ff, D.latent},
                       {"w3", "ffn_up_exps", D.moe_ff, D.latent},
                       {"w2", "ffn_down_exps", D.latent, D.moe_ff}};
      for (const W& w : ws) {
        OutSpec o{b + w.gg + ".weight", D.mxfp4_experts ? Op::StackMxfp4 : Op::StackExperts, {}, {w.in, w.out, D.n_expert},
                  D.mxfp4_experts ? Rule::Mxfp4 : Rule::Float, il};
        for (int64_t e = 0; e < D.n_expert; ++e) {
          std::string base = m + "experts." + std::to_string(e) + "." + w.w + ".";
          if (D.mxfp4_experts) {
            S.src(base + "weight_packed", {{w.out, w.in / 2}}, il, Cls::Packed);
            S.src(base + "weight_scale", {{w.out, w.in / 32}}, il, Cls::Scale);
            o.srcs.push_back(base + "weight_packed");
            o.srcs.push_back(base + "weight_scale");
          } else {
            S.src(base + "weight", {{w.out, w.in}}, il);
            o.srcs.push_back(base + "weight");
          }
        }
        S.outs.push_back(std::move(o));
      }
    }
  }
  vec("model.norm.weight", "output_norm.weight", d, -1);
  res("model.output_attn_res", "output_res_score.weight", -1);
  if (!D.tie_embeddings) mat("lm_head.weight", "output.weight", D.vocab, d, -1);
  return S;
}

// Layer index of "model.layers.N...." or -1.
int64_t layer_of(const std::string& n) {
  const std::string pre = "model.layers.";
  if (n.rfind(pre, 0) != 0) return -1;
  size_t i = pre.size();
  int64_t v = 0;
  bool any = false;
  while (i < n.size() && std::isdigit(static_cast<unsigned char>(n[i]))) {
    v = v * 10 + (n[i] - '0');
    any = true;
    if (v > (int64_t(1) << 40)) return -1;
    ++i;
  }
  return (any && i < n.size() && n[i] == '.') ? v : -1;
}

bool is_routed_expert(const std::string& n) {
  size_t p = n.find(".block_sparse_moe.experts.");
  if (p == std::string::npos || layer_of(n) < 0) return false;
  size_t i = p + std::string(".block_sparse_moe.experts.").size();
  size_t j = i;
  while (j < n.size() && std::isdigit(static_cast<unsigned char>(n[j]))) ++j;
  if (j == i || j >= n.size() || n[j] != '.') return false;
  std::string rest = n.substr(j + 1);
  return rest == "w1.weight_packed" || rest == "w2.weight_packed" || rest == "w3.weight_packed" ||
         rest == "w1.weight_scale" || rest == "w2.weight_scale" || rest == "w3.weight_scale";
}

GgmlType resolve_type(Rule r, OutType ot, const std::vector<int64_t>& ne, st::Dtype src) {
  switch (r) {
    case Rule::ForceF32: return GgmlType::F32;
    case Rule::Mxfp4: return GgmlType::MXFP4;
    case Rule::IndexerSrc:
      if (ot == OutType::Q8_0) {  // never quantized: keep the source precision
        if (src == st::Dtype::BF16) return GgmlType::BF16;
        if (src == st::Dtype::F16) return GgmlType::F16;
        return GgmlType::F32;
      }
      [[fallthrough]];
    case Rule::Float:
      switch (ot) {
        case OutType::F32: return GgmlType::F32;
        case OutType::F16: return GgmlType::F16;
        case OutType::Q8_0: return ne[0] % 32 == 0 ? GgmlType::Q8_0 : GgmlType::F16;  // llama.cpp falls back to F16
        default: return GgmlType::BF16;
      }
  }
  return GgmlType::F32;
}

uint64_t tensor_bytes(GgmlType t, const std::vector<int64_t>& ne) {
  uint64_t rows = 1;
  for (size_t i = 1; i < ne.size(); ++i) rows *= static_cast<uint64_t>(ne[i]);
  return row_bytes(t, static_cast<uint64_t>(ne[0])) * rows;
}

}  // namespace

Plan make_plan(const K3Dims& D, const st::Checkpoint& ckpt, OutType outtype, int64_t keep, const std::string& label) {
  if (keep < 0) keep = D.n_layer;
  check(keep >= 1 && keep <= D.n_layer, "--layers {} out of range: the model has {} layers", keep, D.n_layer);
  Schema S = build_schema(D);
  Plan plan;

  // 1. classify the checkpoint's tensors
  std::map<std::string, const st::Tensor*> found;  // stripped name -> tensor
  std::vector<std::string> problems;
  size_t n_problems = 0;
  auto problem = [&](std::string s) {
    if (++n_problems <= 20) problems.push_back(std::move(s));
  };
  const std::string lm = "language_model.";
  for (const std::string& full : ckpt.names()) {
    const st::Tensor& t = ckpt.get(full);
    if (full.rfind("vision_tower.", 0) == 0 || full.rfind("mm_projector.", 0) == 0) {
      plan.dropped.push_back(full);
      plan.dropped_bytes += t.nbytes;
      continue;
    }
    std::string n = full.rfind(lm, 0) == 0 ? full.substr(lm.size()) : full;
    if (n.size() >= 14 && n.compare(n.size() - 14, 14, ".weight_packed") == 0 && !is_routed_expert(n)) {
      problem(fmt::format("tensor '{}' ({}): weight_packed outside the routed experts; only "
                          "block_sparse_moe.experts.E.wK may be MXFP4-packed",
                          full, t.file));
      continue;
    }
    auto it = S.expect.find(n);
    if (it == S.expect.end()) {
      int64_t il = layer_of(n);
      if (n.find(".indexer.") != std::string::npos && il >= 0 && il < D.n_layer && !D.is_mla[il]) {
        problem(fmt::format("tensor '{}' ({}): indexer tensor in layer {}, which is not a full-attention layer "
                            "(full_attn_layers, 1-indexed: {})",
                            full, t.file, il, fmt::join(D.full_attn_1based, ",")));
      } else if (n.find(".indexer.") != std::string::npos && D.idx_topk == 0) {
        problem(fmt::format("tensor '{}' ({}): indexer tensor but config.json has no index_topk > 0", full, t.file));
      } else if (is_routed_expert(n) && !D.mxfp4_experts) {
        problem(fmt::format("tensor '{}' ({}): MXFP4-packed expert but config.json has no compressed-tensors "
                            "mxfp4-pack-quantized quantization_config",
                            full, t.file));
      } else {
        problem(fmt::format("tensor '{}' ({}): unrecognized tensor (not part of the Kimi-K3 layout for this config)",
                            full, t.file));
      }
      continue;
    }
    const Expect& e = it->second;
    if (!dtype_ok(e.cls, t.dtype)) {
      problem(fmt::format("tensor '{}' ({}): dtype {} but expected {}", full, t.file, st::dtype_name(t.dtype),
                          cls_name(e.cls)));
      continue;
    }
    if (std::find(e.shapes.begin(), e.shapes.end(), t.shape) == e.shapes.end()) {
      std::vector<std::string> acc;
      for (auto& s : e.shapes) acc.push_back(shape_str(s));
      problem(fmt::format("tensor '{}' ({}): shape {} but the config implies {}", full, t.file, shape_str(t.shape),
                          fmt::join(acc, " or ")));
      continue;
    }
    found.emplace(n, &t);
  }
  for (const auto& [n, e] : S.expect) {
    if (found.count(n)) continue;
    bool bad_present = ckpt.find(n) || ckpt.find(lm + n);
    if (!bad_present) problem(fmt::format("tensor '{}{}' missing from the checkpoint {}", lm, n, label));
  }
  if (!problems.empty()) {
    std::string msg = fmt::format("{}: checkpoint does not match config.json:", label);
    for (auto& p : problems) msg += "\n  " + p;
    if (n_problems > problems.size()) msg += fmt::format("\n  ... and {} more", n_problems - problems.size());
    throw Error(msg);
  }

  // 2. resolve the output type
  OutType ot = outtype;
  if (ot == OutType::Auto) {
    ot = OutType::BF16;
    for (const auto& [n, t] : found) {
      if (t->shape.size() >= 2 && S.expect[n].cls == Cls::Float) {
        ot = t->dtype == st::Dtype::F16 ? OutType::F16 : OutType::BF16;
        break;
      }
    }
  }
  plan.outtype = ot;

  // 3. plan tensors
  for (const OutSpec& o : S.outs) {
    if (o.layer >= keep) {
      for (auto& s : o.srcs) plan.skipped.push_back(s);
      continue;
    }
    TensorPlan t;
    t.name = o.name;
    t.op = o.op;
    t.ne = o.ne;
    t.layer = o.layer;
    t.n_head = o.n_head, t.nope = o.nope, t.v_dim = o.v_dim, t.kv_lora = o.kv_lora;
    for (auto& s : o.srcs) t.src.push_back(found.at(s));
    t.type = resolve_type(o.rule, ot, o.ne, t.src[0]->dtype);
    if (t.type == GgmlType::MXFP4) plan.has_mxfp4 = true;
    t.nbytes = tensor_bytes(t.type, t.ne);
    plan.total_bytes += t.nbytes;
    plan.tensors.push_back(std::move(t));
  }
  if (plan.has_mxfp4) plan.ftype = FileType::MOSTLY_MXFP4_MOE;
  else if (ot == OutType::F32) plan.ftype = FileType::ALL_F32;
  else if (ot == OutType::F16) plan.ftype = FileType::MOSTLY_F16;
  else if (ot == OutType::Q8_0) plan.ftype = FileType::MOSTLY_Q8_0;
  else plan.ftype = FileType::MOSTLY_BF16;
  return plan;
}

// ---------------------------------------------------------------------------------------------
// produce

namespace {

GgmlType same_type(st::Dtype d) {
  switch (d) {
    case st::Dtype::F32: return GgmlType::F32;
    case st::Dtype::F16: return GgmlType::F16;
    case st::Dtype::BF16: return GgmlType::BF16;
    default: return GgmlType::I64;  // no match
  }
}

constexpr int64_t kChunkElems = int64_t(1) << 20;  // ~1M elements per chunk

// Streams rows [0, n_rows) of a row-major float tensor (row_len elements each, starting at element
// `first`) converted to `type`.
void stream_rows(const st::Tensor& src, int64_t first, int64_t n_rows, int64_t row_len, GgmlType type,
                 std::vector<float>& fbuf, std::vector<uint8_t>& obuf, const Sink& sink) {
  const uint64_t rb = row_bytes(type, static_cast<uint64_t>(row_len));
  if (same_type(src.dtype) == type) {  // plain copy straight from the mapping
    const size_t es = st::dtype_size(src.dtype);
    const int64_t rows_per = std::max<int64_t>(1, (int64_t(64) << 20) / (row_len * es));
    for (int64_t r = 0; r < n_rows; r += rows_per) {
      int64_t nr = std::min(rows_per, n_rows - r);
      sink(src.data + (first + r * row_len) * es, static_cast<size_t>(nr * row_len) * es);
    }
    return;
  }
  const int64_t rows_per = std::max<int64_t>(1, kChunkElems / row_len);
  fbuf.resize(static_cast<size_t>(std::min(rows_per, n_rows) * row_len));
  obuf.resize(static_cast<size_t>(std::min(rows_per, n_rows) * rb));
  for (int64_t r = 0; r < n_rows; r += rows_per) {
    int64_t nr = std::min(rows_per, n_rows - r);
    decode_f32(src, first + r * row_len, nr * row_len, fbuf.data());
    encode_rows(fbuf.data(), nr * row_len, row_len, type, obuf.data());
    sink(obuf.data(), static_cast<size_t>(nr * rb));
  }
}

}  // namespace

void produce(const TensorPlan& t, const Sink& sink) {
  std::vector<float> fbuf, fbuf2;
  std::vector<uint8_t> obuf;
  const int64_t ne0 = t.ne[0];
  switch (t.op) {
    case Op::Copy:
    case Op::ConvReshape: {
      const st::Tensor& s = *t.src[0];
      stream_rows(s, 0, s.numel() / ne0, ne0, t.type, fbuf, obuf, sink);
      break;
    }
    case Op::ResScore: {
      const st::Tensor &a = *t.src[0], &b = *t.src[1];
      fbuf.resize(ne0);
      fbuf2.resize(ne0);
      decode_f32(a, 0, ne0, fbuf.data());
      decode_f32(b, 0, ne0, fbuf2.data());
      for (int64_t i = 0; i < ne0; ++i) fbuf[i] = fbuf[i] * fbuf2[i];
      obuf.resize(row_bytes(t.type, ne0));
      encode_rows(fbuf.data(), ne0, ne0, t.type, obuf.data());
      sink(obuf.data(), obuf.size());
      break;
    }
    case Op::NegExpSlice: {
      fbuf.resize(ne0);
      decode_f32(*t.src[0], 0, ne0, fbuf.data());
      for (int64_t i = 0; i < ne0; ++i) fbuf[i] = static_cast<float>(-std::exp(static_cast<double>(fbuf[i])));
      obuf.resize(row_bytes(t.type, ne0));
      encode_rows(fbuf.data(), ne0, ne0, t.type, obuf.data());
      sink(obuf.data(), obuf.size());
      break;
    }
    case Op::KvbK: {  // out[h][l][n] = src[h*(nope+v) + n][l]
      const st::Tensor& s = *t.src[0];
      const int64_t per = t.nope + t.v_dim, L = t.kv_lora;
      std::vector<float> head(static_cast<size_t>(t.nope * L));
      fbuf.resize(static_cast<size_t>(L * t.nope));
      obuf.resize(static_cast<size_t>(row_bytes(t.type, t.nope) * L));
      for (int64_t h = 0; h < t.n_head; ++h) {
        decode_f32(s, h * per * L, t.nope * L, head.data());  // rows n = 0..nope-1 of head h
        for (int64_t l = 0; l < L; ++l)
          for (int64_t n = 0; n < t.nope; ++n) fbuf[l * t.nope + n] = head[n * L + l];
        encode_rows(fbuf.data(), L * t.nope, t.nope, t.type, obuf.data());
        sink(obuf.data(), obuf.size());
      }
      break;
    }
    case Op::KvbV: {  // out[h][j][l] = src[h*(nope+v) + nope + j][l]
      const st::Tensor& s = *t.src[0];
      const int64_t per = t.nope + t.v_dim, L = t.kv_lora;
      for (int64_t h = 0; h < t.n_head; ++h)
        stream_rows(s, (h * per + t.nope) * L, t.v_dim, L, t.type, fbuf, obuf, sink);
      break;
    }
    case Op::StackMxfp4: {
      const int64_t in = t.ne[0], out = t.ne[1], ng = in / 32;
      obuf.resize(static_cast<size_t>(out * ng * 17));
      for (size_t e = 0; e + 1 < t.src.size(); e += 2) {
        const st::Tensor &pk = *t.src[e], &sc = *t.src[e + 1];
        for (int64_t r = 0; r < out; ++r)
          repack_mxfp4_row(pk.data + r * ng * 16, sc.data + r * ng, ng, obuf.data() + r * ng * 17);
        sink(obuf.data(), obuf.size());
      }
      break;
    }
    case Op::StackExperts: {
      for (const st::Tensor* s : t.src) stream_rows(*s, 0, t.ne[1], ne0, t.type, fbuf, obuf, sink);
      break;
    }
  }
}

}  // namespace kimi::convert
