// Independent re-derivation of a converted GGUF from its Hugging Face source. Deliberately shares no
// transform code with convert/transforms.cpp: the name map, the element index arithmetic of every
// transform, the output-type rules and the MXFP4 repack are written again here from the spec.
#include "convert/verify.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>
#include <unistd.h>

#include "convert/dspark.h"
#include "convert/vocab.h"  // tiktoken file parsing only (not the merges / token mapping)
#include "io/gguf.h"
#include "io/hf_config.h"
#include "io/safetensors.h"
#include "tensor/quants.h"
#include "tensor/types.h"
#include "util/error.h"
#include "util/json.h"
#include "util/paths.h"
#include "util/progress.h"

namespace fs = std::filesystem;

namespace kimi::convert {

std::string VerifyResult::summary() const {
  return fmt::format("verified {} tensors: {} exact, {} mismatched; metadata: {} keys match", n_tensors, n_exact,
                     n_mismatched + n_missing, n_keys_match) +
         (n_keys_mismatch ? fmt::format(", {} keys mismatched", n_keys_mismatch) : std::string());
}

VerifyResult verify_vision(const VerifyOptions& o, const HfConfig& cfg, const st::Checkpoint& ck,
                           const gguf::Reader& rd);  // verify_vision.cpp

namespace {

// ------------------------------------------------------------------ source element access
float src_at(const st::Tensor& t, int64_t i) {
  const uint8_t* p = t.data;
  switch (t.dtype) {
    case st::Dtype::BF16: {
      uint16_t h;
      std::memcpy(&h, p + 2 * i, 2);
      uint32_t u = static_cast<uint32_t>(h) << 16;
      float f;
      std::memcpy(&f, &u, 4);
      return f;
    }
    case st::Dtype::F16: {
      uint16_t h;
      std::memcpy(&h, p + 2 * i, 2);
      return f16_to_f32(h);
    }
    case st::Dtype::F32: {
      float f;
      std::memcpy(&f, p + 4 * i, 4);
      return f;
    }
    case st::Dtype::F64: {
      double d;
      std::memcpy(&d, p + 8 * i, 8);
      return static_cast<float>(d);
    }
    default:
      fail("source tensor '{}' ({}) has non-float dtype {}", t.name, t.file, st::dtype_name(t.dtype));
  }
}

bool same_dtype(st::Dtype d, GgmlType t) {
  return (d == st::Dtype::F32 && t == GgmlType::F32) || (d == st::Dtype::F16 && t == GgmlType::F16) ||
         (d == st::Dtype::BF16 && t == GgmlType::BF16);
}

// GGUF element of a float-typed row, for messages
double gguf_elem(GgmlType t, const uint8_t* row, int64_t i) {
  if (t == GgmlType::F32) {
    float f;
    std::memcpy(&f, row + 4 * i, 4);
    return f;
  }
  uint16_t h;
  std::memcpy(&h, row + 2 * i, 2);
  if (t == GgmlType::F16) return f16_to_f32(h);
  if (t == GgmlType::BF16) return bf16_to_f32(h);
  return NAN;
}

// independent closed form of formats-quant.md §3.5:
// qs[j] = nib(P[j>>1], j&1) | nib(P[8 + (j>>1)], j&1) << 4, byte 0 = the E8M0 scale
void mxfp4_block_closed_form(const uint8_t* P, uint8_t scale, uint8_t* out17) {
  auto nib = [](uint8_t b, int hi) -> uint8_t { return hi ? static_cast<uint8_t>(b >> 4) : static_cast<uint8_t>(b & 15); };
  out17[0] = scale;
  for (int j = 0; j < 16; ++j)
    out17[1 + j] = static_cast<uint8_t>(nib(P[j >> 1], j & 1) | (nib(P[8 + (j >> 1)], j & 1) << 4));
}

// ------------------------------------------------------------------ GPT-2 byte decoding (independent)
// printable bytes map to themselves; the other 68 bytes map to 256.. in byte order
bool gpt2_printable(int b) { return (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174 && b <= 255); }

bool decode_gpt2(const std::string& s, std::string* out) {
  static const std::vector<int> extra = [] {
    std::vector<int> v;
    for (int b = 0; b < 256; ++b)
      if (!gpt2_printable(b)) v.push_back(b);
    return v;
  }();
  out->clear();
  for (size_t i = 0; i < s.size();) {
    unsigned char c = s[i];
    uint32_t cp;
    if (c < 0x80) {
      cp = c;
      i += 1;
    } else if ((c & 0xE0) == 0xC0 && i + 1 < s.size()) {
      cp = ((c & 0x1Fu) << 6) | (static_cast<unsigned char>(s[i + 1]) & 0x3Fu);
      i += 2;
    } else {
      return false;
    }
    if (cp < 256 && gpt2_printable(static_cast<int>(cp))) {
      *out += static_cast<char>(cp);
    } else if (cp >= 256 && cp < 256 + extra.size()) {
      *out += static_cast<char>(extra[cp - 256]);
    } else {
      return false;
    }
  }
  return true;
}

std::string encode_gpt2(const std::string& bytes) {
  static const std::vector<uint32_t> m = [] {
    std::vector<uint32_t> t(256);
    uint32_t n_extra = 0;
    for (int b = 0; b < 256; ++b) t[b] = gpt2_printable(b) ? static_cast<uint32_t>(b) : 256u + n_extra++;
    return t;
  }();
  std::string out;
  for (unsigned char c : bytes) {
    uint32_t cp = m[c];
    if (cp < 0x80) {
      out += static_cast<char>(cp);
    } else {
      out += static_cast<char>(0xC0 | (cp >> 6));
      out += static_cast<char>(0x80 | (cp & 0x3F));
    }
  }
  return out;
}

// naive rank-limited BPE (k3-architecture.md §4.1), written independently of vocab.cpp
std::vector<std::string> naive_merges(const std::vector<std::string>& ranks) {
  std::map<std::string, int64_t> rank;
  for (size_t r = 0; r < ranks.size(); ++r) rank[ranks[r]] = static_cast<int64_t>(r);
  std::vector<std::string> merges;
  for (size_t r = 0; r < ranks.size(); ++r) {
    const std::string& tok = ranks[r];
    if (tok.size() < 2) continue;
    std::vector<std::string> parts;
    for (char c : tok) parts.emplace_back(1, c);
    for (;;) {
      int64_t best = -1;
      size_t at = 0;
      for (size_t i = 0; i + 1 < parts.size(); ++i) {
        auto it = rank.find(parts[i] + parts[i + 1]);
        if (it == rank.end() || it->second >= static_cast<int64_t>(r)) continue;
        if (best < 0 || it->second < best) {
          best = it->second;
          at = i;
        }
      }
      if (best < 0) break;
      parts[at] += parts[at + 1];
      parts.erase(parts.begin() + static_cast<std::ptrdiff_t>(at) + 1);
    }
    if (parts.size() == 2) merges.push_back(encode_gpt2(parts[0]) + " " + encode_gpt2(parts[1]));
  }
  return merges;
}

std::string slurp(const std::string& path) {
  return read_input_file(path);  // regular files only (a FIFO would block), bounded size
}

// ------------------------------------------------------------------ the verifier
enum class Cat { Vec, Conv, Router, IndexerProj, Matrix, IndexerMat, ExpertsPacked, ExpertsFloat };

struct Item {
  const gguf::TensorInfo* ti = nullptr;
  Cat cat = Cat::Matrix;
  std::vector<int64_t> ne;                       // expected ggml shape
  std::vector<const st::Tensor*> srcs;
  std::function<void(int64_t row, float* out)> row;  // expected floats of GGUF row `row`
  bool identity = false;                          // GGUF element order == source element order (srcs[0])
  std::string err;                                // mapping error (no source, wrong layer type, ...)
};

struct Verifier {
  const VerifyOptions& o;
  const HfConfig& cfg;
  const st::Checkpoint& ck;
  const gguf::Reader& r;
  VerifyResult& res;
  std::set<std::string> used;  // full source names
  int64_t n_layer_cfg = 0, n_layer = 0, d = 0, H = 0, Hkv = 0, kda = 0, nope = 0, rope = 0, vd = 0, kv_lora = 0;
  int64_t q_lora = 0, n_exp = 0, conv_k = 0;
  std::set<int64_t> mla;  // 0-based

