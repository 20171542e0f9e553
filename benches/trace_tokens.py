#!/usr/bin/env python3
"""Per-decode breakdown of a `bmoe run --trace-chrome` trace.

For each verify.decode span: its wall time, the time the verify thread spent
computing (verify.segment), waiting for experts (hook.wait / hook.wait_down),
the flash reads that ran during the decode and how many of them overlapped a
compute segment. Usage: benches/trace_tokens.py TRACE.json [--slowest N]
"""
import json
import sys
from collections import defaultdict


def main():
    args = sys.argv[1:]
    if not args:
        sys.exit(__doc__)
    slowest = None
    if "--slowest" in args:
        i = args.index("--slowest")
        slowest = int(args[i + 1])
        del args[i : i + 2]
    events = json.load(open(args[0]))
    spans = [e for e in events if e.get("ph") == "X"]
    decodes = sorted((e for e in spans if e["name"] == "verify.decode"), key=lambda e: e["ts"])
    reads = [e for e in spans if e["name"] == "flash.read_op"]
    rows = []
    for n, d in enumerate(decodes):
        t0, t1 = d["ts"], d["ts"] + d["dur"]
        inside = [e for e in spans if e["tid"] == d["tid"] and t0 <= e["ts"] and e["ts"] + e["dur"] <= t1 + 0.01]
        total = defaultdict(float)
        for e in inside:
            total[e["name"]] += e["dur"]
        segs = [e for e in inside if e["name"] == "verify.segment"]
        during = [r for r in reads if r["ts"] < t1 and r["ts"] + r["dur"] > t0]
        overlapped = sum(
            1 for r in during if any(r["ts"] < s["ts"] + s["dur"] and s["ts"] < r["ts"] + r["dur"] for s in segs)
        )
        rows.append((n, d, total, len(during), overlapped, sum(r["args"].get("bytes", 0) for r in during)))
    if slowest:
        rows = sorted(rows, key=lambda r: -r[1]["dur"])[:slowest]
    print("decode  rows  wall_ms  compute_ms  wait_ms  wait_down_ms  reads  overlapping_compute  MiB_read")
    for n, d, total, nread, over, nbytes in rows:
        print(
            f"{n:6d} {d['args'].get('rows', 0):5d} {d['dur'] / 1e3:8.1f} {total['verify.segment'] / 1e3:11.1f}"
            f" {total['hook.wait'] / 1e3:8.1f} {total['hook.wait_down'] / 1e3:13.1f} {nread:6d}"
            f" {over:20d} {nbytes / 2**20:9.1f}"
        )


if __name__ == "__main__":
    main()
