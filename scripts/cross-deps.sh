#!/usr/bin/env bash
# Target libraries for the cross builds that Debian ships no cross package for, built once into
# $KIMI_DEPS_DIR/<target> (default build-deps/, git-ignored):
#   - PCRE2 from Debian's source package (apt-get source; when the machine has no deb-src entry, one
#     is derived from its own apt sources: every enabled `deb` entry of the release's suites, as
#     `deb-src`, same archive and keyring — `cross-deps.sh --print-deb-src` shows what it would add),
#   - GoogleTest from Debian's googletest package (/usr/src/googletest),
#   - the header-only libraries (fmt in header-only mode, nlohmann-json, CLI11, cpp-httplib) as links
#     to Debian's headers in an include folder of their own (never /usr/include itself, whose C
#     library headers are the host's).
# usage: scripts/cross-deps.sh aarch64-linux-gnu|x86_64-w64-mingw32|--print-deb-src
set -euo pipefail
cd "$(dirname "$0")/.."

# deb-src entries derived from the machine's configured apt sources (APT_ETC, default /etc/apt):
# /etc/apt/sources.list and sources.list.d/*.list (one-line format) and sources.list.d/*.sources
# (deb822). Every enabled `deb` entry whose suite is the release's (VERSION_CODENAME of
# /etc/os-release, or CODENAME) or one of its pockets (CODENAME-updates, CODENAME-security, ...)
# becomes the same entry as `deb-src`: same URIs, suites, components and options (Signed-By...).
# Prints two sections, "# list" (one-line entries) and "# sources" (deb822 stanzas).
derive_deb_src() {
  local etc=${APT_ETC:-/etc/apt} codename=${CODENAME:-}
  if [[ -z $codename ]]; then codename=$(. /etc/os-release && echo "${VERSION_CODENAME:-}"); fi
  [[ -n $codename ]] || { echo "cross-deps: no VERSION_CODENAME in /etc/os-release (set CODENAME)" >&2; return 1; }
  local lists=() sources=() f
  [[ -f $etc/sources.list ]] && lists+=("$etc/sources.list")
  for f in "$etc"/sources.list.d/*.list; do [[ -f $f ]] && lists+=("$f"); done
  for f in "$etc"/sources.list.d/*.sources; do [[ -f $f ]] && sources+=("$f"); done
  echo "# list"
  ((${#lists[@]})) && awk -v cn="$codename" '
    { sub(/#.*/, "") }
    $1 == "deb" {
      i = 2; opts = ""
      if ($2 ~ /^\[/) { while (i <= NF) { opts = opts (opts == "" ? "" : " ") $i; if ($i ~ /\]$/) { i++; break } i++ } }
      uri = $i; suite = $(i + 1)
      if (suite != cn && index(suite, cn "-") != 1) next
      line = "deb-src" (opts == "" ? "" : " " opts) " " uri
      for (j = i + 1; j <= NF; j++) line = line " " $j
      print line
    }' "${lists[@]}"
  echo "# sources"
  ((${#sources[@]})) && awk -v cn="$codename" '
    function flush(   k, n, t, keep, out, sn, s, i) {
      if (nk == 0) return
      n = split(val["types"], t, " "); keep = 0
      for (i = 1; i <= n; i++) if (t[i] == "deb") keep = 1
      if (tolower(val["enabled"]) == "no") keep = 0
      sn = split(val["suites"], s, " "); out = ""
      for (i = 1; i <= sn; i++) if (s[i] == cn || index(s[i], cn "-") == 1) out = out (out == "" ? "" : " ") s[i]
      if (keep && out != "") {
        for (k = 1; k <= nk; k++) {
          if (lk[keys[k]] == "types") print "Types: deb-src"
          else if (lk[keys[k]] == "suites") print "Suites: " out
          else print keys[k] ": " raw[keys[k]]
        }
        print ""
      }
      nk = 0; delete val; delete raw; delete keys; delete lk
    }
    FNR == 1 { flush() }
    /^[ \t]*#/ { next }
    /^[ \t]*$/ { flush(); next }
    /^[ \t]/ { if (cur != "") { raw[cur] = raw[cur] "\n" $0; val[lk[cur]] = val[lk[cur]] " " $0 } next }
    {
      k = $0; sub(/:.*/, "", k); v = $0; sub(/^[^:]*:[ \t]*/, "", v)
      cur = k; keys[++nk] = k; lk[k] = tolower(k); raw[k] = v; val[lk[k]] = v
    }
    END { flush() }' "${sources[@]}"
  return 0
}
if [[ ${1:-} == --print-deb-src ]]; then derive_deb_src; exit; fi
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
    src=$(derive_deb_src)
    list=$(sed -n '/^# list$/,/^# sources$/{/^#/d;p}' <<<"$src")
    stanzas=$(sed -n '/^# sources$/,${/^# sources$/d;p}' <<<"$src")
    if [[ -z $list && -z ${stanzas//$'\n'/} ]]; then
      echo "cross-deps: no deb-src entry and no apt source of this release to derive one from: add a deb-src" \
           "entry for your archive to /etc/apt/sources.list.d/ (see scripts/cross-deps.sh --print-deb-src)" >&2
      exit 1
    fi
    echo "cross-deps: adding deb-src entries derived from this machine's apt sources (source package pcre2)"
    SUDO=""; [[ $(id -u) -ne 0 ]] && SUDO="sudo"
    [[ -z $list ]] || $SUDO tee /etc/apt/sources.list.d/kimi-deb-src.list <<<"$list" >/dev/null
    [[ -z ${stanzas//$'\n'/} ]] || $SUDO tee /etc/apt/sources.list.d/kimi-deb-src.sources <<<"$stanzas" >/dev/null
    $SUDO apt-get update -qq
  fi
  # the source version of the installed libpcre2-dev first, then every other one the archive lists
  # (newest first): an archive may list a version whose files it no longer serves
  versions=$({ dpkg-query -W -f='${source:Version}\n' libpcre2-dev 2>/dev/null || true
               apt-cache showsrc pcre2 | sed -n 's/^Version: //p' | sort -rV; } | awk 'NF && !seen[$0]++')
  got=0
  for v in $versions; do
    if (cd "$deps/src" && apt-get source --download-only "pcre2=$v" >"$deps/src/apt-source.log" 2>&1); then
      echo "cross-deps: pcre2 $v source"; got=1; break
    fi
    echo "cross-deps: pcre2 $v: $(grep -m1 '^E:' "$deps/src/apt-source.log" || tail -n1 "$deps/src/apt-source.log")"
  done
  ((got)) || { echo "cross-deps: could not download the pcre2 source package" >&2; exit 1; }
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
