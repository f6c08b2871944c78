# kimi_server: the HTTP server module (src/server, `kimi serve`). Needs cpp-httplib (Debian
# libcpp-httplib-dev: a split header + libcpp-httplib.so; compile with its pkg-config Cflags so the
# class layouts match the library). Include this file from the top CMakeLists.txt after kimi_lib:
#   include(${CMAKE_SOURCE_DIR}/src/server/server.cmake)
# It adds kimi_server to kimi_lib and defines KIMI_HAVE_SERVER for everything linking kimi_lib
# (app/cmd_serve.cpp and tests/model/test_app_server*.cpp compile a stub without it).
if(NOT TARGET kimi_server)
  pkg_check_modules(HTTPLIB IMPORTED_TARGET cpp-httplib)
  if(HTTPLIB_FOUND)
    kimi_module(server DIRS server DEPS kimi_model kimi_tokenizer PkgConfig::HTTPLIB)
    target_compile_definitions(kimi_server PUBLIC KIMI_HAVE_SERVER=1)
    target_link_libraries(kimi_lib INTERFACE kimi_server)
  else()
    message(WARNING "cpp-httplib not found (apt install libcpp-httplib-dev): `kimi serve` is disabled")
  endif()
endif()
