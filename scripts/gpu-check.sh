#!/usr/bin/env bash
# GPU check of issue 17 (docs/gpu.md): on a machine with an NVIDIA GPU, allocates device memory
# through the CUDA driver API (Python ctypes, no CUDA toolkit needed), runs put/get of 4 KiB ...
# 64 MiB objects and the scatter-gather calls from device buffers against a local cluster
# (kvpoolctl cluster up), checks the bytes, checks that a timed-out get never writes the device
# buffer after it returned, and prints GB/s next to a plain device<->host copy baseline.
# Without a GPU it says so in one line and exits 0. Bounded to 5 minutes (timeout 290 s).
# Needs a build (scripts/build.sh, KVP_BUILD_DIR, default build/). KVPOOL_LIBCUDA may name
# another driver library (e.g. the test double build/tests/fakecuda/libcuda.so.1, to try the
# script without a GPU).
set -euo pipefail
cd "$(dirname "$0")/.."
B=$(cd "${KVP_BUILD_DIR:-build}" 2>/dev/null && pwd || echo "${KVP_BUILD_DIR:-build}")
exec timeout 290 python3 scripts/gpu_check.py "$B"
