// Unit tests of the tokenizer pieces: UTF-8 handling, GPT-2 byte mapping, the `&&` translation
// (exhaustive over all code points), BPE (heap path vs a naive reference), special tokens,
// the incremental detokenizer and the error messages for bad vocabularies / rank files.
#include <gtest/gtest.h>

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include <fstream>
#include <nlohmann/json.hpp>
#include <random>
#include <unordered_map>

#include "tokenizer/bpe.h"
#include "tokenizer/pretokenizer.h"
#include "tokenizer/tiktoken_file.h"
#include "tokenizer/tokenizer.h"
#include "tokenizer/unicode.h"
#include "util/error.h"

using namespace kimi::tok;

namespace {

// ---- a tiny PCRE2 helper for whole-string single-code-point tests
struct Re {
  pcre2_code* re = nullptr;
  pcre2_match_data* md = nullptr;
  explicit Re(const std::string& pat) {
    int err;
    PCRE2_SIZE off;
    re = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pat.c_str()), pat.size(), PCRE2_UTF | PCRE2_UCP | PCRE2_ANCHORED |
                       PCRE2_ENDANCHORED, &err, &off, nullptr);
    EXPECT_NE(re, nullptr) << pat;
    pcre2_jit_compile(re, PCRE2_JIT_COMPLETE);
    md = pcre2_match_data_create_from_pattern(re, nullptr);
  }
  ~Re() {
    pcre2_match_data_free(md);
    pcre2_code_free(re);
  }
  bool match(const std::string& s) const {
    return pcre2_match(re, reinterpret_cast<PCRE2_SPTR>(s.data()), s.size(), 0, 0, md, nullptr) >= 0;
  }
};

std::string cp_str(uint32_t cp) {
  std::string s;
  utf8_append(s, cp);
  return s;
}

std::vector<std::pair<uint32_t, uint32_t>> ranges(const nlohmann::json& j) {
  return j.get<std::vector<std::pair<uint32_t, uint32_t>>>();
}
bool in_ranges(const std::vector<std::pair<uint32_t, uint32_t>>& r, uint32_t cp) {
  auto it = std::upper_bound(r.begin(), r.end(), std::make_pair(cp, UINT32_MAX));
  return it != r.begin() && std::prev(it)->second >= cp;
}

// naive rank BPE (reference): merge the lowest-rank adjacent pair, leftmost on ties
std::vector<int32_t> naive_rank_bpe(const std::string& w, const std::unordered_map<std::string, int32_t>& rank) {
  if (auto it = rank.find(w); it != rank.end()) return {it->second};
  std::vector<std::string> parts;
  for (char c : w) parts.emplace_back(1, c);
  for (;;) {
    int32_t best = INT32_MAX;
    size_t bi = SIZE_MAX;
    for (size_t i = 0; i + 1 < parts.size(); ++i)
      if (auto it = rank.find(parts[i] + parts[i + 1]); it != rank.end() && it->second < best) {
        best = it->second;
        bi = i;
      }
    if (bi == SIZE_MAX) break;
    parts[bi] += parts[bi + 1];
    parts.erase(parts.begin() + bi + 1);
  }
  std::vector<int32_t> ids;
  for (auto& p : parts) ids.push_back(rank.at(p));
  return ids;
}

std::vector<std::pair<std::string, int32_t>> small_ranks(const std::vector<std::string>& extra) {
  std::vector<std::pair<std::string, int32_t>> r;
  for (int b = 0; b < 256; ++b) r.emplace_back(std::string(1, static_cast<char>(b)), b);
  for (size_t i = 0; i < extra.size(); ++i) r.emplace_back(extra[i], static_cast<int32_t>(256 + i));
  return r;
}

template <typename F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const kimi::Error& e) {
    return e.what();
  }
  return "(no error)";
}

}  // namespace

