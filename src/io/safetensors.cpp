// safetensors reader (strict, formats-quant.md §2) and streaming writer.
#include "io/safetensors.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>
#include <utility>

#include "util/error.h"
#include "util/json.h"
#include "util/paths.h"
#include "util/tempfile.h"

namespace fs = std::filesystem;
using nlohmann::json;

namespace kimi::st {

namespace {

struct DtypeInfo {
  Dtype d;
  const char* name;
  size_t size;
};

constexpr DtypeInfo kDtypes[] = {
    {Dtype::BOOL, "BOOL", 1},       {Dtype::U8, "U8", 1},           {Dtype::I8, "I8", 1},
    {Dtype::I16, "I16", 2},         {Dtype::U16, "U16", 2},         {Dtype::F16, "F16", 2},
    {Dtype::BF16, "BF16", 2},       {Dtype::I32, "I32", 4},         {Dtype::U32, "U32", 4},
    {Dtype::F32, "F32", 4},         {Dtype::F64, "F64", 8},         {Dtype::I64, "I64", 8},
    {Dtype::U64, "U64", 8},         {Dtype::F8_E4M3, "F8_E4M3", 1}, {Dtype::F8_E5M2, "F8_E5M2", 1},
    {Dtype::F8_E8M0, "F8_E8M0", 1},
};

const DtypeInfo& info(Dtype d) {
  for (const auto& i : kDtypes)
    if (i.d == d) return i;
  fail("safetensors: invalid Dtype value {}", static_cast<int>(d));
}

constexpr uint64_t kMaxHeader = 100000000;  // reference implementation limit
constexpr uint64_t kMaxIndexBytes = 1ull << 30;  // model.safetensors.index.json (K3: a few MB)

uint64_t read_u64le(const uint8_t* p) {
  uint64_t v = 0;
  for (int i = 7; i >= 0; --i) v = (v << 8) | p[i];
  return v;
}

// Parses JSON text strictly: any syntax error is reported with its line/column. Duplicate keys
// in any object (which nlohmann would silently collapse) are reported through *dup (the key) and
// *dup_path (the keys of the enclosing objects, outermost first); *dup stays empty when none.
json parse_json_strict(const char* text, size_t len, const std::string& label, const char* what, std::string* dup,
                       std::vector<std::string>* dup_path) {
  std::vector<std::set<std::string>> stack;
  std::vector<std::string> last_key;  // last key seen at each depth
  dup->clear();
  dup_path->clear();
  bool found = false;
  auto cb = [&](int depth, json::parse_event_t ev, json& parsed) -> bool {
    switch (ev) {
      case json::parse_event_t::object_start:
        stack.emplace_back();
        break;
      case json::parse_event_t::object_end:
        if (!stack.empty()) stack.pop_back();
        break;
      case json::parse_event_t::key:
        if (!found && !stack.empty() && parsed.is_string() && depth >= 1) {
          const auto& k = parsed.get_ref<const std::string&>();
          if (last_key.size() < static_cast<size_t>(depth)) last_key.resize(depth);
          last_key[depth - 1] = k;
          if (!stack.back().insert(k).second) {
            found = true;
            *dup = k;
            dup_path->assign(last_key.begin(), last_key.begin() + (depth - 1));
          }
        }
        break;
      default:
        break;
    }
    return true;
  };
  json j;
  try {
    // the same nesting limit as every other JSON the program reads (util/json.h)
    j = parse_json_with<json>(std::string_view(text, len), label + ": " + what, cb);
  } catch (const JsonError& e) {
    if (e.too_deep) throw;
    auto [line, col] = json_line_col(std::string_view(text, len), e.byte);
    fail("{}: invalid JSON in {} at line {}, column {}: {}", label, what, line, col, e.what());
  }
  if (!found) dup->clear();
  return j;
}

std::string join_path(const std::vector<std::string>& p) {
  std::string s;
  for (const auto& k : p) s += (s.empty() ? "" : ".") + k;
  return s;
}

bool json_to_u64(const json& v, uint64_t* out) {
  if (v.is_number_unsigned()) {
    *out = v.get<uint64_t>();
    return true;
  }
  if (v.is_number_integer()) {
    int64_t x = v.get<int64_t>();
    if (x < 0) return false;
    *out = static_cast<uint64_t>(x);
    return true;
  }
  return false;
}

struct Parsed {
  std::vector<Tensor> tensors;
  std::map<std::string, std::string> metadata;
};

Parsed parse_file(const uint8_t* data, size_t size, const std::string& label) {
  Parsed out;
  check(size >= 8, "{}: file is {} bytes, too small for a safetensors header (need at least 8)", label, size);
  const uint64_t n = read_u64le(data);
  check(n <= kMaxHeader, "{}: header length {} exceeds the limit of {} bytes", label, n, kMaxHeader);
  check(n <= size - 8, "{}: header length {} runs past the end of the file ({} bytes)", label, n, size);
  check(n >= 2, "{}: header length {} is too small for a JSON object", label, n);
  const char* text = reinterpret_cast<const char*>(data + 8);
  check(text[0] == '{', "{}: header does not start with '{{' (got byte 0x{:02x})", label,
        static_cast<unsigned>(static_cast<uint8_t>(text[0])));
  std::string dup;
  std::vector<std::string> dup_path;
  json h = parse_json_strict(text, n, label, "the safetensors header", &dup, &dup_path);
  if (!dup.empty()) {
    if (dup_path.empty()) fail("{}: tensor '{}': duplicate tensor name in the header", label, dup);
    if (dup_path[0] == "__metadata__") fail("{}: duplicate key '{}' in __metadata__", label, dup);
    fail("{}: tensor '{}': duplicate key '{}' in its entry", label, dup_path[0], dup);
  }
  check(h.is_object(), "{}: safetensors header is not a JSON object", label);

  const uint8_t* buf = data + 8 + n;
  const uint64_t buf_len = size - 8 - n;

  struct Span {
    uint64_t begin, end;
    size_t idx;
  };
  std::vector<Span> spans;
  out.tensors.reserve(h.size());
  for (auto it = h.begin(); it != h.end(); ++it) {
    const std::string& name = it.key();
    const json& e = it.value();
    if (name == "__metadata__") {
      check(e.is_object(), "{}: __metadata__ must be an object of strings, got {}", label, e.type_name());
      for (auto m = e.begin(); m != e.end(); ++m) {
        check(m.value().is_string(), "{}: __metadata__ value for key '{}' must be a string, got {}", label, m.key(),
              m.value().type_name());
        out.metadata[m.key()] = m.value().get<std::string>();
      }
      continue;
    }
    check(e.is_object(), "{}: tensor '{}': entry must be an object, got {}", label, name, e.type_name());
    for (auto f = e.begin(); f != e.end(); ++f) {
      const auto& k = f.key();
      check(k == "dtype" || k == "shape" || k == "data_offsets", "{}: tensor '{}': unexpected field '{}'", label, name,
            k);
    }
    Tensor t;
    t.name = name;
    t.file = label;

    auto d = e.find("dtype");
    check(d != e.end(), "{}: tensor '{}': missing 'dtype'", label, name);
    check(d->is_string(), "{}: tensor '{}': 'dtype' must be a string, got {}", label, name, d->type_name());
    const auto& dname = d->get_ref<const std::string&>();
    check(dtype_from_name(dname, &t.dtype), "{}: tensor '{}': unknown dtype '{}'", label, name, dname);

    auto s = e.find("shape");
    check(s != e.end(), "{}: tensor '{}': missing 'shape'", label, name);
    check(s->is_array(), "{}: tensor '{}': 'shape' must be an array, got {}", label, name, s->type_name());
    uint64_t numel = 1;
    bool overflow = false;
    for (size_t i = 0; i < s->size(); ++i) {
      uint64_t dim = 0;
      check(json_to_u64((*s)[i], &dim), "{}: tensor '{}': shape[{}] must be a non-negative integer, got {}", label, name,
            i, (*s)[i].dump());
      check(dim <= static_cast<uint64_t>(INT64_MAX), "{}: tensor '{}': shape[{}] = {} is too large", label, name, i,
            dim);
      t.shape.push_back(static_cast<int64_t>(dim));
      if (!overflow && __builtin_mul_overflow(numel, dim, &numel)) overflow = true;
    }
    uint64_t nbytes = 0;
    if (!overflow && __builtin_mul_overflow(numel, static_cast<uint64_t>(dtype_size(t.dtype)), &nbytes))
      overflow = true;
    // A zero dimension makes the tensor empty even if the other dimensions overflowed.
    bool has_zero = std::find(t.shape.begin(), t.shape.end(), 0) != t.shape.end();
    if (has_zero) {
      overflow = false;
      nbytes = 0;
    }
    check(!overflow, "{}: tensor '{}': shape {} x {} bytes overflows 64 bits", label, name, t.shape_string(), dname);

    auto o = e.find("data_offsets");
    check(o != e.end(), "{}: tensor '{}': missing 'data_offsets'", label, name);
    check(o->is_array() && o->size() == 2, "{}: tensor '{}': 'data_offsets' must be an array [BEGIN, END], got {}",
          label, name, o->dump());
    uint64_t b = 0, en = 0;
    check(json_to_u64((*o)[0], &b) && json_to_u64((*o)[1], &en),
          "{}: tensor '{}': 'data_offsets' must be two non-negative integers, got {}", label, name, o->dump());
    check(b <= en, "{}: tensor '{}': data_offsets [{}, {}] has BEGIN > END", label, name, b, en);
    check(en <= buf_len, "{}: tensor '{}': data_offsets [{}, {}] run past the end of the data buffer ({} bytes)", label,
          name, b, en, buf_len);
    check(en - b == nbytes, "{}: tensor '{}': data_offsets [{}, {}] span {} bytes but shape {} x {} needs {} bytes",
          label, name, b, en, en - b, t.shape_string(), dname, nbytes);
    t.data = buf + b;
    t.nbytes = nbytes;
    spans.push_back({b, en, out.tensors.size()});
    out.tensors.push_back(std::move(t));
  }

  std::sort(spans.begin(), spans.end(), [](const Span& a, const Span& b) {
    return a.begin != b.begin ? a.begin < b.begin : a.end < b.end;
  });
  uint64_t expect = 0;
  std::string prev;
  for (const auto& sp : spans) {
    const auto& nm = out.tensors[sp.idx].name;
    if (sp.begin < expect)
      fail("{}: tensor '{}': data_offsets [{}, {}] overlap tensor '{}' (which ends at {})", label, nm, sp.begin, sp.end,
           prev, expect);
    if (sp.begin > expect) {
      if (prev.empty())
        fail("{}: tensor '{}': gap of {} bytes before it at the start of the data buffer (begins at {})", label, nm,
             sp.begin - expect, sp.begin);
      fail("{}: tensor '{}': gap of {} bytes between tensor '{}' (ends at {}) and it (begins at {})", label, nm,
           sp.begin - expect, prev, expect, sp.begin);
    }
    expect = sp.end;
    prev = nm;
  }
  if (expect != buf_len) {
    if (prev.empty())
      fail("{}: data buffer has {} bytes but the header declares no tensor data", label, buf_len);
    fail("{}: {} trailing bytes after the last tensor '{}' (ends at {}, buffer is {} bytes)", label, buf_len - expect,
         prev, expect, buf_len);
  }
  return out;
}

bool ends_with(const std::string& s, const std::string& suf) {
  return s.size() >= suf.size() && s.compare(s.size() - suf.size(), suf.size(), suf) == 0;
}

std::string read_text_file(const std::string& path) {
  return read_input_file(path, kMaxIndexBytes);  // regular files only: a FIFO would block
}

}  // namespace

const char* dtype_name(Dtype d) { return info(d).name; }

bool dtype_from_name(const std::string& s, Dtype* out) {
  for (const auto& i : kDtypes) {
    if (s == i.name) {
      if (out) *out = i.d;
      return true;
    }
  }
  return false;
}

size_t dtype_size(Dtype d) { return info(d).size; }

int64_t Tensor::numel() const {
  int64_t n = 1;
  for (auto d : shape) n *= d;
  return n;
}

std::string Tensor::shape_string() const {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) {
    if (i) s += ", ";
    s += std::to_string(shape[i]);
  }
  return s + "]";
}

