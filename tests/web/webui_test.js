#!/usr/bin/env node
// Browser test of the chat page `kimi serve` serves at / (index.html in src/server/web/), in a real
// headless Chromium (Debian's, driven by playwright-core). Compared by structure (DOM), not pixels:
//  - real replies of the server: the streamed reasoning and answer equal a non-streamed greedy
//    request's; the speed line equals the server's own log line for that request; the next turn of
//    the conversation shows the tokens the server's prompt cache reused;
//  - a recorded stream (fed through page.route, re-chunked into 5-byte pieces) with a thinking block,
//    Markdown (heading, emphasis, list, link, table, a ``` code block), raw HTML and a tool call: each
//    renders as such, nothing of the model's text becomes HTML, and the incremental rendering equals
//    the full rendering after a reload;
//  - conversations survive a reload, the list switches, renames and deletes them; Stop ends a long
//    generation (the server's slot goes idle); light/dark themes; no horizontal overflow at 380 px;
//  - images pasted, dropped and picked: thumbnails, the image_url data: URL parts of the request (the
//    files' exact bytes), kept over a reload; the page shows what the server answers that request.
// Any page JS error or request to another host fails the test.
// usage: node webui_test.js <kimi binary> [page source, to compare with what is served]
// Env: KIMI_WEBUI_SHOTS=DIR saves screenshots (desktop and phone width, light and dark) there;
//      KIMI_WEBUI_PAGE=FILE serves FILE at / instead of the built-in page (edit the page without a rebuild).
// Without chromium or playwright-core the test skips (exit 77), unless KIMI_REQUIRE_BROWSER=1,
// CI=true or KIMI_REQUIRE_VULKAN=1 (scripts/test.sh), where it fails.
"use strict";
const fs = require("fs");
const os = require("os");
const path = require("path");
const { spawn, execFileSync } = require("child_process");
const { imagePromptText } = require("../agents/images.js");

const KIMI = process.argv[2];
const PAGE_SRC = process.argv[3];
const CHROMIUM = process.env.KIMI_CHROMIUM || "/usr/bin/chromium";
const SHOTS = process.env.KIMI_WEBUI_SHOTS || "";
const DEV_PAGE = process.env.KIMI_WEBUI_PAGE || "";
const STEP_MS = 30000;  // every wait is bounded

function fail(msg) {
  console.error("FAIL: " + msg);
  process.exitCode = 1;
  throw new Error(msg);
}
function check(cond, msg) { if (!cond) fail(msg); }
function eq(a, b, what) { check(JSON.stringify(a) === JSON.stringify(b), `${what}: ${JSON.stringify(a)} != expected ${JSON.stringify(b)}`); }

function skipOrFail(why) {
  const env = process.env;
  const required = env.KIMI_REQUIRE_BROWSER === "1" || env.CI === "true" || env.KIMI_REQUIRE_VULKAN === "1";
  if (required) {
    console.error(`FAIL: ${why} (required: KIMI_REQUIRE_BROWSER=1, CI=true or KIMI_REQUIRE_VULKAN=1; ` +
                  "scripts/setup.sh --test installs it)");
    process.exit(1);
  }
  console.log(`SKIP: ${why} (scripts/setup.sh --test installs it)`);
  process.exit(77);
}

if (!KIMI || !fs.existsSync(KIMI)) { console.error("usage: node webui_test.js <kimi binary> [index.html]"); process.exit(2); }
if (!fs.existsSync(CHROMIUM)) skipOrFail(`no browser at ${CHROMIUM}`);
let chromium;
try {
  ({ chromium } = require("playwright-core"));
} catch (e) {
  skipOrFail("playwright-core is not installed (npm ci --prefix tests/web)");
}

const tmp = fs.mkdtempSync(path.join(os.tmpdir(), "kimi-webui-"));
let server = null;
let browser = null;
const serverLog = [];  // stderr lines of kimi serve

function kimi(args) {
  execFileSync(KIMI, args, { stdio: ["ignore", "ignore", "inherit"], timeout: 120000 });
}

// Starts `kimi serve` on an ephemeral port; resolves with the base URL once the model is loaded.
function startServer(model) {
  return new Promise((resolve, reject) => {
    server = spawn(KIMI, ["serve", "-m", model, "--host", "127.0.0.1", "--port", "0", "-c", "32768", "--parallel", "1"],
                   { stdio: ["ignore", "pipe", "pipe"] });
    let out = "";
    let err = "";
    const timer = setTimeout(() => reject(new Error("kimi serve did not start in time:\n" + err)), STEP_MS);
    server.stdout.on("data", (d) => {
      out += d;
      const m = out.match(/listening on http:\/\/[^:]+:(\d+)/);
      if (m) { clearTimeout(timer); resolve(`http://127.0.0.1:${m[1]}`); }
    });
    server.stderr.on("data", (d) => {
      err += d;
      const lines = err.split("\n");
      err = lines.pop();
      serverLog.push(...lines);
    });
    server.on("exit", (code) => { clearTimeout(timer); reject(new Error(`kimi serve exited (${code}):\n${serverLog.join("\n")}${err}`)); });
  });
}

async function getJSON(url, init) {
  const r = await fetch(url, init);
  const j = await r.json();
  if (!r.ok) fail(`${url}: HTTP ${r.status} ${JSON.stringify(j)}`);
  return j;
}

async function waitFor(what, pred) {
  const end = Date.now() + STEP_MS;
  while (Date.now() < end) {
    if (await pred()) return;
    await new Promise((r) => setTimeout(r, 50));
  }
  fail("timed out waiting for " + what);
}

