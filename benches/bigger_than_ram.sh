#!/usr/bin/env bash
# A model file larger than the host's memory: --resident (llama.cpp's mmap)
# against streamed recipes, the file dropped from the page cache before
# every run, optionally with a balloon holding memory.
# Usage: benches/bigger_than_ram.sh MODEL OUT [BALLOON]
#   BALLOON: 0 (none), N (hold N GiB), or avail:M (hold MemAvailable at M MiB:
#   the balloon takes what is available above M when it starts).
# Env: BIN (default target/debug/bmoe), N_RESIDENT=16, N=64;
#   ALL_CELLS=1 adds cache 0 serial and 25% with overlap and prediction;
#   ROUTE_FROM=TRACE forces every cell's routing from a route trace
#   (`--route-from`: the reads, stalls and cache are the traced model's) and
#   runs the real-routing cells: resident, cache 0 serial, 25% / auto with
#   overlap with and without prediction, 50% with both, auto without the
#   toucher (--pretouch-mb 0: every new slot faults its pages in on the read);
#   CELL_LOCK=FILE takes that flock around each run (not around the balloon),
#   so other work on the host waits between cells and never during one;
#   RESIDENT_AGAIN=1 runs --resident again as the last cell (the noise band);
#   CELLS="resident c0-serial ..." runs only the cells named;
#   SAMPLING="--temp 1 --seed 7" draws every cell's tokens the same way.
# Writes OUT/<cell>.{csv,err,txt}; prints each cell's summary lines.
set -uo pipefail
M=${1:?model}; OUT=${2:?out dir}; BAL=${3:-0}
B=${BIN:-target/debug/bmoe}
P=benches/workloads/prose.txt
ROUTE=()
[ -n "${ROUTE_FROM:-}" ] && ROUTE=(--route-from "$ROUTE_FROM")
mkdir -p "$OUT"
evict() {
    python3 -c 'import os,sys; fd=os.open(sys.argv[1],os.O_RDONLY); os.posix_fadvise(fd,0,0,os.POSIX_FADV_DONTNEED)' "$M"
}
balloon_mib() { # the balloon's size in MiB for BALLOON
    case "$1" in
    avail:*)
        local avail_kib
        avail_kib=$(awk '/MemAvailable/ {print $2}' /proc/meminfo)
        echo $(( avail_kib / 1024 - ${1#avail:} )) ;;
    *) echo $(( $1 * 1024 )) ;;
    esac
}
BPID=
if [ "$BAL" != 0 ]; then
    ready="$OUT/.balloon-ready"
    # sized and touched under CELL_LOCK, so no other job's memory sizes it
    [ -n "${CELL_LOCK:-}" ] && { exec 9>"$CELL_LOCK"; flock 9; }
    python3 -c '
import mmap, sys, time
n = int(sys.argv[1]) * 2**20
m = mmap.mmap(-1, n, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
for i in range(0, n, 4096):
    m[i] = 1
open(sys.argv[2], "w").write("1")
time.sleep(7200)' "$(balloon_mib "$BAL")" "$ready" 9>&- &
    BPID=$!
    trap '[ -n "$BPID" ] && kill "$BPID" 2>/dev/null' EXIT
    while [ ! -f "$ready" ]; do sleep 1; done
    grep MemAvailable /proc/meminfo
    [ -n "${CELL_LOCK:-}" ] && { flock -u 9; exec 9>&-; }
fi
locked() {
    if [ -n "${CELL_LOCK:-}" ]; then flock "$CELL_LOCK" "$@"; else "$@"; fi
}
cell() { # name tokens flags...
    local name=$1 n=$2; shift 2
    case " ${CELLS:-$name} " in *" $name "*) ;; *) return ;; esac
    evict
    echo "$name start $(date +%T) $(grep MemAvailable /proc/meminfo | tr -s ' ')"
    locked /usr/bin/time -f "%e s wall, %M KB maxrss, %I fs-in blocks" timeout 1200 \
        "$B" run -m "$M" -f "$P" -n "$n" --ignore-eos ${SAMPLING:-} "${ROUTE[@]}" "$@" \
        --csv "$OUT/$name.csv" > "$OUT/$name.txt" 2> "$OUT/$name.err"
    echo "$name rc=$? $(tail -1 "$OUT/$name.err")"
    grep -E "^(generation|load|moe-cache|moe-stream):" "$OUT/$name.err"
}
NS=${N:-64}
cell resident "${N_RESIDENT:-16}" --resident
if [ -n "${ROUTE_FROM:-}" ]; then
    cell c0-serial "$NS" --cache-mb 0
    cell p25-overlap "$NS" --cache-mb 25% --overlap
    cell p25-overlap-predict "$NS" --cache-mb 25% --overlap --predict-prefetch
    cell p50-overlap "$NS" --cache-mb 50% --overlap
    cell p50-overlap-predict "$NS" --cache-mb 50% --overlap --predict-prefetch
    cell auto-overlap "$NS" --cache-mb auto --overlap
    cell auto-overlap-untouched "$NS" --cache-mb auto --overlap --pretouch-mb 0
    cell auto-overlap-predict "$NS" --cache-mb auto --overlap --predict-prefetch
else
    [ -n "${ALL_CELLS:-}" ] && cell c0-serial "$NS" --cache-mb 0
    cell c0-overlap-predict "$NS" --cache-mb 0 --overlap --predict-prefetch
    [ -n "${ALL_CELLS:-}" ] && cell p25-overlap-predict "$NS" --cache-mb 25% --overlap --predict-prefetch
    cell auto-overlap-predict "$NS" --cache-mb auto --overlap --predict-prefetch
fi
# the baseline again, for its noise band (RESIDENT_AGAIN=1)
[ -n "${RESIDENT_AGAIN:-}" ] && cell resident-again "${N_RESIDENT:-16}" --resident
# reaped before returning, so a next run sizing its own balloon sees the memory back
[ -n "$BPID" ] && { kill "$BPID"; wait "$BPID" 2>/dev/null; }
BPID=
rm -f "$OUT/.balloon-ready"
