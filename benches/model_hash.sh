#!/usr/bin/env bash
# The prompt cache's whole-file model hash on a large file (docs/serving.md,
# "The prompt cache"): a run with --prompt-cache-file and no memo (it hashes the
# file), the same run with the memo, and one without --prompt-cache-file, the page
# cache dropped before each (root). Usage: benches/model_hash.sh BMOE MODEL [ROUNDS]
set -euo pipefail
B=$1 M=$2 ROUNDS=${3:-2}
MEMO=${BMOE_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/bmoe}/model-ids
STATE=$(mktemp -d)/h.bpc
drop() { sync; echo 3 > /proc/sys/vm/drop_caches; }
timed() { local s e; s=$(date +%s.%N); "$@" > /dev/null 2> "$STATE.err" || true; e=$(date +%s.%N); echo "$e - $s" | bc; }
for round in $(seq "$ROUNDS"); do
  rm -rf "$MEMO" "$STATE"; drop
  t=$(timed "$B" run -m "$M" -p The -n 1 -t 2 --prompt-cache-file "$STATE" -v)
  echo "round $round, no memo: run $t s; $(grep -o 'hashed in [0-9.]* s' "$STATE.err")"
  drop
  t=$(timed "$B" run -m "$M" -p The -n 1 -t 2 --prompt-cache-file "$STATE" -v)
  echo "round $round, memo: run $t s; hashed again: $(grep -c 'hashed in' "$STATE.err" || true)"
  drop
  t=$(timed "$B" run -m "$M" -p The -n 1 -t 2)
  echo "round $round, no --prompt-cache-file: run $t s"
done