// The server's log lines of chat generations: prompt tokens, cached, tok/s, generated, tok/s.
function generationLines() {
  const re = /POST \/v1\/chat\/completions (\S+): \w+; prompt (\d+) tokens \((\d+) cached\) [\d.]+ s, ([\d.]+) tok\/s; generated (\d+) tokens [\d.]+ s, ([\d.]+) tok\/s/;
  return serverLog.map((l) => re.exec(l)).filter(Boolean)
    .map((m) => ({ id: m[1], prompt: +m[2], cached: +m[3], promptTps: +m[4], gen: +m[5], genTps: +m[6] }));
}
async function logLineOf(id) {
  let line = null;
  await waitFor(`the server's log line of ${id}`, () => (line = generationLines().find((l) => l.id === id)));
  return line;
}
// The page's speed line must state the numbers of the server's log line: the same token counts, the
// same speeds within 3 % (the log line has 1 decimal, and may take the generation's interval from
// other clock readings of the same events: a 48-token reply of the tiny model lasts ~10 ms).
function checkStats(shown, ref, what) {
  check(shown, `${what}: no speed line`);
  eq([shown.prompt, shown.cached, shown.gen], [ref.prompt, ref.cached, ref.gen], `${what}: prompt/cached/generated tokens`);
  const near = (a, b) => Math.abs(a - b) <= 0.051 + 0.03 * Math.abs(b);
  check(near(shown.promptTps, ref.promptTps) && near(shown.genTps, ref.genTps),
        `${what}: speeds ${shown.promptTps}/${shown.genTps} t/s, the server logged ${ref.promptTps}/${ref.genTps}`);
  const f = (x) => (x >= 100 ? Math.round(x).toLocaleString("en-US") : x.toFixed(1));
  check(shown.text.includes(`${ref.prompt} tok`) && shown.text.includes(`${ref.cached} tok`) && shown.text.includes(`${ref.gen} tok`),
        `${what}: token counts in the speed line "${shown.text}"`);
  if (ref.gen > 1) check(shown.text.includes(`${f(shown.genTps)} t/s`), `${what}: generation speed in "${shown.text}"`);
}

// ---- the recorded stream: what the server sends, with a reply the random-weight model will not write
const REC = {
  reasoning: "The user wants memoized Fibonacci.\nA short Python function with lru_cache, then a table.",
  code: "from functools import lru_cache\n\n@lru_cache(maxsize=None)\ndef fib(n: int) -> int:\n" +
        "    # naive recursion, cached\n    return n if n < 2 else fib(n - 1) + fib(n - 2)",
  tool: { name: "run_python", args: { code: "print(fib(30))", timeout_s: 5 } },
  timings: { prompt_n: 120, prompt_ms: 60, prompt_per_second: 2000, predicted_n: 85, predicted_ms: 420,
             predicted_per_second: 200, cache_n: 16 },
};
REC.answer = [
  "## Fibonacci, *fast*",
  "",
  "Here is **a memoized** version using `lru_cache`:",
  "",
  "```python",
  REC.code,
  "```",
  "",
  "- it runs in *linear* time",
  "- docs: [functools](https://docs.python.org/3/library/functools.html)",
  "  - nested: ~~exponential~~ no more",
  "",
  "| n | fib(n) |",
  "|---|-------:|",
  "| 10 | 55 |",
  "| 20 | 6765 |",
  "",
  "Raw HTML stays text: <img src=x onerror=\"window.__pwned=1\"> <b>bold?</b> " +
    "<script>window.__pwned=2</script> and [a bad link](javascript:window.__pwned=3).",
].join("\n");
function recordedSSE() {
  const id = "chatcmpl-rec", created = 1767225600, model = "recorded";
  const chunk = (delta, finish, extra) => ({ id, object: "chat.completion.chunk", created, model,
    choices: [{ index: 0, delta, finish_reason: finish || null, ...(extra || {}) }] });
  const ev = [chunk({ role: "assistant", content: "" })];
  const pieces = (s, n) => { const out = []; for (let i = 0; i < s.length; i += n) out.push(s.slice(i, i + n)); return out; };
  for (const p of pieces(REC.reasoning, 9)) ev.push(chunk({ reasoning_content: p }));
  for (const p of pieces(REC.answer, 6)) ev.push(chunk({ content: p }));
  ev.push(chunk({ tool_calls: [{ index: 0, id: "call_rec_0", type: "function",
                                 function: { name: REC.tool.name, arguments: JSON.stringify(REC.tool.args) } }] }));
  ev.push(chunk({}, "tool_calls", { timings: REC.timings }));
  ev.push({ id, object: "chat.completion.chunk", created, model, choices: [],
            usage: { prompt_tokens: 136, completion_tokens: 85, total_tokens: 221, prompt_tokens_details: { cached_tokens: 16 } } });
  return ev.map((e) => "data: " + JSON.stringify(e) + "\n\n").join("") + ": a comment line\n\ndata: [DONE]\n\n";
}

