// llama.cpp as the reference for `kimi quantize`, on a 4-layer `small` model without the DSA indexer
// (llama.cpp v0.5.0 loads plain K3 files only), through the prebuilt v0.5.0 CPU libraries of
// ../shared/tools/llama-ref:
//  - SameTensorTypesAsLlamaQuantize: for every llama-quantize name kimi makes, llama.cpp's own
//    quantizer (llama_model_quantize, dry run, driven by llama_quant_oracle.cpp next to this file)
//    picks the same type for every tensor as kimi's rules (kimi keeps the MXFP4 experts; IQ4_NL,
//    the IQ types' fallback for narrow rows, is Q5_0 in kimi), with and without an imatrix;
//  - LowBitFilesGiveTheSameLogits: llama.cpp reads the files of every such name and of kimi's MoE
//    mixes (IQ2_XS_MOE, Q3_K_MOE, IQ4_XS_MOE: the experts in IQ2_XS, Q2_K, Q3_K, Q4_K, IQ4_XS) and its
//    logits of one prompt (llama-ref's logits program) agree with `kimi eval` on the same file. A type
//    decoded differently by the two would move the logits by about the quantization error itself;
//    so the two programs must agree far more closely than the quantized model agrees with its BF16
//    source (or, for the near-lossless types, as closely as on the BF16 source itself).
// Skips with one line when llama-ref is not installed (bash ../shared/tools/llama-ref/setup.sh; CI does
// not install it). Numbers: docs/quantize.md.
#include <gtest/gtest.h>

#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <string>
#include <vector>

#include "convert/quantize.h"
#include "io/gguf.h"
#include "tensor/types.h"
#include "test_util.h"
#include "util/error.h"

namespace fs = std::filesystem;
using kimi::test::run_kimi;
using kimi::test::TempDir;

