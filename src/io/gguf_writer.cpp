// Streaming GGUF v3 writer (formats-quant.md §1). Metadata and tensor infos are kept in memory;
// tensor data goes straight to the output file as it is produced. Output goes to temp files that
// are renamed into place by finish(); a Writer destroyed before that removes them.
#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <limits>
#include <unordered_map>

#include "io/gguf.h"
#include "io/gguf_internal.h"
#include "util/error.h"
#include "util/paths.h"
#include "util/tempfile.h"

namespace kimi::gguf {

namespace {

constexpr size_t kMaxNameLen = 63;

void put_u32(std::string& b, uint32_t v) { b.append(reinterpret_cast<const char*>(&v), 4); }
void put_u64(std::string& b, uint64_t v) { b.append(reinterpret_cast<const char*>(&v), 8); }
void put_str(std::string& b, const std::string& s) {
  put_u64(b, s.size());
  b.append(s);
}

template <typename T>
void put_raw(std::string& b, T v) {
  b.append(reinterpret_cast<const char*>(&v), sizeof(T));
}

// Range checks for one integer element of type t. `what` names it in the error.
void put_int(std::string& b, ValueType t, bool is_signed, int64_t i, uint64_t u, const std::string& what) {
  auto range_fail = [&](const char* tn) -> void {
    if (is_signed)
      fail("{}: value {} does not fit in {}", what, i, tn);
    else
      fail("{}: value {} does not fit in {}", what, u, tn);
  };
  // value as a 128-bit signed number
  const __int128 x = is_signed ? static_cast<__int128>(i) : static_cast<__int128>(u);
  auto in = [&](__int128 lo, __int128 hi) { return x >= lo && x <= hi; };
  switch (t) {
    case ValueType::UINT8: if (!in(0, UINT8_MAX)) range_fail("uint8"); put_raw<uint8_t>(b, static_cast<uint8_t>(x)); break;
    case ValueType::UINT16: if (!in(0, UINT16_MAX)) range_fail("uint16"); put_raw<uint16_t>(b, static_cast<uint16_t>(x)); break;
    case ValueType::UINT32: if (!in(0, UINT32_MAX)) range_fail("uint32"); put_raw<uint32_t>(b, static_cast<uint32_t>(x)); break;
    case ValueType::UINT64: if (!in(0, UINT64_MAX)) range_fail("uint64"); put_raw<uint64_t>(b, static_cast<uint64_t>(x)); break;
    case ValueType::INT8: if (!in(INT8_MIN, INT8_MAX)) range_fail("int8"); put_raw<int8_t>(b, static_cast<int8_t>(x)); break;
    case ValueType::INT16: if (!in(INT16_MIN, INT16_MAX)) range_fail("int16"); put_raw<int16_t>(b, static_cast<int16_t>(x)); break;
    case ValueType::INT32: if (!in(INT32_MIN, INT32_MAX)) range_fail("int32"); put_raw<int32_t>(b, static_cast<int32_t>(x)); break;
    case ValueType::INT64: if (!in(INT64_MIN, INT64_MAX)) range_fail("int64"); put_raw<int64_t>(b, static_cast<int64_t>(x)); break;
    default: fail("{}: internal error: {} is not an integer type", what, value_type_name(t));
  }
}

void put_scalar_value(std::string& b, const std::string& key, const Value& v) {
  const std::string what = fmt::format("key '{}'", key);
  switch (detail::kind_of(v.type)) {
    case detail::Kind::Unsigned: put_int(b, v.type, false, 0, v.u, what); break;
    case detail::Kind::Signed: put_int(b, v.type, true, v.i, 0, what); break;
    case detail::Kind::Float:
      if (v.type == ValueType::FLOAT32)
        put_raw<float>(b, static_cast<float>(v.f));
      else
        put_raw<double>(b, v.f);
      break;
    case detail::Kind::Bool: put_raw<uint8_t>(b, v.b ? 1 : 0); break;
    case detail::Kind::String: put_str(b, v.s); break;
    case detail::Kind::Array: break;
  }
}

void put_kv(std::string& b, const KV& kv) {
  const Value& v = kv.value;
  put_str(b, kv.key);
  put_u32(b, static_cast<uint32_t>(v.type));
  if (v.type != ValueType::ARRAY) {
    put_scalar_value(b, kv.key, v);
    return;
  }
  put_u32(b, static_cast<uint32_t>(v.elem_type));
  const size_t n = v.array_size();
  put_u64(b, n);
  switch (detail::kind_of(v.elem_type)) {
    case detail::Kind::Unsigned:
      for (size_t k = 0; k < n; ++k)
        put_int(b, v.elem_type, false, 0, v.uints[k], fmt::format("key '{}' element {}", kv.key, k));
      break;
    case detail::Kind::Signed:
      for (size_t k = 0; k < n; ++k)
        put_int(b, v.elem_type, true, v.ints[k], 0, fmt::format("key '{}' element {}", kv.key, k));
      break;
    case detail::Kind::Float:
      for (size_t k = 0; k < n; ++k) {
        if (v.elem_type == ValueType::FLOAT32)
          put_raw<float>(b, static_cast<float>(v.floats[k]));
        else
          put_raw<double>(b, v.floats[k]);
      }
      break;
    case detail::Kind::Bool:
      for (size_t k = 0; k < n; ++k) put_raw<uint8_t>(b, v.bools[k] ? 1 : 0);
      break;
    case detail::Kind::String:
      for (size_t k = 0; k < n; ++k) put_str(b, v.strs[k]);
      break;
    case detail::Kind::Array: break;
  }
}

uint64_t align_up(uint64_t x, uint64_t a) { return (x + a - 1) / a * a; }

}  // namespace

struct Writer::Impl {
  struct Tensor {
    std::string name;
    GgmlType type;
    std::vector<int64_t> ne;  // as declared (n_dims = ne.size())
    uint64_t nbytes = 0;
    uint64_t offset = 0;      // within its shard's data section (set by plan())
    uint32_t shard = 0;
  };
  struct Shard {
    std::string final_path, tmp_path;
    size_t first = 0, end = 0;  // tensor index range
  };
  enum class State { Declaring, Writing, Finished, Failed };

