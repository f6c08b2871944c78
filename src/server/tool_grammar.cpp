// The grammar of enforced tool calls (tool_grammar.h).
#include "server/tool_grammar.h"

#include <fmt/format.h>

#include <algorithm>
#include <cctype>
#include <set>

#include "server/api_error.h"

namespace kimi::server {

using ojson = nlohmann::ordered_json;

namespace {

// The structural tokens in GBNF.
const char* const O = "\"\\uE000\"";
const char* const C = "\"\\uE001\"";
const char* const S = "\"\\uE002\"";

std::string lit(const std::string& s) { return grammar::gbnf_literal(s); }

// An attribute value as the K3 template writes it (& and " escaped).
std::string attr(const std::string& s) {
  std::string o;
  for (char c : s) {
    if (c == '&') o += "&amp;";
    else if (c == '"') o += "&quot;";
    else o += c;
  }
  return o;
}

// Text that cannot hold a tag: no structural code point, never "<|".
const char* const kText = "t-txt ::= ( [^<\\uE000-\\uE002] | \"<\"+ [^<|\\uE000-\\uE002] )* \"<\"*";

// JSON strings inside a call: the same rule (json-char of the schema converter's base without the
// structural code points and "<|").
const char* const kJsonChar =
    "json-char ::= [^\"\\\\\\x00-\\x1f<\\uE000-\\uE002] | \"\\\\\" ( [\"\\\\/bfnrt] | \"u\" [0-9a-fA-F]{4} ) | "
    "\"<\"+ ( [^\"\\\\\\x00-\\x1f<|\\uE000-\\uE002] | \"\\\\\" ( [\"\\\\/bfnrt] | \"u\" [0-9a-fA-F]{4} ) )";
const char* const kJsonString = "json-string ::= \"\\\"\" json-char* \"<\"* \"\\\"\"";
// One character of a string whose characters are counted (maxLength, pattern): never a raw '<'
// ("\u003c" is one), so a length counts exactly what the arguments hold.
const char* const kJsonChar1 =
    "json-char1 ::= [^\"\\\\\\x00-\\x1f<\\uE000-\\uE002] | \"\\\\\" ( [\"\\\\/bfnrt] | \"u\" [0-9a-fA-F]{4} )";

std::string lhs(const std::string& line) {
  const size_t p = line.find(" ::= ");
  if (p == std::string::npos) return {};
  size_t b = 0;
  while (b < p && std::isspace(static_cast<unsigned char>(line[b]))) ++b;
  return line.substr(b, p - b);
}

std::vector<std::string> lines_of(const std::string& s) {
  std::vector<std::string> out;
  size_t p = 0;
  while (p <= s.size()) {
    size_t e = s.find('\n', p);
    if (e == std::string::npos) e = s.size();
    if (e > p) out.push_back(s.substr(p, e - p));
    p = e + 1;
  }
  return out;
}

// The schema converter's shared JSON rules (with json-char / json-string replaced) and their names.
struct Base {
  std::string text;
  std::set<std::string> names;
};
const Base& json_base() {
  static const Base b = [] {
    Base r;
    for (const std::string& l : lines_of(grammar::schema_to_gbnf(ojson::object()))) {
      const std::string n = lhs(l);
      if (n.empty() || n == "root") continue;
      r.names.insert(n);
      r.text += (n == "json-char"    ? std::string(kJsonChar)
                 : n == "json-string" ? std::string(kJsonString)
                 : n == "json-char1"  ? std::string(kJsonChar1)
                                      : l) +
                "\n";
    }
    return r;
  }();
  return b;
}

// The rules of a schema's grammar without the shared base, prefixed; returns the root rule's name.
std::string schema_rules(const ojson& schema, const std::string& prefix, std::string& out) {
  const Base& base = json_base();
  std::string own;
  for (const std::string& l : lines_of(grammar::schema_to_gbnf(schema, grammar::Budget{}, true)))
    if (!base.names.count(lhs(l))) own += l + "\n";
  out += prefix_gbnf(own, prefix);
  return prefix + "root";
}

const std::set<std::string>& kept_keywords() {
  static const std::set<std::string> k = {"type", "properties", "required", "additionalProperties", "items", "minItems",
                                          "maxItems", "enum", "const", "anyOf", "oneOf", "$ref", "minLength",
                                          "maxLength", "pattern", "minimum", "maximum", "exclusiveMinimum",
                                          "exclusiveMaximum", "$defs", "definitions", "title", "description", "default",
                                          "examples", "$schema", "$id", "$comment", "deprecated", "readOnly", "writeOnly"};
  return k;
}

// Length and item counts the grammar spells out (a repetition {m,n} is n copies; counts of nested
// arrays multiply): larger ones are dropped.
bool small_count(const ojson& v, uint64_t most) {
  return v.is_number_integer() && v.get<int64_t>() >= 0 && v.get<uint64_t>() <= most;
}

// A property's value in the argument-tag form: type attribute and value grammar; false when the
// property's schema has no single form there (the tool then takes the json form only).
bool tag_value(const ojson& p, const ojson& root_defs, const std::string& prefix, std::string& type, std::string& value,
               std::string& rules) {
  if (!p.is_object()) return false;
  auto raw_ok = [](const std::string& s) {
    return s.find("<|") == std::string::npos && s.find("\xEE\x80") == std::string::npos;
  };
  if (p.contains("const") || p.contains("enum")) {
    const ojson vals = p.contains("const") ? ojson::array({p["const"]}) : p["enum"];
    if (!vals.is_array() || vals.empty()) return false;
    std::string alts;
    for (const auto& v : vals) {
      if (!v.is_string() || !raw_ok(v.get<std::string>())) return false;
      alts += (alts.empty() ? "" : " | ") + lit(v.get<std::string>());
    }
    type = "string";
    value = "( " + alts + " )";
    return true;
  }
  if (!p.contains("type") || !p["type"].is_string() || p.contains("anyOf") || p.contains("oneOf") || p.contains("$ref"))
    return false;
  const std::string t = p["type"].get<std::string>();
  if (t == "string") {
    if (p.contains("minLength") || p.contains("maxLength") || p.contains("pattern")) return false;
    type = "string";
    value = "t-txt";
    return true;
  }
  if (t != "number" && t != "integer" && t != "boolean" && t != "null" && t != "object" && t != "array") return false;
  type = t == "integer" ? "number" : t;
  ojson sub = p;
  for (auto it = root_defs.begin(); it != root_defs.end(); ++it) sub[it.key()] = it.value();
  try {
    value = schema_rules(sub, prefix, rules);
  } catch (const grammar::SchemaError&) {  // (the json form refuses the tool when it is the schema's fault)
    return false;
  }
  return true;
}

// The alternatives of one tool's call.
std::string call_rule(const ToolSpec& t, size_t k, std::string& rules) {
  const std::string name = fmt::format("tc{}", k);
  // the json form: the arguments as one JSON object of the schema. A keyword the converter cannot
  // hold to (a pattern outside its regex subset, ...) is a SchemaError (the request's 400); a
  // grammar beyond the engine's limits is tried coarse (relax_schema), then any JSON object.
  ojson schema = t.parameters.is_object() ? relax_schema(t.parameters) : ojson{{"type", "object"}};
  std::string json_root;
  std::string json_rules;
  for (int pass = 0;; ++pass) {
    try {
      json_rules.clear();
      json_root = schema_rules(schema, name + "j-", json_rules);
      // the tool's arguments alone must make a grammar within the engine's limits (size, ...)
      grammar::Grammar::parse("root ::= " + json_root + "\n" + kText + "\n" + json_rules + json_base().text);
      break;
    } catch (const grammar::SchemaError&) {
      throw;
    } catch (const std::exception&) {  // GrammarError / LimitError
      if (pass == 0 && t.parameters.is_object()) {
        schema = relax_schema(t.parameters, true);
        continue;
      }
      json_rules.clear();
      json_root = "json-object";
      break;
    }
  }
  rules += json_rules;
  std::string args = O + std::string(" ") + lit("json type=\"object\"") + " " + S + " " + json_root + " " + C + " " +
                     lit("json") + " " + S;
  // the argument-tag form, when every property has one
  const bool object = schema.is_object() && schema.value("type", ojson()) == "object";
  if (object) {
    ojson defs = ojson::object();
    for (const char* d : {"$defs", "definitions"})
      if (schema.contains(d)) defs[d] = schema[d];
    std::set<std::string> required;
    if (schema.contains("required") && schema["required"].is_array())
      for (const auto& r : schema["required"])
        if (r.is_string()) required.insert(r.get<std::string>());
    std::string seq, tag_rules;
    bool ok = true;
    size_t i = 0;
    if (schema.contains("properties") && schema["properties"].is_object()) {
      for (auto it = schema["properties"].begin(); ok && it != schema["properties"].end(); ++it, ++i) {
        std::string type, value;
        ok = tag_value(it.value(), defs, fmt::format("{}a{}-", name, i), type, value, tag_rules);
        if (!ok) break;
        const std::string rn = fmt::format("{}-a{}", name, i);
        tag_rules += rn + " ::= " + O + " " + lit("argument key=\"" + attr(it.key()) + "\" type=\"" + type + "\"") + " " +
                     S + " " + value + " " + C + " " + lit("argument") + " " + S + "\n";
        seq += " " + rn + (required.count(it.key()) ? "" : "?");
      }
    }
    if (ok && !seq.empty()) {
      try {  // within the engine's limits, as the json form
        grammar::Grammar::parse("root ::= (" + seq + " )?\n" + kText + "\n" + tag_rules + json_base().text);
      } catch (const std::exception&) {
        ok = false;
      }
    }
    if (ok) {
      rules += tag_rules;
      args += " | " + (seq.empty() ? std::string("\"\"") : "(" + seq + " )");
    }
  }
  rules += name + " ::= " + O + " " + lit("call tool=\"" + attr(t.name) + "\" index=\"") + " t-idx " + lit("\"") + " " + S +
           " ( " + args + " ) " + C + " " + lit("call") + " " + S + "\n";
  return name;
}

}  // namespace

grammar::Budget tool_budget() {
  grammar::Budget b;
  b.max_expanded = b.max_size * (kMaxToolCalls + 1);  // the tools section repeats the calls' rule (our structure)
  return b;
}

std::string prefix_gbnf(const std::string& gbnf, const std::string& prefix) {
  std::set<std::string> defined;
  for (const std::string& l : lines_of(gbnf)) {
    const std::string n = lhs(l);
    if (!n.empty()) defined.insert(n);
  }
  std::string out;
  const size_t n = gbnf.size();
  auto ident = [](char c) { return std::isalnum(static_cast<unsigned char>(c)) || c == '-' || c == '_'; };
  for (size_t i = 0; i < n;) {
    const char c = gbnf[i];
    if (c == '"' || c == '[') {  // literal / class: copied with its escapes
      const char end = c == '"' ? '"' : ']';
      size_t j = i + 1;
      while (j < n && gbnf[j] != end) j += gbnf[j] == '\\' ? 2 : 1;
      j = std::min(j + 1, n);
      out.append(gbnf, i, j - i);
      i = j;
    } else if (c == '{' || c == '#') {  // repetition counts, comments
      const size_t j = c == '{' ? gbnf.find('}', i) : gbnf.find('\n', i);
      const size_t e = j == std::string::npos ? n : (c == '{' ? j + 1 : j);
      out.append(gbnf, i, e - i);
      i = e;
    } else if (ident(c)) {
      size_t j = i;
      while (j < n && ident(gbnf[j])) ++j;
      const std::string id = gbnf.substr(i, j - i);
      out += defined.count(id) ? prefix + id : id;
      i = j;
    } else {
      out += c;
      ++i;
    }
  }
  return out;
}

ojson relax_schema(const ojson& s, bool coarse) {
  if (s.is_boolean()) return s.get<bool>() ? ojson::object() : s;
  if (!s.is_object()) return s;
  ojson in = s;
  if (in.contains("allOf") && in["allOf"].is_array()) {  // merged: properties, required, the first type
    for (const auto& part : in["allOf"]) {
      if (!part.is_object()) continue;
      for (auto it = part.begin(); it != part.end(); ++it) {
        if (it.key() == "properties" && it.value().is_object()) {
          if (!in.contains("properties") || !in["properties"].is_object()) in["properties"] = ojson::object();
          for (auto p = it.value().begin(); p != it.value().end(); ++p) in["properties"][p.key()] = p.value();
        } else if (it.key() == "required" && it.value().is_array()) {
          if (!in.contains("required") || !in["required"].is_array()) in["required"] = ojson::array();
          for (const auto& r : it.value()) in["required"].push_back(r);
        } else if (!in.contains(it.key())) {
          in[it.key()] = it.value();
        }
      }
    }
    in.erase("allOf");
  }
  ojson out = ojson::object();
  for (auto it = in.begin(); it != in.end(); ++it)
    if (kept_keywords().count(it.key())) out[it.key()] = it.value();
  for (const char* k : {"exclusiveMinimum", "exclusiveMaximum"})  // draft 4's boolean form
    if (out.contains(k) && out[k].is_boolean()) out.erase(k);
  // the converter takes these only alone (with annotations; enum / const with type)
  auto only = [&](std::initializer_list<const char*> keep) {
    ojson o = ojson::object();
    for (auto it = out.begin(); it != out.end(); ++it) {
      bool k = false;
      for (const char* w : keep) k = k || it.key() == w;
      if (k || it.key() == "$defs" || it.key() == "definitions") o[it.key()] = it.value();
    }
    out = std::move(o);
  };
  if (out.contains("$ref")) only({"$ref"});
  else if (out.contains("const")) only({"const", "type"});
  else if (out.contains("enum")) only({"enum", "type"});
  else if (out.contains("anyOf")) only({"anyOf"});
  else if (out.contains("oneOf")) only({"oneOf"});
  // coarse (a schema whose exact grammar is beyond the limits): long strings and item counts are not spelled out
  if (coarse) {
    for (const char* k : {"minLength", "maxLength"})
      if (out.contains(k) && !small_count(out[k], 64)) out.erase(k);
    for (const char* k : {"minItems", "maxItems"})
      if (out.contains(k) && !small_count(out[k], 4)) out.erase(k);
  }
  if (out.contains("pattern") && (out.contains("minLength") || out.contains("maxLength"))) {  // the converter takes one of them
    out.erase("minLength");
    out.erase("maxLength");
  }
  const bool plain = !out.contains("$ref") && !out.contains("const") && !out.contains("enum") && !out.contains("anyOf") &&
                     !out.contains("oneOf");
  if (plain && !out.contains("type")) {  // the type its keywords imply
    if (out.contains("properties")) out["type"] = "object";
    else if (out.contains("items")) out["type"] = "array";
  }
  // keywords of types the schema does not allow are dropped (a type list keeps each type's)
  std::set<std::string> types;
  if (out.contains("type")) {
    if (out["type"].is_string()) types.insert(out["type"].get<std::string>());
    else if (out["type"].is_array())
      for (const auto& t : out["type"])
        if (t.is_string()) types.insert(t.get<std::string>());
  }
  if (plain && !types.empty()) {
    if (!types.count("string"))
      for (const char* k : {"minLength", "maxLength", "pattern"}) out.erase(k);
    if (!types.count("array"))
      for (const char* k : {"minItems", "maxItems", "items"}) out.erase(k);
    if (!types.count("object"))
      for (const char* k : {"properties", "required", "additionalProperties"}) out.erase(k);
    if (!types.count("number") && !types.count("integer"))
      for (const char* k : {"minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum"}) out.erase(k);
  }
  if (out.contains("items") && !out["items"].is_object() && !out["items"].is_boolean()) out.erase("items");
  if (out.contains("additionalProperties")) {
    ojson& ap = out["additionalProperties"];
    if (ap.is_object()) ap = relax_schema(ap, coarse);
    else if (!ap.is_boolean()) out.erase("additionalProperties");
  }
  if (out.contains("properties")) {
    if (!out["properties"].is_object()) {
      out.erase("properties");
    } else {
      for (auto it = out["properties"].begin(); it != out["properties"].end(); ++it) it.value() = relax_schema(it.value(), coarse);
    }
  }
  if (out.contains("required")) {
    ojson req = ojson::array();
    if (out["required"].is_array() && out.contains("properties"))
      for (const auto& r : out["required"])
        if (r.is_string() && out["properties"].contains(r.get<std::string>())) {
          bool dup = false;
          for (const auto& q : req) dup = dup || q == r;
          if (!dup) req.push_back(r);
        }
    if (req.empty()) out.erase("required");
    else out["required"] = std::move(req);
  }
  if (out.contains("items")) out["items"] = relax_schema(out["items"], coarse);
  for (const char* k : {"anyOf", "oneOf"})
    if (out.contains(k) && out[k].is_array())
      for (auto& v : out[k]) v = relax_schema(v, coarse);
  for (const char* d : {"$defs", "definitions"})
    if (out.contains(d) && out[d].is_object())
      for (auto it = out[d].begin(); it != out[d].end(); ++it) it.value() = relax_schema(it.value(), coarse);
  return out;
}

std::string tool_gbnf(const std::vector<ToolSpec>& tools, ToolMode mode, const std::string& forced, bool thinking,
                      bool one_call) {
  std::string rules;
  std::string calls;
  if (mode != ToolMode::None) {
    for (size_t k = 0; k < tools.size(); ++k) {
      if (!forced.empty() && tools[k].name != forced) continue;
      calls += (calls.empty() ? "" : " | ") + call_rule(tools[k], k, rules);
    }
    if (calls.empty()) calls = "\"\\uE003\"";  // (no tool to call: nothing can follow)
  }
  // one call of a named tool or when the client allows one call only; else up to kMaxToolCalls in
  // one message. After the last call only the section's close can follow.
  const int most = forced.empty() && !one_call ? kMaxToolCalls : 1;
  const std::string tools_section = (most == 1 ? std::string("t-call ") : fmt::format("t-call{{1,{}}} ", most)) + C + " " +
                                    lit("tools") + " " + S;
  const std::string think_end = std::string("t-txt ") + C + " " + lit("think") + " " + S + " " + O + " " + lit("response") + " " + S;
  std::string root;
  switch (mode) {
    case ToolMode::Required:
      root = (thinking ? think_end + " " : std::string()) + C + " " + lit("response") + " " + S + " " + O + " " +
             lit("tools") + " " + S + " " + tools_section + " t-end";
      break;
    case ToolMode::None:
      root = (thinking ? think_end + " " : std::string()) + "t-txt " + C + " " + lit("response") + " " + S + " t-end";
      break;
    case ToolMode::Auto:
      if (one_call) {  // from the first token (a call outside a tools section, or a second one, cannot be written);
        // the answer may end wherever an unconstrained one may (an end token after any text)
        const std::string resp = std::string("t-txt ( ") + C + " " + lit("response") + " " + S + " ( " + O + " " + lit("tools") + " " +
                                 S + " " + tools_section + " )? t-end )?";
        root = thinking ? std::string("t-txt ( ") + C + " " + lit("think") + " " + S + " " + O + " " + lit("response") + " " + S + " " +
                              resp + " )?"
                        : resp;
      } else {  // lazy: from the trigger on
        root = tools_section + " t-end";
      }
      break;
  }
  std::string g = "root ::= " + root + "\n" + kText + "\nt-idx ::= [1-9] [0-9]{0,2}\nt-end ::= ( " + C + " " +
                  lit("message") + " " + S + " )?\n";
  if (mode != ToolMode::None) g += "t-call ::= " + calls + "\n" + rules + json_base().text;
  return g;
}

void set_tool_constraint(GenParams& gen, const ojson& tools, const ojson& tool_choice, bool thinking, bool one_call) {
  if (!tools.is_array() || tools.empty()) return;
  ToolMode mode = ToolMode::Auto;
  std::string forced;
  if (tool_choice.is_string()) {
    if (tool_choice == "required") mode = ToolMode::Required;
    else if (tool_choice == "none") mode = ToolMode::None;
  } else if (tool_choice.is_object() && tool_choice.contains("function") && tool_choice["function"].is_object()) {
    mode = ToolMode::Required;
    forced = tool_choice["function"].value("name", std::string());
  }
  std::vector<ToolSpec> specs;
  for (const auto& t : tools) {
    const ojson& fn = t.contains("function") ? t["function"] : t;
    ToolSpec s;
    s.name = fn.value("name", std::string());
    if (fn.contains("parameters")) s.parameters = fn["parameters"];
    specs.push_back(std::move(s));
  }
  try {
    gen.tool_grammar = grammar::Grammar::parse(tool_gbnf(specs, mode, forced, thinking, one_call), tool_budget());
  } catch (const grammar::SchemaError& e) {
    throw ApiError(400, fmt::format("tools: a tool's parameters cannot be enforced: {} (keyword '{}')", e.what(), e.feature),
                   "invalid_request_error", "tools", "unsupported_schema");
  } catch (const std::exception& e) {
    throw ApiError(400, fmt::format("tools: the tool-call grammar of these tools cannot be built: {}", e.what()),
                   "invalid_request_error", "tools");
  }
  gen.tool_trigger = mode == ToolMode::Auto && !one_call ? kToolTrigger : "";
  if (mode == ToolMode::Required) {
    gen.grammar = nullptr;  // the response is empty
    // the answer ends with a call: its cheapest completion is forced once max_tokens leaves only
    // its room, and the think channel is closed early enough (Scheduler::start)
    gen.tool_must_finish = true;
  }
}

}  // namespace kimi::server
