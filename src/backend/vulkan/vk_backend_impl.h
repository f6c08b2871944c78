// Internal to src/backend/vulkan: the VulkanBackend class. Its ops are spread over files by
// family (vulkan_backend.cpp: memory, dense algebra, residual, caches, MLA matmuls, MoE experts;
// vk_attention.cpp: MLA attention and the DSA indexer; vk_kda.cpp: KDA and the router).
//
// Conventions for an op: every pointer argument is a device address of this backend (see
// vk_runtime.h) passed to the shader as uint64 in its push constants; host inputs (the
// micro-batch entries, row lists) go through rt_.stage(); scratch the op needs is allocated in
// reserve() from WorkLimits, never in the op.
#pragma once
#include <algorithm>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "backend/vulkan/vk_runtime.h"
#include "backend/vulkan/vulkan_backend.h"
#include "util/error.h"

namespace kimi {

inline uint64_t dev_addr(const void* p) { return reinterpret_cast<uint64_t>(p); }

// a push-constant field: v must fit 32 bits (kimi::Error naming `what` otherwise)
inline uint32_t u32(int64_t v, const char* what) {
  check(v >= 0 && v <= 0xFFFFFFFFll, "vulkan: {} = {} does not fit 32 bits", what, v);
  return static_cast<uint32_t>(v);
}

// workgroups for `items` independent units, capped at the grid size every device allows (65535);
// the shaders loop over the rest
inline uint32_t groups(int64_t items) { return static_cast<uint32_t>(std::clamp<int64_t>(items, 1, 65535)); }

class VulkanBackend final : public Backend {
 public:
  VulkanBackend(int index, Precision prec);
  ~VulkanBackend() override;
  const char* name() const override { return name_.c_str(); }
  bool host_visible() const override { return false; }
  Precision precision() const override { return prec_; }
  BackendStats stats() const override;
  uint64_t memory_capacity() const override { return rt_.info().device_local; }
  vk::Runtime& runtime() { return rt_; }
  DeviceCeiling measure_ceiling();  // vk_ceiling.cpp

  std::unique_ptr<Buffer> alloc(uint64_t bytes, const char* what) override;
  const uint8_t* place_weight(const std::string& name, const uint8_t* host, uint64_t bytes) override;
  void upload(void* dst, const void* host_src, uint64_t bytes) override;
  void download(void* host_dst, const void* src, uint64_t bytes) override;
  void copy(void* dst, const void* src, uint64_t bytes) override;
  void fill_zero(void* dst, uint64_t bytes) override;
  void sync() override;
  void flush() override;
  void reserve(const WorkLimits& lim) override;
  uint64_t scratch_bytes() const override;

  void matmul(const MatView& W, const float* x, int64_t n, float* y) override;
  void embed_rows(const MatView& table, const BatchEntry* e, int64_t n, float* out) override;
  void rms_norm_rows(const float* x, int64_t ldx, const float* w, float* y, int64_t ldy, int64_t n, int64_t width,
                     float eps) override;
  void layer_norm_rows(float* x, const float* w, const float* b, int64_t n, int64_t width, float eps) override;
  void l2_norm_rows(float* x, int64_t n, int64_t width, float eps) override;
  void add(float* y, const float* x, int64_t count) override;
  void scale_rows(float* x, int64_t n, int64_t width, float a) override;
  void sigmoid(float* x, int64_t count) override;
  void mul_sigmoid_rows(float* x, const float* gate, int64_t n, int64_t width) override;
  void situ_rows(float* g, const float* u, int64_t n, int64_t width, float beta, float lambda) override;
  void silu_mul_rows(float* g, const float* u, int64_t n, int64_t width) override;
  void rope_rows(float* x, int64_t ld, const BatchEntry* e, int64_t n, int64_t n_heads, int64_t head_stride,
                 int64_t n_rot, const float* cs) override;
  void gelu(float* x, int64_t count, bool tanh_approx) override;
  void rope_2d(float* x, int64_t ld, int64_t n, int64_t heads, int64_t head_dim, const int32_t* row, const int32_t* col,
               float theta) override;
  void segment_attention(const float* qkv, int64_t ld, int64_t n, int64_t H, int64_t D, const int64_t* seg,
                         int64_t n_seg, float scale, float* out) override;
  void gather_rows(const float* src, int64_t width, const int32_t* rows, int64_t n, float* dst) override;
  void set_i32(int32_t* dst, int64_t count, int32_t v) override;
  void res_mix(const float* cur, const float* w, const float* bank, const float* bank_inv, uint32_t nb,
               int64_t bank_tokens, int64_t n, int64_t d, float eps, float* dst) override;
  void bank_append(const float* src, int64_t n, int64_t d, float eps, float* bank_entry, float* inv_entry) override;
  void store_cache_rows(const float* src, int64_t ld_src, const BatchEntry* e, int64_t n,
                        const CacheRows& rows) override;
  void mla_absorb_queries(const MatView& k_b, uint64_t slice_bytes, const float* q, int64_t n, int64_t H,
                          int64_t nope, int64_t pe, float* qcat) override;
  void mla_attention(const CacheRows& latent, int64_t kv_lora, const BatchEntry* e, int64_t n, int64_t H,
                     const float* qcat, const int32_t* sel_idx, const int32_t* sel_n, int64_t sel_cap, float scale,
                     AttnPath path, float* z) override;
  void mla_value_heads(const MatView& v_b, uint64_t slice_bytes, const float* z, int64_t n, int64_t H,
                       float* o) override;
  void indexer_scores(const CacheRows& keys, int32_t seq, const float* q, const float* w, int64_t n_heads,
                      int64_t n_visible, float* scores) override;
  void indexer_topk(const float* scores, int64_t n, int64_t k, int32_t* sel, int32_t* sel_n, float* tmp) override;
  void kda_conv_silu(const float* const w[3], int64_t K, int64_t C, const SeqStates& conv, const BatchEntry* e,
                     int64_t n, float* const x[3]) override;
  void kda_gate(float* g, const float* dt_bias, const float* a, int64_t n, int64_t H, int64_t D,
                const KdaGateParams& p) override;
  void kda_scan(const SeqStates& rec, const BatchEntry* e, int64_t n, int64_t H, int64_t D, const float* q,
                const float* k, const float* v, const float* g, const float* beta, float scale, float* o) override;
  void moe_route(float* logits, const float* bias, int64_t n, const RouterParams& p, float* probs, int32_t* sel,
                 float* weights) override;
  void moe_experts(const ExpertMats& m, const float* x, int64_t n, int64_t width, const int32_t* sel,
                   const float* weights, int64_t n_used, int64_t n_expert, float situ_beta, float situ_lambda,
                   float* acc) override;

