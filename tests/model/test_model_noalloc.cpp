// The decode loop allocates nothing: after a warm-up token, further single-token decodes (and
// their logits) make no heap allocation. Counts operator new calls in this binary.
#include <gtest/gtest.h>

#include <atomic>
#include <cstdlib>
#include <new>

#include "engine_fixture.h"
#include "model/model.h"
#include "runtime/context.h"
#include "test_util.h"

#include "count_allocs.h"

using namespace kimi;

TEST(ModelNoAlloc, DecodeLoopDoesNotAllocate) {
  test::TempDir d;
  const std::string path = d.file("tiny.gguf");
  test::write_tiny_gguf(path, test::TinySpec{});
  auto m = Model::load(path);
  // 1 thread and 2 threads: ThreadPool::parallel_for takes callables by reference (no
  // std::function), so neither the engine's nor kern::matmul's pool calls allocate.
  for (int threads : {1, 2}) {
    for (AttnPath p : {AttnPath::Sparse, AttnPath::Dense}) {
      ContextOptions o;
      o.n_threads = threads;
      o.n_ctx_max = 64;
      o.attn = p;
      Context c(*m, o);
      Batch b;
      b.add_sequence({1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20}, 0, 0, true);
      c.decode(b);
      b.clear();
      b.add(21, 0, c.seq_len(0), true);
      c.decode(b);  // warm-up at batch size 1
      const long before = g_allocs.load();
      for (int i = 0; i < 24; ++i) {  // crosses top_k = 16: the indexer selects
        b.entries[0].token = 100 + i;
        b.entries[0].pos = c.seq_len(0);
        c.decode(b);
        ASSERT_NE(c.logits(0), nullptr);
      }
      EXPECT_EQ(g_allocs.load() - before, 0) << "threads " << threads << " path " << int(p);
    }
  }
}
