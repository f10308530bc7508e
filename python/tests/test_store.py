"""Every method of kvpool.MooncakeDistributedStore against a real local cluster (1 master,
2 segments), with its error cases. The surface: ../shared/clients/mooncake-python.md."""
import ctypes
import os
import threading
import uuid

import pytest

import kvpool
from conftest import Cluster, make_store

NOT_FOUND, INVALID, HAS_LEASE = -704, -600, -706


def uniq(prefix="k"):
    return "%s-%s" % (prefix, uuid.uuid4().hex)


class Buf:
    """A host buffer with its address, as inference servers hand them over."""

    def __init__(self, n):
        self.b = ctypes.create_string_buffer(n)
        self.p = ctypes.addressof(self.b)
        self.n = n

    def fill(self, data, off=0):
        ctypes.memmove(self.p + off, data, len(data))

    def read(self, off, n):
        return ctypes.string_at(self.p + off, n)


# ------------------------------------------------------------------ construction and setup


def test_no_io_before_setup_and_calls_return_codes():
    s = kvpool.MooncakeDistributedStore()
    assert s.put("a", b"x") == INVALID
    assert s.get("a") == b""
    assert s.is_exist("a") == INVALID
    assert s.batch_is_exist(["a", "b"]) == [INVALID, INVALID]
    assert s.batch_put_from(["a"], [1], [1]) == [INVALID]
    assert s.batch_get_into_multi_buffers(["a", "b"], [[1], [1]], [[1], [1]]) == [INVALID, INVALID]
    assert s.get_batch(["a"]) == [b""]
    assert s.batch_get_buffer(["a"]) == [None]
    assert s.remove("a") == INVALID
    assert s.remove_all() == INVALID
    assert s.get_size("a") == INVALID
    assert s.close() == 0
    assert s.get_hostname() == ""


def test_setup_positional_engine_and_kwargs(cluster):
    s = kvpool.MooncakeDistributedStore()
    # SGLang's form: 7 positional, engine 8th positionally, then keyword arguments; protocol
    # "rdma" runs on TCP with a WARN.
    rc = s.setup("127.0.0.1:12345", "http://127.0.0.1:8080/metadata", 16 << 20, 16 << 20, "rdma", "mlx5_0",
                 cluster.masters, None, tenant_id="t1", enable_ssd_offload=False, ssd_offload_path="",
                 enable_client_http_server=False, client_http_port=0, **cluster.tenant_key("t1"))
    assert rc == 0
    assert s.tenant_id == "t1"
    host = s.get_hostname()
    assert host.startswith("127.0.0.1:") and host != "127.0.0.1:12345"  # its own segment's port
    k = uniq()
    assert s.put(k, b"v" * 100) == 0
    assert s.get(k) == b"v" * 100
    assert s.close() == 0


def test_setup_unknown_kwarg_raises_typeerror_naming_it(cluster):
    s = kvpool.MooncakeDistributedStore()
    with pytest.raises(TypeError, match="no_such_option"):
        s.setup("127.0.0.1", "", 0, 1 << 20, "tcp", "", cluster.masters, no_such_option=1)


def test_setup_wrong_types_name_the_argument(cluster):
    s = kvpool.MooncakeDistributedStore()
    with pytest.raises(TypeError, match="local_hostname"):
        s.setup(5, "", 0, 1 << 20, "tcp", "", cluster.masters)
    with pytest.raises(TypeError, match="global_segment_size"):
        s.setup("127.0.0.1", "", [1], 1 << 20, "tcp", "", cluster.masters)
    with pytest.raises(ValueError, match="local_buffer_size"):
        s.setup("127.0.0.1", "", 0, "lots", "tcp", "", cluster.masters)
    with pytest.raises(TypeError, match="master_server_addr"):
        s.setup("127.0.0.1", "", 0, 1 << 20, "tcp", "", 7101)


