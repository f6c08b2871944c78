// Prefill offload of the routed experts in hybrid mode (expert_offload.h, docs/gpu.md "Prefill offload").
#include "model/expert_offload.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>

#include "model/expert_cache.h"
#include "util/error.h"
#include "util/progress.h"

namespace kimi {

namespace {

constexpr uint64_t kAlign = 256;  // each stack of a pool half starts on 256 bytes

uint64_t align_up(uint64_t v) { return (v + kAlign - 1) / kAlign * kAlign; }

double now_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

std::string rate(double Bps) { return fmt::format("{:.3g} GB/s", Bps * 1e-9); }
std::string per_pick(double s) { return s >= 1e-3 ? fmt::format("{:.3g} ms", s * 1e3) : fmt::format("{:.3g} us", s * 1e6); }

}  // namespace

double OffloadRates::cpu_seconds(int64_t distinct, int64_t picks, uint64_t expert_bytes) const {
  const double read = cpu_read_Bps > 0 ? double(distinct) * double(expert_bytes) / cpu_read_Bps : 0.0;
  return std::max(read, double(picks) * cpu_s_per_pick);
}

double OffloadRates::device_seconds(int64_t distinct, int64_t picks, uint64_t expert_bytes) const {
  return double(distinct) * double(expert_bytes) / upload_Bps + double(picks) * dev_s_per_pick;
}

int64_t default_offload_min_tokens(int64_t n_expert, int64_t n_used) {
  return std::max<int64_t>(2, n_used > 0 ? 32 * n_expert / n_used : 2);
}

ExpertOffload::ExpertOffload(const Model& m, Backend& dev, Backend& host, const std::vector<uint8_t>& on_host,
                             const ExpertOffloadOptions& o, int64_t n_tokens)
    : dev_(dev), host_(host), mode_(o.mode), max_experts_(o.max_experts), device_(dev.name()) {
  const HParams& hp = m.hparams();
  E_ = hp.n_expert;
  k_ = hp.n_expert_used;
  n_tokens_ = n_tokens;
  width_ = hp.n_latent ? hp.n_latent : hp.n_embd;
  min_tokens_ = o.min_tokens > 0 ? std::max<int64_t>(2, o.min_tokens) : default_offload_min_tokens(E_, k_);
  on_host_.assign(hp.n_layer, 0);
  int64_t first = -1;
  for (uint32_t il = 0; il < hp.n_layer && il < on_host.size(); ++il) {
    if (!on_host[il] || !hp.is_moe(il) || !m.layer(il).ffn_gate_exps) continue;
    const LayerWeights& L = m.layer(il);
    on_host_[il] = 1;
    if (first < 0) first = il;
    gate_slice_ = std::max(gate_slice_, L.ffn_gate_exps.slice_bytes);
    up_slice_ = std::max(up_slice_, L.ffn_up_exps.slice_bytes);
    down_slice_ = std::max(down_slice_, L.ffn_down_exps.slice_bytes);
  }
  expert_bytes_ = gate_slice_ + up_slice_ + down_slice_;
  const std::string head = fmt::format("prefill offload ({})", device_);
  if (first < 0) return;  // no hybrid layer: nothing to say
  if (mode_ == ExpertOffloadOptions::Mode::Off) {
    plan_ = head + ": off (--moe-offload off)";
    return;
  }
  if (hp.file_experts() != hp.n_expert) {
    plan_ = head + ": off (the file holds a shard of the experts)";
    return;
  }
  if (n_tokens_ < min_tokens_) {
    plan_ = fmt::format("{}: off: micro-batches of at most {} tokens (-b) are below the threshold of {} tokens "
                        "(--moe-offload-min)", head, n_tokens_, min_tokens_);
    return;
  }
  // the pool: two halves of C experts, each half a gate, an up and a down stack (three allocations)
  auto half_bytes = [&](int64_t c) {
    return align_up(uint64_t(c) * gate_slice_) + align_up(uint64_t(c) * up_slice_) + align_up(uint64_t(c) * down_slice_);
  };
  if (o.pool_bytes > 0) {
    chunk_ = 0;
    while (chunk_ < E_ && 2 * half_bytes(chunk_ + 1) <= uint64_t(o.pool_bytes)) ++chunk_;
    check(chunk_ >= 1, "--moe-offload-pool {}: holds no expert (two halves of at least {} each)",
          format_bytes(uint64_t(o.pool_bytes)), format_bytes(half_bytes(1)));
  } else {
    // 1/8 of the free memory; 4 GiB when the backend does not say how much it has; a stack at most 1 GiB
    // (one allocation each: devices limit the size of one, lavapipe to 2 GiB)
    const uint64_t cap = dev.memory_capacity(), used = dev.stats().device_bytes;
    const uint64_t budget = cap == 0 ? uint64_t(4) << 30 : cap > used ? (cap - used) / 8 : 0;
    const uint64_t widest = std::max({gate_slice_, up_slice_, down_slice_});
    chunk_ = std::min<int64_t>({E_, int64_t(budget / (2 * (expert_bytes_ + 3 * kAlign))),
                                int64_t((uint64_t(1) << 30) / std::max<uint64_t>(widest, 1))});
    if (chunk_ < 1) {
      plan_ = head + ": off (no room on the device for the pool of two experts; --moe-offload-pool)";
      return;
    }
  }
  for (int h = 0; h < 2; ++h) {
    pool_[h][0] = dev.alloc(uint64_t(chunk_) * gate_slice_, "prefill offload pool (gate)");
    pool_[h][1] = dev.alloc(uint64_t(chunk_) * up_slice_, "prefill offload pool (up)");
    pool_[h][2] = dev.alloc(uint64_t(chunk_) * down_slice_, "prefill offload pool (down)");
    sel_[h] = dev.alloc(uint64_t(n_tokens * k_) * 4, "prefill offload routing");
    w_[h] = dev.alloc(uint64_t(n_tokens * k_) * 4, "prefill offload weights");
    acc_[h] = dev.alloc(uint64_t(n_tokens * width_) * 4, "prefill offload chunk sum");
  }
  part_ = dev.alloc(uint64_t(n_tokens * width_) * 4, "prefill offload sum (split steps)");
  used_.assign(size_t(E_), 0);
  pos_.assign(size_t(E_), -1);
  cnt_.assign(size_t(E_), 0);
  csel_.assign(size_t(n_tokens * k_), -1);
  cw_.assign(size_t(n_tokens * k_), 0.0f);
  active_ = true;
  const std::string pool = fmt::format("pool 2 x {} experts ({})", chunk_, format_bytes(2 * half_bytes(chunk_)));
  if (mode_ == ExpertOffloadOptions::Mode::On) {
    plan_ = fmt::format("{}: on for micro-batches >= {} tokens (--moe-offload on), {}", head, min_tokens_, pool);
    return;
  }
  probe(m, uint32_t(first), n_tokens);
  const int64_t picks = n_tokens * k_, distinct = std::min(E_, picks);
  const double c = rates_.cpu_seconds(distinct, picks, expert_bytes_),
               g = rates_.device_seconds(distinct, picks, expert_bytes_);
  plan_ = fmt::format(
      "{}: auto for micro-batches >= {} tokens, each step's most-picked experts to the device while the CPU runs the "
      "rest, as many as the rates measured now make fastest "
      "({:.2f} s): CPU {} of experts read, {} per pick; upload {}; device {} per pick; a full micro-batch of {} tokens "
      "({} picks of {} experts): CPU {:.3g} ms vs upload + device {:.3g} ms -> {}; {}",
      head, min_tokens_, rates_.probe_s, rate(rates_.cpu_read_Bps), per_pick(rates_.cpu_s_per_pick),
      rate(rates_.upload_Bps), per_pick(rates_.dev_s_per_pick), n_tokens, picks, distinct, c * 1e3, g * 1e3,
      g < c ? "offload" : "CPU", pool);
}

ExpertOffload::~ExpertOffload() = default;

// gate, up and down slices of expert e (host memory) into slot `slot` of pool half `half`
void ExpertOffload::upload_expert(const ExpertMats& hm, int32_t e, int half, int64_t slot) {
  const uint64_t sl[3] = {hm.gate_slice, hm.up_slice, hm.down_slice};
  const MatView* mv[3] = {&hm.gate, &hm.up, &hm.down};
  for (int w = 0; w < 3; ++w) {
    const uint8_t* src = hm.slices ? hm.slices[3 * size_t(e) + size_t(w)] : mv[w]->data + uint64_t(e) * sl[w];
    dev_.upload(pool_[half][w]->as<uint8_t>() + uint64_t(slot) * sl[w], src, sl[w]);
  }
}

// the views of pool half `half` for a layer whose experts hm describes (its slices at their own strides)
ExpertMats ExpertOffload::half_mats(const ExpertMats& hm, int half) const {
  ExpertMats dm = hm;
  dm.slices = nullptr;
  dm.gate.data = pool_[half][0]->as<uint8_t>();
  dm.up.data = pool_[half][1]->as<uint8_t>();
  dm.down.data = pool_[half][2]->as<uint8_t>();
  dm.gate.packed = dm.up.packed = dm.down.packed = nullptr;
  return dm;
}

// The rates of auto mode, measured on layer il's experts: Pn tokens picking among the first Ep experts
// (uploaded into half 0) on the host and on the device, each timed twice (the faster counts: the first run
// also creates pipelines and faults pages in), and one token's k picks on the host (read-bound).
void ExpertOffload::probe(const Model& m, uint32_t il, int64_t n_tokens) {
  const double t_start = now_s();
  const LayerWeights& L = m.layer(il);
  const ExpertMats hm{L.ffn_gate_exps.mat, L.ffn_up_exps.mat, L.ffn_down_exps.mat,
                      L.ffn_gate_exps.slice_bytes, L.ffn_up_exps.slice_bytes, L.ffn_down_exps.slice_bytes, nullptr};
  const uint64_t eb = hm.gate_slice + hm.up_slice + hm.down_slice;
  const int64_t Pn = std::min<int64_t>(n_tokens, 64), Ep = std::min<int64_t>({chunk_, E_, 16}), P = Pn * k_;
  const int64_t W = width_;
  auto hx = host_.alloc(uint64_t(Pn * W) * 4, "offload probe input");
  auto hsel = host_.alloc(uint64_t(P) * 4, "offload probe routing");
  auto hw = host_.alloc(uint64_t(P) * 4, "offload probe weights");
  auto hacc = host_.alloc(uint64_t(Pn * W) * 4, "offload probe output");
  auto dx = dev_.alloc(uint64_t(Pn * W) * 4, "offload probe input");
  float* x = hx->as<float>();
  for (int64_t i = 0; i < Pn * W; ++i) x[i] = 0.25f * std::sin(0.37f * float(i % 977) + 0.11f * float(i / 977));
  for (int64_t i = 0; i < P; ++i) {
    hsel->as<int32_t>()[i] = int32_t(i % Ep);  // token t: experts tk..tk+k-1 mod Ep (distinct when Ep >= k)
    hw->as<float>()[i] = 1.0f / float(k_);
  }
  dev_.upload(dx->data(), x, uint64_t(Pn * W) * 4);
  dev_.upload(sel_[0]->data(), hsel->data(), uint64_t(P) * 4);
  dev_.upload(w_[0]->data(), hw->data(), uint64_t(P) * 4);
  const ExpertMats dm = half_mats(hm, 0);
  const float beta = m.hparams().situ_beta, lambda = m.hparams().situ_lambda;
  double up = 1e30, dv = 1e30, cpu = 1e30, rd = 1e30;
  dev_.sync();
  for (int rep = 0; rep < 2; ++rep) {
    double t0 = now_s();
    for (int64_t e = 0; e < Ep; ++e) upload_expert(hm, int32_t(e), 0, e);
    dev_.sync();
    up = std::min(up, now_s() - t0);
    t0 = now_s();
    dev_.moe_experts(dm, dx->as<float>(), Pn, W, sel_[0]->as<int32_t>(), w_[0]->as<float>(), k_, Ep, beta, lambda,
                     acc_[0]->as<float>());
    dev_.sync();
    dv = std::min(dv, now_s() - t0);
    t0 = now_s();
    host_.moe_experts(hm, x, Pn, W, hsel->as<int32_t>(), hw->as<float>(), k_, E_, beta, lambda, hacc->as<float>());
    cpu = std::min(cpu, now_s() - t0);
    if (now_s() - t_start > 0.5) break;  // a slow device (a software one, big experts): one run is enough
  }
  // one token, k experts the batch above did not use where there are such (a read-bound step)
  for (int64_t j = 0; j < k_; ++j) hsel->as<int32_t>()[j] = int32_t((Ep + j) % E_);
  for (int rep = 0; rep < 2; ++rep) {
    const double t0 = now_s();
    host_.moe_experts(hm, x, 1, W, hsel->as<int32_t>(), hw->as<float>(), k_, E_, beta, lambda, hacc->as<float>());
    rd = std::min(rd, now_s() - t0);
  }
  const double tiny = 1e-9;
  rates_.upload_Bps = double(Ep) * double(eb) / std::max(up, tiny);
  rates_.dev_s_per_pick = std::max(dv, tiny) / double(P);
  rates_.cpu_s_per_pick = std::max(cpu, tiny) / double(P);
  rates_.cpu_read_Bps = double(std::min(k_, E_)) * double(eb) / std::max(rd, tiny);
  rates_.probe_s = now_s() - t_start;
}

ExpertOffload::Result ExpertOffload::run(uint32_t il, const ExpertMats& hm, const float* x, int64_t n, int64_t width,
                                         int32_t* host_sel, const float* host_weights, int64_t k, float situ_beta,
                                         float situ_lambda, float* acc) {
  if (!active_ || n < min_tokens_ || il >= on_host_.size() || !on_host_[il]) return Result::None;
  const int64_t count = n * k;
  check(count <= int64_t(csel_.size()) && width <= width_ && k == k_,
        "prefill offload: a step of {} picks beyond the {} reserved", count, csel_.size());
  // the distinct experts of the host's picks and their picks
  int64_t picks = 0, D = 0;
  for (int64_t i = 0; i < count; ++i) {
    const int32_t e = host_sel[i];
    if (e < 0 || e >= E_) continue;
    ++picks;
    ++cnt_[size_t(e)];
  }
  for (int64_t e = 0; e < E_; ++e)
    if (cnt_[size_t(e)] > 0) used_[size_t(D++)] = int32_t(e);
  auto done = [&](Result r) {
    for (int64_t p = 0; p < D; ++p) cnt_[size_t(used_[size_t(p)])] = 0, pos_[size_t(used_[size_t(p)])] = -1;
    return r;
  };
  if (D == 0) return done(Result::None);
  const uint64_t eb = hm.gate_slice + hm.up_slice + hm.down_slice;
  // how many experts go to the device: the S most-picked ones (ties: the lower id), the rest stays on the host
  int64_t S = D;
  if (max_experts_ > 0) S = std::min(S, max_experts_);
  if (mode_ == ExpertOffloadOptions::Mode::Auto || S < D) {
    std::sort(used_.begin(), used_.begin() + D, [&](int32_t a, int32_t b) {
      return cnt_[size_t(a)] != cnt_[size_t(b)] ? cnt_[size_t(a)] > cnt_[size_t(b)] : a < b;
    });
  }
  if (mode_ == ExpertOffloadOptions::Mode::Auto) {
    if (!rates_.measured()) {
      ++declined_;
      return done(Result::None);
    }
    // the split with the shortest step: the device's share (upload + work) and the host's run at the same time
    double best = rates_.cpu_seconds(D, picks, eb);
    int64_t best_s = 0, dev_picks = 0;
    for (int64_t j = 1; j <= S; ++j) {
      dev_picks += cnt_[size_t(used_[size_t(j - 1)])];
      const double dev = rates_.device_seconds(j, dev_picks, eb);
      const double host = j < D ? rates_.cpu_seconds(D - j, picks - dev_picks, eb) : 0.0;
      const double t = std::max(dev, host);
      if (t < best) best = t, best_s = j;
    }
    if (best_s == 0) {
      ++declined_;
      return done(Result::None);
    }
    S = best_s;
  }
  // the offloaded experts in id order: their position in the walk; the others keep pos -1
  std::sort(used_.begin(), used_.begin() + S);
  for (int64_t p = 0; p < S; ++p) pos_[size_t(used_[size_t(p)])] = int32_t(p);
  const bool all = S == D;
  float* sum = all ? acc : part_->as<float>();
  int64_t moved = 0;
  for (int64_t lo = 0, c = 0; lo < S; lo += chunk_, ++c) {
    const int h = int(c % 2);
    const int64_t hi = std::min(S, lo + chunk_);
    for (int64_t p = lo; p < hi; ++p) upload_expert(hm, used_[size_t(p)], h, p - lo);
    for (int64_t i = 0; i < count; ++i) {
      const int32_t e = host_sel[i];
      const int32_t p = e >= 0 && e < E_ ? pos_[size_t(e)] : -1;
      const bool mine = p >= lo && p < hi;
      csel_[size_t(i)] = mine ? int32_t(p - lo) : -1;
      cw_[size_t(i)] = mine ? host_weights[i] : 0.0f;
    }
    dev_.upload(sel_[h]->data(), csel_.data(), uint64_t(count) * 4);
    dev_.upload(w_[h]->data(), cw_.data(), uint64_t(count) * 4);
    const ExpertMats dm = half_mats(hm, h);
    // chunk 0 writes the sum, each later chunk is added to it: one fixed order
    float* out = c == 0 ? sum : acc_[h]->as<float>();
    dev_.moe_experts(dm, x, n, width, sel_[h]->as<int32_t>(), w_[h]->as<float>(), k, hi - lo, situ_beta, situ_lambda,
                     out);
    if (c > 0) dev_.add(sum, out, n * width);
    dev_.flush();  // the device may run this chunk while the host stages the next one (or runs its share)
    bytes_ += uint64_t(hi - lo) * eb;
    ++chunks_;
  }
  // the host keeps the picks of the experts not offloaded
  for (int64_t i = 0; i < count; ++i) {
    const int32_t e = host_sel[i];
    if (e >= 0 && e < E_ && pos_[size_t(e)] >= 0) host_sel[i] = -1, ++moved;
  }
  ++steps_;
  if (!all) ++split_steps_;
  picks_ += uint64_t(moved);
  return done(all ? Result::All : Result::Part);
}

void ExpertOffload::add_stats(ExpertStreamStats& s) const {
  s.offload_steps += steps_;
  s.offload_declined += declined_;
  s.offload_picks += picks_;
  s.offload_bytes += bytes_;
  s.offload_chunks += chunks_;
  s.offload_split_steps += split_steps_;
  s.offload_plan = plan_;
  s.offload_device = device_;
}

std::string ExpertStreamStats::offload_summary() const {
  return fmt::format("routed experts offloaded to {}: {} layer steps ({} of them split with the CPU, {} left on the "
                     "CPU by the rates), {} picks, {} uploaded in {} chunks",
                     offload_device, offload_steps, offload_split_steps, offload_declined, offload_picks,
                     format_bytes(offload_bytes), offload_chunks);
}

}  // namespace kimi
