#!/usr/bin/env bash
# Two or more builds of bmoe on the same cells, interleaved: every round runs
# each cell with each build in turn (rotating which build goes first), so host
# drift falls on all builds alike. Prints one line per run (tok/s, hit counts,
# bytes read, all from BMOE_DONE) and a per-(cell, build) summary: mean, min and
# max tok/s, and whether the counters and the text agree across builds (they
# must: a build changes speed, never routing or output). Raw outputs go to OUT
# (default target/bench-results/builds-DATE, outside the tracked tree).
# Usage: [OUT=DIR] [ROUNDS=3] [N=64] [ONLY=CELL] benches/builds.sh MODEL BIN_A BIN_B [BIN...]
set -euo pipefail
MODEL=$1; shift
BINS=("$@")
ROUNDS=${ROUNDS:-3}
N=${N:-64}
OUT=${OUT:-target/bench-results/builds-$(date +%Y%m%d-%H%M)}
PROMPT="Once upon a time, in a small village by the sea, there lived"
CELLS=(
  "c0-serial|--cache-mb 0"
  "c25-predict|--cache-mb 25% --overlap --predict-prefetch"
  "c100-serial|--cache-mb 100%"
  "resident|--resident"
)
mkdir -p "$OUT"
: >"$OUT/runs.tsv"
for r in $(seq 1 "$ROUNDS"); do
  for c in "${CELLS[@]}"; do
    name=${c%%|*}; flags=${c#*|}
    [ -n "${ONLY:-}" ] && [ "$name" != "$ONLY" ] && continue
    for i in "${!BINS[@]}"; do
      b=${BINS[$(( (i + r) % ${#BINS[@]} ))]}
      tag=$(basename "$b")
      # shellcheck disable=SC2086
      "$b" run -m "$MODEL" -p "$PROMPT" -n "$N" --ignore-eos $flags \
        >"$OUT/$name-$tag-$r.out" 2>"$OUT/$name-$tag-$r.err"
      done_json=$(grep '^BMOE_DONE ' "$OUT/$name-$tag-$r.err" | cut -d' ' -f2-)
      python3 - "$name" "$tag" "$r" "$done_json" "$OUT/$name-$tag-$r.out" >>"$OUT/runs.tsv" <<'PY'
import hashlib, json, sys
name, tag, r, done, out = sys.argv[1:6]
d = json.loads(done)
text = hashlib.sha256(open(out, 'rb').read()).hexdigest()[:12]
print(f"{name}\t{tag}\t{r}\t{d['decode_tok_s']}\t{d['cache_hits']}\t{d['cache_misses']}\t{d['read_bytes_total']}\t{text}")
PY
      tail -1 "$OUT/runs.tsv"
    done
  done
done
python3 - "$OUT/runs.tsv" <<'PY' | tee "$OUT/summary.txt"
import collections, statistics, sys
rows = [l.rstrip('\n').split('\t') for l in open(sys.argv[1])]
by = collections.defaultdict(list)
for name, tag, r, tok, hits, misses, read, text in rows:
    by[(name, tag)].append((float(tok), (hits, misses, read, text)))
print("cell\tbuild\truns\tmean tok/s\tmin\tmax\tcounters+text same across builds")
for name in dict.fromkeys(n for n, _ in by):
    sigs = {s for (n, _), v in by.items() if n == name for _, s in v}
    for (n, tag), v in by.items():
        if n != name:
            continue
        t = [x for x, _ in v]
        print(f"{name}\t{tag}\t{len(t)}\t{statistics.mean(t):.2f}\t{min(t):.2f}\t{max(t):.2f}\t{'yes' if len(sigs) == 1 else 'NO'}")
PY
