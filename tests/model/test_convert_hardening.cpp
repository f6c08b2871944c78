// Hardening of the commands that read and write files (issue 9), run through the `kimi` binary:
// outputs that would replace an input (every split shard name included) are refused before anything
// is written; FIFOs in place of inputs are refused instead of blocking; counts in config.json larger
// than the checkpoint can hold fail fast; too-deep JSON is a clean error; temp files are unique,
// removed on SIGINT/SIGTERM/SIGHUP, and stale ones of dead runs are removed by the next run.
#include <gtest/gtest.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <array>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <vector>

#include "test_util.h"
#include "tokenizer/tiktoken_file.h"
#include "util/error.h"

namespace fs = std::filesystem;
using kimi::test::read_file;
using kimi::test::RunResult;
using kimi::test::TempDir;
using kimi::test::write_file;

namespace {

// `kimi ARGS` under `timeout SECONDS` (exit 124 when it had to be stopped), optional shell prefix.
RunResult run_bounded(const std::string& args, int seconds = 60, const std::string& prefix = "") {
  const std::string cmd = prefix + "timeout " + std::to_string(seconds) + " " + KIMI_BIN + " " + args + " 2>&1";
  RunResult r;
  FILE* p = ::popen(cmd.c_str(), "r");
  if (!p) return r;
  std::array<char, 4096> buf;
  size_t n;
  while ((n = std::fread(buf.data(), 1, buf.size(), p)) > 0) r.out.append(buf.data(), n);
  const int st = ::pclose(p);
  r.exit_code = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + (WIFSIGNALED(st) ? WTERMSIG(st) : 0);
  return r;
}

// A private copy of the cached tiny HF checkpoint (tests modify it).
std::string copy_hf(const TempDir& td, const std::string& name = "hf") {
  const std::string dst = td.file(name);
  fs::copy(kimi::test::tiny_hf(), dst, fs::copy_options::recursive);
  return dst;
}

std::map<std::string, std::string> snapshot(const std::string& dir) {
  std::map<std::string, std::string> m;
  for (const auto& e : fs::directory_iterator(dir))
    if (e.is_regular_file()) m[e.path().filename().string()] = read_file(e.path().string());
  return m;
}

std::vector<std::string> names_in(const std::string& dir) {
  std::vector<std::string> v;
  for (const auto& e : fs::directory_iterator(dir)) v.push_back(e.path().filename().string());
  std::sort(v.begin(), v.end());
  return v;
}

bool has_temp_in(const std::string& dir) {
  for (const auto& n : names_in(dir))
    if (n.find(".kimi-tmp.") != std::string::npos || n.find(".tmp") != std::string::npos) return true;
  return false;
}

void set_config_key(const std::string& hf, const std::string& key, const nlohmann::json& v) {
  const std::string p = hf + "/config.json";
  auto c = nlohmann::json::parse(read_file(p));
  (c.contains("text_config") ? c["text_config"] : c)[key] = v;
  write_file(p, c.dump(1));
}

// A pid no process can have: the kernel hands out pids below pid_max.
long dead_pid() { return std::stol(read_file("/proc/sys/kernel/pid_max")); }

}  // namespace

// ---------------------------------------------------------------------------------------------
// outputs that are inputs

