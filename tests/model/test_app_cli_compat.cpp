// The command line as llama.cpp users type it: llama.cpp's flag names as aliases, the last of a
// repeated flag wins, flags of features kimi.cpp does not have fail with one clear line, `kimi run`
// echoes the prompt and checks the context before printing anything, friendlier mistakes (a Hugging
// Face directory, out-of-range sampling values), `kimi bench -o`, `kimi --version`.
#include <gtest/gtest.h>

#include <cmath>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "test_util.h"

using kimi::test::run_kimi;
using kimi::test::TempDir;

namespace {

std::string q(const std::string& s) {
  std::string o = "'";
  for (char c : s) o += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return o + "'";
}

const std::string& gguf() {
  static const std::string g = q(kimi::test::tiny_gguf());
  return g;
}

// The generated ids of `run --ids` (stdout's first line; the timing line is on stderr, after it).
std::vector<int> ids_of(const std::string& out) {
  std::istringstream is(out.substr(0, out.find('\n')));
  std::vector<int> v;
  for (int x; is >> x;) v.push_back(x);
  return v;
}

bool one_line_usage_error(const kimi::test::RunResult& r) {
  return r.exit_code == 2 && r.out.find('\n') + 1 == r.out.size() && r.out.rfind("kimi ", 0) == 0 &&
         r.out.find("Usage") == std::string::npos;
}

}  // namespace

TEST(CliCompat, LlamaCppAliasesMeanTheSame) {
  const std::string base = "run -m " + gguf() + " --tokens 1,2,3 -n 6 --ids --temp 0 -t 1";
  const auto ref = run_kimi(base);
  ASSERT_EQ(ref.exit_code, 0) << ref.out;
  ASSERT_EQ(ids_of(ref.out).size(), 6u) << ref.out;
  for (const char* extra : {" --ctx-size 64", " -c 64", " -b 2", " --batch-size 2", " -ub 3", " --ubatch-size 3",
                            " -fa on", " -fa off", " -fa auto", " --flash-attn on", " -ngl 99", " -ngl 0"}) {
    const auto r = run_kimi(base + extra);
    EXPECT_EQ(r.exit_code, 0) << extra << ": " << r.out;
    EXPECT_EQ(ids_of(r.out), ids_of(ref.out)) << extra;
  }
  const auto bad = run_kimi(base + " -fa maybe");
  EXPECT_TRUE(one_line_usage_error(bad)) << bad.out;
  EXPECT_NE(bad.out.find("--flash-attn"), std::string::npos) << bad.out;
}

// `-ngl 99` is the GPU-layers flag, never `-n gl`; -n keeps its own value.
TEST(CliCompat, NglIsNotDashN) {
  const auto r = run_kimi("run -m " + gguf() + " --tokens 1,2 -n 3 --ids --temp 0 -ngl 99");
  ASSERT_EQ(r.exit_code, 0) << r.out;
  EXPECT_EQ(ids_of(r.out).size(), 3u) << r.out;
}

TEST(CliCompat, LastRepeatedFlagWins) {
  const std::string base = "run -m " + gguf() + " --tokens 1,2 --ids --temp 0 --ignore-eos";
  const auto a = run_kimi(base + " -n 2 -n 5");
  ASSERT_EQ(a.exit_code, 0) << a.out;
  EXPECT_EQ(ids_of(a.out).size(), 5u) << a.out;
  const auto b = run_kimi(base + " -n 5 -n 2");
  ASSERT_EQ(b.exit_code, 0) << b.out;
  EXPECT_EQ(ids_of(b.out).size(), 2u) << b.out;
  // greedy both times; the later --temp wins over an earlier sampling one
  const auto c = run_kimi(base + " -n 5 --temp 1.5 --seed 9 --temp 0");
  EXPECT_EQ(ids_of(c.out), ids_of(a.out)) << c.out;
}

TEST(CliCompat, UnsupportedAndUnknownFlagsFailWithOneLine) {
  struct Case { std::string args, expect; };
  const std::vector<Case> cases = {
      {"run -m " + gguf() + " -p hi -hf org/model", "Hugging Face"},
      {"run -m " + gguf() + " -p hi --hf-repo org/model", "Hugging Face"},
      {"serve -m " + gguf() + " -hf org/model", "Hugging Face"},
      {"chat -m " + gguf() + " -hf x < /dev/null", "Hugging Face"},
      {"run -m " + gguf() + " -p hi -xyz", "unknown option -xyz"},
      {"run -m " + gguf() + " -p hi -temp 0", "did you mean --temp"},
      {"run -m " + gguf() + " -p hi --lora a.gguf", "LoRA"},
      {"run -m " + gguf() + " -p hi -np 2", "-np"},  // run has no --parallel
      {"bench -m " + gguf() + " -hf x", "Hugging Face"},
      {"convert x -hf y", "Hugging Face"},
  };
  for (const Case& c : cases) {
    const auto r = run_kimi(c.args);
    SCOPED_TRACE(c.args + "\n" + r.out);
    EXPECT_TRUE(one_line_usage_error(r));
    EXPECT_NE(r.out.find(c.expect), std::string::npos);
  }
  // a value that starts with '-' is still a value
  const auto neg = run_kimi("run -m " + gguf() + " -p -hf -n 2 --temp 0");
  EXPECT_EQ(neg.exit_code, 0) << neg.out;
}

