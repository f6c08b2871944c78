// The one ISA dispatch of the CPU kernels: the feature set each level requires, and that lowering
// the level (set_isa, as KIMI_ISA does at start-up) moves EVERY kernel family - matmul, ops,
// attention, KDA, bf16 rows - to the lower path: named by kernel_impl() and visible in the results
// (the portable path is bit-identical to the libm / plain-loop definitions written out here, the
// AVX-512 path differs from them in the last bits but stays within its documented tolerance).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <fstream>
#include <random>
#include <cstdlib>
#include <string>
#include <vector>

#include "backend/cpu/attention.h"
#include "backend/cpu/dispatch.h"
#include "backend/cpu/kda.h"
#include "backend/cpu/ops.h"
#include "backend/cpu/vec.h"
#include "backend/key_quant.h"
#include "tensor/types.h"

using namespace kimi;
using namespace kimi::kern;

namespace {

struct IsaRestore {
  Isa saved = current_isa();
  ~IsaRestore() { set_isa(saved); }
};

// every level this CPU has (x86-64: scalar, avx2, avx512; aarch64: scalar, neon, neon_dot, neon_i8mm)
std::vector<Isa> isa_levels() { return supported_isas(); }

std::vector<float> rnd(size_t n, uint32_t seed, float lo, float hi) {
  std::mt19937 r(seed);
  std::uniform_real_distribution<float> U(lo, hi);
  std::vector<float> v(n);
  for (auto& x : v) x = U(r);
  return v;
}

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

CpuFeatures all_features() {
  CpuFeatures f;
  f.avx2 = f.fma = f.f16c = f.bmi2 = true;
  f.avx512f = f.avx512bw = f.avx512vl = f.avx512dq = f.avx512vnni = f.avx512bf16 = true;
  return f;
}

}  // namespace

// One feature set per level: avx512 needs F, BW, DQ, VL, VNNI and BF16 (every *_avx512.cpp is
// compiled with all six), avx2 needs AVX2, FMA, F16C and BMI2; a missing one drops a level.
TEST(Dispatch, EachLevelRequiresItsWholeFeatureSet) {
  const CpuFeatures all = all_features();
  EXPECT_EQ(best_isa_for(all), Isa::Avx512);
  bool CpuFeatures::*avx512_bits[] = {&CpuFeatures::avx512f, &CpuFeatures::avx512bw, &CpuFeatures::avx512vl,
                                      &CpuFeatures::avx512dq, &CpuFeatures::avx512vnni, &CpuFeatures::avx512bf16};
  for (auto bit : avx512_bits) {
    CpuFeatures f = all;
    f.*bit = false;  // e.g. Skylake-X: AVX-512 F/BW/DQ/VL without VNNI and BF16
    EXPECT_EQ(best_isa_for(f), Isa::Avx2);
    EXPECT_FALSE(isa_supported(Isa::Avx512, f));
  }
  bool CpuFeatures::*avx2_bits[] = {&CpuFeatures::avx2, &CpuFeatures::fma, &CpuFeatures::f16c, &CpuFeatures::bmi2};
  for (auto bit : avx2_bits) {
    CpuFeatures f = all;
    f.*bit = false;  // AVX-512 present but a base feature missing: neither SIMD level
    EXPECT_EQ(best_isa_for(f), Isa::Scalar);
  }
  EXPECT_EQ(best_isa_for(CpuFeatures{}), Isa::Scalar);
  EXPECT_TRUE(isa_supported(Isa::Scalar, CpuFeatures{}));
  EXPECT_EQ(best_isa(), best_isa_for(cpu_features()));
}

