#!/usr/bin/env python3
"""schedstat.py — time on CPU and time waiting for a CPU (run-queue wait) of processes, from
/proc/PID/task/TID/schedstat (fields 1 and 2, ns; Documentation/scheduler/sched-stats.rst).
On a shared machine a benchmark's threads can wait far longer for a CPU than they run (at load
20+ here, 4 MiB batch gets waited ~25 us runnable per us on CPU); that wait moves with the load,
not with the code, so scripts/bench.sh (KVP_BENCH_COUNTS=1) records it beside its figures.

  schedstat.py snap PIDS OUT.json          every thread of PIDS (comma-separated) now:
                                           {"tid": [cpu_ns, wait_ns]}
  schedstat.py follow PARENT OUT.json      the children of PARENT (e.g. `perf stat -- CMD`'s
                                           CMD) sampled every 50 ms until PARENT exits; the last
                                           sample of each thread (threads that exit lose at most
                                           their last 50 ms)
"""
import json
import os
import sys
import time


def threads(pid):
    out = {}
    try:
        tids = os.listdir("/proc/%d/task" % pid)
    except OSError:
        return out
    for t in tids:
        try:
            with open("/proc/%d/task/%s/schedstat" % (pid, t)) as f:
                a = f.read().split()
            out[t] = [int(a[0]), int(a[1])]
        except (OSError, ValueError, IndexError):
            pass
    return out


def children(pid):
    kids = []
    try:
        for t in os.listdir("/proc/%d/task" % pid):
            with open("/proc/%d/task/%s/children" % (pid, t)) as f:
                kids += [int(x) for x in f.read().split()]
    except (OSError, ValueError):
        pass
    return kids


def main():
    if len(sys.argv) != 4 or sys.argv[1] not in ("snap", "follow"):
        sys.stderr.write(__doc__)
        return 2
    out = {}
    if sys.argv[1] == "snap":
        for p in sys.argv[2].split(","):
            if p.strip():
                out.update(threads(int(p)))
    else:
        parent = int(sys.argv[2])
        while os.path.exists("/proc/%d" % parent):
            for c in children(parent):
                out.update(threads(c))
            time.sleep(0.05)
    with open(sys.argv[3], "w") as f:
        json.dump(out, f)
    return 0


if __name__ == "__main__":
    sys.exit(main())
