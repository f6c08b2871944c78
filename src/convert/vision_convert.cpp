// The projector GGUF (docs/spec/vision.md §2.2): tower + projector tensors, each a type conversion
// of its source in the same element order.
#include "convert/vision_convert.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <map>

#include "convert/transforms.h"
#include "io/gguf.h"
#include "io/hf_config.h"
#include "io/moonvit_names.h"
#include "util/error.h"

namespace kimi::convert {

namespace {

int64_t vint(const nlohmann::json& v, const char* key, const std::string& label) {
  check(v.contains(key), "{}: vision_config.{} missing", label, key);
  const auto& x = v[key];
  check(x.is_number_integer() && x.get<int64_t>() > 0 && x.get<int64_t>() <= (int64_t{1} << 20),
        "{}: vision_config.{} = {} (expected a positive integer)", label, key, x.dump());
  return x.get<int64_t>();
}

void vstr(const nlohmann::json& v, const char* key, const char* want, const std::string& label) {
  if (!v.contains(key)) return;  // absent: K3's value is assumed (vision.md §1.1)
  check(v[key].is_string() && v[key].get<std::string>() == want,
        "{}: vision_config.{} = {} (the engine implements only \"{}\", docs/spec/vision.md §1.1)", label, key,
        v[key].dump(), want);
}

void vfalse(const nlohmann::json& v, const char* key, const std::string& label) {
  if (!v.contains(key)) return;
  check(v[key].is_boolean() && !v[key].get<bool>(),
        "{}: vision_config.{} = {} (the engine implements a tower without biases)", label, key, v[key].dump());
}

std::string shape_str(const std::vector<int64_t>& s) { return fmt::format("[{}]", fmt::join(s, ", ")); }

}  // namespace

std::optional<VisionDims> read_vision_dims(const HfConfig& cfg, int64_t text_hidden, const std::string& label) {
  if (!cfg.has("vision_config")) return std::nullopt;
  const nlohmann::json& v = cfg.get("vision_config");
  check(v.is_object(), "{}: vision_config is not an object", label);
  VisionDims d;
  vstr(v, "model_type", "moonvit3d", label);
  vstr(v, "norm_type", "rmsnorm", label);
  vstr(v, "merge_type", "sd2_tpool", label);
  vstr(v, "mm_projector_type", "patchmergerv2", label);
  vstr(v, "activation_func", "gelu_pytorch_tanh", label);
  vstr(v, "projector_hidden_act", "gelu", label);
  vstr(v, "pos_emb_interpolation_mode", "bilinear", label);
  vstr(v, "pos_emb_type", "divided_fixed", label);
  vfalse(v, "attn_bias", label);
  vfalse(v, "linear_bias", label);
  vfalse(v, "patch_embed_proj_bias", label);
  d.patch = vint(v, "patch_size", label);
  d.width = vint(v, "vt_hidden_size", label);
  d.qkv = vint(v, "qkv_hidden_size", label);
  d.heads = vint(v, "vt_num_attention_heads", label);
  d.ff = vint(v, "vt_intermediate_size", label);
  d.blocks = vint(v, "vt_num_hidden_layers", label);
  d.grid_h = vint(v, "init_pos_emb_height", label);
  d.grid_w = vint(v, "init_pos_emb_width", label);
  check(d.qkv % d.heads == 0 && (d.qkv / d.heads) % 4 == 0,
        "{}: vision_config.qkv_hidden_size {} must split into vt_num_attention_heads {} heads of a multiple of 4 "
        "values (the 2-D rotary embedding, docs/spec/vision.md §3.4)",
        label, d.qkv, d.heads);
  check(d.patch <= 64, "{}: vision_config.patch_size {} (at most 64)", label, d.patch);
  if (v.contains("merge_kernel_size")) {
    const auto& m = v["merge_kernel_size"];
    check(m.is_array() && m.size() == 2 && m[0] == 2 && m[1] == 2,
          "{}: vision_config.merge_kernel_size = {} (the engine implements [2, 2])", label, m.dump());
  }
  if (v.contains("mm_hidden_size"))
    check(vint(v, "mm_hidden_size", label) == d.width, "{}: vision_config.mm_hidden_size {} != vt_hidden_size {}",
          label, v["mm_hidden_size"].dump(), d.width);
  d.text_hidden = text_hidden;
  if (v.contains("text_hidden_size"))
    check(vint(v, "text_hidden_size", label) == text_hidden,
          "{}: vision_config.text_hidden_size {} != the text model's hidden_size {}", label,
          v["text_hidden_size"].dump(), text_hidden);
  if (v.contains("projector_ln_eps")) {
    check(v["projector_ln_eps"].is_number() && v["projector_ln_eps"].get<double>() > 0,
          "{}: vision_config.projector_ln_eps = {}", label, v["projector_ln_eps"].dump());
    d.proj_eps = static_cast<float>(v["projector_ln_eps"].get<double>());
  }
  d.placeholder = cfg.get_int_or("media_placeholder_token_id", 163605);
  return d;
}

std::string default_mmproj_path(const std::string& out_path) {
  const std::string ext = ".gguf";
  if (out_path.size() > ext.size() && out_path.compare(out_path.size() - ext.size(), ext.size(), ext) == 0)
    return out_path.substr(0, out_path.size() - ext.size()) + ".mmproj.gguf";
  return out_path + ".mmproj.gguf";
}

std::vector<VisionTensor> plan_vision(const VisionDims& d, const st::Checkpoint& ck, GgmlType mt,
                                      const std::string& label) {
  const int64_t W = d.width, Q = d.qkv, F = d.ff, P = d.patch, T = d.text_hidden;
  struct Want {
    std::string src, dst;
    std::vector<int64_t> shape;  // HF [out, in]
    bool matrix;
  };
  std::vector<Want> want;
  const std::string t = "vision_tower.";
  want.push_back({t + "patch_embed.proj.weight", moonvit::kPatchEmbd, {W, 3, P, P}, true});
  want.push_back({t + "patch_embed.pos_emb.weight", moonvit::kPosEmbd, {d.grid_h, d.grid_w, W}, false});
  for (int64_t b = 0; b < d.blocks; ++b) {
    const std::string p = t + "encoder.blocks." + std::to_string(b) + ".";
    want.push_back({p + "norm0.weight", moonvit::blk(b, "ln1.weight"), {W}, false});
    want.push_back({p + "wqkv.weight", moonvit::blk(b, "attn_qkv.weight"), {3 * Q, W}, true});
    want.push_back({p + "wo.weight", moonvit::blk(b, "attn_out.weight"), {W, Q}, true});
    want.push_back({p + "norm1.weight", moonvit::blk(b, "ln2.weight"), {W}, false});
    want.push_back({p + "mlp.fc0.weight", moonvit::blk(b, "ffn_up.weight"), {F, W}, true});
    want.push_back({p + "mlp.fc1.weight", moonvit::blk(b, "ffn_down.weight"), {W, F}, true});
  }
  want.push_back({t + "encoder.final_layernorm.weight", moonvit::kPostNorm, {W}, false});
  want.push_back({"mm_projector.proj.0.weight", moonvit::kMm1, {4 * W, 4 * W}, true});
  want.push_back({"mm_projector.proj.2.weight", moonvit::kMm2, {T, 4 * W}, true});
  want.push_back({"mm_projector.post_norm.weight", moonvit::kMmNorm, {T}, false});

  std::vector<std::string> problems;
  std::map<std::string, bool> expected;
  std::vector<VisionTensor> out;
  for (const Want& w : want) {
    expected[w.src] = true;
    const st::Tensor* s = ck.find(w.src);
    if (!s) {
      problems.push_back(fmt::format("tensor '{}' missing (vision_config implies it)", w.src));
      continue;
    }
    if (s->shape != w.shape) {
      problems.push_back(fmt::format("tensor '{}' ({}): shape {} but vision_config implies {}", w.src, s->file,
                                     s->shape_string(), shape_str(w.shape)));
      continue;
    }
    if (s->dtype != st::Dtype::BF16 && s->dtype != st::Dtype::F16 && s->dtype != st::Dtype::F32) {
      problems.push_back(fmt::format("tensor '{}' ({}): dtype {} (expected BF16, F16 or F32)", w.src, s->file,
                                     st::dtype_name(s->dtype)));
      continue;
    }
    VisionTensor v;
    v.name = w.dst;
    v.type = w.matrix ? mt : GgmlType::F32;
    v.ne.assign(w.shape.rbegin(), w.shape.rend());
    if (w.matrix && w.shape.size() == 4) v.ne = {3 * P * P, W};  // the Conv2d as a matrix
    v.src = s;
    int64_t rows = 1;
    for (size_t i = 1; i < v.ne.size(); ++i) rows *= v.ne[i];
    v.nbytes = row_bytes(v.type, static_cast<uint64_t>(v.ne[0])) * static_cast<uint64_t>(rows);
    out.push_back(std::move(v));
  }
  for (const std::string& n : ck.names())
    if ((n.rfind("vision_tower.", 0) == 0 || n.rfind("mm_projector.", 0) == 0) && !expected.count(n))
      problems.push_back(fmt::format("tensor '{}' ({}): not part of the MoonViT3D layout (docs/spec/vision.md §2.1)",
                                     n, ck.get(n).file));
  if (!problems.empty()) {
    std::string msg = fmt::format("{}: vision tensors do not match vision_config:", label);
    for (size_t i = 0; i < problems.size() && i < 20; ++i) msg += "\n  " + problems[i];
    if (problems.size() > 20) msg += fmt::format("\n  ... and {} more", problems.size() - 20);
    throw Error(msg);
  }
  return out;
}

uint64_t write_vision(const VisionDims& d, const std::vector<VisionTensor>& plan, const std::string& out_path,
                      const std::vector<std::string>& inputs, const std::string& model_name) {
  using gguf::Value;
  gguf::WriterOptions wo;
  wo.inputs = inputs;
  gguf::Writer w(out_path, wo);
  auto u = [&](const char* k, int64_t v) { w.add_kv(moonvit::key(k), Value::u32(static_cast<uint32_t>(v))); };
  w.add_kv("general.architecture", Value::str(moonvit::kArch));
  w.add_kv("general.type", Value::str("projector"));
  w.add_kv("general.name", Value::str(model_name + " vision"));
  u(moonvit::kPatchSize, d.patch);
  u(moonvit::kWidth, d.width);
  u(moonvit::kQkv, d.qkv);
  u(moonvit::kHeads, d.heads);
  u(moonvit::kFf, d.ff);
  u(moonvit::kBlocks, d.blocks);
  u(moonvit::kGridH, d.grid_h);
  u(moonvit::kGridW, d.grid_w);
  u(moonvit::kMerge, d.merge);
  w.add_kv(moonvit::key(moonvit::kEps), Value::f32(moonvit::kTowerEps));
  w.add_kv(moonvit::key(moonvit::kProjEps), Value::f32(d.proj_eps));
  u(moonvit::kTextHidden, d.text_hidden);
  u(moonvit::kPlaceholder, d.placeholder);
  u(moonvit::kPatchLimit, moonvit::kPatchLimitK3);
  u(moonvit::kSidePatchLimit, moonvit::kSidePatchLimitK3);
  for (const auto& t : plan) w.add_tensor(t.name, t.type, t.ne);
  w.begin();
  uint64_t total = 0;
  std::vector<float> f;
  std::vector<uint8_t> o;
  for (const auto& t : plan) {
    const int64_t n0 = t.ne[0];
    const int64_t rows = static_cast<int64_t>(t.src->numel()) / n0;
    const int64_t chunk = std::max<int64_t>(1, (int64_t{1} << 20) / n0);
    const uint64_t rb = row_bytes(t.type, static_cast<uint64_t>(n0));
    for (int64_t r = 0; r < rows; r += chunk) {
      const int64_t nr = std::min(chunk, rows - r);
      f.resize(static_cast<size_t>(nr * n0));
      o.resize(static_cast<size_t>(nr) * rb);
      decode_f32(*t.src, r * n0, nr * n0, f.data());
      encode_rows(f.data(), nr * n0, n0, t.type, o.data());
      w.write_tensor_data(t.name, o.data(), o.size());
      total += o.size();
    }
  }
  w.finish();
  return total;
}

}  // namespace kimi::convert