// KIMI_ISA only lowers the level; an unknown value is ignored with a warning that names it.
TEST(Dispatch, KimiIsaValues) {
  std::string warn;
  EXPECT_EQ(isa_for_env(nullptr, Isa::Avx512, &warn), Isa::Avx512);
  EXPECT_EQ(isa_for_env("", Isa::Avx512, &warn), Isa::Avx512);
  EXPECT_EQ(isa_for_env("scalar", Isa::Avx512, &warn), Isa::Scalar);
  EXPECT_EQ(isa_for_env("avx2", Isa::Avx512, &warn), Isa::Avx2);
  EXPECT_EQ(isa_for_env("avx512", Isa::Avx2, &warn), Isa::Avx2);  // never above what the CPU has
  EXPECT_TRUE(warn.empty()) << warn;
  EXPECT_EQ(isa_for_env("AVX2x", Isa::Avx512, &warn), Isa::Avx512);
  EXPECT_NE(warn.find("KIMI_ISA=\"AVX2x\""), std::string::npos) << warn;
  EXPECT_NE(warn.find("avx512"), std::string::npos) << warn;
}

// aarch64 levels (pure logic, checked on every host): neon is every AArch64 CPU, neon_dot adds
// dotprod, neon_i8mm adds i8mm AND bf16; KIMI_ISA moves only down the same chain.
TEST(Dispatch, NeonLevelsAndTheirChain) {
  CpuFeatures f;
  f.neon = true;
  EXPECT_EQ(best_isa_for(f), Isa::Neon);
  f.i8mm = f.bf16 = true;  // without dotprod: still plain neon
  EXPECT_EQ(best_isa_for(f), Isa::Neon);
  f.dotprod = true;
  EXPECT_EQ(best_isa_for(f), Isa::NeonI8mm);
  f.bf16 = false;
  EXPECT_EQ(best_isa_for(f), Isa::NeonDot);
  EXPECT_FALSE(isa_supported(Isa::Avx2, f));
  EXPECT_EQ(lower_isa(Isa::NeonI8mm), Isa::NeonDot);
  EXPECT_EQ(lower_isa(Isa::NeonDot), Isa::Neon);
  EXPECT_EQ(lower_isa(Isa::Neon), Isa::Scalar);
  EXPECT_TRUE(isa_at_most(Isa::Neon, Isa::NeonI8mm));
  EXPECT_FALSE(isa_at_most(Isa::Avx2, Isa::NeonI8mm));
  EXPECT_FALSE(isa_at_most(Isa::NeonDot, Isa::Avx512));
  std::string warn;
  EXPECT_EQ(isa_for_env("neon", Isa::NeonI8mm, &warn), Isa::Neon);
  EXPECT_EQ(isa_for_env("neon_dot", Isa::NeonI8mm, &warn), Isa::NeonDot);
  EXPECT_EQ(isa_for_env("neon_i8mm", Isa::NeonDot, &warn), Isa::NeonDot);  // never above the CPU
  EXPECT_EQ(isa_for_env("avx512", Isa::NeonDot, &warn), Isa::NeonDot);    // another architecture
  EXPECT_EQ(isa_for_env("neon", Isa::Avx512, &warn), Isa::Avx512);
  EXPECT_TRUE(warn.empty());
  for (Isa isa : {Isa::Neon, Isa::NeonDot, Isa::NeonI8mm}) EXPECT_EQ(isa_from_name(isa_name(isa)), isa);
  const auto levels = supported_isas();
  ASSERT_FALSE(levels.empty());
  EXPECT_EQ(levels.front(), Isa::Scalar);
  EXPECT_EQ(levels.back(), best_isa());
}

// The level detected on this CPU is the one the caller expects (KIMI_EXPECT_ISA, set by
// scripts/cross-test.sh for each qemu CPU model: neon_i8mm on -cpu max, neon on cortex-a53), so the
// HWCAP reading is checked, not only the kernels; without the variable there is nothing to compare.
TEST(Dispatch, DetectedLevelIsTheExpectedOne) {
  const char* want = std::getenv("KIMI_EXPECT_ISA");
  if (want == nullptr || *want == '\0') GTEST_SKIP() << "KIMI_EXPECT_ISA not set";
  EXPECT_STREQ(isa_name(best_isa()), want);
}

