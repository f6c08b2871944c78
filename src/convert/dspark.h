// The K3 DSpark draft model on the converter side (docs/spec/dspark.md): synthetic draft checkpoints
// with the real Hugging Face layout (`kimi synth --preset dspark-tiny|dspark-small`) and the HF -> GGUF
// conversion of a draft (`kimi convert` dispatches here when config.json is a `k3_dspark` model).
//
//   auto c = kimi::dspark::synth_preset("dspark-tiny");
//   kimi::dspark::write_synth(c, "draft-hf");                     // config.json + model.safetensors
//   kimi::convert::ConvertOptions o{.hf_dir = "draft-hf", .out_path = "draft.gguf"};
//   kimi::dspark::convert(o);                                      // a kimi-k3-dspark GGUF
#pragma once
#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "convert/convert.h"
#include "convert/verify.h"

namespace kimi {
struct HfConfig;
}

namespace kimi::dspark {

// The draft's config.json values (dspark.md §1.1) for a synthetic checkpoint.
struct SynthConfig {
  std::string preset;
  std::string target_preset;  // the `kimi synth` target preset it pairs with (same width and vocabulary)
  int64_t hidden = 0, layers = 0, heads = 0, q_lora = 0, kv_lora = 0, nope = 0, rope = 0, v_dim = 0, ff = 0;
  int64_t vocab = 0, rank = 0, block = 7;
  int64_t target_layers = 0, target_hidden = 0;
  std::vector<int64_t> taps;  // 0-based target layers, ascending
  int64_t mask_token = 0;
  int64_t max_pos = 1048576;
  double eps = 1e-5, rope_theta = 50000.0;
  double yarn_factor = 32.0, yarn_orig = 32768, beta_fast = 32, beta_slow = 1, mscale = 1.0, mscale_all = 1.0;
  uint64_t seed = 0;
};

const std::vector<std::string>& preset_names();  // dspark-tiny, dspark-small
bool is_preset(const std::string& name);
SynthConfig synth_preset(const std::string& name);  // throws kimi::Error for other names

// The tap layers for a target of n_layers layers: K3's (2, 23, 47, 71, 89) of 93 scaled by
// round(T * (n - 1) / 92), kept strictly increasing (dspark.md §4). Throws for n < 5.
std::vector<int64_t> scale_taps(int64_t n_layers);

nlohmann::ordered_json config_json(const SynthConfig& c);
// The checkpoint's tensors in file order: name, shape (PyTorch [out, in]); all BF16.
std::vector<std::pair<std::string, std::vector<int64_t>>> tensor_list(const SynthConfig& c);
// The float values of a tensor before rounding to BF16 (a pure function of seed and name; the
// embed_tokens copy is the target preset's embedding, `kimi synth` of the same seed).
std::vector<float> tensor_values(const SynthConfig& c, const std::string& name);

struct SynthSummary {
  size_t tensors = 0;
  uint64_t parameters = 0, bytes = 0;
};
// Writes DIR/config.json and DIR/model.safetensors (into a temp directory, renamed at the end).
SynthSummary write_synth(const SynthConfig& c, const std::string& dir, bool force = false);

// True when the HF config is a K3 DSpark draft (model_type k3_dspark or architecture K3DSparkModel).
bool is_dspark_config(const HfConfig& cfg);
// HF draft checkpoint -> GGUF (dspark.md §2). Matrices: --outtype auto (= the source type), bf16, f16
// or f32; 1-D tensors F32; kv_b split into attn_k_b / attn_v_b; embed_tokens and the confidence
// head are dropped (counted in n_dropped).
convert::ConvertResult convert(const convert::ConvertOptions& o);
// `kimi verify` of a draft GGUF against its HF source (dspark_verify.cpp): every tensor re-derived
// independently of the converter and compared byte for byte, every kimi-k3-dspark.* key.
convert::VerifyResult verify(const convert::VerifyOptions& o);

}  // namespace kimi::dspark
