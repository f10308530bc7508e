"""Device pointers: a call given GPU memory fails that key with -600 and a log line, never a
crash. The CUDA driver is the test double python/tests/fake_cuda.c (built as
build/python/fakecuda/libcuda.so.1), loaded through KVPOOL_LIBCUDA, which reports the address
range in FAKE_CUDA_DEVICE_RANGE as device memory. Each case runs in a child process, because
the driver is loaded once per process."""
import os
import subprocess
import sys

import pytest

from conftest import BUILD, HERE

FAKE = os.path.join(BUILD, "python", "fakecuda", "libcuda.so.1")

CHILD = r"""
import ctypes, os, sys
sys.path.insert(0, os.path.join(os.environ["KVP_BUILD_DIR"], "python"))
import kvpool
s = kvpool.MooncakeDistributedStore()
assert s.setup("127.0.0.1", "", 0, 16 << 20, "tcp", "", os.environ["MASTERS"]) == 0
host = ctypes.create_string_buffer(8192)
dev = ctypes.create_string_buffer(8192)      # "device" memory, per the fake driver
hp, dp = ctypes.addressof(host), ctypes.addressof(dev)
ctypes.memmove(hp, b"h" * 8192, 8192)
os.environ["FAKE_CUDA_DEVICE_RANGE"] = "%d:%d" % (dp, 8192)
tag = os.environ["TAG"]
out = []
out.append(s.batch_put_from([tag + "h", tag + "d"], [hp, dp], [100, 100]))
out.append(s.put_from(tag + "d2", dp + 10, 10))
out.append(s.is_exist(tag + "d"))
out.append(s.get_into(tag + "h", dp, 100))
out.append(s.batch_get_into_multi_buffers([tag + "h", tag + "h"], [[hp + 1000], [hp + 2000, dp]], [[100], [50, 50]]))
out.append(s.batch_put_from_multi_buffers([tag + "m"], [[hp, dp + 4096]], [[10, 10]], None))
out.append(s.register_buffer(dp, 8192))
out.append(ctypes.string_at(hp + 1000, 100) == b"h" * 100)
s.close()
print("RESULT", out)
"""


def run_child(cluster, tag, libcuda):
    env = dict(os.environ, KVP_BUILD_DIR=BUILD, MASTERS=cluster.masters, TAG=tag)
    if libcuda is None:
        env.pop("KVPOOL_LIBCUDA", None)
    else:
        env["KVPOOL_LIBCUDA"] = libcuda
    p = subprocess.run([sys.executable, "-c", CHILD], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                       timeout=120, universal_newlines=True)
    assert p.returncode == 0, p.stderr[-3000:]
    line = [x for x in p.stdout.splitlines() if x.startswith("RESULT ")]
    assert line, p.stdout + p.stderr[-3000:]
    return eval(line[0][7:]), p.stderr


def test_device_pointers_fail_their_key_with_600(cluster):
    assert os.path.exists(FAKE), "build the kvpool_fake_cuda target"
    res, log = run_child(cluster, "dev-fake-", FAKE)
    assert res == [
        [0, -600],      # the host key is stored, the device key refused
        -600,           # put_from of device memory
        0,              # nothing was stored under the refused key
        -600,           # get_into device memory
        [100, -600],    # one device piece fails that key only
        [-600],
        0,              # registering device memory is allowed (vLLM registers GPU buffers)
        True,
    ]
    assert "GPU device memory" in log


def test_without_a_driver_every_pointer_is_host_memory(cluster):
    res, log = run_child(cluster, "dev-none-", None)
    assert res == [[0, 0], 0, 1, 100, [100, 100], [0], 0, True]
    res, log = run_child(cluster, "dev-missing-", "/nonexistent/libcuda.so.1")
    assert res[0] == [0, 0]
