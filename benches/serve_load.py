#!/usr/bin/env python3
"""Aggregate decode rate of `bmoe serve` with 1, 2 and 4 concurrent clients at
--parallel 1, 2 and 4, and a chat's second turn against a cold `bmoe run` of
the same prompt. Interleaved: each round starts one server per --parallel
(their order rotated per round) and runs the client counts in a rotated order
on it; the raw results go to OUT/cells.csv and OUT/turns.csv.

Usage: benches/serve_load.py BIN MODEL OUT [--rounds 3] [--tokens 32]
                             [--cache-mb 25%] [--ctx 512]

A cell: N clients each send one greedy completion of --tokens tokens (distinct
prompts) at once; aggregate tok/s = generated tokens / wall time from the
first send to the last answer; MiB/token and hit % from /metrics deltas.
"""
import argparse
import csv
import json
import os
import re
import subprocess
import sys
import threading
import time
import urllib.request

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bmoe_serve  # noqa: E402

PROMPTS = [
    "Once upon a time, in a small village by the sea, there lived",
    "The history of the printing press begins in",
    "A good recipe for bread needs flour, water and",
    "In the year 2050, the cities of the world",
    "The old lighthouse keeper climbed the stairs and",
    "Scientists studying the deep ocean found that",
    "My favourite memory from school is the day when",
    "The train left the station at dawn, carrying",
]
TURN1 = "Tell me a short story about a fisherman."
TURN2 = "Now tell me what happened to his boat the next morning."


def start_server(binary, model, parallel, args):
    flags = ["--parallel", str(parallel), "--queue", "8", "-c", str(args.ctx),
             "--cache-mb", args.cache_mb]
    return bmoe_serve.start(binary, model, flags)


