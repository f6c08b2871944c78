#include "tokenizer/chat.h"

#include <algorithm>
#include <cctype>
#include <charconv>
#include <cmath>

#include "util/error.h"
#include "util/json.h"

namespace kimi::tok {

namespace {

const char* const OPEN = "<|open|>";
const char* const CLOSE = "<|close|>";
const char* const SEP = "<|sep|>";
const char* const EOM = "<|end_of_msg|>";

// render_chat_marked: every string taken from the request is enclosed in kUserTextBegin /
// kUserTextEnd (set for the duration of one rendering on this thread).
thread_local bool g_mark_user = false;

std::string user(std::string s) {
  if (!g_mark_user || s.empty()) return s;
  return kUserTextBegin + s + kUserTextEnd;
}

std::string py_float(double d) {
  if (std::isnan(d)) return "NaN";
  if (std::isinf(d)) return d > 0 ? "Infinity" : "-Infinity";
  char buf[64];
  auto r = std::to_chars(buf, buf + sizeof buf, d, std::chars_format::scientific);
  std::string s(buf, r.ptr);
  const size_t epos = s.find('e');
  std::string mant = s.substr(0, epos);
  const int exp = std::stoi(s.substr(epos + 1));
  std::string sign;
  if (!mant.empty() && mant[0] == '-') {
    sign = "-";
    mant.erase(0, 1);
  }
  std::string digits;
  for (char c : mant)
    if (c != '.') digits += c;
  if (exp >= -4 && exp < 16) {
    std::string out;
    if (exp < 0) {
      out = "0." + std::string(static_cast<size_t>(-exp - 1), '0') + digits;
    } else if (static_cast<int>(digits.size()) <= exp + 1) {
      out = digits + std::string(static_cast<size_t>(exp + 1 - digits.size()), '0') + ".0";
    } else {
      out = digits.substr(0, exp + 1) + "." + digits.substr(exp + 1);
    }
    return sign + out;
  }
  std::string m = digits.substr(0, 1);
  if (digits.size() > 1) m += "." + digits.substr(1);
  return sign + m + fmt::format("e{}{:02d}", exp < 0 ? '-' : '+', std::abs(exp));
}

void py_json_string(std::string& out, const std::string& s) {
  out += '"';
  for (unsigned char c : s) {
    switch (c) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      case '\r': out += "\\r"; break;
      case '\t': out += "\\t"; break;
      case '\b': out += "\\b"; break;
      case '\f': out += "\\f"; break;
      default:
        if (c < 0x20) out += fmt::format("\\u{:04x}", c);
        else out += static_cast<char>(c);
    }
  }
  out += '"';
}

std::string py_repr_string(const std::string& s) {
  const bool has_single = s.find('\'') != std::string::npos, has_double = s.find('"') != std::string::npos;
  const char q = has_single && !has_double ? '"' : '\'';
  std::string out(1, q);
  for (unsigned char c : s) {
    if (c == '\\') out += "\\\\";
    else if (c == static_cast<unsigned char>(q)) out += std::string("\\") + q;
    else if (c == '\n') out += "\\n";
    else if (c == '\r') out += "\\r";
    else if (c == '\t') out += "\\t";
    else if (c < 0x20 || c == 0x7F) out += fmt::format("\\x{:02x}", c);
    else out += static_cast<char>(c);
  }
  return out + q;
}

std::string py_repr(const ojson& v) {
  if (v.is_string()) return py_repr_string(v.get_ref<const std::string&>());
  if (v.is_array()) {
    std::string out = "[";
    for (size_t i = 0; i < v.size(); ++i) out += (i ? ", " : "") + py_repr(v[i]);
    return out + "]";
  }
  if (v.is_object()) {
    std::string out = "{";
    bool first = true;
    for (auto it = v.begin(); it != v.end(); ++it) {
      out += (first ? "" : ", ") + py_repr_string(it.key()) + ": " + py_repr(it.value());
      first = false;
    }
    return out + "}";
  }
  return py_str(v);
}

bool truthy(const ojson& v) {
  if (v.is_null()) return false;
  if (v.is_boolean()) return v.get<bool>();
  if (v.is_number_integer() || v.is_number_unsigned()) return v.get<int64_t>() != 0;
  if (v.is_number_float()) return v.get<double>() != 0.0;
  if (v.is_string()) return !v.get_ref<const std::string&>().empty();
  return !v.empty();
}
bool truthy(const std::optional<ojson>& v) { return v && truthy(*v); }

// message.get(key) (null when absent or when the message is not an object)
const ojson& get(const ojson& obj, const char* key) {
  static const ojson null_value;
  if (!obj.is_object()) return null_value;
  auto it = obj.find(key);
  return it == obj.end() ? null_value : *it;
}
bool has(const ojson& obj, const char* key) { return obj.is_object() && obj.contains(key); }

std::string escape_attr(const std::string& s) {
  std::string out;
  for (char c : s) {
    if (c == '&') out += "&amp;";
    else if (c == '"') out += "&quot;";
    else out += c;
  }
  return out;
}

using Attrs = std::vector<std::pair<std::string, std::string>>;  // values already py_str'ed

std::string open_tag(const std::string& tag, const Attrs& attrs = {}) {
  std::string out = OPEN + tag;
  for (auto& [k, v] : attrs) out += " " + k + "=\"" + escape_attr(v) + "\"";
  return out + SEP;
}
std::string close_tag(const std::string& tag) { return CLOSE + tag + SEP; }

std::string trim(std::string_view s) {
  const char* ws = " \t\n\r\f\v";
  const size_t b = s.find_first_not_of(ws);
  if (b == std::string_view::npos) return "";
  const size_t e = s.find_last_not_of(ws);
  return std::string(s.substr(b, e - b + 1));
}

// render_text: text|string (image_prompts is never defined here)
std::string render_text(const ojson& v) { return v.is_null() ? std::string() : py_str(v); }

std::string render_content(const ojson& content) {
  if (content.is_string()) return user(content.get<std::string>());
  if (content.is_null()) return "";
  check(content.is_array() || content.is_object(),
        "message content must be a string, a list of parts or null, found {}", content.type_name());
  std::string out;
  if (content.is_object()) {  // iterating a mapping yields its keys (strings): their .text is undefined
    return out;
  }
  for (const ojson& part : content) {
    const ojson& type = get(part, "type");
    if (type.is_string() && (type == "image" || type == "image_url")) out += kImagePlaceholder;
    else if (has(part, "text")) out += user(render_text(part["text"]));
  }
  return out;
}

std::string internal_system_message(const std::string& type, const std::string& body) {
  return open_tag("message", {{"role", "system"}, {"type", type}}) + trim(body) + close_tag("message") + EOM;
}

std::string render_tool_declare(const ojson& tools, bool dynamic) {
  std::string out = open_tag("message", {{"role", "system"}, {"type", "tool-declare"}});
  out += dynamic ? "## New Tools Available\nThe system dynamically extends the toolset via lazy-loading.\nYou have access "
                   "to all existing and extended tools.\nHere are the specs for the extended tools.\n\n```json\n"
                 : "# Tools\nHere are the available tools, described in JSONSchema.\n\n```json\n";
  out += user(json_sorted(tools)) + "\n```" + close_tag("message") + EOM;
  return out;
}

const char* xtml_type(const ojson& v) {
  if (v.is_boolean()) return "boolean";
  if (v.is_null()) return "null";
  if (v.is_number()) return "number";
  if (v.is_string()) return "string";
  if (v.is_object()) return "object";
  return "array";
}

const ojson& call_function(const ojson& call) {
  const ojson& fn = get(call, "function");
  return fn.is_object() ? fn : call;
}

std::string render_assistant(const ojson& m, bool thinking) {
  std::string out;
  if (thinking) {
    const ojson& rc = get(m, "reasoning_content");
    const ojson& reasoning = truthy(rc) ? rc : get(m, "reasoning");
    out += open_tag("think");
    if (!reasoning.is_null() && !trim(py_str(reasoning)).empty()) out += user(render_text(reasoning));
    out += close_tag("think");
  }
  out += open_tag("response") + render_content(get(m, "content")) + close_tag("response");
  const ojson& calls = get(m, "tool_calls");
  if (truthy(calls)) {
    check(calls.is_array(), "Kimi K3 tool calls must be mappings.");
    out += open_tag("tools");
    int index = 0;
    for (const ojson& call : calls) {
      ++index;
      check(call.is_object(), "Kimi K3 tool calls must be mappings.");
      const ojson& fn = call_function(call);
      check(!get(fn, "name").is_null(), "Kimi K3 tool calls require a function name.");
      out += open_tag("call", {{"tool", user(py_str(fn["name"]))}, {"index", std::to_string(index)}});
      const ojson arguments = has(fn, "arguments") ? fn["arguments"] : ojson::object();
      const ojson& json_block = get(fn, "_xtml_json_block");
      if (!json_block.is_null()) {
        out += open_tag("json", {{"type", "object"}}) + user(render_text(json_block)) + close_tag("json");
      } else if (arguments.is_object()) {
        for (auto it = arguments.begin(); it != arguments.end(); ++it) {
          const ojson& v = it.value();
          out += open_tag("argument", {{"key", user(it.key())}, {"type", xtml_type(v)}});
          out += user(v.is_string() ? v.get<std::string>() : py_json_dumps(v));
          out += close_tag("argument");
        }
      } else if (arguments.is_string() && !trim(arguments.get<std::string>()).empty()) {
        out += open_tag("json", {{"type", "object"}}) + user(arguments.get<std::string>()) + close_tag("json");
      } else if (!arguments.is_null() && !arguments.is_string()) {
        fail("Kimi K3 tool call arguments must be a mapping or a JSON object string.");
      }
      out += close_tag("call");
    }
    out += close_tag("tools");
  }
  return out;
}

struct State {
  const ojson* tool_calls = nullptr;  // of the last assistant message (null: none)
  int tool_index = 0;
};

std::string render_tool_message(const ojson& m, State& st, const ojson* resolved_name) {
  ++st.tool_index;
  ojson name;
  if (resolved_name) name = *resolved_name;
  else if (has(m, "tool")) name = m["tool"];
  else name = get(m, "name");
  if (name.is_null() && st.tool_calls && st.tool_calls->is_array() &&
      st.tool_index <= static_cast<int>(st.tool_calls->size())) {
    name = get(call_function((*st.tool_calls)[st.tool_index - 1]), "name");
  }
  check(!name.is_null(),
        "Kimi K3 tool messages need a resolvable tool name: carry `tool`/`name`, or match a preceding assistant "
        "tool_call by order.");
  return open_tag("message", {{"role", "tool"}, {"tool", user(py_str(name))}, {"index", std::to_string(st.tool_index)}}) +
         render_content(get(m, "content")) + close_tag("message") + EOM;
}

// candidate.get('tool_call_id', candidate.get('id'))
const ojson& result_id(const ojson& m) { return has(m, "tool_call_id") ? m["tool_call_id"] : get(m, "id"); }

}  // namespace

