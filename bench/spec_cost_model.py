#!/usr/bin/env python3
"""What a speculative verify step costs on the real Kimi-K3.1, and the speedup it gives (docs/speculative.md).

A decode step of one sequence is bound by reading weights. A verify step of k drafted tokens (k + 1 rows)
reads the always-read weights once and the routed experts of the union of its rows' picks: the expert
bytes grow with (k + 1) x u_k, u_k the expert-union share (distinct experts / picks) that
`kimi bench --verify-k` measures. Byte counts from docs/gpu.md (computed from k3-architecture.md section 2).

    python3 bench/spec_cost_model.py [--union 0.861,0.793,...]   # u_1..u_8 (default: measured, docs/speculative.md)
    python3 bench/spec_cost_model.py --auto     # what --spec auto's rule (runtime/speculative.h spec_decide) decides
    python3 bench/spec_cost_model.py --auto-batch   # kimi serve's rule (spec_decide_batch) beside other rows

--auto evaluates the engine's built-in model (VerifyCostModel: uniform expert union, an accelerator read 8x
faster than RAM) and its rule: the k <= 8 with the best E(p, k) / rel(k), drafting when it beats 1.05.
"""
import argparse

# measured on the zipf router with K3's 896 experts top 16 (kimi synth --preset tiny --experts 896
# --experts-used 16 --router zipf; kimi bench --verify-k 1..8 -d 256 -r 20): u_1 .. u_8
UNION = [0.861, 0.793, 0.745, 0.712, 0.681, 0.654, 0.637, 0.616]

EXPERTS_GB = 25.8  # 92 MoE layers x 16 picks x 17.55 MB (MXFP4), one token
ALWAYS_GB = {"BF16": 113.0, "Q8_0": 60.0, "Q4_K": 31.8}  # everything but the routed experts
RAM_GBS = 380.0    # 12-channel DDR5-4800 socket, read ceiling
GPU = {"H100 80 GB (3.3 TB/s)": 3300.0}


def configs(union):
    u = [1.0] + list(union)  # u_0 = 1: one token's picks are distinct
    out = []
    for name, gb in ALWAYS_GB.items():  # CPU-only: everything from RAM
        out.append((f"CPU-only, {name} always-read + MXFP4 experts", [(gb + EXPERTS_GB * (k + 1) * u[k]) / RAM_GBS for k in range(len(u))]))
    for gname, bw in GPU.items():  # hybrid: Q8_0 always-read on the GPU, the experts in RAM (sides one after the other)
        out.append((f"hybrid, {gname} Q8_0 always-read, experts in RAM", [60.0 / bw + EXPERTS_GB * (k + 1) * u[k] / RAM_GBS for k in range(len(u))]))
    # one sequence with every weight in GPU memory (several GPUs): the same reads as CPU-only at a
    # higher bandwidth, so the same ratios as the CPU-only row of its weight type
    return out


N_EXPERT, TOP_K, DEV_BW = 896, 16, 8.0  # VerifyCostModel's defaults: K3's experts, the accelerator 8x RAM


def auto_table(k_max=8, margin=0.05):
    x = EXPERTS_GB / TOP_K  # one expert of every MoE layer

    def union(k):  # VerifyCostModel::union_experts
        return N_EXPERT * (1 - (1 - TOP_K / N_EXPERT) ** (k + 1))

    places = [(f"CPU-only (or all on GPUs), {n} always-read", gb, 0.0) for n, gb in ALWAYS_GB.items()]
    places.append(("hybrid --cpu-moe, Q8_0 always-read on the GPU", 0.0, 60.0))
    ps = [0.3, 0.5, 0.6, 0.7, 0.8, 0.9]
    print("| placement | rel(1) | rel(4) | rel(7) | " + " | ".join(f"p={p}" for p in ps) + " |")
    print("|---|---:|---:|---:|" + "---:|" * len(ps))
    for name, host_fixed, dev_fixed in places:
        def t(k):
            return host_fixed + union(k) * x + dev_fixed / DEV_BW

        rel = [t(k) / t(0) for k in range(k_max + 1)]
        cells = []
        for p in ps:
            best_k, best = 0, 0.0
            for k in range(1, k_max + 1):
                e = sum(p ** i for i in range(k + 1))
                if e / rel[k] > best:
                    best_k, best = k, e / rel[k]
            cells.append(f"k={best_k}: {best:.2f}" if best > 1 + margin else f"off ({best:.2f})")
        print(f"| {name} | {rel[1]:.2f} | {rel[4]:.2f} | {rel[7]:.2f} | " + " | ".join(cells) + " |")