  std::string out_path;
  WriterOptions opts;
  std::vector<KV> kvs;
  std::unordered_map<std::string, size_t> kv_index;
  std::vector<Tensor> tensors;
  std::unordered_map<std::string, size_t> tensor_index;
  State state = State::Declaring;

  std::vector<Shard> shards;   // set by begin()
  std::vector<std::string> tmp_created;
  FILE* f = nullptr;
  size_t cur_shard = 0;
  size_t cur = 0;              // first tensor whose data is not complete
  uint64_t cur_written = 0;    // bytes of tensors[cur] written so far
  uint64_t file_pos = 0;       // bytes written to the current shard

  // Shard plan for the current declarations (pure).
  std::vector<Shard> plan() {
    std::vector<Shard> out;
    const uint64_t a = opts.alignment;
    if (opts.split_max_bytes == 0 || tensors.empty()) {
      out.push_back({out_path, "", 0, tensors.size()});
    } else {
      uint64_t used = 0;
      for (size_t k = 0; k < tensors.size(); ++k) {
        const uint64_t sz = align_up(tensors[k].nbytes, a);
        if (out.empty() || (used > 0 && (sz > opts.split_max_bytes || used + sz > opts.split_max_bytes))) {
          out.push_back({"", "", k, k});
          used = 0;
        }
        out.back().end = k + 1;
        used += sz;
      }
      if (out.size() == 1) {
        out[0].final_path = out_path;
      } else {
        std::string prefix = out_path;
        if (prefix.size() > 5 && prefix.compare(prefix.size() - 5, 5, ".gguf") == 0) prefix.resize(prefix.size() - 5);
        for (size_t s = 0; s < out.size(); ++s)
          out[s].final_path = detail::split_name(prefix, static_cast<uint32_t>(s + 1), static_cast<uint32_t>(out.size()));
      }
    }
    for (size_t s = 0; s < out.size(); ++s) {
      uint64_t off = 0;
      for (size_t k = out[s].first; k < out[s].end; ++k) {
        tensors[k].shard = static_cast<uint32_t>(s);
        tensors[k].offset = off;
        off += align_up(tensors[k].nbytes, a);
      }
    }
    return out;
  }

