#!/usr/bin/env bash
# The master session's cost, this tree against a base tree, in one run (docs/runtime.md
# "Figures"): tools/bench/bench_msession.c built against both trees' libkvpool.a, run in
# alternating pairs (the order flips every pair) at 1, 16 and 64 caller threads.
# Prints each run, then per caller count the medians of calls/s and CPU µs per call, the
# ratio new/base of the calls/s medians and the median of the per-pair ratios, and the load
# average before and after; then two counts that the machine's load does not move: system
# calls per call (strace -f -c) and user-space instructions per call (valgrind callgrind), each
# at one caller, when those tools are installed.
#
#   scripts/bench_msession.sh BASE_SRC BASE_BUILD [PAIRS=5] [SECONDS=2] [CALLERS="1 16 64"]
#
# BASE_SRC: a checkout of the base commit (e.g. `git archive 979f8f9 | tar -x -C DIR`);
# BASE_BUILD: its build folder with libkvpool.a built (cmake --build B --target kvpool_static).
# This tree's build is build/ (or $KVP_BUILD_DIR) with kvpool_static built.
set -euo pipefail
cd "$(dirname "$0")/.."
BASE_SRC=$(cd "$1" && pwd); BASE_BUILD=$(cd "$2" && pwd)
PAIRS=${3:-5}; SECS=${4:-2}; CALLERS=${5:-"1 16 64"}
NEW_BUILD=$(cd "${KVP_BUILD_DIR:-build}" && pwd)
OUT=$(mktemp -d)
trap 'rm -rf "$OUT"' EXIT
LIBS="$(pkg-config --libs libczmq libzmq libsodium raft libuv liblz4 libprotobuf-c jansson libxxhash libmicrohttpd) -libverbs -lpthread -lm -ldl"
build() { # out src build
  cc -O2 -g -o "$1" tools/bench/bench_msession.c -I"$2" -I"$2/include" -I"$3" "$3/libkvpool.a" $LIBS
}
build "$OUT/base" "$BASE_SRC" "$BASE_BUILD"
build "$OUT/new" "$PWD" "$NEW_BUILD"
echo "load before: $(cut -d' ' -f1-3 /proc/loadavg)"
for c in $CALLERS; do
  for i in $(seq 1 "$PAIRS"); do
    if [ $((i % 2)) = 1 ]; then order="base new"; else order="new base"; fi
    for b in $order; do
      line=$("$OUT/$b" "$c" "$SECS")
      echo "pair $i $b $line"
      echo "$c $i $b $line" >> "$OUT/runs"
    done
  done
done
echo "load after: $(cut -d' ' -f1-3 /proc/loadavg)"
# System calls per call at one caller, all threads (the answering master's included), under
# strace -f -c: a count that the machine's load does not move, next to the timings it does.
if command -v strace > /dev/null; then
  for b in base new; do
    line=$(strace -f -c -o "$OUT/st-$b" "$OUT/$b" 1 "$SECS" 2> /dev/null)
    calls=$(echo "$line" | sed -n 's/.*calls=\([0-9]*\).*/\1/p')
    total=$(awk '$NF == "total" {print $4}' "$OUT/st-$b")
    echo "syscalls $b calls=$calls syscalls=$total per_call=$(python3 -c "print(round($total / ($calls + 200), 1))")"
  done
fi
# User-space instructions per call at one caller (valgrind callgrind; all threads): the
# difference between a 1 s and a 4 s run over the difference in calls, so start-up cancels out.
if command -v valgrind > /dev/null; then
  for b in base new; do
    for d in 1 4; do
      line=$(valgrind --tool=callgrind --callgrind-out-file=/dev/null "$OUT/$b" 1 $d 2> "$OUT/vg-$b-$d")
      echo "$line" | sed -n 's/.*calls=\([0-9]*\).*/\1/p' > "$OUT/vgc-$b-$d"
    done
    python3 - "$OUT" "$b" <<'PY'
import re, sys
d, b = sys.argv[1], sys.argv[2]
ir = {t: int(re.search(r"Collected : (\d+)", open(f"{d}/vg-{b}-{t}").read()).group(1)) for t in (1, 4)}
calls = {t: int(open(f"{d}/vgc-{b}-{t}").read()) for t in (1, 4)}
print(f"instructions {b} per_call={(ir[4] - ir[1]) / (calls[4] - calls[1]):.0f} (calls {calls[1]} / {calls[4]})")
PY
  done
fi
python3 - "$OUT/runs" <<'EOF'
import re, statistics, sys
runs = {}
for line in open(sys.argv[1]):
    c, i, b, rest = line.split(None, 3)
    f = dict(kv.split("=") for kv in rest.split())
    runs.setdefault(int(c), {}).setdefault(int(i), {})[b] = (float(f["calls_per_s"]), float(f["cpu_us_per_call"]))
print("callers  base calls/s  new calls/s  ratio(medians)  median(pair ratios)  base cpu us/call  new cpu us/call")
for c in sorted(runs):
    pairs = [p for p in runs[c].values() if "base" in p and "new" in p]
    bm = statistics.median(p["base"][0] for p in pairs); nm = statistics.median(p["new"][0] for p in pairs)
    pr = statistics.median(p["new"][0] / p["base"][0] for p in pairs)
    bc = statistics.median(p["base"][1] for p in pairs); nc = statistics.median(p["new"][1] for p in pairs)
    print(f"{c:7d}  {bm:12.0f}  {nm:11.0f}  {nm / bm:14.2f}  {pr:19.2f}  {bc:16.1f}  {nc:15.1f}")
EOF
