#!/bin/sh
# leftovers.sh start|check BUILD_DIR — the suite's leftover-process check (a CTest fixture that
# every test requires: tests/CMakeLists.txt).
#   start: record the processes of BUILD_DIR already running (a developer's own cluster).
#   check: after the last test, fail if a process the suite started still runs: one whose
#          executable lies under BUILD_DIR (daemons, test binaries, forked clients) or whose
#          environment names KVP_BUILD_DIR=BUILD_DIR (what a test's script or pytest started).
#          A guard (tests/lib/cluster_guard.h) may still be stopping a timed-out test's cluster,
#          so the check waits up to 10 s for them to go; then it lists and SIGKILLs the rest.
set -u
# Its own subshells would carry an inherited KVP_BUILD_DIR (a forked shell keeps the environment
# it was started with): run without it.
if [ -n "${KVP_BUILD_DIR+x}" ]; then exec env -u KVP_BUILD_DIR sh "$0" "$@"; fi
mode=$1
B=$(cd "$2" && pwd -P)
pre="$B/tests/leftovers.pre"
ours() { # the pids of processes of $B, but this script's
  { find /proc -mindepth 2 -maxdepth 2 -name exe -lname "$B/*" 2>/dev/null | cut -d/ -f3
    grep -lsxzF "KVP_BUILD_DIR=$B" /proc/[0-9]*/environ | cut -d/ -f3; } | sort -u | grep -vx "$$"
}
new() { # ours, less those recorded at start
  for p in $(ours); do
    grep -qx "$p" "$pre" 2>/dev/null || echo "$p"
  done
}
case "$mode" in
start)
  mkdir -p "$B/tests"
  ours >"$pre"
  echo "$(wc -l <"$pre") process(es) of $B were running before the suite"
  ;;
check)
  i=0
  left=$(new)
  while [ -n "$left" ] && [ $i -lt 20 ]; do
    sleep 0.5
    i=$((i + 1))
    left=$(new)
  done
  if [ -z "$left" ]; then
    echo "no process started by the suite is still running"
    exit 0
  fi
  echo "processes started by the suite still running after it (killed now):"
  for p in $left; do
    printf '  pid %s: %s\n' "$p" "$(tr '\0' ' ' <"/proc/$p/cmdline" 2>/dev/null)"
  done
  for p in $left; do kill -9 "$p" 2>/dev/null; done
  exit 1
  ;;
*)
  echo "usage: leftovers.sh start|check BUILD_DIR" >&2
  exit 2
  ;;
esac
