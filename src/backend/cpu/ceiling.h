// The machine's ceilings, measured at run time on the threads that run the model: the read
// bandwidth (what decode, a stream of weight bytes, can reach at best) and the compute peak of the
// inner-product instructions the matmul kernels use (what prefill can reach at best).
//
// Read bandwidth: every thread sums its own slice of a buffer much larger than the caches (at least
// twice the last-level cache the OS reports: a 256 MiB buffer on a CPU with a 480 MiB L3 measured
// 36 GB/s where 1-4 GiB buffers measured 32.5-33.8 GB/s, the memory's own rate; it
// first-touches that slice, so on a NUMA machine the slice is on the thread's node), split into
// S interleaved streams advanced in lockstep with the widest loads of the level (256 bytes per
// stream per step), plain or non-temporal loads. One stream per thread leaves bandwidth unused on
// some machines (the hardware prefetchers track a limited number of streams per core; more
// streams keep more misses in flight), so a small sweep over S and the load kind runs and the
// best pass counts. The wall time of a pass is from the start to the end of all threads (a late
// thread makes that pass slower, never faster).
//
// Compute peak: one thread runs A independent accumulator chains of the level's instruction
// (A large enough to cover its latency on every CPU the level runs on); the per-thread rate times
// the thread count is the peak (compute is core-local; a CPU that lowers its clock when every core
// runs wide vectors gets a peak slightly above what it can sustain). Activation arithmetic:
//   F32   f32 FMA                vfmadd231ps zmm/ymm, fmla.4s, scalar fmaf
//   BF16  bf16 pair dot → f32    tdpbf16ps (AMX tiles, matmul_amx.h) where usable, else vdpbf16ps zmm
//                                (avx512), bfdot (neon_i8mm); f32 FMA elsewhere
//                                (those levels widen bf16 to f32)
//   INT8  u8·s8 / s8·s8 dot → i32 vpdpbusd zmm (avx512), vpmaddubsw+vpmaddwd+vpaddd (avx2),
//                                smmla (neon_i8mm), sdot (neon_dot), smull+sadalp (neon)
//   INT8 TILES  s8·s8 → i32      tdpbssd (AMX-INT8, matmul_amx.h): the products with >= 16 tokens of
//                                MXFP4 / Q4_0 / Q8_0 and of the packed 2-D Q4_K / Q5_K weights where
//                                the CPU has AMX-INT8 (measured only there; elsewhere nothing runs it)
// An "op" is a multiply or an add: a multiply-add counts 2 (FLOPs for the float types).
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>

#include "backend/cpu/dispatch.h"
#include "tensor/types.h"
#include "util/thread_pool.h"

namespace kimi::kern {

enum class ActType : int { F32 = 0, Bf16 = 1, Int8 = 2, Int8Tiles = 3 };
constexpr int kActTypes = 4;
constexpr int kLoopTypes = 3;  // the per-level loops (CeilingLoops): F32, Bf16, Int8
const char* act_type_name(ActType t);  // "f32", "bf16", "int8", "int8_tiles"

// The arithmetic the matmul kernel of (weight type, precision) runs at the level in use for a product
// with `tokens` tokens: F32 for f32/f16 weights and for Precision::F32, BF16 for bf16 weights, INT8 for
// the quantized types, INT8 TILES for those of them that AMX-INT8 computes (matmul_amx.h; stacked = a
// 3-D expert stack, whose K-quants are not packed and so not on the tiles).
ActType matmul_act_type(GgmlType type, Precision prec, int64_t tokens = 16, bool stacked = false);

struct ReadCeiling {
  double bytes_per_s = 0;             // best pass over all configurations (bytes / wall second)
  int streams = 0;                    // per thread, of the best pass
  bool non_temporal = false;          // of the best pass
  double one_stream_bytes_per_s = 0;  // best pass with one plain stream per thread
  size_t buffer_bytes = 0;
  size_t llc_bytes = 0;  // last_level_cache_bytes() when the default size was chosen (0: not known)
  int passes = 0;
};

struct ComputeCeiling {
  double per_thread[kActTypes] = {};  // ops/s of one thread (Int8Tiles: 0 where AMX-INT8 is not used)
  double total[kActTypes] = {};       // per_thread x threads
  const char* instr[kActTypes] = {};  // the instruction measured (nullptr where not measured)
};

struct Ceiling {
  Isa isa = Isa::Scalar;  // the level measured (the one the kernels run at)
  int threads = 1;
  ReadCeiling read;
  ComputeCeiling compute;
  double seconds = 0;  // wall time the measurement took
};

struct CeilingOptions {
  size_t buffer_bytes = 0;      // 0: max(256 MiB, 32 MiB x threads, 2 x the last-level cache), at most 1/8 of RAM
  double read_seconds = 0.25;   // time budget of the read sweep (at least one pass per configuration)
  double compute_seconds = 0.15;  // time budget of the compute loops (all three types)
};

// The total size of the machine's last-level caches: for the highest cache level sysfs lists under
// sys_cpu (cpuN/cache/indexM/{level,size,shared_cpu_list}), the sum over its distinct instances (a
// 2-socket machine counts both L3s). 0 where that is not readable (not Linux, no sysfs).
size_t last_level_cache_bytes(const std::string& sys_cpu = "/sys/devices/system/cpu");

// The read buffer measure_read uses when o.buffer_bytes is 0 (see CeilingOptions).
size_t default_read_buffer_bytes(int threads, size_t llc_bytes, size_t ram_bytes);

// Measures both on pool's threads (a few hundred ms; allocates and frees the buffer).
Ceiling measure_ceiling(ThreadPool& pool, const CeilingOptions& o = {});
ReadCeiling measure_read(ThreadPool& pool, const CeilingOptions& o = {});
ComputeCeiling measure_compute(int threads, const CeilingOptions& o = {});

// One line per number, for logs: "read 61.2 GB/s (2 threads, 2 streams/thread); f32 FMA ... "
std::string describe(const Ceiling& c);

// ---- the per-level loops (ceiling_<level>.cpp), exposed for tests ----
struct CeilingLoops {
  // Sum of the 64-bit words of [p, p + bytes) read as `streams` interleaved streams (p 64-byte
  // aligned, bytes a multiple of 256 * streams); nt: non-temporal loads where the level has them.
  uint64_t (*read)(const uint8_t* p, size_t bytes, int streams, bool nt) = nullptr;
  // iters steps of type t's instruction on every accumulator, inputs all `one` (1.0 or 1): returns
  // the sum of all accumulator lanes, = products_per_iter[t] * iters while that is exact.
  double (*peak)(ActType t, int64_t iters, int one) = nullptr;  // t < kLoopTypes
  int products_per_iter[kLoopTypes] = {};  // multiplies per step (ops = 2 x products)
  const char* instr[kLoopTypes] = {};
  bool has_non_temporal = false;
};
// The loops of that level (false when the build has none for it: another architecture).
bool ceiling_loops(Isa level, CeilingLoops* out);
namespace detail {  // one per file; false where the file is compiled for another architecture
bool ceiling_loops_avx512(CeilingLoops* out);     // ceiling_avx512.cpp
bool ceiling_loops_avx2(CeilingLoops* out);       // ceiling_avx2.cpp
bool ceiling_loops_neon(CeilingLoops* out);       // ceiling_neon.cpp
bool ceiling_loops_neon_dot(CeilingLoops* out);   // ceiling_neon_dot.cpp
bool ceiling_loops_neon_i8mm(CeilingLoops* out);  // ceiling_neon_i8mm.cpp
}  // namespace detail

}  // namespace kimi::kern
