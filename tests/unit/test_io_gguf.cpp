// GGUF reader/writer tests. Malformed files are built here byte by byte with a small independent
// encoder (Bytes), following formats-quant.md §1, not with the Writer under test.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <limits>
#include <memory>
#include <random>

#include "io/gguf.h"
#include "test_util.h"
#include "util/error.h"

namespace fs = std::filesystem;
using namespace kimi;
using namespace kimi::gguf;
using kimi::test::TempDir;

namespace {

// ---- independent little-endian encoder
struct Bytes {
  std::string b;
  Bytes& raw(const void* p, size_t n) {
    b.append(static_cast<const char*>(p), n);
    return *this;
  }
  template <typename T>
  Bytes& num(T v) {
    return raw(&v, sizeof v);
  }
  Bytes& u8(uint8_t v) { return num(v); }
  Bytes& u32(uint32_t v) { return num(v); }
  Bytes& u64(uint64_t v) { return num(v); }
  Bytes& str(const std::string& s) {
    u64(s.size());
    b += s;
    return *this;
  }
  Bytes& header(uint64_t n_tensors, uint64_t n_kv, uint32_t version = 3) {
    b += "GGUF";
    return u32(version).u64(n_tensors).u64(n_kv);
  }
  Bytes& kv_u32(const std::string& k, uint32_t v) { return str(k).u32(4).u32(v); }
  Bytes& kv_str(const std::string& k, const std::string& v) { return str(k).u32(8).str(v); }
  Bytes& tinfo(const std::string& name, std::vector<uint64_t> ne, uint32_t type, uint64_t offset) {
    str(name).u32(static_cast<uint32_t>(ne.size()));
    for (auto d : ne) u64(d);
    return u32(type).u64(offset);
  }
  Bytes& pad(size_t align) {
    b.resize((b.size() + align - 1) / align * align, '\0');
    return *this;
  }
  Bytes& zeros(size_t n) {
    b.append(n, '\0');
    return *this;
  }
};

// Parse from an exactly-sized heap copy (so sanitizers catch any read past the end).
std::unique_ptr<Reader> parse(const std::string& bytes) {
  static std::vector<std::unique_ptr<uint8_t[]>> keep;  // buffers must outlive the readers
  auto buf = std::make_unique<uint8_t[]>(bytes.size() ? bytes.size() : 1);
  std::memcpy(buf.get(), bytes.data(), bytes.size());
  auto r = Reader::open_memory(bytes.size() ? buf.get() : nullptr, bytes.size(), "mem.gguf");
  keep.push_back(std::move(buf));
  return r;
}

std::string error_of(const std::string& bytes) {
  try {
    parse(bytes);
  } catch (const kimi::Error& e) {
    return e.what();
  }
  return "<no error>";
}

#define EXPECT_PARSE_ERROR(bytes, substr)                                                \
  do {                                                                                   \
    std::string msg_ = error_of(bytes);                                                  \
    EXPECT_NE(msg_.find(substr), std::string::npos) << "message: " << msg_ << "\nwant: " << (substr); \
  } while (0)

// A valid one-tensor file: F32 tensor "t" with ne, data all zeros, alignment 32.
std::string one_tensor(std::vector<uint64_t> ne, uint32_t type = 0, uint64_t offset = 0, size_t data_bytes = 0) {
  Bytes b;
  b.header(1, 1).kv_str("general.architecture", "kimi-k3").tinfo("t", ne, type, offset).pad(32).zeros(data_bytes);
  return b.b;
}

// formats-quant.md §1.9, transcribed from the listing.
std::string spec_hexdump() {
  Bytes b;
  const uint8_t head[] = {0x47, 0x47, 0x55, 0x46, 0x03, 0, 0, 0, 0x01, 0, 0, 0, 0, 0, 0, 0, 0x02, 0, 0, 0, 0, 0, 0, 0};
  b.raw(head, sizeof head);
  const uint8_t l20[] = {0x14, 0, 0, 0, 0, 0, 0, 0};
  b.raw(l20, 8).raw("general.architecture", 20);
  const uint8_t t8[] = {0x08, 0, 0, 0, 0x07, 0, 0, 0, 0, 0, 0, 0};
  b.raw(t8, sizeof t8).raw("kimi-k3", 7);
  const uint8_t l17[] = {0x11, 0, 0, 0, 0, 0, 0, 0};
  b.raw(l17, 8).raw("general.file_type", 17);
  const uint8_t u32v[] = {0x04, 0, 0, 0, 0x01, 0, 0, 0};
  b.raw(u32v, 8);
  const uint8_t l18[] = {0x12, 0, 0, 0, 0, 0, 0, 0};
  b.raw(l18, 8).raw("output_norm.weight", 18);
  const uint8_t ti[] = {0x02, 0, 0, 0, 0x04, 0, 0, 0, 0, 0, 0, 0, 0x02, 0, 0, 0, 0, 0, 0, 0,
                        0,    0, 0, 0, 0,    0, 0, 0, 0, 0, 0, 0};
  b.raw(ti, sizeof ti);
  EXPECT_EQ(b.b.size(), 0xA2u);
  b.zeros(0xC0 - 0xA2);
  const uint8_t one[] = {0x00, 0x00, 0x80, 0x3F};
  for (int k = 0; k < 8; ++k) b.raw(one, 4);
  EXPECT_EQ(b.b.size(), 0xE0u);
  return b.b;
}

Value make_scalar(ValueType t, int64_t i, uint64_t u, double f) {
  Value v;
  v.type = t;
  v.i = i;
  v.u = u;
  v.f = f;
  return v;
}

}  // namespace

// ---------------------------------------------------------------------------------------------

TEST(GgufWriter, ReproducesSpecHexdump) {
  TempDir td;
  const std::string path = td.file("x.gguf");
  {
    Writer w(path);
    w.add_kv("general.architecture", Value::str("kimi-k3"));
    w.add_kv("general.file_type", Value::u32(1));
    w.add_tensor("output_norm.weight", GgmlType::F32, {4, 2});
    EXPECT_EQ(w.total_tensor_bytes(), 32u);
    w.begin();
    std::vector<float> ones(8, 1.0f);
    w.write_tensor_data("output_norm.weight", ones.data(), 12);  // in two chunks
    w.write_tensor_data("output_norm.weight", reinterpret_cast<const char*>(ones.data()) + 12, 20);
    w.finish();
  }
  const std::string got = kimi::test::read_file(path);
  const std::string want = spec_hexdump();
  ASSERT_EQ(got.size(), want.size());
  for (size_t k = 0; k < want.size(); ++k) ASSERT_EQ(static_cast<uint8_t>(got[k]), static_cast<uint8_t>(want[k])) << "byte 0x" << std::hex << k;
}

