#!/usr/bin/env python3
"""An agent's cold turn: time to first token of a coding agent's first request, kimi beside llama.cpp.

The request is bench/data/claude_code_first_request.json: the first POST /v1/messages of Claude Code 2.1.332
(`claude -p "Say hi"`, 22 tools, its full system prompt), captured once from a loopback listener (the
request's metadata field dropped). It is turned into an OpenAI-style body (system text, the user message's
text blocks, the tools as functions), rendered with `kimi template render`, and its tokens counted with the
model's own vocabulary (`kimi tokenize -m MODEL`; a synthetic model's learned vocabulary gives other counts
than the real K3 tokenizer: --tiktoken FILE counts with a tiktoken rank file too, e.g. o200k). Then, in
rounds (kimi, then llama.cpp when --llama is given, so both see the same machine state):

  kimi bench -m MODEL -p N -n 1 -r 1 -o json     (its warm-up pass untimed, as llama-bench does)
  LLAMA MODEL_LLAMA -p N -n 1 -r 1 -o jsonl      (llama-bench compatible: ../shared/tools/llama-ref bench)

Time to first token = N / prefill t/s + 1 / decode t/s. Prints min / median / max over the rounds.

  python3 bench/cold_turn.py -m /work/models-prefill/small.gguf -t 2 --rounds 1
  python3 bench/cold_turn.py -m MODEL.gguf --llama ~/.cache/kimi-llama-ref/bin/bench --llama-model K3.gguf -t 2
  python3 bench/cold_turn.py -m MODEL.gguf --tokens 2048     # time 2048 tokens instead (kimi bench: random ids)

Exit status: 0, 2 on bad arguments, 1 when a program fails.
"""
import argparse
import json
import os
import shlex
import statistics
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))


def run(cmd, stdin=None):
    p = subprocess.run(cmd, input=stdin, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    if p.returncode != 0:
        sys.stderr.write(f"cold_turn: {' '.join(map(shlex.quote, cmd))} exited {p.returncode}\n{p.stderr[-4000:]}")
        sys.exit(1)
    return p.stdout


def block_text(content):
    if isinstance(content, str):
        return content
    return "\n".join(b.get("text", "") for b in content if b.get("type") == "text")


def openai_body(req):
    """The Anthropic Messages request as the OpenAI-style body `kimi template render` takes."""
    msgs = []
    if req.get("system"):
        msgs.append({"role": "system", "content": block_text(req["system"])})
    for m in req["messages"]:
        msgs.append({"role": m["role"], "content": block_text(m["content"])})
    tools = [{"type": "function", "function": {"name": t["name"], "description": t.get("description", ""),
                                               "parameters": t.get("input_schema", {"type": "object"})}}
             for t in req.get("tools", [])]
    return {"messages": msgs, "tools": tools}


def count_tokens(kimi, prompt, model=None, tiktoken=None):
    with tempfile.NamedTemporaryFile("w", suffix=".txt", delete=False) as f:
        f.write(prompt)
        path = f.name
    try:
        cmd = [kimi, "tokenize", "--json", path] + (["-m", model] if model else ["--tiktoken", tiktoken])
        return len(json.loads(run(cmd)))
    finally:
        os.unlink(path)


def stat(v):
    return f"{min(v):.4g} / {statistics.median(v):.4g} / {max(v):.4g}" if v else "-"


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("-m", "--model", required=True, help="kimi's GGUF")
    ap.add_argument("--kimi", default=os.path.join(HERE, "..", "build", "kimi"))
    ap.add_argument("--request", default=os.path.join(HERE, "data", "claude_code_first_request.json"))
    ap.add_argument("--tiktoken", help="also count the prompt with this tiktoken rank file")
    ap.add_argument("--tokens", type=int, default=0, help="time this many tokens instead of the whole prompt")
    ap.add_argument("--llama", help="a llama-bench compatible program (../shared/tools/llama-ref bench)")
    ap.add_argument("--llama-model", help="llama.cpp's GGUF (default: -m; a K3.1 file needs its no-indexer twin)")
    ap.add_argument("-t", "--threads", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--kimi-args", default="", help="more kimi bench options, e.g. \"-b 4096\"")
    a = ap.parse_args()
    if a.rounds < 1 or a.tokens < 0:
        ap.error("--rounds >= 1, --tokens >= 0")
    req = json.load(open(a.request))
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
        json.dump(openai_body(req), f)
        body = f.name
    try:
        prompt = run([a.kimi, "template", "render", body])
    finally:
        os.unlink(body)
    n_model = count_tokens(a.kimi, prompt, model=a.model)
    print(f"request: {os.path.basename(a.request)}: {len(req.get('tools', []))} tools, {len(prompt)} characters "
          f"rendered, {n_model} tokens with the model's vocabulary", end="")
    if a.tiktoken:
        print(f", {count_tokens(a.kimi, prompt, tiktoken=a.tiktoken)} with {os.path.basename(a.tiktoken)}", end="")
    print()
    n = a.tokens or n_model
    kimi_ttft, llama_ttft, kimi_pp, llama_pp = [], [], [], []
    for _ in range(a.rounds):
        j = json.loads(run([a.kimi, "bench", "-m", a.model, "-p", str(n), "-n", "1", "-r", "1", "-t", str(a.threads),
                            "-o", "json"] + shlex.split(a.kimi_args)))
        pp, tg = j["pp"]["tok_s"], j["tg"]["tok_s"]
        kimi_pp.append(pp)
        kimi_ttft.append(n / pp + 1 / tg)
        if a.llama:
            out = run([a.llama, a.llama_model or a.model, "-p", str(n), "-n", "1", "-r", "1", "-t", str(a.threads),
                       "-o", "jsonl"])
            rows = [json.loads(l) for l in out.splitlines() if l.startswith("{")]
            lpp = max(r["avg_ts"] for r in rows if r.get("n_prompt", 0) > 0)
            ltg = max(r["avg_ts"] for r in rows if r.get("n_gen", 0) > 0)
            llama_pp.append(lpp)
            llama_ttft.append(n / lpp + 1 / ltg)
    print(f"{n} prompt tokens, {a.threads} threads, {a.rounds} round(s), min / median / max:")
    print(f"  kimi:      prefill {stat(kimi_pp)} t/s, time to first token {stat(kimi_ttft)} s")
    if a.llama:
        ratio = [l / k for k, l in zip(kimi_ttft, llama_ttft)]
        print(f"  llama.cpp: prefill {stat(llama_pp)} t/s, time to first token {stat(llama_ttft)} s")
        print(f"  llama.cpp's time / kimi's, per round: {stat(ratio)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
