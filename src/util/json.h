// Depth-limited JSON parsing: every JSON document the program reads (HTTP bodies, config.json,
// tokenizer_config.json, safetensors headers, chat-template inputs, tool-call arguments) goes
// through parse_json so that a deeply nested document is refused while it is being parsed, before
// any recursive walk (copy, comparison, dump) of the parsed value can overflow the stack.
//
//   auto j = kimi::parse_json<nlohmann::json>(text, "config.json");   // throws kimi::JsonError
//   auto o = kimi::try_parse_json<nlohmann::ordered_json>(body);      // discarded value on error
//
// The work is linear in the text: the value is built by our own SAX handler (JsonBuilder below),
// not by nlohmann's callback parser, whose end of every object walks the whole enclosing array or
// object (a body of 100 000 `{}` took 7.3 s, 8 MiB of them ~1.5 h), and an ordered_json object is
// filled by appending its members and removing repeated keys once at its end (nlohmann's
// ordered_map looks every key up by a linear search: 100 000 keys were quadratic as well).
#pragma once
#include <cstddef>
#include <string>
#include <string_view>
#include <type_traits>
#include <unordered_map>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "util/error.h"

namespace kimi {

// Nesting deeper than this (objects + arrays) is refused. Real inputs nest < 10 levels.
inline constexpr int kJsonMaxDepth = 128;

// A parse failure: malformed text or nesting deeper than the limit. `too_deep` tells them apart.
struct JsonError : Error {
  JsonError(const std::string& msg, bool deep, size_t at = 0) : Error(msg), too_deep(deep), byte(at) {}
  bool too_deep = false;
  size_t byte = 0;  // for a syntax error: 0-based offset of the offending byte in the text
};

// 1-based line and column of byte offset `pos` in `text` (for messages).
inline std::pair<size_t, size_t> json_line_col(std::string_view text, size_t pos) {
  size_t line = 1, col = 1;
  for (size_t i = 0; i < pos && i < text.size(); ++i) {
    if (text[i] == '\n') {
      ++line;
      col = 1;
    } else {
      ++col;
    }
  }
  return {line, col};
}

namespace json_detail {

struct NoExtra {};

template <class T>
struct is_ordered_map : std::false_type {};
template <class K, class V, class L, class A>
struct is_ordered_map<nlohmann::ordered_map<K, V, L, A>> : std::true_type {};

// Builds the value of a JSON text from nlohmann's SAX events, refusing nesting deeper than
// max_depth at the start of the container that is too deep, and telling `extra` every element as
// nlohmann's parser callback would (same events and depths).
template <class J, class Extra>
class JsonBuilder {
 public:
  using Event = typename J::parse_event_t;
  JsonBuilder(J& root, Extra& extra, int max_depth, const std::string& what)
      : root_(root), extra_(extra), max_depth_(max_depth), what_(what) {}

  bool null() { return value(J(nullptr)); }
  bool boolean(bool v) { return value(J(v)); }
  bool number_integer(typename J::number_integer_t v) { return value(J(v)); }
  bool number_unsigned(typename J::number_unsigned_t v) { return value(J(v)); }
  bool number_float(typename J::number_float_t v, const typename J::string_t&) { return value(J(v)); }
  bool string(typename J::string_t& v) { return value(J(std::move(v))); }
  bool binary(typename J::binary_t& v) { return value(J::binary(std::move(v))); }

  bool start_object(std::size_t) { return open(J::value_t::object, Event::object_start); }
  bool start_array(std::size_t) { return open(J::value_t::array, Event::array_start); }

  bool key(typename J::string_t& k) {
    if constexpr (!std::is_same_v<Extra, NoExtra>) {
      J kv(k);
      extra_(depth(), Event::key, kv);
    }
    auto& obj = stack_.back()->template get_ref<typename J::object_t&>();
    if constexpr (is_ordered_map<typename J::object_t>::value) {
      // append; a repeated key is resolved once at the end of the object (dedup_ordered)
      auto& vec = static_cast<typename J::object_t::Container&>(obj);
      vec.emplace_back(std::move(k), J());
      slot_ = &vec.back().second;
    } else {
      J& s = obj[std::move(k)];  // a map: logarithmic; a repeated key keeps the last value
      s = J();
      slot_ = &s;
    }
    return true;
  }

  bool end_object() {
    J& o = *stack_.back();
    if constexpr (is_ordered_map<typename J::object_t>::value) dedup_ordered(o);
    stack_.pop_back();
    if constexpr (!std::is_same_v<Extra, NoExtra>) extra_(depth(), Event::object_end, o);
    return true;
  }
  bool end_array() {
    J& a = *stack_.back();
    stack_.pop_back();
    if constexpr (!std::is_same_v<Extra, NoExtra>) extra_(depth(), Event::array_end, a);
    return true;
  }