TEST(HardenOutputs, ConvertRefusesToReplaceAnySourceFile) {
  TempDir td;
  const std::string hf = copy_hf(td);
  fs::create_symlink(hf + "/config.json", td.file("link.gguf"));
  const auto before = snapshot(hf);
  // the first weight shard, whatever the shard count of the tiny checkpoint (its vision tensors made it 3)
  std::string shard;
  for (const auto& n : names_in(hf))
    if (n.rfind("model-00001-of-", 0) == 0) shard = n;
  ASSERT_FALSE(shard.empty()) << "no model-00001-of-* shard in " << hf;
  ASSERT_TRUE(read_file(hf + "/model.safetensors.index.json").find(shard) != std::string::npos) << shard;
  for (const std::string& out : {hf + "/config.json", hf + "/" + shard, hf + "/model.safetensors.index.json",
                                hf + "/tiktoken.model", td.file("link.gguf")}) {
    auto r = run_bounded("convert " + hf + " -o " + out + " -q");
    EXPECT_EQ(r.exit_code, 1) << out << ": " << r.out;
    EXPECT_NE(r.out.find("is the input file"), std::string::npos) << out << ": " << r.out;
  }
  EXPECT_EQ(snapshot(hf), before);  // every source file untouched
  // a split output whose shard names are source files
  fs::rename(hf + "/" + shard, hf + "/x-00001-of-00002.gguf");
  std::string idx = read_file(hf + "/model.safetensors.index.json");
  for (size_t p; (p = idx.find(shard)) != std::string::npos;) idx.replace(p, shard.size(), "x-00001-of-00002.gguf");
  write_file(hf + "/model.safetensors.index.json", idx);
  const auto before_split = snapshot(hf);
  auto r = run_bounded("convert " + hf + " -o " + hf + "/x.gguf --split-max-size 600K -q");
  EXPECT_EQ(r.exit_code, 1) << r.out;
  EXPECT_NE(r.out.find("is the input file"), std::string::npos) << r.out;
  EXPECT_EQ(snapshot(hf), before_split);
  EXPECT_FALSE(has_temp_in(hf));
}

TEST(HardenOutputs, QuantizeSplitRefusesShardNamesThatAreTheInputShards) {
  TempDir td;
  auto r = run_bounded("convert " + kimi::test::tiny_hf() + " -o " + td.file("m.gguf") + " --split-max-size 300K -q");
  ASSERT_EQ(r.exit_code, 0) << r.out;
  std::vector<std::string> shards;
  for (const auto& n : names_in(td.path)) shards.push_back(n);
  ASSERT_GE(shards.size(), 3u);
  const auto before = snapshot(td.path);
  // COPY with the same split size would write exactly the input's shard names
  r = run_bounded("quantize " + td.file(shards[0]) + " " + td.file("m.gguf") + " COPY --split-max-size 300K -q");
  EXPECT_EQ(r.exit_code, 1) << r.out;
  EXPECT_NE(r.out.find("is the input file"), std::string::npos) << r.out;
  EXPECT_EQ(snapshot(td.path), before);  // all shards untouched, nothing else created
  // a different output name still works
  r = run_bounded("quantize " + td.file(shards[0]) + " " + td.file("q.gguf") + " COPY --split-max-size 300K -q");
  EXPECT_EQ(r.exit_code, 0) << r.out;
}

TEST(HardenOutputs, EvalAndPerplexityRefuseToOverwriteTheModel) {
  TempDir td;
  const std::string g = td.file("m.gguf");
  fs::copy_file(kimi::test::tiny_gguf(), g);
  fs::create_hard_link(g, td.file("hard.gguf"));
  write_file(td.file("text.txt"), "The quick brown fox jumps over the lazy dog. " + std::string(2000, 'a'));
  const std::string model = read_file(g);
  for (const std::string& out : {g, td.file("hard.gguf")}) {
    auto r = run_bounded("eval -m " + g + " --tokens 1,2,3 --logits-out " + out);
    EXPECT_EQ(r.exit_code, 1) << r.out;
    EXPECT_NE(r.out.find("--logits-out: output"), std::string::npos) << r.out;
    r = run_bounded("perplexity -m " + g + " -f " + td.file("text.txt") + " -c 64 --chunks 1 --kl-divergence-base " +
                    out);
    EXPECT_EQ(r.exit_code, 1) << r.out;
    EXPECT_NE(r.out.find("--kl-divergence-base: output"), std::string::npos) << r.out;
  }
  auto r = run_bounded("perplexity -m " + g + " -f " + td.file("text.txt") + " -c 64 --chunks 1 --kl-divergence-base " +
                       td.file("text.txt"));
  EXPECT_EQ(r.exit_code, 1) << r.out;
  EXPECT_EQ(read_file(g), model);
  EXPECT_EQ(names_in(td.path), (std::vector<std::string>{"hard.gguf", "m.gguf", "text.txt"}));
}