def test_setup_bad_values_are_return_codes(cluster):
    s = kvpool.MooncakeDistributedStore()
    assert s.setup("127.0.0.1", "", 0, 1 << 20, "udp", "", cluster.masters) == INVALID
    assert s.setup({"master_server_address": cluster.masters, "no_such_key": "1"}) == INVALID
    # no master at that address: RPC failure, after rpc_timeout_ms
    assert s.setup({"master_server_address": "127.0.0.1:1", "rpc_timeout_ms": "300",
                    "global_segment_size": 0}) == -900
    assert s.close() == 0


def test_setup_dict_sizes_and_units(cluster):
    s = kvpool.MooncakeDistributedStore()
    cfg = {"local_hostname": "127.0.0.1", "metadata_server": "P2PHANDSHAKE",
           "master_server_address": cluster.masters, "global_segment_size": "16 MB",
           "local_buffer_size": "4mb", "protocol": "tcp", "transfer_timeout": 2, "replica_num": 1}
    assert s.setup(cfg) == 0
    k = uniq()
    assert s.put(k, b"a" * (4 << 20)) == 0          # exactly local_buffer_size
    assert s.put(uniq(), b"a" * ((4 << 20) + 1)) == INVALID  # above it
    assert s.get(k) == b"a" * (4 << 20)
    assert s.close() == 0
    # the dict's defaults (16 MiB staging, tcp): the sizes may be omitted
    assert s.setup({"master_server_address": cluster.masters}) == 0
    assert s.get_hostname() != ""
    assert s.close() == 0


def test_close_is_idempotent_and_setup_works_again(cluster):
    s = make_store(cluster)
    k = uniq()
    assert s.put(k, b"1") == 0
    assert s.setup("127.0.0.1", "", 0, 1 << 20, "tcp", "", cluster.masters) == INVALID  # already set up
    assert s.close() == 0
    assert s.close() == 0
    assert s.get(k) == b""  # closed: a code, not an exception
    assert s.setup("127.0.0.1", "", 0, 1 << 20, "tcp", "", cluster.masters) == 0
    assert s.get(k) == b"1"
    assert s.close() == 0


# ------------------------------------------------------------------ put / get


def test_put_is_write_once_and_get_returns_bytes(store):
    k = uniq()
    assert store.put(k, b"first") == 0
    assert store.put(k, b"second") == 0  # exists: 0, nothing written
    v = store.get(k)
    assert type(v) is bytes and v == b"first"
    assert store.get(uniq()) == b""
    assert store.put(k, bytearray(b"x")) == 0
    assert store.put(uniq(), memoryview(b"mv")) == 0
    with pytest.raises(TypeError, match="value"):
        store.put(uniq(), "a str")
    with pytest.raises(TypeError, match="key"):
        store.put(5, b"x")
    with pytest.raises(ValueError, match="key"):
        store.put("a\0b", b"x")
    with pytest.raises(ValueError, match=r"keys\[1\]"):
        store.batch_is_exist(["a", "b\0"])
    with pytest.raises(TypeError, match="config"):
        store.put(uniq(), b"x", 5)
    assert store.put(uniq(), b"") == INVALID  # objects are 1 byte or more
    assert store.put("x" * 600, b"1") == INVALID  # key over 512 bytes


def test_unknown_keyword_on_a_method_raises_typeerror(store):
    with pytest.raises(TypeError, match="bogus"):
        store.put(uniq(), b"x", bogus=1)
    with pytest.raises(TypeError, match="bogus"):
        store.batch_get_into_multi_buffers([], [], [], bogus=True)


def test_is_exist_miss_is_zero(store):
    k = uniq()
    assert store.is_exist(k) == 0
    assert store.put(k, b"1") == 0
    assert store.is_exist(k) == 1
    assert store.batch_is_exist([k, uniq(), k]) == [1, 0, 1]
    assert store.batch_is_exist([]) == []
    assert store.batch_is_exist(["", k]) == [INVALID, 1]
    with pytest.raises(TypeError, match=r"keys\[1\]"):
        store.batch_is_exist([k, 3])
    with pytest.raises(TypeError, match="keys"):
        store.batch_is_exist(5)


