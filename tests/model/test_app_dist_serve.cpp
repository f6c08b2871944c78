// `mpirun -np 2 kimi serve` (docs/distributed.md) answers completion and chat requests exactly like a
// single-process `kimi serve` on the tiny model (greedy; a second request that shares the first one's
// prefix goes through the prompt cache: sequence copies and KDA snapshots replayed on the worker).
// Runs only in a build with MPI.
#include <gtest/gtest.h>
#include <httplib.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <nlohmann/json.hpp>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "test_util.h"

namespace {

using ojson = nlohmann::json;

struct Served {
  pid_t pid = -1;
  int port = 0;
  std::string first_line;
};

// starts `sh -c CMD` with stdout on a pipe; waits for the "127.0.0.1:PORT" line
Served start(const std::string& cmd) {
  Served s;
  int out[2];
  if (::pipe(out) != 0) return s;
  s.pid = ::fork();
  if (s.pid == 0) {
    ::dup2(out[1], 1);
    ::close(out[0]);
    ::execl("/bin/sh", "sh", "-c", cmd.c_str(), static_cast<char*>(nullptr));
    ::_exit(127);
  }
  ::close(out[1]);
  char ch;
  while (::read(out[0], &ch, 1) == 1 && ch != '\n') s.first_line += ch;
  const size_t p = s.first_line.find("127.0.0.1:");
  if (p != std::string::npos) s.port = std::stoi(s.first_line.substr(p + 10));
  return s;
}

// SIGTERM to the server: to the process itself, or under mpirun to rank 0 (its graceful shutdown
// closes the model, which ends the workers with status 0; a signal to mpirun itself ends every rank
// and mpirun reports 1)
int stop(const Served& s, bool mpi = false) {
  if (s.pid <= 0) return -1;
  pid_t target = s.pid;
  if (mpi) {
    const std::string find = "for p in $(pgrep -P " + std::to_string(s.pid) +
                             "); do grep -qz '^OMPI_COMM_WORLD_RANK=0$' /proc/$p/environ && echo $p; done";
    FILE* f = ::popen(find.c_str(), "r");
    char buf[64] = {};
    if (f && std::fgets(buf, sizeof buf, f)) target = std::atoi(buf);
    if (f) ::pclose(f);
  }
  ::kill(target, SIGTERM);
  int st = 0;
  ::waitpid(s.pid, &st, 0);
  return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
}

std::string post(int port, const std::string& path, const ojson& body) {
  httplib::Client c("127.0.0.1", port);
  c.set_read_timeout(120, 0);
  auto r = c.Post(path, body.dump(), "application/json");
  if (!r) return "no response";
  return std::to_string(r->status) + " " + r->body;
}

// the generated text of a completion / chat response
std::string text_of(const std::string& resp) {
  const auto sp = resp.find(' ');
  if (resp.substr(0, sp) != "200") return resp;
  const ojson j = ojson::parse(resp.substr(sp + 1));
  const auto& c = j["choices"][0];
  return c.contains("text") ? c["text"].get<std::string>() : c["message"]["content"].get<std::string>();
}

TEST(DistServe, AnswersLikeOneProcess) {
#ifndef KIMI_HAVE_MPI
  GTEST_SKIP() << "built without MPI (KIMI_MPI)";
#endif
  const std::string model = kimi::test::tiny_gguf(1);
  const std::string args = std::string(" serve -m '") + model + "' --port 0 -t 1 -c 512 2>/dev/null";
  const std::vector<std::pair<std::string, ojson>> requests = {
      {"/v1/completions", {{"prompt", "The quick brown fox"}, {"max_tokens", 16}, {"temperature", 0}}},
      {"/v1/completions",  // shares the first prompt's prefix: the prompt cache
       {{"prompt", "The quick brown fox jumps over"}, {"max_tokens", 16}, {"temperature", 0}}},
      {"/v1/chat/completions",
       {{"messages", {{{"role", "user"}, {"content", "Hello there"}}}},
        {"max_tokens", 12},
        {"temperature", 0},
        {"thinking", false}}},
  };
  auto run = [&](const std::string& launcher, bool mpi) {
    Served s = start(launcher + std::string(KIMI_BIN) + args);
    std::vector<std::string> got;
    if (s.port == 0) {
      ADD_FAILURE() << launcher << ": no port in '" << s.first_line << "'";
      stop(s, mpi);
      return got;
    }
    for (const auto& [path, body] : requests) got.push_back(text_of(post(s.port, path, body)));
    EXPECT_EQ(stop(s, mpi), 0) << launcher;  // graceful on rank 0, the workers end with it
    return got;
  };
  const auto one = run("exec ", false);
  const auto two = run("export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1; exec mpirun --oversubscribe -np 2 ",
                       true);
  ASSERT_EQ(one.size(), requests.size());
  ASSERT_EQ(two.size(), requests.size());
  for (size_t i = 0; i < one.size(); ++i) {
    EXPECT_FALSE(one[i].empty()) << i;
    EXPECT_EQ(two[i], one[i]) << "request " << i;
  }
}

}  // namespace
