#include "util/paths.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <optional>

#include "util/error.h"

namespace fs = std::filesystem;

namespace kimi {

namespace {

const char* kind_of(mode_t m) {
  if (S_ISDIR(m)) return "a directory";
  if (S_ISFIFO(m)) return "a FIFO";
  if (S_ISCHR(m)) return "a character device";
  if (S_ISBLK(m)) return "a block device";
  if (S_ISSOCK(m)) return "a socket";
  return "a special file";
}

[[noreturn]] void not_regular(const std::string& path, mode_t m) {
  fail("'{}' is not a regular file (it is {})", path, kind_of(m));
}

// The identity of an existing file: device + inode (on Windows: volume serial + file index, as the
// C runtime's stat has no inode there).
bool file_id(const std::string& path, uint64_t* dev, uint64_t* ino) {
#if defined(_WIN32)
  unsigned long long d = 0, i = 0;
  if (kimi_file_id(path.c_str(), &d, &i) != 0) return false;
  *dev = d;
  *ino = i;
#else
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) return false;
  *dev = static_cast<uint64_t>(st.st_dev);
  *ino = static_cast<uint64_t>(st.st_ino);
#endif
  return true;
}

// Identity of a path: the file's device + inode when it exists, else its parent directory's
// device + inode and its last component.
struct Key {
  bool exists = false;
  uint64_t dev = 0;
  uint64_t ino = 0;
  bool has_parent = false;
  uint64_t pdev = 0;
  uint64_t pino = 0;
  std::string name;
};

Key key_of(const std::string& path) {
  Key k;
  k.exists = file_id(path, &k.dev, &k.ino);
  fs::path p(path);
  std::string name = p.filename().string();
  fs::path parent = p.parent_path();
  if (parent.empty()) parent = ".";
  if (!name.empty() && name != "." && name != ".." && file_id(parent.string(), &k.pdev, &k.pino)) {
    k.has_parent = true;
    k.name = name;
  }
  return k;
}

bool same_key(const Key& a, const Key& b) {
  if (a.exists && b.exists) return a.dev == b.dev && a.ino == b.ino;
  // one of them does not exist (yet): the same directory entry is the same file
  return a.has_parent && b.has_parent && a.pdev == b.pdev && a.pino == b.pino && a.name == b.name;
}

}  // namespace

int open_input_file(const std::string& path) {
  // O_NONBLOCK: opening a FIFO without a writer returns at once instead of waiting for one.
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOCTTY);
  if (fd < 0) fail("cannot open '{}': {}", path, std::strerror(errno));
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    int e = errno;
    ::close(fd);
    fail("cannot stat '{}': {}", path, std::strerror(e));
  }
  if (!S_ISREG(st.st_mode)) {
    ::close(fd);
    not_regular(path, st.st_mode);
  }
  int fl = ::fcntl(fd, F_GETFL);
  if (fl >= 0) ::fcntl(fd, F_SETFL, fl & ~O_NONBLOCK);
  return fd;
}

std::string read_input_file(const std::string& path, uint64_t max_bytes) {
  int fd = open_input_file(path);
  struct stat st {};
  ::fstat(fd, &st);
  if (static_cast<uint64_t>(st.st_size) > max_bytes) {
    ::close(fd);
    fail("'{}' is {} bytes, more than the limit of {} bytes for this file", path, static_cast<uint64_t>(st.st_size),
         max_bytes);
  }
  std::string out;
  out.resize(static_cast<size_t>(st.st_size));
  size_t got = 0;
  for (;;) {
    if (got == out.size()) {
      if (out.size() >= max_bytes) break;
      out.resize(std::min<uint64_t>(max_bytes, out.size() + (1u << 16)));  // the file grew while reading
    }
    ssize_t n = ::read(fd, out.data() + got, out.size() - got);
    if (n < 0) {
      if (errno == EINTR) continue;
      int e = errno;
      ::close(fd);
      fail("error reading '{}': {}", path, std::strerror(e));
    }
    if (n == 0) break;
    got += static_cast<size_t>(n);
  }
  ::close(fd);
  out.resize(got);
  return out;
}

void check_input_regular(const std::string& path) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) fail("cannot open '{}': {}", path, std::strerror(errno));
  if (!S_ISREG(st.st_mode)) not_regular(path, st.st_mode);
}

bool same_file(const std::string& a, const std::string& b) { return same_key(key_of(a), key_of(b)); }

void check_outputs_distinct(const std::vector<std::string>& inputs, const std::vector<std::string>& outputs,
                            const std::string& what) {
  std::vector<Key> in_keys;
  in_keys.reserve(inputs.size());
  for (const auto& p : inputs) in_keys.push_back(key_of(p));
  const std::string pre = what.empty() ? std::string() : what + ": ";
  for (const auto& o : outputs) {
    const Key ok = key_of(o);
    for (size_t i = 0; i < inputs.size(); ++i) {
      if (same_key(ok, in_keys[i]))
        fail("{}output '{}' is the input file '{}' (the same file): choose another output path", pre, o, inputs[i]);
    }
  }
}

}  // namespace kimi
