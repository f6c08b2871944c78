// Vocabulary pieces of the converter: GPT-2 byte mapping, base64 / tiktoken parsing and the merges
// reconstruction of k3-architecture.md §4.1, on a hand-made rank table with hand-derived merges.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "convert/vocab.h"
#include "util/error.h"

using namespace kimi::convert;

namespace {
std::string utf8(uint32_t cp) {  // code points < 0x800 are enough here
  std::string s;
  if (cp < 0x80) {
    s += static_cast<char>(cp);
  } else {
    s += static_cast<char>(0xC0 | (cp >> 6));
    s += static_cast<char>(0x80 | (cp & 0x3F));
  }
  return s;
}
}  // namespace

TEST(ConvertVocab, Gpt2ByteMapping) {
  const auto& t = gpt2_byte_to_unicode();
  // printable ASCII and Latin-1 map to themselves
  EXPECT_EQ(t['a'], "a");
  EXPECT_EQ(t['!'], "!");
  EXPECT_EQ(t['~'], "~");
  EXPECT_EQ(t[0xA1], utf8(0xA1));
  EXPECT_EQ(t[0xAC], utf8(0xAC));
  EXPECT_EQ(t[0xAE], utf8(0xAE));
  EXPECT_EQ(t[0xFF], utf8(0xFF));
  // the 68 others: 0..32 -> U+0100..U+0120, 127 -> U+0121, 128..160 -> U+0122..U+0142, 173 -> U+0143
  EXPECT_EQ(t[0x00], utf8(0x100));
  EXPECT_EQ(t[' '], utf8(0x120));   // "Ġ"
  EXPECT_EQ(t['\n'], utf8(0x10A));  // "Ċ"
  EXPECT_EQ(t[0x7F], utf8(0x121));
  EXPECT_EQ(t[0x80], utf8(0x122));
  EXPECT_EQ(t[0xA0], utf8(0x142));
  EXPECT_EQ(t[0xAD], utf8(0x143));
  // all distinct, and decode inverts encode
  std::string all;
  for (int b = 0; b < 256; ++b) all += static_cast<char>(b);
  std::string enc = gpt2_encode_bytes(all), dec;
  ASSERT_TRUE(gpt2_decode(enc, &dec));
  EXPECT_EQ(dec, all);
  EXPECT_FALSE(gpt2_decode(utf8(0x144), &dec));  // not in the table
  EXPECT_FALSE(gpt2_decode("\xE4\xB8\xAD", &dec));
}

TEST(ConvertVocab, Base64) {
  std::string out;
  ASSERT_TRUE(base64_decode("aGVsbG8=", &out));
  EXPECT_EQ(out, "hello");
  ASSERT_TRUE(base64_decode("IA==", &out));
  EXPECT_EQ(out, " ");
  ASSERT_TRUE(base64_decode("4pyF", &out));
  EXPECT_EQ(out, "\xE2\x9C\x85");
  ASSERT_TRUE(base64_decode("/w", &out));  // padding optional
  EXPECT_EQ(out, "\xFF");
  EXPECT_FALSE(base64_decode("a*==", &out));
  EXPECT_FALSE(base64_decode("aGVs=bG8", &out));  // data after padding
}

TEST(ConvertVocab, TiktokenParse) {
  auto r = parse_tiktoken("Yg== 1\nYQ== 0\n\nYWI= 2\n", "t.model");
  ASSERT_EQ(r.size(), 3u);
  EXPECT_EQ(r[0], "a");
  EXPECT_EQ(r[1], "b");
  EXPECT_EQ(r[2], "ab");
  auto msg = [](const std::string& text) {
    try {
      parse_tiktoken(text, "t.model");
    } catch (const kimi::Error& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  EXPECT_NE(msg("YQ== 0\nYg== 0\n").find("rank 0 appears twice"), std::string::npos);
  EXPECT_NE(msg("YQ== 0\nYg== 5\n").find("rank 5 out of range"), std::string::npos);
  EXPECT_NE(msg("YQ== 0\nYQ== 1\n").find("duplicates"), std::string::npos);
  EXPECT_NE(msg("YQ==0\n").find("t.model:1"), std::string::npos);
  EXPECT_NE(msg("YQ== 0\n*** 1\n").find("t.model:2: invalid base64"), std::string::npos);
  EXPECT_NE(msg("YQ== x\n").find("invalid rank"), std::string::npos);
}

// Hand-made table. Expected merges derived by hand from the rule "BPE with only merges whose
// result has rank < R, lowest rank first, leftmost on ties; emit when two pieces remain".
TEST(ConvertVocab, MergesFromRanks) {
  std::vector<std::string> ranks = {
      "a", "b", "c", "d", " ", "\n",  // 0..5 single bytes
      "ab",                           // 6: a,b -> "a b"
      "cd",                           // 7: "c d"
      "abcd",                         // 8: ab(6) then cd(7) -> [ab, cd] -> "ab cd"
      "bc",                           // 9: "b c"
      "abc",                          // 10: ab(6) beats bc(9) -> [ab, c] -> "ab c"
      "bcd",                          // 11: cd(7) beats bc(9) -> [b, cd] -> "b cd"
      "aa",                           // 12: "a a"
      "aaa",                          // 13: aa at 0 and 1 tie -> leftmost -> [aa, a] -> "aa a"
      "dca",                          // 14: no dc / ca -> 3 pieces -> no merge line
      " a",                           // 15: "Ġ a"
      "\n\n",                         // 16: "Ċ Ċ"
      "\xC3", "\xA9",                 // 17, 18 single bytes
      "\xC3\xA9",                     // 19: "Ã ©"
      "abab",                         // 20: [ab, ab] -> "ab ab"
      "ababc",                        // 21: ab,ab,c -> abab(20) is < 21 and abc(10) too: abc(10) lowest
                                      //     a,b,a,b,c: ab(6)@0 -> [ab,a,b,c]; ab(6)@1 -> [ab,ab,c];
                                      //     pairs abab(20), abc(10) -> [ab, abc] -> "ab abc"
  };
  auto m = reconstruct_merges(ranks);
  std::vector<std::string> want = {
      "a b", "c d", "ab cd", "b c", "ab c", "b cd", "a a", "aa a",
      "\xC4\xA0 a",                  // Ġ a
      "\xC4\x8A \xC4\x8A",           // Ċ Ċ
      "\xC3\x83 \xC2\xA9",           // Ã ©
      "ab ab", "ab abc",
  };
  EXPECT_EQ(m, want);
}

TEST(ConvertVocab, MergesRankLimitMatters) {
  // "xyz" (rank 3) must not use "yz" (rank 4) which comes later: x,y,z has no pair < 3 except none
  // -> 3 pieces -> no line; "yz" itself -> "y z".
  std::vector<std::string> ranks = {"x", "y", "z", "xyz", "yz", "xy"};
  auto m = reconstruct_merges(ranks);
  std::vector<std::string> want = {"y z", "x y"};
  EXPECT_EQ(m, want);
}
