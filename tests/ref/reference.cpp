// The float64 reference forward pass (k3-architecture.md §3, dsa-indexer.md §1.2, spec/README.md
// decisions 3-4), reading the Hugging Face checkpoint directly. Straight loops, no cleverness:
// every step is written in the order the spec states it.
#include "ref/reference.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <functional>
#include <numeric>

#include "io/hf_config.h"
#include "io/safetensors.h"
#include "util/error.h"

namespace kimi::ref {

using Vec = std::vector<double>;
using Seq = std::vector<Vec>;  // [T][width]

namespace {

// How the GGUF stores a weight, i.e. what the engine's fast mode rounds the activation to.
enum class WType { BF16, F32, MXFP4 };

double sigmoid(double x) { return 1.0 / (1.0 + std::exp(-x)); }
double softplus(double x) { return x > 30.0 ? x : std::log1p(std::exp(x)); }
double silu(double x) { return x * sigmoid(x); }

Vec rms_norm(const Vec& x, const Vec& w, double eps) {
  double ss = 0.0;
  for (double v : x) ss += v * v;
  const double r = 1.0 / std::sqrt(ss / static_cast<double>(x.size()) + eps);
  Vec y(x.size());
  for (size_t i = 0; i < x.size(); ++i) y[i] = x[i] * r * w[i];
  return y;
}

int64_t squeeze_numel(const std::vector<int64_t>& s) {
  int64_t n = 1;
  for (auto v : s) n *= v;
  return n;
}
std::vector<int64_t> squeeze(const std::vector<int64_t>& s) {
  std::vector<int64_t> r;
  for (auto v : s)
    if (v != 1) r.push_back(v);
  return r;
}
std::string shape_str(const std::vector<int64_t>& s) {
  std::string r = "[";
  for (size_t i = 0; i < s.size(); ++i) r += (i ? ", " : "") + std::to_string(s[i]);
  return r + "]";
}

}  // namespace

struct RefModel::Impl {
  std::string dir;
  std::unique_ptr<st::Checkpoint> ck;
  std::string prefix;  // "language_model." or ""
  RefConfig cfg;
  std::vector<bool> is_mla;
  mutable std::map<std::string, Vec> cache;  // decoded tensors (keyed by name + decode variant)

  bool has(const std::string& name) const { return ck->find(prefix + name) != nullptr; }

  // Decodes a float tensor to double, checking its shape (size-1 dims ignored: [1, d] == [d]).
  const Vec& get(const std::string& name, const std::vector<int64_t>& shape) const {
    auto it = cache.find(name);
    if (it != cache.end()) return it->second;
    const st::Tensor* t = ck->find(prefix + name);
    check(t != nullptr, "reference: tensor '{}{}' not found in {}", prefix, name, dir);
    check(squeeze(t->shape) == squeeze(shape) && squeeze_numel(t->shape) == squeeze_numel(shape),
          "reference: tensor '{}' in {} has shape {}, expected {}", t->name, t->file, t->shape_string(),
          shape_str(shape));
    const int64_t n = t->numel();
    Vec v(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) {
      const uint8_t* p = t->data;
      switch (t->dtype) {
        case st::Dtype::BF16: {
          uint16_t h;
          std::memcpy(&h, p + 2 * i, 2);
          v[i] = bf16_bits_to_double(h);
          break;
        }
        case st::Dtype::F16: {
          uint16_t h;
          std::memcpy(&h, p + 2 * i, 2);
          v[i] = f16_bits_to_double(h);
          break;
        }
        case st::Dtype::F32: {
          float f;
          std::memcpy(&f, p + 4 * i, 4);
          v[i] = f;
          break;
        }
        case st::Dtype::F64: {
          std::memcpy(&v[i], p + 8 * i, 8);
          break;
        }
        default:
          fail("reference: tensor '{}' in {} has dtype {}, expected BF16, F16, F32 or F64", t->name, t->file,
               st::dtype_name(t->dtype));
      }
      check(std::isfinite(v[i]), "reference: tensor '{}' in {} has a non-finite value at element {}", t->name,
            t->file, i);
    }
    return cache.emplace(name, std::move(v)).first->second;
  }

