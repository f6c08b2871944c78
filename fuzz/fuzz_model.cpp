// libFuzzer target: the GGUF model loader (kimi::Model::load: hparams from kimi-k3.* keys, every
// tensor's presence, type and shape checked against them) and, for a file it accepts, the
// forward pass (kimi::Context + decode), where a wrong hparam the loader let through becomes an
// out-of-bounds access (as attn_res.block_size near 2^32 did).
//
// Structured input: the tiny synthetic model (`kimi synth --preset tiny` + `kimi convert`, made
// at start-up) is the base, and the input is a list of edits applied to it before it is written
// as a GGUF file and loaded: set a numeric key (small values, the original +- a delta, boundary
// values around 2^31 / 2^32 / 2^64, raw 32/64-bit, floats incl. inf/nan; any integer type),
// delete a key, edit the per-layer head_count_kv / indexer.types arrays, change a tensor's
// dimensions or type (its data then becomes zeros of the new size), drop or rename a tensor,
// change a string key. The first byte picks the context options (precision, attention path).
// An empty edit list is the unmodified model, which must load and decode.
// A rejected file must end in kimi::Error; a crash, a sanitizer report, any other exception, a
// hang (-timeout) or an allocation above -malloc_limit_mb is a bug.
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "common.h"
#include "io/gguf.h"
#include "model/model.h"
#include "runtime/context.h"
#include "tensor/types.h"
#include "util/error.h"

using namespace kimi;
using gguf::Value;
using gguf::ValueType;

