// Exactness against OpenAI's tiktoken (golden ids made by the real npm `tiktoken`, see
// tools/tiktoken/gen_golden.js) and the Kimi pre-tokenizer against Node's RegExp (v flag).
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>

#include "test_util.h"
#include "tokenizer/pretokenizer.h"
#include "tokenizer/tokenizer.h"
#include "tokenizer/unicode.h"

using nlohmann::json;
using namespace kimi::tok;

namespace {

const std::string kData = std::string(KIMI_TEST_DATA) + "/tokenizer";

std::string encoder_json(const std::string& name) {
  const std::string p = std::string(KIMI_SOURCE_DIR) + "/tools/tiktoken/node_modules/tiktoken/encoders/" + name + ".json";
  if (!std::filesystem::exists(p))
    ADD_FAILURE() << p << " is missing: run `npm ci --prefix tools/tiktoken` (scripts/setup.sh --test does)";
  return p;
}

json load_json(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  EXPECT_TRUE(f.good()) << path;
  return json::parse(f);
}

std::string hex_decode(const std::string& h) {
  std::string out;
  for (size_t i = 0; i + 1 < h.size(); i += 2) out.push_back(static_cast<char>(std::stoi(h.substr(i, 2), nullptr, 16)));
  return out;
}

struct Case {
  std::string name, bytes;
  json golden;
};

const std::vector<Case>& cases() {
  static std::vector<Case> cs = [] {
    std::vector<Case> out;
    json corpus = load_json(kData + "/corpus.json");
    json golden = load_json(kData + "/golden.json");
    EXPECT_EQ(corpus.size(), golden["cases"].size()) << "golden.json is stale: rerun tools/tiktoken/gen_golden.js";
    for (size_t i = 0; i < corpus.size() && i < golden["cases"].size(); ++i) {
      const json& c = corpus[i];
      Case k;
      k.name = c["name"];
      if (c.contains("hex")) k.bytes = hex_decode(c["hex"]);
      else if (c.contains("file")) k.bytes = kimi::test::read_file(kData + "/" + c["file"].get<std::string>());
      else k.bytes = c["text"];
      k.golden = golden["cases"][i];
      EXPECT_EQ(k.golden["name"], k.name);
      out.push_back(std::move(k));
    }
    return out;
  }();
  return cs;
}

std::map<std::string, int32_t> kimi_specials() {
  json g = load_json(kData + "/golden.json");
  std::map<std::string, int32_t> m;
  for (auto& [k, v] : g["kimi_specials"].items()) m[k] = v.get<int32_t>();
  return m;
}

std::vector<int32_t> ids_of(const json& j) { return j.get<std::vector<int32_t>>(); }

void expect_ids(const std::vector<int32_t>& got, const std::vector<int32_t>& want, const std::string& what) {
  if (got == want) return;
  size_t i = 0;
  while (i < got.size() && i < want.size() && got[i] == want[i]) ++i;
  ADD_FAILURE() << what << ": " << got.size() << " ids vs " << want.size() << " golden, first difference at " << i
                << " (got " << (i < got.size() ? std::to_string(got[i]) : "end") << ", want "
                << (i < want.size() ? std::to_string(want[i]) : "end") << ")";
}

}  // namespace

class TiktokenGolden : public ::testing::TestWithParam<const char*> {};

TEST_P(TiktokenGolden, MatchesRealTiktokenOnCorpus) {
  const std::string name = GetParam();
  const std::string key = name == std::string("cl100k_base") ? "cl100k" : "o200k";
  Tokenizer t = Tokenizer::from_tiktoken(encoder_json(name), "", {});
  ASSERT_TRUE(t.rank_mode());
  for (const Case& c : cases()) {
    expect_ids(t.encode(c.bytes, /*allow_special=*/false), ids_of(c.golden[key]), name + " ordinary '" + c.name + "'");
    expect_ids(t.encode(c.bytes, /*allow_special=*/true), ids_of(c.golden[key + "_special"]),
               name + " all-special '" + c.name + "'");
  }
}

INSTANTIATE_TEST_SUITE_P(Encoders, TiktokenGolden, ::testing::Values("cl100k_base", "o200k_base"));

