// Float64 reference of docs/spec/vision.md §3 (see ref_vision.h).
#include "ref/ref_vision.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <map>
#include <stdexcept>

#include "io/hf_config.h"
#include "io/safetensors.h"
#include "ref/reference.h"

namespace kimi::ref {

RefNavit ref_navit(int64_t width, int64_t height) {
  const int64_t P = 14, limit = 65536, side = 512, factor = 28;
  const double s1 = std::sqrt(double(limit) / (std::max(1.0, double(width / P)) * std::max(1.0, double(height / P))));
  const double scale = std::min(std::min(1.0, s1), std::min(double(side * P) / double(width), double(side * P) / double(height)));
  RefNavit r;
  r.new_w = std::min<int64_t>(std::max<int64_t>(1, int64_t(double(width) * scale)), side * P);
  r.new_h = std::min<int64_t>(std::max<int64_t>(1, int64_t(double(height) * scale)), side * P);
  r.pad_w = (factor - r.new_w % factor) % factor;
  r.pad_h = (factor - r.new_h % factor) % factor;
  r.gw = (r.new_w + r.pad_w) / P;
  r.gh = (r.new_h + r.pad_h) / P;
  r.tokens = r.gw * r.gh / 4;
  return r;
}

namespace {

double cubic(double x) {  // a = -0.5
  x = std::fabs(x);
  if (x < 1) return 1.5 * x * x * x - 2.5 * x * x + 1;
  if (x < 2) return -0.5 * x * x * x + 2.5 * x * x - 4 * x + 2;
  return 0;
}

// one 1-D pass over `count` lines of `n_in` samples (stride between samples `step`, between lines `line`)
std::vector<uint8_t> pass(const std::vector<uint8_t>& src, int64_t n_in, int64_t n_out, int64_t lines,
                          bool horizontal, int64_t w) {
  // output image: horizontal -> n_out x lines, vertical -> w x n_out
  std::vector<uint8_t> dst(static_cast<size_t>((horizontal ? n_out * lines : w * n_out) * 3));
  const double scale = double(n_in) / double(n_out), fs = scale > 1 ? scale : 1.0, support = 2 * fs;
  for (int64_t o = 0; o < n_out; ++o) {
    const double c = (o + 0.5) * scale;
    const int64_t lo = std::max<int64_t>(0, int64_t(c - support + 0.5));
    const int64_t hi = std::min<int64_t>(n_in, int64_t(c + support + 0.5));
    std::vector<double> wt;
    double total = 0;
    for (int64_t j = lo; j < hi; ++j) {
      wt.push_back(cubic((j - c + 0.5) / fs));
      total += wt.back();
    }
    std::vector<int64_t> k;
    for (double x : wt) {
      const double v = (total != 0 ? x / total : x) * 4194304.0;  // 2^22
      k.push_back(v < 0 ? int64_t(v - 0.5) : int64_t(v + 0.5));
    }
    for (int64_t l = 0; l < lines; ++l)
      for (int ch = 0; ch < 3; ++ch) {
        int64_t acc = 2097152;  // 2^21
        for (size_t j = 0; j < k.size(); ++j) {
          const int64_t s = lo + int64_t(j);
          const int64_t idx = horizontal ? (l * n_in + s) * 3 + ch : (s * w + l) * 3 + ch;
          acc += k[j] * src[static_cast<size_t>(idx)];
        }
        int64_t v = acc >> 22;  // arithmetic shift (floor)
        v = v < 0 ? 0 : v > 255 ? 255 : v;
        const int64_t di = horizontal ? (l * n_out + o) * 3 + ch : (o * w + l) * 3 + ch;
        dst[static_cast<size_t>(di)] = uint8_t(v);
      }
  }
  return dst;
}

}  // namespace

std::vector<uint8_t> ref_resize(const std::vector<uint8_t>& rgb, int64_t w, int64_t h, int64_t nw, int64_t nh) {
  std::vector<uint8_t> cur = rgb;
  if (nw != w) cur = pass(cur, w, nw, h, true, 0);
  if (nh != h) cur = pass(cur, h, nh, nw, false, nw);
  return cur;
}

RefImage ref_preprocess(const std::vector<uint8_t>& rgb, int64_t w, int64_t h) {
  RefImage im;
  im.size = ref_navit(w, h);
  const RefNavit& s = im.size;
  const std::vector<uint8_t> r = ref_resize(rgb, w, h, s.new_w, s.new_h);
  const int64_t P = 14;
  for (int64_t gy = 0; gy < s.gh; ++gy)
    for (int64_t gx = 0; gx < s.gw; ++gx) {
      std::vector<double> p;
      for (int c = 0; c < 3; ++c)
        for (int64_t py = 0; py < P; ++py)
          for (int64_t px = 0; px < P; ++px) {
            const int64_t y = gy * P + py, x = gx * P + px;
            const double v = (y < s.new_h && x < s.new_w) ? r[static_cast<size_t>((y * s.new_w + x) * 3 + c)] : 0;
            p.push_back((v / 255.0 - 0.5) / 0.5);
          }
      im.patches.push_back(std::move(p));
    }
  return im;
}

struct RefVision::Impl {
  int64_t W = 0, Q = 0, H = 0, F = 0, B = 0, gh0 = 0, gw0 = 0, T = 0, P = 14;
  double proj_eps = 1e-5;
  std::map<std::string, std::vector<double>> w;
  const std::vector<double>& t(const std::string& n) const {
    auto it = w.find(n);
    if (it == w.end()) throw std::runtime_error("ref vision: tensor " + n + " missing");
    return it->second;
  }
};

RefVision::RefVision(RefVision&&) noexcept = default;
RefVision::~RefVision() = default;
int64_t RefVision::text_hidden() const { return impl_->T; }

RefVision RefVision::load(const std::string& hf_dir) {
  RefVision r;
  r.impl_ = std::make_unique<Impl>();
  Impl& m = *r.impl_;
  HfConfig cfg = HfConfig::load(hf_dir + "/config.json");
  const auto& vc = cfg.get("vision_config");
  m.W = vc["vt_hidden_size"].get<int64_t>();
  m.Q = vc["qkv_hidden_size"].get<int64_t>();
  m.H = vc["vt_num_attention_heads"].get<int64_t>();
  m.F = vc["vt_intermediate_size"].get<int64_t>();
  m.B = vc["vt_num_hidden_layers"].get<int64_t>();
  m.gh0 = vc["init_pos_emb_height"].get<int64_t>();
  m.gw0 = vc["init_pos_emb_width"].get<int64_t>();
  m.P = vc["patch_size"].get<int64_t>();
  m.T = cfg.get_int("hidden_size");
  if (vc.contains("projector_ln_eps")) m.proj_eps = vc["projector_ln_eps"].get<double>();
  auto ck = st::Checkpoint::open(hf_dir);
  for (const std::string& n : ck->names()) {
    if (n.rfind("vision_tower.", 0) != 0 && n.rfind("mm_projector.", 0) != 0) continue;
    const st::Tensor& t = ck->get(n);
    std::vector<double> v(static_cast<size_t>(t.numel()));
    for (size_t i = 0; i < v.size(); ++i) {
      uint16_t h;
      float f;
      switch (t.dtype) {
        case st::Dtype::BF16: std::memcpy(&h, t.data + 2 * i, 2); v[i] = bf16_bits_to_double(h); break;
        case st::Dtype::F16: std::memcpy(&h, t.data + 2 * i, 2); v[i] = f16_bits_to_double(h); break;
        case st::Dtype::F32: std::memcpy(&f, t.data + 4 * i, 4); v[i] = f; break;
        default: throw std::runtime_error("ref vision: dtype of " + n);
      }
    }
    m.w[n] = std::move(v);
  }
  return r;
}

namespace {

using Mat = std::vector<std::vector<double>>;

// y = x W^T with W [out][in] row-major
Mat linear(const Mat& x, const std::vector<double>& W, int64_t out, int64_t in) {
  Mat y(x.size(), std::vector<double>(static_cast<size_t>(out)));
  for (size_t t = 0; t < x.size(); ++t)
    for (int64_t o = 0; o < out; ++o) {
      double s = 0;
      for (int64_t i = 0; i < in; ++i) s += W[static_cast<size_t>(o * in + i)] * x[t][static_cast<size_t>(i)];
      y[t][static_cast<size_t>(o)] = s;
    }
  return y;
}

void rmsnorm(Mat& x, const std::vector<double>& w, double eps) {
  for (auto& r : x) {
    double ss = 0;
    for (double v : r) ss += v * v;
    const double inv = 1.0 / std::sqrt(ss / double(r.size()) + eps);
    for (size_t i = 0; i < r.size(); ++i) r[i] = r[i] * inv * w[i];
  }
}

}  // namespace

std::vector<std::vector<double>> RefVision::forward(const std::vector<const RefImage*>& images) const {
  const Impl& m = *impl_;
  const int64_t W = m.W, Q = m.Q, H = m.H, D = Q / H, F = m.F, T = m.T, PP = 3 * m.P * m.P;
  const double eps = 1.0 / 128.0;  // 2^-7 (vision.md §1.2)
  const double pi = 3.14159265358979323846;
  Mat out;
  for (const RefImage* im : images) {  // images are independent (attention stays inside one)
    const int64_t gh = im->size.gh, gw = im->size.gw, n = gh * gw;
    // §3.2 patch embedding + the bilinear position grid
    Mat x = linear(im->patches, m.t("vision_tower.patch_embed.proj.weight"), W, PP);
    const auto& g = m.t("vision_tower.patch_embed.pos_emb.weight");  // [gh0][gw0][W]
    for (int64_t r = 0; r < gh; ++r)
      for (int64_t c = 0; c < gw; ++c) {
        double sy = (r + 0.5) * double(m.gh0) / double(gh) - 0.5, sx = (c + 0.5) * double(m.gw0) / double(gw) - 0.5;
        if (gh == m.gh0) sy = r;
        if (gw == m.gw0) sx = c;
        sy = std::max(0.0, sy), sx = std::max(0.0, sx);
        const int64_t y0 = std::min<int64_t>(int64_t(std::floor(sy)), m.gh0 - 1), x0 = std::min<int64_t>(int64_t(std::floor(sx)), m.gw0 - 1);
        const int64_t y1 = std::min(y0 + 1, m.gh0 - 1), x1 = std::min(x0 + 1, m.gw0 - 1);
        const double ly = sy - y0, lx = sx - x0;
        for (int64_t k = 0; k < W; ++k) {
          auto G = [&](int64_t y, int64_t xx) { return g[static_cast<size_t>((y * m.gw0 + xx) * W + k)]; };
          x[static_cast<size_t>(r * gw + c)][static_cast<size_t>(k)] +=
              (1 - ly) * ((1 - lx) * G(y0, x0) + lx * G(y0, x1)) + ly * ((1 - lx) * G(y1, x0) + lx * G(y1, x1));
        }
      }
    // §3.3 blocks
    for (int64_t b = 0; b < m.B; ++b) {
      const std::string p = "vision_tower.encoder.blocks." + std::to_string(b) + ".";
      Mat y = x;
      rmsnorm(y, m.t(p + "norm0.weight"), eps);
      Mat qkv = linear(y, m.t(p + "wqkv.weight"), 3 * Q, W);
      // §3.4 rotary on q and k: pair 2j by col * w_j, pair 2j+1 by row * w_j
      for (int64_t t = 0; t < n; ++t) {
        const double row = double(t / gw), col = double(t % gw);
        for (int64_t part = 0; part < 2; ++part)
          for (int64_t h = 0; h < H; ++h)
            for (int64_t pr = 0; pr < D / 2; ++pr) {
              const int64_t j = pr / 2;
              const double ang = (pr % 2 == 0 ? col : row) * std::pow(10000.0, -4.0 * double(j) / double(D));
              double& a = qkv[static_cast<size_t>(t)][static_cast<size_t>(part * Q + h * D + 2 * pr)];
              double& bb = qkv[static_cast<size_t>(t)][static_cast<size_t>(part * Q + h * D + 2 * pr + 1)];
              const double na = a * std::cos(ang) - bb * std::sin(ang), nb = a * std::sin(ang) + bb * std::cos(ang);
              a = na, bb = nb;
            }
      }
      Mat att(static_cast<size_t>(n), std::vector<double>(static_cast<size_t>(Q)));
      for (int64_t h = 0; h < H; ++h)
        for (int64_t t = 0; t < n; ++t) {
          std::vector<double> sc(static_cast<size_t>(n));
          double mx = -1e300;
          for (int64_t s = 0; s < n; ++s) {
            double d = 0;
            for (int64_t i = 0; i < D; ++i)
              d += qkv[static_cast<size_t>(t)][static_cast<size_t>(h * D + i)] * qkv[static_cast<size_t>(s)][static_cast<size_t>(Q + h * D + i)];
            sc[static_cast<size_t>(s)] = d / std::sqrt(double(D));
            mx = std::max(mx, sc[static_cast<size_t>(s)]);
          }
          double z = 0;
          for (auto& v : sc) z += (v = std::exp(v - mx));
          for (int64_t s = 0; s < n; ++s)
            for (int64_t i = 0; i < D; ++i)
              att[static_cast<size_t>(t)][static_cast<size_t>(h * D + i)] +=
                  sc[static_cast<size_t>(s)] / z * qkv[static_cast<size_t>(s)][static_cast<size_t>(2 * Q + h * D + i)];
        }
      Mat o = linear(att, m.t(p + "wo.weight"), W, Q);
      for (int64_t t = 0; t < n; ++t)
        for (int64_t k = 0; k < W; ++k) x[static_cast<size_t>(t)][static_cast<size_t>(k)] += o[static_cast<size_t>(t)][static_cast<size_t>(k)];
      y = x;
      rmsnorm(y, m.t(p + "norm1.weight"), eps);
      Mat u = linear(y, m.t(p + "mlp.fc0.weight"), F, W);
      for (auto& r : u)
        for (double& v : r) v = 0.5 * v * (1 + std::tanh(std::sqrt(2 / pi) * (v + 0.044715 * v * v * v)));
      Mat dn = linear(u, m.t(p + "mlp.fc1.weight"), W, F);
      for (int64_t t = 0; t < n; ++t)
        for (int64_t k = 0; k < W; ++k) x[static_cast<size_t>(t)][static_cast<size_t>(k)] += dn[static_cast<size_t>(t)][static_cast<size_t>(k)];
    }
    rmsnorm(x, m.t("vision_tower.encoder.final_layernorm.weight"), eps);
    // §3.5 merge, §3.6 projector
    Mat mg;
    for (int64_t R = 0; R < gh / 2; ++R)
      for (int64_t C = 0; C < gw / 2; ++C) {
        std::vector<double> row;
        for (int64_t dy = 0; dy < 2; ++dy)
          for (int64_t dx = 0; dx < 2; ++dx) {
            const auto& src = x[static_cast<size_t>((2 * R + dy) * gw + 2 * C + dx)];
            row.insert(row.end(), src.begin(), src.end());
          }
        mg.push_back(std::move(row));
      }
    Mat h1 = linear(mg, m.t("mm_projector.proj.0.weight"), 4 * W, 4 * W);
    for (auto& r : h1)
      for (double& v : r) v = 0.5 * v * (1 + std::erf(v / std::sqrt(2.0)));
    Mat o = linear(h1, m.t("mm_projector.proj.2.weight"), T, 4 * W);
    rmsnorm(o, m.t("mm_projector.post_norm.weight"), m.proj_eps);
    out.insert(out.end(), o.begin(), o.end());
  }
  return out;
}

}  // namespace kimi::ref
