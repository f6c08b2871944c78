#!/usr/bin/env node
// Generates the tokenizer golden data for kimi.cpp tests with the REAL tiktoken (npm `tiktoken`,
// the WASM build of OpenAI's Rust core) and Node's RegExp (v flag: class intersection `&&`).
//
//   npm ci --prefix tools/tiktoken && node tools/tiktoken/gen_golden.js
//
// Reads  tests/data/tokenizer/corpus.json (cases: {name, text} | {name, hex} | {name, file})
// Writes tests/data/tokenizer/long.txt        (deterministic long mixed-script text)
//        tests/data/tokenizer/golden.json     (ids and Kimi splits per case)
//        tests/data/tokenizer/kimi_classes.json (code point ranges of the two `&&` classes)
"use strict";
const fs = require("fs");
const path = require("path");
const { Tiktoken } = require("tiktoken/lite");

const root = path.resolve(__dirname, "..", "..");
const dataDir = path.join(root, "tests", "data", "tokenizer");

// The Kimi pre-tokenizer regex exactly as the Kimi tokenizer writes it (Rust regex syntax).
const KIMI_PAT =
  "[\\p{Han}]+|[^\\r\\n\\p{L}\\p{N}]?[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}&&[^\\p{Han}]]*[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}&&[^\\p{Han}]]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?|[^\\r\\n\\p{L}\\p{N}]?[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}&&[^\\p{Han}]]+[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}&&[^\\p{Han}]]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";

// The same regex for JavaScript (flags "gv"). What differs from Rust's regex crate:
//  * \p{Han} is a Script in Rust: JS needs \p{Script=Han};
//  * (?i:...) groups do not exist in Node 20: spelled out with Unicode simple case folding
//    (s ~ S ~ U+017F long s; the other letters fold only to their ASCII case partner);
//  * \s in JS includes U+FEFF and excludes U+0085; Rust's \s is the White_Space property.
const WS = "\\t\\n\\v\\f\\r \\x85\\xA0\\u1680\\u2000-\\u200A\\u2028\\u2029\\u202F\\u205F\\u3000";
const CONTR = "(?:'(?:[sS\\u017F]|[tT]|[rR][eE]|[vV][eE]|[mM]|[lL][lL]|[dD]))";
function kimiForJs(p) {
  return p
    // JS set operations need each operand to be one class: [A B C&&[^D]] -> [[A B C]&&[^D]]
    .split("[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}&&").join("[[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}]&&")
    .split("[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}&&").join("[[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}]&&")
    .split("\\p{Han}").join("\\p{Script=Han}")
    .split("(?i:'s|'t|'re|'ve|'m|'ll|'d)").join(CONTR)
    .split("[^\\s").join("[^" + WS)
    .split("(?!\\S)").join("(?![^" + WS + "])")
    .split("\\s").join("[" + WS + "]");
}
const KIMI_JS = new RegExp(kimiForJs(KIMI_PAT), "gv");

function loadEncoder(name) {
  return require(`tiktoken/encoders/${name}.json`);
}

// Kimi-style special tokens placed after the cl100k ranks (the rank file has ranks 0..100255).
const KIMI_SPECIALS = {
  "[BOS]": 100256, "[EOS]": 100257, "<|end_of_msg|>": 100258, "<|open|>": 100259, "<|close|>": 100260,
  "<|sep|>": 100261, "[EOT]": 100262, "<|reserved_token_100300|>": 100300,
};

function caseBytes(c) {
  if (c.hex !== undefined) return Buffer.from(c.hex, "hex");
  if (c.file !== undefined) return fs.readFileSync(path.join(dataDir, c.file));
  return Buffer.from(c.text, "utf8");
}

// Deterministic long text mixing every kind of case (LCG, fixed seed).
function makeLongText(corpus) {
  const parts = [];
  for (const c of corpus) if (c.text !== undefined) parts.push(c.text);
  const words = parts.join(" ").split(/(\s+)/u);
  let s = 12345;
  const rnd = (n) => { s = (Math.imul(s, 1103515245) + 12345) >>> 0; return (s >>> 8) % n; };
  let out = "";
  while (Buffer.byteLength(out) < 24000) {
    const k = rnd(3);
    if (k === 0) out += parts[rnd(parts.length)];
    else for (let i = 0, m = 5 + rnd(40); i < m; ++i) out += words[rnd(words.length)];
    out += ["\n", " ", "\n\n", "", "\r\n"][rnd(5)];
  }
  return out;
}

