// GGUF v3 reader (formats-quant.md §1) and the metadata Value helpers. The writer is in
// gguf_writer.cpp. Every read is bounds-checked against the buffer; every size computation is
// overflow-checked; every problem throws kimi::Error naming the file and what is wrong.
#include "io/gguf.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <numeric>
#include <string_view>

#include "io/gguf_internal.h"
#include "util/error.h"

namespace kimi::gguf {

// ---------------------------------------------------------------------------------------------
// Value

const char* value_type_name(ValueType t) {
  switch (t) {
    case ValueType::UINT8: return "uint8";
    case ValueType::INT8: return "int8";
    case ValueType::UINT16: return "uint16";
    case ValueType::INT16: return "int16";
    case ValueType::UINT32: return "uint32";
    case ValueType::INT32: return "int32";
    case ValueType::FLOAT32: return "float32";
    case ValueType::BOOL: return "bool";
    case ValueType::STRING: return "string";
    case ValueType::ARRAY: return "array";
    case ValueType::UINT64: return "uint64";
    case ValueType::INT64: return "int64";
    case ValueType::FLOAT64: return "float64";
  }
  return "unknown";
}

size_t Value::array_size() const {
  if (type != ValueType::ARRAY) return 0;
  switch (detail::kind_of(elem_type)) {
    case detail::Kind::Unsigned: return uints.size();
    case detail::Kind::Signed: return ints.size();
    case detail::Kind::Float: return floats.size();
    case detail::Kind::Bool: return bools.size();
    case detail::Kind::String: return strs.size();
    case detail::Kind::Array: return 0;
  }
  return 0;
}

Value Value::u8(uint8_t v) { Value r; r.type = ValueType::UINT8; r.u = v; r.i = v; return r; }
Value Value::u16(uint16_t v) { Value r; r.type = ValueType::UINT16; r.u = v; r.i = v; return r; }
Value Value::u32(uint32_t v) { Value r; r.type = ValueType::UINT32; r.u = v; r.i = v; return r; }
Value Value::i32(int32_t v) {
  Value r;
  r.type = ValueType::INT32;
  r.i = v;
  r.u = v >= 0 ? static_cast<uint64_t>(v) : 0;
  return r;
}
Value Value::u64(uint64_t v) {
  Value r;
  r.type = ValueType::UINT64;
  r.u = v;
  r.i = v <= static_cast<uint64_t>(INT64_MAX) ? static_cast<int64_t>(v) : 0;
  return r;
}
Value Value::f32(float v) { Value r; r.type = ValueType::FLOAT32; r.f = v; return r; }
Value Value::boolean(bool v) { Value r; r.type = ValueType::BOOL; r.b = v; return r; }
Value Value::str(std::string v) { Value r; r.type = ValueType::STRING; r.s = std::move(v); return r; }
Value Value::arr_i32(std::vector<int32_t> v) {
  Value r;
  r.type = ValueType::ARRAY;
  r.elem_type = ValueType::INT32;
  r.ints.assign(v.begin(), v.end());
  return r;
}
Value Value::arr_u32(std::vector<uint32_t> v) {
  Value r;
  r.type = ValueType::ARRAY;
  r.elem_type = ValueType::UINT32;
  r.uints.assign(v.begin(), v.end());
  return r;
}
Value Value::arr_f32(std::vector<float> v) {
  Value r;
  r.type = ValueType::ARRAY;
  r.elem_type = ValueType::FLOAT32;
  r.floats.assign(v.begin(), v.end());
  return r;
}
Value Value::arr_bool(std::vector<bool> v) {
  Value r;
  r.type = ValueType::ARRAY;
  r.elem_type = ValueType::BOOL;
  r.bools = std::move(v);
  return r;
}
Value Value::arr_str(std::vector<std::string> v) {
  Value r;
  r.type = ValueType::ARRAY;
  r.elem_type = ValueType::STRING;
  r.strs = std::move(v);
  return r;
}

namespace {

// Length of the valid UTF-8 sequence starting at s[k] (a byte >= 0x80), or 0.
size_t utf8_len(std::string_view s, size_t k) {
  const auto b = [&](size_t j) { return static_cast<unsigned char>(s[j]); };
  const unsigned char c = b(k);
  size_t len;
  uint32_t cp;
  if (c >= 0xc2 && c <= 0xdf) {
    len = 2;
    cp = c & 0x1f;
  } else if (c >= 0xe0 && c <= 0xef) {
    len = 3;
    cp = c & 0x0f;
  } else if (c >= 0xf0 && c <= 0xf4) {
    len = 4;
    cp = c & 0x07;
  } else {
    return 0;
  }
  if (k + len > s.size()) return 0;
  for (size_t j = 1; j < len; ++j) {
    if ((b(k + j) & 0xc0) != 0x80) return 0;
    cp = (cp << 6) | (b(k + j) & 0x3f);
  }
  if ((len == 3 && (cp < 0x800 || (cp >= 0xd800 && cp <= 0xdfff))) || (len == 4 && (cp < 0x10000 || cp > 0x10ffff)))
    return 0;
  return len;
}

void append_escaped(std::string& out, std::string_view s, size_t max_bytes) {
  out += '"';
  size_t n = std::min(s.size(), max_bytes);
  for (size_t k = 0; k < n; ++k) {
    unsigned char c = static_cast<unsigned char>(s[k]);
    switch (c) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      case '\r': out += "\\r"; break;
      case '\t': out += "\\t"; break;
      default:
        if (c < 0x20 || c == 0x7f) {
          out += fmt::format("\\x{:02x}", c);
        } else if (c < 0x80) {
          out += static_cast<char>(c);
        } else if (size_t len = utf8_len(s, k); len > 0 && k + len <= n) {
          out.append(s.substr(k, len));
          k += len - 1;
        } else {
          out += fmt::format("\\x{:02x}", c);  // not valid UTF-8
        }
    }
  }
  out += '"';
  if (n < s.size()) out += fmt::format("...({} bytes)", s.size());
}

std::string float_string(double v, ValueType t) {
  if (t == ValueType::FLOAT32) return fmt::format("{}", static_cast<float>(v));
  return fmt::format("{}", v);
}

}  // namespace

