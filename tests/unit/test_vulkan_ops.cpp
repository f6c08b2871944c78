// The Vulkan backend's dense, residual, cache, MLA-matmul and expert ops against the CPU backend
// in f32 (the reference), on random inputs of odd shapes, for every weight type.
#include "unit/vulkan_fixture.h"

#include "tensor/quants.h"
#include "tensor/types.h"

using namespace kimi;
using kimi::test::rel_rms;
using kimi::test::random_floats;
using kimi::test::kTypes;
using kimi::test::make_weight;

namespace {

int64_t cols_for(GgmlType t, bool odd) {
  if (t == GgmlType::F32 || t == GgmlType::F16 || t == GgmlType::BF16) return odd ? 203 : 256;
  if (t == GgmlType::Q4_K || t == GgmlType::Q5_K || t == GgmlType::Q6_K || t == GgmlType::Q2_K ||
      t == GgmlType::Q3_K || t == GgmlType::IQ4_XS)
    return odd ? 768 : 512;
  return odd ? 96 : 160;
}

}  // namespace

using VulkanDense = kimi::test::VulkanOps;

// matmul (decode n = 1 and prefill n = 7, 13) and embedding rows for every weight type, odd
// sizes; on both shader paths: subgroup reductions (where the device has them: lavapipe does) and
// the portable shared-memory one (KIMI_VULKAN_PORTABLE=1)
TEST_F(VulkanDense, MatmulAndEmbedEveryType) {
 for (const char* portable : {"0", "1"}) {
  ::setenv("KIMI_VULKAN_PORTABLE", portable, 1);
  gpu_ = make_vulkan_backend(test::first_vulkan_device(), Precision::F32);
  ::unsetenv("KIMI_VULKAN_PORTABLE");
  SCOPED_TRACE(std::string("KIMI_VULKAN_PORTABLE=") + portable);
  uint32_t seed = 1;
  for (GgmlType t : kTypes) {
    for (bool odd : {false, true}) {
      const int64_t rows = odd ? 37 : 64, cols = cols_for(t, odd);
      SCOPED_TRACE(std::string(type_name(t)) + " " + std::to_string(rows) + "x" + std::to_string(cols));
      auto w = weight(std::string("w") + std::to_string(seed), t, rows, cols, make_weight(t, rows, cols, seed));
      for (int64_t n : {1, 7, 13}) {
        auto x = both(random_floats(static_cast<size_t>(n * cols), seed + 100));
        auto y = zeros(static_cast<size_t>(n * rows));
        cpu_->matmul(w.c, x.cp<float>(), n, y.cp<float>());
        gpu_->matmul(w.g, x.gp<float>(), n, y.gp<float>());
        auto [c, g] = read(y);
        EXPECT_LT(rel_rms(g, c), 1e-5) << "n = " << n;
      }
      // embedding lookup: rows 3, 0, rows-1, 3
      std::vector<BatchEntry> e(4);
      const int32_t ids[] = {3, 0, static_cast<int32_t>(rows - 1), 3};
      for (int i = 0; i < 4; ++i) e[static_cast<size_t>(i)].token = ids[i];
      auto out = zeros(static_cast<size_t>(4 * cols));
      cpu_->embed_rows(w.c, e.data(), 4, out.cp<float>());
      gpu_->embed_rows(w.g, e.data(), 4, out.gp<float>());
      auto [c, g] = read(out);
      EXPECT_EQ(c, g) << "embedding rows decode exactly";
      ++seed;
    }
  }
 }
}

