// K3 DSpark draft: synthetic checkpoints and HF -> GGUF conversion (dspark.md §1, §2, §4).
#include "convert/dspark.h"

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <set>

#include "convert/synth.h"
#include "io/gguf.h"
#include "io/hf_config.h"
#include "io/safetensors.h"
#include "tensor/types.h"
#include "util/error.h"
#include "util/tempfile.h"

namespace fs = std::filesystem;

namespace kimi::dspark {

// ------------------------------------------------------------------------------------------------
// presets (dspark.md §4)

const std::vector<std::string>& preset_names() {
  static const std::vector<std::string> n{"dspark-tiny", "dspark-small"};
  return n;
}

bool is_preset(const std::string& name) {
  for (auto& p : preset_names())
    if (p == name) return true;
  return false;
}

std::vector<int64_t> scale_taps(int64_t n) {
  check(n >= 5, "dspark: a target of {} layers is too shallow for 5 taps (need >= 5 layers)", n);
  static const int64_t k3[5] = {2, 23, 47, 71, 89};
  std::vector<int64_t> t;
  for (int64_t v : k3) {
    int64_t x = static_cast<int64_t>(std::llround(static_cast<double>(v) * static_cast<double>(n - 1) / 92.0));
    if (!t.empty() && x <= t.back()) x = t.back() + 1;
    t.push_back(std::min(x, n - 1));
  }
  // capping at n - 1 may have made the tail equal: walk back from the end
  for (size_t i = t.size() - 1; i > 0; --i)
    if (t[i - 1] >= t[i]) t[i - 1] = t[i] - 1;
  return t;
}

SynthConfig synth_preset(const std::string& name) {
  SynthConfig c;
  c.preset = name;
  if (name == "dspark-tiny") {
    c.target_preset = "tiny";
    c.hidden = 64, c.layers = 5, c.heads = 4, c.q_lora = 32, c.kv_lora = 32, c.nope = 16, c.rope = 8, c.v_dim = 16;
    c.ff = 128, c.rank = 16;
  } else if (name == "dspark-small") {
    c.target_preset = "small";
    c.hidden = 2048, c.layers = 5, c.heads = 16, c.q_lora = 512, c.kv_lora = 512, c.nope = 128, c.rope = 64;
    c.v_dim = 128, c.ff = 4096, c.rank = 256;
  } else {
    fail("unknown synth preset '{}' (expected tiny, small, k3-layers, dspark-tiny or dspark-small)", name);
  }
  const synth::Config t = synth::preset(c.target_preset);
  c.vocab = t.vocab;
  c.target_hidden = t.hidden;
  c.target_layers = t.layers;
  c.taps = scale_taps(t.layers);
  c.mask_token = c.vocab - 3;
  c.max_pos = t.max_pos;
  c.yarn_orig = 64;  // small contexts reach the interpolated frequencies (dspark.md §4)
  return c;
}

nlohmann::ordered_json config_json(const SynthConfig& c) {
  nlohmann::ordered_json j;
  j["architectures"] = {"K3DSparkModel"};
  j["model_type"] = "k3_dspark";
  j["hidden_size"] = c.hidden;
  j["intermediate_size"] = c.ff;
  j["num_hidden_layers"] = c.layers;
  j["num_attention_heads"] = c.heads;
  j["num_key_value_heads"] = c.heads;
  j["q_lora_rank"] = c.q_lora;
  j["kv_lora_rank"] = c.kv_lora;
  j["qk_nope_head_dim"] = c.nope;
  j["qk_rope_head_dim"] = c.rope;
  j["v_head_dim"] = c.v_dim;
  j["mla_use_nope"] = false;
  j["mla_use_output_gate"] = false;
  j["vocab_size"] = c.vocab;
  j["draft_vocab_size"] = c.vocab;
  j["rms_norm_eps"] = c.eps;
  j["hidden_act"] = "silu";
  j["max_position_embeddings"] = c.max_pos;
  j["rope_theta"] = c.rope_theta;
  j["rope_parameters"] = {{"rope_type", "yarn"},          {"factor", c.yarn_factor},
                          {"original_max_position_embeddings", static_cast<int64_t>(c.yarn_orig)},
                          {"rope_theta", c.rope_theta},   {"beta_fast", c.beta_fast},
                          {"beta_slow", c.beta_slow},     {"mscale", c.mscale},
                          {"mscale_all_dim", c.mscale_all}};
  j["num_target_layers"] = static_cast<int64_t>(c.taps.size());
  j["target_hidden_size"] = c.target_hidden;
  j["target_num_hidden_layers"] = c.target_layers;
  j["target_layer_ids"] = c.taps;
  j["mask_token_id"] = c.mask_token;
  j["block_size"] = c.block;
  j["markov_rank"] = c.rank;
  j["markov_head_type"] = "vanilla";
  j["enable_confidence_head"] = true;
  j["confidence_head_with_markov"] = true;
  j["torch_dtype"] = "bfloat16";
  return j;
}

std::vector<std::pair<std::string, std::vector<int64_t>>> tensor_list(const SynthConfig& c) {
  std::vector<std::pair<std::string, std::vector<int64_t>>> t;
  const int64_t d = c.hidden, H = c.heads;
  t.push_back({"embed_tokens.weight", {c.vocab, d}});
  t.push_back({"context_proj.weight", {d, static_cast<int64_t>(c.taps.size()) * c.target_hidden}});
  t.push_back({"context_norm.weight", {d}});
  for (int64_t l = 0; l < c.layers; ++l) {
    const std::string p = fmt::format("layers.{}.", l);
    t.push_back({p + "input_layernorm.weight", {d}});
    t.push_back({p + "self_attn.q_a_proj.weight", {c.q_lora, d}});
    t.push_back({p + "self_attn.q_a_layernorm.weight", {c.q_lora}});
    t.push_back({p + "self_attn.q_b_proj.weight", {H * (c.nope + c.rope), c.q_lora}});
    t.push_back({p + "self_attn.kv_a_proj_with_mqa.weight", {c.kv_lora + c.rope, d}});
    t.push_back({p + "self_attn.kv_a_layernorm.weight", {c.kv_lora}});
    t.push_back({p + "self_attn.kv_b_proj.weight", {H * (c.nope + c.v_dim), c.kv_lora}});
    t.push_back({p + "self_attn.o_proj.weight", {d, H * c.v_dim}});
    t.push_back({p + "post_attention_layernorm.weight", {d}});
    t.push_back({p + "mlp.gate_proj.weight", {c.ff, d}});
    t.push_back({p + "mlp.up_proj.weight", {c.ff, d}});
    t.push_back({p + "mlp.down_proj.weight", {d, c.ff}});
  }
  t.push_back({"final_norm.weight", {d}});
  t.push_back({"markov_head.markov_w1.weight", {c.vocab, c.rank}});
  t.push_back({"markov_head.markov_w2.weight", {c.vocab, c.rank}});
  t.push_back({"confidence_head.proj.weight", {1, d + c.rank}});
  t.push_back({"confidence_head.proj.bias", {1}});
  return t;
}

namespace {

uint64_t mix64(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

// approximately N(0, 1) (sum of four uniforms, rescaled), element i of the tensor keyed by `key`
float normal(uint64_t key, uint64_t i) {
  const uint64_t h = mix64(key + (i + 1) * 0x9E3779B97F4A7C15ull);
  const float s = float(h & 0xffff) + float((h >> 16) & 0xffff) + float((h >> 32) & 0xffff) + float(h >> 48);
  return (s * (1.0f / 65536.0f) - 2.0f) * 1.7320508f;
}

uint64_t name_key(uint64_t seed, const std::string& name) {
  uint64_t h = 0xcbf29ce484222325ull;  // FNV-1a
  for (unsigned char ch : name) h = (h ^ ch) * 0x100000001b3ull;
  return mix64(h ^ mix64(seed + 0xD5A4Dull));
}

bool ends_with(const std::string& s, const std::string& t) {
  return s.size() >= t.size() && s.compare(s.size() - t.size(), t.size(), t) == 0;
}

}  // namespace

std::vector<float> tensor_values(const SynthConfig& c, const std::string& name) {
  std::vector<int64_t> shape;
  for (auto& [n, s] : tensor_list(c))
    if (n == name) shape = s;
  check(!shape.empty(), "dspark synth: no tensor '{}' in preset '{}'", name, c.preset);
  if (name == "embed_tokens.weight") {  // the frozen target embedding, copied
    synth::Config t = synth::preset(c.target_preset);
    t.seed = c.seed;
    return synth::tensor_values(t, "language_model.model.embed_tokens.weight");
  }
  int64_t n = 1;
  for (auto v : shape) n *= v;
  std::vector<float> v(static_cast<size_t>(n));
  const uint64_t key = name_key(c.seed, name);
  const bool norm = ends_with(name, "norm.weight");
  float a = 0.0f;
  if (norm) a = 0.1f;
  else if (name == "markov_head.markov_w1.weight") a = 1.0f;
  else if (name == "confidence_head.proj.bias") a = 0.1f;
  else a = 1.0f / std::sqrt(static_cast<float>(shape.back()));  // keeps activations O(1)
  // the Markov bias is a small correction of the base logits (rank-r products of O(1) terms)
  if (name == "markov_head.markov_w2.weight") a = 0.5f / std::sqrt(static_cast<float>(shape.back()));
  for (int64_t i = 0; i < n; ++i) v[size_t(i)] = (norm ? 1.0f : 0.0f) + a * normal(key, uint64_t(i));
  return v;
}

SynthSummary write_synth(const SynthConfig& c, const std::string& dir, bool force) {
  check(!dir.empty(), "synth: no output directory given");
  const fs::path out = fs::path(dir).lexically_normal();
  const fs::path final_path = out.has_filename() ? out : out.parent_path();
  std::error_code ec;
  bool replace = false;
  if (fs::exists(final_path, ec)) {
    check(fs::is_directory(final_path, ec), "synth: output path '{}' exists and is not a directory", final_path.string());
    if (!fs::is_empty(final_path, ec))
      check(force, "synth: output directory '{}' exists and is not empty (use --force to replace it)",
            final_path.string());
    replace = true;
  }
  if (final_path.has_parent_path()) {
    fs::create_directories(final_path.parent_path(), ec);
    check(!ec, "synth: cannot create directory '{}': {}", final_path.parent_path().string(), ec.message());
  }
  const fs::path tmp = create_temp_dir(final_path.string());
  SynthSummary sum;
  try {
    const auto list = tensor_list(c);
    st::Writer w((tmp / "model.safetensors").string());
    w.add_metadata("format", "pt");
    for (auto& [n, s] : list) w.add_tensor(n, st::Dtype::BF16, s);
    w.begin();
    std::vector<uint16_t> bf;
    for (auto& [n, s] : list) {
      auto v = tensor_values(c, n);
      bf.resize(v.size());
      for (size_t i = 0; i < v.size(); ++i) bf[i] = f32_to_bf16(v[i]);
      w.write(n, bf.data(), bf.size() * 2);
      ++sum.tensors;
      sum.parameters += v.size();
    }
    w.finish();
    sum.bytes = w.data_bytes();
    std::ofstream f(tmp / "config.json", std::ios::binary);
    f << config_json(c).dump(2) << "\n";
    f.close();
    check(f.good(), "synth: cannot write '{}'", (tmp / "config.json").string());
  } catch (...) {
    discard_temp(tmp.string());
    throw;
  }
  synth::install_dir(tmp.string(), final_path.string(), replace);
  return sum;
}

// ------------------------------------------------------------------------------------------------
// conversion (dspark.md §2)

bool is_dspark_config(const HfConfig& cfg) {
  if (cfg.root.is_object() && cfg.root.contains("model_type") && cfg.root["model_type"].is_string() &&
      cfg.root["model_type"].get<std::string>() == "k3_dspark")
    return true;
  return cfg.top_architecture() == "K3DSparkModel";
}

namespace {

struct Dims {
  int64_t d, L, H, q_lora, kv_lora, nope, rope, v, ff, V, rank, block, n_tap, d_t, n_t, mask, max_pos;
  std::vector<int64_t> taps;
  double eps, theta, factor = 1, orig = 0, beta_fast = 32, beta_slow = 1, mscale = 1, mscale_all = 0;
};

Dims read_dims(const HfConfig& c) {
  Dims D{};
  auto pos = [&](const std::string& k) {
    const int64_t v = c.get_int(k);
    check(v > 0 && v <= (int64_t{1} << 31), "{}: key '{}' = {}: expected a positive count", c.path, k, v);
    return v;
  };
  D.d = pos("hidden_size");
  D.L = pos("num_hidden_layers");
  check(D.L <= 64, "{}: key 'num_hidden_layers' = {}: a draft of more than 64 layers is not a DSpark draft", c.path, D.L);
  D.H = pos("num_attention_heads");
  D.q_lora = pos("q_lora_rank");
  D.kv_lora = pos("kv_lora_rank");
  D.nope = pos("qk_nope_head_dim");
  D.rope = pos("qk_rope_head_dim");
  check(D.rope % 2 == 0, "{}: key 'qk_rope_head_dim' = {}: must be even (rotated in pairs)", c.path, D.rope);
  D.v = pos("v_head_dim");
  D.ff = pos("intermediate_size");
  D.V = pos("vocab_size");
  D.rank = pos("markov_rank");
  D.block = c.get_int_or("block_size", 7);
  check(D.block >= 1 && D.block <= 64, "{}: key 'block_size' = {}: expected 1..64", c.path, D.block);
  D.d_t = pos("target_hidden_size");
  D.n_t = pos("target_num_hidden_layers");
  D.mask = c.get_int("mask_token_id");
  check(D.mask >= 0 && D.mask < D.V, "{}: key 'mask_token_id' = {}: outside the vocabulary [0, {})", c.path, D.mask, D.V);
  D.max_pos = c.get_int_or("max_position_embeddings", 0);
  D.eps = c.get_float("rms_norm_eps");
  check(!c.get_bool_or("mla_use_nope", false), "{}: key 'mla_use_nope' is true: the K3 DSpark draft is RoPE MLA", c.path);
  check(!c.get_bool_or("mla_use_output_gate", false),
        "{}: key 'mla_use_output_gate' is true: the K3 DSpark draft has no output gate", c.path);
  const std::string mh = c.has("markov_head_type") ? c.get_str("markov_head_type") : "vanilla";
  check(mh == "vanilla", "{}: key 'markov_head_type' = '{}': only 'vanilla' is supported", c.path, mh);
  const auto& tl = c.get("target_layer_ids");
  check(tl.is_array() && !tl.empty(), "{}: key 'target_layer_ids': expected a non-empty array", c.path);
  for (auto& x : tl) {
    check(x.is_number_integer(), "{}: key 'target_layer_ids': expected integers", c.path);
    const int64_t t = x.get<int64_t>();
    check(t >= 0 && t < D.n_t, "{}: key 'target_layer_ids': layer {} outside the target's 0..{}", c.path, t, D.n_t - 1);
    check(D.taps.empty() || t > D.taps.back(), "{}: key 'target_layer_ids': must be strictly ascending", c.path);
    D.taps.push_back(t);
  }
  D.n_tap = static_cast<int64_t>(D.taps.size());
  check(c.get_int_or("num_target_layers", D.n_tap) == D.n_tap,
        "{}: key 'num_target_layers' = {} but target_layer_ids has {} entries", c.path,
        c.get_int_or("num_target_layers", D.n_tap), D.n_tap);
  D.theta = c.get_float_or("rope_theta", 10000.0);
  if (c.has("rope_parameters")) {
    const auto& rp = c.get("rope_parameters");
    check(rp.is_object(), "{}: key 'rope_parameters': expected an object", c.path);
    auto num = [&](const char* k, double def) {
      if (!rp.contains(k) || rp[k].is_null()) return def;
      check(rp[k].is_number(), "{}: key 'rope_parameters.{}': expected a number", c.path, k);
      return rp[k].get<double>();
    };
    D.theta = num("rope_theta", D.theta);
    const std::string type = rp.contains("rope_type") && rp["rope_type"].is_string() ? rp["rope_type"].get<std::string>()
                                                                                      : "default";
    if (type == "yarn" || type == "deepseek_yarn") {
      D.factor = num("factor", 1.0);
      D.orig = num("original_max_position_embeddings", 0);
      D.beta_fast = num("beta_fast", 32), D.beta_slow = num("beta_slow", 1);
      D.mscale = num("mscale", 1), D.mscale_all = num("mscale_all_dim", 0);
      check(D.factor >= 1.0 && D.orig > 0, "{}: key 'rope_parameters': YaRN needs factor >= 1 and "
            "original_max_position_embeddings > 0", c.path);
    } else {
      check(type == "default", "{}: key 'rope_parameters.rope_type' = '{}': expected yarn or default", c.path, type);
    }
  }
  check(D.theta > 1.0, "{}: rope_theta = {}: expected > 1", c.path, D.theta);
  return D;
}

std::vector<float> decode(const st::Tensor& t) {
  const int64_t n = t.numel();
  std::vector<float> v(static_cast<size_t>(n));
  switch (t.dtype) {
    case st::Dtype::BF16:
      for (int64_t i = 0; i < n; ++i) {
        uint16_t h;
        std::memcpy(&h, t.data + 2 * i, 2);
        v[size_t(i)] = bf16_to_f32(h);
      }
      break;
    case st::Dtype::F16:
      for (int64_t i = 0; i < n; ++i) {
        uint16_t h;
        std::memcpy(&h, t.data + 2 * i, 2);
        v[size_t(i)] = f16_to_f32(h);
      }
      break;
    case st::Dtype::F32:
      std::memcpy(v.data(), t.data, size_t(n) * 4);
      break;
    default:
      fail("tensor '{}' ({}): dtype {} not supported for a DSpark draft (expected BF16, F16 or F32)", t.name, t.file,
           st::dtype_name(t.dtype));
  }
  return v;
}

struct OutTensor {
  std::string name;
  GgmlType type;
  std::vector<int64_t> ne;
  std::function<std::vector<float>()> values;
};

}  // namespace

convert::ConvertResult convert(const convert::ConvertOptions& o) {
  using gguf::Value;
  auto t0 = std::chrono::steady_clock::now();
  const std::string cfg_path = (fs::path(o.hf_dir) / "config.json").string();
  HfConfig cfg = HfConfig::load(cfg_path);
  const Dims D = read_dims(cfg);
  check(o.layers < 0, "convert: --layers does not apply to a DSpark draft");
  auto ck = st::Checkpoint::open(o.hf_dir);

  // the source tensors, shape-checked against the config (dspark.md §1.2)
  auto src = [&](const std::string& name, std::vector<int64_t> shape) -> const st::Tensor& {
    const st::Tensor* t = ck->find(name);
    if (!t) t = ck->find("model." + name);
    check(t != nullptr, "{}: tensor '{}' is missing (expected shape {})", o.hf_dir, name, fmt::join(shape, "x"));
    check(t->shape == shape, "{}: tensor '{}': shape {}, expected [{}]", t->file, name, t->shape_string(),
          fmt::join(shape, ", "));
    return *t;
  };

  convert::OutType ot = o.outtype;
  check(ot != convert::OutType::Q8_0, "convert: --outtype q8_0 is not supported for a DSpark draft (auto, bf16, f16, f32)");
  const st::Tensor& first = src("context_proj.weight", {D.d, D.n_tap * D.d_t});
  if (ot == convert::OutType::Auto)
    ot = first.dtype == st::Dtype::BF16 ? convert::OutType::BF16
         : first.dtype == st::Dtype::F16 ? convert::OutType::F16
                                          : convert::OutType::F32;
  const GgmlType mt = ot == convert::OutType::BF16 ? GgmlType::BF16 : ot == convert::OutType::F16 ? GgmlType::F16
                                                                                                 : GgmlType::F32;

  std::vector<OutTensor> out;
  auto mat = [&](const std::string& gname, const std::string& sname, std::vector<int64_t> shape) {
    const st::Tensor& t = src(sname, shape);
    out.push_back({gname, mt, {shape[1], shape[0]}, [&t] { return decode(t); }});
  };
  auto vec = [&](const std::string& gname, const std::string& sname, int64_t n) {
    const st::Tensor& t = src(sname, {n});
    out.push_back({gname, GgmlType::F32, {n}, [&t] { return decode(t); }});
  };
  mat("dspark.context_proj.weight", "context_proj.weight", {D.d, D.n_tap * D.d_t});
  vec("dspark.context_norm.weight", "context_norm.weight", D.d);
  for (int64_t l = 0; l < D.L; ++l) {
    const std::string p = fmt::format("layers.{}.", l), g = fmt::format("blk.{}.", l);
    vec(g + "attn_norm.weight", p + "input_layernorm.weight", D.d);
    mat(g + "attn_q_a.weight", p + "self_attn.q_a_proj.weight", {D.q_lora, D.d});
    vec(g + "attn_q_a_norm.weight", p + "self_attn.q_a_layernorm.weight", D.q_lora);
    mat(g + "attn_q_b.weight", p + "self_attn.q_b_proj.weight", {D.H * (D.nope + D.rope), D.q_lora});
    mat(g + "attn_kv_a_mqa.weight", p + "self_attn.kv_a_proj_with_mqa.weight", {D.kv_lora + D.rope, D.d});
    vec(g + "attn_kv_a_norm.weight", p + "self_attn.kv_a_layernorm.weight", D.kv_lora);
    // kv_b [H*(nope+v), r]: per head nope K rows then v V rows -> attn_k_b {nope, r, H}, attn_v_b {r, v, H}
    const st::Tensor& kvb = src(p + "self_attn.kv_b_proj.weight", {D.H * (D.nope + D.v), D.kv_lora});
    out.push_back({g + "attn_k_b.weight", mt, {D.nope, D.kv_lora, D.H}, [&kvb, D] {
                     auto w = decode(kvb);
                     std::vector<float> r(size_t(D.H * D.kv_lora * D.nope));
                     for (int64_t h = 0; h < D.H; ++h)
                       for (int64_t c = 0; c < D.kv_lora; ++c)
                         for (int64_t i = 0; i < D.nope; ++i)
                           r[size_t((h * D.kv_lora + c) * D.nope + i)] = w[size_t((h * (D.nope + D.v) + i) * D.kv_lora + c)];
                     return r;
                   }});
    out.push_back({g + "attn_v_b.weight", mt, {D.kv_lora, D.v, D.H}, [&kvb, D] {
                     auto w = decode(kvb);
                     std::vector<float> r(size_t(D.H * D.v * D.kv_lora));
                     for (int64_t h = 0; h < D.H; ++h)
                       for (int64_t j = 0; j < D.v; ++j)
                         for (int64_t c = 0; c < D.kv_lora; ++c)
                           r[size_t((h * D.v + j) * D.kv_lora + c)] =
                               w[size_t((h * (D.nope + D.v) + D.nope + j) * D.kv_lora + c)];
                     return r;
                   }});
    mat(g + "attn_output.weight", p + "self_attn.o_proj.weight", {D.d, D.H * D.v});
    vec(g + "ffn_norm.weight", p + "post_attention_layernorm.weight", D.d);
    mat(g + "ffn_gate.weight", p + "mlp.gate_proj.weight", {D.ff, D.d});
    mat(g + "ffn_up.weight", p + "mlp.up_proj.weight", {D.ff, D.d});
    mat(g + "ffn_down.weight", p + "mlp.down_proj.weight", {D.d, D.ff});
  }
  vec("output_norm.weight", "final_norm.weight", D.d);
  mat("dspark.markov_w1.weight", "markov_head.markov_w1.weight", {D.V, D.rank});
  mat("dspark.markov_w2.weight", "markov_head.markov_w2.weight", {D.V, D.rank});

  // anything else must be one of the tensors the draft does not need (dspark.md §1.2)
  convert::ConvertResult r;
  r.dropped_what = "unused draft";  // embed_tokens (the target's is used) and the confidence head
  {
    std::set<std::string> used;
    for (auto& name : ck->names()) {
      std::string n = name.rfind("model.", 0) == 0 ? name.substr(6) : name;
      const bool dropped = n == "embed_tokens.weight" || n == "lm_head.weight" || n.rfind("confidence_head.", 0) == 0 ||
                           n.find("rotary_emb.inv_freq") != std::string::npos;
      if (dropped) {
        ++r.n_dropped;
        r.dropped_bytes += ck->get(name).nbytes;
      }
    }
    const size_t expected = out.size() - static_cast<size_t>(D.L);  // k_b and v_b come from one tensor
    check(ck->names().size() == expected + r.n_dropped,
          "{}: {} tensors, expected {} of a {}-layer DSpark draft plus embed_tokens/confidence_head (an unknown "
          "tensor name?)", o.hf_dir, ck->names().size(), expected + r.n_dropped, D.L);
  }

  std::vector<gguf::KV> kv;
  const std::string A = "kimi-k3-dspark.";
  auto add = [&](const std::string& k, Value v) { kv.push_back({k, std::move(v)}); };
  add("general.architecture", Value::str("kimi-k3-dspark"));
  add("general.type", Value::str("model"));
  {
    fs::path pth = fs::path(o.hf_dir).lexically_normal();
    if (pth.filename().empty()) pth = pth.parent_path();
    add("general.name", Value::str(pth.filename().string().empty() ? "kimi-k3-dspark" : pth.filename().string()));
  }
  auto u32 = [](int64_t v) { return Value::u32(static_cast<uint32_t>(v)); };
  add(A + "block_count", u32(D.L));
  if (D.max_pos > 0) add(A + "context_length", u32(D.max_pos));
  add(A + "embedding_length", u32(D.d));
  add(A + "feed_forward_length", u32(D.ff));
  add(A + "vocab_size", u32(D.V));
  add(A + "attention.head_count", u32(D.H));
  add(A + "attention.layer_norm_rms_epsilon", Value::f32(static_cast<float>(D.eps)));
  add(A + "attention.q_lora_rank", u32(D.q_lora));
  add(A + "attention.kv_lora_rank", u32(D.kv_lora));
  add(A + "attention.key_length_mla", u32(D.nope + D.rope));
  add(A + "attention.value_length_mla", u32(D.v));
  add(A + "rope.dimension_count", u32(D.rope));
  add(A + "rope.freq_base", Value::f32(static_cast<float>(D.theta)));
  if (D.factor > 1.0) {
    add(A + "rope.scaling.factor", Value::f32(static_cast<float>(D.factor)));
    add(A + "rope.scaling.original_context_length", u32(static_cast<int64_t>(D.orig)));
    add(A + "rope.scaling.yarn_beta_fast", Value::f32(static_cast<float>(D.beta_fast)));
    add(A + "rope.scaling.yarn_beta_slow", Value::f32(static_cast<float>(D.beta_slow)));
    add(A + "rope.scaling.yarn_mscale", Value::f32(static_cast<float>(D.mscale)));
    add(A + "rope.scaling.yarn_mscale_all_dim", Value::f32(static_cast<float>(D.mscale_all)));
  }
  std::vector<uint32_t> taps;
  for (auto t : D.taps) taps.push_back(static_cast<uint32_t>(t));
  add(A + "target.layers", Value::arr_u32(taps));
  add(A + "target.block_count", u32(D.n_t));
  add(A + "target.embedding_length", u32(D.d_t));
  add(A + "block_size", u32(D.block));
  add(A + "mask_token_id", u32(D.mask));
  add(A + "markov_rank", u32(D.rank));
  const FileType ft = mt == GgmlType::BF16 ? FileType::MOSTLY_BF16 : mt == GgmlType::F16 ? FileType::MOSTLY_F16
                                                                                          : FileType::ALL_F32;
  add("general.file_type", Value::u32(static_cast<uint32_t>(ft)));
  add("general.quantization_version", Value::u32(2));

  gguf::WriterOptions wo;
  wo.split_max_bytes = o.split_max_bytes;
  wo.inputs = ck->file_paths();
  wo.inputs.push_back(cfg_path);
  gguf::Writer w(o.out_path, wo);
  for (auto& k : kv) w.add_kv(k.key, k.value);
  for (auto& t : out) w.add_tensor(t.name, t.type, t.ne);
  w.begin();
  std::vector<uint16_t> h;
  for (auto& t : out) {
    const auto v = t.values();
    if (t.type == GgmlType::F32) {
      w.write_tensor_data(t.name, v.data(), v.size() * 4);
      r.tensor_bytes += v.size() * 4;
    } else {
      h.resize(v.size());
      for (size_t i = 0; i < v.size(); ++i) h[i] = t.type == GgmlType::BF16 ? f32_to_bf16(v[i]) : f32_to_f16(v[i]);
      w.write_tensor_data(t.name, h.data(), h.size() * 2);
      r.tensor_bytes += h.size() * 2;
    }
  }
  w.finish();
  r.n_tensors = out.size();
  r.n_metadata = kv.size();
  r.ftype = ft;
  r.outtype = ot;
  r.outputs = w.output_paths();
  r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return r;
}

}  // namespace kimi::dspark
