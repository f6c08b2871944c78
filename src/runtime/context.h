// Inference context: sequences, batches and logits over the model's forward pass
// (model/forward.h), which runs on the backends the placement rules choose (backend/).
//
//   auto model = kimi::Model::load(path);
//   kimi::Context ctx(*model, {.n_threads = 2, .n_seq_max = 2});
//   kimi::Batch b;
//   b.add(tok0, /*seq*/0, /*pos*/0, false); b.add(tok1, 0, 1, true);   // prefill chunk of seq 0
//   b.add(tokX, 1, ctx.seq_len(1), true);                               // decode token of seq 1
//   ctx.decode(b);
//   const float* lg = ctx.logits(1);   // n_vocab floats for entry 1 of the last batch
//
// Positions: each sequence is a contiguous run 0..len-1. Within one batch, the entries of a
// sequence must carry consecutive positions starting at seq_len(seq), in batch order (entries of
// different sequences may be interleaved freely). Since K3 is NoPE, positions only order tokens.
//
// KDA states are recurrent (they cannot be rewound), so seq_truncate(seq, n) is allowed only for
// n == 0 (== seq_clear), n == seq_len(seq) (no-op) and n == the position of a snapshot taken with
// seq_snapshot(seq) (restores the KDA states saved there and drops the snapshots after n;
// latent/indexer caches are by position). A sequence keeps up to ContextOptions::n_snapshots_max
// snapshots (seq_snapshot_positions lists them); a model without KDA layers can go back anywhere.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "backend/backend.h"  // BatchEntry, AttnPath, Precision
#include "backend/collective.h"
#include "backend/placement.h"
#include "model/expert_cache.h"
#include "model/model.h"
#include "model/phase_times.h"
#include "util/thread_pool.h"

namespace kimi {

struct ContextOptions {
  int n_threads = 0;      // 0 = all hardware threads
  std::vector<int> cpus;  // the CPU each pool thread is pinned to (thread i: cpus[i % size]); empty = not pinned
  int n_seq_max = 1;      // sequence ids 0..n_seq_max-1
  int n_ctx_max = 4096;   // positions per sequence (cache rows)
  int n_batch_max = 512;  // tokens per internal micro-batch (work buffers are sized for it;
                          // larger batches are split in order)
  AttnPath attn = AttnPath::Sparse;
  int attn_top_k = -1;    // -1: top_k from the file; 0: indexer disabled (plain attention); >0: override
  Precision precision = Precision::Fast;  // F32: f32 matmuls, f32 caches, no rounding
  CacheType cache_type = CacheType::F16;              // ignored (F32) when precision == F32
  // DSA indexer keys cached as int8 (per-key scale) and scored with int8 queries (VNNI): 136 instead
  // of 256 bytes per key and layer, ~5x faster scans at depth; scores change at the 1e-2 level, so
  // near-tied positions may be selected differently. Opt-in; ignored when precision == F32.
  bool indexer_int8 = false;
  int n_snapshots_max = 4;  // KDA snapshots kept per sequence (>= 1); a new one beyond evicts the
                            // interior snapshot leaving the smallest gap (the newest is always kept)
  // Which backend holds each weight (-ngl / --cpu-moe / --n-cpu-moe / -ot, backend/placement.h).
  // Resolved once when the context is made; device 0 is the context's own CPU backend, devices
  // 1.. are extra_backends in order (not owned; they must outlive the context).
  PlacementRules placement;
  std::vector<Backend*> extra_backends;
  // One model over several ranks (docs/distributed.md): the communicator (not owned; nullptr or
  // one rank = a single process) and how the model is split. On ranks > 0 the constructor serves
  // rank 0's calls until rank 0's context is destroyed, then calls collective->worker_finished()
  // (which ends the process for MPI).
  Collective* collective = nullptr;
  SplitMode split_mode = SplitMode::Tensor;
  // Routed experts streamed from disk under a memory budget, for models larger than memory
  // (model/expert_cache.h; default: only when the model does not fit).
  ExpertStreamOptions stream;
};

struct Batch {
  std::vector<BatchEntry> entries;
  // Per entry: a row of n_embd floats (host) that replaces the entry's token_embd row (an image's
  // projector output at a <|media_pad|> position, docs/spec/vision.md §4), or nullptr. Empty when
  // no entry has one. The rows must stay valid until decode returns.
  std::vector<const float*> embd;
  void add(int32_t token, int32_t seq_id, int32_t pos, bool want_logits) {
    entries.push_back({token, seq_id, pos, want_logits});
    if (!embd.empty()) embd.push_back(nullptr);
  }
  // an entry whose input is the embedding row `row` instead of token's row (token: the placeholder)
  void add_embd(int32_t token, const float* row, int32_t seq_id, int32_t pos, bool want_logits) {
    embd.resize(entries.size(), nullptr);
    entries.push_back({token, seq_id, pos, want_logits});
    embd.push_back(row);
  }
  // tokens of one sequence at positions start_pos.., logits for the last one (or all)
  void add_sequence(const std::vector<int32_t>& tokens, int32_t seq_id, int32_t start_pos,
                    bool logits_last = true, bool logits_all = false) {
    for (size_t i = 0; i < tokens.size(); ++i)
      add(tokens[i], seq_id, start_pos + static_cast<int32_t>(i),
          logits_all || (logits_last && i + 1 == tokens.size()));
  }
  void clear() {
    entries.clear();
    embd.clear();
  }
  size_t size() const { return entries.size(); }
  bool empty() const { return entries.empty(); }
};

class Context {
 public:
  Context(const Model& model, const ContextOptions& opts = {});
  ~Context();
  Context(const Context&) = delete;
  Context& operator=(const Context&) = delete;