TEST(GgufReader, ReadsSpecHexdump) {
  const std::string bytes = spec_hexdump();
  auto r = parse(bytes);
  EXPECT_EQ(r->version(), 3u);
  EXPECT_EQ(r->alignment(), 32u);
  ASSERT_EQ(r->kvs().size(), 2u);
  EXPECT_EQ(r->kvs()[0].key, "general.architecture");
  EXPECT_EQ(r->get_str("general.architecture"), "kimi-k3");
  EXPECT_EQ(r->get_u32("general.file_type"), 1u);
  ASSERT_EQ(r->tensors().size(), 1u);
  const TensorInfo& t = r->tensor("output_norm.weight");
  EXPECT_EQ(t.type, GgmlType::F32);
  EXPECT_EQ(t.n_dims, 2u);
  EXPECT_EQ(t.ne[0], 4);
  EXPECT_EQ(t.ne[1], 2);
  EXPECT_EQ(t.ne[2], 1);
  EXPECT_EQ(t.nelements(), 8);
  EXPECT_EQ(t.nbytes, 32u);
  EXPECT_EQ(t.offset, 0u);
  EXPECT_EQ(t.shape_string(), "{4, 2}");
  float vals[8];
  std::memcpy(vals, t.data, 32);
  for (float v : vals) EXPECT_EQ(v, 1.0f);
}

TEST(GgufReader, AcceptsVersion2AndNoTensors) {
  Bytes b;
  b.header(0, 1, 2).kv_u32("a.b", 7);
  auto r = parse(b.b);
  EXPECT_EQ(r->version(), 2u);
  EXPECT_EQ(r->get_u32("a.b"), 7u);
  EXPECT_TRUE(r->tensors().empty());
}

TEST(GgufRoundTrip, EveryValueType) {
  TempDir td;
  const std::string path = td.file("v.gguf");
  const std::vector<ValueType> scalar_types = {ValueType::UINT8,  ValueType::INT8,   ValueType::UINT16,
                                               ValueType::INT16,  ValueType::UINT32, ValueType::INT32,
                                               ValueType::FLOAT32, ValueType::BOOL,  ValueType::STRING,
                                               ValueType::UINT64, ValueType::INT64,  ValueType::FLOAT64};
  {
    Writer w(path);
    w.add_kv("general.architecture", Value::str("test"));
    w.add_kv("s.u8", make_scalar(ValueType::UINT8, 0, 250, 0));
    w.add_kv("s.i8", make_scalar(ValueType::INT8, -128, 0, 0));
    w.add_kv("s.u16", make_scalar(ValueType::UINT16, 0, 65535, 0));
    w.add_kv("s.i16", make_scalar(ValueType::INT16, -32768, 0, 0));
    w.add_kv("s.u32", Value::u32(4000000000u));
    w.add_kv("s.i32", Value::i32(-2000000000));
    w.add_kv("s.f32", Value::f32(0.1f));
    w.add_kv("s.bool", Value::boolean(true));
    w.add_kv("s.str", Value::str("h\xC3\xA9llo \"q\"\n"));
    w.add_kv("s.u64", Value::u64(18446744073709551615ull));
    w.add_kv("s.i64", make_scalar(ValueType::INT64, std::numeric_limits<int64_t>::min(), 0, 0));
    w.add_kv("s.f64", make_scalar(ValueType::FLOAT64, 0, 0, 1.0 / 3.0));
    w.add_kv("s.emptystr", Value::str(""));
    // arrays of every element type
    for (ValueType et : scalar_types) {
      Value v;
      v.type = ValueType::ARRAY;
      v.elem_type = et;
      switch (et) {
        case ValueType::UINT8: v.uints = {0, 1, 255}; break;
        case ValueType::UINT16: v.uints = {0, 65535}; break;
        case ValueType::UINT32: v.uints = {7, 4294967295u}; break;
        case ValueType::UINT64: v.uints = {18446744073709551615ull, 3}; break;
        case ValueType::INT8: v.ints = {-128, 127, 0}; break;
        case ValueType::INT16: v.ints = {-32768, 32767}; break;
        case ValueType::INT32: v.ints = {-5, 2147483647}; break;
        case ValueType::INT64: v.ints = {std::numeric_limits<int64_t>::min(), 42}; break;
        case ValueType::FLOAT32: v.floats = {1.5, -0.25, 1e30}; break;
        case ValueType::FLOAT64: v.floats = {1e300, -1.0 / 7.0}; break;
        case ValueType::BOOL: v.bools = {true, false, true}; break;
        case ValueType::STRING: v.strs = {"a", "", "tokens \xE2\x96\x81"}; break;
        default: break;
      }
      w.add_kv(std::string("a.") + value_type_name(et), v);
    }
    w.add_kv("a.empty", Value::arr_i32({}));
    w.add_kv("a.f32", Value::arr_f32({0.5f, 2.0f}));
    w.add_kv("s.u32", Value::u32(4000000001u));  // replaces the earlier value, keeps its position
    w.finish();
  }
  auto r = Reader::open(path);
  EXPECT_EQ(r->kvs()[0].key, "general.architecture");
  EXPECT_EQ(r->kvs()[5].key, "s.u32");
  EXPECT_EQ(r->find("s.u8")->type, ValueType::UINT8);
  EXPECT_EQ(r->get_u32("s.u8"), 250u);
  EXPECT_EQ(r->get_i64("s.i8"), -128);
  EXPECT_EQ(r->find("s.i8")->type, ValueType::INT8);
  EXPECT_EQ(r->get_u32("s.u16"), 65535u);
  EXPECT_EQ(r->get_i64("s.i16"), -32768);
  EXPECT_EQ(r->get_u32("s.u32"), 4000000001u);
  EXPECT_EQ(r->get_i64("s.i32"), -2000000000);
  EXPECT_EQ(r->get_f32("s.f32"), 0.1f);
  EXPECT_EQ(r->find("s.f32")->type, ValueType::FLOAT32);
  EXPECT_TRUE(r->get_bool("s.bool"));
  EXPECT_EQ(r->get_str("s.str"), "h\xC3\xA9llo \"q\"\n");
  EXPECT_EQ(r->get_str("s.emptystr"), "");
  EXPECT_EQ(r->get_u64("s.u64"), 18446744073709551615ull);
  EXPECT_EQ(r->get_i64("s.i64"), std::numeric_limits<int64_t>::min());
  EXPECT_EQ(r->find("s.f64")->f, 1.0 / 3.0);
  EXPECT_EQ(r->find("s.f64")->type, ValueType::FLOAT64);

  auto arr = [&](ValueType et) -> const Value& {
    const Value* v = r->find(std::string("a.") + value_type_name(et));
    EXPECT_NE(v, nullptr);
    EXPECT_EQ(v->type, ValueType::ARRAY);
    EXPECT_EQ(v->elem_type, et);
    return *v;
  };
  EXPECT_EQ(arr(ValueType::UINT8).uints, (std::vector<uint64_t>{0, 1, 255}));
  EXPECT_EQ(arr(ValueType::UINT16).uints, (std::vector<uint64_t>{0, 65535}));
  EXPECT_EQ(arr(ValueType::UINT32).uints, (std::vector<uint64_t>{7, 4294967295u}));
  EXPECT_EQ(arr(ValueType::UINT64).uints, (std::vector<uint64_t>{18446744073709551615ull, 3}));
  EXPECT_EQ(arr(ValueType::INT8).ints, (std::vector<int64_t>{-128, 127, 0}));
  EXPECT_EQ(arr(ValueType::INT16).ints, (std::vector<int64_t>{-32768, 32767}));
  EXPECT_EQ(arr(ValueType::INT32).ints, (std::vector<int64_t>{-5, 2147483647}));
  EXPECT_EQ(arr(ValueType::INT64).ints, (std::vector<int64_t>{std::numeric_limits<int64_t>::min(), 42}));
  EXPECT_EQ(arr(ValueType::FLOAT32).floats, (std::vector<double>{1.5, -0.25, static_cast<double>(1e30f)}));
  EXPECT_EQ(arr(ValueType::FLOAT64).floats, (std::vector<double>{1e300, -1.0 / 7.0}));
  EXPECT_EQ(arr(ValueType::BOOL).bools, (std::vector<bool>{true, false, true}));
  EXPECT_EQ(arr(ValueType::STRING).strs, (std::vector<std::string>{"a", "", "tokens \xE2\x96\x81"}));
  EXPECT_EQ(arr(ValueType::STRING).array_size(), 3u);
  EXPECT_EQ(r->find("a.empty")->array_size(), 0u);
  EXPECT_EQ(r->find("a.empty")->elem_type, ValueType::INT32);

  EXPECT_EQ(r->get_int_array("a.int32"), (std::vector<int64_t>{-5, 2147483647}));
  EXPECT_EQ(r->get_int_array("a.uint16"), (std::vector<int64_t>{0, 65535}));
  EXPECT_EQ(r->get_float_array("a.f32"), (std::vector<float>{0.5f, 2.0f}));
  EXPECT_EQ(r->get_str_array("a.string").size(), 3u);

  // to_string (what inspect prints)
  EXPECT_EQ(r->find("s.str")->to_string(), "\"h\xC3\xA9llo \\\"q\\\"\\n\"");
  EXPECT_EQ(r->find("s.f32")->to_string(), "0.1");
  EXPECT_EQ(r->find("a.int8")->to_string(), "[-128, 127, 0]");
  EXPECT_EQ(r->find("a.int8")->to_string(2), "[-128, 127, ...] (3 x int8)");
  EXPECT_EQ(r->find("a.bool")->to_string(), "[true, false, true]");
}

