#!/usr/bin/env bash
# upgrade_mixed.sh BUILD_DIR REPO — rolling upgrade (issue 24 item 4, docs/operations.md
# "Upgrading"): a 3-master, 3-segment cluster of the first release (tag v0.1.0, built once by
# upgrade_build_old.sh and cached under BUILD_DIR/upgrade) serves puts and gets from this tree's
# kvpoolctl while its members are replaced one at a time by this tree's binaries (same data dir,
# same ports): one segment, the masters, the other segments, then one master back to v0.1.0;
# a v0.1.0 kvpoolctl also puts and gets against the upgraded masters.
# Checked: every byte read back equals what was put (zero wrong bytes); no put or get fails while
# only masters change (every replica lives); the cluster's feature level stays 1 until the last
# v0.1.0 master is gone, is 2 then, and is 1 again once one master is downgraded.
# Exit 77 (skipped) when the tag is missing from the clone.
set -uo pipefail
B=$(cd "$1" && pwd) REPO=$2
OLD=$B/upgrade/v0.1.0/bin
NEW=$B/tools
# v0.1.0 is commit a1b3629838558caf204eb5171ed7b195e0801176 (the fallback when the clone has no tags)
"$REPO/tests/integration/upgrade_build_old.sh" "$REPO" v0.1.0 "$B/upgrade/v0.1.0" a1b3629838558caf204eb5171ed7b195e0801176 || exit $?

D=$(mktemp -d /tmp/kvp-upgrade.XXXXXX)
CTL="$NEW/kvpoolctl --cluster $D/cluster.json --timeout 20000"
LOADER=
fail() {
    echo "FAIL: $*" >&2
    [ -n "$LOADER" ] && kill "$LOADER" 2>/dev/null
    for f in "$D"/*.log "$D"/*/*.log; do [ -f "$f" ] && { echo "== $f"; tail -15 "$f"; }; done >&2
    "$NEW/kvpoolctl" cluster down --dir "$D" >/dev/null 2>&1
    exit 1
}
cleanup() {
    [ -n "$LOADER" ] && kill "$LOADER" 2>/dev/null
    "$NEW/kvpoolctl" cluster down --dir "$D" >/dev/null 2>&1
    rm -rf "$D"
}
trap cleanup EXIT
# Its daemons die with this script however it ends: ctest's timeout SIGKILLs it, past the trap
# (the guard of tests/lib/cluster_guard.h; every process started from here carries its mark).
if [ -x "$B/tests/kvp_test_guard" ]; then export KVP_TEST_OWNER=$("$B/tests/kvp_test_guard" $$); fi

# v0.1.0 has no authentication: its cluster.json has no keys, so this tree's binaries that replace
# its members run with auth none (a rolling upgrade to an authenticated cluster is a second step,
# docs/security.md "Turning authentication on"). v0.1.0 ignores the variable.
export KVPOOL_AUTH=none
"$OLD/kvpoolctl" cluster up --dir "$D" --masters 3 --segments 3 --segment-size 64MiB \
    >"$D/up.out" 2>&1 || fail "v0.1.0 cluster up: $(cat "$D/up.out")"

# The load: put a fresh random value (2 replicas), read it back, read an older key back.
# wrong = bytes differ (never allowed); failed puts/gets are counted per phase.
mkdir -p "$D/v"
echo 0 >"$D/phase"
load() {
    local i=0 ph
    while [ ! -e "$D/stop" ]; do
        i=$((i + 1))
        ph=$(cat "$D/phase")
        head -c $((500 + RANDOM % 4000)) /dev/urandom >"$D/v/k$i"
        if $CTL put "k$i" "$D/v/k$i" --replica-num 2 >/dev/null 2>"$D/v/err"; then
            echo "k$i $ph" >>"$D/keys"
        else
            echo "$ph put k$i $(tr '\n' ' ' <"$D/v/err")" >>"$D/failed"
            continue
        fi
        for k in "k$i" "$(shuf -n1 "$D/keys" | cut -d' ' -f1)"; do
            if $CTL get "$k" "$D/v/got" >/dev/null 2>"$D/v/err"; then
                cmp -s "$D/v/got" "$D/v/$k" || echo "$ph $k" >>"$D/wrong"
                echo ok >>"$D/reads"
            else
                echo "$ph get $k $(tr '\n' ' ' <"$D/v/err")" >>"$D/failed"
            fi
        done
    done
}
load &
LOADER=$!

reads() { cat "$D/reads" 2>/dev/null | wc -l; }
wait_reads() { # N more reads than now, within 60 s
    local want=$(($(reads) + $1)) t=0
    while [ "$(reads)" -lt "$want" ]; do
        sleep 0.2
        t=$((t + 1))
        [ $t -gt 300 ] && fail "the load made no progress (reads $(reads), want $want)"
    done
}
# cluster feature level per the leader's status ("none" = a v0.1.0 leader, which reports none)
level() {
    $CTL --json status 2>/dev/null | jq -r 'if has("feature_level") then .feature_level.cluster else "none" end'
}
# replace MEMBER(master id or segment name) by BIN; wait until it logs that it serves
replace() {
    local sel=$1 bin=$2 pid log lines
    pid=$(jq -r "($sel).pid" "$D/cluster.json")
    log=$(jq -r "($sel).log" "$D/cluster.json")
    kill -TERM "$pid" 2>/dev/null
    for _ in $(seq 150); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    kill -0 "$pid" 2>/dev/null && fail "pid $pid did not stop"
    lines=$(wc -l <"$log")
    jq "($sel).cmdline[0] = \"$bin\"" "$D/cluster.json" >"$D/cluster.json.new" && mv "$D/cluster.json.new" "$D/cluster.json"
    "$NEW/kvpoolctl" cluster restart --dir "$D" "$3" >/dev/null || fail "restart $3"
    for _ in $(seq 300); do
        tail -n +$((lines + 1)) "$log" | grep -qE "$4" && return 0
        sleep 0.1
    done
    fail "$3 ($bin) did not log /$4/ within 30 s"
}
master_ready='follower \(term|became leader'

