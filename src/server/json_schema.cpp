// JSON schema -> GBNF (grammar.h: schema_to_gbnf, json_object_gbnf).
#include <fmt/format.h>

#include <chrono>
#include <map>
#include <set>

#include "server/grammar.h"

namespace kimi::server::grammar {

namespace {

using ojson = nlohmann::ordered_json;

// Shared rules of every JSON grammar. Whitespace is limited (no endless runs of spaces); numbers
// have at most 16 integer and 16 fraction digits.
const char* const kJsonBase = R"(
ws ::= ( " " | "\n" [ \t]{0,8} )?
json-value ::= json-object | json-array | json-string | json-number | json-boolean | json-null
json-object ::= "{" ws ( json-string ws ":" ws json-value ( ws "," ws json-string ws ":" ws json-value )* )? ws "}"
json-array ::= "[" ws ( json-value ( ws "," ws json-value )* )? ws "]"
json-char ::= [^"\\\x00-\x1f] | "\\" ( ["\\/bfnrt] | "u" [0-9a-fA-F]{4} )
json-string ::= "\"" json-char* "\""
json-int ::= "-"? ( "0" | [1-9] [0-9]{0,15} )
json-number ::= json-int ( "." [0-9]{1,16} )? ( [eE] [-+]? [0-9]{1,2} )?
json-integer ::= json-int
json-boolean ::= "true" | "false"
json-null ::= "null"
)";

std::string lit(const std::string& s) { return gbnf_literal(s); }

const std::set<std::string>& annotations() {
  static const std::set<std::string> a = {"title", "description", "default", "examples", "$schema", "$id",
                                          "$comment", "deprecated", "readOnly", "writeOnly", "$defs", "definitions"};
  return a;
}

class Converter {
 public:
  Converter(const ojson& root, const Budget& b) : root_(root), b_(b), deadline_(b.deadline()) {}

  std::string run() {
    const std::string top = expr(root_, "$");
    std::string out = "root ::= " + top + "\n";
    for (const auto& r : rules_) out += r + "\n";
    return out + kJsonBase;
  }

 private:
  // Nesting (schema levels and $ref chains together) is bounded, so the recursion over the schema
  // is; the text made so far is bounded by the size budget (a GBNF symbol is at least a byte of
  // it... and a rule reference at most a few dozen), and time and the client are polled.
  struct Level {
    Converter& c;
    Level(Converter& c, const std::string& where) : c(c) {
      if (++c.depth_ > c.b_.max_depth)
        throw LimitError("max_depth", fmt::format("JSON schema: nested deeper than the limit of {} (schema levels and "
                                                  "$ref chains together) at {}",
                                                  c.b_.max_depth, where));
      if ((++c.polls_ & 63) == 0) {
        if (c.b_.cancelled && c.b_.cancelled()) throw LimitError("cancelled", "JSON schema: compilation cancelled (the client has gone)");
        if (std::chrono::steady_clock::now() > c.deadline_)
          throw LimitError("max_seconds", fmt::format("JSON schema: converting took longer than the limit of {} s", c.b_.max_seconds));
      }
    }
    ~Level() { --c.depth_; }
  };
  void grew(size_t n) {
    out_bytes_ += n;
    if (out_bytes_ > kBytesPerSymbol * b_.max_size)
      throw LimitError("max_size", fmt::format("JSON schema: the grammar it makes is larger than the limit ({} symbols)",
                                               b_.max_size));
  }
  static constexpr uint64_t kBytesPerSymbol = 8;
  [[noreturn]] void unsupported(const std::string& kw, const std::string& where, const std::string& why = "") const {
    throw SchemaError(kw, where,
                      fmt::format("JSON schema: '{}' at {} is not supported{}", kw, where, why.empty() ? "" : " (" + why + ")"));
  }
  std::string add_rule(const std::string& body) {
    const std::string name = fmt::format("s{}", rules_.size() + refs_.size() + 1);
    rules_.push_back(name + " ::= " + body);
    grew(rules_.back().size());
    return name;
  }
  void check_keys(const ojson& s, const std::string& where, std::initializer_list<const char*> allowed) const {
    for (auto it = s.begin(); it != s.end(); ++it) {
      const std::string& k = it.key();
      if (annotations().count(k)) continue;
      bool ok = false;
      for (const char* a : allowed) ok = ok || k == a;
      if (!ok) unsupported(k, where);
    }
  }

