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

struct TargetRow {
  const char* name;
  FileType ftype;
  GgmlType type;
};
// MoE mix presets: name, file type, routed gate/up, routed down, every other quantizable tensor
struct MixRow {
  const char* name;
  FileType ftype;
  GgmlType gate_up, down, always_read;
};
constexpr MixRow kMixes[] = {
    {"IQ2_XS_M", FileType::MOSTLY_IQ2_XS, GgmlType::IQ2_XS, GgmlType::Q2_K, GgmlType::Q4_K},
    {"Q2_K_M", FileType::MOSTLY_Q2_K, GgmlType::Q2_K, GgmlType::Q3_K, GgmlType::Q4_K},
    {"Q3_K_M", FileType::MOSTLY_Q3_K_M, GgmlType::Q3_K, GgmlType::Q4_K, GgmlType::Q5_K},
    {"IQ4_XS", FileType::MOSTLY_IQ4_XS, GgmlType::IQ4_XS, GgmlType::IQ4_XS, GgmlType::Q6_K},
};
constexpr TargetRow kTargets[] = {
    {"Q8_0", FileType::MOSTLY_Q8_0, GgmlType::Q8_0},     {"Q6_K", FileType::MOSTLY_Q6_K, GgmlType::Q6_K},
    {"Q5_K_M", FileType::MOSTLY_Q5_K_M, GgmlType::Q5_K}, {"Q5_K_S", FileType::MOSTLY_Q5_K_S, GgmlType::Q5_K},
    {"Q4_K_M", FileType::MOSTLY_Q4_K_M, GgmlType::Q4_K}, {"Q4_K_S", FileType::MOSTLY_Q4_K_S, GgmlType::Q4_K},
    {"Q4_0", FileType::MOSTLY_Q4_0, GgmlType::Q4_0},     {"BF16", FileType::MOSTLY_BF16, GgmlType::BF16},
    {"F16", FileType::MOSTLY_F16, GgmlType::F16},        {"F32", FileType::ALL_F32, GgmlType::F32},
};

bool writable(GgmlType t) { return t != GgmlType::Q8_K && can_quantize(t); }

uint32_t block_of(GgmlType t) { return traits(t).block; }

// The §5.3 mixture for one tensor: returns the type and sets `note` when a rule fired.
GgmlType mix_type(const TensorDesc& t, Category cat, GgmlType ty, FileType ft, const ModelFacts& facts, bool has_output,
                  int i_attn_v, int n_attn_v, int i_ffn_down, std::string& note) {
  using F = FileType;
  const bool tied_embd = !has_output && t.name == "token_embd.weight";
  if (cat == Category::Output || tied_embd) {
    const char* what = tied_embd ? "tied token_embd" : "output";
    if (t.ne[0] % block_of(ty) != 0) {
      note = fmt::format("{}: ne[0] = {} not a multiple of {} -> Q8_0", what, t.ne[0], block_of(ty));
      return GgmlType::Q8_0;
    }
    if (ty != GgmlType::Q8_0) {
      note = fmt::format("{} -> Q6_K", what);
      return GgmlType::Q6_K;
    }
    return ty;
  }
  switch (cat) {
    case Category::AttnV: {
      GgmlType r = ty;
      if ((ft == F::MOSTLY_Q4_K_M || ft == F::MOSTLY_Q5_K_M) && more_bits(i_attn_v, n_attn_v)) {
        r = GgmlType::Q6_K;
        note = fmt::format("attn_v-like {}/{} is a more_bits one -> Q6_K", i_attn_v, n_attn_v);
      } else if (ft == F::MOSTLY_Q4_K_S && i_attn_v < 4) {
        r = GgmlType::Q5_K;
        note = fmt::format("attn_v-like {} of the first 4 -> Q5_K", i_attn_v);
      }
      if (facts.n_expert == 8) {
        r = GgmlType::Q8_0;
        note = "attn_v-like in an 8-expert model -> Q8_0";
      }
      return r;
    }
    case Category::AttnK:
      if (facts.n_expert == 8) {
        note = "attn_k in an 8-expert model -> Q8_0";
        return GgmlType::Q8_0;
      }
      return ty;
    case Category::FfnDown: {
      int i = i_ffn_down;
      const int n = facts.n_layer;
      if (facts.n_expert > 1) {  // MoE: the layer index from the name (experts are not in layer order)
        auto li = layer_index(t.name);
        check(li.has_value(), "tensor '{}': cannot determine its layer (expected a 'blk.N.' name)", t.name);
        i = *li;
      }
      check(n > 0 && i >= 0 && i < n, "tensor '{}': layer {} is outside [0, {}) (block_count)", t.name, i, n);
      if ((ft == F::MOSTLY_Q4_K_M || ft == F::MOSTLY_Q5_K_M) && more_bits(i, n)) {
        note = fmt::format("ffn_down in more_bits layer {}/{} -> Q6_K", i, n);
        return GgmlType::Q6_K;
      }
      if (ft == F::MOSTLY_Q4_K_S && i < n / 8) {
        note = fmt::format("ffn_down in layer {} < n/8 = {} -> Q5_K", i, n / 8);
        return GgmlType::Q5_K;
      }
      return ty;
    }
    case Category::AttnOut:
      if (facts.n_expert == 8 && (ft == F::MOSTLY_Q4_K_S || ft == F::MOSTLY_Q4_K_M)) {
        note = "attn_output in an 8-expert model -> Q5_K";
        return GgmlType::Q5_K;
      }
      return ty;
    default:  // token_embd (untied), attn_q, ffn_up, ffn_gate, other: no rule for our targets
      return ty;
  }
}

