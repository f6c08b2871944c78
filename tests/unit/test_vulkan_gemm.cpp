// The Vulkan backend's prefill kernels against the CPU backend in f32: the tiled GEMM
// (mm_tiled.comp) for every weight type at odd sizes and batch sizes around the GEMM/row-kernel
// switch, the per-head (z-sliced) form, and the routed experts grouped per expert (moe_sort.comp +
// grouped GEMM) against the CPU and against the ungrouped per-pair path.
#include "unit/vulkan_fixture.h"

#include "tensor/quants.h"
#include "tensor/types.h"

using namespace kimi;
using kimi::test::rel_rms;
using kimi::test::random_floats;
using kimi::test::kTypes;
using kimi::test::make_weight;

namespace {

// columns that are not a multiple of the GEMM's 32-column step where the type allows it
int64_t odd_cols(GgmlType t) {
  if (t == GgmlType::F32 || t == GgmlType::F16 || t == GgmlType::BF16) return 203;
  if (t == GgmlType::Q4_K || t == GgmlType::Q5_K || t == GgmlType::Q6_K || t == GgmlType::Q2_K ||
      t == GgmlType::Q3_K || t == GgmlType::IQ4_XS)
    return 512;
  return 96;
}

// a Vulkan backend with KIMI_VULKAN_GEMM_MIN set to `gemm_min` (0: the default switch)
std::unique_ptr<Backend> vulkan_with(int64_t gemm_min) {
  if (gemm_min > 0) ::setenv("KIMI_VULKAN_GEMM_MIN", std::to_string(gemm_min).c_str(), 1);
  auto b = make_vulkan_backend(test::first_vulkan_device(), Precision::F32);
  ::unsetenv("KIMI_VULKAN_GEMM_MIN");
  return b;
}

}  // namespace

using VulkanGemm = kimi::test::VulkanOps;

// Every weight type, 70 rows (a full and a partial 64-row block) x odd columns, against the CPU:
// with the default switch (16 tokens) at n = 15, 16 and 33 (a partial second 32-token block),
// and with the GEMM forced for every n (KIMI_VULKAN_GEMM_MIN=1) at n = 1 and 5. The f32 sums are
// one ordered sum per output in both kernels: agreement with the CPU within rel RMS 1e-5.
TEST_F(VulkanGemm, TiledMatmulEveryTypeAroundTheSwitch) {
  auto forced = vulkan_with(1);
  uint32_t seed = 1;
  for (GgmlType t : kTypes) {
    const int64_t rows = 70, cols = odd_cols(t);
    SCOPED_TRACE(std::string(type_name(t)) + " " + std::to_string(rows) + "x" + std::to_string(cols));
    const auto bytes = make_weight(t, rows, cols, seed);
    auto w = weight(std::string("w") + std::to_string(seed), t, rows, cols, bytes);
    MatView wf = w.g;
    wf.data = forced->place_weight(std::string("w") + std::to_string(seed), host_.back().data(), bytes.size());
    for (int64_t n : {1, 5, 15, 16, 33}) {
      const auto xs = random_floats(static_cast<size_t>(n * cols), seed + 100);
      auto x = both(xs);
      auto y = zeros(static_cast<size_t>(n * rows));
      cpu_->matmul(w.c, x.cp<float>(), n, y.cp<float>());
      if (n >= 15) {
        gpu_->matmul(w.g, x.gp<float>(), n, y.gp<float>());
        auto [c, g] = read(y);
        EXPECT_LT(rel_rms(g, c), 1e-5) << "default switch, n = " << n;
      }
      if (n <= 5) {
        auto xf = forced->alloc(xs.size() * 4, "x");
        auto yf = forced->alloc(static_cast<uint64_t>(n * rows) * 4, "y");
        forced->upload(xf->data(), xs.data(), xs.size() * 4);
        forced->matmul(wf, xf->as<float>(), n, yf->as<float>());
        std::vector<float> g(static_cast<size_t>(n * rows)), c(g.size());
        forced->sync();
        forced->download(g.data(), yf->data(), g.size() * 4);
        std::memcpy(c.data(), y.c->data(), c.size() * 4);
        EXPECT_LT(rel_rms(g, c), 1e-5) << "GEMM forced, n = " << n;
      }
    }
    ++seed;
  }
}

