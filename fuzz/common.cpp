#include "common.h"

#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>


namespace fs = std::filesystem;

namespace kimi::fuzz {

[[noreturn]] void die(const std::string& what) {
  std::fprintf(stderr, "fuzz harness: %s\n", what.c_str());
  std::abort();
}

namespace {
std::string g_dir;
void remove_dir() {
  std::error_code ec;
  if (!g_dir.empty()) fs::remove_all(g_dir, ec);
}
}  // namespace

const std::string& temp_dir() {
  if (!g_dir.empty()) return g_dir;
  std::string base;
  if (const char* t = std::getenv("TMPDIR"); t && *t) base = t;
  else if (access("/dev/shm", W_OK) == 0) base = "/dev/shm";
  else base = "/tmp";
  std::string tmpl = base + "/kimi-fuzz-XXXXXX";
  if (!mkdtemp(tmpl.data())) die("mkdtemp in " + base + " failed");
  g_dir = tmpl;
  std::atexit(remove_dir);
  return g_dir;
}

void write_file(const std::string& path, std::string_view bytes) {
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  f.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  f.close();
  if (!f) die("cannot write " + path);
}

std::string read_file(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) die("cannot read " + path);
  std::ostringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

}  // namespace kimi::fuzz
