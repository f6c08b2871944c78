// kimi bench: prompt processing (pp) and token generation (tg) speed, optionally at a context
// depth, mean +- sd over repetitions.
#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <memory>
#include <nlohmann/json.hpp>
#include <random>
#include <sys/resource.h>

#include "bench_ceiling.h"
#include "bench_verify.h"
#include "command.h"
#include "dist_report.h"
#include "engine_args.h"
#include "model/model.h"
#include "runtime/context.h"
#ifdef KIMI_HAVE_VULKAN
#include "backend/vulkan/vulkan_backend.h"
#endif
#include "util/error.h"

namespace {

struct Stat {
  double mean = 0, sd = 0;
};
Stat stats(const std::vector<double>& v) {
  Stat s;
  if (v.empty()) return s;
  for (double x : v) s.mean += x;
  s.mean /= double(v.size());
  if (v.size() > 1) {
    for (double x : v) s.sd += (x - s.mean) * (x - s.mean);
    s.sd = std::sqrt(s.sd / double(v.size() - 1));
  }
  return s;
}

// The roofline of the timed prefill passes (bench_ceiling.h): their work at this micro-batch, depth, precision
// and attention path, and the phase times summed over the reps.
kimi::app::RooflineReport pp_roofline(const kimi::Model& model, const kimi::Context& ctx, const kimi::app::EngineArgs& ea,
                                      int n_prompt, int n_ubatch, int depth, const kimi::PhaseTimes& sum,
                                      const std::vector<double>& pp_tps) {
  kimi::app::RoofInputs in;
  in.n_prompt = n_prompt;
  in.n_ubatch = n_ubatch;
  in.depth = depth;
  in.prec = ea.precision == "f32" ? kimi::Precision::F32 : kimi::Precision::Fast;
  in.top_k = ctx.effective_top_k();
  in.sparse = ea.attn != "dense";
  in.cache_elem_bytes = ctx.cache_type() == kimi::CacheType::F16 ? 2.0 : 4.0;
  const bool key_i8 = ea.indexer_int8 && ea.precision == "fast";
  in.idx_key_bytes = key_i8 ? double(model.hparams().idx_dim + 8) : in.cache_elem_bytes * model.hparams().idx_dim;
  double best_s = 0, mean_s = 0;  // pass times (the mean of the times, not of the rates)
  for (double tps : pp_tps) {
    const double s = n_prompt / tps;
    best_s = best_s > 0 ? std::min(best_s, s) : s;
    mean_s += s / double(pp_tps.size());
  }
  return kimi::app::make_roofline(model, in, sum, static_cast<int>(pp_tps.size()), best_s, mean_s);
}

int cmd_bench(int argc, char** argv) {
  CLI::App app{"Benchmark prompt processing (pp) and generation (tg) speed"};
  kimi::app::EngineArgs ea;
  kimi::app::add_engine_options(app, ea);
  int n_prompt = 512, n_gen = 128, depth = 0, reps = 3;
  bool json = false, no_ceiling = false, no_warmup = false;
  std::string fill = "prefill";
  uint64_t seed = 1;
  app.add_option("-p,--n-prompt", n_prompt, "prompt tokens (0 = skip pp)")->check(CLI::Range(0, 1 << 24));
  app.add_option("-n,--n-gen", n_gen, "generated tokens (0 = skip tg)")->check(CLI::Range(0, 1 << 24));
  app.add_option("-d,--depth", depth, "context depth to fill first (random tokens, batched prefill)")
      ->check(CLI::Range(0, 1 << 24));
  app.add_option("-r,--repetitions", reps, "repetitions")->check(CLI::Range(1, INT32_MAX));
  app.add_option("--fill", fill,
                 "how the depth is filled: prefill (random tokens through the model, untimed) or synthetic "
                 "(random cache rows, no forward pass: times decode at a depth without the prefill cost)")
      ->check(CLI::IsMember({"prefill", "synthetic"}));
  app.add_option("--seed", seed, "seed of the random tokens");
  app.add_flag("--no-ceiling", no_ceiling,
               "skip measuring the machine's read bandwidth and compute peak after the runs (~0.5 s; the "
               "report gives decode as % of the read ceiling and prefill as % of the compute peak; with "
               "--device vulkan the device's read bandwidth and f32 FMA rate instead, and the device's share)");
  app.add_flag("--no-warmup", no_warmup,
               "time the first pass too (by default one untimed pass of the prompt and one generated token runs "
               "first, as llama-bench does: a process's first pass pays the page faults of the mapped weights)");
  app.add_flag("--json", json, "print JSON instead of a table (= -o json)");
  std::string output = "md";
  app.add_option("-o,--output", output, "output format (llama-bench's): md (table), json, jsonl (one line)")
      ->check(CLI::IsMember({"md", "json", "jsonl"}));
  std::string verify_k;
  app.add_option("--verify-k", verify_k,
                 "measure speculative verify steps instead (docs/speculative.md): for each k (e.g. 1..8 or 1,2,4), "
                 "one forward pass of k + 1 tokens with logits at every row against one decode step at depth -d, "
                 "the expert-union share, the bytes read and the speedup at acceptance lengths 1-6 (-r repetitions, "
                 "interleaved)");
  kimi::app::SpecArgs sa;
  kimi::app::add_spec_options(app, sa);
  int spec_accept = -1;
  app.add_option("--spec-accept", spec_accept,
                 "with --spec: draft the answer a plain run gave, wrong at this block position (>= --draft-max: "
                 "always right), to measure the speedup at a known acceptance length")
      ->check(CLI::Range(0, 256));
  if (int rc = kimi::app::parse_engine_cli(app, argc, argv); rc >= 0) return rc;
  if (json && !app.count("--output")) output = "json";
  kimi::check(spec_accept < 0 || sa.type != "off", "--spec-accept needs --spec");
  if (sa.type != "off") {  // greedy generation with and without speculation (docs/speculative.md)
    kimi::check(verify_k.empty(), "give one of --verify-k and --spec");
    const kimi::SpecParams sp = kimi::app::spec_params(sa);
    auto model = kimi::Model::load(ea.model, kimi::app::model_options(ea));
    const int n_ctx_spec = 2 * n_prompt + 2 * n_gen + sa.draft_max + 2;
    std::unique_ptr<kimi::Drafter> drafter = kimi::app::make_drafter(sa, *model, n_ctx_spec + 64, ea.threads);
    kimi::ContextOptions co = kimi::app::context_options(ea, n_ctx_spec,
                                                         std::max(1, std::min(ea.batch, 2 * n_prompt + n_gen)));
    co.n_batch_max = std::max(co.n_batch_max, 3 * sp.n_max + 2);
    co.n_snapshots_max += 1;
    kimi::Context ctx(*model, co);
    kimi::app::print_engine_summary(ea, ctx);
    ctx.set_tap_layers({drafter->tap_layers().begin(), drafter->tap_layers().end()});
    kimi::app::SpecBenchOptions so;
    so.n_prompt = std::max(n_prompt, 1);
    so.n_gen = std::max(n_gen, 2);
    so.reps = reps;
    so.seed = seed;
    so.output = output;
    so.model_name = ea.model;
    so.spec_name = sa.type;
    so.accept = spec_accept;
    return kimi::app::run_spec_bench(*model, ctx, *drafter, sp, so);
  }
  if (!verify_k.empty()) {
    kimi::app::VerifyBenchOptions vo;
    vo.ks = kimi::app::parse_verify_k(verify_k);
    vo.depth = depth;
    vo.fill_synthetic = fill == "synthetic";
    vo.reps = reps;
    vo.seed = seed;
    vo.output = output;
    vo.model_name = ea.model;
    vo.precision = ea.precision;
    auto model = kimi::Model::load(ea.model, kimi::app::model_options(ea));
    const int kmax = vo.ks.back();
    kimi::Context ctx(*model, kimi::app::context_options(ea, depth + kmax + 2, std::max(kmax + 1, std::min(ea.batch, std::max(depth, 1)))));
    kimi::app::print_engine_summary(ea, ctx);
    return kimi::app::run_verify_bench(*model, ctx, vo);
  }

  auto model = kimi::Model::load(ea.model, kimi::app::model_options(ea));
  const int n_ctx = depth + std::max(n_prompt, n_gen) + 1;
  const int n_ubatch = std::max(1, std::min(ea.batch, std::max(n_prompt, std::max(depth, 1))));
  kimi::Context ctx(*model, kimi::app::context_options(ea, n_ctx, n_ubatch));
  kimi::app::print_engine_summary(ea, ctx);
  std::mt19937_64 rng(seed);
  const int V = ctx.n_vocab();
  auto rand_tokens = [&](int n) {
    std::vector<int32_t> t(static_cast<size_t>(n));
    for (auto& x : t) x = static_cast<int32_t>(rng() % static_cast<uint64_t>(V));
    return t;
  };
  using clk = std::chrono::steady_clock;
  auto cpu_s = [] {  // user + system CPU seconds of the process
    rusage ru{};
    getrusage(RUSAGE_SELF, &ru);
    return double(ru.ru_utime.tv_sec + ru.ru_stime.tv_sec) + 1e-6 * double(ru.ru_utime.tv_usec + ru.ru_stime.tv_usec);
  };
  std::vector<double> pp, tg;
  // accelerators: host <-> device bytes moved and device memory held (BackendStats)
  const std::vector<kimi::Backend*> accels = kimi::app::open_accelerators(ea);
  auto moved = [&] {
    uint64_t b = 0;
    for (kimi::Backend* be : accels) b += be->stats().bytes_to_device + be->stats().bytes_from_device;
    return b;
  };
  uint64_t pp_moved = 0, tg_moved = 0;
  double pp_cpu = 0, pp_wall = 0, tg_cpu = 0, tg_wall = 0;
  kimi::PhaseTimes pp_phase, tg_phase;  // wall time per part of the forward pass, summed over reps
  auto add_phases = [&](kimi::PhaseTimes& sum) {
    const kimi::PhaseTimes t = ctx.phase_times();
    for (int p = 0; p < kimi::PhaseTimes::Count; ++p) sum.s[p] += t.s[p];
  };
  kimi::ExpertStreamStats pp_xs = ctx.expert_stream_stats().minus(ctx.expert_stream_stats()), tg_xs = pp_xs;
  kimi::Batch b;
  kimi::app::RankTrafficSum rank_traffic;  // under mpirun: per-rank bytes and exchanges of tg
  if (!no_warmup && (n_prompt > 0 || n_gen > 0)) {  // untimed; its random tokens come from their own seed
    std::mt19937_64 wrng(seed ^ 0x9e3779b97f4a7c15ull);
    const int nw = n_prompt > 0 ? n_prompt : 1;
    std::vector<int32_t> w(static_cast<size_t>(nw));
    for (auto& x : w) x = static_cast<int32_t>(wrng() % static_cast<uint64_t>(V));
    ctx.seq_clear(0);
    b.clear();
    b.add_sequence(w, 0, 0, true);
    ctx.decode(b);
    if (n_prompt > 0 && n_gen > 0) {
      b.clear();
      b.add(w[0], 0, nw, true);
      ctx.decode(b);
    }
    ctx.seq_clear(0);
  }
  for (int r = 0; r < reps; ++r) {
    ctx.seq_clear(0);
    if (depth > 0 && fill == "synthetic") {
      ctx.seq_fill_synthetic(0, depth, seed + static_cast<uint64_t>(r));
    } else if (depth > 0) {
      b.clear();
      b.add_sequence(rand_tokens(depth), 0, 0, false);
      ctx.decode(b);
    }
    ctx.seq_snapshot(0);
    if (n_prompt > 0) {
      b.clear();
      b.add_sequence(rand_tokens(n_prompt), 0, depth, true);
      const double c0 = cpu_s();
      const uint64_t m0 = moved();
      ctx.reset_phase_times();
      const kimi::ExpertStreamStats x0 = ctx.expert_stream_stats();
      auto t0 = clk::now();
      ctx.decode(b);
      const double w = std::chrono::duration<double>(clk::now() - t0).count();
      add_phases(pp_phase);
      pp_xs.add(ctx.expert_stream_stats().minus(x0));
      pp_moved += moved() - m0;
      pp.push_back(n_prompt / w);
      pp_wall += w;
      pp_cpu += cpu_s() - c0;
      ctx.seq_truncate(0, depth);
    }
    if (n_gen > 0) {
      auto toks = rand_tokens(n_gen);
      rank_traffic.start(ctx);
      const double c0 = cpu_s();
      const uint64_t m0 = moved();
      ctx.reset_phase_times();
      const kimi::ExpertStreamStats x0 = ctx.expert_stream_stats();
      auto t0 = clk::now();
      for (int i = 0; i < n_gen; ++i) {
        b.clear();
        b.add(toks[static_cast<size_t>(i)], 0, depth + i, true);
        ctx.decode(b);
      }
      const double w = std::chrono::duration<double>(clk::now() - t0).count();
      tg_xs.add(ctx.expert_stream_stats().minus(x0));
      tg.push_back(n_gen / w);
      add_phases(tg_phase);
      tg_moved += moved() - m0;
      tg_wall += w;
      tg_cpu += cpu_s() - c0;
      rank_traffic.stop(ctx);
    }
  }
  const std::string attn = ctx.effective_top_k() == 0 ? std::string("no-indexer") : ea.attn;
  const Stat sp = stats(pp), sg = stats(tg);
  // what a decoded token reads: weights (routed experts: k of E) + cache rows at this depth
  const kimi::HParams& hp = model->hparams();
  const double wbytes = double(model->decode_weight_bytes_per_token());
  const int topk = ctx.effective_top_k();
  const double es = ctx.cache_type() == kimi::CacheType::F16 ? 2.0 : 4.0;
  const double vis = depth + 0.5 * n_gen;  // mean visible positions during tg
  const double rows = topk > 0 && ea.attn == "sparse" ? std::min<double>(vis, topk) : vis;
  const bool key_i8 = ea.indexer_int8 && ea.precision == "fast";
  const double kb = key_i8 ? double(hp.idx_dim + 8) : es * double(hp.idx_dim);  // bytes per indexer key
  const double cbytes = hp.n_mla_layers() * (es * rows * hp.mla_row() + (topk > 0 ? vis * kb : 0.0));
  const double best_tg = tg.empty() ? 0.0 : *std::max_element(tg.begin(), tg.end());
  const double best_pp = pp.empty() ? 0.0 : *std::max_element(pp.begin(), pp.end());
  // the ceilings, measured now on the model's threads (backend/cpu/ceiling.h; CPU runs only)
  kimi::app::CeilingReport ceiling;
  const bool with_ceiling = !no_ceiling && accels.empty();
  if (with_ceiling) {
    ceiling.c = kimi::kern::measure_ceiling(ctx.pool());
    ceiling.tg_bytes_per_token = wbytes + cbytes;
    ceiling.tg_best = best_tg;
    ceiling.tg_mean = sg.mean;
    ceiling.pp_best = best_pp;
    ceiling.pp_mean = sp.mean;
    ceiling.n_prompt = n_prompt;
    ceiling.work = kimi::app::prefill_work(*model, n_prompt, ea.precision == "f32" ? kimi::Precision::F32 : kimi::Precision::Fast);
    if (n_prompt > 0 && !pp.empty()) {
      ceiling.with_roofline = true;
      ceiling.roof = pp_roofline(*model, ctx, ea, n_prompt, n_ubatch, depth, pp_phase, pp);
    }
  }
  // accelerators: their own ceilings, measured now, and the share of the run their weights are
  struct DevReport {
    std::string name;
    kimi::DeviceCeiling c;
    kimi::app::DeviceShare share;
  };
  std::vector<DevReport> dev_reports;
#ifdef KIMI_HAVE_VULKAN
  if (!no_ceiling)
    for (size_t i = 0; i < accels.size(); ++i) {
      DevReport r;
      r.name = accels[i]->name();
      r.c = kimi::measure_vulkan_ceiling(*accels[i]);
      if (r.c.read_bytes_per_s <= 0) continue;
      r.share = kimi::app::device_share(*model, ctx.placement(), static_cast<int>(i) + 1, n_prompt);
      if (tg_xs.hot_per_layer > 0 && tg_xs.hot_device == r.name) {
        // --gpu-experts: the device also ran its share of the picks of the experts placed on the CPU
        const kimi::app::DeviceShare host = kimi::app::device_share(*model, ctx.placement(), 0, n_prompt);
        r.share.tg_bytes_per_token += tg_xs.hot_share() * host.tg_expert_bytes_per_token;
        r.share.pp_flops += pp_xs.hot_share() * host.pp_expert_flops;
      }
      dev_reports.push_back(r);
    }
#endif
  auto dev_tg_pct = [&](const DevReport& r) {
    return r.c.read_bytes_per_s > 0 ? 100.0 * best_tg * r.share.tg_bytes_per_token / r.c.read_bytes_per_s : 0.0;
  };
  auto dev_pp_pct = [&](const DevReport& r) {
    return r.c.fma_flops > 0 && best_pp > 0 ? 100.0 * r.share.pp_flops / n_prompt * best_pp / r.c.fma_flops : 0.0;
  };
  rusage ru{};
  getrusage(RUSAGE_SELF, &ru);
  const double rss_mib = double(ru.ru_maxrss) / 1024.0;  // ru_maxrss is KiB on Linux
  if (output != "md") {
    nlohmann::ordered_json j;
    j["model"] = ea.model;
    j["threads"] = ctx.pool().size();
    j["attn"] = attn;
    j["top_k"] = ctx.effective_top_k();
    j["precision"] = ea.precision;
    j["depth"] = depth;
    j["repetitions"] = reps;
    j["warmup"] = !no_warmup;
    if (n_prompt > 0) j["pp"] = {{"n", n_prompt}, {"tok_s", sp.mean}, {"sd", sp.sd}, {"samples", pp}};
    if (n_gen > 0) j["tg"] = {{"n", n_gen}, {"tok_s", sg.mean}, {"sd", sg.sd}, {"samples", tg}};
    if (n_prompt > 0) j["pp_cpu_s_per_wall_s"] = pp_wall > 0 ? pp_cpu / pp_wall : 0.0;
    if (n_gen > 0) j["tg_cpu_s_per_wall_s"] = tg_wall > 0 ? tg_cpu / tg_wall : 0.0;
    j["weight_bytes_per_token"] = wbytes;
    j["cache_bytes_per_token"] = cbytes;
    j["tg_best_read_gb_s"] = best_tg * (wbytes + cbytes) / 1e9;
    j["peak_rss_mib"] = rss_mib;
    for (kimi::Backend* be : accels) {
      const kimi::BackendStats s = be->stats();
      j["devices"].push_back({{"name", be->name()}, {"device_bytes", s.device_bytes}, {"weight_bytes", s.weight_bytes}});
    }
    if (!accels.empty()) {
      if (n_prompt > 0) j["pp_host_device_bytes_per_token"] = double(pp_moved) / (double(n_prompt) * reps);
      if (n_gen > 0) j["tg_host_device_bytes_per_token"] = double(tg_moved) / (double(n_gen) * reps);
    }
    auto phases_json = [&](const kimi::PhaseTimes& t, double tokens) {
      nlohmann::ordered_json o;
      for (int p = 0; p < kimi::PhaseTimes::Count; ++p) o[kimi::PhaseTimes::name(p)] = 1e3 * t.s[p] / tokens;
      return o;
    };
    if (n_prompt > 0) j["pp_phase_ms_per_token"] = phases_json(pp_phase, double(n_prompt) * reps);
    if (n_gen > 0) j["tg_phase_ms_per_token"] = phases_json(tg_phase, double(n_gen) * reps);
    if (pp_xs.enabled) {
      auto xs_json = [](const kimi::ExpertStreamStats& x, double wall) {
        return nlohmann::ordered_json{{"lookups", x.lookups}, {"hit_rate", x.hit_rate()},
                                      {"bytes_read", x.bytes_read}, {"read_mb_s", wall > 0 ? x.bytes_read * 1e-6 / wall : 0.0},
                                      {"wait_s", x.wait_s}, {"bypass_calls", x.bypass_calls}};
      };
      j["expert_stream"] = {{"mode", pp_xs.mode == kimi::StreamMode::Pread ? "pread" : "madvise"},
                            {"budget_bytes", pp_xs.budget_bytes}, {"slots", pp_xs.slots}};
      if (n_prompt > 0) j["expert_stream"]["pp"] = xs_json(pp_xs, pp_wall);
      if (n_gen > 0) j["expert_stream"]["tg"] = xs_json(tg_xs, tg_wall);
    }
    if (pp_xs.hot_per_layer > 0) {
      j["hot_experts"] = {{"device", pp_xs.hot_device}, {"per_layer", pp_xs.hot_per_layer}};
      if (n_prompt > 0) j["hot_experts"]["pp_share"] = pp_xs.hot_share();
      if (n_gen > 0) j["hot_experts"]["tg_share"] = tg_xs.hot_share();
    }
    if (!pp_xs.offload_plan.empty()) {  // prefill offload (docs/gpu.md): what ran on the device, what was uploaded
      auto off_json = [](const kimi::ExpertStreamStats& x) {
        return nlohmann::ordered_json{{"steps", x.offload_steps}, {"declined", x.offload_declined},
                                      {"picks", x.offload_picks}, {"bytes_uploaded", x.offload_bytes},
                                      {"chunks", x.offload_chunks}};
      };
      j["moe_offload"] = {{"device", pp_xs.offload_device}, {"plan", pp_xs.offload_plan}};
      if (n_prompt > 0) j["moe_offload"]["pp"] = off_json(pp_xs);
      if (n_gen > 0) j["moe_offload"]["tg"] = off_json(tg_xs);
    }
    rank_traffic.to_json(j, double(n_gen) * reps);
    if (with_ceiling) ceiling.to_json(j);
    for (const DevReport& r : dev_reports) {
      nlohmann::ordered_json d{{"device", r.name},
                               {"name", r.c.device},
                               {"read_gb_s", r.c.read_bytes_per_s / 1e9},
                               {"read_buffer_mib", double(r.c.read_buffer_bytes) / 1048576.0},
                               {"f32_fma_tflop_s", r.c.fma_flops / 1e12},
                               {"seconds", r.c.seconds},
                               {"tg_device_bytes_per_token", r.share.tg_bytes_per_token},
                               {"pp_device_flops_per_token", n_prompt > 0 ? r.share.pp_flops / n_prompt : 0.0}};
      if (n_gen > 0) d["tg_pct_of_device_read"] = dev_tg_pct(r);
      if (n_prompt > 0) d["pp_pct_of_device_fma"] = dev_pp_pct(r);
      j["device_ceilings"].push_back(d);
    }
    std::printf("%s\n", j.dump(output == "json" ? 2 : -1).c_str());
    return 0;
  }
  std::printf("| %-28s | %7s | %-10s | %-9s | %14s | %20s |\n", "model", "threads", "attn", "precision", "test",
              "t/s");
  std::printf("|%s|%s|%s|%s|%s|%s|\n", std::string(30, '-').c_str(), std::string(9, '-').c_str(),
              std::string(12, '-').c_str(), std::string(11, '-').c_str(), std::string(16, '-').c_str(),
              std::string(22, '-').c_str());
  std::string name = ea.model;
  if (name.size() > 28) name = "..." + name.substr(name.size() - 25);
  auto row = [&](const char* kind, int n, const Stat& s) {
    const std::string test = fmt::format("{}{}{}", kind, n, depth ? fmt::format(" @ d{}", depth) : "");
    std::printf("| %-28s | %7d | %-10s | %-9s | %14s | %20s |\n", name.c_str(), ctx.pool().size(), attn.c_str(),
                ea.precision.c_str(), test.c_str(), fmt::format("{:.2f} ± {:.2f}", s.mean, s.sd).c_str());
  };
  if (n_prompt > 0) row("pp", n_prompt, sp);
  if (n_gen > 0) row("tg", n_gen, sg);
  rank_traffic.print(stdout, double(n_gen) * reps);
  std::printf("weights read per decoded token: %.1f MiB; cache read per token at this depth: %.2f MiB; peak RSS %.0f MiB\n",
              wbytes / 1048576.0, cbytes / 1048576.0, rss_mib);
  if (n_prompt > 0)
    std::printf("pp: best %.2f t/s, CPU %.2f s over %.2f s wall (%.2f cores busy)\n", best_pp, pp_cpu, pp_wall,
                pp_wall > 0 ? pp_cpu / pp_wall : 0.0);
  if (n_gen > 0)
    std::printf("tg: best %.2f t/s = %.2f GB/s of weight + cache reads, CPU %.2f s over %.2f s wall (%.2f cores busy)\n",
                best_tg, best_tg * (wbytes + cbytes) / 1e9, tg_cpu, tg_wall, tg_wall > 0 ? tg_cpu / tg_wall : 0.0);
  auto print_phases = [&](const char* kind, const kimi::PhaseTimes& t, double tokens) {
    const double tot = t.total();
    if (tot <= 0) return;
    std::string line;
    for (int p = 0; p < kimi::PhaseTimes::Count; ++p)
      if (t.s[p] > 0)
        line += fmt::format(" {} {:.3f} ({:.0f} %)", kimi::PhaseTimes::name(p), 1e3 * t.s[p] / tokens, 100.0 * t.s[p] / tot);
    std::printf("%s phases, ms per token:%s\n", kind, line.c_str());
  };
  if (n_prompt > 0) print_phases("pp", pp_phase, double(n_prompt) * reps);
  if (n_gen > 0) print_phases("tg", tg_phase, double(n_gen) * reps);
  if (pp_xs.enabled && n_prompt > 0) std::printf("pp: %s\n", pp_xs.summary(pp_wall).c_str());
  if (pp_xs.enabled && n_gen > 0) std::printf("tg: %s\n", tg_xs.summary(tg_wall).c_str());
  if (pp_xs.hot_per_layer > 0 && n_prompt > 0) std::printf("pp: %s\n", pp_xs.hot_summary().c_str());
  if (tg_xs.hot_per_layer > 0 && n_gen > 0) std::printf("tg: %s\n", tg_xs.hot_summary().c_str());
  if (pp_xs.offload_steps + pp_xs.offload_declined > 0 && n_prompt > 0)
    std::printf("pp: %s\n", pp_xs.offload_summary().c_str());
  if (tg_xs.offload_steps + tg_xs.offload_declined > 0 && n_gen > 0)
    std::printf("tg: %s\n", tg_xs.offload_summary().c_str());
  for (kimi::Backend* be : accels) {
    const kimi::BackendStats s = be->stats();
    std::printf("device %s: %.1f MiB held (weights %.1f MiB), %llu submits; command buffers %llu recorded (%.2f ms), "
                "%llu replayed\n",
                be->name(), s.device_bytes / 1048576.0, s.weight_bytes / 1048576.0,
                static_cast<unsigned long long>(s.submits), static_cast<unsigned long long>(s.cmd_recorded),
                s.record_seconds * 1e3, static_cast<unsigned long long>(s.cmd_replayed));
  }
  if (with_ceiling) ceiling.print(stdout);
  for (const DevReport& r : dev_reports) {
    std::printf("device %s ceiling (%s, measured now in %.2f s): read %.4g GB/s (%.0f MiB buffer), f32 FMA %.3g TFLOP/s\n",
                r.name.c_str(), r.c.device.c_str(), r.c.seconds, r.c.read_bytes_per_s / 1e9,
                double(r.c.read_buffer_bytes) / 1048576.0, r.c.fma_flops / 1e12);
    if (n_gen > 0)
      std::printf("tg on %s: its weights %.2f MiB per token, %.3g GB/s at the best rep = %.2f %% of the device's read "
                  "bandwidth\n",
                  r.name.c_str(), r.share.tg_bytes_per_token / 1048576.0, best_tg * r.share.tg_bytes_per_token / 1e9,
                  dev_tg_pct(r));
    if (n_prompt > 0)
      std::printf("pp on %s: its matmul work %.3g GFLOP per token, %.3g TFLOP/s at the best rep = %.2f %% of the device's "
                  "f32 FMA peak\n",
                  r.name.c_str(), r.share.pp_flops / n_prompt / 1e9, r.share.pp_flops / n_prompt * best_pp / 1e12,
                  dev_pp_pct(r));
  }
  if (!accels.empty())
    std::printf("host<->device traffic: %.1f KiB per prompt token, %.1f KiB per generated token\n",
                n_prompt > 0 ? pp_moved / 1024.0 / (double(n_prompt) * reps) : 0.0,
                n_gen > 0 ? tg_moved / 1024.0 / (double(n_gen) * reps) : 0.0);
  return 0;
}

kimi::app::Registrar reg_bench("bench", "measure prompt and generation speed", cmd_bench);

}  // namespace