std::string Value::to_string(size_t max_elems) const {
  switch (type) {
    case ValueType::UINT8:
    case ValueType::UINT16:
    case ValueType::UINT32:
    case ValueType::UINT64: return fmt::format("{}", u);
    case ValueType::INT8:
    case ValueType::INT16:
    case ValueType::INT32:
    case ValueType::INT64: return fmt::format("{}", i);
    case ValueType::FLOAT32:
    case ValueType::FLOAT64: return float_string(f, type);
    case ValueType::BOOL: return b ? "true" : "false";
    case ValueType::STRING: {
      std::string out;
      append_escaped(out, s, std::numeric_limits<size_t>::max());
      return out;
    }
    case ValueType::ARRAY: break;
    default: return fmt::format("<invalid value type {}>", static_cast<uint32_t>(type));
  }
  const size_t n = array_size();
  const size_t shown = std::min(n, max_elems);
  std::string out = "[";
  for (size_t k = 0; k < shown; ++k) {
    if (k) out += ", ";
    switch (detail::kind_of(elem_type)) {
      case detail::Kind::Unsigned: out += fmt::format("{}", uints[k]); break;
      case detail::Kind::Signed: out += fmt::format("{}", ints[k]); break;
      case detail::Kind::Float: out += float_string(floats[k], elem_type); break;
      case detail::Kind::Bool: out += bools[k] ? "true" : "false"; break;
      case detail::Kind::String: append_escaped(out, strs[k], 64); break;
      case detail::Kind::Array: break;
    }
  }
  if (shown < n) out += shown ? ", ..." : "...";
  out += "]";
  if (shown < n) out += fmt::format(" ({} x {})", n, value_type_name(elem_type));
  return out;
}

std::string TensorInfo::shape_string() const {
  std::string out = "{";
  for (uint32_t d = 0; d < n_dims && d < 4; ++d) {
    if (d) out += ", ";
    out += fmt::format("{}", ne[d]);
  }
  return out + "}";
}

// ---------------------------------------------------------------------------------------------
// Reader: parsing