  std::string expr(const ojson& s, const std::string& where) {
    const Level level(*this, where);
    std::string e = expr1(s, where);
    grew(e.size());
    return e;
  }
  std::string expr1(const ojson& s, const std::string& where) {
    if (s.is_boolean()) {
      if (s.get<bool>()) return "json-value";
      unsupported("false", where, "a schema that accepts nothing");
    }
    if (!s.is_object()) throw SchemaError("schema", where, fmt::format("JSON schema: the schema at {} is not an object", where));
    if (s.contains("$ref")) {
      check_keys(s, where, {"$ref"});
      return ref(s["$ref"], where);
    }
    if (s.contains("const")) {
      check_keys(s, where, {"const", "type"});
      return lit(s["const"].dump());
    }
    if (s.contains("enum")) {
      check_keys(s, where, {"enum", "type"});
      if (!s["enum"].is_array() || s["enum"].empty()) unsupported("enum", where, "must be a non-empty array");
      std::string alts;
      for (const auto& v : s["enum"]) alts += (alts.empty() ? "" : " | ") + lit(v.dump());
      return "( " + alts + " )";
    }
    for (const char* k : {"anyOf", "oneOf"}) {
      if (!s.contains(k)) continue;
      check_keys(s, where, {k});
      const ojson& v = s[k];
      if (!v.is_array() || v.empty()) unsupported(k, where, "must be a non-empty array");
      std::string alts;
      for (size_t i = 0; i < v.size(); ++i)
        alts += (alts.empty() ? "" : " | ") + expr(v[i], fmt::format("{}.{}[{}]", where, k, i));
      return "( " + alts + " )";
    }
    if (!s.contains("type")) {
      check_keys(s, where, {});
      return "json-value";  // {}: any JSON value
    }
    const ojson& t = s["type"];
    if (t.is_array()) {
      std::string alts;
      for (const auto& one : t) {
        ojson sub = s;
        sub["type"] = one;
        alts += (alts.empty() ? "" : " | ") + expr(sub, where);
      }
      if (alts.empty()) unsupported("type", where, "an empty type list");
      return "( " + alts + " )";
    }
    if (!t.is_string()) unsupported("type", where, "must be a string or a list of strings");
    const std::string type = t.get<std::string>();
    if (type == "object") return object(s, where);
    if (type == "array") return array(s, where);
    if (type == "string") {
      check_keys(s, where, {"type", "minLength", "maxLength"});
      const int lo = count(s, "minLength", where, 0), hi = count(s, "maxLength", where, -1);
      if (lo == 0 && hi < 0) return "json-string";
      if (hi >= 0 && hi < lo) unsupported("maxLength", where, "smaller than minLength");
      return add_rule(fmt::format("\"\\\"\" json-char{{{},{}}} \"\\\"\"", lo, hi < 0 ? "" : std::to_string(hi)));
    }
    if (type == "number" || type == "integer" || type == "boolean" || type == "null") {
      check_keys(s, where, {"type"});
      return "json-" + type;
    }
    unsupported("type", where, fmt::format("unknown type '{}'", type));
  }

  int count(const ojson& s, const char* k, const std::string& where, int dflt) const {
    if (!s.contains(k)) return dflt;
    if (!s[k].is_number_unsigned() || s[k].get<uint64_t>() > 1000) unsupported(k, where, "must be an integer 0..1000");
    return static_cast<int>(s[k].get<uint64_t>());
  }

  std::string ref(const ojson& r, const std::string& where) {
    if (!r.is_string()) unsupported("$ref", where, "must be a string");
    const std::string p = r.get<std::string>();
    auto it = refs_.find(p);
    if (it != refs_.end()) return it->second;
    std::string key;
    const ojson* defs = nullptr;
    for (const char* d : {"#/$defs/", "#/definitions/"}) {
      if (p.rfind(d, 0) != 0) continue;
      key = p.substr(std::string(d).size());
      const std::string dk = std::string(d).substr(2, std::string(d).size() - 3);
      if (root_.contains(dk) && root_[dk].is_object() && root_[dk].contains(key)) defs = &root_[dk][key];
    }
    if (p == "#") defs = &root_;
    if (!defs) unsupported("$ref", where, fmt::format("'{}' does not name an entry of #/$defs or #/definitions", p));
    // a rule per definition, named before it is converted: recursive schemas refer to it
    const std::string name = fmt::format("ref{}", refs_.size() + 1);
    refs_[p] = name;
    const std::string body = expr(*defs, p);
    rules_.push_back(name + " ::= " + body);
    grew(rules_.back().size());
    return name;
  }