  // A routed expert matrix [rows, cols]: compressed-tensors MXFP4 (weight_packed + weight_scale,
  // decoded here: E2M1 code x 2^(scale - 127)) or a plain float `.weight`.
  const Vec& expert(const std::string& base, int64_t rows, int64_t cols, Trap trap) const {
    const bool nib = trap == Trap::MxfpNibbleOrder, half = trap == Trap::MxfpHalfScale;
    const std::string key = base + (nib ? "|nibble" : "") + (half ? "|half" : "");
    auto it = cache.find(key);
    if (it != cache.end()) return it->second;
    if (!has(base + ".weight_packed")) return get(base + ".weight", {rows, cols});
    const st::Tensor& pk = ck->get(prefix + base + ".weight_packed");
    const st::Tensor& sc = ck->get(prefix + base + ".weight_scale");
    check(pk.dtype == st::Dtype::U8 && pk.shape == std::vector<int64_t>{rows, cols / 2},
          "reference: tensor '{}' in {} is {} {}, expected U8 [{}, {}]", pk.name, pk.file, st::dtype_name(pk.dtype),
          pk.shape_string(), rows, cols / 2);
    check((sc.dtype == st::Dtype::U8 || sc.dtype == st::Dtype::F8_E8M0) &&
              sc.shape == std::vector<int64_t>{rows, cols / 32},
          "reference: tensor '{}' in {} is {} {}, expected U8 [{}, {}]", sc.name, sc.file, st::dtype_name(sc.dtype),
          sc.shape_string(), rows, cols / 32);
    Vec v(static_cast<size_t>(rows * cols));
    for (int64_t r = 0; r < rows; ++r)
      mxfp4_decode_row(pk.data + r * (cols / 2), sc.data + r * (cols / 32), cols, v.data() + r * cols, nib, half);
    return cache.emplace(key, std::move(v)).first->second;
  }
};

// ---------------------------------------------------------------- loading

RefModel::RefModel(RefModel&&) noexcept = default;
RefModel& RefModel::operator=(RefModel&&) noexcept = default;
RefModel::~RefModel() = default;

RefModel RefModel::load(const std::string& hf_dir) {
  namespace fs = std::filesystem;
  RefModel m;
  m.impl_ = std::make_unique<Impl>();
  Impl& I = *m.impl_;
  I.dir = hf_dir;
  const std::string cfg_path = (fs::path(hf_dir) / "config.json").string();
  HfConfig hc = HfConfig::load(cfg_path);
  RefConfig& c = m.cfg_;
  c.n_layer = hc.get_int("num_hidden_layers");
  c.d = hc.get_int("hidden_size");
  c.vocab = hc.get_int("vocab_size");
  c.n_head = hc.get_int("num_attention_heads");
  c.eps = hc.get_float_or("rms_norm_eps", 1e-5);
  c.situ_beta = hc.get_float_or("activation_situ_beta", 4.0);
  c.situ_lambda = hc.get_float_or("activation_situ_linear_beta", 25.0);
  c.block_size = hc.get_int_or("attn_res_block_size", 0);
  c.full_attn_1based = hc.full_attn_layers_1based();
  c.q_lora = hc.get_int("q_lora_rank");
  c.kv_lora = hc.get_int("kv_lora_rank");
  c.nope = hc.get_int("qk_nope_head_dim");
  c.rope = hc.get_int("qk_rope_head_dim");
  c.vdim = hc.get_int("v_head_dim");
  c.kda_dim = hc.get_int("linear_attn_config.head_dim");
  c.conv_k = hc.get_int_or("linear_attn_config.short_conv_kernel_size", 4);
  c.has_gate_lb = hc.has("linear_attn_config.gate_lower_bound");
  c.gate_lb = c.has_gate_lb ? hc.get_float("linear_attn_config.gate_lower_bound") : 0.0;
  c.first_dense = hc.get_int_or("first_k_dense_replace", 0);
  c.dense_width = c.first_dense > 0 ? hc.get_int("intermediate_size") : 0;
  c.n_expert = hc.get_int_or("num_experts", 0);
  c.n_used = hc.get_int_or("num_experts_per_token", 0);
  c.n_shared = hc.get_int_or("num_shared_experts", 0);
  c.moe_width = hc.get_int_or("moe_intermediate_size", 0);
  c.latent = hc.get_int_or("routed_expert_hidden_size", 0);
  c.routed_scale = hc.get_float_or("routed_scaling_factor", 1.0);
  c.renorm = hc.get_bool_or("moe_renormalize", true);
  c.sigmoid_gating = !hc.has("moe_router_activation_func") || hc.get_str("moe_router_activation_func") != "softmax";
  c.experts_packed = hc.experts_mxfp4_packed();
  c.tie_embeddings = hc.get_bool_or("tie_word_embeddings", false);
  c.idx_topk = hc.get_int_or("index_topk", 0);
  c.idx_heads = hc.get_int_or("index_n_heads", 0);
  c.idx_dim = hc.get_int_or("index_head_dim", 0);
  check(c.n_layer > 0 && c.d > 0 && c.vocab > 0 && c.n_head > 0 && c.kda_dim > 0 && c.conv_k > 0,
        "{}: num_hidden_layers, hidden_size, vocab_size, num_attention_heads, linear_attn_config.head_dim and "
        "short_conv_kernel_size must be positive",
        cfg_path);
  check(c.n_layer <= c.first_dense || (c.n_expert > 0 && c.n_used > 0 && c.n_used <= c.n_expert && c.moe_width > 0),
        "{}: MoE layers need num_experts > 0, 0 < num_experts_per_token <= num_experts, moe_intermediate_size > 0",
        cfg_path);
  check(c.block_size >= 0, "{}: attn_res_block_size = {} must be >= 0", cfg_path, c.block_size);
  check(c.idx_topk <= 0 || (c.idx_heads > 0 && c.idx_dim > 0), "{}: index_topk = {} needs index_n_heads and "
        "index_head_dim > 0", cfg_path, c.idx_topk);
  I.is_mla.assign(static_cast<size_t>(c.n_layer), false);
  for (auto l : c.full_attn_1based) I.is_mla[static_cast<size_t>(l - 1)] = true;  // 1-indexed (trap 1)
  I.cfg = c;
  I.ck = st::Checkpoint::open(hf_dir);
  if (I.ck->find("language_model.model.embed_tokens.weight")) {
    I.prefix = "language_model.";
  } else {
    check(I.ck->find("model.embed_tokens.weight") != nullptr,
          "reference: {} has neither 'language_model.model.embed_tokens.weight' nor 'model.embed_tokens.weight'",
          hf_dir);
  }
  return m;
}

// ---------------------------------------------------------------- forward

namespace {

struct Fwd {
  const RefModel::Impl& I;
  const RefConfig& c;
  RefOptions o;
  int64_t top_k = 0;  // effective indexer top-k (0: dense attention)

