// GGUF hyper-parameters out of a real model's range (issue 9): each is refused by Model::load with an
// error naming the key, and `kimi eval` exits 1 with that error instead of crashing. The files are a
// real tiny model rewritten by the project's GGUF writer with one key replaced.
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "io/gguf.h"
#include "model/model.h"
#include "test_util.h"
#include "util/error.h"

using kimi::gguf::Value;

namespace {

// Copy of SRC (all keys and tensors) with key K set to V.
void write_patched(const std::string& src, const std::string& dst, const std::string& k, const Value& v) {
  auto r = kimi::gguf::Reader::open(src);
  kimi::gguf::WriterOptions wo;
  wo.alignment = r->alignment();
  kimi::gguf::Writer w(dst, wo);
  bool found = false;
  for (const auto& kv : r->kvs()) {
    if (kv.key == k) {
      w.add_kv(kv.key, v);
      found = true;
    } else {
      w.add_kv(kv.key, kv.value);
    }
  }
  ASSERT_TRUE(found) << "the tiny model has no key " << k;
  for (const auto& t : r->tensors())
    w.add_tensor(t.name, t.type, std::vector<int64_t>(t.ne.begin(), t.ne.begin() + t.n_dims));
  w.begin();
  for (const auto& t : r->tensors()) w.write_tensor_data(t.name, t.data, t.nbytes);
  w.finish();
}

struct Case {
  std::string key;
  Value value;
};

std::string load_error(const std::string& path) {
  try {
    kimi::Model::load(path);
  } catch (const kimi::Error& e) {
    return e.what();
  }
  return "";
}

}  // namespace

TEST(ModelHparams, OutOfRangeValuesAreRefusedByTheLoader) {
  const std::string src = kimi::test::tiny_gguf();
  ASSERT_EQ(load_error(src), "");  // the unpatched model loads
  auto r = kimi::gguf::Reader::open(src);
  const uint32_t n_layer = r->get_u32("kimi-k3.block_count");
  ASSERT_GT(r->get_u32("kimi-k3.attn_res.block_size"), 0u);  // the tiny model uses ResMix
  ASSERT_GT(r->get_u32("kimi-k3.attention.indexer.top_k"), 0u);

  const std::vector<Case> cases = {
      // (n_layer + block - 1) / block wrapped to 0 in 32 bits: the bank was sized 0, then written
      {"kimi-k3.attn_res.block_size", Value::u32(0xFFFFFFFFu)},
      {"kimi-k3.attn_res.block_size", Value::u32(1u << 20)},
      {"kimi-k3.attention.head_count", Value::u32(0x80000000u)},
      {"kimi-k3.attention.head_count", Value::u32(65536)},  // head_count x dims > limit
      {"kimi-k3.kda.head_dim", Value::u32(0x10000001u)},
      {"kimi-k3.ssm.conv_kernel", Value::u32(0xFFFFFFFFu)},
      {"kimi-k3.expert_count", Value::u32(0xFFFFFFFFu)},
      {"kimi-k3.expert_used_count", Value::u32(0)},
      {"kimi-k3.expert_feed_forward_length", Value::u32(0xFFFFFFFFu)},
      {"kimi-k3.attention.indexer.head_count", Value::u32(0x80000000u)},
      {"kimi-k3.attention.indexer.key_length", Value::u32(0xFFFFFFFFu)},
      {"kimi-k3.vocab_size", Value::u32(0xFFFFFFFFu)},
      {"kimi-k3.context_length", Value::u32(0xFFFFFFFFu)},
      {"kimi-k3.embedding_length", Value::u32(0x80000000u)},
      {"kimi-k3.attention.layer_norm_rms_epsilon", Value::f32(std::nanf(""))},
      {"kimi-k3.attention.layer_norm_rms_epsilon", Value::f32(-1.0f)},
      // SiTU divides by beta (and lambda > 0): 0 or a subnormal made every activation NaN (fuzz_model)
      {"kimi-k3.activation.situ_beta", Value::f32(0.0f)},
      {"kimi-k3.activation.situ_beta", Value::f32(7e-45f)},
      {"kimi-k3.activation.situ_linear_beta", Value::f32(1e-45f)},
      {"tokenizer.ggml.eos_token_id", Value::u32(0x80000000u)},
      // the per-layer tables were sized from it before any tensor was looked at (fuzz_model: OOM)
      {"kimi-k3.block_count", Value::u32(0xDF2C0000u)},
      {"kimi-k3.block_count", Value::u32(0)},
  };
  kimi::test::TempDir td;
  // a ResMix block longer than the file's layers is valid (a slice of the real model keeps its block)
  const std::string longer = td.file("block_longer.gguf");
  write_patched(src, longer, "kimi-k3.attn_res.block_size", Value::u32(n_layer + 1));
  EXPECT_EQ(load_error(longer), "");
  for (size_t i = 0; i < cases.size(); ++i) {
    const auto& c = cases[i];
    const std::string p = td.file("bad" + std::to_string(i) + ".gguf");
    write_patched(src, p, c.key, c.value);
    const std::string msg = load_error(p);
    EXPECT_NE(msg.find(p), std::string::npos) << c.key << " = " << c.value.to_string() << ": " << msg;
    // the message names the key (kimi-k3.X; products name both factors' keys)
    const std::string shortkey = c.key.substr(c.key.find('.') + 1);
    EXPECT_NE(msg.find(shortkey.substr(shortkey.rfind('.') + 1)), std::string::npos)
        << c.key << " = " << c.value.to_string() << ": " << msg;
  }
}

TEST(ModelHparams, EvalOnAWrappingBlockSizeExitsWithTheErrorNotACrash) {
  const std::string src = kimi::test::tiny_gguf();
  kimi::test::TempDir td;
  const std::string p = td.file("wrap.gguf");
  write_patched(src, p, "kimi-k3.attn_res.block_size", Value::u32(0xFFFFFFFFu));
  auto r = kimi::test::run_kimi("eval -m " + p + " --tokens 1,2,3 --logits-out " + td.file("l.bin"));
  EXPECT_EQ(r.exit_code, 1) << r.out;
  EXPECT_NE(r.out.find("attn_res.block_size"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("must be in 1.."), std::string::npos) << r.out;
  r = kimi::test::run_kimi("run -m " + p + " -p hi -n 2");
  EXPECT_EQ(r.exit_code, 1) << r.out;
  EXPECT_NE(r.out.find("attn_res.block_size"), std::string::npos) << r.out;
}