TEST(TokenizerUnicode, SanitizeFollowsWhatwgMaximalSubparts) {
  const std::string R = "\xEF\xBF\xBD";
  EXPECT_EQ(utf8_sanitize("abc"), "abc");
  EXPECT_EQ(utf8_sanitize("\xF0\x9F\x98"), R);                 // truncated 4-byte: one U+FFFD
  EXPECT_EQ(utf8_sanitize("\xED\xA0\x80"), R + R + R);         // surrogate: ED is a lead whose A0 is invalid
  EXPECT_EQ(utf8_sanitize("\xC0\xAF"), R + R);                 // overlong lead
  EXPECT_EQ(utf8_sanitize("\xE2\x82 x"), R + " x");            // cut 3-byte sequence
  EXPECT_EQ(utf8_sanitize("\xF4\x90\x80\x80"), R + R + R + R);  // > U+10FFFF
  EXPECT_EQ(utf8_sanitize("\xFF\xC3\xA9"), R + "\xC3\xA9");
  EXPECT_FALSE(utf8_valid("\xC3"));
  EXPECT_TRUE(utf8_valid("\xF0\x9F\x98\x80"));
}

TEST(TokenizerUnicode, IncompleteTail) {
  EXPECT_EQ(utf8_incomplete_tail("ab\xF0\x9F\x98"), 3u);
  EXPECT_EQ(utf8_incomplete_tail("ab\xF0\x9F"), 2u);
  EXPECT_EQ(utf8_incomplete_tail("ab\xE2"), 1u);
  EXPECT_EQ(utf8_incomplete_tail("ab\xF0\x9F\x98\x80"), 0u);
  EXPECT_EQ(utf8_incomplete_tail("ab\xE0\x80"), 0u);  // E0 80 can never become valid
  EXPECT_EQ(utf8_incomplete_tail("ab\x80"), 0u);
  EXPECT_EQ(utf8_incomplete_tail(""), 0u);
}

TEST(TokenizerUnicode, Gpt2ByteMapping) {
  EXPECT_EQ(gpt2_encode(" "), "\xC4\xA0");   // U+0120 'Ġ'
  EXPECT_EQ(gpt2_encode("\n"), "\xC4\x8A");  // U+010A 'Ċ'
  EXPECT_EQ(gpt2_encode("a~!"), "a~!");
  EXPECT_EQ(gpt2_byte_to_cp(0xAD), 0x143u);  // the last remapped byte
  std::string all, back;
  for (int b = 0; b < 256; ++b) all.push_back(static_cast<char>(b));
  ASSERT_TRUE(gpt2_decode(gpt2_encode(all), back));
  EXPECT_EQ(back, all);
  EXPECT_FALSE(gpt2_decode("\xE4\xB8\x80", back));  // U+4E00 is not in the mapping
}

TEST(TokenizerPattern, TranslatesIntersectionAndScripts) {
  EXPECT_EQ(translate_pattern(R"([\p{Lu}\p{M}&&[^\p{Han}]]+)"), R"((?:(?=[\p{Lu}\p{M}])[^\p{sc:Han}])+)");
  EXPECT_EQ(translate_pattern(R"([\p{Han}]+|\s+(?!\S)|(?i:'s))"), R"([\p{sc:Han}]+|\s+(?!\S)|(?i:'s))");
  EXPECT_EQ(translate_pattern(R"(\p{Script=Greek}\p{L}\pN)"), R"(\p{sc:Greek}\p{L}\pN)");
  EXPECT_EQ(translate_pattern(R"([a-z&&[^aeiou]])"), R"((?:(?=[a-z])[^aeiou]))");
  EXPECT_NE(error_of([] { translate_pattern("[abc"); }).find("unterminated character class"), std::string::npos);
}

