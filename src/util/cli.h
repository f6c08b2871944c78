// Argument parsing for subcommands (CLI11), with one behaviour everywhere: `--help` prints the
// help and exits 0; a usage error prints ONE line "kimi CMD: error: ... (see kimi CMD --help)"
// and exits 2. A flag given twice takes its last value (as llama.cpp and scripts expect; options
// that collect values, like -ot, keep them all). A single dash with several letters (`-hf`,
// `-xyz`) is never split into one-letter flags: it is an error naming the flag (llama.cpp spells
// its multi-letter short flags this way; the engine commands map theirs first, engine_args.h).
#pragma once
#include <CLI/CLI.hpp>
#include <cctype>
#include <cstdio>
#include <cstring>
#include <string>

namespace kimi {

namespace cli_detail {

// llama.cpp flags for features kimi.cpp does not have: the error says what they are.
inline const char* unsupported_llama_flag(const std::string& a) {
  static const char* const kFlags[][2] = {
      {"-hf", "downloading from Hugging Face"},  {"--hf-repo", "downloading from Hugging Face"},
      {"-hfr", "downloading from Hugging Face"}, {"-hff", "downloading from Hugging Face"},
      {"--hf-file", "downloading from Hugging Face"}, {"-mu", "downloading a model by URL"},
      {"--model-url", "downloading a model by URL"}, {"--lora", "LoRA adapters"},
      {"-md", "speculative decoding with a draft model"}, {"--model-draft", "speculative decoding with a draft model"},
      {"--mmproj", "multimodal projectors"}, {"-sm", "--split-mode"}, {"-ts", "tensor splits (use -ot)"},
      {"--tensor-split", "tensor splits (use -ot)"}, {"-mg", "a main GPU"}, {"--main-gpu", "a main GPU"},
      {"--rope-scaling", "RoPE scaling"}, {"--grammar-file", "grammar files on the command line"},
      {"-cnv", "conversation mode in run (use kimi chat)"}, {"-i", "interactive mode in run (use kimi chat)"},
      {"-ins", "interactive mode in run (use kimi chat)"}};
  for (const auto& f : kFlags)
    if (a == f[0]) return f[1];
  return nullptr;
}

inline std::string fmt_unsupported(const std::string& flag, const char* what) {
  if (std::strncmp(what, "--", 2) == 0) return flag + " is not a kimi flag (did you mean " + what + "?)";
  return flag + ": kimi.cpp does not support " + what;
}

// "-12", "-0.5", "-1e3": a negative number (a value, not a flag).
inline bool negative_number(const std::string& a) {
  return a.size() >= 2 && a[0] == '-' && (std::isdigit(static_cast<unsigned char>(a[1])) || a[1] == '.');
}

// The first problem in argv (empty: none). `app` tells which flags take a value (what follows
// one is its value, not a flag).
inline std::string check_flags(CLI::App& app, int argc, char** argv) {
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--") break;
    if (a.size() < 2 || a[0] != '-' || negative_number(a)) continue;
    const std::string name = a.substr(0, a.find('='));
    if (const char* what = unsupported_llama_flag(name); what && !app.get_option_no_throw(name))
      return fmt_unsupported(name, what);
    if (a[1] != '-' && a.size() > 2 && std::isalpha(static_cast<unsigned char>(a[2]))) {
      // CLI11 would read -xyz as -x -y -z (or -x yz): only one-letter flags take one dash here
      const CLI::Option* o = app.get_option_no_throw("--" + a.substr(1));
      return o ? "unknown option " + a + " (did you mean --" + a.substr(1) + "?)"
               : "unknown option " + a + " (one dash takes a one-letter flag; long flags take two)";
    }
    // a flag that takes a value: skip the value (which may start with '-', e.g. -p "-x")
    const CLI::Option* o = app.get_option_no_throw(name);
    if (o && o->get_type_size_max() > 0 && name == a && i + 1 < argc) ++i;
  }
  return {};
}

}  // namespace cli_detail

// argv[0] is the subcommand name. Returns -1 when the command should run, else the exit code.
inline int parse_cli(CLI::App& app, int argc, char** argv) {
  const char* name = argc > 0 ? argv[0] : "?";
  // a repeated flag: the last value wins (options that collect several values keep all)
  for (CLI::Option* o : app.get_options())
    if (o->get_items_expected_max() <= 1 && o->get_multi_option_policy() == CLI::MultiOptionPolicy::Throw)
      o->multi_option_policy(CLI::MultiOptionPolicy::TakeLast);
  if (std::string e = cli_detail::check_flags(app, argc, argv); !e.empty()) {
    std::fprintf(stderr, "kimi %s: error: %s (see kimi %s --help)\n", name, e.c_str(), name);
    return 2;
  }
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
    std::fprintf(stderr, "kimi %s: error: %s (see kimi %s --help)\n", name, e.what(), name);
    return 2;
  }
}

}  // namespace kimi
