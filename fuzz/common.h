// Helpers shared by the fuzz targets: a private temporary directory per process, and the tiny
// synthetic model (`kimi synth --preset tiny` + `kimi convert`) made once, inside it, so that each
// harness is self-contained (no files needed next to the binary).
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace kimi::fuzz {

// A directory of this process (under $TMPDIR, /dev/shm when writable), removed at exit.
const std::string& temp_dir();
// Prints "fuzz harness: WHAT" and aborts (a harness problem, not a finding about the input).
[[noreturn]] void die(const std::string& what);
// Writes bytes to a file (replacing it); aborts on I/O failure (not an input problem).
void write_file(const std::string& path, std::string_view bytes);
std::string read_file(const std::string& path);

// tiny_model.cpp (needs the converter): the tiny preset's Hugging Face directory (config.json, safetensors shards, tiktoken.model,
// tokenizer_config.json), written on first use.
const std::string& tiny_hf_dir();
// The same model converted to GGUF (bf16 + MXFP4 experts), written on first use.
const std::string& tiny_gguf();

// Reads the fuzz input as a little stream of choices; returns 0 once exhausted.
struct Bytes {
  const uint8_t* p;
  size_t n;
  bool empty() const { return n == 0; }
  uint8_t u8() {
    if (!n) return 0;
    --n;
    return *p++;
  }
  uint32_t u32() { return u8() | uint32_t(u8()) << 8 | uint32_t(u8()) << 16 | uint32_t(u8()) << 24; }
  uint64_t u64() { return u32() | uint64_t(u32()) << 32; }
  // the rest of the input
  std::string_view rest() {
    std::string_view s(reinterpret_cast<const char*>(p), n);
    p += n;
    n = 0;
    return s;
  }
};

}  // namespace kimi::fuzz