  void problem(const std::string& s) {
    if (res.problems.size() < o.max_report) res.problems.push_back(s);
  }

  const st::Tensor* src(const std::string& n) {
    const st::Tensor* t = ck.find("language_model." + n);
    if (!t) t = ck.find(n);
    if (t) used.insert(t->name);
    return t;
  }

  // ---------------------------------------------------------------- mapping
  Item map(const gguf::TensorInfo& ti) {
    Item it;
    it.ti = &ti;
    const std::string& n = ti.name;
    auto need = [&](const std::string& s) -> const st::Tensor* {
      const st::Tensor* t = src(s);
      if (!t && it.err.empty()) it.err = fmt::format("no source tensor 'language_model.{}'", s);
      return t;
    };
    auto rev = [](const std::vector<int64_t>& s) { return std::vector<int64_t>(s.rbegin(), s.rend()); };
    auto copy = [&](const std::string& s, Cat cat) {
      const st::Tensor* t = need(s);
      if (!t) return;
      it.cat = cat;
      it.srcs = {t};
      it.ne = rev(t->shape);
      it.identity = true;
      const int64_t n0 = it.ne.empty() ? 1 : it.ne[0];
      it.row = [t, n0](int64_t row, float* out) {
        for (int64_t i = 0; i < n0; ++i) out[i] = src_at(*t, row * n0 + i);
      };
    };
    auto product = [&](const std::string& a, const std::string& b) {
      const st::Tensor* ta = need(a);
      const st::Tensor* tb = need(b);
      if (!ta || !tb) return;
      it.cat = Cat::Vec;
      it.srcs = {ta, tb};
      it.ne = {ta->numel()};
      if (tb->numel() != ta->numel()) it.err = fmt::format("'{}' and '{}' differ in size", ta->name, tb->name);
      it.row = [ta, tb](int64_t, float* out) {
        for (int64_t i = 0; i < ta->numel(); ++i) out[i] = src_at(*ta, i) * src_at(*tb, i);
      };
    };

    if (n == "token_embd.weight") return copy("model.embed_tokens.weight", Cat::Matrix), it;
    if (n == "output.weight") return copy("lm_head.weight", Cat::Matrix), it;
    if (n == "output_norm.weight") return copy("model.norm.weight", Cat::Vec), it;
    if (n == "output_res_score.weight")
      return product("model.output_attn_res_norm.weight", "model.output_attn_res_proj.weight"), it;

    // blk.N.suffix
    int64_t il = -1;
    std::string suf;
    if (n.rfind("blk.", 0) == 0) {
      size_t dot = n.find('.', 4);
      if (dot != std::string::npos && dot > 4) {
        try {
          il = std::stoll(n.substr(4, dot - 4));
        } catch (...) {
          il = -1;
        }
        suf = n.substr(dot + 1);
      }
    }
    if (il < 0) {
      it.err = "unknown GGUF tensor name (no Kimi-K3 source)";
      return it;
    }
    if (il >= n_layer) {
      it.err = fmt::format("layer {} >= block_count {}", il, n_layer);
      return it;
    }
    const bool is_mla = mla.count(il) > 0;
    const std::string L = "model.layers." + std::to_string(il) + ".";
    const std::string A = L + "self_attn.";
    const std::string M = L + "block_sparse_moe.";
    auto want = [&](bool mla_layer) {
      if (is_mla != mla_layer && it.err.empty())
        it.err = fmt::format("belongs to a {} layer but layer {} is {} (full_attn_layers is 1-indexed)",
                             mla_layer ? "full-attention (MLA)" : "KDA", il, is_mla ? "MLA" : "KDA");
    };

    struct Simple { const char* gg; const char* hf; int kind; Cat cat; };  // kind: 0 any, 1 KDA, 2 MLA
    static const Simple table[] = {
        {"attn_norm.weight", "input_layernorm.weight", 0, Cat::Vec},
        {"ffn_norm.weight", "post_attention_layernorm.weight", 0, Cat::Vec},
        {"attn_output.weight", "self_attn.o_proj.weight", 0, Cat::Matrix},
        {"attn_q.weight", "self_attn.q_proj.weight", 1, Cat::Matrix},
        {"attn_k.weight", "self_attn.k_proj.weight", 1, Cat::Matrix},
        {"attn_v.weight", "self_attn.v_proj.weight", 1, Cat::Matrix},
        {"ssm_f_a.weight", "self_attn.f_a_proj.weight", 1, Cat::Matrix},
        {"ssm_f_b.weight", "self_attn.f_b_proj.weight", 1, Cat::Matrix},
        {"ssm_beta.weight", "self_attn.b_proj.weight", 1, Cat::Matrix},
        {"ssm_g.weight", "self_attn.g_proj.weight", 1, Cat::Matrix},
        {"ssm_norm.weight", "self_attn.o_norm.weight", 1, Cat::Vec},
        {"ssm_dt.bias", "self_attn.dt_bias", 1, Cat::Vec},
        {"attn_q_a.weight", "self_attn.q_a_proj.weight", 2, Cat::Matrix},
        {"attn_q_a_norm.weight", "self_attn.q_a_layernorm.weight", 2, Cat::Vec},
        {"attn_q_b.weight", "self_attn.q_b_proj.weight", 2, Cat::Matrix},
        {"attn_kv_a_mqa.weight", "self_attn.kv_a_proj_with_mqa.weight", 2, Cat::Matrix},
        {"attn_kv_a_norm.weight", "self_attn.kv_a_layernorm.weight", 2, Cat::Vec},
        {"attn_gate.weight", "self_attn.g_proj.weight", 2, Cat::Matrix},
        {"indexer.attn_q_b.weight", "self_attn.indexer.wq_b.weight", 2, Cat::IndexerMat},
        {"indexer.attn_k.weight", "self_attn.indexer.wk.weight", 2, Cat::IndexerMat},
        {"indexer.k_norm.weight", "self_attn.indexer.k_norm.weight", 2, Cat::Vec},
        {"indexer.k_norm.bias", "self_attn.indexer.k_norm.bias", 2, Cat::Vec},
        {"indexer.proj.weight", "self_attn.indexer.weights_proj.weight", 2, Cat::IndexerProj},
        {"ffn_gate.weight", "mlp.gate_proj.weight", 0, Cat::Matrix},
        {"ffn_up.weight", "mlp.up_proj.weight", 0, Cat::Matrix},
        {"ffn_down.weight", "mlp.down_proj.weight", 0, Cat::Matrix},
        {"ffn_gate_inp.weight", "block_sparse_moe.gate.weight", 0, Cat::Router},
        {"exp_probs_b.bias", "block_sparse_moe.gate.e_score_correction_bias", 0, Cat::Vec},
        {"ffn_routed_down.weight", "block_sparse_moe.routed_expert_down_proj.weight", 0, Cat::Matrix},
        {"ffn_routed_up.weight", "block_sparse_moe.routed_expert_up_proj.weight", 0, Cat::Matrix},
        {"ffn_routed_norm.weight", "block_sparse_moe.routed_expert_norm.weight", 0, Cat::Vec},
        {"ffn_gate_shexp.weight", "block_sparse_moe.shared_experts.gate_proj.weight", 0, Cat::Matrix},
        {"ffn_up_shexp.weight", "block_sparse_moe.shared_experts.up_proj.weight", 0, Cat::Matrix},
        {"ffn_down_shexp.weight", "block_sparse_moe.shared_experts.down_proj.weight", 0, Cat::Matrix},
    };
    for (const Simple& s : table) {
      if (suf != s.gg) continue;
      if (s.kind) want(s.kind == 2);
      copy(L + s.hf, s.cat);
      return it;
    }
    if (suf == "attn_res_score.weight") return product(L + "self_attention_res_norm.weight", L + "self_attention_res_proj.weight"), it;
    if (suf == "ffn_res_score.weight") return product(L + "mlp_res_norm.weight", L + "mlp_res_proj.weight"), it;
    for (const char* x : {"q", "k", "v"}) {
      if (suf != std::string("ssm_conv1d_") + x + ".weight") continue;
      want(false);
      const st::Tensor* t = need(A + x + "_conv1d.weight");
      if (!t) return it;
      it.cat = Cat::Conv;
      it.srcs = {t};
      int64_t C = t->shape.empty() ? 0 : t->shape[0], K = t->shape.empty() ? 0 : t->shape.back();
      it.ne = {K, 1, C, 1};
      if (C * K != t->numel()) it.err = fmt::format("source shape {} is not [C, 1, K]", t->shape_string());
      it.identity = true;
      it.row = [t, K](int64_t row, float* out) {  // row = channel: its K taps stay contiguous
        for (int64_t j = 0; j < K; ++j) out[j] = src_at(*t, row * K + j);
      };
      return it;
    }
    if (suf == "ssm_a") {
      want(false);
      const st::Tensor* t = need(A + "A_log");
      if (!t) return it;
      it.cat = Cat::Vec;
      it.srcs = {t};
      it.ne = {H};
      if (t->numel() < H) it.err = fmt::format("A_log has {} values, fewer than {} heads", t->numel(), H);
      const int64_t h = H;
      it.row = [t, h](int64_t, float* out) {
        for (int64_t i = 0; i < h; ++i) out[i] = static_cast<float>(-std::exp(static_cast<double>(src_at(*t, i))));
      };
      return it;
    }
    if (suf == "attn_k_b.weight" || suf == "attn_v_b.weight") {
      want(true);
      const st::Tensor* t = need(A + "kv_b_proj.weight");
      if (!t) return it;
      it.cat = Cat::Matrix;
      it.srcs = {t};
      const int64_t per = nope + vd, lat = kv_lora, np = nope;
      if (t->numel() != Hkv * per * lat)
        it.err = fmt::format("kv_b_proj shape {} != [{} * ({} + {}), {}]", t->shape_string(), Hkv, nope, vd, kv_lora);
      if (suf == "attn_k_b.weight") {
        it.ne = {nope, kv_lora, Hkv};
        // GGUF row (l, h): element i0 = K-nope row i0 of head h, column l
        it.row = [t, per, lat, np](int64_t row, float* out) {
          const int64_t l = row % lat, h = row / lat;
          for (int64_t i0 = 0; i0 < np; ++i0) out[i0] = src_at(*t, (h * per + i0) * lat + l);
        };
      } else {
        it.ne = {kv_lora, vd, Hkv};
        const int64_t v = vd;
        it.row = [t, per, lat, np, v](int64_t row, float* out) {
          const int64_t j = row % v, h = row / v;
          for (int64_t i0 = 0; i0 < lat; ++i0) out[i0] = src_at(*t, (h * per + np + j) * lat + i0);
        };
      }
      return it;
    }
    for (auto [gg, w] : {std::pair{"ffn_gate_exps.weight", "w1"}, std::pair{"ffn_up_exps.weight", "w3"},
                         std::pair{"ffn_down_exps.weight", "w2"}}) {
      if (suf != gg) continue;
      const std::string base0 = M + "experts.0." + w + ".";
      bool packed = src(base0 + "weight_packed") != nullptr;
      for (int64_t e = 0; e < n_exp; ++e) {
        const std::string base = M + "experts." + std::to_string(e) + "." + w + ".";
        if (packed) {
          const st::Tensor* p = need(base + "weight_packed");
          const st::Tensor* s = need(base + "weight_scale");
          if (!p || !s) return it;
          it.srcs.push_back(p);
          it.srcs.push_back(s);
        } else {
          const st::Tensor* t = need(base + "weight");
          if (!t) return it;
          it.srcs.push_back(t);
        }
      }
      const st::Tensor* f = it.srcs[0];
      if (f->shape.size() != 2) {
        it.err = fmt::format("expert source {} is not 2-D", f->name);
        return it;
      }
      const int64_t out = f->shape[0], in = packed ? f->shape[1] * 2 : f->shape[1];
      it.ne = {in, out, n_exp};
      it.cat = packed ? Cat::ExpertsPacked : Cat::ExpertsFloat;
      for (size_t k = 0; k < it.srcs.size(); k += packed ? 2 : 1) {
        const st::Tensor* x = it.srcs[k];
        std::vector<int64_t> want_shape = packed ? std::vector<int64_t>{out, in / 2} : std::vector<int64_t>{out, in};
        if (x->shape != want_shape) it.err = fmt::format("expert source {} has shape {}", x->name, x->shape_string());
        if (packed) {
          std::vector<int64_t> ss{out, in / 32};
          if (it.srcs[k + 1]->shape != ss)
            it.err = fmt::format("expert scale {} has shape {}", it.srcs[k + 1]->name, it.srcs[k + 1]->shape_string());
        }
      }
      if (!packed) {
        auto srcs = it.srcs;
        it.row = [srcs, out, in](int64_t row, float* o) {
          const st::Tensor* t = srcs[row / out];
          const int64_t r = row % out;
          for (int64_t i = 0; i < in; ++i) o[i] = src_at(*t, r * in + i);
        };
      }
      return it;
    }
    it.err = "unknown GGUF tensor name (no Kimi-K3 source)";
    return it;
  }

