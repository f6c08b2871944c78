#include "util/numa.h"

#include <algorithm>
#include <cstdlib>

#include "util/error.h"
#include "util/thread_pool.h"

#if defined(KIMI_HAVE_NUMA)
#include <numa.h>
#include <sched.h>
#endif

namespace kimi::numa {

std::optional<Mode> mode_from_name(std::string_view name) {
  if (name == "distribute") return Mode::Distribute;
  if (name == "isolate") return Mode::Isolate;
  if (name == "numactl") return Mode::Numactl;
  return std::nullopt;
}

const char* mode_name(Mode m) {
  switch (m) {
    case Mode::Distribute: return "distribute";
    case Mode::Isolate: return "isolate";
    case Mode::Numactl: return "numactl";
    default: return "none";
  }
}

bool built_with_libnuma() {
#if defined(KIMI_HAVE_NUMA)
  return true;
#else
  return false;
#endif
}

bool available() {
#if defined(KIMI_HAVE_NUMA)
  static const bool ok = numa_available() >= 0;
  return ok;
#else
  return false;
#endif
}

Topology topology() {
  Topology t;
#if defined(KIMI_HAVE_NUMA)
  check(available(), "--numa: the kernel reports no NUMA support (numa_available failed)");
  const std::vector<int> allowed = allowed_cpus();
  const int cur_cpu = sched_getcpu();
  const int cur_node = cur_cpu >= 0 ? numa_node_of_cpu(cur_cpu) : -1;
  bitmask* cpus = numa_allocate_cpumask();
  for (int node = 0; node <= numa_max_node(); ++node) {
    if (!numa_bitmask_isbitset(numa_all_nodes_ptr, static_cast<unsigned>(node))) continue;
    if (numa_node_to_cpus(node, cpus) != 0) continue;
    std::vector<int> v;
    for (int c : allowed)
      if (numa_bitmask_isbitset(cpus, static_cast<unsigned>(c))) v.push_back(c);
    if (v.empty()) continue;  // a memory-only node, or none of its CPUs allowed
    if (node == cur_node) t.current_node = static_cast<int>(t.node_cpus.size());
    t.node_cpus.push_back(std::move(v));
    t.node_ids.push_back(node);
  }
  numa_free_cpumask(cpus);
  check(!t.node_cpus.empty(), "--numa: no NUMA node has a CPU this process may run on");
#else
  fail("--numa: this build has no libnuma (install libnuma-dev, e.g. scripts/setup.sh, and rebuild)");
#endif
  return t;
}

std::vector<int> thread_cpus(Mode mode, const Topology& t, const std::vector<int>& allowed, int n_threads) {
  std::vector<int> out;
  auto cycle = [&](const std::vector<int>& cpus) {
    const size_t n = n_threads > 0 ? static_cast<size_t>(n_threads) : cpus.size();
    for (size_t i = 0; i < n && !cpus.empty(); ++i) out.push_back(cpus[i % cpus.size()]);
  };
  switch (mode) {
    case Mode::None: break;
    case Mode::Numactl: cycle(allowed); break;
    case Mode::Isolate:
      if (!t.node_cpus.empty()) cycle(t.node_cpus[static_cast<size_t>(t.current_node)]);
      break;
    case Mode::Distribute: {
      // contiguous blocks of threads per node, in proportion to the node's CPUs: a thread
      // owns a contiguous range of every parallel loop (ThreadPool), so each node's threads own
      // one contiguous share of every weight's rows
      const size_t nodes = t.node_cpus.size();
      if (nodes == 0) break;
      size_t total = 0;
      for (const auto& v : t.node_cpus) total += v.size();
      const size_t n = n_threads > 0 ? static_cast<size_t>(n_threads) : total;
      std::vector<size_t> used(nodes, 0);
      for (size_t i = 0; i < n; ++i) {
        // nodes get threads in proportion to their CPUs: thread i takes the node that holds
        // position i * total / n of the CPUs listed node after node
        size_t pos = i * total / n, node = 0;
        while (pos >= t.node_cpus[node].size()) pos -= t.node_cpus[node++].size();
        const auto& v = t.node_cpus[node];
        out.push_back(v[used[node]++ % v.size()]);
      }
      break;
    }
  }
  return out;
}

std::vector<int> setup(Mode mode, int n_threads) {
  if (mode == Mode::None) return {};
  const Topology t = topology();  // throws without libnuma / kernel support
#if defined(KIMI_HAVE_NUMA)
  if (mode == Mode::Distribute && t.node_cpus.size() > 1) {
    numa_set_interleave_mask(numa_all_nodes_ptr);
  } else if (mode == Mode::Isolate) {
    numa_set_preferred(t.node_ids[static_cast<size_t>(t.current_node)]);
  }
#endif
  return thread_cpus(mode, t, allowed_cpus(), n_threads);
}

std::vector<int> parse_cpu_list(const std::string& s, const char* what) {
  std::vector<int> out;
  size_t i = 0;
  auto number = [&](int* v) {
    size_t j = i;
    while (j < s.size() && s[j] == ' ') ++j;
    size_t k = j;
    long x = 0;
    while (k < s.size() && s[k] >= '0' && s[k] <= '9' && k - j < 6) x = x * 10 + (s[k++] - '0');
    if (k == j) return false;
    while (k < s.size() && s[k] == ' ') ++k;
    *v = static_cast<int>(x);
    i = k;
    return true;
  };
  const auto bad = [&] { fail("{}: '{}' is not a CPU list like 0-3,8,10-11", what, s); };
  if (s.empty()) bad();
  for (;;) {
    int lo = 0, hi = 0;
    if (!number(&lo)) bad();
    hi = lo;
    if (i < s.size() && s[i] == '-') {
      ++i;
      if (!number(&hi) || hi < lo) bad();
    }
    check(hi < 65536, "{}: CPU {} is out of range", what, hi);
    for (int c = lo; c <= hi; ++c) out.push_back(c);
    if (i == s.size()) break;
    if (s[i] != ',') bad();
    ++i;
  }
  return out;
}

static std::string ranges(const std::vector<int>& cpus) {
  std::string s;
  for (size_t i = 0; i < cpus.size();) {
    size_t j = i;
    while (j + 1 < cpus.size() && cpus[j + 1] == cpus[j] + 1) ++j;
    if (!s.empty()) s += ',';
    s += j > i ? fmt::format("{}-{}", cpus[i], cpus[j]) : fmt::format("{}", cpus[i]);
    i = j + 1;
  }
  return s;
}

std::string describe(Mode mode, const std::vector<int>& cpus) {
  std::string s = fmt::format("threads pinned to CPUs {}", cpus.empty() ? std::string("(none)") : ranges(cpus));
  if (mode != Mode::None) {
    s = fmt::format("numa {}: ", mode_name(mode)) + s;
    if (available()) s += fmt::format(" ({} NUMA node(s) with CPUs)", topology().node_cpus.size());
  }
  return s;
}

}  // namespace kimi::numa
