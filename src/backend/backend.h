// The backend seam: what the forward pass (src/model/) needs from a device. The CPU backend
// (backend/cpu/cpu_backend.h) implements it over the kern:: kernels; a Vulkan or CUDA backend, or
// a proxy for layers on another MPI rank, implements the same class.
//
// Rules every implementation and every caller keeps:
// - Memory: activations, scratch, caches and states live in Buffers the backend allocated
//   (alloc). A pointer passed to an op is an address inside such a buffer of THAT backend (a
//   device address for a device backend; the host never dereferences it unless host_visible()).
//   Weights are passed as views whose data pointer place_weight returned (the mmap itself for
//   the CPU, an uploaded copy for a device).
// - Data moves between backends only through copy_between (upload / download / staging).
// - Host-side inputs are marked "(host)": the micro-batch description (BatchEntry rows: token,
//   sequence, position) and small scalars; a device backend uploads what it needs.
// - Ops are issued in order; results are visible to the next op on the same backend and, after
//   sync(), to copies. Ops allocate nothing: reserve() sizes internal scratch once.
// - Numerics: Precision::F32 ops must be exact f32 (libm activations); Precision::Fast may use
//   the backend's fast activations and reduced-precision matmul inputs.
#pragma once
#include <cstdint>
#include <memory>
#include <string>

#include "backend/mat_view.h"  // MatView (a plain weight view) and Precision

namespace kimi {

class Backend;

// One token of a micro-batch (host metadata; ops with per-sequence state read seq_id and pos).
struct BatchEntry {
  int32_t token = 0;
  int32_t seq_id = 0;
  int32_t pos = 0;
  bool want_logits = false;
};

enum class AttnPath {
  Sparse,  // gather the selected latent rows, online softmax (cost ~ top-k)
  Dense,   // softmax over the whole visible cache with -inf for unselected rows
};

// What an accelerator does at most, as measured by its backend (the Vulkan one:
// measure_vulkan_ceiling in backend/vulkan/vulkan_backend.h); plain data, so that a build without a
// device backend still compiles the code that reports it.
struct DeviceCeiling {
  std::string device;        // the device's name
  double read_bytes_per_s = 0;
  uint64_t read_buffer_bytes = 0;
  double fma_flops = 0;      // 2 flops per multiply-add
  double seconds = 0;        // time the measurement took
};

// Memory owned by one backend. data() is a host address when the backend is host_visible(),
// else a device address. Freed with the Buffer.
class Buffer {
 public:
  virtual ~Buffer() = default;
  void* data() const { return data_; }
  uint64_t bytes() const { return bytes_; }
  Backend& owner() const { return *owner_; }
  template <class T>
  T* as() const { return static_cast<T*>(data_); }

