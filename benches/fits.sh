#!/usr/bin/env bash
# A model file that fits in memory: the default run (no streaming flag)
# against --resident and the streamed --cache-mb auto, each cold (the file
# dropped from the page cache first) and then warm (run again at once), for a
# short and a long generation.
# Usage: benches/fits.sh MODEL OUT (BIN, LENGTHS="24 256",
#   MODES="default resident auto", CELL_LOCK=FILE)
# Writes OUT/<mode>-n<N>-<cold|warm>.{csv,err,txt}; prints each run's lines.
set -uo pipefail
M=${1:?model}; OUT=${2:?out dir}
B=${BIN:-target/debug/bmoe}
P=benches/workloads/prose.txt
mkdir -p "$OUT"
evict() {
    python3 -c 'import os,sys; fd=os.open(sys.argv[1],os.O_RDONLY); os.posix_fadvise(fd,0,0,os.POSIX_FADV_DONTNEED)' "$M"
}
locked() {
    if [ -n "${CELL_LOCK:-}" ]; then flock "$CELL_LOCK" "$@"; else "$@"; fi
}
one() { # name tokens flags...
    local name=$1 n=$2; shift 2
    locked /usr/bin/time -f "%e s wall, %M KB maxrss, %I fs-in blocks" timeout 1200 \
        "$B" run -m "$M" -f "$P" -n "$n" --ignore-eos "$@" \
        --csv "$OUT/$name.csv" > "$OUT/$name.txt" 2> "$OUT/$name.err"
    echo "$name rc=$? $(tail -1 "$OUT/$name.err")"
    grep -E "^(generation|load|moe-cache|bmoe:)" "$OUT/$name.err" | grep -v "^bmoe: warn"
}
for n in ${LENGTHS:-24 256}; do
    for mode in ${MODES:-default resident auto}; do
        case $mode in
        default) flags=() ;;
        resident) flags=(--resident) ;;
        auto) flags=(--cache-mb auto) ;;
        esac
        evict
        one "$mode-n$n-cold" "$n" "${flags[@]}"
        one "$mode-n$n-warm" "$n" "${flags[@]}"
    done
done