TEST(CliCompat, SamplingValuesOutOfRangeAreRejected) {
  for (const char* v : {"--temp -1", "--top-p 0", "--top-p 1.5", "--min-p -0.1", "--min-p 2", "--top-k -1",
                        "--repeat-penalty 0", "--repeat-last-n -2", "--top-p abc"}) {
    // serve: an address that cannot be bound, should the flag ever be accepted
    for (const char* cmd : {"run -p hi", "chat", "serve --host 256.0.0.1"}) {
      const auto r = run_kimi(std::string(cmd) + " -m " + gguf() + " " + v + " < /dev/null");
      SCOPED_TRACE(std::string(cmd) + " " + v + "\n" + r.out);
      EXPECT_TRUE(one_line_usage_error(r));
      const std::string flag = std::string(v).substr(0, std::string(v).find(' '));
      EXPECT_NE(r.out.find(flag), std::string::npos);
    }
  }
  // the edges are accepted
  const auto ok = run_kimi("run -m " + gguf() + " -p hi -n 2 --temp 0 --top-p 1 --min-p 0 --top-k 0 --repeat-last-n -1");
  EXPECT_EQ(ok.exit_code, 0) << ok.out;
}

TEST(CliCompat, HuggingFaceDirectoryGetsTheConvertCommand) {
  const std::string hf = q(kimi::test::tiny_hf());
  for (const std::string& cmd : {"run -m " + hf + " -p hi", "chat -m " + hf + " < /dev/null", "serve -m " + hf,
                                "bench -m " + hf, "perplexity -m " + hf + " -f x"}) {
    const auto r = run_kimi(cmd);
    SCOPED_TRACE(cmd + "\n" + r.out);
    EXPECT_EQ(r.exit_code, 2);
    EXPECT_NE(r.out.find("is a Hugging Face checkpoint; convert it with `kimi convert"), std::string::npos);
    EXPECT_NE(r.out.find("-o FILE.gguf`"), std::string::npos);
  }
}

TEST(CliCompat, RunEchoesThePromptAndEndsWithTiming) {
  TempDir td;
  kimi::test::write_file(td.file("p.txt"), "hello world");
  const std::string base = "run -m " + gguf() + " -n 4 --temp 0 -t 1 --ignore-eos";
  const auto p = run_kimi(base + " -p 'hello world'");
  ASSERT_EQ(p.exit_code, 0) << p.out;
  EXPECT_EQ(p.out.rfind("hello world", 0), 0u) << "the prompt is echoed first: " << p.out;
  const size_t timing = p.out.find("prompt: ");
  ASSERT_NE(timing, std::string::npos) << p.out;
  EXPECT_NE(p.out.find("generated 4 tokens", timing), std::string::npos) << p.out;
  EXPECT_EQ(p.out.find('\n', p.out.find('\n', timing) + 1), std::string::npos) << "the timing line is the last";
  // -f FILE is the same prompt
  const auto f = run_kimi(base + " -f " + q(td.file("p.txt")));
  EXPECT_EQ(f.exit_code, 0) << f.out;
  EXPECT_EQ(f.out.substr(0, f.out.find("prompt: ")), p.out.substr(0, timing));
  // --no-display-prompt: only the generated text
  const auto n = run_kimi(base + " -p 'hello world' --no-display-prompt");
  EXPECT_EQ(n.exit_code, 0) << n.out;
  EXPECT_EQ("hello world" + n.out.substr(0, n.out.find("prompt: ")), p.out.substr(0, timing));
  const auto missing = run_kimi(base + " -f " + q(td.file("none.txt")));
  EXPECT_EQ(missing.exit_code, 1) << missing.out;
  EXPECT_NE(missing.out.find("-f/--file: cannot open"), std::string::npos) << missing.out;
}

// `run -c 2 -n 4` needs more positions than the context has: an error before any output.
TEST(CliCompat, RunChecksTheContextBeforeGenerating) {
  const auto r = run_kimi("run -m " + gguf() + " -p hi -c 2 -n 4 --no-display-prompt");
  EXPECT_EQ(r.exit_code, 1) << r.out;
  EXPECT_EQ(r.out.rfind("kimi run: error: ", 0), 0u) << "nothing printed before the error: " << r.out;
  EXPECT_NE(r.out.find("exceeds the context size (-c 2)"), std::string::npos) << r.out;
  // exactly enough: prompt (1 token) + 3 more decoded positions
  const auto ok = run_kimi("run -m " + gguf() + " --tokens 5 -c 4 -n 4 --ids --ignore-eos");
  EXPECT_EQ(ok.exit_code, 0) << ok.out;
  EXPECT_EQ(ids_of(ok.out).size(), 4u) << ok.out;
}

