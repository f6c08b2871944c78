#!/usr/bin/env node
// Encoding speed of the real tiktoken (npm, WASM) for bench/tokenizer_bench.sh.
//   node tools/tiktoken/bench.js ENCODER FILE [kimi]
// ENCODER: cl100k_base | o200k_base; "kimi" runs the Kimi regex over the ENCODER's ranks.
"use strict";
const fs = require("fs");
const { Tiktoken } = require("tiktoken/lite");
const KIMI_PAT =
  "[\\p{Han}]+|[^\\r\\n\\p{L}\\p{N}]?[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}&&[^\\p{Han}]]*[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}&&[^\\p{Han}]]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?|[^\\r\\n\\p{L}\\p{N}]?[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}&&[^\\p{Han}]]+[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}&&[^\\p{Han}]]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";
const [name, file, mode] = process.argv.slice(2);
if (!name || !file) {
  console.error("usage: bench.js ENCODER FILE [kimi]");
  process.exit(2);
}
const e = require(`tiktoken/encoders/${name}.json`);
const enc = new Tiktoken(e.bpe_ranks, e.special_tokens, mode === "kimi" ? KIMI_PAT : e.pat_str);
const buf = fs.readFileSync(file);
const text = new TextDecoder().decode(buf);
const nTokens = enc.encode_ordinary(text).length;  // warm-up
let iters = 0;
const t0 = process.hrtime.bigint();
let secs = 0;
do {
  enc.encode_ordinary(text);
  ++iters;
  secs = Number(process.hrtime.bigint() - t0) / 1e9;
} while (secs < 2 || iters < 3);
const per = secs / iters;
console.log(`${buf.length} bytes, ${nTokens} tokens, ${iters} iterations, ${(per * 1e3).toFixed(3)} ms/iter: ` +
            `${Math.round(nTokens / per)} tokens/s, ${(buf.length / per / 1e6).toFixed(2)} MB/s`);
enc.free();