std::vector<Tensor> parse_buffer(const uint8_t* data, size_t size, const std::string& label) {
  return parse_file(data, size, label).tensors;
}

// ---------------------------------------------------------------------------------------------
// Checkpoint

struct CheckpointLoader {
  static void add_file(Checkpoint& c, MappedFile mf, const std::string& label,
                       const std::map<std::string, std::string>* weight_map, const std::string& shard_name,
                       std::set<std::string>* seen) {
    Parsed p = parse_file(mf.data(), mf.size(), label);
    if (c.files_.empty()) c.metadata_ = p.metadata;
    for (auto& t : p.tensors) {
      if (weight_map) {
        auto it = weight_map->find(t.name);
        check(it != weight_map->end(), "{}: tensor '{}' is in the shard but not in model.safetensors.index.json", label,
              t.name);
        check(it->second == shard_name,
              "{}: tensor '{}' is in shard '{}' but model.safetensors.index.json maps it to '{}'", label, t.name,
              shard_name, it->second);
        seen->insert(t.name);
      }
      auto prev = c.tensors_.find(t.name);
      check(prev == c.tensors_.end(), "{}: tensor '{}' also appears in '{}'", label, t.name,
            prev == c.tensors_.end() ? std::string() : prev->second.file);
      std::string name = t.name;
      c.tensors_.emplace(std::move(name), std::move(t));
    }
    c.files_.push_back(std::move(mf));  // mmap address is unchanged by the move
  }

