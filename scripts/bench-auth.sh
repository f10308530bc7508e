#!/usr/bin/env bash
# The cost of authentication on the hot path (issue 25; scripts/bench.sh runs this with
# KVP_BENCH_AUTH=1): two local clusters side by side, one as by default (CURVE on the control
# plane, tenant scope on every request) and one started with `cluster up --auth none`, and
# alternating runs against them (on, off, on, off, ...) so that the shared machine's drift hits
# both alike:
#  - 4 MiB get, batch 1, 1 thread (kvpool-bench get --value-size 4M);
#  - 4 KiB batch get of 32 keys from KVP_BENCH_CLIENTS (default 4) threads.
# Prints every run and, per figure, the median of on/off over the rounds (target: >= 0.97).
# Figures are printed, never asserted. KVP_BENCH_ROUNDS (default 5) rounds.
set -euo pipefail
cd "$(dirname "$0")/.."
B=${KVP_BUILD_DIR:-build}
CTL=$B/tools/kvpoolctl
BENCH=$B/tools/kvpool-bench
ROUNDS=${KVP_BENCH_ROUNDS:-5}
CLIENTS=${KVP_BENCH_CLIENTS:-4}
SEGSIZE=${KVP_BENCH_SEGMENT_SIZE:-512M}
DIR=${KVP_BENCH_DIR:-$(pwd)/bench-auth-$$}
mkdir -p "$DIR/on" "$DIR/off" "$DIR/results"
OUT=$DIR/results
cleanup() {
  "$CTL" cluster down --dir "$DIR/on" >/dev/null 2>&1 || true
  "$CTL" cluster down --dir "$DIR/off" >/dev/null 2>&1 || true
}
trap cleanup EXIT
trap 'exit 130' INT TERM
jget() { python3 -c 'import json,sys; d=json.load(open(sys.argv[1])); print(eval(sys.argv[2], {}, {"d": d}))' "$@"; }

echo "== two clusters (1 master, 2 segments of $SEGSIZE each): auth on in $DIR/on, auth none in $DIR/off"
"$CTL" cluster up --dir "$DIR/on" --masters 1 --segments 2 --segment-size "$SEGSIZE" >"$OUT/up-on.log"
"$CTL" cluster up --dir "$DIR/off" --masters 1 --segments 2 --segment-size "$SEGSIZE" --auth none >"$OUT/up-off.log" 2>&1
for m in on off; do # touch the pools once, untimed
  "$BENCH" put --cluster "$DIR/$m/cluster.json" --value-size 4M --count 120 --batch 8 --threads 2 --replicas 1 >/dev/null 2>&1
done
sleep 6

for r in $(seq 1 "$ROUNDS"); do
  for m in on off; do
    C=$DIR/$m/cluster.json
    "$BENCH" get --cluster "$C" --value-size 4M --count 60 --batch 1 --threads 1 --replicas 1 --json \
      >"$OUT/get4m-$m-$r.json" 2>/dev/null
    "$BENCH" get --cluster "$C" --value-size 4K --count 32000 --batch 32 --threads "$CLIENTS" --replicas 1 --json \
      >"$OUT/get4k-$m-$r.json" 2>/dev/null
    printf 'round %d auth %-3s  4 MiB get %8.1f MB/s   4 KiB batch get %9.0f keys/s\n' "$r" "$m" \
      "$(jget "$OUT/get4m-$m-$r.json" 'd["bytes_per_second"]/1e6')" \
      "$(jget "$OUT/get4k-$m-$r.json" 'd["ops_per_second"]')"
  done
  sleep 3
done

python3 - "$OUT" "$ROUNDS" <<'PY'
import json, statistics, sys
out, rounds = sys.argv[1], int(sys.argv[2])
for name, field, label in (("get4m", "bytes_per_second", "4 MiB get (batch 1)"),
                           ("get4k", "ops_per_second", "4 KiB batch get (32 keys)")):
    ratios = []
    for r in range(1, rounds + 1):
        on = json.load(open("%s/%s-on-%d.json" % (out, name, r)))[field]
        off = json.load(open("%s/%s-off-%d.json" % (out, name, r)))[field]
        ratios.append(on / off if off else 0.0)
    print("%-28s auth on/off per round: %s  median %.3f (target >= 0.97)"
          % (label, " ".join("%.3f" % x for x in ratios), statistics.median(ratios)))
    # CPU per operation is less sensitive to a loaded machine than throughput: the masters' and
    # the client's (kvpool-bench's), median over the rounds, on against off.
    for who in ("masters", "bench", "segments"):
        cpu = {}
        for m in ("on", "off"):
            v = [(json.load(open("%s/%s-%s-%d.json" % (out, name, m, r))).get("cpu_us_per_op") or {}).get(who)
                 for r in range(1, rounds + 1)]
            v = [x for x in v if x is not None]
            cpu[m] = statistics.median(v) if v else float("nan")
        print("%-28s   CPU us/op %-8s on %.2f  off %.2f  (%+.2f)" % ("", who, cpu["on"], cpu["off"], cpu["on"] - cpu["off"]))
PY
echo "new connection: CURVE adds one round trip to ZeroMQ's handshake (HELLO/WELCOME, then INITIATE/READY"
echo "in place of NULL's READY/READY: ZMTP RFC 26); per-connection, not per request."
