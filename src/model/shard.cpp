// Per-rank model files (shard.h).
#include "model/shard.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>

#include "util/error.h"

namespace kimi {

namespace {

constexpr const char* kRanks = "kimi.shard.ranks";
constexpr const char* kRank = "kimi.shard.rank";
constexpr const char* kFirst = "kimi.shard.expert_first";
constexpr const char* kCount = "kimi.shard.expert_count";
constexpr const char* kSource = "kimi.shard.source";

bool is_experts(const std::string& name) {
  return name.size() > 12 && name.compare(name.size() - 12, 12, "_exps.weight") == 0;
}

struct Fnv {
  uint64_t h = 1469598103934665603ull;
  void bytes(const void* p, size_t n) {
    const auto* b = static_cast<const uint8_t*>(p);
    for (size_t i = 0; i < n; ++i) h = (h ^ b[i]) * 1099511628211ull;
  }
  void str(const std::string& s) { bytes(s.data(), s.size() + 1); }
  void u64(uint64_t v) { bytes(&v, sizeof v); }
};

}  // namespace

std::string model_id(const gguf::Reader& r) {
  if (const gguf::Value* v = r.find(kSource); v && v->type == gguf::ValueType::STRING) return r.get_str(kSource);
  Fnv f;
  for (const auto& kv : r.kvs())
    if (kv.key.rfind("kimi.shard.", 0) != 0 && kv.key.rfind("split.", 0) != 0) f.str(kv.key);
  for (const auto& t : r.tensors()) {
    f.str(t.name);
    f.u64(static_cast<uint64_t>(t.type));
    for (int64_t e : t.ne) f.u64(static_cast<uint64_t>(e));
    // a sample of the values (not of the experts, which a shard holds only in part): the first and
    // last 32 bytes, so that two checkpoints of the same shapes differ
    if (!is_experts(t.name) && t.data && t.nbytes > 0) {
      const size_t n = static_cast<size_t>(std::min<uint64_t>(32, t.nbytes));
      f.bytes(t.data, n);
      f.bytes(t.data + t.nbytes - n, n);
    }
  }
  return fmt::format("{:016x}", f.h);
}

std::string shard_file_name(const std::string& input, int rank, int ranks) {
  return fmt::format("{}.rank{}-of-{}.gguf", std::filesystem::path(input).stem().string(), rank, ranks);
}

std::vector<std::string> write_shards(const ShardOptions& o) {
  check(o.ranks >= 2 && o.ranks <= 4096, "shard: --ranks must be in 2..4096 (got {})", o.ranks);
  auto r = gguf::Reader::open(o.input);
  check(!r->has(kRanks), "{}: already a shard (rank {} of {}); shard the full model", o.input,
        r->get_u32_or(kRank, 0), r->get_u32_or(kRanks, 0));
  std::error_code ec;
  std::filesystem::create_directories(o.out_dir, ec);
  check(std::filesystem::is_directory(o.out_dir), "shard: -o {}: cannot create the directory", o.out_dir);
  // the expert count, from the stacked expert tensors (all agree)
  int64_t E = -1;
  for (const auto& t : r->tensors())
    if (is_experts(t.name)) {
      check(E < 0 || E == t.ne[2], "{}: tensor '{}' stacks {} experts, another one {}", o.input, t.name, t.ne[2], E);
      E = t.ne[2];
    }
  check(E >= o.ranks, "{}: {} routed experts cannot be split over {} ranks", o.input, E < 0 ? 0 : E, o.ranks);
  const std::string id = model_id(*r);
  std::vector<std::string> out;
  for (int rank = 0; rank < o.ranks; ++rank) {
    const int64_t lo = E * rank / o.ranks, hi = E * (rank + 1) / o.ranks;
    const std::string path = (std::filesystem::path(o.out_dir) / shard_file_name(o.input, rank, o.ranks)).string();
    gguf::WriterOptions wo;
    wo.alignment = r->alignment();
    wo.inputs = {o.input};
    gguf::Writer w(path, wo);
    for (const auto& kv : r->kvs())
      if (kv.key.rfind("split.", 0) != 0 && kv.key != "general.alignment") w.add_kv(kv.key, kv.value);
    w.add_kv(kRanks, gguf::Value::u32(static_cast<uint32_t>(o.ranks)));
    w.add_kv(kRank, gguf::Value::u32(static_cast<uint32_t>(rank)));
    w.add_kv(kFirst, gguf::Value::u32(static_cast<uint32_t>(lo)));
    w.add_kv(kCount, gguf::Value::u32(static_cast<uint32_t>(hi - lo)));
    w.add_kv(kSource, gguf::Value::str(id));
    for (const auto& t : r->tensors()) {
      std::vector<int64_t> ne(t.ne.begin(), t.ne.begin() + t.n_dims);
      if (is_experts(t.name)) ne[2] = hi - lo;
      w.add_tensor(t.name, t.type, ne);
    }
    w.begin();
    for (const auto& t : r->tensors()) {
      if (is_experts(t.name)) {
        const uint64_t slice = t.nbytes / static_cast<uint64_t>(t.ne[2]);
        w.write_tensor_data(t.name, t.data + slice * static_cast<uint64_t>(lo),
                            static_cast<size_t>(slice * static_cast<uint64_t>(hi - lo)));
      } else {
        w.write_tensor_data(t.name, t.data, static_cast<size_t>(t.nbytes));
      }
    }
    w.finish();
    const auto names = w.output_paths();
    out.insert(out.end(), names.begin(), names.end());
    if (!o.quiet)
      std::fprintf(stderr, "shard: rank %d of %d: experts %lld..%lld -> %s\n", rank, o.ranks, static_cast<long long>(lo),
                   static_cast<long long>(hi - 1), path.c_str());
  }
  return out;
}

}  // namespace kimi
