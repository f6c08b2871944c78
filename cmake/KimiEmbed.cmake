# Turns a file into a C++ source at build time (no file read at run time).
# Script mode: cmake -DIN=<file> -DOUT=<file.cpp> -DNS=<namespace> -DFN=<function> -P KimiEmbed.cmake
# The generated source defines `std::string_view NS::FN()` returning the file's bytes.
if(CMAKE_SCRIPT_MODE_FILE)
  file(READ "${IN}" hex HEX)
  string(LENGTH "${hex}" n)
  math(EXPR n "${n} / 2")
  string(REGEX REPLACE "([0-9a-f][0-9a-f])" "0x\\1," bytes "${hex}")
  string(REGEX REPLACE "(0x..,0x..,0x..,0x..,0x..,0x..,0x..,0x..,0x..,0x..,0x..,0x..,0x..,0x..,0x..,0x..,)" "\\1\n" bytes "${bytes}")
  file(WRITE "${OUT}.tmp" "// generated from ${IN} by cmake/KimiEmbed.cmake; do not edit\n#include <string_view>\n"
       "namespace ${NS} {\nnamespace {\nconst unsigned char kData[] = {\n${bytes}0};\n}  // namespace\n"
       "std::string_view ${FN}() { return std::string_view(reinterpret_cast<const char*>(kData), ${n}); }\n}  // namespace ${NS}\n")
  file(COPY_FILE "${OUT}.tmp" "${OUT}" ONLY_IF_DIFFERENT)
  file(REMOVE "${OUT}.tmp")
  return()
endif()

# kimi_embed_file(<target> <input file> <namespace> <function>): adds the generated source to <target>.
function(kimi_embed_file target in ns fn)
  get_filename_component(base "${in}" NAME)
  set(out "${CMAKE_BINARY_DIR}/embed/${fn}.cpp")
  add_custom_command(OUTPUT "${out}"
    COMMAND ${CMAKE_COMMAND} -DIN=${in} -DOUT=${out} -DNS=${ns} -DFN=${fn} -P ${CMAKE_SOURCE_DIR}/cmake/KimiEmbed.cmake
    DEPENDS "${in}" "${CMAKE_SOURCE_DIR}/cmake/KimiEmbed.cmake"
    COMMENT "Embedding ${base}" VERBATIM)
  target_sources(${target} PRIVATE "${out}")
endfunction()
