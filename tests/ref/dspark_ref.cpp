// Float64 reference of the K3 DSpark draft (dspark_ref.h), from docs/spec/dspark.md §3.
#include "ref/dspark_ref.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <map>
#include <stdexcept>

#include "io/hf_config.h"
#include "io/safetensors.h"
#include "ref/reference.h"  // bf16_bits_to_double, f16_bits_to_double

namespace fs = std::filesystem;

namespace kimi::ref {

namespace {

using Vec = std::vector<double>;

[[noreturn]] void die(const std::string& m) { throw std::runtime_error("dspark reference: " + m); }

Vec decode(const st::Tensor& t) {
  Vec v(static_cast<size_t>(t.numel()));
  for (size_t i = 0; i < v.size(); ++i) {
    if (t.dtype == st::Dtype::BF16 || t.dtype == st::Dtype::F16) {
      uint16_t h;
      std::memcpy(&h, t.data + 2 * i, 2);
      v[i] = t.dtype == st::Dtype::BF16 ? bf16_bits_to_double(h) : f16_bits_to_double(h);
    } else if (t.dtype == st::Dtype::F32) {
      float f;
      std::memcpy(&f, t.data + 4 * i, 4);
      v[i] = f;
    } else {
      die("tensor " + t.name + ": unexpected dtype");
    }
  }
  return v;
}

// y = W x for W [rows, cols] row-major
Vec matvec(const Vec& W, int64_t rows, int64_t cols, const double* x) {
  Vec y(static_cast<size_t>(rows), 0.0);
  for (int64_t r = 0; r < rows; ++r) {
    double s = 0;
    const double* w = W.data() + r * cols;
    for (int64_t c = 0; c < cols; ++c) s += w[c] * x[c];
    y[size_t(r)] = s;
  }
  return y;
}

Vec rmsnorm(const double* x, int64_t n, const Vec& w, double eps) {
  double ss = 0;
  for (int64_t i = 0; i < n; ++i) ss += x[i] * x[i];
  const double k = 1.0 / std::sqrt(ss / double(n) + eps);
  Vec y(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) y[size_t(i)] = w[size_t(i)] * x[i] * k;
  return y;
}

}  // namespace

struct DsparkRef::Impl {
  int64_t d, L, H, q_lora, r, nope, rope, v, ff, V, rank, B, n_tap, d_t, mask;
  double eps, theta, factor = 1, orig = 0, beta_fast = 32, beta_slow = 1, mscale = 1, mscale_all = 0;
  Vec embed, head, cproj, cnorm, fnorm, w1, w2;
  struct Layer {
    Vec in_norm, q_a, q_a_norm, q_b, kv_a, kv_a_norm, kv_b, o, post_norm, gate, up, down;
  };
  std::vector<Layer> layers;
  Vec freq;  // per rope pair
  double mag = 1;

  // rotate the pairs (2i, 2i+1) of x[0..rope) to position pos (§3.3)
  void rope_at(double* x, int64_t pos) const {
    for (int64_t i = 0; i < rope / 2; ++i) {
      const double a = double(pos) * freq[size_t(i)], c = std::cos(a) * mag, s = std::sin(a) * mag;
      const double x0 = x[2 * i], x1 = x[2 * i + 1];
      x[2 * i] = x0 * c - x1 * s;
      x[2 * i + 1] = x0 * s + x1 * c;
    }
  }

