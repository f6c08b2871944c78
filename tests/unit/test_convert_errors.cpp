// `kimi convert` refuses malformed checkpoints with a message naming the tensor / key / file, exits
// non-zero and leaves no output file. Each case corrupts a copy of the tiny synthetic checkpoint.
#include <gtest/gtest.h>

#include <filesystem>
#include <functional>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "io/safetensors.h"
#include "test_util.h"

namespace fs = std::filesystem;
using kimi::test::TempDir;
using nlohmann::json;

namespace {

struct Entry {
  kimi::st::Dtype dtype;
  std::vector<int64_t> shape;
  std::string bytes;
};
using Shard = std::map<std::string, Entry>;

std::string copy_tiny(const TempDir& td) {
  std::string dst = td.file("hf");
  fs::copy(kimi::test::tiny_hf(), dst, fs::copy_options::recursive);
  return dst;
}

json load_json(const std::string& p) { return json::parse(kimi::test::read_file(p)); }
void save_json(const std::string& p, const json& j) { kimi::test::write_file(p, j.dump(2)); }

std::string shard_of(const std::string& dir, const std::string& tensor) {
  return load_json(dir + "/model.safetensors.index.json")["weight_map"].at(tensor).get<std::string>();
}

// Rewrites one shard through `edit` (tensors by name) and keeps the index's weight_map in sync.
void edit_shard(const std::string& dir, const std::string& shard, const std::function<void(Shard&)>& edit) {
  Shard s;
  {
    auto ck = kimi::st::Checkpoint::open(dir + "/" + shard);
    for (const auto& n : ck->names()) {
      const auto& t = ck->get(n);
      s[n] = Entry{t.dtype, t.shape, std::string(reinterpret_cast<const char*>(t.data), t.nbytes)};
    }
  }
  Shard before_keys = s;
  edit(s);
  std::string tmp = dir + "/" + shard + ".new";
  {
    kimi::st::Writer w(tmp);
    for (auto& [n, e] : s) w.add_tensor(n, e.dtype, e.shape);
    w.begin();
    for (auto& [n, e] : s) w.write(n, e.bytes.data(), e.bytes.size());
    w.finish();
  }
  fs::rename(tmp, dir + "/" + shard);
  json idx = load_json(dir + "/model.safetensors.index.json");
  for (auto& [n, e] : before_keys)
    if (!s.count(n)) idx["weight_map"].erase(n);
  for (auto& [n, e] : s) idx["weight_map"][n] = shard;
  save_json(dir + "/model.safetensors.index.json", idx);
}

// Runs convert on `dir`; expects failure with `needle` in the output and no file left behind.
void expect_refusal(const std::string& dir, const std::string& needle, const std::string& extra = "") {
  TempDir out;
  auto r = kimi::test::run_kimi("convert " + dir + " -o " + out.file("out.gguf") + " --quiet " + extra);
  EXPECT_NE(r.exit_code, 0) << r.out;
  EXPECT_NE(r.out.find(needle), std::string::npos) << "expected '" << needle << "' in:\n" << r.out;
  EXPECT_TRUE(fs::is_empty(out.path)) << "output directory not empty after a refused conversion";
}

const std::string P = "language_model.model.layers.";

}  // namespace

TEST(ConvertErrors, BaselineConverts) {
  TempDir td;
  std::string dir = copy_tiny(td);
  auto r = kimi::test::run_kimi("convert " + dir + " -o " + td.file("ok.gguf") + " --quiet");
  ASSERT_EQ(r.exit_code, 0) << r.out;
  EXPECT_TRUE(fs::exists(td.file("ok.gguf")));
}

TEST(ConvertErrors, MissingShard) {
  TempDir td;
  std::string dir = copy_tiny(td);
  std::string shard = shard_of(dir, P + "7.input_layernorm.weight");
  fs::remove(dir + "/" + shard);
  expect_refusal(dir, shard);
}

TEST(ConvertErrors, ShapeMismatch) {
  TempDir td;
  std::string dir = copy_tiny(td);
  const std::string n = P + "0.mlp.down_proj.weight";  // [64, 128] in the tiny preset
  edit_shard(dir, shard_of(dir, n), [&](Shard& s) { s.at(n).shape = {128, 64}; });
  expect_refusal(dir, "tensor '" + n + "'");
  expect_refusal(dir, "shape [128, 64] but the config implies [64, 128]");
}

TEST(ConvertErrors, UnknownTensor) {
  TempDir td;
  std::string dir = copy_tiny(td);
  const std::string n = P + "2.self_attn.mystery_proj.weight";
  edit_shard(dir, shard_of(dir, P + "2.input_layernorm.weight"),
             [&](Shard& s) { s[n] = Entry{kimi::st::Dtype::BF16, {4}, std::string(8, '\0')}; });
  expect_refusal(dir, "tensor '" + n + "'");
  expect_refusal(dir, "unrecognized tensor");
}

TEST(ConvertErrors, MissingTensor) {
  TempDir td;
  std::string dir = copy_tiny(td);
  const std::string n = P + "5.self_attn.dt_bias";
  edit_shard(dir, shard_of(dir, n), [&](Shard& s) { s.erase(n); });
  expect_refusal(dir, "tensor '" + n + "' missing");
}