namespace detail {

Kind kind_of(ValueType t) {
  switch (t) {
    case ValueType::UINT8:
    case ValueType::UINT16:
    case ValueType::UINT32:
    case ValueType::UINT64: return Kind::Unsigned;
    case ValueType::INT8:
    case ValueType::INT16:
    case ValueType::INT32:
    case ValueType::INT64: return Kind::Signed;
    case ValueType::FLOAT32:
    case ValueType::FLOAT64: return Kind::Float;
    case ValueType::BOOL: return Kind::Bool;
    case ValueType::STRING: return Kind::String;
    case ValueType::ARRAY: return Kind::Array;
  }
  return Kind::Array;
}

size_t scalar_size(ValueType t) {
  switch (t) {
    case ValueType::UINT8:
    case ValueType::INT8:
    case ValueType::BOOL: return 1;
    case ValueType::UINT16:
    case ValueType::INT16: return 2;
    case ValueType::UINT32:
    case ValueType::INT32:
    case ValueType::FLOAT32: return 4;
    case ValueType::UINT64:
    case ValueType::INT64:
    case ValueType::FLOAT64: return 8;
    case ValueType::STRING: return 8;  // the length prefix (minimum size)
    case ValueType::ARRAY: return 12;  // elem type + count (minimum size)
  }
  return 0;
}

const char* removed_type_note(uint32_t id) {
  switch (id) {
    case 4: return "removed type Q4_2";
    case 5: return "removed type Q4_3";
    case 31: return "removed type Q4_0_4_4";
    case 32: return "removed type Q4_0_4_8";
    case 33: return "removed type Q4_0_8_8";
    case 36: return "removed type IQ4_NL_4_4";
    case 37: return "removed type IQ4_NL_4_8";
    case 38: return "removed type IQ4_NL_8_8";
    case 40: return "NVFP4, not supported by this engine";
    case 41: return "Q1_0, not supported by this engine";
    case 42: return "Q2_0, not supported by this engine";
    default: return "unknown type";
  }
}

bool tensor_nbytes(GgmlType type, const std::array<int64_t, 4>& ne, uint64_t& nbytes, std::string& why) {
  const auto tr = type_traits(static_cast<uint32_t>(type));
  if (!tr) {
    why = fmt::format("unknown ggml type id {}", static_cast<uint32_t>(type));
    return false;
  }
  int64_t elems = 1;
  for (int d = 0; d < 4; ++d) {
    if (ne[d] < 0) {
      why = fmt::format("ne[{}] = {} is negative", d, ne[d]);
      return false;
    }
    if (__builtin_mul_overflow(elems, ne[d], &elems)) {
      why = "element count overflows int64";
      return false;
    }
  }
  if (static_cast<uint64_t>(ne[0]) % tr->block != 0) {
    why = fmt::format("ne[0] = {} is not a multiple of the {} block size {}", ne[0], tr->name, tr->block);
    return false;
  }
  uint64_t b = 0;
  if (__builtin_mul_overflow(static_cast<uint64_t>(ne[0]) / tr->block, static_cast<uint64_t>(tr->bytes), &b)) {
    why = "byte size overflows uint64";
    return false;
  }
  for (int d = 1; d < 4; ++d) {
    if (__builtin_mul_overflow(b, static_cast<uint64_t>(ne[d]), &b)) {
      why = "byte size overflows uint64";
      return false;
    }
  }
  if (b > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
    why = fmt::format("byte size {} is too large", b);
    return false;
  }
  nbytes = b;
  return true;
}

bool parse_split_name(const std::string& path, std::string& prefix, uint32_t& no, uint32_t& count) {
  // PREFIX-NNNNN-of-MMMMM.gguf
  static constexpr std::string_view kExt = ".gguf";
  static constexpr size_t kTail = 1 + 5 + 4 + 5;  // "-NNNNN-of-MMMMM"
  if (path.size() < kTail + kExt.size() + 1) return false;
  if (path.compare(path.size() - kExt.size(), kExt.size(), kExt) != 0) return false;
  const size_t t = path.size() - kExt.size() - kTail;
  auto digits = [&](size_t at, uint32_t& v) {
    v = 0;
    for (size_t k = 0; k < 5; ++k) {
      char c = path[at + k];
      if (c < '0' || c > '9') return false;
      v = v * 10 + static_cast<uint32_t>(c - '0');
    }
    return true;
  };
  if (path[t] != '-' || path.compare(t + 6, 4, "-of-") != 0) return false;
  if (!digits(t + 1, no) || !digits(t + 10, count)) return false;
  if (no == 0 || count == 0 || no > count) return false;
  prefix = path.substr(0, t);
  return true;
}

std::string split_name(const std::string& prefix, uint32_t no, uint32_t count) {
  return fmt::format("{}-{:05d}-of-{:05d}.gguf", prefix, no, count);
}

}  // namespace detail

namespace {

constexpr uint32_t kMagic = 0x46554747;  // "GGUF" read as LE u32
constexpr uint64_t kMaxStringLen = 1ull << 30;
constexpr uint64_t kMaxArrayCount = 1ull << 30;
constexpr size_t kMaxNameLen = 63;  // GGML_MAX_NAME - 1
constexpr uint64_t kMinKvBytes = 8 + 1 + 4 + 1;
constexpr uint64_t kMinTensorInfoBytes = 8 + 1 + 4 + 8 + 4 + 8;

// Bounds-checked little-endian cursor over one buffer. `what` callables describe the field being
// read; they are only evaluated when the read fails.
struct Cursor {
  const uint8_t* data;
  size_t size;
  const std::string& label;
  size_t pos = 0;

  size_t left() const { return size - pos; }