// The per-head products of MLA through the GEMM (z = head slice of a stacked weight, strided rows).
TEST_F(VulkanGemm, TiledHeadMatmuls) {
  for (GgmlType t : {GgmlType::F32, GgmlType::Q8_0, GgmlType::Q4_K}) {
    SCOPED_TRACE(type_name(t));
    const int64_t H = 3, n = 19, kvl = 256, vd = 40;
    WorkLimits lim;
    lim.n_tokens = n;
    lim.n_heads = H;
    lim.head_io = kvl;
    lim.row = kvl;
    cpu_->reserve(lim);
    gpu_->reserve(lim);
    auto vb = make_weight(t, H * vd, kvl, 51);
    host_.push_back(vb);
    MatView vc{t, host_.back().data(), vd, kvl, row_bytes(t, kvl)};
    MatView vg = vc;
    vg.data = gpu_->place_weight(std::string("v_b.") + type_name(t), host_.back().data(), vb.size());
    auto z = both(random_floats(static_cast<size_t>(n * H * kvl), 53));
    auto o = zeros(static_cast<size_t>(n * H * vd));
    cpu_->mla_value_heads(vc, vc.row_bytes * vd, z.cp<float>(), n, H, o.cp<float>());
    gpu_->mla_value_heads(vg, vg.row_bytes * vd, z.gp<float>(), n, H, o.gp<float>());
    auto [c, g] = read(o);
    EXPECT_LT(rel_rms(g, c), 1e-5);
  }
}

