#!/usr/bin/env python3
"""Warm start against a cold cache, interleaved.

A profile is trained by runs of TRAIN prompts (``--cache-warm FILE``); then,
each round, every TEST prompt (none of them a training prompt) runs cold
(``--cache-warm off``) and warm (a fresh copy of the profile, so every warm run
starts from the same one), in alternating order. Per run, from its CSV: the
decode hit rate over tokens 1-16 and over 65-80, and the decode rate of tokens
1-16. The summary compares the warm run's first 16 tokens with the cold run's
first 16, with its 49-64 and 65-80 (what a cold cache reaches only after 64
tokens) and with its whole first 64.

With ``--temp T --seed S`` every run samples (the same seed for cold and warm,
so both decode the same text: streaming never changes the logits); greedy text
of a small model loops under ``--ignore-eos``, and a loop's repeated experts
make a cold run's late hit rate a measure of the loop, not of a warming cache.

With ``--oracle`` each TEST prompt's warm runs use a profile of that same
prompt's own earlier run (same seed) instead of the TRAIN prompts': the most a
record of earlier runs can know about the text.

    benches/warm_start.py -m MODEL [--cache-mb 25%] [-n 80] [--rounds 3]
        [--temp T --seed S] [--oracle] [-o NEW_DIR]
"""

import argparse
import csv
import math
import os
import shutil
import statistics
import subprocess
import sys
import time

TRAIN = [
    "Write a short story about a dragon who learns to bake bread.",
    "Explain how a bicycle gear system works, step by step.",
]
TEST = [
    "Describe a walk through an old city market in the early morning.",
    "List the steps to plant a vegetable garden in spring.",
    "Tell me about the history of lighthouses and their keepers.",
]


def run(bmoe, model, prompt, n, cache, warm, csv_path, sampling):
    cmd = [bmoe, "run", "-m", model, "-p", prompt, "-n", str(n), "--ignore-eos",
           "--moe-stream", "--cache-mb", cache, "--cache-warm", warm, "--csv", csv_path]
    cmd += sampling
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
    if p.returncode != 0:
        sys.exit(f"failed ({p.returncode}): {' '.join(cmd)}\n{p.stderr[-2000:]}")
    return [l for l in p.stderr.splitlines() if l.startswith("moe-cache-warm:")]


def decode_rows(csv_path):
    with open(csv_path) as f:
        rows = [r for r in csv.DictReader(l for l in f if not l.startswith("#"))]
    return [r for r in rows if r["prefill"] == "0"]


def window(rows, a, b):
    """Hit %, tok/s and MiB read per token over decode tokens a..b (1-based, inclusive)."""
    w = rows[a - 1:b]
    hits = sum(int(r["cache_hits"]) for r in w)
    misses = sum(int(r["cache_misses"]) for r in w)
    ms = sum(float(r["wall_ms"]) for r in w)
    mib = sum(int(r["read_bytes"]) for r in w) / 2**20 / max(1, len(w))
    hit = 100.0 * hits / max(1, hits + misses)
    return hit, 1000.0 * len(w) / ms if ms > 0 else 0.0, mib


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("-m", "--model", required=True)
    ap.add_argument("--cache-mb", default="25%")
    ap.add_argument("-n", type=int, default=80)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--bmoe", default="target/debug/bmoe")
    ap.add_argument("--temp", type=float, default=None, help="sample at this temperature (default greedy)")
    ap.add_argument("--seed", type=int, default=1, help="the sampler's seed with --temp")
    ap.add_argument("--oracle", action="store_true",
                    help="warm each test prompt from a profile of its own earlier run")
    ap.add_argument("-o", "--out", default=None,
                    help="run directory, must not exist (default: target/bench-results/warm-DATE-TIME)")
    a = ap.parse_args()
    if a.n < 80:
        sys.exit("-n must be at least 80 (tokens 65-80 are compared)")
    out = a.out or time.strftime("target/bench-results/warm-%Y%m%d-%H%M%S")
    os.makedirs(out, exist_ok=False)
    profile = os.path.join(out, "trained.bmws")
    a.sampling = [] if a.temp is None else ["--temp", str(a.temp), "--seed", str(a.seed)]
    profiles = [profile] * len(TEST)
    if a.oracle:
        profiles = [os.path.join(out, f"self{t}.bmws") for t in range(len(TEST))]
    for i, (p, path) in enumerate(zip(TEST, profiles) if a.oracle else ((p, profile) for p in TRAIN)):
        lines = run(a.bmoe, a.model, p, a.n, a.cache_mb, path, os.path.join(out, f"train{i}.csv"),
                    a.sampling)
        print(f"train {i}: {lines[-1]}", flush=True)
    results = []
    for r in range(a.rounds):
        for t, prompt in enumerate(TEST):
            order = ["cold", "warm"] if (r + t) % 2 == 0 else ["warm", "cold"]
            cell = {"round": r, "prompt": t}
            for kind in order:
                csv_path = os.path.join(out, f"r{r}-p{t}-{kind}.csv")
                warm = "off"
                if kind == "warm":
                    warm = os.path.join(out, f"r{r}-p{t}.bmws")
                    shutil.copyfile(profiles[t], warm)
                lines = run(a.bmoe, a.model, prompt, a.n, a.cache_mb, warm, csv_path, a.sampling)
                rows = decode_rows(csv_path)
                cell[kind] = {"first": window(rows, 1, 16), "late": window(rows, 65, 80),
                              "mid": window(rows, 49, 64), "all64": window(rows, 1, 64),
                              "warm_line": lines[0] if lines else ""}
            results.append(cell)
            c, w = cell["cold"], cell["warm"]
            print(f"round {r} prompt {t}: cold hit 1-16 {c['first'][0]:.1f}% 49-64 {c['mid'][0]:.1f}% "
                  f"65-80 {c['late'][0]:.1f}% 1-64 {c['all64'][0]:.1f}% "
                  f"{c['first'][1]:.2f} tok/s | warm hit 1-16 {w['first'][0]:.1f}% {w['first'][1]:.2f} tok/s",
                  flush=True)
    write_summary(out, a, results)


