#!/usr/bin/env python3
"""The Python side of the binding's benchmark: the same work as `kvpool-bench put|get|exists`
(tools/bench/bench_kv.c) through kvpool.MooncakeDistributedStore, T threads on one store object.

  put:    batch_put_from_multi_buffers of B keys, each value P pieces of value_size/P bytes
  get:    keys stored first (untimed), then batch_get_into_multi_buffers of B keys (timed)
  exists: keys stored first (untimed), then batch_is_exist of B keys (timed)

Prints one JSON object: ops_per_second (keys/s over the timed phase), seconds, ops_ok, errors.
scripts/bench_python.sh runs it next to kvpool-bench against one cluster and prints ratios.
"""
import argparse
import ctypes
import json
import sys
import threading
import time

import kvpool


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("mode", choices=["put", "get", "exists"])
    ap.add_argument("--masters", required=True)
    ap.add_argument("--value-size", type=int, required=True)
    ap.add_argument("--pieces", type=int, default=1)
    ap.add_argument("--count", type=int, required=True)
    ap.add_argument("--batch", type=int, required=True)
    ap.add_argument("--threads", type=int, default=1)
    o = ap.parse_args()
    s = kvpool.MooncakeDistributedStore()
    rc = s.setup("127.0.0.1", "", 0, 0, "tcp", "", o.masters)
    if rc != 0:
        print("setup: %d" % rc, file=sys.stderr)
        return 1
    run = "kvpy-%08x" % (int(time.time() * 1e6) & 0xFFFFFFFF)
    per = (o.count + o.threads - 1) // o.threads
    piece = o.value_size // o.pieces
    sizes_one = [piece] * (o.pieces - 1) + [o.value_size - piece * (o.pieces - 1)]
    bufs, ptrs, sizes = [], [], []
    for t in range(o.threads):
        b = ctypes.create_string_buffer(o.batch * o.value_size)
        p = ctypes.addressof(b)
        assert s.register_buffer(p, o.batch * o.value_size) == 0
        bufs.append(b)
        ptrs.append([[p + j * o.value_size + k * piece for k in range(o.pieces)] for j in range(o.batch)])
        sizes.append([list(sizes_one) for _ in range(o.batch)])
    counts = [0] * o.threads
    errors = {}
    lock = threading.Lock()

    def work(t, phase):
        first = t * per
        n = max(0, min(per, o.count - first))
        ok = 0
        errs = {}
        for i in range(0, n, o.batch):
            nb = min(o.batch, n - i)
            keys = ["%s-%d" % (run, first + i + j) for j in range(nb)]
            if phase == "put":
                r = s.batch_put_from_multi_buffers(keys, ptrs[t][:nb], sizes[t][:nb], None)
                good = [x == 0 for x in r]
            elif phase == "get":
                r = s.batch_get_into_multi_buffers(keys, ptrs[t][:nb], sizes[t][:nb])
                good = [x == o.value_size for x in r]
            else:
                r = s.batch_is_exist(keys)
                good = [x == 1 for x in r]
            for g, x in zip(good, r):
                if g:
                    ok += 1
                else:
                    errs[x] = errs.get(x, 0) + 1
        with lock:
            counts[t] = ok
            for k, v in errs.items():
                errors[k] = errors.get(k, 0) + v

    def phase(name):
        ts = [threading.Thread(target=work, args=(t, name)) for t in range(o.threads)]
        t0 = time.perf_counter()
        for th in ts:
            th.start()
        for th in ts:
            th.join()
        return time.perf_counter() - t0

    if o.mode != "put":
        phase("put")  # populate, untimed (opens the data connections too)
    else:  # one untimed call per thread on other keys, as kvpool-bench's --warmup 1
        wb = o.batch
        for t in range(o.threads):
            keys = ["%s-w%d-%d" % (run, t, j) for j in range(wb)]
            s.batch_put_from_multi_buffers(keys, ptrs[t][:wb], sizes[t][:wb], None)
    errors.clear()
    secs = phase(o.mode)
    ops = sum(counts)
    print(json.dumps({"impl": "python", "mode": o.mode, "value_size": o.value_size, "pieces": o.pieces,
                      "batch": o.batch, "threads": o.threads, "count": o.count, "seconds": secs,
                      "ops_ok": ops, "ops_per_second": ops / secs if secs > 0 else 0,
                      "errors": {kvpool.errname(k): v for k, v in errors.items()}}))
    s.remove_all(True)
    for b in bufs:
        s.unregister_buffer(ctypes.addressof(b))
    s.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
