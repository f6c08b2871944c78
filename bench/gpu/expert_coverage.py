#!/usr/bin/env python3
"""How much of the routed-expert work N resident experts per layer would cover (docs/gpu.md, hot experts).

Reads the per-expert token counts of `kimi imatrix` files (llama.cpp's imatrix GGUF: one
`blk.N.ffn_gate_exps.weight.counts` tensor per MoE layer = how many tokens picked each expert) and prints:
- per layer: picks, distinct experts, the share of picks the N most-picked experts take;
- for GPU memory budgets (GB of VRAM given to routed experts), the experts per layer that fit at Kimi-K3.1's
  sizes (92 MoE layers, 896 experts of 17.55 MB in MXFP4) and the share of the expert work they cover.

With two files, the experts are ranked by the first (counted beforehand: an imatrix of other text) and the
share is measured on the second (what serving would see); with one file both are the same (in-sample, an
upper bound). The ranks apply to a model with E experts per layer at the fraction N/E of its experts when it
has fewer than 896 (a synthetic model measured at K3's expert count needs no scaling).

  python3 bench/gpu/expert_coverage.py RANK.imatrix [EVAL.imatrix] [--budgets 8,16,32,64,100]
No dependency beyond Python 3.
"""
import argparse
import re
import struct
import sys

K3_MOE_LAYERS = 92
K3_EXPERTS = 896
K3_EXPERT_BYTES = 3 * 3072 * 3584 * 17 // 32  # gate + up + down, MXFP4 (17 bytes per 32 weights)


def read_counts(path):
    """{layer: [count per expert]} from the *_gate_exps.weight.counts tensors of an imatrix GGUF."""
    with open(path, "rb") as f:
        data = f.read()
    pos = 0

    def take(fmt):
        nonlocal pos
        v = struct.unpack_from("<" + fmt, data, pos)
        pos += struct.calcsize("<" + fmt)
        return v[0] if len(v) == 1 else v

    def string():
        n = take("Q")
        nonlocal pos
        s = data[pos:pos + n].decode("utf-8", "replace")
        pos += n
        return s

    scalar = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q", 12: "d"}

    def value(t):
        if t == 8:
            return string()
        if t == 9:
            et, n = take("I"), take("Q")
            return [value(et) for _ in range(n)]
        if t not in scalar:
            sys.exit(f"{path}: unknown GGUF value type {t}")
        return take(scalar[t])

    if data[:4] != b"GGUF":
        sys.exit(f"{path}: not a GGUF file")
    pos = 4
    _version, n_tensors, n_kv = take("I"), take("Q"), take("Q")
    align = 32
    for _ in range(n_kv):
        key = string()
        v = value(take("I"))
        if key == "general.alignment":
            align = int(v)
    infos = []
    for _ in range(n_tensors):
        name = string()
        nd = take("I")
        dims = [take("Q") for _ in range(nd)]
        ttype, off = take("I"), take("Q")
        infos.append((name, dims, ttype, off))
    base = (pos + align - 1) // align * align
    out = {}
    for name, dims, ttype, off in infos:
        m = re.fullmatch(r"blk\.(\d+)\.ffn_gate_exps\.weight\.counts", name)
        if not m:
            continue
        if ttype != 0:
            sys.exit(f"{path}: {name} is not F32")
        n = 1
        for d in dims:
            n *= d
        out[int(m.group(1))] = list(struct.unpack_from(f"<{n}f", data, base + off))
    if not out:
        sys.exit(f"{path}: no blk.N.ffn_gate_exps.weight.counts tensors (an imatrix of a MoE model is needed)")
    return out


def share_of_top(rank_counts, eval_counts, n):
    """Share of eval's picks that fall on the n experts rank_counts picked most (ties: lower id)."""
    order = sorted(range(len(rank_counts)), key=lambda e: (-rank_counts[e], e))
    total = sum(eval_counts)
    return sum(eval_counts[e] for e in order[:n]) / total if total else 0.0


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("rank", help="imatrix whose counts rank the experts")
    ap.add_argument("eval", nargs="?", help="imatrix whose counts are covered (default: the same file)")
    ap.add_argument("--budgets", default="8,16,32,64,100", help="VRAM for routed experts, GB (comma-separated)")
    a = ap.parse_args()
    rank = read_counts(a.rank)
    ev = read_counts(a.eval) if a.eval else rank
    layers = sorted(set(rank) & set(ev))
    if not layers:
        sys.exit("the two files share no MoE layer")
    E = len(rank[layers[0]])
    picks = sum(sum(ev[l]) for l in layers)
    print(f"{len(layers)} MoE layers, {E} experts each, {picks:.0f} picks counted"
          f" ({'ranked on ' + a.rank + ', measured on ' + a.eval if a.eval else 'in-sample'})")
    fracs = [0.01, 0.02, 0.05, 0.10, 0.20, 0.50]
    print("\n| layer | picks | distinct experts | " + " | ".join(f"top {f:.0%}" for f in fracs) + " |")
    print("|---:|---:|---:|" + "---:|" * len(fracs))
    mean = [0.0] * len(fracs)
    for l in layers:
        row = []
        for i, f in enumerate(fracs):
            s = share_of_top(rank[l], ev[l], max(1, round(f * E)))
            mean[i] += s / len(layers)
            row.append(f"{s:.1%}")
        print(f"| {l} | {sum(ev[l]):.0f} | {sum(1 for c in ev[l] if c > 0)} | " + " | ".join(row) + " |")
    print("| mean | | | " + " | ".join(f"{s:.1%}" for s in mean) + " |")
    print(f"\nKimi-K3.1 ({K3_MOE_LAYERS} MoE layers x {K3_EXPERTS} experts of {K3_EXPERT_BYTES / 1e6:.2f} MB MXFP4 ="
          f" {K3_MOE_LAYERS * K3_EXPERTS * K3_EXPERT_BYTES / 1e12:.3f} TB):")
    print("\n| VRAM for experts (GB) | experts per layer | of 896 | share of expert work on the GPU |")
    print("|---:|---:|---:|---:|")
    for b in [float(x) for x in a.budgets.split(",") if x]:
        n = int(b * 1e9 // (K3_MOE_LAYERS * K3_EXPERT_BYTES))
        n_here = min(E, round(n * E / K3_EXPERTS))
        s = sum(share_of_top(rank[l], ev[l], n_here) for l in layers) / len(layers) if n_here else 0.0
        print(f"| {b:g} | {n} | {n / K3_EXPERTS:.1%} | {s:.1%} |")


if __name__ == "__main__":
    main()
