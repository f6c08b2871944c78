// Every `kimi ...` example in README.md and docs/*.md runs as written (one test per file).
//
// The examples are the lines of the fenced code blocks that start a kimi command (`kimi`,
// `build/kimi`, `mpirun ... kimi`, after VAR=value prefixes). They run in document order with bash,
// in one scratch directory per file that holds what the docs assume: `data/`, `tools/`, `README.md`
// and `docs/` (links to the source tree), and the demo's model `models/small.gguf` (also as
// `small.gguf`, with its projector file `models/small.mmproj.gguf`; README.md's examples make
// `models/small-hf` and convert it again themselves) and
// `models/small-k3.gguf` (the same with `--no-indexer`, plain K3). The stand-in: those are the
// *tiny* preset made the same way as the demo makes the small one (`kimi synth --preset tiny --seed 7`,
// `kimi convert`), not the 1.35 GiB small preset, so that the whole set runs in a few minutes on two
// cores; for the same reason `--preset small` in an example becomes `--preset tiny` (kSubstitutions).
// In the blocks that hold an example, these other lines run too, in order: `VAR=value`, `echo ... >`,
// `cmp`, and `curl` (against the `kimi serve` started by an earlier line of the block: its port
// becomes a free one; curl's answer must be JSON without an "error"). Other lines (builds, system
// tools) are not run. Usage synopses and what needs absent hardware, a cluster or the real 1.5 TB
// model are skipped by the patterns in kSkips, each with its reason (printed per example).
// A failing example fails the test with `FILE:LINE: the command`, its exit status and its output.
#include <gtest/gtest.h>

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <regex>
#include <string>
#include <thread>
#include <vector>

#include "test_util.h"

namespace fs = std::filesystem;