function main() {
  const corpus = JSON.parse(fs.readFileSync(path.join(dataDir, "corpus.json"), "utf8"));
  fs.writeFileSync(path.join(dataDir, "long.txt"), makeLongText(corpus));

  const cl = loadEncoder("cl100k_base"), o2 = loadEncoder("o200k_base");
  const encCl = new Tiktoken(cl.bpe_ranks, cl.special_tokens, cl.pat_str);
  const encO2 = new Tiktoken(o2.bpe_ranks, o2.special_tokens, o2.pat_str);
  const encKimi = new Tiktoken(cl.bpe_ranks, KIMI_SPECIALS, KIMI_PAT);
  const decoder = new TextDecoder("utf-8", { fatal: false });  // WHATWG: U+FFFD per maximal subpart

  const cases = [];
  for (const c of corpus) {
    const text = decoder.decode(caseBytes(c));
    const arr = (u32) => Array.from(u32);
    // Kimi splits: the special tokens are cut out first, then the regex runs on each segment.
    const splits = [];
    const specialRe = /\[BOS\]|\[EOS\]|\[EOT\]|<\|end_of_msg\|>|<\|open\|>|<\|close\|>|<\|sep\|>|<\|reserved_token_100300\|>/g;
    let last = 0;
    const splitSegment = (seg) => { for (const m of seg.matchAll(KIMI_JS)) splits.push(m[0]); };
    for (const m of text.matchAll(specialRe)) {
      splitSegment(text.slice(last, m.index));
      splits.push(m[0]);
      last = m.index + m[0].length;
    }
    splitSegment(text.slice(last));
    cases.push({
      name: c.name,
      cl100k: arr(encCl.encode_ordinary(text)),
      cl100k_special: arr(encCl.encode(text, "all")),
      o200k: arr(encO2.encode_ordinary(text)),
      o200k_special: arr(encO2.encode(text, "all")),
      kimi_cl100k_special: arr(encKimi.encode(text, "all")),
      kimi_splits: splits,
    });
  }
  encCl.free(); encO2.free(); encKimi.free();
  const golden = {
    generator: "tools/tiktoken/gen_golden.js",
    tiktoken_version: JSON.parse(fs.readFileSync(path.join(__dirname, "node_modules", "tiktoken", "package.json"), "utf8")).version,
    node_version: process.version,
    unicode_version: process.versions.unicode,
    kimi_specials: KIMI_SPECIALS,
    cases,
  };
  fs.writeFileSync(path.join(dataDir, "golden.json"), JSON.stringify(golden) + "\n");

  // Code point ranges of the two intersection classes and of unassigned code points (Cn), for the
  // exhaustive translation test.
  const classes = {
    upper: /^[[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]&&[^\p{Script=Han}]]$/v,
    lower: /^[[\p{Ll}\p{Lm}\p{Lo}\p{M}]&&[^\p{Script=Han}]]$/v,
    unassigned: /^\p{Cn}$/v,
  };
  const ranges = {};
  for (const [k, re] of Object.entries(classes)) {
    const r = [];
    let start = -1;
    for (let cp = 0; cp <= 0x110000; ++cp) {
      const ok = cp < 0x110000 && !(cp >= 0xd800 && cp <= 0xdfff) && re.test(String.fromCodePoint(cp));
      if (ok && start < 0) start = cp;
      if (!ok && start >= 0) { r.push([start, cp - 1]); start = -1; }
    }
    ranges[k] = r;
  }
  ranges.unicode_version = process.versions.unicode;
  fs.writeFileSync(path.join(dataDir, "kimi_classes.json"), JSON.stringify(ranges) + "\n");
  console.log(`wrote ${cases.length} cases (unicode ${process.versions.unicode})`);
}

main();