TEST(ConvertErrors, WeightPackedOnAttention) {
  TempDir td;
  std::string dir = copy_tiny(td);
  const std::string n = P + "3.self_attn.q_a_proj.weight";
  edit_shard(dir, shard_of(dir, n), [&](Shard& s) {
    Entry e = s.at(n);
    s.erase(n);
    e.dtype = kimi::st::Dtype::U8;
    e.shape = {static_cast<int64_t>(e.bytes.size())};
    s[n + "_packed"] = e;
  });
  expect_refusal(dir, "tensor '" + n + "_packed'");
  expect_refusal(dir, "weight_packed outside the routed experts");
}

TEST(ConvertErrors, DtypeMismatch) {
  TempDir td;
  std::string dir = copy_tiny(td);
  const std::string n = P + "0.input_layernorm.weight";
  edit_shard(dir, shard_of(dir, n), [&](Shard& s) { s.at(n).dtype = kimi::st::Dtype::I16; });
  expect_refusal(dir, "tensor '" + n + "'");
  expect_refusal(dir, "dtype I16");
}

TEST(ConvertErrors, IndexerTensorInKdaLayer) {
  TempDir td;
  std::string dir = copy_tiny(td);
  const std::string n = P + "1.self_attn.indexer.wk.weight";  // layer 1 is KDA (full_attn_layers [4, 8])
  edit_shard(dir, shard_of(dir, P + "1.input_layernorm.weight"),
             [&](Shard& s) { s[n] = Entry{kimi::st::Dtype::BF16, {16, 64}, std::string(16 * 64 * 2, '\0')}; });
  expect_refusal(dir, "tensor '" + n + "'");
  expect_refusal(dir, "not a full-attention layer");
}

TEST(ConvertErrors, IndexerRopeSetting) {
  TempDir td;
  std::string dir = copy_tiny(td);
  json c = load_json(dir + "/config.json");
  c["text_config"]["indexer_rope_interleave"] = true;
  save_json(dir + "/config.json", c);
  expect_refusal(dir, "indexer_rope_interleave");
  c["text_config"].erase("indexer_rope_interleave");
  c["index_rope_theta"] = 10000.0;  // root level counts too
  save_json(dir + "/config.json", c);
  expect_refusal(dir, "index_rope_theta");
}

TEST(ConvertErrors, BadJson) {
  TempDir td;
  std::string dir = copy_tiny(td);
  std::string text = kimi::test::read_file(dir + "/config.json");
  kimi::test::write_file(dir + "/config.json", text.substr(0, text.size() / 2));
  expect_refusal(dir, "config.json");
  expect_refusal(dir, "invalid JSON");
}

TEST(ConvertErrors, BadTokenizerConfigJson) {
  TempDir td;
  std::string dir = copy_tiny(td);
  kimi::test::write_file(dir + "/tokenizer_config.json", "{\"added_tokens_decoder\": {");
  expect_refusal(dir, "tokenizer_config.json");
}

// A field of the wrong JSON type gets a message naming the file, the entry and the field (fuzz_tokenizer_config
// found `"special": "no"` ending the process through the JSON library's own exception).
TEST(ConvertErrors, WronglyTypedTokenizerField) {
  TempDir td;
  std::string dir = copy_tiny(td);
  json tc = load_json(dir + "/tokenizer_config.json");
  ASSERT_TRUE(tc.contains("added_tokens_decoder") && !tc["added_tokens_decoder"].empty());
  const std::string first = tc["added_tokens_decoder"].begin().key();
  tc["added_tokens_decoder"][first]["special"] = "no";
  save_json(dir + "/tokenizer_config.json", tc);
  expect_refusal(dir, "tokenizer_config.json: added_tokens_decoder[" + first + "]: 'special' must be true or false");
  tc["added_tokens_decoder"][first]["special"] = nullptr;  // null = absent: the default applies
  save_json(dir + "/tokenizer_config.json", tc);
  auto r = kimi::test::run_kimi("convert " + dir + " -o " + td.file("ok.gguf") + " --quiet");
  EXPECT_EQ(r.exit_code, 0) << r.out;
}

TEST(ConvertErrors, WrongArchitecture) {
  TempDir td;
  std::string dir = copy_tiny(td);
  json c = load_json(dir + "/config.json");
  c["architectures"] = json::array({"DeepseekV3ForCausalLM"});
  save_json(dir + "/config.json", c);
  expect_refusal(dir, "unsupported architecture 'DeepseekV3ForCausalLM'");
}

TEST(ConvertErrors, BadOptions) {
  TempDir td;
  std::string dir = kimi::test::tiny_hf();
  expect_refusal(dir, "--layers 9 out of range", "--layers 9");
  expect_refusal(dir, "invalid size 'lots'", "--split-max-size lots");
  expect_refusal(dir, "--outtype", "--outtype q4_0");
  expect_refusal(td.path + "/nonexistent", "not a directory");
}