TEST(CliCompat, BenchOutputFormats) {
  const std::string base = "bench -m " + gguf() + " -p 8 -n 4 -r 1 -t 1";
  const auto md = run_kimi(base + " -o md");
  ASSERT_EQ(md.exit_code, 0) << md.out;
  EXPECT_NE(md.out.find("| model"), std::string::npos);
  const auto js = run_kimi(base + " -o json");
  ASSERT_EQ(js.exit_code, 0) << js.out;
  const auto j = nlohmann::json::parse(js.out);
  EXPECT_EQ(j["pp"]["n"], 8);
  EXPECT_EQ(j["tg"]["n"], 4);
  const auto jl = run_kimi(base + " -o jsonl");
  ASSERT_EQ(jl.exit_code, 0) << jl.out;
  EXPECT_EQ(jl.out.find('\n'), jl.out.size() - 1) << "one line: " << jl.out;
  EXPECT_EQ(nlohmann::json::parse(jl.out)["tg"]["n"], 4);
  const auto bad = run_kimi(base + " -o csv");
  EXPECT_TRUE(one_line_usage_error(bad)) << bad.out;
}

TEST(CliCompat, Version) {
  for (const char* a : {"--version", "version"}) {
    const auto r = run_kimi(a);
    ASSERT_EQ(r.exit_code, 0) << r.out;
    EXPECT_EQ(r.out.rfind("kimi.cpp version ", 0), 0u) << r.out;
    const size_t c = r.out.find("(commit ");
    ASSERT_NE(c, std::string::npos) << r.out;
    const std::string commit = r.out.substr(c + 8, 12);
    EXPECT_TRUE(commit == "unknown)\nbui" ||
                commit.find_first_not_of("0123456789abcdef") == std::string::npos) << commit;
    EXPECT_NE(r.out.find("\nbuild: "), std::string::npos) << r.out;
    EXPECT_NE(r.out.find("\ncpu kernels: "), std::string::npos) << r.out;
    EXPECT_NE(r.out.find("\nbackends: cpu"), std::string::npos) << r.out;
  }
  const auto bad = run_kimi("version extra");
  EXPECT_EQ(bad.exit_code, 2) << bad.out;
}

// perplexity reports progress per chunk with the share done and an ETA that falls to 0 at the end.
TEST(CliCompat, PerplexityProgressHasEta) {
  const std::string text = q(std::string(KIMI_SOURCE_DIR) + "/data/ppl-sample.txt");
  const auto r = run_kimi("perplexity -m " + gguf() + " -f " + text + " -c 64 --chunks 3 -t 1");
  ASSERT_EQ(r.exit_code, 0) << r.out;
  for (int k = 1; k <= 3; ++k) {
    const std::string head = "[" + std::to_string(k) + "/3] PPL ";
    const size_t p = r.out.find(head);
    ASSERT_NE(p, std::string::npos) << head << " in " << r.out;
    const std::string line = r.out.substr(p, r.out.find('\n', p) - p);
    EXPECT_NE(line.find(std::to_string(std::lround(100.0 * k / 3)) + "% done, ETA "), std::string::npos) << line;
    if (k == 3) {
      EXPECT_NE(line.find("ETA 0.0 s"), std::string::npos) << line;
    }
  }
}

// A mistyped quantization type names the closest ones (all that are equally close); a far one does
// not get a guess.
TEST(CliCompat, QuantTypeDidYouMean) {
  TempDir td;
  const std::string out = q(td.file("q.gguf"));
  auto r = run_kimi("quantize " + gguf() + " " + out + " q4_k_n");
  EXPECT_EQ(r.exit_code, 1) << r.out;
  EXPECT_NE(r.out.find("unknown quantization type 'q4_k_n' (did you mean 'Q4_K_S' or 'Q4_K_M'?)"), std::string::npos) << r.out;
  r = run_kimi("quantize " + gguf() + " " + out + " Q8_0 --tensor-type attn_output=q8_O");
  EXPECT_NE(r.out.find("unknown tensor type 'q8_O' (did you mean 'Q8_0'?)"), std::string::npos) << r.out;
  r = run_kimi("quantize " + gguf() + " " + out + " Q8_0 --tensor-type attn_output=banana");
  EXPECT_NE(r.out.find("unknown tensor type 'banana' (expected one of"), std::string::npos) << r.out;
}
