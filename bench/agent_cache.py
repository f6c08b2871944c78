#!/usr/bin/env python3
"""Prompt-cache benchmark for agent loops (docs/agents.md "Prompt cache"; not a test).

Drives `kimi serve` with a recorded Claude-Code-like conversation: a long system prompt and tool
declarations (several K tokens), then turns that each add the assistant's tool call and the tool's
result. Measures, with the store (--cache-ram) and --cache-dir:

  A. one conversation: turn 2 (= turn 1 + a tool call + its result) against turn 1: cached tokens
     as a share of turn 1's prompt, and time to first token (a max_tokens=1 request) vs turn 1's;
  B. 4 agents x 5 turns, interleaved (4 client threads) on --parallel 2: the share of the
     follow-up turns' prefix tokens (the previous turn's prompt) that came from the cache;
  C. restart: turn 1 with --cache-dir, the server stopped (SIGTERM) and started again on the same
     directory, then turn 2: its time to first token vs turn 1's cold one.

    python3 bench/agent_cache.py [-m models/small.gguf] [-c 65536] [--system-words 2500] [--json]

Standard library only. Prints one table; --json prints the numbers as JSON too.
"""
import argparse
import http.client
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time

WORDS = ("the file path config test build error read write edit grep search function class module "
         "import return value result output input line code change commit branch merge review tool "
         "call shell command directory list project source header library option flag default user "
         "agent task step plan check verify run fix update create delete rename move copy").split()


def text(n, seed):
    out, x = [], seed * 2654435761 % 2**32 or 1
    for i in range(n):
        x = (x * 1103515245 + 12345) % 2**31
        out.append(WORDS[x % len(WORDS)])
        if i % 13 == 12:
            out[-1] += ".\n"
    return " ".join(out)


TOOLS = [{"type": "function", "function": {
    "name": name, "description": text(40, 100 + k),
    "parameters": {"type": "object", "properties": {
        "path": {"type": "string", "description": text(12, 200 + k)},
        "pattern": {"type": "string", "description": text(10, 300 + k)},
        "limit": {"type": "integer", "description": "maximum number of results"}},
        "required": ["path"]}}} for k, name in enumerate(
            ["Read", "Write", "Edit", "Grep", "Glob", "Bash", "LS", "TodoWrite"])]


def conversation(agent, turns, system_words):
    """The messages of `turns` turns: system, the task, then per extra turn an assistant tool call
    and the tool's result (as recorded from a coding agent: read a file, grep, run the tests)."""
    msgs = [{"role": "system", "content": "You are a coding agent working in a repository.\n" + text(system_words, 7)},
            {"role": "user", "content": f"Task {agent}: " + text(60, 1000 + agent)}]
    for t in range(1, turns):
        call_id = f"call_{agent}_{t}"
        tool = ["Read", "Grep", "Bash", "Edit"][t % 4]
        msgs.append({"role": "assistant", "content": text(8, 5000 + 10 * agent + t),
                     "tool_calls": [{"id": call_id, "type": "function", "function": {
                         "name": tool, "arguments": json.dumps({"path": f"src/mod{agent}/file{t}.cpp"})}}]})
        msgs.append({"role": "tool", "tool_call_id": call_id, "content": text(40, 9000 + 10 * agent + t)})
    return msgs


