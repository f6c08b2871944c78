#include "util/file_read.h"

#if !defined(_WIN32)
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>
#endif

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>

#include "util/error.h"

namespace kimi {

#if defined(_WIN32)

std::string read_regular_file(const std::string& path, uint64_t max_bytes, const std::string& shown, uint64_t prefix,
                              uint64_t* file_size) {
  namespace fs = std::filesystem;
  std::error_code ec;
  const fs::file_status st = fs::symlink_status(fs::u8path(path), ec);
  check(!ec && fs::exists(st), "'{}': no such file", shown);
  check(fs::is_regular_file(st), "'{}': not a regular file (a link, device or directory is not read)", shown);
  const uint64_t size = fs::file_size(fs::u8path(path), ec);
  check(!ec, "'{}': cannot be read", shown);
  check(size <= max_bytes, "'{}': larger than the {} bytes such a file can have here", shown, max_bytes);
  if (file_size) *file_size = size;
  const uint64_t want = std::min(size, prefix);
  std::ifstream in(fs::u8path(path), std::ios::binary);
  check(static_cast<bool>(in), "'{}': cannot be read", shown);
  std::string out(static_cast<size_t>(want), '\0');
  in.read(out.data(), static_cast<std::streamsize>(want));
  check(static_cast<uint64_t>(in.gcount()) == want && (want < size || in.peek() == std::char_traits<char>::eof()),
        "'{}': its size changed while it was read", shown);
  return out;
}

bool ReadOnlyFile::supported() { return false; }
ReadOnlyFile::ReadOnlyFile(const std::string& path) : path_(path) {
  fail("'{}': streaming from the file is not supported on this system", path);
}
ReadOnlyFile::~ReadOnlyFile() = default;
void ReadOnlyFile::read_at(uint64_t, uint64_t, void*) const { fail("'{}': positioned reads not supported", path_); }
void ReadOnlyFile::will_need(uint64_t, uint64_t) const {}
void ReadOnlyFile::drop_cache(uint64_t, uint64_t) const {}
void advise_willneed(const void*, size_t) {}
void advise_release(const void*, size_t) {}
uint64_t physical_memory_bytes() { return 0; }
uint64_t memory_limit_bytes() { return 0; }

#else

std::string read_regular_file(const std::string& path, uint64_t max_bytes, const std::string& shown, uint64_t prefix,
                              uint64_t* file_size) {
  // O_NONBLOCK: opening a FIFO for reading waits for a writer otherwise
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK | O_NOCTTY);
  if (fd < 0) {
    const int e = errno;
    check(e != ENOENT && e != ENOTDIR, "'{}': no such file", shown);
    check(e != ELOOP, "'{}': a symbolic link (not followed)", shown);
    fail("'{}': cannot be opened ({})", shown, std::strerror(e));
  }
  struct Closer {
    int fd;
    ~Closer() { ::close(fd); }
  } closer{fd};
  struct stat st {};
  check(::fstat(fd, &st) == 0, "'{}': cannot be read ({})", shown, std::strerror(errno));
  check(S_ISREG(st.st_mode), "'{}': not a regular file (a FIFO, device or directory is not read)", shown);
  check(st.st_size >= 0 && static_cast<uint64_t>(st.st_size) <= max_bytes,
        "'{}': larger than the {} bytes such a file can have here", shown, max_bytes);
  const int fl = ::fcntl(fd, F_GETFL);
  if (fl >= 0) (void)::fcntl(fd, F_SETFL, fl & ~O_NONBLOCK);
  if (file_size) *file_size = static_cast<uint64_t>(st.st_size);
  const auto size = static_cast<size_t>(std::min(static_cast<uint64_t>(st.st_size), prefix));
  std::string out(size, '\0');
  size_t done = 0;
  while (done < size) {
    const ssize_t r = ::read(fd, out.data() + done, size - done);
    if (r < 0 && errno == EINTR) continue;
    check(r >= 0, "'{}': read failed ({})", shown, std::strerror(errno));
    check(r > 0, "'{}': its size changed while it was read", shown);
    done += static_cast<size_t>(r);
  }
  if (size < static_cast<uint64_t>(st.st_size)) return out;  // a prefix
  char extra = 0;
  ssize_t r = 0;
  do r = ::read(fd, &extra, 1);
  while (r < 0 && errno == EINTR);
  check(r == 0, "'{}': its size changed while it was read", shown);
  return out;
}