def auto_batch_table(k_max=8, margin=0.05):
    """kimi serve's rule (spec_decide_batch): one sequence's k drafts added to a step of `rows` rows that
    emits a token for `seqs` sequences. The sequence is charged its share of the step, t(rows) / seqs,
    plus the whole time its rows add: S = E(p, k) / (1 + seqs (t(rows + k) / t(rows) - 1))."""
    x = EXPERTS_GB / TOP_K

    def union_rows(r):  # distinct experts r rows pick (VerifyCostModel::rows_rel)
        return N_EXPERT * (1 - (1 - TOP_K / N_EXPERT) ** r)

    places = [(f"CPU-only, {n} always-read", gb, 0.0) for n, gb in ALWAYS_GB.items()]
    places.append(("hybrid --cpu-moe, Q8_0 on the GPU", 0.0, 60.0))
    batches = [(1, 1), (4, 4), (16, 16), (64, 64), (257, 1)]  # (rows, seqs); 257: a 256-token prompt chunk beside

    def decide(t, p, rows, seqs):
        best_k, best = 0, 0.0
        for k in range(1, k_max + 1):
            e = sum(p ** i for i in range(k + 1))
            s = e / (1 + seqs * (t(rows + k) / t(rows) - 1))
            if s > best:
                best_k, best = k, s
        return best_k, best

    print("| placement | " + " | ".join(f"{r} rows, {n} seq{'s' if n > 1 else ''}" for r, n in batches) + " |")
    print("|---|" + "---:|" * len(batches))
    for name, host_fixed, dev_fixed in places:
        def t(r):
            return host_fixed + union_rows(r) * x + dev_fixed / DEV_BW

        cells = []
        for rows, seqs in batches:
            p_on = next((p / 100 for p in range(0, 101) if decide(t, p / 100, rows, seqs)[1] > 1 + margin), None)
            k8, s8 = decide(t, 0.8, rows, seqs)
            on8 = s8 > 1 + margin
            cells.append(("off" if p_on is None else f"p >= {p_on:.2f}") +
                         (f"; p=0.8: k={k8}, {s8:.2f}" if on8 else f"; p=0.8: off ({s8:.2f})"))
        print(f"| {name} | " + " | ".join(cells) + " |")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--union", default=",".join(str(x) for x in UNION), help="u_1..u_K, comma-separated")
    ap.add_argument("--auto", action="store_true", help="the table --spec auto's rule works from")
    ap.add_argument("--auto-batch", action="store_true", help="kimi serve's auto rule beside other rows")
    a = ap.parse_args()
    if a.auto:
        return auto_table()
    if a.auto_batch:
        return auto_batch_table()
    union = [float(x) for x in a.union.split(",")]
    K = len(union)
    print("verify step of k drafts, time relative to a decode step (bytes read / bandwidth):\n")
    print("| configuration | decode t/s | " + " | ".join(f"k={k}" for k in range(1, K + 1)) + " |")
    print("|---|---:|" + "---:|" * K)
    rows = configs(union)
    for name, t in rows:
        print(f"| {name} | {1.0 / t[0]:.1f} | " + " | ".join(f"{t[k] / t[0]:.2f}" for k in range(1, K + 1)) + " |")
    print("\nspeedup at acceptance length a (a drafts kept per step, a + 1 tokens emitted): draft k = a / draft k = 7 "
          "(DSpark's block) / nothing kept (a = 0) with k = 1:\n")
    print("| configuration | " + " | ".join(f"a={a_}" for a_ in range(1, 7)) + " | a=0, k=1 |")
    print("|---|" + "---:|" * 7)
    for name, t in rows:
        cells = []
        for a_ in range(1, 7):
            s1 = (a_ + 1) * t[0] / t[a_]
            s7 = (a_ + 1) * t[0] / t[7] if K >= 7 else float("nan")
            cells.append(f"{s1:.2f} / {s7:.2f}")
        print(f"| {name} | " + " | ".join(cells) + f" | {t[0] / t[1]:.2f} |")


if __name__ == "__main__":
    main()
