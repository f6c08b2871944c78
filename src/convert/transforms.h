// Kimi-K3 / K3.1 HF -> GGUF tensor transforms (k3-architecture.md §2.1, §2.3; spec/README.md decisions 1-2).
// The checkpoint schema is derived from config.json; make_plan() checks the checkpoint against it
// (missing / extra / mis-shaped / mis-typed tensors) and lists every GGUF tensor with its type,
// shape and the source tensors it is produced from. produce() streams one planned tensor's bytes.
#pragma once
#include <cstdint>
#include <functional>
#include <set>
#include <string>
#include <vector>

#include "io/safetensors.h"
#include "tensor/types.h"

namespace kimi {
struct HfConfig;
}

namespace kimi::convert {

// Model dimensions from the merged config, validated (architecture, asserted settings,
// no indexer rotary settings). Throws kimi::Error naming config.json and the key.
struct K3Dims {
  int64_t n_layer = 0, d = 0, vocab = 0, n_head = 0, n_head_kv = 0;
  int64_t kda_dim = 0, conv_kernel = 0;
  int64_t q_lora = 0, kv_lora = 0, nope = 0, rope = 0, v_dim = 0;
  int64_t ff_dense = 0, n_expert = 0, n_expert_used = 0, n_shared = 0, moe_ff = 0, latent = 0, first_dense = 0;
  int64_t idx_heads = 0, idx_dim = 0, idx_topk = 0;  // idx_topk > 0 <=> indexer present
  bool mxfp4_experts = false;
  bool tie_embeddings = false;
  bool output_gate = true;   // mla_use_output_gate
  bool routed_norm = true;   // latent_moe_use_norm
  std::vector<int64_t> full_attn_1based;
  std::vector<bool> is_mla;  // per 0-based layer
  bool is_moe(int64_t il) const { return il >= first_dense; }
};
// max_tensors: how many tensors the checkpoint holds. Every count that sizes per-item structures
// (layers, routed experts) is refused above it before anything is allocated: each layer and each
// routed expert has tensors of its own, so a larger count cannot be a real checkpoint.
K3Dims read_dims(const HfConfig& cfg, uint64_t max_tensors = UINT64_MAX);
// Throws if any config key (merged dict or linear_attn_config) names both "index" and "rope".
void refuse_indexer_rope(const HfConfig& cfg);

enum class OutType { Auto, BF16, F16, F32, Q8_0 };
OutType parse_outtype(const std::string& s);  // auto|bf16|f16|f32|q8_0
const char* outtype_name(OutType t);

enum class Op {
  Copy,          // element-wise type conversion (or plain copy), same element order
  ResScore,      // res_norm.weight * res_proj.weight in f32
  ConvReshape,   // [C,1,K] -> ne {K,1,C,1} (pure reshape)
  NegExpSlice,   // ssm_a = -exp(A_log[:n_head])
  KvbK,          // kv_b K part per head, transposed: ne {nope, kv_lora, H_kv}
  KvbV,          // kv_b V part per head: ne {kv_lora, v, H_kv}
  StackMxfp4,    // per expert: weight_packed + weight_scale -> block_mxfp4 rows, ne {in, out, E}
  StackExperts,  // per expert float weights stacked: ne {in, out, E}
};

struct TensorPlan {
  std::string name;                      // GGUF name
  GgmlType type = GgmlType::F32;
  std::vector<int64_t> ne;               // ggml order
  Op op = Op::Copy;
  std::vector<const st::Tensor*> src;    // StackMxfp4: packed0, scale0, packed1, scale1, ...
  int64_t layer = -1;                    // -1 = global
  uint64_t nbytes = 0;
  // Op parameters
  int64_t n_head = 0, nope = 0, v_dim = 0, kv_lora = 0;
};

struct Plan {
  std::vector<TensorPlan> tensors;       // in output order
  std::vector<std::string> dropped;      // vision/projector tensors (full names)
  uint64_t dropped_bytes = 0;
  std::vector<std::string> skipped;      // text tensors of layers >= n_layers_keep (--layers)
  OutType outtype = OutType::BF16;       // resolved (never Auto)
  bool has_mxfp4 = false;
  FileType ftype = FileType::MOSTLY_BF16;
  uint64_t total_bytes = 0;
};

// n_layers_keep: -1 = all layers.
Plan make_plan(const K3Dims& dims, const st::Checkpoint& ckpt, OutType outtype, int64_t n_layers_keep,
               const std::string& ckpt_label);

// Streams the planned tensor's bytes (exactly t.nbytes in total) to sink in chunks.
using Sink = std::function<void(const void* data, size_t n)>;
void produce(const TensorPlan& t, const Sink& sink);

// compressed-tensors MXFP4 -> ggml block_mxfp4 for one row of n_groups groups of 32 inputs:
// packed = n_groups*16 bytes (element 2i low nibble, 2i+1 high nibble of byte i),
// scales = n_groups E8M0 bytes; out = n_groups*17 bytes (formats-quant.md §3.5).
void repack_mxfp4_row(const uint8_t* packed, const uint8_t* scales, int64_t n_groups, uint8_t* out);

// Decodes n elements of a float safetensors tensor (BF16/F16/F32/F64) starting at element `first`.
void decode_f32(const st::Tensor& t, int64_t first, int64_t n, float* out);
// Encodes floats as F32/F16/BF16 rows, or Q8_0 rows of `row_len` (n must be a multiple of row_len).
void encode_rows(const float* x, int64_t n, int64_t row_len, GgmlType type, void* out);
// True when this build can write Q8_0 (needs tensor/quants.h).
bool q8_0_available();

}  // namespace kimi::convert