  template <typename What>
  void need(uint64_t n, const What& what) const {
    if (n > left())
      fail("{}: truncated file: {} at offset {} needs {} bytes, but only {} remain (file size {})", label, what(),
           pos, n, left(), size);
  }
  template <typename T, typename What>
  T read(const What& what) {
    need(sizeof(T), what);
    T v;
    std::memcpy(&v, data + pos, sizeof(T));
    pos += sizeof(T);
    return v;
  }
  template <typename What>
  std::string read_string(const What& what) {
    const uint64_t len = read<uint64_t>([&] { return fmt::format("length of {}", what()); });
    if (len > kMaxStringLen)
      fail("{}: {} has length {} at offset {} (limit {})", label, what(), len, pos - 8, kMaxStringLen);
    need(len, what);
    std::string s(reinterpret_cast<const char*>(data + pos), static_cast<size_t>(len));
    pos += static_cast<size_t>(len);
    return s;
  }
};

struct Parsed {
  uint32_t version = 3;
  uint32_t alignment = 32;
  std::vector<KV> kvs;
  std::map<std::string, size_t> kv_index;
  std::vector<TensorInfo> tensors;
  uint64_t data_start = 0;
};

ValueType checked_value_type(uint32_t raw, const std::string& label, const std::string& key, const char* role) {
  if (raw > static_cast<uint32_t>(ValueType::FLOAT64))
    fail("{}: key '{}': unknown {} {} (valid: 0..12)", label, key, role, raw);
  return static_cast<ValueType>(raw);
}

void read_scalar(Cursor& c, ValueType t, Value& v, const std::string& key) {
  auto what = [&] { return fmt::format("value of key '{}' ({})", key, value_type_name(t)); };
  switch (t) {
    case ValueType::UINT8: v.u = c.read<uint8_t>(what); v.i = static_cast<int64_t>(v.u); break;
    case ValueType::UINT16: v.u = c.read<uint16_t>(what); v.i = static_cast<int64_t>(v.u); break;
    case ValueType::UINT32: v.u = c.read<uint32_t>(what); v.i = static_cast<int64_t>(v.u); break;
    case ValueType::UINT64:
      v.u = c.read<uint64_t>(what);
      v.i = v.u <= static_cast<uint64_t>(INT64_MAX) ? static_cast<int64_t>(v.u) : 0;
      break;
    case ValueType::INT8: v.i = c.read<int8_t>(what); break;
    case ValueType::INT16: v.i = c.read<int16_t>(what); break;
    case ValueType::INT32: v.i = c.read<int32_t>(what); break;
    case ValueType::INT64: v.i = c.read<int64_t>(what); break;
    case ValueType::FLOAT32: v.f = c.read<float>(what); break;
    case ValueType::FLOAT64: v.f = c.read<double>(what); break;
    case ValueType::BOOL: {
      uint8_t b = c.read<uint8_t>(what);
      if (b > 1) fail("{}: key '{}': invalid bool value {} at offset {} (expected 0 or 1)", c.label, key, b, c.pos - 1);
      v.b = b != 0;
      break;
    }
    case ValueType::STRING:
      v.s = c.read_string([&] { return fmt::format("string value of key '{}'", key); });
      break;
    case ValueType::ARRAY: break;  // handled by read_array
  }
  if (detail::kind_of(t) == detail::Kind::Signed) v.u = v.i >= 0 ? static_cast<uint64_t>(v.i) : 0;
}

template <typename T, typename Out>
void read_fixed_elems(Cursor& c, uint64_t n, std::vector<Out>& out) {
  out.resize(static_cast<size_t>(n));
  const uint8_t* p = c.data + c.pos;
  for (size_t k = 0; k < n; ++k) {
    T v;
    std::memcpy(&v, p + k * sizeof(T), sizeof(T));
    out[k] = static_cast<Out>(v);
  }
  c.pos += static_cast<size_t>(n) * sizeof(T);
}

void read_array(Cursor& c, Value& v, const std::string& key) {
  const uint32_t raw = c.read<uint32_t>([&] { return fmt::format("element type of array key '{}'", key); });
  const ValueType et = checked_value_type(raw, c.label, key, "array element type");
  if (et == ValueType::ARRAY) fail("{}: key '{}': nested arrays are not supported", c.label, key);
  v.elem_type = et;
  const uint64_t n = c.read<uint64_t>([&] { return fmt::format("element count of array key '{}'", key); });
  if (n > kMaxArrayCount) fail("{}: key '{}': array count {} exceeds the limit {}", c.label, key, n, kMaxArrayCount);
  const size_t es = detail::scalar_size(et);  // strings: at least the 8-byte length each
  if (n > c.left() / es)
    fail("{}: key '{}': array of {} {} elements at offset {} cannot fit in the {} remaining bytes", c.label, key, n,
         value_type_name(et), c.pos, c.left());
  switch (et) {
    case ValueType::UINT8: read_fixed_elems<uint8_t>(c, n, v.uints); break;
    case ValueType::UINT16: read_fixed_elems<uint16_t>(c, n, v.uints); break;
    case ValueType::UINT32: read_fixed_elems<uint32_t>(c, n, v.uints); break;
    case ValueType::UINT64: read_fixed_elems<uint64_t>(c, n, v.uints); break;
    case ValueType::INT8: read_fixed_elems<int8_t>(c, n, v.ints); break;
    case ValueType::INT16: read_fixed_elems<int16_t>(c, n, v.ints); break;
    case ValueType::INT32: read_fixed_elems<int32_t>(c, n, v.ints); break;
    case ValueType::INT64: read_fixed_elems<int64_t>(c, n, v.ints); break;
    case ValueType::FLOAT32: read_fixed_elems<float>(c, n, v.floats); break;
    case ValueType::FLOAT64: read_fixed_elems<double>(c, n, v.floats); break;
    case ValueType::BOOL: {
      v.bools.resize(static_cast<size_t>(n));
      for (size_t k = 0; k < n; ++k) {
        uint8_t b = c.data[c.pos + k];
        if (b > 1)
          fail("{}: key '{}': array element {} is an invalid bool value {} (expected 0 or 1)", c.label, key, k, b);
        v.bools[k] = b != 0;
      }
      c.pos += static_cast<size_t>(n);
      break;
    }
    case ValueType::STRING: {
      v.strs.reserve(static_cast<size_t>(n));
      for (uint64_t k = 0; k < n; ++k)
        v.strs.push_back(c.read_string([&] { return fmt::format("element {} of string array key '{}'", k, key); }));
      break;
    }
    case ValueType::ARRAY: break;
  }
}

void parse_buffer(const uint8_t* data, size_t size, const std::string& label, Parsed& out) {
  Cursor c{data, size, label};
  const uint32_t magic = c.read<uint32_t>([] { return std::string("magic"); });
  if (magic != kMagic)
    fail("{}: not a GGUF file: bad magic {:02x} {:02x} {:02x} {:02x} (expected 47 47 55 46 \"GGUF\")", label, data[0],
         data[1], data[2], data[3]);
  const uint32_t version = c.read<uint32_t>([] { return std::string("version"); });
  if ((version & 0xffffu) == 0 && version != 0)
    fail("{}: big-endian GGUF files are not supported (version field 0x{:08x})", label, version);
  if (version != 2 && version != 3) fail("{}: unsupported GGUF version {} (expected 2 or 3)", label, version);
  out.version = version;
  const uint64_t n_tensors = c.read<uint64_t>([] { return std::string("tensor count"); });
  const uint64_t n_kv = c.read<uint64_t>([] { return std::string("metadata KV count"); });
  if (n_kv > c.left() / kMinKvBytes)
    fail("{}: metadata KV count {} cannot fit in the {} remaining bytes of the file", label, n_kv, c.left());
  if (n_tensors > c.left() / kMinTensorInfoBytes)
    fail("{}: tensor count {} cannot fit in the {} remaining bytes of the file", label, n_tensors, c.left());

  // ---- metadata
  out.kvs.reserve(static_cast<size_t>(n_kv));
  for (uint64_t k = 0; k < n_kv; ++k) {
    KV kv;
    kv.key = c.read_string([&] { return fmt::format("key of metadata KV {}", k); });
    if (kv.key.empty()) fail("{}: metadata KV {} has an empty key", label, k);
    const uint32_t raw = c.read<uint32_t>([&] { return fmt::format("value type of key '{}'", kv.key); });
    kv.value.type = checked_value_type(raw, label, kv.key, "value type");
    if (kv.value.type == ValueType::ARRAY)
      read_array(c, kv.value, kv.key);
    else
      read_scalar(c, kv.value.type, kv.value, kv.key);
    auto [it, inserted] = out.kv_index.emplace(kv.key, out.kvs.size());
    if (!inserted) fail("{}: duplicate metadata key '{}' (KV {} and KV {})", label, kv.key, it->second, k);
    out.kvs.push_back(std::move(kv));
  }

  // ---- alignment
  if (auto it = out.kv_index.find("general.alignment"); it != out.kv_index.end()) {
    const Value& v = out.kvs[it->second].value;
    if (v.type != ValueType::UINT32)
      fail("{}: key 'general.alignment': expected uint32, found {}", label, value_type_name(v.type));
    // the GGUF rule: a power of two and a multiple of 8 (a smaller one would put f32 / f16 data at
    // addresses their loads may not use)
    if (v.u < 8 || (v.u & (v.u - 1)) != 0)
      fail("{}: key 'general.alignment': {} is not a non-zero power of two that is a multiple of 8", label, v.u);
    out.alignment = static_cast<uint32_t>(v.u);
  }

  // ---- tensor infos
  std::map<std::string_view, size_t> names;
  out.tensors.resize(static_cast<size_t>(n_tensors));
  for (uint64_t k = 0; k < n_tensors; ++k) {
    TensorInfo& t = out.tensors[k];
    t.name = c.read_string([&] { return fmt::format("name of tensor {}", k); });
    if (t.name.empty()) fail("{}: tensor {} has an empty name", label, k);
    if (t.name.size() > kMaxNameLen)
      fail("{}: tensor {} name '{}' is {} bytes long (limit {})", label, k, t.name, t.name.size(), kMaxNameLen);
    t.n_dims = c.read<uint32_t>([&] { return fmt::format("n_dims of tensor '{}'", t.name); });
    if (t.n_dims < 1 || t.n_dims > 4)
      fail("{}: tensor '{}': n_dims = {} (expected 1..4)", label, t.name, t.n_dims);
    for (uint32_t d = 0; d < t.n_dims; ++d) {
      const uint64_t ne = c.read<uint64_t>([&] { return fmt::format("ne[{}] of tensor '{}'", d, t.name); });
      if (ne > static_cast<uint64_t>(INT64_MAX)) fail("{}: tensor '{}': ne[{}] = {} is too large", label, t.name, d, ne);
      t.ne[d] = static_cast<int64_t>(ne);
    }
    const uint32_t raw = c.read<uint32_t>([&] { return fmt::format("type of tensor '{}'", t.name); });
    if (!type_traits(raw))
      fail("{}: tensor '{}': invalid ggml type id {} ({})", label, t.name, raw, detail::removed_type_note(raw));
    t.type = static_cast<GgmlType>(raw);
    std::string why;
    if (!detail::tensor_nbytes(t.type, t.ne, t.nbytes, why))
      fail("{}: tensor '{}' {} of type {}: {}", label, t.name, t.shape_string(), type_name(t.type), why);
    t.offset = c.read<uint64_t>([&] { return fmt::format("data offset of tensor '{}'", t.name); });
    auto [it, inserted] = names.emplace(t.name, k);
    if (!inserted) fail("{}: duplicate tensor name '{}' (tensors {} and {})", label, t.name, it->second, k);
  }

  // ---- data section
  if (n_tensors == 0) {
    out.data_start = c.pos;
    return;
  }
  const uint64_t a = out.alignment;
  const uint64_t start = (static_cast<uint64_t>(c.pos) + a - 1) / a * a;  // pos <= size, no overflow
  if (start > size)
    fail("{}: truncated file: data section should start at offset {} but the file has {} bytes", label, start, size);
  out.data_start = start;
  const uint64_t data_size = size - start;
  for (auto& t : out.tensors) {
    if (t.offset % a != 0)
      fail("{}: tensor '{}': data offset {} is not a multiple of the alignment {}", label, t.name, t.offset, a);
    if (t.offset > data_size || t.nbytes > data_size - t.offset)
      fail("{}: tensor '{}': {} bytes at data offset {} lie past the end of the file (the data section is {} "
           "bytes)",
           label, t.name, t.nbytes, t.offset, data_size);
    t.data = data + start + t.offset;
  }
  std::vector<size_t> order(out.tensors.size());
  std::iota(order.begin(), order.end(), size_t{0});
  std::sort(order.begin(), order.end(), [&](size_t x, size_t y) {
    const auto& tx = out.tensors[x];
    const auto& ty = out.tensors[y];
    return tx.offset != ty.offset ? tx.offset < ty.offset : tx.nbytes < ty.nbytes;
  });
  for (size_t k = 1; k < order.size(); ++k) {
    const auto& p = out.tensors[order[k - 1]];
    const auto& q = out.tensors[order[k]];
    if (p.nbytes > 0 && q.nbytes > 0 && p.offset + p.nbytes > q.offset)
      fail("{}: tensors '{}' [{}, {}) and '{}' [{}, {}) overlap in the data section", label, p.name, p.offset,
           p.offset + p.nbytes, q.name, q.offset, q.offset + q.nbytes);
  }
}

}  // namespace

