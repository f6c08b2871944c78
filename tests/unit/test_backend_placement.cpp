// Weight placement rules (backend/placement.h): -ngl, --cpu-moe, --n-cpu-moe, -ot, parts kept
// together, clear errors. Expected devices are worked out by hand from the rule text.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "backend/placement.h"
#include "util/error.h"

using namespace kimi;

namespace {

// the tensor names of a small model: 4 layers, layer 0 dense, 1..3 MoE, layer 2 MLA (with indexer)
std::vector<std::string> names() {
  std::vector<std::string> v{"token_embd.weight", "output_norm.weight", "output.weight", "output_res_score.weight"};
  for (int il = 0; il < 4; ++il) {
    auto n = [&](const char* s) { return "blk." + std::to_string(il) + "." + s; };
    for (const char* s : {"attn_norm.weight", "ffn_norm.weight", "attn_res_score.weight", "attn_output.weight"})
      v.push_back(n(s));
    if (il == 2)
      for (const char* s : {"attn_q_a.weight", "attn_kv_a_mqa.weight", "indexer.attn_k.weight"}) v.push_back(n(s));
    else
      for (const char* s : {"attn_q.weight", "ssm_conv1d_q.weight", "ssm_a"}) v.push_back(n(s));
    if (il == 0)
      for (const char* s : {"ffn_gate.weight", "ffn_up.weight", "ffn_down.weight"}) v.push_back(n(s));
    else
      for (const char* s : {"ffn_gate_inp.weight", "exp_probs_b.bias", "ffn_gate_exps.weight", "ffn_up_exps.weight",
                            "ffn_down_exps.weight", "ffn_gate_shexp.weight", "ffn_routed_down.weight"})
        v.push_back(n(s));
  }
  return v;
}

const std::vector<std::string> kTwo{"cpu", "dev1"};

}  // namespace

TEST(BackendPlacement, PartOfTensorNames) {
  int32_t il = 0;
  EXPECT_EQ(placement_part_of("token_embd.weight", &il), PlacementPart::Input);
  EXPECT_EQ(il, -1);
  EXPECT_EQ(placement_part_of("output_res_score.weight", &il), PlacementPart::Output);
  EXPECT_EQ(placement_part_of("blk.12.indexer.k_norm.bias", &il), PlacementPart::Attn);
  EXPECT_EQ(il, 12);
  EXPECT_EQ(placement_part_of("blk.3.ssm_a", &il), PlacementPart::Attn);
  EXPECT_EQ(placement_part_of("blk.3.ffn_gate_inp.weight", &il), PlacementPart::Ffn);
  EXPECT_EQ(placement_part_of("blk.3.exp_probs_b.bias", &il), PlacementPart::Ffn);
  EXPECT_EQ(placement_part_of("blk.3.ffn_down_shexp.weight", &il), PlacementPart::Ffn);
  EXPECT_EQ(placement_part_of("blk.3.ffn_up_exps.weight", &il), PlacementPart::Experts);
  EXPECT_EQ(il, 3);
}

TEST(BackendPlacement, DefaultAndCpuOnlyEverythingOnDevice0) {
  PlacementRules r;
  Placement p = resolve_placement(r, kTwo, names(), 4);
  EXPECT_TRUE(p.single_device());
  r.n_gpu_layers = -1;  // no accelerator: ignored
  p = resolve_placement(r, {"cpu"}, names(), 4);
  EXPECT_TRUE(p.single_device());
  for (const auto& n : names()) EXPECT_EQ(p.device_of(n), 0) << n;
}

TEST(BackendPlacement, NglTakesTheLastLayers) {
  PlacementRules r;
  r.n_gpu_layers = 2;
  Placement p = resolve_placement(r, kTwo, names(), 4);
  EXPECT_EQ(p.attn, (std::vector<int>{0, 0, 1, 1}));
  EXPECT_EQ(p.ffn, (std::vector<int>{0, 0, 1, 1}));
  EXPECT_EQ(p.experts, (std::vector<int>{0, 0, 1, 1}));
  EXPECT_EQ(p.output, 0);  // N <= n_layer: the head stays
  EXPECT_EQ(p.input, 0);
  EXPECT_EQ(p.device_of("blk.2.indexer.attn_k.weight"), 1);
  EXPECT_EQ(p.device_of("blk.1.ffn_up_exps.weight"), 0);
  EXPECT_EQ(p.device_of("output.weight"), 0);
  r.n_gpu_layers = 5;  // > n_layer: the output part too
  p = resolve_placement(r, kTwo, names(), 4);
  EXPECT_EQ(p.attn, (std::vector<int>{1, 1, 1, 1}));
  EXPECT_EQ(p.output, 1);
  EXPECT_EQ(p.device_of("output_res_score.weight"), 1);
  EXPECT_EQ(p.device_of("token_embd.weight"), 0);
}

