// Positioned reads of a read-only file and page-cache hints, for streaming parts of a file that
// does not fit in memory (model/expert_cache.h), and the size of the physical memory.
//
//   kimi::ReadOnlyFile f("model.gguf");      // throws kimi::Error naming the path
//   f.read_at(off, len, buf);                 // exactly len bytes, or kimi::Error
//   f.drop_cache(off, len);                   // the kernel may forget those pages now
//
// POSIX (pread, posix_fadvise). On Windows supported() is false and the constructor throws: the
// caller keeps using the memory mapping there.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>

namespace kimi {

class ReadOnlyFile {
 public:
  static bool supported();
  explicit ReadOnlyFile(const std::string& path);
  ~ReadOnlyFile();
  ReadOnlyFile(const ReadOnlyFile&) = delete;
  ReadOnlyFile& operator=(const ReadOnlyFile&) = delete;

  // Reads [off, off+len) into dst (loops over short reads and EINTR); throws kimi::Error naming the
  // file and the range on an error or an early end of file. Safe from several threads at once.
  void read_at(uint64_t off, uint64_t len, void* dst) const;
  // Page-cache hints for [off, off+len) (no-ops where the system has none): the range will be
  // read soon (asynchronous read-ahead) / is not needed any more (clean pages are dropped).
  void will_need(uint64_t off, uint64_t len) const;
  void drop_cache(uint64_t off, uint64_t len) const;
  const std::string& path() const { return path_; }

 private:
  int fd_ = -1;
  std::string path_;
};

// Reads the whole of a regular file that an outside party may have planted things in (a slot or
// prompt-cache folder): the last component of `path` must not be a symbolic link (O_NOFOLLOW), the
// file must be a regular one (a FIFO, device or directory is refused without blocking on it: opened
// O_NONBLOCK, checked with fstat) and at most max_bytes long (checked before reading: a link to
// /dev/zero or a huge file is never read). Errors (kimi::Error) name the file as `shown` (never the
// path) and never state the size of what was refused. With `prefix`, only the file's first
// min(size, prefix) bytes are read; *size gets the file's size.
std::string read_regular_file(const std::string& path, uint64_t max_bytes, const std::string& shown,
                              uint64_t prefix = UINT64_MAX, uint64_t* size = nullptr);

// Memory-mapping hints for [p, p+len) (rounded out to pages): will be read soon / drop this
// process's mapping of it (file-backed pages are read again from the file when touched).
void advise_willneed(const void* p, size_t len);
void advise_release(const void* p, size_t len);

// Physical memory of the machine in bytes (0 when unknown).
uint64_t physical_memory_bytes();
// The memory this process may use: the physical memory, or the limit of its memory cgroup (v1 or
// v2) when that is lower (0 when unknown).
uint64_t memory_limit_bytes();

}  // namespace kimi
