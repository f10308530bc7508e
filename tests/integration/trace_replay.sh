#!/usr/bin/env bash
# Integration (ctest label integration): a short replay of the Mooncake conversation trace
# against a local cluster (3 masters, 2 segments): zero corrupt blocks, zero failed requests,
# hit rate > 0 and not above the offline infinite-cache bound (the LRU bound is printed, not
# checked: the pool's eviction is not the simulated LRU, so it is no strict bound).
# Exit 77 (skipped) when the trace is not next to the repository.
set -euo pipefail
SRC=${KVP_SOURCE_DIR:-$(cd "$(dirname "$0")/../.." && pwd)}
B=${KVP_BUILD_DIR:-$SRC/build}
TRACE=${KVP_TRACE:-$SRC/../shared/data/traces/conversation_trace.jsonl}
REQUESTS=${KVP_TEST_REQUESTS:-300}
[ -r "$TRACE" ] || { echo "trace not found: $TRACE: skipped"; exit 77; }
CTL=$B/tools/kvpoolctl
BENCH=$B/tools/kvpool-bench
for x in "$CTL" "$BENCH" "$B/tools/kvpool-master" "$B/tools/kvpool-segment"; do
  [ -x "$x" ] || { echo "missing $x (build everything first)"; exit 1; }
done
DIR=$(mktemp -d /tmp/kvp-trace-test.XXXXXX)
cleanup() {
  "$CTL" cluster down --dir "$DIR" >/dev/null 2>&1 || true
  rm -rf "$DIR"
}
trap cleanup EXIT INT TERM
# Its daemons die with this script however it ends: ctest's timeout SIGKILLs it, past the trap
# (the guard of tests/lib/cluster_guard.h; every process started from here carries its mark).
if [ -x "$B/tests/kvp_test_guard" ]; then export KVP_TEST_OWNER=$("$B/tests/kvp_test_guard" $$); fi

"$CTL" cluster up --dir "$DIR" --masters 3 --segments 2 --segment-size 128M >"$DIR/up.log" 2>&1 || {
  echo "cluster up failed:"; cat "$DIR/up.log"; tail -n 20 "$DIR"/*.log; exit 1; }
set +e
timeout 70 "$BENCH" trace "$TRACE" --cluster "$DIR/cluster.json" --requests "$REQUESTS" --instances 2 \
  --replicas 2 --kv-bytes-per-token 16 --speedup max --quiet --json "$DIR/report.json"
rc=$?
set -e
echo "kvpool-bench exited $rc"
[ -r "$DIR/report.json" ] || { echo "no report"; tail -n 20 "$DIR"/*.log; exit 1; }
python3 - "$DIR/report.json" "$REQUESTS" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
want = int(sys.argv[2])
print("hit_rate %.4f bound_infinite %.4f bound_lru %.4f corrupt %d failed %d requests %d"
      % (r["hit_rate"], r["bound_infinite"], r["bound_lru"], r["corrupt_blocks"], r["failed_requests"], r["requests"]))
errs = []
if r["requests"] != want: errs.append("replayed %d of %d requests" % (r["requests"], want))
if r["corrupt_blocks"] != 0: errs.append("corrupt blocks")
if r["failed_requests"] != 0: errs.append("failed requests")
if not r["hit_rate"] > 0: errs.append("hit rate is 0")
if r["hit_rate"] > r["bound_infinite"] + 1e-9: errs.append("hit rate above the infinite-cache bound")
if r["hit_blocks"] > r["blocks_got"]: errs.append("hit blocks %d > blocks got %d" % (r["hit_blocks"], r["blocks_got"]))
if errs:
    print("FAIL: " + "; ".join(errs)); sys.exit(1)
print("PASS")
PY
[ "$rc" = 0 ] || { echo "FAIL: kvpool-bench exit status $rc"; exit 1; }
