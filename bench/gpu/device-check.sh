#!/usr/bin/env bash
# The device check (docs/gpu.md, "The device check"): runs from the folder bench/gpu/device-pack.sh made,
# on a machine with a GPU (or lavapipe, with --tiny, as CI does), and writes what it measured to OUTDIR.
#
#   bash dist/device/device-check.sh OUTDIR [--tiny]
#
# 1. synthesizes a model with Kimi-K3.1's real layer shapes (`kimi synth --preset k3-layers --layers 4`:
#    hidden 7168, 96 heads, 1 MLA + 2 KDA layers + the dense layer 0, 64 routed experts of 3072 x 3584 in
#    MXFP4, top 16, the Zipf router) and converts it (9.3 GiB); --tiny: the tiny preset (CI, lavapipe);
# 2. runs `kimi bench` full-GPU (-ngl 99), hybrid (--cpu-moe: routed experts in RAM, on the CPU) and hybrid
#    with --gpu-experts auto (the experts ranked by `kimi imatrix` over calib.txt) when this kimi has it: pp512, pp4096 and tg128 (--tiny: pp8, pp16, tg4);
#    then hybrid tg128 with --hybrid-overlap off, the A/B of the overlap;
# 0. (first) the decode GEMV per weight type alone (bench_vk_gemv, when the pack has it);
# 3. OUTDIR/summary.md: t/s per run and, from each run's own measurement of the device (read bandwidth,
#    f32 FMA peak), decode as % of the bandwidth and prefill as % of the peak; OUTDIR/*.log: each step's
#    whole output. Everything stops by KIMI_CHECK_BUDGET_S (default 450 s: under 8 minutes in all).
# Exit status: 0 when every run that started ended well; the summary says which were skipped for time.
set -uo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
out="${1:?usage: device-check.sh OUTDIR [--tiny]}"
tiny=0
[[ "${2:-}" == "--tiny" ]] && tiny=1
mkdir -p "$out"
out="$(cd "$out" && pwd)"
kimi="$here/kimi"
[[ -x "$kimi" ]] || { echo "device-check: no packed kimi at $kimi (run bench/gpu/device-pack.sh first)" >&2; exit 1; }
budget="${KIMI_CHECK_BUDGET_S:-450}"
t_start=$(date +%s)
left() { echo $(( budget - ($(date +%s) - t_start) )); }
summary="$out/summary.md"
fail=0

# the NVIDIA driver's Vulkan ICD where the lent machine keeps it (docs of the device tool)
if [[ -z "${VK_DRIVER_FILES:-}${VK_ICD_FILENAMES:-}" && -f /usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json ]]; then
  export VK_DRIVER_FILES=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json
  for d in /usr/local/nvidia/lib64 /usr/local/nvidia/lib; do
    [[ -d "$d" ]] && export LD_LIBRARY_PATH="$d${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  done
fi

{
  echo "# kimi.cpp device check ($(date -u +%Y-%m-%dT%H:%M:%SZ))"
  echo
  echo '```'
  "$kimi" version 2>&1
  command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>&1
  echo "cpu: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ //'), $(nproc) cores"
  echo '```'
} > "$summary"

work="$out/work"
rm -rf "$work"
mkdir -p "$work"
if (( tiny )); then
  synth_args=(--preset tiny --router zipf)
  pp_small=8 pp_big=16 tg=4
else
  synth_args=(--preset k3-layers --layers 4 --router zipf)
  pp_small=512 pp_big=4096 tg=128
fi
step() {  # step NAME TIMEOUT_S CMD...: runs with a time limit, output to OUTDIR/NAME.log
  local name="$1" lim="$2"
  shift 2
  local l
  l=$(left)
  if (( l < 10 )); then
    echo "| $name | skipped: the time budget is spent | |" >> "$out/runs.md"
    return 2
  fi
  (( lim > l )) && lim=$l
  local t0
  t0=$(date +%s)
  timeout "$lim" "$@" > "$out/$name.log" 2>&1
  local rc=$?
  echo "$name: exit $rc after $(( $(date +%s) - t0 )) s" | tee -a "$out/steps.txt"
  return $rc
}

# the decode GEMV alone per weight type at K3 shapes, as % of the read bandwidth it measures (when packed)
if [[ -x "$here/bench_vk_gemv" ]]; then
  min_time=0.2
  (( tiny )) && min_time=0.05
  step gemv 120 "$here/bench_vk_gemv" --benchmark_min_time="$min_time" || fail=1
