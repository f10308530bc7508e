"""Two store objects in one process, each contributing its own segment (no other segment in
the cluster): one is closed (its segment drains into the other) while the other keeps reading;
every object stays readable. Then the last one is closed: with no other segment left, its
objects are gone (get returns b"")."""
import threading
import uuid

import pytest

import kvpool
from conftest import Cluster, make_store

N = 24


@pytest.fixture(scope="module")
def bare_cluster():
    c = Cluster(masters=1, segments=0)
    yield c
    c.down()


def put_on_own_segment(s, keys):
    cfg = kvpool.ReplicateConfig()
    cfg.preferred_segment = s.get_hostname()
    for i, k in enumerate(keys):
        assert s.put(k, k.encode() * 100, cfg) == 0


def objects_on(cluster, store):
    name = store._segment()[0]
    return [x["objects"] for x in cluster.status()["segments"] if x["name"] == name][0]


def test_close_drains_into_the_other_store_then_last_close_drops(bare_cluster):
    a = make_store(bare_cluster, global_segment_size=32 << 20)
    b = make_store(bare_cluster, global_segment_size=32 << 20)
    ka = ["a-%d-%s" % (i, uuid.uuid4().hex) for i in range(N)]
    kb = ["b-%d-%s" % (i, uuid.uuid4().hex) for i in range(N)]
    try:
        put_on_own_segment(a, ka)
        put_on_own_segment(b, kb)
        assert objects_on(bare_cluster, a) == N and objects_on(bare_cluster, b) == N
        stop = threading.Event()
        failed, rounds = [], [0]

        def reader():
            while not stop.is_set():
                got = b.get_batch(ka + kb)
                for k, v in zip(ka + kb, got):
                    if v != k.encode() * 100:
                        failed.append((k, len(v)))
                rounds[0] += 1

        t = threading.Thread(target=reader)
        t.start()
        try:
            assert a.close() == 0  # drains a's segment into b's
        finally:
            stop.set()
            t.join()
        assert failed == []
        assert rounds[0] >= 1
        assert b.get_batch(ka + kb) == [k.encode() * 100 for k in ka + kb]
        assert objects_on(bare_cluster, b) == 2 * N
        # a again, without a segment: setup works after close and reads everything
        assert a.setup("127.0.0.1", "", 0, 16 << 20, "tcp", "", bare_cluster.masters) == 0
        assert a.get_batch(ka) == [k.encode() * 100 for k in ka]
        # the last segment goes: nowhere to move its objects, they are dropped
        assert b.close() == 0
        assert a.get_batch(ka + kb) == [b""] * (2 * N)
        assert a.batch_is_exist(ka[:2]) == [0, 0]
    finally:
        a.close()
        b.close()