TEST(TokenizerGolden, KimiRegexIdsMatchTiktokenWithKimiPattern) {
  // tiktoken itself (Rust fancy_regex: `&&` and \p{Han} = Script) run with the Kimi regex over the
  // cl100k ranks: checks our PCRE2 translation end to end on the corpus.
  Tokenizer t = Tokenizer::from_tiktoken(encoder_json("cl100k_base"), kKimiPattern, kimi_specials());
  for (const Case& c : cases())
    expect_ids(t.encode(c.bytes, true), ids_of(c.golden["kimi_cl100k_special"]), "kimi/cl100k '" + c.name + "'");
}

TEST(TokenizerGolden, KimiSplitsMatchNodeRegExp) {
  Tokenizer t = Tokenizer::from_tiktoken(encoder_json("cl100k_base"), kKimiPattern, kimi_specials());
  for (const Case& c : cases()) {
    const auto want = c.golden["kimi_splits"].get<std::vector<std::string>>();
    const auto got = t.split(c.bytes, true);
    EXPECT_EQ(got, want) << "case '" << c.name << "'";
  }
}

TEST(TokenizerGolden, DecodeRoundTripsAndStreams) {
  Tokenizer t = Tokenizer::from_tiktoken(encoder_json("o200k_base"), "", {});
  for (const Case& c : cases()) {
    const auto ids = t.encode(c.bytes, true);
    const std::string clean = utf8_sanitize(c.bytes);
    EXPECT_EQ(t.decode(ids), clean) << c.name;
    Detokenizer d(t);
    std::string streamed;
    for (int32_t id : ids) {
      const std::string chunk = d.push(id);
      EXPECT_TRUE(utf8_valid(chunk)) << c.name;
      streamed += chunk;
    }
    streamed += d.flush();
    EXPECT_EQ(streamed, clean) << c.name;
  }
}

// Merge-mode BPE (the GGUF path): a vocabulary built like `kimi convert` builds it (GPT-2-mapped
// token strings, CONTROL specials, merges reconstructed from the ranks by an independent naive
// BPE written here) must reproduce tiktoken's ids on the corpus.
namespace {
std::vector<std::string> naive_bpe(const std::string& word, const std::unordered_map<std::string, int32_t>& rank,
                                   int32_t limit) {
  std::vector<std::string> parts;
  for (char ch : word) parts.emplace_back(1, ch);
  for (;;) {
    int32_t best = limit;
    size_t bi = SIZE_MAX;
    for (size_t i = 0; i + 1 < parts.size(); ++i) {
      auto it = rank.find(parts[i] + parts[i + 1]);
      if (it != rank.end() && it->second < best) {
        best = it->second;
        bi = i;
      }
    }
    if (bi == SIZE_MAX) break;
    parts[bi] += parts[bi + 1];
    parts.erase(parts.begin() + bi + 1);
  }
  return parts;
}
}  // namespace

TEST(TokenizerGolden, GgufMergeModeMatchesTiktoken) {
  Tokenizer ranks = Tokenizer::from_tiktoken(encoder_json("cl100k_base"), kKimiPattern, kimi_specials());
  const int32_t n = ranks.n_vocab();
  std::unordered_map<std::string, int32_t> rank;
  GgufVocab v;
  v.tokens.resize(n);
  v.types.resize(n);
  std::vector<std::pair<int32_t, std::string>> by_rank;
  for (int32_t id = 0; id < n; ++id) {
    const TokenType ty = ranks.token_type(id);
    if (ty == TokenType::Normal) {
      rank[ranks.token_to_piece(id)] = id;
      v.tokens[id] = gpt2_encode(ranks.token_to_piece(id));
      v.types[id] = 1;
    } else if (ty == TokenType::Control) {
      v.tokens[id] = ranks.token_to_piece(id);
      v.types[id] = 3;
    } else {
      v.tokens[id] = "[PAD" + std::to_string(id) + "]";
      v.types[id] = 5;
    }
  }
  for (int32_t id = 0; id < n; ++id) {
    if (v.types[id] != 1) continue;
    const std::string& tokb = ranks.token_to_piece(id);
    if (tokb.size() < 2) continue;
    auto parts = naive_bpe(tokb, rank, id);
    if (parts.size() == 2) v.merges.push_back(gpt2_encode(parts[0]) + " " + gpt2_encode(parts[1]));
  }
  v.pre = "kimi-k2";
  Tokenizer g = Tokenizer::from_vocab(v);
  ASSERT_FALSE(g.rank_mode());
  for (const Case& c : cases())
    expect_ids(g.encode(c.bytes, true), ids_of(c.golden["kimi_cl100k_special"]), "merge mode '" + c.name + "'");
}
