#!/usr/bin/env bash
# Install kvpool's build and test dependencies from Debian 12 packages. Idempotent: installs
# only what is missing, so a second run is quick. Needs root (or sudo) for apt-get.
set -euo pipefail
PKGS=(build-essential cmake pkg-config git
      libczmq-dev libzmq3-dev libsodium-dev libraft-dev libuv1-dev liblz4-dev libcmocka-dev
      libibverbs-dev librdmacm-dev libprotobuf-c-dev protobuf-c-compiler libjansson-dev
      libxxhash-dev libmicrohttpd-dev clang libclang-rt-14-dev gnuplot-nox iproute2 nftables procps psmisc jq
      python3 python3-dev python3-pytest python3-setuptools python3-wheel python3-pip
      prometheus)
# jq: tests/integration/upgrade_mixed.sh (test_master_upgrade) reads and edits cluster.json with it.
# prometheus: for promtool (`promtool check metrics` in the metrics tests). Its server must not run
# on a build machine: a policy-rc.d keeps every package's daemon from starting during the install,
# and the prometheus unit is disabled afterwards where systemd runs.
# Benchmark baselines only (scripts/bench.sh): KVP_BENCH_DEPS=1 adds them, and linux-perf, which
# counts the kernel crossings per key. Kept out of the default set because the redis and iperf3
# packages start system daemons on install.
[ "${KVP_BENCH_DEPS:-0}" = 1 ] && PKGS+=(redis-server redis-tools iperf3 linux-perf)
missing=()
for p in "${PKGS[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -eq 0 ]; then
  echo "install-deps: all ${#PKGS[@]} packages present"
  exit 0
fi
SUDO=""
[ "$(id -u)" -eq 0 ] || SUDO="sudo"
echo "install-deps: installing ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
POLICY=/usr/sbin/policy-rc.d
own_policy=0
if [ ! -e "$POLICY" ]; then
  printf '#!/bin/sh\nexit 101\n' | $SUDO tee "$POLICY" >/dev/null && $SUDO chmod +x "$POLICY" && own_policy=1
fi
$SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
[ "$own_policy" = 1 ] && $SUDO rm -f "$POLICY"
if [ -d /run/systemd/system ] && systemctl is-enabled prometheus >/dev/null 2>&1; then
  $SUDO systemctl disable --now prometheus >/dev/null 2>&1 || true
fi
echo "install-deps: done"
