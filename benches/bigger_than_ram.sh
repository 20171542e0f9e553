#!/usr/bin/env bash
# A model file larger than the host's memory: --resident (llama.cpp's mmap)
# against two streamed recipes, the file dropped from the page cache before
# every run, optionally with a balloon holding BALLOON_GIB of memory.
# Usage: benches/bigger_than_ram.sh MODEL OUT [BALLOON_GIB] (BIN, N_RESIDENT=16, N=64;
# ALL_CELLS=1 adds cache 0 serial and 25% with overlap and prediction;
# SAMPLING="--temp 1 --seed 7" draws every cell's tokens the same way: on a
# random-weight file greedy decoding repeats a few tokens, so its routing stays
# in a few experts, while drawn tokens spread it as a real model's does)
# Writes OUT/<cell>.{csv,err,txt}; prints each cell's summary lines.
set -uo pipefail
M=${1:?model}; OUT=${2:?out dir}; BAL=${3:-0}
B=${BIN:-target/debug/bmoe}
P=benches/workloads/prose.txt
mkdir -p "$OUT"
evict() {
    python3 -c 'import os,sys; fd=os.open(sys.argv[1],os.O_RDONLY); os.posix_fadvise(fd,0,0,os.POSIX_FADV_DONTNEED)' "$M"
}
BPID=
if [ "$BAL" != 0 ]; then
    ready="$OUT/.balloon-ready"
    python3 -c '
import mmap, sys, time
n = int(sys.argv[1]) * 2**30
m = mmap.mmap(-1, n, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
for i in range(0, n, 4096):
    m[i] = 1
open(sys.argv[2], "w").write("1")
time.sleep(3600)' "$BAL" "$ready" &
    BPID=$!
    while [ ! -f "$ready" ]; do sleep 1; done
    grep MemAvailable /proc/meminfo
fi
cell() { # name tokens flags...
    local name=$1 n=$2; shift 2
    evict
    /usr/bin/time -f "%e s wall, %M KB maxrss, %I fs-in blocks" timeout 900 \
        "$B" run -m "$M" -f "$P" -n "$n" --ignore-eos ${SAMPLING:-} "$@" --csv "$OUT/$name.csv" \
        > "$OUT/$name.txt" 2> "$OUT/$name.err"
    echo "$name rc=$? $(tail -1 "$OUT/$name.err")"
    grep -E "^(generation|load|moe-cache|moe-stream):" "$OUT/$name.err"
}
cell resident "${N_RESIDENT:-16}" --resident
[ -n "${ALL_CELLS:-}" ] && cell c0-serial "${N:-64}" --cache-mb 0
cell c0-overlap-predict "${N:-64}" --cache-mb 0 --overlap --predict-prefetch
[ -n "${ALL_CELLS:-}" ] && cell p25-overlap-predict "${N:-64}" --cache-mb 25% --overlap --predict-prefetch
cell auto-overlap-predict "${N:-64}" --cache-mb auto --overlap --predict-prefetch
[ -n "$BPID" ] && kill "$BPID"
rm -f "$OUT/.balloon-ready"
