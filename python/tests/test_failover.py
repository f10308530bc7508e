"""A 3-master cluster whose Raft leader is SIGKILLed during a batch loop on one store: the loop
sees only return codes (never an exception, never wrong bytes), calls succeed again after the
failover, and afterwards every acknowledged key reads back exactly."""
import ctypes
import os
import signal

import pytest

from conftest import Cluster, make_store

NK, PIECES, PIECE = 8, 4, 4096


@pytest.fixture(scope="module")
def cluster3():
    c = Cluster(masters=3, segments=2)
    yield c
    c.down()


def test_leader_sigkill_during_batch_loop(cluster3):
    s = make_store(cluster3)
    obj = PIECES * PIECE
    src = ctypes.create_string_buffer(NK * obj)
    dst = ctypes.create_string_buffer(NK * obj)
    sp, dp = ctypes.addressof(src), ctypes.addressof(dst)
    acked = {}  # key -> bytes
    codes = {}
    ok_after = 0
    killed = None
    try:
        for it in range(400):
            data = os.urandom(NK * obj)
            ctypes.memmove(sp, data, len(data))
            keys = ["fo-%d-%d-%d" % (os.getpid(), it, i) for i in range(NK)]
            ptrs = [[sp + i * obj + j * PIECE for j in range(PIECES)] for i in range(NK)]
            sizes = [[PIECE] * PIECES for _ in range(NK)]
            r = s.batch_put_from_multi_buffers(keys, ptrs, sizes, None)
            assert len(r) == NK and all(isinstance(x, int) for x in r)
            for i, rc in enumerate(r):
                codes[rc] = codes.get(rc, 0) + 1
                if rc == 0:
                    acked[keys[i]] = data[i * obj:(i + 1) * obj]
            dptrs = [[dp + i * obj + j * PIECE for j in range(PIECES)] for i in range(NK)]
            g = s.batch_get_into_multi_buffers(keys, dptrs, sizes)
            assert len(g) == NK
            for i, rc in enumerate(g):
                assert rc == obj or rc < 0, rc  # never a short or zero read
                if rc == obj:
                    assert ctypes.string_at(dp + i * obj, obj) == data[i * obj:(i + 1) * obj]
            if it == 20 and killed is None:
                leader = cluster3.status()["leader_id"]
                old_leader = leader
                killed = cluster3.master_pid(leader)
                os.kill(killed, signal.SIGKILL)
            if killed is not None and it > 20 and all(x == 0 for x in r):
                ok_after += 1
                if ok_after >= 20:
                    break
        print("put codes:", codes, "acked:", len(acked), "iterations:", it + 1)
        assert killed is not None
        assert cluster3.status()["leader_id"] != old_leader  # a new leader serves
        assert ok_after >= 20, codes  # calls succeed again after the failover
        # every acknowledged key reads back exactly
        ks = list(acked)
        got = s.get_batch(ks)
        bad = [k for k, v in zip(ks, got) if v != acked[k]]
        assert bad == []
    finally:
        s.close()
        try:
            os.waitpid(killed, os.WNOHANG) if killed else None
        except ChildProcessError:
            pass