  // ---------------------------------------------------------------- type rules (k3-architecture §2.1 item 13)
  // Returns the type the tensor must have given the file's main matrix type.
  GgmlType expected_type(const Item& it, GgmlType main) {
    const std::string& n = it.ti->name;
    bool force_f32 = it.cat == Cat::Vec || it.cat == Cat::Conv || it.cat == Cat::Router || it.cat == Cat::IndexerProj ||
                     n.size() < 7 || n.compare(n.size() - 7, 7, ".weight") != 0 ||
                     n.find("_norm.weight") != std::string::npos;
    if (force_f32) return GgmlType::F32;
    if (it.cat == Cat::ExpertsPacked) return GgmlType::MXFP4;
    if (it.cat == Cat::IndexerMat && main == GgmlType::Q8_0) {
      st::Dtype d = it.srcs[0]->dtype;
      return d == st::Dtype::BF16 ? GgmlType::BF16 : d == st::Dtype::F16 ? GgmlType::F16 : GgmlType::F32;
    }
    if (main == GgmlType::Q8_0 && it.ne[0] % 32 != 0) return GgmlType::F16;
    return main;
  }

  // ---------------------------------------------------------------- byte comparison
  // returns "" when exact, else a description of the first difference
  std::string compare(const Item& it) {
    const gguf::TensorInfo& ti = *it.ti;
    const int64_t n0 = ti.ne[0];
    const int64_t rows = ti.ne[1] * ti.ne[2] * ti.ne[3];
    const uint64_t rb = row_bytes(ti.type, static_cast<uint64_t>(n0));
    if (it.cat == Cat::ExpertsPacked) {
      const int64_t out = ti.ne[1], ng = n0 / 32;
      uint8_t blk[17];
      for (int64_t row = 0; row < rows; ++row) {
        const st::Tensor* p = it.srcs[2 * (row / out)];
        const st::Tensor* s = it.srcs[2 * (row / out) + 1];
        const int64_t r = row % out;
        const uint8_t* g = ti.data + row * rb;
        for (int64_t b = 0; b < ng; ++b) {
          mxfp4_block_closed_form(p->data + r * (n0 / 2) + b * 16, s->data[r * ng + b], blk);
          if (std::memcmp(blk, g + b * 17, 17) != 0)
            return fmt::format("MXFP4 block {} of row {} of expert {} differs from the repacked source", b, r, row / out);
        }
      }
      return "";
    }
    if (it.identity && same_dtype(it.srcs[0]->dtype, ti.type)) {  // pass-through: raw bytes must be identical
      if (it.srcs[0]->nbytes == ti.nbytes && std::memcmp(it.srcs[0]->data, ti.data, ti.nbytes) == 0) return "";
    }
    std::vector<float> expect(static_cast<size_t>(n0));
    std::vector<uint8_t> enc(rb);
    for (int64_t row = 0; row < rows; ++row) {
      it.row(row, expect.data());
      const uint8_t* g = ti.data + row * rb;
      switch (ti.type) {
        case GgmlType::F32: std::memcpy(enc.data(), expect.data(), rb); break;
        case GgmlType::F16:
          for (int64_t i = 0; i < n0; ++i) {
            uint16_t h = f32_to_f16(expect[i]);
            std::memcpy(enc.data() + 2 * i, &h, 2);
          }
          break;
        case GgmlType::BF16:
          for (int64_t i = 0; i < n0; ++i) {
            uint16_t h = f32_to_bf16(expect[i]);
            std::memcpy(enc.data() + 2 * i, &h, 2);
          }
          break;
        case GgmlType::Q8_0:
          quantize_row_q8_0(expect.data(), reinterpret_cast<block_q8_0*>(enc.data()), n0);
          break;
        default:
          return fmt::format("unexpected type {}", type_name(ti.type));
      }
      if (std::memcmp(enc.data(), g, rb) != 0) {
        if (ti.type == GgmlType::Q8_0) {
          for (uint64_t b = 0; b < rb / 34; ++b)
            if (std::memcmp(enc.data() + 34 * b, g + 34 * b, 34) != 0)
              return fmt::format("row {}: Q8_0 block {} differs from the re-quantized source", row, b);
        }
        const int64_t es = ti.type == GgmlType::F32 ? 4 : 2;
        int64_t i = 0;
        while (i < n0 && std::memcmp(enc.data() + i * es, g + i * es, es) == 0) ++i;
        const int64_t flat = row * n0 + i;
        return fmt::format("element [{}, {}, {}] differs: gguf {} expected {}", flat % n0, (flat / n0) % ti.ne[1],
                           flat / (n0 * ti.ne[1]), gguf_elem(ti.type, g, i), expect[i]);
      }
    }
    return "";
  }

