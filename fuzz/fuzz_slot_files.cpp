// libFuzzer target: the readers of the files others may plant in `kimi serve`'s folders — slot
// files (read_sequence_file + load_sequence_file, POST /slots/ID?action=restore) and prompt-cache
// files (PromptCache's startup scan of --cache-dir, then loading the entry a prompt hits). The base
// is a valid file of one 5-token sequence of the tiny synthetic model; the first input byte picks
// the reader and whether the rest is the whole file or a list of (offset, byte) edits of the valid
// one, with its checksum made valid again (so the checks after the checksum are reached: sizes,
// segments, token ids, values that are not finite). A refused file must end in kimi::Error (or a
// skipped cache file); a crash, a sanitizer report, a hang or an allocation above -malloc_limit_mb
// is a bug.
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "common.h"
#include "model/model.h"
#include "runtime/context.h"
#include "server/prompt_cache.h"
#include "util/error.h"

using namespace kimi;
using namespace kimi::server;

namespace {

struct Base {
  std::unique_ptr<Model> m;
  std::unique_ptr<Context> ctx;
  std::string identity, valid;
  std::vector<int32_t> toks;
};

Base& base() {
  static Base B = [] {
    Base b;
    b.m = Model::load(fuzz::tiny_gguf());
    ContextOptions co;
    co.n_threads = 1;
    co.n_seq_max = 2;
    co.n_ctx_max = 16;
    co.n_batch_max = 8;
    b.ctx = std::make_unique<Context>(*b.m, co);
    const int32_t nv = b.ctx->n_vocab();
    b.toks = {1, 2, nv / 2, nv - 1, 7};
    Batch batch;
    batch.add_sequence(b.toks, 0, 0);
    b.ctx->decode(batch);
    b.identity = b.ctx->state_identity();
    const std::string p = fuzz::temp_dir() + "/valid.bin";
    save_sequence_file(*b.ctx, b.identity, 0, b.toks, p);
    b.valid = fuzz::read_file(p);
    return b;
  }();
  return B;
}

// the checksum of docs/server.md "Slot files" over all but the last 8 bytes, written there
void fix_checksum(std::string& f) {
  if (f.size() < 8) return;
  uint64_t h = 0x9E3779B97F4A7C15ull;
  const size_t n = f.size() - 8;
  for (size_t i = 0; i < n; i += 8) {
    uint64_t w = 0;
    std::memcpy(&w, f.data() + i, std::min<size_t>(8, n - i));
    h ^= w * 0xBF58476D1CE4E5B9ull;
    h = ((h << 31) | (h >> 33)) * 0x94D049BB133111EBull;
  }
  h ^= n;
  std::memcpy(f.data() + n, &h, 8);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  Base& B = base();
  fuzz::Bytes in{data, size};
  const uint8_t mode = in.u8();
  std::string file;
  if (mode & 2) {  // edits of the valid file
    file = B.valid;
    if (mode & 8) file.resize(in.u32() % (file.size() + 64), '\0');
    while (!in.empty()) {
      const uint32_t at = in.u32();
      const uint8_t v = in.u8();
      if (!file.empty()) file[at % file.size()] = static_cast<char>(v);
    }
    if (mode & 4) fix_checksum(file);
  } else {
    file = std::string(in.rest());
  }
  if (!(mode & 1)) {  // a slot file
    const std::string p = fuzz::temp_dir() + "/slot.bin";
    fuzz::write_file(p, file);
    try {
      SequenceFile f = read_sequence_file(*B.ctx, B.identity, p);
      load_sequence_file(*B.ctx, 1, f);
      if (B.ctx->seq_len(1) != static_cast<int32_t>(f.toks.size())) fuzz::die("a restored sequence of the wrong length");
    } catch (const Error&) {
    }
    return 0;
  }
  // a prompt-cache folder holding this one file under the name an entry of these tokens has
  const std::string dir = fuzz::temp_dir() + "/cache";
  std::error_code ec;
  std::filesystem::remove_all(dir, ec);
  std::filesystem::create_directories(dir);
  fuzz::write_file(dir + "/" + B.identity + "-0000000000000000-5.kpc", file);
  PromptCacheOptions o;
  o.ram_bytes = 1u << 20;
  o.dir = dir;
  o.disk_bytes = 1u << 20;
  PromptCache cache(*B.ctx, o);
  std::vector<int32_t> prompt = B.toks;
  prompt.push_back(3);
  const PromptCache::Hit h = cache.find(prompt, prompt.size());
  if (h.n > 0 && cache.load(h, 1) && B.ctx->seq_len(1) != static_cast<int32_t>(h.n))
    fuzz::die("a loaded cache entry of the wrong length");
  return 0;
}