  template <class Exception>
  bool parse_error(std::size_t pos, const std::string&, const Exception& ex) {
    throw JsonError(what_ + ": invalid JSON: " + ex.what(), false, pos > 0 ? pos - 1 : 0);
  }

 private:
  int depth() const { return static_cast<int>(stack_.size()); }

  // where the next value goes: the root, the end of the open array, or the member of the last key
  J* place(J&& v) {
    if (stack_.empty()) {
      root_ = std::move(v);
      return &root_;
    }
    J& top = *stack_.back();
    if (top.is_array()) {
      auto& a = top.template get_ref<typename J::array_t&>();
      a.push_back(std::move(v));
      return &a.back();
    }
    *slot_ = std::move(v);
    return slot_;
  }
  bool value(J&& v) {
    J* p = place(std::move(v));
    if constexpr (!std::is_same_v<Extra, NoExtra>) extra_(depth(), Event::value, *p);
    return true;
  }
  bool open(typename J::value_t t, Event ev) {
    if (depth() >= max_depth_)
      throw JsonError(what_ + ": JSON nested deeper than " + std::to_string(max_depth_) + " levels", true);
    if constexpr (!std::is_same_v<Extra, NoExtra>) {
      J d(J::value_t::discarded);
      extra_(depth(), ev, d);
    }
    stack_.push_back(place(J(t)));
    return true;
  }
  // nlohmann's ordered_json keeps a repeated key at its first place with its last value
  static void dedup_ordered(J& o) {
    auto& vec = static_cast<typename J::object_t::Container&>(o.template get_ref<typename J::object_t&>());
    if (vec.size() < 2) return;
    std::unordered_map<std::string_view, size_t> first;
    first.reserve(vec.size());
    bool repeated = false;
    for (size_t i = 0; i < vec.size() && !repeated; ++i) repeated = !first.emplace(vec[i].first, i).second;
    if (!repeated) return;
    first.clear();
    std::vector<size_t> last(vec.size());  // for each first occurrence: the index of its last value
    std::vector<size_t> order;
    for (size_t i = 0; i < vec.size(); ++i) {
      auto [it, fresh] = first.emplace(vec[i].first, i);
      if (fresh) order.push_back(i);
      last[it->second] = i;
    }
    typename J::object_t::Container out;
    out.reserve(order.size());
    for (size_t i : order) out.emplace_back(vec[i].first, std::move(vec[last[i]].second));
    vec.swap(out);
  }

  J& root_;
  Extra& extra_;
  int max_depth_;
  const std::string& what_;
  std::vector<J*> stack_;  // the open containers
  J* slot_ = nullptr;      // the member of the last key
};

template <class J, class Extra>
J parse(std::string_view text, const std::string& what, Extra& extra, int max_depth) {
  J out;
  JsonBuilder<J, Extra> b(out, extra, max_depth, what);
  try {
    J::sax_parse(text.begin(), text.end(), &b, nlohmann::json::input_format_t::json, /*strict=*/true,
                 /*ignore_comments=*/false);
  } catch (const JsonError&) {
    throw;
  } catch (const typename J::exception& e) {
    throw JsonError(what + ": invalid JSON: " + e.what(), false);
  }
  return out;
}

}  // namespace json_detail

// Parses `text` as JSON, calling `extra(depth, event, value)` (nlohmann's parser_callback_t
// signature and events) for every element as well, e.g. to find duplicate keys; the return value
// of `extra` is ignored (nothing is dropped). `what` names the document in the error.
template <class J, class Extra>
J parse_json_with(std::string_view text, const std::string& what, Extra&& extra, int max_depth = kJsonMaxDepth) {
  return json_detail::parse<J>(text, what, extra, max_depth);
}

// Parses `text` as JSON; `what` names the document in the error ("config.json", "request body").
template <class J = nlohmann::json>
J parse_json(std::string_view text, const std::string& what, int max_depth = kJsonMaxDepth) {
  json_detail::NoExtra none;
  return json_detail::parse<J>(text, what, none, max_depth);
}

// As parse_json, but returns a `discarded` value instead of throwing (nlohmann's
// parse(text, nullptr, false) convention); `*err` receives the message when given.
template <class J = nlohmann::json>
J try_parse_json(std::string_view text, std::string* err = nullptr, int max_depth = kJsonMaxDepth) {
  try {
    return parse_json<J>(text, "JSON", max_depth);
  } catch (const JsonError& e) {
    if (err) *err = e.what();
    return J(J::value_t::discarded);
  }
}

}  // namespace kimi
