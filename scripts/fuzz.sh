#!/usr/bin/env bash
# Build the libFuzzer harnesses (fuzz/, clang + ASan + UBSan), replay every regression input, then
# run each target for SECONDS (default 30; FUZZ_JOBS targets at a time, default 2). Fails on any
# crash, sanitizer report, timeout, out-of-memory or harness mismatch. scripts/test.sh runs it in CI.
#   bash scripts/fuzz.sh            # CI: 30 s per target
#   bash scripts/fuzz.sh 3600       # longer runs; the corpus grows in fuzz/corpus-work/ (git-ignored)
#   FUZZ_TARGETS="chat api" bash scripts/fuzz.sh 120
set -euo pipefail
cd "$(dirname "$0")/.."
SECONDS_PER_TARGET=${1:-30}
BUILD=${FUZZ_BUILD_DIR:-build-fuzz}
JOBS=${FUZZ_JOBS:-2}
WORK=${FUZZ_WORK:-fuzz/corpus-work}
TARGETS=(${FUZZ_TARGETS:-gguf safetensors hf_config model tiktoken tokenizer_config chat api grammar json_schema image http slot_files})
t0=$(date +%s)

command -v clang++ >/dev/null || { echo "fuzz: clang++ not found (bash scripts/setup.sh --test installs it)" >&2; exit 1; }
CC=clang CXX=clang++ cmake -S fuzz -B "$BUILD" -G Ninja >/dev/null
mkdir -p "$BUILD"
if ! cmake --build "$BUILD" -j "$(nproc)" >"$BUILD/build.log" 2>&1; then
  echo "fuzz: building the fuzz harnesses failed:" >&2
  grep -E -A5 "error|FAILED" "$BUILD/build.log" | head -n 60 >&2 || tail -n 60 "$BUILD/build.log" >&2
  exit 1
fi
tail -n 1 "$BUILD/build.log"
t_build=$(( $(date +%s) - t0 ))