// Routed experts grouped per expert (n >= the switch) against the CPU and against the per-pair
// path (the switch set above n): skewed routing so one expert gets more than one 32-slot tile,
// experts no token picks, and slots held elsewhere (expert -1) whose rows must come out zero.
TEST_F(VulkanGemm, GroupedExpertsEqualUngrouped) {
  auto pairs = vulkan_with(1 << 20);
  for (GgmlType t : {GgmlType::MXFP4, GgmlType::Q4_K}) {
    SCOPED_TRACE(type_name(t));
    const int64_t E = 9, k = 2, F = 256, Lw = 256, n = 36;
    WorkLimits lim;
    lim.n_tokens = n;
    lim.n_expert = E;
    lim.n_expert_used = k;
    lim.expert_ff = F;
    lim.expert_width = Lw;
    cpu_->reserve(lim);
    gpu_->reserve(lim);
    pairs->reserve(lim);
    struct M {
      MatView c, g, p;
    };
    auto mk = [&](const char* nm, int64_t rows, int64_t cols, uint32_t seed) {
      host_.push_back(make_weight(t, E * rows, cols, seed));
      M m;
      m.c = MatView{t, host_.back().data(), rows, cols, row_bytes(t, cols)};
      m.g = m.p = m.c;
      const std::string name = std::string(nm) + type_name(t);
      m.g.data = gpu_->place_weight(name, host_.back().data(), host_.back().size());
      m.p.data = pairs->place_weight(name, host_.back().data(), host_.back().size());
      return m;
    };
    M gt = mk("gate", F, Lw, 70), up = mk("up", F, Lw, 71), dn = mk("down", Lw, F, 72);
    const uint64_t gs = gt.c.row_bytes * F, us = up.c.row_bytes * F, ds = dn.c.row_bytes * Lw;
    ExpertMats mc{gt.c, up.c, dn.c, gs, us, ds}, mg{gt.g, up.g, dn.g, gs, us, ds}, mp{gt.p, up.p, dn.p, gs, us, ds};
    // distinct experts per token: slot 0 of every token on expert 2 (36 slots: two tiles of up to
    // 32), slot 1 on 0, 1, 3, 4 or 5; experts 6..8 unused
    std::vector<int32_t> sel(static_cast<size_t>(n * k));
    const int32_t second[5] = {0, 1, 3, 4, 5};
    for (int64_t t = 0; t < n; ++t) {
      sel[static_cast<size_t>(t * k)] = 2;
      sel[static_cast<size_t>(t * k + 1)] = second[t % 5];
    }
    const auto xs = random_floats(static_cast<size_t>(n * Lw), 74);
    const auto ws = random_floats(static_cast<size_t>(n * k), 73);
    auto run_pairs = [&](const std::vector<int32_t>& s, const std::vector<float>& w) {
      auto sb = pairs->alloc(s.size() * 4, "sel");
      auto wb = pairs->alloc(w.size() * 4, "w");
      auto xb = pairs->alloc(xs.size() * 4, "x");
      auto ab = pairs->alloc(static_cast<uint64_t>(n * Lw) * 4, "acc");
      pairs->upload(sb->data(), s.data(), s.size() * 4);
      pairs->upload(wb->data(), w.data(), w.size() * 4);
      pairs->upload(xb->data(), xs.data(), xs.size() * 4);
      pairs->moe_experts(mp, xb->as<float>(), n, Lw, sb->as<int32_t>(), wb->as<float>(), k, E, 2.0f, 3.0f,
                         ab->as<float>());
      std::vector<float> out(static_cast<size_t>(n * Lw));
      pairs->sync();
      pairs->download(out.data(), ab->data(), out.size() * 4);
      return out;
    };
    {
      auto s = both(sel);
      auto w = both(ws);
      auto x = both(xs);
      auto acc = zeros(static_cast<size_t>(n * Lw));
      cpu_->moe_experts(mc, x.cp<float>(), n, Lw, s.cp<int32_t>(), w.cp<float>(), k, E, 2.0f, 3.0f, acc.cp<float>());
      gpu_->moe_experts(mg, x.gp<float>(), n, Lw, s.gp<int32_t>(), w.gp<float>(), k, E, 2.0f, 3.0f, acc.gp<float>());
      auto [c, g] = read(acc);
      const auto p = run_pairs(sel, ws);
      EXPECT_LT(rel_rms(g, c), 1e-5) << "grouped vs CPU";
      EXPECT_LT(rel_rms(p, c), 1e-5) << "per pair vs CPU";
      EXPECT_LT(rel_rms(g, p), 1e-5) << "grouped vs per pair";
      EXPECT_GT(rel_rms(g, std::vector<float>(g.size())), 0.5) << "a real result, not zeros";
    }
    {  // slots held elsewhere: a nonzero weight on a zero row adds nothing, in both paths
      std::vector<int32_t> s2 = sel;
      std::vector<float> w0 = ws;
      for (size_t i : {size_t{0}, size_t{4}, size_t{5}, static_cast<size_t>(n * k - 1)}) {
        s2[i] = -1;
        w0[i] = 0.0f;
      }
      auto s = both(s2);
      auto w = both(ws);
      auto x = both(xs);
      auto acc = zeros(static_cast<size_t>(n * Lw));
      cpu_->moe_experts(mc, x.cp<float>(), n, Lw, both(sel).cp<int32_t>(), both(w0).cp<float>(), k, E, 2.0f, 3.0f,
                        acc.cp<float>());
      gpu_->moe_experts(mg, x.gp<float>(), n, Lw, s.gp<int32_t>(), w.gp<float>(), k, E, 2.0f, 3.0f, acc.gp<float>());
      auto [c, g] = read(acc);
      EXPECT_LT(rel_rms(g, c), 1e-5) << "grouped with skipped slots";
      EXPECT_LT(rel_rms(run_pairs(s2, ws), c), 1e-5) << "per pair with skipped slots";
    }
  }
}