 protected:
  Buffer(Backend* owner, void* data, uint64_t bytes) : owner_(owner), data_(data), bytes_(bytes) {}
  Backend* owner_;
  void* data_;
  uint64_t bytes_;
};

// Rows of a per-sequence cache in backend memory: row (seq, pos) starts at
// data + ((seq * n_ctx + pos) * width) elements; elements are IEEE half (f16) or f32.
struct CacheRows {
  uint8_t* data = nullptr;
  bool f16 = true;
  int64_t width = 0;
  int64_t n_ctx = 0;
  // int8 rows (DSA indexer keys with --indexer-int8, CPU only; f16 is false): width int8 values,
  // then the row's f32 scale and the int32 sum of its values (backend/key_quant.h)
  bool i8 = false;
  size_t elt() const { return f16 ? 2 : 4; }
  size_t row_bytes() const { return i8 ? static_cast<size_t>(width) + 8 : static_cast<size_t>(width) * elt(); }
  uint8_t* row(int32_t seq, int32_t pos) const {
    return data + (static_cast<size_t>(seq) * static_cast<size_t>(n_ctx) + static_cast<size_t>(pos)) * row_bytes();
  }
};

// Per-sequence f32 states of one layer: sequence s at data + s * per_seq floats.
struct SeqStates {
  float* data = nullptr;
  int64_t per_seq = 0;
  float* of(int32_t seq) const { return data + static_cast<int64_t>(seq) * per_seq; }
};

// Largest shapes the ops will see; reserve() sizes the backend's own scratch from them.
struct WorkLimits {
  int64_t n_tokens = 1;   // micro-batch capacity
  int64_t n_ctx = 1;      // positions per sequence
  int64_t n_heads = 1;    // MLA / KDA heads
  int64_t head_io = 0;    // widest per-head matmul input/output (MLA nope, kv_lora, v)
  int64_t row = 0;        // widest single row scratch (MLA row, indexer dim, KDA head dim)
  bool dense_attn = false;
  // routed experts (0 when this backend runs none)
  int64_t n_expert = 0, n_expert_used = 0, expert_ff = 0, expert_width = 0;
};

// The routed experts of one layer: stacked [E] 2-D slices (slice e at data + e * slice_bytes).
// With `slices` set (experts streamed from disk into a host cache, model/expert_cache.h), expert
// e's gate, up and down data are slices[3e], slices[3e+1], slices[3e+2] instead (host backends
// only; set for the selected experts).
struct ExpertMats {
  MatView gate, up, down;
  uint64_t gate_slice = 0, up_slice = 0, down_slice = 0;
  const uint8_t* const* slices = nullptr;
};

struct RouterParams {
  int64_t n_expert = 0, n_used = 0;
  bool softmax = false;        // else sigmoid
  bool renormalize = true;     // weights / sum(weights)
  float scale = 1.0f;          // expert_weights_scale
};

struct KdaGateParams {
  bool has_lower_bound = false;
  float lower_bound = 0.0f;
};

// What a backend has moved and holds (for `kimi bench` and -v; zeros for the host CPU).
struct BackendStats {
  uint64_t bytes_to_device = 0;    // host -> device traffic so far (uploads, staged inputs)
  uint64_t bytes_from_device = 0;  // device -> host traffic so far (downloads, logits)
  uint64_t device_bytes = 0;       // device memory held now (weights + buffers + scratch)
  uint64_t weight_bytes = 0;       // of which weights
  uint64_t submits = 0;            // command submissions (device round trips) so far
  // command buffers recorded, and cached ones submitted again unchanged (the Vulkan backend's
  // replay of decode steps), and the host seconds spent recording
  uint64_t cmd_recorded = 0, cmd_replayed = 0;
  double record_seconds = 0;
};

class Backend {
 public:
  virtual ~Backend() = default;
  virtual const char* name() const = 0;
  virtual bool host_visible() const = 0;  // data() of its buffers can be read/written by the host
  virtual Precision precision() const = 0;
  virtual BackendStats stats() const { return {}; }
  // bytes of memory this backend can hold weights and buffers in (0 = not limited here: the host)
  virtual uint64_t memory_capacity() const { return 0; }

  // ---- memory ----
  virtual std::unique_ptr<Buffer> alloc(uint64_t bytes, const char* what) = 0;  // zero-filled
  // A weight's bytes as this backend reads them: the host (mmap) address itself for the CPU, an
  // uploaded copy for a device. Called once per placed tensor at load.
  virtual const uint8_t* place_weight(const std::string& name, const uint8_t* host, uint64_t bytes) = 0;
  // A copy of a placed 2-D weight (w.data as place_weight returned it) in a layout of this
  // backend's kernels, made once at load (the CPU: row-interleaved K-quants, backend/cpu/repack.h);
  // it lives as long as the backend and goes into MatView::packed. nullptr (the default): none.
  virtual const PackedWeight* prepare_weight(const MatView& w) { return nullptr; }
  virtual void upload(void* dst, const void* host_src, uint64_t bytes) = 0;
  virtual void download(void* host_dst, const void* src, uint64_t bytes) = 0;
  virtual void copy(void* dst, const void* src, uint64_t bytes) = 0;  // both in this backend
  virtual void fill_zero(void* dst, uint64_t bytes) = 0;
  virtual void sync() {}
  // Starts what is recorded so far on the device without waiting for it (a device backend submits
  // its command stream; the host backend runs ops as they are called: nothing to do). The host may
  // then work on its own while the device runs; a later sync/download waits. Results are the same
  // with or without it.
  virtual void flush() {}
  // Size internal scratch (per-thread rows, expert gathers, ...) once, before any op.
  virtual void reserve(const WorkLimits& lim) = 0;
  virtual uint64_t scratch_bytes() const = 0;

