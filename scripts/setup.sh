#!/usr/bin/env bash
# Install the Debian 12 packages kimi.cpp needs (idempotent: only what is missing is installed).
#   scripts/setup.sh          what building and running `kimi` needs, with the build dependencies of
#                             every backend (Vulkan headers + glslc, Open MPI) — scripts/demo.sh
#   scripts/setup.sh --test   adds what the tests, the fuzzers and the cross builds need, and the npm
#                             packages of the tests — scripts/test.sh
set -euo pipefail
cd "$(dirname "$0")/.."
TEST=0
for arg in "$@"; do
  case $arg in
    --test) TEST=1 ;;
    -h|--help) sed -n '2,6p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "setup: unknown option '$arg' (expected --test)" >&2; exit 2 ;;
  esac
done

# ---- build and run kimi ----
PKGS=(build-essential cmake ninja-build ccache pkg-config git
      nlohmann-json3-dev libfmt-dev libcli11-dev libpcre2-dev
      libnuma-dev  # --numa distribute|isolate|numactl (optional at build time: src/util/numa.cpp)
      libedit-dev  # line editing + history in `kimi chat` (optional: found by CMake, native Linux only)
      libpng-dev libjpeg62-turbo-dev libwebp-dev libgif-dev  # image decoders of the vision path (optional: found by CMake)
      libvulkan-dev glslc  # the Vulkan GPU backend (docs/gpu.md)
      libopenmpi-dev openmpi-bin)  # MPI: several processes or machines (docs/distributed.md)

# ---- tests, fuzzing, cross builds (--test) ----
TEST_PKGS=(libgtest-dev libgmock-dev googletest time libcpp-httplib-dev  # tests/ (httplib: HTTP client side)
      python3-jsonschema  # the tool-schema suite's independent validator (tests/schema/schema_suite.py)
      mesa-vulkan-drivers vulkan-tools  # lavapipe, Mesa's software GPU: the GPU tests (KIMI_REQUIRE_VULKAN=1)
      g++-aarch64-linux-gnu qemu-user g++-mingw-w64-x86-64 wine wine64 unzip curl  # cross builds + emulation: scripts/cross-test.sh (curl: kimi serve under Wine)
      clang libclang-rt-dev llvm  # clang + its sanitizer/libFuzzer runtimes + llvm-symbolizer: scripts/fuzz.sh
      chromium)  # the web chat page's browser test (tests/web, with playwright-core from npm)
((TEST)) && PKGS+=("${TEST_PKGS[@]}")

missing=()
for p in "${PKGS[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((TEST)); then
  # Node.js + npm (the npm packages below): Debian's packages, unless a node/npm is already
  # installed (e.g. a nodejs build that bundles npm).
  command -v node >/dev/null || missing+=(nodejs)
  command -v npm >/dev/null || missing+=(npm)
fi
if ((${#missing[@]})); then
  SUDO=""; [[ $(id -u) -ne 0 ]] && SUDO="sudo"
  echo "setup: installing ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  $SUDO apt-get update -qq
  $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi
echo "setup: all packages present$( ((TEST)) && echo ' (with the test packages)')"
((TEST)) || exit 0

# ---- npm packages of the tests (--test): one `npm ci` per folder with a package-lock.json ----
# the real tiktoken (npm) for the tokenizer's golden tests and benchmark
if [[ ! -d tools/tiktoken/node_modules/tiktoken ]]; then
  npm ci --prefix tools/tiktoken --no-audit --no-fund --loglevel=error
fi
# playwright-core (npm) drives Debian's chromium in the web chat page's test (tests/web/webui_test.js)
if [[ ! -d tests/web/node_modules/playwright-core ]]; then
  npm ci --prefix tests/web --no-audit --no-fund --loglevel=error
fi
# the official Anthropic and OpenAI SDKs against kimi serve's /v1/messages and /v1/responses (tests/agents/sdk_test.js)
if [[ ! -d tests/agents/node_modules/@anthropic-ai/sdk ]]; then
  npm ci --prefix tests/agents --no-audit --no-fund --loglevel=error
fi
# Claude Code and Codex CLI for tests/agents/cli_test.js (~800 MB with their native binaries): into a
# cache folder outside the tree, once (KIMI_AGENT_CLI_DIR, else ~/.cache/kimi.cpp/agent-clis)
AGENT_CLI_DIR="${KIMI_AGENT_CLI_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/kimi.cpp/agent-clis}"
if [[ ! -x "$AGENT_CLI_DIR/node_modules/.bin/claude" || ! -x "$AGENT_CLI_DIR/node_modules/.bin/codex" ]]; then
  mkdir -p "$AGENT_CLI_DIR"
  cp tests/agents/cli/package.json tests/agents/cli/package-lock.json "$AGENT_CLI_DIR/"
  npm ci --prefix "$AGENT_CLI_DIR" --no-audit --no-fund --loglevel=error
fi
