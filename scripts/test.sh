#!/usr/bin/env bash
# Set up, build and run every test (README: "run all tests").
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh --test   # adds the test, fuzzing and cross-build packages
bash scripts/build.sh -DKIMI_TESTS=ON   # everything, tests included (fails if GoogleTest is missing)
# the GPU tests must find a Vulkan device here (setup installs lavapipe): no silent skip
export KIMI_REQUIRE_VULKAN=${KIMI_REQUIRE_VULKAN:-1}
(cd "${BUILD_DIR:-build}" && ctest --output-on-failure -j "$(nproc)" --timeout 900)
# the cross builds tested under emulation: aarch64 under qemu-aarch64 (two CPU models), Windows under
# Wine (scripts/cross-test.sh, docs/platforms.md); KIMI_CROSS=0 skips them, =aarch64|windows picks one
KIMI_NATIVE_BIN="${BUILD_DIR:-build}/kimi" bash scripts/cross-test.sh
# every fuzz target for a bounded time (KIMI_FUZZ_SECONDS per target, default 30; 0 skips)
if [[ ${KIMI_FUZZ_SECONDS:-30} != 0 ]]; then
  bash scripts/fuzz.sh "${KIMI_FUZZ_SECONDS:-30}"
fi
