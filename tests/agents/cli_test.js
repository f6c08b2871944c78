#!/usr/bin/env node
// The agent CLIs against `kimi serve` on a tiny random-weight model, offline on loopback, as
// docs/agents.md runs them: `claude -p` (Claude Code, Anthropic Messages API, streamed, its full
// system prompt and tools) and `codex exec` (Codex CLI, OpenAI Responses API) must each complete a
// turn and exit 0, and the server must have answered their requests with 200. Codex also completes
// its turn when its `stream_idle_timeout_ms` is shorter than the prefill it meets (a server that reads
// the prompt in small chunks): the server's progress events during the prefill are activity to it.
// Images: a PNG attached to Claude Code's -p prompt (stream-json input) arrives as an `image` block of
// the user message; Claude Code reads another with its Read tool and sends it back as an `image` block
// inside a `tool_result`; `codex exec -i` attaches one as an `input_image` of the user message, and
// Codex's `view_image` tool returns the other as an `input_image` in `function_call_output`.
// The random-weight model would not call those tools by itself, so a loopback proxy between the CLI
// and the server scripts that one call (forcing the tool and narrowing its schema to the image's
// path; the server's grammar then writes exactly that call) and pins the turn after the tool result
// to text; the images the CLIs send pass through untouched. Checked: each turn exits 0, the request
// with the image carries the file's exact bytes and was answered 200, and its prompt holds the
// image's tokens (its usage = the same request counted again, and the same request with the image
// swapped for a 28 x 28 one counts exactly the difference of the two images' tokens by
// docs/spec/vision.md fewer).
// usage: node cli_test.js <kimi binary>
// The CLIs live in a cache folder outside the tree (~800 MB with their native binaries):
// $KIMI_AGENT_CLI_DIR, else ${XDG_CACHE_HOME:-~/.cache}/kimi.cpp/agent-clis, where
// `scripts/setup.sh --test` installs tests/agents/cli/package.json. A CLI that is not there is
// skipped with one line (exit 77 when both are), unless KIMI_REQUIRE_AGENTS=1.
"use strict";
const fs = require("fs");
const os = require("os");
const path = require("path");
const http = require("http");
const { spawn, execFileSync } = require("child_process");
const { png, imageTokens } = require("./images.js");

const KIMI = process.argv[2];
const STEP_MS = 300000;
if (!KIMI || !fs.existsSync(KIMI)) { console.error("usage: node cli_test.js <kimi binary>"); process.exit(2); }
const cliDir = process.env.KIMI_AGENT_CLI_DIR ||
               path.join(process.env.XDG_CACHE_HOME || path.join(os.homedir(), ".cache"), "kimi.cpp", "agent-clis");
const bin = (name) => path.join(cliDir, "node_modules", ".bin", name);
const have = { claude: fs.existsSync(bin("claude")), codex: fs.existsSync(bin("codex")) };
for (const [name, ok] of Object.entries(have)) {
  if (ok) continue;
  if (process.env.KIMI_REQUIRE_AGENTS === "1") {
    console.error(`FAIL: ${name} is not installed in ${cliDir} (scripts/setup.sh --test installs it)`);
    process.exit(1);
  }
  console.log(`SKIP: ${name}: not installed in ${cliDir} (scripts/setup.sh --test installs it)`);
}
if (!have.claude && !have.codex) process.exit(77);

const tmp = fs.mkdtempSync(path.join(os.tmpdir(), "kimi-agent-cli-"));
let server = null, serverErr = "";
const others = [];  // further servers (startOther)
let failures = 0;
function check(cond, msg) {
  if (!cond) { console.error("FAIL: " + msg); failures++; }
}

