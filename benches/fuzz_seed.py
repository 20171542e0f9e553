#!/usr/bin/env python3
"""Seed corpus for the gguf_header fuzz target (benches/fuzz.sh).

Writes into DIR:
  tiny-moe.gguf  a complete tiny llama-architecture MoE (2 blocks, 4 experts,
                 top-2; F32 and Q4_0 experts), which bmoe accepts;
  e8k2-head.gguf when a model path is given: that model's header with its large
                 arrays (the vocabulary) dropped, plus 4 KiB of tensor data
                 (refused as truncated: the mutations start from a real table).
"""
import struct
import sys

GGUF_U32, GGUF_STRING, GGUF_ARRAY, GGUF_U64 = 4, 8, 9, 10
F32, Q4_0 = 0, 2


def s(text):
    b = text.encode()
    return struct.pack("<Q", len(b)) + b


def kv_u32(key, v):
    return s(key) + struct.pack("<II", GGUF_U32, v)


def kv_str(key, v):
    return s(key) + struct.pack("<I", GGUF_STRING) + s(v)


def tensor_bytes(ty, ne):
    n = 1
    for d in ne:
        n *= d
    return n * 4 if ty == F32 else n // 32 * 18


def tiny_moe(path, align=32):
    kvs = [
        kv_str("general.architecture", "llama"),
        kv_u32("general.alignment", align),
        kv_u32("llama.block_count", 2),
        kv_u32("llama.expert_count", 4),
        kv_u32("llama.expert_used_count", 2),
        kv_u32("llama.embedding_length", 32),
    ]
    tensors = [("token_embd.weight", F32, [32, 16])]
    for b in range(2):
        tensors.append((f"blk.{b}.attn_q.weight", F32, [32, 32]))
        ty = Q4_0 if b == 0 else F32
        tensors.append((f"blk.{b}.ffn_gate_exps.weight", ty, [32, 16, 4]))
        tensors.append((f"blk.{b}.ffn_up_exps.weight", ty, [32, 16, 4]))
        tensors.append((f"blk.{b}.ffn_down_exps.weight", ty, [32, 16, 4]))
    head = b"GGUF" + struct.pack("<IQQ", 3, len(tensors), len(kvs)) + b"".join(kvs)
    off, infos, data = 0, b"", b""
    for name, ty, ne in tensors:
        infos += s(name) + struct.pack("<I", len(ne))
        infos += b"".join(struct.pack("<Q", d) for d in ne) + struct.pack("<IQ", ty, off)
        size = tensor_bytes(ty, ne)
        pad = (-size) % align
        data += bytes((i * 7) & 0x7F for i in range(size)) + b"\0" * pad
        off += size + pad
    out = head + infos
    out += b"\0" * ((-len(out)) % align)
    open(path, "wb").write(out + data)


def skip_value(b, pos, ty):
    sizes = {0: 1, 1: 1, 7: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 10: 8, 11: 8, 12: 8}
    if ty in sizes:
        return pos + sizes[ty]
    if ty == GGUF_STRING:
        (n,) = struct.unpack_from("<Q", b, pos)
        return pos + 8 + n
    (ety, n) = struct.unpack_from("<IQ", b, pos)
    pos += 12
    for _ in range(n):
        pos = skip_value(b, pos, ety)
    return pos


def stripped_head(model, path):
    b = open(model, "rb").read(8 << 20)
    n_tensors, n_kv = struct.unpack_from("<QQ", b, 8)
    pos, kept, align = 24, [], 32
    for _ in range(n_kv):
        start = pos
        (klen,) = struct.unpack_from("<Q", b, pos)
        key = b[pos + 8 : pos + 8 + klen].decode()
        pos += 8 + klen
        (ty,) = struct.unpack_from("<I", b, pos)
        end = skip_value(b, pos + 4, ty)
        if key == "general.alignment":
            (align,) = struct.unpack_from("<I", b, pos + 4)
        big = ty == GGUF_ARRAY and struct.unpack_from("<Q", b, pos + 8)[0] > 64
        if not big:
            kept.append(b[start:end])
        pos = end
    infos_start = pos
    for _ in range(n_tensors):
        (nlen,) = struct.unpack_from("<Q", b, pos)
        pos += 8 + nlen
        (nd,) = struct.unpack_from("<I", b, pos)
        pos += 4 + 8 * nd + 4 + 8
    out = b"GGUF" + struct.pack("<IQQ", 3, n_tensors, len(kept)) + b"".join(kept)
    out += b[infos_start:pos]
    out += b"\0" * ((-len(out)) % align)
    open(path, "wb").write(out + b"\x11" * 4096)


if __name__ == "__main__":
    out = sys.argv[1]
    tiny_moe(f"{out}/tiny-moe.gguf")
    if len(sys.argv) > 2:
        stripped_head(sys.argv[2], f"{out}/e8k2-head.gguf")
