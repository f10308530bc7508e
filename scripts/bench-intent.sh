#!/bin/bash
# scripts/bench-intent.sh [ROUNDS] [SIZE] — batch-1 puts with and without the level-6 intent
# (docs/master.md "Intent overlapped with the transfer (level 6)") in ONE cluster, so that the
# cluster's own variation cancels: per round a loopback TCP stream of SIZE-byte messages
# (kvpool-bench baseline-tcp), then `kvpool-bench put --batch 1 --replicas 1` with the client
# config `{}` (intent on, default put_intent_min_bytes) and `{"put_intent_min_bytes": 0}` (the
# one-commit put), in alternating order, 6 s apart (removed keys' space waits fence_grace_ms).
# Prints one line per run (MB/s, the stream's MB/s, the ratio, p50) and the medians; not asserted.
# ROUNDS default 10, SIZE default 4M (4M, 16M, 64M). KVP_BUILD_DIR (default build).
set -euo pipefail
cd "$(dirname "$0")/.."
N=${1:-10}
SZ=${2:-4M}
B=${KVP_BUILD_DIR:-build}
CTL=$B/tools/kvpoolctl
BENCH=$B/tools/kvpool-bench
D=$(mktemp -d /tmp/kvpool-bench-intent.XXXXXX)
cleanup() { "$CTL" cluster down --dir "$D" >/dev/null 2>&1 || true; rm -rf "$D"; }
trap cleanup EXIT
trap 'exit 130' INT TERM
"$CTL" cluster up --dir "$D" --masters 3 --segments 3 --segment-size 1G --auth none >"$D/up.log" 2>&1 ||
  { cat "$D/up.log"; exit 1; }
C=$D/cluster.json
echo '{"put_intent_min_bytes": 0}' >"$D/off.json"
echo '{}' >"$D/on.json"
"$BENCH" put --cluster "$C" --value-size 4M --count 600 --batch 8 --threads 2 --replicas 1 >/dev/null 2>&1
sleep 6
case "$SZ" in 16M) cnt=60 ;; 64M) cnt=16 ;; *) cnt=200 ;; esac
: >"$D/runs.txt"
for i in $(seq 1 "$N"); do
  order="on off"; [ $((i % 2)) = 0 ] && order="off on"
  for mode in $order; do
    s=$("$BENCH" baseline-tcp --value-size "$SZ" --json 2>/dev/null |
      python3 -c 'import json,sys; print(json.load(sys.stdin)["bytes_per_second"])')
    "$BENCH" put --cluster "$C" --config "$D/$mode.json" --value-size "$SZ" --count "$cnt" --batch 1 \
      --threads 1 --replicas 1 --json 2>/dev/null |
      python3 -c 'import json,sys
d=json.load(sys.stdin); s=float(sys.argv[1])
print("%s %s %s %.0f %.0f %.3f %d %s" % (sys.argv[2], sys.argv[3], sys.argv[4], d["bytes_per_second"]/1e6, s/1e6,
      d["bytes_per_second"]/s, d["latency_us"]["p50"], open("/proc/loadavg").read().split()[0]))' "$s" "$SZ" "$mode" "$i" |
      tee -a "$D/runs.txt"
    sleep 6
  done
done
python3 - "$D/runs.txt" <<'PY'
import statistics as st, sys
rows = [l.split() for l in open(sys.argv[1]) if l.strip()]
print("size mode round put_MB/s stream_MB/s ratio p50_us load  (columns above)")
for m in ("on", "off"):
    r = [x for x in rows if x[1] == m]
    if r:
        print("%s intent %-3s: %d runs, ratio to the stream median %.2f (%.2f-%.2f), p50 median %d us"
              % (r[0][0], m, len(r), st.median(float(x[5]) for x in r), min(float(x[5]) for x in r),
                 max(float(x[5]) for x in r), st.median(int(x[6]) for x in r)))
on = {x[2]: x for x in rows if x[1] == "on"}; off = {x[2]: x for x in rows if x[1] == "off"}
pr = [int(off[k][6]) / int(on[k][6]) for k in on if k in off]
if pr:
    print("paired p50 without/with the intent: median %.2f (the intent faster in %d of %d rounds)"
          % (st.median(pr), sum(p > 1 for p in pr), len(pr)))
PY