TEST(GgufRoundTrip, TensorsAndAlignment64) {
  TempDir td;
  const std::string path = td.file("a64.gguf");
  std::mt19937 rng(7);
  struct T {
    std::string name;
    GgmlType type;
    std::vector<int64_t> ne;
    std::string data;
  };
  std::vector<T> ts = {{"a", GgmlType::F32, {3}, ""},
                       {"blk.0.b", GgmlType::Q8_0, {64, 3}, ""},
                       {"c", GgmlType::BF16, {5, 1, 2}, ""},
                       {"d.conv", GgmlType::F16, {4, 1, 6, 1}, ""},
                       {"e", GgmlType::MXFP4, {32, 2, 3}, ""},
                       {"f.empty", GgmlType::F32, {0, 4}, ""}};
  const std::vector<uint64_t> sizes = {12, 2 * 34 * 3, 20, 48, 17 * 6, 0};
  for (size_t k = 0; k < ts.size(); ++k) {
    ts[k].data.resize(sizes[k]);
    for (auto& c : ts[k].data) c = static_cast<char>(rng());
  }
  {
    Writer w(path, {.alignment = 64});
    w.add_kv("general.architecture", Value::str("kimi-k3"));
    for (auto& t : ts) w.add_tensor(t.name, t.type, t.ne);
    w.begin();
    for (auto& t : ts) w.write_tensor_data(t.name, t.data.data(), t.data.size());
    w.finish();
  }
  auto r = Reader::open(path);
  EXPECT_EQ(r->alignment(), 64u);
  EXPECT_EQ(r->find("general.alignment")->type, ValueType::UINT32);
  EXPECT_EQ(r->get_u32("general.alignment"), 64u);
  const MappedFile* mf = r->mapped_file(0);
  ASSERT_NE(mf, nullptr);
  EXPECT_EQ(r->file_path(0), path);
  ASSERT_EQ(r->tensors().size(), ts.size());
  uint64_t expect_off = 0;
  for (size_t k = 0; k < ts.size(); ++k) {
    const TensorInfo& t = r->tensors()[k];
    EXPECT_EQ(t.name, ts[k].name);
    EXPECT_EQ(t.type, ts[k].type);
    EXPECT_EQ(t.n_dims, ts[k].ne.size());
    for (size_t d = 0; d < 4; ++d) EXPECT_EQ(t.ne[d], d < ts[k].ne.size() ? ts[k].ne[d] : 1);
    EXPECT_EQ(t.nbytes, sizes[k]);
    EXPECT_EQ(t.offset, expect_off);  // contiguous, each padded to 64 (what ggml requires)
    expect_off += (sizes[k] + 63) / 64 * 64;
    const size_t file_off = static_cast<size_t>(t.data - mf->data());
    EXPECT_EQ(file_off % 64, 0u) << t.name;
    EXPECT_TRUE(t.data >= mf->data() && file_off + t.nbytes <= mf->size());  // points into the mapping
    EXPECT_EQ(std::string(reinterpret_cast<const char*>(t.data), t.nbytes), ts[k].data) << t.name;
  }
  // padding bytes are zero; the file ends with the last tensor's padding
  const std::string bytes = kimi::test::read_file(path);
  EXPECT_EQ(bytes.size() % 64, 0u);
  const size_t data_start = static_cast<size_t>(r->tensors()[0].data - mf->data());
  for (size_t k = 0; k < ts.size(); ++k) {
    const auto& t = r->tensors()[k];
    const size_t end = data_start + t.offset + t.nbytes;
    const size_t padded = data_start + t.offset + (t.nbytes + 63) / 64 * 64;
    for (size_t p = end; p < padded; ++p) ASSERT_EQ(bytes[p], '\0');
  }
}

