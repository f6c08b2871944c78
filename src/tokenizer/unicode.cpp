#include "tokenizer/unicode.h"

#include <array>

namespace kimi::tok {

void utf8_append(std::string& out, uint32_t cp) {
  if (cp < 0x80) {
    out.push_back(static_cast<char>(cp));
  } else if (cp < 0x800) {
    out.push_back(static_cast<char>(0xC0 | (cp >> 6)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else if (cp < 0x10000) {
    out.push_back(static_cast<char>(0xE0 | (cp >> 12)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else {
    out.push_back(static_cast<char>(0xF0 | (cp >> 18)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  }
}

namespace {
// For a lead byte: number of continuation bytes (-1 = invalid lead) and the allowed range of
// the FIRST continuation byte (this is what excludes overlongs, surrogates and > U+10FFFF).
struct Lead {
  int n;
  uint8_t lo, hi;
};
inline Lead lead_info(uint8_t b) {
  if (b < 0x80) return {0, 0, 0};
  if (b < 0xC2) return {-1, 0, 0};
  if (b < 0xE0) return {1, 0x80, 0xBF};
  if (b == 0xE0) return {2, 0xA0, 0xBF};
  if (b == 0xED) return {2, 0x80, 0x9F};
  if (b < 0xF0) return {2, 0x80, 0xBF};
  if (b == 0xF0) return {3, 0x90, 0xBF};
  if (b < 0xF4) return {3, 0x80, 0xBF};
  if (b == 0xF4) return {3, 0x80, 0x8F};
  return {-1, 0, 0};
}
}  // namespace

size_t utf8_decode(std::string_view s, size_t i, uint32_t& cp) {
  if (i >= s.size()) return 0;
  const uint8_t b0 = static_cast<uint8_t>(s[i]);
  const Lead L = lead_info(b0);
  if (L.n == 0) {
    cp = b0;
    return 1;
  }
  if (L.n < 0 || i + static_cast<size_t>(L.n) >= s.size()) return 0;
  const uint8_t b1 = static_cast<uint8_t>(s[i + 1]);
  if (b1 < L.lo || b1 > L.hi) return 0;
  uint32_t c = (b0 & (0x3F >> L.n)) << (6 * L.n);
  c |= static_cast<uint32_t>(b1 & 0x3F) << (6 * (L.n - 1));
  for (int k = 2; k <= L.n; ++k) {
    const uint8_t b = static_cast<uint8_t>(s[i + k]);
    if ((b & 0xC0) != 0x80) return 0;
    c |= static_cast<uint32_t>(b & 0x3F) << (6 * (L.n - k));
  }
  cp = c;
  return static_cast<size_t>(L.n) + 1;
}

bool utf8_valid(std::string_view s) {
  size_t i = 0;
  uint32_t cp;
  while (i < s.size()) {
    if (static_cast<uint8_t>(s[i]) < 0x80) {
      ++i;
      continue;
    }
    const size_t n = utf8_decode(s, i, cp);
    if (!n) return false;
    i += n;
  }
  return true;
}

std::string utf8_sanitize(std::string_view s) {
  if (utf8_valid(s)) return std::string(s);
  std::string out;
  out.reserve(s.size() + 16);
  size_t i = 0;
  while (i < s.size()) {
    const uint8_t b0 = static_cast<uint8_t>(s[i]);
    const Lead L = lead_info(b0);
    if (L.n == 0) {
      out.push_back(static_cast<char>(b0));
      ++i;
      continue;
    }
    if (L.n < 0) {  // not a lead byte at all: one replacement for this byte
      out += "\xEF\xBF\xBD";
      ++i;
      continue;
    }
    // Consume the maximal subpart: the lead plus as many valid continuation bytes as fit.
    size_t k = 1;
    bool ok = true;
    for (; k <= static_cast<size_t>(L.n); ++k) {
      if (i + k >= s.size()) {
        ok = false;
        break;
      }
      const uint8_t b = static_cast<uint8_t>(s[i + k]);
      const uint8_t lo = k == 1 ? L.lo : 0x80, hi = k == 1 ? L.hi : 0xBF;
      if (b < lo || b > hi) {
        ok = false;
        break;
      }
    }
    if (ok) {
      out.append(s.substr(i, L.n + 1));
      i += L.n + 1;
    } else {
      out += "\xEF\xBF\xBD";
      i += k;  // the lead and the valid continuation bytes seen so far form one maximal subpart
    }
  }
  return out;
}

size_t utf8_incomplete_tail(std::string_view s) {
  // Look back at most 3 bytes for a lead byte whose sequence is cut off by the end of s and whose
  // bytes so far are a valid prefix.
  const size_t n = s.size();
  for (size_t back = 1; back <= 3 && back <= n; ++back) {
    const uint8_t b = static_cast<uint8_t>(s[n - back]);
    if ((b & 0xC0) == 0x80) continue;  // continuation byte: keep looking for the lead
    const Lead L = lead_info(b);
    if (L.n <= 0 || static_cast<size_t>(L.n) < back) return 0;  // ASCII, invalid lead or complete
    // verify the continuation bytes present form a valid prefix
    for (size_t k = 1; k < back; ++k) {
      const uint8_t c = static_cast<uint8_t>(s[n - back + k]);
      const uint8_t lo = k == 1 ? L.lo : 0x80, hi = k == 1 ? L.hi : 0xBF;
      if (c < lo || c > hi) return 0;
    }
    return back;
  }
  return 0;
}

namespace {
struct Gpt2Tables {
  std::array<uint32_t, 256> to_cp{};
  std::array<int16_t, 324> from_cp{};  // code points used are < 0x144
  Gpt2Tables() {
    from_cp.fill(-1);
    int extra = 0;
    for (int b = 0; b < 256; ++b) {
      const bool printable = (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
      to_cp[b] = printable ? static_cast<uint32_t>(b) : static_cast<uint32_t>(256 + extra++);
      from_cp[to_cp[b]] = static_cast<int16_t>(b);
    }
  }
};
const Gpt2Tables& gpt2() {
  static const Gpt2Tables t;
  return t;
}
}  // namespace

uint32_t gpt2_byte_to_cp(uint8_t b) { return gpt2().to_cp[b]; }

std::string gpt2_encode(std::string_view bytes) {
  const auto& t = gpt2();
  std::string out;
  out.reserve(bytes.size() * 2);
  for (char c : bytes) utf8_append(out, t.to_cp[static_cast<uint8_t>(c)]);
  return out;
}

bool gpt2_decode(std::string_view s, std::string& bytes_out) {
  const auto& t = gpt2();
  bytes_out.clear();
  size_t i = 0;
  uint32_t cp;
  while (i < s.size()) {
    const size_t n = utf8_decode(s, i, cp);
    if (!n || cp >= t.from_cp.size() || t.from_cp[cp] < 0) return false;
    bytes_out.push_back(static_cast<char>(t.from_cp[cp]));
    i += n;
  }
  return true;
}

}  // namespace kimi::tok
