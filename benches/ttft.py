#!/usr/bin/env python3
"""Time to first token seen from outside, for several bmoe binaries on one
model, interleaved, the file dropped from the page cache before every run.

Usage: benches/ttft.py MODEL ROUNDS NAME=BIN[:FLAGS] ...
Each run is `BIN run -m MODEL -p Hello -n 8 FLAGS`; the time from the process
start to its first byte on stdout (the first generated text) and the total
wall time are printed per run, then the medians per binary.
"""
import os
import statistics
import subprocess
import sys
import time


def evict(path):
    fd = os.open(path, os.O_RDONLY)
    os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    os.close(fd)


def run(binary, model, flags):
    evict(model)
    t0 = time.monotonic()
    p = subprocess.Popen([binary, "run", "-m", model, "-p", "Hello", "-n", "8", *flags],
                         stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
    first = p.stdout.read(1)
    ttft = time.monotonic() - t0
    p.stdout.read()
    p.wait()
    if not first or p.returncode != 0:
        raise SystemExit(f"{binary} failed ({p.returncode})")
    return ttft, time.monotonic() - t0


def main():
    model, rounds, cells = sys.argv[1], int(sys.argv[2]), sys.argv[3:]
    results = {}
    for r in range(rounds):
        for cell in cells:
            name, spec = cell.split("=", 1)
            binary, _, flags = spec.partition(":")
            ttft, wall = run(binary, model, flags.split())
            results.setdefault(name, []).append(ttft)
            print(f"{r + 1} {name}: first output {ttft:.2f} s, wall {wall:.2f} s", flush=True)
    for name, v in results.items():
        print(f"{name}: median first output {statistics.median(v):.2f} s over {len(v)}")


main()
