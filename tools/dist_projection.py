#!/usr/bin/env python3
"""Paper projection for docs/distributed.md: Kimi-K3.1 (real shapes, k3-architecture.md section 1)
decoded one token at a time over N nodes with kimi's tensor split (heads and rows of every
always-read matrix split, head outputs and output-projection rows all-gathered, routed experts
split by expert with one output per routed slot exchanged) or the layer split.
Nothing here is measured; the link and memory numbers are assumptions stated in the table header.
usage: python3 tools/dist_projection.py"""

D, V, L = 7168, 163840, 93
N_MLA, N_KDA = 24, 69            # layer 0 is KDA + dense FFN; 92 MoE layers
H, HD = 96, 128                  # heads (MLA and KDA), head dim
QL, KVL, ROPE, NOPE, VD = 1536, 512, 64, 128, 128
IH, ID = 64, 128                 # indexer heads / dim
E, K, FF, LAT, SH = 896, 16, 3072, 3584, 6144
DENSE_FF = 33792
BF16, MXFP4 = 2.0, 17.0 / 32.0   # bytes per weight

# (rows, cols) of the always-read matrices (BF16); rows are what a rank splits and all-gathers
kda = [(H * HD, D)] * 3 + [(128, D), (H * HD, 128), (H, D), (H * HD, D), (D, H * HD)]
mla = [(QL, D), (H * (NOPE + ROPE), QL), (KVL + ROPE, D), (128, D), (IH * ID, QL), (IH, D), (H * HD, D), (D, H * HD)]
mla_heads = H * (NOPE + VD) * KVL          # k_b / v_b per-head slices (split by heads)
moe = [(E, D), (LAT, D), (D, LAT), (SH, D), (SH, D), (D, SH)]
dense0 = [(DENSE_FF, D), (DENSE_FF, D), (D, DENSE_FF)]
head = (V, D)
expert_bytes = 3 * FF * LAT * MXFP4         # one routed expert (gate, up, down)
kda_fa = 128 * D                            # KDA's low-rank decay input: whole on every node

def mats_bytes(ms):
    return sum(r * c for r, c in ms) * BF16

always = (N_KDA * mats_bytes(kda) + N_MLA * (mats_bytes(mla) + mla_heads * BF16) + 92 * mats_bytes(moe)
          + mats_bytes(dense0) + head[0] * head[1] * BF16)
replicated = N_KDA * kda_fa * BF16          # read whole by every node
experts_total = 92 * E * expert_bytes
experts_per_token = 92 * K * expert_bytes
# exchanges per token (n = 1): KDA 2 (head outputs, output rows), MLA 4 (latents + indexer keys and
# weights, indexer query heads, head outputs, output rows), MoE 3 (router + latent input, routed
# slot outputs + shared experts' inner rows, up/down rows), dense FFN 2, LM head 1 (to rank 0),
# rank 0's command and batch 2
gathers = N_KDA * 2 + N_MLA * 4 + 92 * 3 + 2 + 1 + 2
# floats all-gathered per token (all nodes' parts together)
gathered_floats = (N_KDA * (H * HD + D) + N_MLA * (QL + KVL + ROPE + ID + IH + IH * ID + H * VD + D)
                   + 92 * (E + LAT + K * LAT + SH + D) + DENSE_FF + D)
to_root_floats = V                          # the LM head's rows go to rank 0 only

links = {  # name: (bandwidth bytes/s per direction, one-message latency s)
    "25 GbE (TCP)": (25e9 / 8, 30e-6),
    "100 GbE (TCP)": (100e9 / 8, 20e-6),
    "100 Gb/s RDMA (RoCE/IB)": (100e9 / 8, 3e-6),
}
MEM_BW = 200e9   # bytes/s a node streams weights at (assumed; a 12-channel DDR5 server ~ 300-400 GB/s peak)

print(f"always-read weights {always/1e9:.1f} GB, of them LM head {head[0]*head[1]*BF16/1e9:.2f} GB; "
      f"read whole by every node (KDA decay input) {replicated/1e9:.3f} GB")
print(f"routed experts {experts_total/1e12:.3f} TB in all; {experts_per_token/1e9:.1f} GB read per token (16 of 896 x 92)")
print(f"tensor split: {gathers} exchanges per token; {gathered_floats*4/1e6:.2f} MB of gathered values per token")
print()
print("| nodes | link | memory per node (GB) | weight bytes per token per node (GB) | sent per node per token (MB) | messages per token per node | weights time (ms) | link time (ms) | decode t/s (bound) |")
print("|---:|---|---:|---:|---:|---:|---:|---:|---:|")
for n in (4, 8):
    mem = (always - replicated + experts_total) / n + replicated
    wbytes = (always - replicated + experts_per_token) / n + replicated
    # per all-gather each node sends its part (1/n on average) to the n-1 others
    sent = gathered_floats / n * 4 * (n - 1) + to_root_floats / n * 4
    msgs = gathers * (n - 1)
    t_w = wbytes / MEM_BW
    for name, (bw, lat) in links.items():
        t_l = gathers * lat + sent / bw      # exchanges are sequential
        print(f"| {n} | {name} | {mem/1e9:.0f} | {wbytes/1e9:.2f} | {sent/1e6:.2f} | {msgs} | {t_w*1e3:.1f} | "
              f"{t_l*1e3:.1f} | {1/(t_w+t_l):.1f} |")
print()
print("layer split (pipeline), one sequence: each token visits the nodes in turn")
print("| nodes | link | memory per node (GB) | weight bytes per token per node (GB) | hand-over per node per token (KB) | messages per token | decode t/s (bound) |")
print("|---:|---|---:|---:|---:|---:|---:|")
for n in (4, 8):
    mem = (always + experts_total) / n
    wbytes = (always + experts_per_token) / n
    hand = D * 4 * (1 + 8)  # stream + up to 8 ResMix bank entries (93 layers / block 12)
    for name, (bw, lat) in links.items():
        t = n * wbytes / MEM_BW + n * (lat + hand / bw)
        print(f"| {n} | {name} | {mem/1e9:.0f} | {wbytes/1e9:.2f} | {hand/1e3:.0f} | {n} | {1/t:.2f} |")