  bool trap(Trap t) const { return o.trap == t; }

  // Rounds an activation copy the way the engine's fast mode does before a matmul with a weight
  // stored as `wt` in the GGUF.
  Vec act(const Vec& x, WType wt) const {
    if (!o.emulate_fast || wt == WType::F32) return x;
    Vec r = x;
    if (wt == WType::BF16) {
      for (auto& v : r) v = round_to_bf16(v);
    } else {
      round_q8_0(r.data(), static_cast<int64_t>(r.size()));
    }
    return r;
  }
  double cache_round(double v) const { return o.emulate_fast ? round_to_f16(v) : v; }

  // y = W x, W row-major [rows, cols] (PyTorch [out, in]).
  static Vec matvec(const Vec& W, int64_t rows, int64_t cols, const Vec& x) {
    check(static_cast<int64_t>(x.size()) == cols && static_cast<int64_t>(W.size()) == rows * cols,
          "reference: matvec size mismatch ({} x {} with {} inputs)", rows, cols, x.size());
    Vec y(static_cast<size_t>(rows));
    for (int64_t r = 0; r < rows; ++r) {
      const double* w = W.data() + r * cols;
      double acc = 0.0;
      for (int64_t k = 0; k < cols; ++k) acc += w[k] * x[k];
      y[r] = acc;
    }
    return y;
  }
  Vec lin(const std::string& name, int64_t rows, int64_t cols, const Vec& x, WType wt = WType::BF16) const {
    return matvec(I.get(name, {rows, cols}), rows, cols, act(x, wt));
  }
  const Vec& vec(const std::string& name, int64_t n) const { return I.get(name, {n}); }

  bool layer_is_mla(int64_t il) const {
    if (trap(Trap::ZeroIndexedFullAttn)) {
      for (auto l : c.full_attn_1based)
        if (l == il) return true;
      return false;
    }
    return I.is_mla[static_cast<size_t>(il)];
  }

  // fused residual score vector: res_norm.weight (.) res_proj.weight (trap 3)
  Vec res_score(const std::string& base) const {
    const Vec& nw = vec(base + "_norm.weight", c.d);
    const Vec& pw = I.get(base + "_proj.weight", {1, c.d});
    Vec w(static_cast<size_t>(c.d));
    for (int64_t j = 0; j < c.d; ++j)
      w[j] = trap(Trap::ResScoreNormOnly) ? nw[j] : trap(Trap::ResScoreProjOnly) ? pw[j] : nw[j] * pw[j];
    return w;
  }

  double act_fn(double g, double u) const {
    if (trap(Trap::SwiGLUInsteadOfSiTU)) return silu(g) * u;
    if (trap(Trap::SwapGateUp)) std::swap(g, u);
    return situ(g, u, c.situ_beta, trap(Trap::SituNoUpTanh) ? 0.0 : c.situ_lambda);
  }

