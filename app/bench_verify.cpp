// kimi bench --verify-k (app/bench_verify.h).
#include "bench_verify.h"

#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cstdio>
#include <map>
#include <nlohmann/json.hpp>
#include <random>

#include "util/error.h"

namespace kimi::app {

std::vector<int> parse_verify_k(const std::string& s) {
  std::vector<int> ks;
  auto num = [&](const std::string& x) {
    size_t used = 0;
    int v = 0;
    try {
      v = std::stoi(x, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    check(used == x.size() && !x.empty() && v >= 1 && v <= 256,
          "--verify-k: '{}' is not a number of drafted tokens in 1..256 (in '{}')", x, s);
    return v;
  };
  if (const size_t dots = s.find(".."); dots != std::string::npos) {
    const int a = num(s.substr(0, dots)), b = num(s.substr(dots + 2));
    check(a <= b, "--verify-k: empty range '{}'", s);
    for (int k = a; k <= b; ++k) ks.push_back(k);
  } else {
    size_t from = 0;
    while (from <= s.size()) {
      const size_t c = s.find(',', from);
      ks.push_back(num(s.substr(from, c == std::string::npos ? std::string::npos : c - from)));
      if (c == std::string::npos) break;
      from = c + 1;
    }
  }
  std::sort(ks.begin(), ks.end());
  ks.erase(std::unique(ks.begin(), ks.end()), ks.end());
  return ks;
}

namespace {

double vb_median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

struct VbWeights {  // what one forward step reads, by kind
  double fixed = 0;          // every tensor but the routed experts and the embedding table
  double embd_row = 0;       // one token_embd row
  double expert = 0;         // one routed expert of one MoE layer (gate + up + down), mean over layers
  int n_moe_layers = 0;
};

VbWeights vb_weight_bytes(const Model& m) {
  const HParams& hp = m.hparams();
  VbWeights w;
  double experts = 0;
  for (const auto& t : m.reader().tensors()) {
    if (t.name == "token_embd.weight" && t.ne[1] > 0) {
      w.embd_row = double(t.nbytes) / double(t.ne[1]);
    } else if (t.name.size() > 13 && t.name.compare(t.name.size() - 12, 12, "_exps.weight") == 0) {
      experts += double(t.nbytes);
    } else {
      w.fixed += double(t.nbytes);
    }
  }
  for (uint32_t il = 0; il < hp.n_layer; ++il) w.n_moe_layers += hp.is_moe(il) && hp.n_expert > 0;
  if (w.n_moe_layers > 0 && hp.file_experts() > 0) w.expert = experts / (double(w.n_moe_layers) * hp.file_experts());
  return w;
}

}  // namespace

int run_verify_bench(const Model& model, Context& ctx, const VerifyBenchOptions& o) {
  check(!o.ks.empty(), "--verify-k: no k given");
  const int kmax = o.ks.back();
  check(ctx.options().n_ctx_max >= o.depth + kmax + 1,
        "--verify-k: the context ({} positions) is smaller than the depth {} + k {} + 1", ctx.options().n_ctx_max,
        o.depth, kmax);
  const HParams& hp = model.hparams();
  const int V = ctx.n_vocab();
  std::mt19937_64 rng(o.seed);
  auto rand_tokens = [&](int n) {
    std::vector<int32_t> t(static_cast<size_t>(n));
    for (auto& x : t) x = static_cast<int32_t>(rng() % static_cast<uint64_t>(V));
    return t;
  };
  Batch b;
  ctx.seq_clear(0);
  if (o.depth > 0 && o.fill_synthetic) {
    ctx.seq_fill_synthetic(0, o.depth, o.seed);
  } else if (o.depth > 0) {
    b.add_sequence(rand_tokens(o.depth), 0, 0, false);
    ctx.decode(b);
  }
  ctx.seq_snapshot(0);  // every step starts here (KDA states restored by seq_truncate)
  using clk = std::chrono::steady_clock;
  struct Sample {
    std::vector<double> s;  // seconds per step
    uint64_t picks = 0, distinct = 0, steps = 0;
    PhaseTimes phases;      // summed over the timed steps
  };
  std::map<int, Sample> res;  // k -> samples; k = 0: the single-token decode step
  std::vector<int> order{0};
  order.insert(order.end(), o.ks.begin(), o.ks.end());
  auto one = [&](int k, bool timed) {
    b.clear();
    b.add_sequence(rand_tokens(k + 1), 0, o.depth, true, /*logits_all=*/true);
    ctx.reset_phase_times();
    const auto t0 = clk::now();
    ctx.decode(b);
    const double s = std::chrono::duration<double>(clk::now() - t0).count();
    const PhaseTimes pt = ctx.phase_times();
    ctx.seq_truncate(0, o.depth);
    if (!timed) return;
    Sample& r = res[k];
    r.s.push_back(s);
    r.picks += pt.expert_picks;
    r.distinct += pt.expert_distinct;
    for (int p = 0; p < PhaseTimes::Count; ++p) r.phases.s[p] += pt.s[p];
    ++r.steps;
  };
  one(kmax, false);  // warm-up (page faults of the mapped weights, scratch)
  one(0, false);
  for (int rep = 0; rep < o.reps; ++rep)
    for (int k : order) one(k, true);

  const VbWeights w = vb_weight_bytes(model);
  const double row_bytes = double(hp.cache_bytes_per_token(ctx.cache_type())) ;
  const double t1 = vb_median(res[0].s);
  auto step_bytes = [&](int k, const Sample& r) {
    const double distinct_per_step = r.steps ? double(r.distinct) / double(r.steps) : 0.0;
    return w.fixed + (k + 1) * w.embd_row + distinct_per_step * w.expert +
           (o.depth + 0.5 * (k + 1)) * row_bytes;  // cache rows read (dense upper bound; sparse reads top_k)
  };
  const double bytes1 = step_bytes(0, res[0]);
  struct Row {
    int k;
    double med_ms, min_ms, ratio, vs_k_decodes, union_share, bytes, bytes_ratio;
  };
  std::vector<Row> rows;
  for (int k : order) {
    const Sample& r = res[k];
    Row x;
    x.k = k;
    x.med_ms = 1e3 * vb_median(r.s);
    x.min_ms = 1e3 * *std::min_element(r.s.begin(), r.s.end());
    x.ratio = t1 > 0 ? vb_median(r.s) / t1 : 0;
    x.vs_k_decodes = k > 0 && t1 > 0 ? vb_median(r.s) / (k * t1) : 1.0;
    x.union_share = r.picks ? double(r.distinct) / double(r.picks) : 0.0;
    x.bytes = step_bytes(k, r);
    x.bytes_ratio = bytes1 > 0 ? x.bytes / bytes1 : 0;
    rows.push_back(x);
  }
  auto ratio_of = [&](int k) {
    for (const Row& x : rows)
      if (x.k == k) return x.ratio;
    return 0.0;
  };
  // speedup at acceptance length a (tokens kept per verify step; the step emits a + 1): with a
  // draft of exactly a tokens (k = a) and with the largest k measured (a block of k, a of them kept)
  struct Speed {
    int a;
    double at_k_a, at_kmax;
  };
  std::vector<Speed> speed;
  for (int a = 1; a <= 6; ++a) {
    Speed s{a, 0, 0};
    if (const double r = ratio_of(a); r > 0) s.at_k_a = (a + 1) / r;
    if (a <= kmax) s.at_kmax = (a + 1) / ratio_of(kmax);
    speed.push_back(s);
  }
  auto phase_ms = [&](int k) {  // mean ms per step of each part of the forward pass
    nlohmann::ordered_json ph;
    const Sample& r = res[k];
    for (int p = 0; p < PhaseTimes::Count; ++p) ph[PhaseTimes::name(p)] = r.steps ? 1e3 * r.phases.s[p] / double(r.steps) : 0.0;
    return ph;
  };
  if (o.output != "md") {
    nlohmann::ordered_json j;
    j["model"] = o.model_name;
    j["threads"] = ctx.pool().size();
    j["precision"] = o.precision;
    j["depth"] = o.depth;
    j["repetitions"] = o.reps;
    j["decode_ms"] = 1e3 * t1;
    for (const Row& x : rows)
      j["verify"].push_back({{"k", x.k}, {"rows", x.k + 1}, {"ms_median", x.med_ms}, {"ms_min", x.min_ms},
                             {"cost_vs_decode", x.ratio}, {"cost_vs_k_decodes", x.vs_k_decodes},
                             {"expert_union_share", x.union_share}, {"bytes", x.bytes}, {"bytes_vs_decode", x.bytes_ratio},
                             {"phase_ms", phase_ms(x.k)}});
    for (const Speed& s : speed)
      j["speedup"].push_back({{"accept_len", s.a}, {"k_eq_a", s.at_k_a}, {fmt::format("k_{}", kmax), s.at_kmax}});
    std::printf("%s\n", j.dump(o.output == "json" ? 2 : -1).c_str());
    return 0;
  }
  std::printf("verify step of k drafted tokens (k + 1 rows, logits at every row) vs one decode step; %s, %d threads, "
              "precision %s, depth %d, median of %d (min)\n",
              o.model_name.c_str(), ctx.pool().size(), o.precision.c_str(), o.depth, o.reps);
  std::printf("| k | rows | ms (min) | cost / decode step | cost / k decode steps | expert union | MiB read | bytes / decode step |\n");
  std::printf("|---:|---:|---:|---:|---:|---:|---:|---:|\n");
  for (const Row& x : rows)
    std::printf("| %d | %d | %.2f (%.2f) | %.3f | %s | %.3f | %.1f | %.3f |\n", x.k, x.k + 1, x.med_ms, x.min_ms,
                x.ratio, x.k ? fmt::format("{:.3f}", x.vs_k_decodes).c_str() : "-", x.union_share,
                x.bytes / 1048576.0, x.bytes_ratio);
  std::printf("\nms per step by part of the forward pass (mean; the parts scale with the layer counts of a full model):\n|  k |");
  for (int p = 0; p < PhaseTimes::Count; ++p) std::printf(" %s |", PhaseTimes::name(p));
  std::printf("\n|---:|");
  for (int p = 0; p < PhaseTimes::Count; ++p) std::printf("---:|");
  std::printf("\n");
  for (int k : order) {
    const Sample& r = res[k];
    std::printf("| %d |", k);
    for (int p = 0; p < PhaseTimes::Count; ++p) std::printf(" %.2f |", r.steps ? 1e3 * r.phases.s[p] / double(r.steps) : 0.0);
    std::printf("\n");
  }
  std::printf("\nspeedup over plain decoding at acceptance length a (a drafted tokens kept per step, a + 1 emitted; "
              "drafting costs nothing):\n");
  std::printf("| a | draft k = a | draft k = %d |\n|---:|---:|---:|\n", kmax);
  for (const Speed& s : speed)
    std::printf("| %d | %s | %s |\n", s.a, s.at_k_a > 0 ? fmt::format("{:.2f}", s.at_k_a).c_str() : "-",
                s.at_kmax > 0 ? fmt::format("{:.2f}", s.at_kmax).c_str() : "-");
  std::printf("weights: %.1f MiB read once per step + %.2f MiB per distinct routed expert per layer (%d MoE layers, top %u of %u)\n",
              w.fixed / 1048576.0, w.expert / 1048576.0, w.n_moe_layers, hp.n_expert_used, hp.n_expert);
  return 0;
}

int run_spec_bench(const Model& model, Context& ctx, Drafter& drafter, const SpecParams& sp,
                   const SpecBenchOptions& o) {
  (void)model;
  const int V = ctx.n_vocab();
  std::mt19937_64 rng(o.seed);
  std::vector<int32_t> P(static_cast<size_t>(o.n_prompt));
  for (auto& x : P) x = static_cast<int32_t>(rng() % static_cast<uint64_t>(V));
  using clk = std::chrono::steady_clock;
  // one greedy generation of n tokens after prompt (seq 0 cleared first); the tokens and the seconds
  // from the first token to the last
  struct Run {
    std::vector<int32_t> toks;
    double s = 0;
    SpecStats st;
  };
  auto generate = [&](const std::vector<int32_t>& prompt, int n, Drafter* d) {
    Run r;
    ctx.seq_clear(0);
    drafter.reset();
    Batch b;
    b.add_sequence(prompt, 0, 0, true);
    ctx.decode(b);
    Sampler smp({}, V);
    const int32_t first = smp.sample(ctx.logits(b.size() - 1));
    smp.accept(first);
    r.toks.push_back(first);
    Speculator spec(ctx, 0, smp, d, sp);
    spec.start(prompt, first);
    const auto t0 = clk::now();
    while (static_cast<int>(r.toks.size()) < n)
      for (int32_t t : spec.step(n - static_cast<int>(r.toks.size()))) r.toks.push_back(t);
    r.s = std::chrono::duration<double>(clk::now() - t0).count();
    r.st = spec.stats();
    return r;
  };
  const Run g = generate(P, o.n_gen, nullptr);  // G: what the model writes after P (untimed)
  std::vector<int32_t> prompt = P;
  Drafter* d = &drafter;
  struct Oracle final : Drafter {  // drafts the known answer, wrong at block position `wrong`
    std::vector<int32_t> truth;
    int wrong = -1;
    std::string name() const override { return "oracle"; }
    int propose(std::span<const int32_t> t, int n_max, std::vector<int32_t>& draft) override {
      draft.clear();
      if (t.size() >= truth.size() || !std::equal(t.begin(), t.end(), truth.begin())) return 0;
      for (int j = 0; j < n_max && t.size() + static_cast<size_t>(j) < truth.size(); ++j) {
        const int32_t x = truth[t.size() + static_cast<size_t>(j)];
        draft.push_back(j == wrong ? (x + 1) % 1000 : x);
      }
      return static_cast<int>(draft.size());
    }
  } oracle;
  if (o.accept >= 0) {  // P alone; the oracle knows G
    oracle.truth = P;
    oracle.truth.insert(oracle.truth.end(), g.toks.begin(), g.toks.end());
    oracle.wrong = o.accept;
    d = &oracle;
  } else {  // P + G + P: after it the model may write G again, which the n-gram drafter finds
    prompt.insert(prompt.end(), g.toks.begin(), g.toks.end());
    prompt.insert(prompt.end(), P.begin(), P.end());
  }
  generate(prompt, 2, d);  // warm-up
  std::vector<double> plain_tps, spec_tps;
  SpecStats total;
  bool same = true;
  for (int rep = 0; rep < o.reps; ++rep) {
    const Run a = generate(prompt, o.n_gen, nullptr);
    const Run b = generate(prompt, o.n_gen, d);
    same = same && a.toks == b.toks;
    plain_tps.push_back((o.n_gen - 1) / a.s);
    spec_tps.push_back((o.n_gen - 1) / b.s);
    total.add(b.st);
  }
  auto mm = [](const std::vector<double>& v) {
    return std::array<double, 3>{*std::min_element(v.begin(), v.end()), vb_median(v), *std::max_element(v.begin(), v.end())};
  };
  const auto pa = mm(plain_tps), sa = mm(spec_tps);
  if (o.output != "md") {
    nlohmann::ordered_json j;
    j["model"] = o.model_name;
    j["spec"] = o.spec_name;
    if (o.accept >= 0) j["oracle_wrong_at"] = o.accept;
    j["draft_max"] = sp.n_max;
    j["n_prompt"] = prompt.size();
    j["n_gen"] = o.n_gen;
    j["plain_tok_s"] = {{"min", pa[0]}, {"median", pa[1]}, {"max", pa[2]}, {"samples", plain_tps}};
    j["spec_tok_s"] = {{"min", sa[0]}, {"median", sa[1]}, {"max", sa[2]}, {"samples", spec_tps}};
    j["speedup_median"] = sa[1] / pa[1];
    j["same_tokens"] = same;
    j["steps"] = total.steps;
    j["verify_steps"] = total.verify_steps;
    j["drafted"] = total.drafted;
    j["accepted"] = total.accepted;
    j["accept_rate"] = total.accept_rate();
    j["accept_len"] = total.accept_len();
    j["tokens_per_step"] = total.tokens_per_step();
    j["verify_cost_vs_decode"] = total.verify_cost();
    j["recomputed"] = total.recomputed;
    j["paused"] = total.paused;
    std::printf("%s\n", j.dump(o.output == "json" ? 2 : -1).c_str());
    return same ? 0 : 1;
  }
  if (o.accept >= 0)
    std::printf("greedy tg%d after %zu random tokens, drafts of the known answer wrong at block position %d (%d kept "
                "per full step), %d threads, --draft-max %d, %d interleaved repetitions\n",
                o.n_gen, prompt.size(), o.accept, std::min(o.accept, sp.n_max), ctx.pool().size(), sp.n_max, o.reps);
  else
    std::printf("greedy tg%d after a prompt the model repeats (%zu tokens), %d threads, --spec %s --draft-max %d, %d "
                "interleaved repetitions\n",
                o.n_gen, prompt.size(), ctx.pool().size(), o.spec_name.c_str(), sp.n_max, o.reps);
  std::printf("| run | t/s min | median | max |\n|---|---:|---:|---:|\n");
  std::printf("| plain | %.2f | %.2f | %.2f |\n| %s | %.2f | %.2f | %.2f |\n", pa[0], pa[1], pa[2], o.spec_name.c_str(),
              sa[0], sa[1], sa[2]);
  std::printf("speedup (medians) %.2fx; same tokens: %s\n", sa[1] / pa[1], same ? "yes" : "NO");
  std::printf("per repetition: %.1f forward passes for %d tokens (%.2f tokens per pass), %.1f verify steps, "
              "%.1f drafted, %.1f accepted (%.1f %%), %.2f accepted per verify step, %.1f kept tokens decoded "
              "again, %.1f steps paused; verify step %.2fx a plain step\n",
              double(total.steps) / o.reps, o.n_gen - 1, total.tokens_per_step(), double(total.verify_steps) / o.reps,
              double(total.drafted) / o.reps, double(total.accepted) / o.reps, 100.0 * total.accept_rate(),
              total.accept_len(), double(total.recomputed) / o.reps, double(total.paused) / o.reps,
              total.verify_cost());
  return same ? 0 : 1;
}

}  // namespace kimi::app