  // ---- dense algebra ----
  // y[t][r] = sum_c W[r][c] x[t][c], t < n (x: n x W.cols, y: n x W.rows)
  virtual void matmul(const MatView& W, const float* x, int64_t n, float* y) = 0;
  // y[i] = W[i] x for `count` weights that read the same input x (each y[i] exactly what matmul
  // gives): a backend may prepare x once and run them as one job (the CPU does, for one token)
  virtual void matmul_set(const MatView* const* W, float* const* y, int count, const float* x, int64_t n) {
    for (int i = 0; i < count; ++i) matmul(*W[i], x, n, y[i]);
  }
  // out[t] = row e[t].token of the table, dequantized (n x table.cols)
  virtual void embed_rows(const MatView& table, const BatchEntry* e, int64_t n, float* out) = 0;  // e: host
  // y[t] = rms_norm(x[t][:width]) * w for n rows (row strides ldx/ldy; y may alias x)
  virtual void rms_norm_rows(const float* x, int64_t ldx, const float* w, float* y, int64_t ldy, int64_t n,
                             int64_t width, float eps) = 0;
  virtual void layer_norm_rows(float* x, const float* w, const float* b, int64_t n, int64_t width, float eps) = 0;
  virtual void l2_norm_rows(float* x, int64_t n, int64_t width, float eps) = 0;
  virtual void add(float* y, const float* x, int64_t count) = 0;  // y += x
  // y += a * x with the rounding of the routed experts' weighted sum in moe_experts (so that a sum
  // of expert outputs made elsewhere, e.g. over MPI ranks, has the same bits); backends without it
  // refuse (the distributed forward pass runs on the CPU backend)
  virtual void axpy(float* y, float a, const float* x, int64_t count);
  virtual void scale_rows(float* x, int64_t n, int64_t width, float a) = 0;
  virtual void sigmoid(float* x, int64_t count) = 0;
  virtual void mul_sigmoid_rows(float* x, const float* gate, int64_t n, int64_t width) = 0;  // x *= sigmoid(gate)
  // g[t] = SiTU(g[t], u[t]) rows of width (ffn activation)
  virtual void situ_rows(float* g, const float* u, int64_t n, int64_t width, float beta, float lambda) = 0;
  // g[t] = silu(g[t]) * u[t] rows of width (the K3 DSpark draft's SwiGLU MLP, dspark.md §3.2 step 6);
  // the CPU and Vulkan backends have it, others refuse
  virtual void silu_mul_rows(float* g, const float* u, int64_t n, int64_t width);
  // Rotary embedding in place (dspark.md §3.3): for row t and head h < n_heads the pairs
  // (x[2i], x[2i+1]), i < n_rot / 2, of x + t * ld + h * head_stride are rotated by the angle of
  // position e[t].pos: cos = cs[(pos * n_rot/2 + i) * 2], sin = the next value (cs: a table of
  // n_ctx positions, in this backend's memory, with any magnitude factor folded in); backends
  // without it refuse
  virtual void rope_rows(float* x, int64_t ld, const BatchEntry* e, int64_t n, int64_t n_heads, int64_t head_stride,
                         int64_t n_rot, const float* cs);  // e: host
  virtual void gather_rows(const float* src, int64_t width, const int32_t* rows, int64_t n, float* dst) = 0;  // rows: host
  virtual void set_i32(int32_t* dst, int64_t count, int32_t v) = 0;

  // ---- residual attention (ResMix) ----
  // dst[t] = softmax_k(score_k) weighted sum over [bank[0..nb), cur] (bank entry k, token t at
  // bank + (k * bank_tokens + t) * d; bank_inv likewise per token)
  virtual void res_mix(const float* cur, const float* w, const float* bank, const float* bank_inv, uint32_t nb,
                       int64_t bank_tokens, int64_t n, int64_t d, float eps, float* dst) = 0;
  // bank_entry = src (n x d), inv_entry[t] = 1 / rms(src[t])
  virtual void bank_append(const float* src, int64_t n, int64_t d, float eps, float* bank_entry, float* inv_entry) = 0;

  // ---- caches ----
  // row (e[t].seq_id, e[t].pos) of `rows` = src[t][:rows.width] (converted to the cache type)
  virtual void store_cache_rows(const float* src, int64_t ld_src, const BatchEntry* e, int64_t n,
                                const CacheRows& rows) = 0;  // e: host

  // ---- MLA (absorbed, NoPE) ----
  // qcat[t][h] = [W_kb,h^T q[t][h][:nope] | q[t][h][nope:nope+pe]]   (W_kb,h = k_b slice h: kvl x nope)
  virtual void mla_absorb_queries(const MatView& k_b, uint64_t slice_bytes, const float* q, int64_t n,
                                  int64_t H, int64_t nope, int64_t pe, float* qcat) = 0;
  // z[t][h] = softmax(scale * qcat[t][h] . rows) . latent over the token's visible rows 0..pos,
  // only rows sel_idx[t][0..sel_n[t]) when sel_n[t] >= 0
  virtual void mla_attention(const CacheRows& latent, int64_t kv_lora, const BatchEntry* e, int64_t n, int64_t H,
                             const float* qcat, const int32_t* sel_idx, const int32_t* sel_n, int64_t sel_cap,
                             float scale, AttnPath path, float* z) = 0;  // e: host
  // o[t][h*vd..] = W_vb,h z[t][h]   (W_vb,h = v_b slice h: vd x kvl)
  virtual void mla_value_heads(const MatView& v_b, uint64_t slice_bytes, const float* z, int64_t n, int64_t H,
                               float* o) = 0;