// Builds Reader objects; friend of Reader.
struct ReaderImpl {
  static void install(Reader& r, Parsed&& p, uint32_t file_index, bool metadata) {
    if (metadata) {
      r.version_ = p.version;
      r.alignment_ = p.alignment;
      r.kvs_ = std::move(p.kvs);
      r.kv_index_ = std::move(p.kv_index);
    }
    r.tensors_.reserve(r.tensors_.size() + p.tensors.size());
    for (auto& t : p.tensors) {
      t.file_index = file_index;
      auto [it, inserted] = r.tensor_index_.emplace(t.name, r.tensors_.size());
      if (!inserted)
        fail("{}: tensor '{}' appears in split file {} and in split file {}", r.path_, t.name,
             r.tensors_[it->second].file_index + 1, file_index + 1);
      r.tensors_.push_back(std::move(t));
    }
  }

  static uint64_t int_key(const Parsed& p, const std::string& key, const std::string& file, bool& present) {
    auto it = p.kv_index.find(key);
    present = it != p.kv_index.end();
    if (!present) return 0;
    const Value& v = p.kvs[it->second].value;
    const auto kind = detail::kind_of(v.type);
    if (kind == detail::Kind::Unsigned) return v.u;
    if (kind == detail::Kind::Signed && v.i >= 0) return static_cast<uint64_t>(v.i);
    fail("{}: key '{}': expected a non-negative integer, found {}", file, key,
         kind == detail::Kind::Signed ? v.to_string() : value_type_name(v.type));
  }

