"""The opt-in alias package python/alias/mooncake: `from mooncake.store import ...` gives
kvpool's classes; a real mooncake package elsewhere on sys.path is never shadowed."""
import os
import subprocess
import sys
import tempfile

from conftest import BUILD, HERE

ALIAS = os.path.abspath(os.path.join(HERE, "..", "alias"))


def run(code, extra_path):
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([ALIAS] + extra_path + [os.path.join(BUILD, "python")]))
    p = subprocess.run([sys.executable, "-c", code], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                       universal_newlines=True, timeout=60)
    assert p.returncode == 0, p.stderr
    return p.stdout.strip()


def test_alias_gives_kvpool_classes(cluster):
    env_code = ("import os\nfrom mooncake.store import MooncakeDistributedStore, ReplicateConfig\n"
                "import kvpool\n"
                "assert MooncakeDistributedStore is kvpool.MooncakeDistributedStore\n"
                "s = MooncakeDistributedStore()\n"
                "print(s.setup('127.0.0.1', 'P2PHANDSHAKE', 0, 1 << 20, 'rdma', '', %r), s.close())"
                % cluster.masters)
    assert run(env_code, []) == "0 0"


def test_real_mooncake_is_never_shadowed():
    with tempfile.TemporaryDirectory() as d:
        os.makedirs(os.path.join(d, "mooncake"))
        with open(os.path.join(d, "mooncake", "__init__.py"), "w") as f:
            f.write("REAL = True\n")
        with open(os.path.join(d, "mooncake", "store.py"), "w") as f:
            f.write("class MooncakeDistributedStore:\n    real = True\n")
        out = run("import mooncake\nfrom mooncake.store import MooncakeDistributedStore as M\n"
                  "print(getattr(mooncake, 'REAL', False), getattr(M, 'real', False))", [d])
        assert out == "True True"
