#!/usr/bin/env python3
"""Load benchmark for `kimi serve` (python3 stdlib only).

Starts `kimi serve` on an ephemeral port (or uses --url), then for each concurrency level runs
C clients that each send --requests streaming /v1/completions requests (a --prompt-tokens long
random-text prompt, --max-tokens generated with ignore_eos) and reports:
  aggregate generation tokens/s (all generated tokens / wall time), mean and p50/p90 time to first
  token, per-request decode tokens/s; then a load test (--load-requests from --load-clients
  concurrent clients, small max_tokens) with errors and the server's RSS before/after.

  python3 bench/serve_bench.py                       # models/small.gguf, levels 1 4 8
  python3 bench/serve_bench.py -m models/tiny.gguf --levels 1 2 --requests 2
  python3 bench/serve_bench.py --url http://127.0.0.1:8080 --levels 4
If models/small.gguf is missing: bash scripts/demo.sh, or
  build/kimi synth --preset small -o models/small-hf && build/kimi convert models/small-hf -o models/small.gguf
"""
import argparse
import http.client
import json
import os
import random
import re
import signal
import statistics
import subprocess
import sys
import threading
import time
import urllib.parse


def stream_completion(host, port, body, timeout=600):
    """Returns (ttft_s, total_s, n_chunks_with_text, usage or None, error or None)."""
    t0 = time.perf_counter()
    conn = http.client.HTTPConnection(host, port, timeout=timeout)
    try:
        conn.request("POST", "/v1/completions", body=json.dumps(body), headers={"Content-Type": "application/json"})
        resp = conn.getresponse()
        if resp.status != 200:
            return None, time.perf_counter() - t0, 0, None, f"HTTP {resp.status}: {resp.read()[:200]!r}"
        ttft, usage, chunks = None, None, 0
        for raw in resp:
            line = raw.decode("utf-8", "replace").strip()
            if not line.startswith("data: "):
                continue
            data = line[6:]
            if data == "[DONE]":
                break
            ev = json.loads(data)
            if "error" in ev:
                return ttft, time.perf_counter() - t0, chunks, None, str(ev["error"])
            if ev.get("usage"):
                usage = ev["usage"]
            for ch in ev.get("choices", []):
                if ch.get("text"):
                    chunks += 1
                    if ttft is None:
                        ttft = time.perf_counter() - t0
        return ttft, time.perf_counter() - t0, chunks, usage, None
    except Exception as e:  # noqa: BLE001 - report, keep going
        return None, time.perf_counter() - t0, 0, None, repr(e)
    finally:
        conn.close()


def random_text(rng, n_words):
    words = ["the", "model", "reads", "a", "long", "prompt", "about", "rivers", "and", "mountains", "while",
             "servers", "batch", "tokens", "quickly", "under", "load", "with", "cached", "prefixes"]
    return " ".join(rng.choice(words) for _ in range(n_words))


def tokenize_count(host, port, text):
    conn = http.client.HTTPConnection(host, port, timeout=60)
    conn.request("POST", "/tokenize", body=json.dumps({"content": text}), headers={"Content-Type": "application/json"})
    n = json.loads(conn.getresponse().read())["count"]
    conn.close()
    return n


def run_level(host, port, clients, requests, prompt_words, max_tokens, seed):
    results, lock = [], threading.Lock()

    def client(ci):
        rng = random.Random(seed * 1000 + ci)
        for _ in range(requests):
            body = {"prompt": random_text(rng, prompt_words), "max_tokens": max_tokens, "temperature": 0,
                    "ignore_eos": True, "stream": True, "stream_options": {"include_usage": True}}
            r = stream_completion(host, port, body)
            with lock:
                results.append(r)

    t0 = time.perf_counter()
    th = [threading.Thread(target=client, args=(i,)) for i in range(clients)]
    for t in th:
        t.start()
    for t in th:
        t.join()
    wall = time.perf_counter() - t0
    errors = [r[4] for r in results if r[4]]
    gen = sum((r[3] or {}).get("completion_tokens", r[2]) for r in results if not r[4])
    ttfts = sorted(r[0] for r in results if r[0] is not None)
    per_req = [((r[3] or {}).get("completion_tokens", r[2]) - 1) / (r[1] - r[0])
               for r in results if r[0] is not None and r[1] > r[0] and not r[4]]
    q = lambda xs, p: xs[min(len(xs) - 1, int(p * len(xs)))] if xs else float("nan")
    return {"clients": clients, "requests": len(results), "errors": len(errors), "first_error": errors[0] if errors else None,
            "wall_s": wall, "gen_tokens": gen, "agg_tok_s": gen / wall if wall > 0 else 0,
            "ttft_mean_s": statistics.mean(ttfts) if ttfts else float("nan"), "ttft_p50_s": q(ttfts, 0.5),
            "ttft_p90_s": q(ttfts, 0.9), "per_req_tok_s": statistics.mean(per_req) if per_req else float("nan")}


