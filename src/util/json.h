// Depth-limited JSON parsing: every JSON document the program reads (HTTP bodies, config.json,
// tokenizer_config.json, safetensors headers, chat-template inputs, tool-call arguments) goes
// through parse_json so that a deeply nested document is refused while it is being parsed, before
// any recursive walk (copy, comparison, dump) of the parsed value can overflow the stack.
//
//   auto j = kimi::parse_json<nlohmann::json>(text, "config.json");   // throws kimi::JsonError
//   auto o = kimi::try_parse_json<nlohmann::ordered_json>(body);      // discarded value on error
#pragma once
#include <string>
#include <string_view>
#include <utility>

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

// Parses `text` as JSON, calling `extra(depth, event, value)` (nlohmann's parser_callback_t
// signature) for every element as well, e.g. to find duplicate keys; `extra` returning false drops the
// element, as with nlohmann. `what` names the document in the error.
template <class J, class Extra>
J parse_json_with(std::string_view text, const std::string& what, Extra&& extra, int max_depth = kJsonMaxDepth) {
  bool deep = false;
  auto too_deep = [&] { return what + ": JSON nested deeper than " + std::to_string(max_depth) + " levels"; };
  // The callback sees every element with its depth (0 = the top-level value's contents); an
  // exception thrown from it aborts the parse before the deeper levels are built.
  auto cb = [&](int depth, typename J::parse_event_t ev, J& v) -> bool {
    if ((ev == J::parse_event_t::object_start || ev == J::parse_event_t::array_start) && depth >= max_depth) {
      deep = true;
      throw JsonError(too_deep(), true);
    }
    return extra(depth, ev, v);
  };
  try {
    return J::parse(text.begin(), text.end(), cb, /*allow_exceptions=*/true, /*ignore_comments=*/false);
  } catch (const JsonError&) {
    throw;
  } catch (const typename J::parse_error& e) {
    if (deep) throw JsonError(too_deep(), true);
    throw JsonError(what + ": invalid JSON: " + e.what(), false, e.byte > 0 ? e.byte - 1 : 0);
  } catch (const typename J::exception& e) {
    if (deep) throw JsonError(too_deep(), true);
    throw JsonError(what + ": invalid JSON: " + e.what(), false);
  }
}

// Parses `text` as JSON; `what` names the document in the error ("config.json", "request body").
template <class J = nlohmann::json>
J parse_json(std::string_view text, const std::string& what, int max_depth = kJsonMaxDepth) {
  return parse_json_with<J>(text, what, [](int, typename J::parse_event_t, J&) { return true; }, max_depth);
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
