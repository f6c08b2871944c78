#!/usr/bin/env bash
# Install the Debian 12 packages kimi.cpp needs to build and test (idempotent).
set -euo pipefail
cd "$(dirname "$0")/.."
PKGS=(build-essential cmake ninja-build ccache pkg-config git
      nlohmann-json3-dev libfmt-dev libcli11-dev libpcre2-dev libcpp-httplib-dev
      libnuma-dev  # --numa distribute|isolate|numactl (optional at build time: src/util/numa.cpp)
      libgtest-dev libgmock-dev googletest time
      libedit-dev  # line editing + history in `kimi chat` (optional: found by CMake, native Linux only)
      libopenmpi-dev openmpi-bin  # MPI: the -DKIMI_MPI=ON build (docs/distributed.md)
      g++-aarch64-linux-gnu qemu-user g++-mingw-w64-x86-64 wine wine64 unzip curl  # cross builds + emulation: scripts/cross-test.sh (curl: kimi serve under Wine)
      clang libclang-rt-dev llvm  # clang + its sanitizer/libFuzzer runtimes + llvm-symbolizer: scripts/fuzz.sh
      libvulkan-dev glslc mesa-vulkan-drivers vulkan-tools
      chromium)  # the web chat page's browser test (tests/web, with playwright-core from npm)  # Vulkan backend + lavapipe (Mesa's software GPU) for its tests
missing=()
for p in "${PKGS[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
# Node.js + npm (for the real tiktoken used by the tokenizer's golden tests): Debian's packages,
# unless a node/npm is already installed (e.g. a nodejs build that bundles npm).
command -v node >/dev/null || missing+=(nodejs)
command -v npm >/dev/null || missing+=(npm)
if ((${#missing[@]})); then
  SUDO=""; [[ $(id -u) -ne 0 ]] && SUDO="sudo"
  echo "setup: installing ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  $SUDO apt-get update -qq
  $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi
echo "setup: all packages present"
# the real tiktoken (npm) for the tokenizer's golden tests and benchmark
if [[ ! -d tools/tiktoken/node_modules/tiktoken ]]; then
  npm ci --prefix tools/tiktoken --no-audit --no-fund --loglevel=error
fi
# playwright-core (npm) drives Debian's chromium in the web chat page's test (tests/web/webui_test.js)
if [[ ! -d tests/web/node_modules/playwright-core ]]; then
  npm ci --prefix tests/web --no-audit --no-fund --loglevel=error
fi
