#include "convert/vocab.h"

#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <type_traits>
#include <unordered_map>
#include <unordered_set>

#include "io/hf_config.h"
#include "util/error.h"
#include "util/json.h"
#include "util/paths.h"

namespace fs = std::filesystem;

namespace kimi::convert {

namespace {

void append_utf8(std::string& s, uint32_t cp) {
  if (cp < 0x80) {
    s += static_cast<char>(cp);
  } else if (cp < 0x800) {
    s += static_cast<char>(0xC0 | (cp >> 6));
    s += static_cast<char>(0x80 | (cp & 0x3F));
  } else {
    s += static_cast<char>(0xE0 | (cp >> 12));
    s += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    s += static_cast<char>(0x80 | (cp & 0x3F));
  }
}

std::array<uint32_t, 256> byte_codepoints() {
  std::array<uint32_t, 256> cp{};
  std::array<bool, 256> direct{};
  for (int b = '!'; b <= '~'; ++b) direct[b] = true;
  for (int b = 0xA1; b <= 0xAC; ++b) direct[b] = true;
  for (int b = 0xAE; b <= 0xFF; ++b) direct[b] = true;
  uint32_t n = 0;
  for (int b = 0; b < 256; ++b) cp[b] = direct[b] ? static_cast<uint32_t>(b) : 256 + n++;
  return cp;
}

std::string read_text(const std::string& path) {
  return read_input_file(path);  // regular files only (a FIFO would block), bounded size
}

nlohmann::json parse_json_file(const std::string& path) {
  std::string text = read_text(path);
  try {
    return parse_json<nlohmann::json>(text, path);  // depth-limited
  } catch (const JsonError& e) {
    if (e.too_deep) throw;
    auto [line, col] = json_line_col(text, e.byte);
    fail("{}: invalid JSON at line {}, column {}: {}", path, line, col, e.what());
  }
}

std::optional<uint32_t> config_id(const HfConfig& cfg, const std::string& key) {
  if (!cfg.has(key) || cfg.get(key).is_null()) return std::nullopt;
  int64_t v = cfg.get_int(key);
  check(v >= 0 && v <= 0xFFFFFFFFll, "{}: key '{}' = {} is not a valid token id", cfg.path, key, v);
  return static_cast<uint32_t>(v);
}

// An optional boolean or string field of a JSON object: `dflt` when absent or null, an error naming
// the file and the field when it has another type (the library's own exception would name neither).
template <class T>
T opt_field(const nlohmann::json& obj, const char* key, const T& dflt, const std::string& where) {
  static_assert(std::is_same_v<T, bool> || std::is_same_v<T, std::string>);
  if (!obj.is_object()) return dflt;
  auto it = obj.find(key);
  if (it == obj.end() || it->is_null()) return dflt;
  constexpr bool kBool = std::is_same_v<T, bool>;
  check(kBool ? it->is_boolean() : it->is_string(), "{}: '{}' must be {}, got {} {}", where, key,
        kBool ? "true or false" : "a string", it->type_name(), it->dump().substr(0, 40));
  return it->get<T>();
}

std::string token_content(const nlohmann::json& j) {
  if (j.is_string()) return j.get<std::string>();
  if (j.is_object() && j.contains("content") && j["content"].is_string()) return j["content"].get<std::string>();
  return {};
}

}  // namespace

const std::array<std::string, 256>& gpt2_byte_to_unicode() {
  static const std::array<std::string, 256> table = [] {
    std::array<std::string, 256> t;
    auto cp = byte_codepoints();
    for (int b = 0; b < 256; ++b) append_utf8(t[b], cp[b]);
    return t;
  }();
  return table;
}

std::string gpt2_encode_bytes(std::string_view bytes) {
  const auto& t = gpt2_byte_to_unicode();
  std::string s;
  s.reserve(bytes.size() * 2);
  for (unsigned char c : bytes) s += t[c];
  return s;
}

bool gpt2_decode(std::string_view s, std::string* bytes) {
  static const std::unordered_map<uint32_t, uint8_t> inv = [] {
    std::unordered_map<uint32_t, uint8_t> m;
    auto cp = byte_codepoints();
    for (int b = 0; b < 256; ++b) m[cp[b]] = static_cast<uint8_t>(b);
    return m;
  }();
  bytes->clear();
  size_t i = 0;
  while (i < s.size()) {
    unsigned char c = s[i];
    uint32_t cp;
    size_t n;
    if (c < 0x80) { cp = c; n = 1; }
    else if ((c & 0xE0) == 0xC0) { cp = c & 0x1F; n = 2; }
    else if ((c & 0xF0) == 0xE0) { cp = c & 0x0F; n = 3; }
    else return false;
    if (i + n > s.size()) return false;
    for (size_t k = 1; k < n; ++k) {
      unsigned char d = s[i + k];
      if ((d & 0xC0) != 0x80) return false;
      cp = (cp << 6) | (d & 0x3F);
    }
    auto it = inv.find(cp);
    if (it == inv.end()) return false;
    *bytes += static_cast<char>(it->second);
    i += n;
  }
  return true;
}

bool base64_decode(std::string_view in, std::string* out) {
  out->clear();
  uint32_t acc = 0;
  int bits = 0;
  size_t pad = 0;
  for (char ch : in) {
    int v;
    if (ch >= 'A' && ch <= 'Z') v = ch - 'A';
    else if (ch >= 'a' && ch <= 'z') v = ch - 'a' + 26;
    else if (ch >= '0' && ch <= '9') v = ch - '0' + 52;
    else if (ch == '+') v = 62;
    else if (ch == '/') v = 63;
    else if (ch == '=') { ++pad; continue; }
    else return false;
    if (pad) return false;  // data after padding
    acc = (acc << 6) | static_cast<uint32_t>(v);
    bits += 6;
    if (bits >= 8) {
      bits -= 8;
      *out += static_cast<char>((acc >> bits) & 0xFF);
    }
  }
  if (pad > 2) return false;
  // leftover bits must be zero padding of a partial group (2 or 4 bits)
  if (bits >= 6) return false;
  if (bits > 0 && (acc & ((1u << bits) - 1)) != 0) return false;
  return true;
}

std::vector<std::string> parse_tiktoken(const std::string& text, const std::string& label) {
  std::vector<std::pair<int64_t, std::string>> entries;
  size_t pos = 0, line_no = 0;
  while (pos < text.size()) {
    size_t end = text.find('\n', pos);
    if (end == std::string::npos) end = text.size();
    std::string_view line(text.data() + pos, end - pos);
    pos = end + 1;
    ++line_no;
    if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
    if (line.empty()) continue;
    size_t sp = line.find(' ');
    check(sp != std::string_view::npos && sp > 0 && sp + 1 < line.size(),
          "{}:{}: expected 'BASE64 RANK', found '{}'", label, line_no, std::string(line.substr(0, 80)));
    std::string_view b64 = line.substr(0, sp), rank_s = line.substr(sp + 1);
    int64_t rank = 0;
    for (char c : rank_s) {
      check(c >= '0' && c <= '9' && rank < (int64_t(1) << 40), "{}:{}: invalid rank '{}'", label, line_no,
            std::string(rank_s));
      rank = rank * 10 + (c - '0');
    }
    std::string bytes;
    check(base64_decode(b64, &bytes), "{}:{}: invalid base64 '{}'", label, line_no, std::string(b64));
    check(!bytes.empty(), "{}:{}: empty token", label, line_no);
    entries.emplace_back(rank, std::move(bytes));
  }
  check(!entries.empty(), "{}: no tokens", label);
  std::vector<std::string> by_rank(entries.size());
  std::vector<bool> seen(entries.size(), false);
  for (auto& [rank, bytes] : entries) {
    check(rank < static_cast<int64_t>(entries.size()),
          "{}: rank {} out of range: ranks must be 0..{} (one line per rank)", label, rank, entries.size() - 1);
    check(!seen[rank], "{}: rank {} appears twice", label, rank);
    seen[rank] = true;
    by_rank[rank] = std::move(bytes);
  }
  std::unordered_set<std::string_view> uniq;
  for (size_t r = 0; r < by_rank.size(); ++r)
    check(uniq.insert(by_rank[r]).second, "{}: token of rank {} duplicates an earlier token", label, r);
  return by_rank;
}

std::vector<std::string> load_tiktoken(const std::string& path) { return parse_tiktoken(read_text(path), path); }

std::vector<std::string> reconstruct_merges(const std::vector<std::string>& toks) {
  std::unordered_map<std::string_view, int32_t> rank_of;
  rank_of.reserve(toks.size() * 2);
  for (size_t r = 0; r < toks.size(); ++r) rank_of.emplace(toks[r], static_cast<int32_t>(r));
  std::vector<std::string> merges;
  merges.reserve(toks.size());
  std::vector<uint32_t> starts;  // piece boundaries: piece k = [starts[k], starts[k+1])
  std::vector<int32_t> pair_rank;
  for (size_t r = 0; r < toks.size(); ++r) {
    const std::string& t = toks[r];
    if (t.size() < 2) continue;
    const int32_t max_rank = static_cast<int32_t>(r);
    starts.resize(t.size() + 1);
    for (uint32_t i = 0; i <= t.size(); ++i) starts[i] = i;
    auto rank_at = [&](size_t k) -> int32_t {  // rank of piece k + piece k+1, or -1
      std::string_view sv(t.data() + starts[k], starts[k + 2] - starts[k]);
      auto it = rank_of.find(sv);
      return (it != rank_of.end() && it->second < max_rank) ? it->second : -1;
    };
    pair_rank.resize(t.size() - 1);
    for (size_t k = 0; k + 1 < t.size(); ++k) pair_rank[k] = rank_at(k);
    size_t n_pieces = t.size();
    while (n_pieces > 2) {
      int32_t best = -1;
      size_t bi = 0;
      for (size_t k = 0; k + 1 < n_pieces; ++k) {
        if (pair_rank[k] >= 0 && (best < 0 || pair_rank[k] < best)) {
          best = pair_rank[k];
          bi = k;
        }
      }
      if (best < 0) break;
      // merge pieces bi and bi+1
      starts.erase(starts.begin() + bi + 1);
      pair_rank.erase(pair_rank.begin() + bi);
      --n_pieces;
      if (bi + 1 < n_pieces) pair_rank[bi] = rank_at(bi);
      if (bi > 0) pair_rank[bi - 1] = rank_at(bi - 1);
    }
    if (n_pieces == 2) {
      std::string_view a(t.data(), starts[1]), b(t.data() + starts[1], t.size() - starts[1]);
      merges.push_back(gpt2_encode_bytes(a) + " " + gpt2_encode_bytes(b));
    }
  }
  return merges;
}

Vocab load_vocab(const std::string& hf_dir, const HfConfig& cfg) {
  Vocab v;
  const int64_t vocab_size = cfg.get_int("vocab_size");
  check(vocab_size > 0 && vocab_size < (int64_t(1) << 31), "{}: vocab_size {} out of range", cfg.path, vocab_size);
  const size_t V = static_cast<size_t>(vocab_size);
  std::vector<std::string> tokens(V);
  std::vector<int32_t> types(V, 0);  // 0 = not set yet

  fs::path dir(hf_dir);
  fs::path tk_path = dir / "tiktoken.model", tj_path = dir / "tokenizer.json", tc_path = dir / "tokenizer_config.json";
  nlohmann::json tc = nlohmann::json::object();
  if (fs::exists(tc_path)) {
    tc = parse_json_file(tc_path.string());
    check(tc.is_object(), "{}: expected a JSON object", tc_path.string());
  }
  std::map<std::string, uint32_t> special_ids;  // content -> id

  auto add_special = [&](int64_t id, const std::string& content, bool special, const std::string& where) {
    check(id >= 0, "{}: negative token id {}", where, id);
    special_ids[content] = static_cast<uint32_t>(id);
    if (static_cast<uint64_t>(id) >= V) return;  // only ids < vocab_size reach the GGUF
    check(types[id] == 0 || types[id] == TOKEN_CONTROL || types[id] == TOKEN_USER_DEFINED,
          "{}: special token '{}' has id {} which is already a base token", where, content, id);
    tokens[id] = content;
    types[id] = special ? TOKEN_CONTROL : TOKEN_USER_DEFINED;
  };

  if (fs::exists(tk_path)) {
    v.source = tk_path.string();
    auto ranks = load_tiktoken(v.source);
    check(ranks.size() <= V, "{}: {} base tokens but config vocab_size is {}", v.source, ranks.size(), V);
    v.n_base = ranks.size();
    for (size_t r = 0; r < ranks.size(); ++r) {
      tokens[r] = gpt2_encode_bytes(ranks[r]);
      types[r] = TOKEN_NORMAL;
    }
    v.merges = reconstruct_merges(ranks);
    if (tc.contains("added_tokens_decoder")) {
      const auto& atd = tc["added_tokens_decoder"];
      check(atd.is_object(), "{}: added_tokens_decoder must be an object", tc_path.string());
      for (auto it = atd.begin(); it != atd.end(); ++it) {
        int64_t id = 0;
        try {
          size_t used = 0;
          id = std::stoll(it.key(), &used);
          check(used == it.key().size(), "x");
        } catch (const std::exception&) {
          fail("{}: added_tokens_decoder key '{}' is not a token id", tc_path.string(), it.key());
        }
        std::string content = token_content(it.value());
        check(!content.empty(), "{}: added_tokens_decoder[{}] has no 'content' string", tc_path.string(), it.key());
        bool special = opt_field(it.value(), "special", true, tc_path.string() + ": added_tokens_decoder[" + it.key() + "]");
        add_special(id, content, special, tc_path.string());
      }
    }
  } else if (fs::exists(tj_path)) {
    v.source = tj_path.string();
    nlohmann::json tj = parse_json_file(v.source);
    check(tj.is_object() && tj.contains("model") && tj["model"].is_object(), "{}: missing 'model' object",
          v.source);
    const auto& model = tj["model"];
    const std::string model_type = opt_field<std::string>(model, "type", "BPE", v.source + ": model");
    check(model_type == "BPE", "{}: model.type '{}' is not BPE", v.source, model_type);
    check(model.contains("vocab") && model["vocab"].is_object(), "{}: missing model.vocab object", v.source);
    for (auto it = model["vocab"].begin(); it != model["vocab"].end(); ++it) {
      check(it.value().is_number_integer(), "{}: model.vocab['{}'] is not an integer", v.source, it.key());
      int64_t id = it.value().get<int64_t>();
      check(id >= 0 && static_cast<uint64_t>(id) < V, "{}: model.vocab['{}'] = {} outside vocab_size {}", v.source,
            it.key(), id, V);
      check(types[id] == 0, "{}: id {} assigned twice in model.vocab", v.source, id);
      tokens[id] = it.key();
      types[id] = TOKEN_NORMAL;
      ++v.n_base;
    }
    if (model.contains("merges")) {
      check(model["merges"].is_array(), "{}: model.merges must be an array", v.source);
      for (const auto& m : model["merges"]) {
        if (m.is_string()) {
          v.merges.push_back(m.get<std::string>());
        } else if (m.is_array() && m.size() == 2 && m[0].is_string() && m[1].is_string()) {
          v.merges.push_back(m[0].get<std::string>() + " " + m[1].get<std::string>());
        } else {
          fail("{}: model.merges entry {} is neither \"A B\" nor [\"A\", \"B\"]", v.source, m.dump());
        }
      }
    }
    if (tj.contains("added_tokens")) {
      check(tj["added_tokens"].is_array(), "{}: added_tokens must be an array", v.source);
      for (const auto& a : tj["added_tokens"]) {
        check(a.is_object() && a.contains("id") && a["id"].is_number_integer() && a.contains("content") &&
                  a["content"].is_string(),
              "{}: added_tokens entry {} needs integer 'id' and string 'content'", v.source, a.dump());
        int64_t id = a["id"].get<int64_t>();
        if (id >= 0 && static_cast<uint64_t>(id) < V && types[id] == TOKEN_NORMAL) {
          // a base token re-declared as added token: keep the text, mark the type
          types[id] = 0;
        }
        add_special(id, a["content"].get<std::string>(), opt_field(a, "special", true, v.source + ": added_tokens entry"), v.source);
      }
    }
  } else {
    fail("{}: no tokenizer found (expected tiktoken.model or tokenizer.json)", hf_dir);
  }

  for (size_t i = 0; i < V; ++i) {
    if (types[i] == 0) {
      tokens[i] = "[PAD" + std::to_string(i) + "]";
      types[i] = TOKEN_UNUSED;
    }
  }
  v.tokens = std::move(tokens);
  v.types = std::move(types);

  auto lookup_special = [&](const char* key) -> std::optional<uint32_t> {
    if (!tc.contains(key)) return std::nullopt;
    std::string c = token_content(tc[key]);
    auto it = special_ids.find(c);
    if (c.empty() || it == special_ids.end()) return std::nullopt;
    return it->second;
  };
  v.bos = config_id(cfg, "bos_token_id");
  if (!v.bos) v.bos = lookup_special("bos_token");
  v.eos = config_id(cfg, "eos_token_id");
  if (!v.eos) v.eos = lookup_special("eos_token");
  v.pad = config_id(cfg, "pad_token_id");
  if (!v.pad) v.pad = lookup_special("pad_token");
  for (auto [name, id] : {std::pair{"bos", v.bos}, std::pair{"eos", v.eos}, std::pair{"padding", v.pad}})
    check(!id || *id < V, "{}: {} token id {} is outside vocab_size {}", cfg.path, name, *id, V);

  if (tc.contains("add_bos_token")) {
    check(tc["add_bos_token"].is_boolean(), "{}: add_bos_token must be a boolean", tc_path.string());
    v.add_bos = tc["add_bos_token"].get<bool>();
  }
  fs::path jinja = dir / "chat_template.jinja";
  if (fs::exists(jinja)) {
    v.chat_template = read_text(jinja.string());
  } else if (tc.contains("chat_template")) {
    const auto& ct = tc["chat_template"];
    if (ct.is_string()) {
      v.chat_template = ct.get<std::string>();
    } else if (ct.is_array()) {  // [{"name": "default", "template": "..."}, ...]
      for (const auto& e : ct)
        if (e.is_object() && e.contains("name") && e["name"].is_string() && e["name"] == "default" && e.contains("template") &&
            e["template"].is_string())
          v.chat_template = e["template"].get<std::string>();
    }
  }
  return v;
}

}  // namespace kimi::convert
