// The CPU backend: the Backend interface (backend/backend.h) over the kern:: kernels. Buffers are
// host memory, weights are used in place from the mmap, ops run on the context's ThreadPool.
// Everything about CPU tiling (heads per work item, position chunks, expert row chunks,
// per-thread scratch) lives here, not in the model code.
#pragma once
#include <memory>
#include <vector>

#include "backend/backend.h"
#include "backend/cpu/matmul.h"
#include "backend/cpu/repack.h"
#include "backend/cpu/topk.h"
#include "util/thread_pool.h"

namespace kimi {

class CpuBackend : public Backend {
 public:
  CpuBackend(ThreadPool& pool, kern::Precision prec);
  const char* name() const override { return "cpu"; }
  bool host_visible() const override { return true; }
  kern::Precision precision() const override { return prec_; }
  ThreadPool& pool() { return pool_; }

  std::unique_ptr<Buffer> alloc(uint64_t bytes, const char* what) override;
  const uint8_t* place_weight(const std::string& name, const uint8_t* host, uint64_t bytes) override;
  // K-quant weights: the row-interleaved copy; BF16 weights where AMX-BF16 is usable: the tile-order copy
  // (backend/cpu/repack.h), held until the backend goes. BF16 copies stop at half the memory limit (the
  // rest read in place: a model much larger than memory keeps its page cache for what it streams).
  const PackedWeight* prepare_weight(const kern::MatView& w) override;
  uint64_t packed_bytes() const { return packed_bytes_; }
  size_t packed_count() const { return packed_.size(); }
  uint64_t packed_bf16_bytes() const { return packed_bf16_bytes_; }
  size_t packed_bf16_count() const { return packed_bf16_count_; }
  void upload(void* dst, const void* host_src, uint64_t bytes) override;
  void download(void* host_dst, const void* src, uint64_t bytes) override;
  void copy(void* dst, const void* src, uint64_t bytes) override;
  void fill_zero(void* dst, uint64_t bytes) override;
  void reserve(const WorkLimits& lim) override;
  uint64_t scratch_bytes() const override;

  void matmul(const kern::MatView& W, const float* x, int64_t n, float* y) override;
  void matmul_set(const kern::MatView* const* W, float* const* y, int count, const float* x, int64_t n) override;
  void embed_rows(const kern::MatView& table, const BatchEntry* e, int64_t n, float* out) override;
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
  void gather_rows(const float* src, int64_t width, const int32_t* rows, int64_t n, float* dst) override;
  void set_i32(int32_t* dst, int64_t count, int32_t v) override;
  void res_mix(const float* cur, const float* w, const float* bank, const float* bank_inv, uint32_t nb,
               int64_t bank_tokens, int64_t n, int64_t d, float eps, float* dst) override;
  void bank_append(const float* src, int64_t n, int64_t d, float eps, float* bank_entry, float* inv_entry) override;
  void store_cache_rows(const float* src, int64_t ld_src, const BatchEntry* e, int64_t n,
                        const CacheRows& rows) override;
  void mla_absorb_queries(const kern::MatView& k_b, uint64_t slice_bytes, const float* q, int64_t n, int64_t H,
                          int64_t nope, int64_t pe, float* qcat) override;
  void mla_attention(const CacheRows& latent, int64_t kv_lora, const BatchEntry* e, int64_t n, int64_t H,
                     const float* qcat, const int32_t* sel_idx, const int32_t* sel_n, int64_t sel_cap, float scale,
                     AttnPath path, float* z) override;
  void mla_value_heads(const kern::MatView& v_b, uint64_t slice_bytes, const float* z, int64_t n, int64_t H,
                       float* o) override;
  void indexer_scores(const CacheRows& keys, int32_t seq, const float* q, const float* w, int64_t n_heads,
                      int64_t n_visible, float* scores) override;
  void indexer_topk(const float* scores, int64_t n, int64_t k, int32_t* sel, int32_t* sel_n, float* tmp) override;
  void indexer_select(const CacheRows& keys, const BatchEntry* e, int64_t n, const float* q, const float* w,
                      int64_t n_heads, int64_t k, int32_t* sel, int64_t sel_cap, int32_t* sel_n, float* scores,
                      float* tmp) override;
  void kda_conv_silu(const float* const w[3], int64_t K, int64_t C, const SeqStates& conv, const BatchEntry* e,
                     int64_t n, float* const x[3]) override;
  void kda_gate(float* g, const float* dt_bias, const float* a, int64_t n, int64_t H, int64_t D,
                const KdaGateParams& p) override;
  void kda_scan(const SeqStates& rec, const BatchEntry* e, int64_t n, int64_t H, int64_t D, const float* q,
                const float* k, const float* v, const float* g, const float* beta, float scale, float* o) override;
  void moe_route(float* logits, const float* bias, int64_t n, const RouterParams& p, float* probs, int32_t* sel,
                 float* weights) override;
  void axpy(float* y, float a, const float* x, int64_t count) override;
  void moe_experts(const ExpertMats& m, const float* x, int64_t n, int64_t width, const int32_t* sel,
                   const float* weights, int64_t n_used, int64_t n_expert, float situ_beta, float situ_lambda,
                   float* acc) override;
  void gelu(float* x, int64_t count, bool tanh_approx) override;
  void rope_2d(float* x, int64_t ld, int64_t n, int64_t heads, int64_t head_dim, const int32_t* row,
               const int32_t* col, float theta) override;
  void segment_attention(const float* qkv, int64_t ld, int64_t n, int64_t H, int64_t D, const int64_t* seg,
                         int64_t n_seg, float scale, float* out) override;

