#include "util/file_read.h"

#if !defined(_WIN32)
#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>
#endif

#include <cerrno>
#include <cstring>
#include <fstream>

#include "util/error.h"

namespace kimi {

#if defined(_WIN32)

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
