#include "convert/synth.h"

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <numeric>

#include "convert/bpe_train.h"
#include "convert/synth_corpus.h"
#include "tensor/types.h"
#include "util/error.h"
#include "util/progress.h"
#include "util/tempfile.h"
#include "util/thread_pool.h"

namespace fs = std::filesystem;

namespace kimi::synth {

// ------------------------------------------------------------------------------------------------
// presets

bool Config::is_mla(int64_t layer0) const {
  return std::find(full_attn_layers.begin(), full_attn_layers.end(), layer0 + 1) != full_attn_layers.end();
}

const std::vector<std::string>& preset_names() {
  static const std::vector<std::string> names = {"tiny", "small", "k3-layers"};
  return names;
}

Config preset(const std::string& name) {
  Config c;
  c.preset = name;
  if (name == "tiny") {
    c.hidden = 64, c.layers = 8, c.full_attn_layers = {4, 8}, c.heads = 4, c.kda_head_dim = 16;
    c.q_lora = 32, c.kv_lora = 32, c.nope = 16, c.rope = 8, c.v_dim = 16, c.dense_width = 128;
    c.experts = 8, c.top_k = 2, c.moe_inter = 32, c.latent = 32, c.res_block = 3;
    c.index_heads = 4, c.index_dim = 16, c.index_topk = 16, c.vocab = 1024;
    c.routed_scaling = 2.5, c.max_pos = 4096;
    c.vt_width = 32, c.vt_qkv = 32, c.vt_heads = 2, c.vt_ff = 64, c.vt_blocks = 2, c.vt_grid = 8;
  } else if (name == "small") {
    c.hidden = 2048, c.layers = 8, c.full_attn_layers = {4, 8}, c.heads = 16, c.kda_head_dim = 128;
    c.q_lora = 512, c.kv_lora = 512, c.nope = 128, c.rope = 64, c.v_dim = 128, c.dense_width = 8192;
    c.experts = 64, c.top_k = 8, c.moe_inter = 768, c.latent = 1024, c.res_block = 4;
    c.index_heads = 32, c.index_dim = 128, c.index_topk = 2048, c.vocab = 32768;
    c.vt_width = 256, c.vt_qkv = 384, c.vt_heads = 3, c.vt_ff = 1024, c.vt_blocks = 4, c.vt_grid = 64;
  } else if (name == "k3-layers") {
    c.hidden = 7168, c.layers = 4, c.full_attn_layers = {4}, c.heads = 96, c.kda_head_dim = 128;
    c.q_lora = 1536, c.kv_lora = 512, c.nope = 128, c.rope = 64, c.v_dim = 128, c.dense_width = 33792;
    c.experts = 64, c.top_k = 16, c.moe_inter = 3072, c.latent = 3584, c.res_block = 12;
    c.index_heads = 64, c.index_dim = 128, c.index_topk = 2048, c.vocab = 32768;
    c.vt_width = 1024, c.vt_qkv = 1536, c.vt_heads = 12, c.vt_ff = 4096, c.vt_blocks = 27, c.vt_grid = 64;
  } else {
    fail("unknown synth preset '{}' (expected tiny, small or k3-layers)", name);
  }
  return c;
}

void set_layers(Config& c, int64_t n) {
  check(n >= 1 && n <= 1024, "--layers {}: expected 1..1024", n);
  c.layers = n;
  std::erase_if(c.full_attn_layers, [&](int64_t l) { return l > n; });
}

void set_experts(Config& c, int64_t n) {
  check(n >= 1 && n <= 4096, "--experts {}: expected 1..4096", n);
  c.experts = n;
  c.top_k = std::min(c.top_k, n);
}

// ------------------------------------------------------------------------------------------------
// deterministic values: element i of a tensor is a pure function of (seed, name, i)

namespace {

uint64_t mix64(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

uint64_t name_key(uint64_t seed, const std::string& name) {
  uint64_t h = 0xcbf29ce484222325ull;  // FNV-1a
  for (unsigned char ch : name) h = (h ^ ch) * 0x100000001b3ull;
  return mix64(h ^ mix64(seed + 0x5EED5EED5EEDull));
}

inline uint64_t elem_hash(uint64_t key, uint64_t i) { return mix64(key + (i + 1) * 0x9E3779B97F4A7C15ull); }

// approximately N(0, 1): Irwin-Hall sum of four 16-bit uniforms, rescaled (range +-3.46)
inline float normal(uint64_t key, uint64_t i) {
  uint64_t h = elem_hash(key, i);
  float s = float(h & 0xffff) + float((h >> 16) & 0xffff) + float((h >> 32) & 0xffff) + float(h >> 48);
  return (s * (1.0f / 65536.0f) + 2.0f / 65536.0f - 2.0f) * 1.7320508f;
}
inline float uniform01(uint64_t key, uint64_t i) { return float(elem_hash(key, i) >> 40) * 0x1.0p-24f; }

enum class Init {
  Normal,        // a * N(0,1)
  NormWeight,    // 1 + a * N(0,1)
  Uniform,       // U(a, b)
  BiasSpread,    // spread-out router bias: gap a between consecutive (permuted) experts
  BiasZipf,      // router bias for Zipf popularity of exponent a, top-b experts per token (Config::router_zipf)
  CenteredRows,  // a * N(0,1) with every column centred over the rows (weights sum to ~0)
  Correlated,    // a * (sqrt(1 - b^2) * shared base + b * own), base keyed by `base`
  ConvTaps,      // depthwise conv [C, 1, K]: last tap (current token) 1 + a * N(0,1), others a * N(0,1)
};

struct Item {
  TensorInfo t;              // stored tensor (for an MXFP4 expert: the weight_packed tensor)
  Init init = Init::Normal;
  float a = 0, b = 0;
  std::string value_name;    // name whose values are generated (differs for MXFP4 experts)
  std::string base;          // Correlated: name of the shared base
  bool mxfp4 = false;
  TensorInfo scale;          // MXFP4: the weight_scale tensor (written right after t)
  int64_t rows = 0, cols = 0;  // logical matrix (MXFP4) / numel (cols) for others
  int64_t group = 0;         // shard group
  std::vector<int64_t> outliers;  // NormWeight: channels multiplied by outlier_scale (ascending)
  float outlier_scale = 1.0f;
};

int64_t numel(const std::vector<int64_t>& s) {
  int64_t n = 1;
  for (auto d : s) n *= d;
  return n;
}

constexpr const char* kP = "language_model.";
constexpr int64_t kVisionPatch = 14;  // docs/spec/vision.md §1.1

struct Planner {
  const Config& c;
  std::vector<Item> items;
  int64_t group = 0;

  void add(std::string name, st::Dtype dt, std::vector<int64_t> shape, Init init, float a, float b = 0) {
    Item it;
    it.t = {name, dt, std::move(shape)};
    it.init = init, it.a = a, it.b = b;
    it.value_name = std::move(name);
    it.cols = numel(it.t.shape);
    it.rows = 1;
    it.group = group;
    items.push_back(std::move(it));
  }
  // BF16 matrix [out, in] with std gain/sqrt(in)
  void mat(const std::string& name, int64_t out, int64_t in, float gain = 1.0f) {
    add(name, st::Dtype::BF16, {out, in}, Init::Normal, gain / std::sqrt(float(in)));
  }
  // BF16 matrix [out, in] = (0.8 * base + 0.6 * own) / sqrt(in) (correlation 0.64), base keyed by base_name
  void correlated(const std::string& name, const std::string& base_name, int64_t out, int64_t in) {
    add(name, st::Dtype::BF16, {out, in}, Init::Correlated, 1.0f / std::sqrt(float(in)), 0.6f);
    items.back().base = base_name;
  }
  void normw(const std::string& name, int64_t n, st::Dtype dt = st::Dtype::BF16) {
    add(name, dt, {n}, Init::NormWeight, 0.1f);
  }
  // a norm whose output feeds weight matrices: outlier channels when configured
  void normw_outliers(const std::string& name, int64_t n) {
    normw(name, n);
    items.back().outliers = outlier_channel_indices(c, n);
    items.back().outlier_scale = c.outlier_scale;
  }
  void expert(const std::string& pre, int64_t e, const char* w, int64_t out, int64_t in) {
    std::string logical = fmt::format("{}experts.{}.{}.weight", pre, e, w);
    Item it;
    it.init = Init::Correlated;
    // experts are strongly correlated (shared base, small own part: correlation ~0.91), so an
    // expert choice flipped by rounding changes the output only a little
    it.a = 1.0f / std::sqrt(float(in));
    it.b = 0.3f;
    it.value_name = logical;
    it.base = fmt::format("{}experts.shared_base.{}", pre, w);
    it.rows = out, it.cols = in;
    it.group = group;
    if (c.mxfp4_experts) {
      it.mxfp4 = true;
      it.t = {fmt::format("{}experts.{}.{}.weight_packed", pre, e, w), st::Dtype::U8, {out, in / 2}};
      it.scale = {fmt::format("{}experts.{}.{}.weight_scale", pre, e, w), st::Dtype::U8, {out, in / 32}};
    } else {
      it.t = {logical, st::Dtype::BF16, {out, in}};
    }
    items.push_back(std::move(it));
  }

  void layer(int64_t L) {
    const int64_t d = c.hidden, H = c.heads, hd = c.kda_head_dim, C = H * hd;
    const float inv_sqrt_d = 1.0f / std::sqrt(float(d));
    std::string p = fmt::format("{}model.layers.{}.", kP, L);
    normw_outliers(p + "input_layernorm.weight", d);
    normw_outliers(p + "post_attention_layernorm.weight", d);
    normw(p + "self_attention_res_norm.weight", d);
    add(p + "self_attention_res_proj.weight", st::Dtype::BF16, {1, d}, Init::Normal, inv_sqrt_d);
    normw(p + "mlp_res_norm.weight", d);
    add(p + "mlp_res_proj.weight", st::Dtype::BF16, {1, d}, Init::Normal, inv_sqrt_d);
    std::string a = p + "self_attn.";
    if (!c.is_mla(L)) {  // KDA
      // q and k share a base (q.k of a token with itself is clearly positive) and v is large, so
      // the per-head read-out o = S q / sqrt(D) stays far above the RMSNorm epsilon: otherwise
      // the o_norm output would amplify rounding noise
      correlated(a + "q_proj.weight", a + "qk_shared_base", C, d);
      correlated(a + "k_proj.weight", a + "qk_shared_base", C, d);
      mat(a + "v_proj.weight", C, d, 3.0f);
      for (const char* x : {"q", "k", "v"})
        add(a + x + "_conv1d.weight", st::Dtype::F32, {C, 1, c.conv_kernel()}, Init::ConvTaps, 0.3f);
      mat(a + "f_a_proj.weight", hd, d);
      mat(a + "f_b_proj.weight", C, hd);
      // exp(A_log) in 0.5..2
      add(a + "A_log", st::Dtype::F32, {c.a_log_len()}, Init::Uniform, std::log(0.5f), std::log(2.0f));
      add(a + "dt_bias", st::Dtype::F32, {C}, Init::Normal, 0.5f);
      mat(a + "b_proj.weight", H, d);
      mat(a + "g_proj.weight", C, d);
      normw(a + "o_norm.weight", hd, st::Dtype::F32);
      mat(a + "o_proj.weight", d, C);
    } else {  // MLA (+ DSA indexer)
      mat(a + "q_a_proj.weight", c.q_lora, d);
      normw_outliers(a + "q_a_layernorm.weight", c.q_lora);
      mat(a + "q_b_proj.weight", H * (c.nope + c.rope), c.q_lora);
      mat(a + "kv_a_proj_with_mqa.weight", c.kv_lora + c.rope, d);
      normw_outliers(a + "kv_a_layernorm.weight", c.kv_lora);
      mat(a + "kv_b_proj.weight", H * (c.nope + c.v_dim), c.kv_lora);
      mat(a + "g_proj.weight", H * c.v_dim, d);
      mat(a + "o_proj.weight", d, H * c.v_dim);
      if (c.indexer) {
        std::string ix = a + "indexer.";
        mat(ix + "wq_b.weight", c.index_heads * c.index_dim, c.q_lora);
        mat(ix + "wk.weight", c.index_dim, d);
        normw(ix + "k_norm.weight", c.index_dim);
        add(ix + "k_norm.bias", st::Dtype::BF16, {c.index_dim}, Init::Normal, 0.1f);
        // per-head weights that sum to ~0 over the heads: for every query some heads weigh
        // positively, so the top scores are distinct positive values, not ReLU-zero ties
        add(ix + "weights_proj.weight", st::Dtype::BF16, {c.index_heads, d}, Init::CenteredRows,
            2.0f * inv_sqrt_d);
      }
    }
    if (L < 1) {  // first_k_dense_replace = 1
      std::string m = p + "mlp.";
      mat(m + "gate_proj.weight", c.dense_width, d);
      mat(m + "up_proj.weight", c.dense_width, d);
      mat(m + "down_proj.weight", d, c.dense_width);
    } else {
      std::string m = p + "block_sparse_moe.";
      const int64_t sw = c.shared_experts * c.moe_inter;
      mat(m + "gate.weight", c.experts, d);
      if (c.router_zipf >= 0)
        add(m + "gate.e_score_correction_bias", st::Dtype::F32, {c.experts}, Init::BiasZipf, float(c.router_zipf),
            float(c.top_k));
      else
        add(m + "gate.e_score_correction_bias", st::Dtype::F32, {c.experts}, Init::BiasSpread, 0.1f);
      mat(m + "routed_expert_down_proj.weight", c.latent, d);
      normw_outliers(m + "routed_expert_norm.weight", c.latent);
      mat(m + "routed_expert_up_proj.weight", d, c.latent);
      mat(m + "shared_experts.gate_proj.weight", sw, d);
      mat(m + "shared_experts.up_proj.weight", sw, d);
      mat(m + "shared_experts.down_proj.weight", d, sw);
      for (int64_t e = 0; e < c.experts; ++e) {
        expert(m, e, "w1", c.moe_inter, c.latent);
        expert(m, e, "w2", c.latent, c.moe_inter);
        expert(m, e, "w3", c.moe_inter, c.latent);
      }
    }
  }

  // The MoonViT3D tower and the patchmergerv2 projector, HF names and shapes (docs/spec/vision.md §2.1).
  void vision() {
    const int64_t W = c.vt_width, Q = c.vt_qkv, F = c.vt_ff, P = kVisionPatch;
    group = c.layers / 4 + 1;  // a shard of its own after the text layers
    const std::string t = "vision_tower.";
    add(t + "patch_embed.proj.weight", st::Dtype::BF16, {W, 3, P, P}, Init::Normal, 1.0f / std::sqrt(float(3 * P * P)));
    add(t + "patch_embed.pos_emb.weight", st::Dtype::BF16, {c.vt_grid, c.vt_grid, W}, Init::Normal, 0.5f);
    for (int64_t b = 0; b < c.vt_blocks; ++b) {
      const std::string p = t + "encoder.blocks." + std::to_string(b) + ".";
      normw(p + "norm0.weight", W);
      mat(p + "wqkv.weight", 3 * Q, W);
      mat(p + "wo.weight", W, Q, 0.5f);
      normw(p + "norm1.weight", W);
      mat(p + "mlp.fc0.weight", F, W);
      mat(p + "mlp.fc1.weight", W, F, 0.5f);
    }
    normw(t + "encoder.final_layernorm.weight", W);
    mat("mm_projector.proj.0.weight", 4 * W, 4 * W);
    mat("mm_projector.proj.2.weight", c.hidden, 4 * W);
    normw("mm_projector.post_norm.weight", c.hidden);
  }

  void build() {
    const int64_t d = c.hidden;
    group = 0;
    add(std::string(kP) + "model.embed_tokens.weight", st::Dtype::BF16, {c.vocab, d}, Init::Normal, 1.0f);
    for (int64_t L = 0; L < c.layers; ++L) {
      group = L / 4;
      layer(L);
    }
    std::string m = std::string(kP) + "model.";
    normw_outliers(m + "norm.weight", d);
    normw(m + "output_attn_res_norm.weight", d);
    add(m + "output_attn_res_proj.weight", st::Dtype::BF16, {1, d}, Init::Normal, 1.0f / std::sqrt(float(d)));
    // logits std ~2 over the vocabulary
    mat(std::string(kP) + "lm_head.weight", c.vocab, d, 2.0f);
    if (c.vision) vision();
  }
};

std::vector<Item> plan(const Config& c) {
  check(c.hidden > 0 && c.layers > 0 && c.heads > 0 && c.vocab >= 512, "synth: incomplete configuration");
  check(c.latent % 32 == 0 && c.moe_inter % 32 == 0,
        "synth: MXFP4 experts need latent ({}) and moe_intermediate ({}) to be multiples of 32", c.latent,
        c.moe_inter);
  Planner p{c, {}, 0};
  p.build();
  return std::move(p.items);
}

// Values [i0, i1) of an element-wise item (everything except BiasSpread / CenteredRows).
void fill_range(const Item& it, uint64_t key, uint64_t base_key, int64_t i0, int64_t i1, float* out) {
  switch (it.init) {
    case Init::Normal:
      for (int64_t i = i0; i < i1; ++i) out[i - i0] = it.a * normal(key, i);
      break;
    case Init::NormWeight:
      for (int64_t i = i0; i < i1; ++i) out[i - i0] = 1.0f + it.a * normal(key, i);
      for (int64_t ch : it.outliers)
        if (ch >= i0 && ch < i1) out[ch - i0] *= it.outlier_scale;
      break;
    case Init::Uniform:
      for (int64_t i = i0; i < i1; ++i) out[i - i0] = it.a + (it.b - it.a) * uniform01(key, i);
      break;
    case Init::Correlated: {
      const float wb = std::sqrt(1.0f - it.b * it.b);
      for (int64_t i = i0; i < i1; ++i) out[i - i0] = it.a * (wb * normal(base_key, i) + it.b * normal(key, i));
      break;
    }
    case Init::ConvTaps: {
      const int64_t k = it.t.shape.back();
      for (int64_t i = i0; i < i1; ++i) out[i - i0] = (i % k == k - 1 ? 1.0f : 0.0f) + it.a * normal(key, i);
      break;
    }
    default:
      fail("synth: internal error: {} is not element-wise", it.value_name);
  }
}

bool elementwise(const Item& it) {
  return it.init != Init::BiasSpread && it.init != Init::BiasZipf && it.init != Init::CenteredRows;
}

// experts in a random order keyed by the tensor (position r = popularity rank r + 1)
std::vector<int64_t> hash_order(uint64_t key, int64_t n) {
  std::vector<int64_t> order(static_cast<size_t>(n));
  std::iota(order.begin(), order.end(), 0);
  std::sort(order.begin(), order.end(), [&](int64_t x, int64_t y) {
    uint64_t hx = elem_hash(key, x), hy = elem_hash(key, y);
    return hx != hy ? hx < hy : x < y;
  });
  return order;
}

// Config::router_zipf: the share of tokens picking each expert (by id): p_r = min(1, c / r^s) for the expert of
// rank r (1-based) in the order keyed by `key`, with c found by bisection so that the shares sum to k.
std::vector<double> zipf_share(uint64_t key, int64_t n, int64_t k, double s) {
  const std::vector<int64_t> order = hash_order(key, n);
  std::vector<double> w(static_cast<size_t>(n));
  for (int64_t r = 0; r < n; ++r) w[size_t(r)] = std::pow(double(r + 1), -s);
  auto total = [&](double c) {
    double t = 0;
    for (double x : w) t += std::min(1.0, c * x);
    return t;
  };
  double lo = 0, hi = 1;
  while (total(hi) < double(k) && hi < 1e300) hi *= 2;
  for (int it = 0; it < 200; ++it) {
    const double mid = 0.5 * (lo + hi);
    (total(mid) < double(k) ? lo : hi) = mid;
  }
  std::vector<double> p(static_cast<size_t>(n));
  for (int64_t r = 0; r < n; ++r) p[size_t(order[size_t(r)])] = std::min(1.0, hi * w[size_t(r)]);
  return p;
}

// z with P(N(0,1) > z) = p, 0 < p < 1 (bisection on erfc: exact to double rounding, deterministic)
double normal_upper_quantile(double p) {
  double lo = -40, hi = 40;
  for (int it = 0; it < 200; ++it) {
    const double mid = 0.5 * (lo + hi);
    (0.5 * std::erfc(mid / std::sqrt(2.0)) > p ? lo : hi) = mid;
  }
  return 0.5 * (lo + hi);
}

std::vector<float> whole_values(const Item& it, uint64_t seed) {
  const uint64_t key = name_key(seed, it.value_name);
  const int64_t n = it.rows * it.cols;
  std::vector<float> v(static_cast<size_t>(n));
  if (it.init == Init::BiasZipf) {
    // expert e is picked when sigmoid(l) + b_e is among the top k of its token; with l ~ N(0, 1) independent
    // over the experts and many experts, the k-th score stays near a threshold, here 0: b_e = -sigmoid(z_e)
    // with P(l > z_e) = p_e picks e with probability p_e; an expert every token picks (p_e = 1) gets +1,
    // above every other score (mean-field calibration: the measured shares are in docs/performance.md)
    const std::vector<double> p = zipf_share(key, n, int64_t(it.b), double(it.a));
    for (int64_t e = 0; e < n; ++e) {
      const double pe = p[size_t(e)];
      v[size_t(e)] = pe >= 1.0 - 1e-12 ? 1.0f : float(-1.0 / (1.0 + std::exp(-normal_upper_quantile(pe))));
    }
  } else if (it.init == Init::BiasSpread) {
    // a random permutation of evenly spaced values (gap a) plus a little jitter
    const std::vector<int64_t> order = hash_order(key, n);
    for (int64_t r = 0; r < n; ++r) {
      int64_t e = order[r];
      v[e] = it.a * (float(r) - 0.5f * float(n - 1)) + 0.1f * it.a * (uniform01(key ^ 0xB1A5ull, e) - 0.5f);
    }
  } else if (it.init == Init::CenteredRows) {
    const int64_t rows = it.t.shape[0], cols = it.t.shape[1];
    for (int64_t i = 0; i < n; ++i) v[i] = normal(key, i);
    const float corr = rows > 1 ? std::sqrt(float(rows) / float(rows - 1)) : 1.0f;
    for (int64_t j = 0; j < cols; ++j) {
      double mean = 0;
      for (int64_t r = 0; r < rows; ++r) mean += v[r * cols + j];
      mean /= double(rows);
      for (int64_t r = 0; r < rows; ++r) v[r * cols + j] = it.a * corr * (v[r * cols + j] - float(rows > 1 ? mean : 0.0));
    }
  } else {
    const uint64_t bkey = it.base.empty() ? 0 : name_key(seed, it.base);
    fill_range(it, key, bkey, 0, n, v.data());
  }
  return v;
}

inline uint8_t e2m1_code(float y) {  // y already divided by the scale; nearest, ties away from 0
  const float m = std::fabs(y);
  // count of decision thresholds (midpoints between the E2M1 magnitudes) at or below m
  const int c = int(m >= 0.25f) + int(m >= 0.75f) + int(m >= 1.25f) + int(m >= 1.75f) + int(m >= 2.5f) +
                int(m >= 3.5f) + int(m >= 5.0f);
  return static_cast<uint8_t>(c | ((y < 0 && c != 0) ? 8 : 0));
}

}  // namespace

void mxfp4_quantize_row(const float* x, int64_t n, uint8_t* packed, uint8_t* scales) {
  check(n % 32 == 0, "mxfp4: row length {} is not a multiple of 32", n);
  for (int64_t g = 0; g < n / 32; ++g) {
    const float* b = x + g * 32;
    float amax = 0;
    for (int k = 0; k < 32; ++k) amax = std::max(amax, std::fabs(b[k]));
    // smallest exponent k with 6 * 2^k >= amax (no clipping); E8M0 byte = k + 127
    int k = -127;
    if (amax > 0) {
      k = static_cast<int>(std::ceil(std::log2(amax / 6.0f)));
      while (6.0f * std::ldexp(1.0f, k) < amax) ++k;
      while (k > -127 && 6.0f * std::ldexp(1.0f, k - 1) >= amax) --k;
    }
    k = std::clamp(k, -127, 127);
    scales[g] = static_cast<uint8_t>(k + 127);
    const float inv = std::ldexp(1.0f, -k);
    uint8_t codes[32];
    for (int i = 0; i < 32; ++i) codes[i] = e2m1_code(b[i] * inv);
    for (int i = 0; i < 16; ++i) packed[g * 16 + i] = static_cast<uint8_t>(codes[2 * i] | (codes[2 * i + 1] << 4));
  }
}

void set_outlier_channels(Config& c, const std::string& spec) {
  const size_t colon = spec.find(':');
  const std::string ns = spec.substr(0, colon);
  const std::string ss = colon == std::string::npos ? std::string() : spec.substr(colon + 1);
  auto bad = [&]() {
    fail("--outlier-channels '{}': expected N or N:SCALE (N a whole number >= 1, SCALE a number > 0, e.g. 8:30)",
         spec);
  };
  if (ns.empty() || ns.find_first_not_of("0123456789") != std::string::npos || ns.size() > 9) bad();
  const int64_t n = std::stoll(ns);
  if (n < 1) bad();
  float scale = 20.0f;
  if (colon != std::string::npos) {
    size_t used = 0;
    try {
      scale = std::stof(ss, &used);
    } catch (const std::exception&) {
      bad();
    }
    if (used != ss.size() || !std::isfinite(scale) || !(scale > 0)) bad();
  }
  check(n <= c.kv_lora && n <= c.latent && n <= c.hidden && n <= c.q_lora,
        "--outlier-channels {}: more channels than the narrowest norm it applies to has ({})", n,
        std::min({c.kv_lora, c.latent, c.hidden, c.q_lora}));
  c.outlier_channels = n;
  c.outlier_scale = scale;
}

std::vector<int64_t> outlier_channel_indices(const Config& c, int64_t n) {
  if (c.outlier_channels <= 0) return {};
  // the first k of a permutation of [0, n) by hash: depends on the seed and the width only
  const uint64_t key = name_key(c.seed, fmt::format("outlier_channels.{}", n));
  std::vector<int64_t> order(static_cast<size_t>(n));
  std::iota(order.begin(), order.end(), 0);
  std::sort(order.begin(), order.end(), [&](int64_t x, int64_t y) {
    const uint64_t hx = elem_hash(key, x), hy = elem_hash(key, y);
    return hx != hy ? hx < hy : x < y;
  });
  order.resize(static_cast<size_t>(std::min(c.outlier_channels, n)));
  std::sort(order.begin(), order.end());
  return order;
}

void set_experts_used(Config& c, int64_t n) {
  check(n >= 1 && n <= c.experts, "--experts-used {}: expected 1..{} (the number of routed experts)", n, c.experts);
  c.top_k = n;
}

void set_router(Config& c, const std::string& spec) {
  if (spec == "spread") {
    c.router_zipf = -1;
    return;
  }
  auto bad = [&]() {
    fail("--router '{}': expected spread, zipf or zipf:S (S a number from 0 to 4, e.g. zipf:1.2)", spec);
  };
  if (spec.rfind("zipf", 0) != 0) bad();
  double s = 1.0;
  if (spec.size() > 4) {
    if (spec[4] != ':' || spec.size() == 5) bad();
    const std::string num = spec.substr(5);
    size_t used = 0;
    try {
      s = std::stod(num, &used);
    } catch (const std::exception&) {
      bad();
    }
    if (used != num.size() || !std::isfinite(s) || s < 0 || s > 4) bad();
  }
  c.router_zipf = s;
}

std::vector<double> router_pick_share(const Config& c, int64_t layer0) {
  if (c.router_zipf < 0 || layer0 < 1 || layer0 >= c.layers) return {};
  const std::string name = fmt::format("{}model.layers.{}.block_sparse_moe.gate.e_score_correction_bias", kP, layer0);
  return zipf_share(name_key(c.seed, name), c.experts, c.top_k, c.router_zipf);
}

std::vector<TensorInfo> tensor_list(const Config& c) {
  std::vector<TensorInfo> out;
  for (auto& it : plan(c)) {
    out.push_back(it.t);
    if (it.mxfp4) out.push_back(it.scale);
  }
  return out;
}

std::vector<float> tensor_values(const Config& c, const std::string& name) {
  for (auto& it : plan(c))
    if (it.value_name == name || (!it.mxfp4 && it.t.name == name)) return whole_values(it, c.seed);
  fail("synth: no floating-point tensor '{}' in preset '{}' (for MXFP4 experts ask for the logical "
       "'...experts.E.wK.weight')",
       name, c.preset);
}

// ------------------------------------------------------------------------------------------------
// config.json, tokenizer files

std::string special_token(int64_t vocab, int64_t id) {
  const int64_t off = id - (vocab - 256);
  check(off >= 0 && off < 256, "special_token: id {} is not one of the top 256 ids of vocab {}", id, vocab);
  switch (off) {
    case 0: return "[BOS]";
    case 1: return "[EOS]";
    case 2: return "<|end_of_msg|>";
    case 3: return "<|open|>";
    case 4: return "<|close|>";
    case 5: return "<|sep|>";
    case 6: return "[start_header_id]";
    case 7: return "[end_header_id]";
    case 9: return "[EOT]";
    case 18: return "<|media_begin|>";
    case 19: return "<|media_content|>";
    case 20: return "<|media_end|>";
    case 21: return "<|media_pad|>";
    case 254: return "[UNK]";
    case 255: return "[PAD]";
    default: return fmt::format("<|reserved_token_{}|>", id);
  }
}

nlohmann::ordered_json config_json(const Config& c) {
  using J = nlohmann::ordered_json;
  const int64_t sp = c.vocab - 256;
  J lin;
  std::vector<int64_t> kda;
  for (int64_t l = 1; l <= c.layers; ++l)
    if (!c.is_mla(l - 1)) kda.push_back(l);
  lin["full_attn_layers"] = c.full_attn_layers;
  lin["kda_layers"] = kda;
  lin["head_dim"] = c.kda_head_dim;
  lin["num_heads"] = c.heads;
  lin["short_conv_kernel_size"] = c.conv_kernel();
  lin["gate_lower_bound"] = -5.0;
  lin["use_full_rank_gate"] = true;

  J t;
  t["architectures"] = J::array({"KimiLinearForCausalLM"});
  t["model_type"] = "kimi_linear";
  t["torch_dtype"] = "bfloat16";
  t["vocab_size"] = c.vocab;
  t["hidden_size"] = c.hidden;
  t["num_hidden_layers"] = c.layers;
  t["num_attention_heads"] = c.heads;
  t["num_key_value_heads"] = c.heads;
  t["intermediate_size"] = c.dense_width;
  t["max_position_embeddings"] = c.max_pos;
  t["rms_norm_eps"] = 1e-5;
  t["hidden_act"] = "situ";
  t["activation_situ_beta"] = 4.0;
  t["activation_situ_linear_beta"] = 25.0;
  t["attn_res_block_size"] = c.res_block;
  t["q_lora_rank"] = c.q_lora;
  t["kv_lora_rank"] = c.kv_lora;
  t["qk_nope_head_dim"] = c.nope;
  t["qk_rope_head_dim"] = c.rope;
  t["v_head_dim"] = c.v_dim;
  t["mla_use_nope"] = true;
  t["mla_use_output_gate"] = true;
  t["num_experts"] = c.experts;
  t["num_experts_per_token"] = c.top_k;
  t["num_shared_experts"] = c.shared_experts;
  t["moe_intermediate_size"] = c.moe_inter;
  t["routed_expert_hidden_size"] = c.latent;
  t["latent_moe_use_norm"] = true;
  t["first_k_dense_replace"] = 1;
  t["moe_layer_freq"] = 1;
  t["routed_scaling_factor"] = c.routed_scaling;
  t["moe_renormalize"] = true;
  t["moe_router_activation_func"] = "sigmoid";
  t["use_grouped_topk"] = true;
  t["topk_method"] = "noaux_tc";
  t["num_expert_group"] = 1;
  t["topk_group"] = 1;
  t["tie_word_embeddings"] = false;
  t["num_nextn_predict_layers"] = 0;
  t["linear_attn_config"] = lin;
  if (c.indexer) {
    t["index_n_heads"] = c.index_heads;
    t["index_head_dim"] = c.index_dim;
    t["index_topk"] = c.index_topk;
  }
  t["bos_token_id"] = sp;
  t["eos_token_id"] = sp + 2;
  t["pad_token_id"] = c.vocab - 1;

  // docs/spec/vision.md §1.1: K3's keys, the widths scaled per preset (§1.3)
  J vision;
  vision["model_type"] = "moonvit3d";
  vision["activation_func"] = "gelu_pytorch_tanh";
  vision["attn_bias"] = false;
  vision["init_pos_emb_height"] = c.vt_grid;
  vision["init_pos_emb_time"] = 4;
  vision["init_pos_emb_width"] = c.vt_grid;
  vision["linear_bias"] = false;
  vision["merge_kernel_size"] = J::array({2, 2});
  vision["merge_type"] = "sd2_tpool";
  vision["mlp_type"] = "mlp2";
  vision["mm_hidden_size"] = c.vt_width;
  vision["mm_projector_type"] = "patchmergerv2";
  vision["norm_type"] = "rmsnorm";
  vision["patch_embed_proj_bias"] = false;
  vision["patch_size"] = kVisionPatch;
  vision["pos_emb_interpolation_mode"] = "bilinear";
  vision["pos_emb_type"] = "divided_fixed";
  vision["projector_hidden_act"] = "gelu";
  vision["projector_ln_eps"] = 1e-5;
  vision["qkv_hidden_size"] = c.vt_qkv;
  vision["text_hidden_size"] = c.hidden;
  vision["vt_hidden_size"] = c.vt_width;
  vision["vt_intermediate_size"] = c.vt_ff;
  vision["vt_num_attention_heads"] = c.vt_heads;
  vision["vt_num_hidden_layers"] = c.vt_blocks;

  J root;
  root["architectures"] = J::array({"KimiK3ForConditionalGeneration"});
  root["model_type"] = "kimi_k3";
  root["torch_dtype"] = "bfloat16";
  root["media_placeholder_token_id"] = sp + 21;
  if (c.vision) root["vision_config"] = vision;
  root["text_config"] = t;
  if (c.mxfp4_experts) {
    J w;
    w["num_bits"] = 4;
    w["type"] = "float";
    w["symmetric"] = true;
    w["group_size"] = 32;
    w["strategy"] = "group";
    w["dynamic"] = false;
    w["actorder"] = nullptr;
    w["observer"] = "minmax";
    w["scale_dtype"] = "uint8";
    J g;
    g["targets"] = J::array({"Linear"});
    g["weights"] = w;
    g["input_activations"] = nullptr;
    g["output_activations"] = nullptr;
    g["format"] = "mxfp4-pack-quantized";
    J q;
    q["quant_method"] = "compressed-tensors";
    q["format"] = "mxfp4-pack-quantized";
    q["quantization_status"] = "compressed";
    q["config_groups"] = J{{"group_0", g}};
    q["ignore"] = J::array({"lm_head", "re:.*self_attn.*", "re:.*shared_experts.*", "re:.*mlp\\..*",
                            "re:.*routed_expert_(down|up)_proj$", "re:.*block_sparse_moe\\.gate$",
                            "re:vision_tower.*", "re:mm_projector.*"});
    q["kv_cache_scheme"] = nullptr;
    root["quantization_config"] = q;
  }
  root["transformers_version"] = "4.56.0";
  return root;
}

nlohmann::ordered_json tokenizer_config_json(const Config& c) {
  using J = nlohmann::ordered_json;
  J added = J::object();
  for (int64_t id = c.vocab - 256; id < c.vocab; ++id) {
    J e;
    e["content"] = special_token(c.vocab, id);
    e["lstrip"] = false;
    e["normalized"] = false;
    e["rstrip"] = false;
    e["single_word"] = false;
    e["special"] = true;
    added[std::to_string(id)] = e;
  }
  J t;
  t["added_tokens_decoder"] = added;
  t["bos_token"] = "[BOS]";
  t["eos_token"] = "[EOS]";
  t["pad_token"] = "[PAD]";
  t["unk_token"] = "[UNK]";
  t["model_max_length"] = c.max_pos;
  t["tokenizer_class"] = "TikTokenTokenizer";
  t["clean_up_tokenization_spaces"] = false;
  return t;
}

std::vector<std::string> learn_vocab(int64_t vocab, size_t* text_bytes) {
  check(vocab >= 512, "synth: vocab_size {} too small (need >= 512: 256 bytes + 256 specials)", vocab);
  const size_t n_base = static_cast<size_t>(vocab - 256);
  size_t bytes = std::max<size_t>(128 << 10, 64 * n_base);
  for (int attempt = 0;; ++attempt) {
    std::string text = make_corpus(bytes);
    try {
      bpe::TrainOptions o;
      o.n_tokens = n_base;
      auto toks = bpe::train(text, o);
      if (text_bytes) *text_bytes = text.size();
      return toks;
    } catch (const Error&) {
      if (attempt >= 4) throw;
      bytes *= 2;  // too few distinct pairs: learn from a longer text
    }
  }
}

// ------------------------------------------------------------------------------------------------
// writing

namespace {

void write_text(const fs::path& p, const std::string& s) {
  std::ofstream f(p, std::ios::binary);
  f.write(s.data(), static_cast<std::streamsize>(s.size()));
  f.close();
  check(!f.fail(), "synth: cannot write '{}'", p.string());
}

struct Shard {
  std::vector<size_t> items;
  uint64_t bytes = 0;
};

uint64_t item_bytes(const Item& it) {
  uint64_t b = uint64_t(numel(it.t.shape)) * st::dtype_size(it.t.dtype);
  if (it.mxfp4) b += uint64_t(numel(it.scale.shape));
  return b;
}

class ShardWriter {
 public:
  ShardWriter(const Config& c, ThreadPool& pool, Progress& prog) : c_(c), pool_(pool), prog_(prog) {}

