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

#include <nlohmann/json.hpp>

#include "util/error.h"

namespace kimi {

// Nesting deeper than this (objects + arrays) is refused. Real inputs nest < 10 levels.
inline constexpr int kJsonMaxDepth = 128;

// A parse failure: malformed text or nesting deeper than the limit. `too_deep` tells them apart.
struct JsonError : Error {
  JsonError(const std::string& msg, bool deep) : Error(msg), too_deep(deep) {}
  bool too_deep = false;
};

// Parses `text` as JSON; `what` names the document in the error ("config.json", "request body").
template <class J = nlohmann::json>
J parse_json(std::string_view text, const std::string& what, int max_depth = kJsonMaxDepth) {
  bool deep = false;
  // The callback sees every element with its depth (0 = the top-level value's contents); an
  // exception thrown from it aborts the parse before the deeper levels are built.
  auto cb = [&](int depth, typename J::parse_event_t ev, J&) -> bool {
    if ((ev == J::parse_event_t::object_start || ev == J::parse_event_t::array_start) && depth >= max_depth) {
      deep = true;
      throw JsonError(what + ": JSON nested deeper than " + std::to_string(max_depth) + " levels", true);
    }
    return true;
  };
  try {
    return J::parse(text.begin(), text.end(), cb, /*allow_exceptions=*/true, /*ignore_comments=*/false);
  } catch (const JsonError&) {
    throw;
  } catch (const typename J::exception& e) {
    if (deep) throw JsonError(what + ": JSON nested deeper than " + std::to_string(max_depth) + " levels", true);
    throw JsonError(what + ": invalid JSON: " + e.what(), false);
  }
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