 private:
  // parallel_for over n items of ~`work` elementary operations each; runs inline when the whole
  // job is too small to be worth waking the pool (the decode loop issues many tiny jobs)
  template <class F>
  void par(int64_t n, int64_t work, F&& fn) {
    if (n <= 0) return;
    if (n_threads_ == 1 || n == 1 || n * work < (int64_t{1} << 15)) {
      for (int64_t i = 0; i < n; ++i) fn(i, 0);
      return;
    }
    const auto* fp = &fn;  // one pointer: fits the pool's small job record (no allocation)
    pool_.parallel_for(n, [fp](int64_t i, int th) { (*fp)(i, th); });
  }
  bool fast() const { return prec_ == kern::Precision::Fast; }
  float* head_matmul(const kern::MatView& w, uint64_t slice_bytes, int64_t h, int th, const float* src, int64_t stride,
                     int64_t H, int64_t n);

  ThreadPool& pool_;
  kern::Precision prec_;
  int n_threads_ = 1;
  WorkLimits lim_;
  // per-thread scratch: [threads][stride]
  std::vector<float> th_head_in_, th_head_out_;  // per-head matmul gathers (n_tokens * head_io)
  std::vector<float> th_row_;                    // one row (MLA row, indexer dim, KDA head dim)
  std::vector<float> th_scores_;                 // dense attention scores (heads_per_item * n_ctx)
  std::vector<uint8_t> th_sel_;                  // dense attention row mask (n_ctx)
  int64_t th_head_stride_ = 0, th_row_stride_ = 0, th_scores_stride_ = 0;
  // batched DSA selection (prefill): scores of kIdxGroup queries, top-k scratch per thread
  static constexpr int64_t kIdxGroup = 16;
  std::vector<float> idx_scores_, th_idx_tmp_;
  std::vector<uint8_t> idx_q8_;  // --indexer-int8: prepared queries (prep_idx_queries)
  std::vector<float> idx_qf_;    // f32 scores: prepared queries (prep_idx_queries_f32)
  const uint8_t* prep_idx_queries(const float* q, const float* w, int64_t n, int64_t HI, int64_t DI);
  // The same for the f32 scan (kern::prep_idx_query_f32): nullptr where that scan does not exist here.
  const float* prep_idx_queries_f32(const float* q, const float* w, int64_t n, int64_t HI, int64_t DI);
  std::vector<float> th_kda_;  // chunked KDA scan scratch (kern::kda_chunk_work_floats)
  int64_t th_kda_stride_ = 0;
  // chunked KDA scan on prefill runs of at least kMinKdaChunk tokens (opt-in, see the constructor)
  bool chunked_kda_ = false;
  static constexpr int64_t kMinKdaChunk = 8;
  int heads_per_item_ = 1;                       // MLA heads one attention work item handles
  // routed-expert grouping and gathers
  std::vector<float> ex_in_, ex_gate_, ex_up_, ex_out_;  // [slots][width or ff]
  std::vector<int32_t> ex_count_, ex_off_, ex_tok_, ex_active_;
  std::vector<float> ex_wt_;
  std::vector<kern::ScoreIdx> route_scratch_;
  std::vector<std::unique_ptr<PackedWeight>> packed_;  // prepare_weight's copies
  uint64_t packed_bytes_ = 0, packed_bf16_bytes_ = 0;
  size_t packed_bf16_count_ = 0;
};

}  // namespace kimi