// ---------------------------------------------------------------------------------------------
// FIFOs, huge counts, deep JSON

TEST(HardenInputs, FifoConfigJsonIsRefusedNotWaitedOn) {
  TempDir td;
  const std::string hf = copy_hf(td);
  const std::string gguf = kimi::test::tiny_gguf();
  fs::remove(hf + "/config.json");
  ASSERT_EQ(::mkfifo((hf + "/config.json").c_str(), 0600), 0);
  for (const std::string& cmd : {"convert " + hf + " -o " + td.file("o.gguf") + " -q", "verify " + hf + " " + gguf + " -q"}) {
    auto r = run_bounded(cmd, 30);
    EXPECT_EQ(r.exit_code, 1) << cmd << ": " << r.out;  // 124 = it blocked until the timeout
    EXPECT_NE(r.out.find("is not a regular file (it is a FIFO)"), std::string::npos) << cmd << ": " << r.out;
  }
  // and a FIFO tokenizer_config.json / template request
  TempDir td2;
  const std::string hf2 = copy_hf(td2);
  fs::remove(hf2 + "/tokenizer_config.json");
  ASSERT_EQ(::mkfifo((hf2 + "/tokenizer_config.json").c_str(), 0600), 0);
  auto r = run_bounded("convert " + hf2 + " -o " + td2.file("o.gguf") + " -q", 30);
  EXPECT_EQ(r.exit_code, 1) << r.out;
  EXPECT_NE(r.out.find("tokenizer_config.json' is not a regular file"), std::string::npos) << r.out;
  ASSERT_EQ(::mkfifo(td2.file("req.json").c_str(), 0600), 0);
  r = run_bounded("template render " + td2.file("req.json"), 30);
  EXPECT_EQ(r.exit_code, 1) << r.out;
  EXPECT_NE(r.out.find("not a regular file"), std::string::npos) << r.out;
  r = run_bounded("tokenize -m " + gguf + " " + td2.file("req.json"), 30);
  EXPECT_EQ(r.exit_code, 1) << r.out;
  EXPECT_NE(r.out.find("not a regular file"), std::string::npos) << r.out;
}

// A 1 GiB memory bound for a child `kimi`: the address-space limit, except under AddressSanitizer
// (-DKIMI_SANITIZE=ON), whose shadow memory needs terabytes of address space; there the
// sanitizer's own allocation and RSS limits bound it instead.
#if defined(__SANITIZE_ADDRESS__)
const char* const kMemLimit1G = "export ASAN_OPTIONS=hard_rss_limit_mb=1024:max_allocation_size_mb=1024; ";
#else
const char* const kMemLimit1G = "ulimit -v 1048576; ";
#endif

TEST(HardenInputs, HugeCountsInConfigFailFastWithoutAllocating) {
  for (const std::string key : {"num_hidden_layers", "num_experts"}) {
    TempDir td;
    const std::string hf = copy_hf(td);
    set_config_key(hf, key, int64_t(1) << 31);
    // 1 GiB of address space is far more than the tiny model needs and far less than the old
    // per-layer / per-expert allocations (6-9 GB); 30 s is far more than the 0.05 s it takes
    const auto t0 = std::chrono::steady_clock::now();
    auto r = run_bounded("convert " + hf + " -o " + td.file("o.gguf") + " -q", 30, kMemLimit1G);
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    EXPECT_EQ(r.exit_code, 1) << key << ": " << r.out;
    EXPECT_NE(r.out.find("'" + key + "' = 2147483648"), std::string::npos) << r.out;
    EXPECT_NE(r.out.find("than the checkpoint can hold"), std::string::npos) << r.out;
    EXPECT_LT(s, 10.0) << key;
    r = run_bounded("verify " + hf + " " + kimi::test::tiny_gguf() + " -q", 30, kMemLimit1G);
    EXPECT_NE(r.exit_code, 124) << key << ": " << r.out;
    EXPECT_EQ(r.out.find("bad_alloc"), std::string::npos) << r.out;
    EXPECT_FALSE(fs::exists(td.file("o.gguf")));
  }
}

