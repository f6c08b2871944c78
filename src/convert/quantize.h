// `kimi quantize`: GGUF -> GGUF with the tensor types chosen by quant_rules.h. Streaming: every
// tensor is read from the input mmap, converted row-block by row-block on the thread pool
// (decode to f32, quantize_row) and written before the next one; the output goes to a temp
// file renamed at the end, so an error never leaves a partial output behind.
#pragma once
#include <cstdint>
#include <cstdio>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "convert/quant_rules.h"
#include "io/gguf.h"

namespace kimi::quant {

struct QuantizeOptions {
  std::string in_path;               // any shard of a split input
  std::string out_path;              // single file unless split_max_bytes > 0
  RuleOptions rules;
  int threads = 0;                   // 0 = all hardware threads
  uint64_t split_max_bytes = 0;
  bool dry_run = false;              // decide and report, write nothing
  bool quiet = false;                // no progress bar
  std::string imatrix_path;          // --imatrix: llama.cpp GGUF imatrix (runtime/imatrix.h format)
  double imatrix_prior = 16;         // per-expert importance blended with the tensor's mean over its
                                     // experts as if seen on this many extra tokens (rare experts)
  std::string error_imatrix_path;    // --error-imatrix: measure each converted tensor's error weighted
                                     // by this imatrix (e.g. one from held-out text)
};

struct TensorReport {
  std::string name;
  std::array<int64_t, 4> ne{1, 1, 1, 1};
  GgmlType src_type = GgmlType::F32;
  uint64_t bytes_in = 0, bytes_out = 0;
  Decision decision;
  bool imatrix_used = false;         // importance-weighted quantization from --imatrix
  // --error-imatrix: sum over rows and columns of importance * (decoded - source)^2, and of
  // importance * source^2 (their ratio: the relative expected output error); both 0 when not measured
  double err_num = 0, err_den = 0;
  std::string line() const;  // "blk.3.attn_v.weight {64, 64} BF16 -> Q8_0 (8.0 KiB -> 2.1 KiB) mix rule: ..."
};

struct QuantizeResult {
  std::string target;                // canonical target name
  uint32_t file_type = 0;            // general.file_type written
  std::vector<TensorReport> tensors; // in file order
  uint64_t bytes_in = 0, bytes_out = 0;
  std::map<std::string, size_t> out_type_counts;  // by output type name
  size_t n_imatrix = 0;              // tensors quantized with importance weights
  std::string imatrix;               // the --imatrix file (empty: none)
  std::string error_imatrix;         // the --error-imatrix file (empty: none)
  size_t n_converted = 0, n_copied = 0, n_indexer = 0, n_experts_kept = 0, n_not_quantizable = 0, n_fallback = 0;
  std::map<std::string, size_t> indexer_types;    // type name -> count of exempt indexer matrices
  std::vector<std::string> outputs;  // written files (empty for a dry run)
  double seconds = 0;
  bool dry_run = false;
  std::string summary() const;       // multi-line, ends with '\n'
};

// Runs the quantization. `on_tensor` (optional) is called once per tensor, in file order, when it
// has been written (dry run: when decided). Throws kimi::Error for every bad input, before any
// output exists where possible (unknown tensors types, requantization refused, bad layer names).
QuantizeResult quantize(const QuantizeOptions& opts, const std::function<void(const TensorReport&)>& on_tensor = {});

// Model facts for the rules from a GGUF: `{arch}.block_count` (else 1 + the largest blk.N index)
// and `{arch}.expert_count` (else 0).
ModelFacts model_facts(const gguf::Reader& r);

}  // namespace kimi::quant
