// Helpers shared by the GGUF reader (gguf.cpp) and writer (gguf_writer.cpp). Not a public API.
#pragma once
#include <array>
#include <cstddef>
#include <cstdint>
#include <string>

#include "io/gguf.h"

namespace kimi::gguf::detail {

enum class Kind { Unsigned, Signed, Float, Bool, String, Array };
Kind kind_of(ValueType t);
// Encoded size of one scalar of type t (STRING: 8, the minimum; ARRAY: 12, the minimum header).
size_t scalar_size(ValueType t);
// Description of a type id that type_traits() rejects ("removed type Q4_2", "unknown type").
const char* removed_type_note(uint32_t id);
// Byte size of a tensor of `type` with dims `ne` (all four), overflow-checked; false + reason.
bool tensor_nbytes(GgmlType type, const std::array<int64_t, 4>& ne, uint64_t& nbytes, std::string& why);
// "PREFIX-NNNNN-of-MMMMM.gguf" -> prefix, no (1-based), count; false when the name has another form.
bool parse_split_name(const std::string& path, std::string& prefix, uint32_t& no, uint32_t& count);
std::string split_name(const std::string& prefix, uint32_t no, uint32_t count);

}  // namespace kimi::gguf::detail