std::string py_str(const ojson& v) {
  if (v.is_string()) return v.get<std::string>();
  if (v.is_null()) return "None";
  if (v.is_boolean()) return v.get<bool>() ? "True" : "False";
  if (v.is_number_unsigned()) return std::to_string(v.get<uint64_t>());
  if (v.is_number_integer()) return std::to_string(v.get<int64_t>());
  if (v.is_number_float()) return py_float(v.get<double>());
  return py_repr(v);
}

std::string py_json_dumps(const ojson& v) {
  std::string out;
  if (v.is_string()) {
    py_json_string(out, v.get_ref<const std::string&>());
  } else if (v.is_null()) {
    out = "null";
  } else if (v.is_boolean()) {
    out = v.get<bool>() ? "true" : "false";
  } else if (v.is_number()) {
    out = py_str(v);
  } else if (v.is_array()) {
    out = "[";
    for (size_t i = 0; i < v.size(); ++i) out += (i ? ", " : "") + py_json_dumps(v[i]);
    out += "]";
  } else {
    out = "{";
    bool first = true;
    for (auto it = v.begin(); it != v.end(); ++it) {
      if (!first) out += ", ";
      first = false;
      py_json_string(out, it.key());
      out += ": " + py_json_dumps(it.value());
    }
    out += "}";
  }
  return out;
}

