// The K3 DSpark draft: loading (dspark.md §2) and the forward pass through the Backend ops (§3).
#include "model/dspark.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <iterator>
#include <limits>

#include "util/error.h"

namespace kimi {

// ------------------------------------------------------------------------------------------------
// hyper-parameters

namespace {

double mscale_of(double factor, double m) { return factor <= 1.0 ? 1.0 : 0.1 * m * std::log(factor) + 1.0; }

}  // namespace

double DsparkHParams::attn_scale() const {
  const double m = yarn_factor > 1.0f ? mscale_of(yarn_factor, yarn_mscale_all) : 1.0;
  return m * m / std::sqrt(static_cast<double>(n_kq()));
}

std::vector<float> DsparkHParams::rope_table(int64_t n_ctx) const {
  const int64_t half = n_rope / 2;
  const double D = n_rope, base = rope_base;
  std::vector<double> f(static_cast<size_t>(half));
  double mag = 1.0;
  for (int64_t i = 0; i < half; ++i) f[size_t(i)] = std::pow(base, -2.0 * static_cast<double>(i) / D);
  if (yarn_factor > 1.0f) {  // YaRN (dspark.md §3.3)
    const double factor = yarn_factor, orig = yarn_orig_ctx;
    const double pi = 3.14159265358979323846;
    auto corr = [&](double n_rot) { return D * std::log(orig / (n_rot * 2.0 * pi)) / (2.0 * std::log(base)); };
    double low = std::max(std::floor(corr(yarn_beta_fast)), 0.0);
    double high = std::min(std::ceil(corr(yarn_beta_slow)), D - 1.0);
    if (low == high) high += 0.001;
    for (int64_t i = 0; i < half; ++i) {
      const double ramp = std::clamp((static_cast<double>(i) - low) / (high - low), 0.0, 1.0);
      const double mask = 1.0 - ramp;
      const double extra = f[size_t(i)], inter = extra / factor;
      f[size_t(i)] = inter * (1.0 - mask) + extra * mask;
    }
    mag = mscale_of(factor, yarn_mscale) / mscale_of(factor, yarn_mscale_all);
  }
  std::vector<float> cs(static_cast<size_t>(n_ctx * half * 2));
  for (int64_t p = 0; p < n_ctx; ++p)
    for (int64_t i = 0; i < half; ++i) {
      const double a = static_cast<double>(p) * f[size_t(i)];
      cs[size_t((p * half + i) * 2)] = static_cast<float>(std::cos(a) * mag);
      cs[size_t((p * half + i) * 2 + 1)] = static_cast<float>(std::sin(a) * mag);
    }
  return cs;
}

// ------------------------------------------------------------------------------------------------
// loading

struct DsparkLoader {
  DsparkModel& m;
  const gguf::Reader& r;
  std::string file;
  const std::string A = "kimi-k3-dspark.";

  [[noreturn]] void bad(const std::string& what) const { fail("{}: {}", file, what); }
  uint32_t u32(const std::string& k) const { return r.get_u32(A + k); }
  uint32_t u32_or(const std::string& k, uint32_t d) const { return r.get_u32_or(A + k, d); }
  float f32_or(const std::string& k, float d) const { return r.get_f32_or(A + k, d); }
  uint32_t positive(const std::string& k, uint32_t hi) const {
    const uint32_t v = u32(k);
    if (v == 0 || v > hi) bad(fmt::format("key '{}{}' = {}: expected 1 .. {}", A, k, v, hi));
    return v;
  }