// A weight larger than lavapipe's 128 MiB maxStorageBufferRange: read through its device address,
// never through a bounded descriptor.
TEST_F(VulkanDense, WeightLargerThanStorageRange) {
  const int64_t rows = 4100, cols = 8192;  // 4100 x 8192 f32 = 128.1 MiB
  std::vector<uint8_t> bytes(static_cast<size_t>(rows * cols) * 4);
  {
    auto f = random_floats(static_cast<size_t>(cols), 7);
    auto* p = reinterpret_cast<float*>(bytes.data());
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t c = 0; c < cols; ++c) p[r * cols + c] = f[static_cast<size_t>(c)] * static_cast<float>((r % 13) - 6);
  }
  auto w = weight("big", GgmlType::F32, rows, cols, bytes);
  auto x = both(random_floats(static_cast<size_t>(cols), 8));
  auto y = zeros(static_cast<size_t>(rows));
  cpu_->matmul(w.c, x.cp<float>(), 1, y.cp<float>());
  gpu_->matmul(w.g, x.gp<float>(), 1, y.gp<float>());
  auto [c, g] = read(y);
  EXPECT_LT(rel_rms(g, c), 1e-5);
  EXPECT_NEAR(g[static_cast<size_t>(rows - 1)], c[static_cast<size_t>(rows - 1)], 1e-3 * (1 + std::fabs(c.back())));
}

TEST_F(VulkanDense, NormsAndElementwise) {
  const int64_t n = 5, d = 333;
  auto xs = random_floats(static_cast<size_t>(n * d), 11, 3.0f);
  auto w = both(random_floats(static_cast<size_t>(d), 12));
  auto b = both(random_floats(static_cast<size_t>(d), 13));
  {  // rms norm with strides (row stride 333 in, 400 out)
    auto x = both(xs);
    auto y = zeros(static_cast<size_t>(n * 400));
    cpu_->rms_norm_rows(x.cp<float>(), d, w.cp<float>(), y.cp<float>(), 400, n, d, 1e-5f);
    gpu_->rms_norm_rows(x.gp<float>(), d, w.gp<float>(), y.gp<float>(), 400, n, d, 1e-5f);
    auto [c, g] = read(y);
    EXPECT_LT(rel_rms(g, c), 1e-6);
  }
  {
    auto x = both(xs);
    cpu_->layer_norm_rows(x.cp<float>(), w.cp<float>(), b.cp<float>(), n, d, 1e-6f);
    gpu_->layer_norm_rows(x.gp<float>(), w.gp<float>(), b.gp<float>(), n, d, 1e-6f);
    auto [c, g] = read(x);
    EXPECT_LT(rel_rms(g, c), 1e-6);
  }
  {
    auto x = both(xs);
    cpu_->l2_norm_rows(x.cp<float>(), n * 9, 37, 1e-5f);
    gpu_->l2_norm_rows(x.gp<float>(), n * 9, 37, 1e-5f);
    auto [c, g] = read(x);
    EXPECT_LT(rel_rms(g, c), 1e-6);
  }
  auto other = random_floats(static_cast<size_t>(n * d), 14, 4.0f);
  for (int op = 0; op < 5; ++op) {
    SCOPED_TRACE(op);
    auto x = both(xs);
    auto o = both(other);
    const float beta = 2.5f, lambda = op == 4 ? 1.7f : 0.0f;
    auto run = [&](Backend& be, float* xp, float* op_) {
      switch (op) {
        case 0: be.add(xp, op_, n * d); break;
        case 1: be.scale_rows(xp, n, d, 0.37f); break;
        case 2: be.sigmoid(xp, n * d); break;
        case 3: be.mul_sigmoid_rows(xp, op_, n, d); break;
        case 4: be.situ_rows(xp, op_, n, d, beta, lambda); be.situ_rows(op_, xp, n, d, beta, 0.0f); break;
      }
    };
    run(*cpu_, x.cp<float>(), o.cp<float>());
    run(*gpu_, x.gp<float>(), o.gp<float>());
    auto [c, g] = read(x);
    EXPECT_LT(rel_rms(g, c), 1e-6);
    auto [c2, g2] = read(o);
    EXPECT_LT(rel_rms(g2, c2), 1e-6);
  }
  {  // set_i32 and gather_rows
    auto i = zeros<int32_t>(11);
    cpu_->set_i32(i.cp<int32_t>() + 2, 7, -5);
    gpu_->set_i32(i.gp<int32_t>() + 2, 7, -5);
    auto [c, g] = read<int32_t>(i);
    EXPECT_EQ(c, g);
    EXPECT_EQ(g[2], -5);
    auto x = both(xs);
    auto y = zeros(static_cast<size_t>(3 * d));
    const int32_t rows[] = {4, 0, 2};
    cpu_->gather_rows(x.cp<float>(), d, rows, 3, y.cp<float>());
    gpu_->gather_rows(x.gp<float>(), d, rows, 3, y.gp<float>());
    auto [c2, g2] = read(y);
    EXPECT_EQ(c2, g2);
  }
}

