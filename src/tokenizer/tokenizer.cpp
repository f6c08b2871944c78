#include "tokenizer/tokenizer.h"

#include <algorithm>
#include <array>
#include <cstdint>
#include <mutex>
#include <unordered_map>

#include "tokenizer/bpe.h"
#include "tokenizer/pretokenizer.h"
#include "tokenizer/unicode.h"
#include "util/error.h"

namespace kimi::tok {

// Bounds for vocabularies built from rank files (from_ranks): ids are allocated densely up to the
// largest one, so the largest id may exceed the number of tokens given by at most this many
// unused ids, and no vocabulary reaches 2^24 ids (K3: 163 840).
constexpr int64_t kMaxUnusedIds = 65536;
constexpr int64_t kMaxVocab = int64_t{1} << 24;

struct Tokenizer::Impl {
  std::vector<std::string> pieces;  // raw bytes per id (special: text)
  std::vector<TokenType> types;
  std::vector<bool> special;        // matched before pre-tokenization
  BpeEncoder bpe;
  std::unique_ptr<Pretokenizer> pre;
  BytesTable special_table;         // text -> id
  std::vector<uint32_t> special_lens;  // distinct lengths, descending
  std::array<bool, 256> special_first{};
  int32_t bos = -1, eos = -1, eot = -1, pad = -1;
  bool add_bos = false;
  std::vector<int32_t> eog;

  // Piece cache (multi-token pieces only), bounded; guarded by a try-lock so concurrent encoders
  // never wait: a thread that does not get the lock simply encodes without the cache.
  mutable std::mutex cache_mu;
  mutable BytesTable cache_keys;
  mutable std::vector<std::pair<uint32_t, uint32_t>> cache_spans;
  mutable std::vector<int32_t> cache_ids;
  static constexpr size_t kCacheMax = 1 << 16;

  void finish_specials() {
    special_table = BytesTable();
    special_lens.clear();
    special_first.fill(false);
    for (size_t id = 0; id < pieces.size(); ++id) {
      if (!special[id] || pieces[id].empty()) continue;
      special_table.insert(pieces[id], static_cast<int32_t>(id));
      special_first[static_cast<uint8_t>(pieces[id][0])] = true;
      special_lens.push_back(static_cast<uint32_t>(pieces[id].size()));
    }
    std::sort(special_lens.begin(), special_lens.end(), std::greater<>());
    special_lens.erase(std::unique(special_lens.begin(), special_lens.end()), special_lens.end());
  }

  int32_t find_by_text(std::string_view text) const {
    const int32_t s = special_table.find(text);
    if (s >= 0) return s;
    return bpe.lookup(text);
  }

  void finish_ids() {
    if (eot < 0) eot = special_table.find("[EOT]");
    eog.clear();
    for (int32_t id : {eos, eot, special_table.find("[EOS]"), special_table.find("[EOT]")})
      if (id >= 0 && std::find(eog.begin(), eog.end(), id) == eog.end()) eog.push_back(id);
  }

  // Leftmost, longest special token at or after `from`; returns {pos, id} or {npos, -1}.
  std::pair<size_t, int32_t> next_special(std::string_view text, size_t from) const {
    if (special_lens.empty()) return {std::string_view::npos, -1};
    for (size_t p = from; p < text.size(); ++p) {
      if (!special_first[static_cast<uint8_t>(text[p])]) continue;
      for (uint32_t len : special_lens) {
        if (len > text.size() - p) continue;
        const int32_t id = special_table.find(text.substr(p, len));
        if (id >= 0) return {p, id};
      }
    }
    return {std::string_view::npos, -1};
  }