  void read_hparams() {
    if (!r.has("general.architecture") || r.get_str("general.architecture") != "kimi-k3-dspark")
      bad(fmt::format("general.architecture is '{}', expected 'kimi-k3-dspark' (a K3 DSpark draft GGUF)",
                      r.has("general.architecture") ? r.get_str("general.architecture") : std::string("(missing)")));
    DsparkHParams& hp = m.hp_;
    try {
      hp.n_layer = positive("block_count", 64);
      hp.n_embd = positive("embedding_length", 1u << 16);
      hp.n_ff = positive("feed_forward_length", 1u << 20);
      hp.n_vocab = positive("vocab_size", 1u << 24);
      hp.n_head = positive("attention.head_count", 1024);
      hp.q_lora = positive("attention.q_lora_rank", 1u << 16);
      hp.kv_lora = positive("attention.kv_lora_rank", 1u << 16);
      const uint32_t kq = positive("attention.key_length_mla", 1u << 12);
      hp.n_v = positive("attention.value_length_mla", 1u << 12);
      hp.n_rope = positive("rope.dimension_count", 1u << 12);
      if (hp.n_rope % 2 != 0 || hp.n_rope >= kq)
        bad(fmt::format("key '{}rope.dimension_count' = {}: must be even and below key_length_mla = {}", A, hp.n_rope, kq));
      hp.n_nope = kq - hp.n_rope;
      hp.n_ctx_train = u32_or("context_length", 0);
      hp.rms_eps = r.get_f32(A + "attention.layer_norm_rms_epsilon");
      hp.rope_base = f32_or("rope.freq_base", 10000.0f);
      if (!(hp.rope_base > 1.0f)) bad(fmt::format("key '{}rope.freq_base' = {}: expected > 1", A, hp.rope_base));
      hp.yarn_factor = f32_or("rope.scaling.factor", 1.0f);
      if (hp.yarn_factor > 1.0f) {
        hp.yarn_orig_ctx = positive("rope.scaling.original_context_length", 1u << 30);
        hp.yarn_beta_fast = f32_or("rope.scaling.yarn_beta_fast", 32.0f);
        hp.yarn_beta_slow = f32_or("rope.scaling.yarn_beta_slow", 1.0f);
        hp.yarn_mscale = f32_or("rope.scaling.yarn_mscale", 1.0f);
        hp.yarn_mscale_all = f32_or("rope.scaling.yarn_mscale_all_dim", 0.0f);
      }
      for (auto t : r.get_int_array(A + "target.layers")) {
        if (t < 0 || (!hp.taps.empty() && t <= int64_t{hp.taps.back()}))
          bad(fmt::format("key '{}target.layers': {} is negative or not ascending", A, t));
        hp.taps.push_back(static_cast<uint32_t>(t));
      }
      if (hp.taps.empty() || hp.taps.size() > 64) bad(fmt::format("key '{}target.layers': expected 1 .. 64 layers", A));
      hp.target_n_layer = positive("target.block_count", 4096);
      if (hp.taps.back() >= hp.target_n_layer)
        bad(fmt::format("key '{}target.layers': layer {} outside the target's {} layers", A, hp.taps.back(),
                        hp.target_n_layer));
      hp.target_n_embd = positive("target.embedding_length", 1u << 16);
      hp.block = positive("block_size", 64);
      hp.mask_token = u32("mask_token_id");
      if (hp.mask_token >= hp.n_vocab)
        bad(fmt::format("key '{}mask_token_id' = {}: outside the vocabulary of {}", A, hp.mask_token, hp.n_vocab));
      hp.markov_rank = positive("markov_rank", 1u << 16);
    } catch (const Error& e) {
      if (std::string(e.what()).rfind(file, 0) == 0) throw;
      bad(e.what());
    }
  }

  WeightView bind(const std::string& name, bool vec, std::vector<int64_t> ne) {
    const gguf::TensorInfo* ti = r.find_tensor(name);
    auto shape = [](const std::vector<int64_t>& v) {
      std::string s = "{";
      for (size_t i = 0; i < v.size(); ++i) s += (i ? ", " : "") + std::to_string(v[i]);
      return s + "}";
    };
    if (!ti) bad(fmt::format("tensor '{}' is missing (expected shape {})", name, shape(ne)));
    for (size_t i = 0; i < 4; ++i)
      if (ti->ne[i] != (i < ne.size() ? ne[i] : 1))
        bad(fmt::format("tensor '{}': expected shape {}, found {}", name, shape(ne), ti->shape_string()));
    WeightView w;
    if (std::string why = weight_view_of(*ti, vec, w); !why.empty()) bad(why);
    return w;
  }

