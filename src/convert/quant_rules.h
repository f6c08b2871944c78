// Tensor-type rules of `kimi quantize` (formats-quant.md §4.7, §5; spec/README.md decision 5;
// dsa-indexer.md §4.6). Pure functions of tensor names, shapes and options: no file access, so
// every branch can be unit-tested on made-up names and shapes.
//
// Per tensor, first matching step wins (see docs/quantize.md):
//   1. DSA indexer tensors with >= 2 dims (`indexer.attn_q_b`, `indexer.attn_k`, `indexer.proj`):
//      kept byte for byte in the converter's type. No target, rule, override or flag changes them.
//   2. COPY target: kept.
//   3. Not quantizable (1-D, names not ending in "weight", *_norm.weight, router ffn_gate_inp,
//      ssm_conv1d*, output.weight with --leave-output-tensor): kept.
//   4. MXFP4 routed experts (*_exps): kept byte for byte unless --requantize-experts TYPE.
//   5. --output-tensor-type / --token-embedding-type, else --tensor-type PATTERN=TYPE (first
//      match), else the target's default type with the mixture rules of §5.3 (not with --pure):
//      for llama-quantize's names, llama.cpp's `llama_tensor_get_type` rules for that ftype,
//      transcribed branch by branch (with its running counters); for kimi's MoE mixes, their own.
//   6. Block-size fallback (§5.2) when ne[0] is not a multiple of the type's block; a fallback type
//      kimi cannot make (IQ4_NL) becomes Q5_0 (F16 when 32 does not divide ne[0] either); a type
//      from the rules that kimi cannot make (Q4_1 in Q4_0 with an imatrix) is an error.
//   7. Source already quantized (not F32/F16/BF16) and the type differs: error unless
//      allow_requantize; same type: bytes copied.
#pragma once
#include <array>
#include <cstdint>
#include <optional>
#include <regex>
#include <string>
#include <string_view>
#include <vector>

#include "tensor/types.h"

