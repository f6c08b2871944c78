// Cache and state store over the Backend memory primitives (state_store.h).
#include "backend/state_store.h"

#include <cstring>

#include "backend/key_quant.h"
#include "tensor/types.h"
#include "util/error.h"

namespace kimi {

StateStore::StateStore(Backend& be, const Shape& s, int n_mla, int n_kda) : be_(be), s_(s) {
  const size_t es = s.f16 ? 2 : 4;
  const uint64_t rows = static_cast<uint64_t>(s.n_seq) * static_cast<uint64_t>(s.n_ctx);
  for (int i = 0; i < n_mla; ++i) {
    latent_.push_back(be.alloc(rows * static_cast<uint64_t>(s.latent_width) * es, "mla latent cache"));
    if (s.index_width > 0)
      keys_.push_back(be.alloc(rows * (s.index_i8 ? static_cast<uint64_t>(s.index_width) + 8
                                                  : static_cast<uint64_t>(s.index_width) * es),
                               "indexer keys"));
  }
  for (int i = 0; i < n_kda; ++i) {
    conv_.push_back(be.alloc(static_cast<uint64_t>(s.n_seq) * s.conv_floats * 4, "kda conv state"));
    rec_.push_back(be.alloc(static_cast<uint64_t>(s.n_seq) * s.rec_floats * 4, "kda recurrent state"));
  }
  snaps_.resize(static_cast<size_t>(s.n_seq) * static_cast<size_t>(s.n_snapshots));
  host_row_.resize(static_cast<size_t>(std::max(s.latent_width, s.index_width)) * 4 + 8);
}

CacheRows StateStore::latent(int i) const {
  return {latent_[static_cast<size_t>(i)]->as<uint8_t>(), s_.f16, s_.latent_width, s_.n_ctx};
}
CacheRows StateStore::index_keys(int i) const {
  const bool f16 = s_.f16 && !s_.index_i8;
  if (keys_.empty()) return {nullptr, f16, s_.index_width, s_.n_ctx, s_.index_i8};
  return {keys_[static_cast<size_t>(i)]->as<uint8_t>(), f16, s_.index_width, s_.n_ctx, s_.index_i8};
}
SeqStates StateStore::conv(int i) const { return {conv_[static_cast<size_t>(i)]->as<float>(), s_.conv_floats}; }
SeqStates StateStore::rec(int i) const { return {rec_[static_cast<size_t>(i)]->as<float>(), s_.rec_floats}; }

void StateStore::seq_clear(int32_t seq) {
  for (size_t i = 0; i < conv_.size(); ++i) {
    be_.fill_zero(conv(static_cast<int>(i)).of(seq), static_cast<uint64_t>(s_.conv_floats) * 4);
    be_.fill_zero(rec(static_cast<int>(i)).of(seq), static_cast<uint64_t>(s_.rec_floats) * 4);
  }
}

void StateStore::seq_copy(int32_t src, int32_t dst, int32_t n_rows) {
  if (src == dst) return;
  for (size_t i = 0; i < latent_.size(); ++i) {
    const CacheRows l = latent(static_cast<int>(i));
    be_.copy(l.row(dst, 0), l.row(src, 0), static_cast<uint64_t>(n_rows) * l.row_bytes());
    const CacheRows k = index_keys(static_cast<int>(i));
    if (k.data) be_.copy(k.row(dst, 0), k.row(src, 0), static_cast<uint64_t>(n_rows) * k.row_bytes());
  }
  for (size_t i = 0; i < conv_.size(); ++i) {
    be_.copy(conv(static_cast<int>(i)).of(dst), conv(static_cast<int>(i)).of(src), static_cast<uint64_t>(s_.conv_floats) * 4);
    be_.copy(rec(static_cast<int>(i)).of(dst), rec(static_cast<int>(i)).of(src), static_cast<uint64_t>(s_.rec_floats) * 4);
  }
}

float* StateStore::snap(int32_t seq, int32_t slot, bool create) {
  check(slot >= 0 && slot < s_.n_snapshots, "state store: snapshot slot {} out of range 0..{}", slot, s_.n_snapshots - 1);
  auto& b = snaps_[static_cast<size_t>(seq) * static_cast<size_t>(s_.n_snapshots) + static_cast<size_t>(slot)];
  if (!b && create)
    b = be_.alloc(static_cast<uint64_t>(conv_.size()) * static_cast<uint64_t>(s_.conv_floats + s_.rec_floats) * 4,
                  "kda snapshot");
  return b ? b->as<float>() : nullptr;
}

void StateStore::snapshot_save(int32_t seq, int32_t slot) {
  if (conv_.empty()) return;
  float* p = snap(seq, slot, true);
  for (size_t i = 0; i < conv_.size(); ++i) {
    float* base = p + static_cast<int64_t>(i) * (s_.conv_floats + s_.rec_floats);
    be_.copy(base, conv(static_cast<int>(i)).of(seq), static_cast<uint64_t>(s_.conv_floats) * 4);
    be_.copy(base + s_.conv_floats, rec(static_cast<int>(i)).of(seq), static_cast<uint64_t>(s_.rec_floats) * 4);
  }
}

void StateStore::snapshot_restore(int32_t src, int32_t slot, int32_t dst) {
  if (conv_.empty()) return;
  const float* p = snap(src, slot, false);
  check(p != nullptr, "state store: snapshot slot {} of sequence {} was never saved", slot, src);
  for (size_t i = 0; i < conv_.size(); ++i) {
    const float* base = p + static_cast<int64_t>(i) * (s_.conv_floats + s_.rec_floats);
    be_.copy(conv(static_cast<int>(i)).of(dst), base, static_cast<uint64_t>(s_.conv_floats) * 4);
    be_.copy(rec(static_cast<int>(i)).of(dst), base + s_.conv_floats, static_cast<uint64_t>(s_.rec_floats) * 4);
  }
}

void StateStore::snapshot_copy(int32_t src, int32_t dst, int32_t slot) {
  if (conv_.empty() || src == dst) return;
  const float* p = snap(src, slot, false);
  check(p != nullptr, "state store: snapshot slot {} of sequence {} was never saved", slot, src);
  be_.copy(snap(dst, slot, true), p, static_cast<uint64_t>(conv_.size()) * (s_.conv_floats + s_.rec_floats) * 4);
}

void StateStore::write_row(const CacheRows& rows, int32_t seq, int32_t pos, const float* host_row) {
  const size_t bytes = rows.row_bytes();
  if (rows.i8) {
    quantize_key_i8(host_row, rows.width, host_row_.data());
  } else if (rows.f16) {
    auto* h = reinterpret_cast<uint16_t*>(host_row_.data());
    for (int64_t j = 0; j < rows.width; ++j) h[j] = f32_to_f16(host_row[j]);
  } else {
    std::memcpy(host_row_.data(), host_row, bytes);
  }
  be_.upload(rows.row(seq, pos), host_row_.data(), bytes);
}

std::vector<uint64_t> StateStore::row_parts() const {
  std::vector<uint64_t> r;
  for (size_t i = 0; i < latent_.size(); ++i) {
    r.push_back(latent(static_cast<int>(i)).row_bytes());
    const CacheRows k = index_keys(static_cast<int>(i));
    if (k.data) r.push_back(k.row_bytes());
  }
  return r;
}

uint64_t StateStore::kda_state_bytes() const {
  return static_cast<uint64_t>(conv_.size()) * static_cast<uint64_t>(s_.conv_floats + s_.rec_floats) * 4;
}

void StateStore::save_rows(int32_t seq, int32_t from, int32_t to, uint8_t* host) const {
  check(from >= 0 && from <= to && to <= s_.n_ctx, "state store: rows {}..{} out of range 0..{}", from, to, s_.n_ctx);
  const uint64_t n = static_cast<uint64_t>(to - from);
  for (size_t i = 0; i < latent_.size(); ++i) {
    for (const CacheRows& c : {latent(static_cast<int>(i)), index_keys(static_cast<int>(i))}) {
      if (!c.data) continue;
      be_.download(host, c.row(seq, from), n * c.row_bytes());
      host += n * c.row_bytes();
    }
  }
}

void StateStore::load_rows(int32_t seq, int32_t from, int32_t to, const uint8_t* host) {
  check(from >= 0 && from <= to && to <= s_.n_ctx, "state store: rows {}..{} out of range 0..{}", from, to, s_.n_ctx);
  const uint64_t n = static_cast<uint64_t>(to - from);
  for (size_t i = 0; i < latent_.size(); ++i) {
    for (const CacheRows& c : {latent(static_cast<int>(i)), index_keys(static_cast<int>(i))}) {
      if (!c.data) continue;
      be_.upload(c.row(seq, from), host, n * c.row_bytes());
      host += n * c.row_bytes();
    }
  }
}

void StateStore::save_state(int32_t seq, int32_t slot, uint8_t* host) const {
  if (conv_.empty()) return;
  const uint64_t cb = static_cast<uint64_t>(s_.conv_floats) * 4, rb = static_cast<uint64_t>(s_.rec_floats) * 4;
  if (slot >= 0) {  // a snapshot holds every layer's conv then rec, as this layout
    const float* p = const_cast<StateStore*>(this)->snap(seq, slot, false);
    check(p != nullptr, "state store: snapshot slot {} of sequence {} was never saved", slot, seq);
    be_.download(host, p, kda_state_bytes());
    return;
  }
  for (size_t i = 0; i < conv_.size(); ++i) {
    be_.download(host, conv(static_cast<int>(i)).of(seq), cb);
    be_.download(host + cb, rec(static_cast<int>(i)).of(seq), rb);
    host += cb + rb;
  }
}

void StateStore::load_state(int32_t seq, const uint8_t* host) {
  const uint64_t cb = static_cast<uint64_t>(s_.conv_floats) * 4, rb = static_cast<uint64_t>(s_.rec_floats) * 4;
  for (size_t i = 0; i < conv_.size(); ++i) {
    be_.upload(conv(static_cast<int>(i)).of(seq), host, cb);
    be_.upload(rec(static_cast<int>(i)).of(seq), host + cb, rb);
    host += cb + rb;
  }
}

uint64_t StateStore::cache_bytes() const {
  uint64_t b = 0;
  for (auto& v : latent_) b += v->bytes();
  for (auto& v : keys_) b += v->bytes();
  return b;
}

uint64_t StateStore::state_bytes() const {
  uint64_t b = 0;
  for (auto& v : conv_) b += v->bytes();
  for (auto& v : rec_) b += v->bytes();
  return b;
}

}  // namespace kimi