  void write_item(st::Writer& w, const Item& it) {
    const uint64_t key = name_key(c_.seed, it.value_name);
    const uint64_t bkey = it.base.empty() ? 0 : name_key(c_.seed, it.base);
    if (it.mxfp4) {
      packed_.resize(size_t(it.rows * it.cols / 2));
      scales_.resize(size_t(it.rows * it.cols / 32));
      const int64_t rows_per = std::max<int64_t>(1, kChunk / it.cols);
      for (int64_t r0 = 0; r0 < it.rows; r0 += rows_per) {
        const int64_t nr = std::min(rows_per, it.rows - r0);
        buf_.resize(size_t(nr * it.cols));
        auto do_row = [&](int64_t r, int) {
          float* row = buf_.data() + r * it.cols;
          fill_range(it, key, bkey, (r0 + r) * it.cols, (r0 + r + 1) * it.cols, row);
          mxfp4_quantize_row(row, it.cols, packed_.data() + (r0 + r) * (it.cols / 2),
                             scales_.data() + (r0 + r) * (it.cols / 32));
        };
        if (nr * it.cols < kPart) {  // small: not worth waking the pool
          for (int64_t r = 0; r < nr; ++r) do_row(r, 0);
        } else {
          pool_.parallel_for(nr, do_row);
        }
      }
      w.write(it.t.name, packed_.data(), packed_.size());
      w.write(it.scale.name, scales_.data(), scales_.size());
      prog_.add_bytes(packed_.size() + scales_.size());
      return;
    }
    const int64_t n = it.rows * it.cols;
    std::vector<float> whole;
    if (!elementwise(it)) whole = whole_values(it, c_.seed);
    for (int64_t i0 = 0; i0 < n; i0 += kChunk) {
      const int64_t m = std::min<int64_t>(kChunk, n - i0);
      buf_.resize(size_t(m));
      if (whole.empty()) {
        const int64_t parts = (m + kPart - 1) / kPart;
        auto do_part = [&](int64_t p, int) {
          int64_t a = i0 + p * kPart, b = std::min(i0 + m, a + kPart);
          fill_range(it, key, bkey, a, b, buf_.data() + (a - i0));
        };
        if (parts == 1) do_part(0, 0);
        else pool_.parallel_for(parts, do_part);
      } else {
        std::copy(whole.begin() + i0, whole.begin() + i0 + m, buf_.begin());
      }
      if (it.t.dtype == st::Dtype::F32) {
        w.write(it.t.name, buf_.data(), size_t(m) * 4);
        prog_.add_bytes(uint64_t(m) * 4);
      } else {
        bf16_.resize(size_t(m));
        for (int64_t i = 0; i < m; ++i) bf16_[i] = f32_to_bf16(buf_[i]);
        w.write(it.t.name, bf16_.data(), size_t(m) * 2);
        prog_.add_bytes(uint64_t(m) * 2);
      }
    }
  }