// The block decoders' wide loads at every alignment, every weight type against the CPU through
// the decode row kernel (mm.comp) on both shader paths (subgroups: 4 rows per subgroup, block types
// by 32-value units; portable: one row per workgroup) and through the tiled GEMM forced for every n
// (its dq8 runs of 8 values). 37 rows (not a multiple of the rows per subgroup or per workgroup) x
// the type's smallest row and a row of more units than a subgroup has lanes; 1, 3 and 9 tokens (a
// full 8-token tile and a partial one); the weight placed 0, 2 and 7 bytes past an aligned address
// (every start of the 4-byte words and the 16-byte loads' fallback) and the activations one float
// past 16 bytes (their scalar path); plain types at their element's alignment. The CPU reads the
// same bytes aligned.
TEST_F(VulkanGemm, WideLoadsEveryTypeAnyAlignment) {
  for (const char* mode : {"subgroup", "portable", "gemm"}) {
    if (std::string(mode) == "portable") ::setenv("KIMI_VULKAN_PORTABLE", "1", 1);
    if (std::string(mode) == "gemm") ::setenv("KIMI_VULKAN_GEMM_MIN", "1", 1);
    auto gpu = make_vulkan_backend(test::first_vulkan_device(), Precision::F32);
    ::unsetenv("KIMI_VULKAN_PORTABLE");
    ::unsetenv("KIMI_VULKAN_GEMM_MIN");
    SCOPED_TRACE(mode);
    uint32_t seed = 300;
    for (GgmlType t : kTypes) {
      const bool plain = t == GgmlType::F32 || t == GgmlType::F16 || t == GgmlType::BF16;
      const bool super = t == GgmlType::Q4_K || t == GgmlType::Q5_K || t == GgmlType::Q6_K || t == GgmlType::Q2_K ||
                         t == GgmlType::Q3_K || t == GgmlType::IQ4_XS;
      const int64_t block = plain ? 8 : super ? 256 : 32;
      for (int64_t cols : {block, block * (super ? 3 : 19)}) {
        const int64_t rows = 37;
        const auto bytes = make_weight(t, rows, cols, seed);
        const uint64_t rb = row_bytes(t, static_cast<uint64_t>(cols));
        host_.push_back(bytes);
        const MatView wc{t, host_.back().data(), rows, cols, rb};
        // plain types need their element's alignment: 4 (F32) or 2 bytes past 16
        const size_t odd_off = plain ? (t == GgmlType::F32 ? 4 : 2) : 7;
        for (auto [woff, xoff] : {std::pair<size_t, size_t>{0, 0}, {plain ? 0 : 2, 1}, {odd_off, 0}}) {
          SCOPED_TRACE(std::string(type_name(t)) + " " + std::to_string(rows) + "x" + std::to_string(cols) +
                       ", weight +" + std::to_string(woff) + " bytes, x +" + std::to_string(xoff) + " floats");
          std::vector<uint8_t> padded(woff, 0xA5);
          padded.insert(padded.end(), bytes.begin(), bytes.end());
          host_.push_back(padded);
          MatView wg = wc;
          wg.data = gpu->place_weight("w" + std::to_string(seed) + "+" + std::to_string(woff), host_.back().data(),
                                      padded.size()) + woff;
          for (int64_t n : {1, 3, 9}) {
            const auto xs = random_floats(static_cast<size_t>(n * cols), seed + 7);
            std::vector<float> yc(static_cast<size_t>(n * rows));
            {
              auto xc = cpu_->alloc(xs.size() * 4, "x");
              auto ycb = cpu_->alloc(yc.size() * 4, "y");
              std::memcpy(xc->data(), xs.data(), xs.size() * 4);
              cpu_->matmul(wc, xc->as<float>(), n, ycb->as<float>());
              std::memcpy(yc.data(), ycb->data(), yc.size() * 4);
            }
            auto xg = gpu->alloc((xs.size() + xoff) * 4, "x");
            auto yg = gpu->alloc(yc.size() * 4, "y");
            gpu->upload(xg->as<float>() + xoff, xs.data(), xs.size() * 4);
            gpu->matmul(wg, xg->as<float>() + xoff, n, yg->as<float>());
            std::vector<float> g(yc.size());
            gpu->sync();
            gpu->download(g.data(), yg->data(), g.size() * 4);
            EXPECT_LT(rel_rms(g, yc), 1e-5) << "n = " << n;
            EXPECT_GT(rel_rms(g, std::vector<float>(g.size())), 0.5) << "a real result, not zeros";
          }
        }
        ++seed;
      }
    }
  }
}