wait_reads 10
[ "$(level)" = none ] || fail "a v0.1.0 cluster reports a feature level: $(level)"
# One segment of this tree under v0.1.0 masters first (its replicas go: phase 2 rules).
echo 2 >"$D/phase"
replace '.segments[] | select(.name == "seg-1")' "$NEW/kvpool-segment" seg-1 "mounted"
wait_reads 10
echo 0 >"$D/phase"
for id in 1 2 3; do
    [ $id = 3 ] && echo 1 >"$D/phase"
    replace ".masters[] | select(.id == $id)" "$NEW/kvpool-master" "$id" "$master_ready"
    wait_reads 10
    l=$(level)
    echo "after master $id: feature level $l"
    if [ $id -lt 3 ]; then
        case "$l" in none | 1) ;; *) fail "feature level $l with a v0.1.0 master left" ;; esac
    fi
    if [ $id = 2 ]; then
        # Lead from an upgraded master while master 3 is still v0.1.0: the level must read 1,
        # steadily (one poll a second; a member's report counts for 5 s).
        $CTL transfer-leader 1 >/dev/null 2>&1 || $CTL transfer-leader 2 >/dev/null 2>&1
        for _ in $(seq 100); do [ "$(level)" != none ] && break; sleep 0.1; done
        for _ in $(seq 8); do
            l=$(level)
            [ "$l" = 1 ] || fail "an upgraded leader with master 3 on v0.1.0 reports feature level $l, want 1"
            sleep 1
        done
        echo "upgraded leader, one v0.1.0 master: feature level 1"
        wait_reads 10
    fi
done
# The level of this tree's binary (actors/master/fsm/version.h), reached once every master runs it.
WANT=$(sed -n 's/^#define KVP_FEATURE_LEVEL \([0-9]*\)u.*/\1/p' "$REPO/actors/master/fsm/version.h")
[ -n "$WANT" ] || fail "no KVP_FEATURE_LEVEL in $REPO/actors/master/fsm/version.h"
for _ in $(seq 100); do [ "$(level)" = "$WANT" ] && break; sleep 0.1; done
[ "$(level)" = "$WANT" ] || fail "every master upgraded, feature level $(level), want $WANT"
for _ in $(seq 30); do grep -q "cluster feature level $WANT" "$D"/*.log && break; sleep 0.1; done
grep -q "cluster feature level $WANT" "$D"/*.log || fail "no master logged level $WANT"
# A client of v0.1.0 against masters of this tree.
for i in 1 2 3; do
    head -c 3000 /dev/urandom >"$D/old$i"
    "$OLD/kvpoolctl" --cluster "$D/cluster.json" --timeout 20000 put "old$i" "$D/old$i" >/dev/null ||
        fail "v0.1.0 kvpoolctl put old$i"
    "$OLD/kvpoolctl" --cluster "$D/cluster.json" --timeout 20000 get "old$i" "$D/old$i.got" >/dev/null 2>&1 ||
        fail "v0.1.0 kvpoolctl get old$i"
    cmp -s "$D/old$i" "$D/old$i.got" || fail "v0.1.0 kvpoolctl read wrong bytes for old$i"
done
echo 2 >"$D/phase"
for s in $(jq -r '.segments[].name' "$D/cluster.json" | grep -vx seg-1); do
    replace ".segments[] | select(.name == \"$s\")" "$NEW/kvpool-segment" "$s" "mounted"
    wait_reads 10
done
echo 3 >"$D/phase"
replace ".masters[] | select(.id == 1)" "$OLD/kvpool-master" 1 "$master_ready"
wait_reads 10
for _ in $(seq 100); do case "$(level)" in none | 1) break ;; esac; sleep 0.1; done
case "$(level)" in none | 1) ;; *) fail "a v0.1.0 master is back, feature level $(level)" ;; esac
echo 4 >"$D/phase"
wait_reads 20
touch "$D/stop"
wait "$LOADER"
LOADER=

puts=$(wc -l <"$D/keys")
echo "puts $puts, reads $(reads)"
[ -s "$D/failed" ] && { echo "failed calls:"; cat "$D/failed"; }
[ -s "$D/wrong" ] && fail "wrong bytes read: $(cat "$D/wrong")"
if [ -s "$D/failed" ]; then
    # Phases 0, 1 (masters replaced; every replica lives), 4 (all settled): none may fail.
    # Phases 2-3 (segments restarted, their replicas gone): only reads of lost keys may fail.
    grep -E '^[014] ' "$D/failed" && fail "calls failed while every replica lived"
    grep -E '^[23] put' "$D/failed" && fail "puts failed while segments were replaced"
fi
echo "PASS: rolling upgrade v0.1.0 -> this tree -> one master back, $puts puts, no wrong bytes"
