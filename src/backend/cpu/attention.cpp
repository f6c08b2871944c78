#include "backend/cpu/attention.h"

#include <cmath>
#include <cstring>
#include <vector>

#include "backend/key_quant.h"
#include "util/error.h"
#include "util/per_thread.h"

#include "backend/cpu/dispatch.h"
#include "backend/cpu/ops.h"
#include "backend/cpu/ops_simd.h"

namespace kimi::kern {

static inline const SimdOps* simd() { return simd_ops(KernelFamily::Attention); }

size_t idx_query_f32_floats(int64_t H, int64_t D) {
  const int64_t G = (H + 15) / 16;
  return static_cast<size_t>(G * D * 16 + G * 16);
}

bool prep_idx_query_f32(const float* q, const float* w, int64_t H, int64_t D, float* out) {
  const SimdOps* s = simd();
  if (!s || !s->indexer_scores_prepared || H > 64 || D % 16 != 0 || D > 256) return false;
  const int64_t G = (H + 15) / 16;
  for (int64_t g = 0; g < G; ++g)
    for (int64_t d = 0; d < D; ++d)
      for (int64_t lane = 0; lane < 16; ++lane) {
        const int64_t h = 16 * g + lane;
        out[(g * D + d) * 16 + lane] = h < H ? q[h * D + d] : 0.0f;
      }
  for (int64_t h = 0; h < G * 16; ++h) out[G * D * 16 + h] = h < H ? w[h] : 0.0f;
  return true;
}

void indexer_scores_prepared(const float* qp, int64_t H, const void* keys, bool f16, int64_t D, int64_t n,
                             float* scores) {
  simd()->indexer_scores_prepared(qp, H, keys, f16, D, n, scores);
}

void indexer_scores(const float* q, const float* w, int64_t H, const void* keys, bool f16, int64_t D, int64_t n,
                    float* scores) {
  {
    auto& t_qp = per_thread<std::vector<float>, struct IndexerQuery>();  // grows once
    if (t_qp.size() < idx_query_f32_floats(H, D)) t_qp.resize(idx_query_f32_floats(H, D));
    if (prep_idx_query_f32(q, w, H, D, t_qp.data())) return indexer_scores_prepared(t_qp.data(), H, keys, f16, D, n, scores);
  }
  if (const SimdOps* s = simd(); s && D % 16 == 0 && D <= 256 && H <= 256)
    return s->indexer_scores(q, w, H, keys, f16, D, n, scores);
  for (int64_t s = 0; s < n; ++s) {
    float acc = 0.0f;
    for (int64_t h = 0; h < H; ++h) {
      const float dq = f16 ? dot_f16(q + h * D, static_cast<const uint16_t*>(keys) + s * D, D)
                           : dot_f32(q + h * D, static_cast<const float*>(keys) + s * D, D);
      if (dq > 0.0f) acc += w[h] * dq;
    }
    scores[s] = acc;
  }
}

size_t idx_query_i8_bytes(int64_t H, int64_t D) {
  const int64_t G = (H + 15) / 16;
  return static_cast<size_t>(D / 4 * G * 64 + G * 16 * 4);
}

void prep_idx_query_i8(const float* q, const float* w, int64_t H, int64_t D, uint8_t* out) {
  const int64_t G = (H + 15) / 16, D4 = D / 4;
  std::memset(out, 128, static_cast<size_t>(D4 * G * 64));  // padded heads: q = 0
  float* wq = reinterpret_cast<float*>(out + D4 * G * 64);
  check(D <= 1024, "indexer: key width {} above the int8 scan's 1024", D);
  int8_t qq[1024];  // one head's quantized query (no allocation per decoded token)
  for (int64_t h = 0; h < G * 16; ++h) {
    if (h >= H) {
      wq[h] = 0.0f;
      continue;
    }
    int32_t sum = 0;
    const float qs = quantize_i8_row(q + h * D, D, qq, &sum);
    wq[h] = w[h] * qs;
    const int64_t g = h / 16, lane = h % 16;
    for (int64_t i = 0; i < D; ++i)
      out[((i / 4) * G + g) * 64 + 4 * lane + i % 4] = static_cast<uint8_t>(qq[i] + 128);
  }
}

void indexer_scores_i8(const uint8_t* qp, int64_t H, const uint8_t* keys, int64_t D, int64_t n, float* scores) {
  if (const SimdOps* s = simd(); s && s->indexer_scores_i8 && H <= 64 && D % 4 == 0)
    return s->indexer_scores_i8(qp, H, keys, D, n, scores);
  const int64_t G = (H + 15) / 16, D4 = D / 4;
  const float* wq = reinterpret_cast<const float*>(qp + D4 * G * 64);
  for (int64_t s = 0; s < n; ++s) {
    const uint8_t* k = keys + s * (D + 8);
    float ks;
    std::memcpy(&ks, k + D, 4);
    float acc = 0.0f;
    for (int64_t h = 0; h < H; ++h) {
      int32_t dq = 0;
      for (int64_t i = 0; i < D; ++i)
        dq += (static_cast<int32_t>(qp[((i / 4) * G + h / 16) * 64 + 4 * (h % 16) + i % 4]) - 128) *
              static_cast<int8_t>(k[i]);
      if (dq > 0) acc += wq[h] * static_cast<float>(dq);
    }
    scores[s] = acc * ks;
  }
}

// z[h][0..r) += sum_j p[h * p_stride + j] * rows[j][0..r)   for h < nh, j < nb (j in order)
static void attn_accumulate(float* z, int64_t nh, int64_t r, const float* const* rows, int64_t nb, const float* p,
                            int64_t p_stride) {
  if (const SimdOps* s = simd(); s && r % 16 == 0) return s->attn_accumulate(z, nh, r, rows, nb, p, p_stride);
  for (int64_t h = 0; h < nh; ++h)
    for (int64_t j = 0; j < nb; ++j) axpy_f32(p[h * p_stride + j], rows[j], z + h * r, r);
}

static inline const float* row_f32(const LatentRows& rows, int64_t s, float* buf) {
  if (rows.f16) {
    f16_to_f32_row(static_cast<const uint16_t*>(rows.data) + s * rows.W, buf, rows.W);
    return buf;
  }
  return static_cast<const float*>(rows.data) + s * rows.W;
}

void mla_attend_sparse(const float* q, int64_t nh, const LatentRows& rows, const int32_t* idx, int64_t n_sel,
                       float scale, float* z, float* row_buf) {
  const int64_t W = rows.W, r = rows.r;
  // Blocks of kBlk rows: the rows are converted once into a block buffer, every head scores the
  // block, the running max/denominator are updated once per block, then the block's weighted rows
  // are added into z (AVX-512: z kept in registers across the block's rows).
  constexpr int64_t kBlk = 16, kMaxW = 1024, kMaxHeads = 16;
  alignas(64) float buf[kBlk * kMaxW];
  if (W > kMaxW) {  // very wide rows: one row at a time through row_buf
    for (int64_t h0 = 0; h0 < nh; ++h0) {
      float m = -INFINITY, l = 0.0f;
      float* zh = z + h0 * r;
      for (int64_t j = 0; j < r; ++j) zh[j] = 0.0f;
      for (int64_t t = 0; t < n_sel; ++t) {
        const float* row = row_f32(rows, idx ? idx[t] : t, row_buf);
        const float e = dot_f32(q + h0 * W, row, W) * scale;
        if (e > m) {
          const float c = std::exp(m - e);
          if (l != 0.0f) scale_f32(c, zh, r);
          l *= c;
          m = e;
        }
        const float p = std::exp(e - m);
        l += p;
        axpy_f32(p, row, zh, r);
      }
      scale_f32(l > 0.0f ? 1.0f / l : 0.0f, zh, r);
    }
    return;
  }
  float m[kMaxHeads], l[kMaxHeads], p[kMaxHeads * kBlk];
  const SimdOps* so = simd();
  const bool simd_scores = so != nullptr && W % 16 == 0;
  const float* rp[kBlk];
  for (int64_t h0 = 0; h0 < nh; h0 += kMaxHeads) {
    const int64_t nhc = nh - h0 < kMaxHeads ? nh - h0 : kMaxHeads;
    float* zg = z + h0 * r;
    for (int64_t h = 0; h < nhc; ++h) {
      m[h] = -INFINITY;
      l[h] = 0.0f;
    }
    for (int64_t j = 0; j < nhc * r; ++j) zg[j] = 0.0f;
    for (int64_t b0 = 0; b0 < n_sel; b0 += kBlk) {
      const int64_t nb = n_sel - b0 < kBlk ? n_sel - b0 : kBlk;
      if (idx) {  // gathered rows: fetch the next block's rows while this one is processed
        const int64_t e = b0 + 2 * kBlk < n_sel ? b0 + 2 * kBlk : n_sel;
        const int64_t rb = W * (rows.f16 ? 2 : 4);
        for (int64_t j = b0 + kBlk; j < e; ++j) {
          const char* base = static_cast<const char*>(rows.data) + idx[j] * rb;
          for (int64_t o = 0; o < rb; o += 64) __builtin_prefetch(base + o);
        }
      }
      for (int64_t j = 0; j < nb; ++j) rp[j] = row_f32(rows, idx ? idx[b0 + j] : b0 + j, buf + j * W);
      for (int64_t h = 0; h < nhc; ++h) {
        float* ph = p + h * kBlk;
        if (simd_scores) {
          so->block_scores(q + (h0 + h) * W, rp, nb, W, ph);
        } else {
          for (int64_t j = 0; j < nb; ++j) ph[j] = dot_f32(q + (h0 + h) * W, rp[j], W);
        }
        float bm = -INFINITY;
        for (int64_t j = 0; j < nb; ++j) {
          ph[j] *= scale;
          bm = ph[j] > bm ? ph[j] : bm;
        }
        if (bm > m[h]) {
          const float c = std::exp(m[h] - bm);  // exp(-inf) = 0 on the first block
          if (l[h] != 0.0f) scale_f32(c, zg + h * r, r);
          l[h] *= c;
          m[h] = bm;
        }
        float sum = 0.0f;
        for (int64_t j = 0; j < nb; ++j) sum += (ph[j] = std::exp(ph[j] - m[h]));
        l[h] += sum;
      }
      attn_accumulate(zg, nhc, r, rp, nb, p, kBlk);
    }
    for (int64_t h = 0; h < nhc; ++h) scale_f32(l[h] > 0.0f ? 1.0f / l[h] : 0.0f, zg + h * r, r);
  }
}

void mla_attend_dense(const float* q, int64_t nh, const LatentRows& rows, int64_t n, const uint8_t* sel,
                      float scale, float* z, float* scores, float* row_buf) {
  const int64_t W = rows.W, r = rows.r;
  // pass 1: scores for every row (-inf where not selected)
  for (int64_t s = 0; s < n; ++s) {
    if (sel && !sel[s]) {
      for (int64_t h = 0; h < nh; ++h) scores[h * n + s] = -INFINITY;
      continue;
    }
    const float* row = row_f32(rows, s, row_buf);
    for (int64_t h = 0; h < nh; ++h) scores[h * n + s] = dot_f32(q + h * W, row, W) * scale;
  }
  // softmax per head
  for (int64_t h = 0; h < nh; ++h) {
    float* sc = scores + h * n;
    float mx = -INFINITY;
    for (int64_t s = 0; s < n; ++s) mx = sc[s] > mx ? sc[s] : mx;
    float sum = 0.0f;
    for (int64_t s = 0; s < n; ++s) {
      const float p = sc[s] == -INFINITY ? 0.0f : std::exp(sc[s] - mx);
      sc[s] = p;
      sum += p;
    }
    const float inv = sum > 0.0f ? 1.0f / sum : 0.0f;
    for (int64_t s = 0; s < n; ++s) sc[s] *= inv;
    float* zh = z + h * r;
    for (int64_t j = 0; j < r; ++j) zh[j] = 0.0f;
  }
  // pass 2: weighted sum of the latent part over all rows (zero weights contribute nothing)
  for (int64_t s = 0; s < n; ++s) {
    if (sel && !sel[s]) continue;
    const float* row = row_f32(rows, s, row_buf);
    for (int64_t h = 0; h < nh; ++h) {
      const float p = scores[h * n + s];
      if (p != 0.0f) axpy_f32(p, row, z + h * r, r);
    }
  }
}

}  // namespace kimi::kern
