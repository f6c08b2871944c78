// HF config.json loader: text_config merge, quantization_config, full_attn_layers, errors.
#include <gtest/gtest.h>

#include <functional>
#include <string>
#include <vector>

#include "io/hf_config.h"
#include "test_util.h"
#include "util/error.h"

using kimi::HfConfig;

namespace {

void expect_error(const std::function<void()>& fn, const std::vector<std::string>& parts) {
  try {
    fn();
  } catch (const kimi::Error& e) {
    std::string msg = e.what();
    for (const auto& p : parts) EXPECT_NE(msg.find(p), std::string::npos) << "message: " << msg << "\nmissing: " << p;
    return;
  } catch (const std::exception& e) {
    ADD_FAILURE() << "expected kimi::Error, got other exception: " << e.what();
    return;
  }
  ADD_FAILURE() << "expected kimi::Error containing '" << (parts.empty() ? "" : parts[0]) << "', nothing thrown";
}

// A K3-shaped config (nested text_config), values from k3-architecture.md §1.2.
const char* kK3 = R"({
  "architectures": ["KimiK3ForConditionalGeneration"],
  "model_type": "kimi_k3",
  "media_placeholder_token_id": 163605,
  "vocab_size": 1,
  "tie_word_embeddings": true,
  "vision_config": {"hidden_size": 1152},
  "text_config": {
    "architectures": ["KimiLinearForCausalLM"],
    "model_type": "kimi_linear",
    "num_hidden_layers": 93,
    "hidden_size": 7168,
    "vocab_size": 163840,
    "rms_norm_eps": 1e-5,
    "activation_situ_beta": 4.0,
    "routed_scaling_factor": 1,
    "tie_word_embeddings": false,
    "mla_use_nope": true,
    "hidden_act": "situ",
    "linear_attn_config": {
      "full_attn_layers": [4, 8, 12, 16, 20, 24, 28, 32, 36, 40, 44, 48, 52, 56, 60, 64, 68, 72, 76, 80, 84, 88, 92, 93],
      "head_dim": 128, "short_conv_kernel_size": 4, "gate_lower_bound": -5.0
    },
    "quantization_config": {
      "quant_method": "compressed-tensors",
      "format": "mxfp4-pack-quantized",
      "config_groups": {"group_0": {"targets": ["Linear"], "weights": {"num_bits": 4, "group_size": 32}}},
      "ignore": ["lm_head"]
    }
  }
})";

}  // namespace

TEST(HfConfig, MergePrecedence) {
  auto c = HfConfig::parse(kK3, "k3/config.json");
  EXPECT_EQ(c.path, "k3/config.json");
  // root architecture is the routing key, not the nested one
  EXPECT_EQ(c.top_architecture(), "KimiK3ForConditionalGeneration");
  // text_config overrides root keys
  EXPECT_EQ(c.get_int("vocab_size"), 163840);
  EXPECT_FALSE(c.get_bool("tie_word_embeddings"));
  EXPECT_EQ(c.get_str("model_type"), "kimi_linear");
  // root-only keys remain visible
  EXPECT_EQ(c.get_int("media_placeholder_token_id"), 163605);
  EXPECT_TRUE(c.has("vision_config"));
  // text_config-only keys
  EXPECT_EQ(c.get_int("num_hidden_layers"), 93);
  EXPECT_EQ(c.get_int("hidden_size"), 7168);
  EXPECT_DOUBLE_EQ(c.get_float("rms_norm_eps"), 1e-5);
  EXPECT_DOUBLE_EQ(c.get_float("activation_situ_beta"), 4.0);
  EXPECT_DOUBLE_EQ(c.get_float("routed_scaling_factor"), 1.0);  // integer accepted as float
  EXPECT_TRUE(c.get_bool("mla_use_nope"));
  EXPECT_EQ(c.get_str("hidden_act"), "situ");
  // the file as read is kept untouched
  EXPECT_EQ(c.root["vocab_size"], 1);
  EXPECT_EQ(c.root["text_config"]["vocab_size"], 163840);
  // dotted paths reach nested objects
  EXPECT_EQ(c.get_int("linear_attn_config.head_dim"), 128);
  EXPECT_DOUBLE_EQ(c.get_float("linear_attn_config.gate_lower_bound"), -5.0);
  EXPECT_FALSE(c.has("linear_attn_config.num_heads"));
  EXPECT_EQ(c.get("linear_attn_config")["short_conv_kernel_size"], 4);
}