  // ---------------------------------------------------------------- metadata
  void key_result(bool ok, const std::string& key, const std::string& what) {
    if (ok) {
      ++res.n_keys_match;
    } else {
      ++res.n_keys_mismatch;
      problem(fmt::format("metadata '{}': {}", key, what));
    }
  }
  void key_u32(const std::string& k, int64_t want) {
    const gguf::Value* v = r.find(k);
    if (!v) return key_result(false, k, fmt::format("missing, expected {}", want));
    bool ok = v->type == gguf::ValueType::UINT32 && static_cast<int64_t>(v->u) == want;
    key_result(ok, k, fmt::format("{} ({}), expected {} (uint32)", v->to_string(), gguf::value_type_name(v->type), want));
  }
  void key_f32(const std::string& k, double want) {
    const gguf::Value* v = r.find(k);
    if (!v) return key_result(false, k, fmt::format("missing, expected {}", want));
    bool ok = v->type == gguf::ValueType::FLOAT32 && static_cast<float>(v->f) == static_cast<float>(want);
    key_result(ok, k, fmt::format("{} ({}), expected {} (float32)", v->to_string(), gguf::value_type_name(v->type), want));
  }
  void key_bool(const std::string& k, bool want) {
    const gguf::Value* v = r.find(k);
    if (!v) return key_result(false, k, fmt::format("missing, expected {}", want));
    key_result(v->type == gguf::ValueType::BOOL && v->b == want, k, fmt::format("{}, expected {}", v->to_string(), want));
  }
  void key_str(const std::string& k, const std::string& want) {
    const gguf::Value* v = r.find(k);
    if (!v) return key_result(false, k, fmt::format("missing, expected '{}'", want));
    key_result(v->type == gguf::ValueType::STRING && v->s == want, k,
               fmt::format("{}, expected '{}'", v->to_string(), want.substr(0, 60)));
  }
  void key_absent(const std::string& k, const std::string& why) {
    if (r.find(k)) key_result(false, k, "present but " + why);
  }

