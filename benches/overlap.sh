#!/usr/bin/env bash
# Overlap / prefetch / lossy cells on one model, side by side in one run
# (streaming issue 4): the read probe, --resident at the start, middle and end
# (noise band), then at --cache-mb 0 and at a cache of ~25% of the expert bytes
# the serial, overlap, prefetch and predictive cells, and the two lossy knobs.
# Each cell writes its CSV; `bmoe compare` makes the tables. Raw outputs go to
# OUT (default target/bench-results/overlap-DATE, outside the tracked tree; copy
# README.txt, probe.txt and compare-*.md into docs/results/ by hand if a doc cites
# the run).
# Usage: [OUT=DIR] benches/overlap.sh [MODEL] [TOKENS] [CACHE25_MB]
set -euo pipefail
cd "$(dirname "$0")/.."
BMOE=${BMOE:-./target/debug/bmoe}
MODEL=${1:-$HOME/.cache/bmoe/smollm2-135m-upcycled-E64K4-s0.1-seed2.gguf}
N=${2:-128}
C25=${3:-760}
OUT=${OUT:-target/bench-results/overlap-$(date +%Y%m%d)}
PROMPT="Once upon a time, in a small village by the sea, there lived"
mkdir -p "$OUT"
echo "model=$MODEL tokens=$N cache25=${C25}MiB bmoe=$($BMOE --version)" | tee "$OUT/README.txt"
$BMOE probe -m "$MODEL" --depths 1,4,8 --seconds 3 | tee "$OUT/probe.txt"
cell() {
  local name=$1; shift
  echo "== $name: $BMOE run -m MODEL -p PROMPT -n $N $*" | tee -a "$OUT/README.txt"
  $BMOE run -m "$MODEL" -p "$PROMPT" -n "$N" --csv "$OUT/$name.csv" "$@" \
    >"$OUT/$name.out" 2>"$OUT/$name.err"
  grep -E "^(generation|moe-)" "$OUT/$name.err" | sed 's/^/   /' | tee -a "$OUT/README.txt"
}
cell resident-1 --resident
cell c0-serial --cache-mb 0
cell c0-overlap --cache-mb 0 --overlap
cell c0-prefetch1 --cache-mb 0 --overlap --prefetch 1
cell c0-predict --cache-mb 0 --predict-prefetch
cell c0-overlap-predict --cache-mb 0 --overlap --predict-prefetch
cell c0-overlap-predict-t1 --cache-mb 0 --overlap --predict-prefetch -t 1
cell c0-serial-2 --cache-mb 0
cell resident-2 --resident
cell c25-serial --cache-mb "$C25"
cell c25-overlap --cache-mb "$C25" --overlap
cell c25-prefetch1 --cache-mb "$C25" --overlap --prefetch 1
cell c25-predict --cache-mb "$C25" --predict-prefetch
cell c25-overlap-predict --cache-mb "$C25" --overlap --predict-prefetch
cell c25-serial-2 --cache-mb "$C25"
cell c0-drop075 --cache-mb 0 --drop-cold-experts 0.75
cell c0-top2 --cache-mb 0 --n-expert-used 2
cell resident-3 --resident
for f in "$OUT"/c*.out; do
  cmp -s "$f" "$OUT/resident-1.out" && echo "identical text: $(basename "$f")" || echo "TEXT DIFFERS: $(basename "$f")"
done | tee -a "$OUT/README.txt"
$BMOE compare "$OUT"/resident-1.csv "$OUT"/resident-2.csv "$OUT"/resident-3.csv \
  "$OUT"/c0-serial.csv "$OUT"/c0-serial-2.csv "$OUT"/c0-overlap.csv "$OUT"/c0-prefetch1.csv \
  "$OUT"/c0-predict.csv "$OUT"/c0-overlap-predict.csv "$OUT"/c0-overlap-predict-t1.csv >"$OUT/compare-cache0.md"
$BMOE compare "$OUT"/c25-serial.csv "$OUT"/c25-serial-2.csv "$OUT"/c25-overlap.csv \
  "$OUT"/c25-prefetch1.csv "$OUT"/c25-predict.csv "$OUT"/c25-overlap-predict.csv >"$OUT/compare-cache25.md"
$BMOE compare "$OUT"/c0-serial.csv "$OUT"/c0-drop075.csv "$OUT"/c0-top2.csv >"$OUT/compare-lossy.md"
# A 16-token Perfetto trace of the best lossless cache-0 recipe.
$BMOE run -m "$MODEL" -p "$PROMPT" -n 16 --cache-mb 0 --overlap --predict-prefetch \
  --trace-chrome "$OUT/trace-16tok.json" >/dev/null 2>"$OUT/trace-16tok.err"
cat "$OUT"/compare-*.md
