// Hugging Face config.json for Kimi-K3 / K3.1: text_config merged into the root
// (root keys, then text_config keys override: k3-architecture.md §1.1); quantization_config
// read from either level.
#pragma once
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

namespace kimi {

struct HfConfig {
  std::string path;            // for messages
  nlohmann::json root;         // the file as read
  nlohmann::json merged;       // {**root, **text_config}

  static HfConfig load(const std::string& config_json_path);    // throws on bad JSON (with line/col)
  static HfConfig parse(const std::string& text, const std::string& label);

  std::string top_architecture() const;  // architectures[0] of the root ("" if absent)
  bool has(const std::string& key) const;
  // Typed getters on the merged dict; throw "config.json: key 'K' missing" / "... expected integer".
  // KEY may be a dotted path into nested objects ("linear_attn_config.head_dim"); a literal key
  // wins. A JSON null counts as absent (has() false, *_or() returns the default).
  int64_t get_int(const std::string& key) const;
  double get_float(const std::string& key) const;
  bool get_bool(const std::string& key) const;
  std::string get_str(const std::string& key) const;
  int64_t get_int_or(const std::string& key, int64_t def) const;
  double get_float_or(const std::string& key, double def) const;
  bool get_bool_or(const std::string& key, bool def) const;
  const nlohmann::json& get(const std::string& key) const;  // throws when missing
  // linear_attn_config.full_attn_layers (1-indexed as stored)
  std::vector<int64_t> full_attn_layers_1based() const;
  // quantization_config from merged dict (null json when absent)
  nlohmann::json quantization_config() const;
  bool experts_mxfp4_packed() const;  // compressed-tensors + mxfp4-pack-quantized
};

}  // namespace kimi
