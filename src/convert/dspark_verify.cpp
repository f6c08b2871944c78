// `kimi verify` for a K3 DSpark draft (dspark.md §2): every GGUF tensor re-derived from the HF
// source with its own name map and index arithmetic (the kv_b split element by element from the
// GGUF side), compared byte for byte; every kimi-k3-dspark.* key against config.json.
#include <fmt/format.h>

#include <cstring>
#include <filesystem>
#include <map>
#include <set>

#include "convert/dspark.h"
#include "convert/verify.h"
#include "io/gguf.h"
#include "io/hf_config.h"
#include "io/safetensors.h"
#include "tensor/types.h"
#include "util/error.h"

namespace fs = std::filesystem;

namespace kimi::dspark {

namespace {

double src_elem(const st::Tensor& t, int64_t i) {
  switch (t.dtype) {
    case st::Dtype::BF16: {
      uint16_t h;
      std::memcpy(&h, t.data + 2 * i, 2);
      return bf16_to_f32(h);
    }
    case st::Dtype::F16: {
      uint16_t h;
      std::memcpy(&h, t.data + 2 * i, 2);
      return f16_to_f32(h);
    }
    case st::Dtype::F32: {
      float f;
      std::memcpy(&f, t.data + 4 * i, 4);
      return f;
    }
    default:
      fail("tensor '{}': dtype {} not expected in a DSpark draft", t.name, st::dtype_name(t.dtype));
  }
}

}  // namespace

convert::VerifyResult verify(const convert::VerifyOptions& o) {
  convert::VerifyResult res;
  const HfConfig cfg = HfConfig::load((fs::path(o.hf_dir) / "config.json").string());
  auto ck = st::Checkpoint::open(o.hf_dir);
  auto rd = gguf::Reader::open(o.gguf_path);
  const gguf::Value* a = rd->find("general.architecture");
  const std::string arch = a && a->type == gguf::ValueType::STRING ? a->s : std::string();
  check(arch == "kimi-k3-dspark", "{}: general.architecture is '{}', expected 'kimi-k3-dspark' (the HF directory is a "
        "DSpark draft)", o.gguf_path, arch.empty() ? "(missing)" : arch);
  auto problem = [&](std::string s) {
    if (res.problems.size() < o.max_report) res.problems.push_back(std::move(s));
  };
  const int64_t nope = cfg.get_int("qk_nope_head_dim"), vd = cfg.get_int("v_head_dim"), r = cfg.get_int("kv_lora_rank");

  // ---- keys
  const std::string A = "kimi-k3-dspark.";
  auto key_u = [&](const std::string& k, int64_t want) {
    const gguf::Value* v = rd->find(A + k);
    const bool ok = v && v->type == gguf::ValueType::UINT32 && int64_t(v->u) == want;
    (ok ? res.n_keys_match : res.n_keys_mismatch)++;
    if (!ok) problem(fmt::format("key {}{}: {}, config.json says {}", A, k, v ? v->to_string() : "missing", want));
  };
  auto key_f = [&](const std::string& k, double want) {
    const gguf::Value* v = rd->find(A + k);
    const bool ok = v && v->type == gguf::ValueType::FLOAT32 && float(v->f) == float(want);
    (ok ? res.n_keys_match : res.n_keys_mismatch)++;
    if (!ok) problem(fmt::format("key {}{}: {}, config.json says {}", A, k, v ? v->to_string() : "missing", want));
  };
  key_u("block_count", cfg.get_int("num_hidden_layers"));
  key_u("embedding_length", cfg.get_int("hidden_size"));
  key_u("feed_forward_length", cfg.get_int("intermediate_size"));
  key_u("vocab_size", cfg.get_int("vocab_size"));
  key_u("attention.head_count", cfg.get_int("num_attention_heads"));
  key_f("attention.layer_norm_rms_epsilon", cfg.get_float("rms_norm_eps"));
  key_u("attention.q_lora_rank", cfg.get_int("q_lora_rank"));
  key_u("attention.kv_lora_rank", r);
  key_u("attention.key_length_mla", nope + cfg.get_int("qk_rope_head_dim"));
  key_u("attention.value_length_mla", vd);
  key_u("rope.dimension_count", cfg.get_int("qk_rope_head_dim"));
  const auto& rp = cfg.has("rope_parameters") ? cfg.get("rope_parameters") : nlohmann::json::object();
  key_f("rope.freq_base", rp.contains("rope_theta") ? rp["rope_theta"].get<double>() : cfg.get_float("rope_theta"));
  if (rp.value("rope_type", std::string()) == "yarn" && rp.value("factor", 1.0) > 1.0) {
    key_f("rope.scaling.factor", rp["factor"].get<double>());
    key_u("rope.scaling.original_context_length", rp["original_max_position_embeddings"].get<int64_t>());
    key_f("rope.scaling.yarn_beta_fast", rp.value("beta_fast", 32.0));
    key_f("rope.scaling.yarn_beta_slow", rp.value("beta_slow", 1.0));
    key_f("rope.scaling.yarn_mscale", rp.value("mscale", 1.0));
    key_f("rope.scaling.yarn_mscale_all_dim", rp.value("mscale_all_dim", 0.0));
  }
  {
    std::vector<int64_t> want;
    for (auto& x : cfg.get("target_layer_ids")) want.push_back(x.get<int64_t>());
    const gguf::Value* v = rd->find(A + "target.layers");
    std::vector<int64_t> got;
    if (v && v->type == gguf::ValueType::ARRAY)
      for (auto u : v->uints) got.push_back(int64_t(u));
    (got == want ? res.n_keys_match : res.n_keys_mismatch)++;
    if (got != want) problem(fmt::format("key {}target.layers does not match target_layer_ids", A));
  }
  key_u("target.block_count", cfg.get_int("target_num_hidden_layers"));
  key_u("target.embedding_length", cfg.get_int("target_hidden_size"));
  key_u("block_size", cfg.get_int_or("block_size", 7));
  key_u("mask_token_id", cfg.get_int("mask_token_id"));
  key_u("markov_rank", cfg.get_int("markov_rank"));

  // ---- tensors: GGUF name -> HF source (own map)
  static const std::map<std::string, std::string> layer_names = {
      {"attn_norm.weight", "input_layernorm.weight"},
      {"attn_q_a.weight", "self_attn.q_a_proj.weight"},
      {"attn_q_a_norm.weight", "self_attn.q_a_layernorm.weight"},
      {"attn_q_b.weight", "self_attn.q_b_proj.weight"},
      {"attn_kv_a_mqa.weight", "self_attn.kv_a_proj_with_mqa.weight"},
      {"attn_kv_a_norm.weight", "self_attn.kv_a_layernorm.weight"},
      {"attn_k_b.weight", "self_attn.kv_b_proj.weight"},
      {"attn_v_b.weight", "self_attn.kv_b_proj.weight"},
      {"attn_output.weight", "self_attn.o_proj.weight"},
      {"ffn_norm.weight", "post_attention_layernorm.weight"},
      {"ffn_gate.weight", "mlp.gate_proj.weight"},
      {"ffn_up.weight", "mlp.up_proj.weight"},
      {"ffn_down.weight", "mlp.down_proj.weight"},
  };
  static const std::map<std::string, std::string> model_names = {
      {"dspark.context_proj.weight", "context_proj.weight"}, {"dspark.context_norm.weight", "context_norm.weight"},
      {"output_norm.weight", "final_norm.weight"},         {"dspark.markov_w1.weight", "markov_head.markov_w1.weight"},
      {"dspark.markov_w2.weight", "markov_head.markov_w2.weight"},
  };
  std::set<std::string> used;
  for (const auto& ti : rd->tensors()) {
    ++res.n_tensors;
    std::string src, part;
    if (auto it = model_names.find(ti.name); it != model_names.end()) {
      src = it->second;
    } else if (ti.name.rfind("blk.", 0) == 0) {
      const size_t dot = ti.name.find('.', 4);
      part = dot == std::string::npos ? "" : ti.name.substr(dot + 1);
      if (auto it2 = layer_names.find(part); it2 != layer_names.end())
        src = "layers." + ti.name.substr(4, dot - 4) + "." + it2->second;
    }
    const st::Tensor* t = src.empty() ? nullptr : ck->find(src);
    if (!t && !src.empty()) t = ck->find("model." + src);
    if (!t) {
      ++res.n_mismatched;
      problem(fmt::format("{}: no source tensor{}", ti.name, src.empty() ? "" : " '" + src + "'"));
      continue;
    }
    used.insert(t->name);
    const int64_t n = ti.nelements();
    // element k of the GGUF tensor (ggml order, ne[0] fastest) from the source
    std::vector<float> want(static_cast<size_t>(n));
    bool shape_ok = true;
    if (part == "attn_k_b.weight" || part == "attn_v_b.weight") {
      const bool k = part == "attn_k_b.weight";
      const int64_t H = t->shape[0] / (nope + vd);
      shape_ok = k ? (ti.ne[0] == nope && ti.ne[1] == r && ti.ne[2] == H) : (ti.ne[0] == r && ti.ne[1] == vd && ti.ne[2] == H);
      for (int64_t e = 0; shape_ok && e < n; ++e) {
        const int64_t i0 = e % ti.ne[0], i1 = (e / ti.ne[0]) % ti.ne[1], h = e / (ti.ne[0] * ti.ne[1]);
        // k_b: (i0 = nope index, i1 = latent c); v_b: (i0 = latent c, i1 = v index)
        const int64_t row = k ? h * (nope + vd) + i0 : h * (nope + vd) + nope + i1, col = k ? i1 : i0;
        want[size_t(e)] = float(src_elem(*t, row * r + col));
      }
    } else {
      int64_t src_n = t->numel();
      shape_ok = src_n == n && (t->shape.size() == 1 ? ti.ne[0] == t->shape[0]
                                                     : ti.ne[0] == t->shape[1] && ti.ne[1] == t->shape[0]);
      for (int64_t e = 0; shape_ok && e < n; ++e) want[size_t(e)] = float(src_elem(*t, e));
    }
    if (!shape_ok) {
      ++res.n_mismatched;
      problem(fmt::format("{}: shape {} does not match source '{}' {}", ti.name, ti.shape_string(), t->name,
                          t->shape_string()));
      continue;
    }
    std::vector<uint8_t> bytes;
    if (ti.type == GgmlType::F32) {
      bytes.resize(size_t(n) * 4);
      std::memcpy(bytes.data(), want.data(), bytes.size());
    } else if (ti.type == GgmlType::BF16 || ti.type == GgmlType::F16) {
      bytes.resize(size_t(n) * 2);
      for (int64_t e = 0; e < n; ++e) {
        const uint16_t h = ti.type == GgmlType::BF16 ? f32_to_bf16(want[size_t(e)]) : f32_to_f16(want[size_t(e)]);
        std::memcpy(bytes.data() + 2 * e, &h, 2);
      }
    }
    const bool vec = ti.n_dims == 1;
    const bool type_ok = vec ? ti.type == GgmlType::F32 : !bytes.empty();
    if (type_ok && bytes.size() == ti.nbytes && std::memcmp(bytes.data(), ti.data, bytes.size()) == 0) {
      ++res.n_exact;
    } else {
      ++res.n_mismatched;
      problem(fmt::format("{}: {} bytes differ from source '{}'", ti.name, type_name(ti.type), t->name));
    }
  }
  for (const auto& name : ck->names()) {
    std::string s = name.rfind("model.", 0) == 0 ? name.substr(6) : name;
    const bool dropped = s == "embed_tokens.weight" || s.rfind("confidence_head.", 0) == 0;
    if (!dropped && !used.count(name)) {
      ++res.n_missing;
      problem(fmt::format("source tensor '{}' is not in the GGUF", name));
    }
  }
  return res;
}

}  // namespace kimi::dspark