function startServer(model, key) {
  return new Promise((resolve, reject) => {
    server = spawn(KIMI, ["serve", "-m", model, "--host", "127.0.0.1", "--port", "0", "-c", "65536", "--parallel", "1",
                          "--api-key", key, "-v"], { stdio: ["ignore", "pipe", "pipe"] });
    let out = "";
    const timer = setTimeout(() => reject(new Error("kimi serve did not start in time:\n" + serverErr)), 60000);
    server.stdout.on("data", (d) => {
      out += d;
      const m = out.match(/listening on http:\/\/[^:]+:(\d+)/);
      if (m) { clearTimeout(timer); resolve(m[1]); }
    });
    server.stderr.on("data", (d) => { serverErr += d; });
    server.on("exit", (code) => { clearTimeout(timer); reject(new Error(`kimi serve exited (${code}):\n${serverErr}`)); });
  });
}

// Another server with more flags; resolves with { port, log() } (its stderr so far).
function startOther(model, key, extra) {
  return new Promise((resolve, reject) => {
    let err = "", out = "";
    const proc = spawn(KIMI, ["serve", "-m", model, "--host", "127.0.0.1", "--port", "0", "-c", "65536", "--parallel", "1",
                              "--api-key", key, ...extra], { stdio: ["ignore", "pipe", "pipe"] });
    others.push(proc);
    const timer = setTimeout(() => reject(new Error("kimi serve did not start in time:\n" + err)), 60000);
    proc.stdout.on("data", (d) => {
      out += d;
      const m = out.match(/listening on http:\/\/[^:]+:(\d+)/);
      if (m) { clearTimeout(timer); resolve({ port: m[1], log: () => err }); }
    });
    proc.stderr.on("data", (d) => { err += d; });
    proc.on("exit", (code) => { clearTimeout(timer); reject(new Error(`kimi serve exited (${code}):\n${err}`)); });
  });
}

// The longest prompt evaluation of the /v1/responses requests in a server's log from `from` on
// (its per-request line: "prompt N tokens (C cached) S s"), in seconds.
function longestPrefill(log, from) {
  let s = 0;
  for (const m of log.slice(from).matchAll(/POST \/v1\/responses \S+: \w+; prompt \d+ tokens \(\d+ cached\) ([0-9.]+) s/g))
    s = Math.max(s, parseFloat(m[1]));
  return s;
}

// Codex's config: the kimi provider at `port`, with more provider keys.
function codexConfig(home, port, extra) {
  fs.mkdirSync(home, { recursive: true });
  fs.writeFileSync(path.join(home, "config.toml"),
                   `model = "kimi"\nmodel_provider = "kimi"\n\n[model_providers.kimi]\nname = "kimi serve"\n` +
                   `base_url = "http://127.0.0.1:${port}/v1"\nwire_api = "responses"\nenv_key = "KIMI_API_KEY"\n` + (extra || ""));
}

// The scripting proxy: listens on an ephemeral loopback port, forwards every request to kimi serve at
// `port` after `rewrite(url, body)` (which may change the parsed JSON body in place), streams the
// answer back, and records {url, body (as forwarded), status, answer (the whole response text)}.
function startProxy(port, rewrite) {
  const log = [];
  const proxy = http.createServer((req, res) => {
    const parts = [];
    req.on("data", (d) => parts.push(d));
    req.on("end", () => {
      let raw = Buffer.concat(parts);
      const entry = { url: req.url, body: null, status: 0, answer: "" };
      log.push(entry);
      try {
        entry.body = JSON.parse(raw.toString("utf8"));
        if (rewrite(req.url, entry.body)) raw = Buffer.from(JSON.stringify(entry.body));
      } catch (_) { /* not JSON: forwarded as it is */ }
      const headers = { ...req.headers, host: `127.0.0.1:${port}`, "content-length": String(raw.length) };
      const up = http.request({ host: "127.0.0.1", port, path: req.url, method: req.method, headers }, (ur) => {
        entry.status = ur.statusCode;
        res.writeHead(ur.statusCode, ur.headers);
        ur.on("data", (d) => { entry.answer += d; res.write(d); });
        ur.on("end", () => res.end());
      });
      up.on("error", (e) => { entry.status = 502; res.writeHead(502); res.end(String(e)); });
      up.end(raw);
    });
  });
  others.push({ kill: () => proxy.close() });
  return new Promise((resolve) => proxy.listen(0, "127.0.0.1", () => resolve({ port: proxy.address().port, log })));
}
// Forces the tool `name` with its one argument `arg` = `value` on a request that offers it and holds
// no tool result yet; a request with a tool result gets tool choice "none" (a text answer).
function scriptToolCall(name, arg, value, resultType, forced, none) {
  return (url, body) => {
    const tools = Array.isArray(body.tools) ? body.tools : [];
    const tool = tools.find((t) => t.name === name);
    if (!tool) return false;
    if (JSON.stringify(body.messages || body.input || []).includes(`"type":"${resultType}"`)) {
      body.tool_choice = none;
      return true;
    }
    const schema = { type: "object", properties: { [arg]: { type: "string", enum: [value] } }, required: [arg], additionalProperties: false };
    if (tool.input_schema) tool.input_schema = schema; else tool.parameters = schema;
    body.tool_choice = forced;
    return true;
  };
}
// SSE answer text -> the parsed `data:` events
function sseEvents(text) {
  return text.split("\n").filter((l) => l.startsWith("data: ") && l !== "data: [DONE]").map((l) => JSON.parse(l.slice(6)));
}
async function post(port, key, url, body) {
  const r = await fetch(`http://127.0.0.1:${port}${url}`, { method: "POST", body: JSON.stringify(body),
    headers: { "Content-Type": "application/json", Authorization: "Bearer " + key, "x-api-key": key, "anthropic-version": "2023-06-01" } });
  const j = await r.json();
  if (!r.ok) throw new Error(`${url}: HTTP ${r.status} ${JSON.stringify(j)}`);
  return j;
}

