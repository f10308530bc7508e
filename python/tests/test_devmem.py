"""GPU device pointers through the binding (issue 17), vLLM-style: register the whole device
allocation once, then batch_put_from_multi_buffers / batch_get_into_multi_buffers with device
ints. The CUDA driver is the test double tests/lib/fakecuda/ (build/tests/fakecuda/libcuda.so.1),
loaded through KVPOOL_LIBCUDA; its device memory is mapped PROT_NONE, so any CPU access by
kvpool kills the child. Each case runs in a child process (the driver is loaded once per
process)."""
import os
import subprocess
import sys

from conftest import BUILD

FAKE = os.path.join(BUILD, "tests", "fakecuda", "libcuda.so.1")

PRELUDE = r"""
import ctypes, os, sys
sys.path.insert(0, os.path.join(os.environ["KVP_BUILD_DIR"], "python"))
import kvpool
cu = ctypes.CDLL(os.environ["KVPOOL_LIBCUDA"]) if os.path.exists(os.environ.get("KVPOOL_LIBCUDA", "")) else None
out = []

def dev_alloc(n, dev=0):
    ctx, old, p = ctypes.c_void_p(), ctypes.c_void_p(), ctypes.c_ulonglong()
    assert cu.cuInit(0) == 0
    assert cu.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), dev) == 0
    assert cu.cuCtxPushCurrent_v2(ctx) == 0
    assert cu.cuMemAlloc_v2(ctypes.byref(p), ctypes.c_size_t(n)) == 0
    cu.cuCtxPopCurrent_v2(ctypes.byref(old))
    return p.value

cu and setattr(cu.fakecuda_shadow, "restype", ctypes.c_void_p)
def shadow(p):  # the double's read-write alias of device memory (the test's eyes only)
    return cu.fakecuda_shadow(ctypes.c_ulonglong(p))

def pattern(tag, n):
    b = (tag.encode() * (n // len(tag) + 1))[:n]
    return bytes((x + i) & 255 for i, x in enumerate(b[:256])) + b[256:]

s = kvpool.MooncakeDistributedStore()
assert s.setup("127.0.0.1", "", 0, 16 << 20, "tcp", "", os.environ["MASTERS"]) == 0
tag = os.environ["TAG"]
"""

VLLM = PRELUDE + r"""
# a KV cache of 2 layers x (K, V) blocks in one device allocation, as the caching allocator packs it
BLOCK, NBLK = 64 * 1024, 16
kv = dev_alloc(4 * BLOCK * NBLK)
out.append(s.register_buffer(kv, 4 * BLOCK * NBLK))
st = s.device_stats()
out.append((st["driver_loaded"], st["registered_bytes"], st["bounce_bytes"] > 0))
def blk(layer, kind, b):
    return kv + ((layer * 2 + kind) * NBLK + b) * BLOCK
keys = [tag + "blk%d" % b for b in range(4)]
for b in range(4):
    for layer in range(2):
        for kind in range(2):
            ctypes.memmove(shadow(blk(layer, kind, b)), pattern("%s%d%d%d" % (tag, b, layer, kind), BLOCK), BLOCK)
ptrs = [[blk(l, k, b) for l in range(2) for k in range(2)] for b in range(4)]
sizes = [[BLOCK] * 4 for _ in range(4)]
out.append(s.batch_put_from_multi_buffers(keys, ptrs, sizes, None))
# read them into blocks 8..11
gptrs = [[blk(l, k, b + 8) for l in range(2) for k in range(2)] for b in range(4)]
out.append(s.batch_get_into_multi_buffers(keys, gptrs, sizes))
ok = all(ctypes.string_at(shadow(blk(l, k, b + 8)), BLOCK) == pattern("%s%d%d%d" % (tag, b, l, k), BLOCK)
         for b in range(4) for l in range(2) for k in range(2))
out.append(ok)
# flat calls with device ints, a host key in the same batch, unregistered device memory
host = ctypes.create_string_buffer(b"h" * 4096, 4096)
loose = dev_alloc(1 << 20)
ctypes.memmove(shadow(loose), b"L" * 5000, 5000)
out.append(s.batch_put_from([tag + "h", tag + "loose"], [ctypes.addressof(host), loose], [4096, 5000]))
out.append(s.get_into(tag + "h", blk(0, 0, 15), BLOCK))
out.append(ctypes.string_at(shadow(blk(0, 0, 15)), 4096) == b"h" * 4096)
out.append(s.batch_get_into([tag + "loose"], [loose + 8192], [8192]))
out.append(ctypes.string_at(shadow(loose + 8192), 5000) == b"L" * 5000)
out.append(s.put_from(tag + "pf", blk(1, 1, 3), BLOCK))
out.append(s.get_into_ranges([blk(1, 1, 14)], [[tag + "pf"]], [[100]], [[10]], [[1000]]))
out.append(ctypes.string_at(shadow(blk(1, 1, 14)) + 100, 1000) == pattern("%s%d%d%d" % (tag, 3, 1, 1), BLOCK)[10:1010])
st = s.device_stats()
out.append((st["copy_errors"], st["staged_batches"] >= 5, st["lanes_busy"]))
out.append(s.unregister_buffer(kv))
out.append(s.device_stats()["registered_bytes"])
s.close()
print("RESULT", out)
"""