TEST(GgufSplit, WriteAndReadBackFromAnyShard) {
  TempDir td;
  const std::string out = td.file("model.gguf");
  std::mt19937 rng(3);
  std::vector<std::pair<std::string, std::string>> ts;
  const std::vector<size_t> elems = {8, 40, 24, 64, 8, 100, 16};
  for (size_t k = 0; k < elems.size(); ++k) {
    std::string d(elems[k] * 4, '\0');
    for (auto& c : d) c = static_cast<char>(rng());
    ts.push_back({"blk." + std::to_string(k) + ".w", d});
  }
  std::vector<std::string> paths;
  {
    Writer w(out, {.alignment = 32, .split_max_bytes = 200});
    w.add_kv("general.architecture", Value::str("kimi-k3"));
    w.add_kv("tokenizer.ggml.tokens", Value::arr_str({"a", "b", "c"}));
    for (auto& [n, d] : ts) w.add_tensor(n, GgmlType::F32, {static_cast<int64_t>(d.size() / 4)});
    paths = w.output_paths();
    w.begin();
    for (auto& [n, d] : ts) w.write_tensor_data(n, d.data(), d.size());
    w.finish();
  }
  // sizes padded: 32, 160, 96, 256, 32, 416, 64 with max 200 ->
  // [32,160] [96] [256] [32] [416] [64]
  ASSERT_EQ(paths.size(), 6u);
  for (size_t s = 0; s < paths.size(); ++s) {
    EXPECT_EQ(paths[s], td.file(fmt::format("model-{:05d}-of-00006.gguf", s + 1)));
    EXPECT_TRUE(fs::exists(paths[s])) << paths[s];
  }
  EXPECT_FALSE(fs::exists(out));
  size_t n_entries = 0;
  for (auto& e : fs::directory_iterator(td.path)) {
    (void)e;
    ++n_entries;
  }
  EXPECT_EQ(n_entries, 6u);  // no temp files left

  // each shard is a complete GGUF with the split keys
  for (size_t s = 0; s < paths.size(); ++s) {
    const std::string bytes = kimi::test::read_file(paths[s]);
    auto r = parse(bytes);
    EXPECT_EQ(r->find("split.no")->type, ValueType::UINT16);
    EXPECT_EQ(r->get_u32("split.no"), s);
    EXPECT_EQ(r->find("split.count")->type, ValueType::UINT16);
    EXPECT_EQ(r->get_u32("split.count"), 6u);
    EXPECT_EQ(r->find("split.tensors.count")->type, ValueType::INT32);
    EXPECT_EQ(r->get_u32("split.tensors.count"), 7u);
    EXPECT_EQ(r->has("general.architecture"), s == 0);  // model KVs only in the first shard
    EXPECT_EQ(r->kvs().size(), s == 0 ? 5u : 3u);
  }

  for (size_t via : {size_t{0}, size_t{3}, size_t{5}}) {
    auto r = Reader::open(paths[via]);
    EXPECT_EQ(r->n_files(), 6u);
    EXPECT_EQ(r->get_str("general.architecture"), "kimi-k3");
    EXPECT_EQ(r->get_str_array("tokenizer.ggml.tokens").size(), 3u);
    ASSERT_EQ(r->tensors().size(), ts.size());
    const std::vector<uint32_t> want_file = {0, 0, 1, 2, 3, 4, 5};
    for (size_t k = 0; k < ts.size(); ++k) {
      const TensorInfo& t = r->tensor(ts[k].first);
      EXPECT_EQ(&t, &r->tensors()[k]);
      EXPECT_EQ(t.file_index, want_file[k]);
      EXPECT_EQ(std::string(reinterpret_cast<const char*>(t.data), t.nbytes), ts[k].second);
      const MappedFile* mf = r->mapped_file(t.file_index);
      EXPECT_TRUE(t.data >= mf->data() && t.data + t.nbytes <= mf->data() + mf->size());
      EXPECT_EQ(r->file_path(t.file_index), paths[t.file_index]);
    }
  }

  // a missing shard is an error naming it
  fs::remove(paths[4]);
  try {
    Reader::open(paths[0]);
    FAIL() << "expected an error";
  } catch (const kimi::Error& e) {
    EXPECT_NE(std::string(e.what()).find("split file 5 of 6"), std::string::npos) << e.what();
  }
}

TEST(GgufSplit, SingleShardWhenEverythingFits) {
  TempDir td;
  Writer w(td.file("m.gguf"), {.split_max_bytes = 1 << 20});
  w.add_tensor("x", GgmlType::F32, {4});
  EXPECT_EQ(w.output_paths(), std::vector<std::string>{td.file("m.gguf")});
  w.begin();
  float d[4] = {1, 2, 3, 4};
  w.write_tensor_data("x", d, sizeof d);
  w.finish();
  auto r = Reader::open(td.file("m.gguf"));
  EXPECT_FALSE(r->has("split.count"));
  EXPECT_EQ(r->n_files(), 1u);
}

TEST(GgufSplit, ShardNumberMismatchIsAnError) {
  TempDir td;
  // a file named as shard 2 of 2 whose split.no says 0
  Bytes b;
  b.header(0, 2).str("split.no").u32(2).num<uint16_t>(0).str("split.count").u32(2).num<uint16_t>(2);
  kimi::test::write_file(td.file("m-00002-of-00002.gguf"), b.b);
  try {
    Reader::open(td.file("m-00002-of-00002.gguf"));
    FAIL();
  } catch (const kimi::Error& e) {
    EXPECT_NE(std::string(e.what()).find("split.no"), std::string::npos) << e.what();
  }
  // split.count > 1 but the name has no shard pattern
  kimi::test::write_file(td.file("plain.gguf"), b.b);
  try {
    Reader::open(td.file("plain.gguf"));
    FAIL();
  } catch (const kimi::Error& e) {
    EXPECT_NE(std::string(e.what()).find("PREFIX-NNNNN-of-00002.gguf"), std::string::npos) << e.what();
  }
}

// ---------------------------------------------------------------------------------------------
// Validation

