# Operating-system specific build settings (docs/platforms.md).
# The HTTP server (src/server, `kimi serve`) is built everywhere: its sockets go through
# src/util/net.h (POSIX sockets + poll, or Winsock 2 + WSAPoll; ws2_32 is linked below).
option(KIMI_SERVER "Build the HTTP server (kimi serve)" ON)
# Windows (MinGW-w64): src/util/win32/posix_shim.h is force-included into every file and
# src/util/win32/include holds the few POSIX headers MinGW lacks (their functions are in
# src/util/win32/posix_win32.cpp), so the rest of the code keeps one POSIX spelling. binmode.o makes
# open()/fopen() binary by default; kimi.exe gets a manifest (UTF-8 code page, long paths).
if(WIN32)
  enable_language(RC)
  add_compile_options(-include ${CMAKE_SOURCE_DIR}/src/util/win32/posix_shim.h)
  include_directories(SYSTEM ${CMAKE_SOURCE_DIR}/src/util/win32/include)
  add_compile_definitions(_WIN32_WINNT=0x0A00 NOMINMAX WIN32_LEAN_AND_MEAN _FILE_OFFSET_BITS=64)
  execute_process(COMMAND ${CMAKE_CXX_COMPILER} -print-file-name=binmode.o OUTPUT_VARIABLE KIMI_BINMODE_OBJ
                  OUTPUT_STRIP_TRAILING_WHITESPACE)
  if(EXISTS "${KIMI_BINMODE_OBJ}")
    add_link_options(${KIMI_BINMODE_OBJ})
  endif()
  link_libraries(psapi ws2_32)
endif()

# Platform resources of an executable (the Windows manifest); nothing elsewhere.
function(kimi_platform_executable target)
  if(WIN32)
    target_sources(${target} PRIVATE ${CMAKE_SOURCE_DIR}/src/util/win32/kimi.rc)
  endif()
endfunction()