def post(port, path, body, timeout=600):
    req = urllib.request.Request(f"http://127.0.0.1:{port}{path}", json.dumps(body).encode(),
                                 {"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=timeout) as r:
        return json.loads(r.read())


def metrics(port):
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=30) as r:
        text = r.read().decode()
    out = {}
    for name in ("bmoe_flash_read_bytes_total", "bmoe_cache_hits_total",
                 "bmoe_cache_misses_total", "bmoe_generated_tokens_total",
                 "bmoe_decodes_total", "bmoe_decode_sequences_total"):
        m = re.search(rf"^{name} (\S+)$", text, re.M)
        out[name] = float(m.group(1)) if m else 0.0
    return out


def cell(port, clients, tokens):
    before = metrics(port)
    results = [None] * clients

    def one(i):
        body = {"prompt": PROMPTS[i % len(PROMPTS)], "max_tokens": tokens}
        results[i] = post(port, "/v1/completions", body)["usage"]["completion_tokens"]

    t0 = time.monotonic()
    threads = [threading.Thread(target=one, args=(i,)) for i in range(clients)]
    [t.start() for t in threads]
    [t.join() for t in threads]
    wall = time.monotonic() - t0
    after = metrics(port)
    d = {k: after[k] - before[k] for k in after}
    gen = sum(results)
    hits, misses = d["bmoe_cache_hits_total"], d["bmoe_cache_misses_total"]
    return {"generated": gen, "wall_s": round(wall, 3), "agg_tok_s": round(gen / wall, 3),
            "mib_per_token": round(d["bmoe_flash_read_bytes_total"] / 2**20 / max(gen, 1), 3),
            "hit_pct": round(100 * hits / max(hits + misses, 1), 1),
            "seqs_per_decode": round(d["bmoe_decode_sequences_total"]
                                     / max(d["bmoe_decodes_total"], 1), 2)}


def first_chunk_s(port, body):
    """Seconds from sending a streamed completion to its first text, and the
    response's bmoe figures (from the final chunk)."""
    req = urllib.request.Request(f"http://127.0.0.1:{port}/v1/completions",
                                 json.dumps({**body, "stream": True,
                                            "stream_options": {"include_usage": True}}).encode(),
                                 {"Content-Type": "application/json"})
    t0, ttft, last = time.monotonic(), None, None
    with urllib.request.urlopen(req, timeout=600) as r:
        for raw in r:
            line = raw.decode().strip()
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            if ttft is None and chunk["choices"] and chunk["choices"][0].get("text"):
                ttft = time.monotonic() - t0
            last = chunk
    return ttft, (last or {}).get("bmoe", {})


def chat_turns(binary, model, args):
    """Turn 2 of a conversation on a warm server, then a cold `bmoe run` of
    the same text. The turns go as raw text (/v1/completions) so both
    tokenize the very same prompt."""
    p, port = start_server(binary, model, 1, args)
    try:
        turn1 = f"Question: {TURN1}\nAnswer:"
        a1 = post(port, "/v1/completions", {"prompt": turn1, "max_tokens": args.tokens})
        prompt = f"{turn1}{a1['choices'][0]['text']}\nQuestion: {TURN2}\nAnswer:"
        ttft, fig = first_chunk_s(port, {"prompt": prompt, "max_tokens": 16})
    finally:
        bmoe_serve.stop(p)
    t0 = time.monotonic()
    run = subprocess.Popen([binary, "run", "-m", model, "--cache-mb", args.cache_mb, "-c",
                            str(args.ctx), "-n", "16", "-p", prompt],
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    run.stdout.read(1)
    cold_ttft = time.monotonic() - t0
    _, err = run.communicate()
    done = json.loads(re.search(r"^BMOE_DONE (.*)$", err, re.M).group(1))
    cold_hit = 100 * done["cache_hits"] / max(done["cache_hits"] + done["cache_misses"], 1)
    return [{"case": "chat turn 2 (warm server)", "ttft_s": round(ttft or -1, 3),
             "hit_pct": round(fig.get("cache_hit_pct") or 0, 1),
             "read_mib": round(fig.get("flash_read_bytes", 0) / 2**20, 1),
             "reused": fig.get("reused_tokens"), "prefilled": fig.get("prefilled_tokens")},
            {"case": "cold bmoe run, same prompt", "ttft_s": round(cold_ttft, 3),
             "hit_pct": round(cold_hit, 1), "read_mib": round(done["read_bytes_total"] / 2**20, 1),
             "reused": 0, "prefilled": done["prompt_tokens"]}]


def summary(rows):
    """A markdown table: per cell the mean aggregate rate (min-max over the
    rounds), its ratio to --parallel 1 at the same client count, MiB/token,
    hit % and sequences per decode."""
    def mean(xs):
        return sum(xs) / len(xs)
    cells = {}
    for r in rows:
        cells.setdefault((r["parallel"], r["clients"]), []).append(r)
    base = {c: mean([r["agg_tok_s"] for r in cells[(1, c)]]) for (_, c) in cells if (1, c) in cells}
    out = ["| --parallel | clients | aggregate tok/s (min-max) | vs --parallel 1 | MiB/token | hit % | sequences/decode |",
           "|---|---|---|---|---|---|---|"]
    for (p, c), rs in sorted(cells.items()):
        rate = [r["agg_tok_s"] for r in rs]
        out.append(f"| {p} | {c} | {mean(rate):.2f} ({min(rate):.2f}-{max(rate):.2f}) | "
                   f"{mean(rate) / base[c]:.2f}x | {mean([r['mib_per_token'] for r in rs]):.1f} | "
                   f"{mean([r['hit_pct'] for r in rs]):.1f} | "
                   f"{mean([r['seqs_per_decode'] for r in rs]):.2f} |")
    return "\n".join(out)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("bin")
    ap.add_argument("model")
    ap.add_argument("out")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--tokens", type=int, default=32)
    ap.add_argument("--cache-mb", default="25%")
    ap.add_argument("--ctx", type=int, default=512)
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    rows = []
    for r in range(args.rounds):
        for k in range(3):
            parallel = [1, 2, 4][(k + r) % 3]
            p, port = start_server(args.bin, args.model, parallel, args)
            try:
                post(port, "/v1/completions", {"prompt": "Hello", "max_tokens": 4})
                for j in range(3):
                    clients = [1, 2, 4][(j + r) % 3]
                    row = {"round": r, "parallel": parallel, "clients": clients,
                           **cell(port, clients, args.tokens)}
                    print(json.dumps(row), flush=True)
                    rows.append(row)
            finally:
                bmoe_serve.stop(p)
    with open(os.path.join(args.out, "cells.csv"), "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    print(summary(rows), flush=True)
    turns = []
    for _ in range(args.rounds):
        for t in chat_turns(args.bin, args.model, args):
            print(json.dumps(t), flush=True)
            turns.append(t)
    with open(os.path.join(args.out, "turns.csv"), "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(turns[0]))
        w.writeheader()
        w.writerows(turns)


if __name__ == "__main__":
    main()
