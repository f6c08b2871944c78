// libFuzzer target: safetensors files (formats-quant.md §2). The first input byte picks the mode:
//   even: the rest is one .safetensors file, parsed from memory by st::parse_buffer (header length,
//         header JSON, dtypes, shapes, offsets tiling the data exactly, duplicates, __metadata__);
//   odd:  the rest is a model.safetensors.index.json next to two small valid shards (a.safetensors,
//         b.safetensors); st::Checkpoint::open reads the directory (weight_map <-> shard checks).
// A malformed input must end in kimi::Error; a crash, a sanitizer report, any other exception or an
// allocation above -malloc_limit_mb is a bug.
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

#include "common.h"
#include "io/safetensors.h"
#include "util/error.h"

using namespace kimi;

namespace {

// Two shards holding tensors x (F32 [2,2]) and y (BF16 [3]) + z (U8 [0]).
const std::string& index_dir() {
  static const std::string dir = [] {
    const std::string d = fuzz::temp_dir() + "/st";
    std::filesystem::create_directories(d);
    {
      st::Writer w(d + "/a.safetensors");
      w.add_metadata("format", "pt");
      w.add_tensor("x", st::Dtype::F32, {2, 2});
      w.begin();
      const float v[4] = {1, 2, 3, 4};
      w.write("x", v, sizeof v);
      w.finish();
    }
    {
      st::Writer w(d + "/b.safetensors");
      w.add_tensor("y", st::Dtype::BF16, {3});
      w.add_tensor("z", st::Dtype::U8, {0});
      w.begin();
      const uint16_t v[3] = {0x3f80, 0x4000, 0xc000};
      w.write("y", v, sizeof v);
      w.finish();
    }
    return d;
  }();
  return dir;
}

size_t touch(const st::Tensor& t) {
  size_t s = t.name.size() + t.shape_string().size() + static_cast<size_t>(t.numel() & 0xff);
  if (t.nbytes > 0) s += t.data[0] + t.data[t.nbytes - 1];  // ASan: inside the buffer
  return s;
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  index_dir();
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const bool index_mode = data[0] & 1;
  size_t sink = 0;
  if (!index_mode) {
    // an exact-size heap copy, so that ASan sees any read past the end
    std::vector<uint8_t> buf(data + 1, data + size);
    try {
      for (const auto& t : st::parse_buffer(buf.data(), buf.size(), "fuzz.safetensors")) sink += touch(t);
    } catch (const Error&) {
    }
  } else {
    fuzz::write_file(index_dir() + "/model.safetensors.index.json",
                     std::string_view(reinterpret_cast<const char*>(data + 1), size - 1));
    try {
      auto ck = st::Checkpoint::open(index_dir());
      for (const auto& n : ck->names()) {
        const st::Tensor& t = ck->get(n);
        sink += touch(t);
        ck->release(t);
      }
      for (const auto& [k, v] : ck->metadata()) sink += k.size() + v.size();
    } catch (const Error&) {
    }
  }
  if (sink == 0xdeadbeef) return 1;  // keep `sink` alive
  return 0;
}