class Server:
    def __init__(self, kimi, model, ctx, parallel, extra, threads):
        cmd = [kimi, "serve", "-m", model, "--port", "0", "-c", str(ctx), "--parallel", str(parallel),
               "-t", str(threads), "--queue", "64", "--timeout", "0"] + extra
        self.err = tempfile.TemporaryFile(mode="w+")
        self.proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=self.err, text=True)
        line = self.proc.stdout.readline()
        m = re.search(r"http://([\d.]+):(\d+)", line)
        if not m:
            self.proc.kill()
            self.err.seek(0)
            sys.exit(f"kimi serve did not start: {line!r}\n{self.err.read()}")
        self.host, self.port = m.group(1), int(m.group(2))

    def chat(self, messages, max_tokens=1, tools=True):
        body = {"messages": messages, "max_tokens": max_tokens, "temperature": 0, "thinking": False,
                "ignore_eos": True}
        if tools:
            body["tools"] = TOOLS
        conn = http.client.HTTPConnection(self.host, self.port, timeout=3600)
        t0 = time.perf_counter()
        conn.request("POST", "/v1/chat/completions", body=json.dumps(body), headers={"Content-Type": "application/json"})
        resp = conn.getresponse()
        data = resp.read()
        dt = time.perf_counter() - t0
        if resp.status != 200:
            sys.exit(f"HTTP {resp.status}: {data[:300]!r}")
        u = json.loads(data)["usage"]
        return {"s": dt, "prompt": u["prompt_tokens"], "cached": u["prompt_tokens_details"]["cached_tokens"]}

    def stop(self):
        self.proc.send_signal(signal.SIGTERM)
        self.proc.wait(timeout=600)
        self.err.seek(0)
        return self.err.read()


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("-m", "--model", default="models/small.gguf")
    ap.add_argument("--kimi", default=os.path.join(os.path.dirname(__file__), "..", "build", "kimi"))
    ap.add_argument("-c", "--ctx", type=int, default=65536)
    ap.add_argument("-t", "--threads", type=int, default=0)
    ap.add_argument("--system-words", type=int, default=700, help="length of the system prompt")
    ap.add_argument("--agents", type=int, default=4)
    ap.add_argument("--turns", type=int, default=5)
    ap.add_argument("--gen", type=int, default=8, help="tokens generated per turn in B")
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    if not os.path.exists(a.kimi) or not os.path.exists(a.model):
        sys.exit(f"need {a.kimi} and {a.model} (kimi synth --preset small; kimi convert)")
    res = {}
    cache_dir = tempfile.mkdtemp(prefix="kimi-agent-cache-")
    try:
        # A: one conversation, turn 2 after turn 1 (the store; no spare sequences)
        s = Server(a.kimi, a.model, a.ctx, 1, ["--cache-slots", "0"], a.threads)
        s.chat([{"role": "user", "content": "warm up"}], tools=False)  # shares nothing with the agents
        t1 = s.chat(conversation(0, 1, a.system_words))
        t2 = s.chat(conversation(0, 2, a.system_words))
        log = s.stop()
        m = re.search(r"KDA states \(([\d.]+) MiB\) and (\d+) bytes per token", log)
        res["A"] = {"turn1": t1, "turn2": t2, "cached_share": t2["cached"] / t1["prompt"],
                    "ttft_ratio": t2["s"] / t1["s"],
                    "entry_state_mib": float(m.group(1)) if m else None, "row_bytes": int(m.group(2)) if m else None}

        # B: agents interleaved on --parallel 2
        s = Server(a.kimi, a.model, a.ctx, 2, ["--cache-slots", "0"], a.threads)
        s.chat([{"role": "user", "content": "warm up"}], tools=False)  # shares nothing with the agents
        lock, rows = threading.Lock(), []

        t0 = time.perf_counter()
        # the first agent reads the shared system prompt first; the others start after its turn 1
        # (sub-agents spawned by a main agent) and then all run at once
        first = threading.Event()

        def agent(k):
            prev = 0
            for t in range(1, a.turns + 1):
                r = s.chat(conversation(k, t, a.system_words), a.gen)
                with lock:
                    rows.append((k, t, prev, r))
                prev = r["prompt"]
                first.set()

        th = [threading.Thread(target=agent, args=(k,)) for k in range(1, a.agents + 1)]
        th[0].start()
        first.wait()
        for x in th[1:]:
            x.start()
        for x in th:
            x.join()
        wall = time.perf_counter() - t0
        log_b = s.stop()
        fu = [(prev, r) for (k, t, prev, r) in rows if t > 1]
        res["B"] = {"follow_ups": len(fu), "prefix_tokens": sum(p for p, _ in fu),
                    "cached_tokens": sum(min(r["cached"], p) for p, r in fu),
                    "all_prompt_tokens": sum(r["prompt"] for (_, _, _, r) in rows),
                    "all_cached_tokens": sum(r["cached"] for (_, _, _, r) in rows), "wall_s": wall,
                    "exit_line": next((ln for ln in log_b.splitlines() if "at exit" in ln), "")}
        res["B"]["cached_share"] = res["B"]["cached_tokens"] / max(1, res["B"]["prefix_tokens"])

        # C: restart with --cache-dir
        s = Server(a.kimi, a.model, a.ctx, 1, ["--cache-slots", "0", "--cache-dir", cache_dir], a.threads)
        s.chat([{"role": "user", "content": "warm up"}], tools=False)  # shares nothing with the agents
        cold = s.chat(conversation(99, 1, a.system_words))
        s.stop()
        files = [f for f in os.listdir(cache_dir) if f.endswith(".kpc")]
        size = sum(os.path.getsize(os.path.join(cache_dir, f)) for f in files)
        s = Server(a.kimi, a.model, a.ctx, 1, ["--cache-slots", "0", "--cache-dir", cache_dir], a.threads)
        warm = s.chat(conversation(99, 2, a.system_words))
        s.stop()
        res["C"] = {"cold": cold, "after_restart": warm, "ttft_ratio": warm["s"] / cold["s"], "files": len(files),
                    "file_mib": size / 1048576.0}
    finally:
        shutil.rmtree(cache_dir, ignore_errors=True)

    A, B, C = res["A"], res["B"], res["C"]
    print(f"A  turn 1: {A['turn1']['prompt']} prompt tokens, TTFT {A['turn1']['s']:.2f} s (cold)")
    print(f"   turn 2: {A['turn2']['prompt']} prompt tokens, {A['turn2']['cached']} cached "
          f"({100 * A['cached_share']:.1f} % of turn 1's prompt), TTFT {A['turn2']['s']:.3f} s "
          f"({100 * A['ttft_ratio']:.1f} % of turn 1)")
    print(f"   entry: KDA states {A['entry_state_mib']} MiB + {A['row_bytes']} bytes per token not shared")
    print(f"B  {a.agents} agents x {a.turns} turns, --parallel 2: follow-up prefix tokens from the cache "
          f"{B['cached_tokens']}/{B['prefix_tokens']} = {100 * B['cached_share']:.1f} %; all prompts "
          f"{B['all_cached_tokens']}/{B['all_prompt_tokens']} cached; wall {B['wall_s']:.1f} s")
    print(f"   {B['exit_line']}")
    print(f"C  restart: cold turn 1 TTFT {C['cold']['s']:.2f} s ({C['cold']['prompt']} tokens); after the restart "
          f"turn 2 TTFT {C['after_restart']['s']:.3f} s ({C['after_restart']['cached']} of "
          f"{C['after_restart']['prompt']} cached) = {100 * C['ttft_ratio']:.1f} % of cold; "
          f"{C['files']} files, {C['file_mib']:.1f} MiB")
    if a.json:
        print(json.dumps(res, indent=1))


if __name__ == "__main__":
    main()