def geo(xs):
    return math.exp(sum(math.log(x) for x in xs) / len(xs)) if xs and min(xs) > 0 else 0.0


def write_summary(out, a, results):
    med = statistics.median
    sampling = f" --temp {a.temp} --seed {a.seed}" if a.temp is not None else ""
    sampling += " --oracle" if a.oracle else ""
    lines = [
        f"# Warm start vs cold, {a.model}, --cache-mb {a.cache_mb}, -n {a.n}, {a.rounds} rounds{sampling}",
        "",
        f"Command: benches/warm_start.py -m {a.model} --cache-mb {a.cache_mb} -n {a.n} --rounds {a.rounds}"
        f"{sampling}",
        "",
        "| round | prompt | cold hit 1-16 | cold 49-64 | cold 65-80 | cold 1-64 | warm hit 1-16 "
        "| MiB/token 1-16 cold | warm | cold tok/s 1-16 | warm tok/s 1-16 | warm/cold |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    ratios = []
    for c in results:
        cf, cl, wf = c["cold"]["first"], c["cold"]["late"], c["warm"]["first"]
        cm, ca = c["cold"]["mid"], c["cold"]["all64"]
        ratio = wf[1] / cf[1] if cf[1] else 0.0
        ratios.append(ratio)
        lines.append(f"| {c['round']} | {c['prompt']} | {cf[0]:.1f}% | {cm[0]:.1f}% | {cl[0]:.1f}% | "
                     f"{ca[0]:.1f}% | {wf[0]:.1f}% | "
                     f"{cf[2]:.1f} | {wf[2]:.1f} | {cf[1]:.2f} | {wf[1]:.2f} | {ratio:.2f}x |")
    col = lambda k, w, i: [c[k][w][i] for c in results]
    lines += [
        "",
        f"Medians: cold hit 1-16 {med(col('cold', 'first', 0)):.1f}%, 49-64 "
        f"{med(col('cold', 'mid', 0)):.1f}%, 1-64 {med(col('cold', 'all64', 0)):.1f}%, cold hit 65-80 "
        f"{med(col('cold', 'late', 0)):.1f}%, warm hit 1-16 {med(col('warm', 'first', 0)):.1f}%; "
        f"tok/s 1-16 cold {med(col('cold', 'first', 1)):.2f}, warm {med(col('warm', 'first', 1)):.2f}, "
        f"warm/cold {med(ratios):.2f}x (geometric mean {geo(ratios):.2f}x, min {min(ratios):.2f}x, "
        f"max {max(ratios):.2f}x); MiB/token 1-16 cold {med(col('cold', 'first', 2)):.1f}, "
        f"warm {med(col('warm', 'first', 2)):.1f}.",
        "",
        "Warm runs' own lines (first cell):",
        "",
        "    " + results[0]["warm"]["warm_line"],
    ]
    with open(os.path.join(out, "summary.md"), "w") as f:
        f.write("\n".join(lines) + "\n")
    print("\n".join(lines))
    print(f"\nraw runs: {out}")


if __name__ == "__main__":
    main()