std::string json_sorted(const ojson& v) {
  if (v.is_object()) {
    std::vector<std::pair<std::string, const ojson*>> items;
    for (auto it = v.begin(); it != v.end(); ++it) items.emplace_back(it.key(), &it.value());
    auto lower = [](std::string s) {
      for (char& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
      return s;
    };
    std::stable_sort(items.begin(), items.end(), [&](auto& a, auto& b) { return lower(a.first) < lower(b.first); });
    std::string out = "{";
    for (size_t i = 0; i < items.size(); ++i) {
      if (i) out += ",";
      py_json_string(out, items[i].first);
      out += ":" + json_sorted(*items[i].second);
    }
    return out + "}";
  }
  if (v.is_array()) {
    std::string out = "[";
    for (size_t i = 0; i < v.size(); ++i) out += (i ? "," : "") + json_sorted(v[i]);
    return out + "]";
  }
  return py_json_dumps(v);
}

ChatRequest ChatRequest::from_json(const ojson& body) {
  check(body.is_object(), "chat request: expected a JSON object, found {}", body.type_name());
  ChatRequest r;
  check(body.contains("messages"), "chat request: missing 'messages'");
  check(body["messages"].is_array(), "chat request: 'messages' must be an array, found {}",
        body["messages"].type_name());
  r.messages = body["messages"];
  auto opt = [&](const char* k, std::optional<ojson>& dst) {
    if (body.contains(k)) dst = body[k];
  };
  opt("tools", r.tools);
  opt("tool_choice", r.tool_choice);
  opt("response_format", r.response_format);
  opt("response_schema", r.response_schema);
  opt("thinking", r.thinking);
  opt("thinking_effort", r.thinking_effort);
  if (body.contains("add_generation_prompt")) r.add_generation_prompt = truthy(body["add_generation_prompt"]);
  if (r.tools) check(r.tools->is_array() || r.tools->is_null(), "chat request: 'tools' must be an array");
  return r;
}

std::string render_chat(const ChatRequest& req) {
  const bool thinking = req.thinking ? truthy(*req.thinking) : true;
  const ojson effort = req.thinking_effort ? *req.thinking_effort : ojson("max");
  // the K3 template's check takes low, high and max (its message and instruction also name medium,
  // which the model was never shown: refused with the template's own message)
  const bool effort_known = effort.is_string() && (effort == "low" || effort == "high" || effort == "max");
  if (thinking && !effort.is_null() && !effort_known)
    fail("Unsupported thinking_effort={}; supported values are low, medium, high, and max.", py_str(effort));
  std::string out;
  if (truthy(req.tools)) out += render_tool_declare(*req.tools, false);
  if (thinking && effort_known)
    out += internal_system_message(
        "thinking-effort",
        "`thinking_effort` guides on how much to think in your thinking channel (not including the response "
        "channel), supported values include `low`, `medium`, `high`, and `max`.\nNow the system is invoked with "
        "`thinking_effort=" + effort.get<std::string>() + "`.");
  State st;
  const ojson& msgs = req.messages;
  for (size_t i = 0; i < msgs.size(); ++i) {
    const ojson& m = msgs[i];
    if (!m.is_object()) continue;
    check(m.contains("role"), "Kimi K3 messages require a role.");
    const ojson& role = m["role"];
    auto with_name = [&](const char* r) {
      Attrs a{{"role", r}};
      if (truthy(get(m, "name"))) a.emplace_back("name", user(py_str(m["name"])));
      return a;
    };
    if (role == "user") {
      out += open_tag("message", with_name("user")) + render_content(get(m, "content")) + close_tag("message") + EOM;
    } else if (role == "system" && truthy(get(m, "tools"))) {
      out += render_tool_declare(m["tools"], true);
    } else if (role == "system") {
      out += open_tag("message", with_name("system")) + render_content(get(m, "content")) + close_tag("message") + EOM;
    } else if (role == "assistant") {
      st.tool_calls = m.contains("tool_calls") && !m["tool_calls"].is_null() ? &m["tool_calls"] : nullptr;
      st.tool_index = 0;
      out += open_tag("message", with_name("assistant")) + render_assistant(m, thinking) + close_tag("message") + EOM;
    } else if (role == "tool" && (i == 0 || get(msgs[i - 1], "role") != "tool")) {
      std::vector<const ojson*> run;
      size_t resolved = 0;
      for (size_t j = i; j < msgs.size(); ++j) {
        const ojson& c = msgs[j];
        if (!c.is_object() || get(c, "role") != "tool") break;
        run.push_back(&c);
        const ojson& call_id = result_id(c);
        bool found = false;
        if (!call_id.is_null() && st.tool_calls && st.tool_calls->is_array())
          for (const ojson& tc : *st.tool_calls)
            if (!found && tc.is_object() && !get(tc, "id").is_null() && py_str(tc["id"]) == py_str(call_id)) found = true;
        resolved += found;
      }
      if (!run.empty() && resolved == run.size()) {
        std::vector<std::string> emitted;
        for (const ojson& tc : *st.tool_calls) {
          if (!tc.is_object() || get(tc, "id").is_null()) continue;
          const std::string id = py_str(tc["id"]);
          if (std::find(emitted.begin(), emitted.end(), id) != emitted.end()) continue;
          emitted.push_back(id);
          const ojson& name = get(call_function(tc), "name");
          for (const ojson* tm : run) {
            const ojson& rid = result_id(*tm);
            if (!rid.is_null() && py_str(rid) == id) out += render_tool_message(*tm, st, name.is_null() ? nullptr : &name);
          }
        }
      } else {
        for (const ojson* tm : run) out += render_tool_message(*tm, st, nullptr);
      }
    }
  }
  if (req.tool_choice && *req.tool_choice == "required")
    out += internal_system_message("tool-choice",
                                   "The system is invoked with `tool_choice=required`.\nYou MUST call tools in the next message.");
  else if (req.tool_choice && *req.tool_choice == "none")
    out += internal_system_message(
        "tool-choice", "The system is invoked with `tool_choice=none`.\nYou MUST NOT call any tools in the next message.");

  ojson schema;  // none
  if (req.response_schema) {
    schema = *req.response_schema;
  } else if (req.response_format && req.response_format->is_object() && !get(*req.response_format, "json_schema").is_null()) {
    const ojson& w = (*req.response_format)["json_schema"];
    if (w.is_object() && w.contains("schema")) schema = w["schema"];
    else if (w.is_object() && w.contains("json_schema")) schema = w["json_schema"];
    else schema = w;
  }
  ojson rf_type;
  if (req.response_format && req.response_format->is_object()) rf_type = get(*req.response_format, "type");
  else if (req.response_format) rf_type = *req.response_format;
  const std::string raw =
      "The system is invoked with `response_format=json_object`.\nYour response must be raw JSON data without markdown "
      "code blocks (```json) or any additional formatting.";
  if (rf_type == "json_object") {
    out += internal_system_message("response-format", raw);
  } else if (rf_type == "json_schema") {
    out += internal_system_message(
        "response-format",
        "The system is invoked with `response_format=json_schema`.\nYour response must be raw JSON data without "
        "markdown code blocks (```json) or any additional formatting.\nThe JSON data must match the following "
        "schema:\n```json\n" + user(json_sorted(schema)) + "\n```");
  }
  if (req.add_generation_prompt) out += open_tag("message", {{"role", "assistant"}}) + open_tag(thinking ? "think" : "response");
  return out;
}

std::string render_chat_request(const ojson& body) { return render_chat(ChatRequest::from_json(body)); }

std::string render_chat_marked(const ChatRequest& req) {
  struct Mark {
    bool was = g_mark_user;
    Mark() { g_mark_user = true; }
    ~Mark() { g_mark_user = was; }
  } mark;
  return render_chat(req);
}

std::string strip_user_marks(std::string_view marked, std::vector<std::pair<size_t, size_t>>* user_ranges) {
  std::string out;
  out.reserve(marked.size());
  size_t begin = 0;
  for (char c : marked) {
    if (c == kUserTextBegin[0]) {
      begin = out.size();
    } else if (c == kUserTextEnd[0]) {
      if (user_ranges && out.size() > begin) user_ranges->emplace_back(begin, out.size());
    } else {
      out += c;
    }
  }
  return out;
}

// ---------------------------------------------------------------------------------------------
// Output parser

ChatParser::ChatParser(bool start_in_think) : where_(start_in_think ? Where::Think : Where::Response) {}

// ---------------------------------------------------------------------------------------------
// Streamed arguments: each call's arguments_json is written while the call is generated, in the
// form the server sends (nlohmann's compact dump with invalid UTF-8 replaced), so the pieces of a
// call concatenate to exactly the JSON of the whole call. A string is written as its characters
// arrive; bytes of a character not complete yet are held back (a piece never splits a character or
// an escape). A json block is read by a small lexer that writes each member in the same form: a
// string value as it arrives, a number or literal once it ends, a key with its value's first
// character (so a block cut after a key leaves nothing of that member).

namespace {

std::string json_text(const ojson& v) { return v.dump(-1, ' ', false, ojson::error_handler_t::replace); }

// The JSON string body (no quotes) of these bytes, as json_text writes it.
std::string json_chars(std::string_view bytes) {
  const std::string s = json_text(ojson(std::string(bytes)));
  return s.substr(1, s.size() - 2);
}

// The longest prefix of `s` after which a UTF-8 decoder that replaces bad bytes the way nlohmann's
// dump does (a byte that breaks a sequence ends it and is read again; a byte that cannot start one
// is replaced alone) has no character open. Text split there is written the same in pieces.
size_t utf8_settled(std::string_view s) {
  size_t settled = 0, need = 0;
  unsigned lo = 0x80, hi = 0xBF;
  for (size_t i = 0; i < s.size(); ++i) {
    const unsigned b = static_cast<unsigned char>(s[i]);
    if (need > 0) {
      if (b >= lo && b <= hi) {
        lo = 0x80, hi = 0xBF;
        if (--need == 0) settled = i + 1;
        continue;
      }
      need = 0;  // broken: this byte starts anew
      lo = 0x80, hi = 0xBF;
    }
    if (b < 0xC2 || b > 0xF4) {  // ASCII, or a byte replaced alone
      settled = i + 1;
      continue;
    }
    need = b < 0xE0 ? 1 : b < 0xF0 ? 2 : 3;
    if (b == 0xE0) lo = 0xA0;
    else if (b == 0xED) hi = 0x9F;
    else if (b == 0xF0) lo = 0x90;
    else if (b == 0xF4) hi = 0x8F;
  }
  return settled;
}

std::string utf8_of(uint32_t cp) {  // also encodes a lone surrogate (written as U+FFFD later)
  std::string out;
  if (cp < 0x80) {
    out += static_cast<char>(cp);
  } else if (cp < 0x800) {
    out += static_cast<char>(0xC0 | (cp >> 6));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else if (cp < 0x10000) {
    out += static_cast<char>(0xE0 | (cp >> 12));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else {
    out += static_cast<char>(0xF0 | (cp >> 18));
    out += static_cast<char>(0x80 | ((cp >> 12) & 0x3F));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  }
  return out;
}

bool json_space(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; }

}  // namespace

void ChatParser::args_out(std::string_view s, ChatDelta& d) {
  if (s.empty() || msg_.tool_calls.empty()) return;
  const size_t call = msg_.tool_calls.size() - 1;
  msg_.tool_calls[call].arguments_json += s;
  auto& v = d.tool_call_deltas;
  if (v.empty() || v.back().call != call || v.back().done) {
    ToolCallDelta td;
    td.call = call;
    v.push_back(std::move(td));
  }
  v.back().arguments += s;
}

void ChatParser::args_string_bytes(std::string_view bytes, bool flush, ChatDelta& d) {
  std::string& hold = args_.utf8_hold;
  hold += bytes;
  const size_t n = flush ? hold.size() : utf8_settled(hold);
  if (n == 0) return;
  args_out(json_chars(std::string_view(hold).substr(0, n)), d);
  hold.erase(0, n);
}

std::string ChatParser::member_prefix(const std::string& key) const {
  const Frame& f = args_.frames.back();
  std::string p = f.count > 0 ? "," : "";
  if (f.type == '{') p += json_text(ojson(key)) + ":";
  return p;
}

void ChatParser::args_typed_open(ChatDelta& d) {
  args_typed_end(d);
  if (args_.block != Block::None) block_end(d);
  Frame& root = args_.frames[0];
  const std::string k = json_text(ojson(arg_key_));
  args_.arg_skip = std::find(root.keys.begin(), root.keys.end(), k) != root.keys.end();
  if (args_.arg_skip) return;
  root.keys.push_back(k);
  if (arg_type_ == "string" || arg_type_.empty()) {
    args_out(member_prefix(arg_key_) + "\"", d);
    ++root.count;
    args_.arg_string = true;
  }
}

void ChatParser::args_typed_end(ChatDelta& d) {
  if (args_.arg_string) {
    args_string_bytes("", true, d);
    args_out("\"", d);
  }
  args_.arg_string = args_.arg_skip = false;
}

void ChatParser::args_close(ChatDelta& d) {
  args_typed_end(d);
  if (args_.block != Block::None) block_end(d);
  args_out("}", d);
  args_.open = false;
}

// A value of the top frame starts. deferred: a number or literal, written (with its prefix) once it ends.
void ChatParser::value_started(ChatDelta& d, bool deferred) {
  args_.prefix.clear();
  if (args_.skip_depth > 0) return;
  if (deferred) {
    args_.prefix = member_prefix(args_.key);
    return;
  }
  args_out(member_prefix(args_.key), d);
  ++args_.frames.back().count;
}

void ChatParser::value_ended() {
  if (args_.skip_depth == args_.frames.size()) args_.skip_depth = 0;  // the repeated key's value is over
  args_.block = Block::After;
  args_.first = false;
}

void ChatParser::block_close_container(ChatDelta& d) {
  if (args_.frames.size() == 1) {  // the block's own object: the call's object stays open
    args_.block = Block::Done;
    return;
  }
  const Frame f = std::move(args_.frames.back());
  args_.frames.pop_back();
  if (f.shown) args_out(f.type == '{' ? "}" : "]", d);
  value_ended();
}

void ChatParser::block_string_bytes(std::string_view bytes, ChatDelta& d) {
  if (args_.hi_surrogate) {  // a high surrogate without its low half
    const std::string lone = utf8_of(args_.hi_surrogate);
    args_.hi_surrogate = 0;
    block_string_bytes(lone, d);
  }
  if (args_.key_str) args_.key += bytes;
  else if (args_.skip_depth == 0) args_string_bytes(bytes, false, d);
}

void ChatParser::block_unit(uint32_t u, ChatDelta& d) {
  if (args_.hi_surrogate && u >= 0xDC00 && u <= 0xDFFF) {
    const uint32_t cp = 0x10000 + ((args_.hi_surrogate - 0xD800) << 10) + (u - 0xDC00);
    args_.hi_surrogate = 0;
    block_string_bytes(utf8_of(cp), d);
  } else if (u >= 0xD800 && u <= 0xDBFF) {
    block_string_bytes("", d);  // writes a pending lone high surrogate
    args_.hi_surrogate = u;
  } else {
    block_string_bytes(utf8_of(u), d);
  }
}

void ChatParser::block_end(ChatDelta& d) {
  Args& a = args_;
  if ((a.block == Block::Num || a.block == Block::Lit) && a.skip_depth == 0) {
    const ojson v = try_parse_json<ojson>(a.tok);
    const bool ok = !v.is_discarded() && (a.block == Block::Num ? v.is_number() : (v.is_boolean() || v.is_null()));
    if (ok) {
      args_out(a.prefix + json_text(v), d);
      ++a.frames.back().count;
    }
  } else if ((a.block == Block::Str || a.block == Block::Esc || a.block == Block::Hex) && !a.key_str &&
             a.skip_depth == 0) {
    a.hi_surrogate = 0;  // half a character: dropped
    args_string_bytes("", true, d);
    args_out("\"", d);
  }
  while (a.frames.size() > 1) {
    const Frame f = std::move(a.frames.back());
    a.frames.pop_back();
    if (f.shown) args_out(f.type == '{' ? "}" : "]", d);
  }
  a.utf8_hold.clear();
  a.tok.clear();
  a.key.clear();
  a.prefix.clear();
  a.hi_surrogate = 0;
  a.skip_depth = 0;
  a.key_str = a.first = false;
  a.block = Block::None;
}

void ChatParser::block_error(ChatDelta& d) {
  block_end(d);
  args_.block = Block::Error;
}

void ChatParser::block_char(char c, ChatDelta& d) {
  Args& a = args_;
  switch (a.block) {
    case Block::None:
    case Block::Error: return;
    case Block::Done:
      if (!json_space(c)) block_error(d);
      return;
    case Block::Start:
      if (json_space(c)) return;
      if (c != '{') return block_error(d);
      a.block = Block::Key;  // the block's object is the call's object
      a.first = true;
      return;
    case Block::Key:
      if (json_space(c)) return;
      if (c == '"') {
        a.block = Block::Str;
        a.key_str = true;
        a.key.clear();
        return;
      }
      if (c == '}' && a.first) return block_close_container(d);
      return block_error(d);
    case Block::Colon:
      if (json_space(c)) return;
      if (c != ':') return block_error(d);
      a.block = Block::Value;
      a.first = false;
      return;
    case Block::Value:
      if (json_space(c)) return;
      if (c == ']' && a.first && a.frames.back().type == '[') return block_close_container(d);
      a.first = false;
      if (c == '"') {
        value_started(d, false);
        if (a.skip_depth == 0) args_out("\"", d);
        a.block = Block::Str;
        a.key_str = false;
        return;
      }
      if (c == '{' || c == '[') {
        if (a.frames.size() + 1 >= static_cast<size_t>(kJsonMaxDepth)) return block_error(d);
        value_started(d, false);
        Frame f;
        f.type = c;
        f.shown = a.skip_depth == 0;
        if (f.shown) args_out(std::string(1, c), d);
        a.frames.push_back(std::move(f));
        a.block = c == '{' ? Block::Key : Block::Value;
        a.first = true;
        return;
      }
      if (c == '-' || (c >= '0' && c <= '9') || (c >= 'a' && c <= 'z')) {
        value_started(d, true);
        a.tok.assign(1, c);
        a.block = c >= 'a' ? Block::Lit : Block::Num;
        return;
      }
      return block_error(d);
    case Block::After:
      if (json_space(c)) return;
      if (c == ',') {
        a.block = a.frames.back().type == '{' ? Block::Key : Block::Value;
        a.first = false;
        return;
      }
      if (c == (a.frames.back().type == '{' ? '}' : ']')) return block_close_container(d);
      return block_error(d);
    case Block::Num:
    case Block::Lit: {
      const bool num = a.block == Block::Num;
      const bool more = num ? (c >= '0' && c <= '9') || c == '.' || c == 'e' || c == 'E' || c == '+' || c == '-'
                            : c >= 'a' && c <= 'z';
      if (more && a.tok.size() < 64) {
        a.tok += c;
        return;
      }
      const ojson v = try_parse_json<ojson>(a.tok);
      if (more || v.is_discarded() || (num ? !v.is_number() : !(v.is_boolean() || v.is_null()))) return block_error(d);
      if (a.skip_depth == 0) {
        args_out(a.prefix + json_text(v), d);
        ++a.frames.back().count;
      }
      a.tok.clear();
      value_ended();
      return block_char(c, d);  // the character after it
    }
    case Block::Str:
      if (c == '"') {
        block_string_bytes("", d);  // a pending lone high surrogate
        if (a.key_str) {
          Frame& f = a.frames.back();
          const std::string k = json_text(ojson(a.key));
          const bool repeated = std::find(f.keys.begin(), f.keys.end(), k) != f.keys.end();
          if (!repeated) f.keys.push_back(k);
          if (repeated && a.skip_depth == 0) a.skip_depth = a.frames.size();  // the first value stays
          a.key_str = false;
          a.block = Block::Colon;
        } else {
          if (a.skip_depth == 0) {
            args_string_bytes("", true, d);
            args_out("\"", d);
          }
          value_ended();
        }
        return;
      }
      if (c == '\\') {
        a.block = Block::Esc;
        return;
      }
      return block_string_bytes(std::string_view(&c, 1), d);
    case Block::Esc: {
      char e = 0;
      switch (c) {
        case '"': e = '"'; break;
        case '\\': e = '\\'; break;
        case '/': e = '/'; break;
        case 'b': e = '\b'; break;
        case 'f': e = '\f'; break;
        case 'n': e = '\n'; break;
        case 'r': e = '\r'; break;
        case 't': e = '\t'; break;
        case 'u':
          a.block = Block::Hex;
          a.tok.clear();
          return;
        default: return block_error(d);
      }
      a.block = Block::Str;
      return block_string_bytes(std::string_view(&e, 1), d);
    }
    case Block::Hex:
      if (!std::isxdigit(static_cast<unsigned char>(c))) return block_error(d);
      a.tok += c;
      if (a.tok.size() < 4) return;
      a.block = Block::Str;
      {
        const uint32_t u = static_cast<uint32_t>(std::stoul(a.tok, nullptr, 16));
        a.tok.clear();
        block_unit(u, d);
      }
      return;
  }
}

void ChatParser::emit_text(std::string_view text, ChatDelta& d) {
  if (text.empty()) return;
  switch (where_) {
    case Where::Think: msg_.reasoning += text; d.reasoning += text; break;
    case Where::Response: msg_.content += text; d.content += text; break;
    case Where::Argument:
      arg_value_ += text;
      if (args_.open && args_.arg_string) args_string_bytes(text, false, d);
      break;
    case Where::Json:
      if (!msg_.tool_calls.empty()) msg_.tool_calls.back().raw_json += text;
      if (args_.open)
        for (char c : text) block_char(c, d);
      break;
    default: break;  // text between structural tags carries nothing
  }
}

namespace {
// attribute value of `key="..."` in a tag header, unescaped
std::string attr(std::string_view header, std::string_view key) {
  const std::string pat = " " + std::string(key) + "=\"";
  const size_t p = header.find(pat);
  if (p == std::string_view::npos) return "";
  const size_t s = p + pat.size();
  const size_t e = header.find('"', s);
  std::string v(header.substr(s, e == std::string_view::npos ? std::string_view::npos : e - s));
  std::string out;
  for (size_t i = 0; i < v.size(); ++i) {
    if (v.compare(i, 5, "&amp;") == 0) { out += '&'; i += 4; }
    else if (v.compare(i, 6, "&quot;") == 0) { out += '"'; i += 5; }
    else out += v[i];
  }
  return out;
}
std::string_view tag_name(std::string_view header) { return header.substr(0, header.find(' ')); }
}  // namespace

void ChatParser::handle_tag(bool open, std::string_view header, ChatDelta& d) {
  const std::string_view name = tag_name(header);
  if (open) {
    // text of the think or response channel inside a call: the call's arguments end there (a stream
    // sends them before that text; what the call holds after it is not part of them)
    if ((name == "think" || name == "response") && args_.open) args_close(d);
    if (name == "think") where_ = Where::Think;
    else if (name == "response") where_ = Where::Response;
    else if (name == "tools") where_ = Where::Tools;
    else if (name == "call") {
      if (args_.open) args_close(d);  // a call that was never closed ends here
      ParsedToolCall c;
      c.name = attr(header, "tool");
      const std::string idx = attr(header, "index");
      c.index = idx.empty() ? static_cast<int>(msg_.tool_calls.size()) + 1 : std::atoi(idx.c_str());
      ToolCallDelta td;
      td.call = msg_.tool_calls.size();
      td.started = true;
      td.name = c.name;
      td.index = c.index;
      msg_.tool_calls.push_back(std::move(c));
      d.tool_call_deltas.push_back(std::move(td));
      args_ = Args{};
      args_.open = true;
      args_.frames.emplace_back();
      args_out("{", d);
      where_ = Where::Call;
    } else if (name == "argument") {
      arg_key_ = attr(header, "key");
      arg_type_ = attr(header, "type");
      arg_value_.clear();
      if (args_.open) args_typed_open(d);
      where_ = Where::Argument;
    } else if (name == "json") {
      if (args_.open) {
        args_typed_end(d);
        if (args_.block != Block::None) block_end(d);
        args_.block = Block::Start;
      }
      where_ = Where::Json;
    }
    return;
  }
  if (name == "think" || name == "response") {
    where_ = Where::Outside;
  } else if (name == "argument") {
    if (!msg_.tool_calls.empty()) {
      ojson v;
      if (arg_type_ == "string" || arg_type_.empty()) {
        v = arg_value_;
      } else {
        v = try_parse_json<ojson>(arg_value_);  // depth-limited (model output)
        if (v.is_discarded()) v = arg_value_;  // malformed typed value: keep the text
      }
      if (args_.open && where_ == Where::Argument && !args_.arg_string && !args_.arg_skip) {
        args_out(member_prefix(arg_key_) + json_text(v), d);  // a typed value other than a string: written whole
        ++args_.frames[0].count;
      }
      msg_.tool_calls.back().arguments[arg_key_] = std::move(v);
    }
    args_typed_end(d);
    where_ = Where::Call;
  } else if (name == "json") {
    if (!msg_.tool_calls.empty()) {
      ojson v = try_parse_json<ojson>(msg_.tool_calls.back().raw_json);
      if (!v.is_discarded() && v.is_object()) msg_.tool_calls.back().arguments = std::move(v);
    }
    if (args_.block != Block::None) block_end(d);
    where_ = Where::Call;
  } else if (name == "call") {
    if (!msg_.tool_calls.empty() && !msg_.tool_calls.back().complete) {  // a repeated close completes nothing
      if (args_.open) args_close(d);
      msg_.tool_calls.back().complete = true;
      const size_t call = msg_.tool_calls.size() - 1;
      d.tool_calls_completed.push_back(call);
      if (d.tool_call_deltas.empty() || d.tool_call_deltas.back().call != call || d.tool_call_deltas.back().done) {
        ToolCallDelta td;
        td.call = call;
        d.tool_call_deltas.push_back(std::move(td));
      }
      d.tool_call_deltas.back().done = true;
    }
    where_ = Where::Tools;
  } else if (name == "tools") {
    where_ = Where::Outside;
  } else if (name == "message") {
    where_ = Where::Done;
    msg_.done = true;
  }
}

ChatDelta ChatParser::push(std::string_view text) {
  ChatDelta d;
  buf_ += text;
  size_t pos = 0;
  while (pos < buf_.size() && where_ != Where::Done) {
    const size_t lt = buf_.find("<|", pos);
    if (lt == std::string::npos) {
      // hold back a trailing '<' that may start a tag
      size_t end = buf_.size();
      if (buf_.back() == '<') --end;
      emit_text(std::string_view(buf_).substr(pos, end - pos), d);
      pos = end;
      break;
    }
    emit_text(std::string_view(buf_).substr(pos, lt - pos), d);
    pos = lt;
    std::string_view rest = std::string_view(buf_).substr(lt);
    auto starts = [&](const char* tok) {
      const std::string_view t(tok);
      return rest.substr(0, t.size()) == t.substr(0, std::min(t.size(), rest.size()));
    };
    const std::string_view eom(EOM), open(OPEN), close(CLOSE);
    if (rest.size() >= eom.size() && rest.substr(0, eom.size()) == eom) {
      where_ = Where::Done;
      msg_.done = true;
      pos += eom.size();
      break;
    }
    const bool is_open = rest.size() >= open.size() && rest.substr(0, open.size()) == open;
    const bool is_close = rest.size() >= close.size() && rest.substr(0, close.size()) == close;
    if (is_open || is_close) {
      const size_t hdr = (is_open ? open : close).size();
      const size_t sep = rest.find(SEP, hdr);
      // a bare tag: another "<|" before its <|sep|>, or no <|sep|> within kMaxTagHeader bytes. In a
      // channel or between sections it is dropped (the text after it is kept): a stray <|open|> /
      // <|close|> of the model never reaches a client's reasoning or content verbatim
      const size_t next = rest.find("<|", hdr);
      const bool sep_may_start = sep == std::string_view::npos && next != std::string_view::npos &&
                                 std::string_view(SEP).substr(0, rest.size() - next) == rest.substr(next);
      const bool bare = free_text() && ((next < sep && !sep_may_start) ||
                                        // no <|sep|> can still start within kMaxTagHeader bytes (one
                                        // cut by the end of the buffer would: wait for it, as the
                                        // whole text would find it)
                                        (sep == std::string_view::npos &&
                                         rest.size() - hdr >= kMaxTagHeader + std::string_view(SEP).size()) ||
                                        (sep != std::string_view::npos && sep - hdr > kMaxTagHeader));
      if (bare) {
        pos += hdr;
        continue;
      }
      if (sep == std::string_view::npos) break;  // header not complete yet: wait
      handle_tag(is_open, rest.substr(hdr, sep - hdr), d);
      pos += sep + std::string_view(SEP).size();
      continue;
    }
    if (rest.size() >= std::string_view(SEP).size() && rest.substr(0, std::string_view(SEP).size()) == SEP && free_text()) {
      pos += std::string_view(SEP).size();  // a bare <|sep|>: dropped as well
      continue;
    }
    if (starts(EOM) || starts(OPEN) || starts(CLOSE) || starts(SEP)) break;  // could still become a tag: wait
    emit_text(std::string_view(buf_).substr(pos, 2), d);  // a literal "<|"
    pos += 2;
  }
  buf_.erase(0, pos);
  if (where_ == Where::Done) buf_.clear();
  return d;
}

ChatDelta ChatParser::finish() {
  ChatDelta d;
  // held text is the start of a tag: in a channel it is text after all; inside a call (cut off) the
  // arguments end without it
  if (where_ != Where::Done && !(args_.open && (where_ == Where::Argument || where_ == Where::Json))) {
    std::string_view held(buf_);
    if (free_text())
      for (const std::string_view tag : {std::string_view(OPEN), std::string_view(CLOSE), std::string_view(SEP)})
        if (held.substr(0, tag.size()) == tag) held.remove_prefix(tag.size());  // a bare tag: dropped (push)
    emit_text(held, d);
  }
  buf_.clear();
  if (args_.open) args_close(d);  // a call cut off: its JSON still ends as an object
  return d;
}

}  // namespace kimi::tok
