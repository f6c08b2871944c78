#!/usr/bin/env bash
# Set up (the packages to build and run kimi only: scripts/setup.sh), build the `kimi` program only,
# and run the main job on the built-in default: synthesize the small K3.1 checkpoint, convert it to
# GGUF, inspect and verify it, generate text and measure speed. (scripts/test.sh builds everything.)
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
bash scripts/build.sh kimi
KIMI=${BUILD_DIR:-build}/kimi
OUT=${OUT:-models}
PRESET=${PRESET:-small}
mkdir -p "$OUT"
[[ -f "$OUT/$PRESET-hf/config.json" ]] || $KIMI synth --preset "$PRESET" -o "$OUT/$PRESET-hf"
$KIMI convert "$OUT/$PRESET-hf" -o "$OUT/$PRESET.gguf"
$KIMI inspect "$OUT/$PRESET.gguf" > "$OUT/$PRESET.inspect.txt"
head -40 "$OUT/$PRESET.inspect.txt"; echo "(full listing: $OUT/$PRESET.inspect.txt)"
$KIMI verify "$OUT/$PRESET-hf" "$OUT/$PRESET.gguf"
$KIMI run -m "$OUT/$PRESET.gguf" -p "The quick brown fox" -n 32 --temp 0
echo
$KIMI bench -m "$OUT/$PRESET.gguf" -p 64 -n 16 -r 1