  // W_down . act(W_gate y, W_up y)
  Vec glu_mlp(const std::string& p, int64_t width, const Vec& y) const {
    Vec g = lin(p + "gate_proj.weight", width, c.d, y);
    Vec u = lin(p + "up_proj.weight", width, c.d, y);
    Vec a(static_cast<size_t>(width));
    for (int64_t i = 0; i < width; ++i) a[i] = act_fn(g[i], u[i]);
    return lin(p + "down_proj.weight", c.d, width, a);
  }

  // ---- KDA layer (k3-architecture.md §3.3) over the whole sequence
  Seq kda(int64_t il, const Seq& y) const {
    const std::string p = "model.layers." + std::to_string(il) + ".self_attn.";
    const int64_t T = static_cast<int64_t>(y.size()), H = c.n_head, D = c.kda_dim, C = H * D, K = c.conv_k;
    // 1. projections
    Seq proj[3];
    const char* names[3] = {"q", "k", "v"};
    for (int s = 0; s < 3; ++s)
      for (int64_t t = 0; t < T; ++t) proj[s].push_back(lin(p + names[s] + "_proj.weight", C, c.d, y[t]));
    // 2-3. causal depthwise conv (tap K-1 = current token), SiLU
    Seq cv[3];
    for (int s = 0; s < 3; ++s) {
      const Vec& w = I.get(p + names[s] + "_conv1d.weight", {C, 1, K});
      cv[s].assign(static_cast<size_t>(T), Vec(static_cast<size_t>(C)));
      for (int64_t t = 0; t < T; ++t)
        for (int64_t ch = 0; ch < C; ++ch) {
          double acc = 0.0;
          for (int64_t j = 0; j < K; ++j) {
            const int64_t src = t - (K - 1) + j;
            if (src < 0) continue;
            int64_t tap = trap(Trap::ConvTapReversed) ? K - 1 - j : j;
            double wj = trap(Trap::ConvLayoutTransposed) ? w[tap * C + ch] : w[ch * K + tap];
            acc += wj * proj[s][src][ch];
          }
          cv[s][t][ch] = trap(Trap::KdaNoConvSilu) ? acc : silu(acc);
        }
    }
    // 5. decay gate
    const Vec& alog_all = [&]() -> const Vec& {
      const st::Tensor* t = I.ck->find(I.prefix + p + "A_log");
      check(t != nullptr, "reference: tensor '{}{}A_log' not found in {}", I.prefix, p, I.dir);
      const int64_t n = t->numel();
      check(n >= H, "reference: tensor '{}' has {} values, expected at least {} (one per head)", t->name, n, H);
      return I.get(p + "A_log", {n});
    }();
    const int64_t n_alog = static_cast<int64_t>(alog_all.size());
    Vec alog(static_cast<size_t>(H));
    for (int64_t h = 0; h < H; ++h) alog[h] = alog_all[trap(Trap::ALogReshape) ? h * (n_alog / H) : h];
    const st::Tensor* fa = I.ck->find(I.prefix + p + "f_a_proj.weight");
    check(fa != nullptr && fa->shape.size() == 2, "reference: tensor '{}{}f_a_proj.weight' missing or not 2-D in {}",
          I.prefix, p, I.dir);
    const int64_t rank = fa->shape[0];
    const Vec& dt = vec(p + "dt_bias", C);
    const Vec& onorm = vec(p + "o_norm.weight", D);
    Seq out;
    std::vector<Seq> qh(H), kh(H), vh(H), gh(H);
    std::vector<Vec> bh(H);
    Seq gate(static_cast<size_t>(T));
    for (int64_t t = 0; t < T; ++t) {
      Vec a = lin(p + "f_b_proj.weight", C, rank, lin(p + "f_a_proj.weight", rank, c.d, y[t]));
      Vec b = lin(p + "b_proj.weight", H, c.d, y[t]);
      gate[t] = lin(p + "g_proj.weight", C, c.d, y[t]);
      for (int64_t h = 0; h < H; ++h) {
        Vec q(D), k(D), v(D), g(D);
        double sq = 0, sk = 0;
        for (int64_t i = 0; i < D; ++i) {
          q[i] = cv[0][t][h * D + i];
          k[i] = cv[1][t][h * D + i];
          v[i] = cv[2][t][h * D + i];
          sq += q[i] * q[i];
          sk += k[i] * k[i];
          const double x = a[h * D + i] + dt[h * D + i];
          const double A = std::exp(alog[h]);
          if (!c.has_gate_lb) {
            g[i] = -A * softplus(x);
          } else if (trap(Trap::GateAsClamp)) {
            g[i] = std::max(c.gate_lb, -A * softplus(x));
          } else if (trap(Trap::SsmAWrongSign)) {
            g[i] = c.gate_lb * sigmoid(-A * x);
          } else {
            g[i] = c.gate_lb * sigmoid(A * x);
          }
        }
        // 4. l2 norm: x / sqrt(sum x^2 + eps)  (trap 7: RMS norm)
        const double div = trap(Trap::RmsInsteadOfL2) ? static_cast<double>(D) : 1.0;
        const double l2eps = trap(Trap::EpsHfReference) ? 1e-6 : c.eps;
        const double rq = 1.0 / std::sqrt(sq / div + l2eps), rk = 1.0 / std::sqrt(sk / div + l2eps);
        for (int64_t i = 0; i < D; ++i) {
          q[i] *= rq;
          k[i] *= rk;
        }
        qh[h].push_back(q);
        kh[h].push_back(k);
        vh[h].push_back(v);
        gh[h].push_back(g);
        bh[h].push_back(sigmoid(b[h]));  // 6. beta
      }
    }
    // 7. recurrence per head, 8. per-head RMSNorm (shared weight), output gate, o_proj
    std::vector<Seq> oh(H);
    for (int64_t h = 0; h < H; ++h) oh[h] = kda_recurrence(qh[h], kh[h], vh[h], gh[h], bh[h], o.trap);
    for (int64_t t = 0; t < T; ++t) {
      Vec z(static_cast<size_t>(C));
      for (int64_t h = 0; h < H; ++h) {
        Vec zn = rms_norm(oh[h][t], onorm, c.eps);
        for (int64_t i = 0; i < D; ++i) {
          const double gv = gate[t][h * D + i];
          z[h * D + i] = zn[i] * (trap(Trap::KdaGateSilu) ? silu(gv) : sigmoid(gv));
        }
      }
      out.push_back(lin(p + "o_proj.weight", c.d, C, z));
    }
    return out;
  }