TEST(GgufValidation, TruncationAtEveryByteOffset) {
  const std::string full = spec_hexdump();
  ASSERT_NO_THROW(parse(full));
  for (size_t n = 0; n < full.size(); ++n) {
    EXPECT_THROW(parse(full.substr(0, n)), kimi::Error) << "prefix of " << n << " bytes";
  }
  // a richer file: arrays of strings and numbers, several tensors (last one ends on the alignment)
  TempDir td;
  {
    Writer w(td.file("r.gguf"));
    w.add_kv("general.architecture", Value::str("kimi-k3"));
    w.add_kv("tok", Value::arr_str({"x", "yy", ""}));
    w.add_kv("ints", Value::arr_i32({1, -2, 3}));
    w.add_kv("flag", Value::boolean(false));
    w.add_kv("bools", Value::arr_bool({true, false}));
    w.add_tensor("a", GgmlType::F16, {3});
    w.add_tensor("b", GgmlType::Q8_0, {32, 2});
    w.add_tensor("c", GgmlType::F32, {8});
    w.begin();
    std::string zeros(100, '\0');
    w.write_tensor_data("a", zeros.data(), 6);
    w.write_tensor_data("b", zeros.data(), 68);
    w.write_tensor_data("c", zeros.data(), 32);
    w.finish();
  }
  const std::string rich = kimi::test::read_file(td.file("r.gguf"));
  ASSERT_NO_THROW(parse(rich));
  for (size_t n = 0; n < rich.size(); ++n) {
    EXPECT_THROW(parse(rich.substr(0, n)), kimi::Error) << "prefix of " << n << " bytes";
  }
}

TEST(GgufValidation, HeaderErrors) {
  std::string good = spec_hexdump();
  std::string bad = good;
  bad[3] = 'X';
  EXPECT_PARSE_ERROR(bad, "bad magic");
  for (uint32_t v : {0u, 1u, 4u}) {
    bad = good;
    std::memcpy(&bad[4], &v, 4);
    EXPECT_PARSE_ERROR(bad, fmt::format("unsupported GGUF version {}", v));
  }
  bad = good;
  const uint32_t be3 = 0x03000000u;
  std::memcpy(&bad[4], &be3, 4);
  EXPECT_PARSE_ERROR(bad, "big-endian");

  Bytes huge_t;
  huge_t.header(uint64_t{1} << 62, 0);
  EXPECT_PARSE_ERROR(huge_t.b, "tensor count 4611686018427387904");
  Bytes huge_kv;
  huge_kv.header(0, ~uint64_t{0});
  EXPECT_PARSE_ERROR(huge_kv.b, "KV count 18446744073709551615");
  Bytes many_kv;  // plausible-looking count, but the file ends early
  many_kv.header(0, 3).kv_u32("a", 1).kv_u32("b", 2).str("c").u32(4).zeros(3);
  EXPECT_PARSE_ERROR(many_kv.b, "truncated");
}

TEST(GgufValidation, KvErrors) {
  Bytes strlen_past_eof;
  strlen_past_eof.header(0, 1).u64(1000).b += "general.architecture";
  strlen_past_eof.zeros(20);
  EXPECT_PARSE_ERROR(strlen_past_eof.b, "key of metadata KV 0");
  EXPECT_PARSE_ERROR(strlen_past_eof.b, "truncated");

  Bytes huge_str;
  huge_str.header(0, 1).str("k").u32(8).u64(uint64_t{1} << 40).zeros(16);
  EXPECT_PARSE_ERROR(huge_str.b, "string value of key 'k' has length 1099511627776");

  Bytes unknown_type;
  unknown_type.header(0, 1).str("k").u32(13).u32(0);
  EXPECT_PARSE_ERROR(unknown_type.b, "key 'k': unknown value type 13");

  Bytes dup;
  dup.header(0, 2).kv_u32("k.x", 1).kv_u32("k.x", 2);
  EXPECT_PARSE_ERROR(dup.b, "duplicate metadata key 'k.x'");

  Bytes empty_key;
  empty_key.header(0, 1).kv_u32("", 1);
  EXPECT_PARSE_ERROR(empty_key.b, "empty key");

  Bytes nested;
  nested.header(0, 1).str("arr").u32(9).u32(9).u64(1).u32(4).u64(1).u32(5);
  EXPECT_PARSE_ERROR(nested.b, "key 'arr': nested arrays");

  Bytes bad_elem;
  bad_elem.header(0, 1).str("arr").u32(9).u32(77).u64(0);
  EXPECT_PARSE_ERROR(bad_elem.b, "unknown array element type 77");

  Bytes arr_past_eof;
  arr_past_eof.header(0, 1).str("arr").u32(9).u32(5).u64(1000).u32(1).u32(2);
  EXPECT_PARSE_ERROR(arr_past_eof.b, "key 'arr': array of 1000 int32 elements");

  Bytes str_arr_past_eof;
  str_arr_past_eof.header(0, 1).str("toks").u32(9).u32(8).u64(3).str("a").str("b").u64(50).zeros(10);
  EXPECT_PARSE_ERROR(str_arr_past_eof.b, "element 2 of string array key 'toks'");

  Bytes huge_arr;
  huge_arr.header(0, 1).str("arr").u32(9).u32(0).u64(uint64_t{1} << 50);
  EXPECT_PARSE_ERROR(huge_arr.b, "array count 1125899906842624");

  Bytes bad_bool;
  bad_bool.header(0, 1).str("b").u32(7).u8(2);
  EXPECT_PARSE_ERROR(bad_bool.b, "key 'b': invalid bool value 2");
  Bytes bad_bool_arr;
  bad_bool_arr.header(0, 1).str("b").u32(9).u32(7).u64(2).u8(1).u8(9);
  EXPECT_PARSE_ERROR(bad_bool_arr.b, "element 1 is an invalid bool value 9");

  Bytes align_type;
  align_type.header(0, 1).str("general.alignment").u32(5).u32(64);
  EXPECT_PARSE_ERROR(align_type.b, "'general.alignment': expected uint32, found int32");
  Bytes align_val;
  align_val.header(0, 1).kv_u32("general.alignment", 48);
  EXPECT_PARSE_ERROR(align_val.b, "48 is not a non-zero power of two");
  Bytes align_zero;
  align_zero.header(0, 1).kv_u32("general.alignment", 0);
  EXPECT_PARSE_ERROR(align_zero.b, "0 is not a non-zero power of two");
  for (uint32_t small : {1u, 2u, 4u}) {  // powers of two, but f32 data could sit at an odd address
    Bytes align_small;
    align_small.header(0, 1).kv_u32("general.alignment", small);
    EXPECT_PARSE_ERROR(align_small.b, std::to_string(small) + " is not a non-zero power of two that is a multiple of 8");
  }
  Bytes align_8;
  align_8.header(0, 1).kv_u32("general.alignment", 8);
  EXPECT_NO_THROW(parse(align_8.b));
}