  void check_arch_keys(std::set<std::string>& checked) {
    const std::string P = "kimi-k3.";
    auto u = [&](const std::string& k, int64_t v) { checked.insert(P + k); key_u32(P + k, v); };
    auto f = [&](const std::string& k, double v) { checked.insert(P + k); key_f32(P + k, v); };
    u("block_count", n_layer);
    u("context_length", cfg.get_int("max_position_embeddings"));
    u("embedding_length", d);
    int64_t ff = cfg.has("prefix_dense_intermediate_size") ? cfg.get_int("prefix_dense_intermediate_size")
                 : cfg.has("dense_intermediate_size")      ? cfg.get_int("dense_intermediate_size")
                                                           : cfg.get_int("intermediate_size");
    u("feed_forward_length", ff);
    u("attention.head_count", H);
    {
      const std::string k = P + "attention.head_count_kv";
      checked.insert(k);
      const gguf::Value* v = r.find(k);
      std::vector<int64_t> want;
      for (int64_t il = 0; il < n_layer; ++il) want.push_back(mla.count(il) ? 1 : 0);
      bool ok = v && v->type == gguf::ValueType::ARRAY && v->elem_type == gguf::ValueType::INT32 && v->ints == want;
      key_result(ok, k, v ? fmt::format("{}, expected int32 array {}", v->to_string(), fmt::join(want, ",")) : "missing");
    }
    f("attention.layer_norm_rms_epsilon", cfg.get_float("rms_norm_eps"));
    u("vocab_size", cfg.get_int("vocab_size"));
    u("attention.q_lora_rank", q_lora);
    u("attention.kv_lora_rank", kv_lora);
    u("attention.key_length", kv_lora + rope);
    u("attention.value_length", kv_lora);
    u("attention.key_length_mla", nope + rope);
    u("attention.value_length_mla", vd);
    u("rope.dimension_count", rope);
    u("ssm.conv_kernel", conv_k);
    u("kda.head_dim", kda);
    if (cfg.has("linear_attn_config.gate_lower_bound")) f("kda.gate_lower_bound", cfg.get_float("linear_attn_config.gate_lower_bound"));
    u("expert_count", n_exp);
    u("expert_used_count", cfg.get_int("num_experts_per_token"));
    u("expert_shared_count", cfg.get_int_or("num_shared_experts", 0));
    u("expert_feed_forward_length", cfg.get_int("moe_intermediate_size"));
    if (cfg.has("routed_expert_hidden_size")) u("expert_latent_length", cfg.get_int("routed_expert_hidden_size"));
    u("leading_dense_block_count", cfg.get_int_or("first_k_dense_replace", 0));
    if (cfg.has("routed_scaling_factor")) f("expert_weights_scale", cfg.get_float("routed_scaling_factor"));
    if (cfg.has("moe_renormalize")) {
      checked.insert(P + "expert_weights_norm");
      key_bool(P + "expert_weights_norm", cfg.get_bool("moe_renormalize"));
    }
    u("expert_gating_func", 2);
    if (cfg.has("topk_group")) u("expert_group_used_count", cfg.get_int("topk_group"));
    u("attn_res.block_size", cfg.get_int("attn_res_block_size"));
    if (cfg.has("activation_situ_beta")) f("activation.situ_beta", cfg.get_float("activation_situ_beta"));
    if (cfg.has("activation_situ_linear_beta")) f("activation.situ_linear_beta", cfg.get_float("activation_situ_linear_beta"));
    if (cfg.get_int_or("index_topk", 0) > 0) {
      u("attention.indexer.head_count", cfg.get_int("index_n_heads"));
      u("attention.indexer.key_length", cfg.get_int("index_head_dim"));
      u("attention.indexer.top_k", cfg.get_int("index_topk"));
    }
    for (const auto& kv : r.kvs())
      if (kv.key.rfind(P, 0) == 0 && !checked.count(kv.key))
        key_result(false, kv.key, "unexpected key (not derived from config.json)");
  }