  // Evaluate a batch (any mix of prefill chunks and decode tokens of different sequences).
  // Validates tokens, sequence ids and positions first (kimi::Error, state unchanged on error).
  void decode(const Batch& batch);
  // Logits (n_vocab floats) of entry i of the last decoded batch; throws if not requested.
  const float* logits(size_t i) const;
  // Hidden-state taps for a draft model (docs/spec/dspark.md §3.1): with layers set, every
  // decode() also keeps the residual stream after each of those target layers (0-based, ascending)
  // for every entry; tap_row(i) is entry i's, layers.size() vectors of n_embd floats in layer order.
  // An empty list turns them off. One process only.
  void set_tap_layers(const std::vector<int>& layers);
  const std::vector<int>& tap_layers() const;
  const float* tap_row(size_t i) const;
  int64_t tap_count() const;                     // entries of the last decode() with taps (0: off)
  const BatchEntry& tap_entry(size_t i) const;   // entry i of that batch (sequence, position)

  int32_t seq_len(int32_t seq) const;
  void seq_clear(int32_t seq);
  void seq_truncate(int32_t seq, int32_t n_keep);  // see the header comment for what is allowed
  void seq_copy(int32_t src, int32_t dst);          // dst becomes an exact copy (incl. snapshot)
  void seq_snapshot(int32_t seq);                   // save KDA states at the current length
  int32_t seq_snapshot_pos(int32_t seq) const;      // -1 when none; else the latest (largest)
  bool seq_has_snapshot(int32_t seq, int32_t pos) const;  // a snapshot at exactly pos
  // Forget the snapshot at pos (none there: no-op); its slot is free for the next one.
  void seq_snapshot_drop(int32_t seq, int32_t pos);
  // All snapshot positions of seq, ascending (each <= seq_len(seq)).
  std::vector<int32_t> seq_snapshot_positions(int32_t seq) const;
  // dst becomes a copy of the first n positions of src: n == 0 (dst cleared), n == seq_len(src)
  // (== seq_copy(src, dst)) or n == a snapshot position of src (KDA states from that snapshot;
  // dst keeps src's snapshots <= n). Only n cache rows are copied. Any n <= len without KDA layers.
  void seq_copy(int32_t src, int32_t dst, int32_t n);
  // Benchmarks only (`kimi bench --fill synthetic`): makes seq n_tokens long with pseudo-random
  // cache rows (MLA latent rows and indexer keys ~ unit-scale values; KDA states unchanged), so
  // decode speed at a depth can be timed without prefilling it. Not a model state.
  void seq_fill_synthetic(int32_t seq, int32_t n_tokens, uint64_t seed = 1);

  // ---- host copies of a sequence, for the server's prompt cache (server/prompt_cache.h) ----
  // Saving a sequence's first n positions takes its cache rows [0, n) (in any split of ranges) and
  // its KDA states at n; loading them into any sequence makes it that sequence at length n, bit
  // for bit, so continuing it gives the logits a full prefill gives. One process only (several
  // ranks: kimi::Error).
  // Rows [from, to) are laid out part by part (each backend's MLA layers in order: latent rows,
  // then indexer keys if kept), (to - from) rows of each; seq_row_parts() gives the bytes per
  // position of each part in that order, seq_row_bytes() their sum.
  std::vector<uint64_t> seq_row_parts() const;
  uint64_t seq_row_bytes() const;
  uint64_t seq_state_bytes() const;  // KDA conv + recurrent states of one sequence (every layer)
  // rows [from, to) of seq, to <= seq_len(seq), into host (seq_row_bytes() * (to - from) bytes)
  void seq_save_rows(int32_t seq, int32_t from, int32_t to, uint8_t* host) const;
  // the KDA states of seq at position at: at == seq_len(seq), or a snapshot position (else error)
  void seq_save_state(int32_t seq, int32_t at, uint8_t* host) const;
  // Loading: seq_load_rows empties seq (length 0, snapshots dropped) and writes rows [from, to);
  // once rows [0, n) are written, seq_load_state(seq, n, host) sets its KDA states and its length
  // n. Positions >= n hold whatever they held (unused until written again).
  void seq_load_rows(int32_t seq, int32_t from, int32_t to, const uint8_t* host);
  void seq_load_state(int32_t seq, int32_t n, const uint8_t* host);
  // What saved bytes depend on besides the tokens: the model file (metadata, tensor layout and a
  // sample of every tensor's bytes), precision, cache type, indexer options, attention path and
  // top_k, the kernels in use (ISA, AMX) and the backends. Equal identities: saved bytes can be
  // loaded and give the same logits.
  std::string state_identity() const;

  const Model& model() const { return model_; }
  const ContextOptions& options() const { return opts_; }
  int n_vocab() const { return static_cast<int>(model_.hparams().n_vocab); }
  int effective_top_k() const;   // 0 = indexer off (plain attention)
  CacheType cache_type() const;  // after applying precision
  uint64_t memory_bytes() const; // caches + states + work buffers
  std::string memory_summary() const;
  ThreadPool& pool();
  const Placement& placement() const;
  // Several ranks: what each rank reads and sends (rank 0 gets every rank's record; one record
  // without ranks). reset: zero the communication counters afterwards.
  std::vector<RankTraffic> rank_traffic(bool reset = false);
  // the expert stream's counters so far (enabled == false: the experts are not streamed)
  ExpertStreamStats expert_stream_stats() const;
  int n_ranks() const;
  // Wall time per part of the forward pass (KDA, MLA, indexer, MoE, ...) summed over decode()
  // calls since the last reset (model/phase_times.h); kimi bench prints it.
  PhaseTimes phase_times() const;
  void reset_phase_times();

  struct Impl;

 private:
  const Model& model_;
  ContextOptions opts_;
  std::unique_ptr<Impl> impl_;
};

}  // namespace kimi