  void bind_all() {
    const DsparkHParams& hp = m.hp_;
    const int64_t d = hp.n_embd, H = hp.n_head;
    m.context_proj_ = bind("dspark.context_proj.weight", false, {hp.tap_width(), d});
    m.context_norm_ = bind("dspark.context_norm.weight", true, {d});
    m.output_norm_ = bind("output_norm.weight", true, {d});
    m.markov_w1_ = bind("dspark.markov_w1.weight", false, {hp.markov_rank, hp.n_vocab});
    m.markov_w2_ = bind("dspark.markov_w2.weight", false, {hp.markov_rank, hp.n_vocab});
    m.layers_.resize(hp.n_layer);
    for (uint32_t il = 0; il < hp.n_layer; ++il) {
      auto n = [&](const char* s) { return fmt::format("blk.{}.{}", il, s); };
      DsparkLayer& L = m.layers_[il];
      L.attn_norm = bind(n("attn_norm.weight"), true, {d});
      L.q_a = bind(n("attn_q_a.weight"), false, {d, hp.q_lora});
      L.q_a_norm = bind(n("attn_q_a_norm.weight"), true, {hp.q_lora});
      L.q_b = bind(n("attn_q_b.weight"), false, {hp.q_lora, H * hp.n_kq()});
      L.kv_a = bind(n("attn_kv_a_mqa.weight"), false, {d, hp.row()});
      L.kv_a_norm = bind(n("attn_kv_a_norm.weight"), true, {hp.kv_lora});
      L.k_b = bind(n("attn_k_b.weight"), false, {hp.n_nope, hp.kv_lora, H});
      L.v_b = bind(n("attn_v_b.weight"), false, {hp.kv_lora, hp.n_v, H});
      L.attn_out = bind(n("attn_output.weight"), false, {H * hp.n_v, d});
      L.ffn_norm = bind(n("ffn_norm.weight"), true, {d});
      L.ffn_gate = bind(n("ffn_gate.weight"), false, {d, hp.n_ff});
      L.ffn_up = bind(n("ffn_up.weight"), false, {d, hp.n_ff});
      L.ffn_down = bind(n("ffn_down.weight"), false, {hp.n_ff, d});
    }
    if (r.tensors().size() != 5 + 13 * size_t{hp.n_layer})
      bad(fmt::format("{} tensors, expected {} for a {}-layer draft (an unknown tensor?)", r.tensors().size(),
                      5 + 13 * size_t{hp.n_layer}, hp.n_layer));
  }
};

std::unique_ptr<DsparkModel> DsparkModel::load(const std::string& path) {
  std::unique_ptr<DsparkModel> m(new DsparkModel());
  m->path_ = path;
  m->reader_ = gguf::Reader::open(path);
  DsparkLoader ld{*m, *m->reader_, path};
  ld.read_hparams();
  ld.bind_all();
  return m;
}

void DsparkModel::check_target(const HParams& t) const {
  auto bad = [&](const std::string& what) { fail("{}: does not fit the target model: {}", path_, what); };
  if (t.n_embd != hp_.n_embd)
    bad(fmt::format("embedding_length {} but the target's is {} (the draft reads the target's embeddings)", hp_.n_embd,
                    t.n_embd));
  if (t.n_vocab != hp_.n_vocab) bad(fmt::format("vocab_size {} but the target's is {}", hp_.n_vocab, t.n_vocab));
  if (t.n_embd != hp_.target_n_embd)
    bad(fmt::format("target.embedding_length {} but the target's width is {}", hp_.target_n_embd, t.n_embd));
  if (hp_.taps.back() >= t.n_layer)
    bad(fmt::format("tap layer {} but the target has {} layers", hp_.taps.back(), t.n_layer));
}

uint64_t DsparkModel::n_params() const {
  uint64_t n = 0;
  for (auto& t : reader_->tensors()) n += static_cast<uint64_t>(t.nelements());
  return n;
}

// ------------------------------------------------------------------------------------------------
// the forward pass

struct DsparkDraft::Impl {
  const DsparkModel& dm;
  const DsparkHParams& hp;
  Backend& be;
  DsparkOptions o;
  int64_t nb = 1;  // scratch rows: max(block, n_batch)
  WeightView embd, out, cproj, cnorm, onorm, w1, w2;
  std::vector<DsparkLayer> L;
  std::unique_ptr<Buffer> cache_buf, cs_buf, work, sel_buf;
  std::vector<CacheRows> cache;
  float *taps = nullptr, *ctx = nullptr, *x = nullptr, *y = nullptr, *qa = nullptr, *q = nullptr, *kv = nullptr,
        *qcat = nullptr, *z = nullptr, *o_heads = nullptr, *tmp = nullptr, *g = nullptr, *u = nullptr,
        *logits = nullptr, *w1row = nullptr, *bias = nullptr, *cs = nullptr;
  int32_t* sel_n = nullptr;
  std::vector<BatchEntry> blk, blk_attn, one;
  std::vector<float> host_logits, host_bias;

