// The `kimi` program with --device vulkan (lavapipe in CI): eval logits of a converted model
// against the CPU's (every layer on the GPU, and hybrid with the routed experts on the CPU), and
// `kimi serve --device vulkan` answering a chat request exactly as the CPU server does (greedy).
#include <gtest/gtest.h>
#include <httplib.h>
#include <nlohmann/json.hpp>

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <memory>
#include <sstream>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "io/imatrix.h"
#include "test_util.h"
#include "unit/vulkan_fixture.h"

using namespace kimi;

namespace {

bool have_vulkan() {
  if (test::first_vulkan_device() >= 0) return true;
  if (test::vulkan_required()) ADD_FAILURE() << "no usable Vulkan device, but KIMI_REQUIRE_VULKAN=1 / CI=true";
  return false;
}

std::vector<float> read_f32(const std::string& path) {
  const std::string b = test::read_file(path);
  std::vector<float> v(b.size() / 4);
  std::memcpy(v.data(), b.data(), v.size() * 4);
  return v;
}

// all-position f32 logits of `kimi eval` with extra flags
std::vector<float> eval_logits(const std::string& model, const std::string& toks, const std::string& flags,
                               const std::string& out) {
  const auto r = test::run_kimi("eval -m " + model + " --tokens " + toks + " --all-logits --precision f32 --logits-out " +
                                out + " " + flags);
  EXPECT_EQ(r.exit_code, 0) << r.out;
  return read_f32(out);
}

}  // namespace

TEST(AppVulkan, EvalLogitsMatchCpu) {
  if (!have_vulkan()) GTEST_SKIP() << "no Vulkan device on this machine: Vulkan CLI tests skipped";
  test::TempDir d;
  const std::string g = test::tiny_gguf();
  std::string toks;
  for (int i = 0; i < 40; ++i) toks += (i ? "," : "") + std::to_string((i * 97 + 13) % 1000);
  const auto cpu = eval_logits(g, toks, "", d.file("cpu.f32"));
  ASSERT_FALSE(cpu.empty());
  const size_t V = cpu.size() / 40;
  for (const char* flags : {"--device vulkan", "--device vulkan --cpu-moe", "--device vulkan -ngl 3",
                            "--device vulkan -b 7"}) {
    SCOPED_TRACE(flags);
    const auto gpu = eval_logits(g, toks, flags, d.file("gpu.f32"));
    ASSERT_EQ(gpu.size(), cpu.size());
    double worst = 0;
    for (size_t t = 0; t < 40; ++t) {
      std::vector<float> a(cpu.begin() + t * V, cpu.begin() + (t + 1) * V), b(gpu.begin() + t * V, gpu.begin() + (t + 1) * V);
      worst = std::max(worst, test::rel_rms(b, a));
      EXPECT_EQ(std::max_element(a.begin(), a.end()) - a.begin(), std::max_element(b.begin(), b.end()) - b.begin())
          << "top-1 of position " << t;
    }
    EXPECT_LT(worst, 1e-4);
    std::printf("[ %s ] worst rel RMS of 40 positions vs CPU f32: %.3g\n", flags, worst);
  }
  // -v names the device and the placement
  const auto r = test::run_kimi("eval -m " + g + " --tokens 1,2 --device vulkan -v --logits-out " + d.file("x.f32"));
  EXPECT_EQ(r.exit_code, 0) << r.out;
  EXPECT_NE(r.out.find("vulkan:0"), std::string::npos) << r.out;
  // a device that does not exist is a clear error
  const auto bad = test::run_kimi("eval -m " + g + " --tokens 1 --device vulkan:7 --logits-out " + d.file("y.f32"));
  EXPECT_NE(bad.exit_code, 0);
  EXPECT_NE(bad.out.find("vulkan: device 7 does not exist"), std::string::npos) << bad.out;
}

// A slice of the small preset (hidden 2048, 64 experts top-8, 32 indexer heads x 128): its first 4
// layers (3 KDA + 1 MLA with the indexer, top-k 4 so it selects), 8 positions, GPU vs CPU f32.
TEST(AppVulkan, SmallPresetSliceMatchesCpu) {
  if (!have_vulkan()) GTEST_SKIP() << "no Vulkan device on this machine: Vulkan CLI tests skipped";
  test::TempDir d;
  auto r = test::run_kimi("synth --preset small --seed 3 -o " + d.file("small-hf"));
  ASSERT_EQ(r.exit_code, 0) << r.out;
  r = test::run_kimi("convert " + d.file("small-hf") + " -o " + d.file("small-4l.gguf") + " --layers 4");
  ASSERT_EQ(r.exit_code, 0) << r.out;
  const std::string toks = "17,4021,9,30000,512,77,1024,3";
  const auto cpu = eval_logits(d.file("small-4l.gguf"), toks, "--attn-top-k 4", d.file("cpu.f32"));
  const auto gpu = eval_logits(d.file("small-4l.gguf"), toks, "--attn-top-k 4 --device vulkan", d.file("gpu.f32"));
  ASSERT_EQ(cpu.size(), gpu.size());
  ASSERT_EQ(cpu.size() % 8, 0u);
  const size_t V = cpu.size() / 8;
  double worst = 0;
  for (size_t t = 0; t < 8; ++t) {
    std::vector<float> a(cpu.begin() + t * V, cpu.begin() + (t + 1) * V), b(gpu.begin() + t * V, gpu.begin() + (t + 1) * V);
    worst = std::max(worst, test::rel_rms(b, a));
    EXPECT_EQ(std::max_element(a.begin(), a.end()) - a.begin(), std::max_element(b.begin(), b.end()) - b.begin())
        << "top-1 of position " << t;
  }
  EXPECT_LT(worst, 1e-4);
  std::printf("[ small preset, 4 layers ] worst rel RMS of 8 positions vs CPU f32: %.3g\n", worst);
}

