#!/usr/bin/env bash
# RDMA check on a real machine (issue 20 item 6; docs/rdma.md). Read-only unless it finds a
# device and a build with the rdma transport.
#  - No RDMA device (this CI VM: ibv_get_device_list gives NULL/ENOSYS): says so in one line,
#    exits 0.
#  - Devices but no rdma transport in this build (kvpool-rdma-probe --transport exits 3):
#    lists the devices, says so, exits 0.
#  - Devices and the transport: a local cluster with `protocol: rdma` (KVPOOL_PROTOCOL=rdma),
#    then put and get at 4 KiB ... 64 MiB from a second process (kvpool-bench), GB/s printed
#    next to perftest's ib_write_bw / ib_read_bw on the first device when they are installed.
#    Figures are printed, never asserted. This branch has not run yet: no machine here has a NIC.
# Needs a build (scripts/build.sh); KVP_BUILD_DIR selects it. KVP_RDMA_DEVICE picks the device
# for perftest (default: the first listed).
set -euo pipefail
cd "$(dirname "$0")/.."
B=${KVP_BUILD_DIR:-build}
PROBE=$B/tools/kvpool-rdma-probe

if [[ ! -x $PROBE ]]; then
  # Built without libibverbs (or not built): fall back on sysfs for the one-line answer.
  if compgen -G "/sys/class/infiniband/*" >/dev/null; then
    echo "rdma-check: RDMA devices in /sys/class/infiniband ($(cd /sys/class/infiniband && echo *)) but $PROBE is not built (install libibverbs-dev, rerun scripts/build.sh)"
  else
    echo "rdma-check: no RDMA device (no /sys/class/infiniband; $PROBE not built); nothing to check"
  fi
  exit 0
fi

set +e
LIST=$("$PROBE")
RC=$?
set -e
if [[ $RC -eq 2 ]]; then
  echo "rdma-check: $LIST; nothing to check"
  exit 0
elif [[ $RC -ne 0 ]]; then
  echo "rdma-check: $PROBE failed ($RC): $LIST" >&2
  exit 1
fi
echo "rdma-check: RDMA devices:"
while IFS= read -r L; do echo "  $L"; done <<<"$LIST"

if ! "$PROBE" --transport >/dev/null; then
  echo "rdma-check: $("$PROBE" --transport); nothing to measure"
  exit 0
fi

# ---- With a device and the transport (not reachable before the transport exists) ----
CTL=$B/tools/kvpoolctl
BENCH=$B/tools/kvpool-bench
DIR=${KVP_RDMA_CHECK_DIR:-$(pwd)/rdma-check-$$}
DEV=${KVP_RDMA_DEVICE:-$(echo "$LIST" | head -1 | cut -d' ' -f1)}
mkdir -p "$DIR"
PIDS=()
cleanup() {
  for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; wait "$p" 2>/dev/null || true; done
  "$CTL" cluster down --dir "$DIR" >/dev/null 2>&1 || true
}
trap cleanup EXIT
export KVPOOL_PROTOCOL=rdma
export KVPOOL_DEVICE_NAME=$DEV
"$CTL" cluster up --dir "$DIR" --masters 1 --segments 1 --segment-size 2G >"$DIR/up.log"
C=$DIR/cluster.json

perftest() { # $1 = ib_write_bw | ib_read_bw; prints GB/s at 64 MiB on $DEV, or "-"
  if ! command -v "$1" >/dev/null; then echo "-"; return; fi
  "$1" -d "$DEV" -s $((64 << 20)) -n 50 >/dev/null 2>&1 & PIDS+=($!)
  sleep 1
  "$1" -d "$DEV" -s $((64 << 20)) -n 50 localhost 2>/dev/null |
    awk '$1 ~ /^[0-9]+$/ && NF >= 4 {printf "%.2f", $4 * 1048576 / 1e9}' || echo "-"
}
WBW=$(perftest ib_write_bw)
RBW=$(perftest ib_read_bw)
printf '%-8s %12s %12s %14s %14s\n' size put_GB/s get_GB/s ib_write_bw ib_read_bw
I=0
for S in 4K 64K 1M 4M 16M 64M; do
  I=$((I + 1))
  RUN=$(printf '%x' $(( ($$ & 0xffffff) * 16 + I )))   # one key set per size
  COUNT=$([[ $S == 64M ]] && echo 16 || echo 64)
  PUT=$("$BENCH" put --cluster "$C" --value-size "$S" --count "$COUNT" --batch 1 --threads 1 \
        --replicas 1 --keep --run-id "$RUN" --json)
  GET=$("$BENCH" get --cluster "$C" --value-size "$S" --count "$COUNT" --batch 1 --threads 1 \
        --run-id "$RUN" --json)
  g() { python3 -c 'import json,sys; d=json.loads(sys.argv[1]); print("%.2f" % (d.get("bytes_per_second", 0)/1e9))' "$1"; }
  printf '%-8s %12s %12s %14s %14s\n' "$S" "$(g "$PUT")" "$(g "$GET")" "$WBW" "$RBW"
done