// The translated intersection classes, evaluated over every Unicode scalar value, against
// (a) a direct evaluation of the two operands with PCRE2 and (b) Node's `v`-flag RegExp ranges.
TEST(TokenizerPattern, IntersectionClassesExhaustive) {
  std::ifstream f(std::string(KIMI_TEST_DATA) + "/tokenizer/kimi_classes.json");
  ASSERT_TRUE(f.good());
  const auto node = nlohmann::json::parse(f);
  const auto node_upper = ranges(node["upper"]), node_lower = ranges(node["lower"]),
             node_cn = ranges(node["unassigned"]);
  struct Cls {
    const char* rust;
    const char* operand;
    const std::vector<std::pair<uint32_t, uint32_t>>* node;
  } classes[] = {
      {R"([\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]])", R"([\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}])", &node_upper},
      {R"([\p{Ll}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]])", R"([\p{Ll}\p{Lm}\p{Lo}\p{M}])", &node_lower},
  };
  Re han(R"(\p{sc:Han})"), cn(R"(\p{Cn})");
  for (const Cls& c : classes) {
    Re translated(translate_pattern(c.rust)), operand(c.operand);
    size_t n_in = 0, n_vs_node = 0, n_unassigned_skipped = 0;
    for (uint32_t cp = 0; cp <= 0x10FFFF; ++cp) {
      if (cp >= 0xD800 && cp <= 0xDFFF) continue;
      const std::string s = cp_str(cp);
      const bool want = operand.match(s) && !han.match(s);
      const bool got = translated.match(s);
      ASSERT_EQ(got, want) << c.rust << " at U+" << std::hex << cp;
      n_in += got;
      // Node (ICU) may know a newer Unicode than PCRE2: compare where both have the code point assigned
      if (cn.match(s) || in_ranges(node_cn, cp)) {
        ++n_unassigned_skipped;
        continue;
      }
      if (got != in_ranges(*c.node, cp)) {
        ++n_vs_node;
        // Known Unicode-version change: U+0295 LATIN LETTER PHARYNGEAL VOICED FRICATIVE is Ll in
        // PCRE2 10.42's Unicode 14 and Lo in Node 20's newer ICU data.
        if (cp != 0x0295) ADD_FAILURE() << c.rust << ": PCRE2 and Node disagree at U+" << std::hex << cp;
      }
    }
    EXPECT_GT(n_in, 30000u) << c.rust;  // sanity: the classes are large
    EXPECT_LE(n_vs_node, 1u) << c.rust;
  }
}

TEST(TokenizerPattern, HanIsScriptNotScriptExtensions) {
  Pretokenizer p(kKimiPattern);
  std::vector<std::string_view> out;
  p.split("\xE4\xB8\xAD\xE6\x96\x87\xE3\x80\x81x", out);  // 中文、x : U+3001 is Common (scx includes Han)
  ASSERT_EQ(out.size(), 2u);
  EXPECT_EQ(out[0], "\xE4\xB8\xAD\xE6\x96\x87");
  EXPECT_EQ(out[1], "\xE3\x80\x81x");
}

TEST(TokenizerBpe, LongPiecesUseHeapAndMatchNaive) {
  const std::vector<std::string> extra = {"ab", "ba", "aa", "abab", "bab", "aab", "bb", "abba", "baab", "aaaa", "abaab"};
  auto ranks = small_ranks(extra);
  std::unordered_map<std::string, int32_t> rank;
  for (auto& [s, r] : ranks) rank[s] = r;
  BpeEncoder e;
  std::vector<std::string> bytes(ranks.size());
  for (auto& [s, r] : ranks) bytes[r] = s;
  e.build_ranks(bytes, std::vector<bool>(bytes.size(), false));
  std::mt19937 rng(7);
  for (int trial = 0; trial < 200; ++trial) {
    const size_t len = 1 + rng() % 600;  // both the scan (<=128) and the heap path
    std::string w;
    for (size_t i = 0; i < len; ++i) w.push_back("ab"[rng() % 2]);
    std::vector<int32_t> got;
    e.encode(w, got);
    ASSERT_EQ(got, naive_rank_bpe(w, rank)) << "length " << len;
  }
}

