// safetensors reader/writer: round trips, sharded checkpoints and one test per malformed input.
// The expected file bytes are derived independently here (manual little-endian length, manual
// JSON header inspection), never from the reader under test.
#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <functional>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <vector>

#include "io/safetensors.h"
#include "test_util.h"
#include "util/error.h"

namespace fs = std::filesystem;
using kimi::st::Dtype;
using kimi::test::TempDir;

namespace {

// True when PATH's directory holds a temp of PATH (PATH.kimi-tmp.*, or the old fixed PATH.tmp).
bool has_temp(const std::string& path) {
  const std::string base = fs::path(path).filename().string();
  for (const auto& e : fs::directory_iterator(fs::path(path).parent_path())) {
    const std::string n = e.path().filename().string();
    if (n.rfind(base + ".kimi-tmp.", 0) == 0 || n == base + ".tmp") return true;
  }
  return false;
}

// Runs fn, expects a kimi::Error whose message contains every one of `parts`.
void expect_error(const std::function<void()>& fn, const std::vector<std::string>& parts) {
  try {
    fn();
  } catch (const kimi::Error& e) {
    std::string msg = e.what();
    for (const auto& p : parts) EXPECT_NE(msg.find(p), std::string::npos) << "message: " << msg << "\nmissing: " << p;
    return;
  } catch (const std::exception& e) {
    ADD_FAILURE() << "expected kimi::Error, got other exception: " << e.what();
    return;
  }
  ADD_FAILURE() << "expected kimi::Error containing '" << (parts.empty() ? "" : parts[0]) << "', nothing thrown";
}

// 8-byte little-endian length N, header text, then `data`.
std::vector<uint8_t> make_file(const std::string& header, const std::vector<uint8_t>& data, uint64_t n_override = 0,
                               bool use_override = false) {
  uint64_t n = use_override ? n_override : header.size();
  std::vector<uint8_t> b;
  for (int i = 0; i < 8; ++i) b.push_back(static_cast<uint8_t>((n >> (8 * i)) & 0xff));
  b.insert(b.end(), header.begin(), header.end());
  b.insert(b.end(), data.begin(), data.end());
  return b;
}

std::vector<uint8_t> bytes(size_t n, uint8_t start = 1) {
  std::vector<uint8_t> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = static_cast<uint8_t>(start + i * 7);
  return v;
}

std::vector<kimi::st::Tensor> parse(const std::vector<uint8_t>& b, const std::string& label = "bad.safetensors") {
  return kimi::st::parse_buffer(b.data(), b.size(), label);
}

void expect_parse_error(const std::string& header, size_t data_len, std::vector<std::string> parts) {
  auto b = make_file(header, bytes(data_len));
  parts.insert(parts.begin(), "bad.safetensors");
  expect_error([&] { parse(b); }, parts);
}

struct DtypeCase {
  Dtype d;
  const char* name;
  size_t size;
};
const DtypeCase kAll[] = {
    {Dtype::BOOL, "BOOL", 1},       {Dtype::U8, "U8", 1},           {Dtype::I8, "I8", 1},
    {Dtype::I16, "I16", 2},         {Dtype::U16, "U16", 2},         {Dtype::F16, "F16", 2},
    {Dtype::BF16, "BF16", 2},       {Dtype::I32, "I32", 4},         {Dtype::U32, "U32", 4},
    {Dtype::F32, "F32", 4},         {Dtype::F64, "F64", 8},         {Dtype::I64, "I64", 8},
    {Dtype::U64, "U64", 8},         {Dtype::F8_E4M3, "F8_E4M3", 1}, {Dtype::F8_E5M2, "F8_E5M2", 1},
    {Dtype::F8_E8M0, "F8_E8M0", 1},
};

uint64_t read_u64(const std::string& s) {
  uint64_t v = 0;
  for (int i = 7; i >= 0; --i) v = (v << 8) | static_cast<uint8_t>(s[i]);
  return v;
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// dtypes

TEST(Safetensors, DtypeTable) {
  for (const auto& c : kAll) {
    EXPECT_STREQ(kimi::st::dtype_name(c.d), c.name);
    EXPECT_EQ(kimi::st::dtype_size(c.d), c.size) << c.name;
    Dtype d = Dtype::BOOL;
    ASSERT_TRUE(kimi::st::dtype_from_name(c.name, &d)) << c.name;
    EXPECT_EQ(d, c.d);
  }
  Dtype d;
  EXPECT_FALSE(kimi::st::dtype_from_name("bf16", &d));
  EXPECT_FALSE(kimi::st::dtype_from_name("C64", &d));
  EXPECT_FALSE(kimi::st::dtype_from_name("", &d));
}

// ---------------------------------------------------------------------------------------------
// Round trips

TEST(Safetensors, RoundTripEveryDtype) {
  TempDir td;
  const std::string path = td.file("all.safetensors");
  std::mt19937 rng(42);
  struct Want {
    std::string name;
    Dtype d;
    std::vector<int64_t> shape;
    std::vector<uint8_t> data;
  };
  std::vector<Want> want;
  for (const auto& c : kAll) {
    std::vector<int64_t> shape = {2, 3};
    std::vector<uint8_t> data(6 * c.size);
    for (auto& x : data) x = static_cast<uint8_t>(rng());
    want.push_back({std::string("t.") + c.name, c.d, shape, data});
  }
  want.push_back({"scalar", Dtype::F32, {}, {0, 0, 0x80, 0x3f}});    // 1.0f
  want.push_back({"empty", Dtype::BF16, {0, 4}, {}});                 // no bytes
  want.push_back({"vec3", Dtype::U8, {3}, {9, 8, 7}});                // odd size: later tensors unaligned
  want.push_back({"after_odd", Dtype::F64, {1, 1}, bytes(8, 100)});

  {
    kimi::st::Writer w(path);
    w.add_metadata("format", "pt");
    w.add_metadata("note", "round trip");
    uint64_t total = 0;
    for (const auto& t : want) {
      w.add_tensor(t.name, t.d, t.shape);
      total += t.data.size();
    }
    EXPECT_EQ(w.data_bytes(), total);
    w.begin();
    for (const auto& t : want) {
      // write in two chunks where possible to exercise chunked writes
      size_t half = t.data.size() / 2;
      w.write(t.name, t.data.data(), half);
      w.write(t.name, t.data.data() + half, t.data.size() - half);
    }
    w.finish();
  }
  EXPECT_FALSE(has_temp(path));

  // Independent check of the byte layout.
  std::string raw = kimi::test::read_file(path);
  ASSERT_GE(raw.size(), 8u);
  uint64_t n = read_u64(raw);
  EXPECT_EQ(n % 8, 0u) << "header must be padded to a multiple of 8";
  std::string header = raw.substr(8, n);
  size_t last = header.find_last_not_of(' ');
  ASSERT_NE(last, std::string::npos);
  EXPECT_EQ(header[last], '}');
  EXPECT_LT(header.size() - last - 1, 8u) << "at most 7 padding spaces";
  auto hj = nlohmann::json::parse(header);
  EXPECT_EQ(hj["__metadata__"]["format"], "pt");
  uint64_t off = 0;
  for (const auto& t : want) {  // declaration order == data order
    const auto& e = hj.at(t.name);
    EXPECT_EQ(e["dtype"], kimi::st::dtype_name(t.d));
    EXPECT_EQ(e["shape"].get<std::vector<int64_t>>(), t.shape);
    EXPECT_EQ(e["data_offsets"][0].get<uint64_t>(), off) << t.name;
    EXPECT_EQ(e["data_offsets"][1].get<uint64_t>(), off + t.data.size()) << t.name;
    if (!t.data.empty()) {  // memcmp with a null pointer (empty tensor) is UB even for size 0
      EXPECT_EQ(0, std::memcmp(raw.data() + 8 + n + off, t.data.data(), t.data.size())) << t.name;
    }
    off += t.data.size();
  }
  EXPECT_EQ(raw.size(), 8 + n + off);

  // Reader.
  auto ck = kimi::st::Checkpoint::open(path);
  EXPECT_EQ(ck->n_files(), 1u);
  EXPECT_EQ(ck->names().size(), want.size());
  EXPECT_TRUE(std::is_sorted(ck->names().begin(), ck->names().end()));
  EXPECT_EQ(ck->metadata().at("format"), "pt");
  EXPECT_EQ(ck->metadata().at("note"), "round trip");
  for (const auto& t : want) {
    const auto& r = ck->get(t.name);
    EXPECT_EQ(r.name, t.name);
    EXPECT_EQ(r.dtype, t.d) << t.name;
    EXPECT_EQ(r.shape, t.shape) << t.name;
    EXPECT_EQ(r.nbytes, t.data.size()) << t.name;
    EXPECT_EQ(r.file, path);
    if (!t.data.empty()) {
      EXPECT_EQ(0, std::memcmp(r.data, t.data.data(), t.data.size())) << t.name;
    }
    ck->release(r);  // must be harmless
  }
  EXPECT_EQ(ck->get("scalar").numel(), 1);
  EXPECT_EQ(ck->get("empty").numel(), 0);
  EXPECT_EQ(ck->get("t.BF16").shape_string(), "[2, 3]");
  EXPECT_EQ(ck->get("scalar").shape_string(), "[]");
  float one;
  std::memcpy(&one, ck->get("scalar").data, 4);
  EXPECT_EQ(one, 1.0f);
  EXPECT_EQ(ck->find("nope"), nullptr);
  expect_error([&] { ck->get("nope"); }, {"tensor 'nope' not found", path});
}

TEST(Safetensors, OpenDirectoryWithSingleFile) {
  TempDir td;
  {
    kimi::st::Writer w(td.file("model.safetensors"));
    w.add_tensor("a", Dtype::I32, {2});
    w.begin();
    int32_t v[2] = {-5, 77};
    w.write("a", v, sizeof v);
    w.finish();
  }
  auto ck = kimi::st::Checkpoint::open(td.path);
  ASSERT_EQ(ck->names(), std::vector<std::string>{"a"});
  int32_t v[2];
  std::memcpy(v, ck->get("a").data, 8);
  EXPECT_EQ(v[0], -5);
  EXPECT_EQ(v[1], 77);
  EXPECT_TRUE(ck->metadata().empty());
}

TEST(Safetensors, OpenDirectoryOnlyOtherName) {
  TempDir td;
  {
    kimi::st::Writer w(td.file("weights.safetensors"));
    w.add_tensor("x", Dtype::U8, {1});
    w.begin();
    uint8_t b = 3;
    w.write("x", &b, 1);
    w.finish();
  }
  auto ck = kimi::st::Checkpoint::open(td.path);
  EXPECT_EQ(ck->get("x").data[0], 3);
}

TEST(Safetensors, OpenDirectoryErrors) {
  TempDir td;
  expect_error([&] { kimi::st::Checkpoint::open(td.path); }, {td.path, "no model.safetensors.index.json"});
  for (const char* f : {"a.safetensors", "b.safetensors"}) {
    kimi::st::Writer w(td.file(f));
    w.begin();
    w.finish();
  }
  expect_error([&] { kimi::st::Checkpoint::open(td.path); }, {"a.safetensors", "b.safetensors", "several"});
  expect_error([&] { kimi::st::Checkpoint::open(td.file("missing.safetensors")); }, {"missing.safetensors"});
}

TEST(Safetensors, ParseBufferHandBuilt) {
  // Entries out of order in the JSON; reader must go by offsets.
  std::string h = R"({"b":{"dtype":"U8","shape":[2],"data_offsets":[4,6]},)"
                  R"("__metadata__":{"k":"v"},"a":{"dtype":"F16","shape":[2],"data_offsets":[0,4]}})";
  auto data = bytes(6);
  auto b = make_file(h, data);
  auto ts = parse(b, "hand.safetensors");
  ASSERT_EQ(ts.size(), 2u);
  for (const auto& t : ts) {
    EXPECT_EQ(t.file, "hand.safetensors");
    if (t.name == "a") {
      EXPECT_EQ(t.dtype, Dtype::F16);
      EXPECT_EQ(t.data, b.data() + 8 + h.size());
      EXPECT_EQ(t.nbytes, 4u);
    } else {
      ASSERT_EQ(t.name, "b");
      EXPECT_EQ(t.data, b.data() + 8 + h.size() + 4);
      EXPECT_EQ(t.nbytes, 2u);
      EXPECT_EQ(t.data[0], data[4]);
    }
  }
  // Header with trailing padding spaces and an empty tensor list.
  auto e = make_file("{}      ", {});
  EXPECT_TRUE(parse(e).empty());
  // Metadata-only header.
  EXPECT_TRUE(parse(make_file(R"({"__metadata__":{}})", {})).empty());
}

// ---------------------------------------------------------------------------------------------
// Malformed single files (one test per rule)

TEST(SafetensorsMalformed, TooSmall) {
  std::vector<uint8_t> b = {1, 0, 0};
  expect_error([&] { parse(b); }, {"bad.safetensors", "3 bytes", "too small"});
  expect_error([&] { kimi::st::parse_buffer(nullptr, 0, "empty.st"); }, {"empty.st", "0 bytes"});
}

TEST(SafetensorsMalformed, HeaderLengthPastEnd) {
  auto b = make_file("{}", {}, 3, true);
  expect_error([&] { parse(b); }, {"bad.safetensors", "header length 3", "past the end"});
  auto c = make_file("{}", {}, UINT64_MAX, true);
  expect_error([&] { parse(c); }, {"bad.safetensors", "exceeds the limit"});
}

TEST(SafetensorsMalformed, HeaderLengthOverLimit) {
  auto b = make_file("{}", {}, 100000001, true);
  expect_error([&] { parse(b); }, {"bad.safetensors", "100000001", "exceeds the limit of 100000000"});
}

TEST(SafetensorsMalformed, InvalidJson) {
  expect_parse_error("{\"a\":\n {\"dtype\": \"U8\",, }}", 0, {"invalid JSON", "line 2", "column"});
  expect_parse_error("{\"a\": tru}", 0, {"invalid JSON", "line 1"});
}

TEST(SafetensorsMalformed, NotAnObject) {
  expect_parse_error("[1, 2, 3]", 0, {"does not start with '{'"});
  expect_parse_error(" {}", 0, {"does not start with '{'"});
}

TEST(SafetensorsMalformed, EntryNotObject) {
  expect_parse_error(R"({"w":[1,2]})", 0, {"tensor 'w'", "must be an object"});
}

TEST(SafetensorsMalformed, MissingFields) {
  expect_parse_error(R"({"w":{"shape":[1],"data_offsets":[0,1]}})", 1, {"tensor 'w'", "missing 'dtype'"});
  expect_parse_error(R"({"w":{"dtype":"U8","data_offsets":[0,1]}})", 1, {"tensor 'w'", "missing 'shape'"});
  expect_parse_error(R"({"w":{"dtype":"U8","shape":[1]}})", 1, {"tensor 'w'", "missing 'data_offsets'"});
  expect_parse_error(R"({"w":{"dtype":"U8","shape":[1],"data_offsets":[0,1],"extra":1}})", 1,
                     {"tensor 'w'", "unexpected field 'extra'"});
}

TEST(SafetensorsMalformed, DtypeWrongType) {
  expect_parse_error(R"({"w":{"dtype":4,"shape":[1],"data_offsets":[0,1]}})", 1, {"tensor 'w'", "'dtype' must be a string"});
}

TEST(SafetensorsMalformed, UnknownDtype) {
  expect_parse_error(R"({"w":{"dtype":"F128","shape":[1],"data_offsets":[0,16]}})", 16,
                     {"tensor 'w'", "unknown dtype 'F128'"});
  expect_parse_error(R"({"w":{"dtype":"bf16","shape":[1],"data_offsets":[0,2]}})", 2, {"tensor 'w'", "unknown dtype 'bf16'"});
}

TEST(SafetensorsMalformed, ShapeWrongType) {
  expect_parse_error(R"({"w":{"dtype":"U8","shape":3,"data_offsets":[0,3]}})", 3, {"tensor 'w'", "'shape' must be an array"});
  expect_parse_error(R"({"w":{"dtype":"U8","shape":[1.5],"data_offsets":[0,1]}})", 1,
                     {"tensor 'w'", "shape[0] must be a non-negative integer"});
  expect_parse_error(R"({"w":{"dtype":"U8","shape":["2"],"data_offsets":[0,2]}})", 2,
                     {"tensor 'w'", "shape[0] must be a non-negative integer"});
}

TEST(SafetensorsMalformed, NegativeDim) {
  expect_parse_error(R"({"w":{"dtype":"U8","shape":[2,-1],"data_offsets":[0,2]}})", 2,
                     {"tensor 'w'", "shape[1] must be a non-negative integer", "-1"});
}

TEST(SafetensorsMalformed, ShapeOverflow) {
  expect_parse_error(R"({"w":{"dtype":"F32","shape":[4294967296,4294967296],"data_offsets":[0,4]}})", 4,
                     {"tensor 'w'", "overflows"});
  // numel fits, numel*size does not
  expect_parse_error(R"({"w":{"dtype":"F64","shape":[4611686018427387904],"data_offsets":[0,8]}})", 8,
                     {"tensor 'w'", "overflows"});
  expect_parse_error(R"({"w":{"dtype":"U8","shape":[18446744073709551615],"data_offsets":[0,1]}})", 1,
                     {"tensor 'w'", "too large"});
  // A zero dimension makes the product 0 regardless of the other dimensions.
  auto ok = make_file(R"({"w":{"dtype":"F32","shape":[0,4294967296,4294967296],"data_offsets":[0,0]}})", {});
  auto ts = parse(ok);
  ASSERT_EQ(ts.size(), 1u);
  EXPECT_EQ(ts[0].nbytes, 0u);
}

TEST(SafetensorsMalformed, OffsetsWrongType) {
  expect_parse_error(R"({"w":{"dtype":"U8","shape":[1],"data_offsets":[0]}})", 1, {"tensor 'w'", "'data_offsets' must be"});
  expect_parse_error(R"({"w":{"dtype":"U8","shape":[1],"data_offsets":[0,1,2]}})", 1, {"tensor 'w'", "'data_offsets' must be"});
  expect_parse_error(R"({"w":{"dtype":"U8","shape":[1],"data_offsets":{"a":0}}})", 1, {"tensor 'w'", "'data_offsets' must be"});
  expect_parse_error(R"({"w":{"dtype":"U8","shape":[1],"data_offsets":[-1,0]}})", 1, {"tensor 'w'", "non-negative integers"});
  expect_parse_error(R"({"w":{"dtype":"U8","shape":[1],"data_offsets":[0,1.0]}})", 1, {"tensor 'w'", "non-negative integers"});
}

TEST(SafetensorsMalformed, OffsetsReversed) {
  expect_parse_error(R"({"w":{"dtype":"U8","shape":[0],"data_offsets":[2,1]}})", 2, {"tensor 'w'", "BEGIN > END"});
}

TEST(SafetensorsMalformed, OffsetsPastEnd) {
  expect_parse_error(R"({"w":{"dtype":"U8","shape":[4],"data_offsets":[0,4]}})", 3, {"tensor 'w'", "past the end", "3 bytes"});
  expect_parse_error(R"({"w":{"dtype":"U8","shape":[1],"data_offsets":[18446744073709551615,18446744073709551615]}})", 1,
                     {"tensor 'w'", "past the end"});
}

TEST(SafetensorsMalformed, SizeMismatch) {
  expect_parse_error(R"({"w":{"dtype":"BF16","shape":[2,3],"data_offsets":[0,6]}})", 6,
                     {"tensor 'w'", "span 6 bytes", "[2, 3]", "needs 12 bytes"});
  expect_parse_error(R"({"w":{"dtype":"F32","shape":[],"data_offsets":[0,2]}})", 2, {"tensor 'w'", "needs 4 bytes"});
}

TEST(SafetensorsMalformed, Gap) {
  expect_parse_error(R"({"a":{"dtype":"U8","shape":[2],"data_offsets":[0,2]},"b":{"dtype":"U8","shape":[2],"data_offsets":[3,5]}})",
                     5, {"tensor 'b'", "gap of 1 bytes", "tensor 'a'"});
}

TEST(SafetensorsMalformed, GapAtStart) {
  expect_parse_error(R"({"a":{"dtype":"U8","shape":[2],"data_offsets":[1,3]}})", 3, {"tensor 'a'", "gap of 1 bytes", "start"});
}

TEST(SafetensorsMalformed, Overlap) {
  expect_parse_error(R"({"a":{"dtype":"U8","shape":[3],"data_offsets":[0,3]},"b":{"dtype":"U8","shape":[2],"data_offsets":[2,4]}})",
                     4, {"tensor 'b'", "overlap", "tensor 'a'"});
  // identical ranges
  expect_parse_error(R"({"a":{"dtype":"U8","shape":[2],"data_offsets":[0,2]},"b":{"dtype":"U8","shape":[2],"data_offsets":[0,2]}})",
                     2, {"overlap"});
}

TEST(SafetensorsMalformed, TrailingBytes) {
  expect_parse_error(R"({"a":{"dtype":"U8","shape":[2],"data_offsets":[0,2]}})", 5, {"3 trailing bytes", "tensor 'a'"});
  expect_parse_error(R"({})", 4, {"4 bytes", "no tensor data"});
}

TEST(SafetensorsMalformed, DuplicateName) {
  expect_parse_error(R"({"a":{"dtype":"U8","shape":[1],"data_offsets":[0,1]},"a":{"dtype":"U8","shape":[1],"data_offsets":[1,2]}})",
                     2, {"tensor 'a'", "duplicate tensor name"});
  expect_parse_error(R"({"a":{"dtype":"U8","dtype":"I8","shape":[1],"data_offsets":[0,1]}})", 1,
                     {"tensor 'a'", "duplicate key 'dtype'"});
  expect_parse_error(R"({"__metadata__":{"f":"a","f":"b"}})", 0, {"duplicate key 'f' in __metadata__"});
}

TEST(SafetensorsMalformed, MetadataNotStrings) {
  expect_parse_error(R"({"__metadata__":{"format":1}})", 0, {"__metadata__", "'format'", "must be a string"});
  expect_parse_error(R"({"__metadata__":["pt"]})", 0, {"__metadata__", "must be an object"});
  expect_parse_error(R"({"__metadata__":{"nested":{"a":"b"}}})", 0, {"__metadata__", "'nested'"});
}

// ---------------------------------------------------------------------------------------------
// Writer misuse

TEST(SafetensorsWriter, TempRemovedWithoutFinish) {
  TempDir td;
  const std::string path = td.file("x.safetensors");
  {
    kimi::st::Writer w(path);
    w.add_tensor("a", Dtype::U8, {4});
    w.begin();
    uint8_t b[2] = {1, 2};
    w.write("a", b, 2);
    EXPECT_TRUE(has_temp(path));
  }
  EXPECT_FALSE(has_temp(path));
  EXPECT_FALSE(fs::exists(path));
}

TEST(SafetensorsWriter, WrongTotalsThrow) {
  TempDir td;
  const std::string path = td.file("x.safetensors");
  kimi::st::Writer w(path);
  w.add_tensor("a", Dtype::F32, {2});
  w.add_tensor("e", Dtype::F32, {0});
  w.add_tensor("b", Dtype::U8, {3});
  w.begin();
  std::vector<uint8_t> buf(16, 0);
  expect_error([&] { w.write("b", buf.data(), 3); }, {"tensor 'b'", "'a' is next"});
  expect_error([&] { w.write("a", buf.data(), 9); }, {"tensor 'a'", "9 bytes", "8 of 8 remain"});
  expect_error([&] { w.write("zz", buf.data(), 1); }, {"undeclared tensor 'zz'"});
  w.write("a", buf.data(), 8);
  w.write("e", buf.data(), 0);  // empty tensor: no-op
  expect_error([&] { w.finish(); }, {"tensor 'b'", "0 of 3 bytes"});
  w.write("b", buf.data(), 2);
  expect_error([&] { w.finish(); }, {"tensor 'b'", "2 of 3 bytes"});
  w.write("b", buf.data(), 1);
  expect_error([&] { w.write("b", buf.data(), 1); }, {"past the end"});
  w.finish();
  EXPECT_TRUE(fs::exists(path));
  auto ck = kimi::st::Checkpoint::open(path);
  EXPECT_EQ(ck->names().size(), 3u);
}

TEST(SafetensorsWriter, DeclarationErrors) {
  TempDir td;
  kimi::st::Writer w(td.file("x.safetensors"));
  w.add_tensor("a", Dtype::U8, {1});
  expect_error([&] { w.add_tensor("a", Dtype::U8, {1}); }, {"'a' declared twice"});
  expect_error([&] { w.add_tensor("n", Dtype::U8, {2, -1}); }, {"tensor 'n'", "negative"});
  expect_error([&] { w.add_tensor("__metadata__", Dtype::U8, {1}); }, {"reserved"});
  expect_error([&] { w.add_tensor("big", Dtype::F64, {INT64_MAX, 4}); }, {"tensor 'big'", "overflow"});
  expect_error([&] { w.finish(); }, {"without begin"});
  w.begin();
  expect_error([&] { w.add_tensor("c", Dtype::U8, {1}); }, {"after begin"});
  expect_error([&] { w.begin(); }, {"twice"});
}

TEST(SafetensorsWriter, UnwritableDirectory) {
  kimi::st::Writer w("/nonexistent-dir-kimi/x.safetensors");
  expect_error([&] { w.begin(); }, {"/nonexistent-dir-kimi/x.safetensors.kimi-tmp."});
}

// ---------------------------------------------------------------------------------------------
// Sharded checkpoints

namespace {

void write_shard(const std::string& path, const std::vector<std::pair<std::string, uint8_t>>& tensors,
                 const std::string& fmt = "pt") {
  kimi::st::Writer w(path);
  w.add_metadata("format", fmt);
  for (const auto& [name, v] : tensors) w.add_tensor(name, Dtype::U8, {2});
  w.begin();
  for (const auto& [name, v] : tensors) {
    uint8_t b[2] = {v, static_cast<uint8_t>(v + 1)};
    w.write(name, b, 2);
  }
  w.finish();
}

void write_index(const std::string& dir, const nlohmann::json& weight_map) {
  nlohmann::json j;
  j["metadata"] = {{"total_size", 8}};
  j["weight_map"] = weight_map;
  kimi::test::write_file(dir + "/model.safetensors.index.json", j.dump(2));
}

const char* S1 = "model-00001-of-00002.safetensors";
const char* S2 = "model-00002-of-00002.safetensors";

void good_sharded(const std::string& dir) {
  write_shard(dir + "/" + S1, {{"layers.0.w", 10}, {"layers.1.w", 20}}, "first");
  write_shard(dir + "/" + S2, {{"embed", 30}, {"head", 40}}, "second");
  write_index(dir, {{"layers.0.w", S1}, {"layers.1.w", S1}, {"embed", S2}, {"head", S2}});
}

}  // namespace

TEST(SafetensorsSharded, OpenWithIndex) {
  TempDir td;
  good_sharded(td.path);
  for (const std::string& p : {td.path, td.file("model.safetensors.index.json")}) {
    auto ck = kimi::st::Checkpoint::open(p);
    EXPECT_EQ(ck->n_files(), 2u);
    EXPECT_EQ(ck->names(), (std::vector<std::string>{"embed", "head", "layers.0.w", "layers.1.w"}));
    EXPECT_EQ(ck->metadata().at("format"), "first");
    const std::pair<const char*, int> want[] = {{"layers.0.w", 10}, {"layers.1.w", 20}, {"embed", 30}, {"head", 40}};
    for (const auto& [name, v] : want) {
      const auto& t = ck->get(name);
      EXPECT_EQ(t.data[0], v) << name;
      EXPECT_EQ(t.data[1], v + 1) << name;
      EXPECT_EQ(fs::path(t.file).filename().string(), v < 30 ? S1 : S2) << name;
      ck->release(t);
    }
    // Pages released with MADV_DONTNEED on a read-only shared mapping read back unchanged.
    EXPECT_EQ(ck->get("head").data[0], 40);
  }
}

TEST(SafetensorsSharded, MissingShard) {
  TempDir td;
  write_shard(td.file(S1), {{"a", 1}});
  write_index(td.path, {{"a", S1}, {"b", S2}});
  expect_error([&] { kimi::st::Checkpoint::open(td.path); }, {"model.safetensors.index.json", S2, "not found"});
}

TEST(SafetensorsSharded, TensorInIndexNotInShard) {
  TempDir td;
  write_shard(td.file(S1), {{"a", 1}});
  write_shard(td.file(S2), {{"b", 1}});
  write_index(td.path, {{"a", S1}, {"b", S2}, {"c", S2}});
  expect_error([&] { kimi::st::Checkpoint::open(td.path); }, {"tensor 'c'", S2, "does not contain it"});
}

TEST(SafetensorsSharded, TensorInShardNotInIndex) {
  TempDir td;
  write_shard(td.file(S1), {{"a", 1}, {"extra", 2}});
  write_shard(td.file(S2), {{"b", 1}});
  write_index(td.path, {{"a", S1}, {"b", S2}});
  expect_error([&] { kimi::st::Checkpoint::open(td.path); }, {S1, "tensor 'extra'", "not in model.safetensors.index.json"});
}

TEST(SafetensorsSharded, TensorInWrongShard) {
  TempDir td;
  write_shard(td.file(S1), {{"a", 1}, {"b", 2}});
  write_shard(td.file(S2), {{"c", 1}});
  write_index(td.path, {{"a", S1}, {"b", S2}, {"c", S2}});
  expect_error([&] { kimi::st::Checkpoint::open(td.path); }, {"tensor 'b'", S1, "maps it to", S2});
}

TEST(SafetensorsSharded, TensorInTwoShards) {
  TempDir td;
  write_shard(td.file(S1), {{"a", 1}});
  write_shard(td.file(S2), {{"a", 2}, {"b", 3}});
  write_index(td.path, {{"a", S1}, {"b", S2}});
  expect_error([&] { kimi::st::Checkpoint::open(td.path); }, {"tensor 'a'", S2, "maps it to", S1});
}

TEST(SafetensorsSharded, WeightMapNotObject) {
  TempDir td;
  write_shard(td.file(S1), {{"a", 1}});
  write_index(td.path, nlohmann::json::array({"a", S1}));
  expect_error([&] { kimi::st::Checkpoint::open(td.path); }, {"model.safetensors.index.json", "'weight_map' must be an object"});
  kimi::test::write_file(td.file("model.safetensors.index.json"), R"({"metadata":{}})");
  expect_error([&] { kimi::st::Checkpoint::open(td.path); }, {"missing 'weight_map'"});
  write_index(td.path, {{"a", 5}});
  expect_error([&] { kimi::st::Checkpoint::open(td.path); }, {"tensor 'a'", "must be a string"});
  write_index(td.path, {{"a", "../x.safetensors"}});
  expect_error([&] { kimi::st::Checkpoint::open(td.path); }, {"tensor 'a'", "invalid shard file name"});
}

TEST(SafetensorsSharded, IndexInvalidJson) {
  TempDir td;
  write_shard(td.file(S1), {{"a", 1}});
  kimi::test::write_file(td.file("model.safetensors.index.json"), "{\n  \"weight_map\": {\n    \"a\": }\n}");
  expect_error([&] { kimi::st::Checkpoint::open(td.path); },
               {"model.safetensors.index.json", "invalid JSON", "line 3", "column"});
  kimi::test::write_file(td.file("model.safetensors.index.json"),
                         std::string(R"({"weight_map":{"a":")") + S1 + R"(","a":")" + S1 + R"("}})");
  expect_error([&] { kimi::st::Checkpoint::open(td.path); }, {"tensor 'a'", "more than once in weight_map"});
  kimi::test::write_file(td.file("model.safetensors.index.json"),
                         std::string(R"({"weight_map":{"a":")") + S1 + R"("},"weight_map":{}})");
  expect_error([&] { kimi::st::Checkpoint::open(td.path); }, {"duplicate key 'weight_map'"});
}

TEST(SafetensorsSharded, CorruptShardNamesFile) {
  TempDir td;
  good_sharded(td.path);
  // truncate the second shard by one byte: tiling no longer reaches the end
  std::string raw = kimi::test::read_file(td.file(S2));
  kimi::test::write_file(td.file(S2), raw.substr(0, raw.size() - 1));
  expect_error([&] { kimi::st::Checkpoint::open(td.path); }, {S2, "tensor 'head'", "past the end"});
}

// Corrupted variants of a valid file (byte flips, truncation, length changes) must either parse
// with every tensor inside the buffer, or throw kimi::Error; never anything else.
TEST(SafetensorsMalformed, RandomCorruptionNeverEscapes) {
  std::string h = R"({"__metadata__":{"format":"pt"},"a":{"dtype":"F32","shape":[2,2],"data_offsets":[0,16]},)"
                  R"("b":{"dtype":"U8","shape":[3],"data_offsets":[16,19]},"c":{"dtype":"BF16","shape":[],"data_offsets":[19,21]}})";
  const auto good = make_file(h, bytes(21));
  ASSERT_EQ(parse(good).size(), 3u);
  std::mt19937 rng(7);
  int ok = 0, err = 0;
  for (int iter = 0; iter < 3000; ++iter) {
    auto b = good;
    int kind = iter % 3;
    if (kind == 0) {  // flip 1-3 bytes
      int k = 1 + static_cast<int>(rng() % 3);
      for (int i = 0; i < k; ++i) b[rng() % b.size()] ^= static_cast<uint8_t>(1u << (rng() % 8));
    } else if (kind == 1) {  // truncate
      b.resize(rng() % b.size());
    } else {  // change the declared header length
      uint64_t n = h.size() + (static_cast<int64_t>(rng() % 17) - 8);
      for (int i = 0; i < 8; ++i) b[i] = static_cast<uint8_t>(n >> (8 * i));
    }
    try {
      auto ts = kimi::st::parse_buffer(b.data(), b.size(), "fuzz");
      for (const auto& t : ts) {
        ASSERT_GE(t.data, b.data() + 8);
        ASSERT_LE(t.data + t.nbytes, b.data() + b.size());
      }
      ++ok;
    } catch (const kimi::Error& e) {
      ASSERT_EQ(std::string(e.what()).rfind("fuzz: ", 0), 0u) << e.what();
      ++err;
    } catch (const std::exception& e) {
      FAIL() << "non-kimi exception: " << e.what();
    }
  }
  EXPECT_GT(err, 1000);  // most corruptions must be caught
}
