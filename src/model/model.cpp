// Model loading: hparams from kimi-k3.* keys, weight binding and validation (k3-architecture.md
// §2.2-2.3, spec/README.md decision 2).
#include "model/model.h"

#include <fmt/format.h>

#include <algorithm>
#include <map>
#include <set>

#include "model/hparams_check.h"
#include "model/shard.h"
#include "util/error.h"

namespace kimi {

std::string weight_view_of(const gguf::TensorInfo& ti, bool vec, WeightView& out) {
  out.info = &ti;
  if (vec) {
    if (ti.type != GgmlType::F32) return fmt::format("tensor '{}': expected type F32, found {}", ti.name, type_name(ti.type));
    out.f32 = reinterpret_cast<const float*>(ti.data);
    out.mat = {GgmlType::F32, ti.data, 1, ti.ne[0], static_cast<uint64_t>(ti.ne[0]) * 4};
    return {};
  }
  const auto tt = type_traits(static_cast<uint32_t>(ti.type));
  if (!tt) return fmt::format("tensor '{}': unsupported type id {}", ti.name, static_cast<uint32_t>(ti.type));
  if (ti.ne[0] % tt->block != 0)
    return fmt::format("tensor '{}': row length {} is not a multiple of the {} block size {}", ti.name, ti.ne[0],
                       tt->name, tt->block);
  const uint64_t rb = row_bytes(ti.type, static_cast<uint64_t>(ti.ne[0]));
  out.mat = {ti.type, ti.data, ti.ne[1], ti.ne[0], rb};
  out.slice_bytes = rb * static_cast<uint64_t>(ti.ne[1]);
  return {};
}

uint32_t HParams::n_mla_layers() const {
  uint32_t n = 0;
  for (auto v : is_mla) n += v ? 1 : 0;
  return n;
}

uint64_t HParams::state_bytes_per_seq() const {
  const uint64_t C = kda_channels();
  const uint64_t conv = 3 * C * (conv_kernel > 0 ? conv_kernel - 1 : 0) * 4;
  const uint64_t rec = static_cast<uint64_t>(n_head) * kda_head_dim * kda_head_dim * 4;
  return n_kda_layers() * (conv + rec);
}

uint64_t HParams::cache_bytes_per_token(CacheType ct) const {
  const uint64_t es = ct == CacheType::F16 ? 2 : 4;
  return n_mla_layers() * (mla_row() + (has_indexer ? idx_dim : 0)) * es;
}

struct ModelLoader {
  Model& m;
  const gguf::Reader& r;
  std::string file;
  std::string arch;
  std::set<std::string> used;

  std::string key(const std::string& k) const { return arch + "." + k; }
  uint32_t u32(const std::string& k) const { return r.get_u32(key(k)); }
  uint32_t u32_or(const std::string& k, uint32_t d) const { return r.get_u32_or(key(k), d); }
  float f32_or(const std::string& k, float d) const { return r.get_f32_or(key(k), d); }

  [[noreturn]] void bad(const std::string& what) const { fail("{}: {}", file, what); }

