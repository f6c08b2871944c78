// kimi tokenize / kimi detokenize: the tokenizer from a GGUF (-m) or a tiktoken rank file.
#include <CLI/CLI.hpp>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <iterator>
#include <memory>
#include <nlohmann/json.hpp>
#include <sstream>

#include "command.h"
#include "io/gguf.h"
#include "tokenizer/pretokenizer.h"
#include "tokenizer/tokenizer.h"
#include "tokenizer/unicode.h"
#include "util/error.h"
#include "util/paths.h"
#include "util/cli.h"

namespace {

using kimi::tok::Tokenizer;

struct Source {
  std::string model, tiktoken, pattern;
  std::vector<std::string> specials;  // TEXT=ID
};

void add_source_options(CLI::App& app, Source& s) {
  app.add_option("-m,--model", s.model, "GGUF model file (any shard) with a tokenizer.ggml.* vocabulary");
  app.add_option("--tiktoken", s.tiktoken,
                 "tiktoken rank file ('base64 rank' lines, or the JSON of the npm tiktoken package) instead of -m");
  app.add_option("--pattern", s.pattern,
                 "pre-tokenizer regex (Rust-regex syntax) for --tiktoken; 'kimi', 'cl100k' and 'o200k' name the "
                 "built-in patterns (default: the JSON's pat_str)");
  app.add_option("--special", s.specials, "special token TEXT=ID for --tiktoken (repeatable; default: the JSON's)");
}

Tokenizer load(const Source& s) {
  kimi::check(s.model.empty() != s.tiktoken.empty(), "give exactly one of -m/--model and --tiktoken");
  if (!s.model.empty()) {
    auto r = kimi::gguf::Reader::open(s.model);
    return Tokenizer::from_gguf(*r);
  }
  std::string pat = s.pattern;
  if (pat == "kimi") pat = kimi::tok::kKimiPattern;
  else if (pat == "cl100k") pat = kimi::tok::kCl100kPattern;
  else if (pat == "o200k") pat = kimi::tok::kO200kPattern;
  std::map<std::string, int32_t> sp;
  for (const std::string& e : s.specials) {
    const size_t eq = e.rfind('=');
    kimi::check(eq != std::string::npos && eq > 0, "--special '{}': expected TEXT=ID", e);
    try {
      sp[e.substr(0, eq)] = std::stoi(e.substr(eq + 1));
    } catch (const std::exception&) {
      kimi::fail("--special '{}': '{}' is not an integer id", e, e.substr(eq + 1));
    }
  }
  return Tokenizer::from_tiktoken(s.tiktoken, pat, sp);
}

std::string read_input(const std::string& file) {
  if (file.empty() || file == "-") {
    std::ostringstream ss;
    ss << std::cin.rdbuf();
    return ss.str();
  }
  kimi::check(!std::filesystem::is_directory(file), "input '{}' is a directory (expected a text file)", file);
  kimi::check(std::filesystem::exists(file), "cannot open input file '{}': no such file", file);
  return kimi::read_input_file(file);  // regular files only: a FIFO would block ('-' reads stdin)
}

// A piece for line output: printable UTF-8 as is, everything else as \n, \t, \xNN.
std::string escape(const std::string& b) {
  std::string out;
  const std::string clean = kimi::tok::utf8_valid(b) ? b : std::string();
  for (size_t i = 0; i < b.size(); ++i) {
    const unsigned char c = static_cast<unsigned char>(b[i]);
    if (c == '\n') out += "\\n";
    else if (c == '\r') out += "\\r";
    else if (c == '\t') out += "\\t";
    else if (c == '\\') out += "\\\\";
    else if (c < 0x20 || c == 0x7F || (c >= 0x80 && clean.empty())) out += fmt::format("\\x{:02x}", c);
    else out += static_cast<char>(c);
  }
  return out;
}

std::string json_strings(const std::vector<std::string>& v) {
  nlohmann::json j = nlohmann::json::array();
  for (const auto& s : v) j.push_back(s);
  return j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

int cmd_tokenize(int argc, char** argv) {
  CLI::App app{"Tokenize text (FILE, --text or stdin) and print the token ids", "kimi tokenize"};
  Source src;
  add_source_options(app, src);
  std::string file, text, bench;
  bool json = false, pieces = false, split = false, no_special = false;
  int bench_iters = 0;
  app.add_option("FILE", file, "input text file ('-' or none: stdin)");
  app.add_option("--text,-t", text, "tokenize this text instead of a file");
  app.add_flag("--json", json, "print a JSON array");
  app.add_flag("--pieces", pieces, "print each token's piece (with its id) instead of bare ids");
  app.add_flag("--split", split, "print only the pre-tokenizer pieces");
  app.add_flag("--no-special", no_special, "treat special-token text as ordinary text");
  app.add_option("--bench", bench, "benchmark encoding of this file: prints tokens/s and MB/s");
  app.add_option("--bench-iters", bench_iters, "benchmark iterations (default: as many as fit in ~2 s, at least 3)");
  if (int rc = kimi::parse_cli(app, argc, argv); rc >= 0) return rc;
  const Tokenizer tok = load(src);
  const bool allow_special = !no_special;

  if (!bench.empty()) {
    const std::string data = read_input(bench);
    kimi::check(!data.empty(), "--bench: '{}' is empty", bench);
    std::vector<int32_t> ids;
    ids.reserve(data.size());
    using clk = std::chrono::steady_clock;
    tok.encode(data, ids, allow_special);  // warm-up (also fills the piece cache, as in real use)
    const size_t n_tokens = ids.size();
    int iters = 0;
    const auto t0 = clk::now();
    double secs = 0;
    do {
      ids.clear();
      tok.encode(data, ids, allow_special);
      ++iters;
      secs = std::chrono::duration<double>(clk::now() - t0).count();
    } while (bench_iters > 0 ? iters < bench_iters : (secs < 2.0 || iters < 3));
    const double per = secs / iters;
    std::printf("%zu bytes, %zu tokens, %d iterations, %.3f ms/iter: %.0f tokens/s, %.2f MB/s\n", data.size(), n_tokens,
                iters, per * 1e3, n_tokens / per, data.size() / per / 1e6);
    return 0;
  }

  const std::string input = text.empty() ? read_input(file) : text;
  if (split) {
    const auto parts = tok.split(input, allow_special);
    if (json) {
      std::printf("%s\n", json_strings(parts).c_str());
    } else {
      for (const auto& p : parts) std::printf("%s\n", escape(p).c_str());
    }
    return 0;
  }
  const auto ids = tok.encode(input, allow_special);
  if (pieces) {
    if (json) {
      std::vector<std::string> ps;
      for (int32_t id : ids) ps.push_back(tok.token_to_piece(id));
      std::printf("%s\n", json_strings(ps).c_str());
    } else {
      for (int32_t id : ids) std::printf("%d\t%s\n", id, escape(tok.token_to_piece(id)).c_str());
    }
    return 0;
  }
  if (json) {
    std::printf("%s\n", nlohmann::json(ids).dump().c_str());
  } else {
    std::string line;
    for (size_t i = 0; i < ids.size(); ++i) line += (i ? " " : "") + std::to_string(ids[i]);
    std::printf("%s\n", line.c_str());
  }
  return 0;
}

int cmd_detokenize(int argc, char** argv) {
  CLI::App app{"Turn token ids (arguments, or stdin: whitespace/comma separated or a JSON array) back into text",
               "kimi detokenize"};
  Source src;
  add_source_options(app, src);
  std::vector<std::string> args;
  bool skip_special = false;
  app.add_option("IDS", args, "token ids");
  app.add_flag("--skip-special", skip_special, "leave out special tokens");
  if (int rc = kimi::parse_cli(app, argc, argv); rc >= 0) return rc;
  const Tokenizer tok = load(src);
  std::string all;
  if (args.empty()) {
    all = read_input("-");
  } else {
    for (const auto& a : args) all += a + " ";
  }
  for (char& c : all)
    if (c == ',' || c == '[' || c == ']') c = ' ';
  std::istringstream ss(all);
  std::string w;
  kimi::tok::Detokenizer d(tok, skip_special);
  std::string out;
  while (ss >> w) {
    size_t used = 0;
    long long v = 0;
    try {
      v = std::stoll(w, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    kimi::check(used == w.size(), "'{}' is not a token id", w);
    kimi::check(v >= 0 && v < tok.n_vocab(), "token id {} is out of range (vocabulary has {} tokens)", v, tok.n_vocab());
    out += d.push(static_cast<int32_t>(v));
  }
  out += d.flush();
  std::fwrite(out.data(), 1, out.size(), stdout);
  return 0;
}

kimi::app::Registrar reg_tok("tokenize", "text -> token ids (GGUF vocabulary or tiktoken ranks), splits, benchmark",
                             cmd_tokenize);
kimi::app::Registrar reg_detok("detokenize", "token ids -> text", cmd_detokenize);

}  // namespace
