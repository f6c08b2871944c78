// kimi: one program, many subcommands (see README.md).
#include <algorithm>
#include <cstdio>
#include <cstring>
#include <exception>
#include <memory>
#include <new>
#include <string>
#include <vector>

#include "command.h"
#include "engine_args.h"
#include "util/error.h"
#ifdef KIMI_HAVE_MPI
#include "mpi/mpi_collective.h"
#endif

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
  if (argc == 2 && !std::strcmp(argv[1], "--version")) argv[1] = const_cast<char*>("version");
  if (argc < 2 || !std::strcmp(argv[1], "--help") || !std::strcmp(argv[1], "-h") || !std::strcmp(argv[1], "help")) {
    usage(argc < 2 ? stderr : stdout);
    return argc < 2 ? 2 : 0;
  }
#ifdef KIMI_HAVE_MPI
  // under mpirun: one communicator for the whole run (docs/distributed.md); an error on any rank
  // ends the whole job (the other ranks would wait for it)
  std::unique_ptr<kimi::dist::MpiCollective> mpi;
  if (kimi::dist::launched_by_mpi()) {
    mpi = kimi::dist::MpiCollective::init(&argc, &argv);
    kimi::app::set_collective(mpi.get());
  }
  // {rank} in an argument (-m 'DIR/M.rank{rank}-of-4.gguf'): this rank's number, so that each rank
  // opens its own per-rank file (kimi shard, docs/distributed.md)
  static std::vector<std::string> rank_args;
  rank_args.reserve(static_cast<size_t>(argc));
  for (int i = 2; i < argc; ++i) {
    std::string a = argv[i];
    for (size_t p; (p = a.find("{rank}")) != std::string::npos;)
      a.replace(p, 6, std::to_string(mpi ? mpi->rank() : 0));
    if (a != argv[i]) argv[i] = rank_args.emplace_back(std::move(a)).data();
  }
  auto failed = [&](const char* what) {
    if (mpi && mpi->size() > 1) mpi->abort_job(fmt::format("kimi {}: error: {}", argv[1], what));
    std::fprintf(stderr, "kimi %s: error: %s\n", argv[1], what);
    return 1;
  };
#else
  auto failed = [&](const char* what) {
    std::fprintf(stderr, "kimi %s: error: %s\n", argv[1], what);
    return 1;
  };
#endif
  for (auto& c : kimi::app::registry()) {
    if (c.name == argv[1]) {
      try {
        return c.fn(argc - 1, argv + 1);
      } catch (const kimi::Error& e) {
        return failed(e.what());
      } catch (const std::bad_alloc&) {
        return failed("out of memory");
      } catch (const std::exception& e) {
        return failed(e.what());
      }
    }
  }
  std::fprintf(stderr, "kimi: unknown command '%s'\n\n", argv[1]);
  usage(stderr);
  return 2;
}
