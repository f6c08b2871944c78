// The CPU backend: each op is a loop over the kern:: kernels, threaded over rows, heads, chunks
// or experts on the context's pool (cpu_backend.h).
#include "backend/cpu/cpu_backend.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <new>

#include "backend/cpu/attention.h"
#include "backend/key_quant.h"
#include "backend/cpu/conv.h"
#include "backend/cpu/kda.h"
#include "backend/cpu/ops.h"
#include "backend/cpu/repack.h"
#include "util/error.h"
#include "util/file_read.h"

namespace kimi {

namespace {

// host memory, 64-byte aligned, zero-filled
class HostBuffer final : public Buffer {
 public:
  HostBuffer(Backend* owner, uint64_t bytes)
      : Buffer(owner, bytes ? ::operator new(bytes, std::align_val_t(64)) : nullptr, bytes) {
    if (bytes) std::memset(data_, 0, bytes);
  }
  ~HostBuffer() override {
    if (data_) ::operator delete(data_, std::align_val_t(64));
  }
};

constexpr uint32_t kMaxBank = 255;

// slice i of a stacked 3-D weight
kern::MatView slice_of(const kern::MatView& w, uint64_t slice_bytes, int64_t i) {
  kern::MatView s = w;
  s.data += slice_bytes * static_cast<uint64_t>(i);
  return s;
}

// expert e's gate (which 0), up (1) or down (2) matrix
kern::MatView expert_mat(const ExpertMats& m, int which, int64_t e) {
  const kern::MatView& w = which == 0 ? m.gate : which == 1 ? m.up : m.down;
  if (m.slices) {
    kern::MatView s = w;
    s.data = m.slices[3 * e + which];
    return s;
  }
  return slice_of(w, which == 0 ? m.gate_slice : which == 1 ? m.up_slice : m.down_slice, e);
}

}  // namespace

CpuBackend::CpuBackend(ThreadPool& pool, kern::Precision prec) : pool_(pool), prec_(prec), n_threads_(pool.size()) {
  // The chunked KDA scan (kern::kda_chunk) is opt-in: KIMI_KDA_SCAN=chunk. It equals the token
  // steps only up to f32 rounding, so a prompt's logits would depend on how it is split into
  // batches, and on this CPU the recurrence is ~2 % of a prefill (docs/performance.md, section 3).
  if (const char* f = std::getenv("KIMI_KDA_SCAN")) chunked_kda_ = std::strcmp(f, "chunk") == 0;
}

std::unique_ptr<Buffer> CpuBackend::alloc(uint64_t bytes, const char*) { return std::make_unique<HostBuffer>(this, bytes); }
const uint8_t* CpuBackend::place_weight(const std::string&, const uint8_t* host, uint64_t) { return host; }
const PackedWeight* CpuBackend::prepare_weight(const kern::MatView& w) {
  if (prec_ != kern::Precision::Fast) return nullptr;  // Precision::F32 reads the original
  const bool bf16 = w.type == GgmlType::BF16;
  if (bf16) {
    static const uint64_t limit = memory_limit_bytes();
    const uint64_t bytes = static_cast<uint64_t>((w.rows + kern::kAmxPackRows - 1) / kern::kAmxPackRows) *
                           kern::kAmxPackRows * static_cast<uint64_t>(w.cols) * 2;
    if (limit > 0 && packed_bf16_bytes_ + bytes > limit / 2) return nullptr;
  }
  auto p = kern::pack_weight(w, &pool_);
  if (!p) return nullptr;
  const uint64_t bytes = p->group_bytes * static_cast<uint64_t>(p->groups);
  packed_bytes_ += bytes;
  if (bf16) packed_bf16_bytes_ += bytes, ++packed_bf16_count_;
  packed_.push_back(std::move(p));
  return packed_.back().get();
}
void CpuBackend::upload(void* dst, const void* src, uint64_t bytes) { std::memcpy(dst, src, bytes); }
void CpuBackend::download(void* dst, const void* src, uint64_t bytes) { std::memcpy(dst, src, bytes); }
void CpuBackend::copy(void* dst, const void* src, uint64_t bytes) {
  if (bytes) std::memmove(dst, src, bytes);
}
void CpuBackend::fill_zero(void* dst, uint64_t bytes) {
  if (bytes) std::memset(dst, 0, bytes);
}

void CpuBackend::reserve(const WorkLimits& lim) {
  lim_ = lim;
  const int64_t T = n_threads_, N = lim.n_tokens;
  // one thread: all heads (up to 16) share each block's row conversion; else groups of 8 so a
  // decode token's attention spreads over the threads
  heads_per_item_ = static_cast<int>(std::max<int64_t>(1, std::min<int64_t>(lim.n_heads, n_threads_ == 1 ? 16 : 8)));
  th_head_stride_ = N * lim.head_io;
  th_row_stride_ = lim.row;
  th_scores_stride_ = static_cast<int64_t>(heads_per_item_) * lim.n_ctx;
  th_head_in_.assign(static_cast<size_t>(T * th_head_stride_), 0.0f);
  th_head_out_.assign(static_cast<size_t>(T * th_head_stride_), 0.0f);
  th_row_.assign(static_cast<size_t>(T * th_row_stride_), 0.0f);
  th_scores_.assign(lim.dense_attn ? static_cast<size_t>(T * th_scores_stride_) : 0, 0.0f);
  th_sel_.assign(lim.dense_attn ? static_cast<size_t>(T * lim.n_ctx) : 0, 0);
  idx_scores_.assign(N > 1 ? static_cast<size_t>(kIdxGroup * lim.n_ctx) : 0, 0.0f);
  th_idx_tmp_.assign(N > 1 ? static_cast<size_t>(T * lim.n_ctx) : 0, 0.0f);
  th_kda_stride_ = N > 1 ? kern::kda_chunk_work_floats(lim.row) : 0;  // the chunked KDA scan (prefill)
  th_kda_.assign(static_cast<size_t>(T * th_kda_stride_), 0.0f);
  const int64_t E = lim.n_expert, k = lim.n_expert_used, F = lim.expert_ff, Lw = lim.expert_width;
  ex_in_.assign(static_cast<size_t>(N * Lw), 0.0f);
  ex_gate_.assign(static_cast<size_t>(N * F), 0.0f);
  ex_up_.assign(static_cast<size_t>(N * F), 0.0f);
  ex_out_.assign(static_cast<size_t>(N * Lw), 0.0f);
  ex_count_.assign(static_cast<size_t>(E), 0);
  ex_active_.assign(static_cast<size_t>(E), 0);
  ex_off_.assign(static_cast<size_t>(E + 1), 0);
  ex_tok_.assign(static_cast<size_t>(N * k), 0);
  ex_wt_.assign(static_cast<size_t>(N * k), 0.0f);
  route_scratch_.resize(static_cast<size_t>(E));
}

uint64_t CpuBackend::scratch_bytes() const {
  uint64_t b = 0;
  for (auto* v : {&th_head_in_, &th_head_out_, &th_row_, &th_scores_, &th_kda_, &idx_scores_, &th_idx_tmp_, &ex_in_, &ex_gate_, &ex_up_, &ex_out_, &ex_wt_})
    b += v->size() * 4;
  return b + th_sel_.size() + (ex_count_.size() + ex_active_.size() + ex_off_.size() + ex_tok_.size()) * 4;
}

// ---- dense algebra ----

void CpuBackend::matmul(const kern::MatView& W, const float* x, int64_t n, float* y) {
  kern::matmul(W, x, n, y, pool_, prec_);
}

void CpuBackend::matmul_set(const kern::MatView* const* W, float* const* y, int count, const float* x, int64_t n) {
  kern::matmul_set(W, y, count, x, n, pool_, prec_);
}

void CpuBackend::embed_rows(const kern::MatView& table, const BatchEntry* e, int64_t n, float* out) {
  const int64_t d = table.cols;
  par(n, d * 2, [&](int64_t t, int) { kern::dequantize_row(table, e[t].token, out + t * d); });
}

void CpuBackend::rms_norm_rows(const float* x, int64_t ldx, const float* w, float* y, int64_t ldy, int64_t n,
                               int64_t width, float eps) {
  par(n, width * 3, [&](int64_t t, int) { kern::rms_norm(x + t * ldx, w, y + t * ldy, width, eps); });
}

void CpuBackend::layer_norm_rows(float* x, const float* w, const float* b, int64_t n, int64_t width, float eps) {
  par(n, width * 6, [&](int64_t t, int) { kern::layer_norm(x + t * width, w, b, x + t * width, width, eps); });
}

void CpuBackend::l2_norm_rows(float* x, int64_t n, int64_t width, float eps) {
  par(n, width * 3, [&](int64_t i, int) { kern::l2_norm(x + i * width, x + i * width, width, eps); });
}

void CpuBackend::add(float* y, const float* x, int64_t count) {
  for (int64_t i = 0; i < count; ++i) y[i] += x[i];
}

void CpuBackend::scale_rows(float* x, int64_t n, int64_t width, float a) {
  for (int64_t i = 0; i < n * width; ++i) x[i] *= a;
}

void CpuBackend::sigmoid(float* x, int64_t count) {
  if (fast())
    kern::sigmoid_inplace_fast(x, count);
  else
    kern::sigmoid_inplace(x, count);
}

void CpuBackend::mul_sigmoid_rows(float* x, const float* gate, int64_t n, int64_t width) {
  par(n, width * 16, [&](int64_t t, int) {
    if (fast())
      kern::mul_sigmoid_fast(x + t * width, gate + t * width, width);
    else
      kern::mul_sigmoid(x + t * width, gate + t * width, width);
  });
}

void CpuBackend::situ_rows(float* g, const float* u, int64_t n, int64_t w, float beta, float lambda) {
  par(n, w * 16, [&](int64_t t, int) {
    if (fast())
      kern::situ_fast(g + t * w, u + t * w, g + t * w, w, beta, lambda);
    else
      kern::situ(g + t * w, u + t * w, g + t * w, w, beta, lambda);
  });
}

// silu(g) * u with libm's exp in both precisions (a small op of the DSpark draft's MLP)
void CpuBackend::silu_mul_rows(float* g, const float* u, int64_t n, int64_t w) {
  par(n, w * 16, [&](int64_t t, int) {
    float* x = g + t * w;
    const float* y = u + t * w;
    for (int64_t i = 0; i < w; ++i) x[i] = x[i] / (1.0f + std::exp(-x[i])) * y[i];
  });
}

void CpuBackend::rope_rows(float* x, int64_t ld, const BatchEntry* e, int64_t n, int64_t n_heads, int64_t head_stride,
                           int64_t n_rot, const float* cs) {
  const int64_t half = n_rot / 2;
  for (int64_t t = 0; t < n; ++t) {
    const float* c = cs + static_cast<int64_t>(e[t].pos) * n_rot;
    for (int64_t h = 0; h < n_heads; ++h) {
      float* v = x + t * ld + h * head_stride;
      for (int64_t i = 0; i < half; ++i) {
        const float x0 = v[2 * i], x1 = v[2 * i + 1], co = c[2 * i], si = c[2 * i + 1];
        v[2 * i] = x0 * co - x1 * si;
        v[2 * i + 1] = x0 * si + x1 * co;
      }
    }
  }
}

void CpuBackend::gather_rows(const float* src, int64_t width, const int32_t* rows, int64_t n, float* dst) {
  for (int64_t i = 0; i < n; ++i)
    std::memcpy(dst + i * width, src + static_cast<int64_t>(rows[i]) * width, static_cast<size_t>(width) * 4);
}

void CpuBackend::set_i32(int32_t* dst, int64_t count, int32_t v) { std::fill(dst, dst + count, v); }

// ---- residual attention ----

void CpuBackend::res_mix(const float* cur, const float* w, const float* bank, const float* bank_inv, uint32_t nb,
                         int64_t bank_tokens, int64_t n, int64_t d, float eps, float* dst) {
  par(n, (nb + 1) * d * 4, [&](int64_t t, int) {
    const float* ct = cur + t * d;
    float* out = dst + t * d;
    if (nb == 0) {
      std::memcpy(out, ct, static_cast<size_t>(d) * 4);
      return;
    }
    float s[kMaxBank + 1];
    const double ss = kern::sum_sq(ct, d);
    const float inv_c = 1.0f / std::sqrt(static_cast<float>(ss / static_cast<double>(d)) + eps);
    for (uint32_t k = 0; k < nb; ++k) {
      const float* b = bank + (static_cast<int64_t>(k) * bank_tokens + t) * d;
      s[k] = kern::dot_f32(b, w, d) * bank_inv[static_cast<size_t>(k) * bank_tokens + t];
    }
    s[nb] = kern::dot_f32(ct, w, d) * inv_c;
    float mx = s[0];
    for (uint32_t k = 1; k <= nb; ++k) mx = std::max(mx, s[k]);
    float sum = 0;
    for (uint32_t k = 0; k <= nb; ++k) {
      s[k] = std::exp(s[k] - mx);
      sum += s[k];
    }
    for (uint32_t k = 0; k <= nb; ++k) s[k] /= sum;
    for (int64_t j = 0; j < d; ++j) out[j] = 0.0f;
    for (uint32_t k = 0; k < nb; ++k) kern::axpy_f32(s[k], bank + (static_cast<int64_t>(k) * bank_tokens + t) * d, out, d);
    kern::axpy_f32(s[nb], ct, out, d);
  });
}

void CpuBackend::bank_append(const float* src, int64_t n, int64_t d, float eps, float* bank_entry, float* inv_entry) {
  std::memcpy(bank_entry, src, static_cast<size_t>(n * d) * 4);
  for (int64_t t = 0; t < n; ++t) {
    const double ss = kern::sum_sq(bank_entry + t * d, d);
    inv_entry[t] = 1.0f / std::sqrt(static_cast<float>(ss / static_cast<double>(d)) + eps);
  }
}

// ---- caches ----

void CpuBackend::store_cache_rows(const float* src, int64_t ld_src, const BatchEntry* e, int64_t n,
                                  const CacheRows& rows) {
  const int64_t W = rows.width;
  par(n, W * 2, [&](int64_t t, int) {
    uint8_t* dst = rows.row(e[t].seq_id, e[t].pos);
    if (rows.i8)
      quantize_key_i8(src + t * ld_src, W, dst);
    else if (rows.f16)
      kern::f32_to_f16_row(src + t * ld_src, reinterpret_cast<uint16_t*>(dst), W);
    else
      std::memcpy(dst, src + t * ld_src, static_cast<size_t>(W) * 4);
  });
}

// ---- MLA ----

// The n tokens of head h through slice h of a stacked per-head weight: gathers x_h (w.cols values
// at src + (t * H + h) * stride) into this thread's scratch; returns the [n][w.rows] product.
float* CpuBackend::head_matmul(const kern::MatView& w, uint64_t slice_bytes, int64_t h, int th, const float* src,
                               int64_t stride, int64_t H, int64_t n) {
  float* a = th_head_in_.data() + th * th_head_stride_;
  float* b = th_head_out_.data() + th * th_head_stride_;
  for (int64_t t = 0; t < n; ++t) std::memcpy(a + t * w.cols, src + (t * H + h) * stride, static_cast<size_t>(w.cols) * 4);
  kern::matmul_rows(slice_of(w, slice_bytes, h), a, n, b, 0, w.rows, prec_);
  return b;
}

void CpuBackend::mla_absorb_queries(const kern::MatView& k_b, uint64_t slice_bytes, const float* q, int64_t n,
                                    int64_t H, int64_t nope, int64_t pe, float* qcat) {
  const int64_t kvl = k_b.rows, kq = nope + pe, W = kvl + pe;
  // heads in parallel, each thread gathers its head's q_nope for all tokens
  par(H, n * nope * kvl * 2, [&](int64_t h, int th) {
    const float* b = head_matmul(k_b, slice_bytes, h, th, q, kq, H, n);  // [n][kvl]
    for (int64_t t = 0; t < n; ++t) {
      float* qc = qcat + (t * H + h) * W;
      std::memcpy(qc, b + t * kvl, kvl * 4);
      std::memcpy(qc + kvl, q + (t * H + h) * kq + nope, pe * 4);
    }
  });
}

void CpuBackend::mla_attention(const CacheRows& latent, int64_t kvl, const BatchEntry* e, int64_t n, int64_t H,
                               const float* qcat, const int32_t* sel_idx, const int32_t* sel_n, int64_t sel_cap,
                               float scale, AttnPath path, float* z) {
  const int64_t W = latent.width;
  const int64_t hg = heads_per_item_, ngroups = (H + hg - 1) / hg;
  const bool dense = path == AttnPath::Dense;
  par(n * ngroups, (static_cast<int64_t>(e[n - 1].pos) + 1) * hg * W * 4, [&](int64_t item, int th) {
    const int64_t t = item / ngroups, h0 = (item % ngroups) * hg, nh = std::min(hg, H - h0);
    const int32_t seq = e[t].seq_id;
    const int64_t nvis = static_cast<int64_t>(e[t].pos) + 1;
    kern::LatentRows rows{latent.row(seq, 0), latent.f16, W, kvl};
    const float* qh = qcat + (t * H + h0) * W;
    float* zh = z + (t * H + h0) * kvl;
    float* rb = th_row_.data() + th * th_row_stride_;
    const int32_t ns = sel_n[t];
    const int32_t* idx = ns < 0 ? nullptr : sel_idx + t * sel_cap;
    if (!dense) {
      kern::mla_attend_sparse(qh, nh, rows, idx, ns < 0 ? nvis : ns, scale, zh, rb);
    } else {
      uint8_t* sel = nullptr;
      if (idx) {
        sel = th_sel_.data() + static_cast<size_t>(th) * static_cast<size_t>(lim_.n_ctx);
        std::memset(sel, 0, static_cast<size_t>(nvis));
        for (int32_t i = 0; i < ns; ++i) sel[idx[i]] = 1;
      }
      kern::mla_attend_dense(qh, nh, rows, nvis, sel, scale, zh, th_scores_.data() + th * th_scores_stride_, rb);
    }
  });
}

void CpuBackend::mla_value_heads(const kern::MatView& v_b, uint64_t slice_bytes, const float* z, int64_t n, int64_t H,
                                 float* o) {
  const int64_t kvl = v_b.cols, vd = v_b.rows;
  par(H, n * kvl * vd * 2, [&](int64_t h, int th) {
    const float* b = head_matmul(v_b, slice_bytes, h, th, z, kvl, H, n);  // [n][vd]
    for (int64_t t = 0; t < n; ++t) std::memcpy(o + t * H * vd + h * vd, b + t * vd, vd * 4);
  });
}

// ---- DSA indexer ----

void CpuBackend::indexer_scores(const CacheRows& keys, int32_t seq, const float* q, const float* w, int64_t HI,
                                int64_t nvis, float* scores) {
  const int64_t DI = keys.width;
  constexpr int64_t kChunk = 256;  // positions per work item
  const int64_t nch = (nvis + kChunk - 1) / kChunk;
  const uint8_t* k0 = keys.row(seq, 0);
  const size_t row_bytes = keys.row_bytes();
  const uint8_t* qp = keys.i8 ? prep_idx_queries(q, w, 1, HI, DI) : nullptr;
  const float* qf = keys.i8 ? nullptr : prep_idx_queries_f32(q, w, 1, HI, DI);
  par(nch, kChunk * HI * DI * (keys.i8 ? 1 : 2), [&](int64_t ch, int) {
    const int64_t s0 = ch * kChunk, s1 = std::min(nvis, s0 + kChunk);
    const uint8_t* kb = k0 + static_cast<size_t>(s0) * row_bytes;
    if (qp)
      kern::indexer_scores_i8(qp, HI, kb, DI, s1 - s0, scores + s0);
    else if (qf)
      kern::indexer_scores_prepared(qf, HI, kb, keys.f16, DI, s1 - s0, scores + s0);
    else
      kern::indexer_scores(q, w, HI, kb, keys.f16, DI, s1 - s0, scores + s0);
  });
}

// The n queries (q: [n][HI * DI], w: [n][HI]) in the int8 scan's form, one after another (the
// buffer grows on first use only).
const uint8_t* CpuBackend::prep_idx_queries(const float* q, const float* w, int64_t n, int64_t HI, int64_t DI) {
  const size_t b = kern::idx_query_i8_bytes(HI, DI);
  if (idx_q8_.size() < b * static_cast<size_t>(n)) idx_q8_.resize(b * static_cast<size_t>(n));
  for (int64_t j = 0; j < n; ++j) kern::prep_idx_query_i8(q + j * HI * DI, w + j * HI, HI, DI, idx_q8_.data() + j * b);
  return idx_q8_.data();
}

const float* CpuBackend::prep_idx_queries_f32(const float* q, const float* w, int64_t n, int64_t HI, int64_t DI) {
  const size_t b = kern::idx_query_f32_floats(HI, DI);
  if (idx_qf_.size() < b * static_cast<size_t>(n)) idx_qf_.resize(b * static_cast<size_t>(n));
  for (int64_t j = 0; j < n; ++j)
    if (!kern::prep_idx_query_f32(q + j * HI * DI, w + j * HI, HI, DI, idx_qf_.data() + j * b)) return nullptr;
  return idx_qf_.data();
}

void CpuBackend::indexer_topk(const float* scores, int64_t n, int64_t k, int32_t* sel, int32_t* sel_n, float* tmp) {
  *sel_n = static_cast<int32_t>(kern::topk_indices_threshold(scores, n, k, sel, tmp));
}

// A prefill chunk: up to kIdxGroup consecutive queries of one sequence are scored together, key
// block by key block (a block of 64 keys stays in L1 while every query of the group scores it, so
// each key is read from the cache once per group instead of once per query); then their top-k
// selections run in parallel. Each score is the same kern::indexer_scores arithmetic on the same
// key as in indexer_scores, so the selection is bit-identical to the query-by-query default.
void CpuBackend::indexer_select(const CacheRows& keys, const BatchEntry* e, int64_t n, const float* q, const float* w,
                                int64_t HI, int64_t k, int32_t* sel, int64_t sel_cap, int32_t* sel_n, float* scores,
                                float* tmp) {
  if (n == 1 || idx_scores_.empty()) return Backend::indexer_select(keys, e, n, q, w, HI, k, sel, sel_cap, sel_n, scores, tmp);
  const int64_t DI = keys.width, qw = HI * DI, nctx = lim_.n_ctx;
  const size_t row_bytes = keys.row_bytes();
  auto nvis = [&](int64_t t) { return static_cast<int64_t>(e[t].pos) + 1; };
  for (int64_t t = 0; t < n;) {
    if (nvis(t) <= k) {
      sel_n[t++] = -1;
      continue;
    }
    int64_t m = 1, nmax = nvis(t);
    while (t + m < n && m < kIdxGroup && e[t + m].seq_id == e[t].seq_id && nvis(t + m) > k) {
      nmax = std::max(nmax, nvis(t + m));
      ++m;
    }
    const uint8_t* k0 = keys.row(e[t].seq_id, 0);
    const uint8_t* qp = keys.i8 ? prep_idx_queries(q + t * qw, w + t * HI, m, HI, DI) : nullptr;
    const size_t qpb = kern::idx_query_i8_bytes(HI, DI);
    const float* qf = keys.i8 ? nullptr : prep_idx_queries_f32(q + t * qw, w + t * HI, m, HI, DI);
    const size_t qfb = kern::idx_query_f32_floats(HI, DI);
    constexpr int64_t kItem = 512, kBlk = 64;  // keys per work item / per L1 block
    par((nmax + kItem - 1) / kItem, kItem * m * HI * DI * 2, [&](int64_t item, int) {
      const int64_t i1 = std::min(nmax, (item + 1) * kItem);
      for (int64_t s0 = item * kItem; s0 < i1; s0 += kBlk) {
        const int64_t s1 = std::min(i1, s0 + kBlk);
        for (int64_t j = 0; j < m; ++j) {
          const int64_t nv = nvis(t + j);
          if (nv <= s0) continue;
          if (qp)
            kern::indexer_scores_i8(qp + j * qpb, HI, k0 + static_cast<size_t>(s0) * row_bytes, DI,
                                    std::min(s1, nv) - s0, idx_scores_.data() + j * nctx + s0);
          else if (qf)
            kern::indexer_scores_prepared(qf + j * qfb, HI, k0 + static_cast<size_t>(s0) * row_bytes, keys.f16, DI,
                                          std::min(s1, nv) - s0, idx_scores_.data() + j * nctx + s0);
          else
            kern::indexer_scores(q + (t + j) * qw, w + (t + j) * HI, HI, k0 + static_cast<size_t>(s0) * row_bytes,
                                 keys.f16, DI, std::min(s1, nv) - s0, idx_scores_.data() + j * nctx + s0);
        }
      }
    });
    par(m, nmax * 8, [&](int64_t j, int th) {
      sel_n[t + j] = static_cast<int32_t>(kern::topk_indices_threshold(idx_scores_.data() + j * nctx, nvis(t + j), k,
                                                                        sel + (t + j) * sel_cap,
                                                                        th_idx_tmp_.data() + th * nctx));
    });
    t += m;
  }
}

// ---- KDA ----

void CpuBackend::kda_conv_silu(const float* const w[3], int64_t K, int64_t C, const SeqStates& conv,
                               const BatchEntry* e, int64_t n, float* const x[3]) {
  // tokens in batch order (per-sequence state); parallel over channel blocks of the three streams
  const int64_t S = K - 1;
  constexpr int64_t kBlk = 64;
  const int64_t nblk = (C + kBlk - 1) / kBlk;
  const bool f = fast();
  par(3 * nblk, n * kBlk * K * 2, [&](int64_t item, int) {
    const int64_t which = item / nblk, c0 = (item % nblk) * kBlk, c1 = std::min<int64_t>(C, c0 + kBlk);
    float tmp[kBlk];
    for (int64_t t = 0; t < n; ++t) {
      float* st = conv.of(e[t].seq_id) + which * C * S + c0 * S;
      float* u = x[which] + t * C + c0;
      kern::conv_step(w[which] + c0 * K, K, st, u, tmp, c1 - c0);
      if (f)
        kern::silu_fast(tmp, u, c1 - c0);
      else
        for (int64_t j = 0; j < c1 - c0; ++j) u[j] = tmp[j] / (1.0f + std::exp(-tmp[j]));
    }
  });
}

void CpuBackend::kda_gate(float* gall, const float* dtb, const float* ssm_a, int64_t n, int64_t H, int64_t D,
                          const KdaGateParams& p) {
  const int64_t C = H * D;
  const bool f = fast();
  par(n, C * 16, [&](int64_t t, int) {
    float* g = gall + t * C;
    for (int64_t h = 0; h < H; ++h) {
      const float ea = -ssm_a[h];  // exp(A_log) > 0
      if (f && p.has_lower_bound) {
        float* gh = g + h * D;
        const float* bh = dtb + h * D;
        for (int64_t i = 0; i < D; ++i) gh[i] = ea * (gh[i] + bh[i]);
        kern::sigmoid_inplace_fast(gh, D);
        for (int64_t i = 0; i < D; ++i) gh[i] *= p.lower_bound;
        continue;
      }
      for (int64_t i = 0; i < D; ++i) {
        const float a = g[h * D + i] + dtb[h * D + i];
        if (p.has_lower_bound) {
          g[h * D + i] = p.lower_bound / (1.0f + std::exp(-ea * a));
        } else {
          const float sp = a > 20.0f ? a : std::log1p(std::exp(a));
          g[h * D + i] = -ea * sp;
        }
      }
    }
    if (f) kern::exp_fast(g, g, C);  // decay factors exp(g) for kda_step_decay
  });
}

void CpuBackend::kda_scan(const SeqStates& rec, const BatchEntry* e, int64_t n, int64_t H, int64_t D, const float* q,
                          const float* k, const float* v, const float* g, const float* beta, float scale, float* o) {
  const int64_t C = H * D;
  const bool f = fast();
  // Heads in parallel, tokens in batch order. A run of consecutive entries of one sequence (a
  // prefill chunk) goes through the chunked form, 16 tokens at a time (kern::kda_chunk); a
  // decode token, a short tail and a chunk whose decay leaves the chunk form's range step token
  // by token.
  const bool chunks = chunked_kda_ && !th_kda_.empty() && D <= th_row_stride_;
  par(H, n * D * D * 4, [&](int64_t h, int th) {
    float* tmp = th_row_.data() + th * th_row_stride_;  // D floats
    float* work = chunks ? th_kda_.data() + th * th_kda_stride_ : nullptr;
    for (int64_t t = 0; t < n;) {
      float* Sm = rec.of(e[t].seq_id) + h * D * D;
      int64_t m = 1;  // tokens of this chunk: same sequence, consecutive entries
      if (chunks)
        while (t + m < n && m < kern::kKdaChunk && e[t + m].seq_id == e[t].seq_id) ++m;
      const int64_t off = t * C + h * D;
      if (m >= kMinKdaChunk &&
          kern::kda_chunk(Sm, q + off, k + off, v + off, g + off, f, beta + t * H + h, C, H, m, scale, o + off, D, work)) {
        t += m;
        continue;
      }
      for (const int64_t t1 = t + m; t < t1; ++t) {
        const int64_t ot = t * C + h * D;
        if (f)
          kern::kda_step_decay(Sm, q + ot, k + ot, v + ot, g + ot, beta[t * H + h], scale, o + ot, D, tmp);
        else
          kern::kda_step(Sm, q + ot, k + ot, v + ot, g + ot, beta[t * H + h], scale, o + ot, D, tmp);
      }
    }
  });
}

// ---- MoE ----

void CpuBackend::moe_route(float* logits, const float* bias, int64_t n, const RouterParams& p, float* probs,
                           int32_t* sel_all, float* weights) {
  const int64_t E = p.n_expert, k = p.n_used;
  for (int64_t t = 0; t < n; ++t) {
    const float* lg = logits + t * E;
    float* pr = probs + t * E;
    if (!p.softmax) {
      for (int64_t i = 0; i < E; ++i) pr[i] = 1.0f / (1.0f + std::exp(-lg[i]));
    } else {
      float mx = lg[0];
      for (int64_t i = 1; i < E; ++i) mx = std::max(mx, lg[i]);
      float s = 0;
      for (int64_t i = 0; i < E; ++i) s += (pr[i] = std::exp(lg[i] - mx));
      for (int64_t i = 0; i < E; ++i) pr[i] /= s;
    }
    float* choice = logits + t * E;  // reuse: selection scores (probabilities + bias)
    for (int64_t i = 0; i < E; ++i) choice[i] = pr[i] + (bias ? bias[i] : 0.0f);
    int32_t* sel = sel_all + t * k;
    kern::topk_ranked(choice, E, k, sel, route_scratch_.data());
    float* w = weights + t * k;
    float sum = 0;
    for (int64_t j = 0; j < k; ++j) sum += (w[j] = pr[sel[j]]);
    if (p.renormalize) {
      const float inv = 1.0f / std::max(sum, 6.1035e-5f);
      for (int64_t j = 0; j < k; ++j) w[j] *= inv;
    }
    if (p.scale != 1.0f)
      for (int64_t j = 0; j < k; ++j) w[j] *= p.scale;
  }
}

void CpuBackend::axpy(float* y, float a, const float* x, int64_t count) { kern::axpy_f32(a, x, y, count); }

void CpuBackend::moe_experts(const ExpertMats& m, const float* xl, int64_t n, int64_t Lw, const int32_t* rsel,
                             const float* rw, int64_t k, int64_t E, float beta, float lambda, float* acc) {
  const int64_t F = m.gate.rows;
  // group the routed slots by expert (expert-major, tokens in batch order)
  int32_t* cnt_ = ex_count_.data();
  int32_t* off = ex_off_.data();
  std::fill(cnt_, cnt_ + E, 0);
  for (int64_t t = 0; t < n * k; ++t)
    if (rsel[t] >= 0) ++cnt_[rsel[t]];  // < 0: an expert of another rank (skipped)
  off[0] = 0;
  for (int64_t i = 0; i < E; ++i) off[i + 1] = off[i] + cnt_[i];
  std::fill(cnt_, cnt_ + E, 0);
  for (int64_t t = 0; t < n; ++t)
    for (int64_t j = 0; j < k; ++j) {
      const int32_t ex = rsel[t * k + j];
      if (ex < 0) continue;
      const int32_t slot = off[ex] + cnt_[ex]++;
      ex_tok_[static_cast<size_t>(slot)] = static_cast<int32_t>(t);
      ex_wt_[static_cast<size_t>(slot)] = rw[t * k + j];
    }
  std::fill(acc, acc + n * Lw, 0.0f);
  const int64_t slots = off[E];  // n * k unless some slots are skipped
  if (slots == 0) return;
  float* xin = ex_in_.data();
  float* eg = ex_gate_.data();
  float* eu = ex_up_.data();
  float* er = ex_out_.data();
  if (slots <= lim_.n_tokens) {
    // all routed slots fit the gather buffers (decode, small batches): every active expert's
    // gate/up rows in ONE parallel job, SiTU, every expert's down rows in one more job
    for (int64_t slot = 0; slot < slots; ++slot)
      std::memcpy(xin + slot * Lw, xl + static_cast<int64_t>(ex_tok_[static_cast<size_t>(slot)]) * Lw,
                  static_cast<size_t>(Lw) * 4);
    int32_t* act = ex_active_.data();
    int64_t na = 0;
    for (int64_t ex = 0; ex < E; ++ex)
      if (off[ex + 1] > off[ex]) act[na++] = static_cast<int32_t>(ex);
    const int64_t want = 4 * static_cast<int64_t>(n_threads_);
    auto chunks = [&](int64_t rows, int64_t per_expert_items) {  // row chunks (multiples of 16)
      int64_t nch = std::max<int64_t>(1, (want + na * per_expert_items - 1) / (na * per_expert_items));
      int64_t rc = (rows + nch - 1) / nch;
      rc = (rc + 15) / 16 * 16;
      return rc;
    };
    const int64_t rcF = chunks(F, 2), nchF = (F + rcF - 1) / rcF;
    par(na * 2 * nchF, Lw * rcF * (slots / na + 1) * 2, [&](int64_t item, int) {
      const int64_t ex = act[item / (2 * nchF)], which = (item / nchF) % 2, ch = item % nchF;
      const int64_t o = off[ex], cnt = off[ex + 1] - o;
      const int64_t r0 = ch * rcF, r1 = std::min(F, r0 + rcF);
      const kern::MatView w = expert_mat(m, static_cast<int>(which), ex);
      float* dst = (which == 0 ? eg : eu) + o * F;
      kern::matmul_rows(w, xin + o * Lw, cnt, dst, r0, r1, prec_);
    });
    CpuBackend::situ_rows(eg, eu, slots, F, beta, lambda);  // internal scratch: not a virtual op
    const int64_t rcL = chunks(Lw, 1), nchL = (Lw + rcL - 1) / rcL;
    par(na * nchL, F * rcL * (slots / na + 1) * 2, [&](int64_t item, int) {
      const int64_t ex = act[item / nchL], ch = item % nchL;
      const int64_t o = off[ex], cnt = off[ex + 1] - o;
      const int64_t r0 = ch * rcL, r1 = std::min(Lw, r0 + rcL);
      kern::matmul_rows(expert_mat(m, 2, ex), eg + o * F, cnt, er + o * Lw, r0, r1, prec_);
    });
    for (int64_t i = 0; i < na; ++i) {
      const int64_t ex = act[i];
      for (int64_t slot = off[ex]; slot < off[ex + 1]; ++slot)
        kern::axpy_f32(ex_wt_[static_cast<size_t>(slot)], er + slot * Lw,
                       acc + static_cast<int64_t>(ex_tok_[static_cast<size_t>(slot)]) * Lw, Lw);
    }
  } else {
    for (int64_t ex = 0; ex < E; ++ex) {
      const int64_t cnt = off[ex + 1] - off[ex];
      if (cnt == 0) continue;
      const int32_t* toks = ex_tok_.data() + off[ex];
      const float* wts = ex_wt_.data() + off[ex];
      for (int64_t i = 0; i < cnt; ++i) std::memcpy(xin + i * Lw, xl + toks[i] * Lw, Lw * 4);
      kern::matmul(expert_mat(m, 0, ex), xin, cnt, eg, pool_, prec_);
      kern::matmul(expert_mat(m, 1, ex), xin, cnt, eu, pool_, prec_);
      CpuBackend::situ_rows(eg, eu, cnt, F, beta, lambda);
      kern::matmul(expert_mat(m, 2, ex), eg, cnt, er, pool_, prec_);
      for (int64_t i = 0; i < cnt; ++i) kern::axpy_f32(wts[i], er + i * Lw, acc + toks[i] * Lw, Lw);
    }
  }
}

// ---- vision tower (docs/spec/vision.md §3) ----

void CpuBackend::gelu(float* x, int64_t count, bool tanh_approx) {
  constexpr int64_t kChunk = 4096;
  const int64_t nch = (count + kChunk - 1) / kChunk;
  par(nch, kChunk * 16, [&](int64_t c, int) {
    float* p = x + c * kChunk;
    const int64_t m = std::min(kChunk, count - c * kChunk);
    if (tanh_approx) {
      const float k = 0.7978845608028654f;  // sqrt(2/pi)
      for (int64_t i = 0; i < m; ++i) {
        const float v = p[i];
        p[i] = 0.5f * v * (1.0f + std::tanh(k * (v + 0.044715f * v * v * v)));
      }
    } else {
      for (int64_t i = 0; i < m; ++i) p[i] = 0.5f * p[i] * (1.0f + std::erf(p[i] * 0.7071067811865476f));
    }
  });
}

void CpuBackend::rope_2d(float* x, int64_t ld, int64_t n, int64_t heads, int64_t D, const int32_t* row,
                         const int32_t* col, float theta) {
  check(D % 4 == 0 && D <= 1024, "rope_2d: head_dim {} (a multiple of 4, at most 1024)", D);
  par(n, heads * D * 8, [&](int64_t t, int) {
    float cs[512], sn[512];  // per pair m < D/2: the rotation of pair m
    for (int64_t j = 0; j < D / 4; ++j) {
      const double w = std::pow(static_cast<double>(theta), -4.0 * static_cast<double>(j) / static_cast<double>(D));
      const float ax = static_cast<float>(static_cast<double>(col[t]) * w);
      const float ay = static_cast<float>(static_cast<double>(row[t]) * w);
      cs[2 * j] = std::cos(ax), sn[2 * j] = std::sin(ax);
      cs[2 * j + 1] = std::cos(ay), sn[2 * j + 1] = std::sin(ay);
    }
    for (int64_t h = 0; h < heads; ++h) {
      float* v = x + t * ld + h * D;
      for (int64_t m = 0; m < D / 2; ++m) {
        const float a = v[2 * m], b = v[2 * m + 1];
        v[2 * m] = a * cs[m] - b * sn[m];
        v[2 * m + 1] = a * sn[m] + b * cs[m];
      }
    }
  });
}

void CpuBackend::segment_attention(const float* qkv, int64_t ld, int64_t n, int64_t H, int64_t D, const int64_t* seg,
                                   int64_t n_seg, float scale, float* out) {
  check(D <= 512, "segment_attention: head_dim {} (at most 512)", D);
  check(n_seg >= 1 && seg[0] == 0 && seg[n_seg] == n, "segment_attention: segments do not cover the {} rows", n);
  const int64_t Q = H * D;
  // A work item is a block of kRows consecutive query rows and one head: every key and value row
  // is read once per block instead of once per query (the rows of a big image do not fit in the
  // cache). Each query keeps its own online softmax over its segment's keys in key order, so the
  // result does not depend on the blocking.
  constexpr int64_t kRows = 16;
  const int64_t n_blocks = (n + kRows - 1) / kRows;
  par(n_blocks * H, kRows * (n / n_seg + 1) * D * 4, [&](int64_t item, int) {
    const int64_t blk = item / H, h = item % H;
    const int64_t r0 = blk * kRows, r1 = std::min(n, r0 + kRows);
    float acc[kRows][512];
    float mx[kRows], sum[kRows], sc[kRows];
    for (int64_t a = r0; a < r1;) {  // runs of rows in the same segment
      const int64_t si = std::upper_bound(seg, seg + n_seg + 1, a) - seg - 1;
      const int64_t s0 = seg[si], s1 = seg[si + 1];
      const int64_t b = std::min(r1, s1), m = b - a;
      for (int64_t i = 0; i < m; ++i) {
        std::fill(acc[i], acc[i] + D, 0.0f);
        mx[i] = -INFINITY;
        sum[i] = 0.0f;
      }
      for (int64_t s = s0; s < s1; ++s) {
        const float* k = qkv + s * ld + Q + h * D;
        const float* v = qkv + s * ld + 2 * Q + h * D;
        for (int64_t i = 0; i < m; ++i) sc[i] = scale * kern::dot_f32(qkv + (a + i) * ld + h * D, k, D);
        for (int64_t i = 0; i < m; ++i) {
          if (sc[i] > mx[i]) {
            const float r = std::exp(mx[i] - sc[i]);  // exp(-inf) = 0 on the first key
            for (int64_t j = 0; j < D; ++j) acc[i][j] *= r;
            sum[i] *= r;
            mx[i] = sc[i];
          }
          const float p = std::exp(sc[i] - mx[i]);
          sum[i] += p;
          kern::axpy_f32(p, v, acc[i], D);
        }
      }
      for (int64_t i = 0; i < m; ++i) {
        float* o = out + (a + i) * Q + h * D;
        const float inv = 1.0f / sum[i];
        for (int64_t j = 0; j < D; ++j) o[j] = acc[i][j] * inv;
      }
      a = b;
    }
  });
}

}  // namespace kimi
