#!/usr/bin/env bash
# The README's test command: install dependencies, build, run the whole suite.
#  1. release-style build: all tests (unit, actor, integration, netns, fuzz smoke)
#  2. ASan+UBSan build: unit and actor tests
#  3. TSan build: runtime (actor) tests
# KVP_TEST_QUICK=1 skips the sanitizer builds.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-deps.sh
J=$(nproc)
echo "== build (RelWithDebInfo, fault injection on)"
KVP_BUILD_DIR=build scripts/build.sh
echo "== tests"
(cd build && ctest --output-on-failure -j"$J" --timeout 600)
if [ "${KVP_TEST_QUICK:-0}" != 1 ]; then
  echo "== ASan+UBSan build: unit and actor tests"
  KVP_BUILD_DIR=build-asan scripts/build.sh -DKVP_SANITIZE=ON -DCMAKE_BUILD_TYPE=Debug
  (cd build-asan && ASAN_OPTIONS=detect_leaks=1 ctest --output-on-failure -j"$J" -L 'unit|actor')
  echo "== TSan build: actor tests"
  KVP_BUILD_DIR=build-tsan scripts/build.sh -DKVP_TSAN=ON -DCMAKE_BUILD_TYPE=Debug
  (cd build-tsan && ctest --output-on-failure -j"$J" -L 'actor')
fi
echo "== all test stages passed"
