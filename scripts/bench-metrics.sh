#!/usr/bin/env bash
# Issue 24's benchmark: the hot-path cost of the client's metrics. Alternating runs against one
# local cluster (kvpoolctl cluster up: 1 master, 2 segments), the client's metrics off
# (metrics_port 0: nothing counted) and on (metrics_port set, the endpoint scraped every second
# during the run), KVP_BENCH_ROUNDS (default 4) rounds of each:
#  - 4 MiB get, batch 1, 1 thread (--count KVP_BENCH_BIG, default 100)
#  - 4 KiB batch_get of 32 keys, 4 threads (--count KVP_BENCH_SMALL, default 16000)
# KVP_BENCH_SCRAPE=0: "on" counts without scraping. Prints each run and the medians with the
# on/off ratio. Figures are printed, never asserted.
# The masters' and segments' own counters are always counted (they cannot be turned off), so
# they are in both columns; their endpoints are not started here.
set -euo pipefail
cd "$(dirname "$0")/.."
B=${KVP_BUILD_DIR:-build}
CTL=$B/tools/kvpoolctl
BENCH=$B/tools/kvpool-bench
ROUNDS=${KVP_BENCH_ROUNDS:-4}
BIG=${KVP_BENCH_BIG:-100}
SMALL=${KVP_BENCH_SMALL:-16000}
DIR=${KVP_BENCH_DIR:-$(mktemp -d /tmp/kvp-bench-metrics-XXXXXX)}
SCRAPER=""
cleanup() {
  [ -n "$SCRAPER" ] && kill "$SCRAPER" 2>/dev/null || true
  "$CTL" cluster down --dir "$DIR/c" >/dev/null 2>&1 || true
}
trap cleanup EXIT
"$CTL" cluster up --dir "$DIR/c" --masters 1 --segments 2 --segment-size 1G >/dev/null
PORT=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
echo '{}' >"$DIR/off.json"
echo "{\"metrics_port\": $PORT}" >"$DIR/on.json"
run() { # mode value-size count batch threads
  local mode=$1; shift
  if [ "$mode" = on ] && [ "${KVP_BENCH_SCRAPE:-1}" = 1 ]; then
    python3 -c 'import sys, time, urllib.request
while True:
    try: urllib.request.urlopen("http://127.0.0.1:%s/metrics" % sys.argv[1], timeout=2).read()
    except Exception: pass
    time.sleep(1)' "$PORT" & SCRAPER=$!
    sleep 0.5 # the scraper's interpreter has started before the timed run
  fi
  "$BENCH" get --cluster "$DIR/c/cluster.json" --config "$DIR/$mode.json" --value-size "$1" --count "$2" \
    --batch "$3" --threads "$4" --json 2>/dev/null |
    python3 -c 'import json,sys; d=json.load(sys.stdin); print(d["bytes_per_second"], d["ops_per_second"], d["latency_us"]["p99"])'
  if [ -n "$SCRAPER" ]; then kill "$SCRAPER" 2>/dev/null || true; wait "$SCRAPER" 2>/dev/null || true; SCRAPER=""; fi
}
: >"$DIR/results.txt"
for r in $(seq 1 "$ROUNDS"); do
  for mode in off on; do
    big=$(run "$mode" 4M "$BIG" 1 1)
    small=$(run "$mode" 4K "$SMALL" 32 4)
    echo "$r $mode big $big" | tee -a "$DIR/results.txt"
    echo "$r $mode small $small" | tee -a "$DIR/results.txt"
  done
done
python3 - "$DIR/results.txt" <<'PY'
import statistics, sys
rows = [l.split() for l in open(sys.argv[1]) if l.strip()]
def med(mode, kind, col):
    return statistics.median(float(r[col]) for r in rows if r[1] == mode and r[2] == kind)
for kind, col, unit, scale in (("big", 3, "MB/s (4 MiB get, batch 1)", 1e6), ("small", 4, "keys/s (4 KiB batch_get 32 x 4 threads)", 1)):
    off, on = med("off", kind, col) / scale, med("on", kind, col) / scale
    p99off, p99on = med("off", kind, 5), med("on", kind, 5)
    print(f"{unit}: off {off:.1f}, on {on:.1f}, on/off {on/off:.3f}; p99 per call off {p99off:.0f} us, on {p99on:.0f} us")
PY