namespace {

struct Example {
  int line = 0;
  std::string cmd;
  bool kimi = false;  // a kimi command (else a support line: VAR=, echo >, cmp, curl)
  int block = 0;
};

// An example matching `pattern` is not run; `why` is printed.
struct Skip {
  const char* pattern;
  const char* why;
};
const Skip kSkips[] = {
    {R"(\[|\bM\.gguf\b|\bIN\.gguf\b|\bMODEL\.gguf\b|\bREQUEST\.json\b|\bRANKS_FILE\b|\b(TEXT|FILE|CTX|BATCH|THREADS|PATTERN)\b|\bkimi [a-z]+ \.\.\.)",
     "a usage synopsis (placeholders), not an example"},
    {R"(Kimi-K3\.1-Pro\.gguf|\bK3\.1\.gguf|/models/K3|shards/K3\.1)", "needs the real Kimi-K3.1 (1.5 TB)"},
    {R"(--hostfile|--host-file|-H [a-z])", "needs several machines (an MPI host file)"},
    {R"(--preset k3-layers)", "writes a multi-GB checkpoint (real K3 per-layer shapes)"},
    {R"(--preset (small|k3)\b.*--layers|--preset real)", "writes a multi-GB checkpoint"},
};
// The same for the other lines that run (VAR=, echo, cmp, curl).
const Skip kSupportSkips[] = {
    {R"(^cmp off512\.kld file512\.kld)",
     "holds for the small preset's file top-k 2048 >= 512; the tiny stand-in's top-k is 16 (differs, as it should)"},
};

// Applied to every example before it runs (the stand-in model; see the top of the file).
struct Substitution {
  const char* pattern;
  const char* replacement;
  const char* why;
};
const Substitution kSubstitutions[] = {
    {R"(--preset small\b)", "--preset tiny", "the stand-in for the demo's 1.35 GiB small preset"},
    {R"(-d 16384\b)", "-d 2048", "filling a 16384-token depth takes minutes on two cores; the flags are the same"},
};

std::string trim(const std::string& s) {
  const size_t b = s.find_first_not_of(" \t");
  if (b == std::string::npos) return "";
  return s.substr(b, s.find_last_not_of(" \t\r") - b + 1);
}

bool is_kimi_command(const std::string& l) {
  static const std::regex re(
      R"(^([A-Za-z_][A-Za-z0-9_]*=\S*\s+)*((/usr/bin/)?time(\s+-v)?\s+)?(mpirun\s.*\s)?(\./)?(build/)?kimi(\s|$))");
  static const std::regex piped(R"(\|\s*(\./)?(build/)?kimi\s)");  // ... | kimi CMD
  return std::regex_search(l, re) || std::regex_search(l, piped);
}
bool is_support(const std::string& l) {
  static const std::regex re(R"(^([A-Za-z_][A-Za-z0-9_]*=\S*$|echo\s.*>|cmp\s|curl\s))");
  return std::regex_search(l, re);
}

// The kimi examples and support lines of one markdown file, with their line numbers.
std::vector<Example> extract(const std::string& path) {
  std::ifstream f(path);
  std::vector<Example> out;
  std::string raw;
  int n = 0, block = 0;
  bool in = false;
  size_t indent = 0;
  std::vector<Example> cur;  // the current block's lines
  bool has_kimi = false;
  while (std::getline(f, raw)) {
    ++n;
    const std::string t = trim(raw);
    if (t.rfind("```", 0) == 0) {
      if (in && has_kimi) out.insert(out.end(), cur.begin(), cur.end());
      in = !in;
      indent = raw.find_first_not_of(" \t");
      cur.clear();
      has_kimi = false;
      ++block;
      continue;
    }
    if (!in) continue;
    std::string l = raw.size() > indent ? raw.substr(std::min(indent, raw.find_first_not_of(" \t"))) : "";
    const int first = n;
    // a line ending in '\' continues on the next one (both belong to the example)
    while (!l.empty() && l.back() == '\\' && std::getline(f, raw)) {
      ++n;
      l.pop_back();
      l += " " + trim(raw);
    }
    l = trim(l);
    if (l.empty() || l[0] == '#') continue;
    Example e;
    e.line = first;
    e.cmd = l;
    e.block = block;
    e.kimi = is_kimi_command(l);
    if (!e.kimi && !is_support(l)) continue;
    has_kimi = has_kimi || e.kimi;
    cur.push_back(e);
  }
  return out;
}

int free_port() {
  const int s = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof a;
  ::bind(s, reinterpret_cast<sockaddr*>(&a), sizeof a);
  ::getsockname(s, reinterpret_cast<sockaddr*>(&a), &len);
  ::close(s);
  return ntohs(a.sin_port);
}

std::string tail_lines(const std::string& s, int n) {
  size_t p = s.size();
  for (int i = 0; i <= n && p != std::string::npos && p > 0; ++i) p = s.rfind('\n', p - 1);
  return p == std::string::npos || p == 0 ? s : s.substr(p + 1);
}

// The scratch directory of one file's examples.
struct Workdir {
  kimi::test::TempDir dir;
  std::string bin;  // holds `kimi`
  Workdir() {
    const fs::path root(KIMI_SOURCE_DIR), w(dir.path);
    for (const char* p : {"data", "tools", "docs", "README.md"}) fs::create_symlink(root / p, w / p);
    fs::create_directories(w / "models");
    fs::create_directories(w / "bin");
    fs::create_directories(w / "build");
    fs::create_symlink(KIMI_BIN, w / "bin" / "kimi");
    fs::create_symlink(KIMI_BIN, w / "build" / "kimi");
    bin = (w / "bin").string();
    // the stand-in model (a copy: an example may rewrite it); README.md's own examples make
    // models/small-hf (synth) and then models/small.gguf again (convert)
    fs::copy_file(kimi::test::tiny_gguf(7), w / "models" / "small.gguf");
    // its vision projector file, as `kimi convert` writes it next to the model (docs/engine.md, "Images")
    fs::copy_file(fs::path(kimi::test::tiny_vision_dir(7)) / "model.mmproj.gguf", w / "models" / "small.mmproj.gguf");
    fs::create_symlink("models/small.gguf", w / "small.gguf");
    // the plain-K3 variant (no DSA indexer) the performance docs compare with llama.cpp on
    fs::copy_file(kimi::test::tiny_gguf(7, "--no-indexer"), w / "models" / "small-k3.gguf");
    kimi::test::write_file(dir.file("stdin.txt"), "Hello\n");
  }
};

struct Outcome {
  int status = -1;  // exit status, or 128 + signal
  std::string out;
};

// Runs `cmd` with bash in the workdir (stdin: one line "Hello"), output to a file.
Outcome run_shell(const Workdir& w, const std::string& prelude, const std::string& cmd, int timeout_s) {
  const std::string log = w.dir.file("out.txt");
  const pid_t pid = ::fork();
  if (pid == 0) {
    ::chdir(w.dir.path.c_str());
    const int in = ::open("stdin.txt", O_RDONLY), out = ::open(log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    ::dup2(in, 0);
    ::dup2(out, 1);
    ::dup2(out, 2);
    ::setenv("PATH", (w.bin + ":" + std::getenv("PATH")).c_str(), 1);
    ::setenv("OMPI_ALLOW_RUN_AS_ROOT", "1", 1);  // mpirun examples, when the tests run as root
    ::setenv("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1", 1);
    ::unsetenv("KIMI_CHAT_HISTORY");
    ::setenv("HOME", w.dir.path.c_str(), 1);
    const std::string script = prelude + cmd;
    ::execl("/usr/bin/timeout", "timeout", "-k", "10", std::to_string(timeout_s).c_str(), "/bin/bash", "-c",
            script.c_str(), static_cast<char*>(nullptr));
    ::_exit(127);
  }
  int st = 0;
  ::waitpid(pid, &st, 0);
  Outcome o;
  o.status = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
  o.out = kimi::test::read_file(log);
  return o;
}

// A `kimi serve` example, running in the background until its block ends.
struct Server {
  pid_t pid = -1;
  std::string log;
  bool start(const Workdir& w, const std::string& cmd, std::string& why) {
    log = w.dir.file("serve.txt");
    kimi::test::write_file(log, "");
    pid = ::fork();
    if (pid == 0) {
      ::chdir(w.dir.path.c_str());
      const int in = ::open("/dev/null", O_RDONLY), out = ::open(log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
      ::dup2(in, 0);
      ::dup2(out, 1);
      ::dup2(out, 2);
      ::setenv("PATH", (w.bin + ":" + std::getenv("PATH")).c_str(), 1);
      const std::string script = "exec " + cmd;
      ::execl("/bin/bash", "bash", "-c", script.c_str(), static_cast<char*>(nullptr));
      ::_exit(127);
    }
    const auto end = std::chrono::steady_clock::now() + std::chrono::seconds(120);
    while (std::chrono::steady_clock::now() < end) {
      if (kimi::test::read_file(log).find("listening on") != std::string::npos) return true;
      int st = 0;
      if (::waitpid(pid, &st, WNOHANG) == pid) {
        pid = -1;
        why = "the server ended before it listened";
        return false;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
    why = "the server did not say 'listening on' within 120 s";
    return false;
  }
  // SIGTERM; the exit status (-1: had to be killed)
  int stop() {
    if (pid < 0) return -1;
    ::kill(pid, SIGTERM);
    for (int i = 0; i < 300; ++i) {
      int st = 0;
      if (::waitpid(pid, &st, WNOHANG) == pid) {
        pid = -1;
        return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
    ::kill(pid, SIGKILL);
    ::waitpid(pid, nullptr, 0);
    pid = -1;
    return -1;
  }
  ~Server() { stop(); }
};

// What this build and machine have: the skips that depend on them.
struct Capabilities {
  bool vulkan = false, mpi = false, tiktoken = false;
  int vulkan_device = -1;  // -1: not probed yet
  // a Vulkan device is usable (probed at the first Vulkan example; CI and KIMI_REQUIRE_VULKAN=1
  // always run the examples, so a missing device fails there)
  bool vulkan_usable() {
    if (vulkan_device < 0) {
      const char* ci = std::getenv("CI");
      const char* req = std::getenv("KIMI_REQUIRE_VULKAN");
      vulkan_device = (ci && std::string(ci) == "true") || (req && std::string(req) == "1") ||
                      kimi::test::run_kimi("run -m " + kimi::test::tiny_gguf(7) + " --device vulkan --tokens 1 -n 1 --ids")
                              .exit_code == 0;
    }
    return vulkan_device == 1;
  }
  Capabilities() {
    const auto v = kimi::test::run_kimi("--version");
    vulkan = v.out.find("vulkan") != std::string::npos;
    mpi = v.out.find("mpi") != std::string::npos && std::system("command -v mpirun >/dev/null 2>&1") == 0;
    tiktoken = fs::exists(fs::path(KIMI_SOURCE_DIR) / "tools/tiktoken/node_modules/tiktoken/encoders/cl100k_base.json");
  }
};

// Why `cmd` is not run here ("" = it is run).
std::string skip_reason(const std::string& cmd, bool kimi, Capabilities& caps) {
  if (!kimi) {
    for (const Skip& s : kSupportSkips)
      if (std::regex_search(cmd, std::regex(s.pattern))) return s.why;
    return "";
  }
  for (const Skip& s : kSkips)
    if (std::regex_search(cmd, std::regex(s.pattern))) return s.why;
  if (cmd.find("--device vulkan") != std::string::npos && !caps.vulkan) return "this build has no Vulkan backend";
  if (cmd.find("--device vulkan") != std::string::npos && !caps.vulkan_usable()) return "no Vulkan device on this machine";
  if (cmd.rfind("mpirun", 0) == 0 && !caps.mpi) return "this build has no MPI (or there is no mpirun)";
  if (cmd.find("--tiktoken tools/tiktoken/node_modules") != std::string::npos && !caps.tiktoken)
    return "needs the npm tiktoken package (npm ci --prefix tools/tiktoken; scripts/setup.sh --test)";
  return "";
}

// A command without a leading build/ and a trailing comment (to find the same example twice).
std::string normalized(std::string c) {
  if (c.rfind("./", 0) == 0) c.erase(0, 2);
  if (c.rfind("build/", 0) == 0) c.erase(0, 6);
  const size_t h = c.find(" #");
  if (h != std::string::npos) c.resize(h);
  return trim(c);
}

class DocExamples : public ::testing::TestWithParam<std::string> {};

TEST_P(DocExamples, RunAsWritten) {
  const std::string rel = GetParam();
  if (std::string(KIMI_RUNNER).size() > 0) GTEST_SKIP() << "the docs' examples run with the native build only";
  const std::vector<Example> ex = extract(std::string(KIMI_SOURCE_DIR) + "/" + rel);
  if (ex.empty()) GTEST_SKIP() << rel << " has no kimi examples";
  Capabilities caps;
  const std::vector<Example> readme = extract(std::string(KIMI_SOURCE_DIR) + "/README.md");
  Workdir w;
  std::string prelude;           // the block's VAR=value lines so far
  Server server;
  int block = -1, port = 0;
  bool skipped_in_block = false;  // a support line after a skipped example is not run either
  int ran = 0, skipped = 0;
  auto end_block = [&](int line) {
    if (server.pid >= 0) {
      const int st = server.stop();
      EXPECT_EQ(st, 0) << rel << ":" << line << ": the `kimi serve` example did not exit 0 on SIGTERM:\n"
                       << tail_lines(kimi::test::read_file(server.log), 20);
    }
  };
  for (const Example& e : ex) {
    if (e.block != block) {
      end_block(e.line);
      block = e.block;
      prelude.clear();
      skipped_in_block = false;
      port = 0;
    }
    std::string cmd = e.cmd;
    const std::string where = rel + ":" + std::to_string(e.line);
    std::string why = skip_reason(cmd, e.kimi, caps);
    // an example README.md runs already is not run twice when it leaves nothing behind (run, bench)
    static const std::regex read_only(R"(^(build/)?kimi (run|bench) [^>]*$)");
    if (e.kimi && why.empty() && rel != "README.md" && std::regex_search(cmd, read_only)) {
      for (const Example& r : readme)
        if (r.kimi && normalized(r.cmd) == normalized(cmd)) why = "the same example as README.md:" + std::to_string(r.line) + " (run there)";
    }
    if (!e.kimi && skipped_in_block) why = "follows a skipped example";
    if (!e.kimi && cmd.rfind("curl", 0) == 0 && server.pid < 0 && why.empty())
      why = "no `kimi serve` example runs before it in its block";
    if (!why.empty()) {
      std::printf("[ skip ] %s: %s\n         (%s)\n", where.c_str(), cmd.c_str(), why.c_str());
      skipped_in_block = skipped_in_block || e.kimi;
      ++skipped;
      continue;
    }
    for (const Substitution& s : kSubstitutions) cmd = std::regex_replace(cmd, std::regex(s.pattern), s.replacement);
    // a server's port: a free one instead of the example's, in this line and the rest of the block
    static const std::regex port_re(R"((--port |localhost:|127\.0\.0\.1:)(\d{4,5}))");
    std::smatch m;
    if (e.kimi && cmd.find(" serve ") != std::string::npos) {
      const std::string written = std::regex_search(cmd, m, port_re) ? m[2].str() : "8080";
      port = free_port();
      cmd = std::regex_replace(cmd, std::regex("\\b" + written + "\\b"), std::to_string(port));
      if (cmd.find("--port") == std::string::npos) cmd += " --port " + std::to_string(port);
    } else if (port > 0) {
      static const std::regex host_port(R"((localhost:|127\.0\.0\.1:)\d{4,5})");
      std::string r;
      auto it = cmd.cbegin();
      for (std::smatch hm; std::regex_search(it, cmd.cend(), hm, host_port); it = hm[0].second)
        r += std::string(it, hm[0].first) + hm[1].str() + std::to_string(port);
      cmd = r + std::string(it, cmd.cend());
    }
    std::printf("[ run  ] %s: %s\n", where.c_str(), cmd.c_str());
    std::fflush(stdout);
    ++ran;
    if (e.kimi && cmd.find(" serve ") != std::string::npos) {
      std::string err;
      if (!server.start(w, cmd, err))
        ADD_FAILURE() << where << ": " << e.cmd << "\n" << err << ":\n" << tail_lines(kimi::test::read_file(server.log), 20);
      continue;
    }
    if (!e.kimi && cmd.find('=') != std::string::npos && is_support(cmd) && cmd.find(' ') == std::string::npos) {
      prelude += cmd + "\n";
      continue;
    }
    const auto t0 = std::chrono::steady_clock::now();
    const Outcome o = run_shell(w, prelude, cmd, 300);
    std::printf("         %.1f s\n", std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
    if (o.status != 0) {
      ADD_FAILURE() << where << ": `" << e.cmd << "` exited " << o.status << " (as run: `" << cmd << "`):\n"
                    << tail_lines(o.out, 25);
      continue;
    }
    if (cmd.rfind("curl", 0) == 0) {
      const auto j = nlohmann::json::parse(o.out, nullptr, false);
      // an error: OpenAI's {"error": {...}} (a Responses object has "error": null) or Anthropic's
      // {"type": "error", ...}
      const bool error = j.is_object() && ((j.contains("error") && !j["error"].is_null()) || j.value("type", "") == "error");
      EXPECT_TRUE(!j.is_discarded() && j.is_object() && !error)
          << where << ": `" << e.cmd << "` did not answer a JSON result:\n" << tail_lines(o.out, 25);
    }
  }
  end_block(ex.back().line);
  std::printf("%s: %d examples run, %d skipped\n", rel.c_str(), ran, skipped);
  if (rel == "README.md") {
    EXPECT_GE(ran, 30) << "README.md: the extraction or the skip patterns lost examples";
  }
}

std::vector<std::string> doc_files() {
  std::vector<std::string> r = {"README.md"};
  std::vector<std::string> docs;
  for (const auto& e : fs::directory_iterator(fs::path(KIMI_SOURCE_DIR) / "docs"))
    if (e.is_regular_file() && e.path().extension() == ".md") docs.push_back("docs/" + e.path().filename().string());
  std::sort(docs.begin(), docs.end());
  r.insert(r.end(), docs.begin(), docs.end());
  return r;
}

std::string test_name(const ::testing::TestParamInfo<std::string>& i) {
  std::string n = i.param;
  for (char& c : n)
    if (!std::isalnum(static_cast<unsigned char>(c))) c = '_';
  return n;
}

INSTANTIATE_TEST_SUITE_P(Docs, DocExamples, ::testing::ValuesIn(doc_files()), test_name);

}  // namespace
