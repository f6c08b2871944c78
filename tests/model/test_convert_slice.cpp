// The seed's slice check: tiny checkpoint -> `kimi convert --layers 8` -> `kimi verify`: every tensor
// exact, indexer metadata equal to config.json, verify's summary line parsed and checked.
// Also a shorter slice (--layers 4, which ends on the first full-attention layer).
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <regex>
#include <string>

#include "io/gguf.h"
#include "test_util.h"

using kimi::test::run_kimi;
using kimi::test::TempDir;

namespace {

void slice_check(int layers, int want_tensors) {
  std::string hf = kimi::test::tiny_hf();
  TempDir td;
  std::string out = td.file("slice.gguf");
  auto c = run_kimi("convert " + hf + " -o " + out + " --layers " + std::to_string(layers));
  ASSERT_EQ(c.exit_code, 0) << c.out;
  // the vision tower + projector go to the companion projector file (docs/spec/vision.md §2.2):
  // 2 + 6 per block (tiny: 2 blocks) + 4 projector tensors, each exactly its source
  EXPECT_NE(c.out.find("slice.mmproj.gguf (vision tower + projector: 18 tensors"), std::string::npos) << c.out;
  auto vv = run_kimi("verify " + hf + " " + td.file("slice.mmproj.gguf"));
  ASSERT_EQ(vv.exit_code, 0) << vv.out;
  EXPECT_NE(vv.out.find("verified 18 tensors: 18 exact, 0 mismatched; metadata: 15 keys match"), std::string::npos)
      << vv.out;

  auto v = run_kimi("verify " + hf + " " + out);
  ASSERT_EQ(v.exit_code, 0) << v.out;
  std::smatch m;
  static const std::regex re(R"(verified (\d+) tensors: (\d+) exact, (\d+) mismatched; metadata: (\d+) keys match)");
  ASSERT_TRUE(std::regex_search(v.out, m, re)) << v.out;
  EXPECT_EQ(std::stoi(m[1]), want_tensors);
  EXPECT_EQ(std::stoi(m[2]), want_tensors);
  EXPECT_EQ(std::stoi(m[3]), 0);
  auto g = kimi::gguf::Reader::open(out);
  // every kimi-k3.* key, the tokenizer arrays/ids and the general.* keys verify checks, all matched
  size_t arch_keys = 0;
  for (const auto& kv : g->kvs()) arch_keys += kv.key.rfind("kimi-k3.", 0) == 0;
  EXPECT_GE(static_cast<size_t>(std::stoi(m[4])), arch_keys + 7) << v.out;
  EXPECT_EQ(v.out.find("MISMATCH"), std::string::npos) << v.out;

  // indexer metadata equal to config.json (read here directly)
  auto cfg = nlohmann::json::parse(kimi::test::read_file(hf + "/config.json"));
  const auto& tc = cfg["text_config"];
  EXPECT_EQ(g->get_u32("kimi-k3.attention.indexer.head_count"), tc["index_n_heads"].get<uint32_t>());
  EXPECT_EQ(g->get_u32("kimi-k3.attention.indexer.key_length"), tc["index_head_dim"].get<uint32_t>());
  EXPECT_EQ(g->get_u32("kimi-k3.attention.indexer.top_k"), tc["index_topk"].get<uint32_t>());
  EXPECT_EQ(g->get_u32("kimi-k3.block_count"), static_cast<uint32_t>(layers));
  auto hkv = g->get_int_array("kimi-k3.attention.head_count_kv");
  ASSERT_EQ(hkv.size(), static_cast<size_t>(layers));
  std::vector<int64_t> want(layers, 0);
  for (const auto& l : tc["linear_attn_config"]["full_attn_layers"])
    if (l.get<int>() <= layers) want[l.get<int>() - 1] = 1;  // 1-indexed in the config
  EXPECT_EQ(hkv, want);
  // indexer tensors in exactly the full-attention layers
  for (int il = 0; il < layers; ++il) {
    bool has = g->find_tensor("blk." + std::to_string(il) + ".indexer.proj.weight") != nullptr;
    EXPECT_EQ(has, want[il] == 1) << il;
  }
  EXPECT_EQ(g->find_tensor("blk." + std::to_string(layers) + ".attn_norm.weight"), nullptr);
}

}  // namespace

TEST(ConvertSlice, EightLayersVerifyExact) { slice_check(8, 228); }

TEST(ConvertSlice, FourLayersVerifyExact) { slice_check(4, 4 + 21 + 2 * 29 + 29); }
