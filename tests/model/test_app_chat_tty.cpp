// `kimi chat` on a terminal (a pseudo-terminal from forkpty): a line left unfinished when Ctrl-D
// ends the input is not sent, model text reaches the terminal with its control characters escaped,
// and a template note is shown once, not every turn.
#include <gtest/gtest.h>

#include <poll.h>
#include <pty.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <string>

#include "test_util.h"

namespace {

struct Pty {
  int fd = -1;
  pid_t pid = -1;
  std::string out;
  // Reads until `want` appears after `from` (or the child ends / 60 s pass).
  bool read_until(const std::string& want, size_t from = 0) {
    const auto end = std::chrono::steady_clock::now() + std::chrono::seconds(60);
    while (out.find(want, from) == std::string::npos) {
      if (std::chrono::steady_clock::now() > end) return false;
      pollfd p{fd, POLLIN, 0};
      if (::poll(&p, 1, 200) <= 0) continue;
      char b[4096];
      const ssize_t n = ::read(fd, b, sizeof b);
      if (n <= 0) return out.find(want, from) != std::string::npos;
      out.append(b, static_cast<size_t>(n));
    }
    return true;
  }
  void send(const std::string& s) { ASSERT_EQ(::write(fd, s.data(), s.size()), static_cast<ssize_t>(s.size())); }
  int wait_exit() {
    read_until("\x01\x02never");  // drain to EOF
    int st = 0;
    ::waitpid(pid, &st, 0);
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
  }
};

Pty start_chat(const std::string& extra) {
  Pty p;
  const std::string model = kimi::test::tiny_gguf();
  p.pid = ::forkpty(&p.fd, nullptr, nullptr, nullptr);
  if (p.pid == 0) {
    const std::string cmd = std::string(KIMI_BIN) + " chat -m '" + model + "' -t 1 --seed 3 " + extra;
    ::execl("/bin/sh", "sh", "-c", cmd.c_str(), static_cast<char*>(nullptr));
    ::_exit(127);
  }
  return p;
}

size_t count(const std::string& s, const std::string& what) {
  size_t n = 0;
  for (size_t p = s.find(what); p != std::string::npos; p = s.find(what, p + 1)) ++n;
  return n;
}

}  // namespace

TEST(ChatTty, UnfinishedLineIsNotSentOnCtrlD) {
  Pty p = start_chat("--thinking off -n 8");
  ASSERT_GT(p.pid, 0);
  ASSERT_TRUE(p.read_until("> ")) << p.out;
  p.send("hello\n");
  ASSERT_TRUE(p.read_until("[prompt ")) << p.out;
  ASSERT_TRUE(p.read_until("> ", p.out.find("[prompt "))) << p.out;
  p.send("half a line");
  p.send("\x04");  // flushes the partial line to the reader
  p.send("\x04");  // end of input
  EXPECT_EQ(p.wait_exit(), 0) << p.out;
  EXPECT_EQ(count(p.out, "[prompt "), 1u) << "the unfinished line was sent: " << p.out;
  EXPECT_NE(p.out.find("(the unfinished line was not sent)"), std::string::npos) << p.out;
}

TEST(ChatTty, ModelControlCharactersAreEscapedAndNotesShownOnce) {
  Pty p = start_chat("--thinking off -n 48 --temp 1.5");
  ASSERT_GT(p.pid, 0);
  ASSERT_TRUE(p.read_until("> ")) << p.out;
  for (int i = 0; i < 3; ++i) {
    const size_t from = p.out.size();
    p.send("tell me more " + std::to_string(i) + "\n");
    ASSERT_TRUE(p.read_until("[prompt ", from)) << p.out;
    ASSERT_TRUE(p.read_until("> ", p.out.find("[prompt ", from))) << p.out;
  }
  p.send("/exit\n");
  EXPECT_EQ(p.wait_exit(), 0) << p.out;
  // the terminal got no raw control bytes (the pty adds \r to each \n); thinking is off, so the
  // program itself sends no escape sequences either
  for (unsigned char c : p.out)
    EXPECT_TRUE(c >= 0x20 || c == '\n' || c == '\r' || c == '\t') << "raw control byte " << int(c);
  EXPECT_LE(count(p.out, "note: "), 1u) << p.out;
}
