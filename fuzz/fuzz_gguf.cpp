// libFuzzer target: parse arbitrary bytes as GGUF with Reader::open_memory. A malformed input
// must end in kimi::Error; anything else (a crash, a sanitizer report, another exception, an
// allocation beyond -malloc_limit_mb) is a bug.
#include <cstddef>
#include <cstdint>
#include <string>

#include "io/gguf.h"
#include "util/error.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace kimi::gguf;
  std::unique_ptr<Reader> r;
  try {
    r = Reader::open_memory(data, size, "fuzz.gguf");
  } catch (const kimi::Error&) {
    return 0;
  }
  // Exercise everything a consumer would touch.
  size_t sink = 0;
  for (const auto& kv : r->kvs()) {
    sink += kv.value.to_string(4).size();
    sink += kv.value.array_size();
    auto attempt = [&](auto&& fn) {
      try {
        fn();
      } catch (const kimi::Error&) {
      }
    };
    attempt([&] { sink += r->get_u32(kv.key); });
    attempt([&] { sink += r->get_u64(kv.key); });
    attempt([&] { sink += static_cast<size_t>(r->get_i64(kv.key)); });
    attempt([&] { sink += static_cast<size_t>(r->get_f32(kv.key) != 0); });
    attempt([&] { sink += r->get_bool(kv.key); });
    attempt([&] { sink += r->get_str(kv.key).size(); });
    attempt([&] { sink += r->get_int_array(kv.key).size(); });
    attempt([&] { sink += r->get_float_array(kv.key).size(); });
    attempt([&] { sink += r->get_str_array(kv.key).size(); });
  }
  for (const auto& t : r->tensors()) {
    sink += t.shape_string().size();
    if (t.nbytes > 0) sink += t.data[0] + t.data[t.nbytes - 1];  // ASan checks these are inside the input
    if (r->find_tensor(t.name) != &t) __builtin_trap();
  }
  if (sink == 0xdeadbeef) return 1;  // keep `sink` alive
  return 0;
}
