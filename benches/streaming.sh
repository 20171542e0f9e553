#!/usr/bin/env bash
# Streaming cells on one model, side by side in one run: the
# read probe, --resident twice (noise band), --cache-mb 0, a cache that holds
# every expert, a 256 MiB cache, and the overlap cells. Raw outputs go to OUT (default
# target/bench-results/streaming-DATE, outside the tracked tree; copy README.txt and
# probe.txt into docs/results/ by hand if a doc cites the run).
# Usage: [OUT=DIR] benches/streaming.sh [MODEL] [TOKENS]
set -euo pipefail
cd "$(dirname "$0")/.."
BMOE=${BMOE:-./target/debug/bmoe}
MODEL=${1:-$HOME/.cache/bmoe/smollm2-135m-upcycled-E64K4-s0.1-seed2.gguf}
N=${2:-128}
OUT=${OUT:-target/bench-results/streaming-$(date +%Y%m%d)}
PROMPT="Once upon a time, in a small village by the sea, there lived"
mkdir -p "$OUT"
echo "model=$MODEL tokens=$N bmoe=$($BMOE --version)" | tee "$OUT/README.txt"
$BMOE probe -m "$MODEL" --depths 1,4,8 --seconds 3 | tee "$OUT/probe.txt"
cell() {
  local name=$1; shift
  echo "== $name: $BMOE run -m MODEL -p PROMPT -n $N $*" | tee -a "$OUT/README.txt"
  $BMOE run -m "$MODEL" -p "$PROMPT" -n "$N" "$@" >"$OUT/$name.out" 2>"$OUT/$name.err"
  grep -E "^(generation|moe-|compute)" "$OUT/$name.err" | sed 's/^/   /' | tee -a "$OUT/README.txt"
}
cell resident-1 --resident
cell stream-cache0 --cache-mb 0
cell stream-cache-all --cache-mb 4096
cell resident-2 --resident
cell stream-cache256 --cache-mb 256
cell stream-cache0-overlap --cache-mb 0 --overlap
cell stream-cache0-overlap-qd8 --cache-mb 0 --overlap --io-threads 8
cell stream-cache256-overlap --cache-mb 256 --overlap
cell stream-cache0-buffered --cache-mb 0 --no-odirect
for f in "$OUT"/stream-*.out; do
  cmp -s "$f" "$OUT/resident-1.out" && echo "identical text: $(basename "$f")" || echo "TEXT DIFFERS: $(basename "$f")"
done | tee -a "$OUT/README.txt"
