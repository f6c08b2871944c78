// The built-in chat page served by `kimi serve` at / (docs/server.md, "Web chat page").
#pragma once
#include <string_view>

namespace kimi::server {

// index.html of src/server/web/, embedded into the binary at build time (cmake/KimiEmbed.cmake).
std::string_view web_index_html();

}  // namespace kimi::server
