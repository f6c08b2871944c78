// safetensors reading (single file or sharded with model.safetensors.index.json, by mmap) and a
// streaming writer. Byte format: formats-quant.md §2.
#pragma once
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "util/mmap.h"

namespace kimi::st {

enum class Dtype { BOOL, U8, I8, I16, U16, F16, BF16, I32, U32, F32, F64, I64, U64, F8_E4M3, F8_E5M2, F8_E8M0 };
const char* dtype_name(Dtype d);          // "BF16", ...
bool dtype_from_name(const std::string& s, Dtype* out);
size_t dtype_size(Dtype d);               // bytes per element

struct Tensor {
  std::string name;
  Dtype dtype = Dtype::F32;
  std::vector<int64_t> shape;  // row-major, outermost first (PyTorch order)
  const uint8_t* data = nullptr;
  uint64_t nbytes = 0;
  std::string file;            // shard file name (for messages)
  int64_t numel() const;
  std::string shape_string() const;  // "[3072, 1792]"
};

// All tensors of a checkpoint. open() takes a directory (uses model.safetensors.index.json when
// present, else model.safetensors or the only *.safetensors), or a single .safetensors file.
// Validation per §2.1 (header size, JSON, dtypes, offsets tiling the buffer exactly,
// shape x dtype == bytes, duplicates, index <-> shard consistency, missing shards) -> kimi::Error
// naming the file and tensor.
class Checkpoint {
 public:
  static std::unique_ptr<Checkpoint> open(const std::string& path);
  const std::vector<std::string>& names() const { return names_; }  // sorted
  const Tensor* find(const std::string& name) const;
  const Tensor& get(const std::string& name) const;  // throws "tensor 'X' not found in <path>"
  const std::map<std::string, std::string>& metadata() const { return metadata_; }  // first file's __metadata__
  size_t n_files() const { return files_.size(); }
  // Every file the checkpoint was read from: the shards and model.safetensors.index.json (if used).
  std::vector<std::string> file_paths() const;
  // Advise the kernel that a tensor's pages are no longer needed (keeps RSS bounded while streaming).
  void release(const Tensor& t) const;

 private:
  Checkpoint() = default;
  std::vector<MappedFile> files_;
  std::string index_path_;
  std::map<std::string, Tensor> tensors_;
  std::vector<std::string> names_;
  std::map<std::string, std::string> metadata_;
  friend struct CheckpointLoader;
};

// Parse one safetensors file from memory (tests/fuzzing); throws on any problem.
std::vector<Tensor> parse_buffer(const uint8_t* data, size_t size, const std::string& label);

// Streaming writer for one .safetensors file: declare all tensors, then write their bytes in
// declaration order (chunks allowed). The header is padded with spaces to a multiple of 8.
// Writes to a unique temp PATH.kimi-tmp.<pid>.<random> (util/tempfile.h) and renames it in finish();
// the temp file is removed if finish() never runs or the process gets SIGINT/SIGTERM/SIGHUP.
class Writer {
 public:
  explicit Writer(std::string path);
  ~Writer();
  void add_metadata(const std::string& key, const std::string& value);
  void add_tensor(const std::string& name, Dtype dtype, std::vector<int64_t> shape);
  void begin();
  void write(const std::string& name, const void* data, size_t n);
  void finish();
  uint64_t data_bytes() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace kimi::st
