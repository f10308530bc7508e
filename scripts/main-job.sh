#!/usr/bin/env bash
# The main job (README): install what is missing, build, start a local cluster (3 masters,
# 3 segments sized to this machine), replay a few thousand requests of Mooncake's conversation
# trace with kvpool-bench, SIGKILL the Raft leader halfway through, and print the report and the
# plots' paths. Exit status 0 only with zero corrupt blocks and zero failed requests.
# Every process it starts is stopped on exit, also on Ctrl-C.
#
# Knobs (environment): KVP_MAIN_REQUESTS (3000), KVP_MAIN_INSTANCES (4), KVP_MAIN_REPLICAS (2),
# KVP_MAIN_KV_BYTES_PER_TOKEN (64 -> 32 KiB per 512-token block), KVP_MAIN_SEGMENT_SIZE (auto),
# KVP_MAIN_DIR (a fresh /tmp dir), KVP_TRACE (../shared/data/traces/conversation_trace.jsonl),
# KVP_MAIN_SKIP_BUILD=1 (use the existing build), KVP_MAIN_NO_KILL=1 (no leader kill).
set -euo pipefail
cd "$(dirname "$0")/.."
REPO=$(pwd)
B=${KVP_BUILD_DIR:-build}

REQUESTS=${KVP_MAIN_REQUESTS:-3000}
INSTANCES=${KVP_MAIN_INSTANCES:-4}
REPLICAS=${KVP_MAIN_REPLICAS:-2}
KVBPT=${KVP_MAIN_KV_BYTES_PER_TOKEN:-64}
TRACE=${KVP_TRACE:-$REPO/../shared/data/traces/conversation_trace.jsonl}
# before the build: a clone away from ../shared learns it in seconds, not after a build
[ -r "$TRACE" ] || { echo "main-job: trace not found: $TRACE (set KVP_TRACE)" >&2; exit 1; }

if [ "${KVP_MAIN_SKIP_BUILD:-0}" != 1 ]; then
  echo "== main-job: dependencies"
  scripts/install-deps.sh
  echo "== main-job: build ($B)"
  if ! KVP_BUILD_DIR=$B scripts/build.sh; then
    # The full build includes every test; the main job needs only four programs.
    echo "main-job: full build failed; building the main job's programs only" >&2
    cmake --build "$B" -j"$(nproc)" --target kvpool-master kvpool-segment kvpoolctl kvpool-bench
  fi
fi
CTL=$B/tools/kvpoolctl
BENCH=$B/tools/kvpool-bench
for x in "$CTL" "$BENCH"; do
  [ -x "$x" ] || { echo "main-job: $x missing (build failed?)" >&2; exit 1; }
done
[ -r "$TRACE" ] || { echo "main-job: trace not found: $TRACE (set KVP_TRACE)" >&2; exit 1; }

# Segment size: 1 GiB each, less on a small machine (at most 1/8 of available memory each).
if [ -n "${KVP_MAIN_SEGMENT_SIZE:-}" ]; then
  SEGSIZE=$KVP_MAIN_SEGMENT_SIZE
else
  avail_kb=$(awk '/MemAvailable/ {print $2}' /proc/meminfo)
  seg_mb=$(( avail_kb / 1024 / 8 ))
  [ "$seg_mb" -gt 1024 ] && seg_mb=1024
  [ "$seg_mb" -lt 64 ] && seg_mb=64
  SEGSIZE=${seg_mb}M
fi

DIR=${KVP_MAIN_DIR:-$(mktemp -d /tmp/kvpool-main.XXXXXX)}
mkdir -p "$DIR"
CLUSTER=$DIR/cluster.json
rm -f "$DIR/bench.done" "$DIR/progress" "$DIR/kills.log" "$DIR/events"
BENCH_PID=""
KILLER_PID=""
CLUSTER_UP=0

cleanup() {
  local rc=$?
  # Ignore further Ctrl-C / TERM while cleaning up (a second Ctrl-C, or `timeout` sending
  # SIGINT twice, must not cut `cluster down` short and leave the cluster running).
  trap '' INT TERM
  trap - EXIT
  if [ -n "$KILLER_PID" ]; then kill "$KILLER_PID" 2>/dev/null || true; wait "$KILLER_PID" 2>/dev/null || true; fi
  if [ -n "$BENCH_PID" ] && kill -0 "$BENCH_PID" 2>/dev/null; then
    kill -INT "$BENCH_PID" 2>/dev/null || true   # the bench stops and prints a partial report
    wait "$BENCH_PID" 2>/dev/null || true
  fi
  if [ "$CLUSTER_UP" = 1 ]; then
    echo "== main-job: cluster down"
    "$CTL" cluster down --dir "$DIR" >/dev/null 2>&1 || echo "main-job: cluster down failed (see $DIR)" >&2
  fi
  exit "$rc"
}
trap cleanup EXIT
trap 'echo; echo "main-job: interrupted" >&2; exit 130' INT TERM