ERRORS = PRELUDE + r"""
d = dev_alloc(1 << 20)
ctypes.memmove(shadow(d), b"D" * 30000, 30000)
host = ctypes.create_string_buffer(b"h" * 10000, 10000)
hp = ctypes.addressof(host)
cu.fakecuda_fail_copy(1, 1)
out.append(s.batch_put_from_multi_buffers([tag + "a", tag + "b", tag + "c"], [[d], [d + 10000], [d + 20000]],
                                          [[10000], [10000], [10000]], None))
out.append(s.is_exist(tag + "b"))
cu.fakecuda_poison(700)
out.append(s.batch_put_from([tag + "pd", tag + "ph"], [d, hp], [100, 100]))
out.append(s.batch_get_into_multi_buffers([tag + "a", tag + "ph"], [[d + 40000], [hp + 5000]], [[10000], [100]]))
out.append(ctypes.string_at(hp + 5000, 100) == b"h" * 100)
out.append(s.device_stats()["copy_errors"])
s.close()
print("RESULT", out)
"""

NODRIVER = PRELUDE + r"""
host = ctypes.create_string_buffer(8192)
hp = ctypes.addressof(host)
ctypes.memmove(hp, b"h" * 8192, 8192)
out.append(s.batch_put_from([tag + "h"], [hp], [100]))
out.append(s.batch_get_into_multi_buffers([tag + "h", tag + "h"], [[hp + 1000], [hp + 2000, hp + 3000]], [[100], [50, 50]]))
out.append(s.register_buffer(hp, 8192))
out.append(s.device_stats()["driver_loaded"])
out.append(kvpool._kvpool._device_pointer(hp))
s.close()
print("RESULT", out)
"""


def run_child(cluster, code, tag, libcuda):
    env = dict(os.environ, KVP_BUILD_DIR=BUILD, MASTERS=cluster.masters, TAG=tag)
    if libcuda is None:
        env.pop("KVPOOL_LIBCUDA", None)
    else:
        env["KVPOOL_LIBCUDA"] = libcuda
    p = subprocess.run([sys.executable, "-c", code], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                       timeout=120, universal_newlines=True)
    assert p.returncode == 0, p.stderr[-3000:]
    line = [x for x in p.stdout.splitlines() if x.startswith("RESULT ")]
    assert line, p.stdout + p.stderr[-3000:]
    return eval(line[0][7:]), p.stderr


def test_vllm_style_device_calls_end_to_end(cluster):
    assert os.path.exists(FAKE), "build the kvp_fakecuda target"
    res, log = run_child(cluster, VLLM, "dev-vllm-", FAKE)
    assert res == [
        0,                              # register_buffer of the whole device allocation
        (True, 4 * 64 * 1024 * 16, True),  # counted, bounce buffers pinned at registration
        [0, 0, 0, 0],                   # batch_put_from_multi_buffers from device ints
        [4 * 65536] * 4,                # batch_get_into_multi_buffers into device ints
        True,                           # the bytes, read back through the double
        [0, 0],                         # a host key and an unregistered device key
        4096, True,                     # get_into device memory
        [5000], True,
        0,                              # put_from device memory
        [[1000]], True,                 # get_into_ranges into device memory
        (0, True, 0),                   # no copy error; staged batches; no lane left busy
        0, 0,                           # unregistered: nothing counted
    ], log[-3000:]


def test_copy_error_and_poisoned_context(cluster):
    res, log = run_child(cluster, ERRORS, "dev-err-", FAKE)
    assert res == [
        [0, -1025, 0],     # the failed copy fails its key only (KVP_ERR_DEVICE: -1000 - 25)
        0,                 # and stores nothing under it
        [-1025, 0],        # poisoned context: the device key fails, the host key is stored
        [-1025, 100],      # and read, while the device read fails
        True,
        1,                 # the failed copy counted (the poisoned keys failed at the pointer query)
    ], log[-3000:]
    assert "KVP_ERR_DEVICE" in log and "CUDA_ERROR_ILLEGAL_ADDRESS" in log


def test_without_a_driver_every_pointer_is_host_memory(cluster):
    expect = [[0], [100, 100], 0, False, 0]
    res, log = run_child(cluster, NODRIVER, "dev-none-", None)
    assert res == expect
    res, log = run_child(cluster, NODRIVER, "dev-missing-", "/nonexistent/libcuda.so.1")
    assert res == expect
