#!/usr/bin/env node
// The agent CLIs against `kimi serve` on a tiny random-weight model, offline on loopback, as
// docs/agents.md runs them: `claude -p` (Claude Code, Anthropic Messages API, streamed, its full
// system prompt and tools) and `codex exec` (Codex CLI, OpenAI Responses API) must each complete a
// turn and exit 0, and the server must have answered their requests with 200. Codex also completes
// its turn when its `stream_idle_timeout_ms` is shorter than the prefill it meets (a server that reads
// the prompt in small chunks): the server's progress events during the prefill are activity to it.
// usage: node cli_test.js <kimi binary>
// The CLIs live in a cache folder outside the tree (~800 MB with their native binaries):
// $KIMI_AGENT_CLI_DIR, else ${XDG_CACHE_HOME:-~/.cache}/kimi.cpp/agent-clis, where
// `scripts/setup.sh --test` installs tests/agents/cli/package.json. A CLI that is not there is
// skipped with one line (exit 77 when both are), unless KIMI_REQUIRE_AGENTS=1.
"use strict";
const fs = require("fs");
const os = require("os");
const path = require("path");
const { spawn, execFileSync } = require("child_process");

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

// Runs a CLI (no network beyond loopback is needed: telemetry and updates off); resolves with its
// exit status (asynchronously: the server's log keeps being read meanwhile).
function run(name, args, env, cwd) {
  return new Promise((resolve) => {
    const t0 = Date.now();
    const p = spawn(bin(name), args, { cwd, env: { PATH: process.env.PATH, ...env }, stdio: ["ignore", "pipe", "pipe"] });
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
    if (have.codex) {
      const codexHome = path.join(tmp, "codex");
      codexConfig(codexHome, port);
      const st = await run("codex", ["exec", "--skip-git-repo-check", "Say hi"],
                     { HOME: home, CODEX_HOME: codexHome, KIMI_API_KEY: key }, work);
      check(st === 0, `codex exec exited ${st}`);
      check(served("/v1/responses") >= 1, "codex: no POST /v1/responses answered 200");

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