TEST(TokenizerBpe, MergeModeUsesMergeOrderNotRank) {
  // Merge priority comes from the merge list: "b c" before "a b" even though "ab" has the lower id.
  GgufVocab v;
  for (int b = 0; b < 256; ++b) v.tokens.push_back(gpt2_encode(std::string(1, static_cast<char>(b))));
  v.tokens.push_back("ab");  // 256
  v.tokens.push_back("bc");  // 257
  v.merges = {"b c", "a b"};
  Tokenizer t = Tokenizer::from_vocab(v);
  EXPECT_EQ(t.encode("abc"), (std::vector<int32_t>{'a', 257}));
  // the same vocabulary in rank mode (no merges) merges the lowest id first
  v.merges.clear();
  Tokenizer r = Tokenizer::from_vocab(v);
  EXPECT_TRUE(r.rank_mode());
  EXPECT_EQ(r.encode("abc"), (std::vector<int32_t>{256, 'c'}));
}

TEST(TokenizerSpecials, MatchedFirstLongestAndSwitchable) {
  auto ranks = small_ranks({"<|", "|>"});
  std::map<std::string, int32_t> sp = {{"<|a|>", 300}, {"<|a|>b", 301}, {"[EOT]", 302}, {"<|end_of_msg|>", 303}};
  Tokenizer t = Tokenizer::from_ranks(ranks, kKimiPattern, sp);
  EXPECT_EQ(t.encode("x<|a|>by"), (std::vector<int32_t>{'x', 301, 'y'}));
  EXPECT_EQ(t.encode("<|a|>"), (std::vector<int32_t>{300}));
  const auto plain = t.encode("<|a|>", false);
  EXPECT_EQ(t.decode(plain), "<|a|>");
  EXPECT_EQ(std::count(plain.begin(), plain.end(), 300), 0);
  EXPECT_TRUE(t.is_special(300));
  EXPECT_EQ(t.eos_id(), 303);
  EXPECT_EQ(t.eot_id(), 302);
  EXPECT_TRUE(t.is_eog(302));
  EXPECT_TRUE(t.is_eog(303));
  EXPECT_FALSE(t.is_eog(300));
  EXPECT_EQ(t.token_id("<|a|>"), 300);
  EXPECT_EQ(t.token_id("|>"), 257);
  EXPECT_EQ(t.split("a<|a|> b"), (std::vector<std::string>{"a", "<|a|>", " b"}));
}

TEST(TokenizerDetokenizer, HoldsSplitCodePointsAndReplacesInvalid) {
  Tokenizer t = Tokenizer::from_ranks(small_ranks({}), kKimiPattern, {{"<|x|>", 300}});
  Detokenizer d(t);
  EXPECT_EQ(d.push(0xF0), "");
  EXPECT_EQ(d.push(0x9F), "");
  EXPECT_EQ(d.push(0x98), "");
  EXPECT_EQ(d.pending_bytes(), 3u);
  EXPECT_EQ(d.push(0x80), "\xF0\x9F\x98\x80");
  EXPECT_EQ(d.push(0xC3), "");
  EXPECT_EQ(d.push('A'), "\xEF\xBF\xBD" "A");  // C3 followed by 'A' can never complete
  EXPECT_EQ(d.push(300), "<|x|>");
  EXPECT_EQ(d.push(0xE2), "");
  EXPECT_EQ(d.flush(), "\xEF\xBF\xBD");
  Detokenizer skip(t, /*skip_special=*/true);
  EXPECT_EQ(skip.push(300), "");
  EXPECT_EQ(skip.push('z'), "z");
}

