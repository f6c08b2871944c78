// `kimi bench`'s ceiling report (app/bench_ceiling.h): the JSON carries the measured ceilings, and
// its percentages are the stated ratios of the fields it reports next to them; the prefill work is
// recomputed here from the GGUF's tensor list (every matmul weight once per prompt token, k of E
// routed experts, the head once, by the arithmetic of each weight type). --no-ceiling leaves it out.
// No speed is asserted.
#include <gtest/gtest.h>

#include <algorithm>
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

TEST(BenchCeiling, TextReportAndOptOut) {
  const std::string g = kimi::test::tiny_gguf(1);
  const auto md = run_kimi("bench -m " + g + " -t 1 -p 8 -n 2 -r 1");
  ASSERT_EQ(md.exit_code, 0) << md.out;
  EXPECT_NE(md.out.find("ceiling ("), std::string::npos) << md.out;
  EXPECT_NE(md.out.find("% of the read ceiling"), std::string::npos) << md.out;
  EXPECT_NE(md.out.find("% of the compute peak"), std::string::npos) << md.out;
  const auto off = run_kimi("bench -m " + g + " -t 1 -p 8 -n 2 -r 1 --no-ceiling");
  ASSERT_EQ(off.exit_code, 0) << off.out;
  EXPECT_EQ(off.out.find("ceiling ("), std::string::npos) << off.out;
  const auto js = bench_json("-t 1 -p 8 -n 2 -r 1 -o jsonl --no-ceiling");
  EXPECT_FALSE(js.contains("ceiling"));
  EXPECT_FALSE(js.contains("tg_pct_of_read_ceiling"));
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
