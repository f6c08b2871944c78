// libFuzzer target: config.json -> model dimensions (what `kimi convert` and `kimi verify` read
// first). The input is the text of config.json: HfConfig::parse (text_config merged into the
// root), every typed getter on every key, convert::read_dims (architecture, asserted settings,
// ranges), and, when the dimensions validate, convert::make_plan against the tiny synthetic
// checkpoint (the schema derived from the config checked against real tensors; a config that
// claims more layers or experts than the checkpoint holds must be refused, not allocated) and
// build_metadata (the GGUF keys, with the checkpoint's tokenizer files).
// A malformed input must end in kimi::Error; anything else is a bug.
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "common.h"
#include "convert/convert.h"
#include "convert/transforms.h"
#include "io/hf_config.h"
#include "io/safetensors.h"
#include "util/error.h"

using namespace kimi;

namespace {
const st::Checkpoint& tiny_checkpoint() {
  static const std::unique_ptr<st::Checkpoint> ck = st::Checkpoint::open(fuzz::tiny_hf_dir());
  return *ck;
}

template <class F>
void attempt(F&& f) {
  try {
    f();
  } catch (const Error&) {
  }
}
}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  tiny_checkpoint();
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  size_t sink = 0;
  HfConfig cfg;
  try {
    cfg = HfConfig::parse(text, "fuzz/config.json");
  } catch (const Error&) {
    return 0;
  }
  sink += cfg.top_architecture().size();
  if (cfg.merged.is_object()) {
    for (auto it = cfg.merged.begin(); it != cfg.merged.end(); ++it) {
      const std::string& k = it.key();
      sink += cfg.has(k);
      attempt([&] { sink += static_cast<size_t>(cfg.get_int(k)); });
      attempt([&] { sink += cfg.get_float(k) != 0; });
      attempt([&] { sink += cfg.get_bool(k); });
      attempt([&] { sink += cfg.get_str(k).size(); });
      attempt([&] { sink += cfg.get(k).size(); });
    }
  }
  for (const char* k : {"linear_attn_config.head_dim", "linear_attn_config.full_attn_layers", "text_config.vocab_size",
                        "quantization_config.format"})
    attempt([&] { sink += static_cast<size_t>(cfg.get_int_or(k, 7)) + cfg.get_bool_or(k, false); });
  attempt([&] { sink += cfg.full_attn_layers_1based().size(); });
  attempt([&] { sink += cfg.quantization_config().size(); });
  attempt([&] { sink += cfg.experts_mxfp4_packed(); });

  try {
    const convert::K3Dims dims = convert::read_dims(cfg);
    sink += dims.is_mla.size();
    const convert::Plan plan = convert::make_plan(dims, tiny_checkpoint(), convert::OutType::Auto, -1, "tiny");
    sink += plan.tensors.size();
    sink += convert::build_metadata(fuzz::tiny_hf_dir(), cfg, dims, dims.n_layer, plan.ftype).size();
  } catch (const Error&) {
  }
  if (sink == 0xdeadbeef) return 1;  // keep `sink` alive
  return 0;
}
