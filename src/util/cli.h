// Argument parsing for subcommands (CLI11), with one behaviour everywhere: `--help` prints the
// help and exits 0; a usage error prints ONE line "kimi CMD: error: ... (see kimi CMD --help)"
// and exits 2.
#pragma once
#include <CLI/CLI.hpp>
#include <cstdio>

namespace kimi {

// argv[0] is the subcommand name. Returns -1 when the command should run, else the exit code.
inline int parse_cli(CLI::App& app, int argc, char** argv) {
  try {
    app.parse(argc, argv);
    return -1;
  } catch (const CLI::CallForHelp&) {
    std::fputs(app.help().c_str(), stdout);
    return 0;
  } catch (const CLI::CallForAllHelp&) {
    std::fputs(app.help("", CLI::AppFormatMode::All).c_str(), stdout);
    return 0;
  } catch (const CLI::CallForVersion&) {
    return 0;
  } catch (const CLI::ParseError& e) {
    const char* name = argc > 0 ? argv[0] : "?";
    std::fprintf(stderr, "kimi %s: error: %s (see kimi %s --help)\n", name, e.what(), name);
    return 2;
  }
}

}  // namespace kimi
