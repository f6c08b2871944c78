// Byte-level BPE training for synthetic tiktoken vocabularies (`kimi synth`).
//
// Ranks 0..255 are the single bytes in byte order; every later rank is a token learned by merging
// the most frequent adjacent pair of tokens (ties: the pair with the smaller (left, right) ids),
// so every token of rank >= 256 is the concatenation of two tokens of smaller rank. Merges never
// cross the chunks produced by pre_split().
#pragma once
#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

namespace kimi::bpe {

// Split text into pre-tokenizer chunks with a simple approximation of the Kimi regex
// (k3-architecture.md §4.1): Han runs; an optional leading non-letter/non-digit character (space,
// punctuation) + a run of other letters + an optional 's/'t/'re/'ve/'m/'ll/'d; digit runs of at
// most 3; an optional space + a punctuation run + trailing newlines; whitespace runs (a run followed
// by a non-space gives its last space to the next chunk). Letters are approximated (ASCII letters,
// and most non-ASCII code points that are not in a punctuation/symbol block). The chunks tile the
// text exactly (their concatenation is the input). Invalid UTF-8 bytes are single "other" chars.
std::vector<std::string_view> pre_split(std::string_view text);

struct TrainOptions {
  size_t n_tokens = 0;  // vocabulary size to reach (>= 256): 256 bytes + n_tokens-256 learned tokens
  // called now and then with (tokens so far, n_tokens)
  std::function<void(size_t, size_t)> progress;
};

// Learn the vocabulary from text. Returns the token byte strings by rank (size n_tokens).
// Throws kimi::Error when the text has too few distinct pairs to learn n_tokens tokens.
std::vector<std::string> train(std::string_view text, const TrainOptions& opt);

// tiktoken.model text: one line "base64(token bytes) rank" per token, in rank order.
std::string to_tiktoken(const std::vector<std::string>& tokens);

// Standard base64 (RFC 4648, with '=' padding).
std::string base64_encode(std::string_view bytes);

}  // namespace kimi::bpe
