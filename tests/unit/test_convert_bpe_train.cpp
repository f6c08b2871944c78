// BPE training for synthetic vocabularies: pre-split, merge properties, round trip, tiktoken file.
#include <gtest/gtest.h>

#include <map>
#include <set>
#include <string>
#include <unordered_map>
#include <vector>

#include "convert/bpe_train.h"
#include "convert/synth_corpus.h"
#include "util/error.h"

using kimi::bpe::pre_split;

namespace {

std::vector<std::string> split(const std::string& s) {
  std::vector<std::string> out;
  for (auto v : pre_split(s)) out.emplace_back(v);
  return out;
}

// Test-side tiktoken encoder: repeatedly merge the adjacent pair whose concatenation has the
// lowest rank (below `limit`), as tiktoken / llama.cpp do.
std::vector<std::string> encode_chunk(const std::unordered_map<std::string, size_t>& rank, const std::string& s,
                                      size_t limit = SIZE_MAX) {
  std::vector<std::string> p;
  for (char c : s) p.emplace_back(1, c);
  for (;;) {
    size_t best = SIZE_MAX, best_rank = SIZE_MAX;
    for (size_t i = 0; i + 1 < p.size(); ++i) {
      auto it = rank.find(p[i] + p[i + 1]);
      if (it != rank.end() && it->second < limit && it->second < best_rank) best_rank = it->second, best = i;
    }
    if (best == SIZE_MAX) break;
    p[best] += p[best + 1];
    p.erase(p.begin() + long(best) + 1);
  }
  return p;
}

std::string b64decode(const std::string& s) {
  auto val = [](char c) -> int {
    if (c >= 'A' && c <= 'Z') return c - 'A';
    if (c >= 'a' && c <= 'z') return c - 'a' + 26;
    if (c >= '0' && c <= '9') return c - '0' + 52;
    if (c == '+') return 62;
    if (c == '/') return 63;
    return -1;
  };
  std::string out;
  uint32_t acc = 0;
  int bits = 0;
  for (char c : s) {
    if (c == '=') break;
    int v = val(c);
    EXPECT_GE(v, 0) << "bad base64 char in " << s;
    acc = (acc << 6) | uint32_t(v);
    bits += 6;
    if (bits >= 8) {
      bits -= 8;
      out += char((acc >> bits) & 0xff);
    }
  }
  return out;
}

}  // namespace

TEST(BpeTrain, PreSplitFollowsKimiRegexShapes) {
  EXPECT_EQ(split("Hello world's 12345 foo!!\n\n  bar"),
            (std::vector<std::string>{"Hello", " world's", " ", "123", "45", " foo", "!!\n\n", " ", " bar"}));
  EXPECT_EQ(split("中文abc 你好，世界"), (std::vector<std::string>{"中文", "abc", " ", "你好", "，", "世界"}));
  EXPECT_EQ(split(" café naïve"), (std::vector<std::string>{" café", " naïve"}));
  EXPECT_EQ(split("x = a[i];\n\treturn"), (std::vector<std::string>{"x", " =", " a", "[i", "];\n", "\treturn"}));
  EXPECT_EQ(split("end  \n"), (std::vector<std::string>{"end", "  \n"}));
  EXPECT_EQ(split("a   "), (std::vector<std::string>{"a", "   "}));
  EXPECT_EQ(split("I'LL we're"), (std::vector<std::string>{"I'LL", " we're"}));
  EXPECT_TRUE(split("").empty());
}

TEST(BpeTrain, PreSplitTilesAnyInput) {
  // generated text plus invalid UTF-8 and control bytes: chunks must concatenate to the input
  std::string text = kimi::synth::make_corpus(20000, 3);
  text += std::string("\xff\xfe\xc3(\xe4\xb8 \x01\x02 tail\r\n");
  std::string joined;
  for (auto c : pre_split(text)) {
    EXPECT_FALSE(c.empty());
    joined += c;
  }
  EXPECT_EQ(joined, text);
}

TEST(BpeTrain, CorpusIsDeterministicAndVaried) {
  std::string a = kimi::synth::make_corpus(50000), b = kimi::synth::make_corpus(50000);
  EXPECT_EQ(a, b);
  EXPECT_GE(a.size(), 50000u);
  EXPECT_EQ(kimi::synth::make_corpus(100000).substr(0, a.size()), a);  // longer text extends the shorter
  EXPECT_NE(kimi::synth::make_corpus(50000, 7), a);
  // spaces, punctuation, digits, newlines, accented letters (2-byte UTF-8), CJK (3-byte UTF-8)
  for (const char* needle : {" ", ".", ",", "\n", "0", "7", "é", "ü"}) EXPECT_NE(a.find(needle), std::string::npos) << needle;
  bool cjk = false;
  for (size_t i = 0; i + 2 < a.size(); ++i) {
    auto c = static_cast<unsigned char>(a[i]);
    if (c >= 0xE4 && c <= 0xE9) cjk = true;  // U+4000..U+9FFF lead bytes
  }
  EXPECT_TRUE(cjk);
}

TEST(BpeTrain, Base64MatchesRfc4648) {
  using kimi::bpe::base64_encode;
  EXPECT_EQ(base64_encode(""), "");
  EXPECT_EQ(base64_encode("f"), "Zg==");
  EXPECT_EQ(base64_encode("fo"), "Zm8=");
  EXPECT_EQ(base64_encode("foo"), "Zm9v");
  EXPECT_EQ(base64_encode("foob"), "Zm9vYg==");
  EXPECT_EQ(base64_encode("fooba"), "Zm9vYmE=");
  EXPECT_EQ(base64_encode("foobar"), "Zm9vYmFy");
  EXPECT_EQ(base64_encode(std::string("\xff\xfe\x00", 3)), "//4A");
}