  std::string header(size_t s) const {
    const size_t n_shards = shards.size();
    std::vector<KV> extra;
    if (opts.alignment != 32) extra.push_back({"general.alignment", Value::u32(opts.alignment)});
    if (n_shards > 1) {
      extra.push_back({"split.no", Value::u16(static_cast<uint16_t>(s))});
      extra.push_back({"split.count", Value::u16(static_cast<uint16_t>(n_shards))});
      extra.push_back({"split.tensors.count", Value::i32(static_cast<int32_t>(tensors.size()))});
    }
    std::vector<const KV*> order;
    if (s == 0) {
      // general.architecture first (as the HF converter writes it), then declaration order
      auto it = kv_index.find("general.architecture");
      if (it != kv_index.end()) order.push_back(&kvs[it->second]);
      for (const auto& kv : kvs)
        if (kv.key != "general.architecture") order.push_back(&kv);
    }
    for (const auto& kv : extra) order.push_back(&kv);

    std::string b;
    put_u32(b, 0x46554747u);
    put_u32(b, 3);
    put_u64(b, shards[s].end - shards[s].first);
    put_u64(b, order.size());
    for (const KV* kv : order) put_kv(b, *kv);
    for (size_t k = shards[s].first; k < shards[s].end; ++k) {
      const Tensor& t = tensors[k];
      put_str(b, t.name);
      put_u32(b, static_cast<uint32_t>(t.ne.size()));
      for (int64_t d : t.ne) put_u64(b, static_cast<uint64_t>(d));
      put_u32(b, static_cast<uint32_t>(t.type));
      put_u64(b, t.offset);
    }
    if (shards[s].end > shards[s].first) b.resize(align_up(b.size(), opts.alignment), '\0');
    return b;
  }

  void write_bytes(const void* p, size_t n) {
    if (n == 0) return;
    if (std::fwrite(p, 1, n, f) != n)
      fail("{}: write failed after {} bytes: {}", shards[cur_shard].tmp_path, file_pos, std::strerror(errno));
    file_pos += n;
  }
  void write_zeros(uint64_t n) {
    static const char zeros[256] = {};
    while (n > 0) {
      size_t k = n < sizeof(zeros) ? static_cast<size_t>(n) : sizeof(zeros);
      write_bytes(zeros, k);
      n -= k;
    }
  }

  void open_shard(size_t s) {
    cur_shard = s;
    Shard& sh = shards[s];
    TempFile tf = create_temp_file(sh.final_path);  // unique name, removed on SIGINT/SIGTERM/SIGHUP
    sh.tmp_path = tf.path;
    tmp_created.push_back(sh.tmp_path);
    f = ::fdopen(tf.fd, "wb");
    if (!f) {
      const int e = errno;
      ::close(tf.fd);
      fail("cannot open '{}' for writing: {}", sh.tmp_path, std::strerror(e));
    }
    std::setvbuf(f, nullptr, _IOFBF, 1 << 20);
    file_pos = 0;
    const std::string h = header(s);
    write_bytes(h.data(), h.size());
  }

  void close_shard() {
    if (!f) return;
    const std::string& p = shards[cur_shard].tmp_path;
    FILE* g = f;
    f = nullptr;
    bool ok = std::fflush(g) == 0;
    int e = errno;
    if (ok && ::fsync(::fileno(g)) != 0) {
      ok = false;
      e = errno;
    }
    if (std::fclose(g) != 0 && ok) {
      ok = false;
      e = errno;
    }
    if (!ok) fail("{}: cannot finish writing: {}", p, std::strerror(e));
  }

  // Make shard s the open one (closing the earlier ones).
  void ensure_shard(size_t s) {
    while (cur_shard < s) {
      close_shard();
      open_shard(cur_shard + 1);
    }
  }

  // Skip zero-size tensors at the cursor (they need no data).
  void skip_empty() {
    while (cur < tensors.size() && tensors[cur].nbytes == 0) ++cur;
  }

