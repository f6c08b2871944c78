// `kimi bench`'s ceiling report (app/bench_ceiling.h): the JSON carries the measured ceilings, and
// its percentages are the stated ratios of the fields it reports next to them; the prefill work is
// recomputed here from the GGUF's tensor list (every matmul weight once per prompt token, k of E
// routed experts, the head once, by the arithmetic of each weight type). --no-ceiling leaves it out.
// No speed is asserted.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <nlohmann/json.hpp>
#include <string>

#include "io/gguf.h"
#include "test_util.h"

using kimi::test::run_kimi;

namespace {

nlohmann::json bench_json(const std::string& args) {
  const auto r = run_kimi("bench -m " + kimi::test::tiny_gguf(1) + " " + args);
  EXPECT_EQ(r.exit_code, 0) << r.out;
  return nlohmann::json::parse(r.out.substr(r.out.find('{')));
}

TEST(BenchCeiling, PercentagesAreTheRatiosOfTheReportedNumbers) {
  const int n_prompt = 16;
  const auto j = bench_json("-t 2 -p 16 -n 4 -r 2 -o json");
  ASSERT_TRUE(j.contains("ceiling")) << j.dump(2);
  const auto& c = j["ceiling"];
  EXPECT_EQ(c["threads"], 2);
  EXPECT_GT(c["read_gb_s"].get<double>(), 0.0);
  EXPECT_GE(c["read_gb_s"].get<double>(), c["read_one_stream_gb_s"].get<double>());
  for (const char* t : {"f32", "bf16", "int8"}) {
    EXPECT_GT(c["peak_g_ops"][t].get<double>(), 0.0) << t;
    EXPECT_NEAR(c["peak_g_ops"][t].get<double>(), 2 * c["peak_g_ops_per_thread"][t].get<double>(),
                1e-9 * c["peak_g_ops"][t].get<double>());
  }
  // decode: best tg x bytes per token / read ceiling
  std::vector<double> tg = j["tg"]["samples"].get<std::vector<double>>();
  const double best_tg = *std::max_element(tg.begin(), tg.end());
  const double bytes = j["weight_bytes_per_token"].get<double>() + j["cache_bytes_per_token"].get<double>();
  EXPECT_NEAR(j["tg_pct_of_read_ceiling"].get<double>(), 100.0 * best_tg * bytes / (c["read_gb_s"].get<double>() * 1e9),
              1e-9 * j["tg_pct_of_read_ceiling"].get<double>());
  // prefill work from the file
  auto rd = kimi::gguf::Reader::open(kimi::test::tiny_gguf(1));
  const double used = rd->get_u32("kimi-k3.expert_used_count");
  // f32, bf16, int8, int8 tiles (the tiny file: BF16 / F32 weights and MXFP4 experts, default precision fast).
  // The int8 tiles (AMX-INT8: reported as a peak only where they run) take the MXFP4 / Q4_0 / Q8_0 products
  // with >= 16 tokens; a routed expert sees k / E of the prompt's tokens on average.
  const bool tiles = c["peak_g_ops"].contains("int8_tiles");
  EXPECT_EQ(tiles, c["peak_instr"].contains("int8_tiles"));
  double ops[4] = {0, 0, 0, 0};
  for (const auto& t : rd->tensors()) {
    if (t.n_dims < 2 || t.ne[1] <= 1 || t.name == "token_embd.weight") continue;
    double e = double(t.nelements());
    const bool experts = t.name.find("_exps.weight") != std::string::npos;
    if (experts) e = e / double(t.ne[2]) * used;
    const double tokens = t.name == "output.weight" ? 1.0 : n_prompt;
    const double per_product = experts ? tokens * used / double(t.ne[2]) : tokens;
    const bool nib = t.type == kimi::GgmlType::MXFP4 || t.type == kimi::GgmlType::Q4_0 || t.type == kimi::GgmlType::Q8_0;
    const int cls = t.type == kimi::GgmlType::BF16                                   ? 1
                    : (t.type == kimi::GgmlType::F32 || t.type == kimi::GgmlType::F16) ? 0
                    : tiles && nib && per_product >= 16                               ? 3
                                                                                      : 2;
    ops[cls] += 2.0 * e * tokens;
  }
  const char* names[4] = {"f32", "bf16", "int8", "int8_tiles"};
  double ideal = 0;
  for (int k = 0; k < 4; ++k) {
    if (k == 3 && !tiles) {
      EXPECT_FALSE(j["pp_matmul_g_ops"].contains("int8_tiles"));
      continue;
    }
    if (k < 3 || ops[k] > 0)
      EXPECT_NEAR(j["pp_matmul_g_ops"][names[k]].get<double>(), ops[k] / 1e9, 1e-12 + 1e-12 * ops[k]) << names[k];
    ideal += ops[k] > 0 ? ops[k] / (c["peak_g_ops"][names[k]].get<double>() * 1e9) : 0.0;
  }
  EXPECT_GT(ops[0] + ops[1] + ops[2] + ops[3], 0.0);
  EXPECT_NEAR(j["pp_ideal_s"].get<double>(), ideal, 1e-9 * ideal);
  std::vector<double> pp = j["pp"]["samples"].get<std::vector<double>>();
  const double best_pp = *std::max_element(pp.begin(), pp.end());
  EXPECT_NEAR(j["pp_pct_of_compute_peak"].get<double>(), 100.0 * ideal / (n_prompt / best_pp),
              1e-9 * j["pp_pct_of_compute_peak"].get<double>());
}

// The roofline (bench_ceiling.h): each phase's FLOPs and bytes against a hand count from the tiny preset's
// sizes (src/convert/synth.cpp "tiny": d 64, 8 layers with MLA at layers 4 and 8 (1-based), H 4, KDA D 16,
// q_lora 32, kv_lora 32, nope 16, rope 8, v 16, dense FFN 128 on layer 0, 8 experts top-2 of width 32 on a
// latent of 32, 2 shared experts, indexer 4 heads x 16, top-k 16, vocab 1024; weights BF16 but the router and
// the indexer's head weights (F32) and the experts (MXFP4: 17 bytes per 32), F16 cache), 48 prompt tokens in
// micro-batches of 16.
TEST(BenchCeiling, RooflineFlopsAndBytesAreTheHandCount) {
  const int n = 48, u = 16, mb = 3;
  const auto j = bench_json("-t 2 -p 48 -b 16 -n 0 -r 2 -o json");
  ASSERT_TRUE(j.contains("pp_roofline")) << j.dump(2);
  const auto& r = j["pp_roofline"];
  EXPECT_EQ(r["n_prompt"], n);
  EXPECT_EQ(r["n_ubatch"], u);
  EXPECT_EQ(r["micro_batches"], mb);
  const auto& ph = r["phases"];
  const double d = 64, H = 4, D = 16, C = 64, ql = 32, kvl = 32, nope = 16, rope = 8, vd = 16, ff = 128, E = 8,
               k = 2, F = 32, Lt = 32, sw = 2 * 32, HI = 4, DI = 16, topk = 16, V = 1024;
  const double n_kda = 6, n_mla = 2, n_moe = 7;
  // one KDA layer: q, k, v, f_a, f_b, beta, g, output; the recurrence 7 flops per state element
  const double kda_macs = 3 * C * d + D * d + C * D + H * d + C * d + d * C;
  EXPECT_EQ(kda_macs, 22784);
  const double kda_rec = 7 * H * D * D;
  // one MLA layer: q_a, q_b, kv_a_mqa, k_b, v_b, gate, output, indexer q_b, k, weights
  const double mla_macs = ql * d + H * (nope + rope) * ql + (kvl + rope) * d + H * nope * kvl + H * kvl * vd +
                          H * vd * d + d * H * vd + HI * DI * ql + DI * d + HI * d;
  EXPECT_EQ(mla_macs, 23296);
  // attention pairs: token i (1-based) visits min(i, 16) rows; the indexer scores all i rows where i > 16
  double pairs = 0, idx_pairs = 0;
  for (int i = 1; i <= n; ++i) pairs += std::min<double>(i, topk), idx_pairs += i > topk ? i : 0;
  EXPECT_EQ(pairs, 648);
  EXPECT_EQ(idx_pairs, 1040);
  const double mla_f32 = pairs * H * 2 * (2 * kvl + rope) + idx_pairs * 2 * HI * DI;
  // rows a micro-batch sees: 16, 32, 48; each an F16 latent row (r + p) and an F16 indexer key
  const double mla_state = (16 + 32 + 48) * (2 * (kvl + rope) + 2 * DI);
  // FFN: layer 0 dense; MoE layers: router (F32), latent down and up, shared experts
  const double dense_macs = 3 * ff * d, moe_bf16 = Lt * d + d * Lt + 3 * sw * d, router = E * d;
  // routed experts: k of E per token, 3 MXFP4 matrices of F x L each; a micro-batch of 16 picks
  // E (1 - (1 - k/E)^16) distinct experts on average
  const double expert_elems = 3 * F * Lt, distinct = E * (1 - std::pow(1 - k / E, 16.0));
  auto near = [](const nlohmann::json& v, double want, const char* what) {
    EXPECT_NEAR(v.get<double>(), want, 1e-9 * std::abs(want)) << what;
  };
  near(ph["kda"]["flops"], n_kda * n * (2 * kda_macs + kda_rec), "kda flops");
  near(ph["kda"]["weight_bytes"], n_kda * mb * 2 * kda_macs, "kda weights");
  near(ph["kda"]["state_bytes"], n_kda * mb * 4 * H * D * D, "kda state");
  near(ph["mla_indexer"]["flops"], n_mla * (2 * n * mla_macs + mla_f32), "mla flops");
  near(ph["mla_indexer"]["f32_flops"], n_mla * mla_f32, "mla f32 flops");
  near(ph["mla_indexer"]["weight_bytes"], n_mla * mb * (2 * mla_macs + 2 * HI * d), "mla weights");  // proj: F32
  near(ph["mla_indexer"]["state_bytes"], n_mla * mla_state, "mla cache");
  near(ph["routed_experts"]["flops"], n_moe * n * 2 * k * expert_elems, "expert flops");
  near(ph["routed_experts"]["weight_bytes"], n_moe * mb * distinct * expert_elems * 17 / 32, "expert weights");
  near(ph["ffn_shared"]["flops"], n * 2 * (dense_macs + n_moe * (moe_bf16 + router)), "ffn flops");
  near(ph["ffn_shared"]["weight_bytes"], mb * (2 * dense_macs + n_moe * (2 * moe_bf16 + 4 * router)), "ffn weights");
  near(ph["head"]["flops"], 2 * V * d, "head flops");
  near(ph["head"]["weight_bytes"], 2 * V * d, "head weights");
  // the bounds: max(ops / peak per arithmetic, bytes / read ceiling), the measured share the ratio
  const auto& c = j["ceiling"];
  double bound = 0, measured = r["other_measured_s"].get<double>();
  for (const char* p : {"kda", "mla_indexer", "routed_experts", "ffn_shared", "head"}) {
    const auto& x = ph[p];
    double cs = x["f32_flops"].get<double>() / (c["peak_g_ops"]["f32"].get<double>() * 1e9);
    if (x.contains("matmul_flops"))
      for (auto it = x["matmul_flops"].begin(); it != x["matmul_flops"].end(); ++it)
        cs += it.value().get<double>() / (c["peak_g_ops"][it.key()].get<double>() * 1e9);
    const double rs = x["bytes"].get<double>() / (c["read_gb_s"].get<double>() * 1e9);
    near(x["compute_s"], cs, p);
    near(x["read_s"], rs, p);
    near(x["bound_s"], std::max(cs, rs), p);
    EXPECT_GT(x["measured_s"].get<double>(), 0.0) << p;
    near(x["pct_of_bound"], 100 * std::max(cs, rs) / x["measured_s"].get<double>(), p);
    bound += std::max(cs, rs), measured += x["measured_s"].get<double>();
  }
  near(r["bound_s"], bound, "bound");
  std::vector<double> pp = j["pp"]["samples"].get<std::vector<double>>();
  const double best = n / *std::max_element(pp.begin(), pp.end());
  near(r["pass_best_s"], best, "best pass");
  near(r["pct_of_roofline"], 100 * bound / best, "roofline %");
  double mean = 0;  // the mean pass time (of the times, not of the rates)
  for (double x : pp) mean += n / x / double(pp.size());
  near(r["pass_mean_s"], mean, "mean pass");
  // the phases are parts of the pass: their mean is at most the mean pass (plus clock reads)
  EXPECT_LE(measured, mean * 1.001 + 1e-5);
}

TEST(BenchCeiling, TextReportAndOptOut) {
  const std::string g = kimi::test::tiny_gguf(1);
  const auto md = run_kimi("bench -m " + g + " -t 1 -p 8 -n 2 -r 1");
  ASSERT_EQ(md.exit_code, 0) << md.out;
  EXPECT_NE(md.out.find("ceiling ("), std::string::npos) << md.out;
  EXPECT_NE(md.out.find("% of the read ceiling"), std::string::npos) << md.out;
  EXPECT_NE(md.out.find("% of the compute peak"), std::string::npos) << md.out;
  EXPECT_NE(md.out.find("% of the roofline"), std::string::npos) << md.out;
  EXPECT_NE(md.out.find("| routed_experts |"), std::string::npos) << md.out;
  const auto off = run_kimi("bench -m " + g + " -t 1 -p 8 -n 2 -r 1 --no-ceiling");
  ASSERT_EQ(off.exit_code, 0) << off.out;
  EXPECT_EQ(off.out.find("ceiling ("), std::string::npos) << off.out;
  const auto js = bench_json("-t 1 -p 8 -n 2 -r 1 -o jsonl --no-ceiling");
  EXPECT_FALSE(js.contains("ceiling"));
  EXPECT_FALSE(js.contains("tg_pct_of_read_ceiling"));
  EXPECT_FALSE(js.contains("pp_roofline"));
}

TEST(BenchCeiling, ThreadPlacementFlags) {
  const std::string g = kimi::test::tiny_gguf(1);
  // pinned to CPU 0 twice: runs, and -v names the placement
  const auto r = run_kimi("bench -m " + g + " -p 4 -n 2 -r 1 --no-ceiling -v --cpu-affinity 0,0");
  ASSERT_EQ(r.exit_code, 0) << r.out;
  EXPECT_NE(r.out.find("threads pinned to CPUs 0,0"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("|       2 |"), std::string::npos) << "-t 0 takes one thread per listed CPU\n" << r.out;
  const auto n = run_kimi("bench -m " + g + " -t 1 -p 4 -n 2 -r 1 --no-ceiling --numa distribute");
  if (n.out.find("libnuma") != std::string::npos) {
    EXPECT_EQ(n.exit_code, 2) << n.out;  // a build without libnuma says so, as a usage error
  } else {
    EXPECT_EQ(n.exit_code, 0) << n.out;
  }
}

}  // namespace
