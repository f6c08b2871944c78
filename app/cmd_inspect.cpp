// kimi inspect FILE.gguf [--json] [--full]: metadata, tensor table and totals by type of a GGUF
// file (or a set of split files: pass any shard).
#include <CLI/CLI.hpp>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <nlohmann/json.hpp>
#include <string>

#include "command.h"
#include "io/gguf.h"
#include "runtime/vision_input.h"
#include "util/error.h"
#include "util/cli.h"

namespace {

using kimi::gguf::Reader;
using kimi::gguf::TensorInfo;
using kimi::gguf::Value;
using kimi::gguf::ValueType;
using json = nlohmann::ordered_json;

constexpr size_t kTextArrayElems = 8;      // text: elements shown per array
constexpr size_t kTextStringBytes = 160;   // text: longest string shown in full
constexpr size_t kJsonArrayLimit = 1024;   // json: longer arrays are summarized unless --full
constexpr size_t kJsonSummaryElems = 8;

std::string human_bytes(uint64_t b) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  double v = static_cast<double>(b);
  int u = 0;
  while (v >= 1024 && u < 4) {
    v /= 1024;
    ++u;
  }
  return u == 0 ? fmt::format("{} B", b) : fmt::format("{:.2f} {}", v, units[u]);
}

std::string type_label(const Value& v) {
  if (v.type == ValueType::ARRAY)
    return fmt::format("arr[{},{}]", kimi::gguf::value_type_name(v.elem_type), v.array_size());
  return kimi::gguf::value_type_name(v.type);
}

std::string text_value(const Value& v) {
  if (v.type == ValueType::STRING && v.s.size() > kTextStringBytes) {
    Value head = Value::str(v.s.substr(0, kTextStringBytes));
    return fmt::format("{}... ({} bytes)", head.to_string(), v.s.size());
  }
  return v.to_string(kTextArrayElems);
}

json float_json(double f, ValueType t) {
  if (t == ValueType::FLOAT32) {
    // shortest decimal of the float, so 0.1f prints as 0.1
    const std::string s = fmt::format("{}", static_cast<float>(f));
    return std::strtod(s.c_str(), nullptr);
  }
  return f;
}

json element_json(const Value& v, size_t k) {
  switch (v.elem_type) {
    case ValueType::UINT8:
    case ValueType::UINT16:
    case ValueType::UINT32:
    case ValueType::UINT64: return v.uints[k];
    case ValueType::INT8:
    case ValueType::INT16:
    case ValueType::INT32:
    case ValueType::INT64: return v.ints[k];
    case ValueType::FLOAT32:
    case ValueType::FLOAT64: return float_json(v.floats[k], v.elem_type);
    case ValueType::BOOL: return static_cast<bool>(v.bools[k]);
    case ValueType::STRING: return v.strs[k];
    default: return nullptr;
  }
}

json value_json(const Value& v, bool full) {
  switch (v.type) {
    case ValueType::UINT8:
    case ValueType::UINT16:
    case ValueType::UINT32:
    case ValueType::UINT64: return v.u;
    case ValueType::INT8:
    case ValueType::INT16:
    case ValueType::INT32:
    case ValueType::INT64: return v.i;
    case ValueType::FLOAT32:
    case ValueType::FLOAT64: return float_json(v.f, v.type);
    case ValueType::BOOL: return v.b;
    case ValueType::STRING: return v.s;
    case ValueType::ARRAY: break;
  }
  const size_t n = v.array_size();
  if (full || n <= kJsonArrayLimit) {
    json a = json::array();
    for (size_t k = 0; k < n; ++k) a.push_back(element_json(v, k));
    return a;
  }
  json first = json::array();
  for (size_t k = 0; k < kJsonSummaryElems; ++k) first.push_back(element_json(v, k));
  return json{{"type", std::string("array")},
              {"elem_type", kimi::gguf::value_type_name(v.elem_type)},
              {"count", n},
              {"first", first}};
}

struct Total {
  uint64_t tensors = 0, bytes = 0, elements = 0;
};