TEST(GgufValidation, TensorInfoErrors) {
  ASSERT_NO_THROW(parse(one_tensor({4, 2}, 0, 0, 32)));
  EXPECT_PARSE_ERROR(one_tensor({}, 0, 0, 32), "tensor 't': n_dims = 0");
  EXPECT_PARSE_ERROR(one_tensor({1, 1, 1, 1, 1}, 0, 0, 32), "tensor 't': n_dims = 5");
  EXPECT_PARSE_ERROR(one_tensor({32}, 99, 0, 64), "invalid ggml type id 99");
  EXPECT_PARSE_ERROR(one_tensor({32}, 4, 0, 64), "invalid ggml type id 4 (removed type Q4_2)");
  EXPECT_PARSE_ERROR(one_tensor({32}, 5, 0, 64), "invalid ggml type id 5 (removed type Q4_3)");
  EXPECT_PARSE_ERROR(one_tensor({33, 2}, 8, 0, 128), "ne[0] = 33 is not a multiple of the Q8_0 block size 32");
  EXPECT_PARSE_ERROR(one_tensor({128}, 12, 0, 256), "ne[0] = 128 is not a multiple of the Q4_K block size 256");
  const uint64_t big = uint64_t{1} << 32;
  EXPECT_PARSE_ERROR(one_tensor({big, big, big}, 0, 0, 32), "element count overflows");
  EXPECT_PARSE_ERROR(one_tensor({uint64_t{1} << 62}, 0, 0, 32), "byte size overflows");
  EXPECT_PARSE_ERROR(one_tensor({~uint64_t{0}}, 0, 0, 32), "ne[0] = 18446744073709551615 is too large");
  EXPECT_PARSE_ERROR(one_tensor({8}, 0, 4, 64), "data offset 4 is not a multiple of the alignment 32");
  EXPECT_PARSE_ERROR(one_tensor({8}, 0, 32, 32), "tensor 't': 32 bytes at data offset 32 lie past the end");
  EXPECT_PARSE_ERROR(one_tensor({9}, 0, 0, 32), "tensor 't': 36 bytes at data offset 0 lie past the end");
  EXPECT_PARSE_ERROR(one_tensor({8}, 0, ~uint64_t{0} - 31, 32), "lie past the end");

  // names: 63 bytes is fine, 64 is not; empty is not
  auto named = [](const std::string& name) {
    Bytes b;
    b.header(1, 0).tinfo(name, {8}, 0, 0).pad(32).zeros(32);
    return b.b;
  };
  ASSERT_NO_THROW(parse(named(std::string(63, 'n'))));
  EXPECT_PARSE_ERROR(named(std::string(64, 'n')), "is 64 bytes long (limit 63)");
  EXPECT_PARSE_ERROR(named(""), "tensor 0 has an empty name");

  // two tensors
  auto two = [](const std::string& n1, uint64_t ne1, uint64_t off1, const std::string& n2, uint64_t ne2,
                uint64_t off2, size_t data) {
    Bytes b;
    b.header(2, 0).tinfo(n1, {ne1}, 0, off1).tinfo(n2, {ne2}, 0, off2).pad(32).zeros(data);
    return b.b;
  };
  ASSERT_NO_THROW(parse(two("a", 8, 0, "b", 8, 32, 64)));
  ASSERT_NO_THROW(parse(two("a", 8, 32, "b", 8, 0, 64)));  // any order of non-overlapping offsets
  EXPECT_PARSE_ERROR(two("a", 8, 0, "b", 8, 0, 64), "overlap");
  EXPECT_PARSE_ERROR(two("a", 16, 0, "b", 8, 32, 96), "tensors 'a' [0, 64) and 'b' [32, 64) overlap");
  EXPECT_PARSE_ERROR(two("a", 8, 0, "a", 8, 32, 64), "duplicate tensor name 'a'");

  // data section start past EOF (header ends unaligned, no padding)
  Bytes nopad;
  nopad.header(1, 0).tinfo("z", {0}, 0, 0);
  EXPECT_PARSE_ERROR(nopad.b, "data section should start at offset 64");
}

TEST(GgufValidation, ZeroSizedTensorsAreAccepted) {
  Bytes b;
  b.header(2, 0).tinfo("e", {0, 3}, 0, 0).tinfo("f", {4}, 0, 0).pad(32).zeros(32);
  auto r = parse(b.b);
  EXPECT_EQ(r->tensor("e").nbytes, 0u);
  EXPECT_EQ(r->tensor("f").nbytes, 16u);
}

TEST(GgufAccessors, ErrorsNameTheKey) {
  TempDir td;
  const std::string path = td.file("acc.gguf");
  {
    Writer w(path);
    w.add_kv("general.name", Value::str("x"));
    w.add_kv("big", Value::u64(uint64_t{1} << 40));
    w.add_kv("neg", Value::i32(-1));
    w.add_kv("f", Value::f32(2.5f));
    w.add_kv("ints", Value::arr_i32({1, 2}));
    w.add_kv("u8", Value::u8(200));
    w.finish();
  }
  auto r = Reader::open(path);
  auto msg = [](auto&& fn) -> std::string {
    try {
      fn();
    } catch (const kimi::Error& e) {
      return e.what();
    }
    return "<no error>";
  };
  auto has = [](const std::string& m, const std::string& s) { return m.find(s) != std::string::npos; };
  std::string m = msg([&] { r->get_u32("general.name"); });
  EXPECT_TRUE(has(m, "key 'general.name': expected uint32, found string")) << m;
  m = msg([&] { r->get_u32("nope.key"); });
  EXPECT_TRUE(has(m, "key 'nope.key': missing")) << m;
  m = msg([&] { r->get_u32("big"); });
  EXPECT_TRUE(has(m, "key 'big'") && has(m, "does not fit in uint32")) << m;
  m = msg([&] { r->get_u64("neg"); });
  EXPECT_TRUE(has(m, "key 'neg'") && has(m, "does not fit in uint64")) << m;
  m = msg([&] { r->get_str("f"); });
  EXPECT_TRUE(has(m, "key 'f': expected string, found float32")) << m;
  m = msg([&] { r->get_f32("neg"); });
  EXPECT_TRUE(has(m, "key 'neg': expected float32, found int32")) << m;
  m = msg([&] { r->get_bool("f"); });
  EXPECT_TRUE(has(m, "key 'f': expected bool")) << m;
  m = msg([&] { r->get_str_array("ints"); });
  EXPECT_TRUE(has(m, "key 'ints': expected array of strings, found array of int32")) << m;
  m = msg([&] { r->get_int_array("general.name"); });
  EXPECT_TRUE(has(m, "key 'general.name': expected array of integers, found string")) << m;
  m = msg([&] { r->get_float_array("f"); });
  EXPECT_TRUE(has(m, "key 'f': expected array of floats")) << m;
  m = msg([&] { r->get_u32_or("general.name", 5); });
  EXPECT_TRUE(has(m, "key 'general.name'")) << m;
  m = msg([&] { r->tensor("blk.0.missing.weight"); });
  EXPECT_TRUE(has(m, "tensor 'blk.0.missing.weight' not found")) << m;

  EXPECT_EQ(r->get_u64("big"), uint64_t{1} << 40);
  EXPECT_EQ(r->get_i64("big"), int64_t{1} << 40);
  EXPECT_EQ(r->get_i64("neg"), -1);
  EXPECT_EQ(r->get_u32("u8"), 200u);
  EXPECT_EQ(r->get_u32_or("absent", 17), 17u);
  EXPECT_EQ(r->get_f32_or("absent", 0.5f), 0.5f);
  EXPECT_EQ(r->get_f32_or("f", 0.5f), 2.5f);
  EXPECT_TRUE(r->get_bool_or("absent", true));
  EXPECT_EQ(r->find("absent"), nullptr);
  EXPECT_EQ(r->find_tensor("absent"), nullptr);
}

