#!/usr/bin/env bash
# Compile-check every source for aarch64 (NEON target) with Debian's cross compiler: the x86 SIMD
# files must compile to nothing there and the portable paths must build. Syntax/semantic check
# only (no aarch64 libraries are installed, so nothing is linked).
set -euo pipefail
cd "$(dirname "$0")/.."
command -v aarch64-linux-gnu-g++ >/dev/null || apt-get install -y -qq g++-aarch64-linux-gnu
fails=0
for f in src/*/*.cpp src/backend/cpu/*.cpp app/*.cpp; do
  if ! aarch64-linux-gnu-g++ -std=c++20 -O2 -fsyntax-only -Isrc -Iapp -I/usr/include -DFMT_HEADER_ONLY "$f"; then
    echo "check-arm: FAILED $f"; fails=$((fails + 1))
  fi
done
echo "check-arm: $fails failures"
exit $((fails > 0))
