#!/usr/bin/env python3
"""A JSON routing log [tokens][layers][k ids] as a bmoe route trace (format in
actors/src/route_trace.rs: one demand per layer and a one-row decode end per
token), every expert slot SLOT bytes (default 13,271,040: one gpt-oss-20b
expert's MXFP4 gate_up and down weights with biases, about 12.66 MiB).
Usage: python3 to_bmrt.py IN.json OUT.bmrt [SLOT_BYTES]"""
import json, struct, sys
src, dst = sys.argv[1], sys.argv[2]
slot = int(sys.argv[3]) if len(sys.argv) > 3 else 13_271_040
t = json.load(open(src))
L = len(t[0]); k = len(t[0][0]); E = 1 + max(e for tok in t for l in tok for e in l)
with open(dst, 'wb') as f:
    f.write(b'BMOERTR1' + struct.pack('<IIII', E, k, L, L))
    f.write(struct.pack(f'<{L}Q', *([slot] * L)))
    name = b'gpt-oss-20b (imported)'
    f.write(struct.pack('<Q', slot * L * E + 2_000_000_000) + struct.pack('<H', len(name)) + name)
    for tok in t:
        for layer, ids in enumerate(tok):
            f.write(struct.pack('<BII', 1, layer, len(ids)) + struct.pack(f'<{len(ids)}H', *ids))
        f.write(struct.pack('<BII', 2, 1, 1))
print(len(t), 'tokens', L, 'layers', E, 'experts', k)
