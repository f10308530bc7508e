#!/usr/bin/env bash
# packaging/systemd/: the units are valid for systemd (systemd-analyze verify, when installed,
# with ExecStart pointed at this build's binaries), the example configs load, and the stop and
# restart settings agree with the daemons: the segment's stop timeout outlasts its default drain,
# exit status 2 (bad settings) is not restarted. Needs KVP_BUILD_DIR and KVP_SOURCE_DIR.
set -euo pipefail
B=${KVP_BUILD_DIR:?}
S=${KVP_SOURCE_DIR:?}
P=$S/packaging/systemd
T=$(mktemp -d /tmp/kvp-systemd-XXXXXX)
trap 'rm -rf "$T"' EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }

for d in master segment; do
  u=$P/kvpool-$d.service
  grep -qx 'Type=notify' "$u" || fail "$u: Type=notify missing"
  grep -qx 'Restart=on-failure' "$u" || fail "$u: Restart=on-failure missing"
  grep -qx 'RestartPreventExitStatus=2' "$u" || fail "$u: exit 2 (bad settings) must not restart"
  grep -qx 'KillSignal=SIGTERM' "$u" || fail "$u: KillSignal=SIGTERM missing"
  grep -q "^ExecStart=/usr/local/bin/kvpool-$d --config /etc/kvpool/$d.json\$" "$u" || fail "$u: ExecStart"
  "$B/tools/kvpool-$d" --config "$P/$d.json.example" --print-config > "$T/$d.json" \
    || fail "$P/$d.json.example does not load"
  if command -v systemd-analyze >/dev/null; then
    sed "s#/usr/local/bin/kvpool-$d#$B/tools/kvpool-$d#" "$u" > "$T/kvpool-$d.service"
    out=$(systemd-analyze verify "$T/kvpool-$d.service" 2>&1) || fail "systemd-analyze verify $u: $out"
    [ -z "$out" ] || fail "systemd-analyze verify $u: $out"
  else
    echo "note: systemd-analyze not found; units checked by grep only"
  fi
done
# The segment drains on SIGTERM for up to drain_timeout_ms: systemd must wait longer.
drain_ms=$(sed -n 's/^ *"drain_timeout_ms": \([0-9]*\).*/\1/p' "$T/segment.json")
stop_s=$(sed -n 's/^TimeoutStopSec=\([0-9]*\)s$/\1/p' "$P/kvpool-segment.service")
[ -n "$drain_ms" ] && [ -n "$stop_s" ] || fail "drain_timeout_ms or TimeoutStopSec not found"
[ $((stop_s * 1000)) -gt "$drain_ms" ] || fail "TimeoutStopSec=${stop_s}s does not outlast drain_timeout_ms=$drain_ms"
grep -qx 'SuccessExitStatus=130 143' "$P/kvpool-segment.service" || fail "segment: a signal before the mount exits 130/143"
echo "systemd units OK"