  void encode_piece(std::string_view piece, std::vector<int32_t>& out, bool use_cache) const {
    if (piece.size() == 1 || !use_cache) {
      bpe.encode(piece, out);
      return;
    }
    if (bpe.rank_mode()) {  // whole-piece hit is as cheap as a cache lookup
      const int32_t id = bpe.lookup(piece);
      if (id >= 0) {
        out.push_back(id);
        return;
      }
    }
    const int32_t c = cache_keys.find(piece);
    if (c >= 0) {
      const auto [off, len] = cache_spans[c];
      out.insert(out.end(), cache_ids.begin() + off, cache_ids.begin() + off + len);
      return;
    }
    const size_t before = out.size();
    bpe.encode(piece, out);
    if (cache_spans.size() >= kCacheMax) {
      cache_keys = BytesTable();
      cache_spans.clear();
      cache_ids.clear();
    }
    cache_keys.insert(piece, static_cast<int32_t>(cache_spans.size()));
    cache_spans.emplace_back(static_cast<uint32_t>(cache_ids.size()), static_cast<uint32_t>(out.size() - before));
    cache_ids.insert(cache_ids.end(), out.begin() + before, out.end());
  }
};

Tokenizer::Tokenizer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Tokenizer::Tokenizer(Tokenizer&&) noexcept = default;
Tokenizer& Tokenizer::operator=(Tokenizer&&) noexcept = default;
Tokenizer::~Tokenizer() = default;

std::string pattern_for_pre(const std::string& pre) {
  if (pre == "kimi-k2") return kKimiPattern;
  fail("tokenizer.ggml.pre is '{}': only 'kimi-k2' (the Kimi K2/K3 pre-tokenizer) is supported", pre);
}

Tokenizer Tokenizer::from_vocab(const GgufVocab& v) {
  const std::string& src = v.source;
  check(v.model == "gpt2", "{}: tokenizer.ggml.model is '{}'; only 'gpt2' (byte-level BPE) is supported", src,
        v.model);
  check(!v.tokens.empty(), "{}: tokenizer.ggml.tokens is empty", src);
  check(v.types.empty() || v.types.size() == v.tokens.size(),
        "{}: tokenizer.ggml.token_type has {} entries, expected {} (one per token)", src, v.types.size(),
        v.tokens.size());
  check(v.tokens.size() < static_cast<size_t>(INT32_MAX), "{}: too many tokens", src);
  auto impl = std::make_unique<Impl>();
  const size_t n = v.tokens.size();
  impl->pieces.resize(n);
  impl->types.resize(n);
  impl->special.assign(n, false);
  std::vector<bool> excluded(n, false);
  for (size_t id = 0; id < n; ++id) {
    const int32_t t = v.types.empty() ? 1 : v.types[id];
    check(t >= 0 && t <= 6, "{}: tokenizer.ggml.token_type[{}] = {} is not a known token type (0..6)", src, id, t);
    const auto type = static_cast<TokenType>(t);
    impl->types[id] = type;
    const std::string& s = v.tokens[id];
    switch (type) {
      case TokenType::Normal:
      case TokenType::Undefined:
      case TokenType::Byte:
        if (!gpt2_decode(s, impl->pieces[id])) {
          unsigned b = 0;
          if (type == TokenType::Byte && s.size() == 6 && std::sscanf(s.c_str(), "<0x%02X>", &b) == 1) {
            impl->pieces[id] = std::string(1, static_cast<char>(b));
          } else {
            fail("{}: tokenizer.ggml.tokens[{}] = '{}' is not a GPT-2 byte-level string (normal tokens must "
                 "use the byte->unicode mapping)",
                 src, id, s);
          }
        }
        check(!impl->pieces[id].empty(), "{}: tokenizer.ggml.tokens[{}] is empty", src, id);
        break;
      case TokenType::Control:
      case TokenType::UserDefined:
        impl->pieces[id] = s;
        impl->special[id] = !s.empty();
        excluded[id] = true;
        break;
      case TokenType::Unknown:
      case TokenType::Unused:
        impl->pieces[id] = s;
        excluded[id] = true;
        break;
    }
  }
  if (v.merges.empty()) {
    impl->bpe.build_ranks(impl->pieces, excluded);
  } else {
    std::unordered_map<std::string_view, int32_t> by_string;
    by_string.reserve(n * 2);
    for (size_t id = 0; id < n; ++id)
      if (!excluded[id]) by_string.emplace(v.tokens[id], static_cast<int32_t>(id));
    std::vector<BpeEncoder::Merge> merges;
    merges.reserve(v.merges.size());
    std::string joined;
    for (size_t k = 0; k < v.merges.size(); ++k) {
      const std::string& m = v.merges[k];
      const size_t sp = m.find(' ');
      check(sp != std::string::npos && sp > 0 && sp + 1 < m.size() && m.find(' ', sp + 1) == std::string::npos,
            "{}: tokenizer.ggml.merges[{}] = '{}' is not of the form 'A B'", src, k, m);
      const std::string_view a(m.data(), sp), b(m.data() + sp + 1, m.size() - sp - 1);
      joined.assign(a);
      joined.append(b);
      auto ia = by_string.find(a), ib = by_string.find(b), ij = by_string.find(joined);
      check(ia != by_string.end() && ib != by_string.end() && ij != by_string.end(),
            "{}: tokenizer.ggml.merges[{}] = '{}': '{}' is not a token of the vocabulary", src, k, m,
            ia == by_string.end() ? std::string(a) : ib == by_string.end() ? std::string(b) : joined);
      merges.push_back({ia->second, ib->second, ij->second});
    }
    impl->bpe.build_merges(impl->pieces, excluded, merges);
  }
  impl->pre = std::make_unique<Pretokenizer>(pattern_for_pre(v.pre));
  auto check_id = [&](int32_t id, const char* key) {
    check(id < static_cast<int32_t>(n), "{}: {} = {} is out of range (vocabulary has {} tokens)", src, key, id, n);
    return id;
  };
  impl->bos = check_id(v.bos, "tokenizer.ggml.bos_token_id");
  impl->eos = check_id(v.eos, "tokenizer.ggml.eos_token_id");
  impl->eot = check_id(v.eot, "tokenizer.ggml.eot_token_id");
  impl->pad = check_id(v.pad, "tokenizer.ggml.padding_token_id");
  impl->add_bos = v.add_bos;
  impl->finish_specials();
  impl->finish_ids();
  return Tokenizer(std::move(impl));
}

Tokenizer Tokenizer::from_ranks(const std::vector<std::pair<std::string, int32_t>>& ranks, const std::string& pattern,
                                const std::map<std::string, int32_t>& specials) {
  int32_t max_id = -1;
  for (const auto& [bytes, r] : ranks) {
    check(r >= 0, "tiktoken ranks: negative rank {}", r);
    check(!bytes.empty(), "tiktoken ranks: empty token for rank {}", r);
    max_id = std::max(max_id, r);
  }
  for (const auto& [text, id] : specials) {
    check(id >= 0, "special token '{}': negative id {}", text, id);
    check(!text.empty(), "special tokens: empty text for id {}", id);
    max_id = std::max(max_id, id);
  }
  check(max_id >= 0, "tiktoken ranks: no tokens");
  // The id space is allocated densely: bound it by what the input holds (a few unused ids between
  // the ranks and the specials are normal; a lone rank of 10^9 in a small file is not).
  const int64_t n_given = static_cast<int64_t>(ranks.size() + specials.size());
  check(max_id < n_given + kMaxUnusedIds && max_id < kMaxVocab,
        "tiktoken ranks: id {} is out of range for {} tokens (at most {} unused ids, vocabulary < {})", max_id, n_given,
        kMaxUnusedIds, kMaxVocab);
  auto impl = std::make_unique<Impl>();
  const size_t n = static_cast<size_t>(max_id) + 1;
  impl->pieces.assign(n, std::string());
  impl->types.assign(n, TokenType::Unused);
  impl->special.assign(n, false);
  std::vector<bool> excluded(n, true);
  for (const auto& [bytes, r] : ranks) {
    check(excluded[r], "tiktoken ranks: rank {} is given twice", r);
    impl->pieces[r] = bytes;
    impl->types[r] = TokenType::Normal;
    excluded[r] = false;
  }
  for (const auto& [text, id] : specials) {
    check(excluded[id] && impl->types[id] == TokenType::Unused,
          "special token '{}' has id {}, which is already a BPE rank or another special", text, id);
    impl->pieces[id] = text;
    impl->types[id] = TokenType::Control;
    impl->special[id] = true;
  }
  impl->bpe.build_ranks(impl->pieces, excluded);
  check(!pattern.empty(), "tiktoken: a pre-tokenizer pattern is required");
  impl->pre = std::make_unique<Pretokenizer>(pattern);
  impl->finish_specials();
  // Kimi-style names, when present, give the usual ids
  impl->bos = impl->special_table.find("[BOS]");
  impl->eos = impl->special_table.find("<|end_of_msg|>");
  if (impl->eos < 0) impl->eos = impl->special_table.find("[EOS]");
  if (impl->eos < 0) impl->eos = impl->special_table.find("<|endoftext|>");
  impl->pad = impl->special_table.find("[PAD]");
  impl->finish_ids();
  return Tokenizer(std::move(impl));
}

namespace {
// Encodes `text` (appending to `out`) until out has more than `limit` tokens. The pre-tokenizer runs
// in windows of pieces, so the piece list stays small whatever the length of the text.
template <class Impl>
void encode_upto(const Impl& I, std::string_view text, std::vector<int32_t>& out, bool allow_special, size_t limit) {
  std::string sanitized;
  if (!utf8_valid(text)) {
    sanitized = utf8_sanitize(text);
    text = sanitized;
  }
  std::unique_lock<std::mutex> lk(I.cache_mu, std::try_to_lock);
  const bool use_cache = lk.owns_lock();
  constexpr size_t kWindow = 4096;  // pieces per pre-tokenizer call
  std::vector<std::string_view> pieces;
  pieces.reserve(std::min<size_t>(kWindow, text.size() / 2 + 1));
  size_t pos = 0;
  while (pos < text.size() && out.size() <= limit) {
    auto [sp, sid] = allow_special ? I.next_special(text, pos) : std::pair<size_t, int32_t>{std::string_view::npos, -1};
    const size_t end = sp == std::string_view::npos ? text.size() : sp;
    const std::string_view seg = text.substr(pos, end - pos);  // as one split() of the segment
    size_t at = 0;
    while (at < seg.size() && out.size() <= limit) {
      pieces.clear();
      at = I.pre->split_from(seg, at, kWindow, pieces);
      for (std::string_view p : pieces) I.encode_piece(p, out, use_cache);
    }
    if (sp == std::string_view::npos || out.size() > limit) break;
    out.push_back(sid);
    pos = sp + I.pieces[sid].size();
  }
}
}  // namespace

void Tokenizer::encode(std::string_view text, std::vector<int32_t>& out, bool allow_special) const {
  encode_upto(*impl_, text, out, allow_special, SIZE_MAX);
}

std::vector<int32_t> Tokenizer::encode(std::string_view text, bool allow_special) const {
  std::vector<int32_t> out;
  out.reserve(text.size() / 3 + 4);
  encode(text, out, allow_special);
  return out;
}

std::vector<int32_t> Tokenizer::encode_limited(std::string_view text, size_t max_tokens, bool allow_special) const {
  std::vector<int32_t> out;
  out.reserve(std::min(text.size() / 3, max_tokens) + 4);
  encode_upto(*impl_, text, out, allow_special, max_tokens);
  return out;
}

size_t Tokenizer::max_token_bytes() const {
  size_t m = 1;
  for (const std::string& p : impl_->pieces) m = std::max(m, p.size());
  return m;
}

std::vector<std::string> Tokenizer::split(std::string_view text, bool allow_special) const {
  std::string sanitized;
  if (!utf8_valid(text)) {
    sanitized = utf8_sanitize(text);
    text = sanitized;
  }
  const Impl& I = *impl_;
  std::vector<std::string> out;
  std::vector<std::string_view> pieces;
  size_t pos = 0;
  while (pos < text.size()) {
    auto [sp, sid] = allow_special ? I.next_special(text, pos) : std::pair<size_t, int32_t>{std::string_view::npos, -1};
    const size_t end = sp == std::string_view::npos ? text.size() : sp;
    if (end > pos) {
      pieces.clear();
      I.pre->split(text.substr(pos, end - pos), pieces);
      for (std::string_view p : pieces) out.emplace_back(p);
    }
    if (sp == std::string_view::npos) break;
    out.push_back(I.pieces[sid]);
    pos = sp + I.pieces[sid].size();
  }
  return out;
}

std::string Tokenizer::decode(std::span<const int32_t> ids) const {
  std::string out;
  for (int32_t id : ids) out += token_to_piece(id);
  return out;
}

const std::string& Tokenizer::token_to_piece(int32_t id) const {
  check(id >= 0 && static_cast<size_t>(id) < impl_->pieces.size(), "token id {} is out of range (vocabulary has {} tokens)",
        id, impl_->pieces.size());
  return impl_->pieces[id];
}

int32_t Tokenizer::token_id(std::string_view piece) const { return impl_->find_by_text(piece); }
int32_t Tokenizer::n_vocab() const { return static_cast<int32_t>(impl_->pieces.size()); }
int32_t Tokenizer::bos_id() const { return impl_->bos; }
int32_t Tokenizer::eos_id() const { return impl_->eos; }
int32_t Tokenizer::eot_id() const { return impl_->eot; }
int32_t Tokenizer::pad_id() const { return impl_->pad; }
bool Tokenizer::add_bos() const { return impl_->add_bos; }
bool Tokenizer::is_eog(int32_t id) const {
  return std::find(impl_->eog.begin(), impl_->eog.end(), id) != impl_->eog.end();
}
bool Tokenizer::is_special(int32_t id) const {
  return id >= 0 && static_cast<size_t>(id) < impl_->special.size() && impl_->special[id];
}
TokenType Tokenizer::token_type(int32_t id) const {
  check(id >= 0 && static_cast<size_t>(id) < impl_->types.size(), "token id {} is out of range", id);
  return impl_->types[id];
}
bool Tokenizer::rank_mode() const { return impl_->bpe.rank_mode(); }
const std::string& Tokenizer::pattern() const { return impl_->pre->pattern(); }

// ---------------------------------------------------------------------------------------------

std::string Detokenizer::push(int32_t id) {
  if (skip_special_ && tok_->is_special(id)) return {};
  pending_ += tok_->token_to_piece(id);
  const size_t tail = utf8_incomplete_tail(pending_);
  std::string out = utf8_sanitize(std::string_view(pending_).substr(0, pending_.size() - tail));
  pending_.erase(0, pending_.size() - tail);
  return out;
}

std::string Detokenizer::flush() {
  std::string out = utf8_sanitize(pending_);
  pending_.clear();
  return out;
}

}  // namespace kimi::tok