def test_local_buffer_size_zero(cluster):
    s = make_store(cluster, local_buffer_size=0)
    try:
        k = uniq()
        assert s.put(k, b"x" * 10) != 0
        assert s.is_exist(k) == 0
        assert s.put_parts(k, b"a", b"b") == INVALID
        buf = Buf(64)
        buf.fill(b"z" * 64)
        assert s.put_from(k, buf.p, 64) == 0  # zero-copy from caller memory still works
        assert s.get(k) == b""  # copying get: staging needed
        assert s.get_batch([k]) == [b""]
        assert s.batch_get_buffer([k]) == [None]
        assert s.get_into(k, buf.p, 64) == 64
        assert s.batch_get_into([k], [buf.p], [64]) == [64]
    finally:
        s.close()


def test_put_parts_stores_the_concatenation(store):
    k = uniq()
    assert store.put_parts(k, b"ab", bytearray(b"cd"), memoryview(b"ef")) == 0
    assert store.get(k) == b"abcdef"
    with pytest.raises(TypeError, match=r"parts\[1\]"):
        store.put_parts(uniq(), b"a", "b")


def test_get_batch_and_batch_get_buffer(store):
    ks = [uniq() for _ in range(3)]
    for i, k in enumerate(ks):
        assert store.put(k, bytes([65 + i]) * (i + 1) * 1000) == 0
    miss = uniq()
    got = store.get_batch(ks + [miss])
    assert got == [b"A" * 1000, b"B" * 2000, b"C" * 3000, b""]
    hs = store.batch_get_buffer([ks[1], miss])
    assert hs[1] is None
    h = hs[0]
    assert len(h) == 2000 and h.size() == 2000
    assert bytes(h) == b"B" * 2000 and memoryview(h).tobytes() == b"B" * 2000
    assert store.get_batch([]) == [] and store.batch_get_buffer([]) == []


# ------------------------------------------------------------------ zero-copy calls


def test_put_from_get_into_capacities_and_misses(store):
    src, dst = Buf(1000), Buf(4096)
    src.fill(os.urandom(1000))
    k = uniq()
    assert store.put_from(k, src.p, 1000) == 0
    assert store.get_into(k, dst.p, 999) == INVALID  # capacity below the object size
    assert store.get_into(k, dst.p, 4096) == 1000  # a larger capacity: the true size
    assert dst.read(0, 1000) == src.read(0, 1000)
    assert store.get_into(uniq(), dst.p, 4096) == NOT_FOUND
    with pytest.raises(TypeError, match="buffer_ptr"):
        store.get_into(k, "0x1", 10)
    with pytest.raises(ValueError, match="size"):
        store.put_from(k, src.p, -1)


def test_batch_put_from_and_batch_get_into(store):
    n = 8
    src, dst = Buf(n * 512), Buf(n * 1024)
    src.fill(os.urandom(n * 512))
    ks = [uniq() for _ in range(n)]
    assert store.batch_put_from(ks, [src.p + i * 512 for i in range(n)], [512] * n) == [0] * n
    assert store.batch_put_from(ks, [src.p + i * 512 for i in range(n)], [512] * n) == [0] * n  # exists
    miss = uniq()
    r = store.batch_get_into(ks + [miss], [dst.p + i * 1024 for i in range(n)] + [dst.p], [1024] * n + [16])
    assert r[:n] == [512] * n  # true sizes below the capacity
    assert r[n] < 0  # never 0 for a miss
    for i in range(n):
        assert dst.read(i * 1024, 512) == src.read(i * 512, 512)
    # mismatched list lengths: len(keys) negatives
    assert store.batch_put_from(ks, [src.p], [512] * n) == [INVALID] * n
    assert store.batch_get_into(ks, [dst.p] * n, [1]) == [INVALID] * n
    assert store.batch_get_into(ks[:1], [dst.p], [100]) == [INVALID]  # capacity below the size
    assert store.batch_put_from([], [], []) == []
    with pytest.raises(TypeError, match=r"sizes\[0\]"):
        store.batch_put_from(ks[:1], [src.p], ["512"])