  // ---- MLA layer (§3.4) with the DSA indexer (decision 3), absorbed form
  Seq mla(int64_t il, const Seq& y, const Seq& h_unnormed) const {
    const std::string p = "model.layers." + std::to_string(il) + ".self_attn.";
    const int64_t T = static_cast<int64_t>(y.size()), H = c.n_head, R = c.kv_lora, P = c.rope, N = c.nope,
                  V = c.vdim, DK = N + P;
    const Vec& qa_norm = vec(p + "q_a_layernorm.weight", c.q_lora);
    const Vec& kva_norm = vec(p + "kv_a_layernorm.weight", R);
    const Vec& kvb = I.get(p + "kv_b_proj.weight", {H * (N + V), R});
    const double lr_eps = trap(Trap::EpsHfReference) ? 1e-6 : c.eps;  // low-rank norms
    // kv_b split per head (trap 12): head h rows h*(N+V) .. +N = K-nope, next V rows = V
    auto kb = [&](int64_t h, int64_t i, int64_t r) -> double {  // W_kb,h[i][r]
      int64_t row = trap(Trap::KvbSplitBlocked) ? h * N + i
                    : trap(Trap::KvbKVSwapped)  ? h * (N + V) + V + i
                                                : h * (N + V) + i;
      return kvb[row * R + r];
    };
    auto vb = [&](int64_t h, int64_t i, int64_t r) -> double {  // W_vb,h[i][r]
      int64_t row = trap(Trap::KvbSplitBlocked) ? H * N + h * V + i
                    : trap(Trap::KvbKVSwapped)  ? h * (N + V) + i
                                                : h * (N + V) + N + i;
      return kvb[row * R + r];
    };
    // cache rows [c | k_pe] and query pieces for every token
    Seq cache_c(T), cache_pe(T), cq_all(T), qlat_raw(T);
    Seq q_abs(T), q_pe(T);
    for (int64_t t = 0; t < T; ++t) {
      qlat_raw[t] = lin(p + "q_a_proj.weight", c.q_lora, c.d, y[t]);
      cq_all[t] = rms_norm(qlat_raw[t], qa_norm, lr_eps);
      Vec q = lin(p + "q_b_proj.weight", H * DK, c.q_lora, cq_all[t]);
      Vec u = lin(p + "kv_a_proj_with_mqa.weight", R + P, c.d, y[t]);
      Vec lat(u.begin(), u.begin() + R);
      Vec cn = rms_norm(lat, kva_norm, lr_eps);
      for (auto& v : cn) v = cache_round(v);
      cache_c[t] = cn;
      cache_pe[t].assign(u.begin() + R, u.end());
      for (auto& v : cache_pe[t]) v = cache_round(v);
      // absorption: q_abs,h = W_kb,h^T q_nope,h (the engine multiplies with attn_k_b, a BF16 weight)
      q_abs[t].assign(static_cast<size_t>(H * R), 0.0);
      q_pe[t].assign(static_cast<size_t>(H * P), 0.0);
      for (int64_t h = 0; h < H; ++h) {
        Vec qn(q.begin() + h * DK, q.begin() + h * DK + N);
        qn = act(qn, WType::BF16);
        for (int64_t r = 0; r < R; ++r) {
          double acc = 0.0;
          for (int64_t i = 0; i < N; ++i) acc += kb(h, i, r) * qn[i];
          q_abs[t][h * R + r] = acc;
        }
        for (int64_t i = 0; i < P; ++i) q_pe[t][h * P + i] = q[h * DK + N + i];
      }
    }
    // indexer keys and selection
    std::vector<std::vector<int64_t>> sel(T);
    const bool use_idx = top_k > 0;
    if (use_idx) {
      const std::string ip = p + "indexer.";
      const int64_t HI = c.idx_heads, DI = c.idx_dim;
      const Vec& knw = vec(ip + "k_norm.weight", DI);
      const Vec& knb = vec(ip + "k_norm.bias", DI);
      Seq kI(T), qI(T), wI(T);
      for (int64_t t = 0; t < T; ++t) {
        Vec k = lin(ip + "wk.weight", DI, c.d, y[t]);
        if (trap(Trap::IndexerRmsNormK)) {
          k = rms_norm(k, knw, 1e-6);
        } else {  // LayerNorm, eps 1e-6 (decision 4)
          double mean = std::accumulate(k.begin(), k.end(), 0.0) / static_cast<double>(DI);
          double var = 0.0;
          for (double v : k) var += (v - mean) * (v - mean);
          var /= static_cast<double>(DI);
          const double r = 1.0 / std::sqrt(var + 1e-6);
          for (int64_t i = 0; i < DI; ++i) k[i] = (k[i] - mean) * r * knw[i] + knb[i];
        }
        for (auto& v : k) v = cache_round(v);
        kI[t] = k;
        qI[t] = lin(ip + "wq_b.weight", HI * DI, c.q_lora, trap(Trap::IndexerQUnnormed) ? qlat_raw[t] : cq_all[t]);
        wI[t] = lin(ip + "weights_proj.weight", HI, c.d, y[t], WType::F32);
        const double ws = trap(Trap::IndexerNoWeightScale) ? 1.0 : 1.0 / std::sqrt(static_cast<double>(HI * DI));
        for (auto& v : wI[t]) v *= ws;
      }
      for (int64_t t = 0; t < T; ++t) {
        const int64_t n_cand = trap(Trap::IndexerNoCausalMask) ? T : t + 1;
        Vec sc(static_cast<size_t>(n_cand));
        for (int64_t s = 0; s < n_cand; ++s) sc[s] = indexer_score(qI[t], wI[t], kI[s], HI, DI, o.trap);
        for (int64_t s : select_top_k(sc, top_k, o.trap))
          if (s <= t) sel[t].push_back(s);  // causal re-mask
      }
    } else {
      for (int64_t t = 0; t < T; ++t) {
        sel[t].resize(static_cast<size_t>(t + 1));
        std::iota(sel[t].begin(), sel[t].end(), 0);
      }
    }
    // attention per head over the selected rows, then gate and o_proj
    const double scale = 1.0 / std::sqrt(static_cast<double>(trap(Trap::MlaScale128) ? N : DK));
    Seq out;
    for (int64_t t = 0; t < T; ++t) {
      Vec oc(static_cast<size_t>(H * V));
      for (int64_t h = 0; h < H; ++h) {
        const auto& ss = sel[t];
        if (ss.empty()) continue;  // only under IndexerNoCausalMask: nothing visible selected -> 0
        Vec e(ss.size());
        for (size_t k = 0; k < ss.size(); ++k) {
          const int64_t s = ss[k];
          double acc = 0.0;
          for (int64_t r = 0; r < R; ++r) acc += q_abs[t][h * R + r] * cache_c[s][r];
          if (!trap(Trap::MlaNoPe))
            for (int64_t i = 0; i < P; ++i) acc += q_pe[t][h * P + i] * cache_pe[s][i];
          e[k] = acc * scale;
        }
        const double mx = *std::max_element(e.begin(), e.end());
        double z = 0.0;
        for (auto& v : e) z += (v = std::exp(v - mx));
        Vec lat(static_cast<size_t>(R), 0.0);  // z_h = sum_s alpha c_s
        for (size_t k = 0; k < ss.size(); ++k)
          for (int64_t r = 0; r < R; ++r) lat[r] += e[k] / z * cache_c[ss[k]][r];
        lat = act(lat, WType::BF16);  // the engine multiplies with attn_v_b (BF16)
        for (int64_t i = 0; i < V; ++i) {
          double acc = 0.0;
          for (int64_t r = 0; r < R; ++r) acc += vb(h, i, r) * lat[r];
          oc[h * V + i] = acc;
        }
      }
      if (!trap(Trap::GProjMixup)) {
        Vec g = lin(p + "g_proj.weight", H * V, c.d, trap(Trap::MlaGateUnnormed) ? h_unnormed[t] : y[t]);
        for (int64_t i = 0; i < H * V; ++i) oc[i] *= sigmoid(g[i]);
      }
      out.push_back(lin(p + "o_proj.weight", c.d, H * V, oc));
    }
    return out;
  }