echo "== main-job: cluster up in $DIR (3 masters, 3 segments of $SEGSIZE)"
CLUSTER_UP=1
"$CTL" cluster up --dir "$DIR" --masters 3 --segments 3 --segment-size "$SEGSIZE" --json >"$DIR/cluster-up.json"
"$CTL" --cluster "$CLUSTER" leader

# Halfway through, SIGKILL the leader, then start it again a few seconds later.
kill_leader_halfway() {
  local total done_ line
  while :; do
    sleep 0.2
    [ -e "$DIR/bench.done" ] && return   # the replay ended (or was interrupted) before halfway
    [ -r "$DIR/progress" ] || continue
    read -r done_ total <"$DIR/progress" || continue
    [ -n "${total:-}" ] && [ "$total" -gt 0 ] && [ $((done_ * 2)) -ge "$total" ] && break
  done
  line=$("$CTL" --cluster "$CLUSTER" --timeout 5000 leader --json) || { echo "main-job: no leader to kill" >&2; return; }
  local pid id
  pid=$(printf '%s' "$line" | python3 -c 'import json,sys; print(json.load(sys.stdin)["pid"])')
  id=$(printf '%s' "$line" | python3 -c 'import json,sys; print(json.load(sys.stdin)["id"])')
  if [ -z "$pid" ] || [ "$pid" -le 0 ]; then echo "main-job: leader pid unknown: $line" >&2; return; fi
  echo >&2
  echo "main-job: request $done_ of $total: SIGKILL leader master-$id (pid $pid)" >&2
  kill -KILL "$pid"
  echo "$(date -u +%H:%M:%S.%N) killed master $id pid $pid at request $done_" >>"$DIR/kills.log"
  echo "$done_ leader-kill" >>"$DIR/events"
  # 3 s of downtime on purpose (the cluster runs on two masters meanwhile); the restart itself
  # waits until every thread of the killed process is gone (kvpoolctl cluster restart).
  sleep 3
  if "$CTL" cluster restart --dir "$DIR" "$id" >/dev/null 2>&1; then
    echo "$(date -u +%H:%M:%S.%N) restarted master $id" >>"$DIR/kills.log"
  else
    echo >&2; echo "main-job: restart of master-$id failed" >&2
  fi
}
if [ "${KVP_MAIN_NO_KILL:-0}" != 1 ]; then
  kill_leader_halfway &
  KILLER_PID=$!
fi

echo "== main-job: replay $REQUESTS requests, $INSTANCES instances, replicas $REPLICAS, $KVBPT B/token"
set +e
"$BENCH" trace "$TRACE" --cluster "$CLUSTER" --requests "$REQUESTS" --instances "$INSTANCES" \
  --replicas "$REPLICAS" --kv-bytes-per-token "$KVBPT" --speedup max \
  --json "$DIR/report.json" --plot "$DIR/plots" --events "$DIR/events" --progress-file "$DIR/progress" &
BENCH_PID=$!
wait "$BENCH_PID"
BRC=$?
BENCH_PID=""
touch "$DIR/bench.done"
set -e
if [ -n "$KILLER_PID" ]; then wait "$KILLER_PID" 2>/dev/null || true; KILLER_PID=""; fi

echo
[ -r "$DIR/kills.log" ] && { echo "leader kills:"; sed 's/^/  /' "$DIR/kills.log"; }
echo "report (JSON): $DIR/report.json"
ls "$DIR"/plots/*.png 2>/dev/null | sed 's/^/plot: /' || true
verdict=$(python3 - "$DIR/report.json" <<'EOF' || echo "FAIL no report"
import json, sys
r = json.load(open(sys.argv[1]))
ok = r["corrupt_blocks"] == 0 and r["failed_requests"] == 0 and not r.get("interrupted")
print(("PASS" if ok else "FAIL") + ": corrupt_blocks=%d failed_requests=%d hit_rate=%.4f (bounds: infinite %.4f, LRU %.4f)"
      % (r["corrupt_blocks"], r["failed_requests"], r["hit_rate"], r["bound_infinite"], r["bound_lru"]))
EOF
)
echo "main-job: $verdict"
case "$verdict" in
  PASS*) [ "$BRC" = 0 ] || { echo "main-job: kvpool-bench exited $BRC" >&2; exit 1; } ;;
  *) exit 1 ;;
esac
