// NUMA-aware thread placement and memory policy (llama.cpp's --numa modes), and CPU lists.
//
//   distribute  threads spread round-robin over the NUMA nodes (thread i on node i % nodes, the
//               next free CPU of that node), and memory interleaved page by page over all nodes
//               (set before the model is mapped: the weights' page-cache pages follow the policy
//               of the thread that faults them in, so every node holds a share and every memory
//               controller serves reads)
//   isolate     threads only on the CPUs of the node the process started on, memory preferred
//               on that node
//   numactl     threads on the CPUs the process was started with (`numactl -C/-N ...`), one per
//               CPU in order; the memory policy numactl set is left as it is
//
// The modes need libnuma (Debian libnuma-dev) at build time; a build without it rejects --numa
// with an error saying so (available() is false). CPU pinning alone (--cpu-affinity) needs only
// Linux. On a one-node machine distribute and isolate pin threads to CPUs and change nothing else.
#pragma once
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace kimi::numa {

enum class Mode { None, Distribute, Isolate, Numactl };
std::optional<Mode> mode_from_name(std::string_view name);  // "distribute", "isolate", "numactl"
const char* mode_name(Mode m);

// Whether this build has libnuma and the kernel supports the NUMA calls.
bool available();
bool built_with_libnuma();

struct Topology {
  std::vector<std::vector<int>> node_cpus;  // per node with CPUs: its CPUs (ascending) this process may use
  std::vector<int> node_ids;                // the kernel's id of each node
  int current_node = 0;                     // index (into node_cpus) of the node of the calling thread's CPU
};
Topology topology();  // needs available(); throws kimi::Error otherwise

// The CPU of each of n_threads threads under mode on topology t (pure: no system call), thread 0
// first. allowed: the process's CPUs (for Numactl). n_threads 0 = one per available CPU of the
// mode. CPUs repeat when there are more threads than CPUs.
std::vector<int> thread_cpus(Mode mode, const Topology& t, const std::vector<int>& allowed, int n_threads);

// Applies the memory policy of mode to the calling thread (call before the model is loaded and
// before the thread pool starts: new threads inherit it) and returns the CPUs of thread_cpus.
// Throws kimi::Error naming --numa when the build or the kernel has no NUMA support.
std::vector<int> setup(Mode mode, int n_threads);

// "0-3,8,10-11" -> {0,1,2,3,8,10,11} (order kept, as given); kimi::Error naming `what` otherwise.
std::vector<int> parse_cpu_list(const std::string& s, const char* what = "--cpu-affinity");

// A short description of the placement: "distribute over 2 nodes: node 0 CPUs 0-31, ..."
std::string describe(Mode mode, const std::vector<int>& cpus);

}  // namespace kimi::numa