  // ---- latent MoE (§3.5) for one token
  Vec moe(int64_t il, const Vec& y) const {
    const std::string p = "model.layers." + std::to_string(il) + ".block_sparse_moe.";
    const int64_t E = c.n_expert, F = c.moe_width;
    const bool latent = c.latent > 0;
    const int64_t L = latent ? c.latent : c.d;
    Vec l = lin(p + "gate.weight", E, c.d, y, WType::F32);  // router on the full width, F32 in GGUF
    const Vec& bias = vec(p + "gate.e_score_correction_bias", E);
    Vec s(static_cast<size_t>(E));
    const bool softmax = trap(Trap::RouterSoftmax) || !c.sigmoid_gating;
    if (softmax) {
      const double mx = *std::max_element(l.begin(), l.end());
      double z = 0.0;
      for (int64_t e = 0; e < E; ++e) z += (s[e] = std::exp(l[e] - mx));
      for (auto& v : s) v /= z;
    } else {
      for (int64_t e = 0; e < E; ++e) s[e] = sigmoid(l[e]);
    }
    Vec choice(static_cast<size_t>(E));
    for (int64_t e = 0; e < E; ++e) choice[e] = trap(Trap::RouterBiasIgnored) ? s[e] : s[e] + bias[e];
    std::vector<int64_t> ids(static_cast<size_t>(E));
    std::iota(ids.begin(), ids.end(), 0);
    std::stable_sort(ids.begin(), ids.end(), [&](int64_t a, int64_t b) { return choice[a] > choice[b]; });
    ids.resize(static_cast<size_t>(c.n_used));
    Vec w(ids.size());
    double sum = 0.0;
    for (size_t k = 0; k < ids.size(); ++k) sum += (w[k] = trap(Trap::RouterBiasInWeights) ? s[ids[k]] + bias[ids[k]]
                                                                                          : s[ids[k]]);
    if (c.renorm && !trap(Trap::NoRenormalize))
      for (auto& v : w) v /= std::max(sum, 6.1035e-5);
    for (auto& v : w) v *= c.routed_scale;
    Vec yl = latent ? lin(p + "routed_expert_down_proj.weight", L, c.d, y) : y;
    const bool has_rnorm = latent && I.has(p + "routed_expert_norm.weight");
    const Vec* rnorm = has_rnorm ? &vec(p + "routed_expert_norm.weight", L) : nullptr;
    const WType ew = c.experts_packed ? WType::MXFP4 : WType::BF16;
    Vec m(static_cast<size_t>(L), 0.0);
    for (size_t k = 0; k < ids.size(); ++k) {
      const std::string ep = p + "experts." + std::to_string(ids[k]) + ".";
      Vec xin = act(yl, ew);
      Vec g = matvec(I.expert(ep + "w1", F, L, o.trap), F, L, xin);
      Vec u = matvec(I.expert(ep + "w3", F, L, o.trap), F, L, xin);
      Vec a(static_cast<size_t>(F));
      for (int64_t i = 0; i < F; ++i) a[i] = act_fn(g[i], u[i]);
      Vec r = matvec(I.expert(ep + "w2", L, F, o.trap), L, F, act(a, ew));
      if (trap(Trap::RoutedNormBeforeSum) && rnorm) r = rms_norm(r, *rnorm, c.eps);
      for (int64_t i = 0; i < L; ++i) m[i] += w[k] * r[i];
    }
    Vec out;
    if (latent) {
      if (rnorm && !trap(Trap::RoutedNormBeforeSum)) m = rms_norm(m, *rnorm, c.eps);  // after the weighted sum
      out = lin(p + "routed_expert_up_proj.weight", c.d, L, m);
    } else {
      out = m;
    }
    if (c.n_shared > 0) {
      Vec sh = glu_mlp(p + "shared_experts.", c.n_shared * F, y);
      for (int64_t i = 0; i < c.d; ++i) out[i] += sh[i];
    }
    return out;
  }

