// Byte-level BPE engine shared by both vocabulary sources.
//
//  * Rank mode (tiktoken): a piece that is itself a token maps to that token; otherwise start from
//    single bytes and repeatedly merge the adjacent pair whose concatenation is the token of
//    lowest rank (ties: leftmost), exactly tiktoken's byte_pair_merge.
//  * Merge mode (GGUF tokenizer.ggml.merges, as llama.cpp): start from single bytes and repeatedly
//    apply the listed merge (A, B) -> AB of lowest priority (= merge line index; ties: leftmost).
//
// Small pieces use tiktoken's linear scan; long pieces use a linked list + min-heap (O(n log n)).
#pragma once
#include <array>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace kimi::tok {

// Open-addressing hash table from byte strings to int32 (keys live in an arena).
class BytesTable {
 public:
  void reserve(size_t n);
  bool insert(std::string_view key, int32_t value);  // false if the key exists already
  int32_t find(std::string_view key) const;          // -1 when absent
  size_t size() const { return count_; }

 private:
  struct Slot {
    uint64_t hash = 0;
    uint32_t off = 0, len = 0;
    int32_t value = -1;
  };
  void grow();
  std::vector<Slot> slots_;
  std::string arena_;
  size_t count_ = 0;
};

uint64_t hash_bytes(std::string_view s);

class BpeEncoder {
 public:
  struct Merge {
    int32_t left, right, result;
  };
  // token_bytes[id] = the raw bytes of token id; ids whose entry is `excluded` take no part in
  // BPE (special / unused tokens). Every single byte 0..255 must be some token (else kimi::Error).
  void build_ranks(const std::vector<std::string>& token_bytes, const std::vector<bool>& excluded);
  void build_merges(const std::vector<std::string>& token_bytes, const std::vector<bool>& excluded,
                    const std::vector<Merge>& merges);

  bool rank_mode() const { return rank_mode_; }
  int32_t lookup(std::string_view bytes) const { return table_.find(bytes); }
  int32_t byte_token(uint8_t b) const { return byte_id_[b]; }

  // Appends the ids of one pre-tokenized piece (raw bytes, non-empty) to out.
  void encode(std::string_view piece, std::vector<int32_t>& out) const;

 private:
  struct PairVal {
    int32_t prio, result;
  };
  PairVal pair(int32_t l, int32_t r, std::string_view joined) const;
  void encode_scan(std::string_view piece, std::vector<int32_t>& out) const;
  void encode_heap(std::string_view piece, std::vector<int32_t>& out) const;
  void build_byte_ids(const std::vector<std::string>& token_bytes);

  bool rank_mode_ = true;
  BytesTable table_;                 // bytes -> id (non-excluded tokens)
  std::array<int32_t, 256> byte_id_{};
  // merge mode: (left << 32 | right) -> (priority, result), open addressing
  struct PairSlot {
    uint64_t key = ~0ull;
    PairVal val{-1, -1};
  };
  std::vector<PairSlot> pairs_;
  uint64_t pair_mask_ = 0;
};

}  // namespace kimi::tok
