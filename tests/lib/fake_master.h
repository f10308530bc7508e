/*
 * fake_master.h — an in-process fake master service for client integration tests: the real
 * master state machine (actors/master/fsm/fsm.h) behind one ZMQ ROUTER thread in the test process.
 * No Raft: every mutation (mount, unmount, put start/end/revoke, remove) is applied directly at
 * term 1 with the wall clock, get-replicas / exists / get-size are FSM queries (replica leases
 * of 5 s), REPORT_UNREACHABLE is counted, anything else is answered with an empty response.
 * Tests read and drive the FSM directly under `mu`.
 *
 * The helpers that assert use cmocka (call them from cmocka tests or setups only).
 */
#ifndef KVP_TESTS_LIB_FAKE_MASTER_H
#define KVP_TESTS_LIB_FAKE_MASTER_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>

#include "actors/master/fsm/fsm.h"
#include "kvpool.h"

struct kvp_fake_master {
    void *ctx, *router;
    char addr[64]; /* host:port, for master_server_address */
    pthread_mutex_t mu; /* guards fsm */
    struct kvp_master_fsm *fsm;
    atomic_bool stop;
    atomic_int unreachable_reports; /* REPORT_UNREACHABLE requests received */
    atomic_size_t max_put_start_items; /* most items seen in one PUT_START request */
    atomic_size_t max_get_replicas_keys; /* most keys seen in one GET_REPLICAS request */
    _Atomic uint64_t revoke_writer_id, revoke_writer_mask; /* of the last PUT_REVOKE request */
    pthread_t thread;
};

/* Zero m, create the FSM with params p, bind the ROUTER on a free loopback port and start the
 * service thread. Returns 0, or -1 on failure. */
int kvp_fake_master_start(struct kvp_fake_master *m, const struct kvp_master_fsm_params *p);

/* Stop the service thread, close the socket, destroy the FSM. */
void kvp_fake_master_stop(struct kvp_fake_master *m);

/* Mount a segment through a master session, as a segment daemon would (owner_pid 1, i.e. not
 * this process, so every transfer goes over TCP). Asserts (cmocka) that the mount succeeds and
 * returns the segment id the master assigned. */
uint32_t kvp_fake_master_mount(struct kvp_fake_master *m, const char *name, const char *endpoint,
                               uint64_t size);

/* The FSM's get-replicas answer for one key (queried directly under mu, as a client on
 * 127.0.0.1 would ask); free it with kvp_master_fsm_response_free(). */
Kvp__Response *kvp_fake_master_get_replicas(struct kvp_fake_master *m, const char *key);

/* A client of m with the given transfer_timeout (ms); asserts (cmocka) that it opens. */
kvp_client *kvp_fake_master_open_client(struct kvp_fake_master *m, uint32_t timeout_ms);

#endif
