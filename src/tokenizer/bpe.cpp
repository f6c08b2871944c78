#include "tokenizer/bpe.h"

#include <algorithm>
#include <climits>
#include <cstring>
#include <queue>

#include "util/error.h"
#include "util/per_thread.h"

namespace kimi::tok {

uint64_t hash_bytes(std::string_view s) {
  uint64_t h = 0x9E3779B97F4A7C15ull ^ (s.size() * 0xFF51AFD7ED558CCDull);
  size_t i = 0;
  for (; i + 8 <= s.size(); i += 8) {
    uint64_t w;
    std::memcpy(&w, s.data() + i, 8);
    h = (h ^ w) * 0xC2B2AE3D27D4EB4Full;
    h ^= h >> 29;
  }
  if (i < s.size()) {
    uint64_t w = 0;
    std::memcpy(&w, s.data() + i, s.size() - i);
    h = (h ^ w) * 0xC2B2AE3D27D4EB4Full;
  }
  h ^= h >> 32;
  h *= 0x9E3779B97F4A7C15ull;
  h ^= h >> 29;
  return h;
}

void BytesTable::reserve(size_t n) {
  size_t cap = 16;
  while (cap < n * 2) cap <<= 1;
  if (cap <= slots_.size()) return;
  std::vector<Slot> old = std::move(slots_);
  slots_.assign(cap, Slot{});
  const size_t mask = cap - 1;
  for (const Slot& s : old) {
    if (s.value < 0) continue;
    size_t j = s.hash & mask;
    while (slots_[j].value >= 0) j = (j + 1) & mask;
    slots_[j] = s;
  }
}

void BytesTable::grow() { reserve(std::max<size_t>(count_ + 1, slots_.size())); }

bool BytesTable::insert(std::string_view key, int32_t value) {
  if ((count_ + 1) * 2 > slots_.size()) grow();
  const uint64_t h = hash_bytes(key);
  const size_t mask = slots_.size() - 1;
  size_t j = h & mask;
  while (slots_[j].value >= 0) {
    const Slot& s = slots_[j];
    if (s.hash == h && s.len == key.size() && std::memcmp(arena_.data() + s.off, key.data(), key.size()) == 0)
      return false;
    j = (j + 1) & mask;
  }
  check(arena_.size() + key.size() < UINT32_MAX, "tokenizer: vocabulary bytes exceed 4 GiB");
  slots_[j] = Slot{h, static_cast<uint32_t>(arena_.size()), static_cast<uint32_t>(key.size()), value};
  arena_.append(key);
  ++count_;
  return true;
}

int32_t BytesTable::find(std::string_view key) const {
  if (slots_.empty()) return -1;
  const uint64_t h = hash_bytes(key);
  const size_t mask = slots_.size() - 1;
  size_t j = h & mask;
  for (;;) {
    const Slot& s = slots_[j];
    if (s.value < 0) return -1;
    if (s.hash == h && s.len == key.size() && std::memcmp(arena_.data() + s.off, key.data(), key.size()) == 0)
      return s.value;
    j = (j + 1) & mask;
  }
}

// ---------------------------------------------------------------------------------------------

void BpeEncoder::build_byte_ids(const std::vector<std::string>& token_bytes) {
  for (int b = 0; b < 256; ++b) {
    const char c = static_cast<char>(b);
    byte_id_[b] = table_.find(std::string_view(&c, 1));
    check(byte_id_[b] >= 0,
          "tokenizer: the vocabulary has no token for the single byte 0x{:02X}; byte-level BPE needs all 256", b);
  }
}

void BpeEncoder::build_ranks(const std::vector<std::string>& token_bytes, const std::vector<bool>& excluded) {
  rank_mode_ = true;
  table_ = BytesTable();
  table_.reserve(token_bytes.size());
  for (size_t id = 0; id < token_bytes.size(); ++id) {
    if (excluded[id] || token_bytes[id].empty()) continue;
    // duplicates: the lowest id (rank) wins, as in a rank file read in order
    table_.insert(token_bytes[id], static_cast<int32_t>(id));
  }
  build_byte_ids(token_bytes);
}

void BpeEncoder::build_merges(const std::vector<std::string>& token_bytes, const std::vector<bool>& excluded,
                              const std::vector<Merge>& merges) {
  build_ranks(token_bytes, excluded);
  rank_mode_ = false;
  size_t cap = 16;
  while (cap < merges.size() * 2) cap <<= 1;
  pairs_.assign(cap, PairSlot{});
  pair_mask_ = cap - 1;
  for (size_t k = 0; k < merges.size(); ++k) {
    const Merge& m = merges[k];
    const uint64_t key = (static_cast<uint64_t>(static_cast<uint32_t>(m.left)) << 32) | static_cast<uint32_t>(m.right);
    size_t j = hash_bytes(std::string_view(reinterpret_cast<const char*>(&key), 8)) & pair_mask_;
    while (pairs_[j].key != ~0ull && pairs_[j].key != key) j = (j + 1) & pair_mask_;
    if (pairs_[j].key == key) continue;  // duplicate merge line: the first (lowest priority) wins
    pairs_[j].key = key;
    pairs_[j].val = PairVal{static_cast<int32_t>(k), m.result};
  }
}

inline BpeEncoder::PairVal BpeEncoder::pair(int32_t l, int32_t r, std::string_view joined) const {
  if (rank_mode_) {
    const int32_t id = table_.find(joined);
    return {id < 0 ? INT32_MAX : id, id};
  }
  const uint64_t key = (static_cast<uint64_t>(static_cast<uint32_t>(l)) << 32) | static_cast<uint32_t>(r);
  size_t j = hash_bytes(std::string_view(reinterpret_cast<const char*>(&key), 8)) & pair_mask_;
  for (;;) {
    const PairSlot& s = pairs_[j];
    if (s.key == key) return s.val;
    if (s.key == ~0ull) return {INT32_MAX, -1};
    j = (j + 1) & pair_mask_;
  }
}

namespace {
struct ScanPart {
  uint32_t start;
  int32_t id;
  int32_t prio;    // priority of merging this part with the next one (INT32_MAX: none)
  int32_t result;  // the merged token
};
}  // namespace

void BpeEncoder::encode(std::string_view piece, std::vector<int32_t>& out) const {
  if (piece.size() == 1) {
    out.push_back(byte_id_[static_cast<uint8_t>(piece[0])]);
    return;
  }
  if (rank_mode_) {
    const int32_t id = table_.find(piece);
    if (id >= 0) {
      out.push_back(id);
      return;
    }
  }
  if (piece.size() <= 128)
    encode_scan(piece, out);
  else
    encode_heap(piece, out);
}

void BpeEncoder::encode_scan(std::string_view piece, std::vector<int32_t>& out) const {
  std::vector<ScanPart>& parts = per_thread<std::vector<ScanPart>, ScanPart>();
  const size_t n = piece.size();
  parts.resize(n + 1);
  for (size_t i = 0; i < n; ++i)
    parts[i] = ScanPart{static_cast<uint32_t>(i), byte_id_[static_cast<uint8_t>(piece[i])], INT32_MAX, -1};
  parts[n] = ScanPart{static_cast<uint32_t>(n), -1, INT32_MAX, -1};
  size_t m = n;  // number of real parts; parts[m] is the end sentinel
  auto set_pair = [&](size_t i) {
    if (i + 1 >= m) {
      parts[i].prio = INT32_MAX;
      return;
    }
    const PairVal v = pair(parts[i].id, parts[i + 1].id, piece.substr(parts[i].start, parts[i + 2].start - parts[i].start));
    parts[i].prio = v.prio;
    parts[i].result = v.result;
  };
  for (size_t i = 0; i + 1 < m; ++i) set_pair(i);
  for (;;) {
    int32_t best = INT32_MAX;
    size_t bi = 0;
    for (size_t i = 0; i + 1 < m; ++i)
      if (parts[i].prio < best) {
        best = parts[i].prio;
        bi = i;
      }
    if (best == INT32_MAX) break;
    parts[bi].id = parts[bi].result;
    parts.erase(parts.begin() + static_cast<ptrdiff_t>(bi) + 1);
    --m;
    set_pair(bi);
    if (bi > 0) set_pair(bi - 1);
  }
  for (size_t i = 0; i < m; ++i) out.push_back(parts[i].id);
}

namespace {
struct HeapPart {
  uint32_t start, end;
  int32_t id;
  int32_t prev, next;  // indices into the part array; -1 = none
  uint32_t version;
};
struct HeapEntry {
  int32_t prio;
  uint32_t left;     // index of the left part (== its original start byte)
  uint32_t version;  // left part's version when pushed
  uint32_t right_version;
  int32_t result;
  bool operator>(const HeapEntry& o) const { return prio != o.prio ? prio > o.prio : left > o.left; }
};
}  // namespace

void BpeEncoder::encode_heap(std::string_view piece, std::vector<int32_t>& out) const {
  std::vector<HeapPart>& p = per_thread<std::vector<HeapPart>, HeapPart>();
  std::vector<HeapEntry>& heap = per_thread<std::vector<HeapEntry>, HeapEntry>();
  const size_t n = piece.size();
  p.resize(n);
  heap.clear();
  for (size_t i = 0; i < n; ++i)
    p[i] = HeapPart{static_cast<uint32_t>(i), static_cast<uint32_t>(i + 1), byte_id_[static_cast<uint8_t>(piece[i])],
                    static_cast<int32_t>(i) - 1, i + 1 < n ? static_cast<int32_t>(i + 1) : -1, 0};
  auto cmp = std::greater<HeapEntry>();
  auto push = [&](int32_t l) {
    if (l < 0) return;
    const int32_t r = p[l].next;
    if (r < 0) return;
    const PairVal v = pair(p[l].id, p[r].id, piece.substr(p[l].start, p[r].end - p[l].start));
    if (v.prio == INT32_MAX) return;
    heap.push_back(HeapEntry{v.prio, static_cast<uint32_t>(l), p[l].version, p[r].version, v.result});
    std::push_heap(heap.begin(), heap.end(), cmp);
  };
  for (size_t i = 0; i + 1 < n; ++i) push(static_cast<int32_t>(i));
  while (!heap.empty()) {
    std::pop_heap(heap.begin(), heap.end(), cmp);
    const HeapEntry e = heap.back();
    heap.pop_back();
    HeapPart& L = p[e.left];
    if (L.version != e.version || L.next < 0) continue;  // stale: left part changed or vanished
    HeapPart& R = p[L.next];
    if (R.version != e.right_version) continue;  // stale: right part changed
    // merge R into L
    L.id = e.result;
    L.end = R.end;
    L.next = R.next;
    if (R.next >= 0) p[R.next].prev = static_cast<int32_t>(e.left);
    R.version = UINT32_MAX;  // dead (never equal to a pushed version... see below)
    R.next = -1;
    ++L.version;
    push(L.prev);
    push(static_cast<int32_t>(e.left));
  }
  for (int32_t i = 0; i >= 0; i = p[i].next) out.push_back(p[i].id);
  // a huge piece (a 4 MB "abab..." body of /tokenize: ~180 MB of scratch) is not kept for the rest
  // of the thread's life: every server handler thread would otherwise hold its own copy
  constexpr size_t kKeepBytes = size_t{1} << 20;
  if (p.capacity() * sizeof(HeapPart) + heap.capacity() * sizeof(HeapEntry) > kKeepBytes) {
    std::vector<HeapPart>().swap(p);
    std::vector<HeapEntry>().swap(heap);
  }
}

}  // namespace kimi::tok
