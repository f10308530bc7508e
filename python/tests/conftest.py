"""Shared fixtures of the Python binding's tests: a real local cluster started by
`kvpoolctl cluster up` in a fresh temporary directory (free ports), stopped by
`kvpoolctl cluster down` (it signals only the processes it started, by pid).

Run by CTest (tests/cmake/python.cmake) as `/usr/bin/python3 -m pytest python/tests/...`
with KVP_BUILD_DIR set; by hand: KVP_BUILD_DIR=build /usr/bin/python3 -m pytest python/tests
"""
import json
import os
import shutil
import subprocess
import sys
import tempfile

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
BUILD = os.path.abspath(os.environ.get("KVP_BUILD_DIR") or os.path.join(HERE, "..", "..", "build"))
sys.path.insert(0, os.path.join(BUILD, "python"))
KVPOOLCTL = os.path.join(BUILD, "tools", "kvpoolctl")

# Master settings that keep the tests short: read leases of 1 s (a remove without force, a
# drain's drop of a moved replica wait for them), freed space reusable after 200 ms.
# Segments touch their pages only when written (no background prefault of the whole region).
MASTER_CONFIG = {"default_kv_lease_ttl": 1000, "fence_grace_ms": 200, "segment_prefault": False}


def _guard():
    """Daemons of this pytest process die with it, however it ends (a ctest timeout SIGKILLs
    pytest, and `down` never runs): the guard of tests/lib/cluster_guard.h, started once. Every
    process started from here on carries its mark KVP_TEST_OWNER; a build without the guard
    binary (an installed module tested alone) runs unguarded."""
    guard = os.path.join(BUILD, "tests", "kvp_test_guard")
    if os.environ.get("KVP_TEST_OWNER", "").startswith("%d." % os.getpid()) or not os.path.exists(guard):
        return
    os.environ["KVP_TEST_OWNER"] = subprocess.run([guard, str(os.getpid())], check=True, timeout=30,
                                                  stdout=subprocess.PIPE, text=True).stdout.strip()


class Cluster:
    def __init__(self, masters=1, segments=2, segment_size="128M"):
        _guard()
        self.dir = tempfile.mkdtemp(prefix="kvp-py-")
        cfg = os.path.join(self.dir, "test-config.json")
        with open(cfg, "w") as f:
            json.dump(MASTER_CONFIG, f)
        subprocess.run([KVPOOLCTL, "cluster", "up", "--dir", self.dir, "--masters", str(masters),
                        "--segments", str(segments), "--segment-size", segment_size, "--config", cfg],
                       check=True, timeout=120, stdout=subprocess.DEVNULL)
        with open(os.path.join(self.dir, "cluster.json")) as f:
            self.info = json.load(f)
        self.masters = self.info["master_server_address"]
        self.file = os.path.join(self.dir, "cluster.json")
        # Authentication is on (cluster up made the keys): every client of these tests finds its
        # key through the cluster file, also those that call setup() with a master list only.
        os.environ["KVPOOL_CLUSTER_FILE"] = self.file

    def tenant_key(self, tenant):
        """A client key of `tenant`, allowed by the masters (its public half in the allowed-keys
        directory, which the masters reread when it changes). Returns setup() kwargs."""
        keys = os.path.join(self.dir, "keys")
        path = os.path.join(keys, "tenant-" + tenant)
        if not os.path.exists(path + "_secret"):
            subprocess.run([KVPOOLCTL, "keygen", path, "--tenant", tenant], check=True, timeout=30,
                           stdout=subprocess.DEVNULL)
            shutil.copy(path, os.path.join(self.info["auth"]["allowed_dir"], "tenant-" + tenant))
        return {"auth_key": path + "_secret", "auth_master_keys": self.info["auth"]["master_keys"]}

    def status(self):
        out = subprocess.run([KVPOOLCTL, "--cluster", self.dir, "status", "--json"], check=True, timeout=30,
                             stdout=subprocess.PIPE).stdout
        return json.loads(out)

    def master_pid(self, master_id):
        for m in self.info["masters"]:
            if m["id"] == master_id:
                return m["pid"]
        raise KeyError(master_id)

    def down(self):
        subprocess.run([KVPOOLCTL, "cluster", "down", "--dir", self.dir], timeout=120,
                       stdout=subprocess.DEVNULL)
        shutil.rmtree(self.dir, ignore_errors=True)


@pytest.fixture(scope="module")
def cluster():
    c = Cluster(masters=1, segments=2)
    yield c
    c.down()


def make_store(cluster, global_segment_size=0, local_buffer_size=64 << 20, **kw):
    import kvpool

    s = kvpool.MooncakeDistributedStore()
    kw.setdefault("cluster_file", cluster.file)
    rc = s.setup("127.0.0.1", "P2PHANDSHAKE", global_segment_size, local_buffer_size, "tcp", "",
                 cluster.masters, **kw)
    assert rc == 0
    return s


@pytest.fixture
def store(cluster):
    s = make_store(cluster)
    yield s
    s.close()