// ---------------------------------------------------------------------------------------------
// Writer behaviour

TEST(GgufWriter, NoOutputWithoutFinish) {
  TempDir td;
  {
    Writer w(td.file("out.gguf"));
    w.add_kv("general.architecture", Value::str("kimi-k3"));
    w.add_tensor("a", GgmlType::F32, {8});
    w.begin();
    float d[4] = {};
    w.write_tensor_data("a", d, sizeof d);  // half of the tensor
  }
  EXPECT_TRUE(fs::is_empty(td.path));
  {
    Writer w(td.file("split.gguf"), {.split_max_bytes = 32});
    w.add_tensor("a", GgmlType::F32, {8});
    w.add_tensor("b", GgmlType::F32, {8});
    w.begin();
    float d[8] = {};
    w.write_tensor_data("a", d, sizeof d);
    w.write_tensor_data("b", d, 4);  // second shard open
  }
  EXPECT_TRUE(fs::is_empty(td.path));
  {
    Writer w(td.file("never.gguf"));  // never begun
    w.add_tensor("a", GgmlType::F32, {8});
  }
  EXPECT_TRUE(fs::is_empty(td.path));
}

TEST(GgufWriter, WrongDataSizeThrows) {
  TempDir td;
  float d[16] = {};
  {  // too many bytes in one call
    Writer w(td.file("a.gguf"));
    w.add_tensor("a", GgmlType::F32, {8});
    w.begin();
    EXPECT_THROW(w.write_tensor_data("a", d, 36), kimi::Error);
    EXPECT_THROW(w.finish(), kimi::Error);
  }
  {  // too many bytes over two calls
    Writer w(td.file("b.gguf"));
    w.add_tensor("a", GgmlType::F32, {8});
    w.begin();
    w.write_tensor_data("a", d, 20);
    EXPECT_THROW(w.write_tensor_data("a", d, 16), kimi::Error);
  }
  {  // too few bytes, then finish
    Writer w(td.file("c.gguf"));
    w.add_tensor("a", GgmlType::F32, {8});
    w.begin();
    w.write_tensor_data("a", d, 28);
    EXPECT_THROW(w.finish(), kimi::Error);
  }
  {  // too few bytes, then the next tensor
    Writer w(td.file("d.gguf"));
    w.add_tensor("a", GgmlType::F32, {8});
    w.add_tensor("b", GgmlType::F32, {8});
    w.begin();
    w.write_tensor_data("a", d, 28);
    EXPECT_THROW(w.write_tensor_data("b", d, 32), kimi::Error);
  }
  {  // out of declaration order / undeclared / more data after completion
    Writer w(td.file("e.gguf"));
    w.add_tensor("a", GgmlType::F32, {8});
    w.add_tensor("b", GgmlType::F32, {8});
    w.begin();
    EXPECT_THROW(w.write_tensor_data("b", d, 32), kimi::Error);
    EXPECT_THROW(w.write_tensor_data("zz", d, 32), kimi::Error);
    w.write_tensor_data("a", d, 32);
    EXPECT_THROW(w.write_tensor_data("a", d, 4), kimi::Error);
  }
  EXPECT_TRUE(fs::is_empty(td.path));
}

TEST(GgufWriter, DeclarationErrors) {
  TempDir td;
  Writer w(td.file("x.gguf"));
  EXPECT_THROW(w.add_tensor("", GgmlType::F32, {8}), kimi::Error);
  EXPECT_THROW(w.add_tensor(std::string(64, 'a'), GgmlType::F32, {8}), kimi::Error);
  EXPECT_THROW(w.add_tensor("q", GgmlType::Q8_0, {33}), kimi::Error);
  EXPECT_THROW(w.add_tensor("q", GgmlType::F32, {}), kimi::Error);
  EXPECT_THROW(w.add_tensor("q", GgmlType::F32, {1, 1, 1, 1, 1}), kimi::Error);
  EXPECT_THROW(w.add_tensor("q", GgmlType::F32, {-1}), kimi::Error);
  EXPECT_THROW(w.add_tensor("q", static_cast<GgmlType>(4), {8}), kimi::Error);
  w.add_tensor("q", GgmlType::F32, {8});
  EXPECT_THROW(w.add_tensor("q", GgmlType::F32, {8}), kimi::Error);
  EXPECT_THROW(w.add_kv("", Value::u32(1)), kimi::Error);
  EXPECT_THROW(w.add_kv("general.alignment", Value::u32(64)), kimi::Error);
  EXPECT_THROW(w.add_kv("general.alignment", Value::i32(32)), kimi::Error);
  Value bad = make_scalar(ValueType::UINT8, 0, 300, 0);
  EXPECT_THROW(w.add_kv("x", bad), kimi::Error);
  Value nested;
  nested.type = ValueType::ARRAY;
  nested.elem_type = ValueType::ARRAY;
  EXPECT_THROW(w.add_kv("x", nested), kimi::Error);
  Value mixed = Value::arr_i32({1});
  mixed.elem_type = ValueType::UINT32;  // elements are in the wrong vector
  EXPECT_THROW(w.add_kv("x", mixed), kimi::Error);
  EXPECT_THROW(Writer(td.file("y.gguf"), {.alignment = 48}), kimi::Error);
  EXPECT_THROW(Writer(td.file("y4.gguf"), {.alignment = 4}), kimi::Error);
  w.begin();
  EXPECT_THROW(w.add_kv("late", Value::u32(1)), kimi::Error);
  EXPECT_THROW(w.add_tensor("late", GgmlType::F32, {8}), kimi::Error);
}