namespace {

std::string q(const std::string& s) { return "'" + s + "'"; }

std::string llama_ref_dir() {
  if (const char* e = std::getenv("NLC_DIR"); e && *e) return e;
  if (const char* x = std::getenv("XDG_CACHE_HOME"); x && *x) return std::string(x) + "/kimi-llama-ref";
  if (const char* h = std::getenv("HOME"); h && *h) return std::string(h) + "/.cache/kimi-llama-ref";
  return "";
}

std::string llama_logits_bin() {
  const std::string dir = llama_ref_dir();
  const std::string p = dir + "/bin/logits";
  return !dir.empty() && ::access(p.c_str(), X_OK) == 0 ? p : "";
}

int sh(const std::string& cmd, std::string* out = nullptr) {
  FILE* f = ::popen((cmd + " 2>&1").c_str(), "r");
  if (!f) return -1;
  char buf[4096];
  std::string s;
  while (size_t n = std::fread(buf, 1, sizeof(buf), f)) s.append(buf, n);
  const int rc = ::pclose(f);
  if (out) *out = s;
  return rc;
}

std::vector<float> read_f32(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  std::vector<char> b((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  std::vector<float> v(b.size() / 4);
  std::memcpy(v.data(), b.data(), v.size() * 4);
  return v;
}

struct Cmp {
  int n = 0;
  double top1 = 0, kl = 0, rel_rms = 0;  // top-1 agreement, mean KL(a || b), |a - b| / |a| over all logits
};

Cmp compare(const std::vector<float>& a, const std::vector<float>& b, size_t V) {
  Cmp c;
  const size_t n = std::min(a.size(), b.size()) / V;
  double num = 0, den = 0;
  for (size_t t = 0; t < n; ++t) {
    const float* x = a.data() + t * V;
    const float* y = b.data() + t * V;
    const size_t ia = static_cast<size_t>(std::max_element(x, x + V) - x);
    const size_t ib = static_cast<size_t>(std::max_element(y, y + V) - y);
    c.top1 += ia == ib;
    double sa = 0, sb = 0;
    for (size_t i = 0; i < V; ++i) {
      sa += std::exp(static_cast<double>(x[i]) - x[ia]);
      sb += std::exp(static_cast<double>(y[i]) - y[ib]);
    }
    const double la = std::log(sa) + x[ia], lb = std::log(sb) + y[ib];
    double kl = 0;
    for (size_t i = 0; i < V; ++i) {
      const double pa = x[i] - la;
      kl += std::exp(pa) * (pa - (y[i] - lb));
      num += (static_cast<double>(x[i]) - y[i]) * (static_cast<double>(x[i]) - y[i]);
      den += static_cast<double>(x[i]) * x[i];
    }
    c.kl += kl;
  }
  c.n = static_cast<int>(n);
  if (n) {
    c.top1 /= static_cast<double>(n);
    c.kl /= static_cast<double>(n);
  }
  c.rel_rms = den > 0 ? std::sqrt(num / den) : 0;
  return c;
}

// The model, made once and kept with the other cached test models (ctest runs each test binary in
// its own process): `small` shapes (hidden 2048, so every K-quant block fits), 4 layers (the fewest
// the attention-residual blocks allow: 3 KDA + 1 MLA), 16 experts in MXFP4, no indexer.
std::string small4_noidx() {
  const auto dir = fs::path(KIMI_BIN).parent_path() / "test-models";
  const std::string path = (dir / "small-4layers-noindexer.gguf").string();
  if (fs::exists(path)) return path;
  fs::create_directories(dir);
  TempDir t;
  const std::string hf = t.file("hf"), tmp = path + ".tmp." + std::to_string(::getpid());
  if (run_kimi("synth --preset small --layers 4 --experts 16 --no-indexer -q -o " + q(hf)).exit_code != 0) return "";
  if (run_kimi("convert " + q(hf) + " -o " + q(tmp) + " --quiet").exit_code != 0) return "";
  fs::rename(tmp, path);
  return path;
}

// llama_quant_oracle.cpp compiled against llama-ref's headers and prebuilt libraries (kept next to the
// cached test models, rebuilt when the source is newer); "" when that fails.
std::string llama_quant_oracle(std::string* log) {
  const std::string nlc = llama_ref_dir();
  const fs::path bins = fs::path(nlc) / "node_modules/@node-llama-cpp/linux-x64/bins/linux-x64";
  const fs::path src = fs::path(KIMI_SOURCE_DIR) / "tests/model/llama_quant_oracle.cpp";
  const fs::path bin = fs::path(KIMI_BIN).parent_path() / "test-models" / "llama_quant_oracle";
  std::string libllama, libggml;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(bins, ec)) {
    const std::string n = e.path().filename().string();
    if (n.rfind("libllama.v", 0) == 0) libllama = n;
    if (n.rfind("libggml.v", 0) == 0) libggml = n;
  }
  if (libllama.empty() || libggml.empty() || !fs::exists(src)) {
    *log = "no prebuilt libraries in " + bins.string() + " or no " + src.string();
    return "";
  }
  if (fs::exists(bin) && fs::last_write_time(bin) > fs::last_write_time(src)) return bin.string();
  fs::create_directories(bin.parent_path());
  const std::string tmp = bin.string() + ".tmp." + std::to_string(::getpid());
  const std::string cmd = "g++ -std=c++17 -O1 -I" + q(nlc + "/include") + " -DORACLE_BACKEND_DIR='\"" + bins.string() +
                          "\"' " + q(src.string()) + " -o " + q(tmp) + " -L" + q(bins.string()) + " -l:" + libllama +
                          " -l:" + libggml + " -l:libggml-base.so -Wl,-rpath," + q(bins.string()) + " -pthread";
  if (sh(cmd, log) != 0) return "";
  fs::rename(tmp, bin);
  return bin.string();
}

// name -> type name, upper-cased (llama.cpp spells q4_K, bf16, ...)
std::map<std::string, std::string> read_types(const std::string& text) {
  std::map<std::string, std::string> m;
  size_t at = 0;
  while (at < text.size()) {
    const size_t eol = std::min(text.find('\n', at), text.size());
    const std::string line = text.substr(at, eol - at);
    at = eol + 1;
    const size_t sp = line.rfind(' ');
    if (sp == std::string::npos) continue;
    std::string ty = line.substr(sp + 1);
    for (auto& c : ty) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
    m[line.substr(0, sp)] = ty;
  }
  return m;
}

TEST(LlamaRef, SameTensorTypesAsLlamaQuantize) {
  if (llama_logits_bin().empty()) GTEST_SKIP() << "llama-ref not installed (bash ../shared/tools/llama-ref/setup.sh)";
  std::string log;
  const std::string oracle = llama_quant_oracle(&log);
  ASSERT_FALSE(oracle.empty()) << log;
  const std::string src = small4_noidx();
  ASSERT_FALSE(src.empty()) << "synth/convert of the small no-indexer model failed";
  using kimi::quant::Why;
  int names = 0;
  for (const auto& info : kimi::quant::target_table()) {
    if (info.ftype < 0 || !info.cannot.empty() || !info.alias_of.empty() || info.mix) continue;
    for (const bool imat : {false, true}) {
      // the rules that look at the imatrix: Q4_0, Q5_0 (ffn_down of the first n/8 layers), IQ4_XS (with 4 layers
      // n/8 = 0, so they do not fire here; test_convert_quant_rules covers them on 93 layers)
      if (imat && info.name != "Q4_0" && info.name != "Q5_0" && info.name != "IQ4_XS") continue;
      SCOPED_TRACE(info.name + (imat ? " with an imatrix" : ""));
      std::string out;
      ASSERT_EQ(sh(q(oracle) + " " + q(src) + " " + std::to_string(info.ftype) + (imat ? " --imatrix-ones" : ""), &out),
                0) << out;
      const auto theirs = read_types(out);
      kimi::quant::QuantizeOptions o;
      o.in_path = src;
      o.dry_run = true;
      o.quiet = true;
      o.rules.target = kimi::quant::parse_target(info.name);
      o.rules.have_imatrix = imat;
      o.rules.allow_no_imatrix = true;  // IQ2_XS, Q2_K_S: llama.cpp's dry run does not need one either
      bool q4_1 = false;  // Q4_0 with an imatrix in a model of >= 8 layers: Q4_1, which kimi refuses to make
      for (const auto& [name, ty] : theirs) q4_1 |= ty == "Q4_1";
      if (q4_1) {
        EXPECT_THROW(kimi::quant::quantize(o), kimi::Error);
        continue;
      }
      const auto r = kimi::quant::quantize(o);
      ASSERT_EQ(r.tensors.size(), theirs.size());
      int same = 0, experts = 0, nl = 0;
      std::map<std::string, int> expert_types;  // what llama.cpp would make of K3's experts
      for (const auto& t : r.tensors) {
        auto it = theirs.find(t.name);
        ASSERT_NE(it, theirs.end()) << t.name;
        const std::string ours = kimi::type_name(t.decision.type);
        if (t.decision.why == Why::ExpertsKept) {
          ++experts;
          ++expert_types[it->second];
          continue;
        }
        if (it->second == "IQ4_NL") {  // the IQ types' fallback, which kimi has no quantizer for
          EXPECT_EQ(ours, "Q5_0") << t.name;
          ++nl;
          continue;
        }
        EXPECT_EQ(ours, it->second) << t.name << " (" << t.decision.note << ")";
        same += ours == it->second;
      }
      std::string et;
      for (const auto& [ty, n] : expert_types) et += " " + ty + " x" + std::to_string(n);
      std::printf("%-9s%s: %d tensors as llama.cpp, %d IQ4_NL -> Q5_0, %d MXFP4 expert stacks kept (llama.cpp:%s)\n",
                  info.name.c_str(), imat ? " +imatrix" : "", same, nl, experts, et.c_str());
      ++names;
    }
  }
  EXPECT_GE(names, 20);
}

TEST(LlamaRef, LowBitFilesGiveTheSameLogits) {
  const std::string llama = llama_logits_bin();
  if (llama.empty()) GTEST_SKIP() << "llama-ref not installed (bash ../shared/tools/llama-ref/setup.sh)";
  const std::string src = small4_noidx();
  ASSERT_FALSE(src.empty()) << "synth/convert of the small no-indexer model failed";
  TempDir td;
  const std::string tokens = "687,32,107,27259,32,603,112,116,266,8800,520,265,860,1231,46,14832,340,115,693,1065,291,"
                             "664,459,265,1259,6873,115,420,289,286,1264,8107";
  const size_t V = 32768;
  auto kimi_logits = [&](const std::string& model, const std::string& out) {
    auto r = run_kimi("eval -m " + q(model) + " --tokens " + tokens + " --all-logits --logits-out " + q(out) + " -t 2");
    EXPECT_EQ(r.exit_code, 0) << r.out;
    return read_f32(out);
  };
  auto llama_logits = [&](const std::string& model, const std::string& name, std::vector<float>* v) {
    std::string out;
    const std::string cmd = q(llama) + " " + q(model) + " " + tokens + " " + q(td.file("llama.f32")) + " -t 2";
    int rc = sh(cmd, &out);
    if (rc != 0 && (out.find("GGML_ASSERT") != std::string::npos || out.find("ggml_abort") != std::string::npos)) {
      // llama.cpp v0.5.0 picks its AMX CPU variant (sapphirerapids) on Xeons with AMX, and that one aborts in its
      // graph scheduler on some of these files (seen for IQ2_XS_MOE): a fault of the reference tool, so its
      // AVX-512 variant is the reference there
      std::printf("%s: llama.cpp aborted; again with its icelake (AVX-512) CPU variant\n", name.c_str());
      rc = sh(cmd + " --cpu-variant icelake", &out);
    }
    *v = read_f32(td.file("llama.f32"));
    return rc == 0 ? std::string() : out;
  };
  const auto bf16 = kimi_logits(src, td.file("bf16.f32"));
  ASSERT_EQ(bf16.size(), 32 * V);
  std::vector<float> bf16_llama;
  const std::string err = llama_logits(src, "BF16 source", &bf16_llama);
  ASSERT_TRUE(err.empty()) << err;
  ASSERT_EQ(bf16_llama.size(), bf16.size());
  const Cmp base = compare(bf16_llama, bf16, V);  // how closely the two agree on the unquantized file
  EXPECT_GE(base.top1, 0.9);
  EXPECT_LT(base.rel_rms, 0.03);
  std::printf("source   llama.cpp vs kimi: top-1 %.3f, KL %.2e, rel RMS %.2e\n", base.top1, base.kl, base.rel_rms);
  // Q4_K_M first (the reference agreement), then: with KIMI_LLAMA_REF_ALL=1 every llama-quantize name kimi
  // makes (aliases, F32 and COPY aside) and kimi's MoE mixes; by default the names that together produce
  // every type kimi writes, five files besides Q4_K_M (MXFP4 Q4_K Q5_0 Q6_K): Q2_K (Q2_K Q3_K, Q4_0 as its
  // narrow-row fallback), the MoE mixes IQ2_XS_MOE (IQ2_XS experts), Q3_K_MOE (Q3_K Q5_K, Q5_1 fallback),
  // IQ4_XS_MOE (IQ4_XS Q8_0), F16 (BF16 is the source) -- the per-tensor types of every name are checked
  // against llama.cpp's quantizer by SameTensorTypesAsLlamaQuantize.
  const char* all_env = std::getenv("KIMI_LLAMA_REF_ALL");
  const bool all = all_env && std::string(all_env) == "1";
  std::vector<std::string> names = {"Q4_K_M"};
  for (const auto& i : kimi::quant::target_table()) {
    if (!i.cannot.empty() || !i.alias_of.empty() || i.name == "COPY" || i.name == "F32" || i.name == "Q4_K_M") continue;
    static const std::vector<std::string> subset = {"Q2_K", "F16", "IQ2_XS_MOE", "Q3_K_MOE", "IQ4_XS_MOE"};
    if (all || std::find(subset.begin(), subset.end(), i.name) != subset.end()) names.push_back(i.name);
  }
  ASSERT_GE(names.size(), all ? 24u : 6u);
  Cmp ref;  // Q4_K_M's agreement
  for (const std::string& preset : names) {
    SCOPED_TRACE(preset);
    const std::string qf = td.file(preset + ".gguf");
    auto z = run_kimi("quantize " + q(src) + " " + q(qf) + " " + preset + " --allow-no-imatrix -t 2 --quiet");
    ASSERT_EQ(z.exit_code, 0) << z.out;
    const auto ours = kimi_logits(qf, td.file("kimi.f32"));
    std::vector<float> theirs;
    const std::string e = llama_logits(qf, preset, &theirs);
    ASSERT_TRUE(e.empty()) << e;
    ASSERT_EQ(theirs.size(), ours.size());
    const Cmp same = compare(theirs, ours, V);   // llama.cpp vs kimi, same quantized file
    const Cmp quant = compare(bf16, ours, V);    // kimi: BF16 source vs the quantized file
    std::printf("%-10s llama.cpp vs kimi: top-1 %.3f, KL %.2e, rel RMS %.2e | quantized vs BF16: top-1 %.3f, KL %.2e, "
                "rel RMS %.2e\n", preset.c_str(), same.top1, same.kl, same.rel_rms, quant.top1, quant.kl, quant.rel_rms);
    // Q4_K_M: the two agree far more closely than the quantization moves the logits (measured: rel RMS 0.09x, KL
    // 0.009x of the quantization's own; a type decoded differently would be >= 1). Every other name: as closely
    // as that, or as closely as Q4_K_M's file does (the near-lossless Q8_0, MXFP4_MOE and F16 change the logits
    // less than the two engines' activation rounding does: measured 1.5-3.4 % rel RMS for every name, Q4_K_M 2.5 %).
    if (preset == "Q4_K_M") ref = same;
    const bool first = preset == "Q4_K_M";
    EXPECT_LT(same.rel_rms, std::max(0.35 * quant.rel_rms, first ? 0.0 : 1.5 * ref.rel_rms));
    EXPECT_LT(same.kl, std::max(0.15 * quant.kl, first ? 0.0 : 2.0 * ref.kl));
    EXPECT_GE(same.top1, 0.75);
  }
}

// The engine runs K-quant weights through their load-time row-interleaved copies (repack.h): the
// copies must exist (a bug once left every weight unpacked: the packed kernels were tested alone,
// never reached) and give what the file's own layout gives. Runs in CI (no llama-ref needed).
// Against the f32 reference decoders (Precision::F32: no copies, f32 activations), the fast
// logits with and without the copies must be equally close: both quantize the activations to Q8_K
// the same way and sum the same integer products. (They need not be bit-equal: the float order of
// the block scales differs, and a router near a tie can then pick another expert; measured: rel RMS
// 0.0315 vs f32 for both, 2e-7 to 0.017 between them.) A wrong layout would be ~1 off.
TEST(SmallModel, KQuantWeightsRunRepacked) {
  const std::string src = small4_noidx();
  ASSERT_FALSE(src.empty()) << "synth/convert of the small no-indexer model failed";
  TempDir td;
  const std::string tokens = "687,32,107,27259,32,603,112,116";
  const size_t V = 32768;
  for (const char* preset : {"Q4_K_M", "Q5_K_M"}) {  // Q4_K + Q6_K, Q5_K + Q6_K
    SCOPED_TRACE(preset);
    const std::string qf = td.file(std::string(preset) + ".gguf");
    auto z = run_kimi("quantize " + q(src) + " " + q(qf) + " " + preset + " -t 2 --quiet");
    ASSERT_EQ(z.exit_code, 0) << z.out;
    auto eval = [&](const std::string& prec, bool repack, std::string* log) {
      const std::string out = td.file("l.f32");
      if (!repack) ::setenv("KIMI_REPACK", "0", 1);
      auto r = run_kimi("eval -m " + q(qf) + " --tokens " + tokens + " --all-logits -v -t 2 --precision " + prec +
                        " --logits-out " + q(out));
      ::unsetenv("KIMI_REPACK");
      EXPECT_EQ(r.exit_code, 0) << r.out;
      if (log) *log = r.out;
      return read_f32(out);
    };
    std::string log_packed, log_plain;
    const auto packed = eval("fast", true, &log_packed), plain = eval("fast", false, &log_plain);
    const auto ref = eval("f32", true, nullptr);
    ASSERT_EQ(ref.size(), 8 * V);
    ASSERT_EQ(packed.size(), ref.size());
    ASSERT_EQ(plain.size(), ref.size());
    const size_t at = log_packed.find(" K-quant weights repacked for the SIMD kernels");
    ASSERT_NE(at, std::string::npos) << log_packed;
    const size_t line = log_packed.rfind('\n', at) + 1;  // "cpu: N K-quant ..."
    EXPECT_GE(std::atoi(log_packed.c_str() + line + 5), 40) << log_packed.substr(line, at - line);  // 45: 4 layers + head
    EXPECT_EQ(log_plain.find("K-quant weights repacked"), std::string::npos) << log_plain;
    const Cmp p = compare(ref, packed, V), u = compare(ref, plain, V);
    std::printf("%s fast vs f32: repacked rel RMS %.4f KL %.2e top-1 %.3f | file layout rel RMS %.4f KL %.2e top-1 %.3f\n",
                preset, p.rel_rms, p.kl, p.top1, u.rel_rms, u.kl, u.top1);
    EXPECT_GT(u.rel_rms, 0.0);  // Q8_K activations differ from f32 ones
    EXPECT_LT(p.rel_rms, 1.5 * u.rel_rms);
    EXPECT_LT(p.kl, 2.0 * u.kl + 1e-6);
    EXPECT_LT(u.rel_rms, 0.2);
  }
}

}  // namespace
