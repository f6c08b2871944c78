// One model over several MPI ranks (docs/distributed.md): `mpirun -np N kimi ...` against the
// same command in one process, on the tiny synthetic model.
// - logits of every position (prefill with the DSA indexer selecting 4 of up to 18 rows): both
//   modes are bit for bit the single process (layer mode: the same ops on the same data, handed
//   over; tensor mode: every rank computes its heads / rows with the same ops, the exchanges only
//   move values, the routed experts' outputs are summed in the single process's order), so rel
//   RMS 0 <= 1e-6 and top-1 equal everywhere; 2 and 3 ranks (3 splits 8 layers, 4 heads, 8
//   experts and every matrix unevenly);
// - greedy generation (decode steps, KDA states, caches) identical;
// - a rank killed mid-generation: every rank ends non-zero within 30 s and the lost rank is named;
// - a worker's error ends the job with a non-zero status instead of a hang;
// - per-rank files (kimi shard) equal the full file; wrong rank count / different models: errors.
// Runs only in a build with MPI (KIMI_MPI, found by CMake); CI runs these on one machine with
// --oversubscribe (as root: OMPI_ALLOW_RUN_AS_ROOT*).
#include <gtest/gtest.h>

#include <chrono>
#include <memory>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include <unistd.h>

#include <nlohmann/json.hpp>

#include "io/gguf.h"
#include "test_util.h"

namespace {

using kimi::test::RunResult;
using kimi::test::TempDir;

std::string q(const std::string& s) { return "'" + s + "'"; }

const char* kTokens = "1,5,9,200,33,17,400,2,8,99,500,7,3,60,61,62,300,301";

RunResult sh(const std::string& cmd) {
  RunResult r;
  FILE* p = ::popen((cmd + " 2>&1").c_str(), "r");
  if (!p) return r;
  char buf[4096];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof buf, p)) > 0) r.out.append(buf, n);
  const int st = ::pclose(p);
  r.exit_code = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
  return r;
}

// mpirun -np NP [extra] PROG (the kimi binary unless a wrapper script is given)
std::string mpirun(int np, const std::string& extra = "", const std::string& prog = KIMI_BIN) {
  return "OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1 "
         "timeout 120 mpirun --oversubscribe " + extra + " -np " + std::to_string(np) + " " + prog;
}

std::vector<float> read_floats(const std::string& path) {
  const std::string d = kimi::test::read_file(path);
  std::vector<float> v(d.size() / 4);
  std::memcpy(v.data(), d.data(), v.size() * 4);
  return v;
}

struct Cmp {
  double rel_rms = 0;
  int top1_same = 0, rows = 0;
  bool bit_equal = false;
};
Cmp compare(const std::vector<float>& a, const std::vector<float>& b, int V) {
  Cmp c;
  double num = 0, den = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    num += (double(a[i]) - b[i]) * (double(a[i]) - b[i]);
    den += double(a[i]) * a[i];
  }
  c.rel_rms = std::sqrt(num / den);
  c.bit_equal = a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * 4) == 0;
  c.rows = static_cast<int>(a.size()) / V;
  for (int r = 0; r < c.rows; ++r) {
    int ia = 0, ib = 0;
    for (int i = 1; i < V; ++i) {
      if (a[size_t(r) * V + i] > a[size_t(r) * V + ia]) ia = i;
      if (b[size_t(r) * V + i] > b[size_t(r) * V + ib]) ib = i;
    }
    c.top1_same += ia == ib;
  }
  return c;
}

