#!/usr/bin/env python3
"""What a sparse decode miss costs: one expert's three slices read at once
(O_DIRECT, one thread each, as the flash actor's depth-3 batch), waited for,
a 2 ms pause (the next layer's compute), then the next expert; into memory
never touched before (fresh), the same three buffers again (recycled), or
fresh memory faulted in before the clock starts (populated). Prints the
latency per expert, the rate while reading, the process's CPU and page
faults, and the kernel's reclaim counters (/proc/vmstat) over the run.

Usage: lone_reads.py FILE SLICE_BYTES EXPERTS fresh|recycled|populated|fresh-huge
Example (Qwen3-30B-A3B Q8_0's slice): lone_reads.py model.gguf 1671168 2500 fresh
Run it under the host's CPU lock; pages freed by a run come back cheap only
for a few seconds (see docs/benchmarks.md, "First touch")."""
import mmap
import os
import random
import resource
import statistics
import sys
import threading
import time

VMSTAT = ["pgscan_direct", "pgsteal_direct", "pgscan_kswapd", "pgsteal_kswapd", "pgfault"]


def vmstat():
    with open("/proc/vmstat") as f:
        return {k: int(v) for k, v in (line.split() for line in f)}


def main():
    path, slice_bytes, n, mode = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
    fd = os.open(path, os.O_RDONLY | os.O_DIRECT)
    size = os.fstat(fd).st_size
    rng = random.Random(7)
    slot = (slice_bytes + 4095) // 4096 * 4096
    fresh = mmap.mmap(-1, slot * 3 * n, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    recycled = mmap.mmap(-1, slot * 3, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    for i in range(0, len(recycled), 4096):
        recycled[i] = 1
    if mode == "fresh-huge":
        fresh.madvise(mmap.MADV_HUGEPAGE)
    if mode == "populated":
        for i in range(0, len(fresh), 4096):
            fresh[i] = 1
    mv_f, mv_r = memoryview(fresh), memoryview(recycled)

    def read_into(buf, off):
        got = os.preadv(fd, [buf], off)
        assert got == len(buf), got

    vm0, lat, t_all = vmstat(), [], time.perf_counter()
    for e in range(n):
        offs = [rng.randrange(0, (size - slot) // 4096) * 4096 for _ in range(3)]
        if mode == "recycled":
            bufs = [mv_r[j * slot:(j + 1) * slot] for j in range(3)]
        else:
            bufs = [mv_f[(3 * e + j) * slot:(3 * e + j + 1) * slot] for j in range(3)]
        t0 = time.perf_counter()
        threads = [threading.Thread(target=read_into, args=(bufs[j], offs[j])) for j in range(3)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        lat.append(time.perf_counter() - t0)
        time.sleep(0.002)
    wall = time.perf_counter() - t_all
    vm1, ru = vmstat(), resource.getrusage(resource.RUSAGE_SELF)
    mib = 3 * slot * n / 2**20
    print(f"{mode}: {n} experts of 3 x {slot / 2**20:.2f} MiB: latency ms mean "
          f"{1e3 * statistics.mean(lat):.2f} median {1e3 * statistics.median(lat):.2f} "
          f"p90 {1e3 * sorted(lat)[int(0.9 * n)]:.2f}; {mib / sum(lat):.0f} MiB/s while reading; "
          f"cpu user {ru.ru_utime:.2f} s sys {ru.ru_stime:.2f} s, {ru.ru_minflt} minor faults, "
          f"wall {wall:.1f} s")
    print("vmstat:", {k: vm1.get(k, 0) - vm0.get(k, 0) for k in VMSTAT})


if __name__ == "__main__":
    main()