def test_multi_buffers_basic_and_errors(store):
    src, dst = Buf(4096), Buf(4096)
    src.fill(os.urandom(4096))
    k = uniq()
    assert store.batch_put_from_multi_buffers([k], [[src.p, src.p + 1000]], [[100, 200]], None) == [0]
    miss = uniq()
    r = store.batch_get_into_multi_buffers([k, miss], [[dst.p, dst.p + 2000], [dst.p + 3000]],
                                           [[50, 250], [100]], True)  # 4th positional bool
    assert r[0] == 300 and r[1] < 0
    assert dst.read(0, 50) == src.read(0, 50)
    assert dst.read(2000, 250) == src.read(50, 50) + src.read(1000, 200)
    assert store.batch_get_into_multi_buffers([k], [[dst.p, dst.p + 100]], [[100, 199]]) == [INVALID]
    # mismatched outer lengths: every key negative; a bad inner shape: that key
    assert store.batch_put_from_multi_buffers([uniq(), uniq()], [[src.p]], [[1], [1]], None) == [INVALID] * 2
    k2, k3 = uniq(), uniq()
    assert store.batch_put_from_multi_buffers([k2, k3], [[src.p, src.p], [src.p]], [[1], [5]], None) == [INVALID, 0]
    assert store.get(k3) == src.read(0, 5)
    with pytest.raises(TypeError, match=r"all_buffer_ptrs\[0\]"):
        store.batch_put_from_multi_buffers([k], [5], [[1]], None)


def test_scatter_gather_64_keys_x_32_pieces(store):
    """vLLM's data path: 64 keys, each the concatenation of 32 pieces (one per layer), written
    from one registered buffer and read back into another one, bytes compared."""
    nk, npc = 64, 32
    sizes = [[256 + ((i * 31 + j * 17) % 7) * 64 for j in range(npc)] for i in range(nk)]
    total = sum(sum(s) for s in sizes)
    src, dst = Buf(total), Buf(total)
    src.fill(os.urandom(total))
    assert store.register_buffer(src.p, total) == 0
    assert store.register_buffer(dst.p, total) == 0
    ptrs, off = [], 0
    for i in range(nk):
        row = []
        for j in range(npc):
            row.append(src.p + off)
            off += sizes[i][j]
        ptrs.append(row)
    ks = [uniq("sg") for _ in range(nk)]
    assert store.batch_put_from_multi_buffers(ks, ptrs, sizes, kvpool.ReplicateConfig()) == [0] * nk
    # read into the other buffer with the pieces in reverse key order
    dptrs, off = [None] * nk, 0
    for i in reversed(range(nk)):
        row = []
        for j in range(npc):
            row.append(dst.p + off)
            off += sizes[i][j]
        dptrs[i] = row
    r = store.batch_get_into_multi_buffers(ks, dptrs, sizes, True)
    assert r == [sum(s) for s in sizes]
    for i in range(nk):
        for j in range(npc):
            assert ctypes.string_at(dptrs[i][j], sizes[i][j]) == ctypes.string_at(ptrs[i][j], sizes[i][j])
    assert store.unregister_buffer(dst.p) == 0
    assert store.unregister_buffer(src.p) == 0


