#!/usr/bin/env node
// The official SDKs against `kimi serve` on a tiny random-weight model (loopback, offline):
// @anthropic-ai/sdk (Messages: plain, streamed, count_tokens, a forced tool call -> tool result ->
// final answer, streamed tool call, a 400) and openai (Responses: the same; chat completions: a
// streamed tool call). The SDKs parse the server's wire format themselves; the tool arguments are
// checked against the schema here, by an independent validator. A streamed tool call's arguments
// arrive in several pieces, which each SDK's own stream helper accumulates into exactly the
// arguments of the same request answered whole (greedy). One tool call at most: the field of each API,
// set through the SDK, gives one call where the same request otherwise gives several.
// Images (the tiny model converted with its vision tower, MODEL.mmproj.gguf beside it): image_url
// data: URLs in chat completions (one and two, whole and streamed), input_image in Responses, an image
// block in Messages and in count_tokens: the usage counts exactly the tokens docs/spec/vision.md makes of the
// image (the navit rule computed here, the text tokenized by /tokenize); the same requests to a server
// of the text-only file (`kimi convert --no-vision`) fail with the SDKs' 400 that names the fix.
// usage: node sdk_test.js <kimi binary>
// Without the npm packages (npm ci --prefix tests/agents) the test skips (exit 77), unless
// KIMI_REQUIRE_AGENTS=1 or CI=true, where it fails.
"use strict";
const fs = require("fs");
const os = require("os");
const path = require("path");
const { spawn, execFileSync } = require("child_process");
const { png, imagePromptText, imageTokens } = require("./images.js");

const KIMI = process.argv[2];
const STEP_MS = 60000;

function skipOrFail(why) {
  if (process.env.KIMI_REQUIRE_AGENTS === "1" || process.env.CI === "true") {
    console.error(`FAIL: ${why} (scripts/setup.sh --test installs it)`);
    process.exit(1);
  }
  console.log(`SKIP: ${why} (npm ci --prefix tests/agents)`);
  process.exit(77);
}
if (!KIMI || !fs.existsSync(KIMI)) { console.error("usage: node sdk_test.js <kimi binary>"); process.exit(2); }
let Anthropic, OpenAI;
try {
  Anthropic = require("@anthropic-ai/sdk").default;
  OpenAI = require("openai").default;
} catch (e) {
  skipOrFail("@anthropic-ai/sdk or openai is not installed");
}

let failures = 0;
function check(cond, msg) {
  if (!cond) { console.error("FAIL: " + msg); failures++; }
}

const tmp = fs.mkdtempSync(path.join(os.tmpdir(), "kimi-agents-"));

const servers = [];
function startServer(model, key) {
  return new Promise((resolve, reject) => {
    const server = spawn(KIMI, ["serve", "-m", model, "--host", "127.0.0.1", "--port", "0", "-c", "4096", "--parallel", "2",
                          "--api-key", key, "-q"], { stdio: ["ignore", "pipe", "pipe"] });
    let out = "", err = "";
    const timer = setTimeout(() => reject(new Error("kimi serve did not start in time:\n" + err)), STEP_MS);
    server.stdout.on("data", (d) => {
      out += d;
      const m = out.match(/listening on http:\/\/[^:]+:(\d+)/);
      if (m) { clearTimeout(timer); resolve(`http://127.0.0.1:${m[1]}`); }
    });
    server.stderr.on("data", (d) => { err += d; });
    server.on("exit", (code) => { clearTimeout(timer); reject(new Error(`kimi serve exited (${code}):\n${err}`)); });
    servers.push(server);
  });
}

// The schema of the test tool, and an independent check of arguments against it.
const SCHEMA = {
  type: "object",
  properties: {
    city: { type: "string", enum: ["Paris", "Oslo", "Lima"] },
    days: { type: "integer", minimum: 1 },
    units: { enum: ["c", "f"] },
    hourly: { type: "boolean" },
  },
  required: ["city", "days"],
  additionalProperties: false,
};
function fitsSchema(a) {
  if (typeof a !== "object" || a === null || Array.isArray(a)) return "not an object";
  for (const k of Object.keys(a)) if (!(k in SCHEMA.properties)) return `unknown key ${k}`;
  if (!SCHEMA.properties.city.enum.includes(a.city)) return `city ${JSON.stringify(a.city)}`;
  if (!Number.isInteger(a.days)) return `days ${JSON.stringify(a.days)}`;
  if ("units" in a && !SCHEMA.properties.units.enum.includes(a.units)) return `units ${JSON.stringify(a.units)}`;
  if ("hourly" in a && typeof a.hourly !== "boolean") return `hourly ${JSON.stringify(a.hourly)}`;
  return "";
}

