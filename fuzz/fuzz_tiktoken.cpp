// libFuzzer target: tiktoken rank data (tiktoken.model, one "BASE64 RANK" per line, or the npm
// tiktoken encoder JSON). The input is the file's text, read by both readers the project has:
//   - tok::parse_tiktoken (the tokenizer's reader; plain and JSON forms), then
//     Tokenizer::from_ranks with the Kimi pattern and the file's specials, encode + decode;
//   - convert::parse_tiktoken (the converter's reader: dense unique ranks), then
//     reconstruct_merges for small vocabularies (the GGUF merges the converter writes).
// Both readers must agree where both accept a file (same bytes for every rank), and the two
// base64 decoders must agree where both accept a token. A malformed input must end in
// kimi::Error; anything else is a bug.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstdio>
#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "convert/vocab.h"
#include "tokenizer/tiktoken_file.h"
#include "tokenizer/tokenizer.h"
#include "util/error.h"

using namespace kimi;

namespace {
[[noreturn]] void mismatch(const char* what) {
  std::fprintf(stderr, "fuzz_tiktoken: %s\n", what);
  std::abort();
}
}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  size_t sink = 0;

  // the two base64 decoders on the first word
  {
    const std::string_view word = std::string_view(text).substr(0, text.find_first_of(" \n"));
    std::string a, b;
    const bool ok_tok = tok::base64_decode(word, a), ok_conv = convert::base64_decode(word, &b);
    if (ok_tok && ok_conv && a != b) mismatch("base64 decoders disagree");
  }

  std::vector<std::pair<std::string, int32_t>> tok_ranks;
  bool tok_ok = false, plain = true;
  try {
    tok::TiktokenData d = tok::parse_tiktoken(text, "fuzz.tiktoken");
    tok_ok = true;
    plain = d.pattern.empty() && d.specials.empty() && text.find('{') == std::string::npos;
    tok_ranks = d.ranks;
    tok::Tokenizer t = tok::Tokenizer::from_ranks(d.ranks, tok::pattern_for_pre("kimi-k2"), d.specials);
    const std::vector<int32_t> ids = t.encode("Hello, world! 123 héllo <|im_end|>\n\tx", true);
    sink += ids.size() + t.decode(ids).size() + static_cast<size_t>(t.n_vocab());
    for (int32_t id : ids) sink += t.token_to_piece(id).size() + t.is_special(id);
  } catch (const Error&) {
  }

  try {
    const std::vector<std::string> by_rank = convert::parse_tiktoken(text, "fuzz.tiktoken");
    if (tok_ok && plain) {
      // same ranks and bytes as the tokenizer's reader
      if (tok_ranks.size() != by_rank.size()) mismatch("the two tiktoken readers found different numbers of ranks");
      for (const auto& [bytes, r] : tok_ranks)
        if (r < 0 || static_cast<size_t>(r) >= by_rank.size() || by_rank[r] != bytes)
          mismatch("the two tiktoken readers disagree on a rank's bytes");
    }
    if (by_rank.size() <= 512) {
      for (const auto& m : convert::reconstruct_merges(by_rank)) sink += m.size();
    }
    for (const auto& b : by_rank) sink += convert::gpt2_encode_bytes(b).size();
  } catch (const Error&) {
  }
  if (sink == 0xdeadbeef) return 1;  // keep `sink` alive
  return 0;
}