  static std::unique_ptr<Reader> open(const std::string& path) {
    std::unique_ptr<Reader> r(new Reader());
    r->path_ = path;
    MappedFile first(path);
    Parsed p0;
    parse_buffer(first.data(), first.size(), path, p0);
    bool has_count = false, has_no = false;
    const uint64_t count = int_key(p0, "split.count", path, has_count);
    const uint64_t given_no = int_key(p0, "split.no", path, has_no);
    if (!has_count || count <= 1) {
      if (has_count && count == 0) fail("{}: key 'split.count' is 0", path);
      if (has_no && given_no != 0) fail("{}: key 'split.no' is {} but split.count is {}", path, given_no, count);
      r->files_.push_back(std::move(first));
      install(*r, std::move(p0), 0, true);
      return r;
    }
    if (count > 65535) fail("{}: key 'split.count' = {} is too large", path, count);
    std::string prefix;
    uint32_t name_no = 0, name_count = 0;
    if (!detail::parse_split_name(path, prefix, name_no, name_count) || name_count != count)
      fail("{}: file has split.count = {} but its name is not of the form PREFIX-NNNNN-of-{:05d}.gguf", path, count,
           count);
    if (!has_no || given_no != name_no - 1)
      fail("{}: key 'split.no' is {} but the file name says shard {} (0-based split.no {})", path,
           has_no ? std::to_string(given_no) : std::string("missing"), name_no, name_no - 1);
    const uint32_t n = static_cast<uint32_t>(count);
    std::vector<Parsed> parsed(n);
    std::vector<MappedFile> files(n);
    for (uint32_t s = 0; s < n; ++s) {
      if (s == name_no - 1) {
        files[s] = std::move(first);
        parsed[s] = std::move(p0);
        continue;
      }
      const std::string sp = detail::split_name(prefix, s + 1, n);
      try {
        files[s] = MappedFile(sp);
      } catch (const Error& e) {
        fail("{}: split file {} of {} is missing or unreadable: {}", path, s + 1, n, e.what());
      }
      parse_buffer(files[s].data(), files[s].size(), sp, parsed[s]);
      bool hc = false, hn = false;
      const uint64_t c = int_key(parsed[s], "split.count", sp, hc);
      const uint64_t no = int_key(parsed[s], "split.no", sp, hn);
      if (!hc || c != count)
        fail("{}: key 'split.count' is {} (expected {}, as in '{}')", sp, hc ? std::to_string(c) : "missing", count,
             path);
      if (!hn || no != s) fail("{}: key 'split.no' is {} (expected {})", sp, hn ? std::to_string(no) : "missing", s);
    }
    bool has_total = false;
    const uint64_t total = int_key(parsed[0], "split.tensors.count", detail::split_name(prefix, 1, n), has_total);
    r->files_ = std::move(files);
    for (uint32_t s = 0; s < n; ++s) install(*r, std::move(parsed[s]), s, s == 0);
    if (has_total && total != r->tensors_.size())
      fail("{}: key 'split.tensors.count' says {} tensors but the {} split files hold {}", path, total, n,
           r->tensors_.size());
    return r;
  }

