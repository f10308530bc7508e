#!/usr/bin/env bash
# Integration (ctest label integration): against a local cluster (3 masters, 2 segments) run
#  1. examples/inference_server (batch_put + batch_put_iov, batch_get + batch_get_iov, every
#     byte verified) with replica_num 2;
#  2. the kvpoolctl data commands: put FILE and put - (stdin), get to stdout / -o FILE / FILE,
#     exists (exit 0 / 1), size, rm, put of an existing key (exit 1), --json output, and a
#     config error (exit 2).
# Usage: run_example.sh (KVP_BUILD_DIR names the build directory, default ./build).
set -euo pipefail
SRC=${KVP_SOURCE_DIR:-$(cd "$(dirname "$0")/.." && pwd)}
B=${KVP_BUILD_DIR:-$SRC/build}
CTL=$B/tools/kvpoolctl
EX=$B/examples/inference_server
for x in "$CTL" "$EX" "$B/tools/kvpool-master" "$B/tools/kvpool-segment"; do
  [ -x "$x" ] || { echo "missing $x (build everything first)"; exit 1; }
done
DIR=$(mktemp -d /tmp/kvp-example-test.XXXXXX)
cleanup() {
  "$CTL" cluster down --dir "$DIR" >/dev/null 2>&1 || true
  rm -rf "$DIR"
}
trap cleanup EXIT INT TERM
fail() { echo "FAIL: $*"; tail -n 15 "$DIR"/*.log 2>/dev/null || true; exit 1; }
# expect STATUS CMD...: run CMD, check its exit status
expect() {
  local want=$1; shift
  set +e; "$@"; local rc=$?; set -e
  [ "$rc" = "$want" ] || fail "exit $rc, want $want: $*"
}

"$CTL" cluster up --dir "$DIR" --masters 3 --segments 2 --segment-size 128M >"$DIR/up.log" 2>&1 || {
  cat "$DIR/up.log"; fail "cluster up"; }
C="--cluster $DIR/cluster.json"

echo "== inference_server"
timeout 60 "$EX" $C --replicas 2 --blocks 32 --layers 16 --piece-bytes 4096 || fail "inference_server"

# bad arguments: exit 2 and a line naming what was wrong
for bad in "--blocks 0" "--layers x" "--bogus 1"; do
  set +e; "$EX" $C $bad 2>"$DIR/bad.txt"; rc=$?; set -e
  flag=${bad%% *}
  [ "$rc" = 2 ] && grep -q -- "$flag" "$DIR/bad.txt" || fail "inference_server $bad: exit $rc, $(head -1 "$DIR/bad.txt")"
done

echo "== kvpoolctl data commands"
head -c 3000000 /dev/urandom >"$DIR/in.bin"
K="ex-$$-a"
expect 1 "$CTL" exists "$K" $C
expect 0 "$CTL" put "$K" "$DIR/in.bin" $C
expect 0 "$CTL" exists "$K" $C
expect 1 "$CTL" put "$K" "$DIR/in.bin" $C                      # exists: nothing written
[ "$("$CTL" size "$K" $C)" = 3000000 ] || fail "size"
"$CTL" get "$K" $C >"$DIR/out1.bin" || fail "get to stdout"
cmp "$DIR/in.bin" "$DIR/out1.bin" || fail "get to stdout: bytes differ"
expect 0 "$CTL" get "$K" -o "$DIR/out2.bin" $C
cmp "$DIR/in.bin" "$DIR/out2.bin" || fail "get -o: bytes differ"
expect 0 "$CTL" get "$K" "$DIR/out3.bin" $C
cmp "$DIR/in.bin" "$DIR/out3.bin" || fail "get FILE: bytes differ"
printf 'hello kvpool\n' | "$CTL" put "ex-$$-b" - $C >/dev/null || fail "put -"
[ "$("$CTL" get "ex-$$-b" $C)" = "hello kvpool" ] || fail "get of stdin put"
J=$("$CTL" size "ex-$$-b" $C --json)
[ "$J" = "{\"command\":\"size\",\"key\":\"ex-$$-b\",\"size\":13}" ] || fail "--json: $J"
expect 1 "$CTL" rm "$K" $C                                    # just read: under a read lease
expect 0 "$CTL" rm "$K" --force $C
expect 1 "$CTL" exists "$K" $C
expect 1 "$CTL" get "$K" $C
expect 1 "$CTL" rm "$K" $C
MS=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["master_server_address"])' "$DIR/cluster.json")
# masters from the environment: the keys too (docs/security.md; the cluster file would name them)
KEY=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["auth"]["client_key"])' "$DIR/cluster.json")
MKEYS=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["auth"]["master_keys"])' "$DIR/cluster.json")
KVPOOL_MASTER_SERVER_ADDRESS="$MS" KVPOOL_AUTH_KEY="$KEY" KVPOOL_AUTH_MASTER_KEYS="$MKEYS" \
  "$CTL" exists "ex-$$-b" >/dev/null || fail "env masters"
# no keys at all: refused at open with a line naming what is missing (exit 2)
expect 2 env KVPOOL_MASTER_SERVER_ADDRESS="$MS" "$CTL" exists "ex-$$-b"
expect 2 "$CTL" exists "ex-$$-b" --masters "not-a-master-list"
expect 2 "$CTL" exists "ex-$$-b" $C --replica-num 0
# no master answers: the operation failed (1); exists says 2 for any error; --json still prints
# the error object on stdout
NOMASTER="--masters 127.0.0.1:1 --timeout 300 --auth none"
expect 1 "$CTL" get "ex-$$-b" $NOMASTER
expect 1 "$CTL" rm "ex-$$-b" $NOMASTER
expect 2 "$CTL" exists "ex-$$-b" $NOMASTER
J=$("$CTL" get "ex-$$-b" $NOMASTER --json 2>/dev/null || true)
case "$J" in *'"name":"KVP_ERR_UNAVAILABLE"'*) ;; *) fail "--json without masters: '$J'" ;; esac
echo "PASS"
