#!/usr/bin/env bash
# Configure and build kvpool into build/ (or $KVP_BUILD_DIR). Extra args go to cmake.
set -euo pipefail
cd "$(dirname "$0")/.."
B=${KVP_BUILD_DIR:-build}
cmake -S . -B "$B" -DCMAKE_BUILD_TYPE=${KVP_BUILD_TYPE:-RelWithDebInfo} "$@" >/dev/null
cmake --build "$B" -j"$(nproc)"
