// IQ2_XS (ggml type 17, formats-quant.md §4.6): 256-element super-blocks of 74 bytes, each group
// of 8 elements one entry of a 512-point codebook of magnitudes {8, 25, 43} with 7 sign bits (the
// 8th sign makes the count of negatives even), a 4-bit scale per 16 elements:
//   x = d * (0.5 + s) * 0.25 * magnitude * sign.
// The codebook is data of the format: kIq2xsGrid[k] holds the 8 levels of entry k as 2-bit digits
// (level 0, 1, 2 = magnitude 8, 25, 43; digit i = element i), i.e. ggml's iq2xs_grid with each byte
// replaced by its level. Quantizer (own): per 16 elements a search over candidate scales, per 8
// elements the sign pattern (parity fixed by flipping the least important element) and the
// codebook entry of least weighted error (the per-element nearest point when it is in the
// codebook, else the best of the 16 entries nearest to that point, a table built once); then the
// 4-bit scales with the stored d and a final re-pick of the entries.
#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>
#include <vector>

#include "tensor/quants.h"
#include "util/error.h"

namespace kimi {

const uint16_t kIq2xsGrid[512] = {
    0, 2, 5, 8, 10, 17, 20, 22, 25, 32, 34, 37, 40, 65, 68, 70,
    73, 80, 82, 85, 88, 97, 100, 128, 130, 133, 136, 145, 148, 153, 160, 257,
    260, 262, 265, 272, 274, 277, 280, 282, 289, 292, 320, 322, 325, 328, 337, 340,
    352, 360, 385, 388, 400, 512, 514, 517, 520, 529, 532, 544, 577, 580, 592, 597,
    640, 650, 1025, 1028, 1030, 1033, 1040, 1042, 1045, 1048, 1057, 1060, 1088, 1090, 1093, 1096,
    1105, 1108, 1110, 1120, 1153, 1156, 1168, 1280, 1282, 1285, 1288, 1297, 1300, 1312, 1345, 1348,
    1360, 1377, 1408, 1537, 1540, 1552, 1574, 1600, 1602, 1668, 2048, 2050, 2053, 2056, 2058, 2065,
    2068, 2080, 2085, 2113, 2116, 2128, 2136, 2176, 2208, 2218, 2305, 2308, 2320, 2368, 2433, 2441,
    2560, 2592, 2600, 2710, 2720, 4097, 4100, 4102, 4105, 4112, 4114, 4117, 4120, 4129, 4132, 4160,
    4162, 4165, 4168, 4177, 4180, 4192, 4202, 4225, 4228, 4240, 4352, 4354, 4357, 4360, 4369, 4372,
    4384, 4417, 4420, 4432, 4480, 4500, 4502, 4609, 4612, 4614, 4624, 4672, 4704, 5120, 5122, 5125,
    5128, 5137, 5140, 5152, 5185, 5188, 5193, 5200, 5220, 5248, 5377, 5380, 5392, 5440, 5632, 5652,
    5705, 6145, 6148, 6160, 6162, 6208, 6228, 6278, 6400, 6405, 6502, 6737, 6825, 8192, 8194, 8197,
    8200, 8202, 8209, 8212, 8224, 8257, 8260, 8272, 8320, 8352, 8449, 8452, 8464, 8512, 8520, 8549,
    8704, 8738, 8832, 8872, 9217, 9220, 9232, 9257, 9280, 9472, 9537, 9554, 9625, 9729, 9754, 9894,
    10240, 10248, 10250, 10272, 10325, 10376, 10402, 10600, 10640, 10760, 10784, 10882, 10888, 10890, 16385, 16388,
    16390, 16393, 16400, 16402, 16405, 16408, 16417, 16420, 16448, 16450, 16453, 16456, 16458, 16465, 16468, 16480,
    16485, 16513, 16516, 16528, 16640, 16642, 16645, 16648, 16657, 16660, 16672, 16705, 16708, 16720, 16768, 16773,
    16802, 16897, 16900, 16912, 16914, 16937, 16960, 17408, 17410, 17413, 17416, 17425, 17428, 17433, 17440, 17473,
    17476, 17488, 17536, 17556, 17665, 17668, 17680, 17700, 17728, 17818, 17920, 17930, 17988, 18000, 18433, 18436,
    18448, 18496, 18501, 18516, 18530, 18688, 18705, 18756, 18768, 18793, 18948, 20480, 20482, 20485, 20488, 20497,
    20500, 20512, 20520, 20545, 20548, 20560, 20608, 20737, 20740, 20752, 20757, 20800, 20802, 20992, 21060, 21162,
    21505, 21508, 21520, 21537, 21568, 21600, 21633, 21665, 21760, 21768, 21888, 21896, 22049, 22120, 22177, 22528,
    22548, 22593, 22608, 22681, 22810, 22848, 22850, 23173, 24577, 24580, 24592, 24640, 24660, 24674, 24710, 24745,
    24832, 25124, 25162, 25234, 25600, 25622, 25872, 25920, 25925, 26020, 26625, 26730, 26917, 27142, 27220, 27234,
    32768, 32770, 32773, 32776, 32785, 32788, 32800, 32810, 32833, 32836, 32848, 32896, 32898, 32936, 32938, 33025,
    33028, 33030, 33040, 33088, 33105, 33113, 33280, 33312, 33408, 33410, 33440, 33448, 33793, 33796, 33808, 33810,
    33813, 33856, 33888, 33929, 34048, 34116, 34213, 34328, 34410, 34816, 34824, 34853, 34906, 34944, 34946, 34984,
    35078, 35362, 35456, 35464, 35478, 35496, 36865, 36868, 36880, 36928, 36950, 36996, 37120, 37154, 37220, 37462,
    37513, 37888, 37893, 37956, 37968, 37976, 38185, 38288, 38290, 38465, 38993, 39078, 39241, 39445, 39520, 40960,
    40962, 40968, 40970, 40992, 41002, 41120, 41297, 41305, 41382, 41472, 41474, 41480, 41514, 41600, 41632, 42048,
    42133, 42597, 42648, 43018, 43040, 43042, 43048, 43168, 43176, 43268, 43396, 43398, 43560, 43562, 43665, 43690,
};

namespace {

constexpr int kMag[3] = {8, 25, 43};

inline int rne(float x) { return static_cast<int>(std::nearbyint(x)); }

constexpr int kNbr = 16;  // codebook entries searched for a point outside the codebook

struct Iq2Tables {
  std::array<int16_t, 6561> index;      // base-3 code of 8 levels -> codebook entry, or -1
  std::array<std::array<uint8_t, 8>, 512> mag;  // magnitudes of each entry
  std::vector<uint16_t> nbr;            // per base-3 code: the kNbr entries nearest to it (L2 on magnitudes)
  Iq2Tables() {
    index.fill(-1);
    for (int k = 0; k < 512; ++k) {
      int code = 0, p = 1;
      for (int i = 0; i < 8; ++i, p *= 3) {
        const int l = (kIq2xsGrid[k] >> (2 * i)) & 3;
        mag[static_cast<size_t>(k)][static_cast<size_t>(i)] = static_cast<uint8_t>(kMag[l]);
        code += l * p;
      }
      index[static_cast<size_t>(code)] = static_cast<int16_t>(k);
    }
    nbr.resize(6561 * kNbr);
    std::vector<std::pair<int, int>> dist(512);
    for (int code = 0; code < 6561; ++code) {
      int m[8];
      for (int i = 0, c = code; i < 8; ++i, c /= 3) m[i] = kMag[c % 3];
      for (int k = 0; k < 512; ++k) {
        int d2 = 0;
        for (int i = 0; i < 8; ++i) {
          const int d = m[i] - mag[static_cast<size_t>(k)][static_cast<size_t>(i)];
          d2 += d * d;
        }
        dist[static_cast<size_t>(k)] = {d2, k};
      }
      std::partial_sort(dist.begin(), dist.begin() + kNbr, dist.end());
      for (int j = 0; j < kNbr; ++j) nbr[static_cast<size_t>(code * kNbr + j)] = static_cast<uint16_t>(dist[static_cast<size_t>(j)].second);
    }
  }
};
const Iq2Tables& tables() {
  static const Iq2Tables t;
  return t;
}

// Best codebook entry for targets t[8] (in units of the scale; negative for an element whose sign
// had to be flipped) with weights w; returns the entry, *err its weighted squared error.
int best_entry(const float* t, const float* w, float* err) {
  const Iq2Tables& T = tables();
  int code = 0, p = 1;
  for (int i = 0; i < 8; ++i, p *= 3) {
    const int l = t[i] < 16.5f ? 0 : t[i] < 34.0f ? 1 : 2;
    code += l * p;
  }
  int best = T.index[static_cast<size_t>(code)];
  auto cost = [&](int k) {
    float e = 0;
    for (int i = 0; i < 8; ++i) {
      const float d = t[i] - T.mag[static_cast<size_t>(k)][static_cast<size_t>(i)];
      e += w[i] * d * d;
    }
    return e;
  };
  if (best >= 0) {
    *err = cost(best);
    return best;
  }
  float be = INFINITY;
  for (int j = 0; j < kNbr; ++j) {  // the entries nearest to the per-element nearest point
    const int k = T.nbr[static_cast<size_t>(code * kNbr + j)];
    const float e = cost(k);
    if (e < be) {
      be = e;
      best = k;
    }
  }
  *err = be;
  return best;
}

// One group of 8 at scale e: sign bits (7-bit index), entry, and the sums for the optimal scale.
struct GroupPick {
  int entry = 0;
  int sign7 = 0;
  double sxg = 0, sg2 = 0;  // sum w * (signed x) * g, sum w * g^2
};
GroupPick pick_group(const float* x, const float* w, float e) {
  GroupPick gp;
  int neg = 0, nneg = 0;
  for (int i = 0; i < 8; ++i)
    if (x[i] < 0) {
      neg |= 1 << i;
      ++nneg;
    }
  if (nneg & 1) {  // flip the sign of the least important element
    int im = 0;
    float vm = INFINITY;
    for (int i = 0; i < 8; ++i) {
      const float v = w[i] * std::fabs(x[i]);
      if (v < vm) {
        vm = v;
        im = i;
      }
    }
    neg ^= 1 << im;
  }
  float t[8];
  for (int i = 0; i < 8; ++i) {
    const float sx = (neg >> i & 1) ? -x[i] : x[i];  // x times the sign it will be decoded with
    t[i] = e > 0 ? sx / e : 0.0f;
  }
  float err;
  gp.entry = best_entry(t, w, &err);
  gp.sign7 = neg & 127;
  const auto& m = tables().mag[static_cast<size_t>(gp.entry)];
  for (int i = 0; i < 8; ++i) {
    const float sx = (neg >> i & 1) ? -x[i] : x[i];
    gp.sxg += static_cast<double>(w[i]) * sx * m[static_cast<size_t>(i)];
    gp.sg2 += static_cast<double>(w[i]) * m[static_cast<size_t>(i)] * m[static_cast<size_t>(i)];
  }
  return gp;
}

// Weighted error of 16 elements coded as two groups at scale e.
double half_error(const float* x, const float* w, float e, GroupPick* g) {
  double err = 0;
  for (int h = 0; h < 2; ++h) {
    g[h] = pick_group(x + 8 * h, w + 8 * h, e);
    const auto& m = tables().mag[static_cast<size_t>(g[h].entry)];
    const int signs = iq2_ksigns(g[h].sign7);
    for (int i = 0; i < 8; ++i) {
      const float v = e * m[static_cast<size_t>(i)] * ((signs >> i & 1) ? -1.0f : 1.0f) - x[8 * h + i];
      err += static_cast<double>(w[8 * h + i]) * v * v;
    }
  }
  return err;
}

}  // namespace

uint64_t iq2xs_grid_u64(int k) {
  uint64_t v = 0;
  for (int i = 0; i < 8; ++i) v |= static_cast<uint64_t>(kMag[(kIq2xsGrid[k] >> (2 * i)) & 3]) << (8 * i);
  return v;
}

const uint64_t* iq2xs_grid_u64_table() {
  static const std::array<uint64_t, 512> t = [] {
    std::array<uint64_t, 512> a{};
    for (int k = 0; k < 512; ++k) a[static_cast<size_t>(k)] = iq2xs_grid_u64(k);
    return a;
  }();
  return t.data();
}

void dequantize_row_iq2_xs(const block_iq2_xs* x, float* y, int64_t n) {
  check(n >= 0 && n % QK_K == 0, "dequantize_row_iq2_xs: row of {} elements is not a multiple of {}", n, QK_K);
  for (int64_t b = 0; b < n / QK_K; ++b) {
    const float d = f16_to_f32(x[b].d);
    for (int ib = 0; ib < 8; ++ib) {
      const float db[2] = {d * (0.5f + (x[b].scales[ib] & 15)) * 0.25f, d * (0.5f + (x[b].scales[ib] >> 4)) * 0.25f};
      for (int l = 0; l < 4; ++l) {
        const uint16_t q = x[b].qs[4 * ib + l];
        const int signs = iq2_ksigns(q >> 9);
        const int k = q & 511;
        for (int j = 0; j < 8; ++j) {
          const int mag = kMag[(kIq2xsGrid[k] >> (2 * j)) & 3];
          *y++ = db[l / 2] * static_cast<float>(mag) * ((signs >> j & 1) ? -1.0f : 1.0f);
        }
      }
    }
  }
}

void quantize_row_iq2_xs(const float* x, block_iq2_xs* y, int64_t n, const float* qw) {
  check(n >= 0 && n % QK_K == 0, "quantize_row_iq2_xs: row of {} elements is not a multiple of {}", n, QK_K);
  float w[QK_K], esc[16];
  GroupPick g[2];
  for (int64_t b = 0; b < n / QK_K; ++b, x += QK_K, qw = qw ? qw + QK_K : nullptr) {
    if (!imatrix_element_weights(qw, QK_K, w)) {  // else the magnitude heuristic
      double s2 = 0;
      for (int i = 0; i < QK_K; ++i) s2 += static_cast<double>(x[i]) * x[i];
      const float sigma2 = static_cast<float>(2.0 * s2 / QK_K);
      for (int i = 0; i < QK_K; ++i) w[i] = std::sqrt(sigma2 + x[i] * x[i]);
    }
    float emax = 0;
    for (int h = 0; h < 16; ++h) {  // 16-element halves: candidate scales, best by weighted error
      const float* xh = x + 16 * h;
      const float* wh = w + 16 * h;
      float amax = 0;
      for (int i = 0; i < 16; ++i) amax = std::max(amax, std::fabs(xh[i]));
      esc[h] = 0;
      if (amax < 1e-30f) continue;
      double best = INFINITY, sx2 = 0;
      for (int i = 0; i < 16; ++i) sx2 += static_cast<double>(wh[i]) * xh[i] * xh[i];
      for (int is = 0; is <= 8; ++is) {
        // entries picked at a candidate scale, then the weighted least-squares scale for those
        // entries and its error (sum w x^2 - (sum w x g)^2 / sum w g^2)
        const float e0 = amax / (43.0f * (0.7f + 0.075f * is));
        half_error(xh, wh, e0, g);
        const double sg2 = g[0].sg2 + g[1].sg2, sxg = g[0].sxg + g[1].sxg;
        if (sg2 <= 0 || sxg <= 0) continue;
        const double err = sx2 - sxg * sxg / sg2;
        if (err < best) {
          best = err;
          esc[h] = static_cast<float>(sxg / sg2);
        }
      }
      emax = std::max(emax, esc[h]);
    }
    std::memset(&y[b], 0, sizeof(block_iq2_xs));
    if (emax <= 0) continue;  // all zero: d = 0
    y[b].d = f32_to_f16(emax * 8.0f / 31.0f);
    const float d = f16_to_f32(y[b].d);
    for (int h = 0; h < 16; ++h) {
      const float* xh = x + 16 * h;
      const float* wh = w + 16 * h;
      const int s0 = d > 0 ? std::clamp(rne((esc[h] * 8.0f / d - 1.0f) * 0.5f), 0, 15) : 0;
      double best = INFINITY;
      int bs = s0;
      GroupPick bg[2];
      for (int s = std::max(0, s0 - 1); s <= std::min(15, s0 + 1); ++s) {
        const float e = d * (0.5f + s) * 0.25f;
        const double err = half_error(xh, wh, e, g);
        if (err < best) {
          best = err;
          bs = s;
          bg[0] = g[0];
          bg[1] = g[1];
        }
      }
      y[b].scales[h / 2] |= static_cast<uint8_t>(bs << (4 * (h % 2)));
      for (int k = 0; k < 2; ++k)
        y[b].qs[2 * h + k] = static_cast<uint16_t>(bg[k].entry | (bg[k].sign7 << 9));
    }
  }
}

}  // namespace kimi
