// `kimi quantize`: plan every tensor with quant_rules, then stream: copy or convert each tensor
// (row blocks in parallel on the thread pool) and write it before the next one.
#include "convert/quantize.h"

#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <filesystem>
#include <mutex>
#include <set>

#include "io/imatrix.h"
#include "tensor/quants.h"
#include "util/error.h"
#include "util/paths.h"
#include "util/progress.h"
#include "util/thread_pool.h"

namespace fs = std::filesystem;

namespace kimi::quant {

namespace {

constexpr uint64_t kChunkBytes = 32ull << 20;     // output bytes converted per parallel round
constexpr uint64_t kCopyChunk = 64ull << 20;      // bytes handed to the writer per call when copying
constexpr int64_t kElemsPerTask = 1 << 16;        // f32 elements per thread-pool task (>= 1 row)

std::string shape_of(const std::array<int64_t, 4>& ne) {
  int nd = n_dims(ne);
  std::string s = "{";
  for (int i = 0; i < nd; ++i) s += (i ? ", " : "") + std::to_string(ne[i]);
  return s + "}";
}

std::vector<std::string> input_files(const gguf::Reader& r) {
  std::vector<std::string> v;
  for (size_t i = 0; i < r.n_files(); ++i) v.push_back(r.file_path(i));
  return v;
}

}  // namespace

std::string TensorReport::line() const {
  if (err_den > 0) {
    TensorReport c = *this;
    c.err_num = c.err_den = 0;
    return c.line() + fmt::format(" [weighted error {:.4e}]", err_num / err_den);
  }
  if (imatrix_used) {
    TensorReport c = *this;
    c.imatrix_used = false;
    return c.line() + " [imatrix]";
  }
  std::string s = fmt::format("{:<36} {:<18} {:>5} -> {:<5} {:>10} -> {:<10} {}", name, shape_of(ne),
                              type_name(src_type), type_name(decision.type), format_bytes(bytes_in),
                              format_bytes(bytes_out), why_name(decision.why));
  if (!decision.note.empty()) s += ": " + decision.note;
  return s;
}

std::string QuantizeResult::summary() const {
  std::string s;
  s += fmt::format("quantize{}: target {} (general.file_type {}), {} tensors, {} -> {} ({:.1f}% of the input){}\n",
                   dry_run ? " (dry run)" : "", target, file_type, tensors.size(), format_bytes(bytes_in),
                   format_bytes(bytes_out), bytes_in ? 100.0 * static_cast<double>(bytes_out) / bytes_in : 0.0,
                   seconds > 0 ? fmt::format(" in {}", format_duration(seconds)) : "");
  std::string types;
  for (const auto& [t, n] : out_type_counts) types += fmt::format("{}{} {}", types.empty() ? "" : ", ", t, n);
  s += fmt::format("  output types: {}\n", types);
  s += fmt::format("  converted {}, copied unchanged {} (not quantizable {}, MXFP4 routed experts byte for byte {})\n",
                   n_converted, n_copied, n_not_quantizable, n_experts_kept);
  std::string it;
  for (const auto& [t, n] : indexer_types) it += (it.empty() ? "" : "/") + t;
  s += fmt::format("  indexer: {} tensors kept at source precision ({}), exempt from quantization rules\n", n_indexer,
                   it.empty() ? "none in this file" : it);
  if (!imatrix.empty())
    s += fmt::format("  importance matrix {}: used for {} tensors\n", imatrix, n_imatrix);
  if (!error_imatrix.empty()) {
    // per output type: the relative importance-weighted error of all its tensors together, and the
    // mean of the per-tensor relative errors
    std::map<std::string, std::array<double, 4>> by;  // num, den, sum of ratios, count
    for (const auto& t : tensors) {
      if (t.err_den <= 0) continue;
      auto& a = by[type_name(t.decision.type)];
      a[0] += t.err_num;
      a[1] += t.err_den;
      a[2] += t.err_num / t.err_den;
      a[3] += 1;
    }
    s += fmt::format("  weighted error (importances of {}): per type, all its tensors / mean over tensors\n",
                     error_imatrix);
    for (const auto& [ty, a] : by)
      s += fmt::format("    {:<6} {:>3} tensors  {:.5e}  {:.5e}\n", ty, static_cast<int>(a[3]), a[0] / a[1],
                       a[2] / a[3]);
  }
  if (n_fallback)
    s += fmt::format("  block-size fallback: {} tensors (ne[0] not a multiple of the block size; see --verbose)\n",
                     n_fallback);
  for (const auto& p : outputs) s += fmt::format("  wrote {}\n", p);
  return s;
}

ModelFacts model_facts(const gguf::Reader& r) {
  ModelFacts f;
  std::string arch;
  if (const gguf::Value* a = r.find("general.architecture"); a && a->type == gguf::ValueType::STRING) arch = a->s;
  if (!arch.empty()) {
    f.n_layer = static_cast<int>(r.get_u32_or(arch + ".block_count", 0));
    f.n_expert = static_cast<int>(r.get_u32_or(arch + ".expert_count", 0));
    // llama.cpp's n_gqa(): head_count / head_count_kv of layer 0 (either may be a per-layer array)
    auto layer0 = [&](const std::string& key) -> int64_t {
      const gguf::Value* v = r.find(key);
      if (!v) return 0;
      using VT = gguf::ValueType;
      if (v->type != VT::ARRAY)
        return v->type == VT::INT8 || v->type == VT::INT16 || v->type == VT::INT32 || v->type == VT::INT64
                   ? v->i : static_cast<int64_t>(v->u);
      if (!v->uints.empty()) return static_cast<int64_t>(v->uints[0]);
      if (!v->ints.empty()) return v->ints[0];
      return 0;
    };
    const int64_t n_head = layer0(arch + ".attention.head_count"), n_head_kv = layer0(arch + ".attention.head_count_kv");
    f.n_gqa = n_head_kv > 0 ? static_cast<int>(n_head / n_head_kv) : 0;
  }
  if (f.n_layer == 0)
    for (const auto& t : r.tensors())
      if (auto li = layer_index(t.name)) f.n_layer = std::max(f.n_layer, *li + 1);
  return f;
}

QuantizeResult quantize(const QuantizeOptions& o, const std::function<void(const TensorReport&)>& on_tensor) {
  const auto t0 = std::chrono::steady_clock::now();
  check(!o.in_path.empty(), "no input file given");
  check(fs::exists(o.in_path), "input '{}' does not exist", o.in_path);
  check(o.dry_run || !o.out_path.empty(), "no output file given");
  auto reader = gguf::Reader::open(o.in_path);
  const gguf::Reader& r = *reader;
  {
    const gguf::Value* a = r.find("general.architecture");
    const std::string arch = a && a->type == gguf::ValueType::STRING ? a->s : std::string();
    check(arch == "kimi-k3", "{}: general.architecture is '{}', expected 'kimi-k3'", o.in_path,
          arch.empty() ? "(missing)" : arch);
  }
  if (!o.dry_run) {
    const fs::path parent = fs::path(o.out_path).parent_path();
    check(parent.empty() || fs::is_directory(parent), "output directory '{}' does not exist", parent.string());
    check(!fs::is_directory(o.out_path), "output '{}' is a directory (expected a .gguf file path)", o.out_path);
    // the shard names the writer will derive from OUT are checked by gguf::Writer::begin (before
    // anything is created); OUT itself is checked here, before the planning work
    check_outputs_distinct(input_files(r), {o.out_path});
  }

  // ---- plan ----
  std::vector<TensorDesc> descs;
  descs.reserve(r.tensors().size());
  for (const auto& t : r.tensors()) {
    check(t.ne[0] > 0, "{}: tensor '{}' has an empty first dimension", r.path(), t.name);
    descs.push_back({t.name, t.type, t.ne});
  }
  const ModelFacts facts = model_facts(r);
  imatrix::Data imat;
  RuleOptions rules = o.rules;
  if (!o.imatrix_path.empty()) {
    imat = imatrix::Data::load(o.imatrix_path);
    rules.have_imatrix = true;
  }
  imatrix::Data err_imat;
  if (!o.error_imatrix_path.empty()) err_imat = imatrix::Data::load(o.error_imatrix_path);
  std::vector<Decision> plan_ = plan(descs, facts, rules);

  QuantizeResult res;
  res.dry_run = o.dry_run;
  res.target = o.rules.target.name;
  if (o.rules.target.copy) {
    const gguf::Value* ft = r.find("general.file_type");
    res.file_type = ft ? static_cast<uint32_t>(ft->type == gguf::ValueType::INT32 ? ft->i : ft->u) : 0;
  } else {
    res.file_type = static_cast<uint32_t>(o.rules.target.ftype);
  }
  res.tensors.resize(descs.size());
  res.imatrix = o.imatrix_path;
  res.error_imatrix = o.error_imatrix_path;
  int64_t max_ne0 = 1;
  uint64_t max_chunk_out = 0;
  for (size_t i = 0; i < descs.size(); ++i) {
    const auto& t = r.tensors()[i];
    TensorReport& rep = res.tensors[i];
    rep.name = t.name;
    rep.ne = t.ne;
    rep.src_type = t.type;
    rep.decision = plan_[i];
    rep.bytes_in = t.nbytes;
    const uint64_t nrows = static_cast<uint64_t>(t.nelements() / t.ne[0]);
    rep.bytes_out = plan_[i].copy ? t.nbytes : row_bytes(plan_[i].type, static_cast<uint64_t>(t.ne[0])) * nrows;
    res.bytes_in += rep.bytes_in;
    res.bytes_out += rep.bytes_out;
    res.out_type_counts[type_name(plan_[i].type)]++;
    switch (plan_[i].why) {
      case Why::Indexer: res.n_indexer++; res.indexer_types[type_name(t.type)]++; break;
      case Why::ExpertsKept: res.n_experts_kept++; break;
      case Why::NotQuantizable: res.n_not_quantizable++; break;
      default: break;
    }
    if (plan_[i].copy) res.n_copied++; else res.n_converted++;
    if (!plan_[i].copy && !o.imatrix_path.empty() && uses_imatrix(plan_[i].type)) {
      auto it = imat.entries.find(t.name);
      if (it != imat.entries.end()) {
        const int64_t n_mat = t.ne[2] * t.ne[3];
        check(it->second.n_in == t.ne[0] && it->second.n_mat == n_mat,
              "imatrix {}: entry '{}' has {} x {} values, the tensor needs {} x {} (ne[0] x experts)", o.imatrix_path,
              t.name, it->second.n_in, it->second.n_mat, t.ne[0], n_mat);
        rep.imatrix_used = true;
        res.n_imatrix++;
      } else {
        check(!requires_imatrix(t.name, plan_[i].type, o.rules.target.ftype) || o.rules.allow_no_imatrix,
              "imatrix {}: no entry for '{}', which {} needs (--allow-no-imatrix to quantize it without one)",
              o.imatrix_path, t.name, type_name(plan_[i].type));
      }
    }
    if (plan_[i].fallback) res.n_fallback++;
    if (!plan_[i].copy) {
      const uint64_t orb = row_bytes(plan_[i].type, static_cast<uint64_t>(t.ne[0]));
      const uint64_t rows = std::min<uint64_t>(nrows, std::max<uint64_t>(1, kChunkBytes / orb));
      max_chunk_out = std::max(max_chunk_out, rows * orb);
      max_ne0 = std::max(max_ne0, t.ne[0]);
    }
  }

  if (o.dry_run) {
    if (on_tensor)
      for (const auto& rep : res.tensors) on_tensor(rep);
    res.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    return res;
  }

  // ---- write ----
  gguf::WriterOptions wo;
  wo.alignment = r.alignment();
  wo.split_max_bytes = o.split_max_bytes;
  wo.inputs = input_files(r);
  gguf::Writer w(o.out_path, wo);
  bool have_qv = false;
  for (const auto& kv : r.kvs()) {
    if (kv.key == "general.file_type" && !o.rules.target.copy) {
      w.add_kv(kv.key, gguf::Value::u32(res.file_type));
    } else if (kv.key == "general.quantization_version") {
      w.add_kv(kv.key, gguf::Value::u32(2));
      have_qv = true;
    } else {
      w.add_kv(kv.key, kv.value);
    }
  }
  if (!r.has("general.file_type") && !o.rules.target.copy) w.add_kv("general.file_type", gguf::Value::u32(res.file_type));
  if (!have_qv) w.add_kv("general.quantization_version", gguf::Value::u32(2));
  if (!o.imatrix_path.empty()) {  // llama-quantize's keys
    w.add_kv("quantize.imatrix.file", gguf::Value::str(o.imatrix_path));
    if (!imat.datasets.empty()) w.add_kv("quantize.imatrix.dataset", gguf::Value::str(imat.datasets.front()));
    w.add_kv("quantize.imatrix.entries_count", gguf::Value::u32(static_cast<uint32_t>(imat.entries.size())));
    w.add_kv("quantize.imatrix.chunks_count", gguf::Value::u32(imat.chunk_count));
  }
  for (size_t i = 0; i < descs.size(); ++i) {
    const auto& t = r.tensors()[i];
    w.add_tensor(t.name, plan_[i].type, std::vector<int64_t>(t.ne.begin(), t.ne.begin() + std::max<uint32_t>(1, t.n_dims)));
  }
  w.begin();

  ThreadPool pool(o.threads);
  std::vector<std::vector<float>> scratch(static_cast<size_t>(pool.size()), std::vector<float>(static_cast<size_t>(max_ne0)));
  std::vector<std::vector<float>> scratch2(o.error_imatrix_path.empty() ? 0 : static_cast<size_t>(pool.size()),
                                           std::vector<float>(static_cast<size_t>(max_ne0)));
  std::vector<uint8_t> outbuf(static_cast<size_t>(max_chunk_out));
  Progress prog("quantize", descs.size(), res.bytes_out, o.quiet ? Progress::Mode::Quiet : Progress::Mode::Auto);

  for (size_t i = 0; i < descs.size(); ++i) {
    const auto& t = r.tensors()[i];
    const Decision& d = plan_[i];
    const MappedFile* mf = r.mapped_file(t.file_index);
    if (d.copy) {
      for (uint64_t off = 0; off < t.nbytes; off += kCopyChunk) {
        const uint64_t n = std::min(kCopyChunk, t.nbytes - off);
        w.write_tensor_data(t.name, t.data + off, n);
        prog.add_bytes(n);
      }
    } else {
      const int64_t ne0 = t.ne[0];
      const int64_t nrows = t.nelements() / ne0;
      const uint64_t irb = row_bytes(t.type, static_cast<uint64_t>(ne0));
      const uint64_t orb = row_bytes(d.type, static_cast<uint64_t>(ne0));
      const int64_t chunk_rows = static_cast<int64_t>(std::min<uint64_t>(nrows, std::max<uint64_t>(1, kChunkBytes / orb)));
      const int64_t rows_per_task = std::max<int64_t>(1, kElemsPerTask / ne0);
      // importance per column of every matrix (expert) of the tensor; row r is in matrix r / ne[1]
      std::vector<float> qw;
      if (res.tensors[i].imatrix_used && !imat.importance(t.name, qw, o.imatrix_prior)) qw.clear();  // saw no token
      // --error-imatrix: the importances to weigh the error with (an entry of the same shape)
      std::vector<float> ew;
      if (!o.error_imatrix_path.empty()) {
        auto it = err_imat.entries.find(t.name);
        if (it == err_imat.entries.end() || it->second.n_in != ne0 || it->second.n_mat != t.ne[2] * t.ne[3] ||
            !err_imat.importance(t.name, ew, o.imatrix_prior))
          ew.clear();
      }
      double enum_ = 0, eden = 0;
      std::mutex err_mu;
      std::string err;
      for (int64_t r0 = 0; r0 < nrows; r0 += chunk_rows) {
        const int64_t rows = std::min(chunk_rows, nrows - r0);
        const int64_t n_tasks = (rows + rows_per_task - 1) / rows_per_task;
        pool.parallel_for(n_tasks, [&](int64_t k, int tid) {
          try {
            float* tmp = scratch[static_cast<size_t>(tid)].data();
            float* dec = ew.empty() ? nullptr : scratch2[static_cast<size_t>(tid)].data();
            const int64_t a = k * rows_per_task, b = std::min(rows, a + rows_per_task);
            double tn = 0, td = 0;
            for (int64_t row = a; row < b; ++row) {
              dequantize_row(t.type, t.data + static_cast<uint64_t>(r0 + row) * irb, tmp, ne0);
              const float* w = qw.empty() ? nullptr : qw.data() + ((r0 + row) / t.ne[1]) * ne0;
              uint8_t* q = outbuf.data() + static_cast<uint64_t>(row) * orb;
              quantize_row_imat(d.type, tmp, q, ne0, w);
              if (dec) {
                dequantize_row(d.type, q, dec, ne0);
                const float* e = ew.data() + ((r0 + row) / t.ne[1]) * ne0;
                for (int64_t c = 0; c < ne0; ++c) {
                  const double diff = static_cast<double>(dec[c]) - tmp[c];
                  tn += e[c] * diff * diff;
                  td += e[c] * static_cast<double>(tmp[c]) * tmp[c];
                }
              }
            }
            if (dec) {
              std::lock_guard<std::mutex> lk(err_mu);
              enum_ += tn;
              eden += td;
            }
          } catch (const std::exception& e) {
            std::lock_guard<std::mutex> lk(err_mu);
            if (err.empty()) err = e.what();
          }
        });
        if (!err.empty()) fail("tensor '{}': {}", t.name, err);
        res.tensors[i].err_num = enum_;
        res.tensors[i].err_den = eden;
        const uint64_t n = static_cast<uint64_t>(rows) * orb;
        w.write_tensor_data(t.name, outbuf.data(), n);
        prog.add_bytes(n);
      }
    }
    if (mf) mf->advise_dontneed(static_cast<size_t>(t.data - mf->data()), static_cast<size_t>(t.nbytes));
    prog.item_done(fmt::format("{} {} -> {}", t.name, type_name(t.type), type_name(d.type)));
    if (on_tensor) on_tensor(res.tensors[i]);
  }
  prog.finish();
  w.finish();
  res.outputs = w.output_paths();
  res.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return res;
}

}  // namespace kimi::quant
