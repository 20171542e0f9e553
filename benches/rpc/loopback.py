#!/usr/bin/env python3
"""Interleaved loopback bench of --rpc: one host vs the model split with a
`bmoe rpc-server` on 127.0.0.1 (docs/scale-out.md).

Each round runs: single, split, single (the baseline twice, for the noise
band), each `bmoe run -n N` with a CSV. Prints per cell the decode tok/s
(median and range), and for the split the remote part and network bytes per
generated token from its CSV. Run directories go under /tmp, not the tree.

  python3 benches/rpc/loopback.py MODEL [--rounds 4] [-n 64] [--layers 15] [--cache 25%]
"""
import argparse, csv, json, os, socket, statistics, subprocess, sys, tempfile, time

BMOE = os.environ.get("BMOE", "./target/debug/bmoe")
PROMPT = "Once upon a time, in a small village by the sea, there lived"


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    p = s.getsockname()[1]
    s.close()
    return p


def run(model, n, extra, out_csv):
    args = [BMOE, "run", "-m", model, "-p", PROMPT, "-n", str(n), "--ignore-eos", "--csv", out_csv] + extra
    p = subprocess.run(args, capture_output=True, text=True, timeout=600)
    if p.returncode != 0:
        sys.exit(f"{' '.join(args)} failed:\n{p.stderr}")
    done = next(l for l in p.stderr.splitlines() if l.startswith("BMOE_DONE "))
    return json.loads(done[len("BMOE_DONE "):])


def per_token(out_csv, col):
    with open(out_csv) as f:
        rows = [r for r in csv.reader(l for l in f if not l.startswith("#"))]
    head, body = rows[0], rows[1:]
    i, pre = head.index(col), head.index("prefill")
    vals = [float(r[i]) for r in body if len(r) == len(head) and r[pre] == "0"]
    return statistics.mean(vals) if vals else 0.0


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("model")
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("-n", type=int, default=64)
    ap.add_argument("--layers", default="15")
    ap.add_argument("--cache", default="25%")
    a = ap.parse_args()
    port = free_port()
    server = subprocess.Popen([BMOE, "rpc-server", "--port", str(port)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    time.sleep(1.0)
    rpc = ["--rpc", f"127.0.0.1:{port}", "--rpc-layers", a.layers]
    cells = {"single": ["--cache-mb", a.cache], "split": ["--cache-mb", a.cache] + rpc}
    out = tempfile.mkdtemp(prefix="bmoe-rpc-bench-")
    res = {k: [] for k in cells}
    try:
        for r in range(a.rounds):
            for name in ["single", "split", "single"]:
                path = os.path.join(out, f"{name}-{r}-{len(res[name])}.csv")
                done = run(a.model, a.n, cells[name], path)
                res[name].append((done["decode_tok_s"], per_token(path, "remote_ms"), per_token(path, "net_bytes"), per_token(path, "read_bytes")))
                print(f"round {r} {name}: {done['decode_tok_s']:.2f} tok/s", file=sys.stderr)
    finally:
        server.kill()
    print(f"runs in {out}\n")
    print("| cell | runs | decode tok/s median (min-max) | remote ms/token | network KiB/token | read MiB/token |")
    print("|---|---:|---:|---:|---:|---:|")
    for name, v in res.items():
        rates = [x[0] for x in v]
        m = lambda j: statistics.mean(x[j] for x in v)
        print(f"| {name} | {len(v)} | {statistics.median(rates):.2f} ({min(rates):.2f}-{max(rates):.2f}) | {m(1):.1f} | {m(2)/1024:.1f} | {m(3)/2**20:.1f} |")
    ratio = statistics.median(x[0] for x in res["split"]) / statistics.median(x[0] for x in res["single"])
    print(f"\nsplit / single (medians): {ratio:.2f}")


if __name__ == "__main__":
    main()
