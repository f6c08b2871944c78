// GGUF v3 reader (mmap, lazy, split files) and streaming writer. Byte format: formats-quant.md §1.
#pragma once
#include <array>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "tensor/types.h"
#include "util/mmap.h"

namespace kimi::gguf {

enum class ValueType : uint32_t {
  UINT8 = 0, INT8 = 1, UINT16 = 2, INT16 = 3, UINT32 = 4, INT32 = 5, FLOAT32 = 6, BOOL = 7,
  STRING = 8, ARRAY = 9, UINT64 = 10, INT64 = 11, FLOAT64 = 12,
};
const char* value_type_name(ValueType t);

// One metadata value. Scalars use the field that fits their type (integers: i or u; floats: f);
// arrays set elem_type and fill exactly one of ints / uints / floats / bools / strs.
struct Value {
  ValueType type = ValueType::UINT32;
  ValueType elem_type = ValueType::UINT32;  // arrays only
  int64_t i = 0;
  uint64_t u = 0;
  double f = 0;
  bool b = false;
  std::string s;
  std::vector<int64_t> ints;     // INT8/16/32/64 arrays
  std::vector<uint64_t> uints;   // UINT8/16/32/64 arrays
  std::vector<double> floats;    // FLOAT32/64 arrays
  std::vector<bool> bools;       // BOOL arrays
  std::vector<std::string> strs; // STRING arrays
  size_t array_size() const;

  static Value u8(uint8_t v);
  static Value u16(uint16_t v);
  static Value u32(uint32_t v);
  static Value i32(int32_t v);
  static Value u64(uint64_t v);
  static Value f32(float v);
  static Value boolean(bool v);
  static Value str(std::string v);
  static Value arr_i32(std::vector<int32_t> v);
  static Value arr_u32(std::vector<uint32_t> v);
  static Value arr_f32(std::vector<float> v);
  static Value arr_bool(std::vector<bool> v);
  static Value arr_str(std::vector<std::string> v);
  std::string to_string(size_t max_elems = 8) const;  // for inspect
};

struct KV {
  std::string key;
  Value value;
};

struct TensorInfo {
  std::string name;
  GgmlType type = GgmlType::F32;
  uint32_t n_dims = 1;
  std::array<int64_t, 4> ne{1, 1, 1, 1};  // ggml order: ne[0] innermost
  uint64_t offset = 0;   // relative to the owning file's data section
  uint64_t nbytes = 0;
  uint32_t file_index = 0;          // which split file holds it
  const uint8_t* data = nullptr;    // reader only: pointer into the mmap
  int64_t nelements() const { return ne[0] * ne[1] * ne[2] * ne[3]; }
  std::string shape_string() const;  // "{64, 128}"
};

// A read-only GGUF model: one file or a set of split files (NAME-0000N-of-0000M.gguf; pass any
// one of them, or the first). All metadata of the first file is visible; tensors of all shards.
// Every structural problem throws kimi::Error naming the file and what is wrong.
class Reader {
 public:
  static std::unique_ptr<Reader> open(const std::string& path);
  // Parse from a memory buffer (used by the fuzzer and tests). The buffer must outlive the Reader.
  static std::unique_ptr<Reader> open_memory(const uint8_t* data, size_t size, const std::string& label);

  uint32_t version() const { return version_; }
  uint32_t alignment() const { return alignment_; }
  const std::vector<KV>& kvs() const { return kvs_; }
  const std::vector<TensorInfo>& tensors() const { return tensors_; }
  size_t n_files() const { return files_.empty() ? 1 : files_.size(); }
  const std::string& path() const { return path_; }

  const Value* find(const std::string& key) const;  // nullptr when absent
  bool has(const std::string& key) const { return find(key) != nullptr; }
  // Typed accessors: throw kimi::Error "key 'K': missing" / "key 'K': expected uint32, found string".
  // Integer accessors accept any integer type whose value fits.
  uint32_t get_u32(const std::string& key) const;
  uint64_t get_u64(const std::string& key) const;
  int64_t get_i64(const std::string& key) const;
  float get_f32(const std::string& key) const;
  bool get_bool(const std::string& key) const;
  const std::string& get_str(const std::string& key) const;
  std::vector<int64_t> get_int_array(const std::string& key) const;
  std::vector<float> get_float_array(const std::string& key) const;
  const std::vector<std::string>& get_str_array(const std::string& key) const;
  uint32_t get_u32_or(const std::string& key, uint32_t def) const;
  float get_f32_or(const std::string& key, float def) const;
  bool get_bool_or(const std::string& key, bool def) const;

  const TensorInfo* find_tensor(const std::string& name) const;  // nullptr when absent
  const TensorInfo& tensor(const std::string& name) const;        // throws naming the tensor

  // Path of split file i (0-based, i < n_files()); for open_memory: the label.
  const std::string& file_path(size_t i) const;
  // The mapping of split file i (nullptr for open_memory), e.g. for madvise on tensor data.
  const MappedFile* mapped_file(size_t i) const;

 private:
  Reader() = default;
  uint32_t version_ = 3;
  uint32_t alignment_ = 32;
  std::string path_;
  std::vector<KV> kvs_;
  std::map<std::string, size_t> kv_index_;
  std::vector<TensorInfo> tensors_;
  std::map<std::string, size_t> tensor_index_;
  std::vector<MappedFile> files_;
  friend struct ReaderImpl;
};

struct WriterOptions {
  uint32_t alignment = 32;          // written as general.alignment only when != 32
  uint64_t split_max_bytes = 0;     // 0 = one file; else shards of at most this many tensor bytes
                                    // (a single larger tensor gets a shard of its own)
  std::vector<std::string> inputs;  // files being read: begin() refuses (before creating anything)
                                    // to write any output file, every shard included, that is one of
                                    // them (util/paths.h check_outputs_distinct)
};

// Streaming writer. Usage:
//   Writer w(out_path, opts);
//   w.add_kv(...) ...; w.add_tensor(name, type, ne) ...;   // declare everything first
//   w.begin();                                               // writes header(s) to a temp file
//   for each tensor in declaration order: w.write_tensor_data(name, bytes, n) (may be called
//     several times per tensor with consecutive chunks; the total must equal the tensor's nbytes)
//   w.finish();                                              // pads, fsyncs, renames temp -> final
// Temp files are FINAL.kimi-tmp.<pid>.<random> (util/tempfile.h): removed if the Writer is destroyed
// without finish() or the process gets SIGINT/SIGTERM/SIGHUP, and by a later run if left by a dead one.
// With splitting, output names are PREFIX-0000N-of-0000M.gguf derived from out_path (a trailing
// ".gguf" is stripped to get PREFIX); split.no / split.count / split.tensors.count are added, and
// all other KVs go to the first shard only.
class Writer {
 public:
  Writer(std::string out_path, WriterOptions opts = {});
  ~Writer();
  Writer(const Writer&) = delete;
  Writer& operator=(const Writer&) = delete;

  // Replaces an earlier value of the same key. split.no/count/tensors.count are ignored (the writer
  // writes its own); general.alignment must equal WriterOptions::alignment (it is written by the
  // writer when != 32). Throws for an empty key, nested arrays, or integers out of their type's range.
  void add_kv(const std::string& key, Value v);
  void add_tensor(const std::string& name, GgmlType type, std::vector<int64_t> ne);
  void begin();
  void write_tensor_data(const std::string& name, const void* data, size_t n);
  void finish();
  std::vector<std::string> output_paths() const;  // final names (valid after declaration)
  uint64_t total_tensor_bytes() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace kimi::gguf
