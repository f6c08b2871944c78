#!/usr/bin/env bash
# Target libraries for the cross builds that Debian ships no cross package for, built once into
# $KIMI_DEPS_DIR/<target> (default build-deps/, git-ignored):
#   - PCRE2 from Debian's source package (apt-get source; a deb-src entry is added if missing),
#   - GoogleTest from Debian's googletest package (/usr/src/googletest),
#   - the header-only libraries (fmt in header-only mode, nlohmann-json, CLI11, cpp-httplib) as links
#     to Debian's headers in an include folder of their own (never /usr/include itself, whose C
#     library headers are the host's).
# usage: scripts/cross-deps.sh aarch64-linux-gnu|x86_64-w64-mingw32
set -euo pipefail
cd "$(dirname "$0")/.."
target=${1:?usage: cross-deps.sh aarch64-linux-gnu|x86_64-w64-mingw32}
root=$(pwd)
export CCACHE_BASEDIR=${CCACHE_BASEDIR:-$root}
deps=${KIMI_DEPS_DIR:-$root/build-deps}
prefix=$deps/$target
toolchain=$root/cmake/toolchains/$target.cmake
[[ -f $toolchain ]] || { echo "cross-deps: no toolchain file $toolchain" >&2; exit 2; }
stamp=$prefix/.complete-v1
if [[ -f $stamp ]]; then echo "cross-deps: $prefix up to date"; exit 0; fi
mkdir -p "$deps/src" "$prefix/include"

# PCRE2 source (the version of Debian's libpcre2-dev)
pcre_src=$(ls -d "$deps"/src/pcre2-*/ 2>/dev/null | head -n1 || true)
if [[ -z $pcre_src ]]; then
  if [[ -z $(apt-get source --download-only --print-uris pcre2 2>/dev/null | grep orig) ]]; then
    echo "cross-deps: adding a deb-src entry for Debian's source packages"
    printf '%s\n' 'Types: deb-src' 'URIs: http://deb.debian.org/debian' 'Suites: bookworm' 'Components: main' \
      'Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg' > /etc/apt/sources.list.d/kimi-deb-src.sources
    apt-get update -qq
  fi
  (cd "$deps/src" && apt-get source --download-only pcre2 2>&1 | grep -v '^W: Download is performed unsandboxed' | tail -n 2)
  tar -C "$deps/src" -xzf "$(ls "$deps"/src/pcre2_*.orig.tar.gz | head -n1)"
  pcre_src=$(ls -d "$deps"/src/pcre2-*/ | head -n1)
fi

cmake_target() {  # source-dir build-dir [cmake args...]
  local src=$1 bld=$2; shift 2
  cmake -S "$src" -B "$bld" -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_TOOLCHAIN_FILE="$toolchain" \
    -DCMAKE_INSTALL_PREFIX="$prefix" -DCMAKE_C_COMPILER_LAUNCHER=ccache -DCMAKE_CXX_COMPILER_LAUNCHER=ccache \
    -DCMAKE_CROSSCOMPILING_EMULATOR= "$@" >/dev/null
  cmake --build "$bld" -j "${JOBS:-$(nproc)}" >/dev/null
  cmake --install "$bld" >/dev/null
}
echo "cross-deps: PCRE2 for $target"
cmake_target "$pcre_src" "$deps/build-pcre2-$target" -DBUILD_SHARED_LIBS=OFF -DPCRE2_BUILD_PCRE2_8=ON \
  -DPCRE2_BUILD_PCRE2_16=OFF -DPCRE2_BUILD_PCRE2_32=OFF -DPCRE2_SUPPORT_JIT=ON -DPCRE2_SUPPORT_UNICODE=ON \
  -DPCRE2_BUILD_PCRE2GREP=OFF -DPCRE2_BUILD_TESTS=OFF -DPCRE2_SUPPORT_LIBBZ2=OFF -DPCRE2_SUPPORT_LIBZ=OFF \
  -DPCRE2_SUPPORT_LIBEDIT=OFF -DPCRE2_SUPPORT_LIBREADLINE=OFF
echo "cross-deps: GoogleTest for $target"
cmake_target /usr/src/googletest "$deps/build-gtest-$target" -DBUILD_GMOCK=ON -DINSTALL_GTEST=ON \
  -Dgtest_force_shared_crt=ON
for h in fmt nlohmann CLI httplib.h; do ln -sfn "/usr/include/$h" "$prefix/include/$h"; done
touch "$stamp"
echo "cross-deps: $prefix ready"
