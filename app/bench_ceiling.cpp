// `kimi bench`'s ceiling report (bench_ceiling.h).
#include "bench_ceiling.h"

#include <algorithm>
#include <cmath>
#include <string>

#include <fmt/format.h>

namespace kimi::app {

PrefillWork prefill_work(const Model& m, int n_prompt, Precision prec) {
  PrefillWork w;
  const HParams& hp = m.hparams();
  for (const auto& t : m.reader().tensors()) {
    if (t.n_dims < 2 || t.ne[1] <= 1 || t.name == "token_embd.weight") continue;
    double macs = double(t.nelements());
    const bool experts = t.name.size() > 12 && t.name.compare(t.name.size() - 12, 12, "_exps.weight") == 0;
    if (experts && hp.n_expert > 0) macs = macs / double(hp.file_experts()) * std::min(hp.n_expert_used, hp.n_expert);
    const double tokens = t.name == "output.weight" ? 1.0 : double(n_prompt);
    // the arithmetic of this weight's product with that many tokens; a routed expert sees k / E of them
    // on average, which decides whether its products are long enough for the int8 tiles
    const double per_product = experts && hp.n_expert > 0 ? macs / double(t.nelements()) * tokens : tokens;
    const kern::ActType a = kern::matmul_act_type(t.type, prec, static_cast<int64_t>(per_product), t.n_dims > 2);
    w.ops[static_cast<int>(a)] += 2.0 * macs * tokens;
  }
  return w;
}

DeviceShare device_share(const Model& m, const Placement& p, int device, int n_prompt) {
  DeviceShare d;
  const HParams& hp = m.hparams();
  for (const auto& t : m.reader().tensors()) {
    if (p.device_of(t.name) != device) continue;
    const bool experts = t.name.size() > 12 && t.name.compare(t.name.size() - 12, 12, "_exps.weight") == 0;
    const double used = experts && hp.n_expert > 0
                            ? double(std::min(hp.n_expert_used, hp.n_expert)) / double(hp.file_experts())
                            : 1.0;
    if (t.name == "token_embd.weight") {
      if (t.ne[1] > 0) d.tg_bytes_per_token += double(t.nbytes) / double(t.ne[1]);
      continue;
    }
    d.tg_bytes_per_token += double(t.nbytes) * used;
    if (experts) d.tg_expert_bytes_per_token += double(t.nbytes) * used;
    if (t.n_dims < 2 || t.ne[1] <= 1) continue;
    const double tokens = t.name == "output.weight" ? 1.0 : double(n_prompt);
    d.pp_flops += 2.0 * double(t.nelements()) * used * tokens;
    if (experts) d.pp_expert_flops += 2.0 * double(t.nelements()) * used * tokens;
  }
  return d;
}

const char* roof_phase_name(int p) {
  static const char* const names[kRoofPhases] = {"kda", "mla_indexer", "routed_experts", "ffn_shared", "head"};
  return p >= 0 && p < kRoofPhases ? names[p] : "?";
}

int roof_phase_of(const std::string& name, const HParams& hp) {
  if (name.rfind("output.", 0) == 0) return 4;
  if (name.rfind("blk.", 0) != 0) return -1;
  const size_t dot = name.find('.', 4);
  if (dot == std::string::npos) return -1;
  const unsigned long il = std::stoul(name.substr(4, dot - 4));
  const std::string rest = name.substr(dot + 1);
  if (rest.find("_norm.") != std::string::npos || rest.find("_res_score.") != std::string::npos) return -1;
  if (rest.rfind("ffn_", 0) == 0 || rest.rfind("exp_probs_b", 0) == 0)
    return rest.find("_exps.") != std::string::npos ? 2 : 3;
  return il < hp.is_mla.size() && hp.is_mla[il] ? 1 : 0;
}

Roofline roofline_work(const Model& m, const RoofInputs& in) {
  Roofline r;
  r.in = in;
  const HParams& hp = m.hparams();
  const int n = in.n_prompt, u = std::max(1, in.n_ubatch);
  if (n <= 0) return r;
  r.micro_batches = (n + u - 1) / u;
  const double E = hp.n_expert, k = std::min(hp.n_expert_used, hp.n_expert);
  // the expected distinct experts the micro-batches pick, summed (a share of the file's experts)
  double expert_share = 0;
  for (int j = 0; j < r.micro_batches; ++j) {
    const int uj = std::min(u, n - j * u);
    expert_share += E > 0 ? 1.0 - std::pow(1.0 - k / E, double(uj)) : 0.0;
  }
  for (const auto& t : m.reader().tensors()) {
    const int p = roof_phase_of(t.name, hp);
    if (p < 0 || t.n_dims < 2 || t.ne[1] <= 1) continue;
    RoofWork& w = r.ph[p];
    const bool experts = p == 2;
    double macs = double(t.nelements());
    if (experts && E > 0) macs = macs / double(hp.file_experts()) * k;
    const double tokens = p == 4 ? 1.0 : double(n);
    const double per_product = experts && E > 0 ? macs / double(t.nelements()) * tokens : tokens;
    const kern::ActType a = kern::matmul_act_type(t.type, in.prec, static_cast<int64_t>(per_product), t.n_dims > 2);
    w.ops[static_cast<int>(a)] += 2.0 * macs * tokens;
    w.weight_bytes += experts ? double(t.nbytes) * expert_share : p == 4 ? double(t.nbytes) : double(t.nbytes) * r.micro_batches;
  }
  // the non-matmul work and the caches / states
  const double H = hp.n_head, D = hp.kda_head_dim;
  r.ph[0].f32_ops = 7.0 * H * D * D * n * hp.n_kda_layers();
  r.ph[0].state_bytes = 4.0 * H * D * D * r.micro_batches * hp.n_kda_layers();
  double pairs = 0, idx_pairs = 0, rows_read = 0;
  for (int i = 0; i < n; ++i) {
    const double vis = double(in.depth) + i + 1;
    pairs += in.sparse && in.top_k > 0 ? std::min(vis, double(in.top_k)) : vis;
    if (in.top_k > 0 && vis > in.top_k) idx_pairs += vis;
  }
  for (int j = 0; j < r.micro_batches; ++j) rows_read += double(in.depth) + std::min(n, (j + 1) * u);
  const double L = hp.n_mla_layers();
  r.ph[1].f32_ops = L * (pairs * H * 2.0 * (2.0 * hp.kv_lora + hp.n_rope) +
                         (in.top_k > 0 ? idx_pairs * 2.0 * hp.idx_heads * hp.idx_dim : 0.0));
  r.ph[1].state_bytes = L * rows_read * (in.cache_elem_bytes * hp.mla_row() + (in.top_k > 0 ? in.idx_key_bytes : 0.0));
  return r;
}

RooflineReport make_roofline(const Model& m, const RoofInputs& in, const PhaseTimes& sum, int reps, double pass_best_s,
                             double pass_mean_s) {
  RooflineReport rep;
  rep.r = roofline_work(m, in);
  const double per = reps > 0 ? 1.0 / reps : 0.0;
  rep.measured_s[0] = sum.s[PhaseTimes::Kda] * per;
  rep.measured_s[1] = (sum.s[PhaseTimes::Mla] + sum.s[PhaseTimes::Indexer]) * per;
  rep.measured_s[2] = sum.s[PhaseTimes::Experts] * per;
  rep.measured_s[3] = (sum.s[PhaseTimes::Moe] + sum.s[PhaseTimes::Ffn]) * per;
  rep.measured_s[4] = sum.s[PhaseTimes::Head] * per;
  rep.other_s = sum.s[PhaseTimes::Other] * per;
  rep.pass_best_s = pass_best_s;
  rep.pass_mean_s = pass_mean_s;
  return rep;
}

RoofBound roof_bound(const RoofWork& w, const kern::Ceiling& c) {
  RoofBound b;
  for (int t = 0; t < kern::kActTypes; ++t)
    if (w.ops[t] > 0 && c.compute.total[t] > 0) b.compute_s += w.ops[t] / c.compute.total[t];
  if (w.f32_ops > 0 && c.compute.total[0] > 0) b.compute_s += w.f32_ops / c.compute.total[0];
  if (c.read.bytes_per_s > 0) b.read_s = w.bytes() / c.read.bytes_per_s;
  return b;
}

double RooflineReport::bound_s(const kern::Ceiling& c) const {
  double s = 0;
  for (int p = 0; p < kRoofPhases; ++p) s += roof_bound(r.ph[p], c).bound_s();
  return s;
}

void RooflineReport::print(FILE* f, const kern::Ceiling& c) const {
  std::fprintf(f, "pp roofline (%d tokens, %d micro-batch(es) of <= %d, at the peaks above):\n", r.in.n_prompt,
               r.micro_batches, r.in.n_ubatch);
  std::fprintf(f, "| %-14s | %10s | %10s | %9s | %10s | %10s | %7s |\n", "phase", "GFLOP", "MB read", "FLOP/B",
               "bound ms", "meas. ms", "% bound");
  std::fprintf(f, "|%s|%s|%s|%s|%s|%s|%s|\n", std::string(16, '-').c_str(), std::string(12, '-').c_str(),
               std::string(12, '-').c_str(), std::string(11, '-').c_str(), std::string(12, '-').c_str(),
               std::string(12, '-').c_str(), std::string(9, '-').c_str());
  for (int p = 0; p < kRoofPhases; ++p) {
    const RoofWork& w = r.ph[p];
    if (w.flops() <= 0 && measured_s[p] <= 0) continue;
    const RoofBound b = roof_bound(w, c);
    std::fprintf(f, "| %-14s | %10.3f | %10.2f | %9.1f | %8.3f %c | %10.3f | %7.1f |\n", roof_phase_name(p),
                 w.flops() / 1e9, w.bytes() / 1e6, w.bytes() > 0 ? w.flops() / w.bytes() : 0.0, 1e3 * b.bound_s(),
                 b.memory_bound() ? 'M' : 'C', 1e3 * measured_s[p],
                 measured_s[p] > 0 ? 100.0 * b.bound_s() / measured_s[p] : 0.0);
  }
  const double bs = bound_s(c);
  std::fprintf(f, "| %-14s | %10s | %10s | %9s | %10s | %10.3f | %7s |\n", "other", "", "", "", "", 1e3 * other_s, "");
  std::fprintf(f,
               "pp: %.1f %% of the roofline at the best rep (%.1f %% at the mean): %.4g s at the bounds vs %.4g s "
               "measured (M: read-bound, C: compute-bound)\n",
               pass_best_s > 0 ? 100.0 * bs / pass_best_s : 0.0, pass_mean_s > 0 ? 100.0 * bs / pass_mean_s : 0.0, bs,
               pass_best_s);
}

void RooflineReport::to_json(nlohmann::ordered_json& j, const kern::Ceiling& c) const {
  nlohmann::ordered_json o;
  o["n_prompt"] = r.in.n_prompt;
  o["n_ubatch"] = r.in.n_ubatch;
  o["micro_batches"] = r.micro_batches;
  for (int p = 0; p < kRoofPhases; ++p) {
    const RoofWork& w = r.ph[p];
    const RoofBound b = roof_bound(w, c);
    nlohmann::ordered_json ph;
    for (int t = 0; t < kern::kActTypes; ++t)
      if (w.ops[t] > 0) ph["matmul_flops"][kern::act_type_name(static_cast<kern::ActType>(t))] = w.ops[t];
    ph["f32_flops"] = w.f32_ops;
    ph["flops"] = w.flops();
    ph["weight_bytes"] = w.weight_bytes;
    ph["state_bytes"] = w.state_bytes;
    ph["bytes"] = w.bytes();
    ph["compute_s"] = b.compute_s;
    ph["read_s"] = b.read_s;
    ph["bound_s"] = b.bound_s();
    ph["bound"] = b.memory_bound() ? "read" : "compute";
    ph["measured_s"] = measured_s[p];
    ph["pct_of_bound"] = measured_s[p] > 0 ? 100.0 * b.bound_s() / measured_s[p] : 0.0;
    o["phases"][roof_phase_name(p)] = ph;
  }
  o["other_measured_s"] = other_s;
  o["bound_s"] = bound_s(c);
  o["pass_best_s"] = pass_best_s;
  o["pass_mean_s"] = pass_mean_s;
  o["pct_of_roofline"] = pass_best_s > 0 ? 100.0 * bound_s(c) / pass_best_s : 0.0;
  o["mean_pct_of_roofline"] = pass_mean_s > 0 ? 100.0 * bound_s(c) / pass_mean_s : 0.0;
  j["pp_roofline"] = o;
}

double CeilingReport::pp_ideal_s() const {
  double s = 0;
  for (int t = 0; t < kern::kActTypes; ++t)
    if (work.ops[t] > 0 && c.compute.total[t] > 0) s += work.ops[t] / c.compute.total[t];
  return s;
}

void CeilingReport::print(FILE* f) const {
  std::fprintf(f, "%s\n", kern::describe(c).c_str());
  if (tg_best > 0)
    std::fprintf(f, "tg: %.1f %% of the read ceiling at the best rep (%.1f %% at the mean): %.2f GB/s of %.2f GB/s\n",
                 tg_pct(tg_best), tg_pct(tg_mean), tg_best * tg_bytes_per_token / 1e9, c.read.bytes_per_s / 1e9);
  if (pp_best > 0 && work.total() > 0) {
    std::string mix;
    for (int t = 0; t < kern::kActTypes; ++t)
      if (work.ops[t] > 0)
        mix += fmt::format("{}{:.1f} G {}", mix.empty() ? "" : " + ", work.ops[t] / 1e9,
                           kern::act_type_name(static_cast<kern::ActType>(t)));
    std::fprintf(f,
                 "pp: %.1f %% of the compute peak at the best rep (%.1f %% at the mean): matmul work %s ops per pass, "
                 "%.3f s at the peaks vs %.3f s measured (attention and KDA not counted)\n",
                 pp_pct(pp_best), pp_pct(pp_mean), mix.c_str(), pp_ideal_s(), n_prompt / pp_best);
  }
  if (with_roofline) roof.print(f, c);
}

void CeilingReport::to_json(nlohmann::ordered_json& j) const {
  nlohmann::ordered_json cj;
  cj["isa"] = kern::isa_name(c.isa);
  cj["threads"] = c.threads;
  cj["seconds"] = c.seconds;
  cj["read_gb_s"] = c.read.bytes_per_s / 1e9;
  cj["read_streams_per_thread"] = c.read.streams;
  cj["read_non_temporal"] = c.read.non_temporal;
  cj["read_one_stream_gb_s"] = c.read.one_stream_bytes_per_s / 1e9;
  cj["read_buffer_mib"] = double(c.read.buffer_bytes) / 1048576.0;
  cj["read_llc_mib"] = double(c.read.llc_bytes) / 1048576.0;
  for (int t = 0; t < kern::kActTypes; ++t) {
    if (c.compute.instr[t] == nullptr) continue;  // not measured (int8 tiles without AMX-INT8)
    const char* name = kern::act_type_name(static_cast<kern::ActType>(t));
    cj["peak_g_ops"][name] = c.compute.total[t] / 1e9;
    cj["peak_g_ops_per_thread"][name] = c.compute.per_thread[t] / 1e9;
    cj["peak_instr"][name] = c.compute.instr[t] ? c.compute.instr[t] : "";
  }
  j["ceiling"] = cj;
  if (tg_best > 0) {
    j["tg_pct_of_read_ceiling"] = tg_pct(tg_best);
    j["tg_mean_pct_of_read_ceiling"] = tg_pct(tg_mean);
  }
  if (pp_best > 0 && work.total() > 0) {
    for (int t = 0; t < kern::kActTypes; ++t)
      if (work.ops[t] > 0 || t < kern::kLoopTypes) j["pp_matmul_g_ops"][kern::act_type_name(static_cast<kern::ActType>(t))] = work.ops[t] / 1e9;
    j["pp_ideal_s"] = pp_ideal_s();
    j["pp_pct_of_compute_peak"] = pp_pct(pp_best);
    j["pp_mean_pct_of_compute_peak"] = pp_pct(pp_mean);
  }
  if (with_roofline) roof.to_json(j, c);
}

}  // namespace kimi::app
