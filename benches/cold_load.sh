#!/usr/bin/env bash
# Interleaved cold loads of one model: streamed (--cache-mb 0) against
# --resident, the file dropped from the page cache before every run.
# Usage: benches/cold_load.sh MODEL [BIN] (ROUNDS=3, N=8 tokens).
# Prints one line per run: load seconds, MiB read from storage during the
# load, time to first token, peak RSS (from BMOE_DONE).
set -euo pipefail
M=${1:?model}
B=${2:-target/debug/bmoe}
ROUNDS=${ROUNDS:-3}
N=${N:-8}
evict() {
    python3 -c 'import os,sys; fd=os.open(sys.argv[1],os.O_RDONLY); os.posix_fadvise(fd,0,0,os.POSIX_FADV_DONTNEED)' "$1"
}
for r in $(seq "$ROUNDS"); do
    for cell in stream resident; do
        evict "$M"
        flags=(--cache-mb 0)
        [ "$cell" = resident ] && flags=(--resident)
        done_line=$("$B" run -m "$M" -p Hello -n "$N" "${flags[@]}" 2>&1 >/dev/null | grep '^BMOE_DONE')
        echo "$r $cell $(echo "${done_line#BMOE_DONE }" | python3 -c 'import sys,json; d=json.load(sys.stdin); print("load_s=%s load_read_MiB=%.1f ttft_s=%s peak_rss_MiB=%.0f" % (d["load_s"], d["load_read_bytes"]/2**20, d["ttft_s"], d["peak_rss_bytes"]/2**20))')"
    done
done
