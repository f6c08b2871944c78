#include "tokenizer/tiktoken_file.h"

#include <nlohmann/json.hpp>

#include <charconv>

#include "util/error.h"
#include "util/json.h"
#include "util/mmap.h"

namespace kimi::tok {

bool base64_decode(std::string_view in, std::string& out) {
  out.clear();
  if (in.size() % 4 != 0 || in.empty()) return false;
  auto val = [](char c) -> int {
    if (c >= 'A' && c <= 'Z') return c - 'A';
    if (c >= 'a' && c <= 'z') return c - 'a' + 26;
    if (c >= '0' && c <= '9') return c - '0' + 52;
    if (c == '+') return 62;
    if (c == '/') return 63;
    return -1;
  };
  for (size_t i = 0; i < in.size(); i += 4) {
    int v[4];
    int pad = 0;
    for (int k = 0; k < 4; ++k) {
      const char c = in[i + k];
      if (c == '=') {
        if (i + 4 != in.size() || k < 2) return false;
        v[k] = 0;
        ++pad;
      } else {
        if (pad) return false;
        v[k] = val(c);
        if (v[k] < 0) return false;
      }
    }
    const uint32_t w = (v[0] << 18) | (v[1] << 12) | (v[2] << 6) | v[3];
    out.push_back(static_cast<char>(w >> 16));
    if (pad < 2) out.push_back(static_cast<char>((w >> 8) & 0xFF));
    if (pad < 1) out.push_back(static_cast<char>(w & 0xFF));
  }
  return true;
}

namespace {

bool parse_int(std::string_view s, int32_t& v) {
  if (s.empty()) return false;
  auto [p, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  return ec == std::errc() && p == s.data() + s.size() && v >= 0;
}

void parse_plain(std::string_view content, const std::string& label, TiktokenData& d) {
  size_t pos = 0, line_no = 0;
  std::string bytes;
  while (pos < content.size()) {
    size_t eol = content.find('\n', pos);
    if (eol == std::string_view::npos) eol = content.size();
    std::string_view line = content.substr(pos, eol - pos);
    pos = eol + 1;
    ++line_no;
    if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
    if (line.empty()) continue;
    const size_t sp = line.find(' ');
    int32_t rank = 0;
    check(sp != std::string_view::npos && parse_int(line.substr(sp + 1), rank),
          "{}:{}: expected '<base64 token> <rank>', found '{}'", label, line_no, line.substr(0, 80));
    check(base64_decode(line.substr(0, sp), bytes), "{}:{}: '{}' is not valid base64", label, line_no,
          line.substr(0, std::min<size_t>(sp, 80)));
    d.ranks.emplace_back(bytes, rank);
  }
}

void parse_npm_json(std::string_view content, const std::string& label, TiktokenData& d) {
  nlohmann::json j;
  try {
    j = parse_json<nlohmann::json>(content, label);  // depth-limited
  } catch (const JsonError& e) {
    if (e.too_deep) throw;
    fail("{}: not valid JSON: {}", label, e.what());
  }
  check(j.is_object() && j.contains("bpe_ranks") && j["bpe_ranks"].is_string(),
        "{}: expected a tiktoken encoder JSON with a string field 'bpe_ranks'", label);
  if (j.contains("pat_str")) {
    check(j["pat_str"].is_string(), "{}: 'pat_str' must be a string", label);
    d.pattern = j["pat_str"].get<std::string>();
  }
  if (j.contains("special_tokens")) {
    check(j["special_tokens"].is_object(), "{}: 'special_tokens' must be an object", label);
    for (auto& [k, v] : j["special_tokens"].items()) {
      check(v.is_number_integer() && v.get<int64_t>() >= 0 && v.get<int64_t>() < INT32_MAX,
            "{}: special_tokens['{}'] must be a non-negative integer id", label, k);
      d.specials[k] = v.get<int32_t>();
    }
  }
  const std::string& br = j["bpe_ranks"].get_ref<const std::string&>();
  std::string_view all(br);
  size_t pos = 0, line_no = 0;
  std::string bytes;
  while (pos < all.size()) {
    size_t eol = all.find('\n', pos);
    if (eol == std::string_view::npos) eol = all.size();
    std::string_view line = all.substr(pos, eol - pos);
    pos = eol + 1;
    ++line_no;
    if (line.empty()) continue;
    // "! START tok tok ...": consecutive ranks from START
    size_t a = line.find(' ');
    size_t b = a == std::string_view::npos ? a : line.find(' ', a + 1);
    int32_t start = 0;
    check(a != std::string_view::npos && b != std::string_view::npos && parse_int(line.substr(a + 1, b - a - 1), start),
          "{}: bpe_ranks line {}: expected '! <start rank> <base64> ...'", label, line_no);
    size_t p = b + 1;
    int64_t rank = start;
    while (p <= line.size()) {
      size_t q = line.find(' ', p);
      if (q == std::string_view::npos) q = line.size();
      if (q > p) {
        check(base64_decode(line.substr(p, q - p), bytes), "{}: bpe_ranks line {}: '{}' is not valid base64", label,
              line_no, line.substr(p, std::min<size_t>(q - p, 80)));
        check(rank < INT32_MAX, "{}: bpe_ranks: rank overflow", label);
        d.ranks.emplace_back(bytes, static_cast<int32_t>(rank++));
      }
      p = q + 1;
    }
  }
}

}  // namespace

TiktokenData parse_tiktoken(std::string_view content, const std::string& label) {
  TiktokenData d;
  size_t first = content.find_first_not_of(" \t\r\n");
  if (first != std::string_view::npos && content[first] == '{')
    parse_npm_json(content, label, d);
  else
    parse_plain(content, label, d);
  check(!d.ranks.empty(), "{}: no ranks found", label);
  return d;
}

TiktokenData read_tiktoken_file(const std::string& path) {
  MappedFile f(path);
  return parse_tiktoken(std::string_view(reinterpret_cast<const char*>(f.data()), f.size()), path);
}

}  // namespace kimi::tok