// The vendor bit (per-vendor tuning) agrees with the kernel's reading of CPUID.0 in /proc/cpuinfo,
// and the packed GEMV's prefetch distance follows it.
TEST(Dispatch, VendorMatchesProcCpuinfo) {
#if defined(__x86_64__) && defined(__linux__)
  std::ifstream f("/proc/cpuinfo");
  std::string line, vendor;
  while (vendor.empty() && std::getline(f, line))
    if (line.rfind("vendor_id", 0) == 0) vendor = line.substr(line.find(':') + 2);
  if (vendor.empty()) GTEST_SKIP() << "no vendor_id in /proc/cpuinfo";
  EXPECT_EQ(cpu_features().intel, vendor == "GenuineIntel") << vendor;
#elif !defined(__x86_64__)
  EXPECT_FALSE(cpu_features().intel);  // not an x86 CPU
#endif
  EXPECT_EQ(packed_gemv_prefetch_bytes(), cpu_features().intel ? 1024 : 3072);
}

// kernel_impl names the level every family runs at: the highest level <= the one in use that the
// family has code for.
TEST(Dispatch, EveryFamilyFollowsTheLevelInUse) {
  IsaRestore restore;
  for (Isa isa : isa_levels()) {
    ASSERT_EQ(set_isa(isa), isa);
    ASSERT_EQ(current_isa(), isa);
    const std::string simd = isa == Isa::Avx512 ? "avx512" : "scalar";  // families with avx512 code only
    // ops, attention, KDA: avx512 code, and neon code used at every NEON level
    const std::string ops = isa == Isa::Avx512 ? "avx512" : isa_at_most(Isa::Neon, isa) ? "neon" : "scalar";
    EXPECT_STREQ(kernel_impl(KernelFamily::Matmul), isa_name(isa));
    EXPECT_EQ(kernel_impl(KernelFamily::Ops), ops);
    EXPECT_EQ(kernel_impl(KernelFamily::Attention), ops);
    EXPECT_EQ(kernel_impl(KernelFamily::Kda), ops);
    EXPECT_EQ(kernel_impl(KernelFamily::Vec), simd);
    EXPECT_EQ(kernel_impl(KernelFamily::QuantizeAct), simd);
    EXPECT_STREQ(kernel_impl(KernelFamily::TopK), "scalar");
    EXPECT_STREQ(kernel_impl(KernelFamily::Conv), "scalar");
    EXPECT_EQ(ops_use_avx512(), isa == Isa::Avx512);
    // matmul per weight type: AVX2 has no Q5_0 / Q5_1 kernel (scalar), the other types have one
    EXPECT_EQ(matmul_kernel_isa(GgmlType::Q4_0, Precision::Fast), isa);
    EXPECT_EQ(matmul_kernel_isa(GgmlType::Q5_0, Precision::Fast), isa == Isa::Avx2 ? Isa::Scalar : isa);
    EXPECT_EQ(matmul_kernel_isa(GgmlType::F32, Precision::F32), isa);
    // Precision::F32 with quantized weights: AVX2 decodes through the scalar kernels
    EXPECT_EQ(matmul_kernel_isa(GgmlType::Q8_0, Precision::F32), isa == Isa::Avx2 ? Isa::Scalar : isa);
  }
  EXPECT_STREQ(family_name(KernelFamily::QuantizeAct), "quantize_act");
}