  std::string object(const ojson& s, const std::string& where) {
    check_keys(s, where, {"type", "properties", "required", "additionalProperties"});
    if (s.contains("additionalProperties")) {
      const ojson& ap = s["additionalProperties"];
      const bool no_extra = ap.is_boolean() && !ap.get<bool>();
      const bool any_extra = (ap.is_boolean() && ap.get<bool>()) || (ap.is_object() && ap.empty());
      if (!no_extra && !(any_extra && !s.contains("properties")))
        unsupported("additionalProperties", where, "only false, or true without properties");
    }
    if (!s.contains("properties")) return "json-object";
    const ojson& props = s["properties"];
    if (!props.is_object()) unsupported("properties", where, "must be an object");
    std::set<std::string> required;
    if (s.contains("required")) {
      if (!s["required"].is_array()) unsupported("required", where, "must be an array of names");
      for (const auto& r : s["required"]) {
        if (!r.is_string() || !props.contains(r.get<std::string>()))
          unsupported("required", where, fmt::format("{} is not one of the properties", r.dump()));
        required.insert(r.get<std::string>());
      }
    }
    // properties in the schema's order; an optional one may be left out. head(i): properties i..
    // with none written yet; tail(i): after at least one (each then starts with a comma).
    std::vector<std::pair<std::string, bool>> kv;  // (key: value expression, required)
    for (auto it = props.begin(); it != props.end(); ++it)
      kv.push_back({lit(ojson(it.key()).dump()) + " ws \":\" ws " + expr(it.value(), where + ".properties." + it.key()),
                    required.count(it.key()) > 0});
    const size_t n = kv.size();
    std::vector<std::string> tail(n + 1), head(n + 1);
    tail[n] = "";
    head[n] = "";
    for (size_t i = n; i-- > 0;) {
      const std::string t_next = tail[i + 1], h_next = head[i + 1];
      if (kv[i].second) {
        tail[i] = add_rule("ws \",\" ws " + kv[i].first + " " + t_next);
        head[i] = add_rule(kv[i].first + " " + t_next);
      } else {
        tail[i] = add_rule("( ws \",\" ws " + kv[i].first + " )? " + t_next);
        head[i] = add_rule(kv[i].first + " " + t_next + " | " + (h_next.empty() ? "\"\"" : h_next));
      }
    }
    return "( \"{\" ws " + (head[0].empty() ? std::string() : head[0]) + " ws \"}\" )";
  }

  std::string array(const ojson& s, const std::string& where) {
    check_keys(s, where, {"type", "items", "minItems", "maxItems"});
    const std::string item = s.contains("items") ? expr(s["items"], where + ".items") : "json-value";
    const int lo = count(s, "minItems", where, 0), hi = count(s, "maxItems", where, -1);
    if (hi >= 0 && hi < lo) unsupported("maxItems", where, "smaller than minItems");
    if (hi == 0) return "( \"[\" ws \"]\" )";
    const std::string more = fmt::format("( ws \",\" ws {} ){{{},{}}}", item, std::max(lo - 1, 0),
                                         hi < 0 ? std::string() : std::to_string(hi - 1));
    const std::string body = item + " " + more;
    return "( \"[\" ws " + (lo == 0 ? "( " + body + " )?" : body) + " ws \"]\" )";
  }

  const ojson& root_;
  const Budget& b_;
  std::chrono::steady_clock::time_point deadline_;
  int depth_ = 0;
  uint64_t polls_ = 0, out_bytes_ = 0;
  std::vector<std::string> rules_;
  std::map<std::string, std::string> refs_;
};

}  // namespace

std::string schema_to_gbnf(const nlohmann::ordered_json& schema) { return schema_to_gbnf(schema, Budget{}); }

std::string schema_to_gbnf(const nlohmann::ordered_json& schema, const Budget& budget) {
  return Converter(schema, budget).run();
}

// A GBNF string literal holding `s` exactly.
std::string gbnf_literal(const std::string& s) {
  std::string o = "\"";
  for (unsigned char c : s) {
    if (c == '"') o += "\\\"";
    else if (c == '\\') o += "\\\\";
    else if (c == '\n') o += "\\n";
    else if (c == '\r') o += "\\r";
    else if (c == '\t') o += "\\t";
    else if (c < 0x20) o += fmt::format("\\x{:02x}", c);
    else o += static_cast<char>(c);
  }
  return o + "\"";
}

std::string json_object_gbnf() { return std::string("root ::= json-object\n") + kJsonBase; }

}  // namespace kimi::server::grammar
