// Q2_K, Q3_K and IQ4_XS (formats-quant.md §4.4, §4.6): reference dequantizers (every value is
// an exact product of the block's integers and f16 scales, so the decode is exact) and
// importance-weighted quantizers. The searches are our own: per group a set of candidate scales,
// the levels for each, the weighted least-squares scale for those levels, keep the lowest
// weighted error; then the group scales are quantized to the super-block's integer scales and
// the levels recomputed with the scales as stored. Weights per element: the imatrix column
// importance qw[i] (imatrix_element_weights); without one sqrt(sigma2 + x_i^2), sigma2 = 2 *
// mean(x^2) of the super-block.
#include <algorithm>
#include <cmath>
#include <cstring>

#include "tensor/quants.h"
#include "util/error.h"

namespace kimi {

const int8_t kvalues_iq4nl[16] = {-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113};

namespace {

// round to nearest, ties to even, for |x| < 2^22 (the float-add trick: no libm call, no FP env)
inline int rne(float x) {
  const float v = x + 12582912.0f;
  int32_t i;
  std::memcpy(&i, &v, 4);
  return (i & 0x007fffff) - 0x00400000;
}

void check_k(int64_t n, const char* what) {
  check(n >= 0 && n % QK_K == 0, "{}: row of {} elements is not a multiple of the block size {}", what, n, QK_K);
}

}  // namespace

bool imatrix_element_weights(const float* qw, int n, float* w) {
  if (!qw) return false;
  double sum = 0;
  for (int i = 0; i < n; ++i) sum += std::max(qw[i], 0.0f);
  if (!(sum > 0) || !std::isfinite(sum)) return false;
  const float floor = static_cast<float>(1e-4 * sum / n);
  for (int i = 0; i < n; ++i) w[i] = std::max(qw[i], 0.0f) + floor;
  return true;
}

namespace {

// Element weights of one super-block: the importances (imatrix_element_weights), else the
// magnitude heuristic sqrt(sigma2 + x^2), sigma2 = 2 * mean(x^2) of the super-block.
void block_weights(const float* x, const float* qw, float* w) {
  if (imatrix_element_weights(qw, QK_K, w)) return;
  double s2 = 0;
  for (int i = 0; i < QK_K; ++i) s2 += static_cast<double>(x[i]) * x[i];
  const float sigma2 = static_cast<float>(2.0 * s2 / QK_K);
  for (int i = 0; i < QK_K; ++i) w[i] = std::sqrt(sigma2 + x[i] * x[i]);
}

// x ~ s * L + m with L in [0, nmax], m <= 0 (returned as *mneg = -m >= 0), weighted.
// Candidate inverse scales around nmax / (max - min); for each the levels and then the weighted
// least-squares (s, m) for those levels (m clamped to <= 0).
float fit_affine(int n, int nmax, const float* x, const float* w, uint8_t* L, float* mneg) {
  float mn = x[0], mx = x[0];
  for (int i = 1; i < n; ++i) {
    mn = std::min(mn, x[i]);
    mx = std::max(mx, x[i]);
  }
  if (mn > 0) mn = 0;
  if (mx <= mn) {
    std::fill(L, L + n, 0);
    *mneg = -mn;
    return 0.0f;
  }
  double sw = 0, sx = 0;
  for (int i = 0; i < n; ++i) {
    sw += w[i];
    sx += w[i] * x[i];
  }
  float best_s = (mx - mn) / nmax, best_m = mn, best_err = INFINITY;
  uint8_t La[32];
  for (int is = -10; is <= 10; ++is) {
    const float iscale = (nmax + 0.1f * is) / (mx - mn);
    if (iscale <= 0) continue;
    double sl = 0, sl2 = 0, sxl = 0;
    for (int i = 0; i < n; ++i) {
      const int l = std::clamp(rne(iscale * (x[i] - mn)), 0, nmax);
      La[i] = static_cast<uint8_t>(l);
      sl += w[i] * l;
      sl2 += w[i] * l * l;
      sxl += w[i] * l * x[i];
    }
    const double D = sw * sl2 - sl * sl;
    float s, m;
    if (D > 0) {
      s = static_cast<float>((sw * sxl - sx * sl) / D);
      m = static_cast<float>((sl2 * sx - sl * sxl) / D);
      if (m > 0) {
        m = 0;
        s = sl2 > 0 ? static_cast<float>(sxl / sl2) : 0.0f;
      }
    } else {
      s = 1.0f / iscale;
      m = mn;
    }
    if (s < 0) continue;
    double err = 0;
    for (int i = 0; i < n; ++i) {
      const double d = s * La[i] + m - x[i];
      err += w[i] * d * d;
    }
    if (err < best_err) {
      best_err = static_cast<float>(err);
      best_s = s;
      best_m = m;
      std::memcpy(L, La, static_cast<size_t>(n));
    }
  }
  *mneg = -best_m;
  return best_s;
}

// Signed fit x ~ s * L, L in [lo, hi] (integers), weighted; the scale may be negative (so an
// asymmetric range serves both signs). Returns s (0 for an all-zero group).
float fit_signed(int n, int lo, int hi, const float* x, const float* w) {
  float amax = 0, vmax = 0;
  for (int i = 0; i < n; ++i)
    if (std::fabs(x[i]) > amax) {
      amax = std::fabs(x[i]);
      vmax = x[i];
    }
  if (amax < 1e-30f) return 0.0f;
  float best_s = 0;
  double best = -1;  // maximise (sum w x L)^2 / sum w L^2
  for (int sgn = -1; sgn <= 1; sgn += 2) {
    const int lim = sgn < 0 ? lo : hi;  // the level the max element maps to
    for (int is = -8; is <= 8; ++is) {
      const float target = static_cast<float>(lim) + 0.1f * is * (lim < 0 ? -1.0f : 1.0f);
      if (target == 0.0f) continue;
      const float iscale = target / vmax;
      double sxl = 0, sl2 = 0;
      for (int i = 0; i < n; ++i) {
        const int l = std::clamp(rne(iscale * x[i]), lo, hi);
        sxl += w[i] * x[i] * l;
        sl2 += w[i] * l * l;
      }
      if (sl2 <= 0) continue;
      const double score = sxl * sxl / sl2;
      if (score > best) {
        best = score;
        best_s = static_cast<float>(sxl / sl2);
      }
    }
  }
  return best_s;
}

// Nearest IQ4_NL level index to v (levels ascending; ties to the lower level). A table over the
// unit intervals [u - 128, u - 127) gives the nearest level of the interval's lower end; within one
// interval the answer can only move one level up.
struct Iq4Lut {
  uint8_t lo[256];
  Iq4Lut() {
    for (int u = 0; u < 256; ++u) {
      const float v = static_cast<float>(u - 128);
      int best = 0;
      for (int k = 1; k < 16; ++k)
        if (std::fabs(v - kvalues_iq4nl[k]) < std::fabs(v - kvalues_iq4nl[best])) best = k;
      lo[u] = static_cast<uint8_t>(best);
    }
  }
};
const Iq4Lut kIq4Lut;
inline int nearest_iq4(float v) {
  if (!(v > -127.0f)) return 0;  // also NaN
  if (v >= 113.0f) return 15;
  const int u = static_cast<int>(std::floor(v)) + 128;
  const int i = kIq4Lut.lo[u];
  return (i < 15 && kvalues_iq4nl[i + 1] - v < v - kvalues_iq4nl[i]) ? i + 1 : i;
}

// Weighted fit x ~ s * T[k] over the 16 IQ4 levels for one group; returns s.
float fit_iq4(int n, const float* x, const float* w) {
  float amax = 0, vmax = 0;
  for (int i = 0; i < n; ++i)
    if (std::fabs(x[i]) > amax) {
      amax = std::fabs(x[i]);
      vmax = x[i];
    }
  if (amax < 1e-30f) return 0.0f;
  float best_s = 0;
  double best = -1;
  for (int end = 0; end < 2; ++end) {  // max element on the -127 end or the +113 end
    const float lim = end == 0 ? -127.0f : 113.0f;
    for (int is = -5; is <= 5; ++is) {
      const float s0 = vmax / (lim + (lim < 0 ? -1.0f : 1.0f) * 6.0f * is);
      const float is0 = 1.0f / s0;
      double sxl = 0, sl2 = 0;
      for (int i = 0; i < n; ++i) {
        const int l = kvalues_iq4nl[nearest_iq4(x[i] * is0)];
        sxl += w[i] * x[i] * l;
        sl2 += w[i] * l * l;
      }
      if (sl2 <= 0) continue;
      const double score = sxl * sxl / sl2;
      if (score > best) {
        best = score;
        best_s = static_cast<float>(sxl / sl2);
      }
    }
  }
  return best_s;
}

}  // namespace

// ------------------------------------------------------------------------------------------------
// Q2_K
void dequantize_row_q2_K(const block_q2_K* x, float* y, int64_t n) {
  check_k(n, "dequantize_row_q2_K");
  for (int64_t b = 0; b < n / QK_K; ++b, y += QK_K) {
    const float d = f16_to_f32(x[b].d), dmin = f16_to_f32(x[b].dmin);
    for (int e = 0; e < QK_K; ++e) {
      const int q = (x[b].qs[32 * (e / 128) + e % 32] >> (2 * ((e % 128) / 32))) & 3;
      const uint8_t sc = x[b].scales[e / 16];
      y[e] = d * static_cast<float>(sc & 15) * static_cast<float>(q) - dmin * static_cast<float>(sc >> 4);
    }
  }
}

void quantize_row_q2_K(const float* x, block_q2_K* y, int64_t n, const float* qw) {
  check_k(n, "quantize_row_q2_K");
  float w[QK_K], sc[16], mn[16];
  uint8_t L[QK_K];
  for (int64_t b = 0; b < n / QK_K; ++b, x += QK_K, qw = qw ? qw + QK_K : nullptr) {
    block_weights(x, qw, w);
    float max_sc = 0, max_mn = 0;
    for (int g = 0; g < 16; ++g) {
      sc[g] = fit_affine(16, 3, x + 16 * g, w + 16 * g, L + 16 * g, &mn[g]);
      max_sc = std::max(max_sc, sc[g]);
      max_mn = std::max(max_mn, mn[g]);
    }
    y[b].d = f32_to_f16(max_sc / 15.0f);
    y[b].dmin = f32_to_f16(max_mn / 15.0f);
    const float d = f16_to_f32(y[b].d), dmin = f16_to_f32(y[b].dmin);
    for (int g = 0; g < 16; ++g) {
      int ls = d > 0 ? std::clamp(rne(sc[g] / d), 0, 15) : 0;
      int lm = dmin > 0 ? std::clamp(rne(mn[g] / dmin), 0, 15) : 0;
      // with the scale and min as stored, refit: pick the (ls, lm) neighbours with the least error
      float best_err = INFINITY;
      int bls = ls, blm = lm;
      for (int a = std::max(0, ls - 1); a <= std::min(15, ls + 1); ++a)
        for (int c = std::max(0, lm - 1); c <= std::min(15, lm + 1); ++c) {
          const float ds = d * a, dm = dmin * c, ids = ds > 0 ? 1.0f / ds : 0.0f;
          float err = 0;
          for (int i = 0; i < 16; ++i) {
            const float v = x[16 * g + i];
            const int q = std::clamp(rne((v + dm) * ids), 0, 3);
            const float e = ds * q - dm - v;
            err += w[16 * g + i] * e * e;
          }
          if (err < best_err) {
            best_err = err;
            bls = a;
            blm = c;
          }
        }
      y[b].scales[g] = static_cast<uint8_t>(bls | (blm << 4));
      const float ds = d * bls, dm = dmin * blm;
      for (int i = 0; i < 16; ++i)
        L[16 * g + i] = static_cast<uint8_t>(ds > 0 ? std::clamp(rne((x[16 * g + i] + dm) / ds), 0, 3) : 0);
    }
    std::memset(y[b].qs, 0, sizeof(y[b].qs));
    for (int e = 0; e < QK_K; ++e)
      y[b].qs[32 * (e / 128) + e % 32] |= static_cast<uint8_t>(L[e] << (2 * ((e % 128) / 32)));
  }
}

// ------------------------------------------------------------------------------------------------
// Q3_K
void q3_K_scales(const uint8_t* p, int8_t* out) {
  for (int t = 0; t < 16; ++t) {
    const int low = t < 8 ? (p[t] & 15) : (p[t - 8] >> 4);
    const int high = (p[8 + t % 4] >> (2 * (t / 4))) & 3;
    out[t] = static_cast<int8_t>((low | (high << 4)) - 32);
  }
}

void dequantize_row_q3_K(const block_q3_K* x, float* y, int64_t n) {
  check_k(n, "dequantize_row_q3_K");
  int8_t s[16];
  for (int64_t b = 0; b < n / QK_K; ++b, y += QK_K) {
    const float d = f16_to_f32(x[b].d);
    q3_K_scales(x[b].scales, s);
    for (int e = 0; e < QK_K; ++e) {
      const int low = (x[b].qs[32 * (e / 128) + e % 32] >> (2 * ((e % 128) / 32))) & 3;
      const int hb = (x[b].hmask[e % 32] >> (e / 32)) & 1;
      y[e] = d * static_cast<float>(s[e / 16]) * static_cast<float>(low - (hb ? 0 : 4));
    }
  }
}

void quantize_row_q3_K(const float* x, block_q3_K* y, int64_t n, const float* qw) {
  check_k(n, "quantize_row_q3_K");
  float w[QK_K], sc[16];
  for (int64_t b = 0; b < n / QK_K; ++b, x += QK_K, qw = qw ? qw + QK_K : nullptr) {
    block_weights(x, qw, w);
    float amax = 0, vmax = 0;
    for (int g = 0; g < 16; ++g) {
      sc[g] = fit_signed(16, -4, 3, x + 16 * g, w + 16 * g);
      if (std::fabs(sc[g]) > amax) {
        amax = std::fabs(sc[g]);
        vmax = sc[g];
      }
    }
    std::memset(&y[b], 0, sizeof(block_q3_K));
    if (amax < 1e-30f) continue;  // all zero: d = 0
    // integer scales s' in [-32, 31]; the largest magnitude maps to -32
    y[b].d = f32_to_f16(vmax / -32.0f);
    const float d = f16_to_f32(y[b].d);
    int ls[16];
    for (int g = 0; g < 16; ++g) {
      int l = d != 0 ? std::clamp(rne(sc[g] / d), -32, 31) : 0;
      // try the neighbour integer scales with the stored d, keep the least weighted error
      float best_err = INFINITY;
      int bl = l;
      for (int c = std::max(-32, l - 1); c <= std::min(31, l + 1); ++c) {
        const float ds = d * c, ids = ds != 0 ? 1.0f / ds : 0.0f;
        float err = 0;
        for (int i = 0; i < 16; ++i) {
          const float v = x[16 * g + i];
          const int q = std::clamp(rne(v * ids), -4, 3);
          const float e = ds * q - v;
          err += w[16 * g + i] * e * e;
        }
        if (err < best_err) {
          best_err = err;
          bl = c;
        }
      }
      ls[g] = bl + 32;
    }
    for (int t = 0; t < 16; ++t) {
      if (t < 8) y[b].scales[t] |= static_cast<uint8_t>(ls[t] & 15);
      else y[b].scales[t - 8] |= static_cast<uint8_t>((ls[t] & 15) << 4);
      y[b].scales[8 + t % 4] |= static_cast<uint8_t>((ls[t] >> 4) << (2 * (t / 4)));
    }
    for (int e = 0; e < QK_K; ++e) {
      const float ds = d * (ls[e / 16] - 32);
      const int q = ds != 0 ? std::clamp(rne(x[e] / ds), -4, 3) : 0;
      const int u = q + 4;  // 0..7: bit 2 -> hmask, low 2 bits -> qs
      y[b].qs[32 * (e / 128) + e % 32] |= static_cast<uint8_t>((u & 3) << (2 * ((e % 128) / 32)));
      if (u & 4) y[b].hmask[e % 32] |= static_cast<uint8_t>(1u << (e / 32));
    }
  }
}

// ------------------------------------------------------------------------------------------------
// IQ4_XS
void dequantize_row_iq4_xs(const block_iq4_xs* x, float* y, int64_t n) {
  check_k(n, "dequantize_row_iq4_xs");
  for (int64_t b = 0; b < n / QK_K; ++b, y += QK_K) {
    const float d = f16_to_f32(x[b].d);
    for (int ib = 0; ib < 8; ++ib) {
      const int ls = ((x[b].scales_l[ib / 2] >> (4 * (ib % 2))) & 15) | (((x[b].scales_h >> (2 * ib)) & 3) << 4);
      const float dl = d * static_cast<float>(ls - 32);
      const uint8_t* q = x[b].qs + 16 * ib;
      for (int j = 0; j < 16; ++j) {
        y[32 * ib + j] = dl * kvalues_iq4nl[q[j] & 15];
        y[32 * ib + j + 16] = dl * kvalues_iq4nl[q[j] >> 4];
      }
    }
  }
}

void quantize_row_iq4_xs(const float* x, block_iq4_xs* y, int64_t n, const float* qw) {
  check_k(n, "quantize_row_iq4_xs");
  float w[QK_K], sc[8];
  for (int64_t b = 0; b < n / QK_K; ++b, x += QK_K, qw = qw ? qw + QK_K : nullptr) {
    block_weights(x, qw, w);
    float amax = 0, vmax = 0;
    for (int ib = 0; ib < 8; ++ib) {
      sc[ib] = fit_iq4(32, x + 32 * ib, w + 32 * ib);
      if (std::fabs(sc[ib]) > amax) {
        amax = std::fabs(sc[ib]);
        vmax = sc[ib];
      }
    }
    std::memset(&y[b], 0, sizeof(block_iq4_xs));
    if (amax < 1e-30f) {  // all zero: d = 0, scales 32 (value 0)
      for (int ib = 0; ib < 8; ++ib) {
        y[b].scales_l[ib / 2] = 0;
        y[b].scales_h |= static_cast<uint16_t>(2u << (2 * ib));
      }
      continue;
    }
    y[b].d = f32_to_f16(vmax / -32.0f);
    const float d = f16_to_f32(y[b].d);
    for (int ib = 0; ib < 8; ++ib) {
      const int l0 = d != 0 ? std::clamp(rne(sc[ib] / d), -32, 31) : 0;
      float best_err = INFINITY;
      int bl = l0;
      for (int c = std::max(-32, l0 - 1); c <= std::min(31, l0 + 1); ++c) {
        const float dl = d * c, idl = dl != 0 ? 1.0f / dl : 0.0f;
        float err = 0;
        for (int i = 0; i < 32; ++i) {
          const float v = x[32 * ib + i];
          const float e = dl != 0 ? dl * kvalues_iq4nl[nearest_iq4(v * idl)] - v : -v;
          err += w[32 * ib + i] * e * e;
        }
        if (err < best_err) {
          best_err = err;
          bl = c;
        }
      }
      const int ls = bl + 32;
      y[b].scales_l[ib / 2] |= static_cast<uint8_t>((ls & 15) << (4 * (ib % 2)));
      y[b].scales_h |= static_cast<uint16_t>((ls >> 4) << (2 * ib));
      const float dl = d * bl, idl = dl != 0 ? 1.0f / dl : 0.0f;
      uint8_t* q = y[b].qs + 16 * ib;
      for (int j = 0; j < 16; ++j) {
        const int k0 = dl != 0 ? nearest_iq4(x[32 * ib + j] * idl) : 8;
        const int k1 = dl != 0 ? nearest_iq4(x[32 * ib + j + 16] * idl) : 8;
        q[j] = static_cast<uint8_t>(k0 | (k1 << 4));
      }
    }
  }
}

}  // namespace kimi
