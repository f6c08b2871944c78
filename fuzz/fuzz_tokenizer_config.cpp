// libFuzzer target: the tokenizer files of a Hugging Face directory as `kimi convert` reads them
// (convert::load_vocab). The first input byte picks the file the rest of the input becomes:
//   even: tokenizer_config.json next to a fixed tiktoken.model (the first 300 ranks of the tiny
//         preset's vocabulary): added_tokens_decoder ids and contents, bos/eos/pad_token,
//         add_bos_token, chat_template;
//   odd:  tokenizer.json (no tiktoken.model): model.vocab, model.merges, added_tokens.
// config.json is the tiny preset's (vocab_size 1024). When the vocabulary loads, the tokenizer is
// built from it as the engine would from the GGUF (tokens, types, merges, special ids) and
// encodes a text with special tokens. A malformed input must end in kimi::Error; anything else
// is a bug.
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <string>
#include <string_view>

#include "common.h"
#include "convert/vocab.h"
#include "io/hf_config.h"
#include "tokenizer/tokenizer.h"
#include "util/error.h"

using namespace kimi;
namespace fs = std::filesystem;

namespace {
struct Dirs {
  std::string tiktoken_dir, json_dir;
  HfConfig cfg;
};

const Dirs& dirs() {
  static const Dirs d = [] {
    Dirs r;
    const std::string& tiny = fuzz::tiny_hf_dir();
    const std::string cfg_text = fuzz::read_file(tiny + "/config.json");
    r.cfg = HfConfig::parse(cfg_text, tiny + "/config.json");
    r.tiktoken_dir = fuzz::temp_dir() + "/tk";
    r.json_dir = fuzz::temp_dir() + "/tj";
    for (const auto& dir : {r.tiktoken_dir, r.json_dir}) {
      fs::create_directories(dir);
      fuzz::write_file(dir + "/config.json", cfg_text);
    }
    // the first 300 lines of the tiny preset's tiktoken.model (ranks 0..299)
    const std::string tk = fuzz::read_file(tiny + "/tiktoken.model");
    size_t end = 0;
    for (int lines = 0; lines < 300 && (end = tk.find('\n', end)) != std::string::npos; ++lines) ++end;
    fuzz::write_file(r.tiktoken_dir + "/tiktoken.model", tk.substr(0, end));
    return r;
  }();
  return d;
}
}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  dirs();
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const Dirs& D = dirs();
  const bool json_mode = data[0] & 1;
  const std::string& dir = json_mode ? D.json_dir : D.tiktoken_dir;
  fuzz::write_file(dir + (json_mode ? "/tokenizer.json" : "/tokenizer_config.json"),
                   std::string_view(reinterpret_cast<const char*>(data + 1), size - 1));
  size_t sink = 0;
  try {
    const convert::Vocab v = convert::load_vocab(dir, D.cfg);
    sink += v.tokens.size() + v.merges.size() + (v.chat_template ? v.chat_template->size() : 0);
    tok::GgufVocab g;
    g.tokens = v.tokens;
    g.types = v.types;
    g.merges = v.merges;
    g.bos = v.bos ? static_cast<int32_t>(*v.bos) : -1;
    g.eos = v.eos ? static_cast<int32_t>(*v.eos) : -1;
    g.pad = v.pad ? static_cast<int32_t>(*v.pad) : -1;
    g.add_bos = v.add_bos.value_or(false);
    g.source = "fuzz";
    const tok::Tokenizer t = tok::Tokenizer::from_vocab(g);
    const auto ids = t.encode("<|im_user|>user<|im_middle|>Hi there, 123!<|im_end|>[EOS] x", true);
    sink += ids.size() + t.decode(ids).size() + static_cast<size_t>(t.eos_id() + t.bos_id());
  } catch (const Error&) {
  }
  if (sink == 0xdeadbeef) return 1;  // keep `sink` alive
  return 0;
}
