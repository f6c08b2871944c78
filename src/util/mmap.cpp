#include "util/mmap.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <utility>

#include "util/error.h"
#include "util/paths.h"

namespace kimi {

MappedFile::MappedFile(const std::string& path) : path_(path) {
  // open_input_file refuses FIFOs, devices and directories without blocking on them
  int fd = open_input_file(path);
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    int e = errno;
    ::close(fd);
    fail("cannot stat '{}': {}", path, std::strerror(e));
  }
  size_ = static_cast<size_t>(st.st_size);
  if (size_ > 0) {
    void* p = ::mmap(nullptr, size_, PROT_READ, MAP_SHARED, fd, 0);
    if (p == MAP_FAILED) {
      int e = errno;
      ::close(fd);
      fail("cannot mmap '{}' ({} bytes): {}", path, size_, std::strerror(e));
    }
    data_ = static_cast<const uint8_t*>(p);
  }
  ::close(fd);
}

MappedFile::~MappedFile() {
  if (data_) ::munmap(const_cast<uint8_t*>(data_), size_);
}

MappedFile::MappedFile(MappedFile&& o) noexcept
    : data_(std::exchange(o.data_, nullptr)), size_(std::exchange(o.size_, 0)), path_(std::move(o.path_)) {}

MappedFile& MappedFile::operator=(MappedFile&& o) noexcept {
  if (this != &o) {
    if (data_) ::munmap(const_cast<uint8_t*>(data_), size_);
    data_ = std::exchange(o.data_, nullptr);
    size_ = std::exchange(o.size_, 0);
    path_ = std::move(o.path_);
  }
  return *this;
}

static void advise(const uint8_t* base, size_t size, size_t off, size_t len, int how) {
  if (!base || off >= size) return;
  if (len > size - off) len = size - off;
  const size_t page = static_cast<size_t>(::sysconf(_SC_PAGESIZE));
  size_t start = off / page * page;
  ::madvise(const_cast<uint8_t*>(base) + start, len + (off - start), how);
}

void MappedFile::advise_sequential(size_t off, size_t len) const { advise(data_, size_, off, len, MADV_WILLNEED); }
void MappedFile::advise_dontneed(size_t off, size_t len) const { advise(data_, size_, off, len, MADV_DONTNEED); }

}  // namespace kimi
