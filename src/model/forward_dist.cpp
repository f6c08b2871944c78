// Forward over several ranks (forward.h, docs/distributed.md): how the model is split, the
// worker protocol (rank 0's calls replayed on every other rank), layer mode's hand-over of the
// residual stream, and the per-rank traffic counters.
#include <algorithm>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <string>

#include "model/forward_impl.h"
#include "model/shard.h"
#include "util/error.h"

namespace kimi {

namespace {

enum Op : int32_t { kRun = 1, kSeqClear, kSeqCopy, kSnapSave, kSnapRestore, kSnapCopy, kFill, kTraffic, kClose };

struct Command {
  int32_t op = 0, a = 0, b = 0, c = 0;
  int64_t n = 0;
  uint64_t seed = 0;
};

void announce(Forward::Dist& d, const Command& cmd) {  // rank 0 only
  if (d.rank != 0) return;
  Command x = cmd;
  d.c->broadcast(&x, sizeof x, 0);
}

// Resident bytes of this process and of its mappings of `files` (Linux: /proc/self/smaps; 0
// elsewhere). The model is mmapped and only read where this rank computes, so the second number
// is what this rank's share of the weights costs in memory.
void resident_bytes(std::vector<std::string> files, uint64_t& total, uint64_t& of_files) {
  total = of_files = 0;
  for (auto& p : files) {
    std::error_code ec;
    const auto c = std::filesystem::weakly_canonical(p, ec);
    if (!ec) p = c.string();
  }
  FILE* f = std::fopen("/proc/self/smaps", "r");
  if (!f) return;
  char line[4096];
  bool in_file = false;
  while (std::fgets(line, sizeof line, f)) {
    unsigned long long kb = 0;
    if (std::strncmp(line, "Rss:", 4) == 0 && std::sscanf(line + 4, "%llu", &kb) == 1) {
      total += kb * 1024;
      if (in_file) of_files += kb * 1024;
      continue;
    }
    // a mapping's header: "start-end perms offset dev inode [path]"
    const char* dash = std::strchr(line, '-');
    if (!dash || dash == line || std::strchr(line, ':') < dash) continue;
    std::string l(line);
    if (!l.empty() && l.back() == '\n') l.pop_back();
    in_file = false;
    for (const std::string& p : files)
      if (l.size() >= p.size() && l.compare(l.size() - p.size(), p.size(), p) == 0) in_file = true;
  }
  std::fclose(f);
}

}  // namespace

bool Forward::is_worker() const { return dist_ && dist_->rank != 0; }

bool Forward::owns_layer(uint32_t il) const {
  return !dist_ || dist_->mode == SplitMode::Tensor || dist_->owner(il) == dist_->rank;
}

TensorSplit* Forward::tensor_split() { return dist_ && dist_->mode == SplitMode::Tensor ? &dist_->tp : nullptr; }

int64_t Forward::kda_heads_here() const {
  const int64_t H = hp_.n_head;
  if (!dist_ || dist_->mode != SplitMode::Tensor) return H;
  int64_t lo = 0, hi = 0;
  dist_->tp.units(H, lo, hi);
  return hi - lo;
}

void Forward::setup_dist() {
  Collective* c = opts_.coll;
  const HParams& hp0 = hp_;
  const std::string& file = model_.reader().path();
  if (!c || c->size() <= 1) {
    check(hp0.shard_ranks == 0,
          "{}: a per-rank file (rank {} of {}); run it with mpirun -np {} (-m with {{rank}} in the path picks each "
          "rank's file), or use the full model",
          file, hp0.shard_rank, hp0.shard_ranks, hp0.shard_ranks);
    return;
  }
  dist_ = std::make_unique<Dist>();
  Dist& d = *dist_;
  d.c = c;
  d.rank = c->rank();
  d.size = c->size();
  d.mode = opts_.split;
  d.bytes.assign(static_cast<size_t>(d.size), 0);
  if (hp0.shard_ranks) {  // checked before any exchange: every rank with a wrong file says so
    check(hp0.shard_ranks == static_cast<uint32_t>(d.size) && hp0.shard_rank == static_cast<uint32_t>(d.rank),
          "rank {}: {} is the file of rank {} of a {}-rank split, but this job has {} ranks and this is rank {} "
          "(mpirun -np {}; {{rank}} in -m picks each rank's file)",
          d.rank, file, hp0.shard_rank, hp0.shard_ranks, d.size, d.rank, hp0.shard_ranks);
    check(opts_.split == SplitMode::Tensor, "rank {}: {} holds only this rank's heads, rows and experts: use --split-mode tensor",
          d.rank, file);
  }
  {  // every rank runs the same model (a shard set has its source's id)
    std::string id = model_id(model_.reader());
    id.resize(16, ' ');
    std::vector<char> all(static_cast<size_t>(d.size) * 16);
    for (auto& b : d.bytes) b = 16;
    c->all_gather(id.data(), all.data(), d.bytes.data());
    for (int r = 0; r < d.size; ++r) {
      const std::string other(all.data() + r * 16, 16);
      check(other == id, "rank {}: {} is model {}, but rank {} runs model {}: every rank needs the same model (or "
            "its shard of it)", d.rank, file, id, r, other);
    }
  }
  check(devs_.size() == 1 && devs_[0]->be->host_visible(),
        "forward: {} ranks run on the CPU backend only (no accelerator placement with MPI yet)", d.size);
  const HParams& hp = hp_;
  if (d.mode == SplitMode::Layer) {
    check(hp.n_layer >= static_cast<uint32_t>(d.size),
          "forward: layer split over {} ranks needs at least as many layers (the model has {})", d.size,
          hp.n_layer);
    for (int r = 0; r <= d.size; ++r)
      d.layer_lo.push_back(static_cast<uint32_t>(static_cast<uint64_t>(hp.n_layer) * static_cast<uint64_t>(r) /
                                                 static_cast<uint64_t>(d.size)));
  } else {
    TensorSplit& t = d.tp;
    t.c = c;
    t.rank = d.rank;
    t.size = d.size;
    t.bytes.assign(static_cast<size_t>(d.size), 0);
    check(hp.n_expert == 0 || hp.n_expert >= static_cast<uint32_t>(d.size),
          "forward: expert parallelism over {} ranks needs at least as many routed experts (the model has {})",
          d.size, hp.n_expert);
    check(hp.n_expert_used <= 64, "forward: the tensor split handles at most 64 routed experts per token (the model uses "
          "{})", hp.n_expert_used);
    for (int r = 0; r <= d.size; ++r) t.expert_lo.push_back(static_cast<int64_t>(hp.n_expert) * r / d.size);
    check(!hp.shard_ranks || (t.expert_lo[static_cast<size_t>(d.rank)] == hp.shard_expert_first &&
                              t.expert_lo[static_cast<size_t>(d.rank) + 1] - t.expert_lo[static_cast<size_t>(d.rank)] ==
                                  hp.shard_expert_count),
          "rank {}: {} holds experts {}+{}, but rank {} of {} runs experts {}..{}", d.rank, file,
          hp.shard_expert_first, hp.shard_expert_count, d.rank, d.size, t.expert_lo[static_cast<size_t>(d.rank)],
          t.expert_lo[static_cast<size_t>(d.rank) + 1] - 1);
  }
}

// Tensor mode: narrows every split weight to this rank's heads / rows / experts (model/shard.h,
// split_rule; a per-rank file holds only those). Both modes: counts the weight bytes each rank
// reads and sizes the exchange buffers (after placement).
void Forward::size_dist() {
  if (!dist_) return;
  Dist& d = *dist_;
  const HParams& hp = hp_;
  const bool tensor = d.mode == SplitMode::Tensor;
  const int64_t N = opts_.n_batch;
  const std::string& file = model_.reader().path();
  auto narrow = [&](WeightView& w) {
    if (!w || !tensor) return;
    const SplitRule rule = split_rule(w.info->name, hp);
    if (!rule) return;
    int64_t lo = 0, hi = 0;
    rule.range(d.size, d.rank, lo, hi);
    const int64_t held = rule.dim == 2 ? w.info->ne[2] : w.mat.rows;  // what the file holds
    const int64_t first = hp.shard_ranks ? lo : 0;
    check(held == (hp.shard_ranks ? hi - lo : rule.total), "rank {}: {}: tensor '{}' holds {} {}, expected {}", d.rank,
          file, w.info->name, held, rule.dim == 2 ? "slices" : "rows", hp.shard_ranks ? hi - lo : rule.total);
    if (rule.dim == 2) {
      w.mat.data += w.slice_bytes * static_cast<uint64_t>(lo - first);
    } else {
      w.mat.data += w.mat.row_bytes * static_cast<uint64_t>(lo - first);
      w.mat.rows = hi - lo;
    }
  };
  for (uint32_t il = 0; il < hp.n_layer; ++il) {
    LayerWeights& L = layers_[il];
    const bool mine = owns_layer(il);
    for_each_layer_weight(L, [&](WeightView& w) {
      if (!w) return;
      narrow(w);
      if (!mine || (w.f32 && &w != &L.ffn_gate_inp)) return;  // vectors: not counted
      const bool expert = &w == &L.ffn_gate_exps || &w == &L.ffn_up_exps || &w == &L.ffn_down_exps;
      if (expert) {
        int64_t lo = 0, hi = hp.n_expert;
        if (tensor) {
          lo = d.tp.expert_lo[static_cast<size_t>(d.rank)];
          hi = d.tp.expert_lo[static_cast<size_t>(d.rank) + 1];
        }
        d.expert_bytes += w.slice_bytes * static_cast<uint64_t>(hi - lo);
        if (hp.n_expert) d.expert_tok += w.slice_bytes * static_cast<uint64_t>(hi - lo) * hp.n_expert_used / hp.n_expert;
        return;
      }
      const SplitRule rule = tensor ? split_rule(w.info->name, hp) : SplitRule{};
      if (rule.dim == 2) {  // k_b / v_b: this rank's head slices
        int64_t lo = 0, hi = 0;
        rule.range(d.size, d.rank, lo, hi);
        d.dense_bytes += w.slice_bytes * static_cast<uint64_t>(hi - lo);
      } else {
        d.dense_bytes += static_cast<uint64_t>(w.mat.rows) * w.mat.row_bytes * static_cast<uint64_t>(
                             w.info->n_dims > 2 ? w.info->ne[2] : 1);
      }
    });
  }
  narrow(output_);
  if (output_ && (tensor || d.rank == d.size - 1))
    d.dense_bytes += static_cast<uint64_t>(output_.mat.rows) * output_.mat.row_bytes;
  if (tensor) {
    TensorSplit& t = d.tp;
    t.weight_bytes = d.dense_bytes;
    // the widest exchange (floats per token, all ranks' parts together)
    const int64_t H = hp.n_head, C = hp.kda_channels(), Lw = hp.n_latent ? hp.n_latent : hp.n_embd;
    const int64_t k = hp.n_expert_used, S = static_cast<int64_t>(hp.n_ff_exp) * hp.n_expert_shared;
    const int64_t widest = std::max<int64_t>(
        {C, static_cast<int64_t>(hp.n_embd), static_cast<int64_t>(hp.q_lora) + hp.mla_row() + hp.idx_dim + hp.idx_heads,
         static_cast<int64_t>(hp.idx_heads) * hp.idx_dim, H * hp.n_v, static_cast<int64_t>(hp.n_ff),
         static_cast<int64_t>(hp.n_expert) + Lw, k * Lw + S, static_cast<int64_t>(hp.n_vocab)});
    t.local.assign(static_cast<size_t>(N * widest), 0.0f);
    t.gathered.assign(static_cast<size_t>(N * widest), 0.0f);
    if (hp.n_expert) {
      t.slot_x.assign(static_cast<size_t>(N * k * Lw), 0.0f);
      t.slot_y.assign(static_cast<size_t>(N * k * Lw), 0.0f);
      t.slot_out.assign(static_cast<size_t>(N * k * Lw), 0.0f);
      t.ones.assign(static_cast<size_t>(N * k), 1.0f);
      t.slot_at.assign(static_cast<size_t>(N * k), 0);
      t.slot_expert.assign(static_cast<size_t>(N * k), 0);
    }
    t.counts.assign(static_cast<size_t>(d.size), 0);
  } else if (d.rank == d.size - 1) {
    d.logits.assign(static_cast<size_t>(N * hp.n_vocab), 0.0f);
  }
  d.batch.assign(static_cast<size_t>(N), BatchEntry{});
  d.traffic.assign(static_cast<size_t>(d.size), TrafficWire{});
}

float* Forward::layer_logits() { return dist_->logits.data(); }

// layer mode: the residual stream and the ResMix bank entries so far go from the rank that ran
// layer il - 1 to the one that runs layer il
void Forward::pass_layer_boundary(uint32_t il, int64_t n, uint32_t nb) {
  Dist& d = *dist_;
  const int from = d.owner(il - 1), to = d.owner(il);
  if (d.rank != from && d.rank != to) return;
  Device& v = *devs_[0];
  const int64_t D = hp_.n_embd, N = opts_.n_batch;
  auto xfer = [&](float* p, int64_t count) {
    if (d.rank == from)
      d.c->send(p, static_cast<uint64_t>(count) * 4, to);
    else
      d.c->recv(p, static_cast<uint64_t>(count) * 4, from);
  };
  xfer(v.res.stream.p, n * D);
  for (uint32_t k = 0; k < nb; ++k) {
    xfer(v.res.bank.p + static_cast<int64_t>(k) * N * D, n * D);
    xfer(v.res.bank_inv.p + static_cast<int64_t>(k) * N, n);
  }
}

// layer mode, after the layers: the last rank computed the logits; rank 0 receives them
bool Forward::layer_mode_logits(int64_t nw, float* logits) {
  if (!dist_ || dist_->mode != SplitMode::Layer) return false;
  Dist& d = *dist_;
  const int last = d.size - 1;
  const uint64_t bytes = static_cast<uint64_t>(nw * hp_.n_vocab) * 4;
  if (d.rank == 0) d.c->recv(logits, bytes, last);
  else if (d.rank == last) d.c->send(d.logits.data(), bytes, 0);
  return true;
}

// ---- rank 0's calls, announced to the workers ----

void Forward::run(const BatchEntry* e, int64_t n, float* logits, const float* const* embd) {
  if (embd && dist_)
    for (int64_t i = 0; i < n; ++i)
      check(embd[i] == nullptr, "image input is not supported with several MPI ranks (docs/distributed.md)");
  if (dist_) {
    announce(*dist_, {kRun, 0, 0, 0, n, 0});
    dist_->c->broadcast(const_cast<BatchEntry*>(e), static_cast<uint64_t>(n) * sizeof(BatchEntry), 0);
  }
  run_local(e, n, logits, embd);
}
void Forward::seq_clear(int32_t seq) {
  if (dist_) announce(*dist_, {kSeqClear, seq, 0, 0, 0, 0});
  seq_clear_local(seq);
}
void Forward::seq_copy(int32_t src, int32_t dst, int32_t n_rows) {
  if (dist_) announce(*dist_, {kSeqCopy, src, dst, n_rows, 0, 0});
  seq_copy_local(src, dst, n_rows);
}
void Forward::snapshot_save(int32_t seq, int32_t slot) {
  if (dist_) announce(*dist_, {kSnapSave, seq, slot, 0, 0, 0});
  snapshot_save_local(seq, slot);
}
void Forward::snapshot_restore(int32_t src, int32_t slot, int32_t dst) {
  if (dist_) announce(*dist_, {kSnapRestore, src, slot, dst, 0, 0});
  snapshot_restore_local(src, slot, dst);
}
void Forward::snapshot_copy(int32_t src, int32_t dst, int32_t slot) {
  if (dist_) announce(*dist_, {kSnapCopy, src, dst, slot, 0, 0});
  snapshot_copy_local(src, dst, slot);
}
void Forward::fill_synthetic(int32_t seq, int32_t n, uint64_t seed) {
  if (dist_) announce(*dist_, {kFill, seq, n, 0, 0, seed});
  fill_synthetic_local(seq, n, seed);
}

std::vector<RankTraffic> Forward::traffic(bool reset) {
  std::vector<RankTraffic> out;
  Collective* c = dist_ ? dist_->c : nullptr;
  if (dist_) announce(*dist_, {kTraffic, reset ? 1 : 0, 0, 0, 0, 0});
  if (!dist_) {  // one process: what it reads (all of it) and its memory
    RankTraffic t;
    std::vector<std::string> files;
    for (size_t i = 0; i < model_.reader().n_files(); ++i) files.push_back(model_.reader().file_path(i));
    resident_bytes(files, t.rss_bytes, t.model_rss_bytes);
    out.push_back(t);
    return out;
  }
  Dist& d = *dist_;
  const CollectiveStats s = c->stats();  // before the gather below counts itself
  TrafficWire mine{d.dense_bytes, d.expert_bytes, d.expert_tok, s.bytes_sent, s.bytes_received, s.calls, s.seconds};
  std::vector<std::string> files;
  for (size_t i = 0; i < model_.reader().n_files(); ++i) files.push_back(model_.reader().file_path(i));
  resident_bytes(files, mine.rss, mine.model_rss);
  for (auto& b : d.bytes) b = sizeof(TrafficWire);
  c->gather(&mine, d.traffic.data(), d.bytes.data(), 0);
  if (reset) c->reset_stats();
  if (d.rank != 0) return out;
  for (int r = 0; r < d.size; ++r) {
    const TrafficWire& w = d.traffic[static_cast<size_t>(r)];
    RankTraffic t;
    t.rank = r;
    t.dense_weight_bytes = w.dense;
    t.expert_weight_bytes = w.experts;
    t.expert_bytes_per_token = w.experts_tok;
    t.comm = {w.sent, w.received, w.calls, w.seconds};
    t.rss_bytes = w.rss;
    t.model_rss_bytes = w.model_rss;
    out.push_back(t);
  }
  return out;
}

void Forward::serve_worker() {
  if (!is_worker()) return;
  Dist& d = *dist_;
  for (;;) {
    Command cmd;
    d.c->wait_command(&cmd, sizeof cmd);
    switch (cmd.op) {
      case kRun:
        check(cmd.n >= 0 && cmd.n <= opts_.n_batch, "rank {}: rank 0 sent a batch of {} tokens (capacity {})", d.rank,
              cmd.n, opts_.n_batch);
        d.c->broadcast(d.batch.data(), static_cast<uint64_t>(cmd.n) * sizeof(BatchEntry), 0);
        run_local(d.batch.data(), cmd.n, nullptr);
        break;
      case kSeqClear: seq_clear_local(cmd.a); break;
      case kSeqCopy: seq_copy_local(cmd.a, cmd.b, cmd.c); break;
      case kSnapSave: snapshot_save_local(cmd.a, cmd.b); break;
      case kSnapRestore: snapshot_restore_local(cmd.a, cmd.b, cmd.c); break;
      case kSnapCopy: snapshot_copy_local(cmd.a, cmd.b, cmd.c); break;
      case kFill: fill_synthetic_local(cmd.a, static_cast<int32_t>(cmd.b), cmd.seed); break;
      case kTraffic: traffic(cmd.a != 0); break;
      case kClose: d.closed = true; return;
      default: fail("rank {}: unknown command {} from rank 0", d.rank, cmd.op);
    }
  }
}

Forward::~Forward() {
  if (dist_ && dist_->rank == 0 && !dist_->closed) {
    dist_->closed = true;
    try {
      announce(*dist_, {kClose, 0, 0, 0, 0, 0});
    } catch (...) {
    }
  }
}

}  // namespace kimi
