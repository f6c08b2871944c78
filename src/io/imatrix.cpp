#include "io/imatrix.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>

#include "io/gguf.h"
#include "util/error.h"

namespace kimi::imatrix {

// ------------------------------------------------------------------------------------------------
void Data::write_gguf(const std::string& path) const {
  gguf::Writer w(path, gguf::WriterOptions{});
  w.add_kv("general.type", gguf::Value::str("imatrix"));
  w.add_kv("imatrix.datasets", gguf::Value::arr_str(datasets.empty() ? std::vector<std::string>{""} : datasets));
  w.add_kv("imatrix.chunk_count", gguf::Value::u32(chunk_count));
  w.add_kv("imatrix.chunk_size", gguf::Value::u32(chunk_size));
  for (const auto& [name, e] : entries) {
    // dimensions as ggml's writer trims them (trailing 1s dropped)
    w.add_tensor(name + ".in_sum2", GgmlType::F32, e.n_mat > 1 ? std::vector<int64_t>{e.n_in, e.n_mat} : std::vector<int64_t>{e.n_in});
    w.add_tensor(name + ".counts", GgmlType::F32, e.n_mat > 1 ? std::vector<int64_t>{1, e.n_mat} : std::vector<int64_t>{1});
  }
  w.begin();
  std::vector<float> buf;
  for (const auto& [name, e] : entries) {
    buf.assign(e.sum2.begin(), e.sum2.end());
    w.write_tensor_data(name + ".in_sum2", buf.data(), buf.size() * 4);
    buf.assign(e.count.begin(), e.count.end());
    w.write_tensor_data(name + ".counts", buf.data(), buf.size() * 4);
  }
  w.finish();
}

Data Data::load(const std::string& path) {
  check(std::filesystem::exists(path), "imatrix {}: no such file", path);
  check(!std::filesystem::is_directory(path), "imatrix {}: is a directory", path);
  auto r = gguf::Reader::open(path);
  Data d;
  if (const gguf::Value* v = r->find("imatrix.datasets"); v && v->type == gguf::ValueType::ARRAY) d.datasets = v->strs;
  if (const gguf::Value* v = r->find("imatrix.chunk_count"); v && v->type == gguf::ValueType::UINT32) d.chunk_count = static_cast<uint32_t>(v->u);
  if (const gguf::Value* v = r->find("imatrix.chunk_size"); v && v->type == gguf::ValueType::UINT32) d.chunk_size = static_cast<uint32_t>(v->u);
  std::map<std::string, const gguf::TensorInfo*> sums, counts;
  for (const auto& t : r->tensors()) {
    auto ends = [&](const char* suf) {
      const size_t n = std::strlen(suf);
      return t.name.size() > n && t.name.compare(t.name.size() - n, n, suf) == 0;
    };
    if (ends(".in_sum2")) sums[t.name.substr(0, t.name.size() - 8)] = &t;
    else if (ends(".counts")) counts[t.name.substr(0, t.name.size() - 7)] = &t;
  }
  check(!sums.empty(), "imatrix {}: no '<weight>.in_sum2' tensors (not an imatrix GGUF; the legacy .dat format is "
        "not supported, convert it with llama-imatrix --in-file X.dat -o X.gguf)", path);
  for (const auto& [name, ts] : sums) {
    auto it = counts.find(name);
    check(it != counts.end(), "imatrix {}: '{}.in_sum2' has no '{}.counts'", path, name, name);
    const gguf::TensorInfo& tc = *it->second;
    check(ts->type == GgmlType::F32 && tc.type == GgmlType::F32, "imatrix {}: '{}' entries must be F32", path, name);
    Entry e;
    e.n_in = ts->ne[0];
    e.n_mat = ts->ne[1] * ts->ne[2] * ts->ne[3];
    check(e.n_in > 0 && tc.nelements() == e.n_mat, "imatrix {}: '{}.counts' has {} values for {} matrices", path, name,
          tc.nelements(), e.n_mat);
    e.sum2.resize(static_cast<size_t>(e.n_in * e.n_mat));
    e.count.resize(static_cast<size_t>(e.n_mat));
    for (int64_t i = 0; i < e.n_in * e.n_mat; ++i) {
      float f;
      std::memcpy(&f, ts->data + 4 * i, 4);
      check(std::isfinite(f) && f >= 0, "imatrix {}: '{}.in_sum2' value {} is {} (must be finite and >= 0)", path,
            name, i, f);
      e.sum2[static_cast<size_t>(i)] = f;
    }
    for (int64_t j = 0; j < e.n_mat; ++j) {
      float f;
      std::memcpy(&f, tc.data + 4 * j, 4);
      check(std::isfinite(f) && f >= 0, "imatrix {}: '{}.counts' value {} is {}", path, name, j, f);
      e.count[static_cast<size_t>(j)] = f;
    }
    d.entries.emplace(name, std::move(e));
  }
  return d;
}

bool Data::importance(const std::string& name, std::vector<float>& out, double prior) const {
  auto it = entries.find(name);
  if (it == entries.end()) return false;
  const Entry& e = it->second;
  const size_t n = static_cast<size_t>(e.n_in), m = static_cast<size_t>(e.n_mat);
  double ctot = 0;
  for (double v : e.count) ctot += v;
  if (ctot <= 0) return false;
  std::vector<double> avg(n, 0.0);  // the mean squared activation over every matrix's tokens
  for (size_t k = 0; k < m; ++k)
    for (size_t i = 0; i < n; ++i) avg[i] += e.sum2[k * n + i];
  for (auto& v : avg) v /= ctot;
  out.resize(n * m);
  for (size_t k = 0; k < m; ++k) {
    const double c = e.count[k];
    const double p = m > 1 ? prior : 0.0;
    for (size_t i = 0; i < n; ++i)
      out[k * n + i] = c + p > 0 ? static_cast<float>((e.sum2[k * n + i] + p * avg[i]) / (c + p)) : static_cast<float>(avg[i]);
  }
  return true;
}

std::vector<RareExpert> rare_experts(const Data& d, double frac, double min_tokens) {
  std::vector<RareExpert> out;
  for (const auto& [name, e] : d.entries) {
    if (e.n_mat <= 1) continue;
    double tot = 0;
    for (double c : e.count) tot += c;
    const double mean = tot / static_cast<double>(e.n_mat);
    const double lim = std::max(min_tokens, frac * mean);
    for (int64_t j = 0; j < e.n_mat; ++j)
      if (e.count[static_cast<size_t>(j)] < lim) out.push_back({name, j, e.count[static_cast<size_t>(j)], mean});
  }
  return out;
}

}  // namespace kimi::imatrix