  static std::unique_ptr<Checkpoint> open_single(const std::string& file) {
    std::unique_ptr<Checkpoint> c(new Checkpoint());
    add_file(*c, MappedFile(file), file, nullptr, "", nullptr);
    finish(*c);
    return c;
  }

  static std::unique_ptr<Checkpoint> open_index(const std::string& index_path) {
    const std::string dir = fs::path(index_path).parent_path().string();
    const std::string text = read_text_file(index_path);
    std::string dup;
    std::vector<std::string> dup_path;
    json j = parse_json_strict(text.data(), text.size(), index_path, "the index", &dup, &dup_path);
    if (!dup.empty()) {
      if (dup_path.size() == 1 && dup_path[0] == "weight_map")
        fail("{}: tensor '{}' appears more than once in weight_map", index_path, dup);
      fail("{}: duplicate key '{}'{}", index_path, dup,
           dup_path.empty() ? std::string() : " in '" + join_path(dup_path) + "'");
    }
    check(j.is_object(), "{}: index must be a JSON object, got {}", index_path, j.type_name());
    auto wm = j.find("weight_map");
    check(wm != j.end(), "{}: missing 'weight_map'", index_path);
    check(wm->is_object(), "{}: 'weight_map' must be an object, got {}", index_path, wm->type_name());
    std::map<std::string, std::string> weight_map;
    std::set<std::string> shards;
    for (auto it = wm->begin(); it != wm->end(); ++it) {
      check(it.value().is_string(), "{}: weight_map entry for tensor '{}' must be a string (shard file name), got {}",
            index_path, it.key(), it.value().type_name());
      std::string shard = it.value().get<std::string>();
      bool ok = !shard.empty() && fs::path(shard).is_relative();
      for (const auto& part : fs::path(shard)) ok = ok && part != "..";
      check(ok,
            "{}: weight_map entry for tensor '{}' has invalid shard file name '{}'", index_path, it.key(), shard);
      weight_map[it.key()] = shard;
      shards.insert(shard);
    }
    std::unique_ptr<Checkpoint> c(new Checkpoint());
    c->index_path_ = index_path;
    std::set<std::string> seen;
    for (const auto& shard : shards) {
      const std::string p = dir.empty() ? shard : dir + "/" + shard;
      std::error_code ec;
      check(fs::is_regular_file(p, ec), "{}: shard '{}' listed in the index not found (expected at '{}')", index_path,
            shard, p);
      add_file(*c, MappedFile(p), p, &weight_map, shard, &seen);
    }
    for (const auto& [name, shard] : weight_map) {
      check(seen.count(name) != 0, "{}: tensor '{}' is mapped to shard '{}' but that shard does not contain it",
            index_path, name, shard);
    }
    finish(*c);
    return c;
  }

