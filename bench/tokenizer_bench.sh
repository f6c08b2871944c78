#!/usr/bin/env bash
# Tokenizer speed, ours vs the real tiktoken (npm WASM build), on the same text and vocabulary.
#   bench/tokenizer_bench.sh [FILE] [KIMI_BIN]
# FILE defaults to tests/data/tokenizer/long.txt repeated to ~1 MB (so the piece cache does not
# hold every piece of a tiny text); KIMI_BIN defaults to build/kimi.
# Needs `npm ci --prefix tools/tiktoken`. Both sides encode without special-token handling.
set -euo pipefail
cd "$(dirname "$0")/.."
KIMI=${2:-build/kimi}
ENC=tools/tiktoken/node_modules/tiktoken/encoders
[[ -x $KIMI ]] || { echo "no kimi binary at $KIMI (build first or pass it)"; exit 1; }
[[ -d $ENC ]] || { echo "missing $ENC: run npm ci --prefix tools/tiktoken"; exit 1; }
FILE=${1:-}
if [[ -z $FILE ]]; then
  FILE=$(mktemp /tmp/kimi-tokbench.XXXXXX)
  trap 'rm -f "$FILE"' EXIT
  for _ in $(seq 1 42); do cat tests/data/tokenizer/long.txt; done > "$FILE"
fi
for spec in "cl100k_base:" "o200k_base:" "cl100k_base:kimi"; do
  enc=${spec%%:*}; mode=${spec#*:}
  label="$enc${mode:+ + Kimi regex}"
  pat=(); [[ $mode == kimi ]] && pat=(--pattern kimi)
  echo "== $label"
  printf '  kimi.cpp : '; "$KIMI" tokenize --tiktoken "$ENC/$enc.json" "${pat[@]}" --no-special --bench "$FILE"
  printf '  tiktoken : '; node tools/tiktoken/bench.js "$enc" "$FILE" $mode
done