  // ---- helpers the op files share ----
  bool subgroup_paths() const { return subgroup_; }
  // the matmul shader of a weight type (throws for a type without one)
  vk::Pipeline& mm_pipe(GgmlType t);
  // y[z][t] = W_z x[z][t] over `batch` z items (see shaders/mm.comp for the strides)
  struct MmArgs {
    uint64_t x_batch = 0, y_batch = 0;  // floats between z items
    uint64_t ldx = 0, ldy = 0;          // floats between tokens
    uint64_t slice_bytes = 0;           // bytes between weight slices
    const int32_t* sel = nullptr;       // expert mode: slice sel[z], input row z / x_div
    uint32_t x_div = 1;
  };
  // the tiled GEMM (mm_tiled.comp) from n >= gemm_min_ tokens, the row kernel (mm.comp) below
  void mm(const MatView& W, const float* x, int64_t n, float* y, int64_t batch, const MmArgs& a);
  // mm_tiled.comp: plain (groups == 0: `batch` slices) or grouped experts (groups = moe_sort.comp's
  // output, max_tiles its tile bound)
  void mm_tiled(const MatView& W, const float* x, int64_t n, float* y, int64_t batch, const MmArgs& a,
                uint64_t groups = 0, int64_t max_tiles = 0);
  int64_t gemm_min_tokens() const { return gemm_min_; }
  void head_mm(const MatView& W, uint64_t slice_bytes, const float* x, int64_t x_head, float* y, int64_t y_head,
               int64_t n, int64_t H);
  // element-wise op of eltwise.comp over `count` elements
  void eltwise(uint32_t op, void* y, const void* x, uint64_t count, float a = 0, float b = 0, int32_t i = 0);
  // a copy of n rows of `width` floats between strided layouts (copy2d.comp)
  void copy2d(float* dst, int64_t ld_dst, const float* src, int64_t ld_src, int64_t n, int64_t width);
  uint64_t stage_entries(const BatchEntry* e, int64_t n);  // the micro-batch as 4 ints per entry
  vk::Pipeline& pipe(const char* shader);                  // by embedded shader name
  static std::string weight_key(const std::string& name, const uint8_t* host, uint64_t bytes);
  // device scratch sized in reserve(): a region of at least `bytes` for the op family `which`
  // (0 = attention/indexer, 1 = KDA/router); valid until the next op of that family
  void* op_scratch(int which, uint64_t bytes);

 private:

  vk::Runtime rt_;
  Precision prec_;
  std::string name_;
  int64_t gemm_min_ = 16;  // tokens from which matmuls use the tiled GEMM (KIMI_VULKAN_GEMM_MIN)
  bool subgroup_ = false;  // use the _sg shader variants (device has subgroup arithmetic; KIMI_VULKAN_PORTABLE=1 turns them off)
  WorkLimits lim_;
  std::map<std::string, vk::Pipeline, std::less<>> pipes_;  // by shader name, created at first use
  std::map<std::string, std::unique_ptr<Buffer>> weights_;  // by weight_key
  uint64_t weight_bytes_ = 0;
  // scratch (reserve)
  std::unique_ptr<Buffer> ex_gate_, ex_up_, ex_out_;  // routed experts: [n_tokens * n_used][ff or width]
  std::unique_ptr<Buffer> ex_sort_;                   // routed experts: moe_sort.comp's tiles and slot order
  std::unique_ptr<Buffer> op_scratch_[2];           // per op family (op_scratch)
  uint64_t scratch_ = 0;
  // host-side inputs of the vision ops, staged per call (vk_draft_vision.cpp); they only grow
  std::vector<int32_t> host_i32_;
  std::vector<float> host_f32_;
};

}  // namespace kimi
