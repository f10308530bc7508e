/*
 * fakeverbs_locked.h — the verbs double (fakeverbs.h) for tests where two threads of one process
 * use it: a segment server's data-plane loop answering RDMA handshakes and a client's transfer
 * actor driving its QPs. Every verbs call through a locked table and every clock call through
 * the locked env take one process-wide mutex, so the double (single-threaded by design) sees one
 * caller at a time. Built only with KVP_HAVE_VERBS.
 */
#ifndef KVP_TESTLIB_FAKEVERBS_LOCKED_H
#define KVP_TESTLIB_FAKEVERBS_LOCKED_H

#include "actors/transfer/rdma/rdma_xport.h"
#include "tests/lib/fakeverbs.h"

/** A table calling n's table under the lock (valid until fv_locked_reset). At most 8 nodes. */
const struct kvp_verbs_ops *fv_locked_ops(struct fv_node *n);
/** An env whose now_ns/wait read/advance f's clock under the lock (wait: max_ns, at least 1 us). */
struct kvp_rdma_env fv_locked_env(struct fv_fabric *f);
/** The lock, for test code touching the double while other threads may (fv_node_pause, ...). */
void fv_lock(void);
void fv_unlock(void);
/** Forget the tables (before fv_fabric_destroy; no thread may use them any more). */
void fv_locked_reset(void);

#endif