# seeds: made from the project's own files at run time (see docs/testing.md)
SEEDS=$(mktemp -d "${TMPDIR:-/tmp}/kimi-fuzz-seeds.XXXXXX")
trap 'rm -rf "$SEEDS"' EXIT
mkdir -p "$SEEDS/gguf"
"$BUILD/fuzz_seeds" "$SEEDS" >/dev/null
"$BUILD/fuzz_gguf_seeds" "$SEEDS/gguf"
cp tests/data/gguf-fuzz/* "$SEEDS/gguf/"
mkdir -p "$SEEDS/image"  # image seeds: the images in data/images (one of each format the docs use)
cp data/images/* "$SEEDS/image/"
# the HTTP reader: the first byte picks the server (odd: the API key is required), then the bytes sent
mkdir -p "$SEEDS/http"
printf '\0GET /health HTTP/1.1\r\nHost: x\r\n\r\n' >"$SEEDS/http/get"
printf '\0POST /x HTTP/1.1\r\nContent-Length: 5\r\n\r\nhelloGET /health HTTP/1.0\r\n\r\n' >"$SEEDS/http/pipelined"
printf '\0POST /stream HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n5;x\r\nhello\r\n0\r\nT: 1\r\n\r\n' >"$SEEDS/http/chunked"
printf '\1POST /x HTTP/1.1\r\nContent-Length: 4000\r\n\r\nabc' >"$SEEDS/http/keyless"
printf '\1HEAD /x HTTP/1.1\r\nx-api-key: k\r\nExpect: 100-continue\r\nContent-Length: 2\r\n\r\n{}' >"$SEEDS/http/keyed"
# the slot / prompt-cache file readers (fuzz/fuzz_slot_files.cpp): the first byte picks slot file (even)
# or cache file (odd) and how the rest edits the harness's valid file (2: (u32 offset, byte) edits,
# 4: checksum made valid again, 8: first cut to a u32 length); 0: the rest is the whole file
mkdir -p "$SEEDS/slot_files"
printf '\2' >"$SEEDS/slot_files/valid-slot"
printf '\3' >"$SEEDS/slot_files/valid-cache"
printf '\6\30\0\0\0\377' >"$SEEDS/slot_files/slot-n-tokens"
printf '\7\34\0\0\0\0' >"$SEEDS/slot_files/cache-no-segments"
printf '\6\130\0\0\0\377\131\0\0\0\177' >"$SEEDS/slot_files/slot-row-nan"
printf '\16\100\0\0\0' >"$SEEDS/slot_files/slot-cut"
printf '\0KIMIPC1\n0123456789abcdef' >"$SEEDS/slot_files/raw-header"

max_len() {
  case $1 in
    gguf) echo 2048 ;; model) echo 256 ;; image) echo 65536 ;; tokenizer_config | json_schema) echo 65536 ;; grammar) echo 16384 ;; *) echo 8192 ;;
  esac
}
dict() {
  case $1 in
    gguf | chat) echo "-dict=fuzz/$1.dict" ;; hf_config | tokenizer_config | api | json_schema) echo "-dict=fuzz/json.dict" ;;
    grammar) echo "-dict=fuzz/gbnf.dict" ;;
  esac
}
OPTS=(-timeout=20 -malloc_limit_mb=1024 -rss_limit_mb=2048 -print_final_stats=1)

# 1. regression inputs (every crash found so far): each must run clean
fail=0
for t in "${TARGETS[@]}"; do
  files=()
  [[ -d fuzz/regressions/$t ]] && files+=(fuzz/regressions/$t/*)
  [[ $t == gguf ]] && files+=(tests/data/gguf-fuzz/*)
  ((${#files[@]})) || continue
  if ! "$BUILD/fuzz_$t" "${OPTS[@]}" "${files[@]}" >"$SEEDS/replay-$t.log" 2>&1; then
    echo "fuzz: REGRESSION in fuzz_$t (replaying fuzz/regressions/$t):" >&2
    tail -n 30 "$SEEDS/replay-$t.log" >&2
    fail=1
  else
    echo "fuzz: fuzz_$t replayed ${#files[@]} regression inputs"
  fi
done

# 2. fuzz each target for SECONDS_PER_TARGET, JOBS at a time
run_one() {
  local t=$1 log=$SEEDS/run-$1.log
  mkdir -p "$WORK/$t" "$WORK/artifacts/$t"
  if "$BUILD/fuzz_$t" "${OPTS[@]}" -max_total_time="$SECONDS_PER_TARGET" -max_len="$(max_len "$t")" $(dict "$t") \
      -artifact_prefix="$WORK/artifacts/$t/" "$WORK/$t" "$SEEDS/$t" >"$log" 2>&1; then
    echo "ok" >"$log.rc"
  else
    echo "failed" >"$log.rc"
  fi
}
running=0
for t in "${TARGETS[@]}"; do
  run_one "$t" &
  running=$((running + 1))
  if ((running >= JOBS)); then wait -n || true; running=$((running - 1)); fi
done
wait || true

printf '%-18s %12s %8s %10s %s\n' target executions seconds exec/s result
for t in "${TARGETS[@]}"; do
  log=$SEEDS/run-$t.log
  execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -n 1)
  secs=$(sed -n 's/^Done [0-9]* runs in \([0-9]*\) second.*/\1/p' "$log" | tail -n 1)
  rate=$(sed -n 's/^stat::average_exec_per_sec: *//p' "$log" | tail -n 1)
  printf '%-18s %12s %8s %10s %s\n' "$t" "${execs:-?}" "${secs:-?}" "${rate:-?}" "$(cat "$log.rc")"
  if [[ $(cat "$log.rc") != ok ]]; then
    fail=1
    echo "---- fuzz_$t failed; the input is in $WORK/artifacts/$t/ (add it to fuzz/regressions/$t/ once fixed):" >&2
    grep -E -A 25 'ERROR:|runtime error|fuzz_[a-z_]*: |fuzz harness:' "$log" | head -n 60 >&2 || tail -n 40 "$log" >&2
  fi
done
echo "fuzz: build ${t_build}s, total $(( $(date +%s) - t0 ))s"
exit $fail
