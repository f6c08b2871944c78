#!/usr/bin/env bash
# Packs a built `kimi` (Release, Vulkan on) with every shared library it needs into one folder that runs on
# a machine without Debian's packages (the lent GPU machine: NVIDIA driver and CUDA, no Vulkan loader, no
# libfmt or libstdc++ of this build) — docs/gpu.md, "The device check".
#
#   bash bench/gpu/device-pack.sh [KIMI_BINARY] [OUT_DIR]      # defaults: build/kimi, dist/device
#
# OUT_DIR gets:
#   bin/kimi           the program
#   lib/               its libraries as ldd resolves them here (libvulkan.so.1, libstdc++, libfmt, ...),
#                      without the C library itself
#   glibc/             the C library and its loader (ld-linux-x86-64.so.2), used only when the machine's own
#                      C library is older than the one kimi was built against
#   kimi               a launcher: runs bin/kimi with lib/ (and glibc/ when needed)
#   bench_vk_gemv      the same for bin/bench_vk_gemv (the decode GEMV per weight type), when it was built
#                      beside the given kimi (BUILD/bench/bench_vk_gemv)
#   device-check.sh    the check to run there (bench/gpu/device-check.sh)
#   calib.txt          text for `kimi imatrix` (the expert counts --gpu-experts ranks by): README.md
# The folder must stay within the 64 MiB that travel with the working tree to the device machine; the
# script fails when it is larger. dist/ is ignored by git (.gitignore), so `run` needs carry: ["dist/device"].
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(cd "$here/../.." && pwd)"
bin="${1:-$root/build/kimi}"
out="${2:-$root/dist/device}"
[[ -x "$bin" ]] || { echo "device-pack: no executable '$bin' (build kimi first: cmake --build build --target kimi)" >&2; exit 1; }
deps="$(ldd "$bin" 2>/dev/null)" || { echo "device-pack: '$bin' is not a dynamically linked program ldd can read" >&2; exit 1; }
# (searched as a whole string, not through `| grep -q`, which under pipefail can fail on the writer's SIGPIPE)
if [[ "$deps" != *libvulkan.so* ]]; then
  echo "device-pack: '$bin' is built without Vulkan (no libvulkan.so in ldd): configure with -DKIMI_VULKAN=ON" >&2
  exit 1
fi
if [[ "$deps" == *"not found"* ]]; then
  echo "device-pack: libraries of '$bin' are missing here:" >&2
  grep 'not found' <<<"$deps" >&2
  exit 1
fi

# the decode GEMV benchmark per weight type (bench/gpu/bench_vk_gemv.cpp) when it was built beside kimi
gemv="$(dirname "$bin")/bench/bench_vk_gemv"
[[ -x "$gemv" ]] || gemv=""
if [[ -n "$gemv" ]]; then
  gdeps="$(ldd "$gemv" 2>/dev/null)" || { echo "device-pack: ldd cannot read '$gemv'" >&2; exit 1; }
  [[ "$gdeps" != *"not found"* ]] || { echo "device-pack: libraries of '$gemv' are missing here" >&2; exit 1; }
  deps+=$'\n'"$gdeps"
fi
rm -rf "$out.tmp"
mkdir -p "$out.tmp/bin" "$out.tmp/lib" "$out.tmp/glibc"
cp "$bin" "$out.tmp/bin/kimi"
[[ -z "$gemv" ]] || cp "$gemv" "$out.tmp/bin/bench_vk_gemv"
# glibc's own libraries stay apart: loaded with the machine's loader they must be the machine's
is_glibc() {
  case "$1" in
    ld-linux*|libc.so.*|libm.so.*|libpthread.so.*|libdl.so.*|librt.so.*|libresolv.so.*|libutil.so.*) return 0 ;;
    *) return 1 ;;
  esac
}
while read -r line; do
  # "libfoo.so.1 => /path/libfoo.so.1 (0x...)" or "/lib64/ld-linux-x86-64.so.2 (0x...)"
  path=""
  if [[ "$line" == *"=>"* ]]; then path="$(echo "$line" | awk '{print $3}')"; else path="$(echo "$line" | awk '{print $1}')"; fi
  [[ "$path" == /* && -f "$path" ]] || continue
  name="$(basename "$path")"
  if is_glibc "$name"; then cp -L "$path" "$out.tmp/glibc/$name"; else cp -L "$path" "$out.tmp/lib/$name"; fi
done <<<"$deps"
# the loader under its canonical name (ldd may list it through a /lib64 link)
[[ -f "$out.tmp/glibc/ld-linux-x86-64.so.2" ]] || { echo "device-pack: no ld-linux-x86-64.so.2 in ldd's list" >&2; exit 1; }
cp "$here/device-check.sh" "$out.tmp/device-check.sh"
# calibration text for the expert counts of --gpu-experts (kimi imatrix on the device)
cp "$root/README.md" "$out.tmp/calib.txt"
# a launcher per program: bin/PROG with lib/, with the machine's C library when it is new enough, else the packed one
launcher() {
  cat > "$out.tmp/$1" <<EOF
#!/usr/bin/env bash
# runs the packed $1: with the machine's C library when it is new enough, else with the packed one
d="\$(cd "\$(dirname "\${BASH_SOURCE[0]}")" && pwd)"
if LD_LIBRARY_PATH="\$d/lib" "\$d/bin/kimi" version >/dev/null 2>&1; then
  LD_LIBRARY_PATH="\$d/lib\${LD_LIBRARY_PATH:+:\$LD_LIBRARY_PATH}" exec "\$d/bin/$1" "\$@"
fi
exec "\$d/glibc/ld-linux-x86-64.so.2" --library-path "\$d/lib:\$d/glibc\${LD_LIBRARY_PATH:+:\$LD_LIBRARY_PATH}" "\$d/bin/$1" "\$@"
EOF
  chmod +x "$out.tmp/$1"
}
launcher kimi
[[ -z "$gemv" ]] || launcher bench_vk_gemv
chmod +x "$out.tmp/device-check.sh"
"$out.tmp/kimi" version >/dev/null || { echo "device-pack: the packed kimi does not start here" >&2; exit 1; }
bytes=$(du -sb "$out.tmp" | awk '{print $1}')
limit=$((64 * 1024 * 1024))
if (( bytes > limit * 9 / 10 )); then
  echo "device-pack: $out.tmp holds $bytes bytes, over 90 % of the 64 MiB that travel to the device machine" >&2
  exit 1
fi
rm -rf "$out"
mv "$out.tmp" "$out"
echo "device-pack: $out ($((bytes / 1024)) KiB: bin/kimi, $(ls "$out/lib" | wc -l) libraries in lib/, glibc/ as a fallback)"
