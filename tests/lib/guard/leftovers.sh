#!/bin/sh
# leftovers.sh start|check BUILD_DIR — the suite's leftover-process check (a CTest fixture that
# every test requires: tests/CMakeLists.txt).
#   start: record the processes of BUILD_DIR already running (a developer's own cluster).
#   check: after the last test, fail if a process the suite started still runs: one whose
#          executable lies under BUILD_DIR (daemons, test binaries, forked clients) or whose
#          environment names KVP_BUILD_DIR=BUILD_DIR (what a test's script or pytest started).
#          A guard (tests/lib/cluster_guard.h) may still be stopping a timed-out test's cluster,
#          so the check waits up to 10 s for them to go; then it lists and SIGKILLs the rest.
# Another ctest may run tests of the same build directory at the same time (a developer's second
# terminal): its processes are not this run's leftovers and are left alone. They are told apart
# by a live owner: a process under another running ctest, or one carrying the KVP_TEST_OWNER mark
# of a test that still runs (the daemons of `kvpoolctl cluster up` are adopted by init at once).
set -u
# Its own subshells would carry an inherited KVP_BUILD_DIR (a forked shell keeps the environment
# it was started with): run without it.
if [ -n "${KVP_BUILD_DIR+x}" ]; then exec env -u KVP_BUILD_DIR sh "$0" "$@"; fi
mode=$1
B=$(cd "$2" && pwd -P)
run=$PPID # the ctest process that runs this fixture (exec above keeps the pid)
pre="$B/tests/leftovers.pre.$run"
ours() { # the pids of processes of $B, but this script's
  { find /proc -mindepth 2 -maxdepth 2 -name exe -lname "$B/*" 2>/dev/null | cut -d/ -f3
    grep -lsxzF "KVP_BUILD_DIR=$B" /proc/[0-9]*/environ | cut -d/ -f3; } | sort -u | grep -vx "$$"
}
field() { # field() PID N: field N of /proc/PID/stat (after the command name)
  s=$(cat "/proc/$1/stat" 2>/dev/null) || return 1
  echo "${s##*) }" | cut -d' ' -f$(($2 - 2))
}
live_owner() { # does pid belong to a test that still runs (of this run or another)?
  p=$1
  [ "$(cat "/proc/$p/comm" 2>/dev/null)" = kvp-guard ] && return 0 # a guard ends with its owner
  mark=$(tr '\0' '\n' <"/proc/$p/environ" 2>/dev/null | sed -n 's/^KVP_TEST_OWNER=//p' | head -n 1)
  if [ -n "$mark" ]; then
    o=${mark%%.*}
    [ "$(field "$o" 22)" = "${mark#*.}" ] && return 0
  fi
  a=$(field "$p" 4)
  while [ -n "$a" ] && [ "$a" -gt 1 ]; do
    if [ "$a" != "$run" ] && [ "$(cat "/proc/$a/comm" 2>/dev/null)" = ctest ]; then
      return 0
    fi
    a=$(field "$a" 4)
  done
  return 1
}
new() { # ours, less those recorded at start and those of tests still running
  for p in $(ours); do
    grep -qx "$p" "$pre" 2>/dev/null && continue
    live_owner "$p" && continue
    echo "$p"
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
  rm -f "$pre"
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
