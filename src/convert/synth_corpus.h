// Deterministic training text for the synthetic BPE vocabulary (`kimi synth`): varied English-like
// prose, source code, numbers, markdown and a little non-ASCII text (accented Latin, Greek, CJK),
// all produced by a fixed generator (no external data).
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>

namespace kimi::synth {

// At least min_bytes of UTF-8 text (a little more: it ends on a paragraph boundary). The same
// (min_bytes, seed) always gives the same text; a longer text starts with the shorter one.
std::string make_corpus(size_t min_bytes, uint64_t seed = 0);

}  // namespace kimi::synth