TEST(HardenInputs, DeepJsonIsACleanErrorNamingTheFile) {
  const std::string deep = std::string(100000, '[') + std::string(100000, ']');
  for (const std::string f : {"config.json", "tokenizer_config.json"}) {
    TempDir td;
    const std::string hf = copy_hf(td);
    write_file(hf + "/" + f, "{\"x\": " + deep + "}");
    auto r = run_bounded("convert " + hf + " -o " + td.file("o.gguf") + " -q", 30);
    EXPECT_EQ(r.exit_code, 1) << f << ": " << r.out;
    EXPECT_NE(r.out.find(f + ": JSON nested deeper than"), std::string::npos) << r.out;
    r = run_bounded("verify " + hf + " " + kimi::test::tiny_gguf() + " -q", 30);
    EXPECT_EQ(r.exit_code, 1) << f << ": " << r.out;
    EXPECT_NE(r.out.find(f + ": JSON nested deeper than"), std::string::npos) << r.out;
  }
  TempDir td;
  write_file(td.file("req.json"), "{\"messages\": " + deep + "}");
  auto r = run_bounded("template render " + td.file("req.json"), 30);
  EXPECT_EQ(r.exit_code, 1) << r.out;
  EXPECT_NE(r.out.find("req.json: JSON nested deeper than"), std::string::npos) << r.out;
}

TEST(HardenInputs, DeepTiktokenJsonIsACleanError) {
  // the npm-style tiktoken encoder JSON goes through the same depth limit
  const std::string deep = "{\"bpe_ranks\": \"\", \"x\": " + std::string(100000, '[') + std::string(100000, ']') + "}";
  std::string msg;
  try {
    kimi::tok::parse_tiktoken(deep, "enc.json");
  } catch (const kimi::Error& e) {
    msg = e.what();
  }
  EXPECT_NE(msg.find("enc.json: JSON nested deeper than"), std::string::npos) << msg;
}

// ---------------------------------------------------------------------------------------------
// temp files