TEST(TokenizerErrors, BadVocabulariesAreNamed) {
  GgufVocab v;
  v.source = "m.gguf";
  for (int b = 0; b < 256; ++b) v.tokens.push_back(gpt2_encode(std::string(1, static_cast<char>(b))));
  v.merges = {"a b"};
  EXPECT_NE(error_of([&] { Tokenizer::from_vocab(v); }).find("m.gguf: tokenizer.ggml.merges[0] = 'a b': 'ab' is not a token"),
            std::string::npos);
  v.merges = {"ab"};
  EXPECT_NE(error_of([&] { Tokenizer::from_vocab(v); }).find("is not of the form 'A B'"), std::string::npos);
  v.merges.clear();
  v.pre = "llama3";
  EXPECT_NE(error_of([&] { Tokenizer::from_vocab(v); }).find("tokenizer.ggml.pre is 'llama3'"), std::string::npos);
  v.pre = "kimi-k2";
  v.types.assign(3, 1);
  EXPECT_NE(error_of([&] { Tokenizer::from_vocab(v); }).find("token_type has 3 entries, expected 256"), std::string::npos);
  v.types.clear();
  v.tokens[65] = "\xE4\xB8\x80";  // not GPT-2 mapped
  EXPECT_NE(error_of([&] { Tokenizer::from_vocab(v); }).find("tokens[65]"), std::string::npos);
  v.tokens.pop_back();
  v.tokens[65] = "A";
  EXPECT_NE(error_of([&] { Tokenizer::from_vocab(v); }).find("no token for the single byte 0xFF"), std::string::npos);
  v.tokens.push_back(gpt2_encode("\xFF"));
  v.eos = 9999;
  EXPECT_NE(error_of([&] { Tokenizer::from_vocab(v); }).find("eos_token_id = 9999 is out of range"), std::string::npos);
  v.eos = -1;
  Tokenizer t = Tokenizer::from_vocab(v);
  EXPECT_NE(error_of([&] { t.token_to_piece(256); }).find("token id 256 is out of range"), std::string::npos);
  EXPECT_NE(error_of([&] { std::vector<int32_t> ids{-1}; t.decode(ids); }).find("token id -1"), std::string::npos);
}

TEST(TokenizerErrors, BadRankFilesAreNamed) {
  EXPECT_NE(error_of([] { parse_tiktoken("YQ== 0\nYg== 1\n!!! 2\n", "r.tiktoken"); }).find("r.tiktoken:3:"),
            std::string::npos);
  EXPECT_NE(error_of([] { parse_tiktoken("YQ== x\n", "r.tiktoken"); }).find("r.tiktoken:1: expected"), std::string::npos);
  EXPECT_NE(error_of([] { parse_tiktoken("{\"bpe_ranks\": 5}", "e.json"); }).find("e.json: expected a tiktoken encoder"),
            std::string::npos);
  EXPECT_NE(error_of([] { Tokenizer::from_ranks({{"a", 0}, {"b", 0}}, kKimiPattern, {}); }).find("rank 0 is given twice"),
            std::string::npos);
  // a lone huge rank (or special id) in a tiny file must not allocate the id space up to it
  EXPECT_NE(error_of([] { Tokenizer::from_ranks({{"a", 0}, {"b", 224000001}}, kKimiPattern, {}); })
                .find("id 224000001 is out of range for 2 tokens"),
            std::string::npos);
  EXPECT_NE(error_of([] { Tokenizer::from_ranks({{"a", 0}}, kKimiPattern, {{"<x>", 70000}}); }).find("out of range"),
            std::string::npos);
  // ... while unused ids between the ranks and the specials stay fine
  const auto byte_ranks = small_ranks({});
  const int32_t nb = static_cast<int32_t>(byte_ranks.size());
  EXPECT_EQ(Tokenizer::from_ranks(byte_ranks, kKimiPattern, {{"<x>", nb + 1000}}).n_vocab(), nb + 1001);
  auto d = parse_tiktoken("{\"pat_str\": \"\\\\s+\", \"special_tokens\": {\"<e>\": 5}, \"bpe_ranks\": \"! 0 YQ== Yg==\\n! 3 Yw==\"}",
                          "e.json");
  ASSERT_EQ(d.ranks.size(), 3u);
  EXPECT_EQ(d.ranks[2], (std::pair<std::string, int32_t>{"c", 3}));
  EXPECT_EQ(d.pattern, "\\s+");
  EXPECT_EQ(d.specials.at("<e>"), 5);
  std::string out;
  EXPECT_TRUE(base64_decode("aGk=", out));
  EXPECT_EQ(out, "hi");
  EXPECT_FALSE(base64_decode("aGk", out));
  EXPECT_FALSE(base64_decode("a=Gk", out));
}
