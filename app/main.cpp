// kimi: one program, many subcommands (see README.md).
#include <algorithm>
#include <cstdio>
#include <cstring>
#include <exception>
#include <new>

#include "command.h"
#include "util/error.h"

namespace kimi::app {
std::vector<Command>& registry() {
  static std::vector<Command> r;
  return r;
}
}  // namespace kimi::app

static void usage(FILE* f) {
  auto cmds = kimi::app::registry();
  std::sort(cmds.begin(), cmds.end(), [](auto& a, auto& b) { return a.name < b.name; });
  std::fprintf(f, "usage: kimi <command> [options]   (kimi <command> --help for details)\n\ncommands:\n");
  for (auto& c : cmds) std::fprintf(f, "  %-12s %s\n", c.name.c_str(), c.summary.c_str());
}

int main(int argc, char** argv) {
  if (argc < 2 || !std::strcmp(argv[1], "--help") || !std::strcmp(argv[1], "-h") || !std::strcmp(argv[1], "help")) {
    usage(argc < 2 ? stderr : stdout);
    return argc < 2 ? 2 : 0;
  }
  for (auto& c : kimi::app::registry()) {
    if (c.name == argv[1]) {
      try {
        return c.fn(argc - 1, argv + 1);
      } catch (const kimi::Error& e) {
        std::fprintf(stderr, "kimi %s: error: %s\n", argv[1], e.what());
        return 1;
      } catch (const std::bad_alloc&) {
        std::fprintf(stderr, "kimi %s: error: out of memory\n", argv[1]);
        return 1;
      } catch (const std::exception& e) {
        std::fprintf(stderr, "kimi %s: error: %s\n", argv[1], e.what());
        return 1;
      }
    }
  }
  std::fprintf(stderr, "kimi: unknown command '%s'\n\n", argv[1]);
  usage(stderr);
  return 2;
}