  static void finish(Checkpoint& c) {
    c.names_.clear();
    c.names_.reserve(c.tensors_.size());
    for (const auto& kv : c.tensors_) c.names_.push_back(kv.first);  // std::map: already sorted
  }
};

std::unique_ptr<Checkpoint> Checkpoint::open(const std::string& path) {
  std::error_code ec;
  if (fs::is_directory(path, ec)) {
    const std::string index = path + "/model.safetensors.index.json";
    if (fs::exists(index, ec)) return CheckpointLoader::open_index(index);
    const std::string single = path + "/model.safetensors";
    if (fs::exists(single, ec)) return CheckpointLoader::open_single(single);
    std::vector<std::string> found;
    for (const auto& de : fs::directory_iterator(path, ec)) {
      if (de.is_regular_file(ec) && de.path().extension() == ".safetensors") found.push_back(de.path().string());
    }
    check(!ec, "cannot list directory '{}': {}", path, ec.message());
    check(!found.empty(), "'{}': no model.safetensors.index.json and no *.safetensors file", path);
    std::sort(found.begin(), found.end());
    if (found.size() > 1) {
      std::string list;
      for (const auto& f : found) list += (list.empty() ? "" : ", ") + fs::path(f).filename().string();
      fail("'{}': several .safetensors files ({}) but no model.safetensors.index.json", path, list);
    }
    return CheckpointLoader::open_single(found[0]);
  }
  check(fs::exists(path, ec), "'{}': no such file or directory", path);
  if (ends_with(path, ".index.json")) return CheckpointLoader::open_index(path);
  return CheckpointLoader::open_single(path);
}

