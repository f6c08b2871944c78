// Hardening of file input/output (issue 9): depth-limited JSON in every io parser, refusal of FIFOs and
// other non-regular inputs without blocking, outputs that would replace an input, and temp files
// (unique names, removal on SIGINT/SIGTERM/SIGHUP, stale temps of dead runs).
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <functional>
#include <set>
#include <string>
#include <vector>

#include "io/gguf.h"
#include "io/hf_config.h"
#include "io/safetensors.h"
#include "test_util.h"
#include "util/error.h"
#include "util/mmap.h"
#include "util/paths.h"
#include "util/tempfile.h"

namespace fs = std::filesystem;
using kimi::test::TempDir;
using kimi::test::write_file;

namespace {

std::string nested(int levels) { return std::string(levels, '[') + std::string(levels, ']'); }

// The message of the kimi::Error fn throws ("" when it throws none).
std::string error_of(const std::function<void()>& fn) {
  try {
    fn();
  } catch (const kimi::Error& e) {
    return e.what();
  }
  return "";
}

// Runs fn in a child process with a 10 s alarm; returns the child's error message, "(no error)",
// or "(hung)" when it had to be killed. A blocking open() cannot hang the test this way.
std::string error_in_child(const std::function<void()>& fn) {
  int p[2];
  if (::pipe(p) != 0) return "(pipe failed)";
  pid_t pid = ::fork();
  if (pid == 0) {
    ::close(p[0]);
    ::alarm(10);
    std::string msg = "(no error)";
    try {
      fn();
    } catch (const std::exception& e) {
      msg = e.what();
    }
    ssize_t w = ::write(p[1], msg.data(), msg.size());
    (void)w;
    ::_exit(0);
  }
  ::close(p[1]);
  std::string out;
  char buf[512];
  ssize_t n;
  while ((n = ::read(p[0], buf, sizeof(buf))) > 0) out.append(buf, static_cast<size_t>(n));
  ::close(p[0]);
  int st = 0;
  ::waitpid(pid, &st, 0);
  if (WIFSIGNALED(st)) return "(hung)";
  return out;
}

std::string make_fifo(const TempDir& td, const std::string& name) {
  const std::string p = td.file(name);
  EXPECT_EQ(::mkfifo(p.c_str(), 0600), 0) << std::strerror(errno);
  return p;
}

// 8-byte little-endian header length + header text + data.
std::string safetensors_bytes(const std::string& header, size_t data_len) {
  std::string s(8, '\0');
  uint64_t n = header.size();
  for (int i = 0; i < 8; ++i) s[i] = static_cast<char>((n >> (8 * i)) & 0xff);
  return s + header + std::string(data_len, '\0');
}

std::vector<std::string> temps_of(const std::string& final_path) {
  std::vector<std::string> v;
  const std::string base = fs::path(final_path).filename().string();
  for (const auto& e : fs::directory_iterator(fs::path(final_path).parent_path())) {
    const std::string n = e.path().filename().string();
    if (n.rfind(base + ".kimi-tmp.", 0) == 0) v.push_back(e.path().string());
  }
  return v;
}

// A pid that certainly belonged to a process which has exited (a reaped child).
long dead_pid() {
  pid_t pid = ::fork();
  if (pid == 0) ::_exit(0);
  int st = 0;
  ::waitpid(pid, &st, 0);
  return pid;
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// JSON nesting depth

TEST(IoJsonDepth, ConfigJsonTooDeepIsAnErrorNamingTheFile) {
  TempDir td;
  const std::string p = td.file("config.json");
  write_file(p, "{\"a\": " + nested(100000) + "}");
  const std::string msg = error_of([&] { kimi::HfConfig::load(p); });
  EXPECT_NE(msg.find(p), std::string::npos) << msg;
  EXPECT_NE(msg.find("nested deeper than"), std::string::npos) << msg;
  // shallow nesting is still read, and a syntax error still has its line and column
  EXPECT_EQ(error_of([&] { kimi::HfConfig::parse("{\"a\": " + nested(20) + "}", "c.json"); }), "");
  EXPECT_NE(error_of([&] { kimi::HfConfig::parse("{\n \"a\": ,}", "c.json"); }).find("line 2"), std::string::npos);
}

TEST(IoJsonDepth, SafetensorsHeaderTooDeep) {
  // the value of a tensor entry nested 5000 levels: refused while parsing, with the header's file name
  const std::string h = "{\"t\": {\"dtype\": \"U8\", \"shape\": " + nested(5000) + ", \"data_offsets\": [0, 0]}}";
  const std::string b = safetensors_bytes(h, 0);
  const std::string msg = error_of([&] {
    kimi::st::parse_buffer(reinterpret_cast<const uint8_t*>(b.data()), b.size(), "deep.safetensors");
  });
  EXPECT_NE(msg.find("deep.safetensors"), std::string::npos) << msg;
  EXPECT_NE(msg.find("nested deeper than"), std::string::npos) << msg;
}

TEST(IoJsonDepth, SafetensorsIndexTooDeep) {
  TempDir td;
  write_file(td.file("model.safetensors.index.json"), "{\"metadata\": " + nested(5000) + ", \"weight_map\": {}}");
  const std::string msg = error_of([&] { kimi::st::Checkpoint::open(td.path); });
  EXPECT_NE(msg.find("model.safetensors.index.json"), std::string::npos) << msg;
  EXPECT_NE(msg.find("nested deeper than"), std::string::npos) << msg;
}

// ---------------------------------------------------------------------------------------------
// FIFOs and other non-regular inputs

TEST(IoRegularFiles, FifoInputsAreRefusedWithoutBlocking) {
  TempDir td;
  const std::string f = make_fifo(td, "config.json");
  for (auto& [what, fn] : std::vector<std::pair<std::string, std::function<void()>>>{
           {"MappedFile", [&] { kimi::MappedFile m(f); }},
           {"read_input_file", [&] { kimi::read_input_file(f); }},
           {"check_input_regular", [&] { kimi::check_input_regular(f); }},
           {"HfConfig::load", [&] { kimi::HfConfig::load(f); }},
           {"gguf::Reader", [&] { kimi::gguf::Reader::open(f); }},
       }) {
    const std::string msg = error_in_child(fn);
    EXPECT_NE(msg.find("is not a regular file (it is a FIFO)"), std::string::npos) << what << ": " << msg;
    EXPECT_NE(msg.find(f), std::string::npos) << what << ": " << msg;
  }
}

TEST(IoRegularFiles, FifoIndexOrShardIsRefused) {
  TempDir td;
  make_fifo(td, "model.safetensors.index.json");
  std::string msg = error_in_child([&] { kimi::st::Checkpoint::open(td.path); });
  EXPECT_NE(msg.find("is not a regular file"), std::string::npos) << msg;

  TempDir td2;
  make_fifo(td2, "model.safetensors");
  msg = error_in_child([&] { kimi::st::Checkpoint::open(td2.path); });
  EXPECT_NE(msg.find("is not a regular file"), std::string::npos) << msg;
}

TEST(IoRegularFiles, DeviceAndDirectoryAreRefused) {
  EXPECT_NE(error_in_child([] { kimi::read_input_file("/dev/zero"); }).find("character device"), std::string::npos);
  TempDir td;
  EXPECT_NE(error_of([&] { kimi::read_input_file(td.path); }).find("directory"), std::string::npos);
  write_file(td.file("a.txt"), "hello");
  EXPECT_EQ(kimi::read_input_file(td.file("a.txt")), "hello");
  EXPECT_NE(error_of([&] { kimi::read_input_file(td.file("a.txt"), 3); }).find("limit"), std::string::npos);
}

// ---------------------------------------------------------------------------------------------
// outputs vs inputs

TEST(IoOutputs, SameFileThroughPathsSymlinksAndHardLinks) {
  TempDir td;
  const std::string in = td.file("in.gguf");
  write_file(in, "model");
  fs::create_symlink(in, td.file("sym.gguf"));
  fs::create_hard_link(in, td.file("hard.gguf"));
  fs::create_directory(td.file("sub"));
  const std::vector<std::string> same = {in, td.file("sym.gguf"), td.file("hard.gguf"), td.file("sub/../in.gguf"),
                                         td.path + "//in.gguf"};
  for (const auto& o : same) {
    const std::string msg = error_of([&] { kimi::check_outputs_distinct({td.file("x"), in}, {td.file("ok"), o}); });
    EXPECT_NE(msg.find("is the input file '" + in + "'"), std::string::npos) << o << ": " << msg;
    EXPECT_TRUE(kimi::same_file(o, in)) << o;
  }
  // a different file, a missing file, a file of the same name elsewhere
  write_file(td.file("sub/in.gguf"), "other");
  for (const auto& o : {td.file("out.gguf"), td.file("sub/in.gguf"), td.file("missing/in.gguf")})
    EXPECT_EQ(error_of([&] { kimi::check_outputs_distinct({in}, {o}); }), "") << o;
  // an input that does not exist yet is the same file as an output with its directory and name
  EXPECT_NE(error_of([&] { kimi::check_outputs_distinct({td.file("new")}, {td.file("sub/../new")}); }), "");
  EXPECT_NE(error_of([&] { kimi::check_outputs_distinct({in}, {in}, "--logits-out"); }).find("--logits-out: "),
            std::string::npos);
}

TEST(IoOutputs, GgufWriterRefusesEveryShardNameThatIsAnInput) {
  // quantize IN-00001-of-00003.gguf IN.gguf --split-max-size: the writer's shard names are the inputs
  TempDir td;
  std::vector<std::string> inputs;
  for (int s = 1; s <= 3; ++s) {
    inputs.push_back(td.file("m-0000" + std::to_string(s) + "-of-00003.gguf"));
    write_file(inputs.back(), "shard " + std::to_string(s));
  }
  kimi::gguf::WriterOptions wo;
  wo.split_max_bytes = 64;
  wo.inputs = {inputs[0], inputs[1], inputs[2]};
  kimi::gguf::Writer w(td.file("m.gguf"), wo);
  for (int i = 0; i < 3; ++i) w.add_tensor("t" + std::to_string(i), kimi::GgmlType::F32, {16});
  ASSERT_EQ(w.output_paths().size(), 3u);
  EXPECT_EQ(w.output_paths()[1], inputs[1]);
  const std::string msg = error_of([&] { w.begin(); });
  EXPECT_NE(msg.find("is the input file"), std::string::npos) << msg;
  for (int s = 1; s <= 3; ++s) EXPECT_EQ(kimi::test::read_file(inputs[s - 1]), "shard " + std::to_string(s));
  EXPECT_EQ(std::distance(fs::directory_iterator(td.path), fs::directory_iterator()), 3);  // nothing created
}

// ---------------------------------------------------------------------------------------------
// temp files

TEST(IoTempFiles, UniqueNamesNextToTheOutput) {
  TempDir td;
  const std::string out = td.file("out.gguf");
  kimi::TempFile a = kimi::create_temp_file(out), b = kimi::create_temp_file(out);
  EXPECT_NE(a.path, b.path);
  for (const auto& t : {a, b}) {
    EXPECT_EQ(fs::path(t.path).parent_path(), fs::path(out).parent_path());
    EXPECT_EQ(t.path.rfind(out + ".kimi-tmp." + std::to_string(::getpid()) + ".", 0), 0u) << t.path;
    EXPECT_GE(t.fd, 0);
    ::close(t.fd);
  }
  EXPECT_EQ(temps_of(out).size(), 2u);
  kimi::discard_temp(a.path);
  write_file(b.path, "data");
  kimi::commit_temp(b.path, out);
  EXPECT_TRUE(temps_of(out).empty());
  EXPECT_EQ(kimi::test::read_file(out), "data");
}

TEST(IoTempFiles, StaleTempsOfDeadRunsAreRemovedOthersKept) {
  TempDir td;
  const std::string out = td.file("out.gguf");
  const long dead = dead_pid();
  const std::string stale_file = out + ".kimi-tmp." + std::to_string(dead) + ".0123abcd";
  const std::string stale_old = out + ".tmp" + std::to_string(dead);  // the former naming
  const std::string stale_dir = out + ".kimi-tmp." + std::to_string(dead) + ".dir";
  const std::string live = out + ".kimi-tmp." + std::to_string(::getppid()) + ".0123abcd";  // a running pid
  write_file(stale_file, "x");
  write_file(stale_old, "x");
  fs::create_directory(stale_dir);
  write_file(stale_dir + "/f", "x");
  write_file(live, "x");
  for (const auto& keep : {out + ".tmp", out + ".kimi-tmp.abc.1", td.file("other.gguf.kimi-tmp.1.x"), out})
    write_file(keep, "keep");
  EXPECT_EQ(kimi::remove_stale_temps(out), 3u);
  EXPECT_FALSE(fs::exists(stale_file));
  EXPECT_FALSE(fs::exists(stale_old));
  EXPECT_FALSE(fs::exists(stale_dir));
  EXPECT_TRUE(fs::exists(live));
  for (const auto& keep : {out + ".tmp", out + ".kimi-tmp.abc.1", td.file("other.gguf.kimi-tmp.1.x"), out})
    EXPECT_EQ(kimi::test::read_file(keep), "keep") << keep;
  // creating a temp does the same clean-up
  write_file(stale_file, "x");
  kimi::TempFile t = kimi::create_temp_file(out);
  ::close(t.fd);
  EXPECT_FALSE(fs::exists(stale_file));
  kimi::discard_temp(t.path);
}

TEST(IoTempFiles, SignalsRemoveTempsAndStillTerminate) {
  for (int sig : {SIGINT, SIGTERM, SIGHUP}) {
    TempDir td;
    const std::string out = td.file("out.gguf"), dir_out = td.file("model-dir");
    int p[2];
    ASSERT_EQ(::pipe(p), 0);
    pid_t pid = ::fork();
    if (pid == 0) {
      ::close(p[0]);
      ::alarm(20);
      kimi::TempFile t = kimi::create_temp_file(out);
      ssize_t w = ::write(t.fd, "partial", 7);
      std::string d = kimi::create_temp_dir(dir_out);
      write_file(d + "/model-00001-of-00002.safetensors", "x");
      write_file(d + "/config.json", "{}");
      w = ::write(p[1], "r", 1);  // ready
      (void)w;
      for (;;) ::pause();
    }
    ::close(p[1]);
    char c = 0;
    ASSERT_EQ(::read(p[0], &c, 1), 1);
    ::close(p[0]);
    EXPECT_EQ(temps_of(out).size(), 1u);
    EXPECT_EQ(temps_of(dir_out).size(), 1u);
    ::kill(pid, sig);
    int st = 0;
    ::waitpid(pid, &st, 0);
    ASSERT_TRUE(WIFSIGNALED(st)) << "signal " << sig;
    EXPECT_EQ(WTERMSIG(st), sig);  // the default action still ran (exit status of the signal)
    EXPECT_TRUE(temps_of(out).empty()) << "signal " << sig;
    EXPECT_TRUE(temps_of(dir_out).empty()) << "signal " << sig;
    EXPECT_EQ(std::distance(fs::directory_iterator(td.path), fs::directory_iterator()), 0);
  }
}

TEST(IoTempFiles, SafetensorsWriterTempIsUniqueAndRemovedOnSignal) {
  TempDir td;
  const std::string out = td.file("x.safetensors");
  pid_t pid = ::fork();
  if (pid == 0) {
    ::alarm(20);
    kimi::st::Writer w(out);
    w.add_tensor("a", kimi::st::Dtype::U8, {4});
    w.begin();
    ::raise(SIGTERM);
    ::_exit(3);
  }
  int st = 0;
  ::waitpid(pid, &st, 0);
  ASSERT_TRUE(WIFSIGNALED(st));
  EXPECT_EQ(WTERMSIG(st), SIGTERM);
  EXPECT_EQ(std::distance(fs::directory_iterator(td.path), fs::directory_iterator()), 0);
}
