#!/usr/bin/env bash
# Build the libFuzzer targets with clang into build-fuzz and run each for N seconds.
#   scripts/fuzz.sh [SECONDS]        (default 20; env KVP_FUZZ_SECONDS also works)
# Targets: the wire decoders (tests/cmake/fuzz.cmake) and any other fuzz_* target a module
# registers (e.g. fuzz_raft_entry). Each run starts from a copy of tests/fuzz/corpus/<target>/
# when there is one; new inputs stay in build-fuzz/corpus/<target>/ and crashes in
# build-fuzz/artifacts/. Exit status is non-zero if any target crashed or failed to build.
set -euo pipefail
cd "$(dirname "$0")/.."
SECS=${1:-${KVP_FUZZ_SECONDS:-20}}
B=${KVP_FUZZ_BUILD_DIR:-build-fuzz}
command -v clang >/dev/null || { echo "fuzz.sh: clang not found (apt-get install clang)" >&2; exit 1; }
# -Wno-unknown-warning-option: KVP_WARN carries gcc-only flags (-Wno-format-truncation).
CC=clang cmake -S . -B "$B" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DKVP_FUZZ=ON \
  -DCMAKE_C_FLAGS="-Wno-unknown-warning-option" >/dev/null
# Every fuzz_* executable target except the *_replay ctests.
TARGETS=$(cmake --build "$B" --target help | sed -n 's/^\.\.\. \(fuzz_[a-z0-9_]*\).*/\1/p' \
          | grep -v '_replay$' | sort -u)
[ -n "$TARGETS" ] || { echo "fuzz.sh: no fuzz targets found" >&2; exit 1; }
fail=0
mkdir -p "$B/artifacts"
for T in $TARGETS; do
  echo "== $T: build"
  if ! cmake --build "$B" --target "$T" -j"$(nproc)" >/dev/null; then
    echo "== $T: BUILD FAILED" >&2; fail=1; continue
  fi
  BIN=$(find "$B" -type f -name "$T" -perm -u+x | head -1)
  mkdir -p "$B/corpus/$T"
  [ -d "tests/fuzz/corpus/$T" ] && cp -n "tests/fuzz/corpus/$T"/* "$B/corpus/$T/" 2>/dev/null || true
  echo "== $T: run ${SECS}s"
  if ! "$BIN" -max_total_time="$SECS" -print_final_stats=1 -artifact_prefix="$B/artifacts/$T-" \
        "$B/corpus/$T" > "$B/$T.log" 2>&1; then
    echo "== $T: FAILED (see $B/$T.log and $B/artifacts/)" >&2
    tail -30 "$B/$T.log" >&2
    fail=1
  else
    grep -E '^stat::number_of_executed_units|^stat::new_units_added' "$B/$T.log" | tr '\n' ' '
    echo
  fi
done
exit $fail
