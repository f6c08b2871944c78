// Read-only memory mapping of a whole file. Movable, not copyable.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>

namespace kimi {

class MappedFile {
 public:
  MappedFile() = default;
  explicit MappedFile(const std::string& path);  // throws kimi::Error naming the path
  ~MappedFile();
  MappedFile(MappedFile&& o) noexcept;
  MappedFile& operator=(MappedFile&& o) noexcept;
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;

  const uint8_t* data() const { return data_; }
  size_t size() const { return size_; }
  const std::string& path() const { return path_; }
  // Hint the kernel that [off, off+len) will be read sequentially soon / is no longer needed.
  void advise_sequential(size_t off, size_t len) const;
  void advise_dontneed(size_t off, size_t len) const;

 private:
  const uint8_t* data_ = nullptr;
  size_t size_ = 0;
  std::string path_;
};

}  // namespace kimi