bool ReadOnlyFile::supported() { return true; }

ReadOnlyFile::ReadOnlyFile(const std::string& path) : path_(path) {
  fd_ = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd_ < 0) fail("cannot open '{}' for reading: {}", path, std::strerror(errno));
}

ReadOnlyFile::~ReadOnlyFile() {
  if (fd_ >= 0) ::close(fd_);
}

void ReadOnlyFile::read_at(uint64_t off, uint64_t len, void* dst) const {
  auto* p = static_cast<uint8_t*>(dst);
  uint64_t done = 0;
  while (done < len) {
    const ssize_t r = ::pread(fd_, p + done, static_cast<size_t>(len - done), static_cast<off_t>(off + done));
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) fail("'{}': read of {} bytes at offset {} failed: {}", path_, len, off, std::strerror(errno));
    if (r == 0) fail("'{}': file ends before offset {} (reading {} bytes at {})", path_, off + done, len, off);
    done += static_cast<uint64_t>(r);
  }
}

void ReadOnlyFile::will_need(uint64_t off, uint64_t len) const {
#if defined(POSIX_FADV_WILLNEED)
  (void)::posix_fadvise(fd_, static_cast<off_t>(off), static_cast<off_t>(len), POSIX_FADV_WILLNEED);
#else
  (void)off, (void)len;
#endif
}

void ReadOnlyFile::drop_cache(uint64_t off, uint64_t len) const {
#if defined(POSIX_FADV_DONTNEED)
  (void)::posix_fadvise(fd_, static_cast<off_t>(off), static_cast<off_t>(len), POSIX_FADV_DONTNEED);
#else
  (void)off, (void)len;
#endif
}

namespace {
void advise_pages(const void* p, size_t len, int how) {
  if (!p || len == 0) return;
  const auto page = static_cast<uintptr_t>(::sysconf(_SC_PAGESIZE));
  const auto a = reinterpret_cast<uintptr_t>(p);
  const uintptr_t start = a / page * page, end = (a + len + page - 1) / page * page;
  (void)::madvise(reinterpret_cast<void*>(start), end - start, how);
}
}  // namespace

void advise_willneed(const void* p, size_t len) { advise_pages(p, len, MADV_WILLNEED); }
void advise_release(const void* p, size_t len) { advise_pages(p, len, MADV_DONTNEED); }

uint64_t physical_memory_bytes() {
  const long pages = ::sysconf(_SC_PHYS_PAGES), size = ::sysconf(_SC_PAGESIZE);
  return pages > 0 && size > 0 ? static_cast<uint64_t>(pages) * static_cast<uint64_t>(size) : 0;
}

namespace {
// the first number in a file ("max" or anything else: 0)
uint64_t read_number(const std::string& path) {
  std::ifstream in(path);
  uint64_t v = 0;
  return in >> v ? v : 0;
}
}  // namespace

uint64_t memory_limit_bytes() {
  uint64_t lim = physical_memory_bytes();
  std::ifstream in("/proc/self/cgroup");
  for (std::string line; std::getline(in, line);) {
    // v2: "0::/path" -> /sys/fs/cgroup/path/memory.max; v1: "N:memory:/path" -> memory.limit_in_bytes
    const size_t a = line.find(':'), b = a == std::string::npos ? a : line.find(':', a + 1);
    if (b == std::string::npos) continue;
    const std::string ctrl = line.substr(a + 1, b - a - 1), path = line.substr(b + 1);
    uint64_t v = 0;
    if (ctrl.empty() && line.compare(0, a, "0") == 0)
      v = read_number("/sys/fs/cgroup" + path + "/memory.max");
    else if (ctrl == "memory")
      v = read_number("/sys/fs/cgroup/memory" + path + "/memory.limit_in_bytes");
    if (v > 0 && (lim == 0 || v < lim)) lim = v;
  }
  return lim;
}

#endif

}  // namespace kimi
