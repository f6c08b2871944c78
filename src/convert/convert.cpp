#include "convert/convert.h"
#include "convert/vision_convert.h"

#include <chrono>
#include <optional>
#include <filesystem>
#include <map>
#include <unordered_map>

#include "convert/dspark.h"
#include "convert/vocab.h"
#include "io/hf_config.h"
#include "io/safetensors.h"
#include "util/error.h"
#include "util/paths.h"
#include "util/progress.h"

namespace fs = std::filesystem;

namespace kimi::convert {

namespace {

uint32_t u32_of(const HfConfig& c, const std::string& key) {
  int64_t v = c.get_int(key);
  check(v >= 0 && v <= 0xFFFFFFFFll, "{}: key '{}' = {} does not fit uint32", c.path, key, v);
  return static_cast<uint32_t>(v);
}

std::string model_name(const std::string& dir) {
  fs::path p = fs::path(dir).lexically_normal();
  if (p.filename().empty()) p = p.parent_path();
  std::string n = p.filename().string();
  return n.empty() ? std::string("kimi-k3") : n;
}

}  // namespace

std::vector<gguf::KV> build_metadata(const std::string& hf_dir, const HfConfig& c, const K3Dims& D, int64_t n_layers,
                                     FileType ftype) {
  using gguf::Value;
  std::vector<gguf::KV> kv;
  auto add = [&](const std::string& k, Value v) { kv.push_back({k, std::move(v)}); };
  const std::string A = "kimi-k3.";
  add("general.architecture", Value::str("kimi-k3"));
  add("general.type", Value::str("model"));
  add("general.name", Value::str(model_name(hf_dir)));

  add(A + "block_count", Value::u32(static_cast<uint32_t>(n_layers)));
  add(A + "context_length", Value::u32(u32_of(c, "max_position_embeddings")));
  add(A + "embedding_length", Value::u32(static_cast<uint32_t>(D.d)));
  add(A + "feed_forward_length", Value::u32(static_cast<uint32_t>(D.ff_dense)));
  add(A + "attention.head_count", Value::u32(static_cast<uint32_t>(D.n_head)));
  std::vector<int32_t> hkv(static_cast<size_t>(n_layers));
  for (int64_t il = 0; il < n_layers; ++il) hkv[il] = D.is_mla[il] ? 1 : 0;
  add(A + "attention.head_count_kv", Value::arr_i32(hkv));
  add(A + "attention.layer_norm_rms_epsilon", Value::f32(static_cast<float>(c.get_float("rms_norm_eps"))));
  add(A + "vocab_size", Value::u32(static_cast<uint32_t>(D.vocab)));
  add(A + "attention.q_lora_rank", Value::u32(static_cast<uint32_t>(D.q_lora)));
  add(A + "attention.kv_lora_rank", Value::u32(static_cast<uint32_t>(D.kv_lora)));
  add(A + "attention.key_length", Value::u32(static_cast<uint32_t>(D.kv_lora + D.rope)));
  add(A + "attention.value_length", Value::u32(static_cast<uint32_t>(D.kv_lora)));
  add(A + "attention.key_length_mla", Value::u32(static_cast<uint32_t>(D.nope + D.rope)));
  add(A + "attention.value_length_mla", Value::u32(static_cast<uint32_t>(D.v_dim)));
  add(A + "rope.dimension_count", Value::u32(static_cast<uint32_t>(D.rope)));
  add(A + "ssm.conv_kernel", Value::u32(static_cast<uint32_t>(D.conv_kernel)));
  add(A + "kda.head_dim", Value::u32(static_cast<uint32_t>(D.kda_dim)));
  if (c.has("linear_attn_config.gate_lower_bound"))
    add(A + "kda.gate_lower_bound", Value::f32(static_cast<float>(c.get_float("linear_attn_config.gate_lower_bound"))));
  add(A + "expert_count", Value::u32(static_cast<uint32_t>(D.n_expert)));
  add(A + "expert_used_count", Value::u32(static_cast<uint32_t>(D.n_expert_used)));
  add(A + "expert_shared_count", Value::u32(static_cast<uint32_t>(D.n_shared)));
  add(A + "expert_feed_forward_length", Value::u32(static_cast<uint32_t>(D.moe_ff)));
  if (c.has("routed_expert_hidden_size"))
    add(A + "expert_latent_length", Value::u32(static_cast<uint32_t>(D.latent)));
  add(A + "leading_dense_block_count", Value::u32(static_cast<uint32_t>(D.first_dense)));
  if (c.has("routed_scaling_factor"))
    add(A + "expert_weights_scale", Value::f32(static_cast<float>(c.get_float("routed_scaling_factor"))));
  if (c.has("moe_renormalize")) add(A + "expert_weights_norm", Value::boolean(c.get_bool("moe_renormalize")));
  add(A + "expert_gating_func", Value::u32(2));  // sigmoid (asserted in read_dims)
  if (c.has("topk_group")) add(A + "expert_group_used_count", Value::u32(u32_of(c, "topk_group")));
  add(A + "attn_res.block_size", Value::u32(u32_of(c, "attn_res_block_size")));
  if (c.has("activation_situ_beta"))
    add(A + "activation.situ_beta", Value::f32(static_cast<float>(c.get_float("activation_situ_beta"))));
  if (c.has("activation_situ_linear_beta"))
    add(A + "activation.situ_linear_beta", Value::f32(static_cast<float>(c.get_float("activation_situ_linear_beta"))));
  if (D.idx_topk > 0) {
    add(A + "attention.indexer.head_count", Value::u32(static_cast<uint32_t>(D.idx_heads)));
    add(A + "attention.indexer.key_length", Value::u32(static_cast<uint32_t>(D.idx_dim)));
    add(A + "attention.indexer.top_k", Value::u32(static_cast<uint32_t>(D.idx_topk)));
  }

  Vocab v = load_vocab(hf_dir, c);
  add("tokenizer.ggml.model", Value::str("gpt2"));
  add("tokenizer.ggml.pre", Value::str("kimi-k2"));
  add("tokenizer.ggml.tokens", Value::arr_str(std::move(v.tokens)));
  add("tokenizer.ggml.token_type", Value::arr_i32(v.types));
  if (!v.merges.empty()) add("tokenizer.ggml.merges", Value::arr_str(std::move(v.merges)));
  if (v.bos) add("tokenizer.ggml.bos_token_id", Value::u32(*v.bos));
  if (v.eos) add("tokenizer.ggml.eos_token_id", Value::u32(*v.eos));
  if (v.pad) add("tokenizer.ggml.padding_token_id", Value::u32(*v.pad));
  if (v.add_bos) add("tokenizer.ggml.add_bos_token", Value::boolean(*v.add_bos));
  if (v.chat_template && !v.chat_template->empty()) add("tokenizer.chat_template", Value::str(*v.chat_template));

  add("general.file_type", Value::u32(static_cast<uint32_t>(ftype)));
  add("general.quantization_version", Value::u32(2));
  return kv;
}

ConvertResult convert(const ConvertOptions& o) {
  auto t0 = std::chrono::steady_clock::now();
  check(fs::is_directory(o.hf_dir), "'{}' is not a directory (expected a Hugging Face model directory)", o.hf_dir);
  const std::string cfg_path = (fs::path(o.hf_dir) / "config.json").string();
  check(fs::exists(cfg_path), "{}: missing (not a Hugging Face model directory?)", cfg_path);
  check(!o.out_path.empty(), "no output path given (-o OUT.gguf)");
  {
    fs::path parent = fs::path(o.out_path).parent_path();
    check(parent.empty() || fs::is_directory(parent), "output directory '{}' does not exist", parent.string());
    check(!fs::is_directory(o.out_path), "output '{}' is a directory (expected a .gguf file path)", o.out_path);
  }
  // every file of the source the converter reads: no output file (shards included) may be one of them
  std::vector<std::string> inputs;
  for (const char* f : {"config.json", "model.safetensors.index.json", "model.safetensors", "tiktoken.model",
                        "tokenizer.json", "tokenizer_config.json", "chat_template.jinja"})
    inputs.push_back((fs::path(o.hf_dir) / f).string());
  check_outputs_distinct(inputs, {o.out_path});
  HfConfig cfg = HfConfig::load(cfg_path);
  if (dspark::is_dspark_config(cfg)) return dspark::convert(o);  // a K3 DSpark draft (docs/spec/dspark.md §2)
  auto ckpt = st::Checkpoint::open(o.hf_dir);  // first: its tensor count bounds the counts in config.json
  K3Dims dims = read_dims(cfg, ckpt->names().size());
  for (auto& p : ckpt->file_paths()) inputs.push_back(p);
  check_outputs_distinct(inputs, {o.out_path});
  Plan plan = make_plan(dims, *ckpt, o.outtype, o.layers, o.hf_dir);
  const int64_t n_layers = o.layers < 0 ? dims.n_layer : o.layers;

  auto kvs = build_metadata(o.hf_dir, cfg, dims, n_layers, plan.ftype);

  // the vision tower + projector -> the companion projector file (docs/spec/vision.md §2.2)
  std::optional<VisionDims> vdims;
  std::vector<VisionTensor> vplan;
  std::string vpath;
  if (!o.no_vision && !plan.dropped.empty()) {
    vdims = read_vision_dims(cfg, dims.d, cfg_path);
    check(vdims.has_value(), "{}: the checkpoint has vision tensors but config.json has no vision_config "
          "(convert with --no-vision for the text model alone)", cfg_path);
    const GgmlType mt = plan.outtype == OutType::F16 ? GgmlType::F16
                        : plan.outtype == OutType::F32 ? GgmlType::F32 : GgmlType::BF16;
    vplan = plan_vision(*vdims, *ckpt, mt, o.hf_dir);
    vpath = o.mmproj_path.empty() ? default_mmproj_path(o.out_path) : o.mmproj_path;
    check(vpath != o.out_path, "--mmproj '{}' is the text model's output path", vpath);
    check_outputs_distinct(inputs, {o.out_path, vpath});
  }

  gguf::WriterOptions wo;
  wo.split_max_bytes = o.split_max_bytes;
  wo.inputs = inputs;
  gguf::Writer w(o.out_path, wo);
  for (auto& kv : kvs) w.add_kv(kv.key, kv.value);
  for (const auto& t : plan.tensors) w.add_tensor(t.name, t.type, t.ne);

  // last use of every source tensor, to release its pages as soon as possible
  std::unordered_map<const st::Tensor*, size_t> last_use;
  for (size_t i = 0; i < plan.tensors.size(); ++i)
    for (const st::Tensor* s : plan.tensors[i].src) last_use[s] = i;

  if (!o.quiet && !plan.dropped.empty() && vplan.empty())
    std::fprintf(stderr, "convert: dropping %zu vision tensors (%s): vision_tower.* and mm_projector.* (--no-vision)\n",
                 plan.dropped.size(), format_bytes(plan.dropped_bytes).c_str());
  if (!o.quiet && o.layers >= 0)
    std::fprintf(stderr, "convert: keeping the first %lld of %lld layers (%zu source tensors skipped)\n",
                 static_cast<long long>(n_layers), static_cast<long long>(dims.n_layer), plan.skipped.size());

  w.begin();
  Progress prog("convert", plan.tensors.size(), plan.total_bytes, o.quiet ? Progress::Mode::Quiet : Progress::Mode::Auto);
  for (size_t i = 0; i < plan.tensors.size(); ++i) {
    const TensorPlan& t = plan.tensors[i];
    uint64_t written = 0;
    produce(t, [&](const void* data, size_t n) {
      w.write_tensor_data(t.name, data, n);
      written += n;
      prog.add_bytes(n);
    });
    check(written == t.nbytes, "internal error: tensor '{}' produced {} bytes, expected {}", t.name, written, t.nbytes);
    for (const st::Tensor* s : t.src)
      if (last_use[s] == i) ckpt->release(*s);
    prog.item_done(fmt::format("{} {} {}", t.name, type_name(t.type), format_bytes(t.nbytes)));
  }
  prog.finish();
  w.finish();

  ConvertResult r;
  if (!vplan.empty()) {
    r.vision_bytes = write_vision(*vdims, vplan, vpath, inputs, model_name(o.hf_dir));
    r.vision_path = vpath;
    r.n_vision = vplan.size();
    if (!o.quiet)
      std::fprintf(stderr, "convert: vision tower + projector: %zu tensors (%s) -> %s\n", vplan.size(),
                   format_bytes(r.vision_bytes).c_str(), vpath.c_str());
  }
  r.n_tensors = plan.tensors.size();
  r.tensor_bytes = plan.total_bytes;
  r.n_dropped = plan.dropped.size();
  r.dropped_bytes = plan.dropped_bytes;
  r.n_metadata = kvs.size();
  r.ftype = plan.ftype;
  r.outtype = plan.outtype;
  r.outputs = w.output_paths();
  r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return r;
}

}  // namespace kimi::convert