  // the latent row [c | k_pe] of layer l for input u at position pos
  Vec latent(const Layer& l, const Vec& in, int64_t pos) const {
    Vec kv = matvec(l.kv_a, r + rope, d, in.data());
    Vec c = rmsnorm(kv.data(), r, l.kv_a_norm, eps);
    Vec row(c);
    row.insert(row.end(), kv.begin() + r, kv.end());
    rope_at(row.data() + r, pos);
    return row;
  }
};

DsparkRef::DsparkRef(std::unique_ptr<Impl> p) : p_(std::move(p)) {}
DsparkRef::DsparkRef(DsparkRef&&) noexcept = default;
DsparkRef::~DsparkRef() = default;
int64_t DsparkRef::block() const { return p_->B; }
int64_t DsparkRef::vocab() const { return p_->V; }
int64_t DsparkRef::tap_width() const { return p_->n_tap * p_->d_t; }

DsparkRef DsparkRef::load(const std::string& draft_hf, const std::string& target_hf) {
  auto p = std::make_unique<Impl>();
  Impl& m = *p;
  const HfConfig c = HfConfig::load((fs::path(draft_hf) / "config.json").string());
  m.d = c.get_int("hidden_size"), m.L = c.get_int("num_hidden_layers"), m.H = c.get_int("num_attention_heads");
  m.q_lora = c.get_int("q_lora_rank"), m.r = c.get_int("kv_lora_rank"), m.nope = c.get_int("qk_nope_head_dim");
  m.rope = c.get_int("qk_rope_head_dim"), m.v = c.get_int("v_head_dim"), m.ff = c.get_int("intermediate_size");
  m.V = c.get_int("vocab_size"), m.rank = c.get_int("markov_rank"), m.B = c.get_int_or("block_size", 7);
  m.n_tap = static_cast<int64_t>(c.get("target_layer_ids").size()), m.d_t = c.get_int("target_hidden_size");
  m.mask = c.get_int("mask_token_id");
  m.eps = c.get_float("rms_norm_eps");
  m.theta = c.get_float_or("rope_theta", 10000.0);
  if (c.has("rope_parameters")) {
    const auto& rp = c.get("rope_parameters");
    if (rp.contains("rope_theta")) m.theta = rp["rope_theta"].get<double>();
    if (rp.value("rope_type", std::string("default")) == "yarn") {
      m.factor = rp.value("factor", 1.0);
      m.orig = rp.value("original_max_position_embeddings", 0.0);
      m.beta_fast = rp.value("beta_fast", 32.0), m.beta_slow = rp.value("beta_slow", 1.0);
      m.mscale = rp.value("mscale", 1.0), m.mscale_all = rp.value("mscale_all_dim", 0.0);
    }
  }
  // YaRN frequencies (§3.3)
  const double D = double(m.rope);
  m.freq.resize(size_t(m.rope / 2));
  for (int64_t i = 0; i < m.rope / 2; ++i) m.freq[size_t(i)] = 1.0 / std::pow(m.theta, 2.0 * double(i) / D);
  auto ms = [](double s, double k) { return s <= 1.0 ? 1.0 : 0.1 * k * std::log(s) + 1.0; };
  if (m.factor > 1.0) {
    const double pi = 3.14159265358979323846;
    auto corr = [&](double nr) { return D * std::log(m.orig / (nr * 2.0 * pi)) / (2.0 * std::log(m.theta)); };
    const double lo = std::max(std::floor(corr(m.beta_fast)), 0.0);
    double hi = std::min(std::ceil(corr(m.beta_slow)), D - 1.0);
    if (lo == hi) hi += 0.001;
    for (int64_t i = 0; i < m.rope / 2; ++i) {
      double ramp = (double(i) - lo) / (hi - lo);
      ramp = ramp < 0 ? 0 : ramp > 1 ? 1 : ramp;
      const double keep = 1.0 - ramp;  // share of the original (extrapolated) frequency
      m.freq[size_t(i)] = m.freq[size_t(i)] / m.factor * (1.0 - keep) + m.freq[size_t(i)] * keep;
    }
    m.mag = ms(m.factor, m.mscale) / ms(m.factor, m.mscale_all);
  }

  auto ck = st::Checkpoint::open(draft_hf);
  auto get = [&](const std::string& n, std::vector<int64_t> shape) {
    const st::Tensor& t = ck->get(n);
    if (t.shape != shape) die(n + ": shape " + t.shape_string());
    return decode(t);
  };
  m.cproj = get("context_proj.weight", {m.d, m.n_tap * m.d_t});
  m.cnorm = get("context_norm.weight", {m.d});
  m.fnorm = get("final_norm.weight", {m.d});
  m.w1 = get("markov_head.markov_w1.weight", {m.V, m.rank});
  m.w2 = get("markov_head.markov_w2.weight", {m.V, m.rank});
  for (int64_t l = 0; l < m.L; ++l) {
    const std::string s = "layers." + std::to_string(l) + ".";
    Impl::Layer y;
    y.in_norm = get(s + "input_layernorm.weight", {m.d});
    y.q_a = get(s + "self_attn.q_a_proj.weight", {m.q_lora, m.d});
    y.q_a_norm = get(s + "self_attn.q_a_layernorm.weight", {m.q_lora});
    y.q_b = get(s + "self_attn.q_b_proj.weight", {m.H * (m.nope + m.rope), m.q_lora});
    y.kv_a = get(s + "self_attn.kv_a_proj_with_mqa.weight", {m.r + m.rope, m.d});
    y.kv_a_norm = get(s + "self_attn.kv_a_layernorm.weight", {m.r});
    y.kv_b = get(s + "self_attn.kv_b_proj.weight", {m.H * (m.nope + m.v), m.r});
    y.o = get(s + "self_attn.o_proj.weight", {m.d, m.H * m.v});
    y.post_norm = get(s + "post_attention_layernorm.weight", {m.d});
    y.gate = get(s + "mlp.gate_proj.weight", {m.ff, m.d});
    y.up = get(s + "mlp.up_proj.weight", {m.ff, m.d});
    y.down = get(s + "mlp.down_proj.weight", {m.d, m.ff});
    m.layers.push_back(std::move(y));
  }
  auto tk = st::Checkpoint::open(target_hf);
  m.embed = decode(tk->get("language_model.model.embed_tokens.weight"));
  m.head = decode(tk->get("language_model.lm_head.weight"));
  if (m.embed.size() != size_t(m.V * m.d) || m.head.size() != size_t(m.V * m.d)) die("target embedding/head size");
  return DsparkRef(std::move(p));
}

std::vector<double> DsparkRef::markov_bias(int32_t prev) const {
  const Impl& m = *p_;
  return matvec(m.w2, m.V, m.rank, m.w1.data() + int64_t(prev) * m.rank);
}

std::vector<std::vector<double>> DsparkRef::block_logits(const std::vector<std::vector<double>>& taps,
                                                         int32_t anchor) const {
  const Impl& m = *p_;
  const int64_t Lc = static_cast<int64_t>(taps.size()), B = m.B, W = m.nope + m.rope;
  // context hidden per position (§3.1): RMSNorm(W_cp x; context_norm)
  std::vector<Vec> ctx;
  for (auto& t : taps) {
    if (int64_t(t.size()) != m.n_tap * m.d_t) die("tap row width");
    Vec h = matvec(m.cproj, m.d, m.n_tap * m.d_t, t.data());
    ctx.push_back(rmsnorm(h.data(), m.d, m.cnorm, m.eps));
  }
  // block input rows (§3.2)
  std::vector<Vec> x(static_cast<size_t>(B));
  for (int64_t j = 0; j < B; ++j) {
    const int64_t tok = j == 0 ? anchor : m.mask;
    x[size_t(j)].assign(m.embed.begin() + tok * m.d, m.embed.begin() + (tok + 1) * m.d);
  }
  const double mall = m.factor > 1.0 ? 0.1 * m.mscale_all * std::log(m.factor) + 1.0 : 1.0;
  const double scale = mall * mall / std::sqrt(double(W));
  for (const auto& l : m.layers) {
    // rows: the context rows, then the block rows (un-absorbed keys and values from each)
    std::vector<Vec> rows;
    for (int64_t p = 0; p < Lc; ++p) rows.push_back(m.latent(l, ctx[size_t(p)], p));
    std::vector<Vec> y(static_cast<size_t>(B)), q(static_cast<size_t>(B));
    for (int64_t j = 0; j < B; ++j) {
      y[size_t(j)] = rmsnorm(x[size_t(j)].data(), m.d, l.in_norm, m.eps);
      Vec qa = matvec(l.q_a, m.q_lora, m.d, y[size_t(j)].data());
      Vec cq = rmsnorm(qa.data(), m.q_lora, l.q_a_norm, m.eps);
      q[size_t(j)] = matvec(l.q_b, m.H * W, m.q_lora, cq.data());
      for (int64_t h = 0; h < m.H; ++h) m.rope_at(q[size_t(j)].data() + h * W + m.nope, Lc + j);
      rows.push_back(m.latent(l, y[size_t(j)], Lc + j));
    }
    const int64_t S = static_cast<int64_t>(rows.size());
    // per-head keys and values of every row: k = [W_kb c | k_pe], v = W_vb c
    std::vector<Vec> K(static_cast<size_t>(S)), Vv(static_cast<size_t>(S));
    for (int64_t s = 0; s < S; ++s) {
      Vec kv = matvec(l.kv_b, m.H * (m.nope + m.v), m.r, rows[size_t(s)].data());
      K[size_t(s)].resize(size_t(m.H * W));
      Vv[size_t(s)].resize(size_t(m.H * m.v));
      for (int64_t h = 0; h < m.H; ++h) {
        for (int64_t i = 0; i < m.nope; ++i) K[size_t(s)][size_t(h * W + i)] = kv[size_t(h * (m.nope + m.v) + i)];
        for (int64_t i = 0; i < m.rope; ++i) K[size_t(s)][size_t(h * W + m.nope + i)] = rows[size_t(s)][size_t(m.r + i)];
        for (int64_t i = 0; i < m.v; ++i)
          Vv[size_t(s)][size_t(h * m.v + i)] = kv[size_t(h * (m.nope + m.v) + m.nope + i)];
      }
    }
    for (int64_t j = 0; j < B; ++j) {
      Vec att(static_cast<size_t>(m.H * m.v), 0.0);
      for (int64_t h = 0; h < m.H; ++h) {
        Vec e(static_cast<size_t>(S));
        double mx = -1e300;
        for (int64_t s = 0; s < S; ++s) {  // every context row and every block row (non-causal)
          double dot = 0;
          for (int64_t i = 0; i < W; ++i) dot += q[size_t(j)][size_t(h * W + i)] * K[size_t(s)][size_t(h * W + i)];
          e[size_t(s)] = scale * dot;
          mx = std::max(mx, e[size_t(s)]);
        }
        double sum = 0;
        for (auto& a : e) sum += (a = std::exp(a - mx));
        for (int64_t s = 0; s < S; ++s)
          for (int64_t i = 0; i < m.v; ++i)
            att[size_t(h * m.v + i)] += e[size_t(s)] / sum * Vv[size_t(s)][size_t(h * m.v + i)];
      }
      Vec o = matvec(l.o, m.d, m.H * m.v, att.data());
      for (int64_t i = 0; i < m.d; ++i) x[size_t(j)][size_t(i)] += o[size_t(i)];
      Vec y2 = rmsnorm(x[size_t(j)].data(), m.d, l.post_norm, m.eps);
      Vec g = matvec(l.gate, m.ff, m.d, y2.data()), u = matvec(l.up, m.ff, m.d, y2.data());
      for (int64_t i = 0; i < m.ff; ++i) g[size_t(i)] = g[size_t(i)] / (1.0 + std::exp(-g[size_t(i)])) * u[size_t(i)];
      Vec dn = matvec(l.down, m.d, m.ff, g.data());
      for (int64_t i = 0; i < m.d; ++i) x[size_t(j)][size_t(i)] += dn[size_t(i)];
    }
  }
  std::vector<Vec> z;
  for (int64_t j = 0; j < B; ++j) {
    Vec h = rmsnorm(x[size_t(j)].data(), m.d, m.fnorm, m.eps);
    z.push_back(matvec(m.head, m.V, m.d, h.data()));  // the target's output matrix, no target norm
  }
  return z;
}

}  // namespace kimi::ref
