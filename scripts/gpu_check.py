"""The checks of scripts/gpu-check.sh (docs/gpu.md). Usage: gpu_check.py BUILD_DIR."""
import ctypes
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

BUILD = os.path.abspath(sys.argv[1] if len(sys.argv) > 1 else "build")
LIB = os.environ.get("KVPOOL_LIBCUDA") or "libcuda.so.1"


def no_gpu(why):
    print("gpu-check: no NVIDIA GPU usable here (%s): nothing to check" % why)
    sys.exit(0)


try:
    cu = ctypes.CDLL(LIB)
except OSError:
    no_gpu("%s does not load" % LIB)
if cu.cuInit(0) != 0:
    no_gpu("cuInit failed")
n_dev = ctypes.c_int(0)
if cu.cuDeviceGetCount(ctypes.byref(n_dev)) != 0 or n_dev.value == 0:
    no_gpu("no device")

sys.path.insert(0, os.path.join(BUILD, "python"))
import kvpool  # noqa: E402

FAIL = []
MIB = 1 << 20


def check(cond, what):
    print("  %-60s %s" % (what, "ok" if cond else "FAILED"))
    if not cond:
        FAIL.append(what)


def ok(r, what):
    if r != 0:
        raise RuntimeError("%s: CUDA error %d" % (what, r))


ctx = ctypes.c_void_p()
dev = ctypes.c_int()
ok(cu.cuDeviceGet(ctypes.byref(dev), 0), "cuDeviceGet")
ok(cu.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), dev), "cuDevicePrimaryCtxRetain")
ok(cu.cuCtxPushCurrent_v2(ctx), "cuCtxPushCurrent")
name = ctypes.create_string_buffer(256)
if hasattr(cu, "cuDeviceGetName"):
    cu.cuDeviceGetName(name, 256, dev)
print("gpu-check: device 0 %s, driver %s" % (name.value.decode(errors="replace") or "?", LIB))


def dalloc(n):
    p = ctypes.c_ulonglong()
    ok(cu.cuMemAlloc_v2(ctypes.byref(p), ctypes.c_size_t(n)), "cuMemAlloc")
    return p.value


def h2d(d, host, n):
    ok(cu.cuMemcpyHtoD_v2(ctypes.c_ulonglong(d), host, ctypes.c_size_t(n)), "cuMemcpyHtoD")


def d2h(host, d, n):
    ok(cu.cuMemcpyDtoH_v2(host, ctypes.c_ulonglong(d), ctypes.c_size_t(n)), "cuMemcpyDtoH")


CAP = 64 * MIB
src, dst = dalloc(CAP), dalloc(CAP)
pinned = ctypes.c_void_p()
ok(cu.cuMemHostAlloc(ctypes.byref(pinned), ctypes.c_size_t(CAP), 0), "cuMemHostAlloc")
host = ctypes.create_string_buffer(CAP)
back = ctypes.create_string_buffer(CAP)
ctypes.memmove(host, os.urandom(CAP), CAP)

# baseline: plain device<->host copies of 64 MiB (pinned host memory), best of 3
def best(fn, reps=3):
    t = 1e9
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        t = min(t, time.perf_counter() - t0)
    return t


t_d2h = best(lambda: d2h(pinned, src, CAP))
t_h2d = best(lambda: h2d(dst, pinned, CAP))
print("baseline 64 MiB copies: D2H %.2f GB/s, H2D %.2f GB/s" % (CAP / t_d2h / 1e9, CAP / t_h2d / 1e9))

# a local cluster
cdir = tempfile.mkdtemp(prefix="kvp-gpu-check-")
ctl = os.path.join(BUILD, "tools", "kvpoolctl")
with open(os.path.join(cdir, "cfg.json"), "w") as f:
    json.dump({"default_kv_lease_ttl": 1000, "fence_grace_ms": 200}, f)
subprocess.run([ctl, "cluster", "up", "--dir", cdir, "--masters", "1", "--segments", "1", "--segment-size", "2G",
                "--config", os.path.join(cdir, "cfg.json")], check=True, timeout=120, stdout=subprocess.DEVNULL)