  Impl(const DsparkModel& m, const Model& target, Backend& b, const DsparkOptions& opt)
      : dm(m), hp(m.hparams()), be(b), o(opt) {
    check(o.n_seq >= 1 && o.n_ctx >= 1 && o.n_batch >= 1, "dspark: n_seq, n_ctx and n_batch must be >= 1");
    dm.check_target(target.hparams());
    nb = std::max<int64_t>(hp.block, o.n_batch);
    auto place = [&](WeightView w, bool prepare = true) {
      const uint8_t* host = w.info->data;
      const uint8_t* at = be.place_weight(w.info->name, host, w.info->nbytes);
      if (w.mat.data) w.mat.data = at + (w.mat.data - host);
      if (w.f32) w.f32 = reinterpret_cast<const float*>(at + (reinterpret_cast<const uint8_t*>(w.f32) - host));
      if (prepare && !w.f32) w.mat.packed = be.prepare_weight(w.mat);
      return w;
    };
    embd = place(target.token_embd(), false);  // tables read by rows: no packed copy
    out = place(target.output());
    cproj = place(m.context_proj());
    cnorm = place(m.context_norm());
    onorm = place(m.output_norm());
    w1 = place(m.markov_w1(), false);
    w2 = place(m.markov_w2());
    for (uint32_t il = 0; il < hp.n_layer; ++il) {
      DsparkLayer l = m.layer(il);
      for (WeightView* w : {&l.attn_norm, &l.q_a, &l.q_a_norm, &l.q_b, &l.kv_a, &l.kv_a_norm, &l.attn_out,
                            &l.ffn_norm, &l.ffn_gate, &l.ffn_up, &l.ffn_down})
        *w = place(*w);
      for (WeightView* w : {&l.k_b, &l.v_b}) {  // stacked heads: no packed copy (read per slice)
        const uint8_t* host = w->info->data;
        const uint8_t* at = be.place_weight(w->info->name, host, w->info->nbytes);
        w->mat.data = at + (w->mat.data - host);
      }
      L.push_back(l);
    }

    const int64_t d = hp.n_embd, H = hp.n_head, R = hp.row(), V = hp.n_vocab;
    WorkLimits lim;
    lim.n_tokens = nb;
    lim.n_ctx = o.n_ctx;
    lim.n_heads = H;
    lim.head_io = std::max<int64_t>({hp.n_nope, hp.kv_lora, hp.n_v, hp.n_kq()});
    lim.row = R;
    be.reserve(lim);

    // the latent cache, f32: [layer][seq][pos][R]
    const uint64_t per_layer = uint64_t(o.n_seq) * uint64_t(o.n_ctx) * uint64_t(R);
    cache_buf = be.alloc(per_layer * hp.n_layer * 4, "dspark latent cache");
    for (uint32_t il = 0; il < hp.n_layer; ++il) {
      CacheRows c;
      c.data = cache_buf->as<uint8_t>() + per_layer * il * 4;
      c.f16 = false;
      c.width = R;
      c.n_ctx = o.n_ctx;
      cache.push_back(c);
    }
    const auto table = hp.rope_table(o.n_ctx);
    cs_buf = be.alloc(table.size() * 4, "dspark rope table");
    be.upload(cs_buf->data(), table.data(), table.size() * 4);
    cs = cs_buf->as<float>();

    const int64_t sizes[] = {nb * int64_t(hp.tap_width()), nb * d, nb * d, nb * d, nb * hp.q_lora,
                             nb * H * hp.n_kq(), nb * R, nb * H * R, nb * H * hp.kv_lora, nb * H * hp.n_v,
                             nb * d, nb * hp.n_ff, nb * hp.n_ff, int64_t(hp.block) * V, hp.markov_rank, V};
    float** ptrs[] = {&taps, &ctx, &x, &y, &qa, &q, &kv, &qcat, &z, &o_heads, &tmp, &g, &u, &logits, &w1row, &bias};
    uint64_t total = 0;
    for (int64_t s : sizes) total += (uint64_t(s) + 15) / 16 * 16;
    work = be.alloc(total * 4, "dspark scratch");
    float* p = work->as<float>();
    for (size_t i = 0; i < std::size(sizes); ++i) {
      *ptrs[i] = p;
      p += (sizes[i] + 15) / 16 * 16;
    }
    sel_buf = be.alloc(uint64_t(nb) * 4, "dspark selection");
    sel_n = sel_buf->as<int32_t>();
    be.set_i32(sel_n, nb, -1);  // every visible row
    blk.resize(hp.block);
    blk_attn.resize(hp.block);
    one.resize(1);
    host_logits.resize(size_t(hp.block) * V);
    host_bias.resize(size_t(V));
  }