// Runs a CLI (no network beyond loopback is needed: telemetry and updates off); resolves with its
// exit status (asynchronously: the server's log keeps being read meanwhile).
// `input`: written to its stdin (else none).
function run(name, args, env, cwd, input) {
  return new Promise((resolve) => {
    const t0 = Date.now();
    const p = spawn(bin(name), args, { cwd, env: { PATH: process.env.PATH, ...env }, stdio: [input ? "pipe" : "ignore", "pipe", "pipe"] });
    if (input) p.stdin.end(input);
    let out = "";
    p.stdout.on("data", (d) => { out += d; });
    p.stderr.on("data", (d) => { out += d; });
    const timer = setTimeout(() => p.kill("SIGKILL"), STEP_MS);
    p.on("close", (code) => {
      clearTimeout(timer);
      if (code !== 0) console.error(`${name} output:\n${out.slice(-4000)}`);
      console.log(`${name}: exit ${code} in ${((Date.now() - t0) / 1000).toFixed(1)} s`);
      setTimeout(() => resolve(code), 200);  // the server's last log lines
    });
  });
}

function served(pathPrefix) {  // requests the server answered with 200 on that path (its -v lines)
  const re = new RegExp(`^POST ${pathPrefix.replace(/\//g, "\\/")}\\S* -> 200$`, "gm");
  return (serverErr.match(re) || []).length;
}

