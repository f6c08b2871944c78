#!/usr/bin/env node
// Browser test of the chat page `kimi serve` serves at / (index.html in src/server/web/):
// a real headless Chromium (Debian's, driven by playwright-core) sends a chat message, the streamed
// reasoning and answer must equal a direct non-streaming greedy request's, and Stop must end a long
// generation (the server's slot goes idle again). Any page JS error fails the test.
// usage: node webui_test.js <kimi binary> [page source, to compare with what is served]
// Without chromium or playwright-core the test skips (exit 77), unless KIMI_REQUIRE_BROWSER=1,
// CI=true or KIMI_REQUIRE_VULKAN=1 (scripts/test.sh), where it fails.
"use strict";
const fs = require("fs");
const os = require("os");
const path = require("path");
const { spawn, execFileSync } = require("child_process");

const KIMI = process.argv[2];
const PAGE_SRC = process.argv[3];
const CHROMIUM = process.env.KIMI_CHROMIUM || "/usr/bin/chromium";
const STEP_MS = 30000;  // every wait is bounded

function fail(msg) {
  console.error("FAIL: " + msg);
  process.exitCode = 1;
  throw new Error(msg);
}
function check(cond, msg) { if (!cond) fail(msg); }

function skipOrFail(why) {
  const env = process.env;
  const required = env.KIMI_REQUIRE_BROWSER === "1" || env.CI === "true" || env.KIMI_REQUIRE_VULKAN === "1";
  if (required) {
    console.error(`FAIL: ${why} (required: KIMI_REQUIRE_BROWSER=1, CI=true or KIMI_REQUIRE_VULKAN=1; ` +
                  "scripts/setup.sh installs it)");
    process.exit(1);
  }
  console.log(`SKIP: ${why} (scripts/setup.sh installs it)`);
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
    server.stderr.on("data", (d) => { err += d; });
    server.on("exit", (code) => { clearTimeout(timer); reject(new Error(`kimi serve exited (${code}):\n${err}`)); });
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

async function main() {
  // a tiny synthetic model (seconds to make)
  const hf = path.join(tmp, "hf");
  const gguf = path.join(tmp, "tiny.gguf");
  kimi(["synth", "--preset", "tiny", "--seed", "3", "-o", hf]);
  kimi(["convert", hf, "-o", gguf, "--quiet"]);
  const base = await startServer(gguf);

  // the page itself: served at / and /index.html as HTML, byte for byte the embedded source file
  for (const p of ["/", "/index.html"]) {
    const r = await fetch(base + p);
    check(r.status === 200, `GET ${p}: HTTP ${r.status}`);
    check((r.headers.get("content-type") || "").startsWith("text/html"), `GET ${p}: Content-Type ${r.headers.get("content-type")}`);
    const body = await r.text();
    if (PAGE_SRC) check(body === fs.readFileSync(PAGE_SRC, "utf8"), `GET ${p}: body differs from ${PAGE_SRC}`);
    check(body.includes("<title>kimi.cpp chat</title>"), `GET ${p}: not the chat page`);
  }
  const post = await fetch(base + "/", { method: "POST", body: "x" });
  check(post.status === 405, `POST /: HTTP ${post.status}, expected 405`);

  // a fresh profile in the temp dir (Playwright takes it as the persistent context's user data dir)
  browser = await chromium.launchPersistentContext(path.join(tmp, "profile"), {
    executablePath: CHROMIUM,
    headless: true,
    timeout: STEP_MS,
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
  page.on("request", (r) => { if (r.url().endsWith("/v1/chat/completions")) chatBodies.push(r.postDataJSON()); });

  await page.goto(base + "/", { timeout: STEP_MS });
  check(await page.title() === "kimi.cpp chat", "page title");

  // 1) a greedy chat turn, streamed; counts how often the reasoning/answer text changes while it streams
  await page.fill("#temperature", "0");
  await page.fill("#top_p", "1");
  await page.fill("#max_tokens", "48");
  await page.check("#thinking");
  await page.evaluate(() => {
    window.__updates = 0;
    new MutationObserver((ms) => { window.__updates += ms.length; })
      .observe(document.getElementById("log"), { subtree: true, childList: true, characterData: true });
  });
  const prompt = "Hello from the browser test";
  await page.fill("#msg", prompt);
  await page.click("#send");
  await page.waitForFunction(() => document.getElementById("status").textContent.startsWith("done"), null,
                             { timeout: STEP_MS });
  const shown = await page.evaluate(() => ({
    reasoning: document.querySelector(".assistant .reasoning-text").textContent,
    reasoningShown: !document.querySelector(".assistant details.reasoning").hidden,
    answer: document.querySelector(".assistant .answer").textContent,
    user: document.querySelector(".user").textContent,
    updates: window.__updates,
    status: document.getElementById("status").textContent,
  }));
  check(shown.user === prompt, "the user's message is shown");
  check(chatBodies.length === 1, `one chat request, saw ${chatBodies.length}`);
  const sent = chatBodies[0];
  check(sent.stream === true && sent.thinking === true && sent.temperature === 0 && sent.top_p === 1 &&
        sent.max_tokens === 48, "request settings: " + JSON.stringify(sent));
  // the same request without streaming: the page must show exactly its reasoning and answer
  const ref = await getJSON(base + "/v1/chat/completions", {
    method: "POST", headers: { "Content-Type": "application/json" },
    body: JSON.stringify({ ...sent, stream: false }),
  });
  const msg = ref.choices[0].message;
  const refReasoning = msg.reasoning_content || "";
  const refAnswer = msg.content || "";
  check(refReasoning.length + refAnswer.length > 0, "the reference answer is empty");
  check(shown.reasoning === refReasoning, `reasoning shown ${JSON.stringify(shown.reasoning)} != ${JSON.stringify(refReasoning)}`);
  check(shown.answer === refAnswer, `answer shown ${JSON.stringify(shown.answer)} != ${JSON.stringify(refAnswer)}`);
  check(shown.reasoningShown === (refReasoning.length > 0), "reasoning block visible iff there is reasoning");
  check(shown.status === `done (${ref.choices[0].finish_reason})`, `status ${shown.status}`);
  // streamed = shown in more than one piece; how many depends on the load (the server sends what
  // accumulated since its last write as one event: a 48-token reply came as 4 to 33 pieces)
  check(shown.updates >= 2, `the text was not updated while streaming (${shown.updates} DOM updates)`);
  console.log(`turn 1: ${ref.usage ? ref.usage.completion_tokens : "?"} tokens, ${shown.updates} DOM updates, ` +
              `reasoning ${refReasoning.length} chars, answer ${refAnswer.length} chars: equal to the non-streamed reply`);

  // 2) Stop: a long generation, stopped after the first streamed text; the request must end
  //    (the page says "stopped", the server's slot is idle again, Send works again)
  //    (the tiny model makes ~1000-3000 tokens/s and may sample an end of turn at any point: the
  //    request gets a GBNF grammar added on its way that derives no end, so the answer cannot finish
  //    before max_tokens (30000); without thinking the grammar holds from the first token. Its
  //    lines are short words: one endless word would make every streamed update re-wrap it all)
  const addEndlessGrammar = (route) => {
    const b = route.request().postDataJSON();
    route.continue({ postData: JSON.stringify({ ...b, grammar: 'root ::= ([a-z]{1,8} " "){1,8} "\\n" root' }) });
  };
  await page.click("#clear");  // New chat: empties the history and the log
  check(await page.evaluate(() => document.getElementById("log").children.length) === 0, "New chat empties the log");
  await page.route(base + "/v1/chat/completions", addEndlessGrammar);
  await page.fill("#max_tokens", "30000");
  await page.uncheck("#thinking");
  await page.fill("#msg", "Tell me a very long story");
  await page.click("#send");
  await page.waitForFunction(() => {
    const a = document.querySelectorAll(".assistant");
    const last = a[a.length - 1];
    return last && (last.querySelector(".answer").textContent + last.querySelector(".reasoning-text").textContent).length > 0;
  }, null, { timeout: STEP_MS });
  check(await page.isEnabled("#stop"), "Stop is enabled while generating (status: " +
        await page.textContent("#status") + ", " + await page.evaluate(() => document.getElementById("log").textContent.length) + " chars shown)");
  await page.click("#stop");
  await page.waitForFunction(() => document.getElementById("status").textContent === "stopped", null, { timeout: STEP_MS });
  check(await page.isEnabled("#send") && !(await page.isEnabled("#stop")), "after Stop: Send enabled, Stop disabled");
  await waitFor("the server to cancel the stopped request (slot idle, kimi_requests_total{result=\"cancelled\"} 1)",
                async () => {
    const slots = await getJSON(base + "/slots");
    const metrics = await (await fetch(base + "/metrics")).text();
    const c = metrics.match(/^kimi_requests_total\{result="cancelled"\} (\d+)/m);
    return Array.isArray(slots) && slots.every((x) => !x.is_processing) && c && Number(c[1]) === 1;
  });
  await page.unroute(base + "/v1/chat/completions", addEndlessGrammar);
  console.log("turn 2: stopped after the first streamed text; the server cancelled it and its slot is idle");

  // 3) Send works again after Stop, with thinking off: the answer (no reasoning) again equals the
  //    non-streamed reply, and the request carries the history since New chat (the stopped turn)
  await page.fill("#max_tokens", "12");
  await page.fill("#msg", "again");
  await page.click("#send");
  await page.waitForFunction(() => document.getElementById("status").textContent.startsWith("done"), null, { timeout: STEP_MS });
  check(chatBodies.length === 3, `three chat requests, saw ${chatBodies.length}`);
  const third = chatBodies[2];
  check(third.thinking === false && third.messages.length === 3, "third request: thinking off, 3 messages (turn 2 and 3): " + JSON.stringify(third));
  const ref3 = await getJSON(base + "/v1/chat/completions", {
    method: "POST", headers: { "Content-Type": "application/json" }, body: JSON.stringify({ ...third, stream: false }),
  });
  const shown3 = await page.evaluate(() => {
    const a = document.querySelectorAll(".assistant");
    const last = a[a.length - 1];
    return { answer: last.querySelector(".answer").textContent, reasoning: last.querySelector(".reasoning-text").textContent };
  });
  const ref3Answer = ref3.choices[0].message.content || "";
  check(ref3Answer.length > 0, "turn 3: the reference answer is empty");
  check(shown3.answer === ref3Answer, `turn 3: answer shown ${JSON.stringify(shown3.answer)} != ${JSON.stringify(ref3Answer)}`);
  check(shown3.reasoning === (ref3.choices[0].message.reasoning_content || ""), "turn 3: reasoning");
  console.log(`turn 3: thinking off, answer ${ref3Answer.length} chars: equal to the non-streamed reply`);

  check(external.length === 0, "the page requested external URLs: " + external.join(", "));
  check(jsErrors.length === 0, "JS errors on the page:\n" + jsErrors.join("\n"));
  console.log("PASS: web chat page (streaming, reasoning block, settings, Stop) in " + execFileSync(CHROMIUM, ["--version"]).toString().trim());
}

main()
  .catch((e) => { if (!process.exitCode) { console.error("FAIL: " + (e && e.stack || e)); process.exitCode = 1; } })
  .finally(async () => {
    if (browser) await browser.close().catch(() => {});
    if (server && server.exitCode === null) server.kill("SIGTERM");
    fs.rmSync(tmp, { recursive: true, force: true });
  });