  // latent rows [RMSNorm(u[0:r]) | RoPE(u[r:])] of n rows of input `in` at positions e[t].pos, stored
  // into layer il's cache (dspark.md §3.1, §3.2 step 3)
  void latent_rows(uint32_t il, const float* in, const BatchEntry* e, int64_t n) {
    const int64_t R = hp.row();
    be.matmul(L[il].kv_a.mat, in, n, kv);
    be.rms_norm_rows(kv, R, L[il].kv_a_norm.f32, kv, R, n, hp.kv_lora, hp.rms_eps);
    be.rope_rows(kv + hp.kv_lora, R, e, n, 1, 0, hp.n_rope, cs);
    be.store_cache_rows(kv, R, e, n, cache[il]);
  }

  void check_entry(const BatchEntry& e, int64_t reach) const {
    check(e.seq_id >= 0 && e.seq_id < o.n_seq, "dspark: sequence {} outside 0..{}", e.seq_id, o.n_seq - 1);
    check(e.pos >= 0 && e.pos + reach <= o.n_ctx, "dspark: position {} (+{}) outside the context of {}", e.pos, reach,
          o.n_ctx);
  }

  void add_context(const BatchEntry* e, int64_t n, const float* host_taps) {
    check(n >= 0 && n <= o.n_batch, "dspark: {} context rows, at most {} per call", n, o.n_batch);
    if (n == 0) return;
    for (int64_t t = 0; t < n; ++t) check_entry(e[t], 1);
    const int64_t d = hp.n_embd;
    be.upload(taps, host_taps, uint64_t(n) * hp.tap_width() * 4);
    be.matmul(cproj.mat, taps, n, ctx);
    be.rms_norm_rows(ctx, d, cnorm.f32, ctx, d, n, d, hp.rms_eps);
    for (uint32_t il = 0; il < hp.n_layer; ++il) latent_rows(il, ctx, e, n);
  }

