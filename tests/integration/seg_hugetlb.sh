#!/usr/bin/env bash
# Integration (ctest label integration, RUN_SERIAL): a segment on hugetlb pages. The test
# reserves exactly the segment's size in 2 MiB huge pages (/proc/sys/vm/nr_hugepages, restored
# at the end), starts one master and one segment (hugepages is on by default), and checks: the
# segment mapped huge pages and populated them (its log lines, HugePages_Free 0), a 1 MiB put
# and get through the data plane return the same bytes, and the pages are free again once the
# cluster is down. RUN_SERIAL: no other test's segment may take the reserved pages meanwhile.
# Exit 77 (skipped) without root or when the kernel does not give the pages (fragmented memory).
set -euo pipefail
SRC=${KVP_SOURCE_DIR:-$(cd "$(dirname "$0")/../.." && pwd)}
B=${KVP_BUILD_DIR:-$SRC/build}
CTL=$B/tools/kvpoolctl
for x in "$CTL" "$B/tools/kvpool-master" "$B/tools/kvpool-segment"; do
  [ -x "$x" ] || { echo "missing $x (build everything first)"; exit 1; }
done
[ "$(id -u)" = 0 ] && [ -w /proc/sys/vm/nr_hugepages ] || { echo "not root: skipped"; exit 77; }
grep -q '^Hugepagesize: *2048 kB' /proc/meminfo || { echo "huge page size is not 2 MiB: skipped"; exit 77; }
huge() { awk -v k="$1:" '$1 == k {print $2}' /proc/meminfo; }

PAGES=16 # 32 MiB
OLD=$(cat /proc/sys/vm/nr_hugepages)
DIR=$(mktemp -d /tmp/kvp-hugetlb-test.XXXXXX)
cleanup() {
  "$CTL" cluster down --dir "$DIR" >/dev/null 2>&1 || true
  echo "$OLD" >/proc/sys/vm/nr_hugepages
  rm -rf "$DIR"
}
trap cleanup EXIT INT TERM
# Its daemons die with this script however it ends: ctest's timeout SIGKILLs it, past the trap
# (the guard of tests/lib/cluster_guard.h; every process started from here carries its mark).
if [ -x "$B/tests/kvp_test_guard" ]; then export KVP_TEST_OWNER=$("$B/tests/kvp_test_guard" $$); fi
if [ "$(huge HugePages_Total)" != "$(huge HugePages_Free)" ]; then
  echo "huge pages already in use on this host: skipped"; exit 77
fi
echo $PAGES >/proc/sys/vm/nr_hugepages
[ "$(huge HugePages_Free)" = $PAGES ] || { echo "the kernel gave $(huge HugePages_Free) of $PAGES huge pages: skipped"; exit 77; }

"$CTL" cluster up --dir "$DIR" --masters 1 --segments 1 --segment-size $((PAGES * 2))M >"$DIR/up.log" 2>&1 || {
  echo "cluster up failed:"; cat "$DIR/up.log"; tail -n 20 "$DIR"/*.log; exit 1; }
SEGLOG=$DIR/seg-1.log
for _ in $(seq 1 100); do grep -q "prefault" "$SEGLOG" && break; sleep 0.1; done
cat "$SEGLOG"
fail=0
grep -q "region $((PAGES * 2 << 20)) bytes (huge pages)" "$SEGLOG" || { echo "FAIL: not on huge pages"; fail=1; }
grep -q "prefault: $((PAGES * 2 << 20)) of $((PAGES * 2 << 20)) bytes populated" "$SEGLOG" ||
  { echo "FAIL: prefault did not populate the region"; fail=1; }
echo "HugePages_Free while mounted: $(huge HugePages_Free) of $(huge HugePages_Total)"
[ "$(huge HugePages_Free)" = 0 ] || { echo "FAIL: the region does not hold every reserved page"; fail=1; }

head -c $((1 << 20)) /dev/urandom >"$DIR/in"
"$CTL" --cluster "$DIR/cluster.json" put hugetlb-key "$DIR/in" || { echo "FAIL: put"; fail=1; }
"$CTL" --cluster "$DIR/cluster.json" get hugetlb-key "$DIR/out" || { echo "FAIL: get"; fail=1; }
cmp "$DIR/in" "$DIR/out" || { echo "FAIL: the bytes read differ from the bytes written"; fail=1; }

"$CTL" cluster down --dir "$DIR" >/dev/null 2>&1
for _ in $(seq 1 50); do [ "$(huge HugePages_Free)" = $PAGES ] && break; sleep 0.1; done
echo "HugePages_Free after cluster down: $(huge HugePages_Free) of $(huge HugePages_Total)"
[ "$(huge HugePages_Free)" = $PAGES ] || { echo "FAIL: huge pages not released"; fail=1; }
[ $fail = 0 ] && echo "PASS"
exit $fail