def test_register_nested_and_overlapping(store):
    b = Buf(1 << 20)
    assert store.register_buffer(b.p, 1 << 20) == 0
    assert store.register_buffer(b.p + 4096, 4096) == 0  # nested
    assert store.register_buffer(b.p + 4096, 1 << 19) == 0  # overlapping, same start
    assert store.unregister_buffer(b.p + 4096) == 0
    assert store.unregister_buffer(b.p + 4096) == 0
    assert store.unregister_buffer(b.p + 4096) == NOT_FOUND
    assert store.unregister_buffer(b.p) == 0
    assert store.register_buffer(b.p, 0) == INVALID
    with pytest.raises(TypeError, match="buffer_ptr"):
        store.register_buffer(None, 10)


# ------------------------------------------------------------------ metadata calls


def test_get_size_remove_and_leases(store):
    k = uniq()
    assert store.put(k, b"x" * 777) == 0
    assert store.get_size(k) == 777
    assert store.get_size(uniq()) == NOT_FOUND
    assert store.get(k) == b"x" * 777  # takes a read lease (1 s in these tests)
    assert store.remove(k) == HAS_LEASE
    assert store.remove(k, force=True) == 0
    assert store.remove(k, force=True) == NOT_FOUND
    assert store.is_exist(k) == 0
    with pytest.raises(TypeError, match="key"):
        store.remove(None)


def test_remove_all(cluster):
    s = make_store(cluster)
    try:
        for i in range(5):
            assert s.put(uniq("ra"), b"1") == 0
        s.get_batch([uniq()])
        n = s.remove_all(True)
        assert n >= 5
        assert s.remove_all(force=True) == 0
    finally:
        s.close()


def test_replicate_config_and_preferred_segment(cluster):
    s = make_store(cluster, global_segment_size=16 << 20)
    try:
        cfg = kvpool.ReplicateConfig()
        assert cfg.replica_num == 1 and cfg.preferred_segment == "" and cfg.soft_pin_ttl_ms is None
        cfg.replica_num = 2
        assert "2" in str(cfg)
        with pytest.raises(TypeError):
            cfg.soft_pin_ttl_ms = -1
        with pytest.raises(TypeError):
            cfg.soft_pin_ttl_ms = 1 << 64
        k = uniq()
        assert s.put(k, b"two copies", cfg) == 0
        desc = s.batch_get_replica_desc([k, uniq()])
        assert list(desc) == [k] and len(desc[k]) == 2
        assert desc[k][0].is_memory_replica() and not desc[k][0].is_disk_replica()
        assert not desc[k][0].is_local_disk_replica()
        # get_hostname names this client's own segment: usable as preferred_segment
        cfg = kvpool.ReplicateConfig()
        cfg.preferred_segment = s.get_hostname()
        k2 = uniq()
        assert s.put(k2, b"here", cfg) == 0
        seg = s._segment()[0]
        st = [x for x in cluster.status()["segments"] if x["name"] == seg]
        assert st and st[0]["objects"] >= 1
        bad = kvpool.ReplicateConfig()
        bad.replica_num = 0
        assert s.put(uniq(), b"x", bad) == INVALID
        bad = kvpool.ReplicateConfig()
        bad.preferred_segment = 5
        with pytest.raises(TypeError, match="preferred_segment"):
            s.put(uniq(), b"x", bad)
        assert not hasattr(kvpool.ReplicateConfig, "group_ids")
    finally:
        s.close()


def test_upsert(store):
    k = uniq()
    assert store.upsert(k, b"one") == 0
    assert store.upsert(k, b"two!") == 0
    assert store.get(k) == b"two!"
    cfg = kvpool.ReplicateConfig()
    cfg.soft_pin_ttl_ms = 1000  # without SoftPinAction.ENABLE: exactly -600
    assert store.upsert(k, b"three", cfg) == -600
    cfg.soft_pin_action = kvpool.SoftPinAction.ENABLE
    assert store.upsert(k, b"three", cfg) == 0
    assert store.get(k) == b"three"


