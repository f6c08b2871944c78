#!/usr/bin/env bash
# Release packages with CPack (cmake/KimiPackage.cmake) into dist/:
#   kimi-VERSION-linux-x86_64.tar.gz and kimi_VERSION_amd64.deb   (native build, $BUILD_DIR or build/)
#   kimi-VERSION-linux-aarch64.tar.gz                              (build-arm/, cross, static deps)
#   kimi-VERSION-windows-x86_64.zip                                (build-win/, MinGW-w64, static)
# Each holds the kimi program, README.md, LICENSE and docs/; the script checks that, and that the
# packaged programs run (`kimi --help`; the aarch64 one under qemu, the Windows one under Wine).
# usage: scripts/package.sh [native|aarch64|windows|all]   (default all)
set -euo pipefail
cd "$(dirname "$0")/.."
what=${1:-all}
root=$(pwd)
dist=$root/dist
mkdir -p "$dist"
JOBS=${JOBS:-$(nproc)}

check_archive() {  # file program-name
  local f=$1 prog=$2 list
  case $f in
    *.tar.gz) list=$(tar -tzf "$f") ;;
    *.zip) list=$(unzip -Z1 "$f") ;;
    *.deb) list=$(dpkg-deb -c "$f" | awk '{print $NF}') ;;
  esac
  for need in "$prog" README.md LICENSE docs/architecture.md docs/platforms.md; do
    grep -q -E "(^|/)${need//./\\.}$" <<<"$list" || { echo "package: $f lacks $need" >&2; exit 1; }
  done
  echo "package: $(basename "$f") ($(du -h "$f" | cut -f1)) holds $prog, README.md, LICENSE, docs/"
}

run_packaged() {  # archive kind: unpack and run the program's --help
  local f=$1 kind=$2 tmp
  tmp=$(mktemp -d)
  case $f in
    *.tar.gz) tar -xzf "$f" -C "$tmp" ;;
    *.zip) (cd "$tmp" && unzip -q "$f") ;;
  esac
  local exe
  exe=$(find "$tmp" -name 'kimi' -type f -o -name 'kimi.exe' -type f | head -n1)
  case $kind in
    native) "$exe" --help >/dev/null ;;
    aarch64) QEMU_LD_PREFIX=/usr/aarch64-linux-gnu qemu-aarch64 "$exe" --help >/dev/null ;;
    windows) WINEDEBUG=-all WINEPREFIX=${WINEPREFIX:-$root/build-win/wineprefix} wine "$exe" --help >/dev/null ;;
  esac
  rm -rf "$tmp"
  echo "package: the packaged $kind program runs"
}

native() {
  local dir=${BUILD_DIR:-build}
  cmake -S . -B "$dir" -G Ninja -DCMAKE_BUILD_TYPE=Release -DKIMI_PACKAGE_DEB=ON >/dev/null
  cmake --build "$dir" -j "$JOBS" --target kimi
  (cd "$dir" && cpack -B "$dist" >/dev/null)
  local v
  v=$(ls -t "$dist"/kimi-*-linux-x86_64.tar.gz | head -n1)
  check_archive "$v" kimi
  run_packaged "$v" native
  check_archive "$(ls -t "$dist"/kimi_*_amd64.deb | head -n1)" kimi
}

cross() {  # kind build-dir target generator
  local kind=$1 dir=$2 target=$3
  bash scripts/cross-deps.sh "$target"
  cmake -S . -B "$dir" -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_TOOLCHAIN_FILE="$root/cmake/toolchains/$target.cmake" \
    -DKIMI_CROSS_PREFIX="$root/build-deps/$target" -DKIMI_BENCH=OFF -DKIMI_VULKAN=OFF >/dev/null
  cmake --build "$dir" -j "$JOBS" --target kimi
  (cd "$dir" && cpack -B "$dist" >/dev/null)
}

case $what in
  native) native ;;
  aarch64|all|windows) ;;
  *) echo "usage: scripts/package.sh [native|aarch64|windows|all]" >&2; exit 2 ;;
esac
if [[ $what == aarch64 || $what == all ]]; then
  cross aarch64 build-arm aarch64-linux-gnu
  f=$(ls -t "$dist"/kimi-*-linux-aarch64.tar.gz | head -n1)
  check_archive "$f" kimi
  run_packaged "$f" aarch64
fi
if [[ $what == windows || $what == all ]]; then
  cross windows build-win x86_64-w64-mingw32
  f=$(ls -t "$dist"/kimi-*-windows-x86_64.zip | head -n1)
  check_archive "$f" kimi.exe
  run_packaged "$f" windows
fi
[[ $what == all ]] && native
ls -l "$dist"