  void read_hparams() {
    HParams& hp = m.hp_;
    hp.arch = arch;
    try {
      hp.n_layer = u32("block_count");
      // K3 has 93; the bound keeps a corrupt count from sizing the per-layer tables (fuzz_model)
      if (hp.n_layer < 1 || hp.n_layer > 4096)
        bad(fmt::format("key '{}' = {}: outside 1 .. 4096 layers", key("block_count"), hp.n_layer));
      hp.n_embd = u32("embedding_length");
      hp.n_ctx_train = u32_or("context_length", 0);
      hp.n_head = u32("attention.head_count");
      hp.rms_eps = r.get_f32(key("attention.layer_norm_rms_epsilon"));
      hp.n_ff = u32_or("feed_forward_length", 0);

      // head_count_kv: per-layer array (0 = KDA). A scalar means every layer is the same kind.
      const gguf::Value* hkv = r.find(key("attention.head_count_kv"));
      if (!hkv) bad(fmt::format("key '{}': missing (needed for the KDA/MLA layer schedule)", key("attention.head_count_kv")));
      hp.is_mla.assign(hp.n_layer, 0);
      if (hkv->type == gguf::ValueType::ARRAY) {
        auto v = r.get_int_array(key("attention.head_count_kv"));
        if (v.size() != hp.n_layer)
          bad(fmt::format("key '{}': expected {} entries (block_count), found {}", key("attention.head_count_kv"),
                          hp.n_layer, v.size()));
        for (uint32_t i = 0; i < hp.n_layer; ++i) hp.is_mla[i] = v[i] != 0;
      } else {
        const uint32_t v = r.get_u32(key("attention.head_count_kv"));
        for (uint32_t i = 0; i < hp.n_layer; ++i) hp.is_mla[i] = v != 0;
      }

      hp.kda_head_dim = u32_or("kda.head_dim", 0);
      hp.conv_kernel = u32_or("ssm.conv_kernel", 0);
      if (r.has(key("kda.gate_lower_bound"))) {
        hp.has_gate_lb = true;
        hp.gate_lb = r.get_f32(key("kda.gate_lower_bound"));
      }
      if (hp.n_mla_layers() > 0) {
        hp.q_lora = u32("attention.q_lora_rank");
        hp.kv_lora = u32("attention.kv_lora_rank");
        hp.n_rope = u32_or("rope.dimension_count", 0);
        hp.n_kq = u32("attention.key_length_mla");
        hp.n_v = u32("attention.value_length_mla");
        if (hp.n_kq <= hp.n_rope)
          bad(fmt::format("key '{}' = {} must exceed rope.dimension_count = {}", key("attention.key_length_mla"),
                          hp.n_kq, hp.n_rope));
        hp.n_nope = hp.n_kq - hp.n_rope;
        const uint32_t kl = u32_or("attention.key_length", hp.kv_lora + hp.n_rope);
        if (kl != hp.kv_lora + hp.n_rope)
          bad(fmt::format("key '{}' = {}, expected kv_lora_rank + rope.dimension_count = {}", key("attention.key_length"),
                          kl, hp.kv_lora + hp.n_rope));
      }
      if (hp.n_kda_layers() > 0) {
        if (hp.kda_head_dim == 0) bad(fmt::format("key '{}': missing or 0 (file has KDA layers)", key("kda.head_dim")));
        if (hp.conv_kernel == 0) bad(fmt::format("key '{}': missing or 0 (file has KDA layers)", key("ssm.conv_kernel")));
      }

      hp.n_dense_lead = u32_or("leading_dense_block_count", 0);
      if (hp.n_dense_lead > hp.n_layer) hp.n_dense_lead = hp.n_layer;
      if (hp.n_dense_lead > 0 && hp.n_ff == 0)
        bad(fmt::format("key '{}': missing (file has dense leading layers)", key("feed_forward_length")));
      if (hp.n_dense_lead < hp.n_layer) {
        hp.n_expert = u32("expert_count");
        hp.n_expert_used = u32("expert_used_count");
        hp.n_expert_shared = u32_or("expert_shared_count", 0);
        hp.n_ff_exp = u32("expert_feed_forward_length");
        hp.n_latent = u32_or("expert_latent_length", 0);
        hp.expert_weights_scale = f32_or("expert_weights_scale", 1.0f);
        hp.expert_weights_norm = r.get_bool_or(key("expert_weights_norm"), false);
        hp.gating_func = u32_or("expert_gating_func", 2);
        if (hp.gating_func != 1 && hp.gating_func != 2)
          bad(fmt::format("key '{}' = {}: only 1 (softmax) and 2 (sigmoid) are supported", key("expert_gating_func"),
                          hp.gating_func));
        if (hp.n_expert_used == 0 || hp.n_expert_used > hp.n_expert)
          bad(fmt::format("key '{}' = {}: must be in 1..expert_count ({})", key("expert_used_count"), hp.n_expert_used,
                          hp.n_expert));
      }
      if (r.has("kimi.shard.ranks")) {  // a per-rank file (model/shard.h)
        hp.shard_ranks = r.get_u32("kimi.shard.ranks");
        hp.shard_rank = r.get_u32("kimi.shard.rank");
        hp.shard_expert_first = r.get_u32_or("kimi.shard.expert_first", 0);
        hp.shard_expert_count = r.get_u32_or("kimi.shard.expert_count", 0);
        const uint64_t e_lo = uint64_t{hp.n_expert} * hp.shard_rank / std::max<uint32_t>(hp.shard_ranks, 1);
        const uint64_t e_hi = uint64_t{hp.n_expert} * (hp.shard_rank + 1) / std::max<uint32_t>(hp.shard_ranks, 1);
        if (hp.shard_ranks < 2 || hp.shard_rank >= hp.shard_ranks || hp.shard_expert_first != e_lo ||
            hp.shard_expert_count != e_hi - e_lo)
          bad(fmt::format("keys kimi.shard.*: rank {} of {} with experts {}+{} of {}: not a valid split",
                          hp.shard_rank, hp.shard_ranks, hp.shard_expert_first, hp.shard_expert_count,
                          hp.n_expert));
      }
      hp.attn_res_block = u32_or("attn_res.block_size", 0);
      hp.situ_beta = f32_or("activation.situ_beta", 4.0f);
      hp.situ_lambda = f32_or("activation.situ_linear_beta", 25.0f);

      const uint32_t topk = u32_or("attention.indexer.top_k", 0);
      if (topk > 0) {
        hp.has_indexer = true;
        hp.idx_top_k = topk;
        hp.idx_heads = u32("attention.indexer.head_count");
        hp.idx_dim = u32("attention.indexer.key_length");
        if (hp.idx_heads == 0 || hp.idx_dim == 0)
          bad("indexer head_count and key_length must be > 0 when attention.indexer.top_k > 0");
        if (r.has(key("attention.indexer.types"))) {
          auto t = r.get_int_array(key("attention.indexer.types"));
          if (t.size() != hp.n_layer) bad(fmt::format("key '{}': expected {} entries", key("attention.indexer.types"), hp.n_layer));
          for (uint32_t i = 0; i < hp.n_layer; ++i)
            if ((t[i] != 0) != (hp.is_mla[i] != 0))
              bad(fmt::format("key '{}': layer {} disagrees with head_count_kv (indexer only in MLA layers)",
                              key("attention.indexer.types"), i));
        }
      }
      if (r.has("tokenizer.ggml.bos_token_id")) hp.bos_id = static_cast<int32_t>(r.get_u32("tokenizer.ggml.bos_token_id"));
      if (r.has("tokenizer.ggml.eos_token_id")) hp.eos_id = static_cast<int32_t>(r.get_u32("tokenizer.ggml.eos_token_id"));
    } catch (const Error& e) {
      const std::string msg = e.what();
      if (msg.rfind(file, 0) == 0) throw;
      fail("{}: {}", file, msg);
    }
  }

