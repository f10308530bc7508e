#!/usr/bin/env bash
# upgrade_build_old.sh REPO TAG OUT [COMMIT] — build kvpool-master, kvpool-segment and kvpoolctl of
# release TAG (a git tag of REPO) into OUT/bin, once: a later call with the same commit reuses them.
# Used by the rolling-upgrade test (tests/integration/upgrade_mixed.sh). A clone without the tag
# (tags are not always carried along) uses COMMIT, the release's commit id, which every full clone
# of main has; exit 77 (skipped) only when neither is there (a shallow checkout).
set -euo pipefail
REPO=$1 TAG=$2 OUT=$3 COMMIT=${4:-}
rev=$(git -C "$REPO" rev-parse -q --verify "refs/tags/$TAG^{commit}" 2>/dev/null) ||
    rev=$( [ -n "$COMMIT" ] && git -C "$REPO" rev-parse -q --verify "$COMMIT^{commit}" 2>/dev/null) || {
    echo "upgrade_build_old: neither tag $TAG nor commit ${COMMIT:-?} in $REPO (a shallow clone?); test skipped" >&2
    exit 77
}
if [ -x "$OUT/bin/kvpool-master" ] && [ -x "$OUT/bin/kvpool-segment" ] && [ -x "$OUT/bin/kvpoolctl" ] &&
    [ "$(cat "$OUT/rev" 2>/dev/null)" = "$rev" ]; then
    exit 0
fi
echo "upgrade_build_old: building $TAG ($rev) into $OUT (once; cached for later runs)" >&2
t0=$(date +%s)
rm -rf "$OUT"
mkdir -p "$OUT/src" "$OUT/bin"
git -C "$REPO" archive "$rev" | tar -x -C "$OUT/src"
cmake -S "$OUT/src" -B "$OUT/build" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DKVP_TESTS=OFF -DKVP_PYTHON=OFF \
    -DKVP_FAULT_INJECTION=OFF >"$OUT/build.log" 2>&1
nice cmake --build "$OUT/build" -j2 --target kvpool-master kvpool-segment kvpoolctl >>"$OUT/build.log" 2>&1 || {
    tail -30 "$OUT/build.log" >&2
    exit 1
}
for b in kvpool-master kvpool-segment kvpoolctl; do
    cp "$(find "$OUT/build" -name "$b" -type f -perm -u+x | head -1)" "$OUT/bin/$b"
done
echo "$rev" >"$OUT/rev"
echo "upgrade_build_old: $TAG built in $(($(date +%s) - t0)) s" >&2
