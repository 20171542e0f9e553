#!/usr/bin/env bash
# The all-hit decode against --resident (docs/benchmarks.md, section 6), two
# builds side by side: A and B are bmoe binaries (say the build before a change
# and after). Each round runs, in turn: A --resident, A all-hit, B all-hit,
# B --resident (the baseline twice a round, for its noise band). All-hit is
# --cache-mb 100% after a 512-token prompt, so the prefill brings in every
# expert; the decode's hit rate is printed beside its rate. Run it under the
# shared CPU lock's discipline (each run takes the lock):
#   benches/all_hit.sh A B MODEL... (ROUNDS="1 2 3" by default)
set -u
A=${1:?usage: all_hit.sh A B MODEL...}
B=${2:?usage: all_hit.sh A B MODEL...}
shift 2
P=$(dirname "$0")/workloads/p512.txt
for M in "$@"; do
  for r in ${ROUNDS:-1 2 3}; do
    for cell in res-A hit-A hit-B res-B; do
      case ${cell#*-} in A) bin=$A ;; B) bin=$B ;; esac
      case $cell in res-*) flags=(--resident) ;; hit-*) flags=(--cache-mb 100%) ;; esac
      out=$(flock /tmp/bmoe-cpu.lock "$bin" run -m "$M" -f "$P" -n 48 -t 2 "${flags[@]}" 2>&1 >/dev/null)
      tok=$(echo "$out" | grep -o '"decode_tok_s":[0-9.]*' | cut -d: -f2)
      hit=$(echo "$out" | grep -o 'decode hit [0-9.]*%')
      echo "$(basename "$M") r$r $cell ${tok:-failed} $hit"
    done
  done
done