TEST_F(VulkanDense, ResMixBankAndCacheRows) {
  const int64_t N = 6, n = 5, d = 130;
  const uint32_t nb = 3;
  auto bank = zeros(static_cast<size_t>(nb * N * d));
  auto inv = zeros(static_cast<size_t>(nb * N));
  for (uint32_t k = 0; k < nb; ++k) {
    auto src = both(random_floats(static_cast<size_t>(n * d), 20 + k, 2.0f));
    cpu_->bank_append(src.cp<float>(), n, d, 1e-5f, bank.cp<float>() + k * N * d, inv.cp<float>() + k * N);
    gpu_->bank_append(src.gp<float>(), n, d, 1e-5f, bank.gp<float>() + k * N * d, inv.gp<float>() + k * N);
  }
  {
    auto [c, g] = read(inv);
    EXPECT_LT(rel_rms(g, c), 1e-6);
  }
  auto cur = both(random_floats(static_cast<size_t>(n * d), 30, 2.0f));
  auto w = both(random_floats(static_cast<size_t>(d), 31));
  for (uint32_t k : {0u, 1u, nb}) {
    auto dst = zeros(static_cast<size_t>(n * d));
    cpu_->res_mix(cur.cp<float>(), w.cp<float>(), bank.cp<float>(), inv.cp<float>(), k, N, n, d, 1e-5f, dst.cp<float>());
    gpu_->res_mix(cur.gp<float>(), w.gp<float>(), bank.gp<float>(), inv.gp<float>(), k, N, n, d, 1e-5f, dst.gp<float>());
    auto [c, g] = read(dst);
    EXPECT_LT(rel_rms(g, c), 1e-6) << "bank entries " << k;
  }
  // cache rows, f16 and f32, two sequences interleaved
  for (bool f16 : {true, false}) {
    const int64_t W = 75, nctx = 9;
    auto cache = zeros<uint8_t>(static_cast<size_t>(2 * nctx * W * (f16 ? 2 : 4)));
    auto src = both(random_floats(static_cast<size_t>(4 * 80), 40));
    std::vector<BatchEntry> e(4);
    const int32_t seqs[] = {1, 0, 1, 0}, pos[] = {3, 0, 4, 8};
    for (int i = 0; i < 4; ++i) e[static_cast<size_t>(i)].seq_id = seqs[i], e[static_cast<size_t>(i)].pos = pos[i];
    CacheRows cr{cache.cp<uint8_t>(), f16, W, nctx}, gr{cache.gp<uint8_t>(), f16, W, nctx};
    cpu_->store_cache_rows(src.cp<float>(), 80, e.data(), 4, cr);
    gpu_->store_cache_rows(src.gp<float>(), 80, e.data(), 4, gr);
    auto [c, g] = read<uint8_t>(cache);
    EXPECT_EQ(c, g) << (f16 ? "f16" : "f32") << " cache rows are bit-identical";
  }
}

