#!/usr/bin/env bash
# The Python binding against the C API on the same work, in one run against one cluster
# (issue 16's benchmark; figures in docs/python.md): for each case, kvpool-bench (C) then
# python/bench/bench_python.py (one MooncakeDistributedStore), at 1 and 8 threads; prints
# keys/s of both and the ratio Python / C.
#   put/get: 32 keys x 32 pieces of 16 KiB per call (batch_put_from_multi_buffers /
#            batch_get_into_multi_buffers vs kvp_batch_put_iov / kvp_batch_get_iov)
#   exists:  batch_is_exist of 1,000 keys (vs kvp_batch_exists)
#   get1:    1-byte multi-buffer gets of 1,000 keys
# Usage: scripts/bench_python.sh   (KVP_BUILD_DIR, default build; KVP_PYTHON, default /usr/bin/python3;
#        KVP_BENCH_SCALE multiplies the key counts, default 1)
set -euo pipefail
SRC=$(cd "$(dirname "$0")/.." && pwd)
B=$(cd "${KVP_BUILD_DIR:-$SRC/build}" && pwd)
PY=${KVP_PYTHON:-/usr/bin/python3}
S=${KVP_BENCH_SCALE:-1}
DIR=$(mktemp -d /tmp/kvp-benchpy.XXXXXX)
trap '"$B/tools/kvpoolctl" cluster down --dir "$DIR" >/dev/null 2>&1 || true; rm -rf "$DIR"' EXIT INT TERM
echo '{"fence_grace_ms": 200, "segment_prefault": false}' >"$DIR/cfg.json"
"$B/tools/kvpoolctl" cluster up --dir "$DIR" --masters 1 --segments 2 --segment-size 1G --config "$DIR/cfg.json" >/dev/null
M=$("$PY" -c 'import json,sys; print(json.load(open(sys.argv[1]))["master_server_address"])' "$DIR/cluster.json")
export KVPOOL_LOG_LEVEL=${KVPOOL_LOG_LEVEL:-warn}
# name mode value pieces batch count
CASES=("put_32x32x16K put 524288 32 32 $((1024 * S))"
       "get_32x32x16K get 524288 32 32 $((1024 * S))"
       "exists_1000 exists 1 1 1000 $((100000 * S))"
       "get1_1000 get 1 1 1000 $((100000 * S))")
printf '%-16s %7s %12s %12s %7s\n' case threads C_keys/s py_keys/s ratio
for c in "${CASES[@]}"; do
  read -r name mode size pieces batch count <<<"$c"
  for t in 1 8; do
    cj=$("$B/tools/kvpool-bench" "$mode" --masters "$M" --value-size "$size" --pieces "$pieces" \
          --batch "$batch" --count "$count" --threads "$t" --warmup 1 --json 2>/dev/null | tail -1)
    sleep 1 # the removed keys' space leaves quarantine (fence_grace_ms 200)
    pj=$(PYTHONPATH="$B/python" "$PY" "$SRC/python/bench/bench_python.py" "$mode" --masters "$M" \
          --value-size "$size" --pieces "$pieces" --batch "$batch" --count "$count" --threads "$t" 2>/dev/null | tail -1)
    sleep 1
    "$PY" - "$name" "$t" "$cj" "$pj" <<'PYEOF'
import json, sys
name, t, c, p = sys.argv[1], sys.argv[2], json.loads(sys.argv[3]), json.loads(sys.argv[4])
cr, pr = c["ops_per_second"], p["ops_per_second"]
err = "" if not (c.get("errors") or p.get("errors")) else "  errors C %s py %s" % (c.get("errors"), p.get("errors"))
print("%-16s %7s %12.0f %12.0f %7.2f%s" % (name, t, cr, pr, pr / cr if cr else 0, err))
PYEOF
  done
done
