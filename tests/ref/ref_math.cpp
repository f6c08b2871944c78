// Building blocks of the float64 reference: number formats and the small math pieces
// (SiTU, ResMix, KDA recurrence, indexer score, top-k). Written from the spec only.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>

#include "ref/reference.h"
#include "util/error.h"

namespace kimi::ref {

// ---------------------------------------------------------------- number formats

double bf16_bits_to_double(uint16_t h) {
  uint32_t u = static_cast<uint32_t>(h) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return static_cast<double>(f);
}

double f16_bits_to_double(uint16_t h) {
  const int sign = (h >> 15) & 1;
  const int exp = (h >> 10) & 0x1f;
  const int mant = h & 0x3ff;
  double v;
  if (exp == 0) {
    v = std::ldexp(static_cast<double>(mant), -24);  // zero / subnormal
  } else if (exp == 31) {
    v = mant ? std::nan("") : INFINITY;
  } else {
    v = std::ldexp(static_cast<double>(1024 + mant), exp - 25);
  }
  return sign ? -v : v;
}

namespace {

// Rounds a finite value to a binary float grid with `mant_bits` explicit mantissa bits and
// smallest normal exponent `emin`, ties to even (std::nearbyint in the default rounding mode).
double round_grid(double x, int mant_bits, int emin) {
  if (x == 0.0 || !std::isfinite(x)) return x;
  int ex;
  std::frexp(x, &ex);  // |x| = m * 2^ex, m in [0.5, 1): leading bit has exponent ex - 1
  int lead = std::max(ex - 1, emin);
  double quantum = std::ldexp(1.0, lead - mant_bits);
  return std::nearbyint(x / quantum) * quantum;
}

}  // namespace

double round_to_bf16(double x) {
  const double f = static_cast<double>(static_cast<float>(x));  // activations are f32 in the engine
  return round_grid(f, 7, -126);  // bf16 overflow to inf cannot happen for finite f32 except at the edge
}

double round_to_f16(double x) {
  const double f = static_cast<double>(static_cast<float>(x));
  double r = round_grid(f, 10, -14);
  if (std::fabs(r) >= 65520.0) r = std::copysign(INFINITY, r);
  return r;
}

void round_q8_0(double* x, int64_t n) {
  check(n % 32 == 0, "round_q8_0: length {} is not a multiple of 32", n);
  for (int64_t b = 0; b < n; b += 32) {
    float amax = 0.0f;
    for (int j = 0; j < 32; ++j) amax = std::max(amax, std::fabs(static_cast<float>(x[b + j])));
    const float d = amax / 127.0f;
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    const double dh = round_to_f16(d);  // the block scale is stored as f16
    for (int j = 0; j < 32; ++j) {
      const float q = std::round(static_cast<float>(x[b + j]) * id);  // roundf: half away from zero
      x[b + j] = static_cast<double>(q) * dh;
    }
  }
}

double e2m1_value(int code) {
  static const double mag[8] = {0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0};
  check(code >= 0 && code < 16, "e2m1_value: code {} out of range", code);
  const double v = mag[code & 7];
  return (code & 8) ? -v : v;
}

void mxfp4_decode_row(const uint8_t* packed, const uint8_t* scales, int64_t n, double* out, bool ggml_order,
                      bool half_scale) {
  check(n % 32 == 0, "mxfp4_decode_row: row length {} is not a multiple of 32", n);
  for (int64_t g = 0; g < n / 32; ++g) {
    const int s = scales[g];
    check(s != 0xff, "MXFP4 scale byte 0xFF (NaN) in group {}", g);
    const double scale = std::ldexp(1.0, s - (half_scale ? 128 : 127));
    const uint8_t* p = packed + g * 16;
    for (int e = 0; e < 32; ++e) {
      int code;
      if (!ggml_order) {
        code = (e & 1) ? (p[e / 2] >> 4) : (p[e / 2] & 0xf);  // element 2i low nibble, 2i+1 high
      } else {
        code = e < 16 ? (p[e] & 0xf) : (p[e - 16] >> 4);     // ggml: j low, j+16 high
      }
      out[g * 32 + e] = e2m1_value(code) * scale;
    }
  }
}

// ---------------------------------------------------------------- small math

double situ(double g, double u, double beta, double lambda) {
  const double sig = 1.0 / (1.0 + std::exp(-g));
  const double gate = beta * std::tanh(g / beta) * sig;
  const double up = lambda > 0.0 ? lambda * std::tanh(u / lambda) : u;
  return gate * up;
}

static double rms_scale(const std::vector<double>& v, double eps) {
  double ss = 0.0;
  for (double x : v) ss += x * x;
  return 1.0 / std::sqrt(ss / static_cast<double>(v.size()) + eps);
}

std::vector<double> res_mix(const std::vector<const std::vector<double>*>& bank, const std::vector<double>& cur,
                            const std::vector<double>& w, double eps, Trap trap) {
  if (bank.empty()) return cur;
  const size_t n = bank.size();
  const size_t d = cur.size();
  check(w.size() == d, "res_mix: score vector has {} values, stream has {}", w.size(), d);
  std::vector<const std::vector<double>*> cand(bank.begin(), bank.end());
  cand.push_back(&cur);  // the current stream is the LAST candidate
  std::vector<double> score(n + 1);
  for (size_t k = 0; k <= n; ++k) {
    const auto& v = *cand[k];
    check(v.size() == d, "res_mix: candidate {} has {} values, expected {}", k, v.size(), d);
    const double r = rms_scale(v, eps);
    double s = 0.0;
    for (size_t j = 0; j < d; ++j) s += v[j] * r * w[j];
    score[k] = s;
  }
  if (trap == Trap::CurrentFirstInSoftmax) std::rotate(score.begin(), score.begin() + n, score.end());
  const double mx = *std::max_element(score.begin(), score.end());
  std::vector<double> pi(n + 1);
  double z = 0.0;
  for (size_t k = 0; k <= n; ++k) z += (pi[k] = std::exp(score[k] - mx));
  std::vector<double> out(d, 0.0);
  for (size_t k = 0; k <= n; ++k) {
    const auto& v = *cand[k];
    const double r = trap == Trap::ResSumNormalized ? rms_scale(v, eps) : 1.0;
    const double p = pi[k] / z;
    for (size_t j = 0; j < d; ++j) out[j] += p * v[j] * r;
  }
  return out;
}

std::vector<std::vector<double>> kda_recurrence(const std::vector<std::vector<double>>& q,
                                                const std::vector<std::vector<double>>& k,
                                                const std::vector<std::vector<double>>& v,
                                                const std::vector<std::vector<double>>& g,
                                                const std::vector<double>& beta, Trap trap) {
  const size_t T = q.size();
  check(k.size() == T && v.size() == T && g.size() == T && beta.size() == T, "kda_recurrence: length mismatch");
  if (T == 0) return {};
  const size_t D = q[0].size();
  const double qscale = trap == Trap::KdaNoQueryScale ? 1.0 : 1.0 / std::sqrt(static_cast<double>(D));
  std::vector<double> S(D * D, 0.0);  // S[i*D + j]: i key index, j value index
  std::vector<double> p(D), delta(D);
  std::vector<std::vector<double>> o(T, std::vector<double>(D, 0.0));
  for (size_t t = 0; t < T; ++t) {
    check(q[t].size() == D && k[t].size() == D && v[t].size() == D && g[t].size() == D,
          "kda_recurrence: width mismatch at token {}", t);
    auto predict = [&] {
      for (size_t j = 0; j < D; ++j) {
        double acc = 0.0;
        for (size_t i = 0; i < D; ++i) acc += S[i * D + j] * k[t][i];
        p[j] = acc;
      }
    };
    auto read = [&] {
      for (size_t j = 0; j < D; ++j) {
        double acc = 0.0;
        for (size_t i = 0; i < D; ++i) acc += S[i * D + j] * q[t][i];
        o[t][j] = acc * qscale;
      }
    };
    if (trap == Trap::DeltaOrderWrong) predict();  // with the undecayed state
    for (size_t i = 0; i < D; ++i) {
      const double a = std::exp(g[t][i]);
      for (size_t j = 0; j < D; ++j) S[i * D + j] *= a;
    }
    if (trap != Trap::DeltaOrderWrong) predict();  // with the decayed state
    if (trap == Trap::ReadBeforeUpdate) read();
    for (size_t j = 0; j < D; ++j) delta[j] = beta[t] * (v[t][j] - p[j]);
    for (size_t i = 0; i < D; ++i)
      for (size_t j = 0; j < D; ++j) S[i * D + j] += k[t][i] * delta[j];
    if (trap != Trap::ReadBeforeUpdate) read();  // with the updated state
  }
  return o;
}

double indexer_score(const std::vector<double>& q, const std::vector<double>& w, const std::vector<double>& k,
                     int64_t n_heads, int64_t dim, Trap trap) {
  check(static_cast<int64_t>(q.size()) == n_heads * dim && static_cast<int64_t>(w.size()) == n_heads &&
            static_cast<int64_t>(k.size()) == dim,
        "indexer_score: sizes q {} w {} k {} do not match {} heads x {}", q.size(), w.size(), k.size(), n_heads,
        dim);
  double s = 0.0;
  for (int64_t h = 0; h < n_heads; ++h) {
    double dot = 0.0;
    for (int64_t i = 0; i < dim; ++i) dot += q[h * dim + i] * k[i];
    if (trap != Trap::IndexerNoRelu) dot = std::max(dot, 0.0);
    s += w[h] * dot;
  }
  return s;
}

std::vector<int64_t> select_top_k(const std::vector<double>& scores, int64_t k, Trap trap) {
  const int64_t n = static_cast<int64_t>(scores.size());
  std::vector<int64_t> idx(n);
  std::iota(idx.begin(), idx.end(), 0);
  if (k >= n) return idx;
  const bool later = trap == Trap::IndexerTieLater;
  std::stable_sort(idx.begin(), idx.end(), [&](int64_t a, int64_t b) {
    if (scores[a] != scores[b]) return scores[a] > scores[b];
    return later ? a > b : a < b;
  });
  idx.resize(static_cast<size_t>(std::max<int64_t>(k, 0)));
  std::sort(idx.begin(), idx.end());
  return idx;
}

double max_rel_diff(const std::vector<std::vector<double>>& a, const std::vector<std::vector<double>>& b) {
  check(a.size() == b.size(), "max_rel_diff: {} vs {} rows", a.size(), b.size());
  double md = 0.0, mb = 0.0;
  for (size_t t = 0; t < a.size(); ++t) {
    check(a[t].size() == b[t].size(), "max_rel_diff: row {} has {} vs {} values", t, a[t].size(), b[t].size());
    for (size_t i = 0; i < a[t].size(); ++i) {
      const double diff = std::fabs(a[t][i] - b[t][i]);
      md = std::isnan(diff) ? INFINITY : std::max(md, diff);
      mb = std::max(mb, std::fabs(b[t][i]));
    }
  }
  return mb > 0.0 ? md / mb : md;
}

// ---------------------------------------------------------------- trap names

const char* trap_name(Trap t) {
  switch (t) {
#define KIMI_TRAP(x) \
  case Trap::x:      \
    return #x;
    KIMI_TRAP(None) KIMI_TRAP(ZeroIndexedFullAttn) KIMI_TRAP(BankMixedH) KIMI_TRAP(BankBeforeMix)
    KIMI_TRAP(NoRestart) KIMI_TRAP(EmbedInStream) KIMI_TRAP(CurrentFirstInSoftmax) KIMI_TRAP(ResSumNormalized)
    KIMI_TRAP(NoFinalMix) KIMI_TRAP(ResScoreNormOnly) KIMI_TRAP(ResScoreProjOnly) KIMI_TRAP(ALogReshape)
    KIMI_TRAP(GateAsClamp) KIMI_TRAP(SsmAWrongSign) KIMI_TRAP(DeltaOrderWrong) KIMI_TRAP(ReadBeforeUpdate)
    KIMI_TRAP(RmsInsteadOfL2) KIMI_TRAP(ConvTapReversed) KIMI_TRAP(ConvLayoutTransposed) KIMI_TRAP(KdaNoConvSilu)
    KIMI_TRAP(KdaGateSilu) KIMI_TRAP(KdaNoQueryScale) KIMI_TRAP(MlaNoPe) KIMI_TRAP(MlaScale128)
    KIMI_TRAP(MlaGateUnnormed) KIMI_TRAP(GProjMixup) KIMI_TRAP(KvbSplitBlocked) KIMI_TRAP(KvbKVSwapped)
    KIMI_TRAP(RouterBiasInWeights) KIMI_TRAP(RouterBiasIgnored) KIMI_TRAP(RouterSoftmax)
    KIMI_TRAP(RoutedNormBeforeSum) KIMI_TRAP(NoRenormalize) KIMI_TRAP(SwiGLUInsteadOfSiTU) KIMI_TRAP(SwapGateUp)
    KIMI_TRAP(SituNoUpTanh) KIMI_TRAP(MxfpNibbleOrder) KIMI_TRAP(MxfpHalfScale) KIMI_TRAP(IndexerTieLater)
    KIMI_TRAP(IndexerNoRelu) KIMI_TRAP(IndexerRmsNormK) KIMI_TRAP(IndexerQUnnormed)
    KIMI_TRAP(IndexerNoCausalMask) KIMI_TRAP(IndexerNoWeightScale) KIMI_TRAP(EpsHfReference)
#undef KIMI_TRAP
    case Trap::Count_:
      break;
  }
  return "?";
}

bool trap_observable(Trap t) {
  return t != Trap::NoRenormalize && t != Trap::IndexerNoWeightScale && t != Trap::EpsHfReference;
}

std::vector<Trap> all_traps() {
  std::vector<Trap> v;
  for (int i = 1; i < static_cast<int>(Trap::Count_); ++i) v.push_back(static_cast<Trap>(i));
  return v;
}

}  // namespace kimi::ref
