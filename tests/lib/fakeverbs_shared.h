/*
 * fakeverbs_shared.h — the verbs double (fakeverbs.h) across processes and in real time, for the
 * C2/C3 suites whose segment runs in a forked child (test_fence_peer) or whose client is the
 * public library (test_fence_client, kvp_verbs_ops_set_test).
 *
 * fv_shared_init, called before the fabric is made and before any fork, moves every record of
 * the double into one MAP_SHARED arena and turns the lock of fakeverbs_locked.h into a robust,
 * process-shared mutex in it. A child forked afterwards sees the same fabric at the same
 * addresses: its verbs calls (through fv_locked_ops of its node) act on the parent's fabric.
 * The model's one rule for this: registered memory that a packet may place bytes in, or read,
 * must be visible to the process that delivers the packet, so the segment's region is MAP_SHARED
 * (mapped before the fork), and only the parent delivers (its ticker). A completion channel is
 * woken only in the process that made it (fakeverbs_internal.h, fv_chan.pid).
 *
 * The ticker (fv_ticker_start) is a thread of the calling process that runs the fabric's virtual
 * clock at real time: every few hundred microseconds (sooner when an event is due), under the
 * lock, it delivers every event due by now. So transports use the real monotonic clock (no
 * drive_clock), as in production, and a frozen (SIGSTOPped) child's simulated NIC keeps
 * answering, as a real NIC does. fv_ticker_watch ties a node to a process: when the process
 * exits (SIGKILL), the ticker kills the node (fv_node_kill: QPs gone without CQEs, packets on the
 * wire still arrive).
 *
 * A child stopped while it holds the lock would stop the parent too: tests stop children only
 * while they make no verbs call (the segment's RDMA side calls verbs only for a handshake, a
 * mount change or a fence). A child killed while holding it leaves the mutex to the next locker
 * (robust mutex; the record it was changing may be half done, which these tests do not hit).
 */
#ifndef KVP_TESTLIB_FAKEVERBS_SHARED_H
#define KVP_TESTLIB_FAKEVERBS_SHARED_H

#include <stdbool.h>
#include <stddef.h>
#include <sys/types.h>

#include "tests/lib/fakeverbs.h"

/** Map the shared arena (`bytes` of address space, MAP_NORESERVE: only used pages cost memory)
 *  and switch the double's allocations and the fakeverbs_locked lock to it. Once per process,
 *  before fv_fabric_new. Returns KVP_OK or KVP_ERR_NOMEM / KVP_ERR_INVALID (called twice). */
int fv_shared_init(size_t bytes);
/** Bytes handed out by the arena so far (0 without one). */
size_t fv_shared_used(void);

/** Start the real-time ticker over f (one per process). Returns KVP_OK or KVP_ERR_NOMEM. */
int fv_ticker_start(struct fv_fabric *f);
/** Kill node n (fv_node_kill) as soon as process pid has exited. At most 8 watches. */
int fv_ticker_watch(struct fv_node *n, pid_t pid);
/** Stop and join the ticker (no-op when not started); forgets the watches. */
void fv_ticker_stop(void);

#endif
