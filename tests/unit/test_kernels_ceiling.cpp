// The run-time ceiling (backend/cpu/ceiling.h): every level's read loop sums every byte of its
// buffer with any stream count and load kind (checked against a plain sum), every peak loop does
// exactly the multiply-adds it claims (unit inputs: the accumulators add up to products x steps),
// the matmul kernels' activation arithmetic, and the drivers' bookkeeping. No timing is asserted.
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <new>
#include <random>
#include <vector>

#include "backend/cpu/ceiling.h"
#include "backend/cpu/dispatch.h"
#include "backend/cpu/matmul_amx.h"

#if defined(__linux__)
#include <unistd.h>
#endif

using namespace kimi;
using namespace kimi::kern;

namespace {

struct IsaRestore {
  Isa saved = current_isa();
  ~IsaRestore() { set_isa(saved); }
};

TEST(Ceiling, EveryLevelOfThisCpuHasLoops) {
  for (Isa isa : supported_isas()) {
    CeilingLoops l;
    EXPECT_TRUE(ceiling_loops(isa, &l)) << isa_name(isa);
    EXPECT_NE(l.read, nullptr);
    EXPECT_NE(l.peak, nullptr);
    for (int t = 0; t < kLoopTypes; ++t) {
      EXPECT_GT(l.products_per_iter[t], 0);
      EXPECT_NE(l.instr[t], nullptr);
    }
  }
}

TEST(Ceiling, ReadLoopsSumEveryWord) {
  constexpr size_t kBytes = 256 * 8 * 3 * 5;  // divisible by 256 x streams for 1..8 streams and 3
  auto* p = static_cast<uint64_t*>(::operator new(kBytes, std::align_val_t(64)));
  std::mt19937_64 rng(7);
  uint64_t want_all = 0;
  for (size_t i = 0; i < kBytes / 8; ++i) want_all += (p[i] = rng());
  for (Isa isa : supported_isas()) {
    CeilingLoops l;
    ASSERT_TRUE(ceiling_loops(isa, &l));
    for (int streams : {1, 2, 3, 4, 8})
      for (bool nt : {false, true}) {
        // a sub-range too: the loop must honour bytes, not read past it
        EXPECT_EQ(l.read(reinterpret_cast<const uint8_t*>(p), kBytes, streams, nt), want_all)
            << isa_name(isa) << " streams " << streams << " nt " << nt;
        const size_t part = 256 * 8 * 3;
        uint64_t want = 0;
        for (size_t i = 0; i < part / 8; ++i) want += p[i];
        EXPECT_EQ(l.read(reinterpret_cast<const uint8_t*>(p), part, streams, nt), want) << isa_name(isa);
      }
  }
  ::operator delete(p, std::align_val_t(64));
}

TEST(Ceiling, PeakLoopsDoTheProductsTheyCount) {
  for (Isa isa : supported_isas()) {
    CeilingLoops l;
    ASSERT_TRUE(ceiling_loops(isa, &l));
    for (int t = 0; t < kLoopTypes; ++t)
      for (int64_t iters : {1, 37, 1000}) {
        // unit inputs: every product is 1, every accumulator lane counts them (exact below 2^24)
        EXPECT_EQ(l.peak(static_cast<ActType>(t), iters, 1), double(l.products_per_iter[t]) * double(iters))
            << isa_name(isa) << " " << act_type_name(static_cast<ActType>(t)) << " iters " << iters;
        EXPECT_EQ(l.peak(static_cast<ActType>(t), iters, 0), 0.0);
      }
  }
}

TEST(Ceiling, MatmulActivationArithmetic) {
  EXPECT_EQ(matmul_act_type(GgmlType::F32, Precision::Fast), ActType::F32);
  EXPECT_EQ(matmul_act_type(GgmlType::F16, Precision::Fast), ActType::F32);
  EXPECT_EQ(matmul_act_type(GgmlType::BF16, Precision::Fast), ActType::Bf16);
  EXPECT_EQ(matmul_act_type(GgmlType::BF16, Precision::F32), ActType::F32);
  // with >= 16 tokens AMX-INT8 takes MXFP4 / Q4_0 / Q8_0 and the packed (2-D) Q4_K / Q5_K where it is usable
  const ActType tiles = amx_int8_usable() ? ActType::Int8Tiles : ActType::Int8;
  for (GgmlType q : {GgmlType::Q8_0, GgmlType::Q4_0, GgmlType::MXFP4, GgmlType::Q4_K, GgmlType::Q5_K}) {
    EXPECT_EQ(matmul_act_type(q, Precision::Fast), tiles) << type_name(q);
    EXPECT_EQ(matmul_act_type(q, Precision::Fast, 15), ActType::Int8) << type_name(q);
    EXPECT_EQ(matmul_act_type(q, Precision::F32), ActType::F32) << type_name(q);
  }
  EXPECT_EQ(matmul_act_type(GgmlType::MXFP4, Precision::Fast, 512, true), tiles);  // expert stacks
  EXPECT_EQ(matmul_act_type(GgmlType::Q4_K, Precision::Fast, 512, true), ActType::Int8);  // not packed
  EXPECT_EQ(matmul_act_type(GgmlType::Q6_K, Precision::Fast, 512), ActType::Int8);
  EXPECT_EQ(matmul_act_type(GgmlType::Q6_K, Precision::F32), ActType::F32);
  EXPECT_STREQ(act_type_name(ActType::Int8), "int8");
  EXPECT_STREQ(act_type_name(ActType::Int8Tiles), "int8_tiles");
}

// A fake sysfs cpu tree: cpu0-3, each with a per-CPU 48K L1 data, 64K L1 instruction and 2048K L2
// cache, and an L3 of l3 bytes (sysfs spelling) shared by cpu0-1 and another by cpu2-3.
void fake_cpu_tree(const std::filesystem::path& root, const std::string& l3) {
  auto put = [](const std::filesystem::path& dir, const char* level, const char* type, const std::string& size,
                const std::string& shared) {
    std::filesystem::create_directories(dir);
    std::ofstream(dir / "level") << level << "\n";
    std::ofstream(dir / "type") << type << "\n";
    std::ofstream(dir / "size") << size << "\n";
    std::ofstream(dir / "shared_cpu_list") << shared << "\n";
  };
  for (int c = 0; c < 4; ++c) {
    const std::filesystem::path cache = root / ("cpu" + std::to_string(c)) / "cache";
    put(cache / "index0", "1", "Data", "48K", std::to_string(c));
    put(cache / "index1", "1", "Instruction", "64K", std::to_string(c));
    put(cache / "index2", "2", "Unified", "2048K", std::to_string(c));
    put(cache / "index3", "3", "Unified", l3, c < 2 ? "0-1" : "2-3");
  }
  std::filesystem::create_directories(root / "cpufreq");  // not a cpuN directory
}

TEST(Ceiling, LastLevelCacheSumsTheInstancesOfTheHighestLevel) {
  const std::filesystem::path root = std::filesystem::path(::testing::TempDir()) / "kimi_fake_cpu_tree";
  std::filesystem::remove_all(root);
  fake_cpu_tree(root, "491520K");
  EXPECT_EQ(last_level_cache_bytes(root.string()), 2 * size_t{491520} * 1024);  // two L3s of 480 MiB
  std::filesystem::remove_all(root);
  fake_cpu_tree(root, "32M");
  EXPECT_EQ(last_level_cache_bytes(root.string()), size_t{64} << 20);
  std::filesystem::remove_all(root / "cpu0" / "cache" / "index3");
  std::filesystem::remove_all(root / "cpu1" / "cache" / "index3");
  std::filesystem::remove_all(root / "cpu2" / "cache" / "index3");
  std::filesystem::remove_all(root / "cpu3" / "cache" / "index3");
  EXPECT_EQ(last_level_cache_bytes(root.string()), size_t{4} * 2048 * 1024);  // no L3: the four L2s
  std::filesystem::remove_all(root);
  EXPECT_EQ(last_level_cache_bytes(root.string()), 0u);  // nothing readable
#if defined(__linux__)
  // this machine: at least the one L3 instance cpu0's own sysfs entry states (not glibc's
  // sysconf(_SC_LEVEL3_CACHE_SIZE): it reads CPUID, which in a VM can state the host's whole L3 --
  // 320 MiB on a Zen 5 guest whose sysfs, and lscpu, say 32 MiB)
  const std::filesystem::path idx3 = "/sys/devices/system/cpu/cpu0/cache/index3/size";
  std::ifstream f(idx3);
  std::string sz;
  if (f && std::getline(f, sz) && !sz.empty()) {
    size_t mult = 1;
    if (sz.back() == 'K') mult = size_t{1} << 10;
    if (sz.back() == 'M') mult = size_t{1} << 20;
    EXPECT_GE(last_level_cache_bytes(), std::stoull(sz) * mult) << idx3 << " says " << sz;
  }
#endif
}

TEST(Ceiling, DefaultReadBufferIsTwiceTheLastLevelCache) {
  const size_t MiB = size_t{1} << 20;
  EXPECT_EQ(default_read_buffer_bytes(2, 0, 0), 256 * MiB);
  EXPECT_EQ(default_read_buffer_bytes(2, 32 * MiB, size_t{24} << 30), 256 * MiB);    // a 32 MiB L3
  EXPECT_EQ(default_read_buffer_bytes(2, 480 * MiB, size_t{24} << 30), 960 * MiB);   // a 480 MiB L3
  EXPECT_EQ(default_read_buffer_bytes(16, 0, 0), 512 * MiB);                          // 32 MiB per thread
  EXPECT_EQ(default_read_buffer_bytes(2, 480 * MiB, size_t{4} << 30), 512 * MiB);    // at most RAM / 8
  EXPECT_EQ(default_read_buffer_bytes(2, 480 * MiB, size_t{1} << 30), 256 * MiB);    // but never below 256 MiB
}

TEST(Ceiling, DriversReportWhatTheyMeasured) {
  IsaRestore restore;
  for (Isa isa : supported_isas()) {
    set_isa(isa);
    ThreadPool pool(2);
    CeilingOptions o;
    o.buffer_bytes = size_t{8} << 20;
    o.read_seconds = 0;  // one round of every configuration
    o.compute_seconds = 0;
    const Ceiling c = measure_ceiling(pool, o);
    EXPECT_EQ(c.isa, isa);
    EXPECT_EQ(c.threads, 2);
    EXPECT_EQ(c.read.buffer_bytes, size_t{8} << 20);  // two slices of 4 MiB
    EXPECT_GT(c.read.bytes_per_s, 0.0);
    EXPECT_GE(c.read.bytes_per_s, c.read.one_stream_bytes_per_s);  // the best over a sweep that has it
    EXPECT_TRUE(c.read.streams == 1 || c.read.streams == 2 || c.read.streams == 4 || c.read.streams == 8);
    EXPECT_GE(c.read.passes, 4);  // 1, 2, 4, 8 streams (and non-temporal where the level has them)
    for (int t = 0; t < kActTypes; ++t) {
      if (static_cast<ActType>(t) == ActType::Int8Tiles && !(isa == Isa::Avx512 && amx_int8_usable())) {
        EXPECT_EQ(c.compute.per_thread[t], 0.0);  // measured only where AMX-INT8 runs
        EXPECT_EQ(c.compute.instr[t], nullptr);
        continue;
      }
      EXPECT_GT(c.compute.per_thread[t], 0.0);
      EXPECT_DOUBLE_EQ(c.compute.total[t], 2 * c.compute.per_thread[t]);
    }
    EXPECT_EQ(describe(c).find("tdpbssd") != std::string::npos, isa == Isa::Avx512 && amx_int8_usable());
    const std::string d = describe(c);
    EXPECT_NE(d.find(isa_name(isa)), std::string::npos) << d;
    EXPECT_NE(d.find("GB/s"), std::string::npos) << d;
  }
}

}  // namespace