  // ---- tensors ----
  enum class Kind { Vec, Mat };

  // Binds a tensor: expected logical shape `ne` (ggml order; trailing 1s ignored). Vec tensors
  // must be F32; Mat tensors may be any known type whose block size divides ne[0].
  WeightView bind(const std::string& name, Kind kind, std::vector<int64_t> ne, bool required = true) {
    const gguf::TensorInfo* ti = r.find_tensor(name);
    WeightView w;
    if (!ti) {
      if (required)
        bad(fmt::format("tensor '{}' is missing (expected shape {})", name, shape_str(ne)));
      return w;
    }
    used.insert(name);
    if (m.hp_.shard_ranks) {  // a per-rank file holds only this rank's range of a split tensor
      const SplitRule rule = split_rule(name, m.hp_);
      if (rule && static_cast<size_t>(rule.dim) < ne.size()) {
        int64_t lo = 0, hi = 0;
        rule.range(static_cast<int>(m.hp_.shard_ranks), static_cast<int>(m.hp_.shard_rank), lo, hi);
        ne[static_cast<size_t>(rule.dim)] = hi - lo;
      }
    }
    check_shape(*ti, ne);
    if (std::string why = weight_view_of(*ti, kind == Kind::Vec, w); !why.empty()) bad(why);
    return w;
  }