async function anthropicTests(base, key) {
  const client = new Anthropic({ baseURL: base, apiKey: key, maxRetries: 0, timeout: STEP_MS });
  const user = [{ role: "user", content: "Hello there" }];
  // plain
  const m = await client.messages.create({ model: "kimi", max_tokens: 16, temperature: 0, messages: user });
  check(m.type === "message" && m.role === "assistant", "anthropic: a message");
  const text = m.content.filter((b) => b.type === "text").map((b) => b.text).join("");
  check(["end_turn", "max_tokens"].includes(m.stop_reason), `anthropic: stop_reason ${m.stop_reason}`);
  // count_tokens: the prompt the answer counted
  const ct = await client.messages.countTokens({ model: "kimi", messages: user });
  check(ct.input_tokens === m.usage.input_tokens + m.usage.cache_read_input_tokens,
        `anthropic: count_tokens ${ct.input_tokens} vs usage ${JSON.stringify(m.usage)}`);
  // streamed: the SDK's accumulated message equals the whole one (greedy)
  const stream = client.messages.stream({ model: "kimi", max_tokens: 16, temperature: 0, messages: user });
  let deltas = "";
  stream.on("text", (t) => { deltas += t; });
  const sm = await stream.finalMessage();
  const stext = sm.content.filter((b) => b.type === "text").map((b) => b.text).join("");
  check(stext === text && deltas === text, `anthropic: streamed ${JSON.stringify(stext)} vs ${JSON.stringify(text)}`);
  check(sm.stop_reason === m.stop_reason && sm.usage.output_tokens === m.usage.output_tokens, "anthropic: streamed stop/usage");
  // forced tool call -> tool result -> final answer, with thinking on (adaptive, as Claude Code sends)
  const tools = [{ name: "get_weather", description: "Weather forecast", input_schema: SCHEMA }];
  for (const streamed of [false, true]) {
    const req = { model: "kimi", max_tokens: 300, messages: user, tools, tool_choice: { type: "tool", name: "get_weather" } };
    const t = streamed ? await client.messages.stream(req).finalMessage() : await client.messages.create(req);
    check(t.stop_reason === "tool_use", `anthropic: forced call stop_reason ${t.stop_reason}`);
    const uses = t.content.filter((b) => b.type === "tool_use");
    check(uses.length === 1 && uses[0].name === "get_weather", `anthropic: one get_weather tool_use (${uses.length})`);
    if (!uses.length) continue;
    const why = fitsSchema(uses[0].input);
    check(why === "", `anthropic: tool input ${JSON.stringify(uses[0].input)}: ${why}`);
    const fin = await client.messages.create({
      model: "kimi", max_tokens: 16, tools,
      messages: [...user, { role: "assistant", content: t.content },
                 { role: "user", content: uses.map((u) => ({ type: "tool_result", tool_use_id: u.id, content: "12 C, sunny" })) }],
      thinking: { type: "adaptive" }, output_config: { effort: "low" }, tool_choice: { type: "none" },
    });
    check(fin.type === "message" && fin.stop_reason !== "tool_use", `anthropic: final answer ${fin.stop_reason}`);
  }
  // streamed tool input: several input_json_delta pieces, accumulated by the SDK's MessageStream into
  // the input of the whole answer to the same greedy request
  {
    const req = { model: "kimi", max_tokens: 300, temperature: 0, messages: user, tools,
                  tool_choice: { type: "tool", name: "get_weather" } };
    const whole = await client.messages.create(req);
    const s = client.messages.stream(req);
    const order = [];
    let pieces = 0, lastSnapshot = null;
    s.on("streamEvent", (e) => { if (e.type !== "ping") order.push(e.type === "content_block_delta" ? e.delta.type : e.type); });
    s.on("inputJson", (partial, snapshot) => { pieces++; lastSnapshot = snapshot; });
    const sm = await s.finalMessage();
    const wu = whole.content.find((b) => b.type === "tool_use"), su = sm.content.find((b) => b.type === "tool_use");
    check(wu && su, "anthropic: a tool_use whole and streamed");
    if (wu && su) {
      check(pieces >= 2, `anthropic: tool input in ${pieces} input_json_delta piece(s), want >= 2`);
      check(JSON.stringify(su.input) === JSON.stringify(wu.input) && JSON.stringify(lastSnapshot) === JSON.stringify(wu.input),
            `anthropic: streamed input ${JSON.stringify(su.input)} vs whole ${JSON.stringify(wu.input)}`);
      const why = fitsSchema(su.input);
      check(why === "", `anthropic: streamed tool input ${JSON.stringify(su.input)}: ${why}`);
      const want = ["message_start", "content_block_start", ...Array(pieces).fill("input_json_delta"), "content_block_stop",
                    "message_delta", "message_stop"];
      check(JSON.stringify(order) === JSON.stringify(want), `anthropic: stream events ${order.join(",")}`);
      console.log(`anthropic sdk: streamed tool input ${JSON.stringify(su.input)} in ${pieces} pieces`);
    }
  }
  // a tool_result for an id no tool_use has: 400 in Anthropic's shape, which the SDK reads
  try {
    await client.messages.create({ model: "kimi", max_tokens: 4,
      messages: [{ role: "user", content: [{ type: "tool_result", tool_use_id: "toolu_x", content: "x" }] }] });
    check(false, "anthropic: an unknown tool_use_id was accepted");
  } catch (e) {
    check(e.status === 400 && e.error && e.error.error && e.error.error.type === "invalid_request_error" &&
          /tool_use_id/.test(e.message), `anthropic: 400 for an unknown tool_use_id (${e.message})`);
  }
  console.log(`anthropic sdk: ok (${JSON.stringify(text).slice(0, 40)})`);
}

