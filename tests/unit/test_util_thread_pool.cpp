// The thread pool (util/thread_pool.h): every item runs exactly once whatever the item and thread
// counts (more threads than items, more items than threads, more threads than cores), the
// per-thread ranges tile [0, n) in order and in balance, nested calls run on the caller, and
// pinned threads run only on their CPUs. No timing is asserted.
#include <gtest/gtest.h>

#include <atomic>
#include <set>
#include <vector>

#include "util/error.h"
#include "util/thread_pool.h"

#if defined(__linux__)
#include <sched.h>
#endif

using kimi::ThreadPool;

TEST(ThreadPool, EveryItemOnceForAnyCounts) {
  for (int threads : {1, 2, 3, 5}) {
    ThreadPool pool(threads);
    EXPECT_EQ(pool.size(), threads);
    for (int64_t n : {0, 1, 2, 3, 4, 7, 64, 1001}) {
      for (int rep = 0; rep < 3; ++rep) {
        std::vector<std::atomic<int>> hits(static_cast<size_t>(n));
        std::atomic<int> bad_thread{0};
        pool.parallel_for(n, [&](int64_t i, int th) {
          hits[static_cast<size_t>(i)].fetch_add(1);
          if (th < 0 || th >= threads) bad_thread.fetch_add(1);
        });
        for (int64_t i = 0; i < n; ++i) ASSERT_EQ(hits[static_cast<size_t>(i)].load(), 1) << "n " << n << " item " << i;
        EXPECT_EQ(bad_thread.load(), 0);
      }
    }
  }
}

TEST(ThreadPool, OwnedRangesTileInOrderAndBalance) {
  for (int T : {1, 2, 3, 8, 64})
    for (int64_t n : {0, 1, 2, 5, 63, 64, 65, 1000}) {
      int64_t next = 0;
      for (int t = 0; t < T; ++t) {
        const auto [lo, hi] = ThreadPool::owned_range(n, t, T);
        EXPECT_EQ(lo, next) << "T " << T << " n " << n << " t " << t;
        const int64_t size = hi - lo;
        EXPECT_TRUE(size == n / T || size == n / T + 1);
        EXPECT_EQ(size, n / T + (t < n % T ? 1 : 0));  // the first n % T ranges hold one more
        next = hi;
      }
      EXPECT_EQ(next, n);
    }
}

TEST(ThreadPool, RunOnAllGivesEveryIndexOnce) {
  ThreadPool pool(4);
  std::vector<std::atomic<int>> seen(4);
  pool.run_on_all([&](int ti, int n) {
    EXPECT_EQ(n, 4);
    seen[static_cast<size_t>(ti)].fetch_add(1);
  });
  for (auto& s : seen) EXPECT_EQ(s.load(), 1);
}

TEST(ThreadPool, NestedCallRunsOnTheCaller) {
  ThreadPool pool(2);
  std::atomic<int> total{0};
  pool.parallel_for(4, [&](int64_t, int) {
    pool.parallel_for(3, [&](int64_t, int th) {
      EXPECT_EQ(th, 0);  // serial: thread index 0 of the nested loop
      total.fetch_add(1);
    });
  });
  EXPECT_EQ(total.load(), 12);
}

#if defined(__linux__)
TEST(ThreadPool, PinnedThreadsRunOnTheirCpus) {
  const std::vector<int> allowed = kimi::allowed_cpus();
  ASSERT_FALSE(allowed.empty());
  const std::vector<int> cpus = {allowed.back(), allowed.front()};
  std::set<int> on;
  std::mutex mu;
  {
    ThreadPool pool(2, cpus);
    EXPECT_EQ(pool.cpus(), cpus);
    for (int rep = 0; rep < 50; ++rep)
      pool.parallel_for(64, [&](int64_t, int) {
        const int c = sched_getcpu();
        std::lock_guard<std::mutex> lk(mu);
        on.insert(c);
      });
  }
  for (int c : on) EXPECT_TRUE(c == cpus[0] || c == cpus[1]) << "ran on CPU " << c;
  // the calling thread was pinned too (to cpus[0]): give it its whole mask back
  cpu_set_t set;
  CPU_ZERO(&set);
  for (int c : allowed) CPU_SET(c, &set);
  sched_setaffinity(0, sizeof set, &set);
}

TEST(ThreadPool, ACpuOutsideTheMaskIsAnError) {
  try {
    ThreadPool pool(2, {60000});
    FAIL() << "no error";
  } catch (const kimi::Error& e) {
    EXPECT_NE(std::string(e.what()).find("CPU 60000"), std::string::npos) << e.what();
  }
}
#endif
