// util/progress: size parsing for --split-max-size, byte/duration formatting, and the progress
// reporter's plain-line and quiet modes (bar mode needs a terminal and is not tested here).
#include <gtest/gtest.h>

#include <cstdio>
#include <string>

#include "util/error.h"
#include "util/progress.h"

TEST(ConvertProgress, ParseSize) {
  EXPECT_EQ(kimi::parse_size("4096"), 4096u);
  EXPECT_EQ(kimi::parse_size("500M"), 500000000u);
  EXPECT_EQ(kimi::parse_size("2G"), 2000000000u);
  EXPECT_EQ(kimi::parse_size("2g"), 2000000000u);
  EXPECT_EQ(kimi::parse_size("1.5GB"), 1500000000u);
  EXPECT_EQ(kimi::parse_size("64K"), 64000u);
  EXPECT_EQ(kimi::parse_size("1T"), 1000000000000u);
  EXPECT_EQ(kimi::parse_size("1MiB"), 1048576u);
  EXPECT_EQ(kimi::parse_size("3GiB"), 3u * 1024 * 1024 * 1024);
  for (const char* bad : {"", "M", "12Q", "1.2.3M", "0", "-5M", "1e3"}) {
    try {
      kimi::parse_size(bad);
      ADD_FAILURE() << "accepted '" << bad << "'";
    } catch (const kimi::Error& e) {
      EXPECT_NE(std::string(e.what()).find(std::string("'") + bad + "'"), std::string::npos) << e.what();
    }
  }
}

TEST(ConvertProgress, Formatting) {
  EXPECT_EQ(kimi::format_bytes(512), "512 B");
  EXPECT_EQ(kimi::format_bytes(1536), "1.50 KiB");
  EXPECT_EQ(kimi::format_bytes(12ull << 20), "12.0 MiB");
  EXPECT_EQ(kimi::format_bytes(300ull << 30), "300 GiB");
  EXPECT_EQ(kimi::format_duration(12.34), "12.3s");
  EXPECT_EQ(kimi::format_duration(185), "3m05s");
  EXPECT_EQ(kimi::format_duration(3720), "1h02m");
}

namespace {
std::string read_all(FILE* f) {
  std::rewind(f);
  std::string s;
  char buf[256];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof buf, f)) > 0) s.append(buf, n);
  return s;
}
}  // namespace

TEST(ConvertProgress, LinesAndQuiet) {
  FILE* f = std::tmpfile();
  ASSERT_NE(f, nullptr);
  {
    kimi::Progress p("convert", 3, 300, kimi::Progress::Mode::Lines, f);
    for (int i = 0; i < 3; ++i) {
      p.add_bytes(100);
      p.item_done("t" + std::to_string(i));
    }
    EXPECT_EQ(p.items_done(), 3u);
    EXPECT_EQ(p.bytes_done(), 300u);
  }
  EXPECT_EQ(read_all(f), "convert [1/3] t0\nconvert [2/3] t1\nconvert [3/3] t2\n");
  std::fclose(f);

  FILE* q = std::tmpfile();
  {
    kimi::Progress p("verify", 2, 10, kimi::Progress::Mode::Quiet, q);
    p.add_bytes(10);
    p.item_done("a");
    p.item_done("b");
  }
  EXPECT_EQ(read_all(q), "");
  std::fclose(q);

  FILE* b = std::tmpfile();  // bar mode forced: one line redrawn with \r, ends in a newline
  {
    kimi::Progress p("convert", 2, 10, kimi::Progress::Mode::Bar, b);
    p.add_bytes(10);
    p.item_done("x");
    p.item_done("y");
  }
  std::string s = read_all(b);
  std::fclose(b);
  EXPECT_NE(s.find("100%"), std::string::npos) << s;
  EXPECT_NE(s.find("2/2 tensors"), std::string::npos) << s;
  EXPECT_EQ(s.back(), '\n');
}
