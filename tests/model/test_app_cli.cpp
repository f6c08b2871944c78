// User's-eye checks of the `kimi` program: every subcommand given bad input (missing files,
// directories, truncated / non-GGUF / other-architecture files, malformed JSON, bad flag values,
// empty input) must fail with a clear one-line error, a non-zero exit that is not a signal, and
// leave no output file behind; plus positive checks of `kimi inspect` (text and --json against
// gguf::Reader) and `kimi --help`.
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <httplib.h>
#include <memory>
#include <nlohmann/json.hpp>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "io/gguf.h"
#include "runtime/sampling.h"
#include "server/api.h"
#include "server/server.h"
#include "tensor/types.h"
#include "test_util.h"
#include "tokenizer/tokenizer.h"

namespace fs = std::filesystem;
using kimi::test::run_kimi;
using kimi::test::TempDir;

namespace {

// Shell-quote one argument.
std::string q(const std::string& s) {
  std::string o = "'";
  for (char c : s) o += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return o + "'";
}

std::set<std::string> listing(const std::string& dir) {
  std::set<std::string> s;
  for (const auto& e : fs::recursive_directory_iterator(dir)) s.insert(e.path().string());
  return s;
}

// Bad-input files shared by all cases.
struct Files {
  TempDir td;
  std::string gguf, hf, trunc, notgguf, llama, dir, empty, badjson, arrjson, text, hf_badcfg, hf_trunc;
  Files() {
    gguf = kimi::test::tiny_gguf();
    hf = kimi::test::tiny_hf();
    const std::string data = kimi::test::read_file(gguf);
    trunc = td.file("trunc.gguf");
    kimi::test::write_file(trunc, data.substr(0, 1000));
    notgguf = td.file("notgguf.gguf");
    kimi::test::write_file(notgguf, "hello, this is not a GGUF file\n");
    llama = td.file("llama.gguf");
    {
      kimi::gguf::Writer w(llama);
      w.add_kv("general.architecture", kimi::gguf::Value::str("llama"));
      w.add_kv("llama.block_count", kimi::gguf::Value::u32(1));
      w.add_tensor("output_norm.weight", kimi::GgmlType::F32, {4});
      w.begin();
      const float x[4] = {1, 2, 3, 4};
      w.write_tensor_data("output_norm.weight", x, sizeof x);
      w.finish();
    }
    dir = td.file("adir");
    fs::create_directory(dir);
    empty = td.file("empty.txt");
    kimi::test::write_file(empty, "");
    badjson = td.file("bad.json");
    kimi::test::write_file(badjson, "{\"messages\": [{\"role\": \"user\", \"content\": \"hi\"}\n");
    arrjson = td.file("arr.json");
    kimi::test::write_file(arrjson, "[1, 2]\n");
    text = td.file("text.txt");
    kimi::test::write_file(text, "The quick brown fox jumps over the lazy dog.\n");
    // HF directories with a malformed config.json / a truncated safetensors shard
    hf_badcfg = td.file("hf-badcfg");
    hf_trunc = td.file("hf-trunc");
    for (const auto* d : {&hf_badcfg, &hf_trunc}) {
      fs::create_directory(*d);
      for (const auto& e : fs::directory_iterator(hf)) fs::copy_file(e.path(), fs::path(*d) / e.path().filename());
    }
    kimi::test::write_file(hf_badcfg + "/config.json", "{\"text_config\": {\"hidden_size\": 64,");
    for (const auto& e : fs::directory_iterator(hf_trunc))
      if (e.path().extension() == ".safetensors") {
        const std::string s = kimi::test::read_file(e.path().string());
        kimi::test::write_file(e.path().string(), s.substr(0, s.size() - 1000));
      }
  }
};

Files& files() {
  static std::unique_ptr<Files> f;
  if (!f) f = std::make_unique<Files>();
  return *f;
}

struct BadCase {
  std::string args;    // without the program name; {G} {H} {T} {N} {L} {D} {E} {J} {A} {X} {C} {S} {O}
  std::string expect;  // substring of the error output
};

std::string expand(std::string s, const std::string& out_dir) {
  const Files& f = files();
  const std::vector<std::pair<std::string, std::string>> subst = {
      {"{G}", q(f.gguf)},   {"{H}", q(f.hf)},     {"{T}", q(f.trunc)},     {"{N}", q(f.notgguf)},
      {"{L}", q(f.llama)},  {"{D}", q(f.dir)},    {"{E}", q(f.empty)},     {"{J}", q(f.badjson)},
      {"{A}", q(f.arrjson)}, {"{X}", q(f.text)},  {"{C}", q(f.hf_badcfg)}, {"{S}", q(f.hf_trunc)},
      {"{O}", q(out_dir)},  {"{M}", q(f.td.file("missing"))}};
  for (const auto& [k, v] : subst)
    for (size_t p; (p = s.find(k)) != std::string::npos;) s.replace(p, k.size(), v);
  return s;
}

const std::vector<BadCase> kBad = {
    // ---- missing file / directory / truncated / not GGUF / other architecture, per GGUF reader command
    {"inspect {M}", "cannot open"},
    {"inspect {D}", "is not a regular file"},
    {"inspect {T}", "trunc.gguf"},
    {"inspect {N}", "not a GGUF file"},
    {"run -m {M} -p hi -n 2", "cannot open"},
    {"run -m {D} -p hi -n 2", "is not a regular file"},
    {"run -m {T} -p hi -n 2", "trunc.gguf"},
    {"run -m {N} -p hi -n 2", "not a GGUF file"},
    {"run -m {L} -p hi -n 2", "general.architecture is 'llama', expected 'kimi-k3'"},
    {"eval -m {M} --tokens 1 --logits-out {O}/l.f32", "cannot open"},
    {"eval -m {T} --tokens 1 --logits-out {O}/l.f32", "trunc.gguf"},
    {"eval -m {L} --tokens 1 --logits-out {O}/l.f32", "expected 'kimi-k3'"},
    {"chat -m {M} < /dev/null", "cannot open"},
    {"chat -m {N} < /dev/null", "not a GGUF file"},
    {"chat -m {L} < /dev/null", "expected 'kimi-k3'"},
    {"perplexity -m {M} -f {X}", "cannot open"},
    {"perplexity -m {T} -f {X}", "trunc.gguf"},
    {"perplexity -m {L} -f {X}", "expected 'kimi-k3'"},
    {"bench -m {M} -p 4 -n 2 -r 1", "cannot open"},
    {"bench -m {N} -p 4 -n 2 -r 1", "not a GGUF file"},
    {"bench -m {L} -p 4 -n 2 -r 1", "expected 'kimi-k3'"},
    {"tokenize -m {M} -t hi", "cannot open"},
    {"tokenize -m {T} -t hi", "trunc.gguf"},
    {"tokenize -m {L} -t hi", "tokenizer.ggml.model"},
    {"detokenize -m {M} 1 2", "cannot open"},
    {"detokenize -m {N} 1 2", "not a GGUF file"},
    {"serve -m {M} --port 0", "cannot open"},
    {"serve -m {T} --port 0", "trunc.gguf"},
    {"serve -m {L} --port 0", "expected 'kimi-k3'"},
    {"quantize {M} {O}/q.gguf Q8_0", "does not exist"},
    {"quantize {D} {O}/q.gguf Q8_0", "is not a regular file"},
    {"quantize {T} {O}/q.gguf Q8_0", "trunc.gguf"},
    {"quantize {N} {O}/q.gguf Q8_0", "not a GGUF file"},
    {"quantize {L} {O}/q.gguf Q8_0", "general.architecture is 'llama', expected 'kimi-k3'"},
    {"verify {H} {M}", "cannot open"},
    {"verify {H} {T}", "trunc.gguf"},
    {"verify {H} {L}", "general.architecture is 'llama', expected 'kimi-k3'"},
    {"verify {M} {G}", "config.json"},
    {"verify {C} {G}", "config.json: invalid JSON"},
    // ---- convert: bad source / bad output
    {"convert {M} -o {O}/c.gguf", "is not a directory"},
    {"convert {G} -o {O}/c.gguf", "is not a directory"},
    {"convert {D} -o {O}/c.gguf", "config.json: missing"},
    {"convert {C} -o {O}/c.gguf", "config.json: invalid JSON"},
    {"convert {S} -o {O}/c.gguf", "run past the end"},
    {"convert {H} -o {D}", "is a directory"},
    {"convert {H} -o {O}/nodir/c.gguf", "does not exist"},
    {"convert {H} -o {O}/c.gguf --outtype q4_0", "q4_0"},
    {"convert {H} -o {O}/c.gguf --layers -1", "--layers"},
    {"convert {H} -o {O}/c.gguf --layers 99", "--layers 99"},
    {"convert {H} -o {O}/c.gguf --split-max-size -5", "invalid size '-5'"},
    {"convert {H} -o {O}/c.gguf --split-max-size 0", "invalid size '0'"},
    {"convert {H} -o {O}/c.gguf --split-max-size lots", "invalid size 'lots'"},
    // ---- quantize: bad types / output
    {"quantize {G} {O}/q.gguf Q9_9", "unknown quantization type 'Q9_9'"},
    {"quantize {G} {O}/q.gguf Q8_0 --tensor-type attn_output", "expected PATTERN=TYPE"},
    {"quantize {G} {O}/q.gguf Q8_0 --tensor-type attn_output=XX", "unknown tensor type 'XX'"},
    {"quantize {G} {O}/q.gguf Q8_0 --requantize-experts BAD", "unknown tensor type 'BAD'"},
    {"quantize {G} {O}/q.gguf Q8_0 --threads -1", "--threads"},
    {"quantize {G} {D} Q8_0", "is a directory"},
    {"quantize {G} {O}/nodir/q.gguf Q8_0", "does not exist"},
    {"quantize {G} {G} Q8_0", "is the input file"},
    // ---- synth
    {"synth --preset huge -o {O}/s", "--preset"},
    {"synth --preset tiny --layers -3 -o {O}/s", "--layers -3"},
    {"synth --preset tiny -o {G}", "is not a directory"},
    // ---- run: flags and empty input
    {"run -m {G} -p hi -n -1", "--n-predict"},
    {"run -m {G} -p hi -n 99999999999", "--n-predict"},
    {"run -m {G} -p hi -n 100000000", "context length 4096"},
    {"run -m {G} -p hi -n 2 --threads -1", "thread count"},
    {"run -m {G} -p hi -n 2 --threads 100000", "thread count"},
    {"run -m {G} -p '' -n 2", "the prompt is empty"},
    {"run -m {G} -n 2", "-p/--prompt"},
    {"run -m {G} --tokens 1,x -n 2", "'x' is not a token id"},
    {"run -m {G} --tokens -1 -n 2", "'-1' is not a token id"},
    {"run -m {G} --tokens 5000 -n 2", "token id 5000 is out of range"},
    {"run -m {G} -p hi -n 2 --attn fast", "--attn"},
    {"run -m {G} -p hi -n 2 --attn-top-k -5", "attn_top_k"},
    {"run -m {G} -p hi -n 2 --precision f8", "--precision"},
    {"run -m {G} -p hi -n 2 --top-p 2", "--top-p"},
    {"run -m {G} -p hi -n 2 --min-p 5", "--min-p"},
    {"run -m {G} -p hi -n 2 --repeat-penalty -1", "--repeat-penalty"},
    {"run -m {G} -p hi -n 2 -c -5", "--ctx"},
    {"run -m {G} -p 'hello world foo bar baz' -n 8 -c 2", "exceeds the context size"},
    // ---- eval
    {"eval -m {G} --tokens '' --logits-out {O}/l.f32", "--tokens is empty"},
    {"eval -m {G} --tokens 5000 --logits-out {O}/l.f32", "token 5000 out of range"},
    {"eval -m {G} --tokens 1 --logits-out {D}", "is a directory"},
    {"eval -m {G} --tokens 1 --logits-out {O}/nodir/l.f32", "does not exist"},
    {"eval -m {G} --tokens 1 --logits-out {O}/l.f32 -b 0", "--batch"},
    // ---- chat
    {"chat -m {G} --thinking maybe < /dev/null", "--thinking"},
    {"chat -m {G} --threads -1 < /dev/null", "thread count"},
    {"chat -m {G} --top-p 0 < /dev/null", "--top-p"},
    // ---- perplexity
    {"perplexity -m {G} -f {M}", "cannot open the text file"},
    {"perplexity -m {G} -f {D}", "is a directory"},
    {"perplexity -m {G} -f {E} -c 64", "0 tokens"},
    {"perplexity -m {G} -f {X} -c -5", "--ctx"},
    {"perplexity -m {G} -f {X} -c 100000", "needs at least"},
    {"perplexity -m {G} -f {X} --kl-divergence {M}", "cannot open KLD base file"},
    {"perplexity -m {G} -f {X} --kl-divergence {N}", "too small to be a KLD base file"},
    {"perplexity -m {G} -f {X} -c 8 --kl-divergence-base {O}/nodir/b.kld", "does not exist"},
    {"perplexity -m {G} -f {X} -c 8 --kl-divergence-base {D}", "is a directory"},
    {"perplexity -m {G}", "-f TEXT is required"},
    // ---- bench
    {"bench -m {G} -p -1", "--n-prompt"},
    {"bench -m {G} -r 0", "--repetitions"},
    {"bench -m {G} -p 4 -n 2 -r 1 --threads -1", "thread count"},
    {"bench -m {G} -p 2147483647 -n 1 -r 1", "--n-prompt"},
    {"bench -m {G} -p 0 -n 1 -r 1 -d 2147483647", "--depth"},
    // ---- tokenize / detokenize
    {"tokenize -m {G} {M}", "cannot open input file"},
    {"tokenize -m {G} {D}", "is a directory"},
    {"tokenize -m {G} --bench {E}", "is empty"},
    {"tokenize --tiktoken {M} -t hi", "cannot open"},
    {"tokenize --tiktoken {N} -t hi", "expected '<base64 token> <rank>'"},
    {"detokenize -m {G} -5", "token id -5 is out of range"},
    {"detokenize -m {G} 5000", "token id 5000 is out of range"},
    {"detokenize -m {G} abc", "'abc' is not a token id"},
    // ---- template
    {"template render {M}", "cannot open request file"},
    {"template render {D}", "is a directory"},
    {"template render {J}", "not valid JSON"},
    {"template render {E}", "not valid JSON"},
    {"template render {A}", "expected a JSON object"},
    {"template", "subcommand"},
    // ---- serve: flags
    {"serve -m {G} --port 99999", "--port"},
    {"serve -m {G} --port 0 --threads -1", "thread count"},
    {"serve -m {G} --port 0 -c 100000000", "--ctx"},
    {"serve -m {G} --port 0 --parallel 0", "--parallel"},
    {"serve -m {G} --port 0 --parallel 256 -c 16000000", "attention cache"},
    {"serve -m {G} --host 999.1.1.1 --port 0", "cannot listen on 999.1.1.1"},
    {"serve -m {G} --port 0 -c 4", "--ctx"},
    // ---- placement flags (app/engine_args.h), the same in every engine command
    {"run -m {G} -p hi -n 2 --device sycl:0", "--device: backend 'sycl' not compiled in"},
    {"chat -m {G} --device cuda < /dev/null", "--device: backend 'cuda' not compiled in"},
    {"serve -m {G} --port 0 --device hip", "--device: backend 'hip' not compiled in"},
    {"bench -m {G} -p 4 -n 2 -r 1 --device metal", "--device: backend 'metal' not compiled in"},
    {"perplexity -m {G} -f {X} --device opencl:1", "--device: backend 'opencl' not compiled in"},
    {"eval -m {G} --tokens 1 --logits-out {O}/l.f32 --device tpu", "--device: unknown device 'tpu'"},
    {"run -m {G} -p hi -n 2 --device cpu,cpu", "device 'cpu' is listed twice"},
    {"run -m {G} -p hi -n 2 --device ''", "--device: no device given"},
    {"run -m {G} -p hi -n 2 -ngl -2", "--n-gpu-layers"},
    {"serve -m {G} --port 0 --n-gpu-layers x", "--n-gpu-layers"},
    {"bench -m {G} -p 4 -n 2 -r 1 --n-cpu-moe -1", "--n-cpu-moe"},
    {"bench -m {G} -p 4 -n 2 -r 1 --cpu-affinity 3-1", "--cpu-affinity: '3-1' is not a CPU list"},
    {"run -m {G} -p hi -n 2 --cpu-affinity 60000", "--cpu-affinity: CPU 60000 is not one this process may run on"},
    {"bench -m {G} -p 4 -n 2 -r 1 --numa mirror", "--numa"},
    {"run -m {G} -p hi -n 2 --mem-budget 5X", "error: --mem-budget: '5X' is not a size"},  // the name once
    {"run -m {G} -p hi -n 2 -ot exps", "--override-tensor: -ot: 'exps' is not REGEX=DEVICE"},
    {"eval -m {G} --tokens 1 --logits-out {O}/l.f32 -ot '(=cpu'", "not a valid regular expression"},
    {"perplexity -m {G} -f {X} --override-tensor 'exps=cpu,=cpu'", "'=cpu' is not REGEX=DEVICE"},
    {"serve -m {G} --port 0 -ot exps=gpu0", "unknown device 'gpu0'"},
    {"chat -m {G} -ot exps=1 < /dev/null", "unknown device '1'"},
    {"run -m {G} -p hi -n 2 -ot exps=cpu blk=cpu", "not expected: blk=cpu"},
    // ---- the program itself
    {"no-such-command", "unknown command 'no-such-command'"},
};

TEST(AppCli, BadInputFailsCleanly) {
  for (const auto& c : kBad) {
    TempDir out;  // output files must never appear here
    const std::string args = expand(c.args, out.path);
    const auto before = listing(files().td.path);
    const auto r = run_kimi(args);
    SCOPED_TRACE("kimi " + c.args + "\n" + r.out);
    EXPECT_NE(r.exit_code, 0);
    EXPECT_LT(r.exit_code, 128) << "killed by a signal";
    EXPECT_NE(r.out.find(c.expect), std::string::npos) << "expected '" << c.expect << "' in the error";
    EXPECT_EQ(r.out.find("Sanitizer"), std::string::npos);
    EXPECT_EQ(r.out.find("runtime error"), std::string::npos);
    EXPECT_TRUE(listing(out.path).empty()) << "output left behind";
    EXPECT_EQ(listing(files().td.path), before) << "files created or removed next to the inputs";
  }
}

// Every failure is a one-line "kimi CMD: error: ..." message (CLI11 usage errors excepted).
TEST(AppCli, ErrorsAreOneLine) {
  for (const auto& c : kBad) {
    TempDir out;
    const auto r = run_kimi(expand(c.args, out.path));
    const size_t p = r.out.find(": error: ");
    if (p == std::string::npos) continue;  // CLI11 parse errors and the top-level usage
    SCOPED_TRACE("kimi " + c.args + "\n" + r.out);
    const size_t line_start = r.out.rfind('\n', p);
    EXPECT_EQ(r.out.compare(line_start == std::string::npos ? 0 : line_start + 1, 5, "kimi "), 0);
    const size_t nl = r.out.find('\n', p);
    EXPECT_TRUE(nl == std::string::npos || nl + 1 == r.out.size()) << "error spans more than one line";
  }
}

TEST(AppCli, HelpListsEverySubcommand) {
  const auto r = run_kimi("--help");
  ASSERT_EQ(r.exit_code, 0) << r.out;
  for (const char* cmd : {"bench", "chat", "convert", "detokenize", "eval", "inspect", "perplexity", "quantize", "run",
                          "serve", "synth", "template", "tokenize", "verify"}) {
    EXPECT_NE(r.out.find(std::string("\n  ") + cmd + " "), std::string::npos) << cmd << " missing from\n" << r.out;
    const auto h = run_kimi(std::string(cmd) + " --help");
    EXPECT_EQ(h.exit_code, 0) << cmd << ": " << h.out;
    EXPECT_NE(h.out.find("-h,--help"), std::string::npos) << cmd << ": " << h.out;
  }
  const auto none = run_kimi("");
  EXPECT_EQ(none.exit_code, 2);
  EXPECT_NE(none.out.find("usage: kimi"), std::string::npos);
}

// The engine commands share one definition of the engine, placement and sampling flags
// (app/engine_args.h): each lists all of them (run, chat and serve also the sampling flags; serve's
// are the defaults of requests that leave a field out), and a bad placement value is a usage error (exit 2,
// one line naming the flag).
TEST(AppCli, EngineCommandsShareTheEngineFlags) {
  const std::vector<std::string> engine = {"-m,--model", "-t,--threads", "--attn ", "--attn-top-k", "--precision",
                                           "--cache-type", "-c,--ctx", "-v,--verbose", "--device", "--n-gpu-layers",
                                           "--cpu-moe", "--n-cpu-moe", "--override-tensor", "--numa",
                                           "--cpu-affinity"};
  const std::vector<std::string> sampling = {"--temp", "--top-k", "--top-p", "--min-p", "--repeat-penalty",
                                             "--repeat-last-n", "--seed"};
  for (const char* cmd : {"run", "chat", "serve", "bench", "perplexity", "eval"}) {
    SCOPED_TRACE(cmd);
    const auto h = run_kimi(std::string(cmd) + " --help");
    ASSERT_EQ(h.exit_code, 0) << h.out;
    for (const auto& f : engine) EXPECT_NE(h.out.find(f), std::string::npos) << f << " missing from\n" << h.out;
    // -b/--batch everywhere but serve (its steps are --chunk x --max-chunks)
    EXPECT_EQ(h.out.find("-b,--batch") != std::string::npos, std::string(cmd) != "serve") << h.out;
    const bool samples = std::string(cmd) == "run" || std::string(cmd) == "chat" || std::string(cmd) == "serve";
    for (const auto& f : sampling) {
      if (f != "--seed" || samples) {  // bench has its own --seed (random tokens)
        EXPECT_EQ(h.out.find(f) != std::string::npos, samples) << f << "\n" << h.out;
      }
    }
  }
  const std::string g = q(files().gguf), x = q(files().text);
  const std::vector<std::string> cmds = {"run -m " + g + " -p hi -n 2", "chat -m " + g + " < /dev/null",
                                         "serve -m " + g + " --port 0", "bench -m " + g + " -p 4 -n 2 -r 1",
                                         "perplexity -m " + g + " -f " + x + " -c 16",
                                         "eval -m " + g + " --tokens 1 --logits-out /dev/null"};
  const std::vector<std::pair<std::string, std::string>> bad = {
      {"--device rocm:0", "--device: backend 'rocm' not compiled in"},
      {"-ngl -5", "--n-gpu-layers"},
      {"--n-cpu-moe -3", "--n-cpu-moe"},
      {"-ot 'blk\\.(=cpu'", "--override-tensor: placement: -ot 'blk\\.(=cpu': the pattern is not a valid regular"},
      {"-ot exps=gpu9", "--override-tensor: placement: -ot 'exps=gpu9': unknown device 'gpu9'"},
  };
  for (const auto& c : cmds)
    for (const auto& [arg, expect] : bad) {
      const auto r = run_kimi(c + " " + arg);
      SCOPED_TRACE("kimi " + c + " " + arg + "\n" + r.out);
      EXPECT_EQ(r.exit_code, 2);
      EXPECT_EQ(r.out.rfind("kimi ", 0), 0u);
      EXPECT_NE(r.out.find(": error: " + expect), std::string::npos) << "expected '" << expect << "'";
      EXPECT_EQ(std::count(r.out.begin(), r.out.end(), '\n'), 1) << "one line";
    }
}

// On a CPU-only build every placement rule resolves to the CPU: the flags are accepted (also the
// llama.cpp spellings -ngl and -ot, repeated) and the results are bit-identical to a run without them.
TEST(AppCli, PlacementFlagsOnCpuChangeNothing) {
  TempDir out;
  const std::string g = q(files().gguf);
  const std::string place =
      " --device cpu -ngl 99 --cpu-moe --n-cpu-moe 2 -ot exps=cpu -ot 'blk\\.1\\.=0' --override-tensor 'output=CPU'";
  auto eval = [&](const std::string& name, const std::string& extra) {
    const std::string f = out.file(name);
    const auto r = run_kimi("eval -m " + g + " --tokens 1,2,3,4,5,6 --all-logits -b 2 --logits-out " + q(f) + extra);
    EXPECT_EQ(r.exit_code, 0) << r.out;
    return kimi::test::read_file(f);
  };
  const std::string plain = eval("plain.f32", ""), placed = eval("placed.f32", place);
  ASSERT_FALSE(plain.empty());
  EXPECT_EQ(plain.size() % (6 * 4), 0u);
  EXPECT_TRUE(plain == placed) << "logits differ with placement flags on a CPU-only build";
  EXPECT_TRUE(eval("ngl.f32", " -ngl -1") == plain);

  // -v shows where the placement put each part: with only the CPU, everything on device 0
  const uint32_t L = kimi::gguf::Reader::open(files().gguf)->get_u32("kimi-k3.block_count");
  const auto v = run_kimi("eval -m " + g + " --tokens 1,2 --logits-out " + q(out.file("v.f32")) + " -v" + place);
  ASSERT_EQ(v.exit_code, 0) << v.out;
  const std::string span = "0-" + std::to_string(L - 1);
  EXPECT_NE(v.out.find("placement: device 0 (cpu): input attn " + span + " ffn " + span + " experts " + span + " output"),
            std::string::npos) << v.out;

  const auto a = run_kimi("run -m " + g + " --tokens 1,2,3 -n 6 --ids --temp 0.7 --seed 5");
  const auto b = run_kimi("run -m " + g + " --tokens 1,2,3 -n 6 --ids --temp 0.7 --seed 5 -b 1" + place);
  ASSERT_EQ(a.exit_code, 0) << a.out;
  ASSERT_EQ(b.exit_code, 0) << b.out;
  auto ids = [](const std::string& s) { return s.substr(0, s.find('\n')); };
  EXPECT_EQ(ids(a.out), ids(b.out));
  EXPECT_FALSE(ids(a.out).empty());
}

// kimi serve's sampling flags are the defaults of a request that leaves a field out (the
// request's own values win; without --seed every request draws its own seed).
TEST(AppCli, ServeSamplingFlagsAreRequestDefaults) {
  const auto rd = kimi::gguf::Reader::open(files().gguf);
  const kimi::tok::Tokenizer tok = kimi::tok::Tokenizer::from_gguf(*rd);
  kimi::server::Limits lim;
  const std::string bare = R"({"prompt": "hi", "max_tokens": 2})";
  const kimi::SamplerParams openai = kimi::server::parse_completion_request(bare, tok, lim).gen.sampler;
  EXPECT_EQ(openai.temp, 1.0f);  // OpenAI's default when no flag is given
  EXPECT_EQ(openai.top_p, 0.95f);  // K3's sampling contract (temperature 1.0, top_p 0.95)
  EXPECT_EQ(openai.top_k, 0);
  lim.sampling.temp = 0.25f;
  lim.sampling.top_k = 7;
  lim.sampling.top_p = 0.5f;
  lim.sampling.min_p = 0.125f;
  lim.sampling.repeat_penalty = 1.5f;
  lim.sampling.repeat_last_n = 9;
  lim.sampling.seed = 1234;
  lim.fixed_seed = true;
  const kimi::SamplerParams d = kimi::server::parse_completion_request(bare, tok, lim).gen.sampler;
  EXPECT_EQ(d.temp, 0.25f);
  EXPECT_EQ(d.top_k, 7);
  EXPECT_EQ(d.top_p, 0.5f);
  EXPECT_EQ(d.min_p, 0.125f);
  EXPECT_EQ(d.repeat_penalty, 1.5f);
  EXPECT_EQ(d.repeat_last_n, 9);
  EXPECT_EQ(d.seed, 1234u);
  const kimi::SamplerParams r = kimi::server::parse_completion_request(
      R"({"prompt": "hi", "temperature": 0.75, "top_k": 3, "seed": 5})", tok, lim).gen.sampler;
  EXPECT_EQ(r.temp, 0.75f);
  EXPECT_EQ(r.top_k, 3);
  EXPECT_EQ(r.seed, 5u);
  EXPECT_EQ(r.top_p, 0.5f);  // not given: the server default
  lim.fixed_seed = false;    // no --seed: a fresh seed per request
  const uint64_t s1 = kimi::server::parse_completion_request(bare, tok, lim).gen.sampler.seed;
  const uint64_t s2 = kimi::server::parse_completion_request(bare, tok, lim).gen.sampler.seed;
  EXPECT_FALSE(s1 == 1234u && s2 == 1234u);

  // a bad default is a usage error before the server starts, naming the flag
  const auto bad = run_kimi("serve -m " + q(files().gguf) + " --port 0 --top-p 2");
  EXPECT_EQ(bad.exit_code, 2) << bad.out;
  EXPECT_NE(bad.out.find("--top-p: 2 is out of range (0, 1]"), std::string::npos) << bad.out;
}

TEST(AppCli, InspectJsonMatchesReader) {
  const std::string g = files().gguf;
  const auto rd = kimi::gguf::Reader::open(g);
  const auto r = run_kimi("inspect " + q(g) + " --json");
  ASSERT_EQ(r.exit_code, 0) << r.out;
  const auto j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j.at("version").get<uint32_t>(), rd->version());
  EXPECT_EQ(j.at("alignment").get<uint32_t>(), rd->alignment());
  EXPECT_EQ(j.at("metadata").size(), rd->kvs().size());
  EXPECT_EQ(j.at("metadata").at("general.architecture").get<std::string>(), "kimi-k3");
  EXPECT_EQ(j.at("metadata").at("kimi-k3.block_count").get<uint32_t>(), rd->get_u32("kimi-k3.block_count"));
  const auto& ts = j.at("tensors");
  ASSERT_EQ(ts.size(), rd->tensors().size());
  std::set<std::string> types;
  for (size_t i = 0; i < ts.size(); ++i) {
    const auto& t = rd->tensors()[i];
    SCOPED_TRACE(t.name);
    EXPECT_EQ(ts[i].at("name").get<std::string>(), t.name);
    EXPECT_EQ(ts[i].at("type").get<std::string>(), kimi::type_name(t.type));
    std::vector<int64_t> shape(t.ne.begin(), t.ne.begin() + t.n_dims);
    EXPECT_EQ(ts[i].at("shape").get<std::vector<int64_t>>(), shape);
    EXPECT_EQ(ts[i].at("bytes").get<uint64_t>(), t.nbytes);
    types.insert(kimi::type_name(t.type));
  }
  // the tiny conversion has BF16 matrices, F32 norms and MXFP4 routed experts
  EXPECT_TRUE(types.count("BF16") && types.count("F32") && types.count("MXFP4"));
}