// The MLA per-head products (absorbed queries, value heads) with a stacked per-head weight.
TEST_F(VulkanDense, MlaHeadMatmuls) {
  for (GgmlType t : {GgmlType::F32, GgmlType::BF16, GgmlType::Q8_0}) {
    SCOPED_TRACE(type_name(t));
    const int64_t H = 3, n = 4, nope = 64, pe = 7, kvl = 96, vd = 32;
    WorkLimits lim;  // the CPU backend's per-thread head gathers
    lim.n_tokens = n;
    lim.n_heads = H;
    lim.head_io = kvl;
    lim.row = kvl + pe;
    cpu_->reserve(lim);
    gpu_->reserve(lim);
    // k_b: H slices of [kvl x nope]; v_b: H slices of [vd x kvl]
    auto kb = make_weight(t, H * kvl, nope, 50), vb = make_weight(t, H * vd, kvl, 51);
    host_.push_back(kb);
    MatView kc{t, host_.back().data(), kvl, nope, row_bytes(t, nope)};
    MatView kg = kc;
    kg.data = gpu_->place_weight(std::string("k_b.") + type_name(t), host_.back().data(), kb.size());
    host_.push_back(vb);
    MatView vc{t, host_.back().data(), vd, kvl, row_bytes(t, kvl)};
    MatView vg = vc;
    vg.data = gpu_->place_weight(std::string("v_b.") + type_name(t), host_.back().data(), vb.size());
    auto q = both(random_floats(static_cast<size_t>(n * H * (nope + pe)), 52));
    auto qcat = zeros(static_cast<size_t>(n * H * (kvl + pe)));
    cpu_->mla_absorb_queries(kc, kc.row_bytes * kvl, q.cp<float>(), n, H, nope, pe, qcat.cp<float>());
    gpu_->mla_absorb_queries(kg, kg.row_bytes * kvl, q.gp<float>(), n, H, nope, pe, qcat.gp<float>());
    auto [c, g] = read(qcat);
    EXPECT_LT(rel_rms(g, c), 1e-5);
    auto z = both(random_floats(static_cast<size_t>(n * H * kvl), 53));
    auto o = zeros(static_cast<size_t>(n * H * vd));
    cpu_->mla_value_heads(vc, vc.row_bytes * vd, z.cp<float>(), n, H, o.cp<float>());
    gpu_->mla_value_heads(vg, vg.row_bytes * vd, z.gp<float>(), n, H, o.gp<float>());
    auto [c2, g2] = read(o);
    EXPECT_LT(rel_rms(g2, c2), 1e-5);
  }
}

// Routed experts: MXFP4 and Q4_K stacks, decode and a prefill batch, repeated experts per batch.
TEST_F(VulkanDense, MoeExperts) {
  for (GgmlType t : {GgmlType::MXFP4, GgmlType::Q8_0, GgmlType::Q4_K}) {
    SCOPED_TRACE(type_name(t));
    const int64_t E = 6, k = 2, F = 256, Lw = 256, N = 5;
    WorkLimits lim;
    lim.n_tokens = N;
    lim.n_expert = E;
    lim.n_expert_used = k;
    lim.expert_ff = F;
    lim.expert_width = Lw;
    cpu_->reserve(lim);
    gpu_->reserve(lim);
    auto mk = [&](const char* nm, int64_t rows, int64_t cols, uint32_t seed) {
      host_.push_back(make_weight(t, E * rows, cols, seed));
      MatView c{t, host_.back().data(), rows, cols, row_bytes(t, cols)};
      MatView g = c;
      g.data = gpu_->place_weight(std::string(nm) + type_name(t), host_.back().data(), host_.back().size());
      return std::pair<MatView, MatView>{c, g};
    };
    auto [gc, gg] = mk("gate", F, Lw, 60);
    auto [uc, ug] = mk("up", F, Lw, 61);
    auto [dc, dg] = mk("down", Lw, F, 62);
    ExpertMats mc{gc, uc, dc, gc.row_bytes * F, uc.row_bytes * F, dc.row_bytes * Lw};
    ExpertMats mg{gg, ug, dg, mc.gate_slice, mc.up_slice, mc.down_slice};
    for (int64_t n : {int64_t{1}, N}) {
      std::vector<int32_t> sel(static_cast<size_t>(n * k));
      for (int64_t i = 0; i < n * k; ++i) sel[static_cast<size_t>(i)] = static_cast<int32_t>((i * 5 + i / k) % E);
      auto s = both(sel);
      auto wts = both(random_floats(static_cast<size_t>(n * k), 63));
      auto x = both(random_floats(static_cast<size_t>(n * Lw), 64));
      auto acc = zeros(static_cast<size_t>(n * Lw));
      cpu_->moe_experts(mc, x.cp<float>(), n, Lw, s.cp<int32_t>(), wts.cp<float>(), k, E, 2.0f, 3.0f, acc.cp<float>());
      gpu_->moe_experts(mg, x.gp<float>(), n, Lw, s.gp<int32_t>(), wts.gp<float>(), k, E, 2.0f, 3.0f, acc.gp<float>());
      auto [c, g] = read(acc);
      EXPECT_LT(rel_rms(g, c), 1e-5) << "n = " << n;
      // a slot whose expert is < 0 (held by another rank) adds nothing: the same as a zero weight
      std::vector<int32_t> sel2 = sel;
      std::vector<float> w2 = random_floats(static_cast<size_t>(n * k), 63);
      sel2[0] = -1;
      w2[0] = 0.0f;
      auto s2 = both(sel2);
      auto wz = both(w2);
      auto acc2 = zeros(static_cast<size_t>(n * Lw));
      gpu_->moe_experts(mg, x.gp<float>(), n, Lw, s2.gp<int32_t>(), wz.gp<float>(), k, E, 2.0f, 3.0f, acc2.gp<float>());
      auto [c2, g2] = read(acc2);
      s2 = both(sel);
      auto acc3 = zeros(static_cast<size_t>(n * Lw));
      gpu_->moe_experts(mg, x.gp<float>(), n, Lw, s2.gp<int32_t>(), wz.gp<float>(), k, E, 2.0f, 3.0f, acc3.gp<float>());
      auto [c3, g3] = read(acc3);
      EXPECT_EQ(g2, g3) << "skipped slot";
    }
  }
}