try:
    masters = json.load(open(os.path.join(cdir, "cluster.json")))["master_server_address"]
    s = kvpool.MooncakeDistributedStore()
    assert s.setup("127.0.0.1", "", 0, 16 * MIB, "tcp", "", masters) == 0
    check(s.device_stats()["driver_loaded"], "the client loaded the CUDA driver")
    check(kvpool._kvpool._device_pointer(src) == 1, "device memory detected")
    check(s.register_buffer(src, CAP) == 0 and s.register_buffer(dst, CAP) == 0, "register_buffer(device)")
    h2d(src, host, CAP)
    hp = ctypes.addressof(host)
    hb = ctypes.addressof(back)
    print("%10s %12s %12s %14s %14s" % ("size", "put GB/s", "get GB/s", "host put GB/s", "host get GB/s"))
    size = 4096
    while size <= CAP:
        reps = 5 if size <= 4 * MIB else 3
        tp = tg = 1e9
        good = True
        for r in range(reps):
            key = "gpu-check-%d-%d" % (size, r)
            t0 = time.perf_counter()
            rc = s.put_from(key, src, size)
            tp = min(tp, time.perf_counter() - t0)
            t0 = time.perf_counter()
            rg = s.get_into(key, dst, size)
            tg = min(tg, time.perf_counter() - t0)
            d2h(back, dst, size)
            good = good and rc == 0 and rg == size and back.raw[:size] == host.raw[:size]
            s.remove(key, True)
        hpt = hgt = 1e9
        for r in range(reps):  # the same calls from host memory, for comparison
            key = "gpu-check-h-%d-%d" % (size, r)
            t0 = time.perf_counter()
            s.put_from(key, hp, size)
            hpt = min(hpt, time.perf_counter() - t0)
            t0 = time.perf_counter()
            s.get_into(key, hb, size)
            hgt = min(hgt, time.perf_counter() - t0)
            s.remove(key, True)
        print("%10d %12.2f %12.2f %14.2f %14.2f" % (size, size / tp / 1e9, size / tg / 1e9, size / hpt / 1e9,
                                                    size / hgt / 1e9))
        check(good, "put/get %d bytes from/into device memory: bytes" % size)
        size *= 4 if size < CAP else 2
    # scatter-gather, vLLM-style: 4 device pieces per key
    B = 256 * 1024
    keys = ["gpu-check-sg-%d" % i for i in range(8)]
    ptrs = [[src + (i * 4 + j) * B for j in range(4)] for i in range(8)]
    gptrs = [[dst + (i * 4 + (3 - j)) * B for j in range(4)] for i in range(8)]
    sizes = [[B] * 4 for _ in range(8)]
    r1 = s.batch_put_from_multi_buffers(keys, ptrs, sizes, None)
    r2 = s.batch_get_into_multi_buffers(keys, gptrs, sizes)
    d2h(back, dst, 32 * B)
    same = all(back.raw[(i * 4 + 3 - j) * B:(i * 4 + 4 - j) * B] == host.raw[(i * 4 + j) * B:(i * 4 + j + 1) * B]
               for i in range(8) for j in range(4))
    check(r1 == [0] * 8 and r2 == [4 * B] * 8 and same, "scatter-gather put/get of device pieces")
    s.remove_all(True)
    # timed-out gets: the device buffer must not change after the call returned
    s.put_from("gpu-check-big", src, CAP)
    timed_out = 0
    clean = True
    timeouts = ("1ms", "2ms", "5ms", "10ms", "20ms", "50ms", "100ms", "200ms")
    for t in timeouts:
        st = kvpool.MooncakeDistributedStore()
        if st.setup({"local_hostname": "127.0.0.1", "master_server_address": masters, "global_segment_size": 0,
                     "local_buffer_size": 16 * MIB, "protocol": "tcp", "transfer_timeout": t}) != 0:
            continue
        ok(cu.cuMemsetD8_v2(ctypes.c_ulonglong(dst), 0xEE, ctypes.c_size_t(CAP)), "cuMemsetD8")
        r = st.get_into("gpu-check-big", dst, CAP)
        d2h(back, dst, CAP)
        first = back.raw
        time.sleep(0.3)
        d2h(back, dst, CAP)
        clean = clean and back.raw == first
        if r < 0:
            timed_out += 1
        st.close()
    check(clean, "timed-out gets: no device write after return (%d of %d timed out)" % (timed_out, len(timeouts)))
    stats = s.device_stats()
    print("device stats: %s" % stats)
    check(stats["copy_errors"] == 0, "no copy errors")
    s.close()
finally:
    subprocess.run([ctl, "cluster", "down", "--dir", cdir], timeout=120, stdout=subprocess.DEVNULL)
    shutil.rmtree(cdir, ignore_errors=True)
print("gpu-check: %s" % ("all checks passed" if not FAIL else "FAILED: " + "; ".join(FAIL)))
sys.exit(1 if FAIL else 0)