// A 4-layer `small` model (d 2048, 64 experts top-8, 16 heads; 858 MB), made once and kept next to
// the other cached test models (ctest runs every test in its own process).
std::string small4() {
  const auto dir = std::filesystem::path(KIMI_BIN).parent_path() / "test-models";
  const std::string path = (dir / "small-4layers.gguf").string();
  if (std::filesystem::exists(path)) return path;
  std::filesystem::create_directories(dir);
  TempDir t;
  const std::string hf = t.file("hf"), tmp = path + ".tmp." + std::to_string(::getpid());
  auto a = kimi::test::run_kimi("synth --preset small --layers 4 -q -o '" + hf + "'");
  if (a.exit_code != 0) return "";
  auto b = kimi::test::run_kimi("convert '" + hf + "' -o '" + tmp + "' --quiet");
  if (b.exit_code != 0) return "";
  std::filesystem::rename(tmp, path);  // atomic: a concurrent maker's file is as good
  return path;
}

class Dist : public ::testing::Test {
 protected:
  void SetUp() override {
#ifndef KIMI_HAVE_MPI
    GTEST_SKIP() << "built without MPI (KIMI_MPI)";
#endif
    if (sh("command -v mpirun").exit_code != 0) GTEST_SKIP() << "mpirun not installed";
    model = kimi::test::tiny_gguf(1);
  }
  std::string model;
  TempDir dir;
};

TEST_F(Dist, LogitsMatchOneProcess) {
  for (const char* prec : {"f32", "fast"}) {
    const std::string args = " eval -m " + q(model) + " --tokens " + kTokens +
                             " --all-logits --attn-top-k 4 -t 1 --precision " + prec + " --logits-out ";
    const std::string one = dir.file(std::string("one-") + prec + ".bin");
    auto r = kimi::test::run_kimi(args + q(one));
    ASSERT_EQ(r.exit_code, 0) << r.out;
    const auto ref = read_floats(one);
    ASSERT_EQ(ref.size(), 18u * 1024u);
    for (int np : {2, 3})
      for (const char* mode : {"tensor", "layer"}) {
        const std::string what = std::string(prec) + " np=" + std::to_string(np) + " " + mode;
        const std::string out = dir.file("m.bin");
        std::remove(out.c_str());
        auto m = sh(mpirun(np) + args + q(out) + " --split-mode " + mode);
        ASSERT_EQ(m.exit_code, 0) << what << "\n" << m.out;
        const auto got = read_floats(out);
        ASSERT_EQ(got.size(), ref.size()) << what;
        const Cmp c = compare(ref, got, 1024);
        std::printf("[dist] tiny %s: rel RMS %.3g, top-1 %d/%d, bit-equal %d\n", what.c_str(), c.rel_rms, c.top1_same,
                    c.rows, c.bit_equal ? 1 : 0);
        EXPECT_EQ(c.top1_same, c.rows) << what;
        EXPECT_LE(c.rel_rms, 1e-6) << what;
        EXPECT_TRUE(c.bit_equal) << what << ": rel RMS " << c.rel_rms;  // same ops, values only moved
      }
  }
}

TEST_F(Dist, GreedyGenerationIdentical) {
  const std::string args = " run -m " + q(model) + " --tokens 1,2,3,4,5 -n 24 --ignore-eos --ids -t 1";
  auto one = kimi::test::run_kimi(args);
  ASSERT_EQ(one.exit_code, 0) << one.out;
  for (auto [np, mode] : {std::pair{2, "tensor"}, std::pair{3, "tensor"}, std::pair{3, "layer"}}) {
    // stdout only: mpirun forwards the ranks' stdout and stderr separately (their order varies)
    auto m = sh("(" + mpirun(np) + args + " --split-mode " + mode + " 2>/dev/null)");
    ASSERT_EQ(m.exit_code, 0) << m.out;
    // the token ids (the first line; the timing line differs), printed by rank 0 only
    EXPECT_EQ(m.out.substr(0, m.out.find('\n')), one.out.substr(0, one.out.find('\n'))) << "np=" << np << " " << mode;
    EXPECT_EQ(m.out.find('\n'), m.out.size() - 1) << m.out;
  }
}