std::vector<std::string> Checkpoint::file_paths() const {
  std::vector<std::string> v;
  for (const auto& f : files_) v.push_back(f.path());
  if (!index_path_.empty()) v.push_back(index_path_);
  return v;
}

const Tensor* Checkpoint::find(const std::string& name) const {
  auto it = tensors_.find(name);
  return it == tensors_.end() ? nullptr : &it->second;
}

const Tensor& Checkpoint::get(const std::string& name) const {
  const Tensor* t = find(name);
  if (!t) {
    std::string where = files_.empty() ? std::string("checkpoint") : files_[0].path();
    if (files_.size() > 1) where = fs::path(where).parent_path().string();
    fail("tensor '{}' not found in {}", name, where);
  }
  return *t;
}

void Checkpoint::release(const Tensor& t) const {
  if (!t.data || t.nbytes == 0) return;
  for (const auto& f : files_) {
    if (f.data() && t.data >= f.data() && t.data < f.data() + f.size()) {
      f.advise_dontneed(static_cast<size_t>(t.data - f.data()), t.nbytes);
      return;
    }
  }
}

// ---------------------------------------------------------------------------------------------
// Writer

struct Writer::Impl {
  struct Entry {
    std::string name;
    Dtype dtype;
    std::vector<int64_t> shape;
    uint64_t nbytes = 0;
    uint64_t written = 0;
  };
  enum class State { Declaring, Writing, Finished, Failed };

  std::string path;
  std::string tmp;
  std::vector<Entry> entries;
  std::map<std::string, size_t> index;
  std::vector<std::pair<std::string, std::string>> metadata;
  std::FILE* f = nullptr;
  State state = State::Declaring;
  size_t cur = 0;
  uint64_t total = 0;

  void advance() {
    while (cur < entries.size() && entries[cur].written == entries[cur].nbytes) ++cur;
  }
  void put(const void* p, size_t n) {
    if (n == 0) return;
    if (std::fwrite(p, 1, n, f) != n) {
      int e = errno;
      state = State::Failed;
      fail("{}: write failed: {}", tmp, std::strerror(e));
    }
  }
  void abandon() {
    if (f) {
      std::fclose(f);
      f = nullptr;
    }
    if (!tmp.empty()) discard_temp(tmp);
  }
};

Writer::Writer(std::string path) : impl_(std::make_unique<Impl>()) {
  impl_->path = std::move(path);  // the temp (PATH.kimi-tmp.<pid>.<random>) is created by begin()
}

Writer::~Writer() {
  if (impl_ && impl_->state != Impl::State::Finished) impl_->abandon();
}

void Writer::add_metadata(const std::string& key, const std::string& value) {
  auto& I = *impl_;
  check(I.state == Impl::State::Declaring, "{}: add_metadata('{}') after begin()", I.path, key);
  for (auto& kv : I.metadata) {
    if (kv.first == key) {
      kv.second = value;
      return;
    }
  }
  I.metadata.emplace_back(key, value);
}

void Writer::add_tensor(const std::string& name, Dtype dtype, std::vector<int64_t> shape) {
  auto& I = *impl_;
  check(I.state == Impl::State::Declaring, "{}: add_tensor('{}') after begin()", I.path, name);
  check(!name.empty(), "{}: tensor name must not be empty", I.path);
  check(name != "__metadata__", "{}: '__metadata__' is reserved and cannot be a tensor name", I.path);
  check(I.index.count(name) == 0, "{}: tensor '{}' declared twice", I.path, name);
  uint64_t numel = 1;
  bool overflow = false, zero = false;
  for (size_t i = 0; i < shape.size(); ++i) {
    check(shape[i] >= 0, "{}: tensor '{}': negative dimension {} at shape[{}]", I.path, name, shape[i], i);
    if (shape[i] == 0) zero = true;
    if (__builtin_mul_overflow(numel, static_cast<uint64_t>(shape[i]), &numel)) overflow = true;
  }
  uint64_t nbytes = 0;
  if (__builtin_mul_overflow(numel, static_cast<uint64_t>(dtype_size(dtype)), &nbytes)) overflow = true;
  if (zero) {
    overflow = false;
    nbytes = 0;
  }
  check(!overflow, "{}: tensor '{}': byte size overflows 64 bits", I.path, name);
  check(!__builtin_add_overflow(I.total, nbytes, &I.total), "{}: total data size overflows 64 bits", I.path);
  I.index[name] = I.entries.size();
  I.entries.push_back({name, dtype, std::move(shape), nbytes, 0});
}

