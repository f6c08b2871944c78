#!/usr/bin/env bash
# Configure and build kimi.cpp (Release) into ./build (BUILD_DIR overrides it).
#   scripts/build.sh [-DOPTION=VALUE ...] [TARGET ...]
# Arguments that start with '-' go to the CMake configure step; the others are targets to build
# (all targets when none is given). Example: scripts/build.sh -DKIMI_NATIVE=ON kimi
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD_DIR=${BUILD_DIR:-build}
JOBS=${JOBS:-$(nproc)}
config=() targets=()
for arg in "$@"; do
  if [[ $arg == -* ]]; then config+=("$arg"); else targets+=(--target "$arg"); fi
done
cmake -S . -B "$BUILD_DIR" -G Ninja -DCMAKE_BUILD_TYPE=Release "${config[@]}" >/dev/null
cmake --build "$BUILD_DIR" -j "$JOBS" "${targets[@]}"