def test_get_into_ranges(store):
    k1, k2 = uniq(), uniq()
    assert store.put(k1, b"0123456789") == 0
    assert store.put(k2, b"abcdefghij") == 0
    a, b = Buf(64), Buf(64)
    r = store.get_into_ranges([a.p, b.p], [[k1, k2], [k2, uniq(), k1]], [[0, 10], [0, 5, 8]],
                              [[2, 0], [5, 0, 9]], [[3, 4], [5, 1, 2]])
    assert r == [[3, 4], [5, NOT_FOUND, INVALID]]
    assert a.read(0, 3) == b"234" and a.read(10, 4) == b"abcd"
    assert b.read(0, 5) == b"fghij"
    assert store.get_into_ranges([a.p], [[k1]], [[0]], [[0]], [[1, 2]]) == [[INVALID]]


def test_errname_and_absent_names():
    assert kvpool.errname(-704) == "OBJECT_NOT_FOUND"
    assert kvpool.errname(-200) == "NO_AVAILABLE_HANDLE"
    assert kvpool.errname(0) == "OK"
    assert kvpool.errname(-1013) == "KVP_ERR_NOMEM"
    assert kvpool.errname(-12345).startswith("UNKNOWN")
    with pytest.raises(TypeError):
        kvpool.errname("x")
    for name in ("batch_put_session_start", "batch_get_session_start", "remove_by_regex", "setup_dummy"):
        assert not hasattr(kvpool.MooncakeDistributedStore, name)
    assert kvpool.SoftPinAction.ENABLE != kvpool.SoftPinAction.PRESERVE


# ------------------------------------------------------------------ threads


def test_8_threads_x_100_puts_and_gets_of_1_mib_on_one_object():
    # A pool of its own, large enough that nothing is evicted: a forced remove of a key just
    # read keeps its space in quarantine until the read lease ends, and at this rate the
    # module's 256 MiB pool would evict live keys between their put and their get.
    cluster = Cluster(masters=1, segments=2, segment_size="512M")
    s = make_store(cluster, local_buffer_size=2 << 20)
    errors = []

    def worker(t):
        try:
            for i in range(100):
                k = "thr-%d-%d-%s" % (t, i, uuid.uuid4().hex[:8])
                v = (bytes([t, i % 256]) + os.urandom(14)) * (1 << 16)
                rc = s.put(k, v)
                if rc != 0:
                    errors.append(("put", t, i, rc))
                    continue
                got = s.get(k)
                if got != v:
                    errors.append(("get", t, i, len(got)))
                s.remove(k, force=True)
        except Exception as e:  # a test failure, reported below
            errors.append(("exception", t, repr(e)))

    ts = [threading.Thread(target=worker, args=(t,)) for t in range(8)]
    try:
        for t in ts:
            t.start()
        for t in ts:
            t.join()
    finally:
        s.close()
        cluster.down()
    assert errors == []


def test_tenants_isolated_and_tenant_id_checked(cluster):
    """Issue 25: the tenant is the key's; another tenant's objects are invisible to reads,
    exists, remove and batches; a tenant_id that disagrees with the key is refused."""
    sa = make_store(cluster, tenant_id="pa", **cluster.tenant_key("pa"))
    sb = make_store(cluster, **cluster.tenant_key("pb"))
    try:
        k = uniq("tenant")
        assert sa.put(k, b"a" * 64) == 0
        assert sb.get(k) == b""
        assert sb.is_exist(k) == 0
        assert sb.batch_is_exist([k]) == [0]
        assert sb.get_batch([k]) == [b""]
        assert sb.get_size(k) == NOT_FOUND
        assert sb.remove(k, force=True) == NOT_FOUND
        assert sb.put(k, b"b" * 32) == 0  # the same name in its own scope
        assert sa.get(k) == b"a" * 64
        assert sb.get(k) == b"b" * 32
    finally:
        sa.close()
        sb.close()
    s = kvpool.MooncakeDistributedStore()
    rc = s.setup("127.0.0.1", "", 0, 1 << 20, "tcp", "", cluster.masters, tenant_id="pb",
                 **cluster.tenant_key("pa"))
    assert rc != 0