// A rank killed (SIGKILL) mid-generation. Plain mpirun ends the job at once (status non-zero)
// and names the rank, and so does rank 0 (the ranks that did not answer its roll call after the
// launcher's SIGTERM); with --enable-recovery the launcher leaves it to kimi: rank 0 names the
// rank it lost after KIMI_MPI_TIMEOUT seconds, tells the others, and every rank ends with status 1
// (recorded per rank by a wrapper: Open MPI 4.1's mpirun itself reports 0 in that mode). The
// wrapper is used only there: under plain mpirun a rank's wrapper that outlives its kimi changes
// what the launcher sees.
TEST_F(Dist, KilledRankEndsEveryRankAndIsNamed) {
  const std::string wrap = dir.file("wrap.sh");
  kimi::test::write_file(wrap, "#!/bin/sh\n\"$@\"\necho $? > " + dir.path + "/rc.$OMPI_COMM_WORLD_RANK\n");
  ASSERT_EQ(sh("chmod +x " + q(wrap)).exit_code, 0);
  for (const char* extra : {"", "--enable-recovery"}) {
    sh("rm -f " + dir.path + "/rc.*");
    const std::string log = dir.file("gen.log");
    const std::string cmd =
        "export KIMI_MPI_TIMEOUT=5 KIMI_TEST_TAG=" + q(dir.path) + "; " +
        "OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 timeout 120 mpirun --oversubscribe " + extra +
        " -x KIMI_MPI_TIMEOUT -x KIMI_TEST_TAG -np 3 " + (*extra ? q(wrap) + " " : std::string()) + std::string(KIMI_BIN) + " run -m " +
        q(model) + " --tokens 1,2,3 -n 100000 --ignore-eos --ids -c 100010 -t 1 > " + q(log) + " 2>&1 & M=$!; "
        "for i in $(seq 1 600); do sleep 0.1; [ $(wc -c < " + q(log) + ") -gt 40 ] && break; done; "
        // this job's ranks: kimi processes carrying our tag; rank 2 by its environment
        "R=''; for p in $(pgrep -x kimi); do grep -qzF \"KIMI_TEST_TAG=$KIMI_TEST_TAG\" /proc/$p/environ 2>/dev/null && R=\"$R $p\"; done; "
        "for p in $R; do grep -qz '^OMPI_COMM_WORLD_RANK=2$' /proc/$p/environ && kill -9 $p && echo killed $p; done; "
        "T0=$(date +%s); wait $M; RC=$?; echo rc=$RC seconds=$(( $(date +%s) - T0 )); "
        "sleep 1; L=0; for p in $R; do ps -o stat= -p $p 2>/dev/null | grep -qv Z && L=$((L+1)); done; echo left=$L; "
        "for r in 0 1; do echo rank$r=$(cat " + dir.path + "/rc.$r 2>/dev/null); done";
    auto r = sh(cmd);
    std::string out = r.out + kimi::test::read_file(log);
    SCOPED_TRACE(std::string("mpirun ") + extra + "\n" + out.substr(out.size() > 3000 ? out.size() - 3000 : 0));
    ASSERT_NE(out.find("killed "), std::string::npos);
    const auto s = out.find("seconds=");
    ASSERT_NE(s, std::string::npos);
    EXPECT_LE(std::atoi(out.c_str() + s + 8), 30);
    EXPECT_NE(out.find("left=0"), std::string::npos);  // no rank left behind
    if (*extra) {
      // each survivor either noticed the loss itself or was told by the other: its line names rank 2
      for (const char* who : {"kimi: rank 0: ", "kimi: rank 1: "}) {
        const auto at = out.find(who);
        ASSERT_NE(at, std::string::npos) << who;
        EXPECT_NE(out.substr(at, out.find('\n', at) - at).find("lost rank 2"), std::string::npos) << who;
      }
      EXPECT_NE(out.find("rank0=1"), std::string::npos);
      EXPECT_NE(out.find("rank1=1"), std::string::npos);
    } else {
      EXPECT_EQ(out.find("rc=0 "), std::string::npos);
      EXPECT_NE(out.find("process rank 2"), std::string::npos);  // mpirun's own report
      // and rank 0's, from the roll call after the launcher's SIGTERM
      EXPECT_NE(out.find("kimi: rank 0: lost rank 2 "), std::string::npos);
    }
  }
}

