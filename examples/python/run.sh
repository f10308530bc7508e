#!/usr/bin/env bash
# Start a local cluster (1 master, 1 segment, in a fresh temporary directory), run
# examples/python/hicache_example.py against it with Debian's /usr/bin/python3, stop the
# cluster (only the processes it started). Exit status: the example's.
# Usage: examples/python/run.sh   (KVP_BUILD_DIR names the build directory, default ./build)
set -euo pipefail
SRC=$(cd "$(dirname "$0")/../.." && pwd)
B=$(cd "${KVP_BUILD_DIR:-$SRC/build}" && pwd)
PY=${KVP_PYTHON:-/usr/bin/python3}
[ -x "$PY" ] || PY=python3
[ -f "$B/python/kvpool/_kvpool.abi3.so" ] || { echo "no Python module in $B/python (run scripts/build.sh; needs python3-dev)"; exit 1; }
DIR=$(mktemp -d /tmp/kvp-pyexample.XXXXXX)
trap '"$B/tools/kvpoolctl" cluster down --dir "$DIR" >/dev/null 2>&1 || true; rm -rf "$DIR"' EXIT INT TERM
# Its daemons die with this script however it ends: ctest's timeout SIGKILLs it, past the trap
# (the guard of tests/lib/cluster_guard.h; every process started from here carries its mark).
if [ -x "$B/tests/kvp_test_guard" ]; then export KVP_TEST_OWNER=$("$B/tests/kvp_test_guard" $$); fi
"$B/tools/kvpoolctl" cluster up --dir "$DIR" --masters 1 --segments 1 --segment-size 128M >"$DIR/up.log" 2>&1 || {
  cat "$DIR/up.log"; exit 1; }
MASTERS=$("$PY" -c 'import json,sys; print(json.load(open(sys.argv[1]))["master_server_address"])' "$DIR/cluster.json")
# SGLang's setup() call names no keys: the client finds them through the cluster file
# (docs/security.md; KVPOOL_AUTH_KEY and KVPOOL_AUTH_MASTER_KEYS work too).
KVPOOL_CLUSTER_FILE="$DIR/cluster.json" KVPOOL_LOG_LEVEL=${KVPOOL_LOG_LEVEL:-warn} PYTHONPATH="$B/python${PYTHONPATH:+:$PYTHONPATH}" \
  "$PY" "$SRC/examples/python/hicache_example.py" "$MASTERS"