TEST(HfConfig, FlatConfig) {
  auto c = HfConfig::parse(R"({"architectures":["X"],"hidden_size":64,"rms_norm_eps":1e-6})", "flat.json");
  EXPECT_EQ(c.top_architecture(), "X");
  EXPECT_EQ(c.get_int("hidden_size"), 64);
  EXPECT_EQ(c.merged, c.root);
  EXPECT_EQ(HfConfig::parse("{}", "e.json").top_architecture(), "");
  EXPECT_EQ(HfConfig::parse(R"({"architectures":[]})", "e.json").top_architecture(), "");
}

TEST(HfConfig, Defaults) {
  auto c = HfConfig::parse(R"({"a":3,"b":null,"f":0.5,"t":true})", "d.json");
  EXPECT_EQ(c.get_int_or("a", 7), 3);
  EXPECT_EQ(c.get_int_or("missing", 7), 7);
  EXPECT_EQ(c.get_int_or("b", 7), 7);  // null counts as absent
  EXPECT_FALSE(c.has("b"));
  EXPECT_DOUBLE_EQ(c.get_float_or("f", 1.5), 0.5);
  EXPECT_DOUBLE_EQ(c.get_float_or("missing", 1.5), 1.5);
  EXPECT_TRUE(c.get_bool_or("t", false));
  EXPECT_TRUE(c.get_bool_or("missing", true));
  // present but mistyped is an error even with a default
  expect_error([&] { c.get_int_or("f", 1); }, {"d.json", "key 'f'", "expected integer"});
  expect_error([&] { c.get_bool_or("a", false); }, {"d.json", "key 'a'", "expected boolean"});
}

TEST(HfConfig, QuantizationConfigNested) {
  auto c = HfConfig::parse(kK3, "k3.json");
  auto q = c.quantization_config();
  ASSERT_TRUE(q.is_object());
  EXPECT_EQ(q["quant_method"], "compressed-tensors");
  EXPECT_TRUE(c.experts_mxfp4_packed());
}

TEST(HfConfig, QuantizationConfigRoot) {
  auto c = HfConfig::parse(
      R"({"quantization_config":{"quant_method":"compressed-tensors","format":"mxfp4-pack-quantized"},"text_config":{"hidden_size":8}})",
      "r.json");
  EXPECT_TRUE(c.experts_mxfp4_packed());
  EXPECT_EQ(c.get_int("hidden_size"), 8);
}

TEST(HfConfig, QuantizationConfigTextOverridesRoot) {
  auto c = HfConfig::parse(
      R"({"quantization_config":{"quant_method":"compressed-tensors","format":"mxfp4-pack-quantized"},
          "text_config":{"quantization_config":{"quant_method":"fp8","weight_block_size":[128,128]}}})",
      "o.json");
  EXPECT_EQ(c.quantization_config()["quant_method"], "fp8");
  EXPECT_FALSE(c.experts_mxfp4_packed());
}

TEST(HfConfig, QuantizationVariants) {
  EXPECT_TRUE(HfConfig::parse(R"({})", "a").quantization_config().is_null());
  EXPECT_FALSE(HfConfig::parse(R"({})", "a").experts_mxfp4_packed());
  EXPECT_FALSE(HfConfig::parse(R"({"quantization_config":{"quant_method":"compressed-tensors","format":"float-quantized"}})", "a")
                   .experts_mxfp4_packed());
  EXPECT_FALSE(HfConfig::parse(R"({"quantization_config":{"quant_method":"mxfp4","format":"mxfp4-pack-quantized"}})", "a")
                   .experts_mxfp4_packed());
  // format given only per config group
  EXPECT_TRUE(HfConfig::parse(
                  R"({"quantization_config":{"quant_method":"compressed-tensors","config_groups":{"g0":{"format":"mxfp4-pack-quantized"}}}})",
                  "a")
                  .experts_mxfp4_packed());
  expect_error([] { HfConfig::parse(R"({"quantization_config":"yes"})", "q.json").quantization_config(); },
               {"q.json", "key 'quantization_config'", "expected object"});
  expect_error([] {
    HfConfig::parse(R"({"quantization_config":{"quant_method":"compressed-tensors","format":3}})", "q.json")
        .experts_mxfp4_packed();
  }, {"q.json", "quantization_config.format", "expected string"});
}

