// Importance matrix data (`kimi imatrix` writes it, `kimi quantize --imatrix` reads it;
// docs/quantize.md): for every weight matrix the engine multiplies, the sum of squared input
// activations per input column and the number of tokens, per expert for the routed-expert stacks
// (ffn_{gate,up,down}_exps: one vector and one token count per expert). The file format is
// llama.cpp's GGUF imatrix, so files are interchangeable with llama-imatrix / llama-quantize:
//   general.type = "imatrix"; imatrix.datasets (array of string), imatrix.chunk_count (u32),
//   imatrix.chunk_size (u32); per weight W two F32 tensors
//     W.in_sum2  ne = [n_in, n_mat]   sum over tokens of x_c^2 (per matrix / expert)
//     W.counts   ne = [1, n_mat]      tokens that reached the matrix / expert
// The importance of column c of matrix j is in_sum2[j][c] / counts[j] (the mean squared activation).
// The collector that fills it during a forward pass is runtime/imatrix_collect.h.
#pragma once
#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace kimi::imatrix {

struct Entry {
  int64_t n_in = 0, n_mat = 1;
  std::vector<double> sum2;   // n_in * n_mat, matrix-major
  std::vector<double> count;  // n_mat
};

struct Data {
  std::map<std::string, Entry> entries;  // by weight name
  std::vector<std::string> datasets;
  uint32_t chunk_count = 0, chunk_size = 0;

  void write_gguf(const std::string& path) const;   // llama.cpp's format (above)
  static Data load(const std::string& path);        // throws kimi::Error naming the file and what is wrong
  // Per-column importance (mean squared activation) of every matrix of the entry into
  // out[n_mat * n_in] (matrix-major); false when the entry does not exist or saw no token at all.
  // A matrix that saw no token gets the mean over all of them; with prior > 0 (stacks of several
  // matrices, i.e. experts) each matrix is blended with that mean as if it were seen on `prior`
  // extra tokens, so a rarely reached expert leans on its layer's average.
  bool importance(const std::string& name, std::vector<float>& out, double prior = 0) const;
};

// Experts that few tokens reached: count < max(min_tokens, frac * mean count of that tensor).
struct RareExpert {
  std::string name;
  int64_t expert;
  double count, mean;
};
std::vector<RareExpert> rare_experts(const Data& d, double frac = 0.1, double min_tokens = 1.0);

}  // namespace kimi::imatrix