namespace kimi::quant {

// A quantization target as named on the command line: one of llama-quantize's names (Q4_K_M, Q2_K,
// IQ4_XS, MXFP4_MOE, ..., COPY) or its ftype number, or one of kimi's MoE mixes (Q2_K_MOE, ...).
struct Target {
  std::string name;                      // canonical spelling, e.g. "Q4_K_M"
  FileType ftype = FileType::MOSTLY_Q8_0; // written as general.file_type (unused for COPY)
  GgmlType default_type = GgmlType::Q8_0;
  bool copy = false;                     // COPY: every tensor unchanged, file_type kept
  // kimi's MoE mixes (Q2_K_MOE, Q3_K_MOE, IQ2_XS_MOE, IQ4_XS_MOE): the routed experts get their own types
  // (MXFP4 experts are re-quantized to them), every other quantizable tensor `always_read`,
  // output.weight Q6_K, non-expert ffn_down in more_bits layers Q6_K.
  bool moe_mix = false;
  GgmlType exp_gate_up = GgmlType::Q8_0, exp_down = GgmlType::Q8_0, always_read = GgmlType::Q8_0;
};
// Throws kimi::Error listing the accepted names for anything unknown, and one line saying so for a
// llama-quantize name kimi cannot make (IQ1_S, IQ2_XXS, ...: a type it has no quantizer for).
// Aliases as llama-quantize's: Q3_K -> Q3_K_M, Q4_K -> Q4_K_M, Q5_K -> Q5_K_M; kimi's older mix
// names Q2_K_M -> Q2_K_MOE, IQ2_XS_M -> IQ2_XS_MOE. Numbers are llama_ftype ids (formats-quant §4.7).
Target parse_target(const std::string& text);
// The names kimi makes (llama-quantize's, then the MoE mixes, then COPY), for help text.
const std::vector<std::string>& target_names();

// One entry of the type list in `kimi quantize --help`: llama-quantize's names in its order, then
// kimi's MoE mixes.
struct TargetInfo {
  std::string name;
  int ftype = -1;            // llama_ftype number (-1: COPY and the mixes, which are named only)
  std::string main_type;     // the ftype's default tensor type ("" when kimi has no such type)
  double bpw = 0;            // bits per weight of main_type (0 when unknown)
  std::string recipe;        // what the rules do, in one line
  std::string cannot;        // non-empty: kimi cannot make this name, and why
  std::string alias_of;      // non-empty for an alias
  bool mix = false;          // one of kimi's MoE mixes
};
const std::vector<TargetInfo>& target_table();
// The formatted list (one line per name, as llama-quantize prints its own), for --help.
std::string targets_help();

// A ggml tensor type for --tensor-type / --output-tensor-type / --token-embedding-type /
// --requantize-experts: one this build can write (F32 F16 BF16 Q8_0 Q4_0 Q5_0 Q5_1 Q2_K Q3_K Q4_K
// Q5_K Q6_K IQ4_XS IQ2_XS MXFP4).
// `what` names the option in the error message.
GgmlType parse_tensor_type(const std::string& text, const std::string& what);

// --tensor-type PATTERN=TYPE: PATTERN (lower-cased) is an ECMAScript regex searched in the name.
struct Override {
  std::string text;     // as given, for messages
  std::string pattern;  // lower-cased
  std::regex re;
  GgmlType type = GgmlType::Q8_0;
};
Override parse_override(const std::string& text);  // throws for a missing '=', empty or bad pattern, bad type

// Categories of §5.3 (by name substring; the indexer is its own category so that
// `indexer.attn_k.weight` is never an attention K).
enum class Category { Output, TokenEmbd, AttnV, AttnK, AttnQ, AttnOut, FfnUp, FfnGate, FfnDown, Indexer, Other };
Category category(std::string_view name);
const char* category_name(Category c);

// Any tensor of the DSA indexer (`indexer.` as a name component: blk.N.indexer.*).
bool is_indexer_tensor(std::string_view name);
// Routed-expert stack (`*_exps.weight`).
bool is_routed_experts(std::string_view name);
// Layer index N of "blk.N...." or nullopt.
std::optional<int> layer_index(std::string_view name);
// ggml_n_dims: 1 + index of the last ne[i] > 1 (at least 1).
int n_dims(const std::array<int64_t, 4>& ne);
// §5.3 use_more_bits(i, n): i < n/8 || i >= 7n/8 || (i - n/8) % 3 == 2 (integer division).
bool more_bits(int i, int n);
// §5.2: the type to use for rows of ne0 elements when `t`'s block size does not divide ne0
// (returns t when it does). Pure spec table: may return types this build cannot write (Q5_0, Q5_1).
GgmlType block_fallback(GgmlType t, int64_t ne0);
// Why a tensor must be kept as-is (step 3), or nullptr when it may be quantized.
const char* not_quantizable_reason(std::string_view name, const std::array<int64_t, 4>& ne, bool leave_output);
// Plain float types (F32/F16/BF16) are not "quantized" for the requantize check.
bool is_float_type(GgmlType t);

struct RuleOptions {
  Target target;
  bool pure = false;              // no mixture rules (overrides, flags and fallback still apply)
  bool leave_output = false;      // --leave-output-tensor
  bool allow_requantize = false;  // allow re-quantizing already-quantized non-MXFP4 tensors
  std::optional<GgmlType> output_type;         // --output-tensor-type
  std::optional<GgmlType> token_embd_type;     // --token-embedding-type
  std::optional<GgmlType> requantize_experts;  // --requantize-experts
  std::vector<Override> overrides;             // --tensor-type, in order
  bool have_imatrix = false;       // --imatrix given (IQ2_XS needs one, as llama-quantize demands)
  bool allow_no_imatrix = false;   // --allow-no-imatrix: quantize IQ2_XS without one anyway
};
// llama.cpp's tensor_requires_imatrix (formats-quant.md §5.4): IQ1_S, IQ1_M, IQ2_XXS, IQ2_XS,
// IQ2_S, IQ3_XXS always, Q2_K inside a Q2_K_S file; never token_embd or output.weight.
bool requires_imatrix(std::string_view name, GgmlType t, FileType ft);

// Model facts the rules need: from `{arch}.block_count` / `{arch}.expert_count`.
struct ModelFacts {
  int n_layer = 0;
  int n_expert = 0;
  int n_gqa = 0;  // llama.cpp's n_gqa(): head_count / head_count_kv of layer 0 (0 when head_count_kv is 0)
};

struct TensorDesc {
  std::string name;
  GgmlType type = GgmlType::F32;            // type in the input file
  std::array<int64_t, 4> ne{1, 1, 1, 1};
};

enum class Why {
  Indexer,         // DSA indexer matrix, exempt (decision 5)
  CopyMode,        // COPY target
  NotQuantizable,  // step 3
  ExpertsKept,     // MXFP4 routed experts copied byte for byte
  ExpertsRequant,  // --requantize-experts
  OutputFlag,      // --output-tensor-type
  TokenEmbdFlag,   // --token-embedding-type
  Override,        // --tensor-type
  Default,         // target default type (no mixture rule fired, or --pure)
  Mix,             // a §5.3 mixture rule changed the type
};
const char* why_name(Why w);

struct Decision {
  GgmlType type = GgmlType::F32;  // output type
  bool copy = false;              // bytes copied unchanged (type == source type)
  Why why = Why::Default;
  bool fallback = false;          // §5.2 fallback (or the substitution after it) changed the type
  std::string note;               // human-readable detail ("more_bits layer 3/8", "fallback Q4_K -> Q5_0 ...")
};

// Decides every tensor; the result is in file order, but the tensors are decided in llama.cpp's
// order (by the layer of `blk.N.`, then by name), on which the running counters of §5.3 depend. Throws
// kimi::Error naming the tensor for a requantization that is not allowed, a type that cannot
// be produced, or a missing layer index where the rules need one.
std::vector<Decision> plan(const std::vector<TensorDesc>& tensors, const ModelFacts& facts, const RuleOptions& opts);

}  // namespace kimi::quant