(async () => {
  try {
    const hf = path.join(tmp, "hf"), gguf = path.join(tmp, "tiny.gguf");
    execFileSync(KIMI, ["synth", "--preset", "tiny", "--seed", "3", "-o", hf], { stdio: "ignore", timeout: 120000 });
    execFileSync(KIMI, ["convert", hf, "-o", gguf, "--quiet"], { stdio: "ignore", timeout: 120000 });
    const key = "test-key-" + process.pid;
    const port = await startServer(gguf, key);
    const home = path.join(tmp, "home"), work = path.join(tmp, "work");
    fs.mkdirSync(home);
    fs.mkdirSync(work);
    if (have.claude) {
      const st = await run("claude", ["-p", "Say hi", "--model", "kimi", "--max-turns", "1"], {
        HOME: home, ANTHROPIC_BASE_URL: `http://127.0.0.1:${port}`, ANTHROPIC_API_KEY: key,
        DISABLE_TELEMETRY: "1", DISABLE_ERROR_REPORTING: "1", DISABLE_AUTOUPDATER: "1",
        CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC: "1",
      }, work);
      check(st === 0, `claude -p exited ${st}`);
      check(served("/v1/messages") >= 1, "claude: no POST /v1/messages answered 200");
    }
    const IMG_W = 60, IMG_H = 40;
    const shot = png(IMG_W, IMG_H, 7);
    const shotPath = path.join(work, "screenshot.png");
    fs.writeFileSync(shotPath, shot);
    const perImage = await imageTokens(`http://127.0.0.1:${port}`, key, IMG_W, IMG_H);
    const attached = png(45, 31, 8), attachedPath = path.join(work, "attached.png");
    fs.writeFileSync(attachedPath, attached);
    const perAttached = await imageTokens(`http://127.0.0.1:${port}`, key, 45, 31);
    // the reference request: the image swapped for a 28 x 28 one (one <|media_pad|>), so the text
    // around it tokenizes the same (removing it could join two text pieces into other tokens)
    const small = png(28, 28, 9), perSmall = await imageTokens(`http://127.0.0.1:${port}`, key, 28, 28);
    const smallB64 = small.toString("base64");
    if (have.claude) {
      const claudeEnv = (proxyPort) => ({
        HOME: home, ANTHROPIC_BASE_URL: `http://127.0.0.1:${proxyPort}`, ANTHROPIC_API_KEY: key,
        DISABLE_TELEMETRY: "1", DISABLE_ERROR_REPORTING: "1", DISABLE_AUTOUPDATER: "1",
        CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC: "1",
      });
      // the image blocks of a message: at the top (attached) or inside tool_result blocks (read)
      const topImages = (m) => (Array.isArray(m.content) ? m.content : []).filter((b) => b.type === "image");
      const resultImages = (m) => (Array.isArray(m.content) ? m.content : []).flatMap((b) =>
        b.type === "tool_result" && Array.isArray(b.content) ? b.content.filter((c) => c.type === "image") : []);
      // the first request of `log` with an image that `where` finds: the file's bytes, HTTP 200, and
      // a prompt of count_tokens(request) tokens, perImg - perSmall more than with the small image
      const claudeImage = async (log, where, swap, bytes, perImg, what) => {
        const e = log.find((x) => x.url.startsWith("/v1/messages") && !x.url.includes("count_tokens") && x.body &&
                                  (x.body.messages || []).some((m) => where(m).length));
        check(e, `claude: no request with ${what} (${log.length} requests)`);
        if (!e) return;
        const img = e.body.messages.flatMap(where)[0];
        check(img.source.type === "base64" && img.source.media_type === "image/png" &&
              Buffer.from(img.source.data, "base64").equals(bytes), `claude: ${what} is not the file's bytes`);
        check(e.status === 200, `claude: the request with ${what} got HTTP ${e.status}: ${e.answer.slice(0, 300)}`);
        if (e.status !== 200) return;
        const u = sseEvents(e.answer).find((x) => x.type === "message_start").message.usage;
        const prompt = u.input_tokens + (u.cache_read_input_tokens || 0);
        const countOf = async (body) => (await post(port, key, "/v1/messages/count_tokens",
          { model: body.model, system: body.system, messages: body.messages, tools: body.tools, thinking: body.thinking,
            tool_choice: body.tool_choice })).input_tokens;
        const counted = await countOf(e.body);
        const swapped = await countOf({ ...e.body, messages: e.body.messages.map(swap) });
        check(prompt === counted && counted - swapped === perImg - perSmall,
              `claude, ${what}: prompt ${prompt} tokens, count_tokens ${counted}, with a 28x28 image instead ${swapped}; ` +
              `the images make ${perImg} and ${perSmall}`);
        console.log(`claude: ${what} -> HTTP 200, prompt ${prompt} tokens (${perImg} of the image)`);
      };

      // an image attached to the -p prompt (stream-json input: a user message with an image block)
      const pass = await startProxy(port, () => false);
      const userMsg = { type: "user", message: { role: "user", content: [
        { type: "image", source: { type: "base64", media_type: "image/png", data: attached.toString("base64") } },
        { type: "text", text: "What does this image show?" }] } };
      const sta = await run("claude", ["-p", "--input-format", "stream-json", "--output-format", "stream-json", "--verbose",
                                       "--model", "kimi", "--max-turns", "1"], claudeEnv(pass.port), work,
                            JSON.stringify(userMsg) + "\n");
      check(sta === 0, `claude -p with an attached image exited ${sta}`);
      const smallBlock = (b) => (b.type === "image" ? { ...b, source: { ...b.source, data: smallB64 } } : b);
      await claudeImage(pass.log, topImages, (m) => ({ ...m, content: Array.isArray(m.content) ? m.content.map(smallBlock) : m.content }),
                        attached, perAttached, "an attached image block");

      // a screenshot read by the model: Read -> an image block in the tool_result -> the answer
      const proxy = await startProxy(port, scriptToolCall("Read", "file_path", shotPath, "tool_result",
                                                          { type: "tool", name: "Read" }, { type: "none" }));
      const st = await run("claude", ["-p", "What does screenshot.png show?", "--model", "kimi", "--max-turns", "3",
                                      "--allowedTools", "Read"], claudeEnv(proxy.port), work);
      check(st === 0, `claude -p reading an image exited ${st}`);
      await claudeImage(proxy.log, resultImages, (m) => ({ ...m, content: Array.isArray(m.content) ? m.content.map((b) =>
        (b.type === "tool_result" && Array.isArray(b.content) ? { ...b, content: b.content.map(smallBlock) } : b)) : m.content }),
                        shot, perImage, "Read's image block in a tool_result");
    }
    if (have.codex) {
      const codexHome = path.join(tmp, "codex");
      codexConfig(codexHome, port);
      const st = await run("codex", ["exec", "--skip-git-repo-check", "Say hi"],
                     { HOME: home, CODEX_HOME: codexHome, KIMI_API_KEY: key }, work);
      check(st === 0, `codex exec exited ${st}`);
      check(served("/v1/responses") >= 1, "codex: no POST /v1/responses answered 200");

      // an image attached with -i (an input_image in the user message), then view_image -> an
      // input_image in the function_call_output -> the answer
      const proxy = await startProxy(port, scriptToolCall("view_image", "path", shotPath, "function_call_output",
                                                          { type: "function", name: "view_image" }, "none"));
      const imgHome = path.join(tmp, "codex-image");
      codexConfig(imgHome, proxy.port);
      const sti = await run("codex", ["exec", "--skip-git-repo-check", "What do these images show?", "-i", attachedPath],
                            { HOME: home, CODEX_HOME: imgHome, KIMI_API_KEY: key }, work);
      check(sti === 0, `codex exec -i with view_image exited ${sti}`);
      const isImg = (o) => o && o.type === "input_image";
      const userImages = (item) => (item.role === "user" && Array.isArray(item.content) ? item.content : []).filter(isImg);
      const outputImages = (item) => (item.type === "function_call_output" && Array.isArray(item.output) ? item.output : []).filter(isImg);
      const responses = proxy.log.filter((e) => e.url.startsWith("/v1/responses") && e.body && Array.isArray(e.body.input));
      const bytesOf = (img) => { const m = /^data:image\/png;base64,(.*)$/.exec(img.image_url || ""); return m ? Buffer.from(m[1], "base64") : null; };
      // the request's prompt tokens as answered, the same request again, and again with `swap`'s small image
      const promptCheck = async (e, swap, perImg, what) => {
        check(e.status === 200, `codex: the request with ${what} got HTTP ${e.status}: ${e.answer.slice(0, 300)}`);
        if (e.status !== 200) return;
        const done = sseEvents(e.answer).find((x) => x.type === "response.completed" || x.type === "response.incomplete");
        const prompt = done.response.usage.input_tokens;
        const again = async (input) => (await post(port, key, "/v1/responses",
                                                   { ...e.body, input, stream: false, max_output_tokens: 1 })).usage.input_tokens;
        const counted = await again(e.body.input), swapped = await again(e.body.input.map(swap));
        check(prompt === counted && counted - swapped === perImg - perSmall,
              `codex, ${what}: prompt ${prompt} tokens, the same again ${counted}, with a 28x28 image instead ${swapped}; ` +
              `the images make ${perImg} and ${perSmall}`);
        console.log(`codex: ${what} -> HTTP 200, prompt ${prompt} tokens (${perImg} of the image)`);
      };
      const smallImage = (o) => (isImg(o) ? { ...o, image_url: "data:image/png;base64," + smallB64 } : o);
      const first = responses.find((e) => e.body.input.some((i) => userImages(i).length));
      check(first, `codex: no request with an input_image in a user message (${proxy.log.length} requests)`);
      if (first) {
        const img = first.body.input.flatMap(userImages)[0];
        check((bytesOf(img) || Buffer.alloc(0)).equals(attached), "codex: the attached input_image is not the file's bytes");
        await promptCheck(first, (i) => (userImages(i).length ? { ...i, content: i.content.map(smallImage) } : i),
                          perAttached, "an image attached with -i");
      }
      const withOutput = responses.find((e) => e.body.input.some((i) => outputImages(i).length));
      check(withOutput, `codex: no request with an input_image in a function_call_output (${proxy.log.length} requests)`);
      if (withOutput) {
        const img = withOutput.body.input.flatMap(outputImages)[0];
        check((bytesOf(img) || Buffer.alloc(0)).equals(shot), "codex: view_image's input_image is not the file's bytes");
        await promptCheck(withOutput, (i) => (outputImages(i).length ? { ...i, output: i.output.map(smallImage) } : i),
                          perImage, "view_image's input_image in function_call_output");
      }

      // A long prefill: no prompt cache, 16-token chunks. The first turn (default idle timeout)
      // measures it; the second runs with stream_idle_timeout_ms an eighth of it and no stream retry,
      // and must complete its turn as well (on a server that sent only SSE comments while it read the
      // prompt, Codex gave up: "idle timeout waiting for SSE").
      const slow = await startOther(gguf, key, ["--no-prompt-cache", "--chunk", "16", "--max-chunks", "1"]);
      const slowHome = path.join(tmp, "codex-slow");
      codexConfig(slowHome, slow.port);
      const st1 = await run("codex", ["exec", "--skip-git-repo-check", "Say hi"],
                            { HOME: home, CODEX_HOME: slowHome, KIMI_API_KEY: key }, work);
      check(st1 === 0, `codex exec (long prefill, default idle timeout) exited ${st1}`);
      const prefill = longestPrefill(slow.log(), 0);
      check(prefill > 0, "codex: no /v1/responses prefill in the log of the second server");
      const idleMs = Math.max(20, Math.floor(prefill * 1000 / 8));
      const idleHome = path.join(tmp, "codex-idle");
      codexConfig(idleHome, slow.port, `stream_idle_timeout_ms = ${idleMs}\nstream_max_retries = 0\n`);
      const mark = slow.log().length;
      const st2 = await run("codex", ["exec", "--skip-git-repo-check", "Say hi"],
                            { HOME: home, CODEX_HOME: idleHome, KIMI_API_KEY: key }, work);
      const prefill2 = longestPrefill(slow.log(), mark);
      console.log(`codex: prefill ${prefill.toFixed(2)} s, then ${prefill2.toFixed(2)} s with stream_idle_timeout_ms = ${idleMs}`);
      check(st2 === 0, `codex exec with stream_idle_timeout_ms = ${idleMs} (prefill ${prefill2} s) exited ${st2}`);
      check(prefill2 * 1000 > idleMs, `the prefill (${prefill2} s) was not longer than stream_idle_timeout_ms = ${idleMs}`);
    }
  } catch (e) {
    console.error("FAIL: " + (e && e.stack ? e.stack : e));
    failures++;
  } finally {
    if (server) server.kill("SIGTERM");
    for (const p of others) p.kill("SIGTERM");
    fs.rmSync(tmp, { recursive: true, force: true });
  }
  if (failures) {
    console.error(`${failures} check(s) failed; kimi serve's log:\n${serverErr.slice(-4000)}`);
    process.exit(1);
  }
  console.log("PASS");
})();