  static std::string shape_str(const std::vector<int64_t>& ne) {
    std::string s = "{";
    for (size_t i = 0; i < ne.size(); ++i) s += (i ? ", " : "") + std::to_string(ne[i]);
    return s + "}";
  }

  void check_shape(const gguf::TensorInfo& ti, const std::vector<int64_t>& ne) const {
    bool ok = true;
    for (size_t i = 0; i < 4; ++i) {
      const int64_t want = i < ne.size() ? ne[i] : 1;
      if (ti.ne[i] != want) ok = false;
    }
    if (!ok) bad(fmt::format("tensor '{}': expected shape {}, found {}", ti.name, shape_str(ne), ti.shape_string()));
  }

  // conv weights: {K, 1, C, 1}, {K, 1, C} or {K, C}
  WeightView bind_conv(const std::string& name, int64_t K, int64_t C) {
    const gguf::TensorInfo* ti = r.find_tensor(name);
    if (!ti) bad(fmt::format("tensor '{}' is missing (expected shape {{{}, 1, {}}})", name, K, C));
    used.insert(name);
    const bool ok = ti->ne[0] == K && ((ti->ne[1] == 1 && ti->ne[2] == C && ti->ne[3] == 1) ||
                                       (ti->ne[1] == C && ti->ne[2] == 1 && ti->ne[3] == 1));
    if (!ok) bad(fmt::format("tensor '{}': expected shape {{{}, 1, {}}}, found {}", name, K, C, ti->shape_string()));
    if (ti->type != GgmlType::F32)
      bad(fmt::format("tensor '{}': expected type F32, found {}", name, type_name(ti->type)));
    WeightView w;
    w.info = ti;
    w.f32 = reinterpret_cast<const float*>(ti->data);
    return w;
  }