  void check_tokenizer() {
    const int64_t V = cfg.get_int("vocab_size");
    key_str("tokenizer.ggml.model", "gpt2");
    key_str("tokenizer.ggml.pre", "kimi-k2");
    fs::path dir(o.hf_dir);
    nlohmann::json tc = nlohmann::json::object();
    if (fs::exists(dir / "tokenizer_config.json")) {
      const std::string p = (dir / "tokenizer_config.json").string();
      tc = parse_json<nlohmann::json>(slurp(p), p);  // depth-limited; the error names the file
    }
    std::vector<std::string> want_tok(static_cast<size_t>(V));
    std::vector<int64_t> want_type(static_cast<size_t>(V), 0);
    std::vector<std::string> want_merges;
    bool have_merges = false;
    if (fs::exists(dir / "tiktoken.model")) {
      auto ranks = load_tiktoken((dir / "tiktoken.model").string());
      for (size_t i = 0; i < ranks.size() && i < static_cast<size_t>(V); ++i) want_type[i] = 1;
      for (size_t i = 0; i < ranks.size() && i < static_cast<size_t>(V); ++i) {
        want_tok[i] = encode_gpt2(ranks[i]);
        std::string back;  // the mapping must be invertible (checks encode_gpt2 against its inverse)
        check(decode_gpt2(want_tok[i], &back) && back == ranks[i], "internal error: GPT-2 mapping of rank {}", i);
      }
      want_merges = naive_merges(ranks);
      have_merges = true;
      if (tc.contains("added_tokens_decoder") && tc["added_tokens_decoder"].is_object()) {
        for (auto it = tc["added_tokens_decoder"].begin(); it != tc["added_tokens_decoder"].end(); ++it) {
          int64_t id = std::stoll(it.key());
          if (id < 0 || id >= V) continue;
          const auto& e = it.value();
          want_tok[id] = e.is_object() ? e.value("content", std::string()) : e.get<std::string>();
          want_type[id] = (e.is_object() && !e.value("special", true)) ? 4 : 3;
        }
      }
    } else if (fs::exists(dir / "tokenizer.json")) {
      const std::string p = (dir / "tokenizer.json").string();
      auto tj = parse_json<nlohmann::json>(slurp(p), p);
      for (auto it = tj["model"]["vocab"].begin(); it != tj["model"]["vocab"].end(); ++it) {
        int64_t id = it.value().get<int64_t>();
        if (id >= 0 && id < V) want_tok[id] = it.key(), want_type[id] = 1;
      }
      if (tj["model"].contains("merges")) {
        have_merges = true;
        for (const auto& m : tj["model"]["merges"])
          want_merges.push_back(m.is_string() ? m.get<std::string>()
                                              : m[0].get<std::string>() + " " + m[1].get<std::string>());
      }
      if (tj.contains("added_tokens"))
        for (const auto& a : tj["added_tokens"]) {
          int64_t id = a["id"].get<int64_t>();
          if (id >= 0 && id < V) want_tok[id] = a["content"].get<std::string>(), want_type[id] = a.value("special", true) ? 3 : 4;
        }
    } else {
      key_result(false, "tokenizer.ggml.tokens", "no tiktoken.model or tokenizer.json in " + o.hf_dir);
      return;
    }
    for (int64_t i = 0; i < V; ++i)
      if (want_type[i] == 0) want_tok[i] = "[PAD" + std::to_string(i) + "]", want_type[i] = 5;

    auto arr_check = [&](const std::string& k, auto&& ok_elem, size_t n, gguf::ValueType et) {
      const gguf::Value* v = r.find(k);
      if (!v) return key_result(false, k, "missing");
      if (v->type != gguf::ValueType::ARRAY || v->elem_type != et || v->array_size() != n)
        return key_result(false, k, fmt::format("{} elements of {}, expected {} of {}", v->array_size(),
                                                gguf::value_type_name(v->elem_type), n, gguf::value_type_name(et)));
      for (size_t i = 0; i < n; ++i)
        if (!ok_elem(*v, i)) return key_result(false, k, fmt::format("element {} differs", i));
      key_result(true, k, "");
    };
    arr_check("tokenizer.ggml.tokens", [&](const gguf::Value& v, size_t i) { return v.strs[i] == want_tok[i]; },
              static_cast<size_t>(V), gguf::ValueType::STRING);
    arr_check("tokenizer.ggml.token_type", [&](const gguf::Value& v, size_t i) { return v.ints[i] == want_type[i]; },
              static_cast<size_t>(V), gguf::ValueType::INT32);
    if (have_merges && !want_merges.empty())
      arr_check("tokenizer.ggml.merges", [&](const gguf::Value& v, size_t i) { return v.strs[i] == want_merges[i]; },
                want_merges.size(), gguf::ValueType::STRING);
    for (auto [k, ck] : {std::pair{"tokenizer.ggml.bos_token_id", "bos_token_id"},
                         std::pair{"tokenizer.ggml.eos_token_id", "eos_token_id"},
                         std::pair{"tokenizer.ggml.padding_token_id", "pad_token_id"}}) {
      if (cfg.has(ck)) key_u32(k, cfg.get_int(ck));
    }
    if (tc.contains("add_bos_token") && tc["add_bos_token"].is_boolean())
      key_bool("tokenizer.ggml.add_bos_token", tc["add_bos_token"].get<bool>());
    else
      key_absent("tokenizer.ggml.add_bos_token", "tokenizer_config.json does not set add_bos_token");
    std::string tmpl;
    if (fs::exists(dir / "chat_template.jinja")) tmpl = slurp((dir / "chat_template.jinja").string());
    else if (tc.contains("chat_template") && tc["chat_template"].is_string()) tmpl = tc["chat_template"].get<std::string>();
    if (!tmpl.empty()) key_str("tokenizer.chat_template", tmpl);
    else key_absent("tokenizer.chat_template", "the checkpoint has no chat template");
  }
};

}  // namespace

VerifyResult verify(const VerifyOptions& o) {
  VerifyResult res;
  const std::string cfg_path = (fs::path(o.hf_dir) / "config.json").string();
  check(fs::exists(cfg_path), "{}: missing (not a Hugging Face model directory?)", cfg_path);
  HfConfig cfg = HfConfig::load(cfg_path);
  if (dspark::is_dspark_config(cfg)) return dspark::verify(o);  // a K3 DSpark draft (docs/spec/dspark.md §2)
  auto ck = st::Checkpoint::open(o.hf_dir);
  auto rd = gguf::Reader::open(o.gguf_path);
  {
    const gguf::Value* a = rd->find("general.architecture");
    const std::string arch = a && a->type == gguf::ValueType::STRING ? a->s : std::string();
    if (arch == "moonvit3d") return verify_vision(o, cfg, *ck, *rd);
    check(arch == "kimi-k3", "{}: general.architecture is '{}', expected 'kimi-k3'", o.gguf_path,
          arch.empty() ? "(missing)" : arch);
  }

  Verifier v{o, cfg, *ck, *rd, res, {}};
  v.n_layer_cfg = cfg.get_int("num_hidden_layers");
  v.n_layer = static_cast<int64_t>(rd->get_u32("kimi-k3.block_count"));
  check(v.n_layer >= 1 && v.n_layer <= v.n_layer_cfg, "{}: kimi-k3.block_count {} outside 1..{} (config num_hidden_layers)",
        o.gguf_path, v.n_layer, v.n_layer_cfg);
  v.d = cfg.get_int("hidden_size");
  v.H = cfg.get_int("num_attention_heads");
  v.Hkv = cfg.get_int_or("num_key_value_heads", v.H);
  v.kda = cfg.get_int("linear_attn_config.head_dim");
  v.conv_k = cfg.get_int("linear_attn_config.short_conv_kernel_size");
  v.nope = cfg.get_int("qk_nope_head_dim");
  v.rope = cfg.get_int("qk_rope_head_dim");
  v.vd = cfg.get_int("v_head_dim");
  v.kv_lora = cfg.get_int("kv_lora_rank");
  v.q_lora = cfg.get_int("q_lora_rank");
  v.n_exp = cfg.get_int("num_experts");
  for (const auto& x : cfg.get("linear_attn_config")["full_attn_layers"]) v.mla.insert(x.get<int64_t>() - 1);

  // ---- general.* keys
  {
    bool first = !rd->kvs().empty() && rd->kvs()[0].key == "general.architecture";
    if (first) v.key_str("general.architecture", "kimi-k3");
    else v.key_result(false, "general.architecture", "must be the first key");
    v.key_str("general.type", "model");
    v.key_u32("general.quantization_version", 2);
  }

  // ---- tensors
  std::vector<Item> items;
  for (const auto& ti : rd->tensors()) items.push_back(v.map(ti));
  // the file's main matrix type: majority over float matrices whose rows are Q8_0-compatible
  std::map<GgmlType, size_t> votes;
  bool any_mxfp4 = false;
  for (const auto& it : items) {
    if (it.ti->type == GgmlType::MXFP4) any_mxfp4 = true;
    if (it.err.empty() && (it.cat == Cat::Matrix || it.cat == Cat::ExpertsFloat) && it.ne[0] % 32 == 0)
      ++votes[it.ti->type];
  }
  GgmlType main = GgmlType::BF16;
  size_t best = 0;
  for (auto [t, c] : votes)
    if (c > best) best = c, main = t;
  {
    uint32_t ft = rd->get_u32_or("general.file_type", 9999);
    uint32_t want = any_mxfp4 ? 38u
                    : main == GgmlType::F32 ? 0u
                    : main == GgmlType::F16 ? 1u
                    : main == GgmlType::Q8_0 ? 7u
                                             : 32u;
    v.key_result(ft == want, "general.file_type", fmt::format("{}, expected {}", ft, want));
  }

  Progress prog("verify", items.size(), rd->tensors().empty() ? 0 : [&] {
    uint64_t s = 0;
    for (auto& t : rd->tensors()) s += t.nbytes;
    return s;
  }(), (!o.quiet && ::isatty(::fileno(stderr))) ? Progress::Mode::Bar : Progress::Mode::Quiet);  // no per-tensor lines
  for (auto& it : items) {
    ++res.n_tensors;
    const auto& ti = *it.ti;
    std::string why = it.err;
    if (why.empty()) {
      std::array<int64_t, 4> want{1, 1, 1, 1};
      for (size_t i = 0; i < it.ne.size() && i < 4; ++i) want[i] = it.ne[i];
      if (want != ti.ne) {
        std::vector<int64_t> w(it.ne);
        why = fmt::format("shape {} but the source implies {{{}}}", ti.shape_string(), fmt::join(w, ", "));
      }
    }
    if (why.empty()) {
      GgmlType et = v.expected_type(it, main);
      if (et != ti.type) why = fmt::format("type {} but expected {}", type_name(ti.type), type_name(et));
    }
    if (why.empty()) why = v.compare(it);
    if (why.empty()) {
      ++res.n_exact;
    } else {
      ++res.n_mismatched;
      v.problem(fmt::format("tensor '{}': {}", ti.name, why));
    }
    // keep the resident set bounded on huge models: drop the pages just compared
    for (const st::Tensor* s : it.srcs) ck->release(*s);
    if (const MappedFile* mf = rd->mapped_file(ti.file_index); mf && ti.data && ti.nbytes)
      mf->advise_dontneed(static_cast<size_t>(ti.data - mf->data()), ti.nbytes);
    prog.add_bytes(ti.nbytes);
    prog.item_done(ti.name);
  }
  prog.finish();

  // ---- source coverage
  for (const std::string& full : ck->names()) {
    if (full.rfind("vision_tower.", 0) == 0 || full.rfind("mm_projector.", 0) == 0) continue;
    if (v.used.count(full)) continue;
    std::string n = full.rfind("language_model.", 0) == 0 ? full.substr(15) : full;
    if (n.rfind("model.layers.", 0) == 0) {
      int64_t il = std::atoll(n.c_str() + 13);
      if (il >= v.n_layer) continue;  // sliced away by --layers
    }
    ++res.n_missing;
    v.problem(fmt::format("source tensor '{}' ({}) has no counterpart in the GGUF", full, ck->get(full).file));
  }

  // ---- metadata
  std::set<std::string> checked;
  v.check_arch_keys(checked);
  v.check_tokenizer();
  return res;
}

}  // namespace kimi::convert
