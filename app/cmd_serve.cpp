// kimi serve: OpenAI-compatible HTTP server (src/server, docs/server.md).
#include "command.h"
#include "server/server.h"

namespace {

int cmd_serve(int argc, char** argv) { return kimi::server::serve_main(argc, argv); }

kimi::app::Registrar reg("serve", "OpenAI-compatible HTTP server (continuous batching, prompt cache)", cmd_serve);

}  // namespace