namespace {

struct Tensor {
  std::string name;
  GgmlType type;
  std::vector<int64_t> ne;
  const uint8_t* data;  // original bytes (nullptr once type or shape changed)
  uint64_t nbytes;
};

struct Base {
  std::unique_ptr<gguf::Reader> reader;
  std::vector<gguf::KV> kvs;
  std::vector<Tensor> tensors;
  std::string path;
};

const Base& base() {
  static const Base b = [] {
    Base r;
    r.reader = gguf::Reader::open(fuzz::tiny_gguf());
    r.kvs = r.reader->kvs();
    for (const auto& t : r.reader->tensors())
      r.tensors.push_back({t.name, t.type, std::vector<int64_t>(t.ne.begin(), t.ne.begin() + t.n_dims), t.data, t.nbytes});
    r.path = fuzz::temp_dir() + "/model.gguf";
    return r;
  }();
  return b;
}

// keys the loader reads that the tiny file does not have
const char* const kExtraKeys[] = {
    "kimi-k3.attention.indexer.types", "kimi-k3.rope.freq_base", "tokenizer.ggml.eot_token_id",
    "tokenizer.ggml.unknown_token_id", "kimi-k3.attention.value_length", "general.alignment",
};

const uint64_t kSpecial[] = {0, 1, 2, 3, 4, 7, 8, 15, 16, 17, 31, 32, 33, 63, 64, 65, 127, 128, 255, 256, 1023,
                             1024, 1025, 4095, 4096, 65535, 65536, 0x7fffffffull, 0x80000000ull, 0xfffffffeull,
                             0xffffffffull, 0x100000000ull, 0x100000001ull, 0x7fffffffffffffffull,
                             0x8000000000000000ull, 0xffffffffffffffffull};
const float kFloats[] = {0.0f, -0.0f, 1.0f, -1.0f, 1e-30f, 1e30f, 3.4e38f, -3.4e38f, 25.0f, -5.0f, 0.5f, 1e-5f,
                         std::numeric_limits<float>::infinity(), -std::numeric_limits<float>::infinity(),
                         std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::denorm_min()};
const GgmlType kTypes[] = {GgmlType::F32,  GgmlType::F16,  GgmlType::BF16, GgmlType::Q8_0, GgmlType::Q4_0,
                           GgmlType::Q5_0, GgmlType::Q5_1, GgmlType::MXFP4, GgmlType::Q4_K, GgmlType::Q6_K,
                           GgmlType::I32,  GgmlType::Q8_K};

template <class T, size_t N>
const T& pick(const T (&a)[N], uint8_t x) {
  return a[x % N];
}

gguf::KV* find(std::vector<gguf::KV>& kvs, const std::string& key) {
  for (auto& kv : kvs)
    if (kv.key == key) return &kv;
  return nullptr;
}

bool is_int(ValueType t) {
  return t != ValueType::FLOAT32 && t != ValueType::FLOAT64 && t != ValueType::BOOL && t != ValueType::STRING &&
         t != ValueType::ARRAY;
}

Value int_value(uint64_t v, uint8_t how) {
  Value x;
  switch (how % 8) {
    case 0:  // negative int32
      x.type = ValueType::INT32;
      x.i = -static_cast<int64_t>(v % 0x80000000ull) - 1;
      return x;
    case 1:  // int64
      x.type = ValueType::INT64;
      x.i = static_cast<int64_t>(v);
      return x;
    case 2:  // narrow types when they fit
      if (v < 256) {
        x.type = ValueType::UINT8;
        x.u = v;
        return x;
      }
      [[fallthrough]];
    default:
      x.type = v <= 0xffffffffull ? ValueType::UINT32 : ValueType::UINT64;
      x.u = v;
      return x;
  }
}

uint64_t number(fuzz::Bytes& in, uint64_t orig) {
  switch (in.u8() % 5) {
    case 0: return in.u8();
    case 1: return orig + static_cast<uint64_t>(static_cast<int64_t>(static_cast<int8_t>(in.u8())));
    case 2: return pick(kSpecial, in.u8());
    case 3: return in.u32();
    default: return in.u64();
  }
}

void edit(fuzz::Bytes& in, std::vector<gguf::KV>& kvs, std::vector<Tensor>& ts) {
  const uint8_t op = in.u8() % 8;
  switch (op) {
    case 0: {  // a numeric key (present or one of the extra keys)
      const size_t n = kvs.size() + std::size(kExtraKeys);
      const size_t i = in.u8() % n;
      std::string key = i < kvs.size() ? kvs[i].key : kExtraKeys[i - kvs.size()];
      gguf::KV* kv = find(kvs, key);
      if (!kv) {
        kvs.push_back({key, Value::u32(0)});
        kv = &kvs.back();
      }
      if (kv->value.type == ValueType::FLOAT32 || kv->value.type == ValueType::FLOAT64) {
        const uint8_t m = in.u8();
        float f;
        if (m & 1) {
          f = pick(kFloats, in.u8());
        } else {
          const uint32_t bits = in.u32();
          f = bits_f32(bits);
        }
        kv->value = Value::f32(f);
      } else if (kv->value.type == ValueType::BOOL) {
        kv->value = Value::boolean(in.u8() & 1);
      } else {
        const uint64_t orig = is_int(kv->value.type) ? kv->value.u | static_cast<uint64_t>(kv->value.i) : 0;
        const uint64_t v = number(in, orig);
        kv->value = int_value(v, in.u8());
        if (kv->key == "general.alignment") kv->value = Value::u32(static_cast<uint32_t>(v));
      }
      break;
    }
    case 1: {  // delete a key
      if (kvs.empty()) break;
      kvs.erase(kvs.begin() + static_cast<std::ptrdiff_t>(in.u8() % kvs.size()));
      break;
    }
    case 2: {  // per-layer arrays
      const char* key = in.u8() & 1 ? "kimi-k3.attention.indexer.types" : "kimi-k3.attention.head_count_kv";
      gguf::KV* kv = find(kvs, key);
      std::vector<int32_t> v;
      if (kv && kv->value.type == ValueType::ARRAY)
        for (int64_t x : kv->value.ints) v.push_back(static_cast<int32_t>(x));
      else if (const gguf::KV* hk = find(kvs, "kimi-k3.attention.head_count_kv"); hk && hk->value.type == ValueType::ARRAY)
        for (int64_t x : hk->value.ints) v.push_back(static_cast<int32_t>(x));
      const uint8_t sub = in.u8() % 4;
      if (sub == 0 && !v.empty()) {
        v[in.u8() % v.size()] = static_cast<int32_t>(number(in, 0));
      } else if (sub == 1) {
        v.resize(in.u8() % 20, static_cast<int32_t>(in.u8() % 2));
      } else if (sub == 2 && v.size() >= 2) {
        const size_t a = in.u8() % v.size(), b = in.u8() % v.size();
        std::swap(v[a], v[b]);
      }
      const Value nv = sub == 3 ? Value::u32(in.u8() % 3) : Value::arr_i32(v);
      if (kv) kv->value = nv;
      else kvs.push_back({key, nv});
      break;
    }
    case 3: {  // a tensor's dimensions
      if (ts.empty()) break;
      Tensor& t = ts[in.u32() % ts.size()];
      const uint8_t sub = in.u8() % 4;
      if (sub == 0 && t.ne.size() < 4) t.ne.push_back(1 + in.u8() % 4);
      else if (sub == 1 && t.ne.size() > 1) t.ne.pop_back();
      else {
        int64_t& d = t.ne[in.u8() % t.ne.size()];
        const uint8_t m = in.u8() % 4;
        d = m == 0 ? d + 1 : m == 1 ? d - 1 : m == 2 ? d * 2 : static_cast<int64_t>(in.u8());
      }
      t.data = nullptr;
      break;
    }
    case 4: {  // a tensor's type
      if (ts.empty()) break;
      Tensor& t = ts[in.u32() % ts.size()];
      t.type = pick(kTypes, in.u8());
      t.data = nullptr;
      break;
    }
    case 5: {  // drop a tensor
      if (ts.empty()) break;
      ts.erase(ts.begin() + static_cast<std::ptrdiff_t>(in.u32() % ts.size()));
      break;
    }
    case 6: {  // rename: another layer's slot, or swap two names
      if (ts.size() < 2) break;
      Tensor& a = ts[in.u32() % ts.size()];
      Tensor& b = ts[in.u32() % ts.size()];
      if (in.u8() & 1) {
        std::swap(a.name, b.name);
      } else if (a.name.rfind("blk.", 0) == 0) {
        const size_t dot = a.name.find('.', 4);
        if (dot != std::string::npos) a.name = "blk." + std::to_string(in.u8() % 10) + a.name.substr(dot);
      }
      break;
    }
    default: {  // strings
      static const char* const kKeys[] = {"general.architecture", "tokenizer.ggml.pre", "tokenizer.ggml.model"};
      static const char* const kVals[] = {"kimi-k3", "deepseek2", "", "kimi-k2", "gpt2", "llama", "kimi-k3\x01"};
      const std::string key = pick(kKeys, in.u8());
      gguf::KV* kv = find(kvs, key);
      Value v = Value::str(pick(kVals, in.u8()));
      if (kv) kv->value = v;
      else kvs.push_back({key, v});
      break;
    }
  }
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  base();
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const Base& B = base();
  fuzz::Bytes in{data, size};
  const uint8_t opts = in.u8();
  std::vector<gguf::KV> kvs = B.kvs;
  std::vector<Tensor> ts = B.tensors;
  for (int n = 0; n < 24 && !in.empty(); ++n) edit(in, kvs, ts);

  // write the edited file (a rejected declaration, e.g. a row not a multiple of its block, is an
  // input the writer refuses: not interesting here)
  uint64_t total = 0;
  try {
    gguf::WriterOptions wo;
    if (const gguf::KV* al = find(kvs, "general.alignment"); al && is_int(al->value.type)) {
      if (al->value.u == 0 || al->value.u > 4096 || (al->value.u & (al->value.u - 1))) return 0;
      wo.alignment = static_cast<uint32_t>(al->value.u);
    }
    gguf::Writer w(B.path, wo);
    for (const auto& kv : kvs) w.add_kv(kv.key, kv.value);
    for (auto& t : ts) {
      for (int64_t d : t.ne)
        if (d < 0 || d > (int64_t(1) << 24)) return 0;
      w.add_tensor(t.name, t.type, t.ne);
    }
    total = w.total_tensor_bytes();
    if (total > (64ull << 20)) return 0;
    w.begin();
    std::vector<uint8_t> zeros;
    for (const auto& t : ts) {
      uint64_t rows = 1;
      for (size_t i = 1; i < t.ne.size(); ++i) rows *= static_cast<uint64_t>(t.ne[i]);
      const uint64_t nb = t.ne.empty() ? 0 : row_bytes(t.type, static_cast<uint64_t>(t.ne[0])) * rows;
      if (t.data && nb == t.nbytes) {
        w.write_tensor_data(t.name, t.data, nb);
      } else {
        zeros.assign(nb, 0);
        w.write_tensor_data(t.name, zeros.data(), nb);
      }
    }
    w.finish();
  } catch (const Error&) {
    return 0;
  }

  std::unique_ptr<Model> m;
  try {
    m = Model::load(B.path);
  } catch (const Error&) {
    return 0;
  }
  size_t sink = m->summary().size() + m->n_params() + m->decode_weight_bytes_per_token();
  try {
    ContextOptions co;
    co.n_threads = 1;
    co.n_seq_max = 1 + (opts >> 4 & 1);
    co.n_ctx_max = 8;
    co.n_batch_max = 4;
    co.attn = opts & 1 ? AttnPath::Dense : AttnPath::Sparse;
    using Prec = decltype(co.precision);
    co.precision = opts & 2 ? Prec::F32 : Prec::Fast;
    co.attn_top_k = opts & 4 ? 2 : -1;
    Context ctx(*m, co);
    const int32_t nv = ctx.n_vocab();
    Batch b;
    b.add_sequence({0, nv - 1, nv / 2, 1, 2}, 0, 0);  // 5 tokens: two micro-batches of <= 4
    ctx.decode(b);
    sink += std::isfinite(ctx.logits(4)[0]);
    b.clear();
    b.add(3, 0, 5, true);
    if (co.n_seq_max > 1) b.add(nv - 2, 1, 0, true);
    ctx.decode(b);
    sink += std::isfinite(ctx.logits(0)[nv - 1]);
  } catch (const Error&) {
  }
  if (sink == 0xdeadbeef) return 1;  // keep `sink` alive
  return 0;
}