TEST(BpeTrain, MostFrequentPairFirst) {
  std::string text;
  for (int i = 0; i < 100; ++i) text += " the";
  for (int i = 0; i < 30; ++i) text += " xy";
  kimi::bpe::TrainOptions o;
  o.n_tokens = 259;
  auto t = kimi::bpe::train(text, o);
  ASSERT_EQ(t.size(), 259u);
  // pairs ( ,t) (t,h) (h,e) occur 100 times, ( ,x) (x,y) 30: the three frequent ones are merged
  // first, ties by smaller ids: " t" (32,116); then ("h","e") beats (" t","h"); then " t"+"he"
  EXPECT_EQ(t[256], " t");
  EXPECT_EQ(t[257], "he");
  EXPECT_EQ(t[258], " the");
}

TEST(BpeTrain, TooLittleTextIsAnError) {
  kimi::bpe::TrainOptions o;
  o.n_tokens = 300;
  EXPECT_THROW(kimi::bpe::train("ab ab ab", o), kimi::Error);
  o.n_tokens = 100;
  EXPECT_THROW(kimi::bpe::train("abc", o), kimi::Error);
}

class BpeVocab : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    text_ = new std::string(kimi::synth::make_corpus(128 << 10));
    kimi::bpe::TrainOptions o;
    o.n_tokens = 2048;
    size_t calls = 0;
    o.progress = [&](size_t done, size_t total) {
      ++calls;
      EXPECT_LE(done, total);
    };
    tokens_ = new std::vector<std::string>(kimi::bpe::train(*text_, o));
    EXPECT_GE(calls, 2u);
  }
  static void TearDownTestSuite() {
    delete text_;
    delete tokens_;
  }
  static std::string* text_;
  static std::vector<std::string>* tokens_;
};
std::string* BpeVocab::text_ = nullptr;
std::vector<std::string>* BpeVocab::tokens_ = nullptr;

TEST_F(BpeVocab, BytesThenConcatenationsOfEarlierTokens) {
  const auto& t = *tokens_;
  ASSERT_EQ(t.size(), 2048u);
  for (int b = 0; b < 256; ++b) ASSERT_EQ(t[b], std::string(1, char(b))) << b;
  std::unordered_map<std::string, size_t> rank;
  for (size_t r = 0; r < t.size(); ++r) ASSERT_TRUE(rank.emplace(t[r], r).second) << "duplicate token at " << r;
  for (size_t r = 256; r < t.size(); ++r) {
    ASSERT_GE(t[r].size(), 2u);
    bool found = false;
    for (size_t k = 1; k < t[r].size() && !found; ++k) {
      auto a = rank.find(t[r].substr(0, k)), b = rank.find(t[r].substr(k));
      found = a != rank.end() && b != rank.end() && a->second < r && b->second < r;
    }
    EXPECT_TRUE(found) << "token " << r << " is not two earlier tokens";
  }
}

TEST_F(BpeVocab, MergesReconstructLikeTheConverter) {
  // k3-architecture.md §4.1: BPE on a token's bytes with only lower ranks ends in exactly two pieces
  const auto& t = *tokens_;
  std::unordered_map<std::string, size_t> rank;
  for (size_t r = 0; r < t.size(); ++r) rank.emplace(t[r], r);
  size_t two = 0;
  for (size_t r = 256; r < t.size(); ++r) two += encode_chunk(rank, t[r], r).size() == 2;
  EXPECT_EQ(two, t.size() - 256);
}

TEST_F(BpeVocab, EncodingTheTrainingTextRoundTripsAndCompresses) {
  const auto& t = *tokens_;
  std::unordered_map<std::string, size_t> rank;
  for (size_t r = 0; r < t.size(); ++r) rank.emplace(t[r], r);
  std::string decoded;
  size_t n_tokens = 0;
  std::map<std::string, std::vector<std::string>> memo;
  for (auto chunk : pre_split(*text_)) {
    std::string c(chunk);
    auto it = memo.find(c);
    if (it == memo.end()) it = memo.emplace(c, encode_chunk(rank, c)).first;
    for (auto& piece : it->second) {
      ASSERT_TRUE(rank.count(piece));
      decoded += piece;
    }
    n_tokens += it->second.size();
  }
  EXPECT_EQ(decoded, *text_);
  // a learned vocabulary compresses its own training text well (bytes would be 1.0)
  EXPECT_GT(double(text_->size()) / double(n_tokens), 2.5);
}

TEST_F(BpeVocab, TiktokenFileFormat) {
  const auto& t = *tokens_;
  std::string file = kimi::bpe::to_tiktoken(t);
  size_t pos = 0, line = 0;
  while (pos < file.size()) {
    size_t nl = file.find('\n', pos);
    ASSERT_NE(nl, std::string::npos);
    std::string l = file.substr(pos, nl - pos);
    size_t sp = l.find(' ');
    ASSERT_NE(sp, std::string::npos) << l;
    EXPECT_EQ(l.substr(sp + 1), std::to_string(line));
    EXPECT_EQ(b64decode(l.substr(0, sp)), t[line]) << "line " << line;
    pos = nl + 1;
    ++line;
  }
  EXPECT_EQ(line, t.size());
}

TEST_F(BpeVocab, Deterministic) {
  kimi::bpe::TrainOptions o;
  o.n_tokens = 2048;
  EXPECT_EQ(kimi::bpe::train(*text_, o), *tokens_);
  o.n_tokens = 1000;  // a smaller vocabulary is a prefix of the larger one
  auto small = kimi::bpe::train(*text_, o);
  EXPECT_TRUE(std::equal(small.begin(), small.end(), tokens_->begin()));
}
