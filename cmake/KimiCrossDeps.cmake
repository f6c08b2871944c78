# Dependencies of a cross build (cmake/toolchains/*.cmake): the host's Debian packages cannot be
# linked into another target, so scripts/cross-deps.sh puts what the target needs under
# KIMI_CROSS_PREFIX: PCRE2 and GoogleTest built for the target, and include/ with links to the
# header-only libraries (fmt is used in header-only mode). This file makes the same targets the
# native build gets from find_package / pkg-config.
if(NOT KIMI_CROSS_PREFIX OR NOT EXISTS ${KIMI_CROSS_PREFIX}/.complete-v1)
  message(FATAL_ERROR "cross build: KIMI_CROSS_PREFIX='${KIMI_CROSS_PREFIX}' is not a prefix made by "
                      "scripts/cross-deps.sh (run it for this target, or use scripts/cross-build.sh)")
endif()
list(PREPEND CMAKE_PREFIX_PATH ${KIMI_CROSS_PREFIX})
add_library(kimi_cross_headers INTERFACE)
target_include_directories(kimi_cross_headers SYSTEM INTERFACE ${KIMI_CROSS_PREFIX}/include)
add_library(fmt::fmt INTERFACE IMPORTED)
target_link_libraries(fmt::fmt INTERFACE kimi_cross_headers)
target_compile_definitions(fmt::fmt INTERFACE FMT_HEADER_ONLY=1)
add_library(nlohmann_json::nlohmann_json INTERFACE IMPORTED)
target_link_libraries(nlohmann_json::nlohmann_json INTERFACE kimi_cross_headers)
add_library(PkgConfig::PCRE2 STATIC IMPORTED)
set_target_properties(PkgConfig::PCRE2 PROPERTIES IMPORTED_LOCATION ${KIMI_CROSS_PREFIX}/lib/libpcre2-8.a
  INTERFACE_COMPILE_DEFINITIONS PCRE2_STATIC=1)
target_link_libraries(PkgConfig::PCRE2 INTERFACE kimi_cross_headers)
add_library(PkgConfig::HTTPLIB INTERFACE IMPORTED)
target_link_libraries(PkgConfig::HTTPLIB INTERFACE kimi_cross_headers)
if(WIN32)
  target_link_libraries(PkgConfig::HTTPLIB INTERFACE ws2_32)
endif()