  Seq run(const std::vector<int32_t>& tokens) const {
    const int64_t T = static_cast<int64_t>(tokens.size());
    const Vec& emb = I.get("model.embed_tokens.weight", {c.vocab, c.d});
    Seq P(static_cast<size_t>(T));
    for (int64_t t = 0; t < T; ++t) {
      const int32_t tok = tokens[t];
      check(tok >= 0 && tok < c.vocab, "reference: token {} at position {} outside the vocabulary [0, {})", tok, t,
            c.vocab);
      P[t].assign(emb.begin() + static_cast<int64_t>(tok) * c.d, emb.begin() + (static_cast<int64_t>(tok) + 1) * c.d);
    }
    const bool resmix = c.block_size > 0;
    std::vector<Seq> bank;  // bank[k][t]
    auto mix = [&](const Seq& cur, const Vec& w) {
      if (!resmix) return cur;
      Seq r(static_cast<size_t>(T));
      for (int64_t t = 0; t < T; ++t) {
        std::vector<const Vec*> b;
        for (const auto& bk : bank) b.push_back(&bk[t]);
        r[t] = res_mix(b, cur[t], w, c.eps, o.trap);
      }
      return r;
    };
    for (int64_t il = 0; il < c.n_layer; ++il) {
      const std::string lp = "model.layers." + std::to_string(il) + ".";
      const bool bank_layer = resmix && il % c.block_size == 0;
      if (bank_layer && trap(Trap::BankBeforeMix)) bank.push_back(P);
      Seq h = mix(P, res_score(lp + "self_attention_res"));
      if (bank_layer && !trap(Trap::BankBeforeMix)) bank.push_back(trap(Trap::BankMixedH) ? h : P);
      const Vec& an = vec(lp + "input_layernorm.weight", c.d);
      Seq y(static_cast<size_t>(T));
      for (int64_t t = 0; t < T; ++t) y[t] = rms_norm(h[t], an, c.eps);
      Seq a = layer_is_mla(il) ? mla(il, y, h) : kda(il, y);
      bool restart = bank_layer && !trap(Trap::NoRestart) && !(il == 0 && trap(Trap::EmbedInStream));
      for (int64_t t = 0; t < T; ++t) {
        if (restart) {
          P[t] = a[t];
        } else {
          for (int64_t j = 0; j < c.d; ++j) P[t][j] += a[t][j];
        }
      }
      Seq h2 = mix(P, res_score(lp + "mlp_res"));
      const Vec& fn = vec(lp + "post_attention_layernorm.weight", c.d);
      for (int64_t t = 0; t < T; ++t) {
        Vec y2 = rms_norm(h2[t], fn, c.eps);
        Vec f = il < c.first_dense ? glu_mlp(lp + "mlp.", c.dense_width, y2) : moe(il, y2);
        for (int64_t j = 0; j < c.d; ++j) P[t][j] += f[j];
      }
    }
    Seq hF = trap(Trap::NoFinalMix) ? P : mix(P, res_score("model.output_attn_res"));
    const Vec& on = vec("model.norm.weight", c.d);
    const bool tied = !I.has("lm_head.weight") && c.tie_embeddings;
    const std::string head = tied ? "model.embed_tokens.weight" : "lm_head.weight";
    Seq logits(static_cast<size_t>(T));
    for (int64_t t = 0; t < T; ++t) logits[t] = lin(head, c.vocab, c.d, rms_norm(hF[t], on, c.eps));
    return logits;
  }
};

}  // namespace

std::vector<std::vector<double>> RefModel::forward(const std::vector<int32_t>& tokens, const RefOptions& opts) const {
  check(impl_ != nullptr, "reference: model not loaded");
  check(!tokens.empty(), "reference: forward() needs at least one token");
  check(opts.attn_top_k >= -1, "reference: attn_top_k must be -1 (config), 0 (off) or > 0, got {}",
        opts.attn_top_k);
  check(opts.trap >= Trap::None && opts.trap < Trap::Count_, "reference: invalid trap value {}",
        static_cast<int>(opts.trap));
  Fwd f{*impl_, cfg_, opts};
  if (opts.attn_top_k < 0) {
    f.top_k = cfg_.idx_topk > 0 ? cfg_.idx_topk : 0;
  } else {
    f.top_k = opts.attn_top_k;
    check(f.top_k == 0 || (cfg_.idx_heads > 0 && cfg_.idx_dim > 0),
          "reference: attn_top_k = {} but config.json has no index_n_heads / index_head_dim", f.top_k);
  }
  return f.run(tokens);
}

}  // namespace kimi::ref