TEST(AppCli, InspectTextListsEveryTensor) {
  const std::string g = files().gguf;
  const auto rd = kimi::gguf::Reader::open(g);
  const auto r = run_kimi("inspect " + q(g));
  ASSERT_EQ(r.exit_code, 0) << r.out;
  EXPECT_NE(r.out.find(std::to_string(rd->tensors().size()) + " tensors"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find(std::to_string(rd->kvs().size()) + " metadata keys"), std::string::npos) << r.out;
  for (const auto& t : rd->tensors()) {
    // one row per tensor: name, type and shape on the same line
    const size_t p = r.out.find(" " + t.name + " ");
    ASSERT_NE(p, std::string::npos) << t.name;
    const size_t e = r.out.find('\n', p);
    const std::string line = r.out.substr(p, e - p);
    EXPECT_NE(line.find(std::string(" ") + kimi::type_name(t.type) + " "), std::string::npos) << line;
    EXPECT_NE(line.find(t.shape_string()), std::string::npos) << line;
  }
}

// Malformed HTTP requests to a running server get a 400/404 JSON error, and the server keeps serving.
TEST(AppCli, ServerRejectsMalformedRequests) {
  kimi::server::ServerOptions o;
  o.model_path = files().gguf;
  o.port = 0;
  o.threads = 1;
  o.ctx = 256;
  o.sched.parallel = 1;
  o.grace_s = 5;
  auto s = std::make_unique<kimi::server::Server>(o);
  const int port = s->bind();
  std::thread t([&] { s->run(); });
  httplib::Client c("127.0.0.1", port);
  c.set_read_timeout(30, 0);
  const std::vector<std::pair<std::string, std::string>> bad = {
      {"/v1/chat/completions", "{\"messages\": [{\"role\": \"user\", \"content\": \"hi\"}"},
      {"/v1/chat/completions", ""},
      {"/v1/chat/completions", "[]"},
      {"/v1/chat/completions", "{\"messages\": \"hi\"}"},
      {"/v1/chat/completions", "{\"messages\": []}"},
      {"/v1/chat/completions", "{\"messages\": [{\"role\": \"user\", \"content\": \"hi\"}], \"max_tokens\": -1}"},
      {"/v1/chat/completions", "{\"messages\": [{\"role\": \"user\", \"content\": \"hi\"}], \"temperature\": \"x\"}"},
      {"/v1/completions", "{\"prompt\": \"\", \"max_tokens\": 2}"},
      {"/v1/completions", "{\"prompt\": 5}"},
      {"/tokenize", "{\"content\": 5}"},
      {"/detokenize", "{\"tokens\": [99999]}"},
      {"/detokenize", "{\"tokens\": \"x\"}"},
  };
  for (const auto& [path, body] : bad) {
    SCOPED_TRACE(path + " " + body);
    auto res = c.Post(path.c_str(), body, "application/json");
    ASSERT_TRUE(res);
    EXPECT_EQ(res->status, 400) << res->body;
    const auto j = nlohmann::json::parse(res->body, nullptr, false);
    ASSERT_FALSE(j.is_discarded()) << res->body;
    EXPECT_TRUE(j.at("error").at("message").is_string()) << res->body;
  }
  auto nf = c.Get("/no/such/endpoint");
  ASSERT_TRUE(nf);
  EXPECT_EQ(nf->status, 404);
  auto ok = c.Post("/v1/completions", "{\"prompt\": \"hi\", \"max_tokens\": 2}", "application/json");
  ASSERT_TRUE(ok);
  EXPECT_EQ(ok->status, 200) << ok->body;
  s->shutdown();
  t.join();
}

}  // namespace
