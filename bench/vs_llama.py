#!/usr/bin/env python3
"""kimi bench against a llama-bench compatible program on the same GGUF file, interleaved.

Each round runs `kimi bench -r 1 -o json` and then the llama program (`-r 1 -o jsonl`, every
flash-attention setting given with --fa; the faster one counts), so both see the same machine
state; the report gives, per test (pp / tg), min / median / max of each program's t/s and of the
ratio kimi / llama.cpp taken round by round, plus kimi's decode as % of its measured read ceiling
and prefill as % of its compute peak (from the same runs).

  python3 bench/vs_llama.py --llama PATH/TO/llama-bench -m MODEL.gguf -p 512 -n 128 -t 2 --rounds 5
  python3 bench/vs_llama.py ... --kimi-args "--attn dense" -d 4096 --md   # a markdown row

Exit status: 0, 2 on bad arguments, 1 when a program fails (its stderr is shown).
"""
import argparse
import json
import shlex
import statistics
import subprocess
import sys


def run(cmd):
    p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    if p.returncode != 0:
        sys.stderr.write(f"vs_llama: {' '.join(map(shlex.quote, cmd))} exited {p.returncode}\n{p.stderr[-4000:]}")
        sys.exit(1)
    return p.stdout


def kimi_round(a):
    cmd = [a.kimi, "bench", "-m", a.model, "-p", str(a.p), "-n", str(a.n), "-t", str(a.t), "-r", "1", "-o", "json"]
    if a.d:
        cmd += ["-d", str(a.d)]
    cmd += shlex.split(a.kimi_args)
    j = json.loads(run(cmd))
    r = {}
    if a.p:
        r["pp"] = j["pp"]["tok_s"]
        r["pp_pct"] = j.get("pp_pct_of_compute_peak")
    if a.n:
        r["tg"] = j["tg"]["tok_s"]
        r["tg_pct"] = j.get("tg_pct_of_read_ceiling")
        r["tg_gb_s"] = j.get("tg_best_read_gb_s")
    return r


def llama_round(a):
    cmd = [a.llama, a.model, "-p", str(a.p), "-n", str(a.n), "-t", str(a.t), "-r", "1", "-fa", a.fa, "-o", "jsonl"]
    if a.d:
        cmd += ["-d", str(a.d)]
    cmd += shlex.split(a.llama_args)
    r = {}
    for line in run(cmd).splitlines():
        line = line.strip()
        if not line.startswith("{"):
            continue
        o = json.loads(line)
        key = "pp" if o.get("n_prompt", 0) > 0 else "tg"
        r[key] = max(r.get(key, 0.0), float(o["avg_ts"]))
    return r


def mmm(xs):
    xs = [x for x in xs if x is not None]
    if not xs:
        return "-"
    return f"{min(xs):.3g} / {statistics.median(xs):.3g} / {max(xs):.3g}"


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--kimi", default="build/kimi")
    ap.add_argument("--llama", required=True, help="llama-bench compatible program (llama-bench, llama-ref's bench)")
    ap.add_argument("-m", "--model", required=True)
    ap.add_argument("-p", type=int, default=512)
    ap.add_argument("-n", type=int, default=128)
    ap.add_argument("-t", type=int, default=2)
    ap.add_argument("-d", type=int, default=0, help="depth (tokens already in the cache)")
    ap.add_argument("--fa", default="0,1", help="llama.cpp flash-attention settings to try (the faster counts)")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--kimi-args", default="")
    ap.add_argument("--llama-args", default="")
    ap.add_argument("--md", action="store_true", help="print markdown rows")
    a = ap.parse_args()
    if a.rounds < 1 or a.p < 0 or a.n < 0 or (a.p == 0 and a.n == 0):
        ap.error("need --rounds >= 1 and at least one of -p / -n > 0")
    ks, ls = [], []
    for i in range(a.rounds):
        ks.append(kimi_round(a))
        ls.append(llama_round(a))
        sys.stderr.write(f"round {i + 1}/{a.rounds}: kimi {ks[-1]} llama.cpp {ls[-1]}\n")
    tests = (["pp"] if a.p else []) + (["tg"] if a.n else [])
    rows = []
    for t in tests:
        n = a.p if t == "pp" else a.n
        name = f"{t}{n}" + (f" @ d{a.d}" if a.d else "")
        k = [r[t] for r in ks]
        l = [r.get(t) for r in ls]
        ratio = [x / y for x, y in zip(k, l) if y]
        pct = [r.get(t + "_pct") for r in ks]
        rows.append((name, mmm(k), mmm(l), mmm(ratio), mmm(pct)))
    if a.md:
        for r in rows:
            print(f"| {a.model} | {r[0]} | {r[1]} | {r[2]} | {r[3]} | {r[4]} |")
    else:
        print(f"model {a.model}, {a.t} threads, {a.rounds} interleaved rounds; min / median / max")
        for r in rows:
            print(f"{r[0]:>14}: kimi {r[1]} t/s | llama.cpp {r[2]} t/s | kimi/llama.cpp {r[3]} | kimi % of ceiling/peak {r[4]}")


if __name__ == "__main__":
    main()