namespace {

// Starts `kimi ARGS...` with its stdout+stderr going into a one-page pipe nobody reads: once it is
// full (the per-tensor progress lines), the process blocks in write() while its temp output is open.
pid_t spawn_blocked(const std::vector<std::string>& args, int* pipe_rd) {
  int p[2];
  if (::pipe(p) != 0) return -1;
  ::fcntl(p[1], F_SETPIPE_SZ, 4096);  // one page: a few dozen progress lines fill it
  pid_t pid = ::fork();
  if (pid == 0) {
    ::dup2(p[1], 1);
    ::dup2(p[1], 2);
    ::close(p[0]);
    ::close(p[1]);
    std::vector<char*> argv;
    std::string bin = KIMI_BIN;
    argv.push_back(bin.data());
    std::vector<std::string> a = args;
    for (auto& s : a) argv.push_back(s.data());
    argv.push_back(nullptr);
    ::execv(bin.c_str(), argv.data());
    ::_exit(127);
  }
  ::close(p[1]);
  *pipe_rd = p[0];
  return pid;
}

// Waits until DIR holds a temp of OUT (kimi-tmp) while the process is still running.
bool wait_for_temp(const std::string& dir, pid_t pid) {
  for (int i = 0; i < 2000; ++i) {
    int st = 0;
    if (::waitpid(pid, &st, WNOHANG) == pid) return false;  // finished (or failed) already
    for (const auto& n : names_in(dir))
      if (n.find(".kimi-tmp.") != std::string::npos) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return false;
}

}  // namespace

TEST(HardenTemps, InterruptedConvertAndQuantizeLeaveNoTemp) {
  // many tensors (one progress line each, far more than a pipe holds) in a small checkpoint
  const std::string hf = kimi::test::tiny_hf(1, "--experts 128 --layers 8 --bf16-experts");
  const std::string gguf = kimi::test::tiny_gguf(1, "--experts 128 --layers 8 --bf16-experts");
  for (int sig : {SIGINT, SIGTERM, SIGHUP}) {
    for (int which = 0; which < 2; ++which) {
      TempDir td;
      const std::string out = td.file("out.gguf");
      int rd = -1;
      pid_t pid = which == 0 ? spawn_blocked({"convert", hf, "-o", out}, &rd)
                             : spawn_blocked({"quantize", gguf, out, "Q8_0", "--verbose"}, &rd);
      ASSERT_GT(pid, 0);
      const bool blocked = wait_for_temp(td.path, pid);
      EXPECT_TRUE(blocked) << "signal " << sig << " cmd " << which << ": no temp seen while running";
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
      ::kill(pid, sig);
      int st = 0;
      bool ended = false;
      for (int i = 0; i < 1000 && !ended; ++i) {  // the pipe stays open: the signal, not EPIPE, ends it
        ended = ::waitpid(pid, &st, WNOHANG) == pid;
        if (!ended) std::this_thread::sleep_for(std::chrono::milliseconds(10));
      }
      ::close(rd);
      if (!ended) ::waitpid(pid, &st, 0);  // did not react to the signal: EPIPE ends it now
      EXPECT_TRUE(ended) << "signal " << sig << " cmd " << which << ": still running 10 s after the signal";
      if (blocked) {
        EXPECT_TRUE(WIFSIGNALED(st) && WTERMSIG(st) == sig) << "signal " << sig << " cmd " << which << " status " << st;
      }
      EXPECT_EQ(names_in(td.path), std::vector<std::string>{}) << "signal " << sig << " cmd " << which;
    }
  }
}

TEST(HardenTemps, NextRunRemovesStaleTempsOfDeadRuns) {
  TempDir td;
  const std::string out = td.file("out.gguf");
  const long dead = dead_pid();
  write_file(out + ".kimi-tmp." + std::to_string(dead) + ".00c0ffee", std::string(1000, 'x'));
  write_file(out + ".tmp" + std::to_string(dead), std::string(1000, 'x'));  // the former naming
  write_file(out + ".tmp", "not ours");
  auto r = run_bounded("convert " + kimi::test::tiny_hf() + " -o " + out + " -q");
  ASSERT_EQ(r.exit_code, 0) << r.out;
  // the text model, its companion vision projector (docs/spec/vision.md), and the file that is not ours
  EXPECT_EQ(names_in(td.path), (std::vector<std::string>{"out.gguf", "out.gguf.tmp", "out.mmproj.gguf"}));
  EXPECT_EQ(read_file(out + ".tmp"), "not ours");
}

TEST(HardenTemps, SynthAndEvalLeaveUnrelatedTmpAlone) {
  TempDir td;
  // synth -o X used to delete X.tmp/ (someone else's directory) before writing
  fs::create_directory(td.file("m.tmp"));
  write_file(td.file("m.tmp/keep.txt"), "mine");
  auto r = run_bounded("synth --preset tiny -o " + td.file("m") + " -q");
  ASSERT_EQ(r.exit_code, 0) << r.out;
  EXPECT_EQ(read_file(td.file("m.tmp/keep.txt")), "mine");
  // eval --logits-out L used a fixed L.tmp (taken from a concurrent run, or a user's file)
  write_file(td.file("l.bin.tmp"), "mine");
  r = run_bounded("eval -m " + kimi::test::tiny_gguf() + " --tokens 1,2,3 --logits-out " + td.file("l.bin"));
  ASSERT_EQ(r.exit_code, 0) << r.out;
  EXPECT_EQ(read_file(td.file("l.bin.tmp")), "mine");
  EXPECT_GT(fs::file_size(td.file("l.bin")), 0u);
  EXPECT_EQ(names_in(td.path), (std::vector<std::string>{"l.bin", "l.bin.tmp", "m", "m.tmp"}));
}