  static std::unique_ptr<Reader> open_memory(const uint8_t* data, size_t size, const std::string& label) {
    std::unique_ptr<Reader> r(new Reader());
    r->path_ = label;
    Parsed p;
    parse_buffer(data, size, label, p);
    install(*r, std::move(p), 0, true);
    return r;
  }
};

std::unique_ptr<Reader> Reader::open(const std::string& path) { return ReaderImpl::open(path); }

std::unique_ptr<Reader> Reader::open_memory(const uint8_t* data, size_t size, const std::string& label) {
  return ReaderImpl::open_memory(data, size, label);
}

// ---------------------------------------------------------------------------------------------
// Reader: accessors

const Value* Reader::find(const std::string& key) const {
  auto it = kv_index_.find(key);
  return it == kv_index_.end() ? nullptr : &kvs_[it->second].value;
}

namespace {

const Value& need_key(const Reader& r, const std::string& key) {
  const Value* v = r.find(key);
  if (!v) fail("{}: key '{}': missing", r.path(), key);
  return *v;
}

[[noreturn]] void wrong_type(const Reader& r, const std::string& key, const char* expected, const Value& v) {
  if (v.type == ValueType::ARRAY)
    fail("{}: key '{}': expected {}, found array of {}", r.path(), key, expected, value_type_name(v.elem_type));
  fail("{}: key '{}': expected {}, found {}", r.path(), key, expected, value_type_name(v.type));
}

// Integer value as a signed 128-bit number (every GGUF integer fits).
__int128 int_value(const Reader& r, const std::string& key, const char* expected, const Value& v) {
  switch (detail::kind_of(v.type)) {
    case detail::Kind::Unsigned: return static_cast<__int128>(v.u);
    case detail::Kind::Signed: return static_cast<__int128>(v.i);
    default: wrong_type(r, key, expected, v);
  }
}

template <typename T>
T int_as(const Reader& r, const std::string& key, const char* expected) {
  const Value& v = need_key(r, key);
  const __int128 x = int_value(r, key, expected, v);
  if (x < static_cast<__int128>(std::numeric_limits<T>::min()) ||
      x > static_cast<__int128>(std::numeric_limits<T>::max()))
    fail("{}: key '{}': value {} ({}) does not fit in {}", r.path(), key, v.to_string(), value_type_name(v.type),
         expected);
  return static_cast<T>(x);
}

}  // namespace