async function responsesTests(base, key) {
  const client = new OpenAI({ baseURL: base + "/v1", apiKey: key, maxRetries: 0, timeout: STEP_MS });
  const r = await client.responses.create({ model: "kimi", input: "Hello there", instructions: "Be brief.",
                                            max_output_tokens: 16, temperature: 0, reasoning: { effort: "none" }, store: false });
  check(r.object === "response", "responses: a response");
  const text = r.output_text;
  check(typeof text === "string", "responses: output_text");
  // streamed: the events' text equals the whole response's
  const s = client.responses.stream({ model: "kimi", input: "Hello there", instructions: "Be brief.",
                                      max_output_tokens: 16, temperature: 0, reasoning: { effort: "none" }, store: false });
  let deltas = "", last = null;
  s.on("response.output_text.delta", (e) => { deltas += e.delta; });
  // the last event: response.completed, or response.incomplete when max_output_tokens cut the answer
  for (const t of ["response.completed", "response.incomplete"]) s.on(t, (e) => { last = e; });
  await s.done();
  check(deltas === text, `responses: streamed ${JSON.stringify(deltas)} vs ${JSON.stringify(text)}`);
  check(last && last.type === (r.status === "completed" ? "response.completed" : "response.incomplete") &&
        last.response.status === r.status, `responses: the stream ends with the status (${last && last.type}, ${r.status})`);
  check(last && last.response.usage.output_tokens === r.usage.output_tokens, "responses: streamed usage");
  // reasoning on: a reasoning item with text, streamed as reasoning deltas
  const rs = client.responses.stream({ model: "kimi", input: "Hi", max_output_tokens: 8, temperature: 0, reasoning: { effort: "low" } });
  let rdeltas = "", ritem = null;
  rs.on("response.reasoning_text.delta", (e) => { rdeltas += e.delta; });
  rs.on("response.output_item.done", (e) => { if (e.item.type === "reasoning") ritem = e.item; });
  await rs.done();
  check(ritem && rdeltas.length > 0 && ritem.content[0].text === rdeltas, "responses: reasoning deltas == the reasoning item");
  // forced function call -> output -> final answer
  const tools = [{ type: "function", name: "get_weather", description: "Weather forecast", parameters: SCHEMA, strict: false }];
  for (const streamed of [false, true]) {
    const req = { model: "kimi", input: [{ role: "user", content: "Weather in Oslo?" }], tools,
                  tool_choice: { type: "function", name: "get_weather" }, max_output_tokens: 300, reasoning: { effort: "none" } };
    const t = streamed ? await client.responses.stream(req).finalResponse() : await client.responses.create(req);
    const calls = t.output.filter((o) => o.type === "function_call");
    const call = calls[0];
    check(calls.length === 1 && call.name === "get_weather", `responses: one get_weather function_call (${calls.length})`);
    if (!call) continue;
    let args = null;
    try { args = JSON.parse(call.arguments); } catch (e) { check(false, `responses: arguments not JSON: ${call.arguments}`); }
    const why = fitsSchema(args);
    check(why === "", `responses: arguments ${call.arguments}: ${why}`);
    const fin = await client.responses.create({
      model: "kimi", tools, max_output_tokens: 16, reasoning: { effort: "none" }, tool_choice: "none",
      input: [...req.input, call, { type: "function_call_output", call_id: call.call_id, output: "12 C" }],
    });
    check(fin.object === "response" && !fin.output.some((o) => o.type === "function_call"), "responses: final answer");
  }
  // streamed function call arguments: several delta events, accumulated by the SDK's ResponseStream
  // into the arguments of the whole answer to the same greedy request
  {
    const req = { model: "kimi", input: [{ role: "user", content: "Weather in Oslo?" }], tools, temperature: 0,
                  tool_choice: { type: "function", name: "get_weather" }, max_output_tokens: 300, reasoning: { effort: "none" } };
    const whole = await client.responses.create(req);
    const s = client.responses.stream(req);
    const order = [];
    let deltas = "", pieces = 0, doneArgs = null;
    s.on("event", (e) => { if (/function_call|output_item/.test(e.type)) order.push(e.type); });
    s.on("response.function_call_arguments.delta", (e) => { deltas += e.delta; pieces++; });
    s.on("response.function_call_arguments.done", (e) => { doneArgs = e.arguments; });
    const fr = await s.finalResponse();
    const wc = whole.output.find((o) => o.type === "function_call"), sc = fr.output.find((o) => o.type === "function_call");
    check(wc && sc, "responses: a function_call whole and streamed");
    if (wc && sc) {
      check(pieces >= 2, `responses: arguments in ${pieces} delta event(s), want >= 2`);
      check(sc.arguments === wc.arguments && deltas === wc.arguments && doneArgs === wc.arguments,
            `responses: streamed arguments ${sc.arguments} / deltas ${deltas} vs whole ${wc.arguments}`);
      let args = null;
      try { args = JSON.parse(sc.arguments); } catch (e) { check(false, `responses: streamed arguments not JSON: ${sc.arguments}`); }
      const why = fitsSchema(args);
      check(why === "", `responses: streamed arguments ${sc.arguments}: ${why}`);
      const want = ["response.output_item.added", ...Array(pieces).fill("response.function_call_arguments.delta"),
                    "response.function_call_arguments.done", "response.output_item.done"];
      check(JSON.stringify(order) === JSON.stringify(want), `responses: stream events ${order.join(",")}`);
      console.log(`openai responses sdk: streamed arguments ${sc.arguments} in ${pieces} pieces`);
    }
  }
  try {
    await client.responses.create({ model: "kimi", input: "x", previous_response_id: r.id });
    check(false, "responses: previous_response_id was accepted");
  } catch (e) {
    check(e.status === 400 && /previous_response_id/.test(e.message), `responses: 400 for previous_response_id (${e.message})`);
  }
  console.log(`openai responses sdk: ok (${JSON.stringify(text).slice(0, 40)})`);
}

