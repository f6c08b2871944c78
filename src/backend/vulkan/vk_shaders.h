// The compute shaders of the Vulkan backend, compiled from src/backend/vulkan/shaders/*.comp to
// SPIR-V by glslc at build time and embedded (CMakeLists.txt writes vk_shaders_table.cpp).
// A shader file whose first line is `// variants: A B C` is compiled once per variant with
// -DVARIANT_A (...) and named FILE_a, FILE_b, ... (lower case); a variant A+B gets both defines
// and the name FILE_a_b.
#pragma once
#include <cstddef>
#include <cstdint>

namespace kimi::vk {

struct Spirv {
  const char* name;
  const uint32_t* words;
  size_t count;
};

// nullptr when no shader has that name
const Spirv* find_spirv(const char* name);

}  // namespace kimi::vk