// An error on one rank only (rank 1 cannot open the model) ends the whole job non-zero.
TEST_F(Dist, ErrorOnOneRankEndsTheJob) {
  const std::string script = dir.file("one-bad.sh");
  kimi::test::write_file(script, "#!/bin/sh\nif [ \"$OMPI_COMM_WORLD_RANK\" = 1 ]; then m=/nonexistent.gguf; else m=" +
                                     q(model) + "; fi\nexec " + std::string(KIMI_BIN) +
                                     " run -m \"$m\" --tokens 1,2,3 -n 4 --ids -t 1\n");
  auto r = sh("chmod +x " + q(script) + " && OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 timeout 60 "
              "mpirun --oversubscribe -np 2 " + q(script));
  EXPECT_NE(r.exit_code, 0) << r.out;
  EXPECT_NE(r.exit_code, 124) << "hang: " << r.out;
  EXPECT_NE(r.out.find("kimi: rank 1: kimi run: error:"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("nonexistent.gguf"), std::string::npos) << r.out;
}

// kimi shard: per-rank files give the same logits as the full file; a shard set used with the wrong
// rank count, a shard without mpirun, and ranks with different models are errors at start.
TEST_F(Dist, PerRankFilesAndMismatches) {
  const std::string shards = dir.file("shards");
  auto w = kimi::test::run_kimi("shard " + q(model) + " --ranks 2 -o " + q(shards) + " -q");
  ASSERT_EQ(w.exit_code, 0) << w.out;
  const std::string stem = std::filesystem::path(model).stem().string();
  const std::string per_rank = shards + "/" + stem + ".rank{rank}-of-2.gguf";
  // each file holds its rank's slice of every split tensor (its heads / rows / experts) and the
  // small tensors whole: per tensor, the ranks' bytes add up to the whole tensor (split) or each
  // rank has all of it; the only large tensors kept whole are the token embedding (a rank reads any
  // row of it) and KDA's low-rank decay input (small)
  {
    auto full_r = kimi::gguf::Reader::open(model);
    std::vector<std::unique_ptr<kimi::gguf::Reader>> part_r;
    for (int r : {0, 1}) part_r.push_back(kimi::gguf::Reader::open(shards + "/" + stem + ".rank" + std::to_string(r) + "-of-2.gguf"));
    uint64_t whole = 0, split = 0;
    for (const auto& t : full_r->tensors()) {
      uint64_t sum = 0;
      for (auto& p : part_r) sum += p->find_tensor(t.name)->nbytes;
      const bool kept_whole = t.name == "token_embd.weight" || t.name.find("ssm_f_a") != std::string::npos ||
                              t.n_dims == 1 || t.name.find("norm") != std::string::npos ||
                              t.name.find("conv1d") != std::string::npos || t.name.find("ssm_a") != std::string::npos ||
                              t.name.find("exp_probs_b") != std::string::npos || t.name.find("res_score") != std::string::npos;
      if (kept_whole) {
        EXPECT_EQ(sum, 2 * t.nbytes) << t.name;
        whole += t.nbytes;
      } else {
        EXPECT_EQ(sum, t.nbytes) << t.name << " is split";
        split += t.nbytes;
      }
    }
    for (auto& p : part_r) {
      uint64_t held = 0;
      for (const auto& t : p->tensors()) held += t.nbytes;
      EXPECT_LE(double(held), double(whole) + 0.5 * double(split) * 1.05);
      std::printf("[dist] tiny shard: %llu of %llu tensor bytes (whole %llu, split %llu)\n",
                  static_cast<unsigned long long>(held), static_cast<unsigned long long>(whole + split),
                  static_cast<unsigned long long>(whole), static_cast<unsigned long long>(split));
    }
  }
  const std::string args = std::string(" eval --tokens ") + kTokens + " --all-logits --attn-top-k 4 -t 1 --precision f32";
  const std::string full = dir.file("full.bin"), part = dir.file("part.bin");
  auto a = sh(mpirun(2) + args + " -m " + q(model) + " --logits-out " + q(full));
  ASSERT_EQ(a.exit_code, 0) << a.out;
  auto b = sh(mpirun(2) + args + " -m " + q(per_rank) + " --logits-out " + q(part));
  ASSERT_EQ(b.exit_code, 0) << b.out;
  EXPECT_TRUE(compare(read_floats(full), read_floats(part), 1024).bit_equal);  // the same computation
  {  // an uneven set: 3 ranks (4 heads as 1 + 1 + 2, 8 experts as 2 + 3 + 3)
    const std::string shards3 = dir.file("shards3");
    auto w3 = kimi::test::run_kimi("shard " + q(model) + " --ranks 3 -o " + q(shards3) + " -q");
    ASSERT_EQ(w3.exit_code, 0) << w3.out;
    const std::string full3 = dir.file("full3.bin");
    auto a3 = sh(mpirun(3) + args + " -m " + q(model) + " --logits-out " + q(full3));
    ASSERT_EQ(a3.exit_code, 0) << a3.out;
    auto b3 = sh(mpirun(3) + args + " -m " + q(shards3 + "/" + stem + ".rank{rank}-of-3.gguf") + " --logits-out " + q(part));
    ASSERT_EQ(b3.exit_code, 0) << b3.out;
    EXPECT_TRUE(compare(read_floats(full3), read_floats(part), 1024).bit_equal);
  }
  // one rank on the full file, the other on its shard: the same model
  const std::string mixed = dir.file("mixed.sh");
  kimi::test::write_file(mixed, "#!/bin/sh\nif [ \"$OMPI_COMM_WORLD_RANK\" = 1 ]; then m=" + q(shards + "/" + stem +
                                    ".rank1-of-2.gguf") + "; else m=" + q(model) + "; fi\nexec " +
                                    std::string(KIMI_BIN) + args + " -m \"$m\" --logits-out " + q(part) + "\n");
  auto c = sh("chmod +x " + q(mixed) + " && " + mpirun(2, "", q(mixed)));
  ASSERT_EQ(c.exit_code, 0) << c.out;
  EXPECT_TRUE(compare(read_floats(full), read_floats(part), 1024).bit_equal);

  // 3 ranks with a 2-rank set: every rank that opens a file says what is wrong
  auto d = sh(mpirun(3) + args + " -m " + q(per_rank) + " --logits-out " + q(part));
  EXPECT_NE(d.exit_code, 0);
  EXPECT_NE(d.exit_code, 124) << "hang";
  // every rank reports its own problem (ranks 0 and 1: the split; rank 2: no file of its own)
  EXPECT_NE(d.out.find("kimi: rank 0: kimi eval: error: rank 0: "), std::string::npos) << d.out;
  EXPECT_NE(d.out.find("kimi: rank 1: kimi eval: error: rank 1: "), std::string::npos) << d.out;
  EXPECT_NE(d.out.find("2-rank split, but this job has 3 ranks"), std::string::npos) << d.out;
  EXPECT_NE(d.out.find("kimi: rank 2: "), std::string::npos) << d.out;
  EXPECT_NE(d.out.find("rank2-of-2"), std::string::npos) << d.out;
  // a shard without mpirun
  auto e = kimi::test::run_kimi(std::string("eval --tokens 1,2 --logits-out ") + q(part) + " -m " +
                                q(shards + "/" + stem + ".rank0-of-2.gguf"));
  EXPECT_NE(e.exit_code, 0);
  EXPECT_NE(e.out.find("a per-rank file (rank 0 of 2); run it with mpirun -np 2"), std::string::npos) << e.out;
  // different models on the ranks
  const std::string other = kimi::test::tiny_gguf(2);
  const std::string two = dir.file("two.sh");
  kimi::test::write_file(two, "#!/bin/sh\nif [ \"$OMPI_COMM_WORLD_RANK\" = 1 ]; then m=" + q(other) + "; else m=" +
                                  q(model) + "; fi\nexec " + std::string(KIMI_BIN) + args + " -m \"$m\" --logits-out " +
                                  q(part) + "\n");
  auto f = sh("chmod +x " + q(two) + " && " + mpirun(2, "", q(two)));
  EXPECT_NE(f.exit_code, 0);
  EXPECT_NE(f.exit_code, 124) << "hang";
  EXPECT_NE(f.out.find("every rank needs the same model"), std::string::npos) << f.out;
}

// Expert parallelism keeps each rank's memory to its share: on a 4-layer `small` model (experts
// ~30 % of the file), each of 2 ranks' resident model pages (the mmap, from /proc/self/smaps)
// stay within the shared bytes + routed-expert bytes / 2 + 10 %, and each rank holds half the experts.
TEST_F(Dist, ResidentModelBytesPerRank) {
  const std::string gguf = small4();
  ASSERT_FALSE(gguf.empty()) << "synth/convert of the small model failed";
  uint64_t experts = 0;
  {
    auto r = kimi::gguf::Reader::open(gguf);
    for (const auto& t : r->tensors())
      if (t.name.find("_exps.weight") != std::string::npos) experts += t.nbytes;
  }
  const uint64_t file = std::filesystem::file_size(gguf), shared = file - experts;
  auto m = sh("(" + mpirun(2) + " bench -m " + q(gguf) + " -p 0 -n 8 -r 1 -t 1 --json 2>/dev/null)");
  ASSERT_EQ(m.exit_code, 0) << m.out;
  const auto j = nlohmann::json::parse(m.out.substr(m.out.find('{')));
  ASSERT_EQ(j["ranks"].size(), 2u) << m.out;
  for (const auto& r : j["ranks"]) {
    const double rss = r["model_rss_bytes"].get<double>();
    EXPECT_GT(rss, 0.0);
    EXPECT_LE(rss, 1.1 * (double(shared) + double(experts) / 2)) << "rank " << r["rank"];
    EXPECT_EQ(r["expert_weight_bytes_held"].get<uint64_t>(), experts / 2) << "rank " << r["rank"];
  }
}

// The same on the `small` shapes (4 layers; 16 heads, 64 experts over 2 or 3 ranks, the indexer
// selecting 4 rows): f32 logits of every position.
TEST_F(Dist, SmallModelLogitsMatchOneProcess) {
  const std::string gguf = small4();
  ASSERT_FALSE(gguf.empty()) << "synth/convert of the small model failed";
  const std::string args = std::string(" eval -m ") + q(gguf) + " --tokens " + kTokens +
                           " --all-logits --attn-top-k 4 -t 1 --precision f32 --logits-out ";
  const std::string one = dir.file("one.bin"), out = dir.file("m.bin");
  auto r = kimi::test::run_kimi(args + q(one));
  ASSERT_EQ(r.exit_code, 0) << r.out;
  const auto ref = read_floats(one);
  for (int np : {2, 3})
    for (const char* mode : {"tensor", "layer"}) {
      const std::string what = "np=" + std::to_string(np) + " " + mode;
      auto m = sh(mpirun(np) + args + q(out) + " --split-mode " + mode);
      ASSERT_EQ(m.exit_code, 0) << what << "\n" << m.out;
      const Cmp c = compare(ref, read_floats(out), 32768);
      std::printf("[dist] small %s: rel RMS %.3g, top-1 %d/%d, bit-equal %d\n", what.c_str(), c.rel_rms, c.top1_same,
                  c.rows, c.bit_equal ? 1 : 0);
      EXPECT_EQ(c.top1_same, c.rows) << what;
      EXPECT_LE(c.rel_rms, 1e-6) << what;
      EXPECT_TRUE(c.bit_equal) << what;
    }
}

}  // namespace
