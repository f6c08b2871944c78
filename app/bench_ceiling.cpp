// `kimi bench`'s ceiling report (bench_ceiling.h).
#include "bench_ceiling.h"

#include <algorithm>
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
}

}  // namespace kimi::app
