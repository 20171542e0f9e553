#!/usr/bin/env python3
"""The forecast of `bmoe inspect --forecast` against live runs (docs/cache.md).

For each model: one run at --cache-mb 25% records a route trace of the prose
workload; then each round forecasts (with that trace) and runs live at
--cache-mb 0, 25% and auto, interleaved. Prints, per model and cache, the
forecast's serial tok/s, the live decode tok/s (median, min-max) and their ratio.
Run files go under /tmp, not the tree.

  python3 benches/forecast/check.py MODEL [MODEL...] [--rounds 2] [-n 64]
"""
import argparse, json, os, re, statistics, subprocess, sys, tempfile

BMOE = os.environ.get("BMOE", "./target/debug/bmoe")
PROMPT = "Once upon a time, in a small village by the sea, there lived"
CELLS = ["0", "25%", "auto"]


def run(model, n, cache, extra=()):
    args = [BMOE, "run", "-m", model, "-p", PROMPT, "-n", str(n), "--ignore-eos", "--cache-mb", cache, *extra]
    p = subprocess.run(args, capture_output=True, text=True, timeout=900)
    if p.returncode != 0:
        sys.exit(f"{' '.join(args)} failed:\n{p.stderr}")
    done = next(l for l in p.stderr.splitlines() if l.startswith("BMOE_DONE "))
    return json.loads(done[len("BMOE_DONE "):])["decode_tok_s"]


def forecast(model, trace):
    p = subprocess.run([BMOE, "inspect", model, "--forecast", "--route-trace", trace], capture_output=True, text=True, timeout=300)
    if p.returncode != 0:
        sys.exit(p.stderr)
    rows = {}
    for line in p.stdout.splitlines():
        if "forecast:" in line or "decode probe:" in line:
            print(line.strip(), file=sys.stderr)
        # cache, budget MiB, hit %, read MiB/token, fresh %, tok/s serial, overlap bound
        m = re.match(r"\s+(0|10%|25%|50%|auto)" + r"\s+(\S+)" * 6 + "$", line)
        if m:
            rows[m.group(1)] = (float(m.group(3)), float(m.group(6)))
    return rows


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("models", nargs="+")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("-n", type=int, default=64)
    a = ap.parse_args()
    tmp = tempfile.mkdtemp(prefix="bmoe-forecast-")
    print("| model | cache | forecast hit % | forecast tok/s | live tok/s median (min-max) | live / forecast |")
    print("|---|---|---:|---:|---:|---:|")
    for model in a.models:
        trace = os.path.join(tmp, os.path.basename(model) + ".bmrt")
        run(model, a.n, "25%", ["--route-trace", trace])
        fc, live = {c: [] for c in CELLS}, {c: [] for c in CELLS}
        for r in range(a.rounds):
            f = forecast(model, trace)
            for c in CELLS:
                fc[c].append(f[c])
                live[c].append(run(model, a.n, c))
                print(f"{os.path.basename(model)} round {r} {c}: forecast {f[c][1]:.2f} live {live[c][-1]:.2f}", file=sys.stderr)
        for c in CELLS:
            hit = statistics.median(x[0] for x in fc[c])
            ft = statistics.median(x[1] for x in fc[c])
            lv = live[c]
            med = statistics.median(lv)
            print(f"| {os.path.basename(model)} | {c} | {hit:.1f} | {ft:.2f} | {med:.2f} ({min(lv):.2f}-{max(lv):.2f}) | {med / ft:.2f} |")
    print(f"\nruns in {tmp}")


if __name__ == "__main__":
    main()
