// Subcommand registry: each app/cmd_*.cpp registers one subcommand with a static Registrar.
#pragma once
#include <functional>
#include <string>
#include <vector>

namespace kimi::app {

using CommandFn = std::function<int(int argc, char** argv)>;  // argv[0] = subcommand name

struct Command {
  std::string name;
  std::string summary;  // one line for `kimi --help`
  CommandFn fn;
};

std::vector<Command>& registry();

struct Registrar {
  Registrar(std::string name, std::string summary, CommandFn fn) {
    registry().push_back({std::move(name), std::move(summary), std::move(fn)});
  }
};

}  // namespace kimi::app
