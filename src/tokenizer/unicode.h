// UTF-8 helpers for the tokenizer: validation, WHATWG-style replacement of invalid sequences,
// incremental completeness checks and the GPT-2 byte <-> unicode mapping used by byte-level BPE
// vocabularies in GGUF files.
#pragma once
#include <cstdint>
#include <string>
#include <string_view>

namespace kimi::tok {

// Appends the UTF-8 encoding of code point cp (must be <= 0x10FFFF).
void utf8_append(std::string& out, uint32_t cp);

// Decodes one code point at s[i]; returns its length in bytes (1..4), or 0 when the bytes at i
// do not start a valid, complete, shortest-form, non-surrogate sequence. Sets cp on success.
size_t utf8_decode(std::string_view s, size_t i, uint32_t& cp);

bool utf8_valid(std::string_view s);

// Replaces every maximal invalid subsequence by U+FFFD exactly as the WHATWG UTF-8 decoder does
// (what Node's TextDecoder and Python's bytes.decode(errors="replace") produce). Valid input is
// returned unchanged.
std::string utf8_sanitize(std::string_view s);

// Length of the longest suffix of s that is a proper prefix of a valid UTF-8 sequence (0..3):
// the bytes an incremental decoder must hold back because more may follow.
size_t utf8_incomplete_tail(std::string_view s);

// GPT-2 byte-level mapping: every byte value maps to one printable code point
// (printable Latin-1 bytes map to themselves, the others to U+0100 + n).
uint32_t gpt2_byte_to_cp(uint8_t b);
// Maps raw bytes to the GPT-2 unicode string (UTF-8).
std::string gpt2_encode(std::string_view bytes);
// Inverse: returns false when s contains a code point outside the mapping or invalid UTF-8.
bool gpt2_decode(std::string_view s, std::string& bytes_out);

}  // namespace kimi::tok