// flush() starts the recorded work without waiting; the results are bit-identical to the same
// chain without flushes, and to the CPU's within rounding. Every step uploads 1.5 MiB and stages
// a row list (the staging ring, 8 MiB, fills and restarts while submissions are in flight) and the
// host buffers are overwritten right after each call.
TEST_F(VulkanDense, FlushBetweenOpsGivesIdenticalResults) {
  const int64_t big = 393216, d = 256, n = 4, rows_out = 64, steps = 12;
  std::vector<uint8_t> wb = make_weight(GgmlType::F32, rows_out, d, 90);
  auto w = weight("flush_w", GgmlType::F32, rows_out, d, wb);
  auto run = [&](Backend& be, const MatView& wv, bool flushes, uint64_t* submits) {
    auto src = be.alloc(static_cast<uint64_t>(big) * 4, "src");
    auto acc = be.alloc(static_cast<uint64_t>(n * d) * 4, "acc");
    auto y = be.alloc(static_cast<uint64_t>(n * rows_out) * 4, "y");
    auto out = be.alloc(static_cast<uint64_t>(rows_out) * 4, "out");
    auto g = be.alloc(static_cast<uint64_t>(3 * d) * 4, "gathered");
    std::vector<float> host(static_cast<size_t>(big));
    std::vector<int32_t> rows(3);
    const uint64_t before = be.stats().submits;
    for (int64_t s = 0; s < steps; ++s) {
      host = random_floats(static_cast<size_t>(big), 200 + static_cast<uint32_t>(s));
      if (be.host_visible()) std::memcpy(src->data(), host.data(), host.size() * 4);
      else be.upload(src->data(), host.data(), host.size() * 4);
      std::fill(host.begin(), host.end(), 1e30f);  // the caller's memory changes at once
      be.add(acc->as<float>(), src->as<float>() + s * 1000, n * d);
      for (int i = 0; i < 3; ++i) rows[static_cast<size_t>(i)] = static_cast<int32_t>((s * 7 + i * 31) % (big / d));
      be.gather_rows(src->as<float>(), d, rows.data(), 3, g->as<float>());
      rows.assign(3, -1);
      be.add(acc->as<float>(), g->as<float>(), 3 * d);
      be.matmul(wv, acc->as<float>(), n, y->as<float>());
      be.add(out->as<float>(), y->as<float>() + (s % n) * rows_out, rows_out);
      be.scale_rows(acc->as<float>(), n, d, 0.5f);
      if (flushes) be.flush();
    }
    if (submits) *submits = be.stats().submits - before;
    std::vector<float> r(static_cast<size_t>(rows_out + n * d));
    be.sync();
    be.download(r.data(), out->data(), static_cast<uint64_t>(rows_out) * 4);
    be.download(r.data() + rows_out, acc->data(), static_cast<uint64_t>(n * d) * 4);
    return r;
  };
  uint64_t sub_plain = 0, sub_flush = 0;
  const auto plain = run(*gpu_, w.g, false, &sub_plain);
  const auto flushed = run(*gpu_, w.g, true, &sub_flush);
  const auto want = run(*cpu_, w.c, false, nullptr);
  EXPECT_EQ(flushed, plain) << "results with flush() between ops are bit-identical";
  EXPECT_LT(rel_rms(flushed, want), 1e-5);
  EXPECT_GE(sub_flush, static_cast<uint64_t>(steps)) << "every flush with recorded work submits";
  EXPECT_LT(sub_plain, static_cast<uint64_t>(steps)) << "without flushes only a full ring submits";
}