  // ---- DSA indexer ----
  // scores[s] = sum_h w[h] max(0, q_h . key(seq, s)), s < n_visible
  virtual void indexer_scores(const CacheRows& keys, int32_t seq, const float* q, const float* w, int64_t n_heads,
                              int64_t n_visible, float* scores) = 0;
  // the k best of scores[0..n) (ties: lower index), ascending, into sel; *sel_n = how many
  virtual void indexer_topk(const float* scores, int64_t n, int64_t k, int32_t* sel, int32_t* sel_n, float* tmp) = 0;
  // The selection of the n queries of a batch (q: [n][n_heads * keys.width], w: [n][n_heads]): a
  // query that sees more than k positions gets the k best of its scores (indexer_scores, then
  // indexer_topk) in sel + t * sel_cap and sel_n[t]; the others get sel_n[t] = -1 (every visible
  // row). scores, tmp: n_ctx floats of scratch. The default runs the two ops query by query; a
  // backend may score several queries of a sequence together (same result).
  virtual void indexer_select(const CacheRows& keys, const BatchEntry* e, int64_t n, const float* q, const float* w,
                              int64_t n_heads, int64_t k, int32_t* sel, int64_t sel_cap, int32_t* sel_n, float* scores,
                              float* tmp);  // e: host

  // ---- KDA ----
  // x[i][t] = SiLU(causal depthwise conv of stream i (q, k, v) with the sequence's rolling state)
  virtual void kda_conv_silu(const float* const w[3], int64_t K, int64_t C, const SeqStates& conv,
                             const BatchEntry* e, int64_t n, float* const x[3]) = 0;  // e: host
  // g (n x H*D, in: f_b projection) -> the per-key-channel decay in the form kda_scan expects
  virtual void kda_gate(float* g, const float* dt_bias, const float* a, int64_t n, int64_t H, int64_t D,
                        const KdaGateParams& p) = 0;
  // gated delta rule over the tokens in order (per-sequence recurrent state), o = read-out
  virtual void kda_scan(const SeqStates& rec, const BatchEntry* e, int64_t n, int64_t H, int64_t D, const float* q,
                        const float* k, const float* v, const float* g, const float* beta, float scale,
                        float* o) = 0;  // e: host

  // ---- MoE ----
  // logits (n x E) -> for each token the n_used experts (ranked) and their weights
  virtual void moe_route(float* logits, const float* bias, int64_t n, const RouterParams& p, float* probs,
                         int32_t* sel, float* weights) = 0;
  // acc[t] = sum_j weights[t][j] * down_e(SiTU(gate_e x[t], up_e x[t])), e = sel[t][j]
  // (x, acc: n x width; grouped per expert in expert order). A slot with sel < 0 is skipped (its
  // expert lives on another rank, docs/distributed.md); acc rows with no slot are zero.
  virtual void moe_experts(const ExpertMats& m, const float* x, int64_t n, int64_t width, const int32_t* sel,
                           const float* weights, int64_t n_used, int64_t n_expert, float situ_beta, float situ_lambda,
                           float* acc) = 0;

  // ---- vision tower (docs/spec/vision.md §3); the CPU and Vulkan backends have them, the defaults refuse ----
  // x = GELU(x) elementwise: tanh_approx ? 0.5x(1 + tanh(sqrt(2/pi)(x + 0.044715x^3))) : 0.5x(1 + erf(x/sqrt 2))
  virtual void gelu(float* x, int64_t count, bool tanh_approx);
  // 2-D rotary embedding (vision.md §3.4) on n rows of `heads` vectors of head_dim values (row t at
  // x + t * ld): pair 2j of a head rotated by col[t] * theta^(-4j/head_dim), pair 2j+1 by row[t] * the same
  virtual void rope_2d(float* x, int64_t ld, int64_t n, int64_t heads, int64_t head_dim, const int32_t* row,
                       const int32_t* col, float theta);  // row, col: host
  // Attention without a mask inside each segment [seg[i], seg[i+1]) of the n rows, none across them
  // (vision.md §3.3 step 3): out[t][h*D..] = softmax_s(scale q[t]_h . k[s]_h) v[s]_h over t's segment,
  // with q, k, v of row t at qkv + t * ld + {0, H*D, 2*H*D} + h*D.
  virtual void segment_attention(const float* qkv, int64_t ld, int64_t n, int64_t H, int64_t D, const int64_t* seg,
                                 int64_t n_seg, float scale, float* out);  // seg: host, n_seg + 1 bounds
};

// Copies bytes from src (a buffer address of backend `from`) to dst (of backend `to`).
void copy_between(Backend& to, void* dst, Backend& from, const void* src, uint64_t bytes);

}  // namespace kimi