def rss_kb(pid):
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1])
    except OSError:
        return None
    return None


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("-m", "--model", default="models/small.gguf")
    ap.add_argument("--kimi", default=None, help="kimi binary (default: build/kimi or build-*/kimi)")
    ap.add_argument("--url", default=None, help="use a running server instead of starting one")
    ap.add_argument("--levels", type=int, nargs="+", default=[1, 4, 8])
    ap.add_argument("--requests", type=int, default=3, help="requests per client per level")
    ap.add_argument("--prompt-words", type=int, default=100)
    ap.add_argument("--max-tokens", type=int, default=32)
    ap.add_argument("--load-requests", type=int, default=200)
    ap.add_argument("--load-clients", type=int, default=16)
    ap.add_argument("--load-max-tokens", type=int, default=4)
    ap.add_argument("--threads", type=int, default=0)
    ap.add_argument("--ctx", type=int, default=2048)
    ap.add_argument("--json", action="store_true", help="print one JSON object instead of the table")
    ap.add_argument("serve_args", nargs="*", help="extra `kimi serve` arguments (after --)")
    a = ap.parse_args()

    proc = None
    if a.url:
        u = urllib.parse.urlparse(a.url)
        host, port = u.hostname, u.port or 80
    else:
        kimi = a.kimi
        if not kimi:
            cands = ["build/kimi"] + sorted(p for p in (f"{d}/kimi" for d in os.listdir(".") if d.startswith("build")))
            kimi = next((c for c in cands if os.path.exists(c)), None)
        if not kimi or not os.path.exists(a.model):
            sys.exit(f"need the kimi binary ({kimi}) and the model ({a.model}); see --help")
        cmd = [kimi, "serve", "-m", a.model, "--port", "0", "-t", str(a.threads), "-c", str(a.ctx),
               "--parallel", str(max(max(a.levels), 1)), "--max-connections", str(max(64, a.load_clients * 2)),
               "--queue", "1024"] + a.serve_args
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
        line = proc.stdout.readline()
        m = re.search(r"http://([\d.]+):(\d+)", line)
        if not m:
            proc.kill()
            sys.exit(f"kimi serve did not start: {line!r}")
        host, port = m.group(1), int(m.group(2))

    try:
        n_prompt = tokenize_count(host, port, random_text(random.Random(1), a.prompt_words))
        # warm-up
        stream_completion(host, port, {"prompt": "warm up", "max_tokens": 2, "stream": True})
        levels = [run_level(host, port, c, a.requests, a.prompt_words, a.max_tokens, seed=c) for c in a.levels]
        rss0 = rss_kb(proc.pid) if proc else None
        per_client = a.load_requests // a.load_clients
        extra = a.load_requests % a.load_clients
        results, lock = [], threading.Lock()

        def load_client(ci):
            for i in range(per_client + (1 if ci < extra else 0)):
                body = {"prompt": f"load test {ci} {i}", "max_tokens": a.load_max_tokens, "stream": i % 2 == 0}
                r = stream_completion(host, port, body) if body["stream"] else None
                if r is None:
                    conn = http.client.HTTPConnection(host, port, timeout=600)
                    t0 = time.perf_counter()
                    try:
                        conn.request("POST", "/v1/completions", body=json.dumps(body),
                                     headers={"Content-Type": "application/json"})
                        resp = conn.getresponse()
                        resp.read()
                        r = (None, time.perf_counter() - t0, 0, None, None if resp.status == 200 else f"HTTP {resp.status}")
                    except Exception as e:  # noqa: BLE001
                        r = (None, time.perf_counter() - t0, 0, None, repr(e))
                    finally:
                        conn.close()
                with lock:
                    results.append(r)

        t0 = time.perf_counter()
        th = [threading.Thread(target=load_client, args=(i,)) for i in range(a.load_clients)]
        for t in th:
            t.start()
        for t in th:
            t.join()
        load_wall = time.perf_counter() - t0
        rss1 = rss_kb(proc.pid) if proc else None
        lat = sorted(r[1] for r in results)
        load = {"requests": len(results), "clients": a.load_clients, "errors": sum(1 for r in results if r[4]),
                "wall_s": load_wall, "req_per_s": len(results) / load_wall,
                "latency_p50_s": lat[len(lat) // 2] if lat else None,
                "latency_p99_s": lat[min(len(lat) - 1, int(0.99 * len(lat)))] if lat else None,
                "rss_before_kb": rss0, "rss_after_kb": rss1}
        out = {"model": a.model, "prompt_tokens": n_prompt, "max_tokens": a.max_tokens, "levels": levels, "load": load}
        if a.json:
            print(json.dumps(out, indent=1))
        else:
            print(f"model {a.model}: prompt {n_prompt} tokens, {a.max_tokens} generated per request (ignore_eos)")
            print(f"{'clients':>7} {'reqs':>5} {'err':>4} {'agg tok/s':>10} {'per-req tok/s':>13} "
                  f"{'TTFT mean':>10} {'p50':>7} {'p90':>7} {'wall s':>7}")
            for l in levels:
                print(f"{l['clients']:>7} {l['requests']:>5} {l['errors']:>4} {l['agg_tok_s']:>10.2f} "
                      f"{l['per_req_tok_s']:>13.2f} {l['ttft_mean_s']:>10.3f} {l['ttft_p50_s']:>7.3f} "
                      f"{l['ttft_p90_s']:>7.3f} {l['wall_s']:>7.1f}")
                if l["first_error"]:
                    print("   first error:", l["first_error"])
            print(f"load: {load['requests']} requests from {load['clients']} clients, {load['errors']} errors, "
                  f"{load['wall_s']:.1f} s ({load['req_per_s']:.1f} req/s), latency p50 {load['latency_p50_s']:.3f} s "
                  f"p99 {load['latency_p99_s']:.3f} s, server RSS {load['rss_before_kb']} -> {load['rss_after_kb']} kB")
    finally:
        if proc:
            proc.send_signal(signal.SIGTERM)
            try:
                rc = proc.wait(timeout=60)
                if rc != 0:
                    print(f"kimi serve exited with {rc}", file=sys.stderr)
            except subprocess.TimeoutExpired:
                proc.kill()


if __name__ == "__main__":
    main()
