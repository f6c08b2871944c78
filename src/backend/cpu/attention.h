// MLA (absorbed, NoPE) attention of one query token over cached latent rows, for a group of heads.
// A cache row is [latent (r values) | pe]; width W = r + pe. The query of head h is the W-vector
// [W_kb,h^T q_nope,h | q_pe,h]; score = q.row * scale; the read-out is the softmax-weighted sum of
// the first r values of the rows (the latent), to be multiplied by W_vb,h afterwards.
#pragma once
#include <cstddef>
#include <cstdint>

namespace kimi::kern {

struct LatentRows {
  const void* data = nullptr;  // row s at data + s * W elements
  bool f16 = true;             // element type: IEEE half or f32
  int64_t W = 0;               // row width (r + pe)
  int64_t r = 0;               // latent (value) width
};

// Sparse path: visits only rows idx[0..n_sel) (ascending; idx == nullptr means rows 0..n_sel-1),
// online softmax. q: nh x W, z: nh x r. row_buf: W floats scratch.
void mla_attend_sparse(const float* q, int64_t nh, const LatentRows& rows, const int32_t* idx, int64_t n_sel,
                       float scale, float* z, float* row_buf);

// Dense path: softmax over all rows 0..n-1 with -inf for rows whose sel[s] == 0 (sel == nullptr:
// every row selected). scores: nh * n floats scratch, row_buf: W floats scratch.
void mla_attend_dense(const float* q, int64_t nh, const LatentRows& rows, int64_t n, const uint8_t* sel,
                      float scale, float* z, float* scores, float* row_buf);

// DSA indexer scores of one query against n keys (spec/README.md decision 3):
//   scores[s] = sum_h w[h] * max(0, q_h . k_s),  s < n.
// q: H x D f32 (head-major), w: H weights, keys: n contiguous rows of D values (IEEE half when
// f16, else f32). AVX-512 path (D % 16 == 0, D <= 256, H <= 256): keys outer, 16 query heads per
// pass with the head dots reduced together (a 16x16 transpose-add); else portable.
void indexer_scores(const float* q, const float* w, int64_t H, const void* keys, bool f16, int64_t D, int64_t n,
                    float* scores);

// The same scores from a query prepared once (decode: once per token; prefill: once per query, not per
// key block). prep_idx_query_f32 returns false where the prepared scan does not exist (a level without it,
// H > 64, D % 16 != 0, D > 256): then call indexer_scores. Otherwise out (idx_query_f32_floats(H, D) floats)
// holds the G = ceil(H / 16) head groups transposed (dimension d of group g = 16 floats,
// the heads' q[d], zero past H), then the G x 16 head weights; indexer_scores_prepared scans with heads in
// the lanes of a vector (no horizontal sums; each head's dot summed in order in runs of 32 dimensions).
// indexer_scores uses the same scan wherever it exists, so both give the same bits.
size_t idx_query_f32_floats(int64_t H, int64_t D);
bool prep_idx_query_f32(const float* q, const float* w, int64_t H, int64_t D, float* out);
void indexer_scores_prepared(const float* qp, int64_t H, const void* keys, bool f16, int64_t D, int64_t n,
                             float* scores);

// The same with int8 keys and queries (--indexer-int8). Keys: n rows of D + 8 bytes (backend/
// key_quant.h: int8 q[D] | f32 scale | int32 sum(q)). The query is prepared once (prep_idx_query_i8,
// idx_query_i8_bytes(H, D) bytes): each head quantized to int8 with scale max|q_h| / 127 (the key
// rule), stored + 128 as u8 with 16 heads in the lanes of a vector (dword d of vector (d, g) = bytes
// 4d..4d+3 of head 16g + lane), then H' = H rounded up to 16 floats w_h * qscale_h (0 past H). Then
//   scores[s] = kscale_s * sum_h (w_h qscale_h) * max(0, sum_i qq_h[i] kq_s[i])
// with an exact integer dot product (VNNI vpdpbusd of the u8 query against the broadcast key dword,
// minus 128 * sum(kq_s)). D % 4 == 0.
size_t idx_query_i8_bytes(int64_t H, int64_t D);
void prep_idx_query_i8(const float* q, const float* w, int64_t H, int64_t D, uint8_t* out);
void indexer_scores_i8(const uint8_t* qp, int64_t H, const uint8_t* keys, int64_t D, int64_t n, float* scores);

}  // namespace kimi::kern
