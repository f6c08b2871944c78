// The cache and state store of the layers one backend runs, in that backend's memory: MLA latent
// rows and DSA indexer keys (by sequence and position) and KDA conv + recurrent states (by
// sequence), plus KDA snapshot slots. Built only on the Backend memory primitives (alloc, copy,
// fill_zero, upload), so every backend gets it unchanged; the layer ops read it through the
// CacheRows / SeqStates views.
//
// The bookkeeping of what a sequence is (its length, which snapshot slot holds which position)
// belongs to the caller (runtime/Context); the store only moves the bytes.
#pragma once
#include <cstdint>
#include <memory>
#include <vector>

#include "backend/backend.h"

namespace kimi {

class StateStore {
 public:
  struct Shape {
    int32_t n_seq = 1, n_ctx = 1;
    bool f16 = true;             // cache element type (states are always f32)
    int64_t latent_width = 0;    // MLA row: kv_lora + rope
    int64_t index_width = 0;     // indexer key width (0: no indexer keys kept)
    bool index_i8 = false;       // indexer keys as int8 rows (CacheRows::i8; --indexer-int8)
    int64_t conv_floats = 0;     // KDA conv state per layer per sequence
    int64_t rec_floats = 0;      // KDA recurrent state per layer per sequence
    int32_t n_snapshots = 1;     // KDA snapshot slots per sequence
  };
  // n_mla / n_kda: how many MLA / KDA layers this backend runs (their slots are 0..n-1)
  StateStore(Backend& be, const Shape& s, int n_mla, int n_kda);
  Backend& backend() const { return be_; }

  CacheRows latent(int mla_slot) const;
  CacheRows index_keys(int mla_slot) const;  // data == nullptr without indexer keys
  SeqStates conv(int kda_slot) const;
  SeqStates rec(int kda_slot) const;

  void seq_clear(int32_t seq);                             // KDA states of seq = 0
  void seq_copy(int32_t src, int32_t dst, int32_t n_rows);  // cache rows 0..n_rows-1 + KDA states
  // KDA snapshot slot `slot` of seq = its current states (the slot's memory is allocated on first use)
  void snapshot_save(int32_t seq, int32_t slot);
  // dst's current KDA states = slot `slot` of src (src == dst: roll back)
  void snapshot_restore(int32_t src, int32_t slot, int32_t dst);
  void snapshot_copy(int32_t src, int32_t dst, int32_t slot);  // dst's slot = src's slot
  // host row (f32, width of the cache) into row (seq, pos), converted to the cache type
  void write_row(const CacheRows& rows, int32_t seq, int32_t pos, const float* host_row);

  // Host copies for the prompt cache (runtime/Context::seq_save_rows ...). Rows [from, to) of seq
  // are laid out part by part: for each MLA slot its latent rows, then its indexer keys (if kept),
  // (to - from) rows each; row_parts() gives the bytes per position of each part in that order.
  // A state is, for each KDA slot, its conv then its recurrent state (kda_state_bytes() in all).
  std::vector<uint64_t> row_parts() const;
  uint64_t kda_state_bytes() const;
  void save_rows(int32_t seq, int32_t from, int32_t to, uint8_t* host) const;
  void load_rows(int32_t seq, int32_t from, int32_t to, const uint8_t* host);
  void save_state(int32_t seq, int32_t slot, uint8_t* host) const;  // slot -1: the current states
  void load_state(int32_t seq, const uint8_t* host);                // the current states of seq

  uint64_t cache_bytes() const;  // latent rows + indexer keys
  uint64_t state_bytes() const;  // current KDA states (snapshots not counted)
  int n_mla() const { return static_cast<int>(latent_.size()); }
  int n_kda() const { return static_cast<int>(conv_.size()); }

 private:
  float* snap(int32_t seq, int32_t slot, bool create);
  Backend& be_;
  Shape s_;
  std::vector<std::unique_ptr<Buffer>> latent_, keys_, conv_, rec_;
  std::vector<std::unique_ptr<Buffer>> snaps_;  // [seq][slot]: per KDA layer conv then rec
  std::vector<uint8_t> host_row_;               // write_row staging
};

}  // namespace kimi
