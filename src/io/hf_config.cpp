// Hugging Face config.json loader (k3-architecture.md §1.1-§1.2).
#include "io/hf_config.h"

#include <cerrno>
#include <cstring>
#include <limits>
#include <set>

#include "util/error.h"
#include "util/json.h"
#include "util/paths.h"

using nlohmann::json;

namespace kimi {

namespace {

constexpr uint64_t kMaxConfigBytes = 64ull << 20;  // config.json is a few KB

// Looks KEY up in J: the literal key first, then (if it contains '.') as a path of nested
// objects, e.g. "linear_attn_config.head_dim". Returns nullptr when absent.
const json* lookup(const json& j, const std::string& key) {
  if (!j.is_object()) return nullptr;
  auto it = j.find(key);
  if (it != j.end()) return &*it;
  if (key.find('.') == std::string::npos) return nullptr;
  const json* cur = &j;
  size_t start = 0;
  for (;;) {
    size_t dot = key.find('.', start);
    std::string part = key.substr(start, dot == std::string::npos ? std::string::npos : dot - start);
    if (!cur->is_object()) return nullptr;
    auto f = cur->find(part);
    if (f == cur->end()) return nullptr;
    cur = &*f;
    if (dot == std::string::npos) return cur;
    start = dot + 1;
  }
}

const char* type_desc(const json& v) {
  if (v.is_number_float()) return "float";
  if (v.is_number()) return "integer";
  return v.type_name();
}

std::string show(const json& v) {
  std::string s = v.dump();
  if (s.size() > 60) s = s.substr(0, 57) + "...";
  return s;
}

int64_t as_int(const json& v, const std::string& label, const std::string& key) {
  if (v.is_number_unsigned()) {
    uint64_t u = v.get<uint64_t>();
    check(u <= static_cast<uint64_t>(std::numeric_limits<int64_t>::max()), "{}: key '{}' value {} is too large",
          label, key, u);
    return static_cast<int64_t>(u);
  }
  if (v.is_number_integer()) return v.get<int64_t>();
  fail("{}: key '{}' expected integer, got {} {}", label, key, type_desc(v), show(v));
}

double as_float(const json& v, const std::string& label, const std::string& key) {
  if (v.is_number()) return v.get<double>();
  fail("{}: key '{}' expected number, got {} {}", label, key, type_desc(v), show(v));
}

bool as_bool(const json& v, const std::string& label, const std::string& key) {
  if (v.is_boolean()) return v.get<bool>();
  fail("{}: key '{}' expected boolean, got {} {}", label, key, type_desc(v), show(v));
}

}  // namespace

HfConfig HfConfig::load(const std::string& config_json_path) {
  return parse(read_input_file(config_json_path, kMaxConfigBytes), config_json_path);
}

HfConfig HfConfig::parse(const std::string& text, const std::string& label) {
  HfConfig c;
  c.path = label;
  try {
    c.root = parse_json<json>(text, label);
  } catch (const JsonError& e) {
    if (e.too_deep) throw;
    auto [line, col] = json_line_col(text, e.byte);
    fail("{}: invalid JSON at line {}, column {}: {}", label, line, col, e.what());
  }
  check(c.root.is_object(), "{}: top level must be a JSON object, got {}", label, c.root.type_name());
  c.merged = c.root;
  auto tc = c.root.find("text_config");
  if (tc != c.root.end() && !tc->is_null()) {
    check(tc->is_object(), "{}: key 'text_config' expected object, got {}", label, tc->type_name());
    for (auto it = tc->begin(); it != tc->end(); ++it) c.merged[it.key()] = it.value();
  }
  return c;
}

std::string HfConfig::top_architecture() const {
  auto it = root.find("architectures");
  if (it == root.end() || !it->is_array() || it->empty() || !(*it)[0].is_string()) return "";
  return (*it)[0].get<std::string>();
}

bool HfConfig::has(const std::string& key) const {
  const json* v = lookup(merged, key);
  return v && !v->is_null();
}

const json& HfConfig::get(const std::string& key) const {
  const json* v = lookup(merged, key);
  if (!v || v->is_null()) fail("{}: key '{}' missing", path, key);
  return *v;
}

int64_t HfConfig::get_int(const std::string& key) const { return as_int(get(key), path, key); }
double HfConfig::get_float(const std::string& key) const { return as_float(get(key), path, key); }
bool HfConfig::get_bool(const std::string& key) const { return as_bool(get(key), path, key); }

std::string HfConfig::get_str(const std::string& key) const {
  const json& v = get(key);
  if (!v.is_string()) fail("{}: key '{}' expected string, got {} {}", path, key, type_desc(v), show(v));
  return v.get<std::string>();
}

int64_t HfConfig::get_int_or(const std::string& key, int64_t def) const { return has(key) ? get_int(key) : def; }
double HfConfig::get_float_or(const std::string& key, double def) const { return has(key) ? get_float(key) : def; }
bool HfConfig::get_bool_or(const std::string& key, bool def) const { return has(key) ? get_bool(key) : def; }

std::vector<int64_t> HfConfig::full_attn_layers_1based() const {
  const json& lac = get("linear_attn_config");
  check(lac.is_object(), "{}: key 'linear_attn_config' expected object, got {}", path, lac.type_name());
  auto it = lac.find("full_attn_layers");
  check(it != lac.end() && !it->is_null(), "{}: key 'linear_attn_config.full_attn_layers' missing", path);
  check(it->is_array(), "{}: key 'linear_attn_config.full_attn_layers' expected array of integers, got {}", path,
        it->type_name());
  const int64_t n_layers = has("num_hidden_layers") ? get_int("num_hidden_layers") : -1;
  std::vector<int64_t> out;
  std::set<int64_t> seen;
  for (size_t i = 0; i < it->size(); ++i) {
    const std::string k = "linear_attn_config.full_attn_layers[" + std::to_string(i) + "]";
    int64_t v = as_int((*it)[i], path, k);
    check(v >= 1, "{}: key '{}' = {}: layers are 1-indexed, expected >= 1", path, k, v);
    check(n_layers < 0 || v <= n_layers, "{}: key '{}' = {} exceeds num_hidden_layers = {} (1-indexed)", path, k, v,
          n_layers);
    check(seen.insert(v).second, "{}: key '{}' = {} is listed twice", path, k, v);
    out.push_back(v);
  }
  return out;
}

json HfConfig::quantization_config() const {
  auto it = merged.find("quantization_config");
  if (it == merged.end() || it->is_null()) return json();
  check(it->is_object(), "{}: key 'quantization_config' expected object, got {}", path, it->type_name());
  return *it;
}

bool HfConfig::experts_mxfp4_packed() const {
  json qc = quantization_config();
  if (qc.is_null()) return false;
  auto qm = qc.find("quant_method");
  if (qm == qc.end() || !qm->is_string() || qm->get<std::string>() != "compressed-tensors") return false;
  auto fmt_it = qc.find("format");
  if (fmt_it != qc.end() && !fmt_it->is_null()) {
    check(fmt_it->is_string(), "{}: key 'quantization_config.format' expected string, got {}", path,
          fmt_it->type_name());
    return fmt_it->get<std::string>() == "mxfp4-pack-quantized";
  }
  // No top-level format: compressed-tensors may carry it per config group; require all groups to agree.
  auto groups = qc.find("config_groups");
  if (groups == qc.end() || !groups->is_object() || groups->empty()) return false;
  for (auto g = groups->begin(); g != groups->end(); ++g) {
    if (!g.value().is_object()) return false;
    auto f = g.value().find("format");
    if (f == g.value().end() || !f->is_string() || f->get<std::string>() != "mxfp4-pack-quantized") return false;
  }
  return true;
}

}  // namespace kimi