TEST(GgufWriter, ArchitectureKeyGoesFirst) {
  TempDir td;
  {
    Writer w(td.file("o.gguf"));
    w.add_kv("general.name", Value::str("n"));
    w.add_kv("general.architecture", Value::str("kimi-k3"));
    w.add_kv("general.file_type", Value::u32(38));
    w.finish();  // no tensors: begin() implied
  }
  auto r = Reader::open(td.file("o.gguf"));
  ASSERT_EQ(r->kvs().size(), 3u);
  EXPECT_EQ(r->kvs()[0].key, "general.architecture");
  EXPECT_EQ(r->kvs()[1].key, "general.name");
  EXPECT_EQ(r->kvs()[2].key, "general.file_type");
  EXPECT_TRUE(r->tensors().empty());
  // no data section padding without tensors (formats-quant.md §1.5)
  const std::string bytes = kimi::test::read_file(td.file("o.gguf"));
  const size_t expect = 4 + 4 + 8 + 8 + (8 + 20 + 4 + 8 + 7) + (8 + 12 + 4 + 8 + 1) + (8 + 17 + 4 + 4);
  EXPECT_EQ(bytes.size(), expect);
}

// ---------------------------------------------------------------------------------------------
// Large vocabularies: a 163840-token header parses (no quadratic behaviour; not timed).

TEST(GgufReader, LargeVocabulary) {
  TempDir td;
  const size_t n = 163840;
  std::vector<std::string> toks(n);
  std::vector<int32_t> types(n);
  for (size_t k = 0; k < n; ++k) {
    toks[k] = "tok" + std::to_string(k);
    types[k] = static_cast<int32_t>(k % 6);
  }
  {
    Writer w(td.file("v.gguf"));
    w.add_kv("tokenizer.ggml.tokens", Value::arr_str(toks));
    w.add_kv("tokenizer.ggml.token_type", Value::arr_i32(types));
    w.finish();
  }
  auto r = Reader::open(td.file("v.gguf"));
  const auto& got = r->get_str_array("tokenizer.ggml.tokens");
  ASSERT_EQ(got.size(), n);
  EXPECT_EQ(got[163839], "tok163839");
  EXPECT_EQ(r->get_int_array("tokenizer.ggml.token_type")[11], 5);
  EXPECT_EQ(r->find("tokenizer.ggml.tokens")->to_string(2), "[\"tok0\", \"tok1\", ...] (163840 x string)");
}

// ---------------------------------------------------------------------------------------------
// Fuzzer regression corpus: every file must parse or give kimi::Error, nothing else.

TEST(GgufFuzzCorpus, EveryFileParsesOrGivesError) {
  const fs::path dir = fs::path(KIMI_TEST_DATA) / "gguf-fuzz";
  ASSERT_TRUE(fs::is_directory(dir)) << dir;
  size_t n_files = 0, n_ok = 0;
  for (const auto& e : fs::directory_iterator(dir)) {
    if (!e.is_regular_file() || e.path().filename().string().rfind("README", 0) == 0) continue;
    ++n_files;
    const std::string bytes = kimi::test::read_file(e.path().string());
    try {
      auto r = parse(bytes);
      for (const auto& kv : r->kvs()) (void)kv.value.to_string();
      uint64_t sum = 0;
      for (const auto& t : r->tensors())
        if (t.nbytes) sum += t.data[0] + t.data[t.nbytes - 1];
      (void)sum;
      ++n_ok;
    } catch (const kimi::Error&) {
    }
    try {  // same through the file path (mmap + split handling)
      Reader::open(e.path().string());
    } catch (const kimi::Error&) {
    }
  }
  EXPECT_GT(n_files, 0u);
  EXPECT_GT(n_ok, 0u);  // the corpus also keeps a few valid files
}

TEST(GgufValue, ToStringEscapes) {
  EXPECT_EQ(Value::str("a\xff\xc3\xa9\x01\t").to_string(), "\"a\\xff\xc3\xa9\\x01\\t\"");
  EXPECT_EQ(Value::str("\xed\xa0\x80").to_string(), "\"\\xed\\xa0\\x80\"");  // surrogate: not valid UTF-8
  EXPECT_EQ(Value::str("\xf0\x9f\x98\x80").to_string(), "\"\xf0\x9f\x98\x80\"");
  EXPECT_EQ(Value::arr_str({std::string(70, 'z')}).to_string(), "[\"" + std::string(64, 'z') + "\"...(70 bytes)]");
  EXPECT_EQ(Value::u16(65535).to_string(), "65535");
  EXPECT_EQ(Value::i32(-3).to_string(), "-3");
  EXPECT_EQ(Value::boolean(false).to_string(), "false");
  EXPECT_EQ(Value::arr_u32({}).to_string(), "[]");
  EXPECT_EQ(Value::arr_f32({0.1f, 2}).to_string(1), "[0.1, ...] (2 x float32)");
  EXPECT_EQ(Value::arr_i32({1, 2, 3}).to_string(0), "[...] (3 x int32)");
  EXPECT_EQ(std::string(value_type_name(ValueType::FLOAT64)), "float64");
}

TEST(GgufWriter, CopyingASplitSetDropsItsSplitKeys) {
  TempDir td;
  {
    Writer w(td.file("s.gguf"), {.alignment = 32, .split_max_bytes = 32});
    w.add_kv("general.architecture", Value::str("kimi-k3"));
    w.add_tensor("a", GgmlType::F32, {8});
    w.add_tensor("b", GgmlType::F32, {8});
    w.begin();
    float d[8] = {1, 2, 3, 4, 5, 6, 7, 8};
    w.write_tensor_data("a", d, sizeof d);
    w.write_tensor_data("b", d, sizeof d);
    w.finish();
  }
  auto src = Reader::open(td.file("s-00001-of-00002.gguf"));
  ASSERT_TRUE(src->has("split.count"));
  {
    Writer w(td.file("one.gguf"));
    for (const auto& kv : src->kvs()) w.add_kv(kv.key, kv.value);
    w.add_kv("general.alignment", Value::u32(32));  // equal to the options: accepted, not written
    for (const auto& t : src->tensors())
      w.add_tensor(t.name, t.type, std::vector<int64_t>(t.ne.begin(), t.ne.begin() + t.n_dims));
    w.begin();
    for (const auto& t : src->tensors()) w.write_tensor_data(t.name, t.data, t.nbytes);
    w.finish();
  }
  auto r = Reader::open(td.file("one.gguf"));
  EXPECT_EQ(r->n_files(), 1u);
  EXPECT_FALSE(r->has("split.count"));
  EXPECT_FALSE(r->has("split.no"));
  EXPECT_FALSE(r->has("general.alignment"));
  EXPECT_EQ(r->kvs().size(), 1u);
  EXPECT_EQ(std::memcmp(r->tensor("b").data, src->tensor("b").data, 32), 0);
}
