// kimi serve: OpenAI-compatible HTTP server (src/server, docs/server.md).
#include <cstdio>

#include "command.h"

#ifdef KIMI_HAVE_SERVER
#include "server/server.h"
#endif

namespace {

int cmd_serve(int argc, char** argv) {
#ifdef KIMI_HAVE_SERVER
  return kimi::server::serve_main(argc, argv);
#else
  (void)argc;
  (void)argv;
  std::fprintf(stderr,
               "kimi serve: this build has no server (needs cpp-httplib: apt install libcpp-httplib-dev, and "
               "src/server/server.cmake included from CMakeLists.txt)\n");
  return 1;
#endif
}

kimi::app::Registrar reg("serve", "OpenAI-compatible HTTP server (continuous batching, prompt cache)", cmd_serve);

}  // namespace
