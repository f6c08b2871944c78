// Per-rank model files (shard.h).
#include "model/shard.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>

#include "model/model.h"
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

SplitRule split_rule(const std::string& name, const HParams& hp) {
  std::string s = name;
  if (s.rfind("blk.", 0) == 0) {  // blk.<il>.<what>
    const auto dot = s.find('.', 4);
    if (dot == std::string::npos) return {};
    s = s.substr(dot + 1);
  }
  const int64_t H = hp.n_head, D = hp.kda_head_dim, d = hp.n_embd, Lw = hp.n_latent ? hp.n_latent : hp.n_embd;
  const int64_t HI = hp.idx_heads, DI = hp.idx_dim, S = static_cast<int64_t>(hp.n_ff_exp) * hp.n_expert_shared;
  auto rows = [](int64_t unit, int64_t total) { return SplitRule{1, unit, total}; };
  // KDA: heads (their channels / their beta row); the decay's low-rank input projection is whole
  if (s == "attn_q.weight" || s == "attn_k.weight" || s == "attn_v.weight" || s == "ssm_g.weight" ||
      s == "ssm_f_b.weight")
    return rows(D, H * D);
  if (s == "ssm_beta.weight") return rows(1, H);
  // MLA: heads of the queries, of the absorbed k_b / v_b slices and of the output gate; the
  // latent projections by rows (gathered: every rank needs the whole latents)
  if (s == "attn_q_b.weight") return rows(hp.n_kq, H * hp.n_kq);
  if (s == "attn_k_b.weight" || s == "attn_v_b.weight") return {2, 1, H};
  if (s == "attn_gate.weight") return rows(hp.n_v, H * hp.n_v);
  if (s == "attn_q_a.weight") return rows(1, hp.q_lora);
  if (s == "attn_kv_a_mqa.weight") return rows(1, hp.kv_lora + hp.n_rope);
  // the DSA indexer: query heads; keys and head weights by rows (gathered)
  if (s == "indexer.attn_q_b.weight") return rows(DI, HI * DI);
  if (s == "indexer.attn_k.weight") return rows(1, DI);
  if (s == "indexer.proj.weight") return rows(1, HI);
  // output projections of every block and the LM head: rows
  if (s == "attn_output.weight" || s == "ffn_down.weight" || s == "ffn_down_shexp.weight" ||
      s == "ffn_routed_up.weight")
    return rows(1, d);
  if (s == "output.weight") return rows(1, hp.n_vocab);
  // FFN inner rows, the router, the routed experts' latent input; the experts themselves
  if (s == "ffn_gate.weight" || s == "ffn_up.weight") return rows(1, hp.n_ff);
  if (s == "ffn_gate_shexp.weight" || s == "ffn_up_shexp.weight") return rows(1, S);
  if (s == "ffn_gate_inp.weight") return rows(1, hp.n_expert);
  if (s == "ffn_routed_down.weight") return rows(1, Lw);
  if (is_experts(s)) return {2, 1, hp.n_expert};
  return {};
}

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
  const auto model = Model::load(o.input);  // the hyper-parameters (and a check of every tensor)
  const HParams& hp = model->hparams();
  std::error_code ec;
  std::filesystem::create_directories(o.out_dir, ec);
  check(std::filesystem::is_directory(o.out_dir), "shard: -o {}: cannot create the directory", o.out_dir);
  const int64_t E = hp.n_expert;
  check(E == 0 || E >= o.ranks, "{}: {} routed experts cannot be split over {} ranks", o.input, E, o.ranks);
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
    // each tensor's bytes for this rank: its range of the split dimension (contiguous: rows of a
    // matrix or slices of a stack), or all of it
    struct Part {
      uint64_t offset = 0, bytes = 0;
    };
    std::vector<Part> parts;
    uint64_t total = 0;
    for (const auto& t : r->tensors()) {
      std::vector<int64_t> ne(t.ne.begin(), t.ne.begin() + t.n_dims);
      Part p{0, t.nbytes};
      const SplitRule rule = split_rule(t.name, hp);
      if (rule) {
        const int dim = rule.dim;
        const int nd = static_cast<int>(t.n_dims);
        check(dim < nd && t.ne[static_cast<size_t>(dim)] == rule.total,
              "{}: tensor '{}' has shape {}, expected {} along dimension {} to split it", o.input, t.name,
              t.shape_string(), rule.total, dim);
        int64_t a = 0, b = 0;
        rule.range(o.ranks, rank, a, b);
        uint64_t outer = 1;  // elements of the dimensions after the split one (1 for these tensors)
        for (int i = dim + 1; i < nd; ++i) outer *= static_cast<uint64_t>(t.ne[static_cast<size_t>(i)]);
        check(outer == 1, "{}: tensor '{}': only the last dimension can be split", o.input, t.name);
        const uint64_t stride = t.nbytes / static_cast<uint64_t>(rule.total);
        p = {stride * static_cast<uint64_t>(a), stride * static_cast<uint64_t>(b - a)};
        ne[static_cast<size_t>(dim)] = b - a;
        check(b > a, "{}: tensor '{}' has too few {} ({}) for {} ranks", o.input, t.name,
              dim == 2 ? "slices" : "rows", rule.total / rule.unit, o.ranks);
      }
      parts.push_back(p);
      total += p.bytes;
      w.add_tensor(t.name, t.type, ne);
    }
    w.begin();
    size_t i = 0;
    for (const auto& t : r->tensors()) {
      const Part& p = parts[i++];
      w.write_tensor_data(t.name, t.data + p.offset, static_cast<size_t>(p.bytes));
    }
    w.finish();
    const auto names = w.output_paths();
    out.insert(out.end(), names.begin(), names.end());
    if (!o.quiet)
      std::fprintf(stderr, "shard: rank %d of %d: experts %lld..%lld, %.1f MiB -> %s\n", rank, o.ranks,
                   static_cast<long long>(lo), static_cast<long long>(hi - 1), static_cast<double>(total) / 1048576.0,
                   path.c_str());
  }
  return out;
}

}  // namespace kimi