// OpenAI chat completions: a forced tool call streamed through the SDK's ChatCompletionStream, its
// arguments in several delta chunks, accumulated into exactly the arguments of the whole answer.
async function chatTests(base, key) {
  const client = new OpenAI({ baseURL: base + "/v1", apiKey: key, maxRetries: 0, timeout: STEP_MS });
  const tools = [{ type: "function", function: { name: "get_weather", description: "Weather forecast", parameters: SCHEMA } }];
  const req = { model: "kimi", messages: [{ role: "user", content: "Weather in Lima?" }], tools, max_tokens: 300, temperature: 0,
                tool_choice: { type: "function", function: { name: "get_weather" } }, thinking: false };
  const whole = await client.chat.completions.create(req);
  const wc = whole.choices[0].message.tool_calls && whole.choices[0].message.tool_calls[0];
  check(whole.choices[0].finish_reason === "tool_calls" && wc, `chat: a forced call (${whole.choices[0].finish_reason})`);
  const s = client.chat.completions.stream(req);
  let pieces = 0, deltas = "", doneArgs = null;
  s.on("tool_calls.function.arguments.delta", (e) => { if (e.arguments_delta) { pieces++; deltas += e.arguments_delta; } });
  s.on("tool_calls.function.arguments.done", (e) => { doneArgs = e.arguments; });
  const fin = await s.finalChatCompletion();
  const sc = fin.choices[0].message.tool_calls && fin.choices[0].message.tool_calls[0];
  check(fin.choices[0].finish_reason === "tool_calls" && sc, `chat: a streamed forced call (${fin.choices[0].finish_reason})`);
  if (!wc || !sc) return;
  check(pieces >= 2, `chat: arguments in ${pieces} delta chunk(s), want >= 2`);
  check(sc.function.name === "get_weather" && sc.type === "function" && sc.id.startsWith("call_"), `chat: streamed call ${JSON.stringify(sc)}`);
  check(sc.function.arguments === wc.function.arguments && deltas === wc.function.arguments && doneArgs === wc.function.arguments,
        `chat: streamed arguments ${sc.function.arguments} vs whole ${wc.function.arguments}`);
  let args = null;
  try { args = JSON.parse(sc.function.arguments); } catch (e) { check(false, `chat: arguments not JSON: ${sc.function.arguments}`); }
  const why = fitsSchema(args);
  check(why === "", `chat: streamed arguments ${sc.function.arguments}: ${why}`);
  console.log(`openai chat sdk: ok (${sc.function.arguments.slice(0, 60)}, ${pieces} pieces)`);
}

