#!/usr/bin/env bash
# Set up, build, and run the main job on the built-in default: synthesize the small K3.1
# checkpoint, convert it to GGUF, inspect and verify it.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
bash scripts/build.sh
KIMI=./build/kimi
OUT=${OUT:-models}
PRESET=${PRESET:-small}
mkdir -p "$OUT"
[[ -f "$OUT/$PRESET-hf/config.json" ]] || $KIMI synth --preset "$PRESET" -o "$OUT/$PRESET-hf"
$KIMI convert "$OUT/$PRESET-hf" -o "$OUT/$PRESET.gguf"
$KIMI inspect "$OUT/$PRESET.gguf" | head -40
$KIMI verify "$OUT/$PRESET-hf" "$OUT/$PRESET.gguf"
