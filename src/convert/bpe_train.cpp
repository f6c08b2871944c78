#include "convert/bpe_train.h"

#include <algorithm>
#include <unordered_map>

#include "util/error.h"

namespace kimi::bpe {
namespace {

enum class Cls : uint8_t { Letter, Han, Digit, Space, Other };

struct Char {
  uint32_t cp;
  size_t pos;  // byte offset
  Cls cls;
};

// Decode one UTF-8 sequence at s[i]; invalid or truncated sequences give (0xFFFD, 1).
uint32_t decode_utf8(std::string_view s, size_t i, size_t* len) {
  auto b0 = static_cast<uint8_t>(s[i]);
  *len = 1;
  if (b0 < 0x80) return b0;
  size_t n = b0 >= 0xF0 && b0 < 0xF5 ? 4 : b0 >= 0xE0 && b0 < 0xF0 ? 3 : b0 >= 0xC2 && b0 < 0xE0 ? 2 : 0;
  if (n == 0 || i + n > s.size()) return 0xFFFD;
  uint32_t cp = b0 & (n == 2 ? 0x1F : n == 3 ? 0x0F : 0x07);
  for (size_t k = 1; k < n; ++k) {
    auto b = static_cast<uint8_t>(s[i + k]);
    if ((b & 0xC0) != 0x80) return 0xFFFD;
    cp = (cp << 6) | (b & 0x3F);
  }
  // reject overlong / surrogate / out of range forms
  if ((n == 3 && cp < 0x800) || (n == 4 && (cp < 0x10000 || cp > 0x10FFFF)) || (cp >= 0xD800 && cp <= 0xDFFF))
    return 0xFFFD;
  *len = n;
  return cp;
}

bool is_han(uint32_t c) {
  return (c >= 0x3400 && c <= 0x4DBF) || (c >= 0x4E00 && c <= 0x9FFF) || (c >= 0xF900 && c <= 0xFAFF) ||
         (c >= 0x20000 && c <= 0x3134F);
}

Cls classify(uint32_t c) {
  if (c < 0x80) {
    if ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z')) return Cls::Letter;
    if (c >= '0' && c <= '9') return Cls::Digit;
    if (c == ' ' || (c >= '\t' && c <= '\r')) return Cls::Space;
    return Cls::Other;
  }
  if (c == 0x85 || c == 0xA0 || c == 0x1680 || (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 ||
      c == 0x202F || c == 0x205F || c == 0x3000)
    return Cls::Space;
  if (is_han(c)) return Cls::Han;
  if (c < 0xC0) return (c == 0xAA || c == 0xB5 || c == 0xBA) ? Cls::Letter : Cls::Other;
  if (c == 0xD7 || c == 0xF7 || c == 0xFFFD) return Cls::Other;
  if ((c >= 0x2000 && c <= 0x2BFF) || (c >= 0x2E00 && c <= 0x2E7F) || (c >= 0x3000 && c <= 0x303F) ||
      (c >= 0xE000 && c <= 0xF8FF) || (c >= 0xFE10 && c <= 0xFE6F) || (c >= 0xFF01 && c <= 0xFF20) ||
      (c >= 0xFF3B && c <= 0xFF40) || (c >= 0xFF5B && c <= 0xFF65) || (c >= 0x1F000 && c <= 0x1FAFF))
    return Cls::Other;
  return Cls::Letter;
}

bool is_newline(uint32_t c) { return c == '\r' || c == '\n'; }

// length in bytes of a contraction ('s 't 're 've 'm 'll 'd, case-insensitive) at s[i], or 0
size_t contraction(std::string_view s, size_t i) {
  if (i + 1 >= s.size() || s[i] != '\'') return 0;
  auto low = [&](size_t k) { return k < s.size() ? static_cast<char>(s[k] | 0x20) : '\0'; };
  char c1 = low(i + 1), c2 = low(i + 2);
  if (c1 == 's' || c1 == 't' || c1 == 'm' || c1 == 'd') return 2;
  if ((c1 == 'r' && c2 == 'e') || (c1 == 'v' && c2 == 'e') || (c1 == 'l' && c2 == 'l')) return 3;
  return 0;
}

struct HeapEntry {
  int64_t count;
  uint64_t key;
};
// max-heap on count; equal counts: the smaller key (left id, then right id) comes first
bool heap_less(const HeapEntry& x, const HeapEntry& y) {
  return x.count < y.count || (x.count == y.count && x.key > y.key);
}

uint64_t pair_key(int32_t a, int32_t b) { return (static_cast<uint64_t>(a) << 32) | static_cast<uint32_t>(b); }

}  // namespace

std::vector<std::string_view> pre_split(std::string_view text) {
  std::vector<Char> ch;
  ch.reserve(text.size());
  for (size_t i = 0; i < text.size();) {
    size_t len;
    uint32_t cp = decode_utf8(text, i, &len);
    ch.push_back({cp, i, classify(cp)});
    i += len;
  }
  const size_t n = ch.size();
  auto pos = [&](size_t k) -> size_t { return k < n ? ch[k].pos : text.size(); };
  std::vector<std::string_view> out;
  for (size_t i = 0; i < n;) {
    const Cls c = ch[i].cls;
    size_t j = i;
    if (c == Cls::Han) {
      while (j < n && ch[j].cls == Cls::Han) ++j;
    } else if (c == Cls::Letter ||
               (c != Cls::Digit && !is_newline(ch[i].cp) && i + 1 < n && ch[i + 1].cls == Cls::Letter)) {
      j = c == Cls::Letter ? i : i + 1;
      while (j < n && ch[j].cls == Cls::Letter) ++j;
      j += contraction(text, pos(j));  // ASCII: one char per byte
    } else if (c == Cls::Digit) {
      while (j < n && j < i + 3 && ch[j].cls == Cls::Digit) ++j;
    } else if (c == Cls::Other || (ch[i].cp == ' ' && i + 1 < n && ch[i + 1].cls == Cls::Other)) {
      j = c == Cls::Other ? i : i + 1;
      while (j < n && ch[j].cls == Cls::Other) ++j;
      while (j < n && is_newline(ch[j].cp)) ++j;
    } else {  // whitespace
      size_t k = i;
      while (k < n && ch[k].cls == Cls::Space) ++k;
      size_t last_nl = n;
      for (size_t m = i; m < k; ++m)
        if (is_newline(ch[m].cp)) last_nl = m;
      if (last_nl != n) j = last_nl + 1;        // \s*[\r\n]+
      else if (k == n || k - i == 1) j = k;     // \s+(?!\S) at the end, or \s+
      else j = k - 1;                           // \s+(?!\S): leave one space for the next chunk
    }
    if (j == i) j = i + 1;  // cannot happen, but never loop forever
    out.push_back(text.substr(pos(i), pos(j) - pos(i)));
    i = j;
  }
  return out;
}

std::vector<std::string> train(std::string_view text, const TrainOptions& opt) {
  check(opt.n_tokens >= 256, "bpe: vocabulary size {} is smaller than the 256 byte tokens", opt.n_tokens);
  std::vector<std::string> tokens;
  tokens.reserve(opt.n_tokens);
  for (int b = 0; b < 256; ++b) tokens.emplace_back(1, static_cast<char>(b));
  if (opt.n_tokens == 256) return tokens;

  // unique chunks with their frequencies, in a fixed (sorted) order
  std::unordered_map<std::string_view, int64_t> freq;
  for (auto c : pre_split(text))
    if (c.size() >= 2) ++freq[c];
  std::vector<std::pair<std::string_view, int64_t>> uniq(freq.begin(), freq.end());
  std::sort(uniq.begin(), uniq.end());
  freq.clear();

  const size_t n_words = uniq.size();
  std::vector<std::vector<int32_t>> words(n_words);
  std::vector<int64_t> wfreq(n_words);
  std::unordered_map<uint64_t, int64_t> pair_count;
  std::unordered_map<uint64_t, std::vector<int32_t>> where;
  for (size_t w = 0; w < n_words; ++w) {
    auto s = uniq[w].first;
    wfreq[w] = uniq[w].second;
    auto& sym = words[w];
    sym.reserve(s.size());
    for (char c : s) sym.push_back(static_cast<uint8_t>(c));
    for (size_t i = 0; i + 1 < sym.size(); ++i) {
      uint64_t k = pair_key(sym[i], sym[i + 1]);
      pair_count[k] += wfreq[w];
      auto& wl = where[k];
      if (wl.empty() || wl.back() != static_cast<int32_t>(w)) wl.push_back(static_cast<int32_t>(w));
    }
  }
  std::vector<HeapEntry> heap;
  heap.reserve(pair_count.size() * 2);
  for (auto& [k, cnt] : pair_count) heap.push_back({cnt, k});
  std::make_heap(heap.begin(), heap.end(), heap_less);

  std::unordered_map<std::string, int32_t> token_id;
  token_id.reserve(opt.n_tokens * 2);
  for (int32_t i = 0; i < 256; ++i) token_id.emplace(tokens[i], i);

  std::vector<uint32_t> stamp(n_words, 0);
  uint32_t merge_no = 0;
  std::vector<int32_t> merged;
  std::vector<uint64_t> touched;
  size_t next_report = 0;

  while (tokens.size() < opt.n_tokens) {
    if (opt.progress && tokens.size() >= next_report) {
      opt.progress(tokens.size(), opt.n_tokens);
      next_report = tokens.size() + 1024;
    }
    if (heap.empty())
      fail("bpe: the training text ({} bytes, {} distinct chunks) has no pairs left after {} tokens; "
           "{} tokens were requested (use a longer text)",
           text.size(), n_words, tokens.size(), opt.n_tokens);
    std::pop_heap(heap.begin(), heap.end(), heap_less);
    HeapEntry e = heap.back();
    heap.pop_back();
    auto pc = pair_count.find(e.key);
    int64_t cur = pc == pair_count.end() ? 0 : pc->second;
    if (cur != e.count) {  // stale entry
      if (cur > 0 && cur < e.count) {
        heap.push_back({cur, e.key});
        std::push_heap(heap.begin(), heap.end(), heap_less);
      }
      continue;
    }
    if (cur <= 0) continue;

    const auto a = static_cast<int32_t>(e.key >> 32);
    const auto b = static_cast<int32_t>(e.key & 0xffffffffu);
    std::string cat = tokens[a] + tokens[b];
    int32_t t;
    if (auto it = token_id.find(cat); it != token_id.end()) {
      t = it->second;  // the same bytes were already learned from another split: reuse that token
    } else {
      t = static_cast<int32_t>(tokens.size());
      token_id.emplace(cat, t);
      tokens.push_back(std::move(cat));
    }

    std::vector<int32_t> wl;
    if (auto it = where.find(e.key); it != where.end()) {
      wl = std::move(it->second);
      where.erase(it);
    }
    ++merge_no;
    touched.clear();
    for (int32_t w : wl) {
      if (stamp[w] == merge_no) continue;
      stamp[w] = merge_no;
      auto& sym = words[w];
      merged.clear();
      bool any = false;
      for (size_t i = 0; i < sym.size();) {
        if (i + 1 < sym.size() && sym[i] == a && sym[i + 1] == b) {
          merged.push_back(t);
          i += 2;
          any = true;
        } else {
          merged.push_back(sym[i++]);
        }
      }
      if (!any) continue;
      const int64_t f = wfreq[w];
      for (size_t i = 0; i + 1 < sym.size(); ++i) pair_count[pair_key(sym[i], sym[i + 1])] -= f;
      for (size_t i = 0; i + 1 < merged.size(); ++i) {
        uint64_t k = pair_key(merged[i], merged[i + 1]);
        pair_count[k] += f;
        if (merged[i] == t || merged[i + 1] == t) {
          auto& l = where[k];
          if (l.empty() || l.back() != w) l.push_back(w);
          touched.push_back(k);
        }
      }
      sym.swap(merged);
    }
    std::sort(touched.begin(), touched.end());
    touched.erase(std::unique(touched.begin(), touched.end()), touched.end());
    for (uint64_t k : touched) {
      int64_t c = pair_count[k];
      if (c > 0) {
        heap.push_back({c, k});
        std::push_heap(heap.begin(), heap.end(), heap_less);
      }
    }
    if (auto it = pair_count.find(e.key); it != pair_count.end() && it->second <= 0) pair_count.erase(it);
  }
  if (opt.progress) opt.progress(tokens.size(), opt.n_tokens);
  return tokens;
}

std::string base64_encode(std::string_view in) {
  static const char* tbl = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
  std::string out;
  out.reserve((in.size() + 2) / 3 * 4);
  size_t i = 0;
  for (; i + 3 <= in.size(); i += 3) {
    uint32_t v = (uint32_t(uint8_t(in[i])) << 16) | (uint32_t(uint8_t(in[i + 1])) << 8) | uint8_t(in[i + 2]);
    out += tbl[v >> 18];
    out += tbl[(v >> 12) & 63];
    out += tbl[(v >> 6) & 63];
    out += tbl[v & 63];
  }
  size_t rest = in.size() - i;
  if (rest) {
    uint32_t v = uint32_t(uint8_t(in[i])) << 16;
    if (rest == 2) v |= uint32_t(uint8_t(in[i + 1])) << 8;
    out += tbl[v >> 18];
    out += tbl[(v >> 12) & 63];
    out += rest == 2 ? tbl[(v >> 6) & 63] : '=';
    out += '=';
  }
  return out;
}

std::string to_tiktoken(const std::vector<std::string>& tokens) {
  std::string out;
  out.reserve(tokens.size() * 16);
  for (size_t r = 0; r < tokens.size(); ++r) {
    out += base64_encode(tokens[r]);
    out += ' ';
    out += std::to_string(r);
    out += '\n';
  }
  return out;
}

}  // namespace kimi::bpe
