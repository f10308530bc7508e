#!/usr/bin/env bash
# The master at fleet scale (issue 22; docs/bench.md "Master scale"). Figures are printed, never
# asserted. Runs tests/integration/bench_master_scale.c (built as <build>/tests/bench_master_scale)
# against a real 3-master cluster of the build named by KVP_SCALE_TARGET (default: this build),
# so a baseline build is measured by the same driver:
#   scripts/bench-scale.sh                       1M objects, this build
#   KVP_SCALE_OBJECTS=10000000 scripts/bench-scale.sh
#   KVP_SCALE_TARGET=/path/to/old/build scripts/bench-scale.sh      (needs kvpool-master, kvpoolctl)
# Other knobs: KVP_SCALE_SEGMENTS (100), KVP_SCALE_FAILOVERS (3), KVP_SCALE_EXTRA (objects written
# while a follower is down, default objects/10 + 400000), KVP_SCALE_LOADERS (4), KVP_SCALE_BATCH (1024),
# KVP_SCALE_LOAD_DEADLINE_S (stop the main load after that long on a slow host; figures follow).
# Memory: each of the 3 masters holds every object (~150-200 B each), plus snapshot buffers; at
# 10M objects plan for ~7 GiB in all. KVPOOL_* variables reach the masters (e.g. KVPOOL_ELECTION_TIMEOUT_MS).
set -euo pipefail
cd "$(dirname "$0")/.."
B=${KVP_BUILD_DIR:-build}
TARGET=${KVP_SCALE_TARGET:-$B}
BIN=$B/tests/bench_master_scale
[ -x "$BIN" ] || { echo "bench-scale: $BIN not built (cmake --build $B --target bench_master_scale)" >&2; exit 2; }
for t in kvpool-master kvpoolctl; do
  [ -x "$TARGET/tools/$t" ] || { echo "bench-scale: $TARGET/tools/$t not built" >&2; exit 2; }
done
OBJECTS=${KVP_SCALE_OBJECTS:-1000000}
args=(--objects "$OBJECTS" --segments "${KVP_SCALE_SEGMENTS:-100}" --failovers "${KVP_SCALE_FAILOVERS:-3}"
      --loaders "${KVP_SCALE_LOADERS:-4}" --batch "${KVP_SCALE_BATCH:-1024}")
[ -n "${KVP_SCALE_EXTRA:-}" ] && args+=(--extra "$KVP_SCALE_EXTRA")
[ -n "${KVP_SCALE_LOAD_DEADLINE_S:-}" ] && args+=(--load-deadline-s "$KVP_SCALE_LOAD_DEADLINE_S")
echo "bench-scale: target $(cd "$TARGET" && pwd) ($(git -C "$(cd "$TARGET" && pwd)" rev-parse --short HEAD 2>/dev/null || echo '?')), $OBJECTS objects"
free -g | sed -n 2p | awk '{print "bench-scale: host memory free " $4 " GiB of " $2}'
KVP_BUILD_DIR=$(cd "$TARGET" && pwd) exec "$BIN" "${args[@]}"
