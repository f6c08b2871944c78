// Run-time ceilings (backend/cpu/ceiling.h): the measuring drivers, the scalar loops, and the
// activation arithmetic of each matmul kernel.
#include "backend/cpu/ceiling.h"

#include "backend/cpu/matmul_amx.h"

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstdint>
#include <filesystem>
#include <fmt/format.h>
#include <fstream>
#include <map>
#include <new>
#include <vector>

#include "util/error.h"

#if defined(__linux__)
#include <sys/mman.h>
#include <unistd.h>
#endif

namespace kimi::kern {

const char* act_type_name(ActType t) {
  switch (t) {
    case ActType::F32: return "f32";
    case ActType::Bf16: return "bf16";
    case ActType::Int8: return "int8";
    case ActType::Int8Tiles: return "int8_tiles";
  }
  return "?";
}

ActType matmul_act_type(GgmlType type, Precision prec, int64_t tokens, bool stacked) {
  // the kernel tables of matmul_<level>.cpp: Precision::F32 and f32/f16 weights run f32 FMAs, bf16
  // weights bf16 dots (widened to f32 FMAs where the level has no bf16 dot: its bf16 peak is the f32
  // one), every quantized type an int8 dot against the quantized activation
  if (prec == Precision::F32 || type == GgmlType::F32 || type == GgmlType::F16) return ActType::F32;
  if (type == GgmlType::BF16) return ActType::Bf16;
  // AMX-INT8 (matmul_amx.h: amx_nib_takes, and matmul_packed for the packed 2-D K-quants)
  AmxPackedRun run = nullptr;
  const bool packed = !stacked && amx_packed_run(type, &run);
  if (tokens >= 16 && (amx_nib_type(type) || packed) && amx_int8_usable()) return ActType::Int8Tiles;
  return ActType::Int8;
}

namespace {

// ---- scalar loops (every CPU): 64-bit word sums, C++ multiply-adds ----
template <int S>
uint64_t scalar_read_s(const uint8_t* p, size_t bytes) {
  uint64_t acc[S][4] = {};
  const size_t part = bytes / S;
  for (size_t off = 0; off < part; off += 256)
    for (int s = 0; s < S; ++s) {
      const uint64_t* q = reinterpret_cast<const uint64_t*>(p + s * part + off);
      for (int k = 0; k < 32; k += 4) {
        acc[s][0] += q[k];
        acc[s][1] += q[k + 1];
        acc[s][2] += q[k + 2];
        acc[s][3] += q[k + 3];
      }
    }
  uint64_t t = 0;
  for (auto& a : acc) t += a[0] + a[1] + a[2] + a[3];
  return t;
}

uint64_t scalar_read(const uint8_t* p, size_t bytes, int streams, bool) {
  switch (streams) {
    case 1: return scalar_read_s<1>(p, bytes);
    case 2: return scalar_read_s<2>(p, bytes);
    case 4: return scalar_read_s<4>(p, bytes);
    case 8: return scalar_read_s<8>(p, bytes);
    default: {
      uint64_t t = 0;
      const size_t part = bytes / static_cast<size_t>(streams);
      for (int s = 0; s < streams; ++s) t += scalar_read_s<1>(p + static_cast<size_t>(s) * part, part);
      return t;
    }
  }
}

constexpr int kScalarAcc = 8;

double scalar_peak(ActType type, int64_t iters, int one) {
  double t = 0;
  if (type == ActType::Int8) {
    int32_t acc[kScalarAcc] = {};
    const int8_t x = static_cast<int8_t>(one);
    for (int64_t i = 0; i < iters; ++i)
      for (int a = 0; a < kScalarAcc; ++a) acc[a] += int32_t(x) * int32_t(x);
    for (int32_t v : acc) t += v;
    return t;
  }
  float acc[kScalarAcc] = {};
  const float x = static_cast<float>(one);
  for (int64_t i = 0; i < iters; ++i)
    for (int a = 0; a < kScalarAcc; ++a) acc[a] += x * x;
  for (float v : acc) t += v;
  return t;
}

bool scalar_loops(CeilingLoops* out) {
  out->read = scalar_read;
  out->peak = scalar_peak;
  for (int t = 0; t < kLoopTypes; ++t) out->products_per_iter[t] = kScalarAcc;
  out->instr[0] = "C++ f32 multiply-add";
  out->instr[1] = "C++ f32 multiply-add (bf16 widened)";
  out->instr[2] = "C++ int32 multiply-add";
  return true;
}

using clk = std::chrono::steady_clock;
double since(clk::time_point t0) { return std::chrono::duration<double>(clk::now() - t0).count(); }

// The loops of the level in use, or of the highest level below it that has loops in this build.
CeilingLoops loops_for(Isa isa) {
  CeilingLoops l;
  for (;; isa = lower_isa(isa))
    if (ceiling_loops(isa, &l) || isa == Isa::Scalar) break;
  return l;
}

struct Buffer {  // 2 MiB-aligned huge pages where the kernel offers them (few page faults), else pages
  uint8_t* p = nullptr;
  size_t n = 0;
  void* map = nullptr;
  size_t map_n = 0;
  explicit Buffer(size_t bytes) : n(bytes) {
#if defined(__linux__)
    constexpr size_t kHuge = size_t{2} << 20;
    map_n = n + kHuge;
    map = mmap(nullptr, map_n, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (map == MAP_FAILED) throw std::bad_alloc();
    p = reinterpret_cast<uint8_t*>((reinterpret_cast<uintptr_t>(map) + kHuge - 1) / kHuge * kHuge);
    madvise(p, n, MADV_HUGEPAGE);
#else
    p = static_cast<uint8_t*>(::operator new(n, std::align_val_t(4096)));
#endif
  }
  ~Buffer() {
#if defined(__linux__)
    munmap(map, map_n);
#else
    ::operator delete(p, std::align_val_t(4096));
#endif
  }
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;
};

}  // namespace

bool ceiling_loops(Isa level, CeilingLoops* out) {
  *out = CeilingLoops{};
  switch (level) {
    case Isa::Scalar: return scalar_loops(out);
    case Isa::Avx2: return detail::ceiling_loops_avx2(out);
    case Isa::Avx512: return detail::ceiling_loops_avx512(out);
    case Isa::Neon: return detail::ceiling_loops_neon(out);
    case Isa::NeonDot: return detail::ceiling_loops_neon_dot(out);
    case Isa::NeonI8mm: return detail::ceiling_loops_neon_i8mm(out);
  }
  return false;
}

size_t last_level_cache_bytes(const std::string& sys_cpu) {
  namespace fs = std::filesystem;
  auto first_line = [](const fs::path& p) {
    std::ifstream f(p);
    std::string s;
    std::getline(f, s);
    return s;
  };
  // level -> (shared_cpu_list -> bytes): one entry per cache instance
  std::map<int, std::map<std::string, size_t>> caches;
  std::error_code ec;
  for (const fs::directory_entry& cpu : fs::directory_iterator(sys_cpu, ec)) {
    const std::string name = cpu.path().filename().string();
    if (name.size() < 4 || name.compare(0, 3, "cpu") != 0 ||
        name.find_first_not_of("0123456789", 3) != std::string::npos)
      continue;
    std::error_code ec2;
    for (const fs::directory_entry& idx : fs::directory_iterator(cpu.path() / "cache", ec2)) {
      if (idx.path().filename().string().compare(0, 5, "index") != 0) continue;
      const std::string level = first_line(idx.path() / "level"), size = first_line(idx.path() / "size");
      const std::string type = first_line(idx.path() / "type");
      if (level.empty() || size.empty() || type == "Instruction") continue;
      char* end = nullptr;
      const unsigned long long v = std::strtoull(size.c_str(), &end, 10);
      const size_t mult = *end == 'K' ? size_t{1} << 10 : *end == 'M' ? size_t{1} << 20 : *end == 'G' ? size_t{1} << 30 : 1;
      const int lv = std::atoi(level.c_str());
      if (lv <= 0 || v == 0) continue;
      std::string shared = first_line(idx.path() / "shared_cpu_list");
      if (shared.empty()) shared = name;  // unknown sharing: one instance per CPU
      caches[lv][shared] = size_t(v) * mult;
    }
  }
  if (caches.empty()) return 0;
  size_t total = 0;
  for (const auto& [shared, bytes] : caches.rbegin()->second) total += bytes;
  return total;
}

size_t default_read_buffer_bytes(int threads, size_t llc_bytes, size_t ram_bytes) {
  size_t want = std::max<size_t>(size_t{256} << 20, (size_t{32} << 20) * size_t(std::max(threads, 1)));
  want = std::max(want, 2 * llc_bytes);
  if (ram_bytes) want = std::min(want, std::max<size_t>(ram_bytes / 8, size_t{256} << 20));
  return want;
}

namespace {
size_t ram_bytes() {
#if defined(__linux__)
  const long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGESIZE);
  if (pages > 0 && page > 0) return size_t(pages) * size_t(page);
#endif
  return 0;
}
}  // namespace

ReadCeiling measure_read(ThreadPool& pool, const CeilingOptions& o) {
  const CeilingLoops l = loops_for(current_isa());
  const int T = pool.size();
  ReadCeiling r;
  if (!o.buffer_bytes) r.llc_bytes = last_level_cache_bytes();
  size_t want = o.buffer_bytes ? o.buffer_bytes : default_read_buffer_bytes(T, r.llc_bytes, ram_bytes());
  const size_t grain = size_t{64} << 10;  // a multiple of 256 x 8 streams, and of the page size
  const size_t slice = std::max(grain, want / size_t(T) / grain * grain);
  r.buffer_bytes = slice * size_t(T);
  Buffer buf(r.buffer_bytes);
  // every thread writes its own slice first (first touch: its pages on its NUMA node); words
  // w = index + 1, so a pass's sum is known: n(n+1)/2 over all words
  pool.run_on_all([&](int ti, int) {
    uint64_t* w = reinterpret_cast<uint64_t*>(buf.p + size_t(ti) * slice);
    const uint64_t base = uint64_t(ti) * (slice / 8);
    for (size_t i = 0; i < slice / 8; ++i) w[i] = base + i + 1;
  });
  const uint64_t words = r.buffer_bytes / 8;
  const uint64_t expect = words % 2 == 0 ? (words / 2) * (words + 1) : words * ((words + 1) / 2);
  struct Config {
    int streams;
    bool nt;
    double best = 0;
  };
  std::vector<Config> cfg = {{1, false}, {2, false}, {4, false}, {8, false}};
  if (l.has_non_temporal) cfg.insert(cfg.end(), {{1, true}, {2, true}, {4, true}});
  std::vector<uint64_t> sums(size_t(T) * 8);  // a cache line per thread
  bool wrong = false;
  const auto t_start = clk::now();
  for (int round = 0; round < 10000; ++round) {  // every configuration once, then rounds while the budget lasts
    for (Config& c : cfg) {
      const auto t0 = clk::now();
      pool.run_on_all([&](int ti, int) {
        sums[size_t(ti) * 8] = l.read(buf.p + size_t(ti) * slice, slice, c.streams, c.nt);
      });
      const double dt = since(t0);
      uint64_t total = 0;
      for (int ti = 0; ti < T; ++ti) total += sums[size_t(ti) * 8];
      wrong |= total != expect;
      c.best = std::max(c.best, double(r.buffer_bytes) / dt);
      ++r.passes;
    }
    if (since(t_start) >= o.read_seconds) break;
  }
  check(!wrong, "ceiling: the {} read loop's sum is wrong (it did not read every byte)", isa_name(current_isa()));
  for (const Config& c : cfg) {
    if (c.best > r.bytes_per_s) {
      r.bytes_per_s = c.best;
      r.streams = c.streams;
      r.non_temporal = c.nt;
    }
    if (c.streams == 1 && !c.nt) r.one_stream_bytes_per_s = c.best;
  }
  return r;
}

ComputeCeiling measure_compute(int threads, const CeilingOptions& o) {
  const CeilingLoops l = loops_for(current_isa());
  ComputeCeiling c;
  volatile int one_v = 1;
  const int one = one_v;
  volatile double sink = 0;
  const bool tiles8 = amx_int8_usable();
  for (int t = 0; t < kActTypes; ++t) {
    const ActType type = static_cast<ActType>(t);
    if (type == ActType::Int8Tiles && !tiles8) continue;  // nothing runs it here
    // bf16 prefill GEMMs run on AMX tiles where the CPU has them (matmul_amx.h): that is its peak
    const bool amx = (type == ActType::Bf16 && amx_bf16_usable()) || type == ActType::Int8Tiles;
    const double budget = o.compute_seconds / (tiles8 ? kActTypes : kLoopTypes);
    int64_t iters = 256;
    const auto t_start = clk::now();
    double best = 0;
    // grow the step count to >= 0.5 ms per run, then keep the best rate of the budget: short runs
    // are rarely interrupted, so on a busy machine the best of many is still the core's own rate
    for (;;) {
      const auto t0 = clk::now();
      sink = sink + (type == ActType::Int8Tiles ? amx_int8_peak_loop(iters)
                     : amx                        ? amx_bf16_peak_loop(iters)
                                                  : l.peak(type, iters, one));
      const double dt = since(t0);
      if (dt < 5e-4 && iters < (int64_t{1} << 40)) {
        iters *= 2;
        continue;
      }
      const double per_iter = type == ActType::Int8Tiles ? kAmxInt8PeakProductsPerIter
                              : amx                        ? kAmxPeakProductsPerIter
                                                           : l.products_per_iter[t];
      best = std::max(best, per_iter * 2.0 * double(iters) / dt);
      if (since(t_start) >= budget) break;
    }
    c.per_thread[t] = best;
    c.total[t] = best * std::max(threads, 1);
    c.instr[t] = type == ActType::Int8Tiles ? "tdpbssd (AMX tiles)" : amx ? "tdpbf16ps (AMX tiles)" : l.instr[t];
  }
  return c;
}

Ceiling measure_ceiling(ThreadPool& pool, const CeilingOptions& o) {
  const auto t0 = clk::now();
  Ceiling c;
  c.isa = current_isa();
  c.threads = pool.size();
  c.read = measure_read(pool, o);
  c.compute = measure_compute(pool.size(), o);
  c.seconds = since(t0);
  return c;
}

std::string describe(const Ceiling& c) {
  std::string s = fmt::format(
      "ceiling ({}, {} threads, measured in {:.2f} s): read {:.1f} GB/s ({} stream(s)/thread, {} loads; 1 "
      "stream/thread {:.1f} GB/s, {} MiB buffer{})",
      isa_name(c.isa), c.threads, c.seconds, c.read.bytes_per_s / 1e9, c.read.streams,
      c.read.non_temporal ? "non-temporal" : "plain", c.read.one_stream_bytes_per_s / 1e9, c.read.buffer_bytes >> 20,
      c.read.llc_bytes ? fmt::format(", last-level cache {} MiB", c.read.llc_bytes >> 20) : std::string());
  const char* unit[kActTypes] = {"GFLOP/s", "GFLOP/s", "Gop/s", "Gop/s"};
  for (int t = 0; t < kActTypes; ++t)
    if (c.compute.instr[t] != nullptr)
      s += fmt::format("; {} {:.0f} {} ({:.0f}/thread, {})", act_type_name(static_cast<ActType>(t)),
                     c.compute.total[t] / 1e9, unit[t], c.compute.per_thread[t] / 1e9,
                     c.compute.instr[t] ? c.compute.instr[t] : "?");
  return s;
}

}  // namespace kimi::kern
