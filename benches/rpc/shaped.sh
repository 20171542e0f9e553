#!/usr/bin/env bash
# Scale-out bench of --rpc over a shaped link (docs/scale-out.md): one host
# against the model split with a `bmoe rpc-server` in a network namespace of
# its own, behind a veth pair held to 1 Gbit/s and to 100 Mbit/s by a
# token-bucket qdisc on both ends (no netem in this kernel: no added delay).
#
# The server keeps the tensors it is sent in a cache folder (--cache): the
# first split start pays the remote weights' transfer at 1 Gbit/s, every
# later one loads them from the server's cache (both load times printed).
# Each round runs: single, split at 1 Gbit/s, single, split at 100 Mbit/s
# (the baseline twice a round, for the noise band). Prints one line per run,
# then per cell the decode tok/s median (min-max), remote ms and network
# KiB per generated token (the summary's `rpc:` line).
#
# Needs root, ip and tc (iproute2). Run it under the shared CPU lock:
#   flock /tmp/bmoe-cpu.lock benches/rpc/shaped.sh MODEL [ROUNDS] [N] [LAYERS] [CACHE]
# defaults: 3 rounds, -n 32, --rpc-layers 15, --cache-mb 25%.
set -euo pipefail
MODEL=${1:?usage: shaped.sh MODEL [ROUNDS] [N] [LAYERS] [CACHE]}
ROUNDS=${2:-3}
N=${3:-32}
LAYERS=${4:-15}
CACHE=${5:-25%}
BMOE=${BMOE:-./target/debug/bmoe}
PROMPT="Once upon a time, in a small village by the sea, there lived"
NS=bmoe-bench-$$
HIF=bb$$h
PIF=bb$$n
HERE=10.232.0.1
THERE=10.232.0.2
WORK=$(mktemp -d /tmp/bmoe-rpc-shaped-XXXX)
SERVER=

down() {
  set +e
  if [ -n "$SERVER" ]; then kill "$SERVER" 2>/dev/null; wait "$SERVER" 2>/dev/null; fi
  ip netns del "$NS" 2>/dev/null || true
  ip link del "$HIF" 2>/dev/null || true
  rm -rf "$WORK"
}
trap down EXIT

shape() { # RATE: both ends of the pair held to it
  for q in "tc qdisc replace dev $HIF" "ip netns exec $NS tc qdisc replace dev $PIF"; do
    $q root tbf rate "$1" burst 128kb latency 50ms
  done
}

up() {
  ip netns add "$NS"
  ip link add "$HIF" type veth peer name "$PIF"
  ip link set "$PIF" netns "$NS"
  ip addr add "$HERE/30" dev "$HIF" && ip link set "$HIF" up
  ip -n "$NS" addr add "$THERE/30" dev "$PIF"
  ip -n "$NS" link set "$PIF" up && ip -n "$NS" link set lo up
  shape 1gbit
  ip netns exec "$NS" "$BMOE" rpc-server --host "$THERE" --allow-remote \
    --cache "$WORK/cache" >/dev/null 2>"$WORK/server.log" &
  SERVER=$!
  for _ in $(seq 100); do
    (exec 3<>"/dev/tcp/$THERE/50052") 2>/dev/null && return
    sleep 0.1
  done
  echo "the rpc-server did not listen: $(cat "$WORK/server.log")" >&2
  exit 1
}

# One run: CELL then the extra flags. Prints `CELL tok/s remote_ms net_kib load_s`.
one() {
  local cell=$1 err
  shift
  err=$("$BMOE" run -m "$MODEL" -p "$PROMPT" -n "$N" --ignore-eos -t 2 \
    --cache-mb "$CACHE" "$@" 2>&1 >/dev/null) || { echo "$err" >&2; exit 1; }
  local tok rem net load
  tok=$(sed -n 's/^generation:.* decode \([0-9.]*\) tok\/s.*/\1/p' <<<"$err")
  rem=$(sed -n 's/^rpc: remote part \([0-9.]*\) ms.*/\1/p' <<<"$err")
  net=$(sed -n 's/^rpc:.* network \([0-9.]*\) KiB\/token.*/\1/p' <<<"$err")
  load=$(sed -n 's/^load: \([0-9.]*\) s.*/\1/p' <<<"$err")
  echo "$cell ${tok:-?} ${rem:--} ${net:--} ${load:-?}" | tee -a "$WORK/runs"
  sed -n 's/^rpc: .*KiB\/token = \([0-9.]*x\).*/  ratio to activations + logits: \1/p' <<<"$err"
}

up
RPC=(--rpc "$THERE:50052" --rpc-layers "$LAYERS")
echo "cell tok/s remote_ms/token net_KiB/token load_s"
one first-start-1gbit "${RPC[@]}" # the weights cross the link once
one second-start-1gbit "${RPC[@]}" # the server's cache holds them
for r in $(seq "$ROUNDS"); do
  one single
  shape 1gbit && one split-1gbit "${RPC[@]}"
  one single
  shape 100mbit && one split-100mbit "${RPC[@]}"
done
echo
echo "cell runs tok/s-median (min-max) remote_ms net_KiB load_s"
for cell in single split-1gbit split-100mbit; do
  grep "^$cell " "$WORK/runs" | python3 -c '
import statistics, sys
rows = [l.split() for l in sys.stdin]
t = [float(r[1]) for r in rows]
m = lambda i: "-" if rows[0][i] == "-" else "%.1f" % statistics.median(float(r[i]) for r in rows)
print(rows[0][0], len(rows), "%.2f (%.2f-%.2f)" % (statistics.median(t), min(t), max(t)), m(2), m(3), m(4))'
done