fi
if ! step synth 180 "$kimi" synth "${synth_args[@]}" -q -o "$work/hf"; then
  echo "device-check: synth failed (see $out/synth.log)" >&2
  exit 1
fi
if ! step convert 180 "$kimi" convert -q "$work/hf" -o "$work/model.gguf"; then
  echo "device-check: convert failed (see $out/convert.log)" >&2
  exit 1
fi
rm -rf "$work/hf"

placements=("gpu|--device vulkan -ngl 99" "hybrid|--device vulkan -ngl 99 --cpu-moe")
# the help text is read whole before it is searched: `grep -q` in a pipe stops reading at the first match,
# and under pipefail the writer's SIGPIPE would make the test fail at random
bench_help="$("$kimi" bench --help 2>/dev/null)"
if [[ "$bench_help" == *--gpu-experts* ]]; then
  # the experts' pick counts over a text (CPU), ranking what --gpu-experts keeps
  if step imatrix 120 "$kimi" imatrix -m "$work/model.gguf" -f "$here/calib.txt" -c 256 --chunks 4 -t "$(nproc)" \
      -o "$work/counts.imatrix"; then
    placements+=("hybrid-hot|--device vulkan -ngl 99 --cpu-moe --gpu-experts auto --expert-counts $work/counts.imatrix")
  else
    fail=1
  fi
fi
: > "$out/runs.md"
for p in "${placements[@]}"; do
  name="${p%%|*}"
  flags="${p#*|}"
  # pp512 + tg128 in one run (one load), then pp4096 alone; -r 1 after the default warm-up pass
  # shellcheck disable=SC2086
  step "bench-$name-pp$pp_small-tg$tg" 200 "$kimi" bench -m "$work/model.gguf" $flags -p "$pp_small" -n "$tg" -r 1 -t "$(nproc)" -v || fail=1
  # shellcheck disable=SC2086
  step "bench-$name-pp$pp_big" 200 "$kimi" bench -m "$work/model.gguf" $flags -p "$pp_big" -n 0 -r 1 -t "$(nproc)" -v || fail=1
done
if [[ "$bench_help" == *--hybrid-overlap* ]]; then
  # the A/B of the overlap: hybrid decode with the GPU's shared experts run after the CPU's routed ones
  step "bench-hybrid-nooverlap-tg$tg" 200 "$kimi" bench -m "$work/model.gguf" --device vulkan -ngl 99 --cpu-moe \
    --hybrid-overlap off -p 0 -n "$tg" -r 1 -t "$(nproc)" -v || fail=1
fi
rm -f "$work/model.gguf" "$work/counts.imatrix"
rmdir "$work" 2>/dev/null

{
  echo
  echo "Model: kimi synth ${synth_args[*]} (+ kimi convert). Runs: kimi bench -r 1 (after one warm-up pass)."
  echo
  if [[ -f "$out/gemv.log" ]]; then
    echo "## gemv (the decode GEMV per weight type: weight GB/s and % of the measured read bandwidth)"
    echo
    echo '```'
    awk '/^BM_vk_gemv/ { bw = ""; pct = ""
           for (i = 2; i <= NF; ++i) { if ($i ~ /^bytes_per_second=/) bw = $i; if ($i ~ /^pct_read_bw=/) pct = $i }
           sub(/^BM_vk_gemv\//, "", $1); sub(/\/real_time$/, "", $1); print $1, bw, pct }' "$out/gemv.log"
    echo '```'
    echo
  fi
  for f in "$out"/bench-*.log; do
    [[ -f "$f" ]] || continue
    echo "## $(basename "$f" .log)"
    echo
    echo '```'
    # the speed rows, the placement, the device and its measured ceilings, decode/prefill as % of them, the
    # hybrid runs' prefill offload choice (--moe-offload auto, the default) and what ran offloaded
    grep -E '^\| |^placement|^device |^tg: |^pp: |% of the device|ceiling|routed expert picks|^prefill offload' "$f"
    echo '```'
    echo
  done
  cat "$out/runs.md"
  echo
  echo "steps (exit status, seconds):"
  echo '```'
  cat "$out/steps.txt"
  echo '```'
} >> "$summary"
rm -f "$out/runs.md"
cat "$summary"
exit $fail