// ops: below avx512 the fast activations ARE the libm definitions (ops.h) and dot_f32 is the
// 8-lane portable sum, bit for bit; at avx512 they come from the polynomial / FMA code, which
// differs in the last bits for some inputs and stays within ~1e-6 relative.
TEST(Dispatch, LoweringTheLevelMovesOps) {
  IsaRestore restore;
  const int n = 4099;  // 256 full vectors and a masked tail
  const auto x = rnd(n, 1, -20.0f, 20.0f), b = rnd(n, 2, -1.0f, 1.0f);
  std::vector<float> lexp(n), lsig(n), lsilu(n);
  for (int i = 0; i < n; ++i) {
    lexp[i] = std::exp(x[i]);
    lsig[i] = 1.0f / (1.0f + std::exp(-x[i]));
    lsilu[i] = x[i] / (1.0f + std::exp(-x[i]));
  }
  float s8[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  int i8 = 0;
  for (; i8 + 8 <= n; i8 += 8)
    for (int k = 0; k < 8; ++k) s8[k] += x[i8 + k] * b[i8 + k];
  float rest = 0;
  for (; i8 < n; ++i8) rest += x[i8] * b[i8];
  const float ldot = rest + (((s8[0] + s8[1]) + (s8[2] + s8[3])) + ((s8[4] + s8[5]) + (s8[6] + s8[7])));
  for (Isa isa : isa_levels()) {
    set_isa(isa);
    std::vector<float> e(n), s(x), si(n);
    exp_fast(x.data(), e.data(), n);
    sigmoid_inplace_fast(s.data(), n);
    silu_fast(x.data(), si.data(), n);
    const float d = dot_f32(x.data(), b.data(), n);
    if (std::string(kernel_impl(KernelFamily::Ops)) == "scalar") {
      EXPECT_TRUE(same_bits(e, lexp)) << isa_name(isa);
      EXPECT_TRUE(same_bits(s, lsig)) << isa_name(isa);
      EXPECT_TRUE(same_bits(si, lsilu)) << isa_name(isa);
      EXPECT_EQ(d, ldot) << isa_name(isa);
    } else {
      EXPECT_FALSE(same_bits(e, lexp)) << "exp_fast at " << isa_name(isa) << " is the libm exp: not the SIMD path";
      for (int i = 0; i < n; ++i) {
        ASSERT_NEAR(e[i], lexp[i], 2e-6 * lexp[i]) << i;
        ASSERT_NEAR(s[i], lsig[i], 2e-6 * lsig[i]) << i;
        ASSERT_NEAR(si[i], lsilu[i], 2e-6 * std::fabs(lsilu[i]) + 1e-30f) << i;
      }
      double ref = 0, mag = 0;
      for (int i = 0; i < n; ++i) ref += double(x[i]) * b[i], mag += std::fabs(double(x[i]) * b[i]);
      EXPECT_NEAR(d, ref, 1e-6 * mag);
    }
  }
}

// attention (indexer scores, MLA sparse) and KDA: each level within the float64 reference's
// tolerance; the portable and AVX-512 results are not bit-identical (different summation order /
// FMA), which shows the level change reached these families.
TEST(Dispatch, LoweringTheLevelMovesAttentionAndKda) {
  IsaRestore restore;
  const Isa top = best_isa();  // avx512 or a NEON level: the families' SIMD code
  set_isa(top);
  if (std::string(kernel_impl(KernelFamily::Attention)) == "scalar") GTEST_SKIP() << "one path only on this CPU";
  const int H = 16, D = 128, nk = 41;
  const auto q = rnd(H * D, 3, -1.0f, 1.0f), w = rnd(H, 4, 0.0f, 1.0f), keys = rnd(nk * D, 5, -1.0f, 1.0f);
  std::vector<double> iref(nk, 0.0);
  for (int s = 0; s < nk; ++s)
    for (int h = 0; h < H; ++h) {
      double dq = 0;
      for (int j = 0; j < D; ++j) dq += double(q[h * D + j]) * keys[s * D + j];
      if (dq > 0) iref[s] += w[h] * dq;
    }
  const int W = 96, r = 64, n = 37, nh = 5;
  const auto rows = rnd(n * W, 6, -1.0f, 1.0f), qa = rnd(nh * W, 7, -2.0f, 2.0f);
  const LatentRows lr{rows.data(), false, W, r};
  std::vector<double> aref(nh * r, 0.0);
  for (int h = 0; h < nh; ++h) {
    std::vector<double> e(n);
    double mx = -1e300, sum = 0;
    for (int s = 0; s < n; ++s) {
      double d = 0;
      for (int j = 0; j < W; ++j) d += double(qa[h * W + j]) * rows[s * W + j];
      e[s] = 0.2 * d;
      mx = std::max(mx, e[s]);
    }
    for (auto& v : e) sum += (v = std::exp(v - mx));
    for (int s = 0; s < n; ++s)
      for (int j = 0; j < r; ++j) aref[h * r + j] += e[s] / sum * rows[s * W + j];
  }
  const int Dk = 64, T = 4;
  std::vector<std::vector<float>> idx_out, attn_out, kda_out;
  for (Isa isa : {Isa::Scalar, top}) {
    set_isa(isa);
    std::vector<float> sc(nk);
    indexer_scores(q.data(), w.data(), H, keys.data(), false, D, nk, sc.data());
    for (int s = 0; s < nk; ++s) EXPECT_NEAR(sc[s], iref[s], 1e-5 * (1 + std::fabs(iref[s]))) << isa_name(isa);
    idx_out.push_back(sc);
    std::vector<float> z(nh * r), rb(W);
    mla_attend_sparse(qa.data(), nh, lr, nullptr, n, 0.2f, z.data(), rb.data());
    for (int i = 0; i < nh * r; ++i) EXPECT_NEAR(z[i], aref[i], 1e-5) << isa_name(isa);
    attn_out.push_back(z);
    std::vector<float> S(Dk * Dk, 0.0f), tmp(Dk), o(Dk), all;
    for (int t = 0; t < T; ++t) {
      const auto qk = rnd(Dk, 10 + t, -0.2f, 0.2f), k = rnd(Dk, 20 + t, -0.2f, 0.2f), v = rnd(Dk, 30 + t, -1.0f, 1.0f);
      auto g = rnd(Dk, 40 + t, -1.0f, -0.1f);
      kda_step(S.data(), qk.data(), k.data(), v.data(), g.data(), 0.5f, 0.25f, o.data(), Dk, tmp.data());
      all.insert(all.end(), o.begin(), o.end());
    }
    kda_out.push_back(all);
  }
  for (size_t i = 0; i < kda_out[0].size(); ++i)
    EXPECT_NEAR(kda_out[0][i], kda_out[1][i], 1e-5 * (1 + std::fabs(kda_out[0][i])));
  EXPECT_FALSE(same_bits(idx_out[0], idx_out[1])) << "indexer_scores did not change path with the level";
  EXPECT_FALSE(same_bits(attn_out[0], attn_out[1])) << "mla_attend_sparse did not change path with the level";
  EXPECT_FALSE(same_bits(kda_out[0], kda_out[1])) << "kda_step did not change path with the level";
}

// --indexer-int8: the int8 scan at every level against a float64 evaluation of its formula, written
// here from the definition (key_quant.h / attention.h): per row and per query head, scale = max|x| /
// 127 (f32), q = round-half-even(x / scale); score = ks * sum_h w_h qs_h max(0, q_h . k_s). And the
// int8 scores stay close to the exact f32 scores (what the opt-in trades).
TEST(Dispatch, Int8IndexerScoresMatchTheirDefinitionAtEveryLevel) {
  IsaRestore restore;
  const int D = 128, n = 37;  // 37: full blocks of 8 and 4 keys plus single-key tails
  auto quant = [](const float* x, int len, std::vector<int>& q) {
    float amax = 0.0f;
    for (int i = 0; i < len; ++i) amax = std::max(amax, std::fabs(x[i]));
    const float scale = amax / 127.0f;
    q.assign(static_cast<size_t>(len), 0);
    for (int i = 0; i < len; ++i) q[static_cast<size_t>(i)] = scale > 0.0f ? static_cast<int>(std::nearbyint(x[i] / scale)) : 0;
    return scale;
  };
  for (int H : {32, 64, 20, 80}) {  // 20: padded head lanes; 80: more heads than the SIMD scan takes
    const auto q = rnd(static_cast<size_t>(H * D), 100 + H, -1.0f, 1.0f);
    auto w = rnd(static_cast<size_t>(H), 200 + H, -1.0f, 1.0f);
    auto kf = rnd(static_cast<size_t>(n * D), 300 + H, -2.0f, 2.0f);
    for (int i = 0; i < D; ++i) kf[static_cast<size_t>(5 * D + i)] = 0.0f;  // an all-zero key (scale 0)
    std::vector<uint8_t> rows(static_cast<size_t>(n * (D + 8)));
    for (int s = 0; s < n; ++s) quantize_key_i8(kf.data() + s * D, D, rows.data() + s * (D + 8));
    std::vector<double> ref(static_cast<size_t>(n));
    std::vector<float> f32ref(static_cast<size_t>(n));
    std::vector<int> qq, kq;
    for (int s = 0; s < n; ++s) {
      const double ks = quant(kf.data() + s * D, D, kq);
      double acc = 0.0, accf = 0.0;
      for (int h = 0; h < H; ++h) {
        const double qs = quant(q.data() + h * D, D, qq);
        long long dot = 0;
        double fdot = 0.0;
        for (int i = 0; i < D; ++i) {
          dot += static_cast<long long>(qq[static_cast<size_t>(i)]) * kq[static_cast<size_t>(i)];
          fdot += double(q[static_cast<size_t>(h * D + i)]) * kf[static_cast<size_t>(s * D + i)];
        }
        acc += double(w[static_cast<size_t>(h)]) * qs * std::max(0.0, double(dot));
        accf += double(w[static_cast<size_t>(h)]) * std::max(0.0, fdot);
      }
      ref[static_cast<size_t>(s)] = acc * ks;
      f32ref[static_cast<size_t>(s)] = static_cast<float>(accf);
    }
    std::vector<uint8_t> qp(idx_query_i8_bytes(H, D));
    prep_idx_query_i8(q.data(), w.data(), H, D, qp.data());
    double num = 0.0, den = 0.0;
    for (Isa isa : isa_levels()) {
      set_isa(isa);
      std::vector<float> sc(static_cast<size_t>(n));
      indexer_scores_i8(qp.data(), H, rows.data(), D, n, sc.data());
      for (int s = 0; s < n; ++s) {
        const double r = ref[static_cast<size_t>(s)];
        ASSERT_NEAR(sc[static_cast<size_t>(s)], r, 1e-5 * (1.0 + std::fabs(r))) << isa_name(isa) << " H=" << H << " key " << s;
        const double e = sc[static_cast<size_t>(s)] - f32ref[static_cast<size_t>(s)];
        num += e * e;
        den += double(f32ref[static_cast<size_t>(s)]) * f32ref[static_cast<size_t>(s)];
      }
      EXPECT_EQ(sc[5], 0.0f) << "all-zero key";
    }
    EXPECT_LT(std::sqrt(num / den), 0.02) << "int8 scores far from the f32 scores, H=" << H;
  }
}

// What the code promises bit for bit across levels: f16 / bf16 row conversions.
TEST(Dispatch, RowConversionsAreBitIdenticalAtEveryLevel) {
  IsaRestore restore;
  const int n = 1000;
  auto x = rnd(n, 8, -70000.0f, 70000.0f);  // f16 overflow to inf included
  x[3] = NAN;
  x[5] = 1e-7f;  // f16 subnormal
  std::vector<uint16_t> h0(n), b0(n);
  for (int i = 0; i < n; ++i) h0[i] = f32_to_f16(x[i]), b0[i] = f32_to_bf16(x[i]);
  for (Isa isa : isa_levels()) {
    set_isa(isa);
    std::vector<uint16_t> h(n), b(n);
    std::vector<float> back(n), bback(n);
    f32_to_f16_row(x.data(), h.data(), n);
    vec::f32_to_bf16_row(x.data(), b.data(), n);
    f16_to_f32_row(h.data(), back.data(), n);
    vec::bf16_to_f32_row(b.data(), bback.data(), n);
    for (int i = 0; i < n; ++i) {
      if (i == 3) continue;  // NaN: payload not specified
      ASSERT_EQ(h[i], h0[i]) << isa_name(isa) << " i=" << i;
      ASSERT_EQ(b[i], b0[i]) << isa_name(isa) << " i=" << i;
      const float hf = f16_to_f32(h0[i]), bf = bf16_to_f32(b0[i]);
      ASSERT_EQ(std::memcmp(&back[i], &hf, 4), 0) << isa_name(isa) << " i=" << i;
      ASSERT_EQ(std::memcmp(&bback[i], &bf, 4), 0) << isa_name(isa) << " i=" << i;
    }
  }
}