// One tool call at most, set through each SDK's own field: Anthropic tool_choice.disable_parallel_tool_use,
// Responses and chat parallel_tool_calls false. On this model the same greedy forced request writes
// several calls when they are allowed (checked first, so the test fails if that premise breaks).
async function oneCallTests(base, key) {
  const anthropic = new Anthropic({ baseURL: base, apiKey: key, maxRetries: 0, timeout: STEP_MS });
  const openai = new OpenAI({ baseURL: base + "/v1", apiKey: key, maxRetries: 0, timeout: STEP_MS });
  const user = [{ role: "user", content: "Weather in Oslo and Paris?" }];
  const schema = { type: "object", properties: { zone: { enum: ["UTC", "CET"] } }, required: ["zone"] };
  const atools = [{ name: "get_weather", input_schema: SCHEMA }, { name: "get_time", input_schema: schema }];
  const counts = {};
  for (const disable of [false, true]) {
    const m = await anthropic.messages.create({ model: "kimi", max_tokens: 240, temperature: 0, messages: user, tools: atools,
                                                tool_choice: { type: "any", disable_parallel_tool_use: disable } });
    counts["anthropic " + disable] = m.content.filter((b) => b.type === "tool_use").length;
    if (disable) check(m.stop_reason === "tool_use", `one call: anthropic stop_reason ${m.stop_reason}`);
  }
  const rtools = atools.map((t) => ({ type: "function", name: t.name, parameters: t.input_schema, strict: false }));
  for (const parallel of [true, false]) {
    const r = await openai.responses.create({ model: "kimi", input: user, tools: rtools, tool_choice: "required", temperature: 0,
                                              max_output_tokens: 240, reasoning: { effort: "none" }, parallel_tool_calls: parallel });
    counts["responses " + !parallel] = r.output.filter((o) => o.type === "function_call").length;
    check(r.parallel_tool_calls === parallel, `one call: responses echoes parallel_tool_calls ${r.parallel_tool_calls}`);
  }
  const ctools = atools.map((t) => ({ type: "function", function: { name: t.name, parameters: t.input_schema } }));
  for (const parallel of [true, false]) {
    const c = await openai.chat.completions.create({ model: "kimi", messages: user, tools: ctools, tool_choice: "required",
                                                     temperature: 0, max_tokens: 240, thinking: false, parallel_tool_calls: parallel });
    counts["chat " + !parallel] = (c.choices[0].message.tool_calls || []).length;
    if (!parallel) check(c.choices[0].finish_reason === "tool_calls", `one call: chat finish_reason ${c.choices[0].finish_reason}`);
  }
  for (const api of ["anthropic", "responses", "chat"]) {
    check(counts[api + " false"] >= 2, `one call: ${api} with several calls allowed gives ${counts[api + " false"]} call(s), want >= 2`);
    check(counts[api + " true"] === 1, `one call: ${api} with one call at most gives ${counts[api + " true"]} call(s)`);
  }
  console.log(`one call at most: ${JSON.stringify(counts)}`);
}