  void bind_all() {
    const HParams& hp = m.hp_;
    const int64_t d = hp.n_embd;
    // vocab from token_embd
    const gguf::TensorInfo* te = r.find_tensor("token_embd.weight");
    if (!te) bad("tensor 'token_embd.weight' is missing");
    const uint32_t nv_key = u32_or("vocab_size", 0);
    m.hp_.n_vocab = nv_key ? nv_key : static_cast<uint32_t>(te->ne[1]);
    const int64_t V = m.hp_.n_vocab;
    m.token_embd_ = bind("token_embd.weight", Kind::Mat, {d, V});
    m.output_ = bind("output.weight", Kind::Mat, {d, V});
    m.output_norm_ = bind("output_norm.weight", Kind::Vec, {d});
    if (hp.attn_res_block > 0) m.output_res_score_ = bind("output_res_score.weight", Kind::Vec, {d});

    m.layers_.resize(hp.n_layer);
    const int64_t H = hp.n_head;
    for (uint32_t il = 0; il < hp.n_layer; ++il) {
      LayerWeights& L = m.layers_[il];
      auto n = [&](const char* s) { return fmt::format("blk.{}.{}", il, s); };
      L.attn_norm = bind(n("attn_norm.weight"), Kind::Vec, {d});
      L.ffn_norm = bind(n("ffn_norm.weight"), Kind::Vec, {d});
      if (hp.attn_res_block > 0) {
        L.attn_res_score = bind(n("attn_res_score.weight"), Kind::Vec, {d});
        L.ffn_res_score = bind(n("ffn_res_score.weight"), Kind::Vec, {d});
      }
      if (!hp.is_mla[il]) {
        const int64_t D = hp.kda_head_dim, C = H * D, K = hp.conv_kernel;
        L.attn_q = bind(n("attn_q.weight"), Kind::Mat, {d, C});
        L.attn_k = bind(n("attn_k.weight"), Kind::Mat, {d, C});
        L.attn_v = bind(n("attn_v.weight"), Kind::Mat, {d, C});
        L.conv_q = bind_conv(n("ssm_conv1d_q.weight"), K, C);
        L.conv_k = bind_conv(n("ssm_conv1d_k.weight"), K, C);
        L.conv_v = bind_conv(n("ssm_conv1d_v.weight"), K, C);
        const gguf::TensorInfo* fa = r.find_tensor(n("ssm_f_a.weight"));
        const int64_t rank = fa ? fa->ne[1] : D;
        L.ssm_f_a = bind(n("ssm_f_a.weight"), Kind::Mat, {d, rank});
        L.ssm_f_b = bind(n("ssm_f_b.weight"), Kind::Mat, {rank, C});
        L.ssm_beta = bind(n("ssm_beta.weight"), Kind::Mat, {d, H});
        L.ssm_a = bind(n("ssm_a"), Kind::Vec, {H});
        L.ssm_dt_b = bind(n("ssm_dt.bias"), Kind::Vec, {C});
        L.ssm_g = bind(n("ssm_g.weight"), Kind::Mat, {d, C});
        L.ssm_norm = bind(n("ssm_norm.weight"), Kind::Vec, {D});
        L.attn_output = bind(n("attn_output.weight"), Kind::Mat, {C, d});
        for (const char* s : {"indexer.attn_q_b.weight", "indexer.attn_k.weight", "indexer.k_norm.weight",
                              "indexer.k_norm.bias", "indexer.proj.weight"})
          if (r.find_tensor(n(s)))
            bad(fmt::format("tensor '{}' found in layer {}, which is a KDA layer (head_count_kv = 0); the DSA "
                            "indexer belongs to the full-attention (MLA) layers only",
                            n(s), il));
      } else {
        const int64_t ql = hp.q_lora, kvl = hp.kv_lora, kq = hp.n_kq, nope = hp.n_nope, vd = hp.n_v;
        L.attn_q_a = bind(n("attn_q_a.weight"), Kind::Mat, {d, ql});
        L.attn_q_a_norm = bind(n("attn_q_a_norm.weight"), Kind::Vec, {ql});
        L.attn_q_b = bind(n("attn_q_b.weight"), Kind::Mat, {ql, H * kq});
        L.attn_kv_a_mqa = bind(n("attn_kv_a_mqa.weight"), Kind::Mat, {d, kvl + hp.n_rope});
        L.attn_kv_a_norm = bind(n("attn_kv_a_norm.weight"), Kind::Vec, {kvl});
        L.attn_k_b = bind(n("attn_k_b.weight"), Kind::Mat, {nope, kvl, H});
        L.attn_v_b = bind(n("attn_v_b.weight"), Kind::Mat, {kvl, vd, H});
        L.attn_gate = bind(n("attn_gate.weight"), Kind::Mat, {d, H * vd}, false);
        L.attn_output = bind(n("attn_output.weight"), Kind::Mat, {H * vd, d});
        if (hp.has_indexer) {
          const int64_t HI = hp.idx_heads, DI = hp.idx_dim;
          L.idx_q_b = bind(n("indexer.attn_q_b.weight"), Kind::Mat, {ql, HI * DI});
          L.idx_k = bind(n("indexer.attn_k.weight"), Kind::Mat, {d, DI});
          L.idx_k_norm_w = bind(n("indexer.k_norm.weight"), Kind::Vec, {DI});
          L.idx_k_norm_b = bind(n("indexer.k_norm.bias"), Kind::Vec, {DI});
          L.idx_proj = bind(n("indexer.proj.weight"), Kind::Mat, {d, HI});
        } else {
          for (const char* s : {"indexer.attn_q_b.weight", "indexer.attn_k.weight", "indexer.proj.weight"})
            if (r.find_tensor(n(s)))
              bad(fmt::format("tensor '{}' present but key '{}' is missing or 0 (indexer disabled)", n(s),
                              key("attention.indexer.top_k")));
        }
      }
      if (!hp.is_moe(il)) {
        L.ffn_gate = bind(n("ffn_gate.weight"), Kind::Mat, {d, hp.n_ff});
        L.ffn_up = bind(n("ffn_up.weight"), Kind::Mat, {d, hp.n_ff});
        L.ffn_down = bind(n("ffn_down.weight"), Kind::Mat, {hp.n_ff, d});
      } else {
        const int64_t E = hp.n_expert, F = hp.n_ff_exp, Lw = hp.n_latent ? hp.n_latent : d;
        const gguf::TensorInfo* gi = r.find_tensor(n("ffn_gate_inp.weight"));
        if (gi && gi->type == GgmlType::F32)
          L.ffn_gate_inp = bind(n("ffn_gate_inp.weight"), Kind::Vec, {d, E});
        else
          L.ffn_gate_inp = bind(n("ffn_gate_inp.weight"), Kind::Mat, {d, E});
        if (gi && gi->type == GgmlType::F32) {
          L.ffn_gate_inp.mat = {GgmlType::F32, gi->data, gi->ne[1], d, static_cast<uint64_t>(d) * 4};
        }
        L.exp_probs_b = bind(n("exp_probs_b.bias"), Kind::Vec, {E}, false);
        const int64_t Ef = E;  // (a per-rank file holds only its experts: bind() narrows the shape)
        L.ffn_gate_exps = bind(n("ffn_gate_exps.weight"), Kind::Mat, {Lw, F, Ef});
        L.ffn_up_exps = bind(n("ffn_up_exps.weight"), Kind::Mat, {Lw, F, Ef});
        L.ffn_down_exps = bind(n("ffn_down_exps.weight"), Kind::Mat, {F, Lw, Ef});
        if (hp.n_latent) {
          L.ffn_routed_down = bind(n("ffn_routed_down.weight"), Kind::Mat, {d, Lw});
          L.ffn_routed_up = bind(n("ffn_routed_up.weight"), Kind::Mat, {Lw, d});
          L.ffn_routed_norm = bind(n("ffn_routed_norm.weight"), Kind::Vec, {Lw}, false);
        }
        if (hp.n_expert_shared > 0) {
          const int64_t S = F * hp.n_expert_shared;
          L.ffn_gate_shexp = bind(n("ffn_gate_shexp.weight"), Kind::Mat, {d, S});
          L.ffn_up_shexp = bind(n("ffn_up_shexp.weight"), Kind::Mat, {d, S});
          L.ffn_down_shexp = bind(n("ffn_down_shexp.weight"), Kind::Mat, {S, d});
        }
      }
    }
    // indexer tensors of layers that do not exist / stray blk tensors beyond block_count
    for (const auto& ti : r.tensors()) {
      if (used.count(ti.name)) continue;
      if (ti.name.find(".indexer.") != std::string::npos)
        bad(fmt::format("unexpected tensor '{}' (the DSA indexer tensors must be exactly in the MLA layers)", ti.name));
    }
  }
};

std::unique_ptr<Model> Model::load(const std::string& path, const ModelOptions& opts) {
  std::unique_ptr<Model> m(new Model());
  m->path_ = path;
  m->reader_ = gguf::Reader::open(path);
  const gguf::Reader& r = *m->reader_;
  ModelLoader ld{*m, r, path, "", {}};
  if (!r.has("general.architecture")) fail("{}: key 'general.architecture' is missing", path);
  ld.arch = r.get_str("general.architecture");
  if (ld.arch != "kimi-k3")
    fail("{}: general.architecture is '{}', expected 'kimi-k3'", path, ld.arch);
  ld.read_hparams();
  validate_hparams(m->hp_, r, path);  // every value the loader and forward pass compute with (hparams_check.h)
  ld.bind_all();
  if (opts.verbose) fmt::print(stderr, "{}", m->summary());
  return m;
}

uint64_t Model::n_params() const {
  uint64_t n = 0;
  for (const auto& t : reader_->tensors()) n += static_cast<uint64_t>(t.nelements());
  return n;
}

static std::string human_bytes(double b) {
  const char* u[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  int i = 0;
  while (b >= 1024.0 && i < 4) {
    b /= 1024.0;
    ++i;
  }
  return fmt::format("{:.2f} {}", b, u[i]);
}

uint64_t Model::decode_weight_bytes_per_token() const {
  uint64_t b = 0;
  for (const auto& t : reader_->tensors()) {
    if (t.name == "token_embd.weight" && t.ne[1] > 0) {
      b += t.nbytes / static_cast<uint64_t>(t.ne[1]);
    } else if (t.name.size() > 13 && t.name.compare(t.name.size() - 12, 12, "_exps.weight") == 0 && hp_.n_expert > 0) {
      b += t.nbytes / hp_.file_experts() * std::min(hp_.n_expert_used, hp_.n_expert);
    } else {
      b += t.nbytes;
    }
  }
  return b;
}

std::string Model::summary(CacheType ct) const {
  const HParams& hp = hp_;
  std::string s;
  s += fmt::format("model: {} ({}), {} tensors, {} file(s)\n", path_, hp.arch, reader_->tensors().size(),
                   reader_->n_files());
  std::string sched;
  for (uint32_t i = 0; i < hp.n_layer; ++i) sched += hp.is_mla[i] ? 'M' : 'K';
  s += fmt::format("  layers {} (K = KDA, M = MLA): {}\n", hp.n_layer, sched);
  s += fmt::format("  d {}, heads {}, vocab {}, kda head_dim {}, kv_lora {} + pe {}, experts {} (top {}, shared {}), "
                   "latent {}\n",
                   hp.n_embd, hp.n_head, hp.n_vocab, hp.kda_head_dim, hp.kv_lora, hp.n_rope, hp.n_expert,
                   hp.n_expert_used, hp.n_expert_shared, hp.n_latent);
  if (hp.has_indexer)
    s += fmt::format("  DSA indexer: {} heads x {}, top_k {}\n", hp.idx_heads, hp.idx_dim, hp.idx_top_k);
  else
    s += "  DSA indexer: none (plain K3)\n";
  std::map<std::string, std::pair<uint64_t, uint64_t>> by_type;  // type -> (params, bytes)
  uint64_t total_b = 0;
  for (const auto& t : reader_->tensors()) {
    auto& e = by_type[type_name(t.type)];
    e.first += static_cast<uint64_t>(t.nelements());
    e.second += t.nbytes;
    total_b += t.nbytes;
  }
  s += fmt::format("  parameters: {} ({:.3f} B), {}\n", n_params(), n_params() / 1e9, human_bytes(double(total_b)));
  for (const auto& [ty, e] : by_type)
    s += fmt::format("    {:<6} {:>16} params  {:>12}\n", ty, e.first, human_bytes(double(e.second)));
  s += fmt::format("  weights read per decoded token: {}\n", human_bytes(double(decode_weight_bytes_per_token())));
  s += fmt::format("  state per sequence (KDA conv + recurrent, f32): {}\n", human_bytes(double(hp.state_bytes_per_seq())));
  s += fmt::format("  cache per token ({}: MLA latent{}): {} B\n", ct == CacheType::F16 ? "F16" : "F32",
                   hp.has_indexer ? " + indexer keys" : "", hp.cache_bytes_per_token(ct));
  return s;
}

}  // namespace kimi