// " (did you mean 'X'?)" for the closest name (edit distance, case-insensitive) when it is close.
std::string did_you_mean(const std::string& text, const std::vector<std::string>& names) {
  const std::string t = upper(text);
  std::string best;
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
      best = n;
    }
  }
  if (best.empty() || best_d > std::max<size_t>(2, t.size() / 3)) return "";
  return fmt::format(" (did you mean '{}'?)", best);
}

}  // namespace

// ------------------------------------------------------------------------------------------------
const std::vector<std::string>& target_names() {
  static const std::vector<std::string> names = [] {
    std::vector<std::string> v;
    for (const auto& r : kTargets) v.emplace_back(r.name);
    for (const auto& r : kMixes) v.emplace_back(r.name);
    v.emplace_back("Q4_K");
    v.emplace_back("Q5_K");
    v.emplace_back("COPY");
    return v;
  }();
  return names;
}

Target parse_target(const std::string& text) {
  std::string s = upper(text);
  if (s == "Q4_K") s = "Q4_K_M";
  if (s == "Q5_K") s = "Q5_K_M";
  if (s == "COPY") return Target{"COPY", FileType::MOSTLY_BF16, GgmlType::BF16, true};
  unsigned num = 0;
  auto [p, ec] = std::from_chars(s.data(), s.data() + s.size(), num);
  const bool is_num = !s.empty() && ec == std::errc() && p == s.data() + s.size();
  for (const auto& r : kTargets)
    if ((is_num && num == static_cast<unsigned>(r.ftype)) || (!is_num && s == r.name))
      return Target{r.name, r.ftype, r.type, false};
  for (const auto& r : kMixes)
    if ((is_num && num == static_cast<unsigned>(r.ftype)) || (!is_num && s == r.name)) {
      Target t{r.name, r.ftype, r.always_read, false};
      t.moe_mix = true;
      t.exp_gate_up = r.gate_up;
      t.exp_down = r.down;
      t.always_read = r.always_read;
      return t;
    }
  std::string list;
  for (const auto& n : target_names()) list += (list.empty() ? "" : ", ") + n;
  fail("unknown quantization type '{}'{} (expected one of {}, or the file_type number of one of them)", text,
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

bool requires_imatrix(GgmlType t) {
  return t == GgmlType::IQ2_XXS || t == GgmlType::IQ2_XS || t == GgmlType::IQ2_S || t == GgmlType::IQ1_S ||
         t == GgmlType::IQ1_M || t == GgmlType::IQ3_XXS;
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
  bool has_output = false;
  int n_attn_v = 0;
  for (const auto& t : tensors) {
    if (t.name == "output.weight") has_output = true;
    if (category(t.name) == Category::AttnV) ++n_attn_v;
  }
  int i_attn_v = 0, i_ffn_down = 0;
  std::vector<Decision> out;
  out.reserve(tensors.size());

  for (const auto& t : tensors) {
    const Category cat = category(t.name);
    // running positions of §5.3, counted over every tensor of the category (whatever decides it)
    const int my_attn_v = cat == Category::AttnV ? i_attn_v++ : -1;
    const int my_ffn_down = cat == Category::FfnDown ? i_ffn_down++ : -1;

    Decision d;
    auto keep = [&](Why why, std::string note) {
      d.type = t.type;
      d.copy = true;
      d.why = why;
      d.note = std::move(note);
      out.push_back(d);
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
    // 4./5. the wanted type
    GgmlType ty = o.target.default_type;
    const bool mix_experts = experts && o.target.moe_mix && !requant_experts;
    if (mix_experts) {  // preset expert types (MXFP4 experts are re-quantized to them)
      ty = cat == Category::FfnDown ? o.target.exp_down : o.target.exp_gate_up;
      d.why = Why::Mix;
      d.note = fmt::format("{} preset: routed experts {} -> {}", o.target.name, type_name(t.type), type_name(ty));
      for (const auto& x : o.overrides)  // an explicit --tensor-type still wins
        if (std::regex_search(t.name, x.re)) {
          ty = x.type;
          d.why = Why::Override;
          d.note = fmt::format("'{}'", x.text);
          break;
        }
    } else if (requant_experts) {
      ty = *o.requantize_experts;
      d.why = Why::ExpertsRequant;
      d.note = fmt::format("routed experts {} -> {}", type_name(t.type), type_name(ty));
    } else if (experts && t.type == GgmlType::MXFP4) {
      keep(Why::ExpertsKept, "MXFP4 routed experts copied byte for byte (--requantize-experts TYPE to change)");
      continue;
    } else {
      const Override* ov = nullptr;
      for (const auto& x : o.overrides)
        if (std::regex_search(t.name, x.re)) {
          ov = &x;
          break;
        }
      const bool tied_embd = !has_output && t.name == "token_embd.weight";
      if (t.name == "token_embd.weight" && o.token_embd_type) {
        ty = *o.token_embd_type;
        d.why = Why::TokenEmbdFlag;
      } else if ((t.name == "output.weight" || tied_embd) && o.output_type) {
        ty = *o.output_type;
        d.why = Why::OutputFlag;
      } else if (ov) {
        ty = ov->type;
        d.why = Why::Override;
        d.note = fmt::format("'{}'", ov->text);
      } else if (o.target.moe_mix && !o.pure) {
        if (cat == Category::Output) {
          ty = GgmlType::Q6_K;
          d.why = Why::Mix;
          d.note = "output -> Q6_K";
        } else if (cat == Category::FfnDown && facts.n_layer > 0 && layer_index(t.name) &&
                   more_bits(*layer_index(t.name), facts.n_layer) && ty != GgmlType::Q6_K) {
          d.why = Why::Mix;
          d.note = fmt::format("ffn_down in more_bits layer {}/{} -> Q6_K", *layer_index(t.name), facts.n_layer);
          ty = GgmlType::Q6_K;
        } else {
          d.why = Why::Default;
          d.note = fmt::format("{} preset: always-read tensor", o.target.name);
        }
      } else if (!o.pure && !is_float_type(ty)) {
        std::string note;
        GgmlType m = mix_type(t, cat, ty, o.target.ftype, facts, has_output, my_attn_v, n_attn_v, my_ffn_down, note);
        if (m != ty) {
          d.why = Why::Mix;
          d.note = note;
        }
        ty = m;
      } else {
        d.why = Why::Default;
      }
    }
    // 6. block-size fallback, then types this build cannot write
    const GgmlType fb = block_fallback(ty, t.ne[0]);
    auto add_note = [&](const std::string& s) { d.note += (d.note.empty() ? "" : "; ") + s; };
    if (fb != ty) {
      add_note(fmt::format("fallback {} -> {} (ne[0] = {} is not a multiple of {})", type_name(ty), type_name(fb),
                           t.ne[0], block_of(ty)));
      d.fallback = true;
      ty = fb;
    }
    if (!writable(ty)) {
      GgmlType sub = t.ne[0] % block_of(GgmlType::Q8_0) == 0 ? GgmlType::Q8_0 : GgmlType::F16;
      check(writable(sub), "tensor '{}': no quantizer for {} or {} in this build", t.name, type_name(ty), type_name(sub));
      add_note(fmt::format("{} has no quantizer in this build -> {}", type_name(ty), type_name(sub)));
      d.fallback = true;
      ty = sub;
    }
    d.type = ty;
    check(!requires_imatrix(ty) || ty == t.type || o.have_imatrix || o.allow_no_imatrix,
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
    out.push_back(d);
  }
  return out;
}

}  // namespace kimi::quant