  void remove_temps() noexcept {
    if (f) {
      std::fclose(f);
      f = nullptr;
    }
    for (const auto& p : tmp_created) discard_temp(p);
    tmp_created.clear();
  }
};

Writer::Writer(std::string out_path, WriterOptions opts) : impl_(std::make_unique<Impl>()) {
  check(!out_path.empty(), "GGUF writer: empty output path");
  check(opts.alignment >= 8 && (opts.alignment & (opts.alignment - 1)) == 0,
        "GGUF writer '{}': alignment {} is not a non-zero power of two that is a multiple of 8", out_path,
        opts.alignment);
  impl_->out_path = std::move(out_path);
  impl_->opts = opts;
}

Writer::~Writer() {
  if (impl_ && impl_->state != Impl::State::Finished) impl_->remove_temps();
}

void Writer::add_kv(const std::string& key, Value v) {
  Impl& m = *impl_;
  check(m.state == Impl::State::Declaring, "{}: add_kv('{}') after begin()", m.out_path, key);
  check(!key.empty(), "{}: metadata key must not be empty", m.out_path);
  check(key.size() <= 65535, "{}: metadata key of {} bytes is too long (limit 65535)", m.out_path, key.size());
  check(static_cast<uint32_t>(v.type) <= static_cast<uint32_t>(ValueType::FLOAT64), "{}: key '{}': invalid value type {}",
        m.out_path, key, static_cast<uint32_t>(v.type));
  if (v.type == ValueType::ARRAY) {
    check(static_cast<uint32_t>(v.elem_type) <= static_cast<uint32_t>(ValueType::FLOAT64),
          "{}: key '{}': invalid array element type {}", m.out_path, key, static_cast<uint32_t>(v.elem_type));
    check(v.elem_type != ValueType::ARRAY, "{}: key '{}': nested arrays cannot be written", m.out_path, key);
    const auto kind = detail::kind_of(v.elem_type);
    const bool stray = (kind != detail::Kind::Unsigned && !v.uints.empty()) ||
                       (kind != detail::Kind::Signed && !v.ints.empty()) ||
                       (kind != detail::Kind::Float && !v.floats.empty()) ||
                       (kind != detail::Kind::Bool && !v.bools.empty()) ||
                       (kind != detail::Kind::String && !v.strs.empty());
    check(!stray, "{}: key '{}': array of {} has elements in a vector of another type", m.out_path, key,
          value_type_name(v.elem_type));
  }
  if (key == "general.alignment") {
    check(v.type == ValueType::UINT32 && v.u == m.opts.alignment,
          "{}: key 'general.alignment' must be a uint32 equal to WriterOptions::alignment ({}); found {} {}",
          m.out_path, m.opts.alignment, value_type_name(v.type), v.to_string());
    return;  // written by the writer itself when != 32
  }
  // split keys describe the input's sharding: the writer writes its own (WriterOptions::split_max_bytes),
  // so copies of split files (as llama-quantize does) simply drop them
  if (key == "split.no" || key == "split.count" || key == "split.tensors.count") return;
  // validate integer ranges now rather than at begin()
  std::string scratch;
  put_kv(scratch, KV{key, v});
  auto it = m.kv_index.find(key);
  if (it != m.kv_index.end()) {
    m.kvs[it->second].value = std::move(v);
  } else {
    m.kv_index.emplace(key, m.kvs.size());
    m.kvs.push_back({key, std::move(v)});
  }
}

void Writer::add_tensor(const std::string& name, GgmlType type, std::vector<int64_t> ne) {
  Impl& m = *impl_;
  check(m.state == Impl::State::Declaring, "{}: add_tensor('{}') after begin()", m.out_path, name);
  check(!name.empty(), "{}: tensor name must not be empty", m.out_path);
  check(name.size() <= kMaxNameLen, "{}: tensor name '{}' is {} bytes long (limit {})", m.out_path, name, name.size(),
        kMaxNameLen);
  check(!m.tensor_index.count(name), "{}: duplicate tensor '{}'", m.out_path, name);
  check(ne.size() >= 1 && ne.size() <= 4, "{}: tensor '{}': {} dimensions (expected 1..4)", m.out_path, name,
        ne.size());
  check(type_traits(static_cast<uint32_t>(type)).has_value(), "{}: tensor '{}': invalid ggml type id {}", m.out_path,
        name, static_cast<uint32_t>(type));
  std::array<int64_t, 4> ne4{1, 1, 1, 1};
  for (size_t d = 0; d < ne.size(); ++d) ne4[d] = ne[d];
  Impl::Tensor t{name, type, std::move(ne)};
  std::string why;
  if (!detail::tensor_nbytes(type, ne4, t.nbytes, why)) fail("{}: tensor '{}': {}", m.out_path, name, why);
  m.tensor_index.emplace(name, m.tensors.size());
  m.tensors.push_back(std::move(t));
}

void Writer::begin() {
  Impl& m = *impl_;
  check(m.state == Impl::State::Declaring, "{}: begin() called twice", m.out_path);
  m.shards = m.plan();
  {
    // every name this writer will create, before any of them is created
    std::vector<std::string> outs;
    for (const auto& sh : m.shards) outs.push_back(sh.final_path);
    check_outputs_distinct(m.opts.inputs, outs);
  }
  check(m.shards.size() <= 65535, "{}: {} split files (limit 65535): raise split_max_bytes", m.out_path,
        m.shards.size());
  check(m.tensors.size() <= static_cast<size_t>(INT32_MAX), "{}: too many tensors", m.out_path);
  m.state = Impl::State::Failed;  // until the header is out
  m.open_shard(0);
  m.cur = 0;
  m.cur_written = 0;
  m.skip_empty();
  m.state = Impl::State::Writing;
}

void Writer::write_tensor_data(const std::string& name, const void* data, size_t n) {
  Impl& m = *impl_;
  check(m.state == Impl::State::Writing, "{}: write_tensor_data('{}') {}", m.out_path, name,
        m.state == Impl::State::Declaring ? "before begin()" : "after finish() or a failed write");
  auto it = m.tensor_index.find(name);
  check(it != m.tensor_index.end(), "{}: write_tensor_data: tensor '{}' was not declared", m.out_path, name);
  const size_t idx = it->second;
  if (idx < m.cur) {
    check(n == 0, "{}: tensor '{}': {} more bytes after its data ({} bytes) was complete", m.out_path, name, n,
          m.tensors[idx].nbytes);
    return;
  }
  if (idx != m.cur) {
    const auto& c = m.tensors[m.cur];
    if (m.cur_written > 0)
      fail("{}: tensor '{}' is incomplete ({} of {} bytes written) when data for '{}' arrived", m.out_path, c.name,
           m.cur_written, c.nbytes, name);
    fail("{}: data for tensor '{}' arrived, but tensors must be written in declaration order (next is '{}')",
         m.out_path, name, c.name);
  }
  Impl::Tensor& t = m.tensors[idx];
  if (n > t.nbytes - m.cur_written) {
    m.state = Impl::State::Failed;
    fail("{}: tensor '{}': {} bytes written, more than its size of {} bytes", m.out_path, name, m.cur_written + n,
         t.nbytes);
  }
  if (n == 0) return;
  try {
    m.ensure_shard(t.shard);
    m.write_bytes(data, n);
    m.cur_written += n;
    if (m.cur_written == t.nbytes) {
      m.write_zeros(align_up(t.nbytes, m.opts.alignment) - t.nbytes);
      ++m.cur;
      m.cur_written = 0;
      m.skip_empty();
    }
  } catch (...) {
    m.state = Impl::State::Failed;
    throw;
  }
}

void Writer::finish() {
  Impl& m = *impl_;
  if (m.state == Impl::State::Declaring) begin();
  check(m.state == Impl::State::Writing, "{}: finish() after {}", m.out_path,
        m.state == Impl::State::Finished ? "finish()" : "a failed write");
  if (m.cur < m.tensors.size()) {
    const auto& c = m.tensors[m.cur];
    m.state = Impl::State::Failed;
    fail("{}: finish(): tensor '{}' has {} of {} bytes of data ({} of {} tensors complete)", m.out_path, c.name,
         m.cur_written, c.nbytes, m.cur, m.tensors.size());
  }
  try {
    m.ensure_shard(m.shards.size() - 1);
    m.close_shard();
    for (auto& sh : m.shards) {
      commit_temp(sh.tmp_path, sh.final_path);
    }
  } catch (...) {
    m.state = Impl::State::Failed;
    throw;
  }
  m.tmp_created.clear();
  m.state = Impl::State::Finished;
}

std::vector<std::string> Writer::output_paths() const {
  std::vector<std::string> out;
  for (const auto& sh : (impl_->state == Impl::State::Declaring ? impl_->plan() : impl_->shards))
    out.push_back(sh.final_path);
  return out;
}

uint64_t Writer::total_tensor_bytes() const {
  uint64_t s = 0;
  for (const auto& t : impl_->tensors) s += t.nbytes;
  return s;
}

}  // namespace kimi::gguf
