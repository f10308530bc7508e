#!/usr/bin/env python3
"""What SGLang's HiCache does with the store, on kvpool.

setup with an embedded segment (this process contributes memory to the pool), register a host
buffer holding KV pages, batch-put the pages from it (zero copy), batch-check that they exist,
batch-get them into another registered buffer, compare every byte. Exit 0 when every byte
matched, 1 otherwise.

Usage: hicache_example.py MASTERS   (e.g. 127.0.0.1:7101 or h1:p,h2:p,h3:p)
Run by run.sh against a local cluster it starts itself.
"""
import ctypes
import os
import sys

import kvpool

PAGES, PAGE_BYTES = 64, 64 * 1024


def main():
    if len(sys.argv) != 2:
        print(__doc__.strip().splitlines()[-2], file=sys.stderr)
        return 2
    store = kvpool.MooncakeDistributedStore()
    # local_hostname, metadata_server, global_segment_size, local_buffer_size, protocol,
    # rdma_devices, master_server_addr: SGLang's call, unchanged ("rdma" runs on TCP for now)
    rc = store.setup("127.0.0.1", "P2PHANDSHAKE", 64 << 20, 16 << 20, "tcp", "", sys.argv[1])
    if rc != 0:
        print("setup failed: %d %s" % (rc, kvpool.errname(rc)), file=sys.stderr)
        return 1
    try:
        host_pool = ctypes.create_string_buffer(PAGES * PAGE_BYTES)
        load_pool = ctypes.create_string_buffer(PAGES * PAGE_BYTES)
        hp, lp = ctypes.addressof(host_pool), ctypes.addressof(load_pool)
        ctypes.memmove(hp, os.urandom(PAGES * PAGE_BYTES), PAGES * PAGE_BYTES)
        assert store.register_buffer(hp, PAGES * PAGE_BYTES) == 0
        assert store.register_buffer(lp, PAGES * PAGE_BYTES) == 0

        # keys as HiCache makes them: <hash>_<tp_rank>_k / _v
        keys = ["%016x_0_%s" % (hash((os.getpid(), i // 2)) & (2**64 - 1), "kv"[i % 2]) for i in range(PAGES)]
        put = store.batch_put_from(keys, [hp + i * PAGE_BYTES for i in range(PAGES)], [PAGE_BYTES] * PAGES)
        exist = store.batch_is_exist(keys)
        got = store.batch_get_into(keys, [lp + i * PAGE_BYTES for i in range(PAGES)], [PAGE_BYTES] * PAGES)
        same = ctypes.string_at(hp, PAGES * PAGE_BYTES) == ctypes.string_at(lp, PAGES * PAGE_BYTES)
        print("segment %s: put %d/%d, exist %d/%d, get %d/%d, bytes %s" % (
            store.get_hostname(), put.count(0), PAGES, exist.count(1), PAGES,
            sum(1 for g in got if g == PAGE_BYTES), PAGES, "identical" if same else "DIFFER"))
        store.unregister_buffer(hp)
        store.unregister_buffer(lp)
        return 0 if same and put.count(0) == PAGES and exist.count(1) == PAGES else 1
    finally:
        store.close()


if __name__ == "__main__":
    sys.exit(main())
