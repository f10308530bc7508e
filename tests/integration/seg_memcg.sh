#!/usr/bin/env bash
# Integration (ctest label integration): a segment inside a memory cgroup whose limit is below
# global_segment_size, as an inference server's container often is. Populating the whole region
# would run the cgroup's OOM killer; the prefault must stop before the limit (actors/segment/
# memcg.c) and the segment must warn at start-up. Checks: the start-up WARN, the "prefault
# stopped ... memory cgroup" line, the segment still running, no OOM kill in the cgroup, usage
# below the limit. No master is needed: the prefault runs before the mount.
# Exit 77 (skipped) without root or a writable memory cgroup (v1 memory controller or v2).
set -euo pipefail
SRC=${KVP_SOURCE_DIR:-$(cd "$(dirname "$0")/../.." && pwd)}
B=${KVP_BUILD_DIR:-$SRC/build}
SEG=$B/tools/kvpool-segment
[ -x "$SEG" ] || { echo "missing $SEG (build everything first)"; exit 1; }
[ "$(id -u)" = 0 ] || { echo "not root: skipped"; exit 77; }

LIMIT=$((768 << 20))
NAME=kvp-memcg-test-$$
if [ -w /sys/fs/cgroup/memory ] && [ -e /sys/fs/cgroup/memory/memory.limit_in_bytes ]; then
  CG=/sys/fs/cgroup/memory/$NAME; V=1
elif [ -e /sys/fs/cgroup/cgroup.controllers ] && grep -qw memory /sys/fs/cgroup/cgroup.subtree_control 2>/dev/null; then
  CG=/sys/fs/cgroup/$NAME; V=2
else
  echo "no writable memory cgroup (v1 memory controller or v2 with memory enabled): skipped"; exit 77
fi
mkdir "$CG" 2>/dev/null || { echo "cannot create $CG: skipped"; exit 77; }
LOG=$(mktemp /tmp/kvp-memcg-test.XXXXXX)
PID=
cleanup() {
  # SIGKILL: the segment is in no cluster, and SIGTERM would wait out the mount's timeout
  [ -n "$PID" ] && kill -KILL "$PID" 2>/dev/null && wait "$PID" 2>/dev/null || true
  rmdir "$CG" 2>/dev/null || true
  rm -f "$LOG"
}
trap cleanup EXIT INT TERM
# Its daemons die with this script however it ends: ctest's timeout SIGKILLs it, past the trap
# (the guard of tests/lib/cluster_guard.h; every process started from here carries its mark).
if [ -x "$B/tests/kvp_test_guard" ]; then export KVP_TEST_OWNER=$("$B/tests/kvp_test_guard" $$); fi
if [ $V = 1 ]; then
  echo $LIMIT >"$CG/memory.limit_in_bytes"
  echo $LIMIT >"$CG/memory.memsw.limit_in_bytes" 2>/dev/null || true # no swapping around it
else
  echo $LIMIT >"$CG/memory.max"
  echo 0 >"$CG/memory.swap.max" 2>/dev/null || true
fi

# The segment moves itself into the cgroup before it starts (exec keeps the pid). No master
# listens at port 1: the mount fails after its timeout, long after the prefault has ended. No
# master, so no keys: auth none (this test is about the prefault, docs/security.md).
bash -c 'echo $$ >"$1/cgroup.procs" && exec "$2" --name memcg-test --global-segment-size 1G \
  --master-server-address 127.0.0.1:1 --auth none' _ "$CG" "$SEG" >"$LOG" 2>&1 &
PID=$!
for _ in $(seq 1 300); do
  grep -q "prefault" "$LOG" && break
  kill -0 "$PID" 2>/dev/null || break
  sleep 0.1
done
sleep 0.5
cat "$LOG"
fail=0
kill -0 "$PID" 2>/dev/null || { echo "FAIL: the segment is not running (OOM-killed?)"; fail=1; }
grep -q "WARN.*global_segment_size .* memory cgroup .*$NAME" "$LOG" || { echo "FAIL: no start-up WARN"; fail=1; }
grep -q "prefault stopped after .*memory cgroup .*$NAME.* near its limit" "$LOG" ||
  { echo "FAIL: the prefault did not stop at the cgroup guard"; fail=1; }
if [ $V = 1 ]; then
  usage=$(cat "$CG/memory.usage_in_bytes")
  oom=$(awk '$1 == "oom_kill" {print $2}' "$CG/memory.oom_control")
else
  usage=$(cat "$CG/memory.current")
  oom=$(awk '$1 == "oom_kill" {print $2}' "$CG/memory.events")
fi
echo "cgroup v$V: limit $LIMIT, usage $usage, oom_kill ${oom:-?}"
[ "$usage" -lt $LIMIT ] || { echo "FAIL: usage at the limit"; fail=1; }
[ "${oom:-0}" = 0 ] || { echo "FAIL: the cgroup's OOM killer ran"; fail=1; }
[ $fail = 0 ] && echo "PASS"
exit $fail
