#!/usr/bin/env python3
"""One `bmoe run` configuration under two bmoe binaries (a change's before and
after), interleaved: each round runs A and B (their order swapped every other
round), reads each run's BMOE_DONE line and checks B's text against A's.
Prints one JSON line per run, then the mean (min-max) decode tok/s of each,
B/A, and the counters (bytes read per token, hits, misses) that should not move.

Usage: benches/ab_binaries.py BIN_A BIN_B MODEL [--rounds 5] [-n 64]
                              [--prompt TEXT] -- [bmoe run flags...]
"""
import argparse
import json
import statistics
import subprocess
import sys


def run(binary, model, args, flags):
    cmd = [binary, "run", "-m", model, "-p", args.prompt, "-n", str(args.n), *flags]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=args.timeout)
    if p.returncode != 0:
        sys.exit(f"{binary} failed ({p.returncode}): {p.stderr[-2000:]}")
    done = next(l for l in p.stderr.splitlines() if l.startswith("BMOE_DONE "))
    return p.stdout, json.loads(done[len("BMOE_DONE "):])


def band(xs):
    return f"{statistics.mean(xs):.3f} ({min(xs):.3f}-{max(xs):.3f})"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("a")
    ap.add_argument("b")
    ap.add_argument("model")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("-n", type=int, default=64)
    ap.add_argument("--prompt", default="Once upon a time, in a small village by the sea, there lived")
    ap.add_argument("--timeout", type=int, default=900)
    argv = sys.argv[1:]
    cut = argv.index("--") if "--" in argv else len(argv)
    args = ap.parse_args(argv[:cut])
    flags = argv[cut + 1:]
    rates = {"A": [], "B": []}
    texts = {}
    counters = {"A": [], "B": []}
    for r in range(args.rounds):
        order = [("A", args.a), ("B", args.b)]
        if r % 2:
            order.reverse()
        for name, binary in order:
            text, done = run(binary, args.model, args, flags)
            texts.setdefault(name, text)
            if text != texts[name]:
                sys.exit(f"{name}'s text changed between rounds")
            rates[name].append(done["decode_tok_s"])
            per_tok = done["read_bytes_total"] / max(done["tokens"], 1) / 2**20
            counters[name].append((round(per_tok, 3), done["cache_hits"], done["cache_misses"]))
            print(json.dumps({"round": r, "bin": name, "decode_tok_s": done["decode_tok_s"],
                              "mib_per_token": per_tok, "hits": done["cache_hits"],
                              "misses": done["cache_misses"]}), flush=True)
    print(f"A {args.a}: decode tok/s {band(rates['A'])}")
    print(f"B {args.b}: decode tok/s {band(rates['B'])}")
    print(f"B/A: {statistics.mean(rates['B']) / statistics.mean(rates['A']):.3f}")
    print(f"counters (MiB/token, hits, misses) A {sorted(set(counters['A']))} "
          f"B {sorted(set(counters['B']))}")
    print("text: " + ("B's equals A's" if texts["A"] == texts["B"] else "DIFFERS"))


if __name__ == "__main__":
    main()
