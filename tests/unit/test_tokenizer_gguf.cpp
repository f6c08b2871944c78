// The GGUF path end to end: a tiny synthetic checkpoint (`kimi synth`) converted by `kimi convert`
// must tokenize exactly like tiktoken run on the checkpoint's own tiktoken.model with the Kimi
// regex and the tokenizer_config.json specials; and bad GGUF tokenizer metadata gives named errors.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "io/gguf.h"
#include "test_util.h"
#include "tokenizer/pretokenizer.h"
#include "tokenizer/tokenizer.h"
#include "tokenizer/unicode.h"
#include "util/error.h"

using namespace kimi::tok;
using nlohmann::json;

namespace {
std::vector<std::string> corpus_texts() {
  const std::string dir = std::string(KIMI_TEST_DATA) + "/tokenizer";
  json corpus = json::parse(kimi::test::read_file(dir + "/corpus.json"));
  std::vector<std::string> out;
  for (auto& c : corpus) {
    if (c.contains("text")) out.push_back(c["text"]);
    if (c.contains("file")) out.push_back(kimi::test::read_file(dir + "/" + c["file"].get<std::string>()));
  }
  out.push_back("<|open|>message role=\"user\"<|sep|>Hi<|close|>message<|sep|><|end_of_msg|>[EOT][BOS]");
  return out;
}
}  // namespace

TEST(TokenizerGguf, SynthConvertedVocabularyMatchesItsTiktokenModel) {
  const std::string hf = kimi::test::tiny_hf();
  auto reader = kimi::gguf::Reader::open(kimi::test::tiny_gguf());
  Tokenizer g = Tokenizer::from_gguf(*reader);
  EXPECT_FALSE(g.rank_mode());  // merges from the GGUF
  const int32_t V = g.n_vocab();
  ASSERT_EQ(V, 1024);

  // specials as docs/spec/README.md (synthetic checkpoints) lists them, from tokenizer_config.json
  json cfg = json::parse(kimi::test::read_file(hf + "/tokenizer_config.json"));
  std::map<std::string, int32_t> specials;
  for (auto& [id, tok] : cfg["added_tokens_decoder"].items()) specials[tok["content"]] = std::stoi(id);
  for (int32_t id = V - 256; id < V; ++id) {
    bool named = false;
    for (auto& [t, i] : specials) named |= i == id;
    if (!named) specials["<|reserved_token_" + std::to_string(id) + "|>"] = id;
  }
  Tokenizer t = Tokenizer::from_tiktoken(hf + "/tiktoken.model", kKimiPattern, specials);
  ASSERT_EQ(t.n_vocab(), V);
  for (int32_t id = 0; id < V; ++id) {
    ASSERT_EQ(g.token_to_piece(id), t.token_to_piece(id)) << "id " << id;
    ASSERT_EQ(g.is_special(id), id >= V - 256) << "id " << id;
  }
  EXPECT_EQ(g.bos_id(), V - 256);
  EXPECT_EQ(g.eos_id(), V - 254);  // <|end_of_msg|>
  EXPECT_EQ(g.eot_id(), V - 256 + 9);
  EXPECT_TRUE(g.is_eog(V - 254));
  EXPECT_TRUE(g.is_eog(V - 255));  // [EOS]
  EXPECT_TRUE(g.is_eog(V - 256 + 9));
  EXPECT_FALSE(g.is_eog(V - 256));
  EXPECT_FALSE(g.add_bos());
  for (const std::string& text : corpus_texts()) {
    EXPECT_EQ(g.encode(text), t.encode(text)) << text.substr(0, 60);
    EXPECT_EQ(g.encode(text, false), t.encode(text, false)) << text.substr(0, 60);
    EXPECT_EQ(g.decode(g.encode(text)), utf8_sanitize(text));
  }
}

TEST(TokenizerGguf, MissingOrBadMetadataIsNamed) {
  kimi::test::TempDir dir;
  auto write = [&](const std::string& name, std::vector<kimi::gguf::KV> kvs) {
    kimi::gguf::Writer w(dir.file(name));
    for (auto& kv : kvs) w.add_kv(kv.key, kv.value);
    w.begin();
    w.finish();
    return dir.file(name);
  };
  auto error_of = [](const std::string& path) -> std::string {
    try {
      auto r = kimi::gguf::Reader::open(path);
      Tokenizer::from_gguf(*r);
    } catch (const kimi::Error& e) {
      return e.what();
    }
    return "(no error)";
  };
  using kimi::gguf::Value;
  const std::string a = write("a.gguf", {{"general.architecture", Value::str("kimi-k3")}});
  EXPECT_NE(error_of(a).find("a.gguf: missing key 'tokenizer.ggml.model'"), std::string::npos) << error_of(a);
  const std::string b = write("b.gguf", {{"tokenizer.ggml.model", Value::str("llama")},
                                         {"tokenizer.ggml.pre", Value::str("kimi-k2")},
                                         {"tokenizer.ggml.tokens", Value::arr_str({"a"})}});
  EXPECT_NE(error_of(b).find("tokenizer.ggml.model is 'llama'"), std::string::npos) << error_of(b);
  std::vector<std::string> toks;
  for (int c = 0; c < 256; ++c) toks.push_back(gpt2_encode(std::string(1, static_cast<char>(c))));
  const std::string c = write("c.gguf", {{"tokenizer.ggml.model", Value::str("gpt2")},
                                         {"tokenizer.ggml.pre", Value::str("kimi-k2")},
                                         {"tokenizer.ggml.tokens", Value::arr_str(toks)},
                                         {"tokenizer.ggml.merges", Value::arr_str({"a b"})}});
  EXPECT_NE(error_of(c).find("c.gguf: tokenizer.ggml.merges[0] = 'a b'"), std::string::npos) << error_of(c);
  toks.push_back("ab");
  const std::string d = write("d.gguf", {{"tokenizer.ggml.model", Value::str("gpt2")},
                                         {"tokenizer.ggml.pre", Value::str("kimi-k2")},
                                         {"tokenizer.ggml.tokens", Value::arr_str(toks)},
                                         {"tokenizer.ggml.token_type", Value::arr_i32(std::vector<int32_t>(257, 1))},
                                         {"tokenizer.ggml.merges", Value::arr_str({"a b"})},
                                         {"tokenizer.ggml.eos_token_id", Value::u32(256)}});
  auto r = kimi::gguf::Reader::open(d);
  Tokenizer t = Tokenizer::from_gguf(*r);
  EXPECT_EQ(t.encode("abab"), (std::vector<int32_t>{256, 256}));
  EXPECT_EQ(t.eos_id(), 256);
}
