#include "runtime/sampling.h"

#include <algorithm>
#include <cmath>

#include "util/error.h"

namespace kimi {

Sampler::Sampler(const SamplerParams& p, int n_vocab) : p_(p), n_vocab_(n_vocab), rng_(p.seed) {
  check(n_vocab > 0, "sampler: n_vocab must be > 0");
  check(p.top_p > 0.0f && p.top_p <= 1.0f, "sampler: top_p must be in (0, 1] (1 = off; got {})", p.top_p);
  check(p.min_p >= 0.0f && p.min_p <= 1.0f, "sampler: min_p must be in [0, 1] (0 = off; got {})", p.min_p);
  check(p.repeat_penalty > 0.0f, "sampler: repeat_penalty must be > 0 (got {})", p.repeat_penalty);
  cand_.reserve(static_cast<size_t>(n_vocab));
  probs_.reserve(static_cast<size_t>(n_vocab));
}

void Sampler::reset() {
  history_.clear();
  rng_.seed(p_.seed);
}

void Sampler::accept(int32_t token) { history_.push_back(token); }

// the candidates with the repetition penalty applied; the greedy pick (argmax, lowest id on ties)
int32_t Sampler::penalise_and_argmax(const float* logits) {
  cand_.resize(static_cast<size_t>(n_vocab_));
  for (int i = 0; i < n_vocab_; ++i) cand_[static_cast<size_t>(i)] = {logits[i], i};
  // repetition penalty (each distinct token once)
  if (p_.repeat_penalty != 1.0f && !history_.empty()) {
    const size_t n = history_.size();
    const size_t from = p_.repeat_last_n < 0 ? 0 : n - std::min(n, static_cast<size_t>(p_.repeat_last_n));
    for (size_t i = from; i < n; ++i) {
      const int32_t t = history_[i];
      if (t < 0 || t >= n_vocab_) continue;
      Cand& c = cand_[static_cast<size_t>(t)];
      if (c.id < 0) continue;  // already penalised (marked)
      c.logit = c.logit > 0 ? c.logit / p_.repeat_penalty : c.logit * p_.repeat_penalty;
      c.id = -1 - c.id;  // mark
    }
    for (auto& c : cand_)
      if (c.id < 0) c.id = -1 - c.id;
  }
  if (p_.temp > 0.0f) return -1;
  auto better = [](const Cand& a, const Cand& b) { return a.logit > b.logit || (a.logit == b.logit && a.id < b.id); };
  return std::min_element(cand_.begin(), cand_.end(), better)->id;
}

// after penalise_and_argmax with temp > 0: top-k, softmax, top-p, min-p over cand_
size_t Sampler::distribution(double& total) {
  auto better = [](const Cand& a, const Cand& b) { return a.logit > b.logit || (a.logit == b.logit && a.id < b.id); };
  size_t n = cand_.size();
  if (p_.top_k > 0 && static_cast<size_t>(p_.top_k) < n) {
    std::partial_sort(cand_.begin(), cand_.begin() + p_.top_k, cand_.end(), better);
    n = static_cast<size_t>(p_.top_k);
  } else {
    std::sort(cand_.begin(), cand_.end(), better);
  }
  // softmax with temperature over the n best (sorted, best first)
  probs_.resize(n);
  const float mx = cand_[0].logit;
  double sum = 0;
  for (size_t i = 0; i < n; ++i) {
    probs_[i] = std::exp((cand_[i].logit - mx) / p_.temp);
    sum += probs_[i];
  }
  for (size_t i = 0; i < n; ++i) probs_[i] = static_cast<float>(probs_[i] / sum);
  if (p_.top_p < 1.0f) {
    double cum = 0;
    size_t keep = n;
    for (size_t i = 0; i < n; ++i) {
      cum += probs_[i];
      if (cum >= p_.top_p) {
        keep = i + 1;
        break;
      }
    }
    n = keep;
  }
  if (p_.min_p > 0.0f) {
    const float thr = p_.min_p * probs_[0];
    size_t keep = 1;
    while (keep < n && probs_[keep] >= thr) ++keep;
    n = keep;
  }
  total = 0;
  for (size_t i = 0; i < n; ++i) total += probs_[i];
  return n;
}

int32_t Sampler::sample(const float* logits) {
  if (p_.temp <= 0.0f) return penalise_and_argmax(logits);
  penalise_and_argmax(logits);
  double total = 0;
  const size_t n = distribution(total);
  std::uniform_real_distribution<double> U(0.0, total);
  const double r = U(rng_);
  double acc = 0;
  for (size_t i = 0; i < n; ++i) {
    acc += probs_[i];
    if (r < acc) return cand_[i].id;
  }
  return cand_[n - 1].id;
}

int32_t Sampler::verify(const float* logits, int32_t draft, const float* q_probs, bool& accepted) {
  if (p_.temp <= 0.0f) {
    const int32_t t = penalise_and_argmax(logits);
    accepted = t == draft;
    return t;
  }
  penalise_and_argmax(logits);
  double total = 0;
  const size_t n = distribution(total);
  double p_d = 0;  // the target's probability of the drafted token
  for (size_t i = 0; i < n; ++i)
    if (cand_[i].id == draft) {
      p_d = probs_[i] / total;
      break;
    }
  const double q_d = q_probs ? double(q_probs[draft]) : 1.0;
  std::uniform_real_distribution<double> U01(0.0, 1.0);
  const double u = U01(rng_);
  if (p_d > 0 && (q_d <= 0 || u * q_d < p_d)) {  // keep with probability min(1, p/q)
    accepted = true;
    return draft;
  }
  accepted = false;
  // rejected: draw from max(0, p - q), renormalised (probs_ becomes that residual)
  double w = 0;
  for (size_t i = 0; i < n; ++i) {
    const int32_t id = cand_[i].id;
    const double q = q_probs ? double(q_probs[id]) : (id == draft ? 1.0 : 0.0);
    const double r = std::max(0.0, probs_[i] / total - q);
    probs_[i] = static_cast<float>(r);
    w += r;
  }
  if (!(w > 0)) return cand_[0].id;  // p <= q everywhere: only through rounding; the target's best
  std::uniform_real_distribution<double> U(0.0, w);
  const double r = U(rng_);
  double acc = 0;
  for (size_t i = 0; i < n; ++i) {
    acc += probs_[i];
    if (r < acc) return cand_[i].id;
  }
  for (size_t i = n; i-- > 0;)
    if (probs_[i] > 0) return cand_[i].id;
  return cand_[n - 1].id;
}

}  // namespace kimi