int run(int argc, char** argv) {
  CLI::App app{"Show the metadata, tensors and size totals of a GGUF file (any shard of a split set)"};
  std::string path;
  bool as_json = false, full = false;
  app.add_option("file", path, "GGUF file")->required();
  app.add_flag("--json", as_json,
               "print one JSON object {version, alignment, metadata, tensors, totals}; arrays longer than 1024 "
               "elements become {type, elem_type, count, first}");
  app.add_flag("--full", full, "with --json: print long arrays in full");
  if (int rc = kimi::parse_cli(app, argc, argv); rc >= 0) return rc;

  auto r = Reader::open(path);
  std::map<std::string, Total> by_type;
  Total all;
  for (const auto& t : r->tensors()) {
    auto& tt = by_type[kimi::type_name(t.type)];
    for (Total* x : {&tt, &all}) {
      x->tensors += 1;
      x->bytes += t.nbytes;
      x->elements += static_cast<uint64_t>(t.nelements());
    }
  }

  if (as_json) {
    json j;
    j["version"] = r->version();
    j["alignment"] = r->alignment();
    j["n_files"] = r->n_files();
    json md = json::object();
    for (const auto& kv : r->kvs()) md[kv.key] = value_json(kv.value, full);
    j["metadata"] = std::move(md);
    json ts = json::array();
    for (const auto& t : r->tensors()) {
      json shape = json::array();
      for (uint32_t d = 0; d < t.n_dims; ++d) shape.push_back(t.ne[d]);
      ts.push_back({{"name", t.name},
                    {"type", kimi::type_name(t.type)},
                    {"shape", shape},
                    {"bytes", t.nbytes},
                    {"offset", t.offset},
                    {"file", t.file_index}});
    }
    j["tensors"] = std::move(ts);
    json tot = json::object();
    for (const auto& [name, x] : by_type)
      tot[name] = {{"tensors", x.tensors}, {"bytes", x.bytes}, {"elements", x.elements}};
    tot["all"] = {{"tensors", all.tensors}, {"bytes", all.bytes}, {"elements", all.elements}};
    j["totals"] = std::move(tot);
    std::string out = j.dump(-1, ' ', false, json::error_handler_t::replace);
    std::fwrite(out.data(), 1, out.size(), stdout);
    std::fputc('\n', stdout);
    return 0;
  }

  std::string out;
  out += fmt::format("file: {}", path);
  if (r->n_files() > 1) out += fmt::format(" ({} split files)", r->n_files());
  out += fmt::format("\nGGUF v{}, alignment {}, {} metadata keys, {} tensors, {} of tensor data\n", r->version(),
                     r->alignment(), r->kvs().size(), r->tensors().size(), human_bytes(all.bytes));
  // the image path (docs/spec/vision.md §2.2): a projector file, or a text model and its companion
  const Value* arch = r->find("general.architecture");
  if (arch && arch->type == ValueType::STRING && arch->s == "moonvit3d") {
    auto u = [&](const char* k) { return r->get_u32_or(std::string("moonvit3d.") + k, 0); };
    out += fmt::format("vision projector (MoonViT3D): {} blocks, width {}, {} heads x {}, MLP {}, patch {}, "
                       "projector -> {} (docs/spec/vision.md)\n",
                       u("block_count"), u("embedding_length"), u("head_count"),
                       u("head_count") ? u("qkv_length") / u("head_count") : 0, u("feed_forward_length"),
                       u("patch_size"), u("projector.output_length"));
  } else if (arch && arch->type == ValueType::STRING && arch->s == "kimi-k3") {
    const std::string mm = kimi::find_mmproj(path);
    out += mm.empty() ? "vision: no projector file next to it (text only; kimi convert writes MODEL.mmproj.gguf)\n"
                      : fmt::format("vision: projector file {}\n", mm);
  }
  out += "\n";

  size_t kw = 3, tw = 4;
  for (const auto& kv : r->kvs()) {
    kw = std::max(kw, kv.key.size());
    tw = std::max(tw, type_label(kv.value).size());
  }
  out += fmt::format("metadata:\n  {:<{}}  {:<{}}  {}\n", "key", kw, "type", tw, "value");
  for (const auto& kv : r->kvs())
    out += fmt::format("  {:<{}}  {:<{}}  {}\n", kv.key, kw, type_label(kv.value), tw, text_value(kv.value));

  size_t nw = 4, sw = 5;
  for (const auto& t : r->tensors()) {
    nw = std::max(nw, t.name.size());
    sw = std::max(sw, t.shape_string().size());
  }
  const bool split = r->n_files() > 1;
  out += fmt::format("\ntensors:\n  {:>5}  {:<{}}  {:<7}  {:<{}}  {:>14}{}\n", "#", "name", nw, "type", "shape", sw,
                     "bytes", split ? "  file" : "");
  for (size_t k = 0; k < r->tensors().size(); ++k) {
    const TensorInfo& t = r->tensors()[k];
    out += fmt::format("  {:>5}  {:<{}}  {:<7}  {:<{}}  {:>14}", k, t.name, nw, kimi::type_name(t.type),
                       t.shape_string(), sw, t.nbytes);
    if (split) out += fmt::format("  {:>4}", t.file_index);
    out += '\n';
  }
  out += "\ntotals by type:\n";
  for (const auto& [name, x] : by_type)
    out += fmt::format("  {:<7}  {:>6} tensors  {:>16} elements  {:>14} bytes  ({})\n", name, x.tensors, x.elements,
                       x.bytes, human_bytes(x.bytes));
  out += fmt::format("  {:<7}  {:>6} tensors  {:>16} elements  {:>14} bytes  ({})\n", "all", all.tensors,
                     all.elements, all.bytes, human_bytes(all.bytes));
  std::fwrite(out.data(), 1, out.size(), stdout);
  return 0;
}

kimi::app::Registrar reg_inspect("inspect", "show a GGUF file's metadata, tensors and totals (--json)", run);

}  // namespace
