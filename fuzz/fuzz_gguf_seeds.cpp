// Writes a handful of small valid GGUF files (made by the Writer under test) as the fuzz seed
// corpus: fuzz_gguf_seeds DIR
#include <cstdio>
#include <string>
#include <vector>

#include "io/gguf.h"
#include "util/error.h"

using namespace kimi;
using namespace kimi::gguf;

static void write_all(Writer& w, const std::vector<std::pair<std::string, size_t>>& sizes) {
  w.begin();
  std::vector<uint8_t> buf;
  uint8_t x = 1;
  for (const auto& [name, n] : sizes) {
    buf.resize(n);
    for (auto& b : buf) b = x += 37;
    w.write_tensor_data(name, buf.data(), buf.size());
  }
  w.finish();
}

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: fuzz_gguf_seeds DIR\n");
    return 2;
  }
  const std::string dir = argv[1];
  try {
    {  // formats-quant.md §1.9
      Writer w(dir + "/seed-hexdump.gguf");
      w.add_kv("general.architecture", Value::str("kimi-k3"));
      w.add_kv("general.file_type", Value::u32(1));
      w.add_tensor("output_norm.weight", GgmlType::F32, {4, 2});
      write_all(w, {{"output_norm.weight", 32}});
    }
    {  // every value type, arrays of each type, no tensors
      Writer w(dir + "/seed-values.gguf");
      w.add_kv("general.architecture", Value::str("kimi-k3"));
      w.add_kv("u8", Value::u8(7));
      w.add_kv("u16", Value::u16(700));
      w.add_kv("i32", Value::i32(-7));
      w.add_kv("u64", Value::u64(1ull << 40));
      w.add_kv("f32", Value::f32(0.5f));
      w.add_kv("b", Value::boolean(true));
      w.add_kv("tok", Value::arr_str({"a", "bc", ""}));
      w.add_kv("ai", Value::arr_i32({1, -2}));
      w.add_kv("au", Value::arr_u32({3, 4}));
      w.add_kv("af", Value::arr_f32({1.5f}));
      w.add_kv("ab", Value::arr_bool({true, false}));
      for (uint32_t t : {1u, 3u, 11u, 12u}) {
        Value v;
        v.type = static_cast<ValueType>(t);
        v.i = -3;
        v.f = 2.25;
        w.add_kv("t" + std::to_string(t), v);
      }
      Value a8;
      a8.type = ValueType::ARRAY;
      a8.elem_type = ValueType::UINT8;
      a8.uints = {1, 2, 3};
      w.add_kv("a8", a8);
      w.finish();
    }
    {  // several tensor types, alignment 64
      Writer w(dir + "/seed-align64.gguf", {.alignment = 64});
      w.add_kv("general.architecture", Value::str("kimi-k3"));
      w.add_tensor("a", GgmlType::F16, {3});
      w.add_tensor("blk.0.q", GgmlType::Q8_0, {32, 2});
      w.add_tensor("e", GgmlType::MXFP4, {32, 1, 2});
      w.add_tensor("z", GgmlType::F32, {0});
      write_all(w, {{"a", 6}, {"blk.0.q", 68}, {"e", 34}, {"z", 0}});
    }
    {  // split output: two shards
      Writer w(dir + "/seed-split.gguf", {.split_max_bytes = 32});
      w.add_kv("general.architecture", Value::str("kimi-k3"));
      w.add_tensor("a", GgmlType::F32, {8});
      w.add_tensor("b", GgmlType::BF16, {4, 2});
      write_all(w, {{"a", 32}, {"b", 16}});
    }
  } catch (const Error& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
  return 0;
}
