// NUMA placement (util/numa.h): CPU-list parsing, the CPU of every thread under each --numa mode on
// made-up topologies (written out by hand), and setup() on this machine: it places threads on
// allowed CPUs when the build has libnuma, and says so in its error otherwise.
#include <gtest/gtest.h>

#include <algorithm>
#include <string>
#include <vector>

#include "util/error.h"
#include "util/numa.h"
#include "util/thread_pool.h"

using namespace kimi::numa;
using V = std::vector<int>;

TEST(Numa, ParseCpuList) {
  EXPECT_EQ(parse_cpu_list("0-3,8,10-11"), (V{0, 1, 2, 3, 8, 10, 11}));
  EXPECT_EQ(parse_cpu_list("5"), (V{5}));
  EXPECT_EQ(parse_cpu_list(" 7 , 2-3 "), (V{7, 2, 3}));  // order as given
  for (const char* bad : {"", "a", "3-1", "1,", ",1", "-1", "1-", "1;2", "1-2-3"}) {
    try {
      parse_cpu_list(bad);
      ADD_FAILURE() << "accepted '" << bad << "'";
    } catch (const kimi::Error& e) {
      EXPECT_NE(std::string(e.what()).find("--cpu-affinity"), std::string::npos) << e.what();
    }
  }
  EXPECT_THROW(parse_cpu_list("70000"), kimi::Error);
}

TEST(Numa, ModeNames) {
  EXPECT_EQ(mode_from_name("distribute"), Mode::Distribute);
  EXPECT_EQ(mode_from_name("isolate"), Mode::Isolate);
  EXPECT_EQ(mode_from_name("numactl"), Mode::Numactl);
  EXPECT_FALSE(mode_from_name("mirror").has_value());
  EXPECT_STREQ(mode_name(Mode::Distribute), "distribute");
}

TEST(Numa, ThreadCpusPerMode) {
  Topology t;  // two sockets of four CPUs; the process started on node 1
  t.node_cpus = {{0, 1, 2, 3}, {4, 5, 6, 7}};
  t.node_ids = {0, 1};
  t.current_node = 1;
  const V allowed = {0, 1, 2, 3, 4, 5, 6, 7};
  // distribute: contiguous blocks of threads per node
  EXPECT_EQ(thread_cpus(Mode::Distribute, t, allowed, 0), (V{0, 1, 2, 3, 4, 5, 6, 7}));
  EXPECT_EQ(thread_cpus(Mode::Distribute, t, allowed, 4), (V{0, 1, 4, 5}));
  EXPECT_EQ(thread_cpus(Mode::Distribute, t, allowed, 3), (V{0, 1, 4}));
  EXPECT_EQ(thread_cpus(Mode::Distribute, t, allowed, 12), (V{0, 1, 2, 3, 0, 1, 4, 5, 6, 7, 4, 5}));
  // isolate: the starting node only
  EXPECT_EQ(thread_cpus(Mode::Isolate, t, allowed, 0), (V{4, 5, 6, 7}));
  EXPECT_EQ(thread_cpus(Mode::Isolate, t, allowed, 6), (V{4, 5, 6, 7, 4, 5}));
  // numactl: the CPUs the process was given, in order
  EXPECT_EQ(thread_cpus(Mode::Numactl, t, {2, 3}, 3), (V{2, 3, 2}));
  EXPECT_EQ(thread_cpus(Mode::Numactl, t, {2, 3}, 0), (V{2, 3}));
  EXPECT_TRUE(thread_cpus(Mode::None, t, allowed, 4).empty());
  // unequal nodes: threads in proportion to the CPUs
  Topology u;
  u.node_cpus = {{0, 1}, {8, 9, 10, 11, 12, 13}};
  u.node_ids = {0, 3};
  EXPECT_EQ(thread_cpus(Mode::Distribute, u, allowed, 0), (V{0, 1, 8, 9, 10, 11, 12, 13}));  // one per CPU
  EXPECT_EQ(thread_cpus(Mode::Distribute, u, allowed, 4), (V{0, 8, 9, 10}));  // 2 : 6 CPUs
}

TEST(Numa, SetupOnThisMachine) {
  EXPECT_TRUE(setup(Mode::None, 4).empty());
  if (!built_with_libnuma()) {
    try {
      setup(Mode::Distribute, 2);
      FAIL() << "no error without libnuma";
    } catch (const kimi::Error& e) {
      EXPECT_NE(std::string(e.what()).find("libnuma"), std::string::npos) << e.what();
    }
    return;
  }
  if (!available()) GTEST_SKIP() << "the kernel reports no NUMA support";
  const V allowed = kimi::allowed_cpus();
  for (Mode m : {Mode::Distribute, Mode::Isolate, Mode::Numactl}) {
    const V cpus = setup(m, 3);
    ASSERT_EQ(cpus.size(), 3u) << mode_name(m);
    for (int c : cpus) EXPECT_NE(std::find(allowed.begin(), allowed.end(), c), allowed.end()) << c;
  }
  EXPECT_EQ(setup(Mode::Numactl, 0), allowed);
  const Topology t = topology();
  size_t total = 0;
  for (const auto& v : t.node_cpus) total += v.size();
  EXPECT_EQ(total, allowed.size());
  EXPECT_NE(describe(Mode::Distribute, {0, 1}).find("numa distribute: threads pinned to CPUs 0-1"), std::string::npos);
}
