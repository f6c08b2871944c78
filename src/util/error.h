// Errors: every failure is a kimi::Error with a message that names the file, tensor or key
// and what was expected. The CLI catches it, prints it and exits non-zero.
#pragma once
#include <fmt/format.h>
#include <stdexcept>
#include <string>

namespace kimi {

struct Error : std::runtime_error {
  using std::runtime_error::runtime_error;
};

template <typename... Args>
[[noreturn]] inline void fail(fmt::format_string<Args...> f, Args&&... args) {
  throw Error(fmt::format(f, std::forward<Args>(args)...));
}

// check(cond, "...") throws kimi::Error when cond is false.
template <typename... Args>
inline void check(bool cond, fmt::format_string<Args...> f, Args&&... args) {
  if (!cond) throw Error(fmt::format(f, std::forward<Args>(args)...));
}

}  // namespace kimi
