// kimi template render REQUEST.json: the Kimi-K3 chat prompt for an OpenAI-style request body.
#include <CLI/CLI.hpp>
#include <filesystem>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <iterator>
#include <sstream>

#include "command.h"
#include "tokenizer/chat.h"
#include "util/error.h"
#include "util/json.h"
#include "util/paths.h"
#include "util/cli.h"

namespace {

int cmd_template(int argc, char** argv) {
  CLI::App app{"Kimi-K3 chat template", "kimi template"};
  app.require_subcommand(1);
  auto* render = app.add_subcommand("render",
                                    "print the prompt for an OpenAI-style chat request body (messages, tools, "
                                    "tool_choice, response_format, response_schema, thinking, thinking_effort, "
                                    "add_generation_prompt; default true)");
  std::string file;
  bool newline = false;
  render->add_option("REQUEST", file, "request JSON file ('-': stdin)")->required();
  render->add_flag("--newline", newline, "end the output with a newline (the prompt itself has none)");
  if (int rc = kimi::parse_cli(app, argc, argv); rc >= 0) return rc;
  std::string text;
  if (file == "-") {
    std::ostringstream ss;
    ss << std::cin.rdbuf();
    text = ss.str();
  } else {
    kimi::check(!std::filesystem::is_directory(file), "request file '{}' is a directory (expected a JSON file)", file);
    kimi::check(std::filesystem::exists(file), "cannot open request file '{}': no such file", file);
    text = kimi::read_input_file(file);  // regular files only: a FIFO would block
  }
  kimi::tok::ojson body;
  try {
    body = kimi::parse_json<kimi::tok::ojson>(text, file);  // depth-limited
  } catch (const kimi::JsonError& e) {
    if (e.too_deep) throw;
    kimi::fail("{}: not valid JSON: {}", file, e.what());
  }
  std::string prompt;
  try {
    prompt = kimi::tok::render_chat_request(body);
  } catch (const kimi::Error& e) {
    kimi::fail("{}: {}", file, e.what());
  }
  if (newline) prompt += '\n';
  std::fwrite(prompt.data(), 1, prompt.size(), stdout);
  return 0;
}

kimi::app::Registrar reg_template("template", "render the Kimi-K3 chat prompt for an OpenAI-style request", cmd_template);

}  // namespace
