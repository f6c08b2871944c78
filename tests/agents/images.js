// Test images for the agent tests (sdk_test.js, cli_test.js), and what the prompt of one must hold,
// computed here from docs/spec/vision.md (not from the engine).
"use strict";
const zlib = require("zlib");

// CRC-32 (ISO-HDLC, as PNG chunks use)
function crc32(buf) {
  let crc = 0xffffffff;
  for (const b of buf) {
    let c = (crc ^ b) & 0xff;
    for (let k = 0; k < 8; k++) c = c & 1 ? 0xedb88320 ^ (c >>> 1) : c >>> 1;
    crc = (crc >>> 8) ^ c;
  }
  return (crc ^ 0xffffffff) >>> 0;
}

// An 8-bit RGB PNG of w x h pixels with a gradient that depends on `seed` (so two images of the same
// size differ), written with zlib's deflate and CRC-32 computed above.
function png(w, h, seed = 0) {
  const rows = [];
  for (let y = 0; y < h; y++) {
    const r = Buffer.alloc(1 + 3 * w);  // filter type 0
    for (let x = 0; x < w; x++) {
      r[1 + 3 * x] = (x * 7 + seed * 31) & 255;
      r[2 + 3 * x] = (y * 11 + seed * 17) & 255;
      r[3 + 3 * x] = ((x ^ y) * 5 + seed) & 255;
    }
    rows.push(r);
  }
  const chunk = (type, data) => {
    const len = Buffer.alloc(4);
    len.writeUInt32BE(data.length);
    const td = Buffer.concat([Buffer.from(type, "latin1"), data]);
    const crc = Buffer.alloc(4);
    crc.writeUInt32BE(crc32(td));
    return Buffer.concat([len, td, crc]);
  };
  const ihdr = Buffer.alloc(13);
  ihdr.writeUInt32BE(w, 0);
  ihdr.writeUInt32BE(h, 4);
  ihdr[8] = 8;  // bit depth
  ihdr[9] = 2;  // RGB
  return Buffer.concat([Buffer.from([0x89, 0x50, 0x4e, 0x47, 0x0d, 0x0a, 0x1a, 0x0a]), chunk("IHDR", ihdr),
                        chunk("IDAT", zlib.deflateSync(Buffer.concat(rows))), chunk("IEND", Buffer.alloc(0))]);
}

// docs/spec/vision.md §3.1 (the navit rule, in double; padding to multiples of 28) and §4: the text
// an image of w x h pixels becomes in the prompt.
function imagePromptText(w, h) {
  const s1 = Math.sqrt(65536 / (Math.max(1, Math.floor(w / 14)) * Math.max(1, Math.floor(h / 14))));
  const scale = Math.min(1, s1, 512 * 14 / w, 512 * 14 / h);
  const nw = Math.min(Math.max(1, Math.trunc(w * scale)), 7168), nh = Math.min(Math.max(1, Math.trunc(h * scale)), 7168);
  const pad = (n) => (28 - (n % 28)) % 28;
  const gw = (nw + pad(nw)) / 14, gh = (nh + pad(nh)) / 14;
  return { pads: gh * gw / 4,
           text: `<|media_begin|>image ${w}x${h}<|media_content|>` + "<|media_pad|>".repeat(gh * gw / 4) + "<|media_end|>" };
}

// The number of prompt tokens one image of w x h adds: the server's /tokenize of that text.
async function imageTokens(base, key, w, h) {
  const r = await fetch(base + "/tokenize", { method: "POST", headers: { Authorization: "Bearer " + key, "Content-Type": "application/json" },
                                              body: JSON.stringify({ content: imagePromptText(w, h).text, special: true }) });
  if (!r.ok) throw new Error(`/tokenize: HTTP ${r.status}`);
  return (await r.json()).count;
}

module.exports = { png, imagePromptText, imageTokens };
