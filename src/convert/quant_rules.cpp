// Tensor-type rules of `kimi quantize`: formats-quant.md §5 restricted to the targets we write,
// plus the K3.1 indexer exemption and the MXFP4-experts policy (spec/README.md decision 5).
#include "convert/quant_rules.h"

#include <fmt/format.h>

#include <algorithm>
#include <cctype>
#include <charconv>
#include <string>
#include <vector>

#include "tensor/quants.h"
#include "util/error.h"

namespace kimi::quant {

namespace {

bool contains(std::string_view s, std::string_view sub) { return s.find(sub) != std::string_view::npos; }
bool ends_with(std::string_view s, std::string_view suf) {
  return s.size() >= suf.size() && s.substr(s.size() - suf.size()) == suf;
}
std::string upper(std::string s) {
  for (auto& c : s) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  return s;
}
std::string lower(std::string s) {
  for (auto& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

// kimi's MoE mixes: name, file type, routed gate/up, routed down, every other quantizable tensor
struct MixRow {
  const char* name;
  FileType ftype;
  GgmlType gate_up, down, always_read;
};
constexpr MixRow kMixes[] = {
    {"IQ2_XS_MOE", FileType::MOSTLY_IQ2_XS, GgmlType::IQ2_XS, GgmlType::Q2_K, GgmlType::Q4_K},
    {"Q2_K_MOE", FileType::MOSTLY_Q2_K, GgmlType::Q2_K, GgmlType::Q3_K, GgmlType::Q4_K},
    {"Q3_K_MOE", FileType::MOSTLY_Q3_K_M, GgmlType::Q3_K, GgmlType::Q4_K, GgmlType::Q5_K},
    {"IQ4_XS_MOE", FileType::MOSTLY_IQ4_XS, GgmlType::IQ4_XS, GgmlType::IQ4_XS, GgmlType::Q6_K},
};

// llama-quantize's names (QUANT_OPTIONS in llama.cpp v0.5.0's quantize.cpp, same order),
// the default tensor type of each (llama_ftype_get_default_type), what its rules do in K3 files, and
// the types its recipe needs that kimi cannot make (nullptr: none).
struct LlamaRow {
  const char* name;
  FileType ftype;
  const char* main_type;  // by name: Q1_0 / Q2_0 are not in kimi's type table
  const char* recipe;
  const char* cannot;     // the missing types
  const char* alias_of;
};
using F = FileType;
constexpr LlamaRow kLlama[] = {
    {"Q1_0", F::MOSTLY_Q1_0, "Q1_0", " 1.12 bpw Q1_0", "Q1_0", nullptr},
    {"Q2_0", F::MOSTLY_Q2_0, "Q2_0", " 2.25 bpw Q2_0", "Q2_0", nullptr},
    {"Q4_0", F::MOSTLY_Q4_0, "Q4_0", "output Q6_K (with --imatrix llama.cpp wants Q4_1 for ffn_down of layers < n/8: refused)", nullptr, nullptr},
    {"Q4_1", F::MOSTLY_Q4_1, "Q4_1", "", "Q4_1", nullptr},
    {"MXFP4_MOE", F::MOSTLY_MXFP4_MOE, "MXFP4", "3-D tensors (experts, attn_k_b, attn_v_b) MXFP4, the rest Q8_0", nullptr, nullptr},
    {"Q5_0", F::MOSTLY_Q5_0, "Q5_0", "output Q6_K; with --imatrix ffn_down of layers < n/8 Q5_1", nullptr, nullptr},
    {"Q5_1", F::MOSTLY_Q5_1, "Q5_1", "output Q6_K", nullptr, nullptr},
    {"IQ2_XXS", F::MOSTLY_IQ2_XXS, "IQ2_XXS", "", "IQ2_XXS", nullptr},
    {"IQ2_XS", F::MOSTLY_IQ2_XS, "IQ2_XS", "needs --imatrix; output Q5_K, token_embd Q2_K, attn_v Q4_K (MoE), first n/8 ffn_down Q2_K", nullptr, nullptr},
    {"IQ2_S", F::MOSTLY_IQ2_S, "IQ2_XS", "", "IQ3_S (token_embd, attn_output, first ffn_down)", nullptr},
    {"IQ2_M", F::MOSTLY_IQ2_M, "IQ2_S", "", "IQ2_S, IQ3_S", nullptr},
    {"IQ1_S", F::MOSTLY_IQ1_S, "IQ1_S", "", "IQ1_S, IQ2_XXS", nullptr},
    {"IQ1_M", F::MOSTLY_IQ1_M, "IQ1_M", "", "IQ1_M, IQ2_XXS", nullptr},
    {"TQ1_0", F::MOSTLY_TQ1_0, "TQ1_0", "", "TQ1_0", nullptr},
    {"TQ2_0", F::MOSTLY_TQ2_0, "TQ2_0", "", "TQ2_0", nullptr},
    {"Q2_K", F::MOSTLY_Q2_K, "Q2_K", "output Q6_K; attn_v Q3_K (Q4_K with GQA >= 4), ffn_down Q3_K, attn_output Q3_K", nullptr, nullptr},
    {"Q2_K_S", F::MOSTLY_Q2_K_S, "Q2_K", "needs --imatrix; output Q6_K; ffn_down of layers < n/8 Q4_K", nullptr, nullptr},
    {"IQ3_XXS", F::MOSTLY_IQ3_XXS, "IQ3_XXS", "", "IQ3_XXS, IQ3_S, IQ2_S", nullptr},
    {"IQ3_S", F::MOSTLY_IQ3_S, "IQ3_S", "", "IQ3_S", nullptr},
    {"IQ3_M", F::MOSTLY_IQ3_M, "IQ3_S", "", "IQ3_S", nullptr},
    {"Q3_K", F::MOSTLY_Q3_K_M, "Q3_K", "", nullptr, "Q3_K_M"},
    {"IQ3_XS", F::MOSTLY_IQ3_XS, "IQ3_S", "", "IQ3_S, IQ3_XXS", nullptr},
    {"Q3_K_S", F::MOSTLY_Q3_K_S, "Q3_K", "output Q6_K", nullptr, nullptr},
    {"Q3_K_M", F::MOSTLY_Q3_K_M, "Q3_K", "output Q6_K; attn_v Q5_K (first 2) else Q4_K; ffn_down Q5_K (layers < n/16) else Q4_K; attn_output Q4_K", nullptr, nullptr},
    {"Q3_K_L", F::MOSTLY_Q3_K_L, "Q3_K", "output Q6_K; attn_v, ffn_down, attn_output Q5_K", nullptr, nullptr},
    {"IQ4_NL", F::MOSTLY_IQ4_NL, "IQ4_NL", "", "IQ4_NL", nullptr},
    {"IQ4_XS", F::MOSTLY_IQ4_XS, "IQ4_XS", "output Q6_K; without --imatrix ffn_down of layers < n/8 Q5_K", nullptr, nullptr},
    {"Q4_K", F::MOSTLY_Q4_K_M, "Q4_K", "", nullptr, "Q4_K_M"},
    {"Q4_K_S", F::MOSTLY_Q4_K_S, "Q4_K", "output Q6_K; first 4 attn_v and ffn_down of layers < n/8 Q5_K", nullptr, nullptr},
    {"Q4_K_M", F::MOSTLY_Q4_K_M, "Q4_K", "output Q6_K; attn_v and ffn_down Q6_K in more_bits layers", nullptr, nullptr},
    {"Q5_K", F::MOSTLY_Q5_K_M, "Q5_K", "", nullptr, "Q5_K_M"},
    {"Q5_K_S", F::MOSTLY_Q5_K_S, "Q5_K", "output Q6_K", nullptr, nullptr},
    {"Q5_K_M", F::MOSTLY_Q5_K_M, "Q5_K", "output Q6_K; attn_v and ffn_down Q6_K in more_bits layers", nullptr, nullptr},
    {"Q6_K", F::MOSTLY_Q6_K, "Q6_K", "output Q6_K", nullptr, nullptr},
    {"Q8_0", F::MOSTLY_Q8_0, "Q8_0", "everything Q8_0", nullptr, nullptr},
    {"F16", F::MOSTLY_F16, "F16", "no mixture", nullptr, nullptr},
    {"BF16", F::MOSTLY_BF16, "BF16", "no mixture", nullptr, nullptr},
    {"F32", F::ALL_F32, "F32", "no mixture", nullptr, nullptr},
};
constexpr const char* kMixAliases[][2] = {{"Q2_K_M", "Q2_K_MOE"}, {"IQ2_XS_M", "IQ2_XS_MOE"}};

bool writable(GgmlType t) { return t != GgmlType::Q8_K && can_quantize(t); }

uint32_t block_of(GgmlType t) { return traits(t).block; }

double bits_per_weight(GgmlType t) { return 8.0 * traits(t).bytes / traits(t).block; }

// llama.cpp's quantize_state_impl counters (running positions in file order).
struct MixState {
  bool has_output = false;
  int n_attn_v = 0, i_attn_v = 0, i_ffn_down = 0, i_ffn_gate = 0, i_ffn_up = 0;
};

// llama.cpp v0.5.0 `llama_tensor_get_type_impl` (llama.cpp's llama-quant.cpp; formats-quant.md §5.3) for
// the ftype `ft`, transcribed branch by branch; kimi-k3 is neither Falcon nor a 70B Llama, and the
// attn_qkv branch is unreachable there (attn_qkv is attn_v-like). `ty` is the ftype's default type.
// Sets `note` when a rule changed the type. The counters advance as llama.cpp's do.
GgmlType llama_rules(const TensorDesc& t, Category cat, GgmlType ty, FileType ft, const ModelFacts& facts,
                     bool has_imatrix, MixState& st, std::string& note) {
  using G = GgmlType;
  const int n_expert = facts.n_expert, n_gqa = facts.n_gqa;
  auto is = [ft](std::initializer_list<FileType> l) { return std::find(l.begin(), l.end(), ft) != l.end(); };
  GgmlType r = ty;
  auto set = [&](GgmlType to, const std::string& why) {
    if (to != r) note = fmt::format("{} -> {}", why, type_name(to));
    r = to;
  };
  // FFN layer position: the layer from `blk.N.` in MoE models, else the running counter
  auto layer_of = [&](int running) {
    int i = running;
    if (std::max(1, n_expert) > 1) {
      auto li = layer_index(t.name);
      check(li.has_value(), "tensor '{}': cannot determine its layer (expected a 'blk.N.' name)", t.name);
      i = *li;
      check(i < facts.n_layer, "tensor '{}': layer {} is outside [0, {}) (block_count)", t.name, i, facts.n_layer);
    }
    return i;
  };
  const int n = facts.n_layer;
  const bool tied = !st.has_output && cat == Category::TokenEmbd;
  const bool attn_v = cat == Category::AttnV;
  const bool iq2_family = is({F::MOSTLY_IQ2_XXS, F::MOSTLY_IQ2_XS, F::MOSTLY_IQ1_S, F::MOSTLY_IQ2_S, F::MOSTLY_IQ2_M,
                              F::MOSTLY_IQ1_M});
  const bool iq2_s_m = is({F::MOSTLY_IQ2_S, F::MOSTLY_IQ2_M});
  if (cat == Category::Output || tied) {
    const char* what = tied ? "tied token_embd" : "output";
    if (ft == F::MOSTLY_MXFP4_MOE) set(G::Q8_0, fmt::format("{} in MXFP4_MOE", what));
    else if (t.ne[0] % block_of(ty) != 0)
      set(G::Q8_0, fmt::format("{}: ne[0] = {} not a multiple of {}", what, t.ne[0], block_of(ty)));
    else if (is({F::MOSTLY_IQ2_XXS, F::MOSTLY_IQ2_XS, F::MOSTLY_IQ3_XXS, F::MOSTLY_IQ1_S, F::MOSTLY_IQ2_S,
                 F::MOSTLY_IQ2_M, F::MOSTLY_IQ1_M}))
      set(G::Q5_K, what);
    else if (ty != G::Q8_0) set(G::Q6_K, what);
  } else if (ft == F::MOSTLY_MXFP4_MOE) {
    if (t.ne[2] > 1) set(G::MXFP4, "3-D tensor in MXFP4_MOE");
    else set(G::Q8_0, "2-D tensor in MXFP4_MOE");
  } else if (cat == Category::TokenEmbd) {
    if (is({F::MOSTLY_IQ2_XXS, F::MOSTLY_IQ2_XS, F::MOSTLY_IQ1_S, F::MOSTLY_IQ1_M})) set(G::Q2_K, "token_embd");
    else if (is({F::MOSTLY_IQ2_S, F::MOSTLY_IQ2_M, F::MOSTLY_IQ3_XXS})) set(G::IQ3_S, "token_embd");
    else if (is({F::MOSTLY_TQ1_0, F::MOSTLY_TQ2_0, F::MOSTLY_Q2_0})) set(G::Q4_K, "token_embd");
  } else if (iq2_family) {
    if (attn_v) {
      if (n_gqa >= 4 || n_expert >= 4) set(G::Q4_K, fmt::format("attn_v-like with GQA {} / {} experts", n_gqa, n_expert));
      else set(iq2_s_m ? G::IQ3_S : G::Q2_K, "attn_v-like");
      ++st.i_attn_v;
    } else if (n_expert == 8 && cat == Category::AttnK) {
      set(G::Q4_K, "attn_k in an 8-expert model");
    } else if (cat == Category::FfnDown) {
      if (st.i_ffn_down < n / 8)
        set(iq2_s_m ? G::IQ3_S : G::Q2_K, fmt::format("ffn_down #{} of the first n/8 = {}", st.i_ffn_down, n / 8));
      ++st.i_ffn_down;
    } else if (cat == Category::AttnOut) {
      if (n_expert == 8) set(G::Q5_K, "attn_output in an 8-expert model");
      else if (is({F::MOSTLY_IQ1_S, F::MOSTLY_IQ1_M})) set(G::IQ2_XXS, "attn_output");
      else if (iq2_s_m) set(G::IQ3_S, "attn_output");
    }
  } else if (attn_v) {
    const int i = st.i_attn_v;
    if (ft == F::MOSTLY_Q2_K) set(n_gqa >= 4 ? G::Q4_K : G::Q3_K, fmt::format("attn_v-like (GQA {})", n_gqa));
    else if (ft == F::MOSTLY_Q2_K_S && n_gqa >= 4) set(G::Q4_K, fmt::format("attn_v-like (GQA {})", n_gqa));
    else if (ft == F::MOSTLY_IQ3_XXS)
      set(n_gqa >= 4 ? G::Q4_K : !has_imatrix ? G::IQ3_S : G::IQ3_XXS, "attn_v-like");
    else if (is({F::MOSTLY_IQ3_XS, F::MOSTLY_IQ3_S}) && n_gqa >= 4) set(G::Q4_K, "attn_v-like (GQA >= 4)");
    else if (ft == F::MOSTLY_IQ3_M) set(G::Q4_K, "attn_v-like");
    else if (ft == F::MOSTLY_Q3_K_M) set(i < 2 ? G::Q5_K : G::Q4_K, fmt::format("attn_v-like #{}", i));
    else if (ft == F::MOSTLY_Q3_K_L) set(G::Q5_K, "attn_v-like");
    else if (is({F::MOSTLY_IQ4_NL, F::MOSTLY_IQ4_XS}) && n_gqa >= 4) set(G::Q5_K, "attn_v-like (GQA >= 4)");
    else if (is({F::MOSTLY_Q4_K_M, F::MOSTLY_Q5_K_M}) && more_bits(i, st.n_attn_v))
      set(G::Q6_K, fmt::format("attn_v-like {}/{} is a more_bits one", i, st.n_attn_v));
    else if (ft == F::MOSTLY_Q4_K_S && i < 4) set(G::Q5_K, fmt::format("attn_v-like {} of the first 4", i));
    if (n_expert == 8) set(G::Q8_0, "attn_v-like in an 8-expert model");
    ++st.i_attn_v;
  } else if (cat == Category::AttnK) {
    if (n_expert == 8) set(G::Q8_0, "attn_k in an 8-expert model");
    else if (ft == F::MOSTLY_IQ3_XS) set(G::IQ3_XXS, "attn_k");
    else if (ft == F::MOSTLY_IQ3_XXS) set(G::IQ2_S, "attn_k");
  } else if (cat == Category::AttnQ) {
    if (ft == F::MOSTLY_IQ3_XS) set(G::IQ3_XXS, "attn_q");
    else if (ft == F::MOSTLY_IQ3_XXS) set(G::IQ2_S, "attn_q");
  } else if (cat == Category::FfnDown) {
    const int i = layer_of(st.i_ffn_down);
    const std::string at = fmt::format("ffn_down in layer {}/{}", i, n);
    if (ft == F::MOSTLY_Q2_K) set(G::Q3_K, "ffn_down");
    else if (ft == F::MOSTLY_Q2_K_S) {
      if (i < n / 8) set(G::Q4_K, at + " < n/8");
    } else if (ft == F::MOSTLY_IQ3_XXS && !has_imatrix) set(i < n / 8 ? G::Q4_K : G::Q3_K, at);
    else if (ft == F::MOSTLY_Q3_K_M) set(i < n / 16 ? G::Q5_K : G::Q4_K, at + (i < n / 16 ? " < n/16" : ""));
    else if (ft == F::MOSTLY_IQ3_M && (i < n / 8 || (n_expert == 8 && more_bits(i, n)))) set(G::Q4_K, at);
    else if (ft == F::MOSTLY_Q3_K_L) set(G::Q5_K, "ffn_down");
    else if (ft == F::MOSTLY_Q4_K_M) {
      if (more_bits(i, n)) set(G::Q6_K, "ffn_down in more_bits layer " + std::to_string(i) + "/" + std::to_string(n));
    } else if (i < n / 8 && is({F::MOSTLY_IQ4_NL, F::MOSTLY_IQ4_XS}) && !has_imatrix) set(G::Q5_K, at + " < n/8, no imatrix");
    else if (ft == F::MOSTLY_Q5_K_M && more_bits(i, n))
      set(G::Q6_K, "ffn_down in more_bits layer " + std::to_string(i) + "/" + std::to_string(n));
    else if (ft == F::MOSTLY_Q4_K_S && i < n / 8) set(G::Q5_K, fmt::format("ffn_down in layer {} < n/8 = {}", i, n / 8));
    else if (is({F::MOSTLY_Q4_0, F::MOSTLY_Q5_0}) && has_imatrix && i < n / 8)
      set(ft == F::MOSTLY_Q4_0 ? G::Q4_1 : G::Q5_1, at + " < n/8 with an imatrix");
    ++st.i_ffn_down;
  } else if (cat == Category::AttnOut) {
    if (n_expert == 8) {
      if (is({F::MOSTLY_Q2_K, F::MOSTLY_IQ3_XS, F::MOSTLY_IQ3_XXS, F::MOSTLY_Q3_K_S, F::MOSTLY_Q3_K_M, F::MOSTLY_IQ4_NL,
              F::MOSTLY_Q4_K_S, F::MOSTLY_Q4_K_M, F::MOSTLY_IQ3_S, F::MOSTLY_IQ3_M, F::MOSTLY_IQ4_XS}))
        set(G::Q5_K, "attn_output in an 8-expert model");
    } else if (ft == F::MOSTLY_Q2_K) set(G::Q3_K, "attn_output");
    else if (ft == F::MOSTLY_IQ3_XXS) set(G::IQ3_S, "attn_output");
    else if (ft == F::MOSTLY_Q3_K_M) set(G::Q4_K, "attn_output");
    else if (ft == F::MOSTLY_Q3_K_L) set(G::Q5_K, "attn_output");
    else if (ft == F::MOSTLY_IQ3_M) set(G::Q4_K, "attn_output");
  } else if (cat == Category::FfnGate || cat == Category::FfnUp) {
    int& counter = cat == Category::FfnGate ? st.i_ffn_gate : st.i_ffn_up;
    const int i = layer_of(counter);
    if (ft == F::MOSTLY_IQ3_XS && i >= n / 8 && i < 7 * n / 8) set(G::IQ3_XXS, "ffn_gate/up in the middle layers");
    ++counter;
  }
  return r;
}

// " (did you mean 'X'?)" for the closest name (edit distance, case-insensitive) when it is close;
// names equally close are all given, in list order (" (did you mean 'Q4_K_S' or 'Q4_K_M'?)").
std::string did_you_mean(const std::string& text, const std::vector<std::string>& names) {
  const std::string t = upper(text);
  std::vector<std::string> best;
  size_t best_d = SIZE_MAX;
  for (const auto& n : names) {
    const std::string u = upper(n);
    std::vector<size_t> prev(u.size() + 1), cur(u.size() + 1);
    for (size_t j = 0; j <= u.size(); ++j) prev[j] = j;
    for (size_t i = 1; i <= t.size(); ++i) {
      cur[0] = i;
      for (size_t j = 1; j <= u.size(); ++j)
        cur[j] = std::min({prev[j] + 1, cur[j - 1] + 1, prev[j - 1] + (t[i - 1] == u[j - 1] ? 0 : 1)});
      prev.swap(cur);
    }
    if (prev[u.size()] < best_d) {
      best_d = prev[u.size()];
      best.clear();
    }
    if (prev[u.size()] == best_d && std::find(best.begin(), best.end(), n) == best.end()) best.push_back(n);
  }
  if (best.empty() || best_d > std::max<size_t>(2, t.size() / 3)) return "";
  std::string s;
  for (size_t i = 0; i < best.size(); ++i)
    s += (i == 0 ? "" : i + 1 == best.size() ? " or " : ", ") + ("'" + best[i] + "'");
  return " (did you mean " + s + "?)";
}

}  // namespace

// ------------------------------------------------------------------------------------------------
const std::vector<TargetInfo>& target_table() {
  static const std::vector<TargetInfo> table = [] {
    std::vector<TargetInfo> v;
    for (const auto& r : kLlama) {
      TargetInfo i;
      i.name = r.name;
      i.ftype = static_cast<int>(r.ftype);
      i.main_type = r.main_type;
      if (auto t = type_from_name(r.main_type)) i.bpw = bits_per_weight(*t);
      i.recipe = r.recipe;
      if (r.cannot) i.cannot = fmt::format("needs {} (no quantizer in kimi)", r.cannot);
      if (r.alias_of) i.alias_of = r.alias_of;
      v.push_back(std::move(i));
    }
    TargetInfo copy;
    copy.name = "COPY";
    copy.recipe = "only copy tensors, no quantizing";
    v.push_back(copy);
    for (const auto& r : kMixes) {
      TargetInfo i;
      i.name = r.name;
      i.main_type = type_name(r.gate_up);
      i.bpw = bits_per_weight(r.gate_up);
      i.mix = true;
      i.recipe = fmt::format("routed experts {} (gate/up) + {} (down), MXFP4 ones re-quantized; every other "
                             "tensor {}; output and more_bits ffn_down Q6_K{}",
                             type_name(r.gate_up), type_name(r.down), type_name(r.always_read),
                             requires_imatrix("", r.gate_up, r.ftype) ? "; needs --imatrix" : "");
      v.push_back(std::move(i));
    }
    for (const auto& a : kMixAliases) {
      TargetInfo i;
      i.name = a[0];
      i.alias_of = a[1];
      i.mix = true;
      v.push_back(std::move(i));
    }
    return v;
  }();
  return table;
}

const std::vector<std::string>& target_names() {
  static const std::vector<std::string> names = [] {
    std::vector<std::string> v;
    for (const auto& i : target_table())
      if (i.cannot.empty()) v.push_back(i.name);
    return v;
  }();
  return names;
}

std::string targets_help() {
  std::string out =
      "Quantization types: llama-quantize's names and numbers (same per-tensor rules as llama.cpp's; bpw = bits per "
      "weight of the main type; 8-expert models also get llama.cpp's 8-expert bumps). K3's MXFP4 routed experts are "
      "copied byte for byte under every llama.cpp name (MXFP4_MOE keeps them MXFP4 too) unless --requantize-experts "
      "TYPE; BF16 experts follow the name's rules. The DSA indexer's three matrices are never changed.\n";
  bool mixes = false;
  for (const auto& i : target_table()) {
    if (i.mix && !mixes) {
      out += "kimi's MoE mixes (experts at 2-4 bits: what the llama.cpp names leave as MXFP4):\n";
      mixes = true;
    }
    std::string head = i.ftype >= 0 ? fmt::format("  {:2d}  or  ", i.ftype) : std::string(10, ' ');
    head += fmt::format("{:<10} : ", i.name);
    if (!i.alias_of.empty()) {
      out += head + "alias for " + i.alias_of + "\n";
      continue;
    }
    std::string size = i.bpw > 0 ? fmt::format("{:5.2f} bpw {}", i.bpw, i.main_type) : std::string();
    if (!i.cannot.empty()) {
      out += head + (size.empty() ? i.recipe : size) + " -- not made by kimi: " + i.cannot + "\n";
      continue;
    }
    out += head + (size.empty() ? "" : size + (i.recipe.empty() ? "" : "; ")) + i.recipe + "\n";
  }
  return out;
}

Target parse_target(const std::string& text) {
  std::string s = upper(text);
  unsigned num = 0;
  auto [p, ec] = std::from_chars(s.data(), s.data() + s.size(), num);
  const bool is_num = !s.empty() && ec == std::errc() && p == s.data() + s.size();
  for (const auto& a : kMixAliases)
    if (s == a[0]) s = a[1];
  if (s == "COPY") return Target{"COPY", FileType::MOSTLY_BF16, GgmlType::BF16, true};
  for (const auto& r : kLlama)
    if ((is_num && num == static_cast<unsigned>(r.ftype)) || (!is_num && s == r.name)) {
      if (r.cannot)
        fail("quantization type '{}' (llama.cpp ftype {}, {}) cannot be made by kimi: its recipe needs {}, which kimi "
             "has no quantizer for (`kimi quantize --help` lists the types it makes)",
             text, static_cast<unsigned>(r.ftype), r.name, r.cannot);
      const std::string name = r.alias_of ? r.alias_of : r.name;
      return Target{name, r.ftype, *type_from_name(r.main_type), false};
    }
  for (const auto& r : kMixes)
    if (!is_num && s == r.name) {
      Target t{r.name, r.ftype, r.always_read, false};
      t.moe_mix = true;
      t.exp_gate_up = r.gate_up;
      t.exp_down = r.down;
      t.always_read = r.always_read;
      return t;
    }
  std::string list;
  for (const auto& n : target_names()) list += (list.empty() ? "" : ", ") + n;
  fail("unknown quantization type '{}'{} (expected one of {}, or the llama.cpp file_type number of one of them)", text,
       did_you_mean(text, target_names()), list);
}

GgmlType parse_tensor_type(const std::string& text, const std::string& what) {
  auto t = type_from_name(text);
  if (t && writable(*t)) return *t;
  std::string list;
  std::vector<std::string> names;
  for (auto c : {GgmlType::F32, GgmlType::F16, GgmlType::BF16, GgmlType::Q8_0, GgmlType::Q6_K, GgmlType::Q5_K,
                 GgmlType::Q4_K, GgmlType::Q3_K, GgmlType::Q2_K, GgmlType::IQ4_XS, GgmlType::IQ2_XS, GgmlType::Q4_0,
                 GgmlType::MXFP4, GgmlType::Q5_0, GgmlType::Q5_1})
    if (writable(c)) {
      list += (list.empty() ? "" : ", ") + std::string(type_name(c));
      names.push_back(type_name(c));
    }
  if (t) fail("{}: type '{}' cannot be written by this build (expected one of {})", what, text, list);
  fail("{}: unknown tensor type '{}'{} (expected one of {})", what, text, did_you_mean(text, names), list);
}

Override parse_override(const std::string& text) {
  const auto eq = text.rfind('=');
  check(eq != std::string::npos, "--tensor-type '{}': expected PATTERN=TYPE", text);
  Override o;
  o.text = text;
  o.pattern = lower(text.substr(0, eq));
  check(!o.pattern.empty(), "--tensor-type '{}': empty pattern", text);
  o.type = parse_tensor_type(text.substr(eq + 1), fmt::format("--tensor-type '{}'", text));
  try {
    o.re = std::regex(o.pattern, std::regex::ECMAScript);
  } catch (const std::regex_error& e) {
    fail("--tensor-type '{}': bad regular expression '{}': {}", text, o.pattern, e.what());
  }
  return o;
}

bool is_indexer_tensor(std::string_view name) {
  return name.substr(0, 8) == "indexer." || contains(name, ".indexer.");
}

bool is_routed_experts(std::string_view name) { return contains(name, "_exps.weight"); }

Category category(std::string_view name) {
  // The indexer first: `blk.N.indexer.attn_k.weight` contains "attn_k.weight" but is not an attention K.
  if (is_indexer_tensor(name)) return Category::Indexer;
  if (name == "output.weight") return Category::Output;
  if (name == "token_embd.weight" || name == "per_layer_token_embd.weight") return Category::TokenEmbd;
  if (contains(name, "attn_v.weight") || contains(name, "attn_qkv.weight") || contains(name, "attn_kv_b.weight"))
    return Category::AttnV;
  if (contains(name, "attn_k.weight")) return Category::AttnK;
  if (contains(name, "attn_q.weight")) return Category::AttnQ;
  if (contains(name, "attn_output.weight")) return Category::AttnOut;
  if (contains(name, "ffn_down")) return Category::FfnDown;
  if (contains(name, "ffn_up")) return Category::FfnUp;
  if (contains(name, "ffn_gate")) return Category::FfnGate;
  return Category::Other;
}

const char* category_name(Category c) {
  switch (c) {
    case Category::Output: return "output";
    case Category::TokenEmbd: return "token_embd";
    case Category::AttnV: return "attn_v";
    case Category::AttnK: return "attn_k";
    case Category::AttnQ: return "attn_q";
    case Category::AttnOut: return "attn_output";
    case Category::FfnUp: return "ffn_up";
    case Category::FfnGate: return "ffn_gate";
    case Category::FfnDown: return "ffn_down";
    case Category::Indexer: return "indexer";
    case Category::Other: return "other";
  }
  return "?";
}

std::optional<int> layer_index(std::string_view name) {
  if (name.substr(0, 4) != "blk.") return std::nullopt;
  const char* b = name.data() + 4;
  const char* e = name.data() + name.size();
  int v = 0;
  auto [p, ec] = std::from_chars(b, e, v);
  if (ec != std::errc() || p == b || p == e || *p != '.' || v < 0) return std::nullopt;
  return v;
}

int n_dims(const std::array<int64_t, 4>& ne) {
  for (int i = 3; i >= 1; --i)
    if (ne[i] > 1) return i + 1;
  return 1;
}

bool more_bits(int i, int n) { return i < n / 8 || i >= 7 * n / 8 || (i - n / 8) % 3 == 2; }

GgmlType block_fallback(GgmlType t, int64_t ne0) {
  if (ne0 % block_of(t) == 0) return t;
  GgmlType r = t;
  switch (t) {
    case GgmlType::IQ1_S: case GgmlType::IQ1_M: case GgmlType::IQ2_XXS: case GgmlType::IQ2_XS:
    case GgmlType::IQ2_S: case GgmlType::IQ3_XXS: case GgmlType::IQ3_S: case GgmlType::IQ4_XS:
      r = GgmlType::IQ4_NL; break;
    case GgmlType::Q2_K: case GgmlType::Q3_K: case GgmlType::TQ1_0: case GgmlType::TQ2_0:
      r = GgmlType::Q4_0; break;
    case GgmlType::Q4_K: r = GgmlType::Q5_0; break;
    case GgmlType::Q5_K: r = GgmlType::Q5_1; break;
    case GgmlType::Q6_K: r = GgmlType::Q8_0; break;
    default: break;  // 32-element block types are kept (and go to F16 below when that does not fit either)
  }
  if (ne0 % block_of(r) != 0) r = GgmlType::F16;
  return r;
}

const char* not_quantizable_reason(std::string_view name, const std::array<int64_t, 4>& ne, bool leave_output) {
  if (n_dims(ne) < 2) return "1-D";
  if (!ends_with(name, "weight")) return "name does not end in 'weight'";
  if (contains(name, "_norm.weight")) return "norm";
  if (leave_output && name == "output.weight") return "--leave-output-tensor";
  if (contains(name, "ffn_gate_inp.weight")) return "router (ffn_gate_inp)";
  if (contains(name, "ffn_gate_tid2eid.weight")) return "router table (ffn_gate_tid2eid)";
  if (contains(name, "ssm_conv1d")) return "short conv (ssm_conv1d)";
  if (contains(name, "shortconv.conv.weight")) return "short conv";
  if (contains(name, "position_embd.weight") || contains(name, "token_types.weight"))
    return "position/token-type embedding";
  return nullptr;
}

bool requires_imatrix(std::string_view name, GgmlType t, FileType ft) {
  if (name == "token_embd.weight" || name == "per_layer_token_embd.weight" || name == "output.weight") return false;
  switch (t) {
    case GgmlType::IQ3_XXS: case GgmlType::IQ2_XXS: case GgmlType::IQ2_XS: case GgmlType::IQ2_S:
    case GgmlType::IQ1_M: case GgmlType::IQ1_S:
      return true;
    case GgmlType::Q2_K:
      return ft == FileType::MOSTLY_Q2_K_S;
    default:
      return false;
  }
}
bool is_float_type(GgmlType t) { return t == GgmlType::F32 || t == GgmlType::F16 || t == GgmlType::BF16; }

const char* why_name(Why w) {
  switch (w) {
    case Why::Indexer: return "indexer (exempt)";
    case Why::CopyMode: return "copy";
    case Why::NotQuantizable: return "kept";
    case Why::ExpertsKept: return "MXFP4 experts kept";
    case Why::ExpertsRequant: return "--requantize-experts";
    case Why::OutputFlag: return "--output-tensor-type";
    case Why::TokenEmbdFlag: return "--token-embedding-type";
    case Why::Override: return "--tensor-type";
    case Why::Default: return "default";
    case Why::Mix: return "mix rule";
  }
  return "?";
}

// ------------------------------------------------------------------------------------------------
std::vector<Decision> plan(const std::vector<TensorDesc>& tensors, const ModelFacts& facts, const RuleOptions& o) {
  MixState st;  // llama.cpp's counters: totals first (init_quantize_state_counters), positions as it goes
  for (const auto& t : tensors) {
    if (t.name == "output.weight") st.has_output = true;
    if (category(t.name) == Category::AttnV) ++st.n_attn_v;
  }
  // llama.cpp decides the tensors in its loader's order (weight_name_comparer: by the layer of
  // `blk.N.`, names without one first, then by name), and its running counters depend on it
  std::vector<size_t> order(tensors.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) {
    const int la = layer_index(tensors[a].name).value_or(-1), lb = layer_index(tensors[b].name).value_or(-1);
    if (la != lb) return la < lb;
    return tensors[a].name < tensors[b].name;
  });
  std::vector<Decision> out(tensors.size());

  for (const size_t ti : order) {
    const TensorDesc& t = tensors[ti];
    const Category cat = category(t.name);
    Decision& d = out[ti];
    auto keep = [&](Why why, std::string note) {
      d.type = t.type;
      d.copy = true;
      d.why = why;
      d.note = std::move(note);
    };
    // 1. the DSA indexer's matrices: exempt from everything (decision 5)
    if (cat == Category::Indexer && n_dims(t.ne) >= 2) {
      keep(Why::Indexer, "DSA indexer matrix, exempt from quantization rules and overrides");
      continue;
    }
    const bool experts = is_routed_experts(t.name);
    const bool requant_experts = experts && o.requantize_experts.has_value();
    // 2. COPY
    if (o.target.copy && !requant_experts) {
      keep(Why::CopyMode, "COPY");
      continue;
    }
    // 3. never quantized
    if (const char* r = not_quantizable_reason(t.name, t.ne, o.leave_output)) {
      keep(Why::NotQuantizable, r);
      continue;
    }
    const Override* ov = nullptr;
    for (const auto& x : o.overrides)
      if (std::regex_search(t.name, x.re)) {
        ov = &x;
        break;
      }
    const bool tied_embd = !st.has_output && cat == Category::TokenEmbd;
    // 4./5. the wanted type
    GgmlType ty = o.target.default_type;
    const bool mix_experts = experts && o.target.moe_mix && !requant_experts;
    if (!o.target.moe_mix) {
      // llama.cpp's llama_tensor_get_type for this name, run for every tensor it would quantize (so its
      // running counters advance as there, also over the MXFP4 experts that kimi keeps)
      GgmlType lt = ty;
      Why why = Why::Default;
      std::string note;
      if (cat == Category::TokenEmbd && o.token_embd_type) {
        lt = *o.token_embd_type;
        why = Why::TokenEmbdFlag;
      } else if ((cat == Category::Output || tied_embd) && o.output_type) {
        lt = *o.output_type;
        why = Why::OutputFlag;
      } else if (ov) {
        lt = ov->type;
        why = Why::Override;
        note = fmt::format("'{}'", ov->text);
      } else if (!o.pure && !is_float_type(lt)) {
        const GgmlType m = llama_rules(t, cat, lt, o.target.ftype, facts, o.have_imatrix, st, note);
        if (m != lt) why = Why::Mix;
        lt = m;
      }
      if (requant_experts) {
        ty = *o.requantize_experts;
        d.why = Why::ExpertsRequant;
        d.note = fmt::format("routed experts {} -> {}", type_name(t.type), type_name(ty));
      } else if (experts && t.type == GgmlType::MXFP4) {
        keep(Why::ExpertsKept, "MXFP4 routed experts copied byte for byte (--requantize-experts TYPE to change)");
        continue;
      } else {
        ty = lt;
        d.why = why;
        d.note = note;
      }
    } else if (mix_experts) {  // the mix's expert types (MXFP4 experts are re-quantized to them)
      ty = cat == Category::FfnDown ? o.target.exp_down : o.target.exp_gate_up;
      d.why = Why::Mix;
      d.note = fmt::format("{} mix: routed experts {} -> {}", o.target.name, type_name(t.type), type_name(ty));
      if (ov) {  // an explicit --tensor-type still wins
        ty = ov->type;
        d.why = Why::Override;
        d.note = fmt::format("'{}'", ov->text);
      }
    } else if (requant_experts) {
      ty = *o.requantize_experts;
      d.why = Why::ExpertsRequant;
      d.note = fmt::format("routed experts {} -> {}", type_name(t.type), type_name(ty));
    } else if (experts && t.type == GgmlType::MXFP4) {
      keep(Why::ExpertsKept, "MXFP4 routed experts copied byte for byte (--requantize-experts TYPE to change)");
      continue;
    } else if (cat == Category::TokenEmbd && o.token_embd_type) {  // kimi's MoE mixes, the other tensors
      ty = *o.token_embd_type;
      d.why = Why::TokenEmbdFlag;
    } else if ((cat == Category::Output || tied_embd) && o.output_type) {
      ty = *o.output_type;
      d.why = Why::OutputFlag;
    } else if (ov) {
      ty = ov->type;
      d.why = Why::Override;
      d.note = fmt::format("'{}'", ov->text);
    } else if (!o.pure && cat == Category::Output) {
      ty = GgmlType::Q6_K;
      d.why = Why::Mix;
      d.note = "output -> Q6_K";
    } else if (!o.pure && cat == Category::FfnDown && facts.n_layer > 0 && layer_index(t.name) &&
               more_bits(*layer_index(t.name), facts.n_layer) && ty != GgmlType::Q6_K) {
      d.why = Why::Mix;
      d.note = fmt::format("ffn_down in more_bits layer {}/{} -> Q6_K", *layer_index(t.name), facts.n_layer);
      ty = GgmlType::Q6_K;
    } else {
      d.why = Why::Default;
      if (!o.pure) d.note = fmt::format("{} mix: always-read tensor", o.target.name);
    }
    // 6. block-size fallback, then a fallback type kimi cannot make
    auto add_note = [&](const std::string& s) { d.note += (d.note.empty() ? "" : "; ") + s; };
    check(writable(ty), "tensor '{}': {} gives it {} ({}), a type kimi cannot make (choose its type with "
          "--tensor-type PATTERN=TYPE)", t.name, o.target.name, type_name(ty), d.note.empty() ? why_name(d.why) : d.note);
    const GgmlType fb = block_fallback(ty, t.ne[0]);
    if (fb != ty) {
      add_note(fmt::format("fallback {} -> {} (ne[0] = {} is not a multiple of {})", type_name(ty), type_name(fb),
                           t.ne[0], block_of(ty)));
      d.fallback = true;
      ty = fb;
    }
    if (!writable(ty)) {  // IQ4_NL, the fallback of the IQ types
      GgmlType sub = t.ne[0] % block_of(GgmlType::Q5_0) == 0 ? GgmlType::Q5_0 : GgmlType::F16;
      add_note(fmt::format("kimi cannot make {} -> {}", type_name(ty), type_name(sub)));
      d.fallback = true;
      ty = sub;
    }
    d.type = ty;
    check(!requires_imatrix(t.name, ty, o.target.ftype) || ty == t.type || o.have_imatrix || o.allow_no_imatrix,
          "tensor '{}': {} needs an importance matrix (--imatrix FILE from `kimi imatrix`; --allow-no-imatrix to "
          "quantize without one anyway)", t.name, type_name(ty));
    // 7. requantization
    if (ty == t.type) {
      d.copy = true;
    } else {
      if (!is_float_type(t.type) && !requant_experts && !(mix_experts && t.type == GgmlType::MXFP4) &&
          !o.allow_requantize)
        fail("tensor '{}' is already quantized ({}); requantizing it to {} is disabled because it loses quality "
             "(pass --allow-requantize to do it anyway)",
             t.name, type_name(t.type), type_name(ty));
      check(can_quantize(t.type) && t.type != GgmlType::Q8_K,
            "tensor '{}': its type {} cannot be decoded by this build, so it cannot be converted to {}", t.name,
            type_name(t.type), type_name(ty));
    }
  }
  return out;
}

}  // namespace kimi::quant