namespace {

// `kimi serve` in a child process on a free port, until destroyed
struct Served {
  pid_t pid = -1;
  int port = 0;
  std::string log;
  // --port 0: the server binds a free port itself and names it on its first log line ("bound to
  // 127.0.0.1:PORT"), so two servers (of this test or of a test beside it) can never pick the same one
  Served(const std::string& model, const std::string& flags, const std::string& log_path) : log(log_path) {
    const std::string cmd = std::string(KIMI_BIN) + " serve -m " + model + " --port 0 --precision f32 -c 512 " + flags +
                            " > " + log + " 2>&1";
    pid = ::fork();
    if (pid == 0) {
      ::execl("/bin/sh", "sh", "-c", ("exec " + cmd).c_str(), static_cast<char*>(nullptr));
      ::_exit(127);
    }
  }
  bool wait_ready() {
    for (int i = 0; i < 600; ++i) {  // up to 60 s (lavapipe compiles shaders at first use)
      if (port == 0) {
        std::string text;
        try {
          text = test::read_file(log);  // the shell may not have created it yet
        } catch (const std::exception&) {
        }
        const std::string key = "bound to 127.0.0.1:";
        if (const size_t at = text.find(key); at != std::string::npos) port = std::atoi(text.c_str() + at + key.size());
      }
      if (port > 0) {
        httplib::Client c("127.0.0.1", port);
        if (auto r = c.Get("/health"); r && r->status == 200) return true;
      }
      int st = 0;
      if (::waitpid(pid, &st, WNOHANG) == pid) {
        pid = -1;
        return false;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
    return false;
  }
  ~Served() {
    if (pid > 0) {
      ::kill(pid, SIGTERM);
      int st = 0;
      ::waitpid(pid, &st, 0);
    }
  }
};

std::string chat(int port) {
  httplib::Client c("127.0.0.1", port);
  c.set_read_timeout(120, 0);
  const nlohmann::json body = {{"messages", {{{"role", "user"}, {"content", "Tell me about the sea."}}}},
                               {"max_tokens", 24}, {"temperature", 0}, {"thinking", false}};
  auto r = c.Post("/v1/chat/completions", body.dump(), "application/json");
  EXPECT_TRUE(r);
  if (!r) return "";
  EXPECT_EQ(r->status, 200) << r->body;
  const auto j = nlohmann::json::parse(r->body, nullptr, false);
  return j.is_discarded() ? r->body : j["choices"][0]["message"].dump();
}

}  // namespace

TEST(AppVulkan, ServeAnswersAsTheCpuServer) {
  if (!have_vulkan()) GTEST_SKIP() << "no Vulkan device on this machine: Vulkan CLI tests skipped";
  test::TempDir d;
  const std::string g = test::tiny_gguf();
  Served cpu(g, "", d.file("cpu.log"));
  Served gpu(g, "--device vulkan", d.file("gpu.log"));
  ASSERT_TRUE(cpu.wait_ready()) << test::read_file(d.file("cpu.log"));
  ASSERT_TRUE(gpu.wait_ready()) << test::read_file(d.file("gpu.log"));
  const std::string a = chat(cpu.port), b = chat(gpu.port);
  EXPECT_FALSE(a.empty());
  EXPECT_EQ(a, b);
  EXPECT_EQ(chat(gpu.port), b) << "a second request (prompt cache hit) answers the same";
}

// bench/gpu/device-pack.sh packs this build's kimi with its libraries (the Vulkan loader among them) into a
// folder that runs on its own, and the device check runs from that folder on the tiny preset (lavapipe in
// CI): every bench run ends well and reports the device's measured ceilings with decode and prefill as a
// share of them, consistent with the run's own figures.
TEST(AppVulkan, DevicePackCheck) {
  if (!have_vulkan()) GTEST_SKIP() << "no Vulkan device on this machine: Vulkan CLI tests skipped";
  test::TempDir d;
  const std::string pack = d.file("device"), out = d.file("out");
  auto sh = [](const std::string& cmd) {
    test::RunResult r;
    FILE* p = ::popen((cmd + " 2>&1").c_str(), "r");
    if (!p) return r;
    char buf[4096];
    size_t n;
    while ((n = std::fread(buf, 1, sizeof(buf), p)) > 0) r.out.append(buf, n);
    const int st = ::pclose(p);
    r.exit_code = WIFEXITED(st) ? WEXITSTATUS(st) : 128;
    return r;
  };
  const std::string src = KIMI_SOURCE_DIR;
  auto r = sh("bash " + src + "/bench/gpu/device-pack.sh " + KIMI_BIN + " " + pack);
  ASSERT_EQ(r.exit_code, 0) << r.out;
  // what travels: the program (the same bytes), the Vulkan loader, the check; within the 64 MiB limit
  EXPECT_EQ(test::read_file(pack + "/bin/kimi"), test::read_file(KIMI_BIN));
  EXPECT_FALSE(test::read_file(pack + "/lib/libvulkan.so.1").empty());
  EXPECT_FALSE(test::read_file(pack + "/glibc/ld-linux-x86-64.so.2").empty());
  auto du = sh("du -sb " + pack);
  ASSERT_EQ(du.exit_code, 0);
  EXPECT_LT(std::stoll(du.out), 64ll << 20) << du.out;
  // a packed folder that does not find its libraries fails: the launcher must supply them
  auto bare = sh("env -u LD_LIBRARY_PATH " + pack + "/kimi version");
  EXPECT_EQ(bare.exit_code, 0) << bare.out;

  r = sh("KIMI_CHECK_BUDGET_S=240 bash " + pack + "/device-check.sh " + out + " --tiny");
  ASSERT_EQ(r.exit_code, 0) << r.out;
  const std::string s = test::read_file(out + "/summary.md");
  for (const char* want : {"## bench-gpu-pp8-tg4", "## bench-gpu-pp16", "## bench-hybrid-pp8-tg4", "## bench-hybrid-pp16",
                           "## bench-hybrid-hot-pp8-tg4", "## bench-hybrid-hot-pp16", "## bench-hybrid-nooverlap-tg4",
                           "routed expert picks on vulkan:0"})
    EXPECT_NE(s.find(want), std::string::npos) << want << "\n" << s;
  EXPECT_EQ(s.find("skipped"), std::string::npos) << s;
  // per run: the ceiling line, and tg's share of the bandwidth = its GB/s over the measured GB/s
  int ceilings = 0, tg_checked = 0;
  std::istringstream in(s);
  std::string line;
  double read_gb_s = 0;
  while (std::getline(in, line)) {
    double a = 0, b = 0, c = 0;
    if (const auto at = line.find(": read "); line.rfind("device vulkan:", 0) == 0 && at != std::string::npos) {
      read_gb_s = std::stod(line.substr(at + 7));
      const auto f = line.find("f32 FMA ");
      ASSERT_NE(f, std::string::npos) << line;
      EXPECT_GT(read_gb_s, 0.01) << line;
      EXPECT_GT(std::stod(line.substr(f + 8)), 0.0) << line;
      ++ceilings;
    } else if (line.rfind("tg on vulkan:", 0) == 0 &&
               std::sscanf(line.c_str() + line.find(": its weights"), ": its weights %lf MiB per token, %lf GB/s at the best rep = %lf",
                           &a, &b, &c) == 3) {
      EXPECT_GT(a, 0.0) << line;
      EXPECT_NEAR(c, 100.0 * b / read_gb_s, 0.01 + 0.02 * c) << line;
      ++tg_checked;
    }
  }
  EXPECT_EQ(ceilings, 7) << s;
  EXPECT_EQ(tg_checked, 4) << s;
  // the decode GEMV benchmark travels and runs when it was built beside kimi (benchmarks on): a row per
  // weight type with its GB/s and its share of the read bandwidth it measured
  const std::string gemv = std::filesystem::path(KIMI_BIN).parent_path().string() + "/bench/bench_vk_gemv";
  if (std::filesystem::exists(gemv)) {
    EXPECT_EQ(test::read_file(pack + "/bin/bench_vk_gemv"), test::read_file(gemv));
    const auto at = s.find("## gemv");
    ASSERT_NE(at, std::string::npos) << s;
    std::istringstream g(s.substr(at));
    int rows = 0;
    double first_ratio = 0;
    while (std::getline(g, line) && line.rfind("## bench", 0) != 0) {
      const auto p = line.find("pct_read_bw="), b = line.find("bytes_per_second=");
      if (p == std::string::npos || b == std::string::npos) continue;
      const double pct = std::stod(line.substr(p + 12));
      size_t used = 0;
      double bw = std::stod(line.substr(b + 17), &used);
      const char unit = line[b + 17 + used];  // google benchmark's 1000-based k / M / G
      bw *= unit == 'G' ? 1e9 : unit == 'M' ? 1e6 : unit == 'k' ? 1e3 : 1.0;
      EXPECT_GT(pct, 0.0) << line;
      // every row's share is its GB/s over the one read bandwidth the run measured: the same ratio
      const double ratio = pct / bw;
      if (rows == 0) first_ratio = ratio;
      EXPECT_NEAR(ratio, first_ratio, 0.01 * first_ratio) << line;
      ++rows;
    }
    EXPECT_GE(rows, 14) << s;  // every weight type of the GEMV (MXFP4 three times)
  }
}

// --gpu-experts (docs/gpu.md, "Hot experts"): hybrid mode with the most-picked routed experts of each layer
// (ranked by a `kimi imatrix` of the model) also on the GPU, their picks run there and the rest on the CPU.
// Logits as the CPU's (rel RMS 1e-4, top-1 equal) for N = 1, 3 and auto (every expert), and greedy
// generation token for token; kimi bench reports the share of the picks the GPU ran.
TEST(AppVulkan, GpuExpertsMatchCpu) {
  if (!have_vulkan()) GTEST_SKIP() << "no Vulkan device on this machine: Vulkan CLI tests skipped";
  test::TempDir d;
  const std::string g = test::tiny_gguf();
  const std::string counts = d.file("counts.imatrix");
  auto im = test::run_kimi("imatrix -m " + g + " -f " + std::string(KIMI_SOURCE_DIR) + "/README.md -c 128 --chunks 3 -o " +
                           counts);
  ASSERT_EQ(im.exit_code, 0) << im.out;
  std::string toks;
  for (int i = 0; i < 24; ++i) toks += (i ? "," : "") + std::to_string((i * 97 + 13) % 1000);
  const auto cpu = eval_logits(g, toks, "", d.file("cpu.f32"));
  ASSERT_FALSE(cpu.empty());
  const size_t V = cpu.size() / 24;
  for (const char* n : {"1", "3", "auto"}) {
    const std::string flags = std::string("--device vulkan --cpu-moe --gpu-experts ") + n + " --expert-counts " + counts;
    SCOPED_TRACE(flags);
    const auto gpu = eval_logits(g, toks, flags, d.file("gpu.f32"));
    ASSERT_EQ(gpu.size(), cpu.size());
    double worst = 0;
    for (size_t t = 0; t < 24; ++t) {
      std::vector<float> a(cpu.begin() + t * V, cpu.begin() + (t + 1) * V), b(gpu.begin() + t * V, gpu.begin() + (t + 1) * V);
      worst = std::max(worst, test::rel_rms(b, a));
      EXPECT_EQ(std::max_element(a.begin(), a.end()) - a.begin(), std::max_element(b.begin(), b.end()) - b.begin())
          << "top-1 of position " << t;
    }
    EXPECT_LT(worst, 1e-4);
    std::printf("[ --gpu-experts %s ] worst rel RMS of 24 positions vs CPU f32: %.3g\n", n, worst);
  }
  auto text = [](std::string out) {  // the generated text without the speed line
    const auto p = out.find("\nprompt: ");
    return p == std::string::npos ? out : out.substr(0, p);
  };
  const std::string run = "run -m " + g + " -p 'The sea is' -n 16 --temp 0 --precision f32 ";
  const auto a = test::run_kimi(run);
  const auto b = test::run_kimi(run + "--device vulkan --cpu-moe --gpu-experts 3 --expert-counts " + counts);
  ASSERT_EQ(a.exit_code, 0) << a.out;
  ASSERT_EQ(b.exit_code, 0) << b.out;
  EXPECT_EQ(text(a.out), text(b.out));
  // the share of the picks on the GPU: 3 of 8 experts per layer take some but not all of them
  const auto r = test::run_kimi("bench -m " + g + " --device vulkan -ngl 99 --cpu-moe --gpu-experts 3 --expert-counts " +
                                counts + " -p 8 -n 4 -r 1 --no-ceiling -o json");
  ASSERT_EQ(r.exit_code, 0) << r.out;
  const auto j = nlohmann::json::parse(r.out.substr(r.out.find('{')), nullptr, false);
  ASSERT_FALSE(j.is_discarded()) << r.out;
  ASSERT_TRUE(j.contains("hot_experts")) << r.out;
  EXPECT_EQ(j["hot_experts"]["per_layer"], 3);
  for (const char* k : {"pp_share", "tg_share"}) {
    EXPECT_GT(j["hot_experts"][k].get<double>(), 0.0) << k;
    EXPECT_LT(j["hot_experts"][k].get<double>(), 1.0) << k;
  }
  // counts to save without hot experts to count them: a one-line error naming the option
  const auto bad = test::run_kimi("eval -m " + g + " --tokens 1 --device vulkan --cpu-moe --expert-counts-out " +
                                  d.file("c.imatrix") + " --logits-out " + d.file("z.f32"));
  EXPECT_NE(bad.exit_code, 0);
  EXPECT_NE(bad.out.find("--expert-counts-out: needs --gpu-experts"), std::string::npos) << bad.out;
}

// Overlap in hybrid mode (docs/gpu.md, "Overlap"): the GPU runs a MoE layer's shared experts and hot experts
// while the CPU runs its routed experts. The same products run with --hybrid-overlap on and off, so `kimi
// eval` gives the same logits bit for bit, with and without hot experts, and within rel RMS 1e-4 of the CPU.
TEST(AppVulkan, HybridOverlapSameLogits) {
  if (!have_vulkan()) GTEST_SKIP() << "no Vulkan device on this machine: Vulkan CLI tests skipped";
  test::TempDir d;
  const std::string g = test::tiny_gguf();
  const std::string counts = d.file("counts.imatrix");
  auto im = test::run_kimi("imatrix -m " + g + " -f " + std::string(KIMI_SOURCE_DIR) + "/README.md -c 128 --chunks 2 -o " +
                           counts);
  ASSERT_EQ(im.exit_code, 0) << im.out;
  std::string toks;
  for (int i = 0; i < 20; ++i) toks += (i ? "," : "") + std::to_string((i * 89 + 7) % 1000);
  const auto cpu = eval_logits(g, toks, "", d.file("cpu.f32"));
  ASSERT_FALSE(cpu.empty());
  for (const std::string& hot : {std::string(), " --gpu-experts 3 --expert-counts " + counts}) {
    // -b 6: prefill micro-batches of 6, 6, 6, 2 tokens
    const std::string flags = "--device vulkan -ngl 99 --cpu-moe -b 6" + hot + " --hybrid-overlap ";
    SCOPED_TRACE(flags);
    const auto on = eval_logits(g, toks, flags + "on", d.file("on.f32"));
    const auto off = eval_logits(g, toks, flags + "off", d.file("off.f32"));
    ASSERT_EQ(on.size(), cpu.size());
    ASSERT_EQ(off.size(), cpu.size());
    EXPECT_EQ(0, std::memcmp(on.data(), off.data(), on.size() * 4)) << "overlap on and off differ";
    EXPECT_LT(test::rel_rms(on, cpu), 1e-4);
  }
  const auto bad = test::run_kimi("eval -m " + g + " --tokens 1 --hybrid-overlap maybe --logits-out " + d.file("z.f32"));
  EXPECT_NE(bad.exit_code, 0);
  EXPECT_NE(bad.out.find("--hybrid-overlap"), std::string::npos) << bad.out;
}

namespace {

// POST /v1/completions with token ids, greedy, n tokens past any end token: the text
std::string complete_ids(int port, const std::vector<int>& prompt, int n) {
  httplib::Client c("127.0.0.1", port);
  c.set_read_timeout(120, 0);
  const nlohmann::json body = {{"prompt", prompt}, {"max_tokens", n}, {"temperature", 0}, {"ignore_eos", true}};
  auto r = c.Post("/v1/completions", body.dump(), "application/json");
  EXPECT_TRUE(r);
  if (!r) return "";
  EXPECT_EQ(r->status, 200) << r->body;
  const auto j = nlohmann::json::parse(r->body, nullptr, false);
  return j.is_discarded() ? r->body : j["choices"][0]["text"].get<std::string>();
}

}  // namespace

// The server's batched decode in hybrid mode with mixed GPU/CPU experts (--gpu-experts 3 of 8, the rest on the
// CPU): 4 greedy requests sent at once (decoded together in 4 slots) answer what each answers alone, and what
// the CPU server answers; the same with the experts counted while serving and re-ranked every 8 tokens, whose
// counts, written at exit (--expert-counts-out), rank the experts of the next start at least as well as their ids.
TEST(AppVulkan, ServeBatchedHybridHotExpertsAsAlone) {
  if (!have_vulkan()) GTEST_SKIP() << "no Vulkan device on this machine: Vulkan CLI tests skipped";
  test::TempDir d;
  const std::string g = test::tiny_gguf();
  const std::string counts = d.file("counts.imatrix");
  auto im = test::run_kimi("imatrix -m " + g + " -f " + std::string(KIMI_SOURCE_DIR) + "/README.md -c 128 --chunks 2 -o " +
                           counts);
  ASSERT_EQ(im.exit_code, 0) << im.out;
  const std::string common = "-np 4 --cache-slots 0 --no-prompt-cache ";
  const std::string hybrid = common + "--device vulkan -ngl 99 --cpu-moe --gpu-experts 3 ";
  const std::string learned = d.file("learned.imatrix");
  Served cpu(g, common, d.file("cpu.log"));
  Served gpu(g, hybrid + "--expert-counts " + counts, d.file("gpu.log"));
  // the counts gathered while serving (no starting counts, a re-ranking every 8 tokens, every pick counted in full:
  // no fading), written at exit
  auto counted = std::make_unique<Served>(g, hybrid + "--expert-rerank 8 --expert-decay 0 --expert-counts-out " + learned,
                                          d.file("counted.log"));
  ASSERT_TRUE(cpu.wait_ready()) << test::read_file(d.file("cpu.log"));
  ASSERT_TRUE(gpu.wait_ready()) << test::read_file(d.file("gpu.log"));
  ASSERT_TRUE(counted->wait_ready()) << test::read_file(d.file("counted.log"));
  const int N = 4, n_gen = 12;
  std::vector<std::vector<int>> prompts(N);
  for (int i = 0; i < N; ++i)
    for (int t = 0; t < 5 + 3 * i; ++t) prompts[size_t(i)].push_back((t * 131 + i * 57 + 11) % 1000);
  std::vector<std::string> on_cpu(N);
  for (int i = 0; i < N; ++i) on_cpu[size_t(i)] = complete_ids(cpu.port, prompts[size_t(i)], n_gen);
  for (Served* s : {&gpu, counted.get()}) {
    SCOPED_TRACE(s == &gpu ? "--expert-counts" : "counted while serving");
    std::vector<std::string> alone(N), together(N);
    for (int i = 0; i < N; ++i) alone[size_t(i)] = complete_ids(s->port, prompts[size_t(i)], n_gen);
    std::vector<std::thread> th;
    for (int i = 0; i < N; ++i)
      th.emplace_back([&, i] { together[size_t(i)] = complete_ids(s->port, prompts[size_t(i)], n_gen); });
    for (auto& t : th) t.join();
    for (int i = 0; i < N; ++i) {
      EXPECT_FALSE(alone[size_t(i)].empty()) << i;
      EXPECT_EQ(together[size_t(i)], alone[size_t(i)]) << "request " << i << " decoded with the others";
      EXPECT_EQ(alone[size_t(i)], on_cpu[size_t(i)]) << "request " << i << " vs the CPU server";
    }
    // /metrics: the picks each side ran (3 of 8 experts resident: some, not all, on the GPU), the re-rankings
    httplib::Client mc("127.0.0.1", s->port);
    const auto m = mc.Get("/metrics");
    ASSERT_TRUE(m);
    auto value = [&](const std::string& key) {
      const auto at = m->body.find("\n" + key + " ");
      return at == std::string::npos ? -1.0 : std::stod(m->body.substr(at + key.size() + 2));
    };
    const double gpu_picks = value("kimi_routed_expert_picks_total{device=\"gpu\"}");
    const double cpu_picks = value("kimi_routed_expert_picks_total{device=\"cpu\"}");
    EXPECT_GT(gpu_picks, 0) << m->body;
    EXPECT_GT(cpu_picks, 0) << m->body;
    if (s != &gpu) {
      EXPECT_GE(value("kimi_hot_expert_reranks_total"), 1) << m->body;
    }
    std::printf("[ serve %s ] routed expert picks on the GPU: %.1f %% of %.0f\n",
                s == &gpu ? "--expert-counts" : "counted while serving", 100 * gpu_picks / (gpu_picks + cpu_picks),
                gpu_picks + cpu_picks);
  }
  counted.reset();  // SIGTERM: the server ends and writes its counts
  // every pick counted: the same number in every MoE layer, at least one per token run (2 rounds of 38 prompt
  // tokens and 11 generated ones per request that ran through the model; the last is sampled only)
  const imatrix::Data saved = imatrix::Data::load(learned);
  double first = -1;
  int layers = 0;
  for (const auto& [name, e] : saved.entries) {
    double sum = 0;
    for (double c : e.count) sum += c;
    if (first < 0) first = sum;
    EXPECT_EQ(sum, first) << name;
    EXPECT_EQ(e.count.size(), 8u) << name;  // the tiny preset's experts
    ++layers;
  }
  EXPECT_GT(layers, 0);
  EXPECT_GE(first, 2.0 * (38 + 4 * 11));
  auto bench_share = [&](const std::string& flags) {
    const auto r = test::run_kimi("bench -m " + g + " --device vulkan -ngl 99 --cpu-moe --gpu-experts 3 " + flags +
                                  " -p 16 -n 8 -r 1 --no-ceiling -o json");
    EXPECT_EQ(r.exit_code, 0) << r.out;
    const auto j = nlohmann::json::parse(r.out.substr(std::min(r.out.find('{'), r.out.size())), nullptr, false);
    return j.is_discarded() || !j.contains("hot_experts") ? -1.0 : j["hot_experts"]["tg_share"].get<double>();
  };
  const double from_file = bench_share("--expert-counts " + learned + " --expert-rerank 0");
  const double by_id = bench_share("--expert-rerank 0");  // no counts, never re-ranked: experts 0, 1, 2
  std::printf("[ --gpu-experts 3 ] decode picks on the GPU: %.3f ranked by the counts served, %.3f experts 0-2\n",
              from_file, by_id);
  EXPECT_GT(from_file, 0.0);
  EXPECT_GE(from_file, by_id);
}

// Speculative decoding with the target on Vulkan (docs/speculative.md): `kimi run --device vulkan`
// greedy with `--spec ngram` and with `--spec dspark` (the synthetic draft, on a Vulkan backend of
// its own: nearly every draft is rejected, so nearly every step rolls the KDA states back) prints the
// ids of `--spec off`, full GPU and hybrid (--cpu-moe), at the default --draft-max 8 (a step holds at
// most 15 rows, below the 16 from which the Vulkan kernels stop giving a row the bits it gets alone:
// docs/gpu.md, "Batch invariance").
TEST(AppVulkan, SpeculativeRunEqualsPlainRun) {
  if (!have_vulkan()) GTEST_SKIP() << "no Vulkan device on this machine: Vulkan CLI tests skipped";
  test::TempDir d;
  const std::string g = test::tiny_gguf(1);
  auto r = test::run_kimi("synth --preset dspark-tiny --seed 1 -q -o " + d.file("draft-hf"));
  ASSERT_EQ(r.exit_code, 0) << r.out;
  r = test::run_kimi("convert " + d.file("draft-hf") + " -o " + d.file("draft.gguf") + " --quiet");
  ASSERT_EQ(r.exit_code, 0) << r.out;
  auto ids = [](const std::string& out) { return out.substr(0, out.find('\n')); };
  for (const char* place : {"--device vulkan", "--device vulkan --cpu-moe"}) {
    SCOPED_TRACE(place);
    const std::string base = std::string("run -m ") + g + " --tokens 7,8,9,10,11,7,8,9,10,11,7,8,9 -n 24 --temp 0 --ids " +
                             place;
    const auto off = test::run_kimi(base + " --spec off");
    ASSERT_EQ(off.exit_code, 0) << off.out;
    EXPECT_GT(ids(off.out).size(), 24u);
    const auto ng = test::run_kimi(base + " --spec ngram");
    ASSERT_EQ(ng.exit_code, 0) << ng.out;
    EXPECT_EQ(ids(ng.out), ids(off.out)) << ng.out;
    EXPECT_NE(ng.out.find("speculative (ngram): "), std::string::npos) << ng.out;
    const auto ds = test::run_kimi(base + " --spec dspark -md " + d.file("draft.gguf"));
    ASSERT_EQ(ds.exit_code, 0) << ds.out;
    EXPECT_EQ(ids(ds.out), ids(off.out)) << ds.out;
    const auto at = ds.out.find("speculative (dspark, draft on vulkan:0): ");
    ASSERT_NE(at, std::string::npos) << ds.out;
    const auto dr = ds.out.find(" drafted", at);
    ASSERT_NE(dr, std::string::npos) << ds.out;
    const auto sp = ds.out.rfind(' ', dr - 1);
    EXPECT_GT(std::stoi(ds.out.substr(sp + 1, dr - sp - 1)), 10) << ds.out;  // it drafted
  }
}

// `kimi run --image` with the model on Vulkan runs the vision tower there too, and gives the CPU
// run's greedy ids (f32).
TEST(AppVulkan, ImageRunMatchesCpu) {
  if (!have_vulkan()) GTEST_SKIP() << "no Vulkan device on this machine: Vulkan CLI tests skipped";
  const std::string dir = test::tiny_vision_dir(1);
  const std::string img = std::string(KIMI_SOURCE_DIR) + "/data/images/red-square.png";
  const std::string base = "run -m " + dir + "/model.gguf --image " + img + " -p 'What is it?' -n 8 --ids --precision f32 --temp 0";
  const auto cpu = test::run_kimi(base);
  ASSERT_EQ(cpu.exit_code, 0) << cpu.out;
  EXPECT_NE(cpu.out.find("vision tower on cpu "), std::string::npos) << cpu.out;
  const auto gpu = test::run_kimi(base + " --device vulkan");
  ASSERT_EQ(gpu.exit_code, 0) << gpu.out;
  EXPECT_NE(gpu.out.find("vision tower on vulkan:0 "), std::string::npos) << gpu.out;
  auto ids = [](const std::string& out) {  // the line of generated ids (stderr's lines are mixed in)
    std::istringstream in(out);
    for (std::string line; std::getline(in, line);)
      if (!line.empty() && std::isdigit(static_cast<unsigned char>(line[0]))) return line;
    return std::string();
  };
  EXPECT_FALSE(ids(cpu.out).empty()) << cpu.out;
  EXPECT_EQ(ids(gpu.out), ids(cpu.out));
}

// `kimi serve --device vulkan` with speculation per request: a greedy completion with n-gram drafts
// ("speculative": {"type": "ngram"}) while another request decodes in the same batches gives the
// tokens and logprobs of the same completion without drafts (docs/speculative.md, docs/gpu.md
// "Batch invariance").
TEST(AppVulkan, ServeSpeculativeEqualsPlain) {
  if (!have_vulkan()) GTEST_SKIP() << "no Vulkan device on this machine: Vulkan CLI tests skipped";
  test::TempDir d;
  Served gpu(test::tiny_gguf(), "--device vulkan -np 2", d.file("gpu.log"));
  ASSERT_TRUE(gpu.wait_ready()) << test::read_file(d.file("gpu.log"));
  auto post = [&](const nlohmann::json& body) {
    httplib::Client c("127.0.0.1", gpu.port);
    c.set_read_timeout(300, 0);
    auto r = c.Post("/v1/completions", body.dump(), "application/json");
    EXPECT_TRUE(r);
    if (!r) return nlohmann::json();
    EXPECT_EQ(r->status, 200) << r->body;
    return nlohmann::json::parse(r->body, nullptr, false);
  };
  // P + G + P, G the model's greedy continuation of P: after the second P the n-gram drafter proposes G
  const std::vector<int32_t> P = {301, 517, 88, 912, 45, 600, 733, 12, 250, 871, 64, 399};
  std::string ptext;
  for (int32_t t : P) ptext += (ptext.empty() ? "" : ",") + std::to_string(t);
  const auto g = test::run_kimi("run -m " + test::tiny_gguf() + " --precision f32 --device vulkan --temp 0 --ids -n 32 --tokens " + ptext);
  ASSERT_EQ(g.exit_code, 0) << g.out;
  std::vector<int32_t> prompt = P;
  {
    std::istringstream in(g.out.substr(0, g.out.find('\n')));
    for (int32_t t; in >> t;) prompt.push_back(t);
  }
  ASSERT_EQ(prompt.size(), P.size() + 32) << g.out;
  prompt.insert(prompt.end(), P.begin(), P.end());
  auto body = [&](const std::vector<int32_t>& p, int n) {
    return nlohmann::json{{"prompt", p}, {"max_tokens", n}, {"temperature", 0}, {"ignore_eos", true}, {"logprobs", 1}};
  };
  const nlohmann::json plain = post(body(prompt, 32));
  ASSERT_TRUE(plain.contains("choices")) << plain.dump();
  nlohmann::json neighbour;
  std::thread tb([&] { neighbour = post(body({400, 401, 402, 403}, 200)); });
  // wait until the neighbour decodes (a condition, not a delay)
  for (int i = 0; i < 200000; ++i) {
    httplib::Client c("127.0.0.1", gpu.port);
    auto r = c.Get("/slots");
    bool busy = false;
    if (r && r->status == 200) {
      const auto slots = nlohmann::json::parse(r->body, nullptr, false);
      if (slots.is_array())
        for (const auto& sl : slots)
          if (sl.value("is_processing", false) && sl.contains("request") && sl["request"].value("n_decoded", 0) > 0)
            busy = true;
    }
    if (busy) break;
    std::this_thread::yield();
  }
  nlohmann::json b = body(prompt, 32);
  b["speculative"] = {{"type", "ngram"}, {"n_max", 6}};
  const nlohmann::json spec = post(b);
  tb.join();
  ASSERT_TRUE(spec.contains("choices")) << spec.dump();
  EXPECT_EQ(spec["choices"][0]["text"], plain["choices"][0]["text"]);
  EXPECT_EQ(spec["choices"][0]["logprobs"]["token_logprobs"], plain["choices"][0]["logprobs"]["token_logprobs"]);
  ASSERT_TRUE(neighbour.contains("choices")) << neighbour.dump();
  httplib::Client c("127.0.0.1", gpu.port);
  auto m = c.Get("/metrics");
  ASSERT_TRUE(m);
  const std::string key = "\nkimi_spec_drafted_tokens_total ";
  const size_t at = m->body.find(key);
  ASSERT_NE(at, std::string::npos) << m->body;
  EXPECT_GT(std::stod(m->body.substr(at + key.size())), 0) << m->body;  // it drafted
}

// `kimi serve --device vulkan` with the projector beside the model runs the tower on Vulkan too: an
// OpenAI request with an image gets the CPU server's greedy answer (f32). The tower runs on its own
// thread and its own Vulkan device handle (docs/engine.md "Images in the server"): an image request
// and a text request sent together (no tower cache: the tower runs again) both get the CPU server's
// answers.
TEST(AppVulkan, ServeImageAsTheCpuServer) {
  if (!have_vulkan()) GTEST_SKIP() << "no Vulkan device on this machine: Vulkan CLI tests skipped";
  test::TempDir d;
  const std::string model = test::tiny_vision_dir(1) + "/model.gguf";
  Served cpu(model, "", d.file("cpu.log"));
  Served gpu(model, "--device vulkan --vision-cache 0", d.file("gpu.log"));
  ASSERT_TRUE(cpu.wait_ready()) << test::read_file(d.file("cpu.log"));
  ASSERT_TRUE(gpu.wait_ready()) << test::read_file(d.file("gpu.log"));
  const std::string png = test::read_file(std::string(KIMI_SOURCE_DIR) + "/data/images/red-square.png");
  std::string b64;  // RFC 4648 base64 of the file
  const char* abc = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
  for (size_t i = 0; i < png.size(); i += 3) {
    uint32_t v = static_cast<uint8_t>(png[i]) << 16;
    if (i + 1 < png.size()) v |= static_cast<uint8_t>(png[i + 1]) << 8;
    if (i + 2 < png.size()) v |= static_cast<uint8_t>(png[i + 2]);
    b64 += abc[v >> 18 & 63];
    b64 += abc[v >> 12 & 63];
    b64 += i + 1 < png.size() ? abc[v >> 6 & 63] : '=';
    b64 += i + 2 < png.size() ? abc[v & 63] : '=';
  }
  const nlohmann::json body = {
      {"messages",
       {{{"role", "user"},
         {"content",
          {{{"type", "text"}, {"text", "What is in the picture?"}},
           {{"type", "image_url"}, {"image_url", {{"url", "data:image/png;base64," + b64}}}}}}}}},
      {"max_tokens", 12}, {"temperature", 0}, {"thinking", false}};
  auto ask = [&](int port) {
    httplib::Client c("127.0.0.1", port);
    c.set_read_timeout(120, 0);
    auto r = c.Post("/v1/chat/completions", body.dump(), "application/json");
    EXPECT_TRUE(r);
    if (!r) return std::string();
    EXPECT_EQ(r->status, 200) << r->body;
    const auto j = nlohmann::json::parse(r->body, nullptr, false);
    EXPECT_GT(j["usage"]["prompt_tokens"].get<int>(), 12) << r->body;  // the image's tokens are in the prompt
    return j["choices"][0]["message"].dump();
  };
  const std::string a = ask(cpu.port), b = ask(gpu.port);
  EXPECT_FALSE(a.empty());
  EXPECT_EQ(a, b);
  std::string b2;
  std::thread t([&] { b2 = ask(gpu.port); });
  const std::string text = chat(gpu.port);
  t.join();
  EXPECT_EQ(b2, a);
  EXPECT_EQ(text, chat(cpu.port));
}