TEST(HfConfig, FullAttnLayers) {
  auto c = HfConfig::parse(kK3, "k3.json");
  auto v = c.full_attn_layers_1based();
  ASSERT_EQ(v.size(), 24u);
  EXPECT_EQ(v.front(), 4);
  EXPECT_EQ(v[22], 92);
  EXPECT_EQ(v.back(), 93);
  auto tiny = HfConfig::parse(R"({"num_hidden_layers":8,"linear_attn_config":{"full_attn_layers":[4,8]}})", "t.json");
  EXPECT_EQ(tiny.full_attn_layers_1based(), (std::vector<int64_t>{4, 8}));
  auto none = HfConfig::parse(R"({"linear_attn_config":{"full_attn_layers":[]}})", "t.json");
  EXPECT_TRUE(none.full_attn_layers_1based().empty());
}

TEST(HfConfig, FullAttnLayersErrors) {
  auto p = [](const std::string& s) { return HfConfig::parse(s, "fa.json").full_attn_layers_1based(); };
  expect_error([&] { p(R"({})"); }, {"fa.json", "key 'linear_attn_config' missing"});
  expect_error([&] { p(R"({"linear_attn_config":{}})"); }, {"fa.json", "linear_attn_config.full_attn_layers", "missing"});
  expect_error([&] { p(R"({"linear_attn_config":[1]})"); }, {"fa.json", "linear_attn_config", "expected object"});
  expect_error([&] { p(R"({"linear_attn_config":{"full_attn_layers":4}})"); }, {"full_attn_layers", "expected array"});
  expect_error([&] { p(R"({"linear_attn_config":{"full_attn_layers":[4,"8"]}})"); },
               {"full_attn_layers[1]", "expected integer"});
  expect_error([&] { p(R"({"linear_attn_config":{"full_attn_layers":[0,4]}})"); }, {"full_attn_layers[0]", "1-indexed"});
  expect_error([&] { p(R"({"num_hidden_layers":8,"linear_attn_config":{"full_attn_layers":[4,9]}})"); },
               {"full_attn_layers[1]", "9", "num_hidden_layers = 8"});
  expect_error([&] { p(R"({"linear_attn_config":{"full_attn_layers":[4,4]}})"); }, {"full_attn_layers[1]", "twice"});
}

TEST(HfConfig, MissingAndMistypedKeys) {
  auto c = HfConfig::parse(R"({"i":5,"f":1.5,"s":"x","b":false,"big":18446744073709551615,"neg":-3})", "m.json");
  expect_error([&] { c.get_int("nope"); }, {"m.json", "key 'nope' missing"});
  expect_error([&] { c.get("nope"); }, {"m.json", "key 'nope' missing"});
  expect_error([&] { c.get_int("f"); }, {"m.json", "key 'f'", "expected integer", "1.5"});
  expect_error([&] { c.get_int("s"); }, {"m.json", "key 's'", "expected integer", "string"});
  expect_error([&] { c.get_int("b"); }, {"key 'b'", "expected integer"});
  expect_error([&] { c.get_int("big"); }, {"key 'big'", "too large"});
  EXPECT_EQ(c.get_int("neg"), -3);
  expect_error([&] { c.get_float("s"); }, {"key 's'", "expected number"});
  expect_error([&] { c.get_bool("i"); }, {"key 'i'", "expected boolean"});
  expect_error([&] { c.get_str("i"); }, {"key 'i'", "expected string"});
  expect_error([&] { c.get_str("i.j"); }, {"key 'i.j' missing"});
}

TEST(HfConfig, MalformedJson) {
  expect_error([] { HfConfig::parse("{\n  \"a\": 1,\n  \"b\": [1, 2,\n}", "bad.json"); },
               {"bad.json", "invalid JSON", "line 4", "column 1"});
  expect_error([] { HfConfig::parse("", "empty.json"); }, {"empty.json", "invalid JSON", "line 1"});
  expect_error([] { HfConfig::parse("[1]", "arr.json"); }, {"arr.json", "must be a JSON object"});
  expect_error([] { HfConfig::parse(R"({"text_config": 3})", "tc.json"); }, {"tc.json", "text_config", "expected object"});
}

TEST(HfConfig, LoadFromFile) {
  kimi::test::TempDir td;
  const std::string p = td.file("config.json");
  kimi::test::write_file(p, kK3);
  auto c = HfConfig::load(p);
  EXPECT_EQ(c.path, p);
  EXPECT_EQ(c.get_int("hidden_size"), 7168);
  kimi::test::write_file(p, "{\"a\": }");
  expect_error([&] { HfConfig::load(p); }, {p, "line 1", "column 7"});
  expect_error([&] { HfConfig::load(td.file("missing.json")); }, {"missing.json"});
}
