#include "test_util.h"

#include <sys/wait.h>
#include <unistd.h>

#include <array>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <mutex>
#include <random>
#include <sstream>
#include <stdexcept>

namespace fs = std::filesystem;

namespace kimi::test {

TempDir::TempDir() {
  std::random_device rd;
  for (;;) {
    auto p = fs::temp_directory_path() / ("kimi-test-" + std::to_string(::getpid()) + "-" + std::to_string(rd()));
    if (fs::create_directory(p)) {
      path = p.string();
      break;
    }
  }
}
TempDir::~TempDir() {
  std::error_code ec;
  fs::remove_all(path, ec);
}

RunResult run_kimi(const std::string& args) {
  // KIMI_RUNNER: the emulator of a cross build (qemu-aarch64 -L SYSROOT), empty natively and for
  // Windows (under Wine the test program itself runs in Wine and starts kimi.exe through cmd.exe,
  // which wants backslashes; a Unix path from the cross build, /x/kimi.exe, is \x\kimi.exe on the
  // current drive, Z: under Wine)
#if defined(_WIN32)
  const std::string bin = fs::path(KIMI_BIN).make_preferred().string();
#else
  const std::string bin = KIMI_BIN;
#endif
  std::string cmd = std::string(KIMI_RUNNER) + bin + " " + args + " 2>&1";
  RunResult r;
  FILE* p = ::popen(cmd.c_str(), "r");
  if (!p) throw std::runtime_error("popen failed: " + cmd);
  std::array<char, 4096> buf;
  size_t n;
  while ((n = std::fread(buf.data(), 1, buf.size(), p)) > 0) r.out.append(buf.data(), n);
  int st = ::pclose(p);
  r.exit_code = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + (WIFSIGNALED(st) ? WTERMSIG(st) : 0);
  return r;
}

static std::string cache_dir() {
  // shared across test binaries of one build; keyed by args so concurrent ctest jobs are safe
  auto d = fs::path(KIMI_BIN).parent_path() / "test-models";
  fs::create_directories(d);
  return d.string();
}

// Fixtures are keyed by their arguments AND the kimi binary's modification time, so a rebuilt
// synth/convert never serves a stale cached model.
static std::string key_of(const std::string& s) {
  std::error_code ec;
  auto t = fs::last_write_time(KIMI_BIN, ec);
  std::string stamp = ec ? "0" : std::to_string(t.time_since_epoch().count());
  return std::to_string(std::hash<std::string>{}(s + "|" + stamp));
}

// make `target` by running `cmd` into a temp name then renaming (atomic for concurrent tests)
static void make_once(const std::string& target, const std::function<std::string(const std::string&)>& cmd_for) {
  if (fs::exists(target)) return;
  std::string tmp = target + ".part" + std::to_string(::getpid());
  auto r = run_kimi(cmd_for(tmp));
  if (r.exit_code != 0) throw std::runtime_error("fixture command failed: " + cmd_for(tmp) + "\n" + r.out);
  std::error_code ec;
  fs::rename(tmp, target, ec);
  if (ec && !fs::exists(target)) throw std::runtime_error("rename failed for " + target);
  fs::remove_all(tmp, ec);
}

std::string tiny_hf(int seed, const std::string& extra) {
  std::string target = cache_dir() + "/tiny-hf-" + std::to_string(seed) + "-" + key_of(extra);
  make_once(target, [&](const std::string& tmp) {
    return "synth --preset tiny --seed " + std::to_string(seed) + " " + extra + " -o " + tmp;
  });
  return target;
}

std::string tiny_gguf(int seed, const std::string& extra_synth, const std::string& extra_convert) {
  std::string hf = tiny_hf(seed, extra_synth);
  std::string target = cache_dir() + "/tiny-" + std::to_string(seed) + "-" + key_of(extra_synth + "|" + extra_convert) + ".gguf";
  make_once(target, [&](const std::string& tmp) {
    // text only: the projector file (a companion) is made by tiny_vision_dir
    return "convert " + hf + " -o " + tmp + " --quiet --no-vision " + extra_convert;
  });
  return target;
}

std::string tiny_vision_dir(int seed, const std::string& extra_synth) {
  std::string hf = tiny_hf(seed, extra_synth);
  std::string target = cache_dir() + "/tiny-vision-" + std::to_string(seed) + "-" + key_of(extra_synth);
  if (fs::exists(target)) return target;
  std::string tmp = target + ".part" + std::to_string(::getpid());
  fs::create_directories(tmp);
  auto r = run_kimi("convert " + hf + " -o " + tmp + "/model.gguf --quiet");
  if (r.exit_code != 0) throw std::runtime_error("fixture convert failed for " + target + "\n" + r.out);
  std::error_code ec;
  fs::rename(tmp, target, ec);
  if (ec && !fs::exists(target)) throw std::runtime_error("rename failed for " + target);
  fs::remove_all(tmp, ec);
  return target;
}

std::string read_file(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) throw std::runtime_error("cannot read " + path);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

void write_file(const std::string& path, const std::string& data) {
  std::ofstream f(path, std::ios::binary);
  f << data;
  if (!f) throw std::runtime_error("cannot write " + path);
}

}  // namespace kimi::test
