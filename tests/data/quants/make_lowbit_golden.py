#!/usr/bin/env python3
"""Golden super-blocks for Q2_K, Q3_K, IQ4_XS and IQ2_XS, packed straight from the byte layouts of
formats-quant.md §4.4 / §4.6 (independent of the C++ code), with their values computed in float64.
Writes lowbit_golden.txt: per type one line `TYPE hex-bytes` and one line `TYPE v0 ... v255`.
The IQ2_XS codebook is read from the C++ source's table (it is data of the format; the test checks
a few entries against ggml's packed u64 values separately)."""
import re, struct, sys, os

here = os.path.dirname(os.path.abspath(__file__))
src = open(os.path.join(here, '../../../src/tensor/quants_iq2.cpp')).read()
body = src[src.index('kIq2xsGrid[512] = {'):]
body = body[body.index('{') + 1: body.index('};')]
grid = [int(v) for v in re.findall(r'\d+', body)]
assert len(grid) == 512

def f16(bits):
    return struct.unpack('<e', struct.pack('<H', bits))[0]

out = []

# Q2_K: scales[16] (lo 4 bits scale, hi 4 bits min), qs[64], d, dmin
d, dmin = 0x3400, 0x3000
scales = [(g % 16) | ((15 - g) << 4) for g in range(16)]
q = [(e * 7 + 3) % 4 for e in range(256)]
qs = [0] * 64
for e in range(256):
    qs[32 * (e // 128) + e % 32] |= q[e] << (2 * ((e % 128) // 32))
b = bytes(scales) + bytes(qs) + struct.pack('<HH', d, dmin)
vals = [f16(d) * (scales[e // 16] & 15) * q[e] - f16(dmin) * (scales[e // 16] >> 4) for e in range(256)]
out.append(('Q2_K', b, vals))

# Q3_K: hmask[32], qs[64], scales[12], d; q in [-4, 3], scale s in [0, 63] stored (value s - 32)
d = 0x2C00
s = [(t * 5 + 3) % 64 for t in range(16)]
q = [((e * 3 + 1) % 8) - 4 for e in range(256)]
hmask = [0] * 32
qs = [0] * 64
for e in range(256):
    u = q[e] + 4
    qs[32 * (e // 128) + e % 32] |= (u & 3) << (2 * ((e % 128) // 32))
    if u & 4:
        hmask[e % 32] |= 1 << (e // 32)
sc = [0] * 12
for t in range(16):
    if t < 8:
        sc[t] |= s[t] & 15
    else:
        sc[t - 8] |= (s[t] & 15) << 4
    sc[8 + t % 4] |= (s[t] >> 4) << (2 * (t // 4))
b = bytes(hmask) + bytes(qs) + bytes(sc) + struct.pack('<H', d)
vals = [f16(d) * (s[e // 16] - 32) * q[e] for e in range(256)]
out.append(('Q3_K', b, vals))

# IQ4_XS: d, scales_h (u16), scales_l[4], qs[128]
T = [-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113]
d = 0x3800
ls = [(ib * 9 + 5) % 64 for ib in range(8)]
nib = [(e * 5 + 2) % 16 for e in range(256)]
sh = 0
sl = [0] * 4
for ib in range(8):
    sl[ib // 2] |= (ls[ib] & 15) << (4 * (ib % 2))
    sh |= (ls[ib] >> 4) << (2 * ib)
qs = [0] * 128
for ib in range(8):
    for j in range(16):
        qs[16 * ib + j] = nib[32 * ib + j] | (nib[32 * ib + j + 16] << 4)
b = struct.pack('<HH', d, sh) + bytes(sl) + bytes(qs)
vals = [f16(d) * (ls[e // 32] - 32) * T[nib[e]] for e in range(256)]
out.append(('IQ4_XS', b, vals))

# IQ2_XS: d, qs[32] u16 (9-bit entry | 7-bit sign index << 9), scales[8]
d = 0x3C00
mag = [8, 25, 43]
entry = [(g * 37 + 11) % 512 for g in range(32)]
sign7 = [(g * 23 + 5) % 128 for g in range(32)]
scl = [((ib * 3) % 16) | (((ib * 7 + 1) % 16) << 4) for ib in range(8)]
b = struct.pack('<H', d) + b''.join(struct.pack('<H', entry[g] | (sign7[g] << 9)) for g in range(32)) + bytes(scl)
vals = []
for e in range(256):
    g, i = e // 8, e % 8
    signs = sign7[g] | ((bin(sign7[g]).count('1') & 1) << 7)  # 8th sign: even number of negatives
    neg = (signs >> i) & 1
    s4 = (scl[e // 32] >> (4 * ((e % 32) // 16))) & 15
    m = mag[(grid[entry[g]] >> (2 * i)) & 3]
    vals.append(f16(d) * (0.5 + s4) * 0.25 * m * (-1 if neg else 1))
out.append(('IQ2_XS', b, vals))

with open(os.path.join(here, 'lowbit_golden.txt'), 'w') as f:
    for name, b, v in out:
        f.write(name + ' ' + b.hex() + '\n')
        f.write(name + ' ' + ' '.join(repr(float(x)) for x in v) + '\n')
print('wrote', len(out), 'blocks')
