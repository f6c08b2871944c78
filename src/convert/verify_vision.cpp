// `kimi verify HF_DIR FILE.mmproj.gguf`: the projector file (docs/spec/vision.md §2.2) against the
// checkpoint, with its own name map and element-by-element comparison (independent of
// vision_convert.cpp), and every moonvit3d.* key against config.json's vision_config.
#include <fmt/format.h>

#include <cmath>
#include <cstring>
#include <regex>
#include <set>

#include "convert/verify.h"
#include "io/gguf.h"
#include "io/hf_config.h"
#include "io/safetensors.h"
#include "tensor/types.h"
#include "util/error.h"

namespace kimi::convert {

namespace {

float source_value(const st::Tensor& t, int64_t i) {
  uint16_t h;
  switch (t.dtype) {
    case st::Dtype::BF16:
      std::memcpy(&h, t.data + 2 * i, 2);
      return bf16_to_f32(h);
    case st::Dtype::F16:
      std::memcpy(&h, t.data + 2 * i, 2);
      return f16_to_f32(h);
    case st::Dtype::F32: {
      float f;
      std::memcpy(&f, t.data + 4 * i, 4);
      return f;
    }
    default:
      fail("source tensor '{}' ({}): dtype {} is not a float type", t.name, t.file, st::dtype_name(t.dtype));
  }
}

// GGUF name -> HF name (vision.md §2.2), "" when the name is not part of the layout
std::string source_name(const std::string& g) {
  static const std::regex blk(R"(v\.blk\.(\d+)\.(ln1|ln2|attn_qkv|attn_out|ffn_up|ffn_down)\.weight)");
  std::smatch m;
  if (std::regex_match(g, m, blk)) {
    const std::string part = m[2];
    const std::string hf = part == "ln1" ? "norm0" : part == "ln2" ? "norm1" : part == "attn_qkv" ? "wqkv"
                           : part == "attn_out" ? "wo" : part == "ffn_up" ? "mlp.fc0" : "mlp.fc1";
    return "vision_tower.encoder.blocks." + std::string(m[1]) + "." + hf + ".weight";
  }
  if (g == "v.patch_embd.weight") return "vision_tower.patch_embed.proj.weight";
  if (g == "v.pos_embd.weight") return "vision_tower.patch_embed.pos_emb.weight";
  if (g == "v.post_norm.weight") return "vision_tower.encoder.final_layernorm.weight";
  if (g == "mm.1.weight") return "mm_projector.proj.0.weight";
  if (g == "mm.2.weight") return "mm_projector.proj.2.weight";
  if (g == "mm.post_norm.weight") return "mm_projector.post_norm.weight";
  return "";
}

}  // namespace

VerifyResult verify_vision(const VerifyOptions& o, const HfConfig& cfg, const st::Checkpoint& ck,
                           const gguf::Reader& rd) {
  VerifyResult res;
  auto problem = [&](std::string s) {
    if (res.problems.size() < o.max_report) res.problems.push_back(std::move(s));
  };
  check(cfg.has("vision_config"), "{}: config.json has no vision_config, but {} is a vision projector file",
        o.hf_dir, o.gguf_path);
  const nlohmann::json& vc = cfg.get("vision_config");
  // ---- keys
  auto key_u32 = [&](const std::string& k, int64_t want) {
    const gguf::Value* v = rd.find(k);
    bool ok = v && v->type == gguf::ValueType::UINT32 && static_cast<int64_t>(v->u) == want;
    if (ok) ++res.n_keys_match;
    else {
      ++res.n_keys_mismatch;
      problem(fmt::format("key '{}': {} but config.json implies {}", k, v ? v->to_string() : "missing", want));
    }
  };
  auto key_f32 = [&](const std::string& k, float want) {
    const gguf::Value* v = rd.find(k);
    bool ok = v && v->type == gguf::ValueType::FLOAT32 && static_cast<float>(v->f) == want;
    if (ok) ++res.n_keys_match;
    else {
      ++res.n_keys_mismatch;
      problem(fmt::format("key '{}': {} but expected {}", k, v ? v->to_string() : "missing", want));
    }
  };
  auto vi = [&](const char* k) -> int64_t {
    check(vc.contains(k) && vc[k].is_number_integer(), "{}: vision_config.{} missing", o.hf_dir, k);
    return vc[k].get<int64_t>();
  };
  const int64_t W = vi("vt_hidden_size"), Q = vi("qkv_hidden_size"), H = vi("vt_num_attention_heads");
  const int64_t F = vi("vt_intermediate_size"), B = vi("vt_num_hidden_layers"), P = vi("patch_size");
  key_u32("moonvit3d.patch_size", P);
  key_u32("moonvit3d.embedding_length", W);
  key_u32("moonvit3d.qkv_length", Q);
  key_u32("moonvit3d.head_count", H);
  key_u32("moonvit3d.feed_forward_length", F);
  key_u32("moonvit3d.block_count", B);
  key_u32("moonvit3d.pos_grid_height", vi("init_pos_emb_height"));
  key_u32("moonvit3d.pos_grid_width", vi("init_pos_emb_width"));
  key_u32("moonvit3d.merge_kernel", 2);
  key_u32("moonvit3d.projector.output_length", cfg.get_int("hidden_size"));
  key_u32("moonvit3d.media_placeholder_token_id", cfg.get_int_or("media_placeholder_token_id", 163605));
  key_u32("moonvit3d.image.patch_limit", 65536);
  key_u32("moonvit3d.image.side_patch_limit", 512);
  key_f32("moonvit3d.norm_epsilon", 0.0078125f);
  key_f32("moonvit3d.projector.norm_epsilon",
          vc.contains("projector_ln_eps") ? static_cast<float>(vc["projector_ln_eps"].get<double>()) : 1e-5f);

  // ---- tensors: every GGUF tensor from its source, every source tensor present
  std::set<std::string> used;
  for (const gguf::TensorInfo& ti : rd.tensors()) {
    ++res.n_tensors;
    const std::string src = source_name(ti.name);
    const st::Tensor* s = src.empty() ? nullptr : ck.find(src);
    std::string why;
    if (!s) why = src.empty() ? "not part of the projector layout" : fmt::format("source '{}' missing", src);
    if (why.empty()) {
      used.insert(src);
      if (ti.nelements() != s->numel())
        why = fmt::format("{} elements but the source {} has {}", ti.nelements(), s->shape_string(), s->numel());
      // ne[0] is the source's innermost extent except for the Conv2d, whose [W,3,P,P] reads as {3PP, W}
      else if (s->shape.size() == 4 ? ti.ne[0] != s->shape[1] * s->shape[2] * s->shape[3]
                                    : ti.ne[0] != s->shape.back())
        why = fmt::format("shape {} does not match the source {}", ti.shape_string(), s->shape_string());
    }
    if (why.empty()) {
      const bool vec = s->shape.size() == 1 || ti.name == "v.pos_embd.weight";
      if (vec && ti.type != GgmlType::F32) why = fmt::format("type {} but expected F32", type_name(ti.type));
      if (!vec && ti.type != GgmlType::F32 && ti.type != GgmlType::F16 && ti.type != GgmlType::BF16)
        why = fmt::format("type {} (expected BF16, F16 or F32)", type_name(ti.type));
    }
    if (why.empty()) {
      for (int64_t i = 0; i < ti.nelements(); ++i) {
        const float x = source_value(*s, i);
        bool same;
        if (ti.type == GgmlType::F32) {
          float g;
          std::memcpy(&g, ti.data + 4 * i, 4);
          same = std::memcmp(&g, &x, 4) == 0;
        } else {
          uint16_t g;
          std::memcpy(&g, ti.data + 2 * i, 2);
          same = g == (ti.type == GgmlType::BF16 ? f32_to_bf16(x) : f32_to_f16(x));
        }
        if (!same) {
          why = fmt::format("element {} differs from the source", i);
          break;
        }
      }
    }
    if (why.empty()) ++res.n_exact;
    else {
      ++res.n_mismatched;
      problem(fmt::format("tensor '{}': {}", ti.name, why));
    }
  }
  for (const std::string& n : ck.names()) {
    if (n.rfind("vision_tower.", 0) != 0 && n.rfind("mm_projector.", 0) != 0) continue;
    if (used.count(n)) continue;
    ++res.n_missing;
    problem(fmt::format("source tensor '{}' ({}) has no counterpart in the projector file", n, ck.get(n).file));
  }
  return res;
}

}  // namespace kimi::convert