// Command-buffer replay (vk_runtime.h): steps of the same shape with new staged inputs (row lists,
// uploads) replay the cached command buffer and give the bits of fresh recording
// (KIMI_VULKAN_REPLAY=0) and of the CPU (gathers and adds are exact); freeing a buffer drops the
// cache, so the next step records again.
TEST_F(VulkanDense, ReplayedStepsEqualFreshRecording) {
  ::setenv("KIMI_VULKAN_REPLAY", "0", 1);
  std::unique_ptr<Backend> fresh = make_vulkan_backend(test::first_vulkan_device(), Precision::F32);
  ::unsetenv("KIMI_VULKAN_REPLAY");
  const int64_t d = 96, rows = 40;
  auto src_host = random_floats(static_cast<size_t>(rows * d), 300);
  auto step = [&](Backend& be, Buffer& src, Buffer& acc, Buffer& g, int s) {
    const int32_t r[3] = {s % 40, (s * 7 + 3) % 40, (s * 13 + 1) % 40};
    std::vector<float> bias(static_cast<size_t>(d), 0.25f * static_cast<float>(s));
    be.upload(g.data(), bias.data(), static_cast<uint64_t>(d) * 4);  // staged input of the step
    be.add(acc.as<float>(), g.as<float>(), d);
    be.gather_rows(src.as<float>(), d, r, 3, g.as<float>());
    be.add(acc.as<float>(), g.as<float>(), 3 * d);
    std::vector<float> out(static_cast<size_t>(3 * d));
    be.sync();
    be.download(out.data(), acc.data(), out.size() * 4);
    return out;
  };
  struct Bufs {
    std::unique_ptr<Buffer> src, acc, g;
  };
  auto make = [&](Backend& be) {
    Bufs b{be.alloc(static_cast<uint64_t>(rows * d) * 4, "src"), be.alloc(static_cast<uint64_t>(3 * d) * 4, "acc"),
           be.alloc(static_cast<uint64_t>(3 * d) * 4, "g")};
    if (be.host_visible()) std::memcpy(b.src->data(), src_host.data(), src_host.size() * 4);
    else be.upload(b.src->data(), src_host.data(), src_host.size() * 4);
    be.sync();
    return b;
  };
  Bufs a = make(*gpu_), f = make(*fresh), c = make(*cpu_);
  const BackendStats s0 = gpu_->stats();
  for (int s = 0; s < 6; ++s) {
    const auto ga = step(*gpu_, *a.src, *a.acc, *a.g, s);
    EXPECT_EQ(ga, step(*fresh, *f.src, *f.acc, *f.g, s)) << "step " << s;
    EXPECT_EQ(ga, step(*cpu_, *c.src, *c.acc, *c.g, s)) << "step " << s;
  }
  const BackendStats s1 = gpu_->stats();
  EXPECT_GE(s1.cmd_replayed - s0.cmd_replayed, 8u) << "steps 2-6 replay both of their submissions";
  EXPECT_EQ(fresh->stats().cmd_replayed, 0u);
  a.src.reset();  // a freed buffer: cached command buffers may reference it
  a.src = gpu_->alloc(static_cast<uint64_t>(rows * d) * 4, "src again");
  gpu_->upload(a.src->data(), src_host.data(), src_host.size() * 4);
  gpu_->sync();
  const BackendStats s2 = gpu_->stats();
  EXPECT_EQ(step(*gpu_, *a.src, *a.acc, *a.g, 6), step(*cpu_, *c.src, *c.acc, *c.g, 6));
  EXPECT_GE(gpu_->stats().cmd_recorded - s2.cmd_recorded, 2u) << "recorded again after a free";
}
