// kimi version (also `kimi --version`): the version, git commit, build type, compiler, the kernel
// ISA in use / best on this CPU, and the backends compiled in.
#include <cstdio>
#include <string>

#include "backend/cpu/dispatch.h"
#include "backend/cpu/matmul_amx.h"
#include "build_info.h"
#include "command.h"
#include "engine_args.h"

namespace {

int cmd_version(int argc, char** argv) {
  if (argc > 1) {
    std::fprintf(stderr, "kimi version: error: takes no arguments (got '%s')\n", argv[1]);
    return 2;
  }
  std::string backends;
  for (const auto& d : kimi::app::compiled_devices()) backends += (backends.empty() ? "" : ", ") + d;
#ifdef KIMI_HAVE_MPI
  backends += ", mpi (distributed)";
#endif
  std::printf("kimi.cpp version %s (commit %s)\n", KIMI_VERSION, KIMI_COMMIT);
  std::printf("build: %s, %s %s\n", KIMI_BUILD_TYPE[0] ? KIMI_BUILD_TYPE : "(no build type)",
#if defined(__clang__)
              "clang", __clang_version__
#elif defined(__GNUC__)
              "gcc", __VERSION__
#else
              "compiler", "unknown"
#endif
  );
  std::printf("cpu kernels: %s in use (best on this cpu: %s; KIMI_ISA selects a lower one)\n",
              kimi::kern::isa_name(kimi::kern::current_isa()), kimi::kern::isa_name(kimi::kern::best_isa()));
  {
    const auto& f = kimi::kern::cpu_features();
    const bool bf16 = kimi::kern::amx_bf16_usable(), int8 = kimi::kern::amx_int8_usable();
    if (bf16 || int8)
      std::printf("intel amx: in use for %s%s%s (KIMI_AMX=0 turns it off)\n", bf16 ? "BF16 weights" : "",
                  bf16 && int8 ? " and " : "", int8 ? "MXFP4 / Q4_0 / Q8_0 / Q4_K / Q5_K weights with >= 16 tokens" : "");
    else
      std::printf("intel amx: %s\n", f.amx_tile && (f.amx_bf16 || f.amx_int8)
                                         ? "present, not in use (KIMI_AMX=0, KIMI_ISA or the OS)"
                                         : "no");
  }
  if (kimi::kern::current_isa() == kimi::kern::Isa::Avx512)
    std::printf("avx512 vbmi: %s\n", kimi::kern::vbmi_kernels() ? "in use for the MXFP4 GEMV"
                                                                  : "no (the MXFP4 GEMV takes its plain AVX-512 form)");
  std::printf("backends: %s\n", backends.c_str());
  return 0;
}

kimi::app::Registrar reg_version("version", "print the version, commit, build type, kernel ISA and backends", cmd_version);

}  // namespace