uint32_t Reader::get_u32(const std::string& key) const { return int_as<uint32_t>(*this, key, "uint32"); }
uint64_t Reader::get_u64(const std::string& key) const { return int_as<uint64_t>(*this, key, "uint64"); }
int64_t Reader::get_i64(const std::string& key) const { return int_as<int64_t>(*this, key, "int64"); }

float Reader::get_f32(const std::string& key) const {
  const Value& v = need_key(*this, key);
  if (detail::kind_of(v.type) != detail::Kind::Float) wrong_type(*this, key, "float32", v);
  return static_cast<float>(v.f);
}

bool Reader::get_bool(const std::string& key) const {
  const Value& v = need_key(*this, key);
  if (v.type != ValueType::BOOL) wrong_type(*this, key, "bool", v);
  return v.b;
}

const std::string& Reader::get_str(const std::string& key) const {
  const Value& v = need_key(*this, key);
  if (v.type != ValueType::STRING) wrong_type(*this, key, "string", v);
  return v.s;
}

std::vector<int64_t> Reader::get_int_array(const std::string& key) const {
  const Value& v = need_key(*this, key);
  if (v.type != ValueType::ARRAY) wrong_type(*this, key, "array of integers", v);
  const auto kind = detail::kind_of(v.elem_type);
  if (kind == detail::Kind::Signed) return v.ints;
  if (kind != detail::Kind::Unsigned) wrong_type(*this, key, "array of integers", v);
  std::vector<int64_t> out(v.uints.size());
  for (size_t k = 0; k < v.uints.size(); ++k) {
    if (v.uints[k] > static_cast<uint64_t>(INT64_MAX))
      fail("{}: key '{}': element {} = {} does not fit in int64", path_, key, k, v.uints[k]);
    out[k] = static_cast<int64_t>(v.uints[k]);
  }
  return out;
}

std::vector<float> Reader::get_float_array(const std::string& key) const {
  const Value& v = need_key(*this, key);
  if (v.type != ValueType::ARRAY) wrong_type(*this, key, "array of floats", v);
  switch (detail::kind_of(v.elem_type)) {
    case detail::Kind::Float: return std::vector<float>(v.floats.begin(), v.floats.end());
    case detail::Kind::Signed: return std::vector<float>(v.ints.begin(), v.ints.end());
    case detail::Kind::Unsigned: return std::vector<float>(v.uints.begin(), v.uints.end());
    default: wrong_type(*this, key, "array of floats", v);
  }
}

const std::vector<std::string>& Reader::get_str_array(const std::string& key) const {
  const Value& v = need_key(*this, key);
  if (v.type != ValueType::ARRAY || v.elem_type != ValueType::STRING) wrong_type(*this, key, "array of strings", v);
  return v.strs;
}

uint32_t Reader::get_u32_or(const std::string& key, uint32_t def) const { return has(key) ? get_u32(key) : def; }
float Reader::get_f32_or(const std::string& key, float def) const { return has(key) ? get_f32(key) : def; }
bool Reader::get_bool_or(const std::string& key, bool def) const { return has(key) ? get_bool(key) : def; }

const TensorInfo* Reader::find_tensor(const std::string& name) const {
  auto it = tensor_index_.find(name);
  return it == tensor_index_.end() ? nullptr : &tensors_[it->second];
}

const TensorInfo& Reader::tensor(const std::string& name) const {
  const TensorInfo* t = find_tensor(name);
  if (!t) fail("{}: tensor '{}' not found", path_, name);
  return *t;
}

const std::string& Reader::file_path(size_t i) const {
  check(i < n_files(), "{}: split file index {} out of range ({} files)", path_, i, n_files());
  return files_.empty() ? path_ : files_[i].path();
}

const MappedFile* Reader::mapped_file(size_t i) const {
  check(i < n_files(), "{}: split file index {} out of range ({} files)", path_, i, n_files());
  return files_.empty() ? nullptr : &files_[i];
}

}  // namespace kimi::gguf