 private:
  static constexpr int64_t kChunk = 1 << 22;  // elements generated per write
  static constexpr int64_t kPart = 1 << 16;   // elements per parallel task
  const Config& c_;
  ThreadPool& pool_;
  Progress& prog_;
  std::vector<float> buf_;
  std::vector<uint16_t> bf16_;
  std::vector<uint8_t> packed_, scales_;
};

}  // namespace

Summary write_checkpoint(const Config& c, const std::string& dir, const WriteOptions& opt) {
  check(!dir.empty(), "synth: no output directory given");
  const fs::path out = fs::path(dir).lexically_normal();
  const fs::path final_path = out.has_filename() ? out : out.parent_path();
  std::error_code ec;
  bool replace = false;
  if (fs::exists(final_path, ec)) {
    check(fs::is_directory(final_path, ec), "synth: output path '{}' exists and is not a directory",
          final_path.string());
    if (!fs::is_empty(final_path, ec)) {
      check(opt.force, "synth: output directory '{}' exists and is not empty (use --force to replace it)",
            final_path.string());
    }
    replace = true;
  }
  // a fresh temp directory of our own (FINAL.kimi-tmp.<pid>.<random>): never someone's FINAL.tmp; its
  // files are removed on SIGINT/SIGTERM/SIGHUP, and stale ones of dead runs by create_temp_dir
  if (final_path.has_parent_path()) {
    fs::create_directories(final_path.parent_path(), ec);
    check(!ec, "synth: cannot create directory '{}': {}", final_path.parent_path().string(), ec.message());
  }
  const fs::path tmp = create_temp_dir(final_path.string());

  Summary sum;
  try {
    auto items = plan(c);

    // shards: a new one every 4 layers (plan groups) or when the size limit would be exceeded
    std::vector<Shard> shards;
    int64_t cur_group = -1;
    for (size_t i = 0; i < items.size(); ++i) {
      const uint64_t b = item_bytes(items[i]);
      if (shards.empty() || items[i].group != cur_group ||
          (shards.back().bytes > 0 && shards.back().bytes + b > opt.shard_max_bytes))
        shards.emplace_back();
      cur_group = items[i].group;
      shards.back().items.push_back(i);
      shards.back().bytes += b;
    }
    uint64_t total = 0;
    for (auto& s : shards) total += s.bytes;

    const bool big = total >= (256ull << 20);
    Progress prog("synth", shards.size(), total,
                  opt.quiet || !big ? Progress::Mode::Quiet : Progress::Mode::Auto);
    ThreadPool pool(0);
    ShardWriter sw(c, pool, prog);
    nlohmann::ordered_json weight_map = nlohmann::ordered_json::object();
    for (size_t s = 0; s < shards.size(); ++s) {
      std::string fname = fmt::format("model-{:05d}-of-{:05d}.safetensors", s + 1, shards.size());
      st::Writer w((tmp / fname).string());
      w.add_metadata("format", "pt");
      for (size_t i : shards[s].items) {
        const Item& it = items[i];
        w.add_tensor(it.t.name, it.t.dtype, it.t.shape);
        weight_map[it.t.name] = fname;
        ++sum.tensors;
        if (it.mxfp4) {
          w.add_tensor(it.scale.name, it.scale.dtype, it.scale.shape);
          weight_map[it.scale.name] = fname;
          ++sum.tensors;
        }
        sum.parameters += uint64_t(it.rows * it.cols);
      }
      w.begin();
      for (size_t i : shards[s].items) sw.write_item(w, items[i]);
      w.finish();
      sum.tensor_bytes += w.data_bytes();
      prog.item_done(fname);
    }
    prog.finish();
    sum.shards = shards.size();

    nlohmann::ordered_json index;
    index["metadata"] = {{"total_size", sum.tensor_bytes}, {"total_parameters", sum.parameters}};
    index["weight_map"] = weight_map;
    write_text(tmp / "model.safetensors.index.json", index.dump(2) + "\n");
    write_text(tmp / "config.json", config_json(c).dump(2) + "\n");
    write_text(tmp / "tokenizer_config.json", tokenizer_config_json(c).dump(2) + "\n");
    nlohmann::ordered_json gen;
    gen["bos_token_id"] = c.vocab - 256;
    gen["eos_token_id"] = c.vocab - 254;
    write_text(tmp / "generation_config.json", gen.dump(2) + "\n");
    auto vocab = learn_vocab(c.vocab, &sum.vocab_text_bytes);
    write_text(tmp / "tiktoken.model", bpe::to_tiktoken(vocab));
  } catch (...) {
    discard_temp(tmp.string());
    throw;
  }

  install_dir(tmp.string(), final_path.string(), replace);
  return sum;
}

void install_dir(const std::string& tmp, const std::string& final_path, bool replace) {
  std::error_code ec;
  if (replace) {
    const std::string old = final_path + ".old." + std::to_string(::getpid());
    fs::rename(final_path, old, ec);
    check(!ec, "synth: cannot move the old '{}' aside: {}", final_path, ec.message());
    fs::rename(tmp, final_path, ec);
    if (ec) discard_temp(tmp);
    check(!ec, "synth: cannot rename '{}' to '{}': {}", tmp, final_path, ec.message());
    unregister_temp(tmp);
    fs::remove_all(old, ec);
  } else {
    fs::rename(tmp, final_path, ec);
    if (ec) discard_temp(tmp);
    check(!ec, "synth: cannot rename '{}' to '{}': {}", tmp, final_path, ec.message());
    unregister_temp(tmp);
  }
}

}  // namespace kimi::synth
