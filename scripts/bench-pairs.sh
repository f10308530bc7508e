#!/usr/bin/env bash
# scripts/bench-pairs.sh BASE_BUILD NEW_BUILD — scripts/bench.sh on two builds in alternating
# pairs on one machine, then per figure the median of the pair ratios (new / base), how many
# pairs the new build won, the spread, and the load average; plus counts per operation that do
# not move with the load the way ops/s does: context switches, system calls, wake-ups and CPU µs,
# summed over the bench client and every master and segment process (perf stat,
# KVP_BENCH_COUNTS=1 of scripts/bench.sh). A ratio whose pairs spread from 0.5 to 2 says little;
# equal counts per op with a lost median point at waiting (or the machine), more counts at work.
#
#  - KVP_PAIRS (5): pairs. Pair i runs base first when i is odd, new first when even.
#  - KVP_PAIRS_DIR (./bench-pairs-<pid>): one bench.sh data dir per run (pI-base, pI-new) and
#    summary.txt. KVP_PAIRS_SUMMARY_ONLY=1 re-prints the summary of an existing KVP_PAIRS_DIR.
#  - KVP_PAIRS_COUNTS (1): 0 runs bench.sh without perf.
#  - KVP_BENCH_UP_ARGS is given to a build's `kvpoolctl cluster up` only when that build knows
#    the option (a build from before authentication has no --auth: it runs without it).
#  - Every other KVP_BENCH_* setting goes to bench.sh as is (e.g. KVP_BENCH_KILLS=1,
#    KVP_BENCH_META=0). The bench.sh of this tree (a copy, in KVP_PAIRS_DIR/scripts) runs for
#    both builds, its cluster data dirs are KVP_PAIRS_DIR/pI-SIDE.
set -euo pipefail
cd "$(dirname "$0")/.."
if [ $# -ne 2 ]; then
  echo "usage: scripts/bench-pairs.sh BASE_BUILD_DIR NEW_BUILD_DIR" >&2
  exit 2
fi
BASE=$(cd "$1" && pwd)
NEW=$(cd "$2" && pwd)
N=${KVP_PAIRS:-5}
DIR=${KVP_PAIRS_DIR:-$(pwd)/bench-pairs-$$}
mkdir -p "$DIR"

# KVP_BENCH_UP_ARGS less the options this build's kvpoolctl does not know (its option parser
# names each one it knows, so the name is in the binary), each with its value.
up_args_for() {
  local b=$1 out=() drop=0 opt
  for opt in ${KVP_BENCH_UP_ARGS:-}; do
    if [ "${opt#--}" != "$opt" ]; then
      drop=0
      if ! grep -aq -- "$opt" "$b/tools/kvpoolctl"; then
        echo "note: $b/tools/kvpoolctl has no $opt: that build runs without it" >&2
        drop=1
      fi
    fi
    [ "$drop" = 1 ] || out+=("$opt")
  done
  echo "${out[*]:-}"
}

run_one() { # run_one BUILD TAG
  local b=$1 tag=$2
  local d="$DIR/$tag"
  rm -rf "$d"; mkdir -p "$d"
  echo "$(cut -d' ' -f1 /proc/loadavg)" >"$d/load_before"
  echo "== $(date -u +%H:%M:%S) $tag ($b), load $(cut -d' ' -f1-3 /proc/loadavg)"
  if KVP_BUILD_DIR="$b" KVP_BENCH_DIR="$d" KVP_BENCH_UP_ARGS="$(up_args_for "$b")" \
     KVP_BENCH_COUNTS="${KVP_PAIRS_COUNTS:-1}" "$DIR/scripts/bench.sh" >"$d/bench.log" 2>&1; then
    echo ok >"$d/status"
  else
    echo "failed (rc $?): see $d/bench.log" | tee "$d/status"
  fi
  echo "$(cut -d' ' -f1 /proc/loadavg)" >"$d/load_after"
}

if [ "${KVP_PAIRS_SUMMARY_ONLY:-0}" != 1 ]; then
  # The runs use a copy of the scripts: bash reads a script while it runs it, so editing
  # scripts/bench.sh during a series would break the run in progress.
  mkdir -p "$DIR/scripts"
  cp scripts/bench.sh scripts/bench-auth.sh scripts/schedstat.py "$DIR/scripts/"
  for i in $(seq 1 "$N"); do
    if [ $((i % 2)) = 1 ]; then run_one "$BASE" "p$i-base"; run_one "$NEW" "p$i-new"
    else run_one "$NEW" "p$i-new"; run_one "$BASE" "p$i-base"; fi
  done
fi

python3 - "$DIR" "$BASE" "$NEW" <<'PY' | tee "$DIR/summary.txt"
import json, os, re, statistics, sys
d, base, new = sys.argv[1:4]

def load_json(p):
    try:
        return json.load(open(p))
    except (OSError, ValueError):
        return None

def meta_rows(p):
    """callers -> (put pairs/s, {process kind: CPU us per pair}) from bench meta's text (meta.txt)."""
    rows, cur = {}, None
    try:
        for line in open(p):
            m = re.match(r"^(\d+)\s+(\d+)\s+\d+\s+\d+\s+\d+", line)
            if m:
                cur = int(m.group(1))
                rows[cur] = (float(m.group(2)), {})
            m = re.match(r"^\s+CPU us per put pair: (.*)$", line)
            if m and cur in rows:
                w = m.group(1).split()
                rows[cur][1].update({w[i]: float(w[i + 1]) for i in range(0, len(w) - 1, 2)})
    except OSError:
        pass
    return rows

def perf(p):
    """perf stat -x, file -> {event: value}; None when missing or not counted."""
    tot = {}
    try:
        for line in open(p):
            parts = line.strip().split(",")
            if len(parts) < 3 or line.startswith("#"):
                continue
            try:
                tot[parts[2]] = float(parts[0])
            except ValueError:
                return None
    except OSError:
        return None
    return tot

KV = [("4 MiB put b1", "put4m", "bytes_per_second"), ("4 MiB get b1", "get4m", "bytes_per_second"),
      ("4 MiB put 8x4", "put4m_batch", "bytes_per_second"), ("4 MiB get 8x4", "get4m_batch", "bytes_per_second"),
      ("4 KiB batch_get(32)x4", "get4k", "ops_per_second"), ("4 KiB batch_put(32)x4", "put4k", "ops_per_second"),
      ("16 MiB put b1", "put16m", "bytes_per_second"), ("64 MiB put b1", "put64m", "bytes_per_second")]
META = [("meta pairs/s %d callers" % c, c) for c in (1, 16, 64)]

def figures(run):
    """figure -> (value, ops counted, counts {client:{}, servers:{}}) for one bench.sh run dir."""
    out = {}
    res = os.path.join(run, "results")
    for label, name, key in KV:
        j = load_json(os.path.join(res, name + ".json"))
        if j:
            cnt = {w: perf(os.path.join(res, "cnt_%s_%s.txt" % (name, w))) for w in ("client", "servers")}
            out[label] = (j[key], j.get("ops_ok", 0), cnt, j.get("cpu_us_per_op") or {}, sched(res, name))
    rows = meta_rows(os.path.join(res, "meta.txt"))
    for label, c in META:
        if c in rows:
            cnt, ops = None, 0
            j = load_json(os.path.join(res, "meta_c%d.json" % c))
            if j:
                lv = j["levels"][0] if isinstance(j, dict) and "levels" in j else (j[0] if isinstance(j, list) else None)
                if lv:
                    ops = lv.get("put_pairs_per_second", 0) * 3.0  # its --seconds 3 run
                    cnt = {w: perf(os.path.join(res, "cnt_meta_c%d_%s.txt" % (c, w))) for w in ("client", "servers")}
            out[label] = (rows[c][0], ops, cnt, rows[c][1], sched(res, "meta_c%d" % c))
    return out

def sched(res, name):
    """(client cpu, client wait, servers cpu, servers wait) in ns over a counted run, or None."""
    c = load_json(os.path.join(res, "sched_%s_client.json" % name))
    s0 = load_json(os.path.join(res, "sched_%s_servers0.json" % name))
    s1 = load_json(os.path.join(res, "sched_%s_servers1.json" % name))
    if c is None or s0 is None or s1 is None:
        return None
    scpu = sum(v[0] - s0.get(t, [0, 0])[0] for t, v in s1.items())
    swait = sum(v[1] - s0.get(t, [0, 0])[1] for t, v in s1.items())
    return (sum(v[0] for v in c.values()), sum(v[1] for v in c.values()), scpu, swait)

def num(f):
    try:
        return float(open(f).read())
    except (OSError, ValueError):
        return float("nan")

pairs = sorted({int(m.group(1)) for n in os.listdir(d) for m in [re.match(r"p(\d+)-(base|new)$", n)] if m})
runs = {}
loads = []
for i in pairs:
    for side in ("base", "new"):
        r = os.path.join(d, "p%d-%s" % (i, side))
        runs[(i, side)] = figures(r)
        loads += [num(os.path.join(r, "load_before")), num(os.path.join(r, "load_after"))]
loads = [x for x in loads if x == x]
print("bench-pairs: base %s, new %s; %d pairs; load average (1 min) over the runs %.1f-%.1f (median %.1f)"
      % (base, new, len(pairs), min(loads or [0]), max(loads or [0]), statistics.median(loads or [0])))
print()
print("%-24s %7s %6s %5s  %-s" % ("figure", "median", "won", "pairs", "ratios new/base in pair order"))
for label in [k[0] for k in KV] + [k[0] for k in META]:
    rs = []
    for i in pairs:
        b, n = runs[(i, "base")].get(label), runs[(i, "new")].get(label)
        if b and n and b[0] > 0:
            rs.append(n[0] / b[0])
    if not rs:
        print("%-24s %7s" % (label, "-"))
        continue
    print("%-24s %7.2f %3d/%-2d %5d  %s" % (label, statistics.median(rs), sum(r >= 1 for r in rs), len(rs), len(rs),
                                          " ".join("%.2f" % r for r in rs)))

print()
print("counts per operation (op = a key, or a put pair for meta), median over runs, client + servers:")
print("%-24s %-5s %10s %10s %10s %10s %10s" % ("figure", "build", "ctx sw", "syscalls", "wakeups", "CPU us", "cli CPU us"))
EV = [("context-switches", 1), ("raw_syscalls:sys_enter", 1), ("sched:sched_wakeup", 1), ("task-clock", 1e3)]
for label in [k[0] for k in KV] + [k[0] for k in META]:
    for side in ("base", "new"):
        per = {e: [] for e, _ in EV}
        cli = []
        for i in pairs:
            f = runs[(i, side)].get(label)
            if not f or not f[1] or not f[2] or not f[2]["client"] or not f[2]["servers"]:
                continue
            c, s = f[2]["client"], f[2]["servers"]
            for e, scale in EV:
                per[e].append((c.get(e, 0) + s.get(e, 0)) * scale / f[1])
            cli.append(c.get("task-clock", 0) * 1e3 / f[1])
        if not cli:
            continue
        print("%-24s %-5s %10.2f %10.2f %10.2f %10.1f %10.1f" % (label, side, *(statistics.median(per[e]) for e, _ in EV),
                                                                statistics.median(cli)))

print()
print("CPU us per operation in the timed phase only (the bench's own figure, from /proc schedstat), median")
print("over runs. Under contention the busiest process's CPU per op, not ops/s, is what a change moves:")
print("%-24s %-5s %10s %10s %10s" % ("figure", "build", "bench", "masters", "segments"))
for label in [k[0] for k in KV] + [k[0] for k in META]:
    for side in ("base", "new"):
        v = {w: [] for w in ("bench", "masters", "segments")}
        for i in pairs:
            f = runs[(i, side)].get(label)
            if f and f[3]:
                for w in v:
                    if w in f[3]:
                        v[w].append(f[3][w])
        if any(v.values()):
            print("%-24s %-5s %s" % (label, side, " ".join("%10.1f" % statistics.median(x) if x else "%10s" % "-"
                                                            for x in v.values())))

print()
print("time on CPU and time waiting for a CPU (run-queue wait) per operation, us, median over runs")
print("(/proc schedstat of every thread; the wait is the load's share of the wall time, not the code's):")
print("%-24s %-5s %10s %10s %10s %10s" % ("figure", "build", "cli CPU", "cli wait", "srv CPU", "srv wait"))
for label in [k[0] for k in KV] + [k[0] for k in META]:
    for side in ("base", "new"):
        v = [[], [], [], []]
        for i in pairs:
            f = runs[(i, side)].get(label)
            if f and f[1] and f[4]:
                for k in range(4):
                    v[k].append(f[4][k] / 1e3 / f[1])
        if v[0]:
            print("%-24s %-5s %s" % (label, side, " ".join("%10.1f" % statistics.median(x) for x in v)))
PY
