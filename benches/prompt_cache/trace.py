#!/usr/bin/env python3
"""The prompt cache on an agent-like trace (issue 52): two conversations A and
B share a system prompt of about --system-tokens tokens; their turns
alternate A, B, A, B, ... (--turns each), then the server is restarted and A
takes one more turn. Run against `bmoe serve --parallel 1` with the prompt
cache on (a fresh directory per round) and off, interleaved (the order
rotated per round), --rounds rounds. Per turn: prompt tokens, tokens restored
or reused (usage.prompt_tokens_details.cached_tokens), tokens prefilled, the
turn's new tokens (its prompt less the conversation's previous prompt and
reply), the time to the first streamed token and the expert bytes read
from flash during the turn (/metrics). Raw rows go to
OUT/turns.csv, the table (medians over rounds) to stdout and OUT/summary.md.

Usage: benches/prompt_cache/trace.py BIN MODEL OUT [--rounds 2] [--turns 6]
                                     [--system-tokens 4000] [--ctx 8192] [--tokens 8]
                                     [--cache-warm] [--restart-pause 0]
--cache-warm adds a third mode, "warm": the prompt cache with `--cache-warm`'s
profile of the expert cache (the turn after the restart finds its experts
read already or being read).
Run it under the shared CPU lock (flock /tmp/bmoe-cpu.lock ...).
"""
import argparse
import csv
import json
import os
import statistics
import sys
import time
import urllib.request

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import bmoe_serve  # noqa: E402
from bmoe_serve import counter, stop  # noqa: E402

SENTENCES = [
    "Tool {i}: read_file takes a path and returns the text of the file, at most 2000 lines.",
    "Rule {i}: never change a file you have not read, and say which lines you changed.",
    "Note {i}: tests run with cargo test; name the test you ran and its result.",
    "Guide {i}: prefer small commits with clear messages over one large change.",
]


def system_prompt(tokens):
    # About 20 tokens a sentence.
    n = max(1, tokens // 20)
    return " ".join(SENTENCES[i % len(SENTENCES)].format(i=i) for i in range(n))


def start(binary, model, args, cache, warm=None):
    flags = ["-c", str(args.ctx), "-t", "2", "--prompt-cache", cache] + (
        ["--cache-warm", warm] if warm else [])
    return bmoe_serve.start(binary, model, flags)


def turn(port, messages, tokens):
    """Stream one reply: its text, usage and the time to its first token."""
    body = {"messages": messages, "max_tokens": tokens, "stream": True,
            "stream_options": {"include_usage": True}}
    req = urllib.request.Request(f"http://127.0.0.1:{port}/v1/chat/completions",
                                 json.dumps(body).encode(), {"Content-Type": "application/json"})
    t0, ttft, text, usage = time.time(), None, "", None
    with urllib.request.urlopen(req, timeout=900) as r:
        for raw in r:
            line = raw.decode().strip()
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            if chunk.get("usage"):
                usage = chunk["usage"]
            for c in chunk.get("choices", []):
                piece = c.get("delta", {}).get("content")
                if piece:
                    ttft = ttft or time.time() - t0
                    text += piece
    return text, usage, ttft or time.time() - t0


def trace(binary, model, args, mode, rnd, out):
    cache = os.path.join(out, f"cache-{rnd}-{mode}") if mode != "off" else "off"
    # "warm": the prompt cache and a warm-start profile of the expert cache,
    # so the turn after the restart finds its experts being read already.
    warm = os.path.join(out, f"warm-{rnd}.bwp") if mode == "warm" else None
    system = {"role": "system", "content": system_prompt(args.system_tokens)}
    convs = {"A": [system], "B": [system]}
    last = {"A": 0, "B": 0}
    plan = [c for _ in range(args.turns) for c in "AB"] + ["restart", "A"]
    p, port = start(binary, model, args, cache, warm)
    rows, step = [], 0
    for who in plan:
        if who == "restart":
            stop(p)
            p, port = start(binary, model, args, cache, warm)
            # A user's next message comes some time after a restart: the
            # warm start reads its experts meanwhile.
            time.sleep(args.restart_pause)
            continue
        step += 1
        convs[who].append({"role": "user", "content": f"Step {step}: what should {who} do next?"})
        flash0 = counter(port, "bmoe_flash_read_bytes_total")
        text, u, ttft = turn(port, convs[who], args.tokens)
        flash = counter(port, "bmoe_flash_read_bytes_total") - flash0
        convs[who].append({"role": "assistant", "content": text})
        cached = u["prompt_tokens_details"]["cached_tokens"]
        rows.append({"round": rnd, "mode": mode, "step": step, "conv": who,
                     "prompt_tokens": u["prompt_tokens"], "cached_tokens": cached,
                     "prefilled": u["prompt_tokens"] - cached,
                     "new_tokens": u["prompt_tokens"] - last[who], "ttft_s": round(ttft, 3),
                     "flash_mib": round(flash / 2**20, 1)})
        last[who] = u["prompt_tokens"] + u["completion_tokens"]
        print(rows[-1], flush=True)
    stop(p)
    return rows


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("binary")
    ap.add_argument("model")
    ap.add_argument("out")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--turns", type=int, default=6)
    ap.add_argument("--system-tokens", type=int, default=4000)
    ap.add_argument("--ctx", type=int, default=8192)
    ap.add_argument("--tokens", type=int, default=8)
    ap.add_argument("--restart-pause", type=float, default=0.0,
                    help="seconds between the restart and the next turn")
    ap.add_argument("--cache-warm", action="store_true",
                    help="a third mode: the prompt cache with a warm-start profile of the expert cache")
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    rows = []
    for rnd in range(args.rounds):
        modes = ["on", "off"] + (["warm"] if args.cache_warm else [])
        # The order rotates by round, so no mode always runs first.
        k = rnd % len(modes)
        for mode in modes[k:] + modes[:k]:
            rows += trace(args.binary, args.model, args, mode, rnd, args.out)
    with open(os.path.join(args.out, "turns.csv"), "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    med = lambda xs: statistics.median(xs)
    modes = [m for m in ("on", "warm", "off") if any(r["mode"] == m for r in rows)]
    head = "| step | conv | new tokens | " + " | ".join(
        f"prefilled ({m}) | TTFT s ({m}) | flash MiB ({m})" for m in modes) + " |"
    lines = [head, "|---:|---|---:|" + "---:|---:|---:|" * len(modes)]
    for step in sorted({r["step"] for r in rows}):
        at = {m: [r for r in rows if r["step"] == step and r["mode"] == m] for m in modes}
        first = at[modes[0]][0]
        cells = [f"{med([r['prefilled'] for r in at[m]]):.0f} | {med([r['ttft_s'] for r in at[m]]):.2f} | "
                 f"{med([r['flash_mib'] for r in at[m]]):.1f}" for m in modes]
        lines.append(f"| {step} | {first['conv']} | {med([r['new_tokens'] for r in at[modes[0]]]):.0f} | "
                     + " | ".join(cells) + " |")
    table = "\n".join(lines)
    print(table)
    with open(os.path.join(args.out, "summary.md"), "w") as f:
        f.write(table + "\n")


if __name__ == "__main__":
    main()
