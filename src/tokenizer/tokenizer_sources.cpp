// Tokenizer factories that read files: GGUF metadata and tiktoken rank files. Kept apart from
// tokenizer.cpp so that code using only the in-memory factories does not pull in the GGUF reader.
#include "io/gguf.h"
#include "tokenizer/tiktoken_file.h"
#include "tokenizer/tokenizer.h"
#include "util/error.h"

namespace kimi::tok {

Tokenizer Tokenizer::from_tiktoken(const std::string& rank_file, const std::string& pattern,
                                   const std::map<std::string, int32_t>& specials) {
  TiktokenData d = read_tiktoken_file(rank_file);
  const std::string& pat = pattern.empty() ? d.pattern : pattern;
  check(!pat.empty(), "{}: no pre-tokenizer pattern given and the file has no 'pat_str'", rank_file);
  return from_ranks(d.ranks, pat, specials.empty() ? d.specials : specials);
}

Tokenizer Tokenizer::from_gguf(const gguf::Reader& r) {
  GgufVocab v;
  v.source = r.path();
  auto opt_id = [&](const char* key) -> int32_t {
    if (!r.has(key)) return -1;
    const uint32_t id = r.get_u32(key);
    check(id < static_cast<uint32_t>(INT32_MAX), "{}: {} = {} is out of range", r.path(), key, id);
    return static_cast<int32_t>(id);
  };
  check(r.has("tokenizer.ggml.model"), "{}: missing key 'tokenizer.ggml.model' (no tokenizer in this GGUF)", r.path());
  v.model = r.get_str("tokenizer.ggml.model");
  check(r.has("tokenizer.ggml.pre"), "{}: missing key 'tokenizer.ggml.pre'", r.path());
  v.pre = r.get_str("tokenizer.ggml.pre");
  v.tokens = r.get_str_array("tokenizer.ggml.tokens");
  if (r.has("tokenizer.ggml.token_type")) {
    for (int64_t t : r.get_int_array("tokenizer.ggml.token_type")) v.types.push_back(static_cast<int32_t>(t));
  }
  if (r.has("tokenizer.ggml.merges")) v.merges = r.get_str_array("tokenizer.ggml.merges");
  v.bos = opt_id("tokenizer.ggml.bos_token_id");
  v.eos = opt_id("tokenizer.ggml.eos_token_id");
  v.eot = opt_id("tokenizer.ggml.eot_token_id");
  v.pad = opt_id("tokenizer.ggml.padding_token_id");
  v.unk = opt_id("tokenizer.ggml.unknown_token_id");
  v.add_bos = r.get_bool_or("tokenizer.ggml.add_bos_token", false);
  return from_vocab(v);
}

}  // namespace kimi::tok
