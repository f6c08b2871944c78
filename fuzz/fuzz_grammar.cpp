// libFuzzer target: the GBNF compiler and its automaton (src/server/grammar.*), as `kimi serve`
// runs them for a request's "grammar". The input is GBNF text, optionally followed by a NUL byte and
// text to feed the matcher. Under the compile budget (small here: depth 64, 50 000 symbols, 1 s),
// a grammar must either compile or end in GrammarError (LimitError beyond the budget); a crash, a
// sanitizer report, a hang (-timeout) or any other exception is a bug. A compiled grammar's matcher
// (the server makes it while compiling) is fed the text byte by byte and through accepts_bytes, and
// both must agree; can_end() right after construction must equal "the shortest sentence is empty".
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "server/grammar.h"

using namespace kimi::server::grammar;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view in(reinterpret_cast<const char*>(data), size);
  const size_t nul = in.find('\0');
  const std::string_view text = in.substr(0, nul);
  const std::string_view feed = nul == std::string_view::npos ? std::string_view() : in.substr(nul + 1);
  Budget b;
  b.max_size = 50000;
  b.max_seconds = 1.0;
  std::shared_ptr<const Grammar> g;
  try {
    g = Grammar::parse(text, b);
  } catch (const GrammarError&) {
    return 0;
  }
  try {
    Matcher m(g);
    if (m.can_end() != (g->min_sentence_bytes() == 0)) __builtin_trap();
    Matcher whole(g);
    const bool all = whole.accepts_bytes(feed);
    bool ok = true;
    for (char c : feed) {
      if (!m.advance_bytes(std::string_view(&c, 1))) {
        ok = false;
        break;
      }
    }
    // byte by byte and at once agree, unless the stack caps cut one of them short
    if (ok != all && !m.overflowed() && !whole.overflowed()) __builtin_trap();
    if (ok && m.can_end() && m.dead()) __builtin_trap();
  } catch (const LimitError&) {
    return 0;  // the first state beyond the matcher's caps: the server answers 400
  }
  return 0;
}
