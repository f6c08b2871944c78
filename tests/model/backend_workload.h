// The workload the multi-backend tests run on a tiny model (test_model_backend_split.cpp,
// test_model_vulkan*.cpp), and their greedy decode: prefill in three micro-batches, decode, a second sequence interleaved
// with the first one's decode, a snapshot + truncate and a sequence copy; every logits row kept.
#pragma once
#include <algorithm>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "engine_fixture.h"
#include "model/model.h"
#include "runtime/context.h"
#include "test_util.h"

namespace kimi::test {

struct Run {
  std::vector<std::vector<float>> logits;  // every logits row, in request order
};

// prefill seq 0, decode, a second sequence interleaved with seq 0's decode, a snapshot + truncate
inline Run drive(const Model& m, ContextOptions o) {
  Context c(m, o);
  Run r;
  const int V = c.n_vocab();
  auto take = [&](const Batch& b) {
    for (size_t i = 0; i < b.size(); ++i)
      if (b.entries[i].want_logits) r.logits.emplace_back(c.logits(i), c.logits(i) + V);
  };
  Batch b;
  std::vector<int32_t> p0;
  for (int i = 0; i < 21; ++i) p0.push_back((i * 37 + 5) % V);
  b.add_sequence(p0, 0, 0, true, true);  // 21 tokens > n_batch 8: three micro-batches
  c.decode(b);
  take(b);
  c.seq_snapshot(0);
  for (int i = 0; i < 4; ++i) {
    b.clear();
    b.add((i * 11 + 3) % V, 0, c.seq_len(0), true);
    c.decode(b);
    take(b);
  }
  b.clear();  // seq 1 prefill (5 tokens) interleaved with a seq 0 decode token
  for (int i = 0; i < 5; ++i) b.add((i * 53 + 7) % V, 1, i, i == 4);
  b.add(17, 0, c.seq_len(0), true);
  c.decode(b);
  take(b);
  c.seq_truncate(0, 21);  // back to the snapshot (KDA states restored on every backend)
  b.clear();
  b.add(99, 0, 21, true);
  c.decode(b);
  take(b);
  c.seq_copy(0, 1);
  b.clear();
  b.add(5, 1, c.seq_len(1), true);
  c.decode(b);
  take(b);
  return r;
}

// Greedy decoding after the prompt {11, 200, 37, 5, 900, 4}, one token per step for `steps` steps: the
// tokens picked; each step's whole logits row appended to *rows when given
inline std::vector<int32_t> greedy(const Model& m, const ContextOptions& o, int steps = 24,
                                   std::vector<std::vector<float>>* rows = nullptr) {
  Context c(m, o);
  std::vector<int32_t> out;
  Batch b;
  b.add_sequence({11, 200, 37, 5, 900, 4}, 0, 0);
  for (int step = 0; step < steps; ++step) {
    c.decode(b);
    const float* lg = c.logits(b.size() - 1);
    if (rows) rows->emplace_back(lg, lg + c.n_vocab());
    const int32_t next = static_cast<int32_t>(std::max_element(lg, lg + c.n_vocab()) - lg);
    out.push_back(next);
    b.clear();
    b.add(next, 0, c.seq_len(0), true);
  }
  return out;
}

// Seq 0 of a fresh context: a prompt of n_prompt tokens in one batch (micro-batched by the context)
inline void prefill_seq0(Context& c, int n_prompt) {
  Batch b;
  std::vector<int32_t> p;
  for (int i = 0; i < n_prompt; ++i) p.push_back((i * 37 + 5) % c.n_vocab());
  b.add_sequence(p, 0, 0, true);
  c.decode(b);
}

// Seq 0: n_steps decode steps of one fixed token each
inline void decode_seq0(Context& c, int n_steps) {
  Batch b;
  for (int i = 0; i < n_steps; ++i) {
    b.clear();
    b.add((i * 11 + 3) % c.n_vocab(), 0, c.seq_len(0), true);
    c.decode(b);
  }
}

struct TinyModel {
  TempDir d;
  std::unique_ptr<Model> m;
  explicit TinyModel(int top_k) {
    TinySpec sp;
    sp.top_k = top_k;
    const std::string path = d.file("tiny.gguf");
    write_tiny_gguf(path, sp);
    m = Model::load(path);
  }
};

}  // namespace kimi::test