TEST(BackendPlacement, NglSplitsOverSeveralAccelerators) {
  PlacementRules r;
  r.n_gpu_layers = 3;  // layers 1,2,3 over devices 1 and 2: j*2/3 = 0,0,1 -> 1,1,2
  Placement p = resolve_placement(r, {"cpu", "a", "b"}, names(), 4);
  EXPECT_EQ(p.attn, (std::vector<int>{0, 1, 1, 2}));
  r.n_gpu_layers = -1;  // 4 layers: 0,0,1,1 -> 1,1,2,2; output on the last device
  p = resolve_placement(r, {"cpu", "a", "b"}, names(), 4);
  EXPECT_EQ(p.attn, (std::vector<int>{1, 1, 2, 2}));
  EXPECT_EQ(p.output, 2);
}

TEST(BackendPlacement, CpuMoeKeepsRoutedExpertsOnTheHost) {
  PlacementRules r;
  r.n_gpu_layers = -1;
  r.cpu_moe = true;
  Placement p = resolve_placement(r, kTwo, names(), 4);
  EXPECT_EQ(p.experts, (std::vector<int>{0, 0, 0, 0}));
  EXPECT_EQ(p.ffn, (std::vector<int>{1, 1, 1, 1}));  // router and shared experts move
  EXPECT_EQ(p.device_of("blk.3.ffn_gate_shexp.weight"), 1);
  EXPECT_EQ(p.device_of("blk.3.ffn_gate_exps.weight"), 0);
  r.cpu_moe = false;
  r.n_cpu_moe = 2;
  p = resolve_placement(r, kTwo, names(), 4);
  EXPECT_EQ(p.experts, (std::vector<int>{0, 0, 1, 1}));
}

TEST(BackendPlacement, OverridesWinInOrder) {
  PlacementRules r;
  r.n_gpu_layers = -1;
  r.overrides = parse_tensor_overrides("blk\\.1\\.=CPU,exps=1,blk\\.3\\.ffn_.*_exps=0");
  ASSERT_EQ(r.overrides.size(), 3u);
  EXPECT_EQ(r.overrides[0].pattern, "blk\\.1\\.");
  EXPECT_EQ(r.overrides[0].device, "CPU");
  Placement p = resolve_placement(r, kTwo, names(), 4);
  EXPECT_EQ(p.attn, (std::vector<int>{1, 0, 1, 1}));
  EXPECT_EQ(p.ffn, (std::vector<int>{1, 0, 1, 1}));
  // layer 1's experts matched the first rule (cpu); layer 3's matched 'exps=1' before rule 3
  EXPECT_EQ(p.experts, (std::vector<int>{1, 0, 1, 1}));
  // -ot can also move parts off the host without -ngl
  PlacementRules r2;
  r2.overrides = parse_tensor_overrides("blk\\.2\\.=dev1");
  p = resolve_placement(r2, kTwo, names(), 4);
  EXPECT_EQ(p.attn, (std::vector<int>{0, 0, 1, 0}));
  EXPECT_EQ(p.ffn, (std::vector<int>{0, 0, 1, 0}));
  EXPECT_EQ(p.experts, (std::vector<int>{0, 0, 1, 0}));
  EXPECT_NE(p.summary().find("device 1 (dev1): attn 2 ffn 2 experts 2"), std::string::npos) << p.summary();
}

TEST(BackendPlacement, ErrorsNameWhatIsWrong) {
  auto msg = [](const PlacementRules& r) {
    try {
      resolve_placement(r, kTwo, names(), 4);
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  PlacementRules r;
  r.overrides = parse_tensor_overrides("attn_q=gpu7");
  EXPECT_NE(msg(r).find("unknown device 'gpu7'"), std::string::npos) << msg(r);
  r.overrides = parse_tensor_overrides("blk\\.(=1");
  EXPECT_NE(msg(r).find("not a valid regular expression"), std::string::npos) << msg(r);
  r.overrides = parse_tensor_overrides("blk\\.1\\.attn_q=1");  // splits layer 1's attention
  const std::string m = msg(r);
  EXPECT_NE(m.find("blk.1.attn_q.weight"), std::string::npos) << m;
  EXPECT_NE(m.find("layer 1's attn"), std::string::npos) << m;
  EXPECT_THROW(parse_tensor_overrides("noequals"), Error);
  EXPECT_THROW(parse_tensor_overrides("=1"), Error);
  EXPECT_THROW(parse_tensor_overrides("a=1,"), Error);
  PlacementRules bad;
  bad.n_gpu_layers = -2;
  EXPECT_NE(msg(bad).find("-ngl"), std::string::npos);
}
