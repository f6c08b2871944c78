#!/usr/bin/env python3
"""A small imatrix GGUF in llama.cpp's layout (llama-imatrix's writer: general.type, imatrix.datasets,
imatrix.chunk_count, imatrix.chunk_size; per weight, in name order, '<w>.in_sum2' F32 [n_in, n_mat] and
'<w>.counts' F32 [1, n_mat], trailing 1-dims trimmed as ggml's writer does), written byte by byte from the
GGUF v3 layout (formats-quant.md §1) with struct only. Values are exact in f32."""
import struct, os

def s(x):
    b = x.encode()
    return struct.pack('<Q', len(b)) + b

kv = []
kv.append(s('general.type') + struct.pack('<I', 8) + s('imatrix'))
kv.append(s('imatrix.datasets') + struct.pack('<I', 9) + struct.pack('<IQ', 8, 1) + s('calib.txt'))
kv.append(s('imatrix.chunk_count') + struct.pack('<I', 4) + struct.pack('<I', 3))
kv.append(s('imatrix.chunk_size') + struct.pack('<I', 4) + struct.pack('<I', 64))

# entries (sorted by name): a dense matrix (n_in 8) and an expert stack (n_in 4, 3 experts, one unseen)
entries = [
    ('blk.0.attn_q.weight', 8, 1, [[float(i * i + 1) for i in range(8)]], [6.0]),
    ('blk.1.ffn_up_exps.weight', 4, 3, [[2.0, 4.0, 6.0, 8.0], [0.0, 0.0, 0.0, 0.0], [1.0, 0.5, 0.25, 3.0]], [2.0, 0.0, 1.0]),
]
tensors = []  # (name, dims, data bytes)
for name, n_in, n_mat, sums, counts in entries:
    d_s = b''.join(struct.pack('<f', v) for row in sums for v in row)
    d_c = b''.join(struct.pack('<f', v) for v in counts)
    tensors.append((name + '.in_sum2', [n_in, n_mat] if n_mat > 1 else [n_in], d_s))
    tensors.append((name + '.counts', [1, n_mat] if n_mat > 1 else [1], d_c))

def pad(n, a=32):
    return (a - n % a) % a

head = b'GGUF' + struct.pack('<IQQ', 3, len(tensors), len(kv)) + b''.join(kv)
off = 0
infos = b''
for name, dims, data in tensors:
    infos += s(name) + struct.pack('<I', len(dims)) + b''.join(struct.pack('<Q', x) for x in dims)
    infos += struct.pack('<IQ', 0, off)
    off += len(data) + pad(len(data))
out = head + infos
out += b'\0' * pad(len(out))
for name, dims, data in tensors:
    out += data + b'\0' * pad(len(data))
here = os.path.dirname(os.path.abspath(__file__))
open(os.path.join(here, 'imatrix_golden.gguf'), 'wb').write(out)
print(len(out), 'bytes')