  void block_logits(int32_t seq, int32_t anchor, int32_t pos, float* base) {
    const int64_t B = hp.block, d = hp.n_embd, H = hp.n_head, V = hp.n_vocab;
    check(anchor >= 0 && uint32_t(anchor) < hp.n_vocab, "dspark: anchor token {} outside the vocabulary", anchor);
    for (int64_t j = 0; j < B; ++j) {
      blk[size_t(j)] = {j == 0 ? anchor : int32_t(hp.mask_token), seq, pos + int32_t(j), false};
      blk_attn[size_t(j)] = {blk[size_t(j)].token, seq, pos + int32_t(B - 1), false};  // non-causal in the block
    }
    check_entry(blk[0], B);
    be.embed_rows(embd.mat, blk.data(), B, x);
    for (uint32_t il = 0; il < hp.n_layer; ++il) {
      const DsparkLayer& l = L[il];
      be.rms_norm_rows(x, d, l.attn_norm.f32, y, d, B, d, hp.rms_eps);
      be.matmul(l.q_a.mat, y, B, qa);
      be.rms_norm_rows(qa, hp.q_lora, l.q_a_norm.f32, qa, hp.q_lora, B, hp.q_lora, hp.rms_eps);
      be.matmul(l.q_b.mat, qa, B, q);
      be.rope_rows(q + hp.n_nope, int64_t(H) * hp.n_kq(), blk.data(), B, H, hp.n_kq(), hp.n_rope, cs);
      latent_rows(il, y, blk.data(), B);
      be.mla_absorb_queries(l.k_b.mat, l.k_b.slice_bytes, q, B, H, hp.n_nope, hp.n_rope, qcat);
      be.mla_attention(cache[il], hp.kv_lora, blk_attn.data(), B, H, qcat, nullptr, sel_n, 0,
                       static_cast<float>(hp.attn_scale()), AttnPath::Sparse, z);
      be.mla_value_heads(l.v_b.mat, l.v_b.slice_bytes, z, B, H, o_heads);
      be.matmul(l.attn_out.mat, o_heads, B, tmp);
      be.add(x, tmp, B * d);
      be.rms_norm_rows(x, d, l.ffn_norm.f32, y, d, B, d, hp.rms_eps);
      be.matmul(l.ffn_gate.mat, y, B, g);
      be.matmul(l.ffn_up.mat, y, B, u);
      be.silu_mul_rows(g, u, B, hp.n_ff);
      be.matmul(l.ffn_down.mat, g, B, tmp);
      be.add(x, tmp, B * d);
    }
    be.rms_norm_rows(x, d, onorm.f32, y, d, B, d, hp.rms_eps);
    be.matmul(out.mat, y, B, logits);
    be.download(base, logits, uint64_t(B) * V * 4);
  }

  void markov_bias(int32_t prev, float* host) {
    check(prev >= 0 && uint32_t(prev) < hp.n_vocab, "dspark: token {} outside the vocabulary", prev);
    one[0] = {prev, 0, 0, false};
    be.embed_rows(w1.mat, one.data(), 1, w1row);
    be.matmul(w2.mat, w1row, 1, bias);
    be.download(host, bias, uint64_t(hp.n_vocab) * 4);
  }

  int draft_greedy(int32_t seq, int32_t anchor, int32_t pos, int n_max, int32_t* outp) {
    const int n = std::min<int>(n_max, int(hp.block));
    if (n <= 0) return 0;
    block_logits(seq, anchor, pos, host_logits.data());
    const int64_t V = hp.n_vocab;
    int32_t prev = anchor;
    for (int j = 0; j < n; ++j) {
      markov_bias(prev, host_bias.data());
      const float* z0 = host_logits.data() + int64_t(j) * V;
      int32_t best = 0;
      float bv = -std::numeric_limits<float>::infinity();
      for (int64_t v = 0; v < V; ++v) {
        const float s = z0[v] + host_bias[size_t(v)];
        if (s > bv) bv = s, best = int32_t(v);
      }
      outp[j] = best;
      prev = best;
    }
    return n;
  }
};

DsparkDraft::DsparkDraft(const DsparkModel& dm, const Model& target, Backend& be, const DsparkOptions& o)
    : p_(std::make_unique<Impl>(dm, target, be, o)), hp_(dm.hparams()) {}
DsparkDraft::~DsparkDraft() = default;
void DsparkDraft::add_context(const BatchEntry* e, int64_t n, const float* taps) { p_->add_context(e, n, taps); }
void DsparkDraft::block_logits(int32_t seq, int32_t anchor, int32_t pos, float* base) {
  p_->block_logits(seq, anchor, pos, base);
}
void DsparkDraft::markov_bias(int32_t prev, float* bias) { p_->markov_bias(prev, bias); }
int DsparkDraft::draft_greedy(int32_t seq, int32_t anchor, int32_t pos, int n_max, int32_t* out) {
  return p_->draft_greedy(seq, anchor, pos, n_max, out);
}

}  // namespace kimi