// Images through the three APIs. `base`: the vision-capable server; `textBase`: the text-only one.
async function imageTests(base, textBase, key) {
  const anthropic = new Anthropic({ baseURL: base, apiKey: key, maxRetries: 0, timeout: STEP_MS });
  const openai = new OpenAI({ baseURL: base + "/v1", apiKey: key, maxRetries: 0, timeout: STEP_MS });
  const W = 60, H = 40, W2 = 301, H2 = 97;
  const b64 = png(W, H, 1).toString("base64"), b64b = png(W2, H2, 2).toString("base64");
  const url = "data:image/png;base64," + b64, url2 = "data:image/png;base64," + b64b;
  const perImage = await imageTokens(base, key, W, H), perImage2 = await imageTokens(base, key, W2, H2);
  check(perImage >= imagePromptText(W, H).pads + 3 && perImage2 >= imagePromptText(W2, H2).pads + 3,
        `images: ${W}x${H} makes ${perImage} tokens, ${W2}x${H2} ${perImage2} (docs/spec/vision.md)`);
  const question = "What is in the picture?";
  const part = async (what, fn) => {  // one API's part: an exception fails it, the others still run
    try { await fn(); } catch (e) { check(false, `images, ${what}: ${e.message}`); }
  };

  // chat completions: one image, then two, each against the same request without them
  await part("chat completions", async () => {
    const chat = (content, extra) => openai.chat.completions.create({ model: "kimi", messages: [{ role: "user", content }],
                                                                     max_tokens: 4, temperature: 0, thinking: false, ...extra });
    const ctext = await chat([{ type: "text", text: question }]);
    const c1 = await chat([{ type: "image_url", image_url: { url } }, { type: "text", text: question }]);
    const c2 = await chat([{ type: "image_url", image_url: { url, detail: "high" } }, { type: "image_url", image_url: { url: url2 } },
                           { type: "text", text: question }]);
    check(c1.object === "chat.completion" && c1.choices[0].message.role === "assistant", "images: chat completion");
    check(c1.usage.prompt_tokens - ctext.usage.prompt_tokens === perImage,
          `images: chat prompt_tokens ${c1.usage.prompt_tokens} = ${ctext.usage.prompt_tokens} without the image + ${perImage}`);
    check(c2.usage.prompt_tokens - ctext.usage.prompt_tokens === perImage + perImage2,
          `images: chat with two images ${c2.usage.prompt_tokens} = ${ctext.usage.prompt_tokens} + ${perImage} + ${perImage2}`);
    // streamed through the SDK's helper: the same text and usage as the whole answer (greedy)
    const st = openai.chat.completions.stream({ model: "kimi", max_tokens: 4, temperature: 0, thinking: false,
      messages: [{ role: "user", content: [{ type: "image_url", image_url: { url } }, { type: "text", text: question }] }],
      stream_options: { include_usage: true } });
    const sc = await st.finalChatCompletion();
    check(sc.choices[0].message.content === c1.choices[0].message.content && sc.usage && sc.usage.prompt_tokens === c1.usage.prompt_tokens,
          `images: streamed chat ${JSON.stringify(sc.choices[0].message.content)} / ${sc.usage && sc.usage.prompt_tokens} vs ` +
          `${JSON.stringify(c1.choices[0].message.content)} / ${c1.usage.prompt_tokens}`);
  });

  // Responses: input_image
  await part("responses", async () => {
    const resp = (content) => openai.responses.create({ model: "kimi", input: [{ role: "user", content }], max_output_tokens: 4,
                                                        temperature: 0, reasoning: { effort: "none" }, store: false });
    const rtext = await resp([{ type: "input_text", text: question }]);
    const r1 = await resp([{ type: "input_image", image_url: url, detail: "auto" }, { type: "input_text", text: question }]);
    check(r1.object === "response" && ["completed", "incomplete"].includes(r1.status), `images: responses status ${r1.status}`);
    check(r1.usage.input_tokens - rtext.usage.input_tokens === perImage,
          `images: responses input_tokens ${r1.usage.input_tokens} = ${rtext.usage.input_tokens} without the image + ${perImage}`);
  });

  // Messages: an image block; count_tokens counts it as the answer's usage does
  const amsg = (content) => ({ model: "kimi", max_tokens: 4, temperature: 0, messages: [{ role: "user", content }] });
  const ablock = { type: "image", source: { type: "base64", media_type: "image/png", data: b64 } };
  const { max_tokens: _m, temperature: _t, ...countReq } = amsg([ablock, { type: "text", text: question }]);
  await part("messages", async () => {
    const atext = await anthropic.messages.create(amsg([{ type: "text", text: question }]));
    const a1 = await anthropic.messages.create(amsg([ablock, { type: "text", text: question }]));
    const used = (m) => m.usage.input_tokens + (m.usage.cache_read_input_tokens || 0);
    check(a1.type === "message" && used(a1) - used(atext) === perImage,
          `images: messages input ${used(a1)} = ${used(atext)} without the image + ${perImage}`);
    const ct = await anthropic.messages.countTokens(countReq);
    check(ct.input_tokens === used(a1), `images: count_tokens ${ct.input_tokens} vs the answer's usage ${used(a1)}`);
  });
  console.log(`images: ${W}x${H} = ${perImage} prompt tokens, ${W2}x${H2} = ${perImage2}, counted by chat, responses, ` +
              `messages and count_tokens`);

  // the text-only file: each API's SDK gets a 400 that says how to get a vision-capable file
  const topenai = new OpenAI({ baseURL: textBase + "/v1", apiKey: key, maxRetries: 0, timeout: STEP_MS });
  const tanth = new Anthropic({ baseURL: textBase, apiKey: key, maxRetries: 0, timeout: STEP_MS });
  const refusals = {
    chat: () => topenai.chat.completions.create({ model: "kimi", max_tokens: 4,
      messages: [{ role: "user", content: [{ type: "image_url", image_url: { url } }, { type: "text", text: question }] }] }),
    responses: () => topenai.responses.create({ model: "kimi", max_output_tokens: 4,
      input: [{ role: "user", content: [{ type: "input_image", image_url: url, detail: "auto" }] }] }),
    messages: () => tanth.messages.create(amsg([ablock, { type: "text", text: question }])),
    count_tokens: () => tanth.messages.countTokens(countReq),
  };
  for (const [api, call] of Object.entries(refusals)) {
    try {
      await call();
      check(false, `images, text-only model: ${api} accepted an image`);
    } catch (e) {
      check(e.status === 400 && /mmproj/.test(e.message) && /--no-vision|kimi convert/.test(e.message),
            `images, text-only model: ${api}: ${e.status} ${e.message}`);
      if (api === "chat") console.log(`images, text-only model: 400 "${e.message}"`);
    }
  }
}

