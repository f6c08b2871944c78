// Readers for tiktoken rank data: the plain `.tiktoken` format (one `base64 rank` per line) and
// the encoder JSON shipped by the `tiktoken` npm package
// ({"pat_str": ..., "special_tokens": {...}, "bpe_ranks": "! START b64 b64 ...\n! START ..."}).
#pragma once
#include <cstdint>
#include <map>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace kimi::tok {

struct TiktokenData {
  std::vector<std::pair<std::string, int32_t>> ranks;  // token bytes, rank
  std::string pattern;                                 // JSON only ("" for a plain rank file)
  std::map<std::string, int32_t> specials;             // JSON only
};

// Throws kimi::Error naming the file and line on malformed input.
TiktokenData read_tiktoken_file(const std::string& path);
TiktokenData parse_tiktoken(std::string_view content, const std::string& label);

// Strict base64 (standard alphabet, '=' padding); returns false on malformed input.
bool base64_decode(std::string_view in, std::string& out);

}  // namespace kimi::tok