void Writer::begin() {
  auto& I = *impl_;
  check(I.state == Impl::State::Declaring, "{}: begin() called twice", I.path);
  nlohmann::ordered_json h = nlohmann::ordered_json::object();
  if (!I.metadata.empty()) {
    nlohmann::ordered_json m = nlohmann::ordered_json::object();
    for (const auto& kv : I.metadata) m[kv.first] = kv.second;
    h["__metadata__"] = std::move(m);
  }
  uint64_t off = 0;
  for (const auto& e : I.entries) {
    nlohmann::ordered_json t = nlohmann::ordered_json::object();
    t["dtype"] = dtype_name(e.dtype);
    t["shape"] = e.shape;
    t["data_offsets"] = {off, off + e.nbytes};
    h[e.name] = std::move(t);
    off += e.nbytes;
  }
  std::string text = h.dump();
  while (text.size() % 8 != 0) text.push_back(' ');

  TempFile tf = create_temp_file(I.path);
  I.tmp = tf.path;
  I.f = ::fdopen(tf.fd, "wb");
  if (!I.f) {
    int e = errno;
    ::close(tf.fd);
    fail("cannot open '{}' for writing: {}", I.tmp, std::strerror(e));
  }
  I.state = Impl::State::Writing;
  std::setvbuf(I.f, nullptr, _IOFBF, 1 << 20);
  uint8_t len[8];
  uint64_t n = text.size();
  for (int i = 0; i < 8; ++i) len[i] = static_cast<uint8_t>(n >> (8 * i));
  I.put(len, 8);
  I.put(text.data(), text.size());
  I.cur = 0;
  I.advance();
}

void Writer::write(const std::string& name, const void* data, size_t n) {
  auto& I = *impl_;
  check(I.state == Impl::State::Writing, "{}: write('{}') outside begin()/finish()", I.path, name);
  auto it = I.index.find(name);
  check(it != I.index.end(), "{}: write() for undeclared tensor '{}'", I.path, name);
  if (n == 0) return;
  check(I.cur < I.entries.size(), "{}: tensor '{}': {} bytes written past the end of all declared data", I.path, name,
        n);
  auto& e = I.entries[I.cur];
  check(e.name == name, "{}: write() for tensor '{}' but tensor '{}' is next in declaration order ({} of {} bytes written)",
        I.path, name, e.name, e.written, e.nbytes);
  check(n <= e.nbytes - e.written, "{}: tensor '{}': writing {} bytes but only {} of {} remain", I.path, name, n,
        e.nbytes - e.written, e.nbytes);
  I.put(data, n);
  e.written += n;
  I.advance();
}

void Writer::finish() {
  auto& I = *impl_;
  check(I.state == Impl::State::Writing, "{}: finish() without begin() (or after a failure or a previous finish())",
        I.path);
  I.advance();
  if (I.cur < I.entries.size()) {
    const auto& e = I.entries[I.cur];
    fail("{}: finish() with tensor '{}' incomplete: {} of {} bytes written", I.path, e.name, e.written, e.nbytes);
  }
  bool ok = std::fflush(I.f) == 0 && !std::ferror(I.f);
  int e1 = errno;
  int rc = std::fclose(I.f);
  int e2 = errno;
  I.f = nullptr;
  if (!ok || rc != 0) {
    I.state = Impl::State::Failed;
    fail("{}: error flushing data: {}", I.tmp, std::strerror(!ok ? e1 : e2));
  }
  try {
    commit_temp(I.tmp, I.path);
  } catch (...) {
    I.state = Impl::State::Failed;
    throw;
  }
  I.state = Impl::State::Finished;
}

uint64_t Writer::data_bytes() const { return impl_->total; }

}  // namespace kimi::st