(async () => {
  try {
    const hf = path.join(tmp, "hf"), gguf = path.join(tmp, "tiny.gguf");
    execFileSync(KIMI, ["synth", "--preset", "tiny", "--seed", "3", "-o", hf], { stdio: "ignore", timeout: 120000 });
    execFileSync(KIMI, ["convert", hf, "-o", gguf, "--quiet"], { stdio: "ignore", timeout: 120000 });
    const key = "test-key-" + process.pid;
    const base = await startServer(gguf, key);
    check(fs.existsSync(path.join(tmp, "tiny.mmproj.gguf")), "kimi convert wrote no tiny.mmproj.gguf");
    await anthropicTests(base, key);
    await responsesTests(base, key);
    await chatTests(base, key);
    await oneCallTests(base, key);
    const textOnly = path.join(tmp, "text", "tiny.gguf");
    fs.mkdirSync(path.dirname(textOnly));
    execFileSync(KIMI, ["convert", hf, "-o", textOnly, "--no-vision", "--quiet"], { stdio: "ignore", timeout: 120000 });
    check(!fs.existsSync(path.join(tmp, "text", "tiny.mmproj.gguf")), "convert --no-vision wrote a projector file");
    await imageTests(base, await startServer(textOnly, key), key);
  } catch (e) {
    console.error("FAIL: " + (e && e.stack ? e.stack : e));
    failures++;
  } finally {
    for (const p of servers) p.kill("SIGTERM");
    fs.rmSync(tmp, { recursive: true, force: true });
  }
  if (failures) { console.error(`${failures} check(s) failed`); process.exit(1); }
  console.log("PASS");
})();
