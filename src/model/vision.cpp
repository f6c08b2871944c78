// The MoonViT3D tower (docs/spec/vision.md §3.2-§3.6) through the Backend interface.
#include "model/vision.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstring>

#include "io/moonvit_names.h"
#include "util/error.h"

namespace kimi {

namespace {

bool float_type(GgmlType t) { return t == GgmlType::F32 || t == GgmlType::F16 || t == GgmlType::BF16; }

}  // namespace

std::unique_ptr<VisionModel> VisionModel::load(const std::string& path, int64_t text_hidden) {
  std::unique_ptr<VisionModel> m(new VisionModel());
  m->path_ = path;
  m->rd_ = gguf::Reader::open(path);
  const gguf::Reader& r = *m->rd_;
  const gguf::Value* a = r.find("general.architecture");
  const std::string arch = a && a->type == gguf::ValueType::STRING ? a->s : std::string();
  check(arch == moonvit::kArch,
        "{}: general.architecture is '{}', not '{}': not a vision projector file (kimi convert writes one next to "
        "the text model, docs/spec/vision.md §2.2)",
        path, arch.empty() ? "(missing)" : arch, moonvit::kArch);
  VisionHParams& hp = m->hp_;
  auto u = [&](const char* k, int64_t lo, int64_t hi) {
    const std::string key = moonvit::key(k);
    const int64_t v = r.get_u32(key);
    check(v >= lo && v <= hi, "{}: {} = {} (expected {}..{})", path, key, v, lo, hi);
    return v;
  };
  hp.patch = u(moonvit::kPatchSize, 1, 64);
  hp.width = u(moonvit::kWidth, 1, 1 << 16);
  hp.qkv = u(moonvit::kQkv, 1, 1 << 16);
  hp.heads = u(moonvit::kHeads, 1, 1024);
  hp.ff = u(moonvit::kFf, 1, 1 << 18);
  hp.blocks = u(moonvit::kBlocks, 1, 1024);
  hp.grid_h = u(moonvit::kGridH, 1, 4096);
  hp.grid_w = u(moonvit::kGridW, 1, 4096);
  hp.merge = u(moonvit::kMerge, 2, 2);
  hp.text_hidden = u(moonvit::kTextHidden, 1, 1 << 18);
  hp.placeholder = static_cast<int32_t>(u(moonvit::kPlaceholder, 0, INT32_MAX));
  hp.patch_limit = r.get_u32_or(moonvit::key(moonvit::kPatchLimit), 65536);
  hp.side_patch_limit = r.get_u32_or(moonvit::key(moonvit::kSidePatchLimit), 512);
  check(hp.patch_limit >= 4 && hp.side_patch_limit >= 2 && hp.side_patch_limit <= 4096,
        "{}: image limits {} patches / {} a side out of range", path, hp.patch_limit, hp.side_patch_limit);
  hp.eps = r.get_f32(moonvit::key(moonvit::kEps));
  hp.proj_eps = r.get_f32(moonvit::key(moonvit::kProjEps));
  check(hp.eps > 0 && hp.proj_eps > 0, "{}: norm epsilons must be positive", path);
  check(hp.qkv % hp.heads == 0 && (hp.qkv / hp.heads) % 4 == 0 && hp.qkv / hp.heads <= 512,
        "{}: {} = {} does not split into {} heads of a multiple of 4 values (at most 512)", path,
        moonvit::key(moonvit::kQkv), hp.qkv, hp.heads);
  hp.head_dim = hp.qkv / hp.heads;
  if (text_hidden > 0)
    check(hp.text_hidden == text_hidden,
          "{}: the projector makes rows of {} values but the text model's hidden size is {} (a projector of "
          "another model?)",
          path, hp.text_hidden, text_hidden);

  auto t = [&](const std::string& name, std::vector<int64_t> ne, bool matrix) {
    const gguf::TensorInfo* ti = r.find_tensor(name);
    check(ti != nullptr, "{}: tensor '{}' missing", path, name);
    std::array<int64_t, 4> want{1, 1, 1, 1};
    for (size_t i = 0; i < ne.size(); ++i) want[i] = ne[i];
    check(ti->ne == want, "{}: tensor '{}' has shape {} but the moonvit3d keys imply {{{}}}", path, name,
          ti->shape_string(), fmt::join(ne, ", "));
    if (matrix)
      check(float_type(ti->type) || ti->type == GgmlType::Q8_0, "{}: tensor '{}' of type {} (expected F32, F16, "
            "BF16 or Q8_0)", path, name, type_name(ti->type));
    else
      check(ti->type == GgmlType::F32, "{}: tensor '{}' of type {} (expected F32)", path, name, type_name(ti->type));
    return ti;
  };
  const int64_t W = hp.width, Q = hp.qkv, F = hp.ff, P = hp.patch, T = hp.text_hidden;
  m->patch_embd = t(moonvit::kPatchEmbd, {3 * P * P, W}, true);
  m->pos_embd = t(moonvit::kPosEmbd, {W, hp.grid_w, hp.grid_h}, false);
  for (int64_t b = 0; b < hp.blocks; ++b)
    m->blocks.push_back({t(moonvit::blk(b, "ln1.weight"), {W}, false), t(moonvit::blk(b, "attn_qkv.weight"), {W, 3 * Q}, true),
                         t(moonvit::blk(b, "attn_out.weight"), {Q, W}, true), t(moonvit::blk(b, "ln2.weight"), {W}, false),
                         t(moonvit::blk(b, "ffn_up.weight"), {W, F}, true), t(moonvit::blk(b, "ffn_down.weight"), {F, W}, true)});
  m->post_norm = t(moonvit::kPostNorm, {W}, false);
  m->mm1 = t(moonvit::kMm1, {4 * W, 4 * W}, true);
  m->mm2 = t(moonvit::kMm2, {4 * W, T}, true);
  m->mm_norm = t(moonvit::kMmNorm, {T}, false);
  const size_t expected = 2 + 6 * static_cast<size_t>(hp.blocks) + 4;
  check(r.tensors().size() == expected, "{}: {} tensors, but a {}-block tower has {}", path, r.tensors().size(),
        hp.blocks, expected);
  return m;
}

image::Patches VisionModel::preprocess(const image::Rgb& img) const {
  return image::preprocess(img, hp_.patch, hp_.merge, hp_.patch_limit, hp_.side_patch_limit);
}

std::vector<float> resample_pos_grid(const VisionModel& m, int64_t gh, int64_t gw) {
  const VisionHParams& hp = m.hp();
  const int64_t W = hp.width, H0 = hp.grid_h, W0 = hp.grid_w;
  const float* g = reinterpret_cast<const float*>(m.pos_embd->data);  // [H0][W0][W]
  std::vector<float> out(static_cast<size_t>(gh * gw * W));
  if (gh == H0 && gw == W0) {
    std::memcpy(out.data(), g, out.size() * 4);
    return out;
  }
  // half-pixel source index, clamped at 0 (PyTorch bilinear, align_corners=False)
  auto src = [](int64_t i, int64_t in, int64_t outn, int64_t* i0, int64_t* i1, double* l) {
    double s = (static_cast<double>(i) + 0.5) * static_cast<double>(in) / static_cast<double>(outn) - 0.5;
    if (s < 0) s = 0;
    *i0 = std::min<int64_t>(static_cast<int64_t>(s), in - 1);
    *i1 = std::min<int64_t>(*i0 + 1, in - 1);
    *l = s - static_cast<double>(*i0);
  };
  for (int64_t r = 0; r < gh; ++r) {
    int64_t y0, y1;
    double ly;
    src(r, H0, gh, &y0, &y1, &ly);
    for (int64_t c = 0; c < gw; ++c) {
      int64_t x0, x1;
      double lx;
      src(c, W0, gw, &x0, &x1, &lx);
      const float* a = g + (y0 * W0 + x0) * W;
      const float* b = g + (y0 * W0 + x1) * W;
      const float* cc = g + (y1 * W0 + x0) * W;
      const float* d = g + (y1 * W0 + x1) * W;
      float* o = out.data() + (r * gw + c) * W;
      for (int64_t k = 0; k < W; ++k)
        o[k] = static_cast<float>((1 - ly) * ((1 - lx) * a[k] + lx * b[k]) + ly * ((1 - lx) * cc[k] + lx * d[k]));
    }
  }
  return out;
}

VisionEncoder::W VisionEncoder::place(const gguf::TensorInfo* t) {
  W w;
  const uint8_t* p = be_.place_weight(t->name, t->data, t->nbytes);
  w.mat.type = t->type;
  w.mat.data = p;
  w.mat.cols = t->ne[0];
  w.mat.rows = t->ne[1] * t->ne[2] * t->ne[3];
  w.mat.row_bytes = row_bytes(t->type, static_cast<uint64_t>(t->ne[0]));
  w.f32 = t->type == GgmlType::F32 ? reinterpret_cast<const float*>(p) : nullptr;
  return w;
}

VisionEncoder::VisionEncoder(const VisionModel& m, Backend& be) : m_(m), be_(be) {
  patch_ = place(m.patch_embd);
  for (const auto& b : m.blocks)
    blk_.push_back({place(b.ln1), place(b.qkv), place(b.out), place(b.ln2), place(b.up), place(b.down)});
  post_ = place(m.post_norm);
  mm1_ = place(m.mm1);
  mm2_ = place(m.mm2);
  mmn_ = place(m.mm_norm);
}

std::vector<float> VisionEncoder::encode(const std::vector<const image::Patches*>& images,
                                         const std::atomic<bool>* cancel) {
  const VisionHParams& hp = m_.hp();
  const int64_t P = hp.patch, PP = 3 * P * P, W = hp.width, Q = hp.qkv, F = hp.ff, T = hp.text_hidden;
  const int64_t H = hp.heads, D = hp.head_dim;
  std::vector<int64_t> seg{0};
  int64_t Np = 0, Nt = 0;
  for (const image::Patches* im : images) {
    check(im->patch == P && im->size.gh % 2 == 0 && im->size.gw % 2 == 0 &&
              static_cast<int64_t>(im->values.size()) == im->size.gh * im->size.gw * PP,
          "vision: image patches of size {} on a {}x{} grid do not fit the tower (patch {})", im->patch, im->size.gh,
          im->size.gw, P);
    Np += im->size.gh * im->size.gw;
    Nt += im->size.gh * im->size.gw / 4;
    seg.push_back(Np);
  }
  if (Np == 0) return {};
  auto alloc = [&](int64_t floats, const char* what) { return be_.alloc(static_cast<uint64_t>(floats) * 4, what); };
  auto xin = alloc(Np * PP, "vision patches");
  auto x = alloc(Np * W, "vision stream");
  auto y = alloc(Np * W, "vision normed");
  auto tmp = alloc(Np * W, "vision part output");
  auto qkv = alloc(Np * 3 * Q, "vision qkv");
  auto att = alloc(Np * Q, "vision attention");
  auto hid = alloc(Np * std::max(F, W), "vision mlp");
  auto h1 = alloc(Nt * 4 * W, "vision projector hidden");
  auto out = alloc(Nt * T, "vision projector output");
  auto f = [](std::unique_ptr<Buffer>& b) { return static_cast<float*>(b->data()); };

  // patches, and the host-side inputs: position grid, rotary positions, merge order
  std::vector<float> pos(static_cast<size_t>(Np * W));
  std::vector<int32_t> prow(static_cast<size_t>(Np)), pcol(static_cast<size_t>(Np)), merge;
  merge.reserve(static_cast<size_t>(Np));
  int64_t base = 0;
  for (const image::Patches* im : images) {
    const int64_t gh = im->size.gh, gw = im->size.gw;
    be_.upload(f(xin) + base * PP, im->values.data(), im->values.size() * 4);
    const std::vector<float> g = resample_pos_grid(m_, gh, gw);
    std::memcpy(pos.data() + base * W, g.data(), g.size() * 4);
    for (int64_t r = 0; r < gh; ++r)
      for (int64_t c = 0; c < gw; ++c) {
        prow[static_cast<size_t>(base + r * gw + c)] = static_cast<int32_t>(r);
        pcol[static_cast<size_t>(base + r * gw + c)] = static_cast<int32_t>(c);
      }
    for (int64_t R = 0; R < gh / 2; ++R)
      for (int64_t C = 0; C < gw / 2; ++C)
        for (int64_t dy = 0; dy < 2; ++dy)
          for (int64_t dx = 0; dx < 2; ++dx) merge.push_back(static_cast<int32_t>(base + (2 * R + dy) * gw + 2 * C + dx));
    base += gh * gw;
  }

  // §3.2 patch + position embedding
  be_.matmul(patch_.mat, f(xin), Np, f(x));
  be_.upload(f(tmp), pos.data(), pos.size() * 4);
  be_.add(f(x), f(tmp), Np * W);
  // §3.3 blocks
  const float scale = 1.0f / std::sqrt(static_cast<float>(D));
  for (const B& b : blk_) {
    if (cancel && cancel->load(std::memory_order_relaxed)) {
      be_.sync();  // nothing recorded may still use the buffers freed on the way out
      throw Error("vision: cancelled");
    }
    be_.rms_norm_rows(f(x), W, b.ln1.f32, f(y), W, Np, W, hp.eps);
    be_.matmul(b.qkv.mat, f(y), Np, f(qkv));
    be_.rope_2d(f(qkv), 3 * Q, Np, H, D, prow.data(), pcol.data(), hp.rope_theta);
    be_.rope_2d(f(qkv) + Q, 3 * Q, Np, H, D, prow.data(), pcol.data(), hp.rope_theta);
    be_.segment_attention(f(qkv), 3 * Q, Np, H, D, seg.data(), static_cast<int64_t>(images.size()), scale, f(att));
    be_.matmul(b.out.mat, f(att), Np, f(tmp));
    be_.add(f(x), f(tmp), Np * W);
    be_.rms_norm_rows(f(x), W, b.ln2.f32, f(y), W, Np, W, hp.eps);
    be_.matmul(b.up.mat, f(y), Np, f(hid));
    be_.gelu(f(hid), Np * F, true);
    be_.matmul(b.down.mat, f(hid), Np, f(tmp));
    be_.add(f(x), f(tmp), Np * W);
  }
  be_.rms_norm_rows(f(x), W, post_.f32, f(y), W, Np, W, hp.eps);
  // §3.5 sd2_tpool merger (one frame): 2x2 groups concatenated
  be_.gather_rows(f(y), W, merge.data(), Np, f(hid));
  // §3.6 patchmergerv2
  be_.matmul(mm1_.mat, f(hid), Nt, f(h1));
  be_.gelu(f(h1), Nt * 4 * W, false);
  be_.matmul(mm2_.mat, f(h1), Nt, f(out));
  be_.rms_norm_rows(f(out), T, mmn_.f32, f(out), T, Nt, T, hp.proj_eps);
  be_.sync();
  std::vector<float> rows(static_cast<size_t>(Nt * T));
  be_.download(rows.data(), f(out), rows.size() * 4);
  return rows;
}

}  // namespace kimi