async function main() {
  const t0 = Date.now();
  // a tiny synthetic model (seconds to make)
  const hf = path.join(tmp, "hf");
  const gguf = path.join(tmp, "tiny.gguf");
  kimi(["synth", "--preset", "tiny", "--seed", "3", "-o", hf]);
  kimi(["convert", hf, "-o", gguf, "--quiet"]);
  const base = await startServer(gguf);
  const CHAT = base + "/v1/chat/completions";

  // the page itself: served at / and /index.html as HTML, byte for byte the embedded source file
  for (const p of ["/", "/index.html"]) {
    const r = await fetch(base + p);
    check(r.status === 200, `GET ${p}: HTTP ${r.status}`);
    check((r.headers.get("content-type") || "").startsWith("text/html"), `GET ${p}: Content-Type ${r.headers.get("content-type")}`);
    const body = await r.text();
    if (PAGE_SRC && !DEV_PAGE) check(body === fs.readFileSync(PAGE_SRC, "utf8"), `GET ${p}: body differs from ${PAGE_SRC}`);
    check(body.includes("<title>kimi.cpp chat</title>"), `GET ${p}: not the chat page`);
    check(!/innerHTML|outerHTML|insertAdjacentHTML|document\.write/.test(body), `GET ${p}: the page parses strings as HTML`);
  }
  const post = await fetch(base + "/", { method: "POST", body: "x" });
  check(post.status === 405, `POST /: HTTP ${post.status}, expected 405`);

  // a fresh profile in the temp dir (Playwright takes it as the persistent context's user data dir)
  browser = await chromium.launchPersistentContext(path.join(tmp, "profile"), {
    executablePath: CHROMIUM,
    headless: true,
    timeout: STEP_MS,
    viewport: { width: 1280, height: 820 },
    colorScheme: "light",
    args: ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
           "--disable-background-networking", "--disable-component-update", "--disable-sync"],
  });
  const page = browser.pages()[0] || await browser.newPage();
  page.setDefaultTimeout(STEP_MS);
  const jsErrors = [];
  page.on("pageerror", (e) => jsErrors.push("pageerror: " + e.message));
  page.on("console", (m) => { if (m.type() === "error") jsErrors.push("console.error: " + m.text()); });
  const external = [];
  page.on("request", (r) => { if (!r.url().startsWith(base)) external.push(r.url()); });
  const chatBodies = [];
  page.on("request", (r) => { if (r.url() === CHAT) chatBodies.push(r.postDataJSON()); });
  if (DEV_PAGE)
    await page.route((u) => u.pathname === "/" || u.pathname === "/index.html",
                     (route) => route.fulfill({ contentType: "text/html; charset=utf-8", body: fs.readFileSync(DEV_PAGE, "utf8") }));

  const shots = [];
  const shot = async (name) => {
    if (!SHOTS) return;
    fs.mkdirSync(SHOTS, { recursive: true });
    const f = path.join(SHOTS, name + ".png");
    await page.screenshot({ path: f });
    shots.push(f);
  };

  await page.goto(base + "/");
  check(await page.title() === "kimi.cpp chat", "page title");
  await page.waitForFunction(() => document.getElementById("model-name").textContent === "tiny");
  check(await page.isVisible("#empty"), "a new chat shows the empty state");
  await shot("desktop-empty-light");

  const state = () => page.evaluate(() => document.body.dataset.state);
  const waitState = async (want) => {  // the reply ends (done, stopped or error): it must be `want`
    await page.waitForFunction(() => document.body.dataset.state !== "generating").catch((e) => {
      fail(`the reply did not end: ${e.message}\nchat requests: ${chatBodies.length}\nJS errors: ${jsErrors.join("; ")}\nserver log:\n${serverLog.slice(-5).join("\n")}`);
    });
    const got = await page.evaluate(() => [document.body.dataset.state,
                                           Array.from(document.querySelectorAll(".msg-error")).map((e) => e.textContent).join("; ")]);
    check(got[0] === want, `the reply ended as "${got[0]}", expected "${want}" (${got[1]})`);
  };
  const stored = () => page.evaluate(() => JSON.parse(localStorage.getItem("kimi.chat.conversations.v1")));
  const lastAssistant = () => page.evaluate(() => {
    const a = document.querySelectorAll("#log .msg.assistant");
    const m = a[a.length - 1];
    if (!m) return null;
    const st = m.querySelector(".stats");
    return {
      reasoning: m.querySelector(".thinking-text").textContent,
      thinkingShown: !m.querySelector("details.thinking").hidden,
      thinkingOpen: m.querySelector("details.thinking").open,
      summary: m.querySelector("details.thinking summary").textContent,
      answerText: m.querySelector(".answer").textContent,
      answerHTML: m.querySelector(".answer").innerHTML,
      tools: Array.from(m.querySelectorAll(".tool-call")).map((t) => ({ name: t.querySelector(".tool-name").textContent,
                                                                         args: t.querySelector(".tool-args").textContent })),
      error: m.querySelector(".msg-error").hidden ? "" : m.querySelector(".msg-error").textContent,
      stats: st && st.dataset.genTokens !== undefined ? { prompt: +st.dataset.promptTokens, cached: +st.dataset.cached,
        promptTps: +st.dataset.promptTps, gen: +st.dataset.genTokens, genTps: +st.dataset.genTps, text: st.textContent } : null,
      statsText: st ? st.textContent : "",
    };
  });
  const send = async (text) => {
    await page.fill("#msg", text);
    await page.press("#msg", "Enter");
  };
  const setSettings = async (s) => {
    await page.click("#settings-btn");
    for (const [k, v] of Object.entries(s)) {
      if (typeof v === "boolean") await page.setChecked("#" + k, v);
      else if (k === "effort") await page.selectOption("#effort", v);
      else await page.fill("#" + k, String(v));
    }
    await page.click("#settings-close");
  };

  // 1) a real greedy reply, streamed; counts how often the page changes while it streams
  await setSettings({ temperature: 0, top_p: 1, max_tokens: 48, thinking: true });
  await page.evaluate(() => {
    window.__updates = 0;
    new MutationObserver((ms) => { window.__updates += ms.length; })
      .observe(document.getElementById("log"), { subtree: true, childList: true, characterData: true });
  });
  const prompt1 = "Hello from the browser test";
  await send(prompt1);
  await waitState("done");
  check(chatBodies.length === 1, `one chat request, saw ${chatBodies.length}`);
  const sent = chatBodies[0];
  check(sent.stream === true && sent.stream_options && sent.stream_options.include_usage === true && sent.thinking === true &&
        sent.temperature === 0 && sent.top_p === 1 && sent.max_tokens === 48, "request settings: " + JSON.stringify(sent));
  eq(sent.messages, [{ role: "user", content: prompt1 }], "first request's messages");
  const ref = await getJSON(CHAT, { method: "POST", headers: { "Content-Type": "application/json" },
                                    body: JSON.stringify({ ...sent, stream: false, stream_options: undefined }) });
  const refMsg = ref.choices[0].message;
  const refReasoning = refMsg.reasoning_content || "", refAnswer = refMsg.content || "";
  check(refReasoning.length + refAnswer.length > 0, "the reference answer is empty");
  const shown1 = await lastAssistant();
  const updates = await page.evaluate(() => window.__updates);
  eq(shown1.reasoning, refReasoning, "reasoning shown");
  check(shown1.thinkingShown === (refReasoning.length > 0), "thinking block visible iff there is reasoning");
  check(refAnswer === "" || shown1.answerText.trim().length > 0, "the answer is rendered");
  const conv1 = (await stored()).convs[0];
  eq(conv1.messages.map((m) => m.role), ["user", "assistant"], "stored messages");
  eq([conv1.messages[1].content, conv1.messages[1].reasoning || ""], [refAnswer, refReasoning], "stored answer and reasoning");
  eq(conv1.title, prompt1, "conversation title");
  // streamed = shown in more than one piece (how many depends on the load)
  check(updates >= 2, `the text was not updated while streaming (${updates} DOM updates)`);
  checkStats(shown1.stats, await logLineOf(conv1.messages[1].id), "turn 1 speed line");
  console.log(`turn 1: ${ref.usage.completion_tokens} tokens, ${updates} DOM updates, reasoning ${refReasoning.length} chars, ` +
              `answer ${refAnswer.length} chars: equal to the non-streamed reply; speed line "${shown1.stats.text}" = the server's log`);

  // 2) the next turn of the same conversation: history sent back, the server's prompt cache reused
  await setSettings({ max_tokens: 8 });
  await send("And one more thing");
  await waitState("done");
  const sent2 = chatBodies[1];
  eq(sent2.messages.map((m) => m.role), ["user", "assistant", "user"], "second request's roles");
  eq([sent2.messages[1].content, sent2.messages[1].reasoning_content || ""], [refAnswer, refReasoning], "history sent back");
  check(sent2.thinking === true && sent2.max_tokens === 8, "second request's settings");
  const shown2 = await lastAssistant();
  const conv2 = (await stored()).convs[0];
  const log2 = await logLineOf(conv2.messages[3].id);
  checkStats(shown2.stats, log2, "turn 2 speed line");
  check(log2.cached > 0, `turn 2 reused no cached prompt tokens (${JSON.stringify(log2)})`);
  console.log(`turn 2: ${log2.cached} of ${log2.prompt} prompt tokens cached, shown as "${shown2.stats.text}"`);

  // 3) a recorded stream (code block, thinking, tool call, raw HTML) in a new chat, fed in 5-byte pieces
  await page.click("#new-chat");
  check(await page.isVisible("#empty") && await page.evaluate(() => document.getElementById("log").children.length) === 0,
        "New chat shows an empty conversation");
  const recorded = recordedSSE();
  const feedRecorded = (route) => route.fulfill({ status: 200, contentType: "text/event-stream", body: recorded });
  await page.route(CHAT, feedRecorded);
  await page.evaluate(() => {
    const real = window.fetch;
    window.__realFetch = real;
    window.fetch = async (...args) => {  // the same bytes, re-chunked: 5 bytes per read, a frame apart every 40
      const res = await real(...args);
      if (!String(args[0]).endsWith("/v1/chat/completions")) return res;
      const rd = res.body.getReader();
      const body = new ReadableStream({
        async pull(ctl) {
          const { value, done } = await rd.read();
          if (done) { ctl.close(); return; }
          for (let i = 0; i < value.length; i += 5) {
            ctl.enqueue(value.slice(i, i + 5));
            await (i % 200 === 195 ? new Promise((r) => requestAnimationFrame(() => r())) : Promise.resolve());
          }
        },
      }, { highWaterMark: 0 });
      return new Response(body, { status: res.status, headers: res.headers });
    };
    window.__seen = { liveThinking: false, openCode: false };
    new MutationObserver(() => {
      if (document.querySelector(".thinking.live[open]:not([hidden])")) window.__seen.liveThinking = true;
      if (document.querySelector(".answer .code-block[data-open]")) window.__seen.openCode = true;
    }).observe(document.getElementById("log"), { subtree: true, childList: true, characterData: true });
  });
  await send("Fibonacci in Python, please");
  check(await page.isVisible("#stop") && !(await page.isVisible("#send")), "Stop replaces Send while generating");
  await waitState("done");
  await page.evaluate(() => { window.fetch = window.__realFetch; });
  await page.unroute(CHAT, feedRecorded);
  const seen = await page.evaluate(() => window.__seen);
  check(seen.liveThinking && seen.openCode, "while streaming: an open live thinking block and an unfinished code block " + JSON.stringify(seen));
  const rec = await lastAssistant();
  eq(rec.reasoning, REC.reasoning, "recorded: thinking text");
  check(rec.thinkingShown && !rec.thinkingOpen, "recorded: the thinking block is folded once the answer came");
  check(/^(Thought for \d+\.\d s|Thoughts)$/.test(rec.summary), "recorded: thinking summary " + rec.summary);
  eq(rec.tools, [{ name: REC.tool.name, args: JSON.stringify(REC.tool.args, null, 2) }], "recorded: tool call (name + pretty JSON)");
  eq(rec.error, "", "recorded: no error");
  const s = rec.stats;
  eq([s.prompt, s.cached, s.gen, s.promptTps, s.genTps], [136, 16, 85, 2000, 200], "recorded: speed numbers from timings + usage");
  check(s.text.includes("2,000 t/s") && s.text.includes("200 t/s") && s.text.includes("16 tok") && s.text.includes("tool_calls"),
        "recorded: speed line " + s.text);
  const structure = await page.evaluate(() => {
    const a = Array.from(document.querySelectorAll("#log .msg.assistant")).pop().querySelector(".answer");
    const q = (sel) => Array.from(a.querySelectorAll(sel));
    return {
      top: Array.from(a.children).map((e) => e.tagName + (e.className ? "." + e.className : "")),
      h2: q("h2").map((e) => e.textContent), h2em: q("h2 em").map((e) => e.textContent),
      strong: q("strong").map((e) => e.textContent), em: q("li em").map((e) => e.textContent),
      del: q("del").map((e) => e.textContent), inlineCode: q("p > code").map((e) => e.textContent),
      codeLang: q(".code-block .code-lang").map((e) => e.textContent),
      code: q(".code-block pre > code").map((e) => e.textContent),
      codeColoured: q(".code-block .tk-kw").map((e) => e.textContent).slice(0, 4),
      codeComment: q(".code-block .tk-com").map((e) => e.textContent),
      open: q(".code-block[data-open]").length,
      items: q(":scope > ul > li").length, nested: q("ul > li > ul > li").map((e) => e.textContent),
      links: q("a").map((e) => [e.textContent, e.getAttribute("href"), e.target, e.rel]),
      th: q("table th").map((e) => e.textContent),
      td: q("table tbody tr").map((r) => Array.from(r.children).map((c) => c.textContent)),
      align: q("table th")[1] ? q("table th")[1].style.textAlign : "",
      elements: q("img, script, b, iframe, [onerror]").length,
      lastP: q(":scope > p").pop().textContent,
      pwned: window.__pwned === undefined ? null : window.__pwned,
    };
  });
  eq(structure.top, ["H2", "P", "DIV.code-block", "UL", "DIV.table-wrap", "P"], "recorded: the answer's blocks");
  eq([structure.h2, structure.h2em], [["Fibonacci, fast"], ["fast"]], "recorded: heading");
  eq([structure.strong, structure.inlineCode, structure.em, structure.del],
     [["a memoized"], ["lru_cache"], ["linear"], ["exponential"]], "recorded: inline Markdown");
  eq([structure.codeLang, structure.code, structure.open], [["python"], [REC.code], 0], "recorded: code block");
  eq([structure.codeColoured, structure.codeComment], [["from", "import", "None", "def"], ["# naive recursion, cached"]],
     "recorded: code colouring");
  eq([structure.items, structure.nested], [2, ["nested: exponential no more"]], "recorded: list");
  eq(structure.links, [["functools", "https://docs.python.org/3/library/functools.html", "_blank", "noopener noreferrer nofollow"]],
     "recorded: links (javascript: makes none)");
  eq([structure.th, structure.td, structure.align], [["n", "fib(n)"], [["10", "55"], ["20", "6765"]], "right"], "recorded: table");
  eq([structure.elements, structure.pwned], [0, null], "recorded: raw HTML made no element and ran nothing");
  eq(structure.lastP, "Raw HTML stays text: <img src=x onerror=\"window.__pwned=1\"> <b>bold?</b> " +
                      "<script>window.__pwned=2</script> and a bad link.", "recorded: raw HTML shown as text");
  console.log("recorded stream: thinking block, code block, list, link, table, tool call and speed line render as such");

  // the renderer on its own: CommonMark cases as outlines written by hand, and for every prefix of
  // each text the incremental rendering equals a whole rendering (so a stream may stop anywhere)
  const MD_CASES = [
    ["1. one\n2. two\n\n3. three loose\n\nafter list\n\n- a\n  - b\n\n    more b\n- c\n\n> quote\ncontinued\n\n> second\n\n" +
     "Title\n=====\n\nSub\n---\n\n***\n\n```js\nconst x = `a\n\nb`;\n```\n\n~~~\nnot closed",
     "ol(li(p) li(p) li(p)) p ul(li(ul(li(p p))) li) blockquote(p(br)) blockquote(p) h1 h2 hr code:js code:text!"],
    ["text with *em and **strong** inside* and __under__ and a_b_c and ***both*** here\n\n| a | b |\n|:-:|--|\n| `x|y` | \\| |\n\n" +
     "- [ ] todo\n- [x] done\n\n  ```py\n  print(1)\n  ```\n\nhttps://example.com/a_(b). and <https://x.y/z> and [t](</a b>) and " +
     "![i](https://x/i.png)\n",
     "p(em(strong) strong strong(em)) table(thead(tr(th th)) tbody(tr(td(code) td))) ul(li(input p) li(input p code:py)) p(a a a)"],
    ["# H\n\n    indented\n\n1) paren\n2) list\n\n10. ten\n11. eleven\n\n* star\n+ plus\n\n&amp; &lt;tag&gt; \\*not em\\*\nline two  \nline three",
     "h1 p ol(li li) ol[10](li li) ul(li) ul(li) p(br br)"],
  ];
  const mdResults = await page.evaluate((cases) => {
    const outline = (e) => Array.from(e.children).map((c) => {
      if (c.classList.contains("code-block")) return "code:" + c.querySelector(".code-lang").textContent + (c.dataset.open ? "!" : "");
      if (c.classList.contains("table-wrap")) return outline(c);
      const name = c.tagName.toLowerCase() + (c.getAttribute("start") ? `[${c.getAttribute("start")}]` : "");
      const inner = outline(c);
      return inner ? `${name}(${inner})` : name;
    }).join(" ");
    return cases.map(([text]) => {
      const full = document.createElement("div");
      MD.render(text, full);
      const inc = document.createElement("div");
      const st = new MD.Stream(inc);
      let prefixesDiffer = 0;
      for (let i = 1; i <= text.length; i++) {
        st.update(text.slice(0, i));
        const ref = document.createElement("div");
        MD.render(text.slice(0, i), ref);
        if (ref.innerHTML !== inc.innerHTML) prefixesDiffer++;
      }
      return { outline: outline(full), prefixesDiffer, links: Array.from(full.querySelectorAll("a")).map((a) => a.getAttribute("href")),
               text: full.textContent };
    });
  }, MD_CASES);
  // nesting 20000 deep (quotes, lists, emphasis) renders (as text below 48 levels) instead of overflowing the stack
  const deep = await page.evaluate(() => ["> ".repeat(20000) + "x", "- ".repeat(20000) + "x", "*a ".repeat(9000) + "x" + " a*".repeat(9000)]
    .map((t) => { const d = document.createElement("div"); try { MD.render(t, d); } catch (e) { return e.message; } return d.textContent.endsWith("x") || d.textContent.endsWith("a*") ? "ok" : d.textContent.slice(-20); }));
  eq(deep, ["ok", "ok", "ok"], "deeply nested Markdown");
  MD_CASES.forEach(([, want], k) => {
    eq(mdResults[k].outline, want, `Markdown case ${k + 1}`);
    eq(mdResults[k].prefixesDiffer, 0, `Markdown case ${k + 1}: prefixes where incremental != whole rendering`);
  });
  eq(mdResults[1].links, ["https://example.com/a_(b)", "https://x.y/z", "https://x/i.png"], "Markdown case 2: links");
  check(mdResults[2].text.endsWith("& <tag> *not em*line twoline three"), "Markdown case 3: entities and escapes: " + mdResults[2].text);

  // 4) Stop: a long real generation in a new chat, stopped after the first streamed text; the
  //    request must end (the page says stopped, the server's slot is idle again, Send is back)
  //    (the tiny model may sample an end of turn at any point: the request gets a GBNF grammar added
  //    on its way whose sentences are 1000 lines of short words, so it cannot finish for a long time)
  const grammar = 'root ::= c c c c c c c c c c\nc ::= b b b b b b b b b b\nb ::= l l l l l l l l l l\n' +
                  'l ::= ([a-z]{1,8} " "){1,8} "\\n"';
  const addEndlessGrammar = (route) => {
    const b = route.request().postDataJSON();
    route.continue({ postData: JSON.stringify({ ...b, grammar }) });
  };
  await page.click("#new-chat");
  await page.route(CHAT, addEndlessGrammar);
  await setSettings({ max_tokens: 30000, thinking: false });
  await send("Tell me a very long story");
  await page.waitForFunction(() => {
    const a = Array.from(document.querySelectorAll("#log .msg.assistant")).pop();
    return a && a.querySelector(".answer").textContent.length > 0;
  }).catch(async (e) => fail(`no streamed text: ${e.message}; state ${await state()}; JS errors: ${jsErrors.join("; ")}; ` +
                             `server: ${serverLog.slice(-3).join("\n")}`));
  check(await state() === "generating" && await page.isVisible("#stop"), "Stop is shown while generating");
  await shot("desktop-streaming-light");
  await page.click("#stop");
  await waitState("stopped");
  check(await page.isVisible("#send") && !(await page.isVisible("#stop")), "after Stop: Send is back");
  await waitFor("the server to cancel the stopped request (slot idle, kimi_requests_total{result=\"cancelled\"} 1)", async () => {
    const slots = await getJSON(base + "/slots");
    const metrics = await (await fetch(base + "/metrics")).text();
    const c = metrics.match(/^kimi_requests_total\{result="cancelled"\} (\d+)/m);
    return Array.isArray(slots) && slots.every((x) => x.state !== "processing") && c && Number(c[1]) === 1;
  });
  await page.unroute(CHAT, addEndlessGrammar);
  const stopped = await lastAssistant();
  check(stopped.statsText.includes("stopped"), "the stopped reply says so: " + stopped.statsText);
  const st = await stored();
  check(st.convs.length === 3, `three conversations stored, saw ${st.convs.length}`);
  const stopConv = st.convs.find((c) => c.id === st.current);
  const partial = stopConv.messages[1].content;
  check(stopConv.messages[1].finish === "stopped" && partial.length > 0, "the partial reply is kept");
  // the grammar's lines are plain words: one paragraph, a line break per line
  const para = await page.evaluate(() => {
    const a = Array.from(document.querySelectorAll("#log .msg.assistant")).pop().querySelector(".answer");
    return { tags: Array.from(a.children).map((e) => e.tagName),
             text: Array.from(a.firstElementChild.childNodes).map((n) => (n.nodeName === "BR" ? "\n" : n.textContent)).join("") };
  });
  eq(para, { tags: ["P"], text: partial.trim().split("\n").map((l) => l.trim()).join("\n") }, "the real streamed answer as rendered");
  console.log(`stop: stopped after ${stopConv.messages[1].content.length} chars; the server cancelled it and its slot is idle`);

  // 5) a reload keeps every conversation; the list switches between them
  const recId = st.convs.find((c) => c.title.startsWith("Fibonacci")).id;
  const c1Id = st.convs.find((c) => c.title === prompt1).id;
  await page.reload();
  await page.waitForSelector("#conv-list .conv");
  eq(await page.$$eval("#conv-list .conv", (l) => l.length), 3, "conversations listed after the reload");
  check(await page.$eval("#conv-list .conv.active .conv-open", (e) => e.textContent) === "Tell me a very long story",
        "the current conversation is still selected");
  await page.click(`#conv-list .conv[data-id="${recId}"] .conv-open`);
  const recAfter = await lastAssistant();
  eq(recAfter.answerHTML, rec.answerHTML, "recorded: the answer rendered from storage (whole text) = rendered while streaming (5-byte pieces)");
  eq([recAfter.reasoning, recAfter.tools, recAfter.statsText], [rec.reasoning, rec.tools, rec.statsText], "recorded: after the reload");
  check(await page.$eval("#conv-title", (e) => e.textContent) === "Fibonacci in Python, please", "title bar names the conversation");
  await page.click(`#conv-list .conv[data-id="${c1Id}"] .conv-open`);
  eq(await page.$$eval("#log .user-text", (l) => l.map((e) => e.textContent)), [prompt1, "And one more thing"], "switched: user messages");
  eq((await page.$$eval("#log .thinking-text", (l) => l.map((e) => e.textContent)))[0], refReasoning, "switched: reasoning");
  const c1After = await lastAssistant();
  eq(c1After.stats, shown2.stats, "switched: speed line kept");

  // Retry: the last reply again, from the same history
  const nReq = chatBodies.length;
  await setSettings({ max_tokens: 8, thinking: true });
  await page.click("#log .msg.assistant:last-of-type .msg-regen");
  await waitState("done");
  check(chatBodies.length === nReq + 1, "Retry sends one request");
  eq(chatBodies[nReq].messages, sent2.messages, "Retry: the same history as the reply it replaces");
  eq([chatBodies[nReq].max_tokens, chatBodies[nReq].thinking], [8, true], "Retry: the current settings");
  const afterRetry = (await stored()).convs.find((c) => c.id === c1Id).messages;
  eq([afterRetry.length, await page.$$eval("#log .msg", (l) => l.length)], [4, 4], "Retry replaces the last reply");
  check(afterRetry[3].id !== conv2.messages[3].id, "Retry: a new reply");

  // rename (inline) and delete (two clicks) in the list
  await page.hover(`#conv-list .conv[data-id="${recId}"]`);  // the buttons show on hover (always at a phone's width)
  await page.click(`#conv-list .conv[data-id="${recId}"] .conv-rename`);
  await page.fill(".conv-title-input", "Memoized Fibonacci");
  await page.press(".conv-title-input", "Enter");
  eq(await page.$eval(`#conv-list .conv[data-id="${recId}"] .conv-open`, (e) => e.textContent), "Memoized Fibonacci", "renamed");
  const stopId = stopConv.id;
  await page.hover(`#conv-list .conv[data-id="${stopId}"]`);
  await page.click(`#conv-list .conv[data-id="${stopId}"] .conv-delete`);
  eq(await page.$$eval("#conv-list .conv", (l) => l.length), 3, "one click on delete asks first");
  await page.hover(`#conv-list .conv[data-id="${stopId}"]`);
  await page.click(`#conv-list .conv[data-id="${stopId}"] .conv-delete`);
  eq(await page.$$eval("#conv-list .conv", (l) => l.length), 2, "deleted");
  await page.reload();
  const st2 = await stored();
  eq(st2.convs.map((c) => c.title).sort(), ["Hello from the browser test", "Memoized Fibonacci"], "after rename, delete, reload");
  console.log("reload: conversations kept; switch, rename and delete work");

  // 6) themes: the system's preference, then the toggle (kept over a reload)
  const bg = () => page.evaluate(() => {
    const m = getComputedStyle(document.body).backgroundColor.match(/\d+/g).map(Number);
    return { theme: document.documentElement.dataset.theme, lum: (0.2126 * m[0] + 0.7152 * m[1] + 0.0722 * m[2]) / 255 };
  });
  await page.click(`#conv-list .conv[data-id="${recId}"] .conv-open`);
  const light = await bg();
  check(light.theme === "light" && light.lum > 0.8, "light theme by default: " + JSON.stringify(light));
  await page.emulateMedia({ colorScheme: "dark" });
  await page.waitForFunction(() => document.documentElement.dataset.theme === "dark").catch(() => {});
  const dark = await bg();
  check(dark.theme === "dark" && dark.lum < 0.2, "follows prefers-color-scheme: dark: " + JSON.stringify(dark));
  await page.evaluate(() => { document.getElementById("scroller").scrollTop = 0; });
  await shot("desktop-dark");
  await page.click("#theme");
  check((await bg()).theme === "light", "the toggle switches to light");
  await page.reload();
  check((await bg()).theme === "light", "the toggle's choice is kept over a reload (system: dark)");
  await page.click(`#conv-list .conv[data-id="${c1Id}"] .conv-open`);
  await shot("desktop-real-light");
  await page.click(`#conv-list .conv[data-id="${recId}"] .conv-open`);
  await shot("desktop-bottom-light");
  await page.evaluate(() => { document.getElementById("scroller").scrollTop = 0; });
  await shot("desktop-light");
  await page.click("#settings-btn");
  await shot("desktop-settings-light");
  await page.click("#settings-close");

  // 7) a phone's width: nothing wider than the screen (code and tables scroll inside themselves)
  await page.setViewportSize({ width: 380, height: 780 });
  const overflow = () => page.evaluate(() => {
    const W = window.innerWidth;
    const bad = [];
    if (document.documentElement.scrollWidth > W) bad.push("document " + document.documentElement.scrollWidth);
    const sc = document.getElementById("scroller");
    if (sc.scrollWidth > sc.clientWidth) bad.push("scroller " + sc.scrollWidth);
    for (const e of document.querySelectorAll("#topbar *, #log *, #composer-wrap *")) {
      if (e.closest("pre, .table-wrap") && !e.matches("pre, .table-wrap")) continue;  // scroll inside their box
      const r = e.getBoundingClientRect();
      if (r.width && (r.right > W + 0.5 || r.left < -0.5)) bad.push(`${e.tagName}.${e.className} ${r.left}..${r.right}`);
    }
    return bad;
  });
  await page.waitForFunction(() => getComputedStyle(document.getElementById("sidebar")).visibility === "hidden").catch(() => {});
  eq(await overflow(), [], "phone width: elements outside the screen");
  check(!(await page.isVisible("#sidebar")) && await page.isVisible("#menu"), "phone width: the list is behind the menu button");
  await shot("phone-light");
  await page.click("#menu");
  await page.waitForFunction(() => document.getElementById("sidebar").getBoundingClientRect().left >= 0);
  check(await page.isVisible("#conv-list .conv"), "phone width: the menu shows the list");
  await page.waitForTimeout(250);
  await shot("phone-list-light");
  await page.click(`#conv-list .conv[data-id="${c1Id}"] .conv-open`);
  check(!(await page.isVisible("#sidebar")) || await page.evaluate(() => !document.body.classList.contains("side-open")),
        "phone width: choosing a conversation closes the list");
  await page.waitForFunction(() => getComputedStyle(document.getElementById("sidebar")).visibility === "hidden");
  eq(await overflow(), [], "phone width: elements outside the screen (conversation 1)");
  await shot("phone-real-light");
  await page.click("#theme");
  await page.click("#menu");
  await page.click(`#conv-list .conv[data-id="${recId}"] .conv-open`);
  await page.waitForFunction(() => getComputedStyle(document.getElementById("sidebar")).visibility === "hidden");
  await page.evaluate(() => { document.getElementById("scroller").scrollTop = 0; });
  await shot("phone-dark");
  eq(await overflow(), [], "phone width, dark: elements outside the screen");

  // 8) images: one pasted into the message box, one dropped on the page, one picked with the image
  //    button; each shows a thumbnail, the x removes one, a dropped text file is refused; the request
  //    sends them as OpenAI image_url parts with data: URLs holding the files' exact bytes, the
  //    conversation keeps them over a reload, and the page shows what the server answers that request
  await page.setViewportSize({ width: 1280, height: 820 });
  await page.click("#new-chat");
  // the images, drawn by the browser (PNG and JPEG encoders that are not the page's)
  const drawn = await page.evaluate(async () => {
    const draw = async (w, h, colours, type) => {
      const c = document.createElement("canvas");
      c.width = w; c.height = h;
      const g = c.getContext("2d");
      colours.forEach((col, k) => { g.fillStyle = col; g.fillRect(k * w / colours.length, 0, w / colours.length, h); });
      const blob = await new Promise((r) => c.toBlob(r, type, 0.9));
      return Array.from(new Uint8Array(await blob.arrayBuffer()));
    };
    return { pasted: await draw(37, 23, ["#e63946", "#2a9d8f", "#264653"], "image/png"),
             dropped: await draw(16, 40, ["#ffb703", "#023047"], "image/png"),
             picked: await draw(50, 30, ["#8338ec", "#3a86ff", "#fb5607", "#ffbe0b"], "image/jpeg") };
  });
  const bytes = Object.fromEntries(Object.entries(drawn).map(([k, v]) => [k, Buffer.from(v)]));
  check(bytes.pasted.subarray(1, 4).toString() === "PNG" && bytes.picked[0] === 0xff && bytes.picked[1] === 0xd8,
        "the browser drew a PNG and a JPEG");
  const dataURL = (mime, b) => `data:${mime};base64,${b.toString("base64")}`;
  const want = { pasted: dataURL("image/png", bytes.pasted), dropped: dataURL("image/png", bytes.dropped),
                 picked: dataURL("image/jpeg", bytes.picked) };
  const pickedFile = path.join(tmp, "picked photo.jpg");
  fs.writeFileSync(pickedFile, bytes.picked);
  const thumbs = () => page.$$eval("#attachments .thumb img", (l) => l.map((i) => i.getAttribute("src")));
  const waitThumbs = (n) => page.waitForFunction((k) => document.querySelectorAll("#attachments .thumb img").length === k, n);
  // paste (a ClipboardEvent with the file, as the browser makes it for a pasted screenshot)
  await page.evaluate((b) => {
    const dt = new DataTransfer();
    dt.items.add(new File([new Uint8Array(b)], "image.png", { type: "image/png" }));
    document.getElementById("msg").dispatchEvent(new ClipboardEvent("paste", { clipboardData: dt, bubbles: true, cancelable: true }));
  }, drawn.pasted);
  await waitThumbs(1);
  check(!(await page.isDisabled("#send")), "an image alone enables Send");
  // drop on the conversation (dragover, then drop), and a text file dropped beside it
  const dropped = await page.evaluate((b) => {
    const dt = new DataTransfer();
    dt.items.add(new File([new Uint8Array(b)], "tall.png", { type: "image/png" }));
    dt.items.add(new File(["just text"], "notes.txt", { type: "text/plain" }));
    const log = document.getElementById("scroller");
    const over = new DragEvent("dragover", { dataTransfer: dt, bubbles: true, cancelable: true });
    log.dispatchEvent(over);
    const highlighted = document.body.classList.contains("drop-over");
    const accepted = !log.dispatchEvent(new DragEvent("drop", { dataTransfer: dt, bubbles: true, cancelable: true }));
    return { overAccepted: over.defaultPrevented, highlighted, accepted };
  }, drawn.dropped);
  eq(dropped, { overAccepted: true, highlighted: true, accepted: true }, "drag and drop of files: accepted and highlighted");
  await waitThumbs(2);
  await page.waitForFunction(() => document.getElementById("toast").textContent.includes("notes.txt"));
  check((await page.textContent("#toast")).includes("not a PNG, JPEG, WebP or GIF image (text/plain)"),
        "the dropped text file is refused: " + await page.textContent("#toast"));
  check(!(await page.evaluate(() => document.body.classList.contains("drop-over"))), "the drop ends the highlight");
  // the image button opens the file picker
  const [chooser] = await Promise.all([page.waitForEvent("filechooser"), page.click("#attach")]);
  check(chooser.isMultiple(), "the file picker takes several images");
  await chooser.setFiles(pickedFile);
  await waitThumbs(3);
  eq(await thumbs(), [want.pasted, want.dropped, want.picked], "thumbnails: the pasted, dropped and picked images' bytes");
  const thumbSizes = await page.$$eval("#attachments .thumb img", (l) => l.map((i) => [i.naturalWidth, i.naturalHeight]));
  eq(thumbSizes, [[37, 23], [16, 40], [50, 30]], "thumbnails decode to the images' sizes");
  await page.click("#attachments .thumb:nth-child(2) .thumb-remove");
  await waitThumbs(2);
  eq(await thumbs(), [want.pasted, want.picked], "x removed the second image");
  await shot("desktop-images-light");
  const nImg = chatBodies.length;
  const imgPrompt = "What is in these two images?";
  await send(imgPrompt);
  await page.waitForFunction(() => document.body.dataset.state !== "generating");
  check(chatBodies.length === nImg + 1, "one request with the images");
  const sentImg = chatBodies[nImg];
  eq(sentImg.messages, [{ role: "user", content: [{ type: "image_url", image_url: { url: want.pasted } },
                                                  { type: "image_url", image_url: { url: want.picked } },
                                                  { type: "text", text: imgPrompt }] }],
     "the request's user message: image_url parts (data: URLs) then the text");
  eq(await thumbs(), [], "sending clears the thumbnails");
  const userImgs = () => page.$$eval("#log .msg.user", (l) => Array.from(l[l.length - 1].querySelectorAll(".user-images img"))
    .map((i) => i.getAttribute("src")));
  eq(await userImgs(), [want.pasted, want.picked], "the sent message shows its images");
  // what the page shows = what the server answers the same request (greedy, not streamed): with the
  // projector `kimi convert` wrote beside the model, an answer whose prompt holds the images' tokens
  // (docs/spec/vision.md, computed by tests/agents/images.js; the text counted by /tokenize)
  const vision = fs.existsSync(gguf.replace(/\.gguf$/, ".mmproj.gguf"));
  const direct = await fetch(CHAT, { method: "POST", headers: { "Content-Type": "application/json" },
                                     body: JSON.stringify({ ...sentImg, stream: false, stream_options: undefined }) });
  const directJ = await direct.json();
  const shownImg = await lastAssistant();
  check(direct.ok === vision, `image request: HTTP ${direct.status} ${JSON.stringify(directJ).slice(0, 300)}, ` +
                             `the model ${vision ? "has" : "has no"} vision projector`);
  if (direct.ok) {
    await waitState("done");
    const m = directJ.choices[0].message;
    eq([shownImg.reasoning, shownImg.error], [m.reasoning_content || "", ""], "image turn: reasoning as the server's reply");
    const stImg = await stored();
    const storedImg = stImg.convs.find((c) => c.id === stImg.current).messages[1];
    eq(storedImg.content, m.content || "", "image turn: the streamed answer = the server's non-streamed reply");
    const noImages = await getJSON(CHAT, { method: "POST", headers: { "Content-Type": "application/json" },
      body: JSON.stringify({ ...sentImg, stream: false, stream_options: undefined, messages: [{ role: "user", content: imgPrompt }] }) });
    const perImage = async (w, h) => (await getJSON(base + "/tokenize", { method: "POST", headers: { "Content-Type": "application/json" },
      body: JSON.stringify({ content: imagePromptText(w, h).text }) })).count;
    const imageToks = (await perImage(37, 23)) + (await perImage(50, 30));
    eq(directJ.usage.prompt_tokens - noImages.usage.prompt_tokens, imageToks, "image turn: the prompt tokens the two images add");
    console.log(`images: pasted, dropped, picked; sent as image_url data: URLs; answered (${directJ.usage.prompt_tokens} prompt tokens)`);
  } else {
    await waitState("error");
    check(direct.status === 400 && directJ.error && directJ.error.message, `image request: HTTP ${direct.status} ${JSON.stringify(directJ)}`);
    eq(shownImg.error, `HTTP 400 Bad Request: ${directJ.error.message}`, "image turn: the page shows the server's 400");
    // the browser logs the failed request itself: that one line is expected
    const k = jsErrors.findIndex((e) => /Failed to load resource: .* 400 \(Bad Request\)/.test(e));
    check(k >= 0, "the browser logged no failed request for the 400");
    jsErrors.splice(k, 1);
    console.log(`images: pasted, dropped, picked; sent as image_url data: URLs; the server answered 400 "${directJ.error.message}"`);
  }
  await page.reload();
  await page.waitForSelector("#log .msg.user");
  eq(await userImgs(), [want.pasted, want.picked], "after a reload the message still shows its images");
  eq((await stored()).convs.find((c) => c.title === imgPrompt).messages[0].images, [want.pasted, want.picked],
     "the stored message keeps its images");

  check(external.length === 0, "the page requested external URLs: " + external.join(", "));
  // the page's Content-Security-Policy: even a bug that made an <img> of another host loads nothing
  const blocked = await page.evaluate(() => new Promise((resolve) => {
    document.addEventListener("securitypolicyviolation", (e) => resolve(e.effectiveDirective), { once: true });
    const img = document.createElement("img");
    img.src = "http://198.51.100.7/x.png";
    setTimeout(() => resolve("not blocked"), 2000);
  }));
  eq(blocked, "img-src", "the CSP blocks images from other hosts");
  check(jsErrors.every((e) => /198\.51\.100\.7.*Content Security Policy/.test(e)) && jsErrors.length <= 1,
        "JS errors on the page:\n" + jsErrors.join("\n"));
  if (shots.length) console.log("screenshots: " + shots.join(" "));
  console.log(`PASS: web chat page in ${((Date.now() - t0) / 1000).toFixed(1)} s (` +
              execFileSync(CHROMIUM, ["--version"], { stdio: ["ignore", "pipe", "ignore"] }).toString().trim() + ")");
}

main()
  .catch((e) => { if (!process.exitCode) { console.error("FAIL: " + (e && e.stack || e)); process.exitCode = 1; } })
  .finally(async () => {
    if (browser) await browser.close().catch(() => {});
    if (server && server.exitCode === null) server.kill("SIGTERM");
    fs.rmSync(tmp, { recursive: true, force: true });
  });
